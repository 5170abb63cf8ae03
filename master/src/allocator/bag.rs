//! Compact resource bags: the allocator's own books.
//!
//! A [`Resources`] carries a `String` name and role per entry, so copying
//! one costs a heap allocation per string. The allocator copies resources
//! on every offer (into the framework's books) and back on every decline,
//! which made malloc and cache misses the bulk of an allocation cycle.
//! Inside the allocator, every (name, role, kind) triple is therefore
//! interned once as a *slot* ([`Slots`]) and books are kept as a [`Bag`]:
//! a short vector of (slot, value) sorted by slot. Scalars need no heap at
//! all; ranges and sets keep their one vector or set.
//!
//! Bag arithmetic is exactly [`Resources`] arithmetic (same rounding, same
//! normal form), so converting between the two never changes a quantity;
//! the tests below check that against `Resources` itself.
//!
//! A slot is in use while a live agent's total has it (every bag of the
//! books is part of some agent's total), and a scalar name while a slot in
//! use or a quota names it; [`Slots::compact`] and [`Names::compact`] drop
//! the others (see [`super::refs`]).

use agora_proto::hash::HashMap;
use std::hash::{Hash, Hasher};

use agora_proto::{Resource, Resources, Value};

use super::refs::{Refs, Remap};

/// Interned (name, role, kind) triples; a scalar slot also has its entry
/// in [`Names`].
#[derive(Debug, Default)]
pub(super) struct Slots {
    slots: Vec<Slot>,
    /// Slots by resource name (few per name: one per role and kind).
    by_name: HashMap<String, Vec<u32>>,
    /// Uses of each slot: the live agents whose total has it.
    refs: Refs,
}

/// Interned scalar resource names: a share is a vector indexed by them.
#[derive(Debug, Default)]
pub(super) struct Names {
    names: Vec<String>,
    /// Uses of each name: the scalar slots in use with that name, and
    /// pins (`cpus`, `mem`, names in a quota).
    pub(super) refs: Refs,
}

/// One interned (name, role, kind) triple.
#[derive(Debug)]
pub(super) struct Slot {
    pub(super) name: String,
    pub(super) role: String,
    kind: u8,
    /// Whether `role` is not the default role.
    pub(super) reserved: bool,
    /// Index of `name` in the allocator's scalar names (shares), for
    /// scalar slots; `usize::MAX` otherwise.
    pub(super) scalar: usize,
}

/// Resources as (slot, value) pairs, sorted by slot, without empty values.
#[derive(Debug, Clone, Default, PartialEq)]
pub(super) struct Bag {
    items: Vec<(u32, Value)>,
}

// === impl Names ===

impl Names {
    /// The index of `name`, interning it when new.
    pub(super) fn intern(&mut self, name: &str) -> usize {
        match self.position(name) {
            Some(i) => i,
            None => {
                self.names.push(name.to_string());
                self.refs.push();
                self.names.len() - 1
            }
        }
    }

    /// The index of `name`, when interned.
    pub(super) fn position(&self, name: &str) -> Option<usize> {
        self.names.iter().position(|n| n == name)
    }

    /// Names interned, in use or not.
    pub(super) fn len(&self) -> usize {
        self.names.len()
    }

    /// Drops the names not in use; the others keep their order. Every
    /// index of a name kept must then be rewritten through the result,
    /// and no index of a name dropped may remain.
    pub(super) fn compact(&mut self) -> Remap {
        let remap = self.refs.compact();
        remap.retain(&mut self.names);
        remap
    }

    #[cfg(test)]
    pub(super) fn as_slice(&self) -> &[String] {
        &self.names
    }
}

// === impl Slots ===

impl Slots {
    /// The slot of a resource entry, interning it (and its scalar name in
    /// `names`) when new. A new slot is not in use until
    /// [`Slots::hold`].
    pub(super) fn intern(&mut self, names: &mut Names, r: &Resource) -> u32 {
        if let Some(s) = self.lookup(r) {
            return s;
        }
        let kind = kind(&r.value);
        let scalar = if kind == 0 {
            names.intern(&r.name)
        } else {
            usize::MAX
        };
        let s = u32::try_from(self.slots.len()).expect("fewer than 2^32 resource kinds");
        self.slots.push(Slot {
            name: r.name.clone(),
            role: r.role.clone(),
            kind,
            reserved: r.is_reserved(),
            scalar,
        });
        self.by_name.entry(r.name.clone()).or_default().push(s);
        self.refs.push();
        s
    }

    /// One more use of slot `s` (and of its scalar name, when the slot
    /// was unused).
    pub(super) fn hold(&mut self, names: &mut Names, s: u32) {
        let scalar = self.slots[s as usize].scalar;
        if self.refs.hold(s as usize) && scalar != usize::MAX {
            names.refs.hold(scalar);
        }
    }

    /// One use fewer of slot `s` (and of its scalar name, when the slot
    /// is unused now).
    pub(super) fn release(&mut self, names: &mut Names, s: u32) {
        let scalar = self.slots[s as usize].scalar;
        if self.refs.release(s as usize) && scalar != usize::MAX {
            names.refs.release(scalar);
        }
    }

    /// Slots interned, in use or not.
    pub(super) fn len(&self) -> usize {
        self.slots.len()
    }

    /// Slots in use.
    pub(super) fn live(&self) -> usize {
        self.refs.live()
    }

    /// Whether the table holds more than twice what is in use, plus `slack`.
    pub(super) fn over(&self, slack: usize) -> bool {
        self.refs.over(slack)
    }

    /// Drops the slots not in use; the others keep their order, so a bag
    /// rewritten through the result (see [`Bag::remap`]) stays sorted.
    pub(super) fn compact(&mut self) -> Remap {
        let remap = self.refs.compact();
        remap.retain(&mut self.slots);
        self.by_name.retain(|_, ids| {
            ids.retain_mut(|s| match remap.get(*s as usize) {
                Some(n) => {
                    *s = slot_id(n);
                    true
                }
                None => false,
            });
            !ids.is_empty()
        });
        remap
    }

    /// Rewrites the slots' scalar name indexes after [`Names::compact`];
    /// every slot must be in use (compacted first).
    pub(super) fn remap_names(&mut self, remap: &Remap) {
        for slot in &mut self.slots {
            if slot.scalar != usize::MAX {
                slot.scalar = remap.kept(slot.scalar);
            }
        }
    }

    /// Uses of slot `s`, for checks.
    #[cfg(test)]
    pub(super) fn uses(&self, s: u32) -> usize {
        self.refs.count(s as usize)
    }

    /// The slot of a resource entry, when it was ever interned.
    pub(super) fn lookup(&self, r: &Resource) -> Option<u32> {
        let kind = kind(&r.value);
        self.by_name.get(r.name.as_str()).and_then(|ids| {
            ids.iter().copied().find(|&s| {
                let slot = &self.slots[s as usize];
                slot.kind == kind && slot.role == r.role
            })
        })
    }

    pub(super) fn get(&self, s: u32) -> &Slot {
        &self.slots[s as usize]
    }

    /// `r` as a bag, interning what is new.
    pub(super) fn bag(&mut self, names: &mut Names, r: &Resources) -> Bag {
        let mut items: Vec<(u32, Value)> = r
            .iter()
            .map(|item| (self.intern(names, item), item.value.clone()))
            .collect();
        items.sort_by_key(|(s, _)| *s);
        Bag { items }
    }

    /// The part of `r` made of known slots, as a bag: what the books can
    /// possibly hold of it (an unknown slot was never allocated).
    pub(super) fn known_bag(&self, r: &Resources) -> Bag {
        let mut items: Vec<(u32, Value)> = r
            .iter()
            .filter_map(|item| self.lookup(item).map(|s| (s, item.value.clone())))
            .collect();
        items.sort_by_key(|(s, _)| *s);
        Bag { items }
    }

    /// The bag as [`Resources`].
    pub(super) fn resources(&self, bag: &Bag) -> Resources {
        let mut out = Resources::new();
        self.add_to(&mut out, bag);
        out
    }

    /// `into += bag`.
    pub(super) fn add_to(&self, into: &mut Resources, bag: &Bag) {
        for (s, value) in &bag.items {
            let slot = self.get(*s);
            into.add_resource(Resource {
                name: slot.name.clone(),
                role: slot.role.clone(),
                value: value.clone(),
            });
        }
    }
}

// === impl Bag ===

impl Bag {
    pub(super) fn is_empty(&self) -> bool {
        self.items.is_empty()
    }

    /// Rewrites the slots after [`Slots::compact`]; every slot of the bag
    /// must be in use. The order is kept, so the bag stays sorted.
    pub(super) fn remap(&mut self, remap: &Remap) {
        for (s, _) in &mut self.items {
            *s = slot_id(remap.kept(*s as usize));
        }
    }

    /// (slot, value) pairs in slot order.
    pub(super) fn iter(&self) -> impl Iterator<Item = &(u32, Value)> {
        self.items.iter()
    }

    /// The scalar entries as (slot, quantity).
    pub(super) fn scalars(&self) -> impl Iterator<Item = (u32, f64)> + '_ {
        self.items.iter().filter_map(|(s, v)| match v {
            Value::Scalar(x) => Some((*s, *x)),
            _ => None,
        })
    }

    fn find(&self, s: u32) -> Option<&Value> {
        self.items
            .binary_search_by_key(&s, |(k, _)| *k)
            .ok()
            .map(|i| &self.items[i].1)
    }

    /// `self += other`.
    pub(super) fn add(&mut self, other: &Bag) {
        if self.items.is_empty() {
            self.items.clone_from(&other.items);
            return;
        }
        for (s, v) in &other.items {
            match self.items.binary_search_by_key(s, |(k, _)| *k) {
                Ok(i) => self.items[i].1.add(v),
                Err(i) => self.items.insert(i, (*s, v.clone())),
            }
        }
    }

    /// `self += other`, reusing `other`'s storage when `self` is empty.
    pub(super) fn add_owned(&mut self, other: Bag) {
        if self.items.is_empty() {
            *self = other;
        } else {
            self.add(&other);
        }
    }

    /// Whether every entry of `r` is held here (an entry of an unknown
    /// slot never is).
    pub(super) fn contains_resources(&self, slots: &Slots, r: &Resources) -> bool {
        r.iter().all(|item| {
            slots
                .lookup(item)
                .and_then(|s| self.find(s))
                .is_some_and(|mine| mine.contains(&item.value))
        })
    }

    /// Whether every entry of `other` is held here.
    pub(super) fn contains(&self, other: &Bag) -> bool {
        other
            .items
            .iter()
            .all(|(s, v)| self.find(*s).is_some_and(|mine| mine.contains(v)))
    }

    /// `self - other`, saturating (what `self` does not hold is ignored).
    pub(super) fn sub(&mut self, other: &Bag) {
        if other.items.is_empty() {
            return;
        }
        if other.contains(self) {
            // All of it (a whole offer declined): no arithmetic.
            self.items.clear();
            return;
        }
        for (s, mine) in &mut self.items {
            if let Some(theirs) = other.find(*s) {
                *mine = mine.sub(theirs);
            }
        }
        self.items.retain(|(_, v)| !v.is_empty());
    }

    /// Takes out of `self` the part of `want` that it holds and returns
    /// it: the `held.saturating_sub(held.saturating_sub(want))` of
    /// [`Resources`], with the same rounding.
    pub(super) fn take_part(&mut self, want: &Bag) -> Bag {
        if want.contains(self) {
            // All of it (a whole offer declined): move, do not copy.
            return std::mem::take(self);
        }
        let mut part = Vec::new();
        for (s, mine) in &mut self.items {
            let Some(theirs) = want.find(*s) else {
                continue;
            };
            let rest = mine.sub(theirs);
            let taken = mine.sub(&rest);
            if !taken.is_empty() {
                part.push((*s, taken));
            }
            *mine = rest;
        }
        self.items.retain(|(_, v)| !v.is_empty());
        Bag { items: part }
    }

    /// A 64-bit hash of the exact content. Equal bags have equal
    /// fingerprints; a collision between different bags (about 2^-64)
    /// could only make a filter hold a little longer, never hand out a
    /// resource twice (callers also compare cpus and mem).
    pub(super) fn fingerprint(&self) -> u64 {
        let mut h = FoldHasher(0x243F_6A88_85A3_08D3);
        for (s, v) in &self.items {
            h.write_u32(*s);
            match v {
                Value::Scalar(x) => h.write_u64(x.to_bits()),
                Value::Ranges(rs) => {
                    h.write_usize(rs.len());
                    for r in rs {
                        h.write_u64(r.begin);
                        h.write_u64(r.end);
                    }
                }
                Value::Set(items) => {
                    h.write_usize(items.len());
                    for x in items {
                        x.hash(&mut h);
                    }
                }
            }
        }
        h.finish()
    }
}

/// A fast, non-cryptographic hasher for fingerprints of our own data.
struct FoldHasher(u64);

impl Hasher for FoldHasher {
    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.write_u64(u64::from(*b));
        }
    }

    fn write_u64(&mut self, n: u64) {
        self.0 = (self.0.rotate_left(5) ^ n).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    }

    fn finish(&self) -> u64 {
        self.0
    }
}

/// A slot index as stored in bags (slots are fewer than 2^32: checked
/// when interned).
fn slot_id(s: usize) -> u32 {
    u32::try_from(s).expect("fewer than 2^32 resource kinds")
}

fn kind(v: &Value) -> u8 {
    match v {
        Value::Scalar(_) => 0,
        Value::Ranges(_) => 1,
        Value::Set(_) => 2,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn arb_resources() -> impl Strategy<Value = Resources> {
        let scalar = (
            prop_oneof![Just("cpus"), Just("mem"), Just("disk")],
            prop_oneof![Just("*"), Just("web")],
            0u32..5000,
        )
            .prop_map(|(n, role, v)| {
                Resource::scalar(n, f64::from(v) / 1000.0)
                    .unwrap()
                    .with_role(role)
                    .unwrap()
            });
        let ranges = (
            prop_oneof![Just("*"), Just("web")],
            proptest::collection::vec((0u64..60, 0u64..6), 0..5),
        )
            .prop_map(|(role, rs)| {
                let rs: Vec<(u64, u64)> = rs.into_iter().map(|(b, l)| (b, b + l)).collect();
                Resource::ranges("ports", &rs)
                    .map(|r| r.with_role(role).unwrap())
                    .unwrap_or_else(|_| Resource::scalar("cpus", 0.0).unwrap())
            });
        let set = proptest::collection::btree_set("[a-c]", 0..3).prop_map(|s| Resource {
            name: "gpus".into(),
            role: "*".into(),
            value: Value::Set(s),
        });
        proptest::collection::vec(prop_oneof![scalar, ranges, set], 0..6).prop_map(|items| {
            let mut out = Resources::new();
            for r in items {
                out.add_resource(r);
            }
            out
        })
    }

    proptest! {
        /// Bag arithmetic agrees with `Resources` arithmetic exactly.
        #[test]
        fn bags_do_what_resources_do(a in arb_resources(), b in arb_resources()) {
            let mut slots = Slots::default();
            let mut names = Names::default();
            let (ba, bb) = (slots.bag(&mut names, &a), slots.bag(&mut names, &b));
            prop_assert_eq!(slots.resources(&ba), a.clone());

            let mut sum = ba.clone();
            sum.add(&bb);
            prop_assert_eq!(slots.resources(&sum), &a + &b);

            let mut diff = ba.clone();
            diff.sub(&bb);
            prop_assert_eq!(slots.resources(&diff), a.saturating_sub(&b));

            prop_assert_eq!(ba.contains(&bb), a.contains(&b));

            let mut held = ba.clone();
            let part = held.take_part(&bb);
            prop_assert_eq!(slots.resources(&part), a.saturating_sub(&a.saturating_sub(&b)));
            prop_assert_eq!(slots.resources(&held), a.saturating_sub(&b));

            // Equal content, equal fingerprint, whatever the history.
            let again = slots.bag(&mut names, &slots.resources(&sum));
            prop_assert_eq!(again.fingerprint(), sum.fingerprint());
        }
    }

    #[test]
    fn unknown_slots_are_left_out_of_known_bags() {
        let mut slots = Slots::default();
        let mut names = Names::default();
        let known = Resources::parse("cpus:2;ports:[1-5]").unwrap();
        slots.bag(&mut names, &known);
        let asked = Resources::parse("cpus:1;gpus:3;cpus(web):1").unwrap();
        let bag = slots.known_bag(&asked);
        assert_eq!(slots.resources(&bag), Resources::parse("cpus:1").unwrap());
        assert_eq!(names.as_slice(), ["cpus".to_string()]);
    }

    /// Compaction drops the slots and names no longer in use, and bags of
    /// the slots kept mean what they meant.
    #[test]
    fn compaction_keeps_what_is_in_use_and_its_meaning() {
        let mut slots = Slots::default();
        let mut names = Names::default();
        let gone = Resources::parse("gpus(old):2;cpus(old):1").unwrap();
        let kept = Resources::parse("cpus:2;mem(web):64;ports:[1-5]").unwrap();
        let gone_bag = slots.bag(&mut names, &gone);
        let mut bag = slots.bag(&mut names, &kept);
        for (s, _) in gone_bag.iter().chain(bag.iter()) {
            slots.hold(&mut names, *s);
        }
        assert_eq!((slots.len(), slots.live(), names.refs.live()), (5, 5, 3));
        for (s, _) in gone_bag.iter() {
            slots.release(&mut names, *s);
        }
        // `cpus` is still used by `cpus:2`; `gpus` by nothing.
        assert_eq!((slots.live(), names.refs.live()), (3, 2));
        let remap = slots.compact();
        bag.remap(&remap);
        let names_remap = names.compact();
        slots.remap_names(&names_remap);
        assert_eq!((slots.len(), names.len()), (3, 2));
        assert_eq!(slots.resources(&bag), kept);
        assert_eq!(slots.known_bag(&kept), bag);
        assert!(slots
            .known_bag(&gone)
            .iter()
            .all(|(s, _)| slots.get(*s).role != "old"));
        for (s, _) in bag.scalars() {
            let slot = slots.get(s);
            assert_eq!(names.as_slice()[slot.scalar], slot.name);
        }
    }
}
