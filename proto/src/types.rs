//! The records every channel shares: frameworks, agents, offers, tasks,
//! executors and task status.

use std::collections::BTreeMap;
use std::fmt;

use base64::Engine as _;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::{
    AgentId, Attributes, ContainerInfo, ContainerStatus, ExecutorId, FetchUri, FrameworkId,
    OfferId, Resources, TaskId,
};

/// Opaque bytes, base64 on the wire (framework messages, task data).
#[derive(Clone, PartialEq, Eq, Default, Hash)]
pub struct Bytes(pub Vec<u8>);

/// Describes a framework. Sent by the scheduler when it subscribes.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FrameworkInfo {
    /// Unix user the framework's executors and tasks run as, on agents
    /// that switch users (`--switch-user`, the default, with the agent
    /// running as root); empty: the agent's own user. Never root unless
    /// the agent allows it (`--allow-root-tasks`).
    #[serde(default)]
    pub user: String,
    /// Human-readable name.
    pub name: String,
    /// Set when re-subscribing after a failover; the master assigns it otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<FrameworkId>,
    /// Seconds the master keeps a disconnected framework's tasks running
    /// before tearing it down. 0 means tear down at once on disconnect.
    #[serde(default)]
    pub failover_timeout: f64,
    /// Whether agents checkpoint this framework's tasks and status updates
    /// so they survive agent restarts.
    #[serde(default)]
    pub checkpoint: bool,
    /// Roles the framework receives resources for; empty means `["*"]`.
    #[serde(default)]
    pub roles: Vec<String>,
    /// Host the scheduler runs on.
    #[serde(default)]
    pub hostname: String,
    /// Principal for authentication and accounting.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub principal: Option<String>,
    /// Link to the framework's own web UI.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub webui_url: Option<String>,
}

/// Describes the master; sent to schedulers and agents on subscription.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MasterInfo {
    /// Unique id of this master process's run.
    pub id: String,
    /// `host:port` the master serves on.
    pub address: String,
    /// Software version.
    pub version: String,
}

/// What the leading master publishes where clients look for it (in
/// high-availability mode, the etcd key `PREFIX/leader`; see
/// `docs/protocol.md`, "High availability").
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LeaderInfo {
    /// `HOST:PORT` that agents and schedulers connect to.
    pub address: String,
    /// The leading master's id (new at every start).
    pub master_id: String,
}

/// Describes an agent. Sent by the agent when it registers.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AgentInfo {
    /// Set when re-registering; the master assigns it on first registration.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<AgentId>,
    /// Host name of the agent's machine.
    pub hostname: String,
    /// `host:port` of the agent's HTTP server (executors and sandbox files).
    pub address: String,
    /// Everything the agent offers.
    pub resources: Resources,
    /// Facts about the machine, e.g. `rack:a`.
    #[serde(default)]
    pub attributes: Attributes,
}

/// Resources on one agent offered to one framework.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Offer {
    /// Unique offer id.
    pub id: OfferId,
    /// The framework the offer is for.
    pub framework_id: FrameworkId,
    /// The agent the resources are on.
    pub agent_id: AgentId,
    /// The agent's host name.
    pub hostname: String,
    /// What is offered.
    pub resources: Resources,
    /// The agent's attributes.
    #[serde(default)]
    pub attributes: Attributes,
    /// Executors of this framework already running on the agent.
    #[serde(default)]
    pub executor_ids: Vec<ExecutorId>,
    /// The role the resources are allocated to (one of the framework's
    /// roles); tasks launched on the offer count towards that role's share.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allocation_role: Option<String>,
}

/// A shell command or program to run. The default is an empty shell command.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CommandInfo {
    /// With `shell` (the default) a string for `/bin/sh -c`; otherwise the
    /// program to execute with `arguments`.
    #[serde(default)]
    pub value: String,
    /// Run `value` through `/bin/sh -c`.
    #[serde(default = "default_true")]
    pub shell: bool,
    /// Arguments (including argv\[0\]) when `shell` is false.
    #[serde(default)]
    pub arguments: Vec<String>,
    /// Extra environment variables.
    #[serde(default)]
    pub environment: BTreeMap<String, String>,
    /// URIs the agent fetches into the sandbox, in order, before it starts
    /// the command (Mesos's `CommandInfo.uris`): an executor's into the
    /// executor's sandbox, a command task's into the task's. The first one
    /// that cannot be fetched fails the launch (`TASK_FAILED`,
    /// `REASON_EXECUTOR_LAUNCH_FAILED`, with a message naming it).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub uris: Vec<FetchUri>,
}

/// Describes an executor: the program an agent forks to run tasks.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ExecutorInfo {
    /// Unique within the framework on one agent.
    pub executor_id: ExecutorId,
    /// The owning framework (filled in by the master if absent).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub framework_id: Option<FrameworkId>,
    /// How to start the executor.
    pub command: CommandInfo,
    /// Resources the executor itself uses, on top of its tasks'.
    #[serde(default)]
    pub resources: Resources,
    /// Human-readable name.
    #[serde(default)]
    pub name: String,
    /// Free-form source tag for grouping executors in metrics.
    #[serde(default)]
    pub source: String,
    /// The executor API the executor speaks, hence where the agent lets it
    /// subscribe and what environment it gets. Absent (as in checkpoints
    /// written before the field existed) means Agora's.
    #[serde(default, skip_serializing_if = "ExecutorApi::is_agora")]
    pub api: ExecutorApi,
    /// Seconds between asking the executor to shut down (SHUTDOWN, or
    /// SIGTERM when it is not connected) and SIGKILL, and what the executor
    /// is told in `MESOS_EXECUTOR_SHUTDOWN_GRACE_PERIOD` and
    /// `AGORA_SHUTDOWN_GRACE_PERIOD` (Mesos's
    /// `ExecutorInfo.shutdown_grace_period`). Absent: the agent's
    /// `--executor-shutdown-grace-period`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shutdown_grace_period: Option<f64>,
    /// Opaque data for the executor, given back to it when it subscribes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data: Option<Bytes>,
    /// Free-form labels, given back to the executor when it subscribes.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
    /// The container the executor runs in (Mesos's
    /// `ExecutorInfo.container`); `None`: the host's file system.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub container: Option<Box<ContainerInfo>>,
}

/// The API an executor speaks to its agent.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum ExecutorApi {
    /// Agora's executor API: a WebSocket on `/api/executor`, subscribing
    /// with the token the agent puts in `AGORA_EXECUTOR_TOKEN`.
    #[default]
    Agora,
    /// The Mesos v1 executor API: `POST /api/v1/executor`, no token, with
    /// Mesos's executor environment (`MESOS_AGENT_ENDPOINT`, ...). Set by
    /// the master's Mesos front door for Mesos frameworks' custom
    /// executors.
    MesosV1,
}

impl ExecutorApi {
    /// Whether this is Agora's own API (the default).
    pub fn is_agora(&self) -> bool {
        *self == ExecutorApi::Agora
    }
}

/// Describes a task to launch. Exactly one of `executor` (a custom
/// executor) or `command` (run by the built-in command executor) is set;
/// a task of a task group (see `task_group`) has an `executor` and may
/// have a `command` too.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TaskInfo {
    /// Human-readable name.
    pub name: String,
    /// Unique within the framework.
    pub task_id: TaskId,
    /// The agent to run on (that of the offer).
    pub agent_id: AgentId,
    /// Resources the task uses; must fit in the offers it is launched on.
    pub resources: Resources,
    /// The role the task's offers were allocated to, as the framework read
    /// it in them (Mesos's `Resource.allocation_info.role`). When set, the
    /// master refuses the task (`TASK_ERROR`) unless every offer of its
    /// launch was allocated to this role.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allocation_role: Option<String>,
    /// A custom executor to run the task.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub executor: Option<ExecutorInfo>,
    /// A command for the built-in command executor.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub command: Option<CommandInfo>,
    /// Opaque data passed to the executor.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data: Option<Bytes>,
    /// Seconds between SIGTERM and SIGKILL when the task is killed
    /// (the agent's default when absent).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kill_grace_period: Option<f64>,
    /// Free-form labels.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
    /// Set by the master when it accepts the launch (whatever a scheduler
    /// sends here is replaced); agents keep it with the task and report it
    /// back. It orders the launches of one task id, across master
    /// failovers: of two agents that report the id, the later launch is
    /// the task that has it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub launch_stamp: Option<LaunchStamp>,
    /// The task group the task belongs to (Mesos's `LAUNCH_GROUP`): the
    /// tasks of one launch that name the same group run on one custom
    /// executor and start all together or not at all. The master refuses
    /// every task of the group (`TASK_ERROR`,
    /// `REASON_TASK_GROUP_INVALID`) when one of them cannot run, and sends
    /// the agent the group in one piece; the agent hands a Mesos executor
    /// the group in one `LAUNCH_GROUP` event and an Agora executor one
    /// `LAUNCH` per task, in order. A task of a group may carry a
    /// `command` beside its `executor`: it is for the executor to run,
    /// not the agent. Any text; it should not name another group of the
    /// framework that has not ended.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub task_group: Option<String>,
    /// The container a command task runs in (Mesos's
    /// `TaskInfo.container`): an image, volumes, networks. `None`: the
    /// host's file system, as before.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub container: Option<Box<ContainerInfo>>,
}

/// When the master accepted a launch: the framework's launch epoch (raised
/// and made durable each time its scheduler subscribes) and the launch's
/// number within it. Ordered by epoch, then number.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct LaunchStamp {
    /// The framework's epoch when the master accepted the launch.
    pub epoch: u64,
    /// The launch's number within the epoch, from 0.
    pub seq: u64,
}

/// The states of a task. `TASK_` on the wire, as in Mesos.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum TaskState {
    /// Accepted by the master, on its way to the agent.
    #[serde(rename = "TASK_STAGING")]
    Staging,
    /// The executor is starting the task.
    #[serde(rename = "TASK_STARTING")]
    Starting,
    /// The task is running.
    #[serde(rename = "TASK_RUNNING")]
    Running,
    /// A kill was asked for and is under way.
    #[serde(rename = "TASK_KILLING")]
    Killing,
    /// Terminal: the task ended successfully.
    #[serde(rename = "TASK_FINISHED")]
    Finished,
    /// Terminal: the task ended with an error.
    #[serde(rename = "TASK_FAILED")]
    Failed,
    /// Terminal: the task was killed on request.
    #[serde(rename = "TASK_KILLED")]
    Killed,
    /// Terminal: the task was lost (its agent or executor went away and
    /// the cause is unknown).
    #[serde(rename = "TASK_LOST")]
    Lost,
    /// Terminal: the task description was invalid.
    #[serde(rename = "TASK_ERROR")]
    Error,
    /// Terminal: the task was never started (e.g. its offer was gone).
    #[serde(rename = "TASK_DROPPED")]
    Dropped,
    /// Terminal: the task's agent was removed and will not return.
    #[serde(rename = "TASK_GONE")]
    Gone,
    /// Not terminal: the task's agent is not reachable right now; the task
    /// may still be running.
    #[serde(rename = "TASK_UNREACHABLE")]
    Unreachable,
    /// Reconciliation answer for a task the master does not know.
    #[serde(rename = "TASK_UNKNOWN")]
    Unknown,
}

/// Who generated a status update.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum Source {
    /// The master (invalid launches, agent loss, reconciliation).
    SourceMaster,
    /// The agent (executor exits, launch failures).
    SourceAgent,
    /// The executor.
    SourceExecutor,
}

/// Why a status update was generated. `#[serde(other)]` keeps unknown
/// reasons readable.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum Reason {
    /// The command exited with a non-zero code.
    ReasonCommandExecutorFailed,
    /// The executor exited or was killed before the task ended.
    ReasonExecutorTerminated,
    /// The executor did not register within the registration timeout.
    ReasonExecutorRegistrationTimeout,
    /// The executor could not be started.
    ReasonExecutorLaunchFailed,
    /// The offers named in the launch are gone or belong to someone else.
    ReasonInvalidOffers,
    /// The task description is invalid (bad id, duplicate id, etc.).
    ReasonTaskInvalid,
    /// The task needs more than its offers hold.
    ReasonInsufficientResources,
    /// The agent was removed (missed too many pings, or shut down).
    ReasonAgentRemoved,
    /// The agent restarted and could not recover the task.
    ReasonAgentRestarted,
    /// The agent is not known to the master.
    ReasonAgentUnknown,
    /// The agent is disconnected.
    ReasonAgentDisconnected,
    /// Answer to a reconciliation request.
    ReasonReconciliation,
    /// The task was killed because its framework was removed.
    ReasonFrameworkRemoved,
    /// The task was killed on request.
    ReasonTaskKilled,
    /// The task is not known where it was looked for.
    ReasonTaskUnknown,
    /// The task's executor was asked to shut down.
    ReasonExecutorShutdown,
    /// The task's container ran out of memory (its `mem`, plus its
    /// executor's): the kernel killed a process of it and the agent
    /// destroyed the container.
    ReasonContainerLimitationMemory,
    /// A task of the task's group is invalid: the whole group was
    /// refused.
    ReasonTaskGroupInvalid,
    /// The framework's principal may not run tasks as the task's user
    /// (`run_tasks` ACL): the task, or its whole group, was refused.
    ReasonTaskUnauthorized,
    /// The task's container could not be made: its image could not be
    /// pulled (the message names the image and the cause), a volume was
    /// refused, or the agent has no image provider enabled (Mesos's
    /// `REASON_CONTAINER_LAUNCH_FAILED`).
    ReasonContainerLaunchFailed,
    // Mesos's other reasons, which Agora does not give itself but passes
    // on unchanged from a Mesos executor's update.
    /// Mesos's `REASON_CONTAINER_LIMITATION`.
    ReasonContainerLimitation,
    /// Mesos's `REASON_CONTAINER_LIMITATION_DISK`.
    ReasonContainerLimitationDisk,
    /// Mesos's `REASON_CONTAINER_PREEMPTED`.
    ReasonContainerPreempted,
    /// Mesos's `REASON_CONTAINER_UPDATE_FAILED`.
    ReasonContainerUpdateFailed,
    /// Mesos's `REASON_MAX_COMPLETION_TIME_REACHED`.
    ReasonMaxCompletionTimeReached,
    /// Mesos's `REASON_EXECUTOR_REREGISTRATION_TIMEOUT`.
    ReasonExecutorReregistrationTimeout,
    /// Mesos's `REASON_EXECUTOR_UNREGISTERED`.
    ReasonExecutorUnregistered,
    /// Mesos's `REASON_GC_ERROR`.
    ReasonGcError,
    /// Mesos's `REASON_INVALID_FRAMEWORKID`.
    ReasonInvalidFrameworkid,
    /// Mesos's `REASON_IO_SWITCHBOARD_EXITED`.
    ReasonIoSwitchboardExited,
    /// Mesos's `REASON_MASTER_DISCONNECTED`.
    ReasonMasterDisconnected,
    /// Mesos's `REASON_RESOURCES_UNKNOWN`.
    ReasonResourcesUnknown,
    /// Mesos's `REASON_AGENT_DRAINING`.
    ReasonAgentDraining,
    /// Mesos's `REASON_AGENT_REMOVED_BY_OPERATOR`.
    ReasonAgentRemovedByOperator,
    /// Mesos's `REASON_AGENT_REREGISTERED`.
    ReasonAgentReregistered,
    /// Mesos's `REASON_TASK_KILLED_DURING_LAUNCH`.
    ReasonTaskKilledDuringLaunch,
    /// Mesos's `REASON_TASK_CHECK_STATUS_UPDATED`: a check's result
    /// changed.
    ReasonTaskCheckStatusUpdated,
    /// Mesos's `REASON_TASK_HEALTH_CHECK_STATUS_UPDATED`: the task's
    /// health (`healthy`) changed.
    ReasonTaskHealthCheckStatusUpdated,
    /// Mesos's `REASON_TASK_GROUP_UNAUTHORIZED`.
    ReasonTaskGroupUnauthorized,
    /// Any reason this version does not know.
    #[serde(other)]
    ReasonUnknown,
}

/// The state of a task at one moment, with why and who said so.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TaskStatus {
    /// The task.
    pub task_id: TaskId,
    /// Its new state.
    pub state: TaskState,
    /// Human-readable detail.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// Who generated the update.
    pub source: Source,
    /// Why, when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<Reason>,
    /// Opaque data from the executor.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data: Option<Bytes>,
    /// The agent the task runs on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent_id: Option<AgentId>,
    /// The executor running the task.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub executor_id: Option<ExecutorId>,
    /// Seconds since the Unix epoch when the update was generated.
    pub timestamp: f64,
    /// Identifies a reliable update. Updates with a uuid are retried until
    /// acknowledged and must be acknowledged by the scheduler; updates
    /// without one (from the master: invalid launches, reconciliation
    /// answers, lost agents) are best-effort and need no acknowledgement.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uuid: Option<String>,
    /// Free-form labels from the executor, passed to the scheduler
    /// unchanged (Mesos's `TaskStatus.labels`).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
    /// The task's health as its executor last judged it (Mesos's
    /// `TaskStatus.healthy`), passed to the scheduler unchanged; absent
    /// when the executor checks no health.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub healthy: Option<bool>,
    /// The launch stamp of the task the agent took this update for (set
    /// by the agent from its record of the task, whatever an executor
    /// sends): which launch of a reused task id it is about.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub launch_stamp: Option<LaunchStamp>,
    /// What the agent reports about the task's container (Mesos's
    /// `TaskStatus.container_status`): its id, networks and first
    /// process. Set by the agent, for tasks that run in a container.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub container_status: Option<Box<ContainerStatus>>,
}

/// Options attached to declining or accepting an offer.
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize, Deserialize)]
pub struct Filters {
    /// Seconds during which the declined (or left-over) resources of that
    /// agent are not offered to this framework again. Default 5.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub refuse_seconds: Option<f64>,
}

/// Master-side default for [`Filters::refuse_seconds`].
pub const DEFAULT_REFUSE_SECONDS: f64 = 5.0;

fn default_true() -> bool {
    true
}

/// Seconds since the Unix epoch, now.
pub fn now_timestamp() -> f64 {
    if let Some(wall) = crate::simulated::wall() {
        return wall;
    }
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0)
}

// === impl CommandInfo ===

impl Default for CommandInfo {
    fn default() -> Self {
        CommandInfo {
            value: String::new(),
            shell: true,
            arguments: Vec::new(),
            environment: BTreeMap::new(),
            uris: Vec::new(),
        }
    }
}

impl CommandInfo {
    /// A command for `/bin/sh -c`.
    pub fn shell(command: impl Into<String>) -> Self {
        CommandInfo {
            value: command.into(),
            ..CommandInfo::default()
        }
    }

    /// Program `path` exec'd directly (no shell), with no argument but
    /// itself as argv\[0\].
    pub fn program(path: impl Into<String>) -> Self {
        let path = path.into();
        CommandInfo {
            value: path.clone(),
            shell: false,
            arguments: vec![path],
            ..CommandInfo::default()
        }
    }
}

// === impl Bytes ===

impl Bytes {
    /// The bytes as UTF-8 text, lossily.
    pub fn to_string_lossy(&self) -> String {
        String::from_utf8_lossy(&self.0).into_owned()
    }
}

impl fmt::Debug for Bytes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Bytes({} bytes)", self.0.len())
    }
}

impl From<Vec<u8>> for Bytes {
    fn from(v: Vec<u8>) -> Self {
        Bytes(v)
    }
}

impl From<&str> for Bytes {
    fn from(v: &str) -> Self {
        Bytes(v.as_bytes().to_vec())
    }
}

impl Serialize for Bytes {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&base64::engine::general_purpose::STANDARD.encode(&self.0))
    }
}

impl<'de> Deserialize<'de> for Bytes {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = String::deserialize(d)?;
        base64::engine::general_purpose::STANDARD
            .decode(text.as_bytes())
            .map(Bytes)
            .map_err(|e| serde::de::Error::custom(format!("invalid base64: {e}")))
    }
}

// === impl FrameworkInfo ===

impl FrameworkInfo {
    /// A framework called `name` with defaults elsewhere.
    pub fn new(name: impl Into<String>) -> Self {
        FrameworkInfo {
            user: String::new(),
            name: name.into(),
            id: None,
            failover_timeout: 0.0,
            checkpoint: false,
            roles: Vec::new(),
            hostname: String::new(),
            principal: None,
            webui_url: None,
        }
    }

    /// The framework's roles, `["*"]` when none are given.
    pub fn effective_roles(&self) -> Vec<String> {
        if self.roles.is_empty() {
            vec![crate::DEFAULT_ROLE.to_string()]
        } else {
            self.roles.clone()
        }
    }
}

// === impl TaskState ===

impl TaskState {
    /// Whether no further update follows this one.
    pub fn is_terminal(self) -> bool {
        matches!(
            self,
            TaskState::Finished
                | TaskState::Failed
                | TaskState::Killed
                | TaskState::Lost
                | TaskState::Error
                | TaskState::Dropped
                | TaskState::Gone
        )
    }

    /// The wire name, e.g. `TASK_RUNNING`.
    pub fn as_str(self) -> &'static str {
        match self {
            TaskState::Staging => "TASK_STAGING",
            TaskState::Starting => "TASK_STARTING",
            TaskState::Running => "TASK_RUNNING",
            TaskState::Killing => "TASK_KILLING",
            TaskState::Finished => "TASK_FINISHED",
            TaskState::Failed => "TASK_FAILED",
            TaskState::Killed => "TASK_KILLED",
            TaskState::Lost => "TASK_LOST",
            TaskState::Error => "TASK_ERROR",
            TaskState::Dropped => "TASK_DROPPED",
            TaskState::Gone => "TASK_GONE",
            TaskState::Unreachable => "TASK_UNREACHABLE",
            TaskState::Unknown => "TASK_UNKNOWN",
        }
    }

    /// Every state, for metrics and tables.
    pub const ALL: [TaskState; 13] = [
        TaskState::Staging,
        TaskState::Starting,
        TaskState::Running,
        TaskState::Killing,
        TaskState::Finished,
        TaskState::Failed,
        TaskState::Killed,
        TaskState::Lost,
        TaskState::Error,
        TaskState::Dropped,
        TaskState::Gone,
        TaskState::Unreachable,
        TaskState::Unknown,
    ];
}

impl fmt::Display for TaskState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

// === impl TaskStatus ===

impl TaskStatus {
    /// A status for `task_id` in `state` from `source`, stamped now, with
    /// no uuid (set one with [`TaskStatus::with_new_uuid`] for reliable updates).
    pub fn new(task_id: TaskId, state: TaskState, source: Source) -> Self {
        TaskStatus {
            launch_stamp: None,
            task_id,
            state,
            message: None,
            source,
            reason: None,
            data: None,
            agent_id: None,
            executor_id: None,
            timestamp: now_timestamp(),
            uuid: None,
            labels: BTreeMap::new(),
            healthy: None,
            container_status: None,
        }
    }

    /// Sets a fresh random uuid, making this a reliable update.
    pub fn with_new_uuid(mut self) -> Self {
        self.uuid = Some(crate::simulated::uuid());
        self
    }

    /// Sets the message.
    pub fn with_message(mut self, message: impl Into<String>) -> Self {
        self.message = Some(message.into());
        self
    }

    /// Sets the reason.
    pub fn with_reason(mut self, reason: Reason) -> Self {
        self.reason = Some(reason);
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn terminal_states() {
        let terminal: Vec<_> = TaskState::ALL.iter().filter(|s| s.is_terminal()).collect();
        assert_eq!(terminal.len(), 7);
        assert!(!TaskState::Unreachable.is_terminal());
        assert_eq!(
            serde_json::to_string(&TaskState::Running).unwrap(),
            "\"TASK_RUNNING\""
        );
    }

    #[test]
    fn bytes_are_base64() {
        let b = Bytes::from("hi");
        assert_eq!(serde_json::to_string(&b).unwrap(), "\"aGk=\"");
        assert_eq!(serde_json::from_str::<Bytes>("\"aGk=\"").unwrap(), b);
        assert!(serde_json::from_str::<Bytes>("\"!!\"").is_err());
    }

    #[test]
    fn unknown_reason_is_tolerated() {
        let r: Reason = serde_json::from_str("\"REASON_FROM_THE_FUTURE\"").unwrap();
        assert_eq!(r, Reason::ReasonUnknown);
    }
}
