//! The agent's core as the whole-cluster simulation (`agora-sim`) drives
//! it: feature `sim`. Nothing here runs in an agent process; it exposes
//! the sans-IO core ([`crate::core`]) with its inputs and actions, the
//! pieces of the checkpoint a simulated disk needs, and read-only views for
//! the simulation's invariants.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;

use agora_proto::{ExecutorId, FrameworkId, TaskId, TaskInfo, TaskState};
use tokio::time::Instant;

pub use crate::checkpoint::Op;
use crate::config::Config;
use crate::core::Core;
pub use crate::messages::{Action, Durable, ExecKey, Input, Request, Started, Stop, Timer};
use crate::shared::Shared;
pub use crate::wal::{StreamState, Streams, WalRecord};

/// An agent core for the simulation.
pub struct SimAgent {
    core: Core,
}

/// What the agent's core says about one of its tasks.
#[derive(Debug, Clone, PartialEq)]
pub struct AgentTask {
    pub framework_id: FrameworkId,
    pub task_id: TaskId,
    /// The executor process that runs it.
    pub executor_id: ExecutorId,
    pub state: TaskState,
    /// Updates of its stream not yet acknowledged by the master.
    pub pending_updates: usize,
}

// === impl SimAgent ===

impl SimAgent {
    /// A fresh agent core (nothing recovered) drawing ids from `seed`.
    pub fn new(config: Config, seed: u64, now: Instant, wall: f64) -> Self {
        let listen: SocketAddr = ([10, 0, 0, 1], 5051).into();
        let shared = Shared {
            executor_endpoint: format!("ws://{listen}/api/executor"),
            listen,
            config: Arc::new(config),
            next_conn: Arc::new(AtomicU64::new(1)),
            counters: Arc::default(),
            identity: Arc::new(crate::identity::ExecutorIdentity::new(
                &seed.to_le_bytes().repeat(4),
            )),
            client_tls: None,
            delegates_cgroups: false,
        };
        SimAgent {
            core: Core::new(shared, seed, now, wall),
        }
    }

    /// Takes in what a restarted agent finds in `work_dir` (its files,
    /// as the simulated disk kept them) and `streams` (its status update
    /// log, likewise). `alive` names the executor runs still running.
    pub fn recover(
        &mut self,
        work_dir: &Path,
        streams: Vec<StreamState>,
        alive: impl Fn(&str) -> bool,
        now: Instant,
        wall: f64,
    ) {
        let mut recovered = crate::core::Recovered::load(work_dir, streams);
        // The simulation's processes, not this machine's /proc, say what
        // runs.
        recovered.alive = recovered
            .frameworks
            .iter()
            .flat_map(|f| &f.executors)
            .filter_map(|e| e.record.as_ref())
            .filter(|r| r.pid.is_some() && alive(&r.run_id))
            .map(|r| r.run_id.clone())
            .collect();
        self.core.recover(recovered, now, wall);
    }

    /// Handles one input; `Some` when the agent stops (refused by the
    /// master).
    pub fn handle(&mut self, input: Input, now: Instant, wall: f64) -> Option<Stop> {
        self.core.handle(input, now, wall)
    }

    /// Re-sends the status updates due by `now`.
    pub fn tick(&mut self, now: Instant, wall: f64) {
        self.core.tick(now, wall);
    }

    /// When [`SimAgent::tick`] has something to do next.
    pub fn next_deadline(&self) -> Option<Instant> {
        self.core.next_deadline()
    }

    /// What the inputs so far ask for.
    pub fn take_actions(&mut self) -> Vec<Action> {
        self.core.take_actions()
    }

    /// The agent's tasks.
    pub fn tasks(&self) -> Vec<AgentTask> {
        self.core
            .task_views()
            .into_iter()
            .map(
                |(framework_id, task_id, executor_id, state, pending_updates)| AgentTask {
                    framework_id,
                    task_id,
                    executor_id,
                    state,
                    pending_updates,
                },
            )
            .collect()
    }

    /// The `TaskInfo` the agent holds for a task (the launch it was given
    /// last and has not forgotten), if any.
    pub fn task_info(&self, framework_id: &FrameworkId, task_id: &TaskId) -> Option<&TaskInfo> {
        self.core.task_info(framework_id, task_id)
    }
}

/// The bytes `records` take in the status update log (as the checkpoint
/// writer appends them).
pub fn wal_encode(records: &[WalRecord]) -> Vec<u8> {
    crate::wal::encode(records)
        .unwrap_or_else(|e| panic!("a log record that cannot be encoded: {e}"))
}

/// The streams a restarted agent reads back from its log's bytes (as the
/// disk kept them: a torn or damaged tail is possible), up to the first
/// bad record: it and everything after it are dropped.
pub fn wal_decode(bytes: &[u8]) -> Vec<StreamState> {
    crate::wal::decode(bytes, "simulated log")
        .streams
        .states()
        .cloned()
        .collect()
}

#[cfg(test)]
mod tests {
    use agora_proto::{ExecutorId, Source, TaskStatus};

    use super::*;

    fn update(task: &str, uuid: &str) -> WalRecord {
        let mut status = TaskStatus::new(
            TaskId::new(task),
            TaskState::Running,
            Source::SourceExecutor,
        );
        status.uuid = Some(uuid.into());
        WalRecord::Update {
            framework_id: FrameworkId::new("f"),
            executor_id: ExecutorId::new("e"),
            status,
        }
    }

    fn pending(streams: &[StreamState], task: &str) -> Vec<String> {
        streams
            .iter()
            .filter(|s| s.task_id.as_str() == task)
            .flat_map(|s| s.pending.iter().filter_map(|u| u.uuid.clone()))
            .collect()
    }

    /// The simulated disk reads back as the agent's does: up to the first
    /// bad record, nothing after it.
    #[test]
    fn wal_decode_stops_at_the_first_bad_record() {
        let records = [update("t", "u1"), update("t", "u2"), update("b", "b1")];
        let bytes = wal_encode(&records);
        assert_eq!(pending(&wal_decode(&bytes), "t"), ["u1", "u2"]);

        let second = bytes.iter().position(|b| *b == b'\n').unwrap() + 1;
        let mut damaged = bytes.clone();
        damaged[second + 3] ^= 0x20;
        let streams = wal_decode(&damaged);
        assert_eq!(pending(&streams, "t"), ["u1"]);
        assert!(pending(&streams, "b").is_empty(), "a later record applied");

        let torn = wal_decode(&bytes[..bytes.len() - 1]);
        assert_eq!(pending(&torn, "t"), ["u1", "u2"]);
        assert!(pending(&torn, "b").is_empty());
    }
}
