//! A map that remembers which entries were changed since it was last
//! asked: the master's agents, frameworks, tasks and offers live in
//! [`Tracked`] maps so that publishing a `/state` snapshot costs work
//! proportional to what changed, not to the cluster's size (see
//! `state.rs`).
//!
//! Reads go through `Deref` to the `HashMap`; every way to change an entry
//! is a method here that records its key, so a change cannot be missed by
//! forgetting a hook. The `untracked_*` methods are for fields `/state`
//! does not show (ping bookkeeping), each use says why.

use agora_proto::hash::HashMap;
use std::borrow::Borrow;
use std::collections::hash_map;
use std::hash::Hash;
use std::ops::Deref;

/// What happened to a key since the last [`Tracked::take_changes`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Change {
    /// The value was reached mutably (it may or may not have changed).
    Modified,
    /// The key was inserted or removed: the value, if any, is a new one.
    Replaced,
}

/// A `HashMap` that records the keys of changed entries.
#[derive(Debug)]
pub(crate) struct Tracked<K, V> {
    map: HashMap<K, V>,
    changes: HashMap<K, Change>,
}

// === impl Tracked ===

impl<K, V> Default for Tracked<K, V> {
    fn default() -> Self {
        Tracked {
            map: HashMap::default(),
            changes: HashMap::default(),
        }
    }
}

impl<K, V> Deref for Tracked<K, V> {
    type Target = HashMap<K, V>;

    fn deref(&self) -> &HashMap<K, V> {
        &self.map
    }
}

impl<K: Eq + Hash + Clone, V> Tracked<K, V> {
    /// The value of `key`, recorded as modified.
    pub(crate) fn get_mut<Q>(&mut self, key: &Q) -> Option<&mut V>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        let (k, _) = self.map.get_key_value(key)?;
        if !self.changes.contains_key(key) {
            self.changes.insert(k.clone(), Change::Modified);
        }
        self.map.get_mut(key)
    }

    /// The value of `key` for a change `/state` does not show.
    pub(crate) fn untracked_get_mut<Q>(&mut self, key: &Q) -> Option<&mut V>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        self.map.get_mut(key)
    }

    /// Every value, for changes `/state` does not show; [`Tracked::mark`]
    /// the ones that changed otherwise.
    pub(crate) fn untracked_values_mut(&mut self) -> hash_map::ValuesMut<'_, K, V> {
        self.map.values_mut()
    }

    pub(crate) fn insert(&mut self, key: K, value: V) -> Option<V> {
        self.changes.insert(key.clone(), Change::Replaced);
        self.map.insert(key, value)
    }

    pub(crate) fn remove<Q>(&mut self, key: &Q) -> Option<V>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        let (k, v) = self.map.remove_entry(key)?;
        self.changes.insert(k, Change::Replaced);
        Some(v)
    }

    /// Records `key` as modified.
    pub(crate) fn mark(&mut self, key: &K) {
        if self.map.contains_key(key) && !self.changes.contains_key(key) {
            self.changes.insert(key.clone(), Change::Modified);
        }
    }

    /// The keys changed since the last call, and forgets them.
    pub(crate) fn take_changes(&mut self) -> HashMap<K, Change> {
        std::mem::take(&mut self.changes)
    }

    /// Forgets the recorded changes (the caller publishes every entry).
    pub(crate) fn clear_changes(&mut self) {
        self.changes.clear();
    }

    /// Whether any change is recorded.
    pub(crate) fn has_changes(&self) -> bool {
        !self.changes.is_empty()
    }
}

impl<K, V> IntoIterator for Tracked<K, V> {
    type Item = (K, V);
    type IntoIter = hash_map::IntoIter<K, V>;

    fn into_iter(self) -> Self::IntoIter {
        self.map.into_iter()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_every_kind_of_change_once() {
        let mut m: Tracked<String, u32> = Tracked::default();
        m.insert("a".into(), 1);
        m.insert("b".into(), 2);
        let changes = m.take_changes();
        assert_eq!(changes.len(), 2);
        assert!(changes.values().all(|c| *c == Change::Replaced));
        assert!(!m.has_changes());

        *m.get_mut("a").unwrap() += 1;
        *m.get_mut("a").unwrap() += 1;
        assert!(m.get_mut("missing").is_none());
        m.remove("b");
        let changes = m.take_changes();
        assert_eq!(changes.len(), 2);
        assert_eq!(changes["a"], Change::Modified);
        assert_eq!(changes["b"], Change::Replaced);
        assert_eq!(m["a"], 3);

        *m.untracked_get_mut("a").unwrap() += 1;
        for v in m.untracked_values_mut() {
            *v += 1;
        }
        assert!(!m.has_changes());
        m.mark(&"a".to_string());
        m.mark(&"gone".to_string());
        assert_eq!(m.take_changes().len(), 1);
    }

    #[test]
    fn a_modified_key_that_is_then_replaced_stays_replaced() {
        let mut m: Tracked<String, u32> = Tracked::default();
        m.insert("a".into(), 1);
        m.take_changes();
        m.get_mut("a");
        m.insert("a".into(), 5);
        m.get_mut("a");
        assert_eq!(m.take_changes()["a"], Change::Replaced);
    }
}
