//! Forking executors and ending them.
//!
//! Each executor is started in its own session (`setsid`), which also makes
//! it the leader of its own process group, with its sandbox as working
//! directory and its output in the sandbox's `stdout` and `stderr` files.
//! Killing an executor signals its whole session: the process group, and
//! any member that moved to a group of its own (the command executor puts
//! each task in a separate group), found through `/proc`.

use std::path::{Path, PathBuf};
use std::process::{ExitStatus, Stdio};
use std::time::Duration;

use nix::sys::signal::{kill, killpg, Signal};
use nix::unistd::Pid;
use tokio::process::{Child, Command};

/// What to run for an executor.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LaunchSpec {
    /// The program, resolved through `PATH` when it has no `/`.
    pub program: String,
    /// `argv[0]`, when it should differ from `program`.
    pub argv0: Option<String>,
    /// Arguments after `argv[0]`.
    pub args: Vec<String>,
    /// Variables added to the agent's own environment.
    pub env: Vec<(String, String)>,
    /// Working directory; `stdout` and `stderr` are created in it.
    pub sandbox: PathBuf,
}

/// A running executor.
#[derive(Debug)]
pub struct Launched {
    /// The process; wait on it to learn the exit status.
    pub child: Child,
    /// Its pid, which is also its process group and session id.
    pub pid: u32,
    /// Its start time (clock ticks since boot, `/proc/PID/stat` field 22),
    /// which tells it apart from a later process with a reused pid.
    pub start_time: Option<u64>,
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
    /// `shell`, else `value` with `arguments` (whose first element is argv\[0\]).
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
                sandbox,
            }
        } else {
            let mut arguments = command.arguments.iter();
            let argv0 = arguments.next().cloned();
            LaunchSpec {
                program: command.value.clone(),
                argv0,
                args: arguments.cloned().collect(),
                env,
                sandbox,
            }
        }
    }
}

/// Forks the executor described by `spec` in a new session. The sandbox
/// must exist.
pub fn spawn(spec: &LaunchSpec) -> std::io::Result<Launched> {
    let stdout = open_log(&spec.sandbox.join("stdout"))?;
    let stderr = open_log(&spec.sandbox.join("stderr"))?;
    let mut command = Command::new(&spec.program);
    if let Some(argv0) = &spec.argv0 {
        command.arg0(argv0);
    }
    command
        .args(&spec.args)
        .envs(spec.env.iter().map(|(k, v)| (k, v)))
        .current_dir(&spec.sandbox)
        .stdin(Stdio::null())
        .stdout(stdout)
        .stderr(stderr)
        .kill_on_drop(false);
    crate::sys::setsid_on_spawn(&mut command);
    let child = command.spawn()?;
    let pid = child
        .id()
        .ok_or_else(|| std::io::Error::other("executor exited before its pid was read"))?;
    let start_time = proc_stat(pid as i32).map(|s| s.start_time);
    Ok(Launched {
        child,
        pid,
        start_time,
    })
}

fn open_log(path: &Path) -> std::io::Result<std::fs::File> {
    std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
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

/// Live members of session `sid`.
pub fn session_members(sid: u32) -> Vec<i32> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| proc_stat(*pid).is_some_and(|s| s.session == sid as i32 && s.state != 'Z'))
        .collect()
}

/// Sends `signal` to process group `sid` and to every other member of
/// session `sid`. Returns whether any process was signalled.
pub fn signal_session(sid: u32, signal: Signal) -> bool {
    if sid <= 1 {
        // Never signal init's group or "all processes".
        return false;
    }
    let mut any = killpg(Pid::from_raw(sid as i32), signal).is_ok();
    for pid in session_members(sid) {
        any |= kill(Pid::from_raw(pid), signal).is_ok();
    }
    any
}

/// Ends session `sid`: SIGTERM, then SIGKILL once `grace` has passed
/// with any member still alive.
pub async fn terminate_session(sid: u32, grace: Duration) {
    if !signal_session(sid, Signal::SIGTERM) {
        return;
    }
    let deadline = tokio::time::Instant::now() + grace;
    while tokio::time::Instant::now() < deadline {
        if session_members(sid).is_empty() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    signal_session(sid, Signal::SIGKILL);
}

/// Exit code, or 128 + signal number for a signal, as reported to the master.
pub fn wait_status_code(status: &ExitStatus) -> Option<i32> {
    use std::os::unix::process::ExitStatusExt;
    status
        .code()
        .or_else(|| status.signal().map(|signal| 128 + signal))
}

/// Human-readable exit status: `exited with status 3` or
/// `terminated by signal SIGKILL`.
pub fn describe_exit(status: &ExitStatus) -> String {
    use std::os::unix::process::ExitStatusExt;
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
    fn session_one_is_never_signalled() {
        assert!(!signal_session(1, Signal::SIGTERM));
        assert!(!signal_session(0, Signal::SIGTERM));
    }
}
