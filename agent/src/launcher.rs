//! Starting executors, waiting for them and signalling them, so that no
//! signal ever reaches a process that is not the executor's.
//!
//! Each executor is started with `posix_spawn` as the leader of its own
//! session (and so of its own process group), with its sandbox as working
//! directory and its output in the sandbox's `stdout` and `stderr` files.
//! The agent holds a pidfd for it: exit is awaited on the pidfd, the exit
//! status is read without reaping (`WNOWAIT`), and the leader stays a
//! zombie until the agent has killed what is left of its session. While
//! the leader is unreaped its pid, and so its process group and session
//! id, cannot be given to another process, so signalling the group is
//! safe; members of the session in other groups are found through
//! `/proc` and signalled through pidfds of their own, after checking
//! (with the pidfd held) that they still belong to the session.
//!
//! An executor re-attached after an agent restart is not the agent's
//! child: its pidfd is opened by pid and checked against the start time
//! recorded at launch, it is never reaped here, and its group is
//! signalled only while its leader is seen alive.

use std::ffi::OsStr;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::ExitStatus;

use nix::sys::signal::{killpg, Signal};
use nix::sys::wait::{waitid, Id, WaitPidFlag, WaitStatus};
use nix::unistd::Pid;
use tokio::io::unix::AsyncFd;

use crate::sys;

/// What to run for an executor.
#[derive(Debug, Clone, PartialEq)]
pub struct LaunchSpec {
    /// The program, resolved through `PATH` when it has no `/`.
    pub program: String,
    /// `argv[0]`, when it should differ from `program`.
    pub argv0: Option<String>,
    /// Arguments after `argv[0]`.
    pub args: Vec<String>,
    /// Variables added to the agent's own environment (less
    /// [`agora_proto::env::SECRET_VARIABLES`], which the agent's own
    /// environment never passes on).
    pub env: Vec<(String, String)>,
    /// Secrets (`NAME=VALUE` as if in the environment) the executor reads
    /// from descriptor [`agora_proto::env::SECRETS_FD_NUMBER`], named by
    /// [`agora_proto::env::SECRETS_FD`] in its environment; none when
    /// empty.
    pub secrets: Vec<(String, String)>,
    /// Working directory; `stdout` and `stderr` are created in it.
    pub sandbox: PathBuf,
    /// URIs fetched into the sandbox before the process starts (see
    /// [`crate::fetch`]).
    pub fetch: Vec<agora_proto::FetchUri>,
    /// What the executor's container is limited to, under
    /// `--isolation cgroups` (`None`: no container).
    pub limits: Option<agora_containerizer::Limits>,
    /// The user the framework names (`FrameworkInfo.user`); the agent
    /// decides whom the executor runs as from it ([`crate::users`]).
    pub user: String,
    /// With `--container-logger logrotate`: the executor's stdout and
    /// stderr go through loggers that rotate the sandbox's files
    /// ([`crate::logrotate`]); `None`: straight into the files.
    pub logger: Option<Box<crate::logrotate::Logrotate>>,
}

/// A process the agent started (or re-attached to), named by a pidfd.
#[derive(Debug)]
pub struct Process {
    pid: u32,
    pidfd: OwnedFd,
    start_time: Option<u64>,
    /// Started by this agent process, which reaps it.
    child: bool,
    reaped: bool,
}

/// Completes when a [`Process`] has exited.
#[derive(Debug)]
pub struct ExitWatch {
    fd: AsyncFd<OwnedFd>,
}

/// The fields of `/proc/PID/stat` the agent uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProcStat {
    /// One-letter state (`R`, `S`, `Z`, ...).
    pub state: char,
    /// Parent pid.
    pub ppid: i32,
    /// Process group.
    pub pgrp: i32,
    /// Session.
    pub session: i32,
    /// Start time in clock ticks since boot.
    pub start_time: u64,
}

// === impl LaunchSpec ===

impl LaunchSpec {
    /// A spec from a [`agora_proto::CommandInfo`]: `/bin/sh -c value` when
    /// `shell`, else `value` with `arguments` (whose first element is argv\[0\]),
    /// after fetching its `uris` into the sandbox.
    pub fn from_command(command: &agora_proto::CommandInfo, sandbox: PathBuf) -> Self {
        let env = command
            .environment
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        if command.shell {
            LaunchSpec {
                program: "/bin/sh".to_string(),
                argv0: None,
                args: vec!["-c".to_string(), command.value.clone()],
                env,
                secrets: Vec::new(),
                sandbox,
                fetch: command.uris.clone(),
                limits: None,
                user: String::new(),
                logger: None,
            }
        } else {
            let mut arguments = command.arguments.iter();
            let argv0 = arguments.next().cloned();
            LaunchSpec {
                program: command.value.clone(),
                argv0,
                args: arguments.cloned().collect(),
                env,
                secrets: Vec::new(),
                sandbox,
                fetch: command.uris.clone(),
                limits: None,
                user: String::new(),
                logger: None,
            }
        }
    }

    /// The environment the executor gets: the agent's own without its
    /// secrets, with `env` set over it.
    fn environment(&self) -> Vec<(Vec<u8>, Vec<u8>)> {
        let mut vars: Vec<(Vec<u8>, Vec<u8>)> = std::env::vars_os()
            .filter(|(k, _)| {
                !self
                    .env
                    .iter()
                    .any(|(key, _)| k.as_bytes() == key.as_bytes())
                    && !agora_proto::env::SECRET_VARIABLES
                        .iter()
                        .any(|secret| k.as_bytes() == secret.as_bytes())
            })
            .map(|(k, v)| (k.as_bytes().to_vec(), v.as_bytes().to_vec()))
            .collect();
        vars.extend(
            self.env
                .iter()
                .map(|(k, v)| (k.as_bytes().to_vec(), v.as_bytes().to_vec())),
        );
        vars
    }

    /// The program's path: as given when it has a `/`, else the first
    /// executable file of that name on the `PATH` the executor gets.
    fn resolve(&self, env: &[(Vec<u8>, Vec<u8>)]) -> std::io::Result<PathBuf> {
        if self.program.contains('/') {
            return Ok(PathBuf::from(&self.program));
        }
        let path = env
            .iter()
            .find(|(k, _)| k == b"PATH")
            .map(|(_, v)| v.clone())
            .unwrap_or_else(|| b"/usr/local/bin:/usr/bin:/bin".to_vec());
        for dir in path.split(|b| *b == b':').filter(|d| !d.is_empty()) {
            let candidate = Path::new(OsStr::from_bytes(dir)).join(&self.program);
            if is_executable(&candidate) {
                return Ok(candidate);
            }
        }
        Err(std::io::Error::new(
            std::io::ErrorKind::NotFound,
            format!("{} not found on PATH", self.program),
        ))
    }
}

fn is_executable(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(path).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

// === impl Process ===

impl Process {
    /// Starts the executor described by `spec` in a new session. The
    /// sandbox must exist. Blocking (a few hundred microseconds): call it
    /// off the async threads.
    pub fn spawn(spec: &LaunchSpec) -> std::io::Result<Process> {
        Process::spawn_as(spec, None)
    }

    /// [`Process::spawn`] as `user` (another than the agent's, which must
    /// be root), with `USER`, `LOGNAME` and `HOME` naming that user.
    pub fn spawn_as(
        spec: &LaunchSpec,
        user: Option<&crate::users::RunAs>,
    ) -> std::io::Result<Process> {
        let outputs = Process::start_loggers(spec, user)?;
        Process::spawn_with_outputs(
            spec,
            user,
            outputs
                .as_ref()
                .map(|(out, err)| (out.as_fd(), err.as_fd())),
        )
    }

    /// Starts the loggers of `spec.logger` (none without one): the write
    /// ends of their pipes, for [`Process::spawn_with_outputs`]. Call it
    /// outside any container: a logger started from a thread inside a
    /// container's cgroup (v1) would be in that container.
    pub fn start_loggers(
        spec: &LaunchSpec,
        user: Option<&crate::users::RunAs>,
    ) -> std::io::Result<Option<(OwnedFd, OwnedFd)>> {
        match &spec.logger {
            Some(logger) => logger
                .start(&spec.sandbox, user.map(|u| (u.uid, u.gid)))
                .map(Some),
            None => Ok(None),
        }
    }

    /// [`Process::spawn_as`] with `outputs` (write ends of loggers'
    /// pipes) as the executor's stdout and stderr instead of the
    /// sandbox's files.
    pub fn spawn_with_outputs(
        spec: &LaunchSpec,
        user: Option<&crate::users::RunAs>,
        outputs: Option<(BorrowedFd<'_>, BorrowedFd<'_>)>,
    ) -> std::io::Result<Process> {
        let mut env = spec.environment();
        let secrets = if spec.secrets.is_empty() {
            None
        } else {
            let mut lines = Vec::new();
            for (name, value) in &spec.secrets {
                lines.extend_from_slice(format!("{name}={value}\n").as_bytes());
            }
            env.push((
                agora_proto::env::SECRETS_FD.as_bytes().to_vec(),
                agora_proto::env::SECRETS_FD_NUMBER.to_string().into_bytes(),
            ));
            Some(sys::secrets_channel(&lines)?)
        };
        if let Some(user) = user {
            for (key, value) in user.environment() {
                env.retain(|(k, _)| k.as_slice() != key.as_bytes());
                env.push((key.into_bytes(), value.into_bytes()));
            }
        }
        let program = spec.resolve(&env)?;
        let argv0 = spec.argv0.as_deref().unwrap_or(&spec.program);
        let mut argv: Vec<&OsStr> = vec![OsStr::new(argv0)];
        argv.extend(spec.args.iter().map(OsStr::new));
        let envp: Vec<Vec<u8>> = env
            .into_iter()
            .map(|(mut k, v)| {
                k.push(b'=');
                k.extend(v);
                k
            })
            .collect();
        let pid = sys::spawn_session(&sys::SpawnArgs {
            program: &program,
            argv: &argv,
            envp: &envp,
            cwd: &spec.sandbox,
            stdout: &spec.sandbox.join("stdout"),
            stderr: &spec.sandbox.join("stderr"),
            output_fds: outputs
                .as_ref()
                .map(|(out, err)| (out.as_fd(), err.as_fd())),
            user,
            secrets: secrets.as_ref().map(AsFd::as_fd),
        })?;
        // The executor has its copy of the secrets' socket.
        drop(secrets);
        // The child cannot be reaped before this (only this process reaps
        // its children, and it has not), so the pidfd names it.
        let pidfd = match sys::pidfd_open(pid) {
            Ok(fd) => fd,
            Err(e) => {
                let _ = nix::sys::signal::kill(Pid::from_raw(pid as i32), Signal::SIGKILL);
                let _ = nix::sys::wait::waitpid(Pid::from_raw(pid as i32), None);
                return Err(std::io::Error::new(
                    e.kind(),
                    format!("pidfd_open: {e} (the agent needs Linux 5.4 or later)"),
                ));
            }
        };
        let start_time = proc_stat(pid as i32).map(|s| s.start_time);
        Ok(Process {
            pid,
            pidfd,
            start_time,
            child: true,
            reaped: false,
        })
    }

    /// Re-attaches to a process this agent did not start (one recorded
    /// before a restart): `None` when `pid` is gone or is now another
    /// process (its start time differs from `start_time`).
    pub fn adopt(pid: u32, start_time: Option<u64>) -> Option<Process> {
        if pid <= 1 {
            return None;
        }
        let pidfd = sys::pidfd_open(pid).ok()?;
        // With the pidfd held, a process that matches now is the one the
        // pidfd names for as long as it lives.
        if !is_alive(pid, start_time) {
            return None;
        }
        Some(Process {
            pid,
            pidfd,
            start_time,
            child: false,
            reaped: false,
        })
    }

    /// Its pid, which is also its process group and session id.
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// Its start time (clock ticks since boot), when it could be read.
    pub fn start_time(&self) -> Option<u64> {
        self.start_time
    }

    /// Whether this agent process started it (and so reaps it).
    pub fn is_child(&self) -> bool {
        self.child
    }

    /// Something to await the process's exit on, from an async task.
    pub fn exit_watch(&self) -> std::io::Result<ExitWatch> {
        let fd = self.pidfd.try_clone()?;
        Ok(ExitWatch {
            fd: sys::register_pidfd(fd)?,
        })
    }

    /// Whether the process is still running (not exited, whether or not
    /// reaped).
    pub fn is_running(&self) -> bool {
        !self.reaped && !pidfd_readable(&self.pidfd)
    }

    /// The exit status of a child that exited, without reaping it; `None`
    /// while it runs, and always for a process that is not a child.
    pub fn exit_status(&self) -> Option<ExitStatus> {
        if !self.child || self.reaped {
            return None;
        }
        status_of(waitid(
            Id::PIDFd(self.pidfd.as_fd()),
            WaitPidFlag::WEXITED | WaitPidFlag::WNOHANG | WaitPidFlag::WNOWAIT,
        ))
    }

    /// Sends `signal` to the process's group: safe while the leader of a
    /// child is unreaped; for a re-attached process, sent only while its
    /// leader is seen alive (and then through the pidfd as well).
    pub fn signal_group(&self, signal: Signal) {
        if self.reaped {
            return;
        }
        if self.child {
            let _ = killpg(Pid::from_raw(self.pid as i32), signal);
        } else if self.is_running() {
            let _ = sys::pidfd_send_signal(self.pidfd.as_raw_fd(), signal);
            let _ = killpg(Pid::from_raw(self.pid as i32), signal);
        }
    }

    /// Reaps a child that exited and returns its status; `None` for one
    /// still running or not a child.
    pub fn reap(&mut self) -> Option<ExitStatus> {
        if !self.child || self.reaped {
            return None;
        }
        let status = status_of(waitid(
            Id::PIDFd(self.pidfd.as_fd()),
            WaitPidFlag::WEXITED | WaitPidFlag::WNOHANG,
        ));
        if status.is_some() {
            self.reaped = true;
        }
        status
    }
}

// === impl ExitWatch ===

impl ExitWatch {
    /// Completes once the process has exited.
    pub async fn exited(&self) {
        loop {
            match self.fd.readable().await {
                Ok(mut guard) => {
                    if pidfd_readable(self.fd.get_ref()) {
                        return;
                    }
                    guard.clear_ready();
                }
                Err(_) => return,
            }
        }
    }

    /// The exit status of an exited child, read without reaping it;
    /// `None` for a process that is not a child of this agent process.
    pub fn exit_status(&self) -> Option<ExitStatus> {
        status_of(waitid(
            Id::PIDFd(self.fd.get_ref().as_fd()),
            WaitPidFlag::WEXITED | WaitPidFlag::WNOHANG | WaitPidFlag::WNOWAIT,
        ))
    }
}

/// Whether a pidfd reports its process exited.
fn pidfd_readable(fd: &OwnedFd) -> bool {
    let mut fds = [nix::poll::PollFd::new(
        fd.as_fd(),
        nix::poll::PollFlags::POLLIN,
    )];
    matches!(nix::poll::poll(&mut fds, nix::poll::PollTimeout::ZERO), Ok(n) if n > 0)
}

fn status_of(result: nix::Result<WaitStatus>) -> Option<ExitStatus> {
    match result {
        Ok(WaitStatus::Exited(_, code)) => Some(ExitStatus::from_raw((code & 0xff) << 8)),
        Ok(WaitStatus::Signaled(_, signal, core)) => Some(ExitStatus::from_raw(
            signal as i32 | if core { 0x80 } else { 0 },
        )),
        _ => None,
    }
}

/// Sends `signal` to every process of each session in `sids` that is not
/// in the session's own process group (those are reached by
/// [`Process::signal_group`]): one pass over `/proc` for all of them.
/// Each member is signalled through a pidfd opened and checked to be in
/// the session first. Returns how many were signalled.
pub fn signal_session_members(sids: &[u32], signal: Signal) -> usize {
    let sids: Vec<i32> = sids.iter().filter(|s| **s > 1).map(|s| *s as i32).collect();
    if sids.is_empty() {
        return 0;
    }
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return 0;
    };
    let mut signalled = 0;
    for pid in entries.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok()) {
        let Some(stat) = proc_stat(pid) else { continue };
        if !sids.contains(&stat.session) || stat.pgrp == stat.session || stat.state == 'Z' {
            continue;
        }
        let Ok(fd) = sys::pidfd_open(pid as u32) else {
            continue;
        };
        // Pinned by the pidfd: still the same member?
        if proc_stat(pid)
            .is_some_and(|s| s.session == stat.session && s.start_time == stat.start_time)
            && sys::pidfd_send_signal(fd.as_raw_fd(), signal).is_ok()
        {
            signalled += 1;
        }
    }
    signalled
}

/// Reads `/proc/PID/stat`.
pub fn proc_stat(pid: i32) -> Option<ProcStat> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    parse_proc_stat(&text)
}

/// Parses the text of `/proc/PID/stat` (the command name may hold spaces
/// and parentheses; everything after the last `)` is space separated).
pub fn parse_proc_stat(text: &str) -> Option<ProcStat> {
    let rest = &text[text.rfind(')')? + 1..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    Some(ProcStat {
        state: fields.first()?.chars().next()?,
        ppid: fields.get(1)?.parse().ok()?,
        pgrp: fields.get(2)?.parse().ok()?,
        session: fields.get(3)?.parse().ok()?,
        start_time: fields.get(19)?.parse().ok()?,
    })
}

/// Whether `pid` is a live (not zombie) process started at `start_time`
/// (any start time when `None`).
pub fn is_alive(pid: u32, start_time: Option<u64>) -> bool {
    match proc_stat(pid as i32) {
        Some(stat) => stat.state != 'Z' && start_time.is_none_or(|t| t == stat.start_time),
        None => false,
    }
}

/// Live members of session `sid` (for tests and diagnostics).
pub fn session_members(sid: u32) -> Vec<i32> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| proc_stat(*pid).is_some_and(|s| s.session == sid as i32 && s.state != 'Z'))
        .collect()
}

/// Exit code, or 128 + signal number for a signal, as reported to the master.
pub fn wait_status_code(status: &ExitStatus) -> Option<i32> {
    status
        .code()
        .or_else(|| status.signal().map(|signal| 128 + signal))
}

/// Human-readable exit status: `exited with status 3` or
/// `terminated by signal SIGKILL`.
pub fn describe_exit(status: &ExitStatus) -> String {
    if let Some(code) = status.code() {
        format!("exited with status {code}")
    } else if let Some(signal) = status.signal() {
        match Signal::try_from(signal) {
            Ok(s) => format!("terminated by signal {}", s.as_str()),
            Err(_) => format!("terminated by signal {signal}"),
        }
    } else {
        format!("ended with {status}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proc_stat_parsing_handles_odd_names() {
        let text = "1234 (we) ird (name)) S 1 1234 1234 0 -1 4194560 100 0 0 0 1 2 0 0 20 0 1 0 98765 1000 10 18446744073709551615";
        let s = parse_proc_stat(text).unwrap();
        assert_eq!(s.state, 'S');
        assert_eq!(s.ppid, 1);
        assert_eq!(s.pgrp, 1234);
        assert_eq!(s.session, 1234);
        assert_eq!(s.start_time, 98765);
        assert!(parse_proc_stat("garbage").is_none());
    }

    #[test]
    fn own_process_is_alive() {
        let me = std::process::id();
        let stat = proc_stat(me as i32).unwrap();
        assert!(is_alive(me, Some(stat.start_time)));
        assert!(!is_alive(me, Some(stat.start_time + 1)));
    }

    #[test]
    fn command_info_to_spec() {
        let mut c = agora_proto::CommandInfo {
            value: "echo hi".into(),
            shell: true,
            ..Default::default()
        };
        let s = LaunchSpec::from_command(&c, PathBuf::from("/tmp"));
        assert_eq!(s.program, "/bin/sh");
        assert_eq!(s.args, vec!["-c", "echo hi"]);
        c.shell = false;
        c.value = "/bin/echo".into();
        c.arguments = vec!["echo".into(), "a".into()];
        let s = LaunchSpec::from_command(&c, PathBuf::from("/tmp"));
        assert_eq!(s.program, "/bin/echo");
        assert_eq!(s.argv0.as_deref(), Some("echo"));
        assert_eq!(s.args, vec!["a"]);
    }

    #[test]
    fn sessions_of_init_and_zero_are_never_signalled() {
        assert_eq!(signal_session_members(&[0, 1], Signal::SIGTERM), 0);
    }

    #[test]
    fn programs_resolve_on_the_executors_path() {
        let spec = LaunchSpec {
            program: "sh".into(),
            argv0: None,
            args: vec![],
            env: vec![("PATH".into(), "/nonexistent:/bin".into())],
            secrets: Vec::new(),
            sandbox: PathBuf::from("/tmp"),
            fetch: Vec::new(),
            limits: None,
            user: String::new(),
            logger: None,
        };
        let env = spec.environment();
        assert_eq!(spec.resolve(&env).unwrap(), PathBuf::from("/bin/sh"));
        let missing = LaunchSpec {
            program: "surely-not-a-program".into(),
            ..spec
        };
        assert!(missing.resolve(&env).is_err());
    }
}
