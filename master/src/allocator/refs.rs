//! Use counts of the allocator's interned tables, and their compaction.
//!
//! Role names, resource names and (name, role, kind) slots come from peers
//! (a scheduler's roles, an agent's resources), so the tables that intern
//! them must forget what nothing uses any more, or a master whose roles
//! and frameworks churn grows for ever. Each table keeps a [`Refs`] beside
//! it: a use count per entry, and how many entries are in use, so what is
//! in use is known in O(1).
//!
//! Entries are not freed one by one: their indexes are held all over the
//! books. Once a table holds more than twice what is in use plus some
//! slack, it is compacted instead: the entries in use keep their relative
//! order, so every order by index (and every allocation) stays as it was,
//! and every index into the table is rewritten through the [`Remap`]. At
//! least as many uses end between two compactions as entries are then in
//! use, plus the slack, so compaction costs O(1) per use, amortized.

/// Use counts of the entries of one interned table.
#[derive(Debug, Default)]
pub(super) struct Refs {
    counts: Vec<usize>,
    /// Entries whose count is not zero.
    live: usize,
}

/// Old index to new index, after [`Refs::compact`].
#[derive(Debug)]
pub(super) struct Remap(Vec<Option<usize>>);

// === impl Refs ===

impl Refs {
    /// A new entry, unused so far.
    pub(super) fn push(&mut self) {
        self.counts.push(0);
    }

    /// Entries in use.
    pub(super) fn live(&self) -> usize {
        self.live
    }

    /// Uses of entry `i`.
    #[cfg(test)]
    pub(super) fn count(&self, i: usize) -> usize {
        self.counts[i]
    }

    /// One more use of entry `i`; whether it was unused before.
    pub(super) fn hold(&mut self, i: usize) -> bool {
        let c = &mut self.counts[i];
        *c += 1;
        if *c == 1 {
            self.live += 1;
        }
        *c == 1
    }

    /// One use fewer of entry `i`; whether it is unused now.
    pub(super) fn release(&mut self, i: usize) -> bool {
        let c = &mut self.counts[i];
        debug_assert!(*c > 0, "entry {i} released more often than held");
        if *c == 0 {
            return false;
        }
        *c -= 1;
        if *c == 0 {
            self.live -= 1;
        }
        *c == 0
    }

    /// Whether the table holds more than twice what is in use, plus
    /// `slack`: time to compact it.
    pub(super) fn over(&self, slack: usize) -> bool {
        self.counts.len() > 2 * self.live + slack
    }

    /// Drops the unused entries; the others keep their order.
    pub(super) fn compact(&mut self) -> Remap {
        let mut next = 0;
        let remap = self
            .counts
            .iter()
            .map(|&c| {
                (c > 0).then(|| {
                    next += 1;
                    next - 1
                })
            })
            .collect();
        self.counts.retain(|&c| c > 0);
        Remap(remap)
    }
}

// === impl Remap ===

impl Remap {
    /// The new index of old entry `i`; `None` when it was dropped.
    pub(super) fn get(&self, i: usize) -> Option<usize> {
        self.0.get(i).copied().flatten()
    }

    /// The new index of an entry that is in use (so kept).
    pub(super) fn kept(&self, i: usize) -> usize {
        self.get(i).expect("an entry in use is kept")
    }

    /// Drops from `table` (parallel to the [`Refs`] before compaction)
    /// the entries that were dropped.
    pub(super) fn retain<T>(&self, table: &mut Vec<T>) {
        debug_assert_eq!(table.len(), self.0.len());
        let mut i = 0;
        table.retain(|_| {
            i += 1;
            self.get(i - 1).is_some()
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_uses_and_compacts_in_order() {
        let mut refs = Refs::default();
        let mut table = vec!["a", "b", "c", "d"];
        for _ in &table {
            refs.push();
        }
        assert!(refs.hold(1));
        assert!(!refs.hold(1));
        assert!(refs.hold(3));
        assert!(refs.hold(0));
        assert_eq!(refs.live(), 3);
        assert!(!refs.release(1));
        assert!(refs.release(0));
        assert!(refs.release(3));
        assert_eq!(refs.live(), 1);
        assert!(refs.over(1) && !refs.over(2));
        let remap = refs.compact();
        remap.retain(&mut table);
        assert_eq!(table, ["b"]);
        assert_eq!(
            (0..4).map(|i| remap.get(i)).collect::<Vec<_>>(),
            [None, Some(0), None, None]
        );
        assert_eq!((refs.live(), refs.count(0)), (1, 1));
        assert!(!refs.over(0));
        // A new entry comes after the ones kept.
        refs.push();
        assert!(refs.hold(1));
        assert_eq!(refs.live(), 2);
    }
}
