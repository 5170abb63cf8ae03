//! The durable worker store: the driver's write-ahead record of its
//! framework id, its attempt counter and each worker's intent, so that a
//! restarted runtime or a new leader knows what the last one did.
//!
//! A worker's state moves only forward: [`WorkerState::New`] (requested;
//! written before anything is asked of the master) → [`WorkerState::Launched`]
//! (written before the task is sent) → [`WorkerState::Released`] (written
//! before the kill); the record is removed once the worker has terminated.
//! On recovery New records are dropped (no task was ever sent for them),
//! Launched ones are reconciled and reported as recovered, and Released
//! ones are killed again.
//!
//! Two stores: [`FileStore`] (a local append-only file, one process at a
//! time) and, with the `etcd` feature, `EtcdStore` (keys in etcd, every
//! write fenced on the leader's epoch). [`MemoryStore`] keeps nothing
//! across restarts, for runtimes that need no recovery.

#[cfg(feature = "etcd")]
mod etcd;
mod file;

use std::collections::BTreeMap;

use agora_proto::{AgentId, FrameworkId};
use serde::{Deserialize, Serialize};

use crate::events::{WorkerHandle, WorkerId};
use crate::placement::Locality;

#[cfg(feature = "etcd")]
pub use etcd::EtcdStore;
pub use file::FileStore;

/// Where a worker's intent stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum WorkerState {
    /// Requested, not launched.
    New,
    /// Its task was sent to the master.
    Launched,
    /// Released: to be killed.
    Released,
}

/// One worker as stored.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WorkerRecord {
    /// The worker.
    pub id: WorkerId,
    /// Its intent.
    pub state: WorkerState,
    /// The spec name it was requested with.
    pub spec_name: String,
    /// Where it was launched (Launched and Released only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub placed: Option<Placed>,
}

/// Where a launched worker runs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Placed {
    /// The agent.
    pub agent_id: AgentId,
    /// Its host name.
    pub hostname: String,
    /// Its rack.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rack: Option<String>,
    /// The locality achieved.
    pub locality: Locality,
    /// The attempt that launched it.
    pub attempt: u64,
    /// Named ports.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub ports: BTreeMap<String, u64>,
}

/// Everything a store holds.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct StoreState {
    /// The framework id, once the master assigned one.
    #[serde(default)]
    pub framework_id: Option<FrameworkId>,
    /// The last attempt number used (0: never started).
    #[serde(default)]
    pub attempt: u64,
    /// The workers.
    #[serde(default)]
    pub workers: BTreeMap<WorkerId, WorkerRecord>,
}

/// One change to the store.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum StoreOp {
    /// Records the framework id.
    SetFrameworkId {
        /// The id.
        framework_id: FrameworkId,
    },
    /// Records the attempt number.
    SetAttempt {
        /// The attempt.
        attempt: u64,
    },
    /// Adds or replaces a worker.
    Put {
        /// The record.
        record: WorkerRecord,
    },
    /// Removes a worker.
    Remove {
        /// The worker.
        id: WorkerId,
    },
    /// Removes everything (after deregistration).
    Clear,
}

/// Why the store failed.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// Reading or writing the file failed.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: String,
        /// Why.
        source: std::io::Error,
    },
    /// The stored data cannot be read.
    #[error("{0}: the stored worker state is corrupt")]
    Corrupt(String),
    /// Another process holds the file store.
    #[error("{0} is in use by another process (one runtime per store)")]
    Locked(String),
    /// etcd refused or failed the write.
    #[error("etcd: {0}")]
    Etcd(String),
    /// The write was refused: this process no longer holds the leader
    /// epoch it was opened with (a newer leader exists).
    #[error("the write was fenced off: epoch {0} is no longer the leader's")]
    Fenced(i64),
}

/// A durable store of worker intent. Writes are batches: the driver
/// writes every change of one step in one [`WorkerStore::apply`], and
/// acts only once it returned `Ok`.
pub trait WorkerStore: Send + 'static {
    /// Reads everything stored.
    fn load(&mut self) -> Result<StoreState, StoreError>;
    /// Applies `ops` durably, in order, all or nothing where the backend allows.
    fn apply(&mut self, ops: &[StoreOp]) -> Result<(), StoreError>;
}

/// A store that forgets everything when the process ends.
#[derive(Debug, Default)]
pub struct MemoryStore {
    state: StoreState,
}

// === impl StoreState ===

impl StoreState {
    /// Applies one change.
    pub fn apply(&mut self, op: &StoreOp) {
        match op {
            StoreOp::SetFrameworkId { framework_id } => {
                self.framework_id = Some(framework_id.clone())
            }
            StoreOp::SetAttempt { attempt } => self.attempt = *attempt,
            StoreOp::Put { record } => {
                self.workers.insert(record.id.clone(), record.clone());
            }
            StoreOp::Remove { id } => {
                self.workers.remove(id);
            }
            StoreOp::Clear => *self = StoreState::default(),
        }
    }
}

// === impl WorkerRecord ===

impl WorkerRecord {
    /// The handle of a launched (or released) worker.
    pub fn handle(&self) -> Option<WorkerHandle> {
        let placed = self.placed.as_ref()?;
        Some(WorkerHandle {
            id: self.id.clone(),
            spec_name: self.spec_name.clone(),
            agent_id: placed.agent_id.clone(),
            hostname: placed.hostname.clone(),
            rack: placed.rack.clone(),
            locality: placed.locality,
            attempt: placed.attempt,
            ports: placed.ports.clone(),
        })
    }
}

// === impl MemoryStore ===

impl WorkerStore for MemoryStore {
    fn load(&mut self) -> Result<StoreState, StoreError> {
        Ok(self.state.clone())
    }

    fn apply(&mut self, ops: &[StoreOp]) -> Result<(), StoreError> {
        for op in ops {
            self.state.apply(op);
        }
        Ok(())
    }
}
