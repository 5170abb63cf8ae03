//! Network namespaces with a name: an empty file onto which a new
//! namespace is bind-mounted, so that it lives on with no process in it
//! until it is unmounted (what `ip netns add` does under `/run/netns`,
//! done here without the `ip` program).
//!
//! The namespace is made by a thread of its own, which `unshare`s its
//! network namespace (a per-thread attribute), binds
//! `/proc/thread-self/ns/net` onto the file and ends: no thread of the
//! caller's pool ever changes namespace.
//!
//! A mount namespace copied from the host's while a namespace was
//! mounted (a container monitor's, made to hide a cgroup mount) holds a
//! copy of that mount; removing the file detaches the copies as well
//! (Linux 3.18 and later), so nothing keeps a detached namespace alive.

use std::io;
use std::path::{Path, PathBuf};

use nix::mount::{mount, umount2, MntFlags, MsFlags};
use nix::sched::{unshare, CloneFlags};

/// Makes `dir` if missing and returns its canonical path.
pub(crate) fn prepare_dir(dir: &Path) -> io::Result<PathBuf> {
    std::fs::create_dir_all(dir)?;
    dir.canonicalize()
}

/// Makes a new network namespace, mounted at `path` (which must not
/// exist). On failure nothing is left at `path`.
pub(crate) async fn create(path: &Path) -> io::Result<()> {
    std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(path)?;
    let target = path.to_path_buf();
    let (tx, rx) = tokio::sync::oneshot::channel();
    let spawned = std::thread::Builder::new()
        .name("agora-netns".into())
        .spawn(move || {
            let made = unshare(CloneFlags::CLONE_NEWNET).and_then(|()| {
                mount(
                    Some("/proc/thread-self/ns/net"),
                    &target,
                    None::<&str>,
                    MsFlags::MS_BIND,
                    None::<&str>,
                )
            });
            let _ = tx.send(made);
        });
    let made = match spawned {
        Ok(_) => rx
            .await
            .unwrap_or(Err(nix::Error::EIO))
            .map_err(io::Error::from),
        Err(e) => Err(e),
    };
    if made.is_err() {
        let _ = std::fs::remove_file(path);
    }
    made
}

/// Unmounts the namespace at `path` and removes the file. Nothing there
/// is not an error.
pub(crate) fn remove(path: &Path) -> io::Result<()> {
    match umount2(path, MntFlags::MNT_DETACH) {
        Ok(()) | Err(nix::Error::EINVAL) | Err(nix::Error::ENOENT) => {}
        Err(e) => return Err(e.into()),
    }
    match std::fs::remove_file(path) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
        _ => Ok(()),
    }
}

/// Whether a network namespace is mounted at `path`.
pub(crate) fn is_namespace(path: &Path) -> bool {
    nix::sys::statfs::statfs(path)
        .is_ok_and(|s| s.filesystem_type() == nix::sys::statfs::NSFS_MAGIC)
}
