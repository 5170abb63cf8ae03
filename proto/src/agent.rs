//! The agent channel: an agent ↔ the master, over a WebSocket at
//! `ws://MASTER/api/agent`.
//!
//! The agent's first call is [`Call::Register`]. An agent that has an id
//! (it registered before, and kept its work dir) sends it together with the
//! tasks and executors it runs, so a restarted master rebuilds its view and
//! a reconnecting agent keeps its tasks. The master answers
//! [`Event::Registered`], pings the agent, and removes it after too many
//! missed pings; a removed agent that comes back gets [`Event::Shutdown`].

use serde::{Deserialize, Serialize};

use crate::{
    AgentId, AgentInfo, Bytes, ExecutorId, ExecutorInfo, FrameworkId, FrameworkInfo, MasterInfo,
    TaskId, TaskInfo, TaskState, TaskStatus,
};

/// Agent → master.
// Messages are built once and moved into a frame; boxing the large
// variants would only add allocations.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "SCREAMING_SNAKE_CASE")]
pub enum Call {
    /// Register, or re-register when `agent_info.id` is set.
    Register {
        /// Must be [`crate::PROTOCOL_VERSION`].
        protocol: u32,
        /// The agent.
        agent_info: AgentInfo,
        /// Tasks the agent has (re-registration).
        #[serde(default)]
        tasks: Vec<TaskReport>,
        /// Executors the agent runs (re-registration).
        #[serde(default)]
        executors: Vec<ExecutorReport>,
        /// Frameworks with tasks on the agent (re-registration).
        #[serde(default)]
        frameworks: Vec<FrameworkInfo>,
    },
    /// A reliable status update from the agent's status update manager.
    /// The master forwards it and later sends [`Event::Acknowledge`].
    StatusUpdate {
        /// The task's framework.
        framework_id: FrameworkId,
        /// The status; `uuid` is always set.
        status: TaskStatus,
    },
    /// An executor process ended.
    ExecutorExited {
        /// Its framework.
        framework_id: FrameworkId,
        /// The executor.
        executor_id: ExecutorId,
        /// Wait status (exit code, or 128 + signal), when known.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        status: Option<i32>,
        /// Detail.
        #[serde(default)]
        message: String,
    },
    /// Bytes from an executor to its scheduler. Best effort.
    Message {
        /// The framework.
        framework_id: FrameworkId,
        /// The executor.
        executor_id: ExecutorId,
        /// Payload.
        data: Bytes,
    },
    /// Answer to [`Event::Ping`].
    Pong,
    /// What the agent's containers use (agents with `--isolation
    /// cgroups`), sent every few seconds. Best effort.
    Usage {
        /// One entry per running executor's container.
        containers: Vec<ContainerUsage>,
    },
    /// Whether the agent can take new tasks. `unavailable` says why it
    /// cannot (its work directory is full): the master then offers none
    /// of its resources (outstanding offers are rescinded) until the
    /// agent sends this call without a reason. Sent on every change, and
    /// after each (re-)registration while the agent cannot take tasks; a
    /// (re-)registered agent is available until it says otherwise. Tasks
    /// already running are not touched.
    Availability {
        /// Why the agent cannot take tasks; `None`: it can again.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        unavailable: Option<String>,
    },
    /// A call type this master does not know.
    #[serde(other)]
    Unknown,
}

/// What one executor's container uses, with the tasks it runs (tasks
/// sharing an executor share its container).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ContainerUsage {
    /// The executor's framework.
    pub framework_id: FrameworkId,
    /// The tasks the container runs.
    pub tasks: Vec<TaskId>,
    /// CPU time used (user and system), seconds.
    pub cpus_time_secs: f64,
    /// CPUs the container is limited to.
    pub cpus_limit: f64,
    /// CFS periods in which the container was throttled.
    pub cpus_nr_throttled: u64,
    /// Memory in use.
    pub mem_bytes: u64,
    /// Most memory in use at once.
    pub mem_max_bytes: u64,
    /// The hard memory limit.
    pub mem_limit_bytes: u64,
    /// Processes and threads.
    pub processes: u64,
}

/// One task an agent reports when it re-registers.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TaskReport {
    /// The task's framework.
    pub framework_id: FrameworkId,
    /// The task as launched.
    pub task: TaskInfo,
    /// Its latest state on the agent.
    pub state: TaskState,
    /// The latest status, if any was generated.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub latest_status: Option<TaskStatus>,
}

/// One executor an agent reports when it re-registers.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ExecutorReport {
    /// Its framework.
    pub framework_id: FrameworkId,
    /// The executor.
    pub executor: ExecutorInfo,
}

/// Master → agent.
// Messages are built once and moved into a frame; boxing the large
// variants would only add allocations.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "SCREAMING_SNAKE_CASE")]
pub enum Event {
    /// Registration accepted.
    Registered {
        /// The agent's id (new, or the one it re-registered with).
        agent_id: AgentId,
        /// The master pings this often.
        ping_interval_seconds: f64,
        /// Who is serving.
        master_info: MasterInfo,
        /// Whether the agent was re-admitted with its id.
        #[serde(default)]
        reregistered: bool,
    },
    /// Run a task (starting its executor when needed).
    RunTask {
        /// The task's framework, with `id` set.
        framework: FrameworkInfo,
        /// The task. For command tasks `command` is set; for custom
        /// executors `executor` (with `framework_id` filled in).
        task: TaskInfo,
    },
    /// Run the tasks of one task group (see [`TaskInfo::task_group`])
    /// together, on their custom executor (started when needed): all of
    /// them or, when one cannot run, none.
    RunTaskGroup {
        /// The tasks' framework, with `id` set.
        framework: FrameworkInfo,
        /// The group's tasks, in order; each has `executor` set (the same
        /// executor, with `framework_id` filled in) and `task_group`.
        tasks: Vec<TaskInfo>,
    },
    /// Kill a task.
    KillTask {
        /// Its framework.
        framework_id: FrameworkId,
        /// The task.
        task_id: TaskId,
    },
    /// The scheduler acknowledged a status update.
    Acknowledge {
        /// The framework.
        framework_id: FrameworkId,
        /// The task.
        task_id: TaskId,
        /// The update's uuid.
        uuid: String,
    },
    /// Bytes from a scheduler to an executor. Best effort.
    Message {
        /// The framework.
        framework_id: FrameworkId,
        /// The executor.
        executor_id: ExecutorId,
        /// Payload.
        data: Bytes,
    },
    /// The framework is gone: shut down its executors and kill its tasks.
    ShutdownFramework {
        /// The framework.
        framework_id: FrameworkId,
    },
    /// Keep-alive; answer with [`Call::Pong`].
    Ping,
    /// The master removed this agent: kill everything and stop. The agent
    /// must not re-register with this id.
    Shutdown {
        /// Why.
        message: String,
    },
    /// An error; `fatal` ends the registration.
    Error {
        /// What went wrong.
        message: String,
        /// Whether the master refuses this agent.
        #[serde(default)]
        fatal: bool,
    },
    /// An event type this agent does not know.
    #[serde(other)]
    Unknown,
}
