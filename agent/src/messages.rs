//! The agent's messages: what its parts say to each other, below all of
//! them. The core ([`crate::core`]) takes [`Input`]s and answers with
//! [`Action`]s; the process thread takes [`Request`]s and reports back
//! with inputs ([`Started`] for a launch); everything posted to the shell
//! is a [`CoreEvent`], an executor subscription carrying the [`ExecLink`]
//! its connection is written through; the shell publishes the `/state`
//! view as a [`Snapshot`].
//!
//! Nothing here does anything: the core, the shell, the process thread
//! and the HTTP handlers all import this module, and it imports none of
//! them, so the core depends on nothing above it (as the master's does).

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use agora_proto::agent::{self as agent_api, Call};
use agora_proto::executor::{self as exec_api, Event};
use agora_proto::{ExecutorId, FrameworkId, TaskId, TaskInfo, TaskStatus};
use axum::extract::ws::CloseFrame;
use tokio::sync::{mpsc, oneshot, watch, Notify};

use crate::checkpoint::Op;
use crate::launcher::LaunchSpec;
use crate::status_updates::StreamKey;
use agora_containerizer::Limits;

// --- The core's inputs and actions ---

/// Identifies an executor: framework and executor id.
pub type ExecKey = (FrameworkId, ExecutorId);

/// What the core reacts to.
#[derive(Debug)]
pub enum Input {
    /// A new master connection is up (the shell holds its writer).
    MasterConnected {
        conn: u64,
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
    /// An executor subscribed (or re-subscribed) on connection `conn`:
    /// on Agora's executor API with its token, or on the Mesos v1
    /// executor API (`token: None`), which carries none and is open only
    /// to executors launched as Mesos executors (see
    /// [`agora_proto::ExecutorApi`]).
    ExecutorSubscribe {
        conn: u64,
        framework_id: FrameworkId,
        executor_id: ExecutorId,
        token: Option<String>,
        updates: Vec<TaskStatus>,
        tasks: Vec<TaskInfo>,
    },
    /// A call after subscribing.
    ExecutorCall { conn: u64, call: exec_api::Call },
    /// A subscribed executor connection ended (after its last call).
    ExecutorDisconnected { conn: u64 },
    /// A launch asked of the process thread succeeded or failed.
    ExecutorLaunched {
        key: ExecKey,
        run_id: String,
        result: Result<Started, String>,
    },
    /// The URIs of command task `key` are in its sandbox, or one could
    /// not be fetched (the message names it); or its container is made,
    /// with the files its process enters it through (see
    /// [`exec_api::Event::Launch`]), or could not be.
    TaskFetched {
        key: StreamKey,
        result: Result<TaskEntry, String>,
    },
    /// Command task `key`'s image was pulled and its container made,
    /// waiting for the command (`Ok`) its executor runs in place of the
    /// task's; or it could not be (the message names the image and the
    /// cause).
    ImagePrepared {
        key: StreamKey,
        result: Result<ImageRun, String>,
    },
    /// Command task `key`'s container was killed whole (nothing of the
    /// task is left) and is being removed; `limitation` says whether it
    /// had reached its memory limit.
    TaskContainerEnded {
        key: StreamKey,
        limitation: Option<agora_containerizer::Limitation>,
    },
    /// An executor process ended.
    ExecutorExited {
        key: ExecKey,
        run_id: String,
        code: Option<i32>,
        message: String,
    },
    /// An executor run's container reached a limit (ran out of memory):
    /// its tasks end with the limitation and the container is destroyed.
    ContainerLimited {
        key: ExecKey,
        run_id: String,
        limitation: agora_containerizer::Limitation,
    },
    /// What the containers use (read off the core), for the master:
    /// sent while registered, dropped otherwise.
    ContainerUsage(Vec<agent_api::ContainerUsage>),
    /// A timer the core set went off.
    Timer(Timer),
    /// A checkpoint the core asked for reached the disk (or failed to).
    Durable(Durable, Result<(), String>),
    /// The work directory became full (`full`: why) or has room again
    /// (see [`crate::disk`]).
    DiskFull { full: Option<String> },
}

/// A command task's container made from its image (see
/// [`agora_containerizer::images`]).
#[derive(Debug, Clone, PartialEq)]
pub struct ImageRun {
    /// The container's id.
    pub id: String,
    /// What its executor runs in place of the task's command (starts the
    /// container and waits for it).
    pub command: agora_proto::CommandInfo,
    /// The container's first process.
    pub pid: u32,
}

/// How a command task's process enters the container made for it alone
/// (see [`exec_api::Event::Launch`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TaskEntry {
    /// The files it writes `0` into; empty when it has no container.
    pub files: Vec<String>,
    /// The name the container keeps through its renames, for an
    /// executor that keeps the files open.
    pub lasting: Option<String>,
}

/// A timer the core sets (with [`Action::Timer`]) and is told of when it
/// goes off.
#[derive(Debug, Clone, PartialEq)]
pub enum Timer {
    /// An executor run has had its time to subscribe.
    RegistrationTimeout { key: ExecKey, run_id: String },
    /// An executor asked to shut down has had its grace period.
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
    /// A custom executor asked to kill a task has had the task's kill
    /// grace period and the shutdown grace period: unless the task ended,
    /// the executor is shut down.
    KillOverrun {
        key: ExecKey,
        run_id: String,
        task_id: TaskId,
    },
}

/// What a checkpoint's completion means to the core.
// Lives for one trip to the checkpoint writer and back; boxing the update
// would only add an allocation per update.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone, PartialEq)]
pub enum Durable {
    /// A checkpointed update: it may enter its stream, and be acknowledged
    /// to `ack_to`.
    Update {
        framework_id: FrameworkId,
        status: TaskStatus,
        ack_to: Option<ExecKey>,
    },
    /// A checkpointed acknowledgement: the stream's next update may go.
    Ack {
        framework_id: FrameworkId,
        task_id: TaskId,
    },
    /// A checkpointed task: it may go to its executor.
    Task { key: StreamKey },
    /// The checkpointed tasks of a task group: they may go to their
    /// executor, together.
    Tasks { keys: Vec<StreamKey> },
}

/// What the core asks to be done, in order.
// Actions live for one trip from the core to the shell; boxing the large
// ones would only add allocations.
#[allow(clippy::large_enum_variant)]
#[derive(Debug)]
pub enum Action {
    /// Write `call` to master connection `conn` (best effort: reliable
    /// updates are retried by their streams).
    ToMaster { conn: u64, call: agent_api::Call },
    /// Drop master connection `conn`: the link connects anew (and the agent
    /// registers again).
    DropMaster { conn: u64 },
    /// Queue `event` for executor connection `conn`: an answer to one of its
    /// calls (`reply`), or an event it did not ask for, which an executor
    /// that has long stopped reading does not get (it is disconnected).
    ToExecutor {
        conn: u64,
        event: exec_api::Event,
        reply: bool,
    },
    /// Close executor connection `conn`.
    CloseExecutor {
        conn: u64,
        code: u16,
        reason: String,
    },
    /// Ask the process thread for something.
    Process(Request),
    /// Stop these executor runs (`true`: asked to shut down, so given the
    /// grace period first) and reap them; the agent is stopping.
    StopExecutors {
        runs: Vec<(String, bool)>,
        grace: Duration,
        overrun: Duration,
    },
    /// Write `ops`; when they are durable (or failed), feed back
    /// [`Input::Durable`] with `then`.
    Checkpoint { ops: Vec<Op>, then: Option<Durable> },
    /// Feed back [`Input::Timer`] after `after`.
    Timer { after: Duration, timer: Timer },
}

/// Why the core stopped.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Stop {
    /// The shutdown future completed.
    Requested,
    /// The master refused the agent for good.
    Refused(String),
}

// --- The process thread's requests ---

/// What the core asks of the process thread.
#[derive(Debug)]
pub enum Request {
    /// Create the sandbox, fetch the spec's URIs into it (on a thread of
    /// their own, which asks for the launch again once they are there)
    /// and start the executor.
    Launch {
        key: ExecKey,
        run_id: String,
        spec: LaunchSpec,
    },
    /// Re-attach to an executor found alive after a restart.
    Adopt {
        key: ExecKey,
        run_id: String,
        pid: u32,
        start_time: Option<u64>,
    },
    /// Grow the limits of a run's container (a task joined its executor).
    Update { run_id: String, limits: Limits },
    /// Create a directory (a command task's sandbox, which its command
    /// executor also creates if it gets there first) for a task of a
    /// framework naming `user`.
    CreateDir {
        path: std::path::PathBuf,
        user: String,
    },
    /// Create command task `key`'s sandbox (owned by the user its
    /// framework names, when the agent switches users) and fetch `uris`
    /// into it, on a thread of their own, then tell the core
    /// ([`Input::TaskFetched`]).
    Fetch {
        key: StreamKey,
        sandbox: std::path::PathBuf,
        uris: Vec<agora_proto::FetchUri>,
        user: String,
    },
    /// Make command task `key` a container of its own, `name`, with
    /// `limits` (given to the user its framework names when the agent
    /// switches users), watched for out-of-memory kills, then tell the
    /// core ([`Input::TaskFetched`], with the files its process enters it
    /// through). Handled by the containers thread, apart from sandboxes
    /// and executors.
    TaskContainer {
        key: StreamKey,
        name: String,
        limits: Limits,
        user: String,
    },
    /// Kill command task `key`'s container whole (its process, and
    /// whatever left its session), then remove it, and tell the core
    /// ([`Input::TaskContainerEnded`]).
    EndTaskContainer { key: StreamKey, name: String },
    /// Pull command task `key`'s image and make its container, then tell
    /// the core ([`Input::ImagePrepared`]).
    PrepareImage {
        key: StreamKey,
        task: Box<agora_containerizer::ImageTask>,
    },
    /// Destroy command task `key`'s image container `id` (processes,
    /// mounts, cgroup, run directory), then tell the core
    /// ([`Input::TaskContainerEnded`]).
    EndImageContainer { key: StreamKey, id: String },
    /// Watch again the container `name` of command task `key`, recovered
    /// alive after a restart.
    AdoptTaskContainer { key: StreamKey, name: String },
    /// Command task `key`'s container ran out of memory: it is killed
    /// whole (the task then ends, and [`Request::EndTaskContainer`]
    /// reports the limitation).
    TaskOutOfMemory { key: StreamKey },
    /// End the executor's whole session: SIGTERM now, SIGKILL once
    /// `grace` has passed with the executor still running.
    Terminate { run_id: String, grace: Duration },
    /// The core is done with an exited executor: kill what is left of its
    /// session and reap it.
    Release { run_id: String },
    /// Stop these executors and reap them, then answer: the ones asked
    /// to shut down (`true`) get `grace` to exit on their own and then
    /// SIGTERM, the others SIGTERM at once; whatever still runs
    /// `overrun` after that gets SIGKILL. Used when the agent stops.
    StopAll {
        runs: Vec<(String, bool)>,
        grace: Duration,
        overrun: Duration,
        done: oneshot::Sender<()>,
    },
}

/// What a launch gave the core.
#[derive(Debug, Clone, Copy)]
pub struct Started {
    pub pid: u32,
    pub start_time: Option<u64>,
}

// --- What the shell is posted ---

/// What is posted to the shell.
pub(crate) enum CoreEvent {
    /// A new master connection; `tx` writes to it.
    MasterConnected {
        conn: u64,
        tx: mpsc::Sender<Call>,
        /// The connection's local IP (for the advertised address).
        local_ip: Option<std::net::IpAddr>,
    },
    /// An executor subscribed (or re-subscribed) on connection `conn`,
    /// written to through `link`.
    ExecutorSubscribe {
        conn: u64,
        link: ExecLink,
        framework_id: FrameworkId,
        executor_id: ExecutorId,
        /// `None` on the Mesos v1 executor API (see [`Input::ExecutorSubscribe`]).
        token: Option<String>,
        updates: Vec<TaskStatus>,
        tasks: Vec<TaskInfo>,
    },
    /// Publish the `/state` snapshot now (if anything changed) and
    /// answer once it is out: for a reader that must not see a view as
    /// old as the shell's snapshot interval.
    Publish(oneshot::Sender<()>),
    /// Anything else, for the core as it is.
    Input(Input),
}

/// The published `/state` view of the agent.
pub(crate) type Snapshot = Arc<serde_json::Value>;

// --- An executor connection ---

/// The core's handle on one executor connection: the events queued for
/// it, and a close request that no full queue can hold up.
///
/// Answers to the executor's own calls (acknowledgements, errors,
/// `SUBSCRIBED`) are always queued: their number is bounded because the
/// connection stops reading the executor's frames while more than
/// `limit` events wait to be written. Events the executor did not ask for
/// (launch, kill, messages, shutdown) are refused once `limit` are
/// waiting and have been for `stall`: the executor is not reading (a busy
/// one that is behind catches up).
#[derive(Clone)]
pub(crate) struct ExecLink {
    pub(crate) events: mpsc::UnboundedSender<Box<Event>>,
    pub(crate) unwritten: Arc<Unwritten>,
    pub(crate) close: Arc<watch::Sender<Option<CloseFrame>>>,
    pub(crate) limit: usize,
    pub(crate) stall: Duration,
}

/// Events queued for a connection but not yet written, and a wake-up for
/// the reader waiting for that number to fall to the limit.
pub(crate) struct Unwritten {
    pub(crate) count: AtomicUsize,
    pub(crate) drained: Notify,
    /// Since when (milliseconds since `since`, plus one; 0: not) the queue
    /// has been at the limit, as seen by the core.
    pub(crate) full_since_ms: AtomicU64,
    since: std::time::Instant,
}

/// Why [`ExecLink::push`] could not queue an event.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum LinkFull {
    /// The executor left the limit of events unread.
    Full,
    /// The connection is gone.
    Closed,
}

// === impl Unwritten ===

impl Default for Unwritten {
    fn default() -> Self {
        Unwritten {
            count: AtomicUsize::new(0),
            drained: Notify::new(),
            full_since_ms: AtomicU64::new(0),
            since: std::time::Instant::now(),
        }
    }
}

impl Unwritten {
    fn now_ms(&self) -> u64 {
        self.since.elapsed().as_millis() as u64
    }

    /// The queue is at the limit: whether it has been for `stall` (the
    /// writer did not get it below since).
    fn stalled(&self, stall: Duration) -> bool {
        let now = self.now_ms() + 1;
        match self
            .full_since_ms
            .compare_exchange(0, now, Ordering::AcqRel, Ordering::Acquire)
        {
            Ok(_) => false,
            Err(since) => now.saturating_sub(since) >= stall.as_millis() as u64,
        }
    }
}

// === impl ExecLink ===

impl ExecLink {
    /// Queues an answer to the executor's own call. Returns whether the
    /// connection is still open.
    pub(crate) fn reply(&self, event: Event) -> bool {
        self.unwritten.count.fetch_add(1, Ordering::AcqRel);
        self.events.send(Box::new(event)).is_ok()
    }

    /// Queues an event the executor did not ask for, unless `limit`
    /// events already wait to be written.
    pub(crate) fn push(&self, event: Event) -> Result<(), LinkFull> {
        if self.events.is_closed() {
            return Err(LinkFull::Closed);
        }
        if self.unwritten.count.load(Ordering::Acquire) >= self.limit
            && self.unwritten.stalled(self.stall)
        {
            return Err(LinkFull::Full);
        }
        if self.reply(event) {
            Ok(())
        } else {
            Err(LinkFull::Closed)
        }
    }

    /// Asks for the connection to be closed with `code` and `reason`,
    /// ahead of anything still queued. The first request wins.
    pub(crate) fn close(&self, code: u16, reason: impl Into<String>) {
        let frame = CloseFrame {
            code,
            reason: reason.into().into(),
        };
        self.close.send_if_modified(|current| {
            if current.is_some() {
                return false;
            }
            *current = Some(frame);
            true
        });
    }
}
