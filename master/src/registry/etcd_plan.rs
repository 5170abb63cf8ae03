//! The key writes that make a batch of [`RegistryOp`]s durable in etcd,
//! and how they are cut into transactions: pure code, so the HA registry
//! (`ha::EtcdRegistry`, which sends them) and the whole-cluster simulation
//! (which checks them against etcd's rules) plan the same writes.
//!
//! One key per record, relative to `PREFIX/registry/`:
//!
//! - `agents/ID`, `frameworks/ID`: the JSON record;
//! - `removed_agents/ID`, `removed_frameworks/ID`: at most
//!   `removed_capacity` of each. The value is the position, in decimal, of
//!   the op that removed the id in its batch; the list is read back oldest
//!   first by (mod revision, that position, id). Every key written in one
//!   transaction has the same revision, so the position keeps the order of
//!   removals within it; registries written before positions existed have
//!   empty values and one removal per revision at most, or ids in order.
//!
//! etcd refuses a transaction that names one key twice ("duplicate key
//! given in txn request"), and a batch often holds two ops on one record
//! (a framework that subscribes and disconnects before the state task
//! wakes; an agent admitted and removed). Within a transaction only the
//! last write of each key is kept. Transactions end between ops (unless
//! one op alone has more writes than a transaction holds), and nothing
//! moves from one transaction to another, so each committed transaction
//! leaves etcd as the ops up to its last would, and the last one as the
//! whole batch does.

use std::collections::VecDeque;

use agora_proto::hash::{HashMap, HashSet};

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

/// A removed-id list as a batch changes it: the stored list with its
/// oldest `popped` ids evicted, then the ids the batch pushed. No copy of
/// the stored list (it holds up to `max_removed_agents` ids).
struct RemovedList<'a, T> {
    stored: &'a VecDeque<T>,
    pushed: Vec<T>,
    popped: usize,
}

/// Transactions being filled, one op at a time.
#[derive(Default)]
struct Txns {
    done: Vec<Vec<KeyWrite>>,
    current: Vec<KeyWrite>,
    /// Where each key of `current` is.
    index: HashMap<String, usize>,
}

/// The transactions, in order, that make `ops` durable on top of `state`
/// (what is stored before them; removed-id lists hold at most
/// `removed_capacity` ids). No key appears twice in one transaction, and
/// what the last one leaves in etcd is `state` with `ops` applied in order.
pub fn etcd_transactions(
    state: &RegistryState,
    ops: &[RegistryOp],
    removed_capacity: usize,
) -> Result<Vec<Vec<KeyWrite>>, RegistryError> {
    let mut removed_agents = RemovedList::new(&state.removed_agents);
    let mut removed_frameworks = RemovedList::new(&state.removed_frameworks);
    let mut txns = Txns::default();
    for (position, op) in ops.iter().enumerate() {
        let writes = match op {
            RegistryOp::PutAgent(record) => {
                vec![put(key("agents", record.id.as_str()), encode(record)?)]
            }
            RegistryOp::PutFramework(record) => {
                vec![put(key("frameworks", record.id.as_str()), encode(record)?)]
            }
            RegistryOp::RemoveAgent { id } => {
                let mut w = vec![delete(key("agents", id.as_str()))];
                w.extend(
                    removed_agents.push(id.clone(), removed_capacity, position, |id| {
                        key("removed_agents", id.as_str())
                    }),
                );
                w
            }
            RegistryOp::PutQuota(record) => {
                vec![put(key("quotas", &record.role), encode(record)?)]
            }
            RegistryOp::PutWeight(record) => {
                vec![put(key("weights", &record.role), encode(record)?)]
            }
            RegistryOp::RemoveFramework { id } => {
                let mut w = vec![delete(key("frameworks", id.as_str()))];
                w.extend(
                    removed_frameworks.push(id.clone(), removed_capacity, position, |id| {
                        key("removed_frameworks", id.as_str())
                    }),
                );
                w
            }
        };
        txns.add_op(writes);
    }
    Ok(txns.finish())
}

/// The order of a removed id read back from etcd: its key's mod revision
/// and value (see the module documentation).
#[cfg_attr(not(feature = "etcd"), allow(dead_code))]
pub(crate) fn removed_order(mod_revision: i64, value: &[u8]) -> (i64, u64) {
    let position = std::str::from_utf8(value)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    (mod_revision, position)
}

fn key(kind: &str, id: &str) -> String {
    format!("{kind}/{id}")
}

fn put(key: String, value: Vec<u8>) -> KeyWrite {
    KeyWrite {
        key,
        value: Some(value),
    }
}

fn delete(key: String) -> KeyWrite {
    KeyWrite { key, value: None }
}

fn encode<T: serde::Serialize>(record: &T) -> Result<Vec<u8>, RegistryError> {
    serde_json::to_vec(record).map_err(|e| RegistryError::Encode(e.to_string()))
}

// === impl RemovedList ===

impl<'a, T: Clone> RemovedList<'a, T> {
    fn new(stored: &'a VecDeque<T>) -> Self {
        RemovedList {
            stored,
            pushed: Vec::new(),
            popped: 0,
        }
    }

    fn len(&self) -> usize {
        self.stored.len() + self.pushed.len() - self.popped
    }

    fn front(&self) -> Option<&T> {
        match self.popped.checked_sub(self.stored.len()) {
            None => self.stored.get(self.popped),
            Some(i) => self.pushed.get(i),
        }
    }

    /// Pushes `id` as `RegistryState::apply` does (evicting the oldest
    /// while the list is full; nothing at capacity 0), and returns the
    /// writes that do the same in etcd.
    fn push(
        &mut self,
        id: T,
        capacity: usize,
        position: usize,
        key: impl Fn(&T) -> String,
    ) -> Vec<KeyWrite> {
        if capacity == 0 {
            return Vec::new();
        }
        let mut writes = Vec::new();
        while self.len() >= capacity {
            let Some(oldest) = self.front() else { break };
            writes.push(delete(key(oldest)));
            self.popped += 1;
        }
        writes.push(put(key(&id), position.to_string().into_bytes()));
        self.pushed.push(id);
        writes
    }
}

// === impl Txns ===

impl Txns {
    /// Adds the writes of one op, in the current transaction when they
    /// fit, else in a new one.
    fn add_op(&mut self, writes: Vec<KeyWrite>) {
        let new_keys: HashSet<&str> = writes
            .iter()
            .map(|w| w.key.as_str())
            .filter(|k| !self.index.contains_key(*k))
            .collect();
        if !self.current.is_empty() && self.current.len() + new_keys.len() > OPS_PER_TXN {
            self.flush();
        }
        for write in writes {
            self.add(write);
        }
    }

    /// Adds one write: over an earlier write of its key in the current
    /// transaction, else at its end (in a new transaction when full).
    fn add(&mut self, write: KeyWrite) {
        if let Some(&i) = self.index.get(&write.key) {
            self.current[i].value = write.value;
            return;
        }
        if self.current.len() >= OPS_PER_TXN {
            self.flush();
        }
        self.index.insert(write.key.clone(), self.current.len());
        self.current.push(write);
    }

    fn flush(&mut self) {
        self.index.clear();
        if !self.current.is_empty() {
            self.done.push(std::mem::take(&mut self.current));
        }
    }

    fn finish(mut self) -> Vec<Vec<KeyWrite>> {
        self.flush();
        self.done
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use agora_proto::{AgentId, FrameworkId, FrameworkInfo};

    use super::*;
    use crate::registry::{AgentRecord, FrameworkRecord};

    /// A stand-in for etcd: keys with their mod revision, written one
    /// transaction at a time under etcd's rules.
    #[derive(Default)]
    struct FakeEtcd {
        revision: i64,
        kvs: BTreeMap<String, (Vec<u8>, i64)>,
    }

    impl FakeEtcd {
        /// Stores `state` as earlier batches would have.
        fn holding(state: &RegistryState, capacity: usize) -> FakeEtcd {
            let mut etcd = FakeEtcd::default();
            let ops: Vec<RegistryOp> = state
                .agents
                .values()
                .cloned()
                .map(RegistryOp::PutAgent)
                .chain(
                    state
                        .frameworks
                        .values()
                        .cloned()
                        .map(RegistryOp::PutFramework),
                )
                .collect();
            etcd.apply(&RegistryState::default(), &ops, capacity);
            // One removal per revision, oldest first.
            for id in &state.removed_agents {
                etcd.txn(&[put(key("removed_agents", id.as_str()), Vec::new())]);
            }
            for id in &state.removed_frameworks {
                etcd.txn(&[put(key("removed_frameworks", id.as_str()), Vec::new())]);
            }
            etcd
        }

        fn txn(&mut self, writes: &[KeyWrite]) {
            assert!(
                writes.len() <= OPS_PER_TXN,
                "{} writes in one transaction",
                writes.len()
            );
            let keys: HashSet<&str> = writes.iter().map(|w| w.key.as_str()).collect();
            assert_eq!(
                keys.len(),
                writes.len(),
                "duplicate key given in txn request: {writes:?}"
            );
            self.revision += 1;
            for w in writes {
                match &w.value {
                    Some(v) => {
                        self.kvs.insert(w.key.clone(), (v.clone(), self.revision));
                    }
                    None => {
                        self.kvs.remove(&w.key);
                    }
                }
            }
        }

        /// Plans `ops` over `state` and writes them; returns how many
        /// transactions it took.
        fn apply(&mut self, state: &RegistryState, ops: &[RegistryOp], capacity: usize) -> usize {
            let txns = etcd_transactions(state, ops, capacity).unwrap();
            for txn in &txns {
                self.txn(txn);
            }
            txns.len()
        }

        /// What a master loading the registry reads (as `EtcdRegistry::load`).
        fn load(&self) -> RegistryState {
            let mut state = RegistryState::default();
            let mut agents = Vec::new();
            let mut frameworks = Vec::new();
            for (key, (value, rev)) in &self.kvs {
                let (kind, id) = key.split_once('/').unwrap();
                match kind {
                    "agents" => {
                        let r: AgentRecord = serde_json::from_slice(value).unwrap();
                        state.agents.insert(r.id.clone(), r);
                    }
                    "frameworks" => {
                        let r: FrameworkRecord = serde_json::from_slice(value).unwrap();
                        state.frameworks.insert(r.id.clone(), r);
                    }
                    "quotas" => {
                        let r: crate::registry::QuotaRecord =
                            serde_json::from_slice(value).unwrap();
                        state.quotas.insert(r.role.clone(), r);
                    }
                    "weights" => {
                        let r: crate::registry::WeightRecord =
                            serde_json::from_slice(value).unwrap();
                        state.weights.insert(r.role, r.weight);
                    }
                    "removed_agents" => agents.push((removed_order(*rev, value), id.to_string())),
                    "removed_frameworks" => {
                        frameworks.push((removed_order(*rev, value), id.to_string()))
                    }
                    _ => panic!("unknown key {key}"),
                }
            }
            agents.sort();
            frameworks.sort();
            state.removed_agents = agents.into_iter().map(|(_, id)| AgentId::new(id)).collect();
            state.removed_frameworks = frameworks
                .into_iter()
                .map(|(_, id)| FrameworkId::new(id))
                .collect();
            state
        }
    }

    fn agent(id: &str, host: &str) -> RegistryOp {
        RegistryOp::PutAgent(crate::registry::test_agent_record(id, host))
    }

    fn framework(id: &str, disconnected_at: Option<f64>) -> RegistryOp {
        let mut info = FrameworkInfo::new("fw");
        info.id = Some(FrameworkId::new(id));
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

    fn applied(state: &RegistryState, ops: &[RegistryOp], capacity: usize) -> RegistryState {
        let mut state = state.clone();
        for op in ops {
            state.apply(op, capacity);
        }
        state
    }

    /// Writes `batches` one after the other into a fake etcd (which
    /// refuses duplicate keys and oversized transactions) and checks that
    /// after each, loading gives the state the ops give in memory.
    fn check(capacity: usize, batches: &[Vec<RegistryOp>]) -> RegistryState {
        let mut etcd = FakeEtcd::default();
        let mut state = RegistryState::default();
        for ops in batches {
            etcd.apply(&state, ops, capacity);
            state = applied(&state, ops, capacity);
            assert_eq!(etcd.load(), state, "after {ops:?}");
        }
        state
    }

    #[test]
    fn quotas_and_weights_are_stored_by_role() {
        let quota = |cpus: f64| {
            RegistryOp::PutQuota(crate::registry::QuotaRecord {
                role: "a/b".into(),
                guarantees: agora_proto::Resources::default(),
                limits: Some([("cpus".to_string(), cpus)].into()),
            })
        };
        let weight = RegistryOp::PutWeight(crate::registry::WeightRecord {
            role: "a/b".into(),
            weight: 3.0,
        });
        let state = check(10, &[vec![quota(1.0), weight], vec![quota(0.0)]]);
        assert_eq!(state.quotas["a/b"].limits.as_ref().unwrap()["cpus"], 0.0);
        assert_eq!(state.weights["a/b"], 3.0);
    }

    #[test]
    fn two_puts_of_one_framework_are_one_write() {
        // Subscribe, then disconnect, before the state task wakes.
        let ops = [framework("f", None), framework("f", Some(12.5))];
        let txns = etcd_transactions(&RegistryState::default(), &ops, 10).unwrap();
        assert_eq!(txns.len(), 1);
        assert_eq!(txns[0].len(), 1);
        let RegistryOp::PutFramework(last) = &ops[1] else {
            unreachable!()
        };
        assert_eq!(txns[0][0].value, Some(encode(last).unwrap()));
        let state = check(10, &[ops.to_vec()]);
        assert_eq!(
            state.frameworks[&FrameworkId::new("f")].disconnected_at,
            Some(12.5)
        );
    }

    #[test]
    fn a_put_then_a_remove_of_one_record_leaves_it_removed() {
        let state = check(
            10,
            &[
                vec![agent("a", "h1"), remove_agent("a")],
                vec![framework("f", None), remove_framework("f")],
                // Known before the batch, re-registered, then removed.
                vec![agent("b", "h1")],
                vec![agent("b", "h2"), remove_agent("b"), agent("c", "h3")],
            ],
        );
        assert_eq!(
            state.agents.keys().collect::<Vec<_>>(),
            [&AgentId::new("c")]
        );
        assert_eq!(state.removed_agents, [AgentId::new("a"), AgentId::new("b")]);
        assert_eq!(state.removed_frameworks, [FrameworkId::new("f")]);
    }

    #[test]
    fn a_removal_then_a_put_leaves_the_record() {
        // What the master never does today (a removed id is refused), but
        // the plan must still store what the ops say.
        check(
            10,
            &[
                vec![agent("a", "h1")],
                vec![remove_agent("a"), agent("a", "h2")],
            ],
        );
    }

    #[test]
    fn removals_in_one_transaction_keep_their_order() {
        // Same revision for all: the position says which came first.
        let state = check(
            10,
            &[vec![
                remove_agent("z"),
                remove_agent("b"),
                remove_agent("m"),
            ]],
        );
        assert_eq!(
            state.removed_agents,
            [AgentId::new("z"), AgentId::new("b"), AgentId::new("m")]
        );
    }

    #[test]
    fn a_full_removed_list_evicts_in_order_even_an_id_pushed_in_the_batch() {
        // Capacity 2: the batch evicts stored ids, then ids it pushed
        // itself (a put and a delete of one key).
        check(
            2,
            &[
                vec![remove_agent("a"), remove_agent("b")],
                vec![
                    remove_agent("c"),
                    remove_agent("d"),
                    remove_agent("e"),
                    remove_framework("f1"),
                ],
            ],
        );
        let ops = [remove_agent("c"), remove_agent("d"), remove_agent("e")];
        let stored = RegistryState {
            removed_agents: [AgentId::new("a"), AgentId::new("b")].into(),
            ..Default::default()
        };
        let txns = etcd_transactions(&stored, &ops, 2).unwrap();
        let writes: Vec<_> = txns.concat();
        let mut deleted: Vec<&str> = writes
            .iter()
            .filter(|w| w.value.is_none() && w.key.starts_with("removed_agents/"))
            .map(|w| w.key.as_str())
            .collect();
        deleted.sort();
        assert_eq!(
            deleted,
            ["removed_agents/a", "removed_agents/b", "removed_agents/c"]
        );
    }

    #[test]
    fn an_evicted_id_removed_again_moves_to_the_back() {
        // Capacity 2, [a, b]: removing c evicts a; a re-admitted agent a
        // removed again evicts b and goes last: [c, a]. Its key is deleted
        // and put again in one transaction, collapsed to one put that
        // gives it a new revision.
        let state = check(
            2,
            &[
                vec![remove_agent("a"), remove_agent("b")],
                vec![remove_agent("c"), agent("a", "h"), remove_agent("a")],
            ],
        );
        assert_eq!(state.removed_agents, [AgentId::new("c"), AgentId::new("a")]);
    }

    #[test]
    fn a_shrunk_capacity_evicts_every_id_over_it() {
        let stored = RegistryState {
            removed_frameworks: ["f1", "f2", "f3", "f4"].map(FrameworkId::new).into(),
            ..Default::default()
        };
        let mut etcd = FakeEtcd::holding(&stored, 10);
        let ops = [remove_framework("f5")];
        etcd.apply(&stored, &ops, 2);
        let expected = applied(&stored, &ops, 2);
        assert_eq!(
            expected.removed_frameworks,
            [FrameworkId::new("f4"), FrameworkId::new("f5")]
        );
        assert_eq!(etcd.load(), expected);
    }

    #[test]
    fn capacity_zero_keeps_no_removed_ids() {
        let state = check(0, &[vec![agent("a", "h"), remove_agent("a")]]);
        assert!(state.removed_agents.is_empty());
    }

    #[test]
    fn a_big_batch_spans_transactions_that_end_between_ops() {
        // 150 agents admitted, then all re-registered with new info and
        // half of them removed: more than one transaction, the same keys
        // written in several of them, never twice in one.
        let mut ops: Vec<RegistryOp> = (0..150).map(|i| agent(&format!("a{i}"), "h1")).collect();
        ops.extend((0..150).map(|i| agent(&format!("a{i}"), "h2")));
        ops.extend((0..150).step_by(2).map(|i| remove_agent(&format!("a{i}"))));
        let txns = etcd_transactions(&RegistryState::default(), &ops, 1000).unwrap();
        assert!(txns.len() > 2, "{} transactions", txns.len());
        // Each transaction ends where an op ends: applying a prefix of the
        // transactions gives the state after a prefix of the ops.
        let mut etcd = FakeEtcd::default();
        let mut done = 0;
        for txn in &txns {
            etcd.txn(txn);
            let loaded = etcd.load();
            done = (done..=ops.len())
                .find(|n| applied(&RegistryState::default(), &ops[..*n], 1000) == loaded)
                .unwrap_or_else(|| panic!("after a transaction: not the state after any op"));
        }
        assert_eq!(done, ops.len());
        check(1000, &[ops.clone()]);
        // The same batch with the removed lists at capacity.
        let state = check(10, &[ops]);
        assert_eq!(state.removed_agents.len(), 10);
        assert_eq!(state.agents.len(), 75);
    }

    #[test]
    fn one_op_with_more_writes_than_a_transaction_is_split() {
        let stored = RegistryState {
            removed_agents: (0..250).map(|i| AgentId::new(format!("r{i}"))).collect(),
            ..Default::default()
        };
        let mut etcd = FakeEtcd::holding(&stored, 1000);
        let ops = [remove_agent("x")];
        let txns = etcd.apply(&stored, &ops, 1);
        assert_eq!(txns, 3);
        assert_eq!(etcd.load(), applied(&stored, &ops, 1));
    }
}
