//! The registry in etcd, for masters in high-availability mode: the same
//! [`RegistryState`] as [`crate::registry::FileRegistry`], one key per
//! record under `PREFIX/registry/`:
//!
//! - `agents/ID`, `frameworks/ID`: the JSON record;
//! - `removed_agents/ID`, `removed_frameworks/ID`: empty, oldest first by
//!   creation revision, at most `max_removed_agents` of each.
//!
//! Each write is a transaction fenced on the leader key's create
//! revision, so only the master that created the current leader key can
//! write; a batch over etcd's transaction size is split into several,
//! written in order before anything that depends on them is delivered.

use std::collections::VecDeque;

use agora_etcd::blocking::Client;
use agora_etcd::TxnOp;
use agora_proto::{AgentId, FrameworkId};

use crate::registry::{Registry, RegistryOp, RegistryState};
use crate::RegistryError;

/// Writes per transaction (etcd's default `--max-txn-ops` is 128).
const OPS_PER_TXN: usize = 100;

/// The registry kept in etcd by the current leader.
#[derive(Debug)]
pub(crate) struct EtcdRegistry {
    client: Client,
    /// `PREFIX/registry/`.
    root: String,
    leader_key: String,
    /// Create revision of the leader key we wrote: the fence.
    leader_revision: i64,
    state: RegistryState,
    removed_capacity: usize,
}

// === impl EtcdRegistry ===

impl EtcdRegistry {
    /// Loads what the previous leaders stored (blocking).
    pub(crate) fn load(
        client: Client,
        prefix: &str,
        leader_key: String,
        leader_revision: i64,
        removed_capacity: usize,
    ) -> Result<EtcdRegistry, RegistryError> {
        let root = format!("{prefix}/registry/");
        let kvs = client
            .get_prefix(root.as_bytes())
            .map_err(|e| RegistryError::Etcd(e.to_string()))?;
        let mut state = RegistryState::default();
        let mut removed_agents = Vec::new();
        let mut removed_frameworks = Vec::new();
        for kv in kvs {
            let key = String::from_utf8_lossy(&kv.key);
            let Some((kind, id)) = key[root.len().min(key.len())..].split_once('/') else {
                continue;
            };
            let corrupt = |e: serde_json::Error| RegistryError::Etcd(format!("{key}: {e}"));
            match kind {
                "agents" => {
                    let record: crate::registry::AgentRecord =
                        serde_json::from_slice(&kv.value).map_err(corrupt)?;
                    state.agents.insert(record.id.clone(), record);
                }
                "frameworks" => {
                    let record: crate::registry::FrameworkRecord =
                        serde_json::from_slice(&kv.value).map_err(corrupt)?;
                    state.frameworks.insert(record.id.clone(), record);
                }
                "removed_agents" => removed_agents.push((kv.create_revision, AgentId::new(id))),
                "removed_frameworks" => {
                    removed_frameworks.push((kv.create_revision, FrameworkId::new(id)))
                }
                _ => tracing::warn!(%key, "ignoring an unknown registry key"),
            }
        }
        removed_agents.sort();
        removed_frameworks.sort();
        state.removed_agents = removed_agents.into_iter().map(|(_, id)| id).collect();
        state.removed_frameworks = removed_frameworks.into_iter().map(|(_, id)| id).collect();
        tracing::info!(
            agents = state.agents.len(),
            frameworks = state.frameworks.len(),
            "registry loaded from etcd"
        );
        Ok(EtcdRegistry {
            client,
            root,
            leader_key,
            leader_revision,
            state,
            removed_capacity,
        })
    }

    /// The etcd writes for `op`, given the state before it (whose bounded
    /// removed lists tell which oldest id falls out).
    fn writes(&self, state: &RegistryState, op: &RegistryOp) -> Result<Vec<TxnOp>, RegistryError> {
        let key = |kind: &str, id: &str| format!("{}{kind}/{id}", self.root).into_bytes();
        let encode = |v: Result<Vec<u8>, serde_json::Error>| {
            v.map_err(|e| RegistryError::Etcd(format!("cannot encode a record: {e}")))
        };
        let evicted =
            |list_len: usize| self.removed_capacity > 0 && list_len >= self.removed_capacity;
        Ok(match op {
            RegistryOp::PutAgent(record) => vec![TxnOp::Put {
                key: key("agents", record.id.as_str()),
                value: encode(serde_json::to_vec(record))?,
                lease: 0,
            }],
            RegistryOp::PutFramework(record) => vec![TxnOp::Put {
                key: key("frameworks", record.id.as_str()),
                value: encode(serde_json::to_vec(record))?,
                lease: 0,
            }],
            RegistryOp::RemoveAgent { id } => {
                let mut w = vec![TxnOp::Delete {
                    key: key("agents", id.as_str()),
                }];
                w.extend(removed_writes(&state.removed_agents, evicted, |old| {
                    key("removed_agents", old.as_str())
                }));
                if self.removed_capacity > 0 {
                    w.push(TxnOp::Put {
                        key: key("removed_agents", id.as_str()),
                        value: Vec::new(),
                        lease: 0,
                    });
                }
                w
            }
            RegistryOp::RemoveFramework { id } => {
                let mut w = vec![TxnOp::Delete {
                    key: key("frameworks", id.as_str()),
                }];
                w.extend(removed_writes(&state.removed_frameworks, evicted, |old| {
                    key("removed_frameworks", old.as_str())
                }));
                if self.removed_capacity > 0 {
                    w.push(TxnOp::Put {
                        key: key("removed_frameworks", id.as_str()),
                        value: Vec::new(),
                        lease: 0,
                    });
                }
                w
            }
        })
    }
}

/// The delete of the oldest removed id when the list is full.
fn removed_writes<T>(
    list: &VecDeque<T>,
    full: impl Fn(usize) -> bool,
    key: impl Fn(&T) -> Vec<u8>,
) -> Option<TxnOp> {
    match list.front() {
        Some(oldest) if full(list.len()) => Some(TxnOp::Delete { key: key(oldest) }),
        _ => None,
    }
}

impl Registry for EtcdRegistry {
    fn state(&self) -> &RegistryState {
        &self.state
    }

    fn apply(&mut self, ops: &[RegistryOp]) -> Result<(), RegistryError> {
        if ops.is_empty() {
            return Ok(());
        }
        let mut next = self.state.clone();
        let mut writes = Vec::new();
        for op in ops {
            writes.extend(self.writes(&next, op)?);
            next.apply(op, self.removed_capacity);
        }
        for chunk in writes.chunks(OPS_PER_TXN) {
            let result = self
                .client
                .txn_if_created_at(self.leader_key.as_bytes(), self.leader_revision, chunk)
                .map_err(|e| RegistryError::Etcd(e.to_string()))?;
            if !result.succeeded {
                return Err(RegistryError::NotLeader(
                    "the leader key is no longer ours; registry write refused".into(),
                ));
            }
        }
        self.state = next;
        Ok(())
    }
}
