//! The registry in etcd, for masters in high-availability mode: the same
//! [`RegistryState`] as [`crate::registry::FileRegistry`], one key per
//! record under `PREFIX/registry/`:
//!
//! - `agents/ID`, `frameworks/ID`: the JSON record;
//! - `removed_agents/ID`, `removed_frameworks/ID`: at most
//!   `max_removed_agents` of each, oldest first by mod revision and the
//!   position the value holds.
//!
//! The writes are planned by [`etcd_transactions`] (pure code, shared with
//! the simulation; its module says more about the keys): never one key
//! twice in a transaction, which etcd refuses. Each write is a transaction fenced on the leader key's create
//! revision, so only the master that created the current leader key can
//! write; a batch over etcd's transaction size is split into several,
//! written in order before anything that depends on them is delivered.

use agora_etcd::blocking::Client;
use agora_etcd::TxnOp;
use agora_proto::{AgentId, FrameworkId};

use crate::registry::{
    etcd_transactions, removed_order, KeyWrite, Registry, RegistryOp, RegistryState,
};
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
                "quotas" => {
                    let record: crate::registry::QuotaRecord =
                        serde_json::from_slice(&kv.value).map_err(corrupt)?;
                    state.quotas.insert(record.role.clone(), record);
                }
                "weights" => {
                    let record: crate::registry::WeightRecord =
                        serde_json::from_slice(&kv.value).map_err(corrupt)?;
                    state.weights.insert(record.role, record.weight);
                }
                "removed_agents" => removed_agents
                    .push((removed_order(kv.mod_revision, &kv.value), AgentId::new(id))),
                "removed_frameworks" => removed_frameworks.push((
                    removed_order(kv.mod_revision, &kv.value),
                    FrameworkId::new(id),
                )),
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
        for txn in etcd_transactions(&self.state, ops, self.removed_capacity)? {
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
        // Only once all is durable: a failed write stops the master anyway.
        for op in ops {
            self.state.apply(op, self.removed_capacity);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use agora_etcd::testing::TestEtcd;
    use agora_proto::FrameworkInfo;

    use super::*;
    use crate::registry::{FileRegistry, FrameworkRecord};

    const PREFIX: &str = "/agora-test";

    fn agent(id: &str, host: &str) -> RegistryOp {
        RegistryOp::PutAgent(crate::registry::test_agent_record(id, host))
    }

    fn framework(id: &str, disconnected_at: Option<f64>) -> RegistryOp {
        let mut info = FrameworkInfo::new("fw");
        info.id = Some(FrameworkId::new(id));
        info.failover_timeout = 30.0;
        RegistryOp::PutFramework(FrameworkRecord {
            launch_epoch: 0,
            id: FrameworkId::new(id),
            info,
            disconnected_at,
        })
    }

    fn remove_agent(id: &str) -> RegistryOp {
        RegistryOp::RemoveAgent {
            id: AgentId::new(id),
        }
    }

    fn remove_framework(id: &str) -> RegistryOp {
        RegistryOp::RemoveFramework {
            id: FrameworkId::new(id),
        }
    }

    /// Batches that each hold two ops (or more) on one key.
    fn batches() -> Vec<Vec<RegistryOp>> {
        let mut big: Vec<RegistryOp> = (0..120).map(|i| agent(&format!("b{i}"), "h1")).collect();
        big.extend((0..120).map(|i| agent(&format!("b{i}"), "h2")));
        big.extend((0..120).step_by(3).map(|i| remove_agent(&format!("b{i}"))));
        vec![
            // A framework subscribes and disconnects before the state
            // task wakes.
            vec![framework("f1", None), framework("f1", Some(17.25))],
            // An agent admitted and removed; another admitted twice.
            vec![
                agent("a1", "h1"),
                remove_agent("a1"),
                agent("a2", "h1"),
                agent("a2", "h2"),
            ],
            // A framework subscribed and torn down; removals out of id
            // order, filling the removed lists (capacity 3).
            vec![
                framework("f2", None),
                remove_framework("f2"),
                remove_framework("f1"),
                remove_agent("z"),
                remove_agent("a2"),
            ],
            // Evicts a1, then the z it pushes... and an evicted id removed
            // again: deleted and put again in one batch.
            vec![
                remove_agent("c"),
                agent("a1", "h3"),
                remove_agent("a1"),
                remove_agent("d"),
            ],
            // More than one transaction, with keys written again.
            big,
        ]
    }

    #[test]
    fn etcd_accepts_batches_with_two_ops_on_one_key_and_reloads_as_the_file_registry() {
        let dir = tempfile::tempdir().unwrap();
        let Some(etcd) = TestEtcd::start(dir.path()) else {
            return;
        };
        let client = etcd.client();
        let leader_key = format!("{PREFIX}/leader");
        let revision = client
            .create(leader_key.as_bytes(), b"test", 0)
            .unwrap()
            .revision;
        let load = || {
            EtcdRegistry::load(etcd.client(), PREFIX, leader_key.clone(), revision, 3)
                .unwrap_or_else(|e| panic!("loading the registry: {e}"))
        };
        let mut registry = load();
        let mut file = FileRegistry::open(&dir.path().join("file-registry"), 3).unwrap();
        for ops in batches() {
            registry
                .apply(&ops)
                .unwrap_or_else(|e| panic!("etcd refused a batch: {e}\n{ops:?}"));
            file.apply(&ops).unwrap();
            assert_eq!(registry.state(), file.state());
            assert_eq!(load().state(), file.state(), "reloaded after {ops:?}");
        }
        let state = file.state();
        assert_eq!(state.agents.len(), 80);
        assert_eq!(state.removed_frameworks.len(), 2);
        assert_eq!(state.removed_agents.len(), 3);
        assert!(state.frameworks.is_empty());
    }
}
