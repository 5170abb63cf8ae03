//! `ledger-executor`: an executor that keeps a ledger of every status
//! update it sends, for tests that check that no update is lost or
//! reordered on its way to the scheduler.
//!
//! A task's `data` is `updates=N;delay_ms=D;bytes=B` (defaults 3, 10 and
//! 0): the task sends N-1 `TASK_RUNNING` updates and then `TASK_FINISHED`,
//! D ms apart, each carrying B bytes of `data`.
//! Before each update is handed to the driver, a line
//! `{"event":"sent","task":…,"uuid":…,"state":…,"seq":…}` is written to
//! `ledger.jsonl` in the sandbox; when the agent acknowledges it, an
//! `"event":"acked"` line follows. Lines are written with `write(2)` on an
//! append-only file, so they survive the process being killed at any
//! moment (they are not fsynced: a machine crash is not what these tests
//! inject).

use std::collections::HashMap;
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use agora_executor::{Executor, ExecutorDriver};
use agora_proto::{Bytes, Source, TaskId, TaskInfo, TaskState, TaskStatus};

/// File name of the ledger in the sandbox.
const LEDGER: &str = "ledger.jsonl";

struct LedgerExecutor {
    ledger: Arc<Mutex<File>>,
    /// Per running task: set to stop it (killed).
    stops: HashMap<TaskId, Arc<AtomicBool>>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

/// What a task's data asks for.
struct Plan {
    updates: u32,
    delay: Duration,
    bytes: usize,
}

fn plan(task: &TaskInfo) -> Plan {
    let mut plan = Plan {
        updates: 3,
        delay: Duration::from_millis(10),
        bytes: 0,
    };
    let text = task
        .data
        .as_ref()
        .map(|d| d.to_string_lossy())
        .unwrap_or_default();
    for part in text.split(';') {
        match part.split_once('=') {
            Some(("updates", n)) => plan.updates = n.trim().parse().unwrap_or(3).max(1),
            Some(("delay_ms", n)) => {
                plan.delay = Duration::from_millis(n.trim().parse().unwrap_or(10))
            }
            Some(("bytes", n)) => plan.bytes = n.trim().parse().unwrap_or(0),
            _ => {}
        }
    }
    plan
}

fn record(ledger: &Mutex<File>, line: serde_json::Value) {
    let mut text = line.to_string();
    text.push('\n');
    let mut file = ledger.lock().unwrap_or_else(|e| e.into_inner());
    if let Err(e) = file.write_all(text.as_bytes()) {
        eprintln!("ledger-executor: cannot write the ledger: {e}");
    }
}

/// Records, then sends, one update.
fn send(
    driver: &ExecutorDriver,
    ledger: &Mutex<File>,
    task_id: &TaskId,
    state: TaskState,
    seq: u32,
    bytes: usize,
) {
    let mut status = TaskStatus::new(task_id.clone(), state, Source::SourceExecutor)
        .with_message(format!("update {seq}"))
        .with_new_uuid();
    if bytes > 0 {
        status.data = Some(Bytes(vec![b'0' + (seq % 10) as u8; bytes]));
    }
    let uuid = status.uuid.clone().unwrap_or_default();
    record(
        ledger,
        serde_json::json!({
            "event": "sent",
            "task": task_id.as_str(),
            "uuid": uuid,
            "state": state,
            "seq": seq,
        }),
    );
    if let Err(e) = driver.send_status_update(status) {
        eprintln!("ledger-executor: cannot send update for {task_id}: {e}");
    }
}

impl Executor for LedgerExecutor {
    fn launch_task(&mut self, driver: &ExecutorDriver, task: TaskInfo) {
        let plan = plan(&task);
        let stop = Arc::new(AtomicBool::new(false));
        self.stops.insert(task.task_id.clone(), stop.clone());
        let (driver, ledger) = (driver.clone(), self.ledger.clone());
        let thread = std::thread::spawn(move || {
            let id = task.task_id;
            for seq in 0..plan.updates {
                if stop.load(Ordering::SeqCst) {
                    send(&driver, &ledger, &id, TaskState::Killed, seq, 0);
                    return;
                }
                let state = if seq + 1 == plan.updates {
                    TaskState::Finished
                } else {
                    TaskState::Running
                };
                send(&driver, &ledger, &id, state, seq, plan.bytes);
                if seq + 1 < plan.updates {
                    std::thread::sleep(plan.delay);
                }
            }
        });
        self.threads.retain(|t| !t.is_finished());
        self.threads.push(thread);
    }

    fn kill_task(&mut self, _driver: &ExecutorDriver, task_id: &TaskId) {
        if let Some(stop) = self.stops.get(task_id) {
            stop.store(true, Ordering::SeqCst);
        }
    }

    fn status_update_acknowledged(
        &mut self,
        _driver: &ExecutorDriver,
        task_id: &TaskId,
        uuid: &str,
    ) {
        record(
            &self.ledger,
            serde_json::json!({"event": "acked", "task": task_id.as_str(), "uuid": uuid}),
        );
    }

    fn shutdown(&mut self, _driver: &ExecutorDriver) {
        for stop in self.stops.values() {
            stop.store(true, Ordering::SeqCst);
        }
        for thread in self.threads.drain(..) {
            let _ = thread.join();
        }
    }

    fn error(&mut self, _driver: &ExecutorDriver, message: &str) {
        eprintln!("ledger-executor: error: {message}");
    }
}

fn main() -> ExitCode {
    agora_examples::cli::init_logging(false);
    let sandbox =
        PathBuf::from(std::env::var(agora_proto::env::SANDBOX).unwrap_or_else(|_| ".".into()));
    let ledger = match OpenOptions::new()
        .create(true)
        .append(true)
        .open(sandbox.join(LEDGER))
    {
        Ok(file) => file,
        Err(e) => {
            eprintln!(
                "ledger-executor: cannot open the ledger in {}: {e}",
                sandbox.display()
            );
            return ExitCode::FAILURE;
        }
    };
    let executor = LedgerExecutor {
        ledger: Arc::new(Mutex::new(ledger)),
        stops: HashMap::new(),
        threads: Vec::new(),
    };
    let driver = match ExecutorDriver::from_env(executor) {
        Ok(driver) => driver,
        Err(e) => {
            eprintln!("ledger-executor: {e}");
            return ExitCode::FAILURE;
        }
    };
    match driver.run() {
        Ok(agora_executor::DriverStatus::Stopped) => ExitCode::SUCCESS,
        Ok(status) => {
            eprintln!("ledger-executor: driver ended {status:?}");
            ExitCode::FAILURE
        }
        Err(e) => {
            eprintln!("ledger-executor: {e}");
            ExitCode::FAILURE
        }
    }
}
