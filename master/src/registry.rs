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
//! per batch and folded into a new snapshot when it grows long. The log is
//! read back up to its first unreadable record, and cut there. The etcd
//! registry of high-availability mode (`ha::EtcdRegistry`) stores the same
//! state one key per record; [`etcd_transactions`] plans its writes.

use std::collections::{BTreeMap, VecDeque};
use std::fs::{File, OpenOptions};
use std::io::Write;
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
    /// The principal that registered it: only it may re-register the id.
    /// None: an unauthenticated agent (or a record written before
    /// principals were kept).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) principal: Option<String>,
    /// DEACTIVATE_AGENT (or a drain) holds it back from offers.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub(crate) deactivated: bool,
    /// DRAIN_AGENT's configuration and whether it is DRAINED.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) drain: Option<crate::drain::DrainRecord>,
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
    /// The epoch of its launch stamps (see [`agora_proto::LaunchStamp`]):
    /// raised each time its scheduler subscribes.
    #[serde(default)]
    pub(crate) launch_epoch: u64,
}

/// A role's quota as an operator last set it (`UPDATE_QUOTA`); a record
/// with no guarantees and no limits is a quota removed (which a start-up
/// `--quotas` value does not bring back).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct QuotaRecord {
    pub role: String,
    #[serde(default)]
    pub guarantees: agora_proto::Resources,
    /// `None`: no limits.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limits: Option<crate::allocator::Limits>,
}

/// A role's weight as an operator last set it (`UPDATE_WEIGHTS`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WeightRecord {
    pub role: String,
    pub weight: f64,
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
    /// An operator set a role's quota.
    PutQuota(QuotaRecord),
    /// An operator set a role's weight.
    PutWeight(WeightRecord),
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
    /// Quotas set at run time, by role; they replace the start-up ones.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub(crate) quotas: BTreeMap<String, QuotaRecord>,
    /// Weights set at run time, by role; they replace the start-up ones.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub(crate) weights: BTreeMap<String, f64>,
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
    truncation: Option<LogTruncation>,
}

/// Where [`FileRegistry::open`] cut its log, and what it dropped.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct LogTruncation {
    /// Byte offset of the first unreadable record.
    pub offset: u64,
    /// Bytes dropped (from `offset` to the end).
    pub bytes: u64,
    /// Records dropped: the unreadable one and every one after it.
    pub records: u64,
    /// Why the first was unreadable.
    pub reason: String,
}

/// The log read back over the snapshot.
struct Replayed {
    /// Records applied.
    ops: usize,
    /// Bytes up to the end of the last one.
    valid_len: u64,
    truncation: Option<LogTruncation>,
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
            RegistryOp::PutQuota(record) => {
                self.quotas.insert(record.role.clone(), record.clone());
            }
            RegistryOp::PutWeight(record) => {
                self.weights.insert(record.role.clone(), record.weight);
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
    /// the snapshot, then the log replayed over it up to its first
    /// unreadable record. That record and everything after it are dropped
    /// and cut off the file (see [`replay_log`]); an unreadable snapshot is
    /// an error.
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
        let bytes = match std::fs::read(&log_path) {
            Ok(bytes) => bytes,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
            Err(e) => return Err(io(&log_path)(e)),
        };
        let replayed = replay_log(&bytes, &mut state, removed_capacity);
        let truncation = replayed.truncation;
        if let Some(t) = &truncation {
            let reason = &t.reason;
            if t.records > 1 {
                tracing::error!(
                    path = %log_path.display(),
                    offset = t.offset,
                    bytes = t.bytes,
                    records = t.records,
                    %reason,
                    "registry log damaged: truncating it at its first unreadable record, dropping it and every record after it"
                );
            } else {
                tracing::warn!(
                    path = %log_path.display(),
                    offset = t.offset,
                    bytes = t.bytes,
                    %reason,
                    "dropping the unreadable last record of the registry log (a write torn by a crash)"
                );
            }
        }
        let log = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log_path)
            .map_err(io(&log_path))?;
        // Cut the damage off, durably, so the next append follows the last
        // good record and a restart reads it.
        if log.metadata().map_err(io(&log_path))?.len() > replayed.valid_len {
            log.set_len(replayed.valid_len).map_err(io(&log_path))?;
            log.sync_all().map_err(io(&log_path))?;
        }
        let log_ops = replayed.ops;
        let mut registry = FileRegistry {
            dir: dir.to_path_buf(),
            state,
            removed_capacity,
            log,
            log_ops,
            truncation,
        };
        if registry.log_ops >= COMPACT_AFTER_OPS {
            registry.compact()?;
        }
        Ok(registry)
    }

    /// What opening cut off the log, if anything.
    pub(crate) fn truncation(&self) -> Option<&LogTruncation> {
        self.truncation.as_ref()
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

/// Replays a log's bytes over `state`, one JSON op per line, up to the
/// first record that is unreadable (does not parse, or has no newline: a
/// write torn by a crash). That record ends the log: a crash during a
/// write may have persisted a later page of it and lost an earlier one, so
/// what follows a bad record was never durable as a whole and must not be
/// applied out of order. The status update log of the agent does the same.
fn replay_log(bytes: &[u8], state: &mut RegistryState, removed_capacity: usize) -> Replayed {
    let mut offset = 0;
    let mut ops = 0;
    let mut reason = None;
    while offset < bytes.len() {
        let Some(len) = bytes[offset..].iter().position(|b| *b == b'\n') else {
            reason = Some("no newline (a torn write)".to_string());
            break;
        };
        let line = &bytes[offset..offset + len];
        if !line.is_empty() {
            match serde_json::from_slice::<RegistryOp>(line) {
                Ok(op) => {
                    state.apply(&op, removed_capacity);
                    ops += 1;
                }
                Err(e) => {
                    reason = Some(e.to_string());
                    break;
                }
            }
        }
        offset += len + 1;
    }
    let truncation = reason.map(|reason| {
        let dropped = &bytes[offset..];
        LogTruncation {
            offset: offset as u64,
            bytes: dropped.len() as u64,
            records: dropped
                .split(|b| *b == b'\n')
                .filter(|l| !l.is_empty())
                .count() as u64,
            reason,
        }
    });
    Replayed {
        ops,
        valid_len: offset as u64,
        truncation,
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

/// An agent's record, for tests of the registries.
#[cfg(test)]
pub(crate) fn test_agent_record(id: &str, hostname: &str) -> AgentRecord {
    AgentRecord {
        id: AgentId::new(id),
        info: AgentInfo {
            id: Some(AgentId::new(id)),
            hostname: hostname.into(),
            address: "127.0.0.1:1".into(),
            resources: agora_proto::Resources::parse("cpus:2;mem:1024").unwrap(),
            attributes: Default::default(),
        },
        principal: None,
        deactivated: false,
        drain: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn agent(id: &str) -> AgentRecord {
        test_agent_record(id, "h")
    }

    fn framework(id: &str, disconnected_at: Option<f64>) -> FrameworkRecord {
        let mut info = FrameworkInfo::new("fw");
        info.id = Some(FrameworkId::new(id));
        info.failover_timeout = 30.0;
        FrameworkRecord {
            launch_epoch: 0,
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
    fn quotas_and_weights_survive_reopen() {
        let dir = tempfile::tempdir().unwrap();
        let mut reg = FileRegistry::open(dir.path(), 10).unwrap();
        let quota = QuotaRecord {
            role: "web".into(),
            guarantees: agora_proto::Resources::parse("cpus:1").unwrap(),
            limits: Some([("cpus".to_string(), 2.0), ("mem".to_string(), 0.0)].into()),
        };
        reg.apply(&[
            RegistryOp::PutQuota(quota.clone()),
            RegistryOp::PutWeight(WeightRecord {
                role: "web".into(),
                weight: 2.5,
            }),
        ])
        .unwrap();
        drop(reg);
        let reg = FileRegistry::open(dir.path(), 10).unwrap();
        assert_eq!(reg.state().quotas["web"], quota);
        assert_eq!(reg.state().weights["web"], 2.5);
    }

    #[test]
    fn torn_last_line_is_dropped_and_cut() {
        let dir = tempfile::tempdir().unwrap();
        let mut reg = FileRegistry::open(dir.path(), 10).unwrap();
        reg.apply(&[RegistryOp::PutAgent(agent("a1"))]).unwrap();
        drop(reg);
        let log = dir.path().join("log.jsonl");
        let good = std::fs::metadata(&log).unwrap().len();
        let fragment = br#"{"op":"put_agent","id":"#;
        let mut f = OpenOptions::new().append(true).open(&log).unwrap();
        f.write_all(fragment).unwrap();
        drop(f);
        let mut reg = FileRegistry::open(dir.path(), 10).unwrap();
        assert_eq!(reg.state().agents.len(), 1);
        let t = reg.truncation().expect("the torn line is counted").clone();
        assert_eq!(
            (t.offset, t.bytes, t.records),
            (good, fragment.len() as u64, 1)
        );
        assert_eq!(std::fs::metadata(&log).unwrap().len(), good, "cut");
        reg.apply(&[RegistryOp::PutAgent(agent("a2"))]).unwrap();
        drop(reg);
        let reg = FileRegistry::open(dir.path(), 10).unwrap();
        assert_eq!(reg.state().agents.len(), 2);
        assert_eq!(reg.truncation(), None);
    }

    #[test]
    fn a_damaged_record_ends_the_log_and_later_ones_are_dropped() {
        let dir = tempfile::tempdir().unwrap();
        let mut reg = FileRegistry::open(dir.path(), 10).unwrap();
        reg.apply(&[
            RegistryOp::PutAgent(agent("a1")),
            RegistryOp::PutAgent(agent("a2")),
            RegistryOp::RemoveAgent {
                id: AgentId::new("a1"),
            },
        ])
        .unwrap();
        drop(reg);
        // A page of the second record lost (zeros), the third intact.
        let log = dir.path().join("log.jsonl");
        let mut bytes = std::fs::read(&log).unwrap();
        let second = bytes.iter().position(|b| *b == b'\n').unwrap() + 1;
        let third = second + bytes[second..].iter().position(|b| *b == b'\n').unwrap() + 1;
        bytes[second..second + 8].fill(0);
        std::fs::write(&log, &bytes).unwrap();

        let mut reg = FileRegistry::open(dir.path(), 10).unwrap();
        // Only what precedes the damage: a1 admitted, its removal (after
        // the damage) not applied.
        assert_eq!(
            reg.state().agents.keys().collect::<Vec<_>>(),
            [&AgentId::new("a1")]
        );
        assert!(reg.state().removed_agents.is_empty());
        let t = reg.truncation().expect("counted").clone();
        assert_eq!(t.offset, second as u64);
        assert_eq!(t.bytes, (bytes.len() - second) as u64);
        assert_eq!(t.records, 2);
        assert!(bytes.len() > third);
        assert_eq!(std::fs::metadata(&log).unwrap().len(), second as u64);

        // Appends follow the last good record and read back.
        reg.apply(&[RegistryOp::PutAgent(agent("a3"))]).unwrap();
        drop(reg);
        let reg = FileRegistry::open(dir.path(), 10).unwrap();
        assert_eq!(reg.truncation(), None);
        assert_eq!(
            reg.state().agents.keys().collect::<Vec<_>>(),
            [&AgentId::new("a1"), &AgentId::new("a3")]
        );
    }

    #[test]
    fn damage_at_the_start_of_the_log_keeps_the_snapshot() {
        let dir = tempfile::tempdir().unwrap();
        let mut reg = FileRegistry::open(dir.path(), 10).unwrap();
        reg.apply(&[RegistryOp::PutAgent(agent("a1"))]).unwrap();
        reg.compact().unwrap();
        drop(reg);
        std::fs::write(
            dir.path().join("log.jsonl"),
            "garbage\n{\"op\":\"remove_agent\",\"id\":\"a1\"}\n",
        )
        .unwrap();
        let reg = FileRegistry::open(dir.path(), 10).unwrap();
        assert_eq!(
            reg.state().agents.len(),
            1,
            "the removal after the damage is dropped"
        );
        assert_eq!(
            reg.truncation().map(|t| (t.offset, t.records)),
            Some((0, 2))
        );
        assert_eq!(
            std::fs::metadata(dir.path().join("log.jsonl"))
                .unwrap()
                .len(),
            0
        );
    }

    #[test]
    fn an_unreadable_snapshot_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("snapshot.json"), "{\"version\":1,").unwrap();
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
