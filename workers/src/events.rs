//! What a runtime hears from the worker driver: [`WorkerHandle`]s,
//! [`TerminationCause`]s and the [`WorkerEventHandler`] callbacks, with
//! the ordering guarantees the driver keeps.

use std::collections::BTreeMap;
use std::fmt;

use agora_proto::{AgentId, Reason, TaskState, TaskStatus};
use serde::{Deserialize, Serialize};

use crate::placement::Locality;

/// A worker's id; also the id of the task that runs it.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(transparent)]
pub struct WorkerId(pub String);

/// A worker the driver started: where it runs and how well it was placed.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WorkerHandle {
    /// The worker (and task) id.
    pub id: WorkerId,
    /// The spec name it was requested with.
    pub spec_name: String,
    /// The agent it runs on.
    pub agent_id: AgentId,
    /// The agent's host name.
    pub hostname: String,
    /// The agent's rack, when it has the rack attribute.
    #[serde(default)]
    pub rack: Option<String>,
    /// The locality the placement achieved.
    pub locality: Locality,
    /// The driver attempt (1, 2, … across runtime restarts) that launched it.
    pub attempt: u64,
    /// Named ports it was given.
    #[serde(default)]
    pub ports: BTreeMap<String, u64>,
}

/// Why a worker ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "cause")]
pub enum TerminationCause {
    /// Its command exited by itself with this code (0: finished).
    Exited {
        /// The exit code.
        code: i32,
    },
    /// It failed otherwise (killed by a signal, killed by someone else,
    /// its executor died).
    Failed,
    /// It was killed because the runtime released it.
    Killed,
    /// Its agent was lost.
    AgentLost,
    /// It could not be launched (invalid or vanished offer, executor
    /// launch failure).
    LaunchFailed,
    /// Reconciliation found the master does not know it (its launch or
    /// its updates were lost).
    LostAfterReconciliation,
}

/// The driver's connection to the master.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ConnectionState {
    /// Registered for the first time in this attempt.
    Connected,
    /// The connection dropped; the driver is reconnecting. Workers keep
    /// running; pending requests stay pending.
    Disconnected,
    /// Registered again after a drop (possibly with a restarted master).
    Reconnected,
}

/// A fatal error: the driver has stopped (in failover mode: its workers
/// keep running) and will do nothing more.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FatalError {
    /// The worker store could not be read or written.
    #[error("worker store: {0}")]
    Store(String),
    /// The master refused or removed the framework, or another scheduler
    /// took it over (a newer leader).
    #[error("the master ended this framework's subscription: {0}")]
    Framework(String),
}

/// The callbacks of a worker driver. They run one at a time on the
/// driver's own thread, in the order the driver decided them, and must
/// not block (hand work to another task).
///
/// Guarantees (Flink's `ResourceManagerDriver` contract, kept and tested):
/// - [`on_previous_attempt_workers_recovered`](Self::on_previous_attempt_workers_recovered)
///   comes exactly once, before any new request is served;
/// - a request's future completes after the worker's intent is durable
///   and before its task is sent to the master, so before the worker
///   process can start and register with the runtime;
/// - no [`on_worker_terminated`](Self::on_worker_terminated) precedes the
///   successful completion of that worker's future, and later failures
///   come only through it;
/// - exactly one `on_worker_terminated` per worker, although the master
///   delivers status updates at least once.
#[allow(unused_variables)]
pub trait WorkerEventHandler: Send + Sync + 'static {
    /// Workers launched by earlier attempts (of this process or a previous
    /// leader) that are still recorded as launched.
    fn on_previous_attempt_workers_recovered(&self, workers: Vec<WorkerHandle>) {}

    /// A worker's task reported `TASK_RUNNING` (first time only).
    fn on_worker_running(&self, worker: &WorkerHandle) {}

    /// A worker ended.
    fn on_worker_terminated(&self, id: &WorkerId, cause: TerminationCause, diagnostics: &str) {}

    /// The connection to the master changed.
    fn on_connection(&self, state: ConnectionState) {}

    /// The driver stopped on an error it cannot recover from.
    fn on_error(&self, error: &FatalError) {}
}

// === impl WorkerId ===

impl WorkerId {
    /// Wraps a string.
    pub fn new(id: impl Into<String>) -> Self {
        WorkerId(id.into())
    }

    /// The id as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for WorkerId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

// === impl TerminationCause ===

impl TerminationCause {
    /// The cause a terminal status stands for; `released` says whether
    /// the runtime had released the worker.
    pub(crate) fn of(status: &TaskStatus, released: bool) -> TerminationCause {
        let reason = status.reason;
        match status.state {
            _ if released => TerminationCause::Killed,
            TaskState::Finished => TerminationCause::Exited { code: 0 },
            TaskState::Failed => match exit_code(status.message.as_deref()) {
                Some(code) => TerminationCause::Exited { code },
                None if reason == Some(Reason::ReasonExecutorLaunchFailed) => {
                    TerminationCause::LaunchFailed
                }
                None => TerminationCause::Failed,
            },
            TaskState::Error | TaskState::Dropped => TerminationCause::LaunchFailed,
            TaskState::Gone => TerminationCause::AgentLost,
            TaskState::Lost | TaskState::Unknown => match reason {
                Some(Reason::ReasonReconciliation) => TerminationCause::LostAfterReconciliation,
                Some(
                    Reason::ReasonAgentRemoved
                    | Reason::ReasonAgentRestarted
                    | Reason::ReasonAgentUnknown
                    | Reason::ReasonAgentDisconnected,
                ) => TerminationCause::AgentLost,
                Some(Reason::ReasonExecutorLaunchFailed | Reason::ReasonInvalidOffers) => {
                    TerminationCause::LaunchFailed
                }
                _ => TerminationCause::Failed,
            },
            _ => TerminationCause::Failed,
        }
    }

    /// A short name: `exited(1)`, `agent_lost`, ….
    pub fn name(&self) -> String {
        match self {
            TerminationCause::Exited { code } => format!("exited({code})"),
            TerminationCause::Failed => "failed".into(),
            TerminationCause::Killed => "killed".into(),
            TerminationCause::AgentLost => "agent_lost".into(),
            TerminationCause::LaunchFailed => "launch_failed".into(),
            TerminationCause::LostAfterReconciliation => "lost_after_reconciliation".into(),
        }
    }
}

impl fmt::Display for TerminationCause {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.name())
    }
}

/// The code in the command executor's "command exited with status N".
fn exit_code(message: Option<&str>) -> Option<i32> {
    let rest = message?.split("exited with status ").nth(1)?;
    let digits: String = rest
        .chars()
        .take_while(|c| c.is_ascii_digit() || *c == '-')
        .collect();
    digits.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use agora_proto::{Source, TaskId};

    fn status(state: TaskState, reason: Option<Reason>, message: Option<&str>) -> TaskStatus {
        let mut s = TaskStatus::new(TaskId::new("t"), state, Source::SourceMaster);
        s.reason = reason;
        s.message = message.map(String::from);
        s
    }

    #[test]
    fn terminal_states_map_to_causes() {
        let of = |s: TaskStatus| TerminationCause::of(&s, false);
        assert_eq!(
            of(status(TaskState::Finished, None, None)),
            TerminationCause::Exited { code: 0 }
        );
        assert_eq!(
            of(status(
                TaskState::Failed,
                Some(Reason::ReasonCommandExecutorFailed),
                Some("command exited with status 3")
            )),
            TerminationCause::Exited { code: 3 }
        );
        assert_eq!(
            of(status(TaskState::Failed, None, Some("killed by signal 9"))),
            TerminationCause::Failed
        );
        assert_eq!(
            of(status(
                TaskState::Lost,
                Some(Reason::ReasonAgentRemoved),
                None
            )),
            TerminationCause::AgentLost
        );
        assert_eq!(
            of(status(
                TaskState::Lost,
                Some(Reason::ReasonReconciliation),
                Some("unknown task")
            )),
            TerminationCause::LostAfterReconciliation
        );
        assert_eq!(
            of(status(TaskState::Dropped, None, None)),
            TerminationCause::LaunchFailed
        );
        assert_eq!(
            TerminationCause::of(&status(TaskState::Killed, None, None), true),
            TerminationCause::Killed
        );
        assert_eq!(
            TerminationCause::of(&status(TaskState::Failed, None, None), true),
            TerminationCause::Killed,
            "a released worker ends as killed whatever its last words"
        );
    }
}
