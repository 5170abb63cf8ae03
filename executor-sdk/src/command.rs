//! The built-in command executor: runs the [`CommandInfo`] of the one task
//! it is given.
//!
//! The agent starts it (the `agora-command-executor` binary, or any
//! multi-call binary that calls [`run`]) for tasks that carry a `command`
//! instead of an executor. It subscribes, and on `LAUNCH`:
//!
//! - spawns `/bin/sh -c VALUE` (or, with `shell: false`, `VALUE` with
//!   `arguments[1..]`, `arguments[0]` as argv\[0\]) in the sandbox, in its
//!   own process group, with `CommandInfo.environment` added, stdout and
//!   stderr inherited (the agent points them at the sandbox files);
//! - sends `TASK_RUNNING` once the child has started, then `TASK_FINISHED`
//!   on exit 0 or `TASK_FAILED` (reason `REASON_COMMAND_EXECUTOR_FAILED`)
//!   naming the exit status or signal;
//! - on `KILL` (or `SHUTDOWN`) sends SIGTERM to the child's process group,
//!   SIGKILL after the grace period (`TaskInfo::kill_grace_period`, else
//!   the executor's shutdown grace period), and reports `TASK_KILLED`.
//!
//! After the terminal update it stops the driver, which waits for the
//! agent's acknowledgement, and exits 0.

use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::PathBuf;
use std::process::{Child, ExitCode, ExitStatus, Stdio};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::thread;
use std::time::{Duration, Instant};

use agora_proto::{CommandInfo, Reason, Source, TaskId, TaskInfo, TaskState, TaskStatus};
use nix::sys::signal::{killpg, Signal};
use nix::unistd::Pid;

use crate::{DriverStatus, Executor, ExecutorConfig, ExecutorDriver};

/// Runs the command executor with the configuration from the environment
/// and returns the process's exit code: success once the task's terminal
/// update went out and the driver stopped, failure otherwise.
pub fn run() -> ExitCode {
    init_tracing();
    let config = match ExecutorConfig::from_env() {
        Ok(config) => config,
        Err(error) => {
            tracing::error!(%error, "cannot start the command executor");
            eprintln!("agora-command-executor: {error}");
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
    /// The task this executor was given, once launched.
    task: Option<Arc<TaskSlot>>,
}

/// The one task and its child process, shared with the thread that waits
/// for the child.
struct TaskSlot {
    task_id: TaskId,
    /// The child's pid, which is also its process group id.
    pgid: Pid,
    grace: Duration,
    state: Mutex<SlotState>,
    ended: Condvar,
}

#[derive(Default)]
struct SlotState {
    kill_requested: bool,
    /// The terminal update was sent.
    ended: bool,
}

// === impl CommandExecutor ===

impl CommandExecutor {
    pub(crate) fn new(sandbox: PathBuf, shutdown_grace: Duration) -> Self {
        CommandExecutor {
            sandbox,
            shutdown_grace,
            task: None,
        }
    }

    /// Sends a terminal update for a task that never started, and ends.
    fn refuse(
        &self,
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

    fn spawn(&self, command: &CommandInfo) -> std::io::Result<Child> {
        let mut process = if command.shell {
            let mut process = std::process::Command::new("/bin/sh");
            process.arg("-c").arg(&command.value);
            process
        } else {
            let mut process = std::process::Command::new(&command.value);
            if let Some((argv0, rest)) = command.arguments.split_first() {
                process.arg0(argv0).args(rest);
            }
            process
        };
        process
            .envs(&command.environment)
            // The token is the executor's credential, not the task's.
            .env_remove(agora_proto::env::EXECUTOR_TOKEN)
            .current_dir(&self.sandbox)
            .stdin(Stdio::null())
            .stdout(Stdio::inherit())
            .stderr(Stdio::inherit())
            .process_group(0)
            .spawn()
    }
}

impl Executor for CommandExecutor {
    fn launch_task(&mut self, driver: &ExecutorDriver, task: TaskInfo) {
        if let Some(current) = &self.task {
            self.refuse(
                driver,
                task.task_id,
                TaskState::Error,
                Reason::ReasonTaskInvalid,
                format!(
                    "the command executor runs one task and already has task {}",
                    current.task_id
                ),
            );
            return;
        }
        let Some(command) = task.command.as_ref() else {
            self.refuse(
                driver,
                task.task_id,
                TaskState::Error,
                Reason::ReasonTaskInvalid,
                "the task has no command for the command executor to run".into(),
            );
            let _ = driver.stop();
            return;
        };
        if command.value.is_empty() {
            self.refuse(
                driver,
                task.task_id,
                TaskState::Error,
                Reason::ReasonTaskInvalid,
                "the task's command is empty".into(),
            );
            let _ = driver.stop();
            return;
        }
        let mut child = match self.spawn(command) {
            Ok(child) => child,
            Err(error) => {
                self.refuse(
                    driver,
                    task.task_id,
                    TaskState::Failed,
                    Reason::ReasonCommandExecutorFailed,
                    format!("cannot start command {:?}: {error}", command.value),
                );
                let _ = driver.stop();
                return;
            }
        };
        let grace = task
            .kill_grace_period
            .filter(|g| g.is_finite() && *g >= 0.0)
            .map(|g| Duration::from_secs_f64(g.min(86_400.0)))
            .unwrap_or(self.shutdown_grace);
        let slot = Arc::new(TaskSlot {
            task_id: task.task_id.clone(),
            pgid: Pid::from_raw(child.id() as i32),
            grace,
            state: Mutex::new(SlotState::default()),
            ended: Condvar::new(),
        });
        tracing::info!(task_id = %task.task_id, pid = child.id(), "command started");
        let running = TaskStatus::new(
            task.task_id.clone(),
            TaskState::Running,
            Source::SourceExecutor,
        );
        let _ = driver.send_status_update(running);
        self.task = Some(slot.clone());

        let waited = thread::Builder::new()
            .name("agora-command-wait".into())
            .spawn({
                let slot = slot.clone();
                let driver = driver.clone();
                move || {
                    let result = child.wait();
                    slot.finish(&driver, result);
                }
            });
        if let Err(error) = waited {
            // Without a waiter nobody would report the task: kill it.
            tracing::error!(%error, "cannot start the thread that waits for the command");
            slot.signal(Signal::SIGKILL);
            slot.finish(
                driver,
                Err(std::io::Error::other(format!(
                    "cannot wait for the command: {error}"
                ))),
            );
        }
    }

    fn kill_task(&mut self, _driver: &ExecutorDriver, task_id: &TaskId) {
        match &self.task {
            Some(slot) if slot.task_id == *task_id => slot.kill(slot.grace),
            _ => tracing::warn!(task_id = %task_id, "kill for a task this executor does not run"),
        }
    }

    fn shutdown(&mut self, _driver: &ExecutorDriver) {
        let Some(slot) = &self.task else {
            return;
        };
        // Leave half of the shutdown grace period for the terminal update
        // to be acknowledged before the agent kills this process.
        let grace = slot.grace.min(self.shutdown_grace / 2);
        slot.kill(grace);
        slot.wait_ended(grace + Duration::from_secs(1));
    }
}

// === impl TaskSlot ===

impl TaskSlot {
    fn lock(&self) -> MutexGuard<'_, SlotState> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// SIGTERM to the group now, SIGKILL after `grace` if the task is
    /// still there.
    fn kill(self: &Arc<Self>, grace: Duration) {
        {
            let mut state = self.lock();
            if state.ended {
                return;
            }
            if state.kill_requested {
                // A second kill: do not restart the grace period.
                return;
            }
            state.kill_requested = true;
        }
        tracing::info!(task_id = %self.task_id, ?grace, "killing the command");
        self.signal(Signal::SIGTERM);
        let slot = self.clone();
        let escalation = thread::Builder::new()
            .name("agora-command-kill".into())
            .spawn(move || {
                if !slot.wait_ended(grace) {
                    tracing::warn!(task_id = %slot.task_id, "grace period over; sending SIGKILL");
                    slot.signal(Signal::SIGKILL);
                }
            });
        if escalation.is_err() {
            self.signal(Signal::SIGKILL);
        }
    }

    fn signal(&self, signal: Signal) {
        match killpg(self.pgid, signal) {
            Ok(()) | Err(nix::errno::Errno::ESRCH) => {}
            Err(error) => {
                tracing::warn!(task_id = %self.task_id, %error, ?signal, "cannot signal the command")
            }
        }
    }

    /// Waits until the terminal update was sent; whether it was.
    fn wait_ended(&self, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        let mut state = self.lock();
        while !state.ended {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return false;
            }
            state = self
                .ended
                .wait_timeout(state, left)
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        }
        true
    }

    /// The child exited (or could not be waited for): report and stop.
    fn finish(&self, driver: &ExecutorDriver, result: std::io::Result<ExitStatus>) {
        let kill_requested = self.lock().kill_requested;
        if kill_requested {
            // Processes the command left behind in its group go too.
            self.signal(Signal::SIGKILL);
        }
        let status = terminal_status(self.task_id.clone(), kill_requested, result);
        tracing::info!(
            task_id = %self.task_id,
            state = %status.state,
            message = status.message.as_deref().unwrap_or(""),
            "command ended"
        );
        if let Err(error) = driver.send_status_update(status) {
            tracing::error!(%error, "cannot send the task's terminal update");
        }
        {
            let mut state = self.lock();
            state.ended = true;
            self.ended.notify_all();
        }
        // Waits (bounded) for the acknowledgement, then the process exits.
        let _ = driver.stop();
    }
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
    let builder = tracing_subscriber::fmt()
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
}
