//! Which user an executor and its tasks run as.
//!
//! A framework names the Unix user its tasks run as
//! (`FrameworkInfo.user`). An agent running as root switches to that user
//! before it starts the framework's executors (`--switch-user`, on by
//! default, as Mesos's `--switch_user`): the executor's process gets the
//! user's uid, primary group and supplementary groups, its sandbox is
//! owned by the user, and `USER`, `LOGNAME` and `HOME` name the user. An
//! agent that is not root cannot switch users, so a task naming another
//! user fails there with a message saying why, unless `--switch-user` is
//! off, in which case every task runs as the agent's own user.
//!
//! Whatever the switch, a task never runs as root (uid 0) unless the
//! agent allows it (`--allow-root-tasks`, off by default, as Nomad's
//! `user.denylist` of `root`): a framework naming `root`, or naming no
//! user on an agent that runs as root, gets its tasks failed with a
//! message naming root.

use std::ffi::CString;
use std::io;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use nix::unistd::{Gid, Uid, User};

/// How an agent chooses the user its executors run as.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UserPolicy {
    /// Run each framework's executors as the user the framework names
    /// (needs the agent to run as root); off: as the agent's own user.
    pub switch_user: bool,
    /// Allow tasks whose user is root (uid 0).
    pub allow_root_tasks: bool,
}

/// A user an executor is started as, resolved from the user database.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunAs {
    /// Login name.
    pub name: String,
    pub uid: u32,
    /// Primary group.
    pub gid: u32,
    /// Supplementary groups (the primary one included), as `initgroups`
    /// would set them.
    pub groups: Vec<u32>,
    /// Home directory.
    pub home: PathBuf,
}

// === impl UserPolicy ===

impl Default for UserPolicy {
    /// Mesos's and Nomad's defaults: switch users, never root.
    fn default() -> Self {
        UserPolicy {
            switch_user: true,
            allow_root_tasks: false,
        }
    }
}

impl UserPolicy {
    /// Every task runs as the agent's own user, root included when the
    /// agent runs as root: for a single-user development cluster
    /// (`agora-local`) and tests, where the person starting the cluster is
    /// the one whose tasks run.
    pub fn agent_user() -> Self {
        UserPolicy {
            switch_user: false,
            allow_root_tasks: Uid::effective().is_root(),
        }
    }

    /// Whether this agent starts executors as another user than its own
    /// (it switches users and runs as root): their sandboxes are then
    /// created and handed to the user before they start.
    pub fn switches(&self) -> bool {
        self.switch_user && Uid::effective().is_root()
    }

    /// The user an executor of a framework naming `requested` runs as:
    /// `Ok(None)` when that is the agent's own user (nothing to switch),
    /// `Ok(Some)` when the agent must switch to it, `Err` with the reason
    /// when the task may not run (root not allowed, no such user, or the
    /// agent cannot switch).
    pub fn resolve(&self, requested: &str) -> Result<Option<RunAs>, String> {
        self.resolve_with(requested, Uid::effective().as_raw(), lookup)
    }

    fn resolve_with(
        &self,
        requested: &str,
        agent_uid: u32,
        lookup: impl Fn(&str) -> Result<Option<RunAs>, String>,
    ) -> Result<Option<RunAs>, String> {
        let refuse_root = |who: String| {
            Err(format!(
                "tasks may not run as root on this agent ({who}); start the agent with \
                 --allow-root-tasks to allow it"
            ))
        };
        if !self.switch_user || requested.is_empty() {
            if agent_uid == 0 && !self.allow_root_tasks {
                let who = if requested.is_empty() {
                    "the framework names no user and the agent runs as root".to_string()
                } else {
                    "--switch-user is off and the agent runs as root".to_string()
                };
                return refuse_root(who);
            }
            return Ok(None);
        }
        let Some(user) = lookup(requested)? else {
            return Err(format!("user {requested:?} does not exist on this agent"));
        };
        if user.uid == 0 && !self.allow_root_tasks {
            return refuse_root(format!("user {requested:?} is uid 0"));
        }
        if user.uid == agent_uid {
            return Ok(None);
        }
        if agent_uid != 0 {
            return Err(format!(
                "the agent runs as uid {agent_uid}, not root, and cannot run tasks as user \
                 {requested:?}; run the agent as root, or with --switch-user=false to run every \
                 task as the agent's user"
            ));
        }
        Ok(Some(user))
    }
}

/// `name` from the user database, with its supplementary groups.
fn lookup(name: &str) -> Result<Option<RunAs>, String> {
    let user = User::from_name(name).map_err(|e| format!("cannot look up user {name:?}: {e}"))?;
    let Some(user) = user else {
        return Ok(None);
    };
    let cname =
        CString::new(name).map_err(|_| format!("user name {name:?} contains a NUL byte"))?;
    let groups = nix::unistd::getgrouplist(&cname, user.gid)
        .map_err(|e| format!("cannot list the groups of user {name:?}: {e}"))?;
    Ok(Some(RunAs {
        name: user.name,
        uid: user.uid.as_raw(),
        gid: user.gid.as_raw(),
        groups: groups.into_iter().map(Gid::as_raw).collect(),
        home: user.dir,
    }))
}

// === impl RunAs ===

impl RunAs {
    /// What the executor's environment says about its user.
    pub fn environment(&self) -> [(String, String); 3] {
        [
            ("USER".to_string(), self.name.clone()),
            ("LOGNAME".to_string(), self.name.clone()),
            ("HOME".to_string(), self.home.to_string_lossy().into_owned()),
        ]
    }

    /// Hands `dir` and everything in it (fetched files) to the user,
    /// without following symbolic links.
    pub fn own_tree(&self, dir: &Path) -> io::Result<()> {
        let (uid, gid) = (Some(Uid::from_raw(self.uid)), Some(Gid::from_raw(self.gid)));
        let mut pending = vec![dir.to_path_buf()];
        while let Some(path) = pending.pop() {
            let meta = std::fs::symlink_metadata(&path)?;
            if meta.uid() != self.uid || meta.gid() != self.gid {
                nix::unistd::fchownat(
                    nix::fcntl::AT_FDCWD,
                    &path,
                    uid,
                    gid,
                    nix::fcntl::AtFlags::AT_SYMLINK_NOFOLLOW,
                )
                .map_err(|e| {
                    io::Error::new(
                        io::Error::from(e).kind(),
                        format!(
                            "cannot give {} to user {:?}: {e}",
                            path.display(),
                            self.name
                        ),
                    )
                })?;
            }
            if meta.is_dir() {
                for entry in std::fs::read_dir(&path)? {
                    pending.push(entry?.path());
                }
            }
        }
        Ok(())
    }

    /// Creates directory `dir` (and its missing parents, owned by the
    /// agent) already owned by the user: made under a temporary name,
    /// handed over, then renamed into place, so the user's executor never
    /// finds it owned by root. An existing `dir` is handed over as is.
    pub fn create_dir(&self, dir: &Path) -> io::Result<()> {
        if dir.is_dir() {
            return self.own_tree(dir);
        }
        let (Some(parent), Some(name)) = (dir.parent(), dir.file_name()) else {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("{} has no parent", dir.display()),
            ));
        };
        std::fs::create_dir_all(parent)?;
        let mut staging = name.to_os_string();
        staging.push(format!(".creating-{}", std::process::id()));
        let staging = parent.join(staging);
        let _ = std::fs::remove_dir(&staging);
        std::fs::create_dir(&staging)?;
        {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(
                &staging,
                std::fs::Permissions::from_mode(crate::processes::SANDBOX_MODE),
            )?;
        }
        let handed = self.own_tree(&staging).and_then(|()| {
            match std::fs::rename(&staging, dir) {
                // Made meanwhile (by another request for it): use that one.
                Err(_) if dir.is_dir() => self.own_tree(dir),
                other => other,
            }
        });
        let _ = std::fs::remove_dir(&staging);
        handed
    }
}

/// Whether every directory from `/` down to `dir` lets other users
/// through (search permission for "others"), which an executor running
/// as another user needs to reach its sandbox under the work dir: the
/// first one that does not, if any.
pub fn untraversable_ancestor(dir: &Path) -> Option<PathBuf> {
    use std::os::unix::fs::PermissionsExt;
    let dir = std::fs::canonicalize(dir).ok()?;
    dir.ancestors()
        .filter_map(|d| std::fs::metadata(d).ok().map(|m| (d, m)))
        .filter(|(_, m)| m.permissions().mode() & 0o001 == 0)
        .map(|(d, _)| d.to_path_buf())
        .last()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn user(name: &str, uid: u32) -> RunAs {
        RunAs {
            name: name.into(),
            uid,
            gid: uid,
            groups: vec![uid],
            home: PathBuf::from(format!("/home/{name}")),
        }
    }

    fn db(name: &str) -> Result<Option<RunAs>, String> {
        Ok(match name {
            "root" => Some(user("root", 0)),
            "alice" => Some(user("alice", 1000)),
            "bob" => Some(user("bob", 1001)),
            _ => None,
        })
    }

    const SWITCH: UserPolicy = UserPolicy {
        switch_user: true,
        allow_root_tasks: false,
    };

    #[test]
    fn a_root_agent_switches_to_the_named_user() {
        assert_eq!(
            SWITCH.resolve_with("alice", 0, db),
            Ok(Some(user("alice", 1000)))
        );
    }

    #[test]
    fn root_is_refused_unless_allowed() {
        for (requested, agent_uid) in [("root", 0), ("", 0), ("root", 1000)] {
            let refused = SWITCH.resolve_with(requested, agent_uid, db).unwrap_err();
            assert!(
                refused.contains("root") && refused.contains("--allow-root-tasks"),
                "{refused}"
            );
        }
        let off = UserPolicy {
            switch_user: false,
            ..SWITCH
        };
        assert!(off
            .resolve_with("alice", 0, db)
            .unwrap_err()
            .contains("root"));
        let allowed = UserPolicy {
            allow_root_tasks: true,
            ..SWITCH
        };
        // Root running as root: nothing to switch.
        assert_eq!(allowed.resolve_with("root", 0, db), Ok(None));
        assert_eq!(allowed.resolve_with("", 0, db), Ok(None));
    }

    #[test]
    fn an_unknown_user_is_named() {
        let refused = SWITCH.resolve_with("mallory", 0, db).unwrap_err();
        assert!(refused.contains("\"mallory\" does not exist"), "{refused}");
    }

    #[test]
    fn a_non_root_agent_runs_its_own_user_and_refuses_others() {
        assert_eq!(SWITCH.resolve_with("alice", 1000, db), Ok(None));
        assert_eq!(SWITCH.resolve_with("", 1000, db), Ok(None));
        let refused = SWITCH.resolve_with("bob", 1000, db).unwrap_err();
        assert!(refused.contains("--switch-user=false"), "{refused}");
        let off = UserPolicy {
            switch_user: false,
            ..SWITCH
        };
        assert_eq!(off.resolve_with("bob", 1000, db), Ok(None));
    }

    #[test]
    fn the_environment_names_the_user() {
        let env = user("alice", 1000).environment();
        assert!(env.contains(&("HOME".to_string(), "/home/alice".to_string())));
        assert!(env.contains(&("USER".to_string(), "alice".to_string())));
    }

    #[test]
    fn untraversable_directories_are_found() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let inner = dir.path().join("a/b");
        std::fs::create_dir_all(&inner).unwrap();
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o700)).unwrap();
        assert_eq!(
            untraversable_ancestor(&inner),
            Some(std::fs::canonicalize(dir.path()).unwrap())
        );
    }
}
