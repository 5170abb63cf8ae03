//! Where the cgroup hierarchies are: `/proc/self/mountinfo` says where
//! each one is mounted (controllers may share a hierarchy or, as `cpu` and
//! `cpuacct` on some hosts, have one each), `/proc/self/cgroup` which
//! cgroup of each the agent is in.

use std::path::{Path, PathBuf};

/// A cgroup file system mount.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct CgroupMount {
    /// Where it is mounted.
    pub(crate) mount_point: PathBuf,
    /// The cgroup of the hierarchy that is mounted there (`/` usually).
    pub(crate) root: String,
    /// `true` for cgroup2, else a v1 hierarchy with `controllers`.
    pub(crate) unified: bool,
    /// The v1 controllers bound to it (`cpu`, `memory`, ...).
    pub(crate) controllers: Vec<String>,
}

/// The cgroup mounts of a `/proc/PID/mountinfo` text.
pub(crate) fn cgroup_mounts(mountinfo: &str) -> Vec<CgroupMount> {
    mountinfo
        .lines()
        .filter_map(|line| {
            // ID PARENT MAJ:MIN ROOT MOUNT_POINT OPTIONS [OPTIONAL...] - FSTYPE SOURCE SUPER_OPTIONS
            let (left, right) = line.split_once(" - ")?;
            let left: Vec<&str> = left.split(' ').collect();
            let mut right = right.split(' ');
            let fstype = right.next()?;
            let _source = right.next()?;
            let super_options = right.next().unwrap_or("");
            let root = unescape(left.get(3)?);
            let mount_point = PathBuf::from(unescape(left.get(4)?));
            match fstype {
                "cgroup2" => Some(CgroupMount {
                    mount_point,
                    root,
                    unified: true,
                    controllers: Vec::new(),
                }),
                "cgroup" => Some(CgroupMount {
                    mount_point,
                    root,
                    unified: false,
                    controllers: super_options
                        .split(',')
                        .filter(|o| {
                            !matches!(*o, "rw" | "ro" | "noprefix" | "clone_children" | "xattr")
                                && !o.contains('=')
                        })
                        .map(str::to_string)
                        .collect(),
                }),
                _ => None,
            }
        })
        .collect()
}

/// `/proc/PID/cgroup`: (hierarchy id, controllers, path) per line; the
/// cgroup2 line has id 0 and no controllers.
pub(crate) fn process_cgroups(text: &str) -> Vec<(u32, Vec<String>, String)> {
    text.lines()
        .filter_map(|line| {
            let mut parts = line.splitn(3, ':');
            let id = parts.next()?.parse().ok()?;
            let controllers = parts
                .next()?
                .split(',')
                .filter(|c| !c.is_empty())
                .map(str::to_string)
                .collect();
            Some((id, controllers, parts.next()?.to_string()))
        })
        .collect()
}

/// The directory of cgroup `path` (as `/proc/PID/cgroup` gives it) in a
/// mount of its hierarchy whose root is `root`: `None` when the cgroup is
/// not visible through that mount.
pub(crate) fn cgroup_dir(mount_point: &Path, root: &str, path: &str) -> Option<PathBuf> {
    let relative = if root == "/" {
        path.trim_start_matches('/')
    } else {
        let rest = path.strip_prefix(root)?;
        if !rest.is_empty() && !rest.starts_with('/') {
            return None;
        }
        rest.trim_start_matches('/')
    };
    Some(if relative.is_empty() {
        mount_point.to_path_buf()
    } else {
        mount_point.join(relative)
    })
}

/// Undoes mountinfo's octal escapes (`\040` for a space, ...).
fn unescape(field: &str) -> String {
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'\\' && i + 4 <= bytes.len() {
            if let Some(value) = std::str::from_utf8(&bytes[i + 1..i + 4])
                .ok()
                .and_then(|o| u8::from_str_radix(o, 8).ok())
            {
                out.push(value);
                i += 4;
                continue;
            }
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    const HYBRID: &str = "\
31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu
33 31 0:30 / /sys/fs/cgroup/cpuacct rw,relatime - cgroup cgroup rw,cpuacct
35 31 0:32 / /sys/fs/cgroup/memory rw,relatime shared:7 - cgroup cgroup rw,memory
39 31 0:36 / /sys/fs/cgroup/pids rw,relatime - cgroup cgroup rw,pids
40 31 0:37 / /sys/fs/cgroup/systemd rw,relatime - cgroup cgroup rw,xattr,name=systemd
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
42 31 0:39 /sub /mnt/with\\040space rw - cgroup cgroup rw,freezer,cpuset
";

    #[test]
    fn mounts_of_a_hybrid_host() {
        let mounts = cgroup_mounts(HYBRID);
        assert_eq!(mounts.len(), 7);
        assert_eq!(mounts[0].controllers, vec!["cpu"]);
        assert_eq!(mounts[1].controllers, vec!["cpuacct"]);
        assert_eq!(
            mounts[2].mount_point,
            PathBuf::from("/sys/fs/cgroup/memory")
        );
        assert!(
            mounts[4].controllers.is_empty(),
            "name=systemd is no controller"
        );
        assert!(mounts[5].unified);
        assert_eq!(mounts[6].mount_point, PathBuf::from("/mnt/with space"));
        assert_eq!(mounts[6].root, "/sub");
        assert_eq!(mounts[6].controllers, vec!["freezer", "cpuset"]);
    }

    #[test]
    fn own_cgroups_and_their_directories() {
        let own = process_cgroups("4:memory:/process_api/d9\n2:cpu,cpuacct:/\n0::/\n");
        assert_eq!(own[0], (4, vec!["memory".into()], "/process_api/d9".into()));
        assert_eq!(own[1].1, vec!["cpu", "cpuacct"]);
        assert_eq!(own[2], (0, vec![], "/".into()));
        let m = Path::new("/sys/fs/cgroup/memory");
        assert_eq!(
            cgroup_dir(m, "/", "/process_api/d9"),
            Some(m.join("process_api/d9"))
        );
        assert_eq!(cgroup_dir(m, "/", "/"), Some(m.to_path_buf()));
        assert_eq!(cgroup_dir(m, "/a", "/a/b"), Some(m.join("b")));
        assert_eq!(cgroup_dir(m, "/a", "/a"), Some(m.to_path_buf()));
        assert_eq!(cgroup_dir(m, "/a", "/ab"), None);
        assert_eq!(cgroup_dir(m, "/a", "/c"), None);
    }
}
