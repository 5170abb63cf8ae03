//! The registry in etcd, for masters in high-availability mode: the same
//! [`RegistryState`] as [`crate::registry::FileRegistry`], one key per
//! record under `PREFIX/registry/`:
//!
//! - `agents/ID`, `frameworks/ID`: the JSON record;
//! - `removed_agents/ID`, `removed_frameworks/ID`: empty, oldest first by
//!   creation revision, at most `max_removed_agents` of each.
//!
//! The writes are planned by [`etcd_transactions`] (pure code, shared with
//! the simulation). Each write is a transaction fenced on the leader key's create
//! revision, so only the master that created the current leader key can
//! write; a batch over etcd's transaction size is split into several,
//! written in order before anything that depends on them is delivered.

use agora_etcd::blocking::Client;
use agora_etcd::TxnOp;
use agora_proto::{AgentId, FrameworkId};

use crate::registry::{etcd_transactions, KeyWrite, Registry, RegistryOp, RegistryState};
use crate::RegistryError;

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

    /// `write` as an etcd operation on its key under the root.
    fn txn_op(&self, write: KeyWrite) -> TxnOp {
        let key = format!("{}{}", self.root, write.key).into_bytes();
        match write.value {
            Some(value) => TxnOp::Put {
                key,
                value,
                lease: 0,
            },
            None => TxnOp::Delete { key },
        }
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
        let txns = etcd_transactions(&self.state, ops, self.removed_capacity)?;
        let mut next = self.state.clone();
        for op in ops {
            next.apply(op, self.removed_capacity);
        }
        for txn in txns {
            let txn: Vec<TxnOp> = txn.into_iter().map(|w| self.txn_op(w)).collect();
            let result = self
                .client
                .txn_if_created_at(self.leader_key.as_bytes(), self.leader_revision, &txn)
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
