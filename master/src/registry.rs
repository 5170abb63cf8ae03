//! The registry: what the master must not forget across a restart.
//!
//! The state machine records every change to the registered state as a
//! [`RegistryOp`] (an agent admitted or removed, a framework subscribed,
//! disconnected or torn down). The state task applies the ops of a batch
//! to a [`Registry`] *before* it delivers the batch's outputs, so no peer
//! ever hears of a change that could be forgotten: an agent learns its id
//! only after its record is durable, a removed agent is told `SHUTDOWN`
//! only after its removal is. One write (one fsync) covers a whole batch.
//!
//! Only what cannot be learnt again is kept: admitted agents (id and
//! [`AgentInfo`], with its resources), registered frameworks (their
//! [`FrameworkInfo`], with the failover timeout, and the wall time they
//! disconnected) and the ids of removed agents and frameworks, so those
//! cannot silently come back. Tasks and executors are not kept: agents
//! report them when they re-register and the master rebuilds them from
//! those reports, as in Mesos.
//!
//! [`FileRegistry`] is the embedded default, in the master's `--work-dir`:
//! a JSON snapshot replaced atomically (write, fsync, rename, fsync the
//! directory) plus an append-only log of ops, one JSON line each, fsynced
//! per batch and folded into a new snapshot when it grows long. The etcd
//! registry of high-availability mode (`ha::EtcdRegistry`) stores the same
//! state one key per record; [`etcd_transactions`] plans its writes.

use std::collections::{BTreeMap, VecDeque};
use std::fs::{File, OpenOptions};
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};

use agora_proto::{AgentId, AgentInfo, FrameworkId, FrameworkInfo};
use serde::{Deserialize, Serialize};

// Used by the etcd registry and the simulation; plain code, so both plan
// the same writes whatever the features.
#[cfg_attr(not(any(feature = "etcd", feature = "sim")), allow(dead_code))]
mod etcd_plan;

#[cfg(feature = "etcd")]
pub(crate) use etcd_plan::removed_order;
#[cfg_attr(not(feature = "sim"), allow(unused_imports))]
pub use etcd_plan::{etcd_transactions, KeyWrite, OPS_PER_TXN};

/// Log lines after which the log is folded into a new snapshot.
const COMPACT_AFTER_OPS: usize = 4096;

/// Format version written in snapshots; a newer one is refused.
const SNAPSHOT_VERSION: u32 = 1;

/// Why the registry could not be read or written.
#[derive(Debug, thiserror::Error)]
pub enum RegistryError {
    /// A file of the registry could not be read or written.
    #[error("registry file {path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// A registry file holds something this master cannot read; it is
    /// left untouched so an operator can inspect it.
    #[error("registry file {path} is corrupt: {message}")]
    Corrupt {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        message: String,
    },
    /// A record could not be encoded for storage.
    #[error("cannot encode a registry record: {0}")]
    Encode(String),
    /// The registry in etcd could not be read or written.
    #[cfg(feature = "etcd")]
    #[error("etcd registry: {0}")]
    Etcd(String),
    /// This master is no longer the leader: its write was fenced off.
    #[cfg(feature = "etcd")]
    #[error("not the leader: {0}")]
    NotLeader(String),
}

/// An agent the master admitted.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AgentRecord {
    pub id: AgentId,
    /// As registered (hostname, address, resources, attributes), `id` set.
    pub(crate) info: AgentInfo,
}

/// A framework that subscribed to the master.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FrameworkRecord {
    pub id: FrameworkId,
    /// As last subscribed (with `failover_timeout`), `id` set.
    pub(crate) info: FrameworkInfo,
    /// Unix time (seconds) its scheduler disconnected; `None` while it
    /// was connected.
    #[serde(default)]
    pub(crate) disconnected_at: Option<f64>,
}

/// One change to the registered state.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum RegistryOp {
    /// An agent was admitted, or re-registered with different info.
    PutAgent(AgentRecord),
    /// An agent was removed: it is forgotten and refused from now on.
    RemoveAgent { id: AgentId },
    /// A framework subscribed, re-subscribed or disconnected.
    PutFramework(FrameworkRecord),
    /// A framework was torn down: forgotten and refused from now on.
    RemoveFramework { id: FrameworkId },
}

/// Everything the registry holds.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct RegistryState {
    pub(crate) agents: BTreeMap<AgentId, AgentRecord>,
    pub(crate) frameworks: BTreeMap<FrameworkId, FrameworkRecord>,
    /// Oldest first; bounded by the master's `max_removed_agents`.
    pub(crate) removed_agents: VecDeque<AgentId>,
    /// Oldest first; bounded like `removed_agents`.
    pub(crate) removed_frameworks: VecDeque<FrameworkId>,
}

/// Durable storage for the registered state. `apply` returns only once
/// the ops are durable; the state task delivers nothing that depends on
/// them before.
pub(crate) trait Registry: Send {
    /// What is stored (as loaded at open, plus everything applied since).
    fn state(&self) -> &RegistryState;
    /// Makes `ops` durable, in order, as one write.
    fn apply(&mut self, ops: &[RegistryOp]) -> Result<(), RegistryError>;
}

/// The registry in a directory of the local file system.
#[derive(Debug)]
pub(crate) struct FileRegistry {
    dir: PathBuf,
    state: RegistryState,
    removed_capacity: usize,
    log: File,
    log_ops: usize,
}

#[derive(Serialize, Deserialize)]
struct Snapshot {
    version: u32,
    #[serde(flatten)]
    state: RegistryState,
}

// === impl RegistryState ===

impl RegistryState {
    /// Applies one op; removed-id lists keep at most `removed_capacity`.
    pub fn apply(&mut self, op: &RegistryOp, removed_capacity: usize) {
        match op {
            RegistryOp::PutAgent(record) => {
                self.agents.insert(record.id.clone(), record.clone());
            }
            RegistryOp::RemoveAgent { id } => {
                self.agents.remove(id);
                push_bounded(&mut self.removed_agents, id.clone(), removed_capacity);
            }
            RegistryOp::PutFramework(record) => {
                self.frameworks.insert(record.id.clone(), record.clone());
            }
            RegistryOp::RemoveFramework { id } => {
                self.frameworks.remove(id);
                push_bounded(&mut self.removed_frameworks, id.clone(), removed_capacity);
            }
        }
    }
}

// The master removes an id once (it must be known to be removed), so the
// lists need no duplicate check.
fn push_bounded<T>(list: &mut VecDeque<T>, item: T, capacity: usize) {
    if capacity == 0 {
        return;
    }
    while list.len() >= capacity {
        list.pop_front();
    }
    list.push_back(item);
}

// === impl FileRegistry ===

impl FileRegistry {
    /// Opens (creating when absent) the registry in `dir` and loads it:
    /// the snapshot, then the log replayed over it. A torn last log line
    /// (a crash in the middle of a write that was never acknowledged) is
    /// dropped; anything else unreadable is an error.
    pub(crate) fn open(dir: &Path, removed_capacity: usize) -> Result<Self, RegistryError> {
        let io = |path: &Path| {
            let path = path.to_path_buf();
            move |source| RegistryError::Io { path, source }
        };
        std::fs::create_dir_all(dir).map_err(io(dir))?;
        let snapshot_path = dir.join("snapshot.json");
        let mut state = match std::fs::read(&snapshot_path) {
            Ok(bytes) => {
                let snapshot: Snapshot =
                    serde_json::from_slice(&bytes).map_err(|e| RegistryError::Corrupt {
                        path: snapshot_path.clone(),
                        message: e.to_string(),
                    })?;
                if snapshot.version > SNAPSHOT_VERSION {
                    return Err(RegistryError::Corrupt {
                        path: snapshot_path,
                        message: format!(
                            "format version {} is newer than this master's {SNAPSHOT_VERSION}",
                            snapshot.version
                        ),
                    });
                }
                snapshot.state
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => RegistryState::default(),
            Err(e) => return Err(io(&snapshot_path)(e)),
        };
        let log_path = dir.join("log.jsonl");
        let mut log_ops = 0;
        let mut valid_len = 0u64;
        match File::open(&log_path) {
            Ok(file) => {
                let mut lines = BufReader::new(file).split(b'\n').peekable();
                while let Some(line) = lines.next() {
                    let line = line.map_err(io(&log_path))?;
                    let last = lines.peek().is_none();
                    match serde_json::from_slice::<RegistryOp>(&line) {
                        Ok(op) => {
                            state.apply(&op, removed_capacity);
                            log_ops += 1;
                            valid_len += line.len() as u64 + 1;
                        }
                        Err(_) if last => {
                            tracing::warn!(path = %log_path.display(), "dropping a torn last registry log line");
                        }
                        Err(e) => {
                            return Err(RegistryError::Corrupt {
                                path: log_path,
                                message: format!("line {}: {e}", log_ops + 1),
                            })
                        }
                    }
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(io(&log_path)(e)),
        }
        let log = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log_path)
            .map_err(io(&log_path))?;
        // Cut a torn tail off so the next append starts on a clean line.
        if log.metadata().map_err(io(&log_path))?.len() > valid_len {
            log.set_len(valid_len).map_err(io(&log_path))?;
        }
        let mut registry = FileRegistry {
            dir: dir.to_path_buf(),
            state,
            removed_capacity,
            log,
            log_ops,
        };
        if registry.log_ops >= COMPACT_AFTER_OPS {
            registry.compact()?;
        }
        Ok(registry)
    }

    /// Writes the whole state as a new snapshot and empties the log.
    fn compact(&mut self) -> Result<(), RegistryError> {
        let snapshot = Snapshot {
            version: SNAPSHOT_VERSION,
            state: self.state.clone(),
        };
        let bytes = serde_json::to_vec(&snapshot).map_err(|e| RegistryError::Corrupt {
            path: self.dir.join("snapshot.json"),
            message: format!("cannot encode: {e}"),
        })?;
        let tmp = self.dir.join("snapshot.json.tmp");
        let path = self.dir.join("snapshot.json");
        let io = |path: &Path| {
            let path = path.to_path_buf();
            move |source| RegistryError::Io { path, source }
        };
        let mut file = File::create(&tmp).map_err(io(&tmp))?;
        file.write_all(&bytes).map_err(io(&tmp))?;
        file.sync_all().map_err(io(&tmp))?;
        std::fs::rename(&tmp, &path).map_err(io(&path))?;
        sync_dir(&self.dir)?;
        // The snapshot now holds everything the log did: a crash from here
        // on replays (idempotent) ops over it at worst.
        self.log
            .set_len(0)
            .map_err(io(&self.dir.join("log.jsonl")))?;
        self.log
            .sync_all()
            .map_err(io(&self.dir.join("log.jsonl")))?;
        self.log_ops = 0;
        Ok(())
    }
}

fn sync_dir(dir: &Path) -> Result<(), RegistryError> {
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|source| RegistryError::Io {
            path: dir.to_path_buf(),
            source,
        })
}

impl Registry for FileRegistry {
    fn state(&self) -> &RegistryState {
        &self.state
    }

    fn apply(&mut self, ops: &[RegistryOp]) -> Result<(), RegistryError> {
        if ops.is_empty() {
            return Ok(());
        }
        let log_path = self.dir.join("log.jsonl");
        let mut buf = Vec::new();
        for op in ops {
            serde_json::to_writer(&mut buf, op).map_err(|e| RegistryError::Corrupt {
                path: log_path.clone(),
                message: format!("cannot encode: {e}"),
            })?;
            buf.push(b'\n');
        }
        let io = |source| RegistryError::Io {
            path: log_path.clone(),
            source,
        };
        self.log.write_all(&buf).map_err(io)?;
        self.log.sync_data().map_err(io)?;
        for op in ops {
            self.state.apply(op, self.removed_capacity);
        }
        self.log_ops += ops.len();
        if self.log_ops >= COMPACT_AFTER_OPS {
            self.compact()?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn agent(id: &str) -> AgentRecord {
        AgentRecord {
            id: AgentId::new(id),
            info: AgentInfo {
                id: Some(AgentId::new(id)),
                hostname: "h".into(),
                address: "127.0.0.1:1".into(),
                resources: agora_proto::Resources::parse("cpus:2;mem:1024").unwrap(),
                attributes: Default::default(),
            },
        }
    }

    fn framework(id: &str, disconnected_at: Option<f64>) -> FrameworkRecord {
        let mut info = FrameworkInfo::new("fw");
        info.id = Some(FrameworkId::new(id));
        info.failover_timeout = 30.0;
        FrameworkRecord {
            id: FrameworkId::new(id),
            info,
            disconnected_at,
        }
    }

    #[test]
    fn survives_reopen_with_log_and_snapshot() {
        let dir = tempfile::tempdir().unwrap();
        let mut reg = FileRegistry::open(dir.path(), 10).unwrap();
        reg.apply(&[
            RegistryOp::PutAgent(agent("a1")),
            RegistryOp::PutAgent(agent("a2")),
            RegistryOp::PutFramework(framework("f1", None)),
        ])
        .unwrap();
        reg.compact().unwrap();
        reg.apply(&[
            RegistryOp::RemoveAgent {
                id: AgentId::new("a1"),
            },
            RegistryOp::PutFramework(framework("f1", Some(12.5))),
            RegistryOp::PutFramework(framework("f2", None)),
            RegistryOp::RemoveFramework {
                id: FrameworkId::new("f2"),
            },
        ])
        .unwrap();
        let expected = reg.state().clone();
        drop(reg);
        let reg = FileRegistry::open(dir.path(), 10).unwrap();
        assert_eq!(reg.state(), &expected);
        assert_eq!(
            reg.state().agents.keys().collect::<Vec<_>>(),
            [&AgentId::new("a2")]
        );
        assert_eq!(reg.state().removed_agents, [AgentId::new("a1")]);
        assert_eq!(reg.state().removed_frameworks, [FrameworkId::new("f2")]);
        assert_eq!(
            reg.state().frameworks[&FrameworkId::new("f1")].disconnected_at,
            Some(12.5)
        );
    }

    #[test]
    fn torn_last_line_is_dropped_and_cut() {
        let dir = tempfile::tempdir().unwrap();
        let mut reg = FileRegistry::open(dir.path(), 10).unwrap();
        reg.apply(&[RegistryOp::PutAgent(agent("a1"))]).unwrap();
        drop(reg);
        let log = dir.path().join("log.jsonl");
        let mut f = OpenOptions::new().append(true).open(&log).unwrap();
        f.write_all(br#"{"op":"put_agent","id":"#).unwrap();
        drop(f);
        let mut reg = FileRegistry::open(dir.path(), 10).unwrap();
        assert_eq!(reg.state().agents.len(), 1);
        reg.apply(&[RegistryOp::PutAgent(agent("a2"))]).unwrap();
        drop(reg);
        let reg = FileRegistry::open(dir.path(), 10).unwrap();
        assert_eq!(reg.state().agents.len(), 2);
    }

    #[test]
    fn corrupt_middle_line_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join("log.jsonl"),
            "garbage\n{\"op\":\"remove_agent\",\"id\":\"a\"}\n",
        )
        .unwrap();
        let err = FileRegistry::open(dir.path(), 10).unwrap_err();
        assert!(matches!(err, RegistryError::Corrupt { .. }), "{err}");
    }

    #[test]
    fn long_log_is_compacted_and_removed_ids_are_bounded() {
        let dir = tempfile::tempdir().unwrap();
        let mut reg = FileRegistry::open(dir.path(), 3).unwrap();
        for i in 0..COMPACT_AFTER_OPS + 5 {
            reg.apply(&[RegistryOp::RemoveAgent {
                id: AgentId::new(format!("a{i}")),
            }])
            .unwrap();
        }
        assert!(reg.log_ops < COMPACT_AFTER_OPS);
        assert_eq!(reg.state().removed_agents.len(), 3);
        let expected = reg.state().clone();
        drop(reg);
        assert_eq!(
            FileRegistry::open(dir.path(), 3).unwrap().state(),
            &expected
        );
    }
}
