//! The agent core: one task that owns every piece of the agent's state
//! (frameworks, executors, tasks, status update streams, the master and
//! executor connections) and takes [`CoreEvent`]s from one queue.
//! Connection tasks, process waiters, timers and the checkpoint writer only
//! post events here; nothing else mutates state, and the core never awaits
//! anything but its queue, so no event waits behind another's I/O.

use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
use std::time::Duration;

use agora_proto::agent::{self as agent_api, ExecutorReport, TaskReport};
use agora_proto::executor as exec_api;
use agora_proto::{
    AgentId, AgentInfo, CommandInfo, ExecutorId, ExecutorInfo, FrameworkId, FrameworkInfo, Reason,
    Resources, Source, TaskId, TaskInfo, TaskState, TaskStatus,
};
use serde_json::json;
use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;

mod executors;
mod master;
mod recovery;
mod snapshot;
mod tasks;
mod updates;

use crate::checkpoint::{self, ExecutorRecord, Op, Writer};
use crate::http::{ExecLink, LinkFull};
use crate::launcher::{self, LaunchSpec};
use crate::paths;
use crate::processes::{Processes, Request, Started};
use crate::status_updates::{AckOutcome, StatusUpdateManager, StreamKey, UpdateOutcome};
use crate::wal::{StreamState, WalRecord};
use crate::{RecoverMode, Shared};

/// Resources of the built-in command executor itself.
const COMMAND_EXECUTOR_RESOURCES: &str = "cpus:0.1;mem:32";
/// Most calls kept for the master while the agent is not registered.
const UNSENT_LIMIT: usize = 4096;
/// How long an exited executor's connection may stay open (held by a
/// process it left behind) before the executor is ended without it.
const EXIT_DRAIN: Duration = Duration::from_secs(2);
/// Time between SIGTERM and SIGKILL once an executor overran its shutdown
/// grace period.
const OVERRUN_KILL_DELAY: Duration = Duration::from_secs(1);

/// Identifies an executor: framework and executor id.
pub(crate) type ExecKey = (FrameworkId, ExecutorId);

/// Everything the core reacts to.
pub(crate) enum CoreEvent {
    /// A new master connection; `tx` writes to it.
    MasterConnected {
        conn: u64,
        tx: mpsc::Sender<agent_api::Call>,
        /// The connection's local IP (for the advertised address).
        local_ip: Option<std::net::IpAddr>,
    },
    /// An event (other than PING) from the master.
    MasterEvent {
        conn: u64,
        event: Box<agent_api::Event>,
    },
    /// The master connection ended.
    MasterDisconnected { conn: u64 },
    /// An executor subscribed (or re-subscribed) on connection `conn`.
    ExecutorSubscribe {
        conn: u64,
        link: ExecLink,
        framework_id: FrameworkId,
        executor_id: ExecutorId,
        token: String,
        updates: Vec<TaskStatus>,
        tasks: Vec<TaskInfo>,
    },
    /// A call after subscribing.
    ExecutorCall { conn: u64, call: exec_api::Call },
    /// A subscribed executor connection ended.
    ExecutorDisconnected { conn: u64 },
    /// A launch asked of the process thread succeeded or failed.
    ExecutorLaunched {
        key: ExecKey,
        run_id: String,
        result: Result<Started, String>,
    },
    /// An executor asked to shut down had its grace period: it is to be
    /// terminated.
    ShutdownOverrun { key: ExecKey, run_id: String },
    /// A command executor's idle time ran out: it stops unless it was given
    /// a task since (`assignments` moved on).
    CommandExecutorIdle {
        key: ExecKey,
        run_id: String,
        assignments: u64,
    },
    /// An exited executor's connection did not close in time (another
    /// process holds it): end the executor without it.
    ExitDrained { key: ExecKey, run_id: String },
    /// An executor process ended.
    ExecutorExited {
        key: ExecKey,
        run_id: String,
        code: Option<i32>,
        message: String,
    },
    /// The registration timer of an executor run fired.
    RegistrationTimeout { key: ExecKey, run_id: String },
    /// A checkpointed update reached the disk (or failed to).
    UpdateDurable {
        framework_id: FrameworkId,
        status: TaskStatus,
        ack_to: Option<ExecKey>,
        result: Result<(), String>,
    },
    /// A checkpointed acknowledgement reached the disk (or failed to):
    /// the stream's next update may go.
    AckDurable {
        framework_id: FrameworkId,
        task_id: TaskId,
        result: Result<(), String>,
    },
    /// `/state` wants a snapshot.
    State {
        reply: oneshot::Sender<serde_json::Value>,
    },
}

/// Why the core stopped.
pub(crate) enum Stop {
    /// The shutdown future completed.
    Requested,
    /// The master refused the agent for good.
    Refused(String),
}

struct MasterConn {
    conn: u64,
    tx: mpsc::Sender<agent_api::Call>,
    registered: bool,
}

struct ExecConn {
    key: ExecKey,
    link: ExecLink,
}

/// The terminal update an executor's unfinished tasks get when it ends.
#[derive(Debug, Clone)]
struct Termination {
    state: TaskState,
    reason: Reason,
    message: String,
}

struct Executor {
    info: ExecutorInfo,
    run_id: String,
    token: String,
    sandbox: PathBuf,
    pid: Option<u32>,
    start_time: Option<u64>,
    /// The built-in command executor, which runs the command tasks of its
    /// framework (up to `--command-executor-tasks` at once).
    is_command: bool,
    conn: Option<u64>,
    subscribed: bool,
    /// Tasks not yet delivered, in arrival order.
    queued: Vec<TaskId>,
    killing: bool,
    termination: Option<Termination>,
    /// The process exited (code, description) while its connection was
    /// still open: it ends once that connection has delivered its last
    /// frames.
    exited: Option<(Option<i32>, String)>,
    /// Bumped whenever a command executor is given a task, so an idle
    /// timer set before knows it is stale.
    assignments: u64,
}

struct Task {
    /// The executor process that runs it (for a command task, the command
    /// executor it was given to; see [`Task::reported_executor_id`]).
    executor_id: ExecutorId,
    /// Its own sandbox: command tasks have one each, as with a command
    /// executor per task; other tasks share their executor's.
    sandbox: Option<PathBuf>,
    info: TaskInfo,
    state: TaskState,
    latest: Option<TaskStatus>,
    kill_requested: bool,
    /// The executor reported a terminal state (its update may still be on
    /// its way to the disk).
    terminal_reported: bool,
    checkpointed: bool,
}

/// The agent's state and its event handlers.
pub(crate) struct Core {
    shared: Shared,
    tx: mpsc::Sender<CoreEvent>,
    agent_id: Option<AgentId>,
    master: Option<MasterConn>,
    frameworks: HashMap<FrameworkId, FrameworkInfo>,
    executors: HashMap<ExecKey, Executor>,
    tasks: HashMap<StreamKey, Task>,
    /// The tasks of each executor (it may be gone while its tasks' streams
    /// are not).
    tasks_by_executor: HashMap<ExecKey, HashSet<TaskId>>,
    /// How many tasks each framework has.
    tasks_by_framework: HashMap<FrameworkId, usize>,
    exec_conns: HashMap<u64, ExecConn>,
    updates: StatusUpdateManager,
    /// Updates submitted to the checkpoint writer, not yet durable.
    pending_durable: HashSet<(FrameworkId, TaskId, String)>,
    /// Status updates whose acknowledgement came back from the master.
    acknowledged: u64,
    writer: Writer,
    processes: Processes,
    /// The local IP of the latest connection to the master.
    master_local_ip: Option<std::net::IpAddr>,
    /// Calls other than status updates made while not registered, sent
    /// once registered (at most [`UNSENT_LIMIT`]).
    unsent: Vec<agent_api::Call>,
}

// === impl Task ===

impl Task {
    /// A task just given to the agent: staging, no update yet.
    fn staging(
        executor_id: ExecutorId,
        sandbox: Option<PathBuf>,
        info: TaskInfo,
        checkpointed: bool,
    ) -> Task {
        Task {
            executor_id,
            sandbox,
            info,
            state: TaskState::Staging,
            latest: None,
            kill_requested: false,
            terminal_reported: false,
            checkpointed,
        }
    }

    /// Whether it runs in one of the agent's command executors (whose ids
    /// no framework can use).
    fn in_command_executor(&self) -> bool {
        self.executor_id
            .as_str()
            .starts_with(paths::AGENT_EXECUTOR_PREFIX)
    }

    /// The executor id its updates and reports name: a command task's own
    /// id (as when each had a command executor of its own, as in Mesos),
    /// else its executor's.
    fn reported_executor_id(&self) -> ExecutorId {
        if self.in_command_executor() {
            ExecutorId::new(self.info.task_id.as_str())
        } else {
            self.executor_id.clone()
        }
    }
}

// === impl Core ===

impl Core {
    pub(crate) fn new(
        shared: Shared,
        tx: mpsc::Sender<CoreEvent>,
        writer: Writer,
        processes: Processes,
    ) -> Self {
        let updates = StatusUpdateManager::new(
            shared.config.status_update_retry_min,
            shared.config.status_update_retry_max,
        );
        Core {
            shared,
            tx,
            agent_id: None,
            master: None,
            frameworks: HashMap::new(),
            executors: HashMap::new(),
            tasks: HashMap::new(),
            tasks_by_executor: HashMap::new(),
            tasks_by_framework: HashMap::new(),
            exec_conns: HashMap::new(),
            updates,
            pending_durable: HashSet::new(),
            acknowledged: 0,
            writer,
            processes,
            unsent: Vec::new(),
            master_local_ip: None,
        }
    }

    /// Processes events until `shutdown` completes or the master refuses
    /// the agent, then stops: executors that cannot be recovered later are
    /// killed, the others keep running.
    pub(crate) async fn run(
        mut self,
        mut rx: mpsc::Receiver<CoreEvent>,
        shutdown: impl std::future::Future<Output = ()>,
    ) -> Stop {
        tokio::pin!(shutdown);
        let stop = loop {
            let retry = self.updates.next_retry();
            tokio::select! {
                _ = &mut shutdown => break Stop::Requested,
                event = rx.recv() => match event {
                    Some(event) => {
                        if let Some(stop) = self.handle(event) {
                            break stop;
                        }
                    }
                    None => break Stop::Requested,
                },
                _ = sleep_until_opt(retry) => {
                    for (framework_id, status) in self.updates.due_retries(Instant::now()) {
                        tracing::debug!(%framework_id, task_id = %status.task_id, "resending status update");
                        self.shared.counters.retried_on_timeout();
                        self.send_master(agent_api::Call::StatusUpdate { framework_id, status });
                    }
                }
            }
        };
        self.stop().await;
        stop
    }

    async fn stop(&mut self) {
        let grace = self.shared.config.executor_shutdown_grace_period;
        let keys: Vec<ExecKey> = self.executors.keys().cloned().collect();
        let mut runs = Vec::new();
        for key in keys {
            let recoverable = self.checkpointing(&key.0)
                && self.shared.config.recover == RecoverMode::Reconnect
                && self.executors.get(&key).is_some_and(|e| e.pid.is_some());
            if recoverable {
                tracing::info!(framework_id = %key.0, executor_id = %key.1, "leaving checkpointed executor running for recovery");
                continue;
            }
            let asked = self
                .executors
                .get(&key)
                .is_some_and(|e| e.subscribed && e.conn.is_some());
            if asked {
                self.send_exec(
                    &key,
                    exec_api::Event::Shutdown {
                        grace_period_seconds: grace.as_secs_f64(),
                    },
                );
            }
            if let Some(ex) = self.executors.get(&key) {
                runs.push((ex.run_id.clone(), asked));
            }
        }
        for conn in self.exec_conns.values() {
            conn.link.close(1001, "agent shutting down");
        }
        self.exec_conns.clear();
        let (done, stopped) = oneshot::channel();
        self.processes.send(Request::StopAll {
            runs,
            grace,
            overrun: OVERRUN_KILL_DELAY,
            done,
        });
        let wait = grace + OVERRUN_KILL_DELAY + Duration::from_secs(5);
        let _ = tokio::time::timeout(wait, stopped).await;
        // Flush the checkpoint writer.
        let (tx, rx) = oneshot::channel();
        self.writer.submit(
            Vec::new(),
            Some(Box::new(move |_| {
                let _ = tx.send(());
            })),
        );
        let _ = tokio::time::timeout(Duration::from_secs(10), rx).await;
    }

    /// Adds a task, keeping the indexes.
    fn insert_task(&mut self, key: StreamKey, task: Task) {
        self.tasks_by_executor
            .entry((key.0.clone(), task.executor_id.clone()))
            .or_default()
            .insert(key.1.clone());
        if let Some(old) = self.tasks.insert(key.clone(), task) {
            self.unindex_task(&key, &old);
        }
        *self.tasks_by_framework.entry(key.0).or_default() += 1;
    }

    /// Removes a task, keeping the indexes.
    fn remove_task(&mut self, key: &StreamKey) -> Option<Task> {
        let task = self.tasks.remove(key)?;
        self.unindex_task(key, &task);
        Some(task)
    }

    fn unindex_task(&mut self, key: &StreamKey, task: &Task) {
        let ekey = (key.0.clone(), task.executor_id.clone());
        if let Some(set) = self.tasks_by_executor.get_mut(&ekey) {
            set.remove(&key.1);
            if set.is_empty() {
                self.tasks_by_executor.remove(&ekey);
            }
        }
        if let Some(n) = self.tasks_by_framework.get_mut(&key.0) {
            *n -= 1;
            if *n == 0 {
                self.tasks_by_framework.remove(&key.0);
            }
        }
    }

    /// The tasks of executor `ekey`.
    fn executor_tasks(&self, ekey: &ExecKey) -> impl Iterator<Item = (&TaskId, &Task)> + '_ {
        let fid = ekey.0.clone();
        self.tasks_by_executor
            .get(ekey)
            .into_iter()
            .flatten()
            .filter_map(move |tid| {
                let task = self.tasks.get(&(fid.clone(), tid.clone()))?;
                Some((tid, task))
            })
    }

    fn handle(&mut self, event: CoreEvent) -> Option<Stop> {
        match event {
            CoreEvent::MasterConnected { conn, tx, local_ip } => {
                if local_ip.is_some() {
                    self.master_local_ip = local_ip;
                }
                let register = self.register_call();
                if tx.try_send(register).is_ok() {
                    self.master = Some(MasterConn {
                        conn,
                        tx,
                        registered: false,
                    });
                }
            }
            CoreEvent::MasterDisconnected { conn } => {
                if self.master.as_ref().is_some_and(|m| m.conn == conn) {
                    self.master = None;
                    self.updates.disconnected();
                }
            }
            CoreEvent::MasterEvent { conn, event } => {
                if self.master.as_ref().is_some_and(|m| m.conn == conn) {
                    return self.master_event(*event);
                }
            }
            CoreEvent::ExecutorSubscribe {
                conn,
                link,
                framework_id,
                executor_id,
                token,
                updates,
                tasks,
            } => self.executor_subscribe(
                conn,
                link,
                framework_id,
                executor_id,
                token,
                updates,
                tasks,
            ),
            CoreEvent::ExecutorCall { conn, call } => self.executor_call(conn, call),
            CoreEvent::ExecutorDisconnected { conn } => self.executor_disconnected(conn),
            CoreEvent::CommandExecutorIdle {
                key,
                run_id,
                assignments,
            } => self.command_executor_idle(key, run_id, assignments),
            CoreEvent::ExitDrained { key, run_id } => {
                if let Some(ex) = self.executors.get(&key).filter(|e| e.run_id == run_id) {
                    if let Some((code, message)) = ex.exited.clone() {
                        tracing::warn!(framework_id = %key.0, executor_id = %key.1, "the connection of an exited executor is still open; ending it without waiting for more");
                        self.executor_ended(key, code, message);
                    }
                }
            }
            CoreEvent::ExecutorExited {
                key,
                run_id,
                code,
                message,
            } => self.executor_exited(key, run_id, code, message),
            CoreEvent::ExecutorLaunched {
                key,
                run_id,
                result,
            } => self.executor_launched(key, run_id, result),
            CoreEvent::ShutdownOverrun { key, run_id } => {
                if self.executors.get(&key).is_some_and(|e| e.run_id == run_id) {
                    tracing::warn!(framework_id = %key.0, executor_id = %key.1, "executor did not shut down within its grace period; terminating it");
                    self.processes.send(Request::Terminate {
                        run_id,
                        grace: OVERRUN_KILL_DELAY,
                    });
                }
            }
            CoreEvent::RegistrationTimeout { key, run_id } => {
                let timeout = self.shared.config.executor_registration_timeout;
                if let Some(ex) = self.executors.get_mut(&key) {
                    if ex.run_id == run_id && !ex.subscribed && !ex.killing {
                        tracing::warn!(framework_id = %key.0, executor_id = %key.1, ?timeout, "executor did not subscribe in time; killing it");
                        ex.termination = Some(Termination {
                            state: TaskState::Failed,
                            reason: Reason::ReasonExecutorRegistrationTimeout,
                            message: format!(
                                "executor did not subscribe within {}",
                                fmt_duration(timeout)
                            ),
                        });
                        self.kill_executor(&key, None);
                    }
                }
            }
            CoreEvent::UpdateDurable {
                framework_id,
                status,
                ack_to,
                result,
            } => {
                let uuid = status.uuid.clone().unwrap_or_default();
                self.pending_durable
                    .remove(&(framework_id.clone(), status.task_id.clone(), uuid));
                match result {
                    Ok(()) => self.append_to_stream(framework_id, status, ack_to),
                    Err(e) => {
                        // Deliver it anyway, but do not tell the executor
                        // it is safe: it keeps the update and re-sends it.
                        tracing::error!(%framework_id, task_id = %status.task_id, error = %e, "could not checkpoint status update");
                        self.append_to_stream(framework_id, status, None);
                    }
                }
            }
            CoreEvent::AckDurable {
                framework_id,
                task_id,
                result,
            } => {
                if let Err(e) = result {
                    // Go on regardless: a duplicate after a restart is
                    // better than a stalled stream.
                    tracing::error!(%framework_id, %task_id, error = %e, "could not checkpoint an acknowledgement");
                }
                if let Some(status) = self
                    .updates
                    .release(&framework_id, &task_id, Instant::now())
                {
                    self.send_master(agent_api::Call::StatusUpdate {
                        framework_id,
                        status,
                    });
                }
            }
            CoreEvent::State { reply } => {
                let _ = reply.send(self.snapshot());
            }
        }
        None
    }
}

/// Compares tokens without an early exit on the first difference.
fn tokens_equal(a: &str, b: &str) -> bool {
    a.len() == b.len()
        && a.bytes()
            .zip(b.bytes())
            .fold(0u8, |acc, (x, y)| acc | (x ^ y))
            == 0
}

fn fmt_duration(d: Duration) -> String {
    format!("{}s", d.as_secs_f64())
}

async fn sleep_until_opt(deadline: Option<Instant>) {
    match deadline {
        Some(deadline) => tokio::time::sleep_until(deadline).await,
        None => std::future::pending().await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn token_comparison() {
        assert!(tokens_equal("abc", "abc"));
        assert!(!tokens_equal("abc", "abd"));
        assert!(!tokens_equal("abc", "abcd"));
    }
}
