//! The registry as etcd keeps it: a batch of registry ops is written as
//! the master's etcd registry plans it, and each transaction must pass
//! etcd's rules or the write fails (and the real master stops).

use std::collections::BTreeSet;

use agora_master::sim::{etcd_transactions, RegistryOp, RegistryState};

/// etcd's default `--max-txn-ops`.
const ETCD_MAX_TXN_OPS: usize = 128;

/// Whether etcd accepts the transactions that write `ops` on top of
/// `state`: at most 128 operations each, no key twice in one ("duplicate
/// key given in txn request").
pub(crate) fn check_write(
    state: &RegistryState,
    ops: &[RegistryOp],
    removed_capacity: usize,
) -> Result<(), String> {
    let txns = etcd_transactions(state, ops, removed_capacity).map_err(|e| e.to_string())?;
    for txn in &txns {
        if txn.len() > ETCD_MAX_TXN_OPS {
            return Err(format!(
                "etcdserver: too many operations in txn request ({} > {ETCD_MAX_TXN_OPS})",
                txn.len()
            ));
        }
        let mut keys = BTreeSet::new();
        for write in txn {
            if !keys.insert(write.key.as_str()) {
                return Err(format!(
                    "etcdserver: duplicate key given in txn request ({})",
                    write.key
                ));
            }
        }
    }
    Ok(())
}
