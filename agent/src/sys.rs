//! The one place the agent needs `unsafe`: starting an executor with
//! `posix_spawn` in a session of its own (or, into a cgroup v2
//! container, `clone3` with `CLONE_INTO_CGROUP`), and the Linux pidfd
//! calls that let the agent wait for and signal exactly the process it
//! started.
//!
//! `posix_spawn` (glibc's is built on `clone(CLONE_VM | CLONE_VFORK)`)
//! costs the same whatever the agent's size, where `fork` copies the
//! page tables of a process with a large heap. A pidfd names one process
//! for good: a signal sent through it can never reach a later process
//! that was given the same pid.

#![allow(unsafe_code)]

use std::cell::Cell;
use std::ffi::{CStr, CString, OsStr};
use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
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
    /// Descriptors given to the child as stdout and stderr instead of
    /// the files (the write ends of its loggers' pipes).
    pub(crate) output_fds: Option<(BorrowedFd<'a>, BorrowedFd<'a>)>,
    /// The user to run as (another than the agent's): the child takes its
    /// groups, gid and uid before it opens its output files.
    pub(crate) user: Option<&'a crate::users::RunAs>,
    /// A descriptor the child gets as
    /// [`agora_proto::env::SECRETS_FD_NUMBER`] (see [`secrets_channel`]).
    pub(crate) secrets: Option<BorrowedFd<'a>>,
}

/// `CLONE_INTO_CGROUP` (bit 33, which libc's `c_int` constant overflows).
const CLONE_INTO_CGROUP: u64 = 0x2_0000_0000;

thread_local! {
    /// The cgroup v2 directory that processes this thread spawns are
    /// born in, while [`spawn_into_cgroup`] runs.
    static SPAWN_CGROUP: Cell<Option<RawFd>> = const { Cell::new(None) };
}

/// `struct clone_args` of `clone3` (Linux 5.7's layout, which has
/// `cgroup`).
#[repr(C)]
#[derive(Default)]
struct CloneArgs {
    flags: u64,
    pidfd: u64,
    child_tid: u64,
    parent_tid: u64,
    exit_signal: u64,
    stack: u64,
    stack_size: u64,
    tls: u64,
    set_tid: u64,
    set_tid_size: u64,
    cgroup: u64,
}

/// What the child of [`clone_child`] does before `exec`: the steps
/// `spawn_session` asks of `posix_spawn`, prepared beforehand (the child
/// may not allocate).
struct ChildSteps<'a> {
    program: &'a CStr,
    argv: &'a [*mut libc::c_char],
    envp: &'a [*mut libc::c_char],
    cwd: &'a CStr,
    stdout: &'a CStr,
    stderr: &'a CStr,
    /// Descriptors that become stdout and stderr instead of the files.
    output_fds: Option<(RawFd, RawFd)>,
    /// Groups, gid and uid to switch to.
    user: Option<(&'a [libc::gid_t], libc::gid_t, libc::uid_t)>,
    /// Given to the child as [`agora_proto::env::SECRETS_FD_NUMBER`].
    secrets: Option<RawFd>,
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
/// given files, in `args.cwd`, as `args.user` when given. Returns its
/// pid; errors of the child before `exec` (a missing program or
/// directory, a refused user switch) are returned here.
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
    let cgroup = SPAWN_CGROUP.with(Cell::get);
    // posix_spawn cannot switch users: that takes a clone of our own.
    if cgroup.is_some() || args.user.is_some() {
        let steps = ChildSteps {
            program: &program,
            argv: &argv_ptrs,
            envp: &envp_ptrs,
            cwd: &cwd,
            stdout: &stdout,
            stderr: &stderr,
            output_fds: args
                .output_fds
                .map(|(out, err)| (out.as_raw_fd(), err.as_raw_fd())),
            user: args.user.map(|u| (&u.groups[..], u.gid, u.uid)),
            secrets: args.secrets.map(|fd| fd.as_raw_fd()),
        };
        return clone_child(&steps, cgroup);
    }

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
        if let Some((out, err)) = args.output_fds {
            // A dup2'd descriptor is not close-on-exec in the child.
            check(libc::posix_spawn_file_actions_adddup2(
                &mut setup.actions,
                out.as_raw_fd(),
                1,
            ))?;
            check(libc::posix_spawn_file_actions_adddup2(
                &mut setup.actions,
                err.as_raw_fd(),
                2,
            ))?;
        } else {
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
        }
        if let Some(secrets) = args.secrets {
            // Not close-on-exec in the child (a dup2 to another number).
            check(libc::posix_spawn_file_actions_adddup2(
                &mut setup.actions,
                secrets.as_raw_fd(),
                agora_proto::env::SECRETS_FD_NUMBER,
            ))?;
        }
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

/// Runs `spawn` with every [`spawn_session`] it makes on this thread
/// starting its process in the cgroup v2 directory `cgroup`: the cgroup
/// v2 counterpart of a thread entering a container's v1 cgroups around a
/// spawn, which v2 cannot do (a process's threads share one cgroup, so
/// moving the thread would move the whole agent).
pub(crate) fn spawn_into_cgroup<T>(cgroup: BorrowedFd<'_>, spawn: impl FnOnce() -> T) -> T {
    struct Restore(Option<RawFd>);
    impl Drop for Restore {
        fn drop(&mut self) {
            SPAWN_CGROUP.with(|c| c.set(self.0));
        }
    }
    let _restore = Restore(SPAWN_CGROUP.with(|c| c.replace(Some(cgroup.as_raw_fd()))));
    spawn()
}

/// [`spawn_session`] into the cgroup v2 directory `cgroup`, or as another
/// user: `clone3` (with `CLONE_INTO_CGROUP`, Linux 5.7, so the child is
/// in the cgroup from its first instruction), then in the child the steps
/// `posix_spawn` would take, the user switch, and `execve`. The child is a copy of the agent (a fork:
/// sharing the agent's memory, as `posix_spawn`'s vfork-like clone does,
/// needs the child to start on a stack of its own, which a raw `clone3`
/// from Rust cannot give it), so this costs a copy of the agent's page
/// tables (`spawn_cost_v2` measures it). A step that
/// fails in the child is reported (its errno) through a close-on-exec
/// pipe, and the child reaped, as `posix_spawn` does.
fn clone_child(steps: &ChildSteps<'_>, cgroup: Option<RawFd>) -> io::Result<u32> {
    let mut fds = [0 as libc::c_int; 2];
    // SAFETY: pipe2 writes two descriptors into `fds`, owned below.
    check_errno(unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) })?;
    // SAFETY: both are fresh descriptors nobody else owns.
    let (report_read, report_write) =
        unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
    let mut args = CloneArgs {
        flags: if cgroup.is_some() {
            CLONE_INTO_CGROUP
        } else {
            0
        },
        exit_signal: libc::SIGCHLD as u64,
        cgroup: cgroup.map_or(0, |fd| fd as u64),
        ..CloneArgs::default()
    };
    // SAFETY: the signal sets are initialised by sigfillset before use.
    // Every signal is blocked across the clone so that no handler of the
    // agent runs in the child (glibc's posix_spawn does the same); the
    // child resets the handlers before it unblocks them.
    let (pid, clone_error) = unsafe {
        let mut all: libc::sigset_t = std::mem::zeroed();
        let mut old: libc::sigset_t = std::mem::zeroed();
        libc::sigfillset(&mut all);
        libc::pthread_sigmask(libc::SIG_SETMASK, &all, &mut old);
        let pid = libc::syscall(
            libc::SYS_clone3,
            &mut args as *mut CloneArgs,
            std::mem::size_of::<CloneArgs>(),
        );
        if pid == 0 {
            exec_child(steps, report_write.as_raw_fd());
        }
        let clone_error = io::Error::last_os_error();
        libc::pthread_sigmask(libc::SIG_SETMASK, &old, std::ptr::null_mut());
        (pid, clone_error)
    };
    drop(report_write);
    if pid < 0 {
        let hint = match clone_error.raw_os_error() {
            Some(libc::ENOSYS | libc::E2BIG | libc::EINVAL) if cgroup.is_some() => {
                " (starting a process in a cgroup v2 container needs Linux 5.7 or later)"
            }
            _ => "",
        };
        return Err(io::Error::new(
            clone_error.kind(),
            format!("clone3: {clone_error}{hint}"),
        ));
    }
    let pid = pid as libc::pid_t;
    let mut errno = [0u8; 4];
    let read = loop {
        match nix::unistd::read(&report_read, &mut errno) {
            Err(nix::errno::Errno::EINTR) => continue,
            other => break other,
        }
    };
    if read == Ok(0) {
        return Ok(pid as u32);
    }
    // The child failed before exec (and exited) or cannot be heard from.
    if read.is_err() {
        let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), Signal::SIGKILL);
    }
    let _ = nix::sys::wait::waitpid(nix::unistd::Pid::from_raw(pid), None);
    Err(match read {
        Ok(4) => io::Error::from_raw_os_error(i32::from_ne_bytes(errno)),
        Ok(_) => io::Error::other("the child reported a partial error"),
        Err(e) => e.into(),
    })
}

/// The child of [`clone_child`]: it is a copy of a multithreaded
/// process, so only async-signal-safe calls (no allocation, no locks).
/// Never returns: `execve`, or `_exit` after reporting errno on
/// `report`.
///
/// # Safety
/// Call only in the child of a fork-like `clone`.
unsafe fn exec_child(steps: &ChildSteps<'_>, report: RawFd) -> ! {
    unsafe fn fail(report: RawFd) -> ! {
        // SAFETY: errno is this thread's; write and _exit are
        // async-signal-safe.
        unsafe {
            let errno = *libc::__errno_location();
            libc::write(report, (&errno as *const libc::c_int).cast(), 4);
            libc::_exit(127)
        }
    }
    /// Opens `path` as descriptor `target`.
    unsafe fn redirect(target: libc::c_int, path: &CStr, flags: libc::c_int) -> bool {
        // SAFETY: open, dup2 and close are async-signal-safe; `path` is
        // a valid C string.
        unsafe {
            let fd = libc::open(path.as_ptr(), flags, 0o644 as libc::c_uint);
            if fd < 0 {
                return false;
            }
            if fd != target {
                if libc::dup2(fd, target) < 0 {
                    return false;
                }
                libc::close(fd);
            }
            true
        }
    }
    // SAFETY: the calls are async-signal-safe, and the pointers point
    // into the parent's prepared strings, copied into this process.
    unsafe {
        if libc::setsid() < 0 {
            fail(report);
        }
        let mut default: libc::sigaction = std::mem::zeroed();
        default.sa_sigaction = libc::SIG_DFL;
        for signal in 1..65 {
            if signal != libc::SIGKILL && signal != libc::SIGSTOP {
                libc::sigaction(signal, &default, std::ptr::null_mut());
            }
        }
        let mut none: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut none);
        libc::pthread_sigmask(libc::SIG_SETMASK, &none, std::ptr::null_mut());
        // Raw system calls: glibc's set*id wrappers would try to reach
        // threads of the agent this copy does not have.
        if let Some((groups, gid, uid)) = steps.user {
            if libc::syscall(libc::SYS_setgroups, groups.len(), groups.as_ptr()) < 0
                || libc::syscall(libc::SYS_setresgid, gid, gid, gid) < 0
                || libc::syscall(libc::SYS_setresuid, uid, uid, uid) < 0
            {
                fail(report);
            }
        }
        let append = libc::O_WRONLY | libc::O_CREAT | libc::O_APPEND;
        let output = match steps.output_fds {
            Some((out, err)) => libc::dup2(out, 1) >= 0 && libc::dup2(err, 2) >= 0,
            None => redirect(1, steps.stdout, append) && redirect(2, steps.stderr, append),
        };
        if !redirect(0, c"/dev/null", libc::O_RDONLY)
            || !output
            || libc::chdir(steps.cwd.as_ptr()) < 0
        {
            fail(report);
        }
        if let Some(secrets) = steps.secrets {
            if libc::dup2(secrets, agora_proto::env::SECRETS_FD_NUMBER) < 0 {
                fail(report);
            }
        }
        libc::execve(
            steps.program.as_ptr(),
            steps.argv.as_ptr() as *const *const libc::c_char,
            steps.envp.as_ptr() as *const *const libc::c_char,
        );
        fail(report)
    }
}

/// A Unix socket holding `secrets`, whose other end is closed: what an
/// executor reads its secrets from, to their end. A socket, not a pipe:
/// `/proc/PID/fd/N` cannot open a socket, so a process of the executor's
/// user cannot read the secrets through the executor's descriptor table.
/// The descriptor is close-on-exec and numbered above the standard
/// descriptors and the one it becomes in the executor, so that
/// [`spawn_session`]'s `dup2` makes a copy the executor keeps.
pub(crate) fn secrets_channel(secrets: &[u8]) -> io::Result<OwnedFd> {
    use std::io::Write;
    let (mut ours, theirs) = std::os::unix::net::UnixStream::pair()?;
    // A few hundred bytes: far below a socket's buffer.
    ours.write_all(secrets)?;
    drop(ours);
    let high = nix::fcntl::fcntl(
        &theirs,
        nix::fcntl::FcntlArg::F_DUPFD_CLOEXEC(agora_proto::env::SECRETS_FD_NUMBER + 1),
    )?;
    // SAFETY: `high` is a new open descriptor nobody else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(high) })
}

fn check_errno(rc: libc::c_int) -> io::Result<()> {
    if rc < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
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

#[cfg(test)]
mod tests {
    use std::os::fd::AsFd;
    use std::path::PathBuf;
    use std::time::{Duration, Instant};

    use super::*;
    use crate::launcher::{LaunchSpec, Process};

    fn spec(program: &str, args: &[&str], sandbox: &Path) -> LaunchSpec {
        LaunchSpec {
            program: program.into(),
            argv0: None,
            args: args.iter().map(|a| a.to_string()).collect(),
            env: vec![],
            secrets: Vec::new(),
            sandbox: sandbox.to_path_buf(),
            fetch: Vec::new(),
            limits: None,
            user: String::new(),
            logger: None,
        }
    }

    /// A directory of this test's own in the host's cgroup2 hierarchy
    /// (no controllers needed: processes can be placed and killed there
    /// on any host with one, hybrid ones included), removed on drop;
    /// `None` (with the reason printed) where there is none or it cannot
    /// be written.
    struct V2Dir(PathBuf);

    impl V2Dir {
        fn new(test: &str) -> Option<V2Dir> {
            let skip = |why: String| {
                eprintln!("skipping {test}: {why}");
                None
            };
            if !nix::unistd::Uid::effective().is_root() {
                return skip("not running as root".into());
            }
            let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
            let Some(mount) = mountinfo.lines().find_map(|line| {
                let (fields, fs) = line.split_once(" - ")?;
                fs.starts_with("cgroup2 ")
                    .then(|| fields.split(' ').nth(4).map(PathBuf::from))?
            }) else {
                return skip("no cgroup2 hierarchy is mounted".into());
            };
            let dir = mount.join(format!("agora-test-{}-{test}", std::process::id()));
            if let Err(e) = std::fs::create_dir(&dir) {
                return skip(format!("cannot create {}: {e}", dir.display()));
            }
            Some(V2Dir(dir))
        }
    }

    impl Drop for V2Dir {
        fn drop(&mut self) {
            let _ = std::fs::write(self.0.join("cgroup.kill"), "1");
            let deadline = Instant::now() + Duration::from_secs(5);
            while std::fs::remove_dir(&self.0).is_err() && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(10));
            }
        }
    }

    fn reap(mut process: Process) {
        let deadline = Instant::now() + Duration::from_secs(5);
        while process.reap().is_none() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_micros(200));
        }
    }

    /// The agent's own half of a cgroup v2 launch (the containerizer
    /// hands it the container's directory): `clone3` starts the executor
    /// in that cgroup, and the agent stays where it was.
    #[test]
    fn a_process_spawned_into_a_v2_cgroup_is_born_there() {
        let Some(dir) = V2Dir::new("v2birth") else {
            return;
        };
        let sandbox = tempfile::tempdir().unwrap();
        let cgroup = std::fs::File::open(&dir.0).unwrap();
        let sleep = spec("/bin/sleep", &["1000"], sandbox.path());
        let process = spawn_into_cgroup(cgroup.as_fd(), || Process::spawn(&sleep)).unwrap();
        let name = dir.0.file_name().unwrap().to_str().unwrap().to_string();
        let own = std::fs::read_to_string(format!("/proc/{}/cgroup", process.pid())).unwrap();
        assert!(
            own.lines()
                .any(|l| l.starts_with("0::") && l.ends_with(&format!("/{name}"))),
            "{own}"
        );
        let thread = std::fs::read_to_string("/proc/thread-self/cgroup").unwrap();
        assert!(!thread.contains(&name), "{thread}");
        // Without it, what this thread spawns is born where it is.
        let plain = Process::spawn(&sleep).unwrap();
        let theirs = std::fs::read_to_string(format!("/proc/{}/cgroup", plain.pid())).unwrap();
        assert!(!theirs.contains(&name), "{theirs}");
        for p in [&process, &plain] {
            p.signal_group(Signal::SIGKILL);
        }
        reap(process);
        reap(plain);
    }

    /// What starting an executor in a v2 cgroup costs (`clone3`, a fork
    /// of the agent) against a plain `posix_spawn`, with a small heap and
    /// with 256 MiB touched. Prints; never gates. Run with
    /// `cargo test -p agora-agent spawn_cost_v2 -- --ignored --nocapture`.
    #[test]
    #[ignore]
    fn spawn_cost_v2() {
        let Some(dir) = V2Dir::new("v2cost") else {
            return;
        };
        let cgroup = std::fs::File::open(&dir.0).unwrap();
        let sandbox = tempfile::tempdir().unwrap();
        let true_spec = spec("/bin/true", &[], sandbox.path());
        let n = 200;
        let time = |spawn: &dyn Fn() -> io::Result<Process>| {
            let started = Instant::now();
            for _ in 0..n {
                reap(spawn().unwrap());
            }
            started.elapsed() / n
        };
        let plain = || Process::spawn(&true_spec);
        let inside = || spawn_into_cgroup(cgroup.as_fd(), || Process::spawn(&true_spec));
        let (small_plain, small_inside) = (time(&plain), time(&inside));
        let ballast: Vec<u8> = vec![1; 256 << 20];
        let (big_plain, big_inside) = (time(&plain), time(&inside));
        drop(ballast);
        eprintln!(
            "per launch of /bin/true (spawn and reap): posix_spawn {small_plain:?}, clone3 into a v2 cgroup {small_inside:?} ({:.1}x); with a 256 MiB heap: posix_spawn {big_plain:?}, clone3 {big_inside:?} ({:.1}x)",
            small_inside.as_secs_f64() / small_plain.as_secs_f64(),
            big_inside.as_secs_f64() / big_plain.as_secs_f64(),
        );
    }

    /// What starting an executor in a container of its own costs, through
    /// the containerizer (create, spawn inside, kill, remove), against a
    /// plain `posix_spawn`, and against `fork` (a `Command` with a
    /// pre-exec step) in the same containers, with a small heap and with
    /// 256 MiB touched. Prints; never gates. Run with
    /// `cargo test -p agora-agent spawn_cost -- --ignored --nocapture`.
    #[test]
    #[ignore]
    fn spawn_cost() {
        use agora_containerizer::isolation::{check_cgroups, destroy_cgroups_root};
        use agora_containerizer::{CgroupsConfig, Containerizer, Isolation, Limits};
        use std::os::unix::process::CommandExt;
        let root = format!("agora-test-{}-cost", std::process::id());
        if let Err(why) = check_cgroups(&root) {
            eprintln!("skipping spawn_cost: {why}");
            return;
        }
        let runtime = tokio::runtime::Runtime::new().unwrap();
        let _entered = runtime.enter();
        let config = CgroupsConfig {
            root: root.clone(),
            ..Default::default()
        };
        let mut containerizer = Containerizer::start(Isolation::Cgroups, &config, 1.0).unwrap();
        let sandbox = tempfile::tempdir().unwrap();
        let true_spec = spec("/bin/true", &[], sandbox.path());
        let limits = Limits {
            cpus: 1.0,
            mem_mib: 64.0,
            pids: None,
        };
        let n = 200;
        let started = Instant::now();
        for _ in 0..n {
            reap(Process::spawn(&true_spec).unwrap());
        }
        let plain = started.elapsed() / n;
        let mut containers = |tag: &str, fork: bool| {
            let started = Instant::now();
            for i in 0..n {
                let run = format!("{tag}{i}");
                let (_, container) = containerizer
                    .launch(&run, Some(&limits), None, |birth| {
                        if let Some(cgroup) = birth {
                            // cgroup v2: only the agent's own spawner.
                            let spawn = || Process::spawn(&true_spec);
                            reap(spawn_into_cgroup(cgroup, spawn)?);
                        } else if fork {
                            // SAFETY: the pre-exec step does nothing; it
                            // only makes the standard library fork.
                            let mut child = unsafe {
                                std::process::Command::new("/bin/true")
                                    .pre_exec(|| Ok(()))
                                    .spawn()?
                            };
                            child.wait()?;
                        } else {
                            reap(Process::spawn(&true_spec)?);
                        }
                        Ok(())
                    })
                    .unwrap();
                let container = container.expect("a container");
                container.kill();
                containerizer.remove(container);
                containerizer.finish(Duration::from_secs(1));
            }
            started.elapsed() / n
        };
        let spawned = containers("s", false);
        let forked_small = containers("f", true);
        // A big heap makes fork dearer, as in a busy agent.
        let ballast: Vec<u8> = vec![1; 256 << 20];
        let forked = containers("b", true);
        drop(ballast);
        if let Err(e) = destroy_cgroups_root(&root) {
            eprintln!("cleaning up test cgroups: {e}");
        }
        eprintln!(
            "per launch of /bin/true: posix_spawn {plain:?}; in a container (create, spawn inside, kill, remove): posix_spawn {spawned:?}, fork {forked_small:?}, fork with a 256 MiB heap {forked:?}"
        );
    }
}
