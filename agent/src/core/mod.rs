//! The agent core: a sans-IO state machine that owns every piece of the
//! agent's state (frameworks, executors, tasks, status update streams, what
//! it knows of the master and executor connections). It is fed [`Input`]s
//! with the time, and answers with [`Action`]s (send to the master or an
//! executor, start, signal or reap a process, write a checkpoint, set a
//! timer); it never touches a socket, a file, a process or a clock itself,
//! and draws its ids from a seeded generator, so the same inputs give the
//! same actions. [`crate::shell`] carries the actions out in production;
//! the simulation (`agora-sim`) carries them out in a simulated world.
//!
//! The state is split by domain noun, each file an `impl Core` block:
//! `master` (registration, the master's commands), `tasks`, `updates`
//! (status updates), `executors`, `recovery`, `snapshot` (`/state`).

use agora_proto::hash::{HashMap, HashSet};
use std::path::PathBuf;
use std::time::Duration;

use agora_proto::agent::{self as agent_api, ExecutorReport, TaskReport};
use agora_proto::executor as exec_api;
use agora_proto::{
    AgentId, AgentInfo, CommandInfo, ExecutorId, ExecutorInfo, FrameworkId, FrameworkInfo, Reason,
    Resources, Source, TaskId, TaskInfo, TaskState, TaskStatus,
};
use rand::{RngCore, SeedableRng};
use serde_json::json;
use tokio::time::Instant;

mod executors;
mod master;
mod recovery;
mod snapshot;
mod tasks;
mod updates;

use executors::{shutdown_grace, speaks_mesos_v1};
pub(crate) use recovery::Recovered;

use crate::checkpoint::{self, ExecutorRecord, Op};
use crate::config::RecoverMode;
use crate::launcher::LaunchSpec;
use crate::messages::{
    Action, Durable, ExecKey, ImageRun, Input, Request, Started, Stop, TaskEntry, Timer,
};
use crate::paths;
use crate::shared::Shared;
use crate::status_updates::{AckOutcome, StatusUpdateManager, StreamKey, UpdateOutcome};
use crate::wal::WalRecord;

/// Resources of the built-in command executor itself.
const COMMAND_EXECUTOR_RESOURCES: &str = "cpus:0.1;mem:32";
/// Most calls kept for the master while the agent is not registered.
const UNSENT_LIMIT: usize = 4096;
/// How long an exited executor's connection may stay open (held by a
/// process it left behind) before the executor is ended without it.
pub(crate) const EXIT_DRAIN: Duration = Duration::from_secs(2);
/// The longest backoff between a checkpointing Mesos executor's attempts
/// to subscribe again (`MESOS_SUBSCRIPTION_BACKOFF_MAX`; Mesos's
/// `EXECUTOR_REREGISTRATION_RETRY_INTERVAL_MAX`).
pub(crate) const MESOS_SUBSCRIPTION_BACKOFF_MAX: Duration = Duration::from_secs(15);
/// Time between SIGTERM and SIGKILL once an executor overran its shutdown
/// grace period.
pub(crate) const OVERRUN_KILL_DELAY: Duration = Duration::from_secs(1);

/// Where a task goes once its checkpoint is durable.
#[derive(Debug)]
pub(crate) struct PendingLaunch {
    ekey: ExecKey,
    info: ExecutorInfo,
    is_command: bool,
}

/// What the core knows of its master connection.
struct MasterConn {
    conn: u64,
    registered: bool,
}

struct ExecConn {
    key: ExecKey,
}

/// A command task waiting for what it needs before it starts.
#[derive(Debug, Clone, Copy)]
struct Preparing {
    /// Its checkpoint is durable.
    recorded: bool,
    /// Answers still to come ([`Input::TaskFetched`]): its URIs fetched
    /// (or its sandbox handed to its user), its container made.
    waiting: u8,
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
    /// The largest limits its container was asked for (the container
    /// keeps the largest): a task that needs no more asks for nothing.
    limits_asked: Option<agora_containerizer::Limits>,
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
    /// Under `--isolation cgroups`, the container of a command task run
    /// in a shared command executor: its name (the task's sandbox run
    /// id) until the agent asked for it to be ended.
    container: Option<String>,
    /// How its process enters that container.
    container_entry: TaskEntry,
    /// A command task in an image: its container's id and first process,
    /// until the agent asked for it to be destroyed.
    image_container: Option<(String, u32)>,
    /// Its executor's terminal update, held until its container is
    /// ended: nothing of the task is left running when the update goes
    /// out, and an out-of-memory kill shows in it.
    held: Option<TaskStatus>,
}

/// The agent's state and its event handlers.
pub(crate) struct Core {
    shared: Shared,
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
    /// Tasks whose checkpoint is on its way to disk: none reaches its
    /// executor before, so a restarted agent never meets a task it has no
    /// record of (and could not report to the master).
    recording: HashMap<StreamKey, PendingLaunch>,
    /// Command tasks whose URIs are being fetched into their sandbox
    /// (they stay in `recording` meanwhile and reach their executor only
    /// once fetched); `true` once their checkpoint is durable too.
    fetching: HashMap<StreamKey, Preparing>,
    /// Status updates whose acknowledgement came back from the master.
    acknowledged: u64,
    /// The local IP of the latest connection to the master.
    master_local_ip: Option<std::net::IpAddr>,
    /// Calls other than status updates made while not registered, sent
    /// once registered (at most [`UNSENT_LIMIT`]).
    unsent: Vec<agent_api::Call>,
    /// What the inputs so far ask for, not yet taken by the shell.
    actions: Vec<Action>,
    /// The time of the input being handled.
    now: Instant,
    /// Wall-clock time of the input being handled (seconds since the
    /// epoch), for the timestamps of the agent's own updates.
    wall: f64,
    /// Where run ids, tokens and update uuids come from.
    rng: rand::rngs::StdRng,
    /// Something changed since the last snapshot.
    dirty: bool,
    /// Why the work directory is full, while it is: no task is launched
    /// and the master offers none of the agent's resources.
    disk_full: Option<String>,
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
            container: None,
            container_entry: TaskEntry::default(),
            image_container: None,
            held: None,
        }
    }

    /// Whether it has not ended: not terminal, and no terminal update
    /// made for it.
    fn is_live(&self) -> bool {
        !self.state.is_terminal() && !self.terminal_reported
    }

    /// Whether it goes to its executor once its checkpoint is durable (see
    /// [`Core::task_recorded`]): it neither ended nor was killed meanwhile.
    fn will_run_on_recording(&self) -> bool {
        self.is_live() && !self.kill_requested
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
    /// A core with nothing in it, drawing its ids from `seed`.
    pub(crate) fn new(shared: Shared, seed: u64, now: Instant, wall: f64) -> Self {
        let updates = StatusUpdateManager::new(
            shared.config.status_update_retry_min,
            shared.config.status_update_retry_max,
        );
        Core {
            shared,
            agent_id: None,
            master: None,
            frameworks: HashMap::default(),
            executors: HashMap::default(),
            tasks: HashMap::default(),
            tasks_by_executor: HashMap::default(),
            tasks_by_framework: HashMap::default(),
            exec_conns: HashMap::default(),
            updates,
            pending_durable: HashSet::default(),
            recording: HashMap::default(),
            fetching: HashMap::default(),
            acknowledged: 0,
            unsent: Vec::new(),
            master_local_ip: None,
            actions: Vec::new(),
            now,
            wall,
            rng: rand::rngs::StdRng::seed_from_u64(seed),
            dirty: true,
            disk_full: None,
        }
    }

    /// Handles one input at `now` (`wall`: the same time on the wall
    /// clock); the actions it asks for are taken with
    /// [`Core::take_actions`]. `Some` when the core is done.
    pub(crate) fn handle(&mut self, input: Input, now: Instant, wall: f64) -> Option<Stop> {
        self.now = now;
        self.wall = wall;
        self.dirty = true;
        match input {
            Input::MasterConnected { conn, local_ip } => {
                if local_ip.is_some() {
                    self.master_local_ip = local_ip;
                }
                let register = self.register_call();
                self.actions.push(Action::ToMaster {
                    conn,
                    call: register,
                });
                self.master = Some(MasterConn {
                    conn,
                    registered: false,
                });
            }
            Input::MasterDisconnected { conn } => {
                if self.master.as_ref().is_some_and(|m| m.conn == conn) {
                    self.master = None;
                    self.updates.disconnected();
                }
            }
            Input::MasterEvent { conn, event } => {
                if self.master.as_ref().is_some_and(|m| m.conn == conn) {
                    return self.master_event(*event);
                }
            }
            Input::ExecutorSubscribe {
                conn,
                framework_id,
                executor_id,
                token,
                updates,
                tasks,
            } => self.executor_subscribe(conn, framework_id, executor_id, token, updates, tasks),
            Input::ExecutorCall { conn, call } => self.executor_call(conn, call),
            Input::ExecutorDisconnected { conn } => self.executor_disconnected(conn),
            Input::ExecutorExited {
                key,
                run_id,
                code,
                message,
            } => self.executor_exited(key, run_id, code, message),
            Input::ExecutorLaunched {
                key,
                run_id,
                result,
            } => self.executor_launched(key, run_id, result),
            Input::ContainerLimited {
                key,
                run_id,
                limitation,
            } => self.container_limited(key, run_id, limitation),
            Input::ContainerUsage(containers) => {
                self.send_master(agent_api::Call::Usage { containers })
            }
            Input::TaskFetched { key, result } => self.task_fetched(key, result),
            Input::ImagePrepared { key, result } => self.image_prepared(key, result),
            Input::TaskContainerEnded { key, limitation } => {
                self.task_container_ended(key, limitation)
            }
            Input::Timer(timer) => self.timer(timer),
            Input::DiskFull { full } => {
                self.disk_full = full.clone();
                if self.master.as_ref().is_some_and(|m| m.registered) {
                    self.send_master(agent_api::Call::Availability { unavailable: full });
                }
            }
            Input::Durable(
                Durable::Update {
                    framework_id,
                    status,
                    ack_to,
                },
                result,
            ) => {
                let uuid = status.uuid.clone().unwrap_or_default();
                if !self.pending_durable.remove(&(
                    framework_id.clone(),
                    status.task_id.clone(),
                    uuid,
                )) {
                    // The master shut this agent down meanwhile: the update
                    // belongs to the agent it was, whose tasks the master
                    // has already declared lost.
                    tracing::debug!(%framework_id, task_id = %status.task_id, "status update of a removed agent dropped");
                    return None;
                }
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
            Input::Durable(Durable::Task { key }, result) => {
                if let Err(e) = &result {
                    // Run it regardless: refusing work because a disk
                    // write failed would help no one; recovery may miss it.
                    tracing::error!(framework_id = %key.0, task_id = %key.1, error = %e, "could not checkpoint task");
                }
                self.task_recorded(key);
            }
            Input::Durable(Durable::Tasks { keys }, result) => {
                if let Err(e) = &result {
                    tracing::error!(tasks = keys.len(), error = %e, "could not checkpoint a task group");
                }
                self.tasks_recorded(keys);
            }
            Input::Durable(
                Durable::Ack {
                    framework_id,
                    task_id,
                },
                result,
            ) => {
                if let Err(e) = result {
                    // Go on regardless: a duplicate after a restart is
                    // better than a stalled stream.
                    tracing::error!(%framework_id, %task_id, error = %e, "could not checkpoint an acknowledgement");
                }
                if let Some(status) = self.updates.release(&framework_id, &task_id, self.now) {
                    self.send_master(agent_api::Call::StatusUpdate {
                        framework_id,
                        status,
                    });
                }
            }
        }
        None
    }

    /// The next time [`Core::tick`] has something to do.
    pub(crate) fn next_deadline(&self) -> Option<Instant> {
        self.updates.next_retry()
    }

    /// Re-sends the updates whose retry interval ran out by `now`.
    pub(crate) fn tick(&mut self, now: Instant, wall: f64) {
        self.now = now;
        self.wall = wall;
        for (framework_id, status) in self.updates.due_retries(now) {
            tracing::debug!(%framework_id, task_id = %status.task_id, "resending status update");
            self.shared.counters.retried_on_timeout();
            self.send_master(agent_api::Call::StatusUpdate {
                framework_id,
                status,
            });
        }
    }

    /// What the inputs so far ask for, in order.
    pub(crate) fn take_actions(&mut self) -> Vec<Action> {
        std::mem::take(&mut self.actions)
    }

    /// Whether anything changed since the last call (for snapshots).
    pub(crate) fn take_dirty(&mut self) -> bool {
        std::mem::replace(&mut self.dirty, false)
    }

    /// Stops: asks executors that cannot be recovered later to shut down
    /// (and has them killed when they do not), leaves the others running,
    /// closes every executor connection.
    pub(crate) fn stop(&mut self) {
        // The executors asked to shut down get the longest of their grace
        // periods.
        let mut grace = self.shared.config.executor_shutdown_grace_period;
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
                let own = self
                    .executors
                    .get(&key)
                    .map_or(grace, |e| shutdown_grace(&e.info, &self.shared.config));
                grace = grace.max(own);
                self.send_exec(
                    &key,
                    exec_api::Event::Shutdown {
                        grace_period_seconds: own.as_secs_f64(),
                    },
                );
            }
            if let Some(ex) = self.executors.get(&key) {
                runs.push((ex.run_id.clone(), asked));
            }
        }
        for (conn, _) in self.exec_conns.drain() {
            self.actions.push(Action::CloseExecutor {
                conn,
                code: 1001,
                reason: "agent shutting down".into(),
            });
        }
        self.actions.push(Action::StopExecutors {
            runs,
            grace,
            overrun: OVERRUN_KILL_DELAY,
        });
    }

    /// A fresh uuid from the core's generator.
    fn uuid(&mut self) -> uuid::Uuid {
        let mut bytes = [0u8; 16];
        self.rng.fill_bytes(&mut bytes);
        uuid::Builder::from_random_bytes(bytes).into_uuid()
    }

    /// Sets a timer.
    fn set_timer(&mut self, after: Duration, timer: Timer) {
        self.actions.push(Action::Timer { after, timer });
    }

    /// Asks the process thread for something.
    fn process(&mut self, request: Request) {
        self.actions.push(Action::Process(request));
    }

    /// Writes `ops` (no completion wanted).
    fn checkpoint(&mut self, ops: Vec<Op>) {
        self.actions.push(Action::Checkpoint { ops, then: None });
    }

    fn timer(&mut self, timer: Timer) {
        match timer {
            Timer::CommandExecutorIdle {
                key,
                run_id,
                assignments,
            } => self.command_executor_idle(key, run_id, assignments),
            Timer::ExitDrained { key, run_id } => {
                if let Some(ex) = self.executors.get(&key).filter(|e| e.run_id == run_id) {
                    if let Some((code, message)) = ex.exited.clone() {
                        tracing::warn!(framework_id = %key.0, executor_id = %key.1, "the connection of an exited executor is still open; ending it without waiting for more");
                        self.executor_ended(key, code, message);
                    }
                }
            }
            Timer::ShutdownOverrun { key, run_id } => {
                if self.executors.get(&key).is_some_and(|e| e.run_id == run_id) {
                    tracing::warn!(framework_id = %key.0, executor_id = %key.1, "executor did not shut down within its grace period; terminating it");
                    self.process(Request::Terminate {
                        run_id,
                        grace: OVERRUN_KILL_DELAY,
                    });
                }
            }
            Timer::KillOverrun {
                key,
                run_id,
                task_id,
            } => {
                let ended = self
                    .tasks
                    .get(&(key.0.clone(), task_id.clone()))
                    .is_none_or(|t| t.state.is_terminal() || t.terminal_reported);
                let same_run = self.executors.get(&key).is_some_and(|e| e.run_id == run_id);
                if !ended && same_run {
                    tracing::warn!(framework_id = %key.0, executor_id = %key.1, %task_id, "executor did not kill the task in time; shutting the executor down");
                    self.kill_executor(
                        &key,
                        Some(Termination {
                            state: TaskState::Killed,
                            reason: Reason::ReasonTaskKilled,
                            message: format!(
                                "the executor did not kill task {task_id} in time; the executor was shut down"
                            ),
                        }),
                    );
                }
            }
            Timer::RegistrationTimeout { key, run_id } => {
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
        }
    }

    /// Adds a task, keeping the indexes.
    fn insert_task(&mut self, key: StreamKey, task: Task) {
        if let Some(old) = self.tasks.remove(&key) {
            self.unindex_task(&key, &old);
        }
        self.tasks_by_executor
            .entry((key.0.clone(), task.executor_id.clone()))
            .or_default()
            .insert(key.1.clone());
        *self.tasks_by_framework.entry(key.0.clone()).or_default() += 1;
        self.tasks.insert(key, task);
    }

    /// Removes a task, keeping the indexes.
    fn remove_task(&mut self, key: &StreamKey) -> Option<Task> {
        self.end_task_container(key);
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

    /// How many tasks executor `ekey` holds, ended ones it has not
    /// forgotten included.
    fn held_tasks(&self, ekey: &ExecKey) -> usize {
        self.tasks_by_executor.get(ekey).map_or(0, HashSet::len)
    }

    /// The tasks of executor `ekey`.
    fn executor_tasks(&self, ekey: &ExecKey) -> impl Iterator<Item = (&TaskId, &Task)> + '_ {
        // One key, its task id rewritten in place for each task: no
        // allocation per task (this runs on every task's launch).
        let mut key: StreamKey = (ekey.0.clone(), TaskId::default());
        self.tasks_by_executor
            .get(ekey)
            .into_iter()
            .flatten()
            .filter_map(move |tid| {
                key.1 .0.clear();
                key.1 .0.push_str(tid.as_str());
                let task = self.tasks.get(&key)?;
                Some((tid, task))
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

#[cfg(test)]
mod tests;
