//! The executor channel: an executor ↔ its agent, over a WebSocket at the
//! URL the agent passes in `AGORA_AGENT_ENDPOINT` (see [`crate::env`]).
//!
//! The executor's first call is [`Call::Subscribe`], carrying the updates
//! and tasks the agent has not acknowledged yet (after an agent restart or
//! a dropped connection), so none are lost. Each [`Call::Update`] is
//! answered by [`Event::Acknowledged`] once the agent has made the update
//! durable; the executor keeps it until then.

use serde::{Deserialize, Serialize};

use crate::{
    AgentId, Bytes, ExecutorId, ExecutorInfo, FrameworkId, FrameworkInfo, TaskId, TaskInfo,
    TaskStatus,
};

/// Executor → agent.
// Messages are built once and moved into a frame; boxing the large
// variants would only add allocations.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "SCREAMING_SNAKE_CASE")]
pub enum Call {
    /// Attach to the agent (first call, and after every reconnect).
    Subscribe {
        /// Must be [`crate::PROTOCOL_VERSION`].
        protocol: u32,
        /// From `AGORA_FRAMEWORK_ID`.
        framework_id: FrameworkId,
        /// From `AGORA_EXECUTOR_ID`.
        executor_id: ExecutorId,
        /// From `AGORA_EXECUTOR_TOKEN`; the agent refuses a wrong one.
        token: String,
        /// Updates sent but not yet acknowledged, oldest first.
        #[serde(default)]
        unacknowledged_updates: Vec<TaskStatus>,
        /// Tasks received that have no update acknowledged yet.
        #[serde(default)]
        unacknowledged_tasks: Vec<TaskInfo>,
    },
    /// A status update for one of this executor's tasks; `status.uuid` set.
    Update {
        /// The status.
        status: TaskStatus,
    },
    /// Bytes for the scheduler. Best effort.
    Message {
        /// Payload.
        data: Bytes,
    },
    /// A call type this agent does not know.
    #[serde(other)]
    Unknown,
}

/// Agent → executor.
// Messages are built once and moved into a frame; boxing the large
// variants would only add allocations.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "SCREAMING_SNAKE_CASE")]
pub enum Event {
    /// Subscription accepted.
    Subscribed {
        /// This executor.
        executor_info: ExecutorInfo,
        /// Its framework.
        framework_info: FrameworkInfo,
        /// The agent.
        agent_id: AgentId,
        /// The agent's host name.
        hostname: String,
    },
    /// Launch a task.
    Launch {
        /// The task.
        task: TaskInfo,
        /// A sandbox the agent made for this task alone (absolute path),
        /// when the executor runs the tasks of many: the built-in command
        /// executor runs each command there, as Mesos's command executor
        /// runs its one task in its own sandbox. Absent for tasks that
        /// share their executor's sandbox.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        sandbox: Option<String>,
        /// Files the task's process writes `0` into before it runs its
        /// command, to be born in the container the agent made for this
        /// task alone (under `--isolation cgroups`, for the tasks of the
        /// built-in command executor: a cgroup v1 `tasks` file per
        /// hierarchy, or the cgroup v2 `cgroup.procs`). Empty when the
        /// task runs in its executor's container.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        cgroups: Vec<String>,
        /// A name the container of `cgroups` keeps while the agent
        /// renames it from one task to the next (an ended task's empty
        /// container is reused): an executor may keep the files open
        /// under it. Absent for a container that is never reused.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        container: Option<String>,
    },
    /// Launch the tasks of one task group together (see
    /// [`TaskInfo::task_group`]). Sent only to executors of the Mesos v1
    /// executor API, as Mesos's `LAUNCH_GROUP`; an executor of Agora's API
    /// gets a group as one [`Event::Launch`] per task, in order.
    LaunchGroup {
        /// The group's tasks.
        tasks: Vec<TaskInfo>,
    },
    /// Kill a task; send a terminal update (TASK_KILLED) when done.
    Kill {
        /// The task.
        task_id: TaskId,
        /// Seconds the task gets to end after SIGTERM.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        grace_period_seconds: Option<f64>,
    },
    /// The agent made an update durable; the executor may forget it.
    Acknowledged {
        /// The task.
        task_id: TaskId,
        /// The update's uuid.
        uuid: String,
    },
    /// Bytes from the scheduler. Best effort.
    Message {
        /// Payload.
        data: Bytes,
    },
    /// Kill all tasks and exit within the grace period.
    Shutdown {
        /// Seconds before the agent kills the process group.
        grace_period_seconds: f64,
    },
    /// An error; `fatal` means the agent refuses this executor.
    Error {
        /// What went wrong.
        message: String,
        /// Whether to give up.
        #[serde(default)]
        fatal: bool,
    },
    /// An event type this executor does not know.
    #[serde(other)]
    Unknown,
}
