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
use tokio::task::JoinSet;
use tokio::time::Instant;

use crate::checkpoint::{self, ExecutorRecord, Op, Writer};
use crate::http::ExecOut;
use crate::launcher::{self, LaunchSpec};
use crate::paths;
use crate::status_updates::{AckOutcome, StatusUpdateManager, StreamKey, UpdateOutcome};
use crate::wal::{StreamState, WalRecord};
use crate::{RecoverMode, Shared};

/// Events queued for the core.
pub(crate) const CORE_QUEUE: usize = 4096;
/// Resources of the built-in command executor itself.
const COMMAND_EXECUTOR_RESOURCES: &str = "cpus:0.1;mem:32";
/// How often a recovered executor (not a child of this agent) is checked.
const RECOVERED_POLL: Duration = Duration::from_millis(500);
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
        tx: mpsc::Sender<ExecOut>,
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
    tx: mpsc::Sender<ExecOut>,
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
    is_command: bool,
    /// Forked by this agent run (else re-attached after a restart).
    child: bool,
    conn: Option<u64>,
    subscribed: bool,
    /// Tasks not yet delivered, in arrival order.
    queued: Vec<TaskId>,
    killing: bool,
    termination: Option<Termination>,
}

struct Task {
    executor_id: ExecutorId,
    info: TaskInfo,
    state: TaskState,
    latest: Option<TaskStatus>,
    kill_requested: bool,
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
    exec_conns: HashMap<u64, ExecConn>,
    updates: StatusUpdateManager,
    /// Updates submitted to the checkpoint writer, not yet durable.
    pending_durable: HashSet<(FrameworkId, TaskId, String)>,
    /// Status updates whose acknowledgement came back from the master.
    acknowledged: u64,
    writer: Writer,
    kills: JoinSet<()>,
}

// === impl Core ===

impl Core {
    pub(crate) fn new(shared: Shared, tx: mpsc::Sender<CoreEvent>, writer: Writer) -> Self {
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
            exec_conns: HashMap::new(),
            updates,
            pending_durable: HashSet::new(),
            acknowledged: 0,
            writer,
            kills: JoinSet::new(),
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
                Some(_) = self.kills.join_next(), if !self.kills.is_empty() => {}
            }
        };
        self.stop().await;
        stop
    }

    async fn stop(&mut self) {
        let grace = self.shared.config.executor_shutdown_grace_period;
        let keys: Vec<ExecKey> = self.executors.keys().cloned().collect();
        for key in keys {
            let recoverable = self.checkpointing(&key.0)
                && self.shared.config.recover == RecoverMode::Reconnect
                && self.executors.get(&key).is_some_and(|e| e.pid.is_some());
            if recoverable {
                tracing::info!(framework_id = %key.0, executor_id = %key.1, "leaving checkpointed executor running for recovery");
            } else {
                self.kill_executor(&key, None);
            }
        }
        for conn in self.exec_conns.values() {
            let _ = conn.tx.try_send(ExecOut::Close {
                code: 1001,
                reason: "agent shutting down".into(),
            });
        }
        self.exec_conns.clear();
        let wait = grace * 2 + OVERRUN_KILL_DELAY + Duration::from_secs(1);
        let kills = &mut self.kills;
        let _ = tokio::time::timeout(
            wait,
            async move { while kills.join_next().await.is_some() {} },
        )
        .await;
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

    fn handle(&mut self, event: CoreEvent) -> Option<Stop> {
        match event {
            CoreEvent::MasterConnected { conn, tx } => {
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
                tx,
                framework_id,
                executor_id,
                token,
                updates,
                tasks,
            } => {
                self.executor_subscribe(conn, tx, framework_id, executor_id, token, updates, tasks)
            }
            CoreEvent::ExecutorCall { conn, call } => self.executor_call(conn, call),
            CoreEvent::ExecutorDisconnected { conn } => {
                if let Some(c) = self.exec_conns.remove(&conn) {
                    if let Some(ex) = self.executors.get_mut(&c.key) {
                        if ex.conn == Some(conn) {
                            ex.conn = None;
                            tracing::info!(framework_id = %c.key.0, executor_id = %c.key.1, "executor disconnected");
                        }
                    }
                }
            }
            CoreEvent::ExecutorExited {
                key,
                run_id,
                code,
                message,
            } => self.executor_exited(key, run_id, code, message),
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

    // --- master ---

    fn master_event(&mut self, event: agent_api::Event) -> Option<Stop> {
        use agent_api::Event;
        match event {
            Event::Registered {
                agent_id,
                reregistered,
                master_info,
                ..
            } => {
                if agent_id.validate().is_err() {
                    tracing::error!(%agent_id, "master assigned an unusable agent id; ignored");
                    return None;
                }
                tracing::info!(%agent_id, reregistered, master = %master_info.address, "registered with master");
                if self.agent_id.as_ref() != Some(&agent_id) {
                    if let Err(e) =
                        checkpoint::write_agent_id(&self.shared.config.work_dir, agent_id.as_str())
                    {
                        tracing::error!(%agent_id, error = %e, "could not save the agent id");
                    }
                    self.agent_id = Some(agent_id);
                }
                if let Some(m) = self.master.as_mut() {
                    m.registered = true;
                }
                for (framework_id, status) in self.updates.connected(Instant::now()) {
                    self.shared.counters.resent_on_registration();
                    self.send_master(agent_api::Call::StatusUpdate {
                        framework_id,
                        status,
                    });
                }
            }
            Event::RunTask { framework, task } => self.run_task(framework, task),
            Event::KillTask {
                framework_id,
                task_id,
            } => self.kill_task(framework_id, task_id),
            Event::Acknowledge {
                framework_id,
                task_id,
                uuid,
            } => self.acknowledge(framework_id, task_id, uuid),
            Event::Message {
                framework_id,
                executor_id,
                data,
            } => {
                let key = (framework_id, executor_id);
                if !self.send_exec(&key, exec_api::Event::Message { data }) {
                    tracing::debug!(framework_id = %key.0, executor_id = %key.1, "framework message for an unconnected executor dropped");
                }
            }
            Event::ShutdownFramework { framework_id } => {
                tracing::info!(%framework_id, "shutting down framework");
                let keys: Vec<ExecKey> = self
                    .executors
                    .keys()
                    .filter(|k| k.0 == framework_id)
                    .cloned()
                    .collect();
                for key in keys {
                    self.kill_executor(
                        &key,
                        Some(Termination {
                            state: TaskState::Killed,
                            reason: Reason::ReasonFrameworkRemoved,
                            message: "framework was shut down".into(),
                        }),
                    );
                }
            }
            Event::Ping => self.send_master(agent_api::Call::Pong),
            Event::Shutdown { message } => self.master_shutdown(&message),
            Event::Error { message, fatal } => {
                if fatal {
                    tracing::error!(%message, "master refused this agent");
                    return Some(Stop::Refused(message));
                }
                tracing::warn!(%message, "error from master");
            }
            Event::Unknown => {}
        }
        None
    }

    fn register_call(&self) -> agent_api::Call {
        let config = &self.shared.config;
        let tasks = self
            .tasks
            .iter()
            .map(|((fid, _), t)| TaskReport {
                framework_id: fid.clone(),
                task: t.info.clone(),
                state: t.state,
                latest_status: t.latest.clone(),
            })
            .collect();
        let executors = self
            .executors
            .iter()
            .map(|((fid, _), e)| ExecutorReport {
                framework_id: fid.clone(),
                executor: e.info.clone(),
            })
            .collect();
        agent_api::Call::Register {
            protocol: agora_proto::PROTOCOL_VERSION,
            agent_info: AgentInfo {
                id: self.agent_id.clone(),
                hostname: config.hostname.clone(),
                address: self.shared.address.clone(),
                resources: config.resources.clone(),
                attributes: config.attributes.clone(),
            },
            tasks,
            executors,
            frameworks: self.frameworks.values().cloned().collect(),
        }
    }

    fn send_master(&mut self, call: agent_api::Call) {
        let Some(master) = self.master.as_ref().filter(|m| m.registered) else {
            return;
        };
        if let Err(mpsc::error::TrySendError::Full(_)) = master.tx.try_send(call) {
            // Reliable updates are retried; anything else is best effort.
            tracing::warn!("master outbox full; message dropped");
        }
    }

    fn master_shutdown(&mut self, message: &str) {
        tracing::warn!(%message, "master shut this agent down; killing everything and registering anew");
        let grace = self.shared.config.executor_shutdown_grace_period;
        for (_, ex) in self.executors.drain() {
            if let Some(pid) = ex.pid {
                self.kills
                    .spawn(async move { launcher::terminate_session(pid, grace).await });
            }
        }
        for (_, conn) in self.exec_conns.drain() {
            let _ = conn.tx.try_send(ExecOut::Close {
                code: 1000,
                reason: "agent shut down by the master".into(),
            });
        }
        self.tasks.clear();
        self.frameworks.clear();
        self.updates.forget(None);
        self.pending_durable.clear();
        let work_dir = &self.shared.config.work_dir;
        self.writer.submit(
            vec![
                Op::WalForget(None),
                Op::RemoveDir {
                    path: paths::meta_root(work_dir).join("frameworks"),
                },
            ],
            None,
        );
        if let Err(e) = std::fs::remove_file(paths::agent_id_file(work_dir)) {
            if e.kind() != std::io::ErrorKind::NotFound {
                tracing::error!(error = %e, "could not remove the agent id file");
            }
        }
        self.agent_id = None;
        // Dropping the connection's sender makes the link reconnect, and the
        // new connection registers as a new agent.
        self.master = None;
        self.updates.disconnected();
    }

    // --- tasks ---

    fn run_task(&mut self, framework: FrameworkInfo, task: TaskInfo) {
        let Some(fid) = framework.id.clone() else {
            tracing::warn!(task_id = %task.task_id, "RUN_TASK without a framework id; ignored");
            return;
        };
        let key = (fid.clone(), task.task_id.clone());
        if self.tasks.contains_key(&key) || self.updates.has_stream(&fid, &task.task_id) {
            tracing::warn!(framework_id = %fid, task_id = %task.task_id, "RUN_TASK for a task the agent already has; ignored");
            return;
        }
        let (mut info, is_command) = match (&task.command, &task.executor) {
            (Some(command), None) => (self.command_executor_info(&task, command), true),
            (None, Some(executor)) => (executor.clone(), false),
            _ => {
                self.reject(
                    &fid,
                    &task,
                    TaskState::Error,
                    Reason::ReasonTaskInvalid,
                    "a task needs exactly one of command or executor".into(),
                );
                return;
            }
        };
        info.framework_id = Some(fid.clone());
        let ids = [
            ("framework", fid.as_str()),
            ("task", task.task_id.as_str()),
            ("executor", info.executor_id.as_str()),
        ];
        for (kind, id) in ids {
            if let Err(e) = agora_proto::validate_id(id) {
                let message = format!("invalid {kind} id: {e}");
                self.reject(
                    &fid,
                    &task,
                    TaskState::Error,
                    Reason::ReasonTaskInvalid,
                    message,
                );
                return;
            }
        }
        let ekey = (fid.clone(), info.executor_id.clone());
        if self.executors.get(&ekey).is_some_and(|e| e.killing) {
            self.reject(
                &fid,
                &task,
                TaskState::Dropped,
                Reason::ReasonExecutorTerminated,
                format!("executor {} is shutting down", ekey.1),
            );
            return;
        }
        self.adopt_framework(framework);
        let checkpointed = self.checkpointing(&fid);
        if checkpointed {
            self.checkpoint_task(&fid, &ekey.1, &task);
        }
        tracing::info!(framework_id = %fid, task_id = %task.task_id, executor_id = %ekey.1, "running task");
        let task_id = task.task_id.clone();
        self.tasks.insert(
            key,
            Task {
                executor_id: ekey.1.clone(),
                info: task,
                state: TaskState::Staging,
                latest: None,
                kill_requested: false,
                checkpointed,
            },
        );
        if self.executors.contains_key(&ekey) {
            self.deliver_or_queue(&ekey, task_id);
        } else {
            self.launch_executor(ekey, info, is_command, task_id);
        }
    }

    /// An agent-generated update for a task the agent does not run.
    fn reject(
        &mut self,
        fid: &FrameworkId,
        task: &TaskInfo,
        state: TaskState,
        reason: Reason,
        message: String,
    ) {
        tracing::warn!(framework_id = %fid, task_id = %task.task_id, %message, "task rejected");
        let status = self.agent_status(&task.task_id, None, state, reason, message);
        self.enqueue_update(fid.clone(), status, None);
    }

    fn command_executor_info(&self, task: &TaskInfo, command: &CommandInfo) -> ExecutorInfo {
        let program = &self.shared.config.command_executor;
        ExecutorInfo {
            executor_id: ExecutorId::new(task.task_id.as_str()),
            framework_id: None,
            command: CommandInfo {
                value: program.first().cloned().unwrap_or_default(),
                shell: false,
                arguments: program.clone(),
                environment: command.environment.clone(),
            },
            resources: Resources::parse(COMMAND_EXECUTOR_RESOURCES).unwrap_or_default(),
            name: format!("Command Executor (Task: {})", task.task_id),
            source: task.task_id.to_string(),
        }
    }

    fn adopt_framework(&mut self, framework: FrameworkInfo) {
        let Some(fid) = framework.id.clone() else {
            return;
        };
        if self.frameworks.get(&fid) == Some(&framework) {
            return;
        }
        if framework.checkpoint {
            if let Ok(dir) = paths::meta_framework_dir(&self.shared.config.work_dir, fid.as_str()) {
                self.writer.submit(
                    vec![Op::Replace {
                        path: dir.join("framework.json"),
                        bytes: checkpoint::json_bytes(&framework),
                    }],
                    None,
                );
            }
        }
        self.frameworks.insert(fid, framework);
    }

    fn deliver_or_queue(&mut self, ekey: &ExecKey, task_id: TaskId) {
        let Some(ex) = self.executors.get_mut(ekey) else {
            return;
        };
        let connected = ex.subscribed && ex.conn.is_some();
        if !connected {
            ex.queued.push(task_id);
            return;
        }
        if let Some(task) = self.tasks.get(&(ekey.0.clone(), task_id)) {
            let event = exec_api::Event::Launch {
                task: task.info.clone(),
            };
            self.send_exec(ekey, event);
        }
    }

    fn kill_task(&mut self, fid: FrameworkId, task_id: TaskId) {
        let key = (fid.clone(), task_id.clone());
        let Some(task) = self.tasks.get_mut(&key) else {
            if !self.updates.has_stream(&fid, &task_id) {
                let status = self.agent_status(
                    &task_id,
                    None,
                    TaskState::Lost,
                    Reason::ReasonTaskUnknown,
                    "task is unknown to the agent".into(),
                );
                self.enqueue_update(fid, status, None);
            }
            return;
        };
        if task.state.is_terminal() {
            return;
        }
        task.kill_requested = true;
        let ekey = (fid.clone(), task.executor_id.clone());
        let grace = task.info.kill_grace_period;
        let Some(ex) = self.executors.get_mut(&ekey) else {
            return;
        };
        if let Some(pos) = ex.queued.iter().position(|t| *t == task_id) {
            ex.queued.remove(pos);
            let eid = ekey.1.clone();
            let status = self.agent_status(
                &task_id,
                Some(eid),
                TaskState::Killed,
                Reason::ReasonTaskKilled,
                "task killed before it was delivered to its executor".into(),
            );
            self.enqueue_update(fid, status, None);
            if !self.executor_has_live_tasks(&ekey) {
                self.kill_executor(&ekey, None);
            }
            return;
        }
        if ex.subscribed && ex.conn.is_some() {
            self.send_exec(
                &ekey,
                exec_api::Event::Kill {
                    task_id,
                    grace_period_seconds: grace,
                },
            );
        }
        // Otherwise the kill is sent when the executor re-subscribes.
    }

    fn executor_has_live_tasks(&self, ekey: &ExecKey) -> bool {
        self.tasks
            .iter()
            .any(|((f, _), t)| *f == ekey.0 && t.executor_id == ekey.1 && !t.state.is_terminal())
    }

    fn acknowledge(&mut self, fid: FrameworkId, task_id: TaskId, uuid: String) {
        let key = (fid.clone(), task_id.clone());
        let checkpointed = self.tasks.get(&key).is_some_and(|t| t.checkpointed);
        match self
            .updates
            .acknowledge(&fid, &task_id, &uuid, checkpointed, Instant::now())
        {
            AckOutcome::Ignored => {
                tracing::debug!(framework_id = %fid, %task_id, %uuid, "acknowledgement for a non-head update ignored");
            }
            AckOutcome::Acknowledged { next, ended, .. } => {
                self.acknowledged += 1;
                let key = (fid.clone(), task_id.clone());
                if checkpointed {
                    // The next update goes out once the acknowledgement is
                    // durable: after a crash the stream resumes exactly
                    // where the master left it.
                    let done: Option<checkpoint::Done> = (!ended).then(|| {
                        let tx = self.tx.clone();
                        let (fid, task_id) = (fid.clone(), task_id.clone());
                        Box::new(move |result: std::io::Result<()>| {
                            let _ = tx.blocking_send(CoreEvent::AckDurable {
                                framework_id: fid,
                                task_id,
                                result: result.map_err(|e| e.to_string()),
                            });
                        }) as checkpoint::Done
                    });
                    self.writer.submit(
                        vec![Op::Wal(WalRecord::Ack {
                            framework_id: fid.clone(),
                            task_id: task_id.clone(),
                            uuid,
                        })],
                        done,
                    );
                }
                if let Some(status) = next {
                    self.send_master(agent_api::Call::StatusUpdate {
                        framework_id: fid.clone(),
                        status: *status,
                    });
                }
                if ended {
                    self.forget_task(&key);
                }
            }
        }
    }

    fn forget_task(&mut self, key: &StreamKey) {
        let dir = self.task_meta_dir(key);
        let Some(task) = self.tasks.remove(key) else {
            return;
        };
        tracing::debug!(framework_id = %key.0, task_id = %key.1, "task forgotten");
        if let Some(dir) = dir {
            self.writer.submit(
                vec![
                    Op::Wal(WalRecord::End {
                        framework_id: key.0.clone(),
                        task_id: key.1.clone(),
                    }),
                    Op::RemoveDir { path: dir },
                ],
                None,
            );
        }
        let ekey = (key.0.clone(), task.executor_id);
        if let Some(ex) = self.executors.get_mut(&ekey) {
            ex.queued.retain(|t| *t != key.1);
        }
        self.gc_executor(&ekey);
    }

    /// Records a checkpointed task in the status update log, which starts
    /// its stream: one more record in the next group commit, where a file
    /// of its own would cost a directory, a file and their syncs.
    fn checkpoint_task(&self, fid: &FrameworkId, executor_id: &ExecutorId, task: &TaskInfo) {
        self.writer.submit(
            vec![Op::Wal(WalRecord::Task {
                framework_id: fid.clone(),
                executor_id: executor_id.clone(),
                task: Box::new(task.clone()),
            })],
            None,
        );
    }

    /// The directory of a task checkpointed as a `task.json` (by an older
    /// agent): removed when the task is forgotten.
    fn task_meta_dir(&self, key: &StreamKey) -> Option<PathBuf> {
        let task = self.tasks.get(key).filter(|t| t.checkpointed)?;
        paths::meta_task_dir(
            &self.shared.config.work_dir,
            key.0.as_str(),
            task.executor_id.as_str(),
            key.1.as_str(),
        )
        .ok()
    }

    /// Removes the checkpoint of a finished executor and the framework
    /// when nothing of them is left.
    fn gc_executor(&mut self, ekey: &ExecKey) {
        let has_tasks = self
            .tasks
            .iter()
            .any(|((f, _), t)| *f == ekey.0 && t.executor_id == ekey.1);
        if !self.executors.contains_key(ekey) && !has_tasks && self.checkpointing(&ekey.0) {
            if let Ok(dir) = paths::meta_executor_dir(
                &self.shared.config.work_dir,
                ekey.0.as_str(),
                ekey.1.as_str(),
            ) {
                self.writer.submit(vec![Op::RemoveDir { path: dir }], None);
            }
        }
        let fid = &ekey.0;
        let busy = self.executors.keys().any(|(f, _)| f == fid)
            || self.tasks.keys().any(|(f, _)| f == fid);
        if !busy {
            if let Some(framework) = self.frameworks.remove(fid) {
                if framework.checkpoint {
                    if let Ok(dir) =
                        paths::meta_framework_dir(&self.shared.config.work_dir, fid.as_str())
                    {
                        self.writer.submit(vec![Op::RemoveDir { path: dir }], None);
                    }
                }
            }
        }
    }

    // --- status updates ---

    fn agent_status(
        &self,
        task_id: &TaskId,
        executor_id: Option<ExecutorId>,
        state: TaskState,
        reason: Reason,
        message: String,
    ) -> TaskStatus {
        let mut status = TaskStatus::new(task_id.clone(), state, Source::SourceAgent)
            .with_reason(reason)
            .with_message(message)
            .with_new_uuid();
        status.agent_id = self.agent_id.clone();
        status.executor_id = executor_id;
        status
    }

    /// Puts an update on its way: checkpointed first when its task is,
    /// then into the stream, then acknowledged to `ack_to`.
    fn enqueue_update(&mut self, fid: FrameworkId, status: TaskStatus, ack_to: Option<ExecKey>) {
        let Some(uuid) = status.uuid.clone() else {
            return;
        };
        let pkey = (fid.clone(), status.task_id.clone(), uuid.clone());
        if self.pending_durable.contains(&pkey) {
            // The acknowledgement follows once the first copy is durable.
            return;
        }
        if self.updates.has_uuid(&fid, &status.task_id, &uuid) {
            if let Some(ekey) = ack_to {
                self.ack_executor(&ekey, &status.task_id, &uuid);
            }
            return;
        }
        let key = (fid.clone(), status.task_id.clone());
        let Some(executor_id) = self
            .tasks
            .get(&key)
            .filter(|t| t.checkpointed)
            .map(|t| t.executor_id.clone())
        else {
            self.append_to_stream(fid, status, ack_to);
            return;
        };
        self.pending_durable.insert(pkey);
        let record = WalRecord::Update {
            framework_id: fid.clone(),
            executor_id,
            status: status.clone(),
        };
        let tx = self.tx.clone();
        self.writer.submit(
            vec![Op::Wal(record)],
            Some(Box::new(move |result| {
                let _ = tx.blocking_send(CoreEvent::UpdateDurable {
                    framework_id: fid,
                    status,
                    ack_to,
                    result: result.map_err(|e| e.to_string()),
                });
            })),
        );
    }

    fn append_to_stream(&mut self, fid: FrameworkId, status: TaskStatus, ack_to: Option<ExecKey>) {
        let task_id = status.task_id.clone();
        let uuid = status.uuid.clone().unwrap_or_default();
        match self.updates.update(&fid, status.clone(), Instant::now()) {
            UpdateOutcome::Added { send } => {
                tracing::debug!(framework_id = %fid, %task_id, state = %status.state, "status update queued");
                if let Some(task) = self.tasks.get_mut(&(fid.clone(), task_id.clone())) {
                    task.state = status.state;
                    task.latest = Some(status);
                }
                if let Some(status) = send {
                    self.send_master(agent_api::Call::StatusUpdate {
                        framework_id: fid,
                        status,
                    });
                }
            }
            UpdateOutcome::AfterTerminal => {
                tracing::debug!(framework_id = %fid, %task_id, "update after a terminal one dropped");
            }
            UpdateOutcome::Duplicate | UpdateOutcome::MissingUuid => {}
        }
        if let Some(ekey) = ack_to {
            self.ack_executor(&ekey, &task_id, &uuid);
        }
    }

    fn ack_executor(&mut self, ekey: &ExecKey, task_id: &TaskId, uuid: &str) {
        self.send_exec(
            ekey,
            exec_api::Event::Acknowledged {
                task_id: task_id.clone(),
                uuid: uuid.to_string(),
            },
        );
    }

    // --- executors ---

    fn checkpointing(&self, fid: &FrameworkId) -> bool {
        self.frameworks.get(fid).is_some_and(|f| f.checkpoint)
    }

    fn launch_executor(
        &mut self,
        ekey: ExecKey,
        info: ExecutorInfo,
        is_command: bool,
        first: TaskId,
    ) {
        let config = self.shared.config.clone();
        let run_id = uuid::Uuid::new_v4().to_string();
        let token = uuid::Uuid::new_v4().simple().to_string();
        let launched =
            paths::sandbox_dir(&config.work_dir, ekey.0.as_str(), ekey.1.as_str(), &run_id)
                .map_err(|e| e.to_string())
                .and_then(|sandbox| {
                    std::fs::create_dir_all(&sandbox)
                        .map_err(|e| format!("cannot create sandbox {}: {e}", sandbox.display()))?;
                    let mut spec = LaunchSpec::from_command(&info.command, sandbox.clone());
                    spec.env.extend(self.executor_env(&ekey, &sandbox, &token));
                    let launched = launcher::spawn(&spec)
                        .map_err(|e| format!("cannot start {:?}: {e}", spec.program))?;
                    Ok((sandbox, launched))
                });
        let (sandbox, launched) = match launched {
            Ok(ok) => ok,
            Err(message) => {
                tracing::warn!(framework_id = %ekey.0, executor_id = %ekey.1, %message, "executor launch failed");
                let status = self.agent_status(
                    &first,
                    Some(ekey.1.clone()),
                    TaskState::Failed,
                    Reason::ReasonExecutorLaunchFailed,
                    format!("failed to launch executor {}: {message}", ekey.1),
                );
                self.enqueue_update(ekey.0.clone(), status, None);
                return;
            }
        };
        let pid = launched.pid;
        tracing::info!(framework_id = %ekey.0, executor_id = %ekey.1, pid, sandbox = %sandbox.display(), "executor started");
        let executor = Executor {
            info,
            run_id: run_id.clone(),
            token,
            sandbox,
            pid: Some(pid),
            start_time: launched.start_time,
            is_command,
            child: true,
            conn: None,
            subscribed: false,
            queued: vec![first],
            killing: false,
            termination: None,
        };
        self.checkpoint_executor(&ekey, &executor);
        self.executors.insert(ekey.clone(), executor);
        let tx = self.tx.clone();
        let mut child = launched.child;
        let (key, run) = (ekey.clone(), run_id.clone());
        tokio::spawn(async move {
            let (code, message) = match child.wait().await {
                Ok(status) => (
                    launcher::wait_status_code(&status),
                    launcher::describe_exit(&status),
                ),
                Err(e) => (None, format!("could not be waited for: {e}")),
            };
            let _ = tx
                .send(CoreEvent::ExecutorExited {
                    key,
                    run_id: run,
                    code,
                    message,
                })
                .await;
        });
        self.start_registration_timer(ekey, run_id);
    }

    fn start_registration_timer(&self, key: ExecKey, run_id: String) {
        let tx = self.tx.clone();
        let timeout = self.shared.config.executor_registration_timeout;
        tokio::spawn(async move {
            tokio::time::sleep(timeout).await;
            let _ = tx
                .send(CoreEvent::RegistrationTimeout { key, run_id })
                .await;
        });
    }

    fn checkpoint_executor(&self, ekey: &ExecKey, ex: &Executor) {
        if !self.checkpointing(&ekey.0) {
            return;
        }
        let Ok(dir) = paths::meta_executor_dir(
            &self.shared.config.work_dir,
            ekey.0.as_str(),
            ekey.1.as_str(),
        ) else {
            return;
        };
        let record = ExecutorRecord {
            framework_id: ekey.0.clone(),
            info: ex.info.clone(),
            run_id: ex.run_id.clone(),
            token: ex.token.clone(),
            pid: ex.pid,
            start_time: ex.start_time,
            sandbox: ex.sandbox.clone(),
            is_command: ex.is_command,
        };
        self.writer.submit(
            vec![Op::Replace {
                path: dir.join("executor.json"),
                bytes: checkpoint::json_bytes(&record),
            }],
            None,
        );
    }

    fn executor_env(
        &self,
        ekey: &ExecKey,
        sandbox: &std::path::Path,
        token: &str,
    ) -> Vec<(String, String)> {
        use agora_proto::env;
        let config = &self.shared.config;
        let agent_id = self
            .agent_id
            .as_ref()
            .map(|a| a.to_string())
            .unwrap_or_default();
        let sandbox = sandbox.to_string_lossy().into_owned();
        let checkpoint = if self.checkpointing(&ekey.0) {
            "1"
        } else {
            "0"
        };
        [
            (env::AGENT_ENDPOINT, self.shared.executor_endpoint.clone()),
            (env::AGENT_ID, agent_id.clone()),
            (env::MESOS_SLAVE_ID, agent_id),
            (env::FRAMEWORK_ID, ekey.0.to_string()),
            (env::MESOS_FRAMEWORK_ID, ekey.0.to_string()),
            (env::EXECUTOR_ID, ekey.1.to_string()),
            (env::MESOS_EXECUTOR_ID, ekey.1.to_string()),
            (env::SANDBOX, sandbox.clone()),
            (env::MESOS_SANDBOX, sandbox.clone()),
            (env::MESOS_DIRECTORY, sandbox),
            (env::EXECUTOR_TOKEN, token.to_string()),
            (env::CHECKPOINT, checkpoint.to_string()),
            (env::MESOS_CHECKPOINT, checkpoint.to_string()),
            (
                env::RECOVERY_TIMEOUT,
                config.executor_recovery_timeout.as_secs_f64().to_string(),
            ),
            (
                env::SHUTDOWN_GRACE_PERIOD,
                config
                    .executor_shutdown_grace_period
                    .as_secs_f64()
                    .to_string(),
            ),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect()
    }

    /// Asks an executor to stop: SHUTDOWN when connected and SIGTERM/SIGKILL
    /// of its session after the grace period; at once SIGTERM, then SIGKILL
    /// after the grace period, when not connected.
    fn kill_executor(&mut self, ekey: &ExecKey, termination: Option<Termination>) {
        let grace = self.shared.config.executor_shutdown_grace_period;
        let Some(ex) = self.executors.get_mut(ekey) else {
            return;
        };
        if termination.is_some() && ex.termination.is_none() {
            ex.termination = termination;
        }
        if ex.killing {
            return;
        }
        ex.killing = true;
        let connected = ex.subscribed && ex.conn.is_some();
        let Some(pid) = ex.pid else {
            return;
        };
        tracing::info!(framework_id = %ekey.0, executor_id = %ekey.1, pid, connected, "stopping executor");
        if connected {
            self.send_exec(
                ekey,
                exec_api::Event::Shutdown {
                    grace_period_seconds: grace.as_secs_f64(),
                },
            );
            self.kills.spawn(async move {
                tokio::time::sleep(grace).await;
                launcher::terminate_session(pid, OVERRUN_KILL_DELAY).await;
            });
        } else {
            self.kills
                .spawn(async move { launcher::terminate_session(pid, grace).await });
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn executor_subscribe(
        &mut self,
        conn: u64,
        tx: mpsc::Sender<ExecOut>,
        fid: FrameworkId,
        eid: ExecutorId,
        token: String,
        updates: Vec<TaskStatus>,
        tasks: Vec<TaskInfo>,
    ) {
        let key = (fid.clone(), eid.clone());
        let refuse = |message: String| {
            tracing::warn!(framework_id = %fid, executor_id = %eid, %message, "executor subscription refused");
            let _ = tx.try_send(ExecOut::Event(Box::new(exec_api::Event::Error {
                message: message.clone(),
                fatal: true,
            })));
            let _ = tx.try_send(ExecOut::Close {
                code: 1008,
                reason: message,
            });
        };
        let Some(ex) = self.executors.get_mut(&key) else {
            refuse(format!("unknown executor {eid} of framework {fid}"));
            return;
        };
        if !tokens_equal(&ex.token, &token) {
            refuse("invalid executor token".to_string());
            return;
        }
        if let Some(old) = ex.conn.replace(conn) {
            if old != conn {
                if let Some(c) = self.exec_conns.remove(&old) {
                    let _ = c.tx.try_send(ExecOut::Close {
                        code: 1000,
                        reason: "replaced by a new subscription".into(),
                    });
                }
            }
        }
        let resubscribed = ex.subscribed;
        ex.subscribed = true;
        let info = ex.info.clone();
        let killing = ex.killing;
        self.exec_conns.insert(
            conn,
            ExecConn {
                key: key.clone(),
                tx,
            },
        );
        tracing::info!(framework_id = %fid, executor_id = %eid, resubscribed, "executor subscribed");
        let framework_info = self.frameworks.get(&fid).cloned().unwrap_or_else(|| {
            let mut f = FrameworkInfo::new("");
            f.id = Some(fid.clone());
            f
        });
        self.send_exec(
            &key,
            exec_api::Event::Subscribed {
                executor_info: info,
                framework_info,
                agent_id: self.agent_id.clone().unwrap_or_default(),
                hostname: self.shared.config.hostname.clone(),
            },
        );
        // Tasks the executor already has need no LAUNCH; ones the agent
        // lost track of (it died before checkpointing them) are re-adopted.
        let known: HashSet<TaskId> = tasks.iter().map(|t| t.task_id.clone()).collect();
        let checkpointed = self.checkpointing(&fid);
        for task in tasks {
            let tkey = (fid.clone(), task.task_id.clone());
            if self.tasks.contains_key(&tkey)
                || self.updates.has_stream(&fid, &task.task_id)
                || task.task_id.validate().is_err()
            {
                continue;
            }
            if checkpointed {
                self.checkpoint_task(&fid, &eid, &task);
            }
            self.tasks.insert(
                tkey,
                Task {
                    executor_id: eid.clone(),
                    info: task,
                    state: TaskState::Staging,
                    latest: None,
                    kill_requested: false,
                    checkpointed,
                },
            );
        }
        for status in updates {
            self.executor_update(&key, status);
        }
        let queued = self
            .executors
            .get_mut(&key)
            .map(|ex| std::mem::take(&mut ex.queued))
            .unwrap_or_default();
        for task_id in queued.into_iter().filter(|t| !known.contains(t)) {
            if let Some(task) = self.tasks.get(&(fid.clone(), task_id)) {
                let event = exec_api::Event::Launch {
                    task: task.info.clone(),
                };
                self.send_exec(&key, event);
            }
        }
        let kills: Vec<(TaskId, Option<f64>)> = self
            .tasks
            .iter()
            .filter(|((f, _), t)| {
                *f == fid && t.executor_id == eid && t.kill_requested && !t.state.is_terminal()
            })
            .map(|((_, tid), t)| (tid.clone(), t.info.kill_grace_period))
            .collect();
        for (task_id, grace_period_seconds) in kills {
            self.send_exec(
                &key,
                exec_api::Event::Kill {
                    task_id,
                    grace_period_seconds,
                },
            );
        }
        if killing {
            let grace = self.shared.config.executor_shutdown_grace_period;
            self.send_exec(
                &key,
                exec_api::Event::Shutdown {
                    grace_period_seconds: grace.as_secs_f64(),
                },
            );
        }
    }

    fn executor_call(&mut self, conn: u64, call: exec_api::Call) {
        let Some(key) = self.exec_conns.get(&conn).map(|c| c.key.clone()) else {
            return;
        };
        match call {
            exec_api::Call::Update { status } => self.executor_update(&key, status),
            exec_api::Call::Message { data } => self.send_master(agent_api::Call::Message {
                framework_id: key.0,
                executor_id: key.1,
                data,
            }),
            // The connection task turns repeated subscriptions into
            // `ExecutorSubscribe`, and unknown calls into errors.
            exec_api::Call::Subscribe { .. } | exec_api::Call::Unknown => {}
        }
    }

    fn executor_update(&mut self, ekey: &ExecKey, mut status: TaskStatus) {
        let Some(uuid) = status.uuid.clone() else {
            self.send_exec(
                ekey,
                exec_api::Event::Error {
                    message: format!("status update for task {} has no uuid", status.task_id),
                    fatal: false,
                },
            );
            return;
        };
        let tkey = (ekey.0.clone(), status.task_id.clone());
        match self.tasks.get(&tkey) {
            Some(task) if task.executor_id == ekey.1 => {}
            Some(_) => {
                let message = format!(
                    "task {} does not belong to executor {}",
                    status.task_id, ekey.1
                );
                self.send_exec(
                    ekey,
                    exec_api::Event::Error {
                        message,
                        fatal: false,
                    },
                );
                return;
            }
            None => {
                // Already delivered and forgotten (the acknowledgement to the
                // executor was lost): let the executor drop it.
                tracing::debug!(framework_id = %ekey.0, task_id = %status.task_id, "update for a task the agent no longer has; acknowledged");
                self.ack_executor(ekey, &tkey.1, &uuid);
                return;
            }
        }
        status.agent_id = self.agent_id.clone();
        status.executor_id = Some(ekey.1.clone());
        self.enqueue_update(ekey.0.clone(), status, Some(ekey.clone()));
    }

    fn send_exec(&mut self, ekey: &ExecKey, event: exec_api::Event) -> bool {
        let Some(conn) = self.executors.get(ekey).and_then(|e| e.conn) else {
            return false;
        };
        let Some(c) = self.exec_conns.get(&conn) else {
            return false;
        };
        match c.tx.try_send(ExecOut::Event(Box::new(event))) {
            Ok(()) => true,
            Err(mpsc::error::TrySendError::Full(_)) => {
                tracing::warn!(framework_id = %ekey.0, executor_id = %ekey.1, "executor is not reading; closing its connection");
                let _ = c.tx.try_send(ExecOut::Close {
                    code: 1008,
                    reason: "too slow".into(),
                });
                self.exec_conns.remove(&conn);
                if let Some(ex) = self.executors.get_mut(ekey) {
                    ex.conn = None;
                }
                false
            }
            Err(mpsc::error::TrySendError::Closed(_)) => false,
        }
    }

    fn executor_exited(
        &mut self,
        key: ExecKey,
        run_id: String,
        code: Option<i32>,
        message: String,
    ) {
        if self.executors.get(&key).is_none_or(|e| e.run_id != run_id) {
            return;
        }
        let Some(ex) = self.executors.remove(&key) else {
            return;
        };
        tracing::info!(framework_id = %key.0, executor_id = %key.1, ?code, %message, "executor exited");
        if let Some(conn) = ex.conn {
            if let Some(c) = self.exec_conns.remove(&conn) {
                let _ = c.tx.try_send(ExecOut::Close {
                    code: 1000,
                    reason: "executor exited".into(),
                });
            }
        }
        if let Some(pid) = ex.pid {
            // Leftovers of the executor's session (a task in a group of its
            // own) go with it. For a re-attached executor, only when the
            // pid is not in use by someone else.
            if ex.child || launcher::proc_stat(pid as i32).is_none() {
                launcher::signal_session(pid, nix::sys::signal::Signal::SIGKILL);
            }
        }
        let unfinished: Vec<(TaskId, bool)> = self
            .tasks
            .iter()
            .filter(|((f, _), t)| *f == key.0 && t.executor_id == key.1 && !t.state.is_terminal())
            .map(|((_, tid), t)| (tid.clone(), t.kill_requested))
            .collect();
        for (task_id, kill_requested) in unfinished {
            let (state, reason, text) = match &ex.termination {
                Some(t) => (t.state, t.reason, t.message.clone()),
                None if kill_requested => (
                    TaskState::Killed,
                    Reason::ReasonExecutorTerminated,
                    format!(
                        "executor {} {message} while the task was being killed",
                        key.1
                    ),
                ),
                None => (
                    TaskState::Failed,
                    Reason::ReasonExecutorTerminated,
                    format!("executor {} {message}", key.1),
                ),
            };
            let status = self.agent_status(&task_id, Some(key.1.clone()), state, reason, text);
            self.enqueue_update(key.0.clone(), status, None);
        }
        self.send_master(agent_api::Call::ExecutorExited {
            framework_id: key.0.clone(),
            executor_id: key.1.clone(),
            status: code,
            message,
        });
        self.gc_executor(&key);
    }

    // --- recovery ---

    /// Loads the agent id and the checkpoints, re-attaches to executors
    /// that survived (or kills them with [`RecoverMode::Cleanup`]) and
    /// gives the tasks of dead ones terminal updates.
    pub(crate) fn recover(&mut self, streams: Vec<StreamState>) {
        let config = self.shared.config.clone();
        self.agent_id = checkpoint::read_agent_id(&config.work_dir).map(AgentId::new);
        let (frameworks, orphans) = checkpoint::load(&config.work_dir, streams);
        for stream in orphans {
            tracing::debug!(framework_id = %stream.framework_id, task_id = %stream.task_id, "dropping the update stream of a forgotten task");
            self.writer.submit(
                vec![Op::Wal(WalRecord::End {
                    framework_id: stream.framework_id,
                    task_id: stream.task_id,
                })],
                None,
            );
        }
        for fw in frameworks {
            let Some(fid) = fw.info.id.clone() else {
                continue;
            };
            self.frameworks.insert(fid.clone(), fw.info);
            for rex in fw.executors {
                let eid = ExecutorId::new(rex.executor_id);
                let ekey = (fid.clone(), eid.clone());
                let mut fresh = Vec::new();
                for rt in rex.tasks {
                    let tid = rt.info.task_id.clone();
                    let (latest, pending, seen, terminal) = match rt.stream {
                        Some(stream) => (
                            stream.latest().cloned(),
                            stream.pending.clone(),
                            stream.seen(),
                            stream.is_terminal(),
                        ),
                        None => (None, Vec::new(), HashSet::new(), false),
                    };
                    if terminal && pending.is_empty() {
                        if let Ok(dir) = paths::meta_task_dir(
                            &config.work_dir,
                            fid.as_str(),
                            eid.as_str(),
                            tid.as_str(),
                        ) {
                            self.writer.submit(
                                vec![
                                    Op::Wal(WalRecord::End {
                                        framework_id: fid.clone(),
                                        task_id: tid.clone(),
                                    }),
                                    Op::RemoveDir { path: dir },
                                ],
                                None,
                            );
                        }
                        continue;
                    }
                    self.updates.restore(&fid, &tid, seen, pending, terminal);
                    if latest.is_none() {
                        fresh.push(tid.clone());
                    }
                    self.tasks.insert(
                        (fid.clone(), tid),
                        Task {
                            executor_id: eid.clone(),
                            info: rt.info,
                            state: latest.as_ref().map_or(TaskState::Staging, |s| s.state),
                            latest,
                            kill_requested: false,
                            checkpointed: true,
                        },
                    );
                }
                let alive = rex.record.as_ref().filter(|r| {
                    r.pid
                        .is_some_and(|pid| launcher::is_alive(pid, r.start_time))
                });
                match alive {
                    Some(record) => {
                        let record = record.clone();
                        let pid = record.pid.unwrap_or_default();
                        tracing::info!(framework_id = %fid, executor_id = %eid, pid, mode = ?config.recover, "found a live executor");
                        self.executors.insert(
                            ekey.clone(),
                            Executor {
                                info: record.info,
                                run_id: record.run_id.clone(),
                                token: record.token,
                                sandbox: record.sandbox,
                                pid: Some(pid),
                                start_time: record.start_time,
                                is_command: record.is_command,
                                child: false,
                                conn: None,
                                subscribed: false,
                                queued: fresh,
                                killing: false,
                                termination: None,
                            },
                        );
                        self.poll_recovered(
                            ekey.clone(),
                            record.run_id.clone(),
                            pid,
                            record.start_time,
                        );
                        match config.recover {
                            RecoverMode::Reconnect => {
                                self.start_registration_timer(ekey.clone(), record.run_id)
                            }
                            RecoverMode::Cleanup => self.kill_executor(
                                &ekey,
                                Some(Termination {
                                    state: TaskState::Lost,
                                    reason: Reason::ReasonAgentRestarted,
                                    message:
                                        "executor killed by agent recovery (--recover cleanup)"
                                            .into(),
                                }),
                            ),
                        }
                    }
                    None => {
                        tracing::info!(framework_id = %fid, executor_id = %eid, "checkpointed executor is gone");
                        let unfinished: Vec<TaskId> = self
                            .tasks
                            .iter()
                            .filter(|((f, _), t)| {
                                *f == fid && t.executor_id == eid && !t.state.is_terminal()
                            })
                            .map(|((_, tid), _)| tid.clone())
                            .collect();
                        for tid in unfinished {
                            let status = self.agent_status(
                                &tid,
                                Some(eid.clone()),
                                TaskState::Failed,
                                Reason::ReasonExecutorTerminated,
                                format!("executor {eid} exited while the agent was down"),
                            );
                            self.enqueue_update(fid.clone(), status, None);
                        }
                        self.gc_executor(&ekey);
                    }
                }
            }
            if !self.executors.keys().any(|(f, _)| *f == fid)
                && !self.tasks.keys().any(|(f, _)| *f == fid)
            {
                self.frameworks.remove(&fid);
                if let Ok(dir) = paths::meta_framework_dir(&config.work_dir, fid.as_str()) {
                    self.writer.submit(vec![Op::RemoveDir { path: dir }], None);
                }
            }
        }
    }

    fn poll_recovered(&self, key: ExecKey, run_id: String, pid: u32, start_time: Option<u64>) {
        let tx = self.tx.clone();
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(RECOVERED_POLL).await;
                if tx.is_closed() {
                    return;
                }
                if !launcher::is_alive(pid, start_time) {
                    let _ = tx
                        .send(CoreEvent::ExecutorExited {
                            key,
                            run_id,
                            code: None,
                            message: "exited (status unknown: not a child of this agent run)"
                                .into(),
                        })
                        .await;
                    return;
                }
            }
        });
    }

    // --- /state ---

    fn snapshot(&self) -> serde_json::Value {
        let config = &self.shared.config;
        let wal = self.writer.stats();
        let task_json = |fid: &FrameworkId, eid: &ExecutorId| -> Vec<serde_json::Value> {
            let mut tasks: Vec<_> = self
                .tasks
                .iter()
                .filter(|((f, _), t)| f == fid && t.executor_id == *eid)
                .map(|((_, tid), t)| {
                    json!({
                        "id": tid,
                        "name": t.info.name,
                        "state": t.state,
                        "resources": t.info.resources,
                        "pending_updates": self.updates.pending(fid, tid).len(),
                    })
                })
                .collect();
            tasks.sort_by(|a, b| a["id"].as_str().cmp(&b["id"].as_str()));
            tasks
        };
        let mut fids: Vec<&FrameworkId> = self.frameworks.keys().collect();
        fids.sort();
        let frameworks: Vec<_> = fids
            .into_iter()
            .map(|fid| {
                let info = &self.frameworks[fid];
                let mut eids: HashSet<&ExecutorId> = self
                    .executors
                    .keys()
                    .filter(|(f, _)| f == fid)
                    .map(|(_, e)| e)
                    .collect();
                let orphan: HashSet<&ExecutorId> = self
                    .tasks
                    .iter()
                    .filter(|((f, _), t)| {
                        f == fid
                            && !self
                                .executors
                                .contains_key(&(fid.clone(), t.executor_id.clone()))
                    })
                    .map(|(_, t)| &t.executor_id)
                    .collect();
                eids.extend(orphan.iter().copied());
                let mut eids: Vec<_> = eids.into_iter().collect();
                eids.sort();
                let executors: Vec<_> = eids
                    .into_iter()
                    .map(
                        |eid| match self.executors.get(&(fid.clone(), eid.clone())) {
                            Some(ex) => json!({
                                "id": eid,
                                "name": ex.info.name,
                                "running": true,
                                "pid": ex.pid,
                                "run_id": ex.run_id,
                                "sandbox": ex.sandbox,
                                "command_executor": ex.is_command,
                                "subscribed": ex.subscribed,
                                "connected": ex.conn.is_some(),
                                "stopping": ex.killing,
                                "tasks": task_json(fid, eid),
                            }),
                            None => json!({
                                "id": eid,
                                "running": false,
                                "tasks": task_json(fid, eid),
                            }),
                        },
                    )
                    .collect();
                json!({
                    "id": fid,
                    "name": info.name,
                    "checkpoint": info.checkpoint,
                    "executors": executors,
                })
            })
            .collect();
        json!({
            "id": self.agent_id,
            "version": agora_proto::VERSION,
            "master": config.master,
            "registered": self.master.as_ref().is_some_and(|m| m.registered),
            "hostname": config.hostname,
            "address": self.shared.address,
            "work_dir": config.work_dir,
            "resources": config.resources,
            "attributes": config.attributes,
            "frameworks": frameworks,
            "status_update_streams": self.updates.len(),
            "status_updates_acknowledged": self.acknowledged,
            "checkpoint": {
                "wal_bytes": wal.bytes,
                "wal_records": wal.records,
                "wal_syncs": wal.syncs,
                "wal_compactions": wal.compactions,
            },
        })
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
