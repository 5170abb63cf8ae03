//! The one place the containerizer needs `unsafe`: an eventfd (cgroup
//! v1's memory events) and registering a descriptor with tokio's reactor
//! to await its events.

#![allow(unsafe_code)]

use std::io;
use std::os::fd::{FromRawFd, OwnedFd};

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

/// Registers a descriptor that becomes readable on events (an eventfd, an
/// inotify descriptor) with tokio's reactor, to await them.
pub(crate) fn register_readable(fd: OwnedFd) -> io::Result<tokio::io::unix::AsyncFd<OwnedFd>> {
    // SAFETY: the `AsyncFd` owns the descriptor: it is neither closed nor
    // replaced while registered, and is deregistered before it is closed.
    unsafe { tokio::io::unix::AsyncFd::register_with_interest(fd, tokio::io::Interest::READABLE) }
        .map_err(|e| e.into_parts().1)
}
