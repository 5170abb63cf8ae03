//! The two things the runtime needs below the standard library: a pidfd
//! for a process that is not its child, and the setup of a runtime
//! process between `fork` and `exec`.
#![allow(unsafe_code)]

use std::os::fd::{FromRawFd, OwnedFd, RawFd};

use nix::mount::{mount, umount2, MntFlags, MsFlags};
use nix::sched::{unshare, CloneFlags};

/// The descriptor number conmon's sync pipe gets in conmon.
pub(crate) const SYNC_FD: RawFd = 3;

/// `pidfd_open(2)`.
pub(crate) fn pidfd_open(pid: u32) -> std::io::Result<OwnedFd> {
    // SAFETY: the syscall takes two integers and returns a new descriptor
    // or -1; nothing is borrowed.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid as libc::pid_t, 0) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: `fd` is a fresh descriptor that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as RawFd) })
}

/// `fd` registered with tokio, to await its readability (a pidfd's is
/// the process's exit).
pub(crate) fn register(fd: OwnedFd) -> std::io::Result<tokio::io::unix::AsyncFd<OwnedFd>> {
    // SAFETY: the `AsyncFd` owns the descriptor: it is neither closed nor
    // replaced while registered, and is deregistered before it is closed.
    unsafe { tokio::io::unix::AsyncFd::register_with_interest(fd, tokio::io::Interest::READABLE) }
        .map_err(|e| e.into_parts().1)
}

/// Prepares `command` to run, in the child between `fork` and `exec`:
/// `sync_fd` becomes descriptor [`SYNC_FD`] (inherited), and with
/// `hide_unified` the child gets a mount namespace of its own (a slave of
/// the host's, so unmounts on the host still reach it) without
/// `/sys/fs/cgroup/unified`, so that crun sees a cgroup v1 host rather
/// than a hybrid one it refuses (see [`super::Runtime`]).
pub(crate) fn prepare_child(
    command: &mut tokio::process::Command,
    sync_fd: Option<RawFd>,
    hide_unified: bool,
) {
    if sync_fd.is_none() && !hide_unified {
        return;
    }
    let setup = move || -> std::io::Result<()> {
        if let Some(fd) = sync_fd {
            // SAFETY: fcntl and dup2 on integers; the descriptor left at
            // SYNC_FD is inherited by the program about to be executed.
            let ret = if fd == SYNC_FD {
                unsafe { libc::fcntl(fd, libc::F_SETFD, 0) }
            } else {
                unsafe { libc::dup2(fd, SYNC_FD) }
            };
            if ret < 0 {
                return Err(std::io::Error::last_os_error());
            }
        }
        if hide_unified {
            unshare(CloneFlags::CLONE_NEWNS)?;
            mount(
                None::<&std::ffi::CStr>,
                c"/",
                None::<&std::ffi::CStr>,
                MsFlags::MS_REC | MsFlags::MS_SLAVE,
                None::<&std::ffi::CStr>,
            )?;
            umount2(c"/sys/fs/cgroup/unified", MntFlags::MNT_DETACH)?;
        }
        Ok(())
    };
    // SAFETY: the closure only makes system calls (no allocation, no
    // lock), which is what may run between fork and exec.
    unsafe {
        command.pre_exec(setup);
    }
}
