//! The one place the agent needs `unsafe`: starting an executor with
//! `posix_spawn` in a session of its own, and the Linux pidfd calls that
//! let the agent wait for and signal exactly the process it started.
//!
//! `posix_spawn` (glibc's is built on `clone(CLONE_VM | CLONE_VFORK)`)
//! costs the same whatever the agent's size, where `fork` copies the
//! page tables of a process with a large heap. A pidfd names one process
//! for good: a signal sent through it can never reach a later process
//! that was given the same pid.

#![allow(unsafe_code)]

use std::ffi::{CString, OsStr};
use std::io;
use std::os::fd::{FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use nix::sys::signal::Signal;

/// What [`spawn_session`] starts.
pub(crate) struct SpawnArgs<'a> {
    /// Absolute path of the program.
    pub(crate) program: &'a Path,
    /// `argv`, `argv[0]` included.
    pub(crate) argv: &'a [&'a OsStr],
    /// The complete environment, as `KEY=VALUE`.
    pub(crate) envp: &'a [Vec<u8>],
    /// Working directory.
    pub(crate) cwd: &'a Path,
    /// Files opened (append, created 0644) as stdout and stderr.
    pub(crate) stdout: &'a Path,
    pub(crate) stderr: &'a Path,
}

fn cstring(bytes: &[u8]) -> io::Result<CString> {
    CString::new(bytes).map_err(|_| {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{:?} contains a NUL byte", String::from_utf8_lossy(bytes)),
        )
    })
}

fn check(rc: libc::c_int) -> io::Result<()> {
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::from_raw_os_error(rc))
    }
}

/// Owns the spawn attributes and file actions until they are destroyed.
struct SpawnSetup {
    attr: libc::posix_spawnattr_t,
    actions: libc::posix_spawn_file_actions_t,
}

impl Drop for SpawnSetup {
    fn drop(&mut self) {
        // SAFETY: both were initialised in `spawn_session` before this
        // value was built, and are destroyed once.
        unsafe {
            libc::posix_spawnattr_destroy(&mut self.attr);
            libc::posix_spawn_file_actions_destroy(&mut self.actions);
        }
    }
}

/// Starts `args.program` as the leader of a new session (and so of a new
/// process group) with every signal at its default disposition and none
/// blocked, stdin from `/dev/null`, stdout and stderr appended to the
/// given files, in `args.cwd`. Returns its pid; errors of the child
/// before `exec` (a missing program or directory) are returned here.
pub(crate) fn spawn_session(args: &SpawnArgs<'_>) -> io::Result<u32> {
    let program = cstring(args.program.as_os_str().as_bytes())?;
    let argv: Vec<CString> = args
        .argv
        .iter()
        .map(|a| cstring(a.as_bytes()))
        .collect::<io::Result<_>>()?;
    let envp: Vec<CString> = args
        .envp
        .iter()
        .map(|e| cstring(e))
        .collect::<io::Result<_>>()?;
    let cwd = cstring(args.cwd.as_os_str().as_bytes())?;
    let stdout = cstring(args.stdout.as_os_str().as_bytes())?;
    let stderr = cstring(args.stderr.as_os_str().as_bytes())?;
    let devnull = c"/dev/null";
    let mut argv_ptrs: Vec<*mut libc::c_char> = argv.iter().map(|a| a.as_ptr() as *mut _).collect();
    argv_ptrs.push(std::ptr::null_mut());
    let mut envp_ptrs: Vec<*mut libc::c_char> = envp.iter().map(|e| e.as_ptr() as *mut _).collect();
    envp_ptrs.push(std::ptr::null_mut());

    // SAFETY: every pointer handed to libc below points into a CString or
    // vector that outlives the call; the attribute and file-action objects
    // are initialised before use and destroyed by `SpawnSetup`'s drop.
    unsafe {
        let mut setup = SpawnSetup {
            attr: std::mem::zeroed(),
            actions: std::mem::zeroed(),
        };
        check(libc::posix_spawnattr_init(&mut setup.attr))?;
        if let Err(e) = check(libc::posix_spawn_file_actions_init(&mut setup.actions)) {
            libc::posix_spawnattr_destroy(&mut setup.attr);
            return Err(e);
        }
        let flags = libc::POSIX_SPAWN_SETSID
            | libc::POSIX_SPAWN_SETSIGMASK as libc::c_short
            | libc::POSIX_SPAWN_SETSIGDEF as libc::c_short;
        check(libc::posix_spawnattr_setflags(&mut setup.attr, flags))?;
        let mut none: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut none);
        check(libc::posix_spawnattr_setsigmask(&mut setup.attr, &none))?;
        let mut all: libc::sigset_t = std::mem::zeroed();
        libc::sigfillset(&mut all);
        check(libc::posix_spawnattr_setsigdefault(&mut setup.attr, &all))?;
        // Not O_CLOEXEC: these become the child's stdout and stderr.
        let append = libc::O_WRONLY | libc::O_CREAT | libc::O_APPEND;
        check(libc::posix_spawn_file_actions_addopen(
            &mut setup.actions,
            0,
            devnull.as_ptr(),
            libc::O_RDONLY,
            0,
        ))?;
        check(libc::posix_spawn_file_actions_addopen(
            &mut setup.actions,
            1,
            stdout.as_ptr(),
            append,
            0o644,
        ))?;
        check(libc::posix_spawn_file_actions_addopen(
            &mut setup.actions,
            2,
            stderr.as_ptr(),
            append,
            0o644,
        ))?;
        check(libc::posix_spawn_file_actions_addchdir_np(
            &mut setup.actions,
            cwd.as_ptr(),
        ))?;
        let mut pid: libc::pid_t = 0;
        check(libc::posix_spawn(
            &mut pid,
            program.as_ptr(),
            &setup.actions,
            &setup.attr,
            argv_ptrs.as_ptr(),
            envp_ptrs.as_ptr(),
        ))?;
        Ok(pid as u32)
    }
}

/// A pidfd for process `pid` (Linux 5.3 and later).
pub(crate) fn pidfd_open(pid: u32) -> io::Result<OwnedFd> {
    // SAFETY: pidfd_open takes a pid and flags and returns a new file
    // descriptor or -1; the descriptor is owned by the returned value.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid as libc::pid_t, 0) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fd` is a fresh descriptor nobody else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as RawFd) })
}

/// Sends `signal` to the process behind `pidfd`.
pub(crate) fn pidfd_send_signal(pidfd: RawFd, signal: Signal) -> io::Result<()> {
    // SAFETY: the syscall reads only its scalar arguments (no siginfo is
    // passed).
    let rc = unsafe {
        libc::syscall(
            libc::SYS_pidfd_send_signal,
            pidfd,
            signal as libc::c_int,
            std::ptr::null::<libc::siginfo_t>(),
            0,
        )
    };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Registers a pidfd with tokio's reactor, to await the process's exit.
pub(crate) fn register_pidfd(fd: OwnedFd) -> io::Result<tokio::io::unix::AsyncFd<OwnedFd>> {
    // SAFETY: the `AsyncFd` owns the descriptor: it is neither closed nor
    // replaced while registered, and is deregistered before it is closed.
    unsafe { tokio::io::unix::AsyncFd::register_with_interest(fd, tokio::io::Interest::READABLE) }
        .map_err(|e| e.into_parts().1)
}

/// The calling thread's id (the id a cgroup v1 `tasks` file takes).
pub(crate) fn gettid() -> u32 {
    // SAFETY: gettid takes no arguments and cannot fail.
    unsafe { libc::gettid() as u32 }
}

/// A new non-blocking, close-on-exec eventfd (for cgroup v1 memory
/// events).
pub(crate) fn eventfd() -> io::Result<OwnedFd> {
    // SAFETY: eventfd takes an initial value and flags and returns a new
    // descriptor or -1; the descriptor is owned by the returned value.
    let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fd` is a fresh descriptor nobody else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Registers an eventfd with tokio's reactor, to await its events.
pub(crate) fn register_eventfd(fd: OwnedFd) -> io::Result<tokio::io::unix::AsyncFd<OwnedFd>> {
    // SAFETY: as for `register_pidfd`: the `AsyncFd` owns the descriptor.
    unsafe { tokio::io::unix::AsyncFd::register_with_interest(fd, tokio::io::Interest::READABLE) }
        .map_err(|e| e.into_parts().1)
}
