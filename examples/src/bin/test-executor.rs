//! `test-executor`: the custom executor of `test-framework`. Each task
//! reports TASK_RUNNING, answers the scheduler's `ping TASK` message with
//! `pong TASK`, and then finishes (after 10 s without a ping it finishes
//! anyway, saying so: framework messages are best effort).

use std::collections::HashMap;
use std::process::ExitCode;
use std::sync::mpsc;
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
