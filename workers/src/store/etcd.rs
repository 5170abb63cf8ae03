//! `EtcdStore`: the worker store in etcd (feature `etcd`), for runtimes
//! that run as leader-elected contenders.
//!
//! Keys under `PREFIX/workers/`: `meta` (framework id and attempt) and
//! `w/ID` (one [`WorkerRecord`](super::WorkerRecord) each), all JSON.
//! Every write is a transaction fenced on the leader key's create
//! revision, the [`LeaderEpoch`](crate::election::LeaderEpoch) this store
//! was opened with: once another contender has won, each write of the
//! deposed leader fails with [`StoreError::Fenced`] and changes nothing.
//! A batch is collapsed to its last write per key and sent in
//! transactions of at most [`OPS_PER_TXN`] keys (etcd's default
//! `--max-txn-ops` is 128), in order.

use std::collections::BTreeMap;

use agora_etcd::blocking::Client;
use agora_etcd::TxnOp;
use serde::{Deserialize, Serialize};

use super::{StoreError, StoreOp, StoreState, WorkerRecord, WorkerStore};
use crate::election::LeaderEpoch;

/// Keys per transaction.
pub const OPS_PER_TXN: usize = 100;

/// The worker store in etcd (see the module docs).
#[derive(Debug)]
pub struct EtcdStore {
    client: Client,
    root: String,
    leader_key: String,
    epoch: LeaderEpoch,
    state: StoreState,
}

#[derive(Serialize, Deserialize)]
struct Meta {
    #[serde(default)]
    framework_id: Option<agora_proto::FrameworkId>,
    #[serde(default)]
    attempt: u64,
}

// === impl EtcdStore ===

impl EtcdStore {
    /// The store under `prefix` in etcd at `endpoint`, writing only while
    /// `epoch` (won on `leader_key`) is current. Blocking calls: use it
    /// from the driver's thread, not from async code.
    pub fn new(
        endpoint: &str,
        prefix: &str,
        leader_key: &str,
        epoch: LeaderEpoch,
    ) -> Result<EtcdStore, StoreError> {
        let client = Client::new(endpoint).map_err(|e| StoreError::Etcd(e.to_string()))?;
        Ok(EtcdStore {
            client,
            root: format!("{}/workers/", prefix.trim_end_matches('/')),
            leader_key: leader_key.to_string(),
            epoch,
            state: StoreState::default(),
        })
    }

    fn worker_key(&self, id: &crate::WorkerId) -> Vec<u8> {
        format!("{}w/{}", self.root, id).into_bytes()
    }

    fn meta_key(&self) -> Vec<u8> {
        format!("{}meta", self.root).into_bytes()
    }
}

impl WorkerStore for EtcdStore {
    fn load(&mut self) -> Result<StoreState, StoreError> {
        let etcd = |e: agora_etcd::EtcdError| StoreError::Etcd(e.to_string());
        let kvs = self.client.get_prefix(self.root.as_bytes()).map_err(etcd)?;
        let mut state = StoreState::default();
        for kv in kvs {
            let key = String::from_utf8_lossy(&kv.key).to_string();
            let corrupt = |e: serde_json::Error| StoreError::Corrupt(format!("{key}: {e}"));
            if kv.key == self.meta_key() {
                let meta: Meta = serde_json::from_slice(&kv.value).map_err(corrupt)?;
                state.framework_id = meta.framework_id;
                state.attempt = meta.attempt;
            } else if key.starts_with(&format!("{}w/", self.root)) {
                let record: WorkerRecord = serde_json::from_slice(&kv.value).map_err(corrupt)?;
                state.workers.insert(record.id.clone(), record);
            }
        }
        self.state = state.clone();
        Ok(state)
    }

    fn apply(&mut self, ops: &[StoreOp]) -> Result<(), StoreError> {
        // Last write per key wins within a batch (etcd refuses a key twice
        // in one transaction).
        let mut writes: BTreeMap<Vec<u8>, Option<Vec<u8>>> = BTreeMap::new();
        let mut order: Vec<Vec<u8>> = Vec::new();
        let mut next = self.state.clone();
        let mut record = |key: Vec<u8>, value: Option<Vec<u8>>| {
            if !writes.contains_key(&key) {
                order.push(key.clone());
            }
            writes.insert(key, value);
        };
        for op in ops {
            match op {
                StoreOp::SetFrameworkId { .. } | StoreOp::SetAttempt { .. } => {
                    next.apply(op);
                    let meta = Meta {
                        framework_id: next.framework_id.clone(),
                        attempt: next.attempt,
                    };
                    record(
                        self.meta_key(),
                        Some(serde_json::to_vec(&meta).unwrap_or_default()),
                    );
                }
                StoreOp::Put { record: r } => {
                    next.apply(op);
                    record(
                        self.worker_key(&r.id),
                        Some(serde_json::to_vec(r).unwrap_or_default()),
                    );
                }
                StoreOp::Remove { id } => {
                    next.apply(op);
                    record(self.worker_key(id), None);
                }
                StoreOp::Clear => {
                    for id in next.workers.keys() {
                        record(self.worker_key(id), None);
                    }
                    record(self.meta_key(), None);
                    next.apply(op);
                }
            }
        }
        let txn_ops: Vec<TxnOp> = order
            .into_iter()
            .map(|key| match writes.remove(&key).flatten() {
                Some(value) => TxnOp::Put {
                    key,
                    value,
                    lease: 0,
                },
                None => TxnOp::Delete { key },
            })
            .collect();
        for chunk in txn_ops.chunks(OPS_PER_TXN) {
            let result = self
                .client
                .txn_if_created_at(self.leader_key.as_bytes(), self.epoch.0, chunk)
                .map_err(|e| StoreError::Etcd(e.to_string()))?;
            if !result.succeeded {
                return Err(StoreError::Fenced(self.epoch.0));
            }
        }
        self.state = next;
        Ok(())
    }
}
