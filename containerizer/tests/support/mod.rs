//! What the runtime's tests and benchmark share: the check that the host
//! can run containers (it says why not), and a busybox image built from
//! the host's `busybox-static` as two layer directories.
#![allow(dead_code)]

pub mod registry;

use std::path::{Path, PathBuf};

use agora_containerizer::runtime::{
    CommandSpec, ContainerSpec, ImageConfig, Limits, Network, RootFs, RuntimeConfig,
};

/// Why containers cannot run here, if they cannot.
pub fn cannot_run_containers() -> Option<String> {
    if !nix::unistd::geteuid().is_root() {
        return Some("not root".into());
    }
    let filesystems = std::fs::read_to_string("/proc/filesystems").unwrap_or_default();
    if !filesystems.lines().any(|l| l.ends_with("overlay")) {
        return Some("no overlay in /proc/filesystems".into());
    }
    for program in ["crun", "conmon", "busybox"] {
        if which(program).is_none() {
            return Some(format!("{program} is not on PATH"));
        }
    }
    None
}

/// Prints why a test skips and returns true when it must.
pub fn skip(test: &str) -> bool {
    match cannot_run_containers() {
        Some(why) => {
            eprintln!("skipping {test}: {why}");
            true
        }
        None => false,
    }
}

pub fn which(program: &str) -> Option<PathBuf> {
    std::env::var_os("PATH")?
        .to_str()?
        .split(':')
        .map(|d| Path::new(d).join(program))
        .find(|p| p.is_file())
}

/// The applets the image links to busybox.
const APPLETS: [&str; 22] = [
    "sh", "cat", "echo", "sleep", "hostname", "id", "ls", "true", "false", "mount", "pwd", "env",
    "head", "tail", "dd", "kill", "ps", "grep", "stat", "touch", "mkdir", "wc",
];

/// A busybox image as two layers under `dir`, bottom first: the bottom
/// has busybox, its applets, `/etc/passwd`, `/etc/group`, and
/// `/etc/which` = `bottom`; the top has `/etc/os-release` naming the
/// image and `/etc/which` = `top`.
pub fn busybox_layers(dir: &Path) -> Vec<PathBuf> {
    let bottom = dir.join("layer0");
    let top = dir.join("layer1");
    for d in ["bin", "etc", "tmp", "proc", "dev", "sys"] {
        std::fs::create_dir_all(bottom.join(d)).unwrap();
    }
    std::fs::create_dir_all(top.join("etc")).unwrap();
    std::fs::copy(which("busybox").unwrap(), bottom.join("bin/busybox")).unwrap();
    for applet in APPLETS {
        std::os::unix::fs::symlink("busybox", bottom.join("bin").join(applet)).unwrap();
    }
    std::fs::write(
        bottom.join("etc/passwd"),
        "root:x:0:0:root:/root:/bin/sh\napp:x:1000:1000::/home/app:/bin/sh\n",
    )
    .unwrap();
    std::fs::write(bottom.join("etc/group"), "root:x:0:\napp:x:1000:\n").unwrap();
    std::fs::write(bottom.join("etc/which"), "bottom\n").unwrap();
    std::fs::write(top.join("etc/os-release"), "ID=agora-busybox\n").unwrap();
    std::fs::write(top.join("etc/which"), "top\n").unwrap();
    vec![bottom, top]
}

/// A test's directories: the runtime's root, sandboxes, run dirs, layers.
pub struct Fixture {
    pub tmp: tempfile::TempDir,
    pub layers: Vec<PathBuf>,
}

impl Fixture {
    pub fn new() -> Fixture {
        // Not under /tmp's tmpfs only by chance: overlay takes any
        // directory, but the upper and work directories must share a
        // file system.
        let tmp = tempfile::Builder::new()
            .prefix("agora-runtime-")
            .tempdir_in(std::env::temp_dir())
            .unwrap();
        let layers = busybox_layers(&tmp.path().join("image"));
        Fixture { tmp, layers }
    }

    pub fn config(&self) -> RuntimeConfig {
        RuntimeConfig::new(self.tmp.path().join("runtime"))
    }

    /// A spec for container `id` running `sh -c script` in the image.
    pub fn spec(&self, id: &str, script: &str) -> ContainerSpec {
        let sandbox = self.tmp.path().join("sandboxes").join(id);
        std::fs::create_dir_all(&sandbox).unwrap();
        ContainerSpec {
            id: id.into(),
            run_dir: self.tmp.path().join("runs").join(id),
            sandbox,
            parent_sandbox: None,
            rootfs: RootFs::Image {
                layers: self.layers.clone(),
                config: ImageConfig {
                    cmd: vec!["/bin/sh".into()],
                    env: vec!["IMAGE_VAR=from-image".into()],
                    ..ImageConfig::default()
                },
            },
            command: CommandSpec {
                shell: true,
                value: Some(script.into()),
                arguments: vec![],
            },
            env: vec![("TASK_VAR".into(), "from-task".into())],
            user: None,
            hostname: Some(format!("host-{id}")),
            network: Network::Host,
            cgroups_path: Some(format!("/agora-runtime-test/{id}")),
            limits: Limits::default(),
            volumes: vec![],
        }
    }

    pub fn sandbox(&self, id: &str) -> PathBuf {
        self.tmp.path().join("sandboxes").join(id)
    }
}

/// A file of the sandbox, as text.
pub fn read(sandbox: &Path, name: &str) -> String {
    std::fs::read_to_string(sandbox.join(name)).unwrap_or_default()
}

/// The container's cgroup directory in the memory hierarchy (v1) or the
/// unified one (v2).
pub fn memory_cgroup(path: &str) -> PathBuf {
    let v2 = Path::new("/sys/fs/cgroup/cgroup.controllers").exists();
    let base = if v2 {
        "/sys/fs/cgroup"
    } else {
        "/sys/fs/cgroup/memory"
    };
    Path::new(base).join(path.trim_start_matches('/'))
}

/// How many processes the out-of-memory killer killed in the cgroup.
pub fn oom_kills(cgroup: &Path) -> u64 {
    let (file, key) = if cgroup.join("memory.events").exists() {
        ("memory.events", "oom_kill")
    } else {
        ("memory.oom_control", "oom_kill")
    };
    std::fs::read_to_string(cgroup.join(file))
        .unwrap_or_default()
        .lines()
        .find_map(|l| match l.split_once(' ') {
            Some((k, v)) if k == key => v.trim().parse().ok(),
            _ => None,
        })
        .unwrap_or(0)
}

/// Whether anything is mounted at or under `dir`.
pub fn mounted_under(dir: &Path) -> Vec<String> {
    std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.split(' ').nth(4))
        .filter(|p| Path::new(p).starts_with(dir))
        .map(String::from)
        .collect()
}

pub fn alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .map(|s| {
            !s.rsplit_once(')')
                .is_some_and(|(_, r)| r.trim_start().starts_with('Z'))
        })
        .unwrap_or(false)
}
