//! Whom a container's process runs as: a Docker/OCI `User` string
//! (`name`, `uid`, `name:group`, `uid:gid`, `name:gid`, `uid:group`)
//! resolved against the image's own `/etc/passwd` and `/etc/group`, not
//! the host's, as Docker does.
//!
//! A name must be found in the image's files; a numeric uid need not be
//! (it runs with gid 0 then, unless a group is given). Without a group,
//! the gid is the user's primary group from `/etc/passwd`. The
//! supplementary groups are those `/etc/group` lists the user's name in.

use std::path::Path;

/// A resolved user.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResolvedUser {
    /// User id.
    pub uid: u32,
    /// Primary group id.
    pub gid: u32,
    /// Supplementary groups.
    pub additional_gids: Vec<u32>,
}

/// Why a user string could not be resolved.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum UserError {
    /// A name that is not in the image's `/etc/passwd`.
    #[error("user '{0}' is not in the image's /etc/passwd")]
    UnknownUser(String),
    /// A group name that is not in the image's `/etc/group`.
    #[error("group '{0}' is not in the image's /etc/group")]
    UnknownGroup(String),
    /// An empty part (`":gid"`, `"name:"`).
    #[error("user '{0}' is not of the form name|uid[:group|gid]")]
    Malformed(String),
}

struct PasswdEntry {
    name: String,
    uid: u32,
    gid: u32,
}

struct GroupEntry {
    name: String,
    gid: u32,
    members: Vec<String>,
}

/// Resolves `spec` in the root file system at `rootfs`. An empty spec is
/// root (0:0).
pub fn resolve(spec: &str, rootfs: &Path) -> Result<ResolvedUser, UserError> {
    let passwd = std::fs::read_to_string(rootfs.join("etc/passwd")).unwrap_or_default();
    let group = std::fs::read_to_string(rootfs.join("etc/group")).unwrap_or_default();
    resolve_in(spec, &passwd, &group)
}

/// [`resolve`] over the contents of `/etc/passwd` and `/etc/group`.
pub fn resolve_in(spec: &str, passwd: &str, group: &str) -> Result<ResolvedUser, UserError> {
    if spec.is_empty() {
        return Ok(ResolvedUser {
            uid: 0,
            gid: 0,
            additional_gids: Vec::new(),
        });
    }
    let users = parse_passwd(passwd);
    let groups = parse_group(group);
    let (user_part, group_part) = match spec.split_once(':') {
        Some((u, g)) => (u, Some(g)),
        None => (spec, None),
    };
    if user_part.is_empty() || group_part == Some("") {
        return Err(UserError::Malformed(spec.into()));
    }
    let entry = match user_part.parse::<u32>() {
        Ok(uid) => users.iter().find(|u| u.uid == uid),
        Err(_) => Some(
            users
                .iter()
                .find(|u| u.name == user_part)
                .ok_or_else(|| UserError::UnknownUser(user_part.into()))?,
        ),
    };
    let uid = match entry {
        Some(e) => e.uid,
        None => user_part.parse::<u32>().unwrap_or(0),
    };
    let gid = match group_part {
        Some(g) => match g.parse::<u32>() {
            Ok(gid) => gid,
            Err(_) => groups
                .iter()
                .find(|e| e.name == g)
                .map(|e| e.gid)
                .ok_or_else(|| UserError::UnknownGroup(g.into()))?,
        },
        None => entry.map(|e| e.gid).unwrap_or(0),
    };
    let mut additional_gids: Vec<u32> = match entry {
        Some(e) => groups
            .iter()
            .filter(|g| g.members.contains(&e.name) && g.gid != gid)
            .map(|g| g.gid)
            .collect(),
        None => Vec::new(),
    };
    additional_gids.dedup();
    Ok(ResolvedUser {
        uid,
        gid,
        additional_gids,
    })
}

fn parse_passwd(text: &str) -> Vec<PasswdEntry> {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|line| {
            let mut f = line.split(':');
            let name = f.next()?.to_string();
            let _password = f.next()?;
            let uid = f.next()?.parse().ok()?;
            let gid = f.next()?.parse().ok()?;
            Some(PasswdEntry { name, uid, gid })
        })
        .collect()
}

fn parse_group(text: &str) -> Vec<GroupEntry> {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|line| {
            let mut f = line.split(':');
            let name = f.next()?.to_string();
            let _password = f.next()?;
            let gid = f.next()?.parse().ok()?;
            let members = f
                .next()
                .unwrap_or("")
                .split(',')
                .filter(|m| !m.is_empty())
                .map(String::from)
                .collect();
            Some(GroupEntry { name, gid, members })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const PASSWD: &str = "root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/:/bin/false\napp:x:1000:1001::/home/app:/bin/sh\n";
    const GROUP: &str = "root:x:0:\nstaff:x:50:app,other\napp:x:1001:\nnogroup:x:65534:\n";

    fn user(uid: u32, gid: u32, extra: &[u32]) -> ResolvedUser {
        ResolvedUser {
            uid,
            gid,
            additional_gids: extra.to_vec(),
        }
    }

    #[test]
    fn names_and_ids_resolve_in_the_images_files() {
        assert_eq!(resolve_in("", PASSWD, GROUP).unwrap(), user(0, 0, &[]));
        assert_eq!(
            resolve_in("app", PASSWD, GROUP).unwrap(),
            user(1000, 1001, &[50])
        );
        assert_eq!(
            resolve_in("1000", PASSWD, GROUP).unwrap(),
            user(1000, 1001, &[50])
        );
        assert_eq!(
            resolve_in("app:staff", PASSWD, GROUP).unwrap(),
            user(1000, 50, &[])
        );
        assert_eq!(
            resolve_in("app:7", PASSWD, GROUP).unwrap(),
            user(1000, 7, &[50])
        );
        assert_eq!(
            resolve_in("4242", PASSWD, GROUP).unwrap(),
            user(4242, 0, &[])
        );
        assert_eq!(
            resolve_in("4242:nogroup", PASSWD, GROUP).unwrap(),
            user(4242, 65534, &[])
        );
    }

    #[test]
    fn unknown_names_are_refused_by_name() {
        assert_eq!(
            resolve_in("ghost", PASSWD, GROUP),
            Err(UserError::UnknownUser("ghost".into()))
        );
        assert_eq!(
            resolve_in("app:ghosts", PASSWD, GROUP),
            Err(UserError::UnknownGroup("ghosts".into()))
        );
        assert_eq!(
            resolve_in("app:", PASSWD, GROUP),
            Err(UserError::Malformed("app:".into()))
        );
        assert_eq!(
            resolve_in(":1", PASSWD, GROUP),
            Err(UserError::Malformed(":1".into()))
        );
    }
}
