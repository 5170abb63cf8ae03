//! Starting a command whose process enters its cgroups itself, between
//! its birth and its `exec`: a child that shares this process's memory
//! until it execs (`clone` with `CLONE_VM | CLONE_VFORK`, as `posix_spawn`
//! does), so nothing of this process is copied, and which writes `0` into
//! each of the container's `tasks` files before anything of the command
//! runs. The thread that starts it never leaves its own cgroups: on
//! cgroup v1 that is half the moves of entering the container, spawning
//! and coming back.
//!
//! The entry files an executor keeps open ([`keep_high`]) sit at or above
//! a floor of descriptor numbers. The child shares this process's
//! descriptor table until it has entered its container, then takes a
//! table of its own holding only the descriptors below the floor
//! (`close_range` with `CLOSE_RANGE_UNSHARE`): each kept file would
//! otherwise be copied into, and closed again in, every command started.

use std::ffi::{CString, OsStr, OsString};
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::{Path, PathBuf};
use std::process::Command;

/// Stack of the child until it execs (it runs a few system calls).
const CHILD_STACK_BYTES: usize = 64 << 10;

/// Why a command did not start.
#[derive(Debug)]
pub(crate) enum Failed {
    /// Its process could not write into one of the entry files.
    Entering(std::io::Error),
    /// Anything else.
    Other(std::io::Error),
}

impl Failed {
    pub(crate) fn into_error(self) -> std::io::Error {
        match self {
            Failed::Entering(e) | Failed::Other(e) => e,
        }
    }
}

impl From<std::io::Error> for Failed {
    fn from(e: std::io::Error) -> Self {
        Failed::Other(e)
    }
}

/// Starts what `command` describes (program, arguments, environment
/// changes and working directory; `argv0` replaces its first argument),
/// with stdin on `/dev/null`, stdout and stderr on `stdout` and `stderr`
/// (this process's own where `None`), as the leader of a new process
/// group, after the child wrote `0` into each of `enter`. Returns the
/// child's pid; the caller reaps it.
pub(crate) fn spawn_entering(
    command: &Command,
    argv0: Option<&OsStr>,
    stdout: Option<&std::fs::File>,
    stderr: Option<&std::fs::File>,
    enter: &[std::fs::File],
) -> Result<u32, Failed> {
    let program = resolve(command)?;
    let program = cstring(program.into_os_string())?;
    let mut argv = vec![cstring(
        argv0.unwrap_or(command.get_program()).to_os_string(),
    )?];
    for arg in command.get_args() {
        argv.push(cstring(arg.to_os_string())?);
    }
    let env = environment(command)?;
    let cwd = command
        .get_current_dir()
        .map(|dir| cstring(dir.as_os_str().to_os_string()))
        .transpose()?;
    let null = std::fs::File::open("/dev/null")?;
    let mut argv_ptrs: Vec<*const libc::c_char> = argv.iter().map(|a| a.as_ptr()).collect();
    argv_ptrs.push(std::ptr::null());
    let mut env_ptrs: Vec<*const libc::c_char> = env.iter().map(|e| e.as_ptr()).collect();
    env_ptrs.push(std::ptr::null());
    let enter_fds: Vec<RawFd> = enter.iter().map(AsRawFd::as_raw_fd).collect();
    let own = |file: Option<&std::fs::File>, fd: RawFd| file.map_or(fd, AsRawFd::as_raw_fd);
    let floor = kept_floor();
    let mut child = Child {
        floor: floor.unwrap_or(0),
        program: program.as_ptr(),
        argv: argv_ptrs.as_ptr(),
        env: env_ptrs.as_ptr(),
        cwd: cwd.as_ref().map_or(std::ptr::null(), |c| c.as_ptr()),
        stdio: [null.as_raw_fd(), own(stdout, 1), own(stderr, 2)],
        enter: enter_fds.as_ptr(),
        enter_len: enter_fds.len(),
        error: 0,
        step: "",
    };
    // Not zeroed: the child writes what it reads (zeroing 64 KiB was a
    // visible share of a spawn).
    let mut stack = Vec::<u8>::with_capacity(CHILD_STACK_BYTES);
    let pid = start(&mut child, stack.spare_capacity_mut())?;
    if child.error != 0 {
        // It exited (with 127) without running anything.
        let _ = nix::sys::wait::waitpid(nix::unistd::Pid::from_raw(pid), None);
        let e = std::io::Error::from_raw_os_error(child.error);
        let e = std::io::Error::new(e.kind(), format!("{}: {e}", child.step));
        return Err(match child.step {
            ENTERING => Failed::Entering(e),
            _ => Failed::Other(e),
        });
    }
    Ok(pid as u32)
}

/// The step of [`Child::step`] that writes into the entry files.
const ENTERING: &str = "cannot enter the task's container";

/// What the child needs, prepared beforehand: it allocates nothing.
#[repr(C)]
struct Child {
    /// The descriptors it keeps are those below this (0: all).
    floor: RawFd,
    program: *const libc::c_char,
    argv: *const *const libc::c_char,
    env: *const *const libc::c_char,
    /// Null: stay in this process's working directory.
    cwd: *const libc::c_char,
    /// stdin, stdout, stderr.
    stdio: [RawFd; 3],
    enter: *const RawFd,
    enter_len: usize,
    /// Set by the child when it could not exec: the errno.
    error: i32,
    /// Set with `error`: what failed.
    step: &'static str,
}

/// Clones the child with every signal blocked in this thread (so no
/// handler of this process runs in the child, which shares its memory)
/// and waits for it to exec or exit.
#[allow(unsafe_code)]
fn start(
    child: &mut Child,
    stack: &mut [std::mem::MaybeUninit<u8>],
) -> std::io::Result<libc::pid_t> {
    // SAFETY: sigset_t is plain data; sigfillset and pthread_sigmask
    // only write the sets passed.
    let mut all: libc::sigset_t = unsafe { std::mem::zeroed() };
    let mut old: libc::sigset_t = unsafe { std::mem::zeroed() };
    unsafe {
        libc::sigfillset(&mut all);
        libc::pthread_sigmask(libc::SIG_SETMASK, &all, &mut old);
    }
    // The stack grows down from its end, 16-byte aligned.
    let top = stack.as_mut_ptr_range().end as usize & !15;
    // SAFETY: `child_main` runs on `stack`, which outlives the child's
    // use of it: with CLONE_VFORK this thread is suspended until the
    // child execs or exits. The child only reads `child` and writes its
    // error fields, which this thread reads after it resumes.
    let pid = unsafe {
        libc::clone(
            child_main,
            top as *mut libc::c_void,
            libc::CLONE_VM | libc::CLONE_VFORK | libc::CLONE_FILES | libc::SIGCHLD,
            child as *mut Child as *mut libc::c_void,
        )
    };
    let error = std::io::Error::last_os_error();
    // SAFETY: restores the mask saved above.
    unsafe {
        libc::pthread_sigmask(libc::SIG_SETMASK, &old, std::ptr::null_mut());
    }
    if pid < 0 {
        return Err(error);
    }
    Ok(pid)
}

/// The child: enters the container, sets up its descriptors, directory,
/// process group and signals, and execs. Only system calls on what was
/// prepared: no allocation, no lock.
#[allow(unsafe_code)]
extern "C" fn child_main(arg: *mut libc::c_void) -> libc::c_int {
    // SAFETY: `arg` is the `Child` that `start` passed, alive and not
    // touched by the suspended parent until this child execs or exits.
    let child = unsafe { &mut *(arg as *mut Child) };
    let fail = |child: &mut Child, step: &'static str| -> ! {
        child.error = std::io::Error::last_os_error()
            .raw_os_error()
            .unwrap_or(libc::EIO);
        child.step = step;
        // SAFETY: ends the child without running this process's exit
        // handlers (its memory is the parent's).
        unsafe { libc::_exit(127) }
    };
    // SAFETY: each call below is an async-signal-safe system call on
    // descriptors, strings and arrays prepared by the parent.
    unsafe {
        for i in 0..child.enter_len {
            if libc::write(*child.enter.add(i), b"0".as_ptr().cast(), 1) != 1 {
                fail(child, ENTERING);
            }
        }
        // A descriptor table of its own (it shares the parent's until
        // here): without the kept files where it can.
        let below = child.floor > 0 && child.stdio.iter().all(|fd| *fd < child.floor);
        let unshared = below
            && libc::syscall(
                libc::SYS_close_range,
                child.floor as libc::c_uint,
                libc::c_uint::MAX,
                libc::CLOSE_RANGE_UNSHARE,
            ) == 0;
        if !unshared && libc::unshare(libc::CLONE_FILES) != 0 {
            fail(child, "cannot set up the command's descriptors");
        }
        for (target, fd) in child.stdio.into_iter().enumerate() {
            let target = target as RawFd;
            if fd == target {
                // Kept across exec.
                let flags = libc::fcntl(fd, libc::F_GETFD);
                if flags < 0 || libc::fcntl(fd, libc::F_SETFD, flags & !libc::FD_CLOEXEC) < 0 {
                    fail(child, "cannot set up the command's output");
                }
            } else if libc::dup2(fd, target) < 0 {
                fail(child, "cannot set up the command's output");
            }
        }
        if !child.cwd.is_null() && libc::chdir(child.cwd) != 0 {
            fail(child, "cannot enter the command's directory");
        }
        if libc::setpgid(0, 0) != 0 {
            fail(child, "cannot start a process group");
        }
        // Handlers of this process become the default (the command
        // would not have them anyway after exec, and until then they
        // would run on the parent's memory); SIGPIPE too, which Rust
        // programs ignore.
        for signal in 1..libc::SIGRTMAX() {
            if signal == libc::SIGKILL || signal == libc::SIGSTOP {
                continue;
            }
            let mut action: libc::sigaction = std::mem::zeroed();
            if libc::sigaction(signal, std::ptr::null(), &mut action) != 0 {
                continue;
            }
            let handled =
                action.sa_sigaction != libc::SIG_DFL && action.sa_sigaction != libc::SIG_IGN;
            if handled || signal == libc::SIGPIPE {
                let mut default: libc::sigaction = std::mem::zeroed();
                default.sa_sigaction = libc::SIG_DFL;
                libc::sigaction(signal, &default, std::ptr::null_mut());
            }
        }
        let mut none: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut none);
        libc::sigprocmask(libc::SIG_SETMASK, &none, std::ptr::null_mut());
        libc::execve(child.program, child.argv, child.env);
    }
    fail(child, "cannot run the command")
}

/// The floor of the descriptor numbers of kept files (see [`keep_high`]):
/// half this process's limit on open files, at most 1024, once the soft
/// limit is raised to the hard one; `None` when the limit is too low to
/// keep any apart.
fn kept_floor() -> Option<RawFd> {
    static FLOOR: std::sync::OnceLock<Option<RawFd>> = std::sync::OnceLock::new();
    *FLOOR.get_or_init(|| {
        use nix::sys::resource::{getrlimit, setrlimit, Resource};
        let (soft, hard) = getrlimit(Resource::RLIMIT_NOFILE).ok()?;
        let limit = if soft < hard && setrlimit(Resource::RLIMIT_NOFILE, hard, hard).is_ok() {
            hard
        } else {
            soft
        };
        let floor = (limit / 2).min(1024);
        (floor >= 64).then_some(floor as RawFd)
    })
}

/// `file`, moved to a descriptor at or above the floor of kept files,
/// which the commands this process starts never get a copy of (as
/// `file` if there is no such floor or no free descriptor there).
#[allow(unsafe_code)]
pub(crate) fn keep_high(file: std::fs::File) -> std::fs::File {
    use std::os::fd::FromRawFd;
    let Some(floor) = kept_floor() else {
        return file;
    };
    // SAFETY: F_DUPFD_CLOEXEC duplicates an open descriptor this
    // function owns (through `file`) and returns a new one or -1.
    let high = unsafe { libc::fcntl(file.as_raw_fd(), libc::F_DUPFD_CLOEXEC, floor) };
    if high < 0 {
        return file;
    }
    // SAFETY: `high` is a new open descriptor nothing else owns.
    unsafe { std::fs::File::from_raw_fd(high) }
}

/// The program to exec: as given when it names a path, else the first
/// executable file of that name in the command's `PATH` (this process's
/// when the command does not set one), as `std::process` looks it up.
fn resolve(command: &Command) -> std::io::Result<PathBuf> {
    let program = command.get_program();
    if program.as_bytes().contains(&b'/') {
        return Ok(PathBuf::from(program));
    }
    let path = command
        .get_envs()
        .find(|(key, _)| *key == "PATH")
        .map(|(_, value)| value.map(OsStr::to_os_string))
        .unwrap_or_else(|| std::env::var_os("PATH"))
        .unwrap_or_else(|| OsString::from("/bin:/usr/bin"));
    std::env::split_paths(&path)
        .map(|dir| dir.join(program))
        .find(|candidate| executable(candidate))
        .ok_or_else(|| {
            std::io::Error::new(
                std::io::ErrorKind::NotFound,
                format!("{}: not found in PATH", program.to_string_lossy()),
            )
        })
}

fn executable(path: &Path) -> bool {
    path.is_file() && nix::unistd::access(path, nix::unistd::AccessFlags::X_OK).is_ok()
}

/// This process's environment with the command's changes, as
/// `KEY=VALUE` strings.
fn environment(command: &Command) -> std::io::Result<Vec<CString>> {
    let mut env: std::collections::BTreeMap<OsString, OsString> = std::env::vars_os().collect();
    for (key, value) in command.get_envs() {
        match value {
            Some(value) => env.insert(key.to_os_string(), value.to_os_string()),
            None => env.remove(key),
        };
    }
    env.into_iter()
        .map(|(key, value)| {
            let mut pair = key.into_vec();
            pair.push(b'=');
            pair.extend(value.into_vec());
            cstring(OsString::from_vec(pair))
        })
        .collect()
}

fn cstring(value: OsString) -> std::io::Result<CString> {
    CString::new(value.into_vec()).map_err(|_| {
        std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            "a NUL byte in the command's program, arguments or environment",
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn wait(pid: u32) -> nix::sys::wait::WaitStatus {
        nix::sys::wait::waitpid(nix::unistd::Pid::from_raw(pid as i32), None).unwrap()
    }

    #[test]
    fn the_child_runs_the_command_with_its_arguments_environment_and_directory() {
        let dir = tempfile::tempdir().unwrap();
        let out = std::fs::File::create(dir.path().join("out")).unwrap();
        let mut command = Command::new("sh");
        command
            .args(["-c", "echo \"$0 $1 $GREETING $(pwd)\"; trap", "one"])
            .env("GREETING", "hello")
            .current_dir(dir.path());
        let pid =
            spawn_entering(&command, Some(OsStr::new("zero")), Some(&out), None, &[]).unwrap();
        assert_eq!(
            wait(pid),
            nix::sys::wait::WaitStatus::Exited(nix::unistd::Pid::from_raw(pid as i32), 0)
        );
        let text = std::fs::read_to_string(dir.path().join("out")).unwrap();
        // argv[0] as given (`sh -c` names it $0), no trap inherited.
        assert_eq!(
            text.trim(),
            format!(
                "one  hello {}",
                dir.path().canonicalize().unwrap().display()
            )
        );
    }

    #[test]
    fn the_child_leads_its_own_group_with_sigpipe_default_and_no_blocked_signal() {
        let dir = tempfile::tempdir().unwrap();
        let out = std::fs::File::create(dir.path().join("out")).unwrap();
        let mut command = Command::new("/bin/sh");
        command.args([
            "-c",
            "grep -E '^(SigBlk|SigIgn)' /proc/self/status; ps -o pid=,pgid= -p $$",
        ]);
        let pid = spawn_entering(&command, None, Some(&out), None, &[]).unwrap();
        wait(pid);
        let text = std::fs::read_to_string(dir.path().join("out")).unwrap();
        assert!(text.contains("SigBlk:\t0000000000000000"), "{text}");
        // SIGPIPE (13) is not ignored.
        let ignored = text
            .lines()
            .find_map(|l| l.strip_prefix("SigIgn:\t"))
            .map(|hex| u64::from_str_radix(hex.trim(), 16).unwrap())
            .unwrap();
        assert_eq!(ignored & (1 << 12), 0, "{text}");
        let ids: Vec<&str> = text.lines().last().unwrap().split_whitespace().collect();
        assert_eq!(ids[0], ids[1], "{text}");
    }

    #[test]
    fn kept_files_are_above_the_floor_and_not_in_the_command() {
        let dir = tempfile::tempdir().unwrap();
        let entry = keep_high(std::fs::File::create(dir.path().join("tasks")).unwrap());
        let floor = kept_floor().expect("a limit on open files of at least 128");
        assert!(entry.as_raw_fd() >= floor);
        let out = std::fs::File::create(dir.path().join("out")).unwrap();
        let mut command = Command::new("/bin/sh");
        command.args(["-c", "ls /proc/self/fd"]);
        let pid = spawn_entering(&command, None, Some(&out), None, &[entry]).unwrap();
        wait(pid);
        assert_eq!(
            std::fs::read_to_string(dir.path().join("tasks")).unwrap(),
            "0"
        );
        let fds: Vec<RawFd> = std::fs::read_to_string(dir.path().join("out"))
            .unwrap()
            .split_whitespace()
            .map(|fd| fd.parse().unwrap())
            .collect();
        // None of the kept ones (the test harness may pass on others).
        assert!(fds.iter().all(|fd| *fd < floor), "{fds:?}");
    }

    #[test]
    fn a_command_that_cannot_start_is_an_error() {
        let command = Command::new("/nonexistent/agora-command");
        let e = spawn_entering(&command, None, None, None, &[])
            .unwrap_err()
            .into_error();
        assert_eq!(e.kind(), std::io::ErrorKind::NotFound, "{e}");
        assert!(e.to_string().contains("cannot run the command"), "{e}");
        let missing = Command::new("agora-no-such-command");
        let e = spawn_entering(&missing, None, None, None, &[])
            .unwrap_err()
            .into_error();
        assert_eq!(e.kind(), std::io::ErrorKind::NotFound, "{e}");
    }

    #[test]
    fn the_child_writes_zero_into_each_entry_file_before_it_execs() {
        let dir = tempfile::tempdir().unwrap();
        let files: Vec<std::fs::File> = (0..3)
            .map(|i| std::fs::File::create(dir.path().join(format!("tasks-{i}"))).unwrap())
            .collect();
        let pid = spawn_entering(&Command::new("/bin/true"), None, None, None, &files).unwrap();
        wait(pid);
        for i in 0..3 {
            let text = std::fs::read_to_string(dir.path().join(format!("tasks-{i}"))).unwrap();
            assert_eq!(text, "0");
        }
        // A file it cannot write: nothing runs.
        let read_only = std::fs::File::open(dir.path().join("tasks-0")).unwrap();
        let marker = dir.path().join("ran");
        let mut command = Command::new("/bin/touch");
        command.arg(&marker);
        let failed = spawn_entering(&command, None, None, None, &[read_only]).unwrap_err();
        assert!(matches!(failed, Failed::Entering(_)), "{failed:?}");
        assert!(!marker.exists());
    }
}
