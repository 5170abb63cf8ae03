//! `test-executor`: the custom executor of `test-framework`. Each task
//! reports TASK_RUNNING, answers the scheduler's `ping TASK` message with
//! `pong TASK`, and then finishes (after 10 s without a ping it finishes
//! anyway, saying so: framework messages are best effort).
//!
//! A task whose data reads `run PROGRAM ARGS…` instead runs that program
//! (no shell) and reports TASK_RUNNING once it started, then TASK_FINISHED
//! or TASK_FAILED by its exit status; a kill sends it SIGTERM. One
//! executor runs any number of these at once (`bench-launch` uses it).

use std::collections::HashMap;
use std::process::{ExitCode, Stdio};
use std::sync::{mpsc, Arc, Mutex};
use std::time::Duration;

use agora_executor::{Executor, ExecutorDriver};
use agora_proto::{
    AgentId, ExecutorInfo, FrameworkInfo, Source, TaskId, TaskInfo, TaskState, TaskStatus,
};

#[derive(Default)]
struct TestExecutor {
    /// Per running task: `true` = ping arrived, `false` = kill it.
    pings: HashMap<TaskId, mpsc::Sender<bool>>,
    threads: Vec<std::thread::JoinHandle<()>>,
    /// Runs and reaps the programs of `run` tasks.
    runtime: Option<tokio::runtime::Runtime>,
    /// Pids of running `run` tasks.
    programs: Arc<Mutex<HashMap<TaskId, u32>>>,
}

fn update(driver: &ExecutorDriver, task_id: &TaskId, state: TaskState, message: &str) {
    let status =
        TaskStatus::new(task_id.clone(), state, Source::SourceExecutor).with_message(message);
    if let Err(e) = driver.send_status_update(status) {
        eprintln!("test-executor: cannot send update for {task_id}: {e}");
    }
}

impl Executor for TestExecutor {
    fn registered(
        &mut self,
        _driver: &ExecutorDriver,
        executor: &ExecutorInfo,
        framework: &FrameworkInfo,
        agent_id: &AgentId,
    ) {
        eprintln!(
            "test-executor {} registered for framework {} on agent {agent_id}",
            executor.executor_id, framework.name
        );
    }

    fn launch_task(&mut self, driver: &ExecutorDriver, task: TaskInfo) {
        let data = task
            .data
            .as_ref()
            .map(|d| d.to_string_lossy())
            .unwrap_or_default();
        if let Some(command) = data.strip_prefix("run ") {
            let argv: Vec<String> = command.split_whitespace().map(str::to_string).collect();
            return self.run_program(driver, task.task_id, argv);
        }
        update(
            driver,
            &task.task_id,
            TaskState::Running,
            &format!("running with {data:?}"),
        );
        let (tx, rx) = mpsc::channel();
        self.pings.insert(task.task_id.clone(), tx);
        let driver = driver.clone();
        let thread = std::thread::spawn(move || {
            let (state, message) = match rx.recv_timeout(Duration::from_secs(10)) {
                Ok(true) => (TaskState::Finished, "finished after ping"),
                Err(mpsc::RecvTimeoutError::Timeout) => {
                    (TaskState::Finished, "finished without ping")
                }
                Ok(false) | Err(mpsc::RecvTimeoutError::Disconnected) => {
                    (TaskState::Killed, "killed on request")
                }
            };
            update(&driver, &task.task_id, state, message);
        });
        self.threads.retain(|t| !t.is_finished());
        self.threads.push(thread);
    }

    fn kill_task(&mut self, _driver: &ExecutorDriver, task_id: &TaskId) {
        if let Some(pid) = self.lock_programs().get(task_id) {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(*pid as i32),
                nix::sys::signal::Signal::SIGTERM,
            );
            return;
        }
        // A task that already ended has sent its terminal update: nothing to kill.
        if let Some(tx) = self.pings.remove(task_id) {
            let _ = tx.send(false);
        }
    }

    fn framework_message(&mut self, driver: &ExecutorDriver, data: &[u8]) {
        let text = String::from_utf8_lossy(data);
        if let Some(task) = text.strip_prefix("ping ") {
            let task_id = TaskId::new(task);
            let _ = driver.send_framework_message(format!("pong {task}").into_bytes());
            if let Some(tx) = self.pings.remove(&task_id) {
                let _ = tx.send(true);
            }
        }
    }

    fn shutdown(&mut self, _driver: &ExecutorDriver) {
        for (_, tx) in self.pings.drain() {
            let _ = tx.send(false);
        }
        // Each task thread sends its terminal update before it ends; the
        // driver flushes unacknowledged updates before it stops.
        for thread in self.threads.drain(..) {
            let _ = thread.join();
        }
    }

    fn error(&mut self, _driver: &ExecutorDriver, message: &str) {
        eprintln!("test-executor: error: {message}");
    }
}

impl TestExecutor {
    fn lock_programs(&self) -> std::sync::MutexGuard<'_, HashMap<TaskId, u32>> {
        self.programs
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Runs `argv` for `task_id` and reports how it went.
    fn run_program(&mut self, driver: &ExecutorDriver, task_id: TaskId, argv: Vec<String>) {
        let Some((program, args)) = argv.split_first() else {
            update(driver, &task_id, TaskState::Error, "run: no program given");
            return;
        };
        if self.runtime.is_none() {
            match tokio::runtime::Builder::new_multi_thread()
                .worker_threads(1)
                .enable_all()
                .build()
            {
                Ok(rt) => self.runtime = Some(rt),
                Err(e) => {
                    update(
                        driver,
                        &task_id,
                        TaskState::Failed,
                        &format!("no runtime: {e}"),
                    );
                    return;
                }
            }
        }
        let Some(runtime) = self.runtime.as_ref() else {
            return;
        };
        let _entered = runtime.enter();
        let child = tokio::process::Command::new(program)
            .args(args)
            .stdin(Stdio::null())
            .kill_on_drop(false)
            .spawn();
        let mut child = match child {
            Ok(child) => child,
            Err(e) => {
                let message = format!("cannot start {program}: {e}");
                update(driver, &task_id, TaskState::Failed, &message);
                return;
            }
        };
        if let Some(pid) = child.id() {
            self.lock_programs().insert(task_id.clone(), pid);
        }
        update(driver, &task_id, TaskState::Running, "started");
        let driver = driver.clone();
        let programs = self.programs.clone();
        runtime.spawn(async move {
            let status = child.wait().await;
            programs
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .remove(&task_id);
            match status {
                Ok(s) if s.success() => update(&driver, &task_id, TaskState::Finished, "exited 0"),
                Ok(s) => update(&driver, &task_id, TaskState::Failed, &format!("{s}")),
                Err(e) => update(&driver, &task_id, TaskState::Failed, &format!("wait: {e}")),
            }
        });
    }
}

fn main() -> ExitCode {
    agora_examples::cli::init_logging(false);
    let driver = match ExecutorDriver::from_env(TestExecutor::default()) {
        Ok(driver) => driver,
        Err(e) => {
            eprintln!("test-executor: {e}");
            return ExitCode::FAILURE;
        }
    };
    match driver.run() {
        Ok(agora_executor::DriverStatus::Stopped) => ExitCode::SUCCESS,
        Ok(status) => {
            eprintln!("test-executor: driver ended {status:?}");
            ExitCode::FAILURE
        }
        Err(e) => {
            eprintln!("test-executor: {e}");
            ExitCode::FAILURE
        }
    }
}
