//! The scheduler channel: a framework's scheduler ↔ the master, over a
//! WebSocket at `ws://MASTER/api/scheduler`.
//!
//! The first call on a connection must be [`Call::Subscribe`]; the master
//! answers [`Event::Subscribed`] and from then on sends offers, updates and
//! heartbeats. A framework that subscribes with `framework_info.id` set is
//! re-registering (scheduler failover): it keeps its tasks and receives the
//! updates still pending for them. Closing the connection without
//! [`Call::Teardown`] starts the framework's failover timeout.

use serde::{Deserialize, Serialize};

use crate::{
    AgentId, Bytes, ExecutorId, Filters, FrameworkId, FrameworkInfo, MasterInfo, Offer, OfferId,
    Resources, TaskId, TaskInfo, TaskStatus,
};

/// Scheduler → master.
///
/// A key a call's body does not have is an error naming it (the master
/// answers an `Error` event), never dropped; keys inside the records a
/// call carries (tasks, the framework, filters, ...) are checked by
/// [`unknown_fields`], since those records also travel in events, which
/// stay tolerant of fields a newer peer adds.
// Messages are built once and moved into a frame; boxing the large
// variants would only add allocations.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "SCREAMING_SNAKE_CASE", deny_unknown_fields)]
pub enum Call {
    /// Register (no id) or re-register (id set) the framework.
    Subscribe {
        /// Must be [`crate::PROTOCOL_VERSION`].
        protocol: u32,
        /// The framework.
        framework_info: FrameworkInfo,
        /// Take over from another live connection of the same framework.
        #[serde(default)]
        force: bool,
    },
    /// Remove the framework: kill its tasks and forget it.
    Teardown,
    /// Accept offers by launching tasks on them. Offers of one launch must
    /// be on one agent. Resources left unused are declined with `filters`.
    /// An empty `tasks` declines the offers.
    Launch {
        /// The offers to use.
        offer_ids: Vec<OfferId>,
        /// The tasks to launch.
        tasks: Vec<TaskInfo>,
        /// Filter for what is left over.
        #[serde(default)]
        filters: Filters,
    },
    /// Decline offers.
    Decline {
        /// The offers to give back.
        offer_ids: Vec<OfferId>,
        /// How long not to re-offer these agents' resources.
        #[serde(default)]
        filters: Filters,
    },
    /// Clear filters and resume offers (all roles when `roles` is empty).
    Revive {
        /// Roles to revive; empty means all.
        #[serde(default)]
        roles: Vec<String>,
    },
    /// Stop offers until revive (all roles when `roles` is empty).
    Suppress {
        /// Roles to suppress; empty means all.
        #[serde(default)]
        roles: Vec<String>,
    },
    /// Kill a task.
    Kill {
        /// The task.
        task_id: TaskId,
        /// Its agent, when known.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        agent_id: Option<AgentId>,
    },
    /// Acknowledge a reliable status update (one with a uuid).
    Acknowledge {
        /// The agent that sent the update.
        agent_id: AgentId,
        /// The task.
        task_id: TaskId,
        /// The update's uuid.
        uuid: String,
    },
    /// Ask for the latest state of tasks; empty `tasks` means all of the
    /// framework's tasks (implicit reconciliation).
    Reconcile {
        /// Tasks to reconcile.
        #[serde(default)]
        tasks: Vec<ReconcileTask>,
    },
    /// Send bytes to an executor. Best effort: not retransmitted.
    Message {
        /// The executor's agent.
        agent_id: AgentId,
        /// The executor.
        executor_id: ExecutorId,
        /// Payload.
        data: Bytes,
    },
    /// Hint what resources the framework wants; the allocator favours
    /// them in its next cycle.
    Request {
        /// What is wanted.
        requests: Vec<ResourceRequest>,
    },
    /// A call type this master does not know; answered with a non-fatal error.
    #[serde(other)]
    Unknown,
}

/// Keys of a scheduler call that no field of Agora's types has, found by
/// [`unknown_fields`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct UnknownFields {
    /// One outside the call's tasks (in its framework, filters, tasks to
    /// reconcile, resource requests), as a path from the call
    /// (`framework_info.capabilities`): the whole call is refused.
    pub call: Option<String>,
    /// Ones in tasks of a [`Call::Launch`]: each task's index in `tasks`
    /// and the first such key's path in the task
    /// (`executor.command.user`): those tasks are refused
    /// (`TASK_ERROR`), the others launched.
    pub tasks: Vec<(usize, String)>,
}

/// The keys of the scheduler call `text` (one frame, already decoded as a
/// [`Call`]) that no field of Agora's types has. Serde drops such keys
/// inside records (and they must stay tolerated where records travel in
/// events); a scheduler sending one asks for something Agora would not do,
/// so the master refuses it by name.
pub fn unknown_fields(text: &str) -> UnknownFields {
    let mut out = UnknownFields::default();
    let Ok(value) = serde_json::from_str::<serde_json::Value>(text) else {
        return out;
    };
    let list = |key: &str| -> &[serde_json::Value] {
        value
            .get(key)
            .and_then(|v| v.as_array())
            .map_or(&[], |v| v.as_slice())
    };
    match value.get("type").and_then(|t| t.as_str()) {
        Some("SUBSCRIBE") => {
            out.call = value
                .get("framework_info")
                .and_then(ignored::<FrameworkInfo>)
                .map(|path| format!("framework_info.{path}"));
        }
        Some("LAUNCH") => {
            out.call = value
                .get("filters")
                .and_then(ignored::<Filters>)
                .map(|path| format!("filters.{path}"));
            out.tasks = list("tasks")
                .iter()
                .enumerate()
                .filter_map(|(i, task)| ignored::<TaskInfo>(task).map(|path| (i, path)))
                .collect();
        }
        Some("DECLINE") => {
            out.call = value
                .get("filters")
                .and_then(ignored::<Filters>)
                .map(|path| format!("filters.{path}"));
        }
        Some("RECONCILE") => {
            out.call = list("tasks").iter().enumerate().find_map(|(i, task)| {
                ignored::<ReconcileTask>(task).map(|path| format!("tasks.{i}.{path}"))
            });
        }
        Some("REQUEST") => {
            out.call = list("requests")
                .iter()
                .enumerate()
                .find_map(|(i, request)| {
                    ignored::<ResourceRequest>(request).map(|path| format!("requests.{i}.{path}"))
                });
        }
        _ => {}
    }
    out
}

/// The path of the first key of `value` that `T` has no field for.
fn ignored<T: serde::de::DeserializeOwned>(value: &serde_json::Value) -> Option<String> {
    let mut first = None;
    let _ = serde_ignored::deserialize::<_, _, T>(value, |path| {
        first.get_or_insert_with(|| {
            let mut segments = Vec::new();
            path_segments(&path, &mut segments);
            segments.join(".")
        });
    });
    first
}

/// A path's keys and indices from the root (options and newtypes, which
/// are not keys on the wire, left out).
fn path_segments(path: &serde_ignored::Path<'_>, out: &mut Vec<String>) {
    use serde_ignored::Path;
    match path {
        Path::Root => {}
        Path::Seq { parent, index } => {
            path_segments(parent, out);
            out.push(index.to_string());
        }
        Path::Map { parent, key } => {
            path_segments(parent, out);
            out.push(key.clone());
        }
        Path::Some { parent }
        | Path::NewtypeStruct { parent }
        | Path::NewtypeVariant { parent } => path_segments(parent, out),
    }
}

/// A task named in [`Call::Reconcile`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ReconcileTask {
    /// The task.
    pub task_id: TaskId,
    /// Its agent, when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent_id: Option<AgentId>,
}

/// One entry of [`Call::Request`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ResourceRequest {
    /// A particular agent, or any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent_id: Option<AgentId>,
    /// The resources wanted.
    pub resources: Resources,
}

/// Master → scheduler.
// Messages are built once and moved into a frame; boxing the large
// variants would only add allocations.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "SCREAMING_SNAKE_CASE")]
pub enum Event {
    /// Subscription accepted.
    Subscribed {
        /// The framework's id (new or the one re-registered).
        framework_id: FrameworkId,
        /// The master sends [`Event::Heartbeat`] this often.
        heartbeat_interval_seconds: f64,
        /// Who is serving.
        master_info: MasterInfo,
        /// Whether this was a re-registration of a known framework.
        #[serde(default)]
        reregistered: bool,
    },
    /// New offers.
    Offers {
        /// The offers.
        offers: Vec<Offer>,
    },
    /// An offer is no longer valid (timed out, agent removed, ...).
    Rescind {
        /// The offer.
        offer_id: OfferId,
    },
    /// A task status update. Acknowledge it when `status.uuid` is set.
    Update {
        /// The status.
        status: TaskStatus,
    },
    /// Bytes from an executor. Best effort.
    Message {
        /// The executor's agent.
        agent_id: AgentId,
        /// The executor.
        executor_id: ExecutorId,
        /// Payload.
        data: Bytes,
    },
    /// An agent was removed (`executor_id` absent) or an executor exited.
    Failure {
        /// The agent.
        agent_id: AgentId,
        /// The executor that exited, if this is about one.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        executor_id: Option<ExecutorId>,
        /// The executor's exit status (wait status), when known.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        status: Option<i32>,
    },
    /// An error. `fatal` errors end the subscription (the framework was
    /// removed, or the subscription was refused); others report a call the
    /// master could not act on.
    Error {
        /// What went wrong.
        message: String,
        /// Whether the master is done with this framework.
        #[serde(default)]
        fatal: bool,
    },
    /// Keep-alive.
    Heartbeat,
    /// An event type this driver does not know.
    #[serde(other)]
    Unknown,
}
