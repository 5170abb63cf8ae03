//! The key writes that make a batch of [`RegistryOp`]s durable in etcd,
//! and how they are cut into transactions: pure code, so the HA registry
//! (`ha::EtcdRegistry`, which sends them) and the whole-cluster simulation
//! (which checks them against etcd's rules) plan the same writes.
//!
//! One key per record, relative to `PREFIX/registry/`:
//!
//! - `agents/ID`, `frameworks/ID`: the JSON record;
//! - `removed_agents/ID`, `removed_frameworks/ID`: empty, oldest first by
//!   creation revision, at most `removed_capacity` of each.

use std::collections::VecDeque;

use super::{RegistryError, RegistryOp, RegistryState};

/// Most writes per transaction (etcd's default `--max-txn-ops` is 128).
pub const OPS_PER_TXN: usize = 100;

/// One write of the etcd registry: `value: None` deletes the key. Keys are
/// relative to `PREFIX/registry/` (e.g. `"agents/ID"`).
#[derive(Debug, Clone, PartialEq)]
pub struct KeyWrite {
    /// The key, under `PREFIX/registry/`.
    pub key: String,
    /// What to put there, or `None` to delete it.
    pub value: Option<Vec<u8>>,
}

/// The transactions, in order, that make `ops` durable on top of `state`
/// (what is stored before them; removed-id lists hold at most
/// `removed_capacity` ids).
pub fn etcd_transactions(
    state: &RegistryState,
    ops: &[RegistryOp],
    removed_capacity: usize,
) -> Result<Vec<Vec<KeyWrite>>, RegistryError> {
    let mut next = state.clone();
    let mut writes = Vec::new();
    for op in ops {
        writes.extend(op_writes(&next, op, removed_capacity)?);
        next.apply(op, removed_capacity);
    }
    Ok(writes.chunks(OPS_PER_TXN).map(<[_]>::to_vec).collect())
}

/// The writes of `op`, given the state before it (whose bounded removed
/// lists tell which oldest id falls out).
fn op_writes(
    state: &RegistryState,
    op: &RegistryOp,
    removed_capacity: usize,
) -> Result<Vec<KeyWrite>, RegistryError> {
    let key = |kind: &str, id: &str| format!("{kind}/{id}");
    let put = |key: String, value: Vec<u8>| KeyWrite {
        key,
        value: Some(value),
    };
    let delete = |key: String| KeyWrite { key, value: None };
    let encode =
        |v: Result<Vec<u8>, serde_json::Error>| v.map_err(|e| RegistryError::Encode(e.to_string()));
    let evicted = |list_len: usize| removed_capacity > 0 && list_len >= removed_capacity;
    Ok(match op {
        RegistryOp::PutAgent(record) => vec![put(
            key("agents", record.id.as_str()),
            encode(serde_json::to_vec(record))?,
        )],
        RegistryOp::PutFramework(record) => vec![put(
            key("frameworks", record.id.as_str()),
            encode(serde_json::to_vec(record))?,
        )],
        RegistryOp::RemoveAgent { id } => {
            let mut w = vec![delete(key("agents", id.as_str()))];
            w.extend(removed_writes(&state.removed_agents, evicted, |old| {
                key("removed_agents", old.as_str())
            }));
            if removed_capacity > 0 {
                w.push(put(key("removed_agents", id.as_str()), Vec::new()));
            }
            w
        }
        RegistryOp::RemoveFramework { id } => {
            let mut w = vec![delete(key("frameworks", id.as_str()))];
            w.extend(removed_writes(&state.removed_frameworks, evicted, |old| {
                key("removed_frameworks", old.as_str())
            }));
            if removed_capacity > 0 {
                w.push(put(key("removed_frameworks", id.as_str()), Vec::new()));
            }
            w
        }
    })
}

/// The delete of the oldest removed id when the list is full.
fn removed_writes<T>(
    list: &VecDeque<T>,
    full: impl Fn(usize) -> bool,
    key: impl Fn(&T) -> String,
) -> Option<KeyWrite> {
    match list.front() {
        Some(oldest) if full(list.len()) => Some(KeyWrite {
            key: key(oldest),
            value: None,
        }),
        _ => None,
    }
}
