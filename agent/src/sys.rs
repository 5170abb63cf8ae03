//! The one place the agent needs `unsafe`: making a forked executor the
//! leader of a new session (and so of a new process group) between `fork`
//! and `exec`.

use tokio::process::Command;

/// Makes the child of `command` call `setsid()` before it execs, so it runs
/// in its own session and process group, detached from the agent's
/// terminal and signals.
#[allow(unsafe_code)]
pub(crate) fn setsid_on_spawn(command: &mut Command) {
    // SAFETY: the closure runs in the forked child before exec, where only
    // async-signal-safe functions may be called. It calls only setsid(2),
    // which is async-signal-safe, touches no memory shared with the parent,
    // and converts the errno into an `io::Error` without allocating.
    unsafe {
        command.pre_exec(|| {
            nix::unistd::setsid()
                .map(|_| ())
                .map_err(std::io::Error::from)
        });
    }
}
