//! The built-in command executor: runs the [`CommandInfo`] of command
//! tasks, as many at once as the agent gives it.
//!
//! The agent starts it (the `agora-command-executor` binary, or any
//! multi-call binary that calls [`run`]) for tasks that carry a `command`
//! instead of an executor, and gives one process many such tasks of the
//! same framework: an executor process per task would cost more to start
//! than most short tasks take to run. For each `LAUNCH` it:
//!
//! - spawns the command in the sandbox the agent made for that task (or,
//!   from an agent that does not make one, in its own sandbox), in a
//!   process group of its own, with `CommandInfo.environment` added, the
//!   task's own sandbox and executor id (the task id, as for Mesos's
//!   command executor) in `AGORA_SANDBOX`/`MESOS_SANDBOX` and
//!   `AGORA_EXECUTOR_ID`/`MESOS_EXECUTOR_ID`, and its output appended to
//!   that sandbox's `stdout` and `stderr`. A shell command is run by
//!   `/bin/sh -c VALUE`, unless it is a plain path followed by plain words
//!   (`/bin/true`, `./run.sh --n=3`), which the shell would only fork and
//!   exec as it stands: that is exec'd directly, saving a process.
//!   `shell: false` runs `VALUE` with `arguments[1..]`, `arguments[0]`
//!   as argv\[0\];
//! - sends `TASK_RUNNING` once the child has started, then `TASK_FINISHED`
//!   on exit 0 or `TASK_FAILED` (reason `REASON_COMMAND_EXECUTOR_FAILED`)
//!   naming the exit status or signal. When the command's process exits,
//!   whatever it left in its process group is killed, as Mesos destroys a
//!   command task's container;
//! - on `KILL` sends SIGTERM to the task's process group, SIGKILL after
//!   the grace period (`TaskInfo::kill_grace_period`, else the executor's
//!   shutdown grace period), and reports `TASK_KILLED`.
//!
//! It stays up between tasks until the agent shuts it down (`SHUTDOWN`:
//! every running task is killed, its terminal update sent, and the driver
//! stops once they are acknowledged). Given a task without a sandbox of
//! its own (an older agent, which starts one command executor per task),
//! it stops after that task, as before.
//!
//! One thread reaps every child: it learns which one exited without
//! reaping it (`waitid` with `WNOWAIT`), kills what is left of its group
//! while the group id cannot have been reused, then reaps it. Signals are
//! sent only to groups whose leader is known unreaped.

use std::collections::HashMap;
use std::io::Write;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Path, PathBuf};
use std::process::{ExitCode, ExitStatus, Stdio};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::thread;
use std::time::{Duration, Instant};

use agora_proto::{CommandInfo, Reason, Source, TaskId, TaskInfo, TaskState, TaskStatus};
use nix::sys::signal::{killpg, Signal};
use nix::sys::wait::{waitid, waitpid, Id, WaitPidFlag, WaitStatus};
use nix::unistd::Pid;

use crate::{DriverStatus, Executor, ExecutorConfig, ExecutorDriver, Placement};

/// Runs the command executor with the configuration from the environment
/// and returns the process's exit code: success once its tasks' terminal
/// updates went out and the driver stopped, failure otherwise.
pub fn run() -> ExitCode {
    init_tracing();
    let config = match ExecutorConfig::from_env() {
        Ok(config) => config,
        Err(error) => {
            tracing::error!(%error, "cannot start the command executor");
            // Not eprintln!, which panics when stderr cannot be written
            // (a full disk under the sandbox).
            let _ = writeln!(std::io::stderr(), "agora-command-executor: {error}");
            return ExitCode::from(2);
        }
    };
    let executor = CommandExecutor::new(config.sandbox.clone(), config.shutdown_grace_period);
    let driver = ExecutorDriver::new(executor, config);
    match driver.run() {
        Ok(DriverStatus::Stopped) => ExitCode::SUCCESS,
        Ok(status) => {
            tracing::error!(
                ?status,
                "the command executor's driver did not stop cleanly"
            );
            ExitCode::FAILURE
        }
        Err(error) => {
            tracing::error!(%error, "cannot start the command executor's driver");
            ExitCode::FAILURE
        }
    }
}

/// The command executor's [`Executor`].
pub(crate) struct CommandExecutor {
    sandbox: PathBuf,
    shutdown_grace: Duration,
    tasks: Arc<Tasks>,
    /// Started with the first task.
    reaper: Option<thread::JoinHandle<()>>,
}

/// The running tasks, shared with the reaper and kill timers. A task is in
/// `running` from before its child can be reaped until after: a signal
/// sent to its group under the lock cannot reach a reused group id.
struct Tasks {
    state: Mutex<TasksState>,
    changed: Condvar,
}

#[derive(Default)]
struct TasksState {
    /// By the pid of the task's process, which leads the task's group.
    running: HashMap<u32, Running>,
    /// The task ids in `running`.
    ids: HashMap<TaskId, u32>,
    /// Stop the driver once no task runs (set by a task launched without a
    /// sandbox of its own, and by `SHUTDOWN`).
    stop_when_idle: bool,
    /// The driver is being stopped: no new task.
    stopping: bool,
}

struct Running {
    task_id: TaskId,
    grace: Duration,
    kill_requested: bool,
}

// === impl CommandExecutor ===

impl CommandExecutor {
    pub(crate) fn new(sandbox: PathBuf, shutdown_grace: Duration) -> Self {
        CommandExecutor {
            sandbox,
            shutdown_grace,
            tasks: Arc::new(Tasks {
                state: Mutex::new(TasksState::default()),
                changed: Condvar::new(),
            }),
            reaper: None,
        }
    }

    fn launch(&mut self, driver: &ExecutorDriver, task: TaskInfo, placement: &Placement) {
        let sandbox = placement.sandbox.as_deref();
        let refuse = |state, reason, message: String| {
            refuse(driver, task.task_id.clone(), state, reason, message)
        };
        let Some(command) = task.command.as_ref() else {
            return refuse(
                TaskState::Error,
                Reason::ReasonTaskInvalid,
                "the task has no command for the command executor to run".into(),
            );
        };
        if command.value.is_empty() {
            return refuse(
                TaskState::Error,
                Reason::ReasonTaskInvalid,
                "the task's command is empty".into(),
            );
        }
        if self.reaper.is_none() {
            let tasks = self.tasks.clone();
            let reaper_driver = driver.clone();
            match thread::Builder::new()
                .name("agora-command-reaper".into())
                .spawn(move || reap(&tasks, &reaper_driver))
            {
                Ok(handle) => self.reaper = Some(handle),
                Err(error) => {
                    return refuse(
                        TaskState::Failed,
                        Reason::ReasonCommandExecutorFailed,
                        format!("cannot start the thread that waits for commands: {error}"),
                    );
                }
            }
        }
        let grace = task
            .kill_grace_period
            .filter(|g| g.is_finite() && *g >= 0.0)
            .map(|g| Duration::from_secs_f64(g.min(86_400.0)))
            .unwrap_or(self.shutdown_grace);
        // Spawned under the lock: the reaper cannot look for the child
        // before it is recorded.
        let mut state = self.tasks.lock();
        if state.stopping {
            drop(state);
            return refuse(
                TaskState::Dropped,
                Reason::ReasonExecutorShutdown,
                "the command executor is shutting down".into(),
            );
        }
        if state.ids.contains_key(&task.task_id) {
            drop(state);
            return refuse(
                TaskState::Error,
                Reason::ReasonTaskInvalid,
                format!("task {} already runs in this executor", task.task_id),
            );
        }
        let spawned = spawn(
            command,
            sandbox.unwrap_or(&self.sandbox),
            sandbox.map(|s| (s, &task.task_id)),
            &placement.cgroups,
            placement.container.as_deref(),
        );
        let pid = match spawned {
            Ok(pid) => pid,
            Err(error) => {
                drop(state);
                return refuse(
                    TaskState::Failed,
                    Reason::ReasonCommandExecutorFailed,
                    format!("cannot start command {:?}: {error}", command.value),
                );
            }
        };
        if sandbox.is_none() {
            state.stop_when_idle = true;
        }
        state.running.insert(
            pid,
            Running {
                task_id: task.task_id.clone(),
                grace,
                kill_requested: false,
            },
        );
        state.ids.insert(task.task_id.clone(), pid);
        tracing::debug!(task_id = %task.task_id, pid, "command started");
        // Queued under the lock: the reaper, which needs it, cannot report
        // the end of a quick command before its start.
        let running = TaskStatus::new(task.task_id, TaskState::Running, Source::SourceExecutor);
        let _ = driver.send_status_update(running);
        self.tasks.changed.notify_all();
    }
}

impl Executor for CommandExecutor {
    fn launch_task(&mut self, driver: &ExecutorDriver, task: TaskInfo) {
        self.launch(driver, task, &Placement::default());
    }

    fn launch_task_in(&mut self, driver: &ExecutorDriver, task: TaskInfo, placement: &Placement) {
        self.launch(driver, task, placement);
    }

    fn kill_task(&mut self, _driver: &ExecutorDriver, task_id: &TaskId) {
        let pid = self.tasks.lock().ids.get(task_id).copied();
        match pid {
            Some(pid) => self.tasks.kill(pid, None),
            None => {
                tracing::warn!(task_id = %task_id, "kill for a task this executor does not run")
            }
        }
    }

    fn shutdown(&mut self, _driver: &ExecutorDriver) {
        // Leave half of the shutdown grace period for the terminal updates
        // to be acknowledged before the agent kills this process.
        let limit = self.shutdown_grace / 2;
        let pids: Vec<u32> = {
            let mut state = self.tasks.lock();
            state.stopping = true;
            state.stop_when_idle = true;
            state.running.keys().copied().collect()
        };
        for pid in pids {
            self.tasks.kill(pid, Some(limit));
        }
        self.tasks.wait_idle(limit + Duration::from_secs(1));
    }
}

// === impl Tasks ===

impl Tasks {
    fn lock(&self) -> MutexGuard<'_, TasksState> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// SIGTERM to the task's group now, SIGKILL after its grace period
    /// (at most `limit`) if it is still there.
    fn kill(self: &Arc<Self>, pid: u32, limit: Option<Duration>) {
        let grace = {
            let mut state = self.lock();
            let Some(task) = state.running.get_mut(&pid) else {
                return;
            };
            if task.kill_requested {
                // A second kill does not restart the grace period.
                return;
            }
            task.kill_requested = true;
            tracing::info!(task_id = %task.task_id, grace = ?task.grace, "killing the command");
            signal_group(pid, Signal::SIGTERM);
            limit.map_or(task.grace, |l| task.grace.min(l))
        };
        let tasks = self.clone();
        let escalation = thread::Builder::new()
            .name("agora-command-kill".into())
            .spawn(move || {
                let deadline = Instant::now() + grace;
                let mut state = tasks.lock();
                while state.running.contains_key(&pid) {
                    let left = deadline.saturating_duration_since(Instant::now());
                    if left.is_zero() {
                        tracing::warn!(pid, "grace period over; sending SIGKILL");
                        signal_group(pid, Signal::SIGKILL);
                        return;
                    }
                    state = tasks
                        .changed
                        .wait_timeout(state, left)
                        .unwrap_or_else(PoisonError::into_inner)
                        .0;
                }
            });
        if escalation.is_err() {
            let state = self.lock();
            if state.running.contains_key(&pid) {
                signal_group(pid, Signal::SIGKILL);
            }
        }
    }

    /// Waits until no task runs; whether none does.
    fn wait_idle(&self, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        let mut state = self.lock();
        while !state.running.is_empty() {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return false;
            }
            state = self
                .changed
                .wait_timeout(state, left)
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        }
        true
    }
}

/// Sends a terminal update for a task that never started.
fn refuse(
    driver: &ExecutorDriver,
    task_id: TaskId,
    state: TaskState,
    reason: Reason,
    message: String,
) {
    tracing::warn!(task_id = %task_id, %message, "task not started");
    let status = TaskStatus::new(task_id, state, Source::SourceExecutor)
        .with_reason(reason)
        .with_message(message);
    let _ = driver.send_status_update(status);
}

/// Signals the group led by `pid`; call only with the task's entry present
/// (its leader unreaped).
fn signal_group(pid: u32, signal: Signal) {
    match killpg(Pid::from_raw(pid as i32), signal) {
        Ok(()) | Err(nix::errno::Errno::ESRCH) => {}
        Err(error) => tracing::warn!(pid, %error, ?signal, "cannot signal the command"),
    }
}

/// The reaper: reports each child's end, forever (the process exits when
/// the driver stops).
fn reap(tasks: &Tasks, driver: &ExecutorDriver) {
    loop {
        {
            let mut state = tasks.lock();
            while state.running.is_empty() {
                state = tasks
                    .changed
                    .wait(state)
                    .unwrap_or_else(PoisonError::into_inner);
            }
        }
        // Which child exited, without reaping it: its group id stays ours.
        let exited = match waitid(Id::All, WaitPidFlag::WEXITED | WaitPidFlag::WNOWAIT) {
            Ok(status) => status.pid(),
            Err(nix::errno::Errno::EINTR | nix::errno::Errno::ECHILD) => continue,
            Err(error) => {
                tracing::error!(%error, "waiting for commands failed");
                thread::sleep(Duration::from_millis(100));
                continue;
            }
        };
        let Some(pid) = exited else { continue };
        let mut state = tasks.lock();
        let entry = state.running.remove(&(pid.as_raw() as u32));
        // What the command left in its group goes with it.
        if entry.is_some() {
            signal_group(pid.as_raw() as u32, Signal::SIGKILL);
        }
        let status = match waitpid(pid, None) {
            Ok(WaitStatus::Exited(_, code)) => Ok(ExitStatus::from_raw((code & 0xff) << 8)),
            Ok(WaitStatus::Signaled(_, signal, core)) => Ok(ExitStatus::from_raw(
                signal as i32 | if core { 0x80 } else { 0 },
            )),
            Ok(other) => Err(std::io::Error::other(format!(
                "unexpected wait status {other:?}"
            ))),
            Err(e) => Err(std::io::Error::from(e)),
        };
        let Some(task) = entry else {
            continue;
        };
        state.ids.remove(&task.task_id);
        let idle = state.running.is_empty() && state.stop_when_idle;
        let terminal = terminal_status(task.task_id.clone(), task.kill_requested, status);
        tracing::debug!(
            task_id = %task.task_id,
            state = %terminal.state,
            message = terminal.message.as_deref().unwrap_or(""),
            "command ended"
        );
        // Sent before the task leaves `running` for good (under the lock),
        // so a shutdown waiting for idleness stops only after it.
        if let Err(error) = driver.send_status_update(terminal) {
            tracing::error!(%error, "cannot send the task's terminal update");
        }
        tasks.changed.notify_all();
        drop(state);
        if idle {
            // Waits (bounded) for the acknowledgements, then the process
            // exits.
            let _ = driver.stop();
        }
    }
}

/// Whether a shell command is a plain path followed by plain words, which
/// `/bin/sh -c` would only fork and exec as it stands: no quoting,
/// expansion, redirection, operators or builtins (a builtin is never
/// named by a path).
fn plain_words(value: &str) -> Option<Vec<&str>> {
    let plain = |c: char| c.is_ascii_alphanumeric() || "/._-+,:@%=".contains(c);
    let words: Vec<&str> = value.split([' ', '\t']).filter(|w| !w.is_empty()).collect();
    let first = words.first()?;
    (first.contains('/')
        && !first.contains('=')
        && value.chars().all(|c| plain(c) || c == ' ' || c == '\t'))
    .then_some(words)
}

/// Starts `command` in `cwd` as the leader of a new process group; with a
/// task sandbox, the task's output goes to files there and its
/// environment names it; with `cgroups`, the child enters the task's
/// container before it execs (`container`: the name of the container's
/// directories, which the agent keeps when it reuses the container, under
/// which its files stay open). Returns the child's pid.
fn spawn(
    command: &CommandInfo,
    cwd: &Path,
    task: Option<(&Path, &TaskId)>,
    cgroups: &[PathBuf],
    container: Option<&str>,
) -> std::io::Result<u32> {
    let mut argv0 = None;
    let mut process = if command.shell {
        match plain_words(&command.value) {
            Some(words) => {
                let mut process = std::process::Command::new(words[0]);
                process.args(&words[1..]);
                process
            }
            None => {
                let mut process = std::process::Command::new("/bin/sh");
                process.arg("-c").arg(&command.value);
                process
            }
        }
    } else {
        let mut process = std::process::Command::new(&command.value);
        if let Some((first, rest)) = command.arguments.split_first() {
            argv0 = Some(std::ffi::OsStr::new(first.as_str()));
            process.args(rest);
        }
        process
    };
    // The token is the executor's credential, not the task's; the
    // logger's settings are the executor's too.
    for name in agora_proto::env::SECRET_VARIABLES
        .iter()
        .chain(LOGGER_VARIABLES)
    {
        process.env_remove(name);
    }
    let (stdout, stderr) = match task {
        Some((sandbox, task_id)) => {
            // The agent makes it too; whoever comes first. Its user's
            // and group's alone (the agent's is, when it comes first).
            if !sandbox.is_dir() {
                use std::os::unix::fs::PermissionsExt;
                std::fs::create_dir_all(sandbox)?;
                std::fs::set_permissions(sandbox, std::fs::Permissions::from_mode(0o750))?;
            }
            let dir = sandbox.to_string_lossy();
            for name in [
                agora_proto::env::SANDBOX,
                agora_proto::env::MESOS_SANDBOX,
                agora_proto::env::MESOS_DIRECTORY,
            ] {
                process.env(name, dir.as_ref());
            }
            for name in [
                agora_proto::env::EXECUTOR_ID,
                agora_proto::env::MESOS_EXECUTOR_ID,
            ] {
                process.env(name, task_id.as_str());
            }
            (
                Some(output_file(sandbox, "stdout")?),
                Some(output_file(sandbox, "stderr")?),
            )
        }
        None => (None, None),
    };
    process.envs(&command.environment).current_dir(cwd);
    if !cgroups.is_empty() {
        // The child enters the task's container itself, before it execs:
        // this thread stays where it is.
        return with_entry_files(cgroups, container, |files| {
            crate::spawn::spawn_entering(&process, argv0, stdout.as_ref(), stderr.as_ref(), files)
        });
    }
    if let Some(argv0) = argv0 {
        process.arg0(argv0);
    }
    let output = |file: Option<std::fs::File>| file.map_or_else(Stdio::inherit, Stdio::from);
    process
        .stdin(Stdio::null())
        .stdout(output(stdout))
        .stderr(output(stderr))
        .process_group(0);
    // Reaped by the reaper thread, not through this handle.
    Ok(process.spawn()?.id())
}

/// Runs `spawn` with each of `files` (the task container's `tasks` files
/// on cgroup v1, its `cgroup.procs` on v2) open for writing. With
/// `container` (the name the agent's reused container keeps)
/// they are kept open under it for the next task the agent puts in that
/// container (opening a cgroup file costs more than the move), and
/// opened again once if the kept ones no longer take a process.
fn with_entry_files<T>(
    files: &[PathBuf],
    container: Option<&str>,
    spawn: impl Fn(&[std::fs::File]) -> Result<T, crate::spawn::Failed>,
) -> std::io::Result<T> {
    let open = || -> std::io::Result<Vec<std::fs::File>> {
        files
            .iter()
            .map(|file| {
                std::fs::OpenOptions::new()
                    .write(true)
                    .open(file)
                    .map(crate::spawn::keep_high)
                    .map_err(|e| cannot_enter(file, e))
            })
            .collect()
    };
    let Some(container) = container else {
        return spawn(&open()?).map_err(crate::spawn::Failed::into_error);
    };
    let mut kept = ENTRIES
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(PoisonError::into_inner);
    if let Some(entry) = kept.get(container).filter(|e| e.len() == files.len()) {
        match spawn(entry) {
            Err(crate::spawn::Failed::Entering(_)) => {
                // Gone: opened again below.
                kept.remove(container);
            }
            done => return done.map_err(crate::spawn::Failed::into_error),
        }
    }
    let entry = open()?;
    let spawned = spawn(&entry).map_err(crate::spawn::Failed::into_error);
    if spawned.is_ok() {
        kept.insert(container.to_string(), entry);
    }
    spawned
}

/// The entry files of task containers, open, by the name each container
/// keeps when reused (see [`with_entry_files`]); the oldest go when
/// there are [`MAX_KEPT_ENTRIES`].
static ENTRIES: std::sync::OnceLock<Mutex<KeptEntries>> = std::sync::OnceLock::new();

/// Task containers whose entry files an executor keeps open at most (five
/// descriptors each on cgroup v1, above the floor of [`crate::spawn`]'s
/// kept descriptors, where it can, so the commands it starts get no copy
/// of them).
const MAX_KEPT_ENTRIES: usize = 256;

/// Open entry files by container, oldest first.
#[derive(Default)]
struct KeptEntries {
    files: HashMap<String, Vec<std::fs::File>>,
    order: std::collections::VecDeque<String>,
}

impl KeptEntries {
    fn get(&self, container: &str) -> Option<&Vec<std::fs::File>> {
        self.files.get(container)
    }

    fn remove(&mut self, container: &str) {
        self.files.remove(container);
        self.order.retain(|c| c != container);
    }

    fn insert(&mut self, container: String, files: Vec<std::fs::File>) {
        while self.files.len() >= MAX_KEPT_ENTRIES {
            let Some(oldest) = self.order.pop_front() else {
                break;
            };
            self.files.remove(&oldest);
        }
        self.order.push_back(container.clone());
        self.files.insert(container, files);
    }
}

fn cannot_enter(file: &Path, e: std::io::Error) -> std::io::Error {
    std::io::Error::new(
        e.kind(),
        format!(
            "cannot enter the task's container ({}): {e}",
            file.display()
        ),
    )
}

/// The variables with which the agent's `--container-logger logrotate`
/// names the logger program and its settings.
const LOGGER_VARIABLES: &[&str] = &[
    agora_proto::env::LOGROTATE_LOGGER,
    agora_proto::env::LOGROTATE_MAX_STDOUT_SIZE,
    agora_proto::env::LOGROTATE_MAX_STDERR_SIZE,
    agora_proto::env::LOGROTATE_MAX_FILES,
];

/// Where a task's `stream` (`stdout` or `stderr`) goes: appended to the
/// sandbox's file, or, when the agent runs `--container-logger
/// logrotate` (it names the logger in this executor's environment), the
/// write end of a pipe into a logger that rotates that file by size. The
/// logger has a process group of its own (a task's group is killed when
/// it ends; the logger reads what is left, then ends) and is reaped as
/// any other child.
fn output_file(sandbox: &Path, stream: &str) -> std::io::Result<std::fs::File> {
    let file = sandbox.join(stream);
    let Some(program) = std::env::var_os(agora_proto::env::LOGROTATE_LOGGER) else {
        return append(&file);
    };
    let size_variable = if stream == "stdout" {
        agora_proto::env::LOGROTATE_MAX_STDOUT_SIZE
    } else {
        agora_proto::env::LOGROTATE_MAX_STDERR_SIZE
    };
    let setting = |name: &str, default: &str| std::env::var(name).unwrap_or(default.to_string());
    let mut logger = std::process::Command::new(program)
        .arg("--log-filename")
        .arg(&file)
        .arg("--max-size")
        .arg(setting(size_variable, "10MB"))
        .arg("--max-files")
        .arg(setting(agora_proto::env::LOGROTATE_MAX_FILES, "9"))
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .process_group(0)
        .spawn()?;
    let pipe = logger
        .stdin
        .take()
        .ok_or_else(|| std::io::Error::other("the logger has no stdin"))?;
    Ok(std::fs::File::from(std::os::fd::OwnedFd::from(pipe)))
}

fn append(path: &Path) -> std::io::Result<std::fs::File> {
    std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
}

/// The update for a command that ended.
fn terminal_status(
    task_id: TaskId,
    kill_requested: bool,
    result: std::io::Result<ExitStatus>,
) -> TaskStatus {
    let new = |state| TaskStatus::new(task_id.clone(), state, Source::SourceExecutor);
    match result {
        Err(error) => new(TaskState::Failed)
            .with_reason(Reason::ReasonCommandExecutorFailed)
            .with_message(format!("cannot wait for the command: {error}")),
        Ok(status) if kill_requested && !status.success() => new(TaskState::Killed)
            .with_reason(Reason::ReasonTaskKilled)
            .with_message(describe(status)),
        Ok(status) if status.success() => {
            new(TaskState::Finished).with_message("command exited with status 0")
        }
        Ok(status) => new(TaskState::Failed)
            .with_reason(Reason::ReasonCommandExecutorFailed)
            .with_message(describe(status)),
    }
}

fn describe(status: ExitStatus) -> String {
    match (status.code(), status.signal()) {
        (Some(code), _) => format!("command exited with status {code}"),
        (None, Some(signal)) => {
            let name = Signal::try_from(signal)
                .map(|s| s.as_str())
                .unwrap_or("unknown");
            format!("command killed by signal {signal} ({name})")
        }
        (None, None) => format!("command ended: {status}"),
    }
}

fn init_tracing() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    // A log line that cannot be written (stderr on a full disk) is lost,
    // not reported with eprintln!, whose panic would abort the executor.
    let builder = tracing_subscriber::fmt()
        .log_internal_errors(false)
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()));
    // Fails only if the embedding binary installed a subscriber already.
    let _ = match std::env::var(agora_proto::env::LOG_FORMAT) {
        Ok(f) if f.eq_ignore_ascii_case("json") => builder.json().try_init(),
        _ => builder.try_init(),
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status_of(code: i32) -> ExitStatus {
        ExitStatus::from_raw(code)
    }

    #[test]
    fn terminal_states_follow_the_exit_status() {
        let t = || TaskId::new("t");
        let finished = terminal_status(t(), false, Ok(status_of(0)));
        assert_eq!(finished.state, TaskState::Finished);
        let failed = terminal_status(t(), false, Ok(status_of(3 << 8)));
        assert_eq!(failed.state, TaskState::Failed);
        assert_eq!(failed.reason, Some(Reason::ReasonCommandExecutorFailed));
        assert_eq!(
            failed.message.as_deref(),
            Some("command exited with status 3")
        );
        let signalled = terminal_status(t(), false, Ok(status_of(9)));
        assert_eq!(signalled.state, TaskState::Failed);
        assert_eq!(
            signalled.message.as_deref(),
            Some("command killed by signal 9 (SIGKILL)")
        );
        let killed = terminal_status(t(), true, Ok(status_of(15)));
        assert_eq!(killed.state, TaskState::Killed);
        // A command that finished on its own despite a kill request.
        assert_eq!(
            terminal_status(t(), true, Ok(status_of(0))).state,
            TaskState::Finished
        );
        let lost = terminal_status(t(), false, Err(std::io::Error::other("gone")));
        assert_eq!(lost.state, TaskState::Failed);
    }

    #[test]
    fn only_a_plain_path_with_plain_words_skips_the_shell() {
        assert_eq!(plain_words("/bin/true"), Some(vec!["/bin/true"]));
        assert_eq!(
            plain_words("./run.sh  --n=3 a,b"),
            Some(vec!["./run.sh", "--n=3", "a,b"])
        );
        for shell in [
            "true",
            "echo hi",
            "exit 3",
            "/bin/echo $HOME",
            "/bin/echo a > out",
            "/bin/true && /bin/false",
            "/bin/echo 'quoted'",
            "/bin/ls *",
            "A=1 /bin/env",
            "/bin/sleep 1 &",
            "/bin/echo ~",
            "/bin/echo a\n/bin/echo b",
            "",
        ] {
            assert_eq!(plain_words(shell), None, "{shell:?} needs the shell");
        }
    }
}
