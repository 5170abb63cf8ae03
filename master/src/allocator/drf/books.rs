//! The books: what is allocated where.
//!
//! Inside the allocator, resources are kept as [`Bag`]s of interned
//! (name, role, kind) slots rather than [`Resources`] (whose every entry
//! owns two `String`s): what each framework holds on an agent lives on the
//! agent, and the agent's free pool is kept both as the `Resources` that
//! offers hand out and as a bag. Offering a whole free pool therefore
//! *moves* both into the offer and the books, and booking it allocates
//! nothing; the strings of the returned [`Allocation`] are the only
//! per-offer heap work left. Each booking also adds to the framework's and
//! the role's allocated [`Scalars`], from which the sorter computes shares.

use agora_proto::{round_scalar, AgentId, FrameworkId, Resource, Resources, Value, DEFAULT_ROLE};

#[cfg(test)]
use super::filters::filter_bit;
use super::*;
use crate::allocator::bag::{Bag, Names, Slots};
use crate::allocator::refs::{Refs, Remap};

/// Quantities per interned scalar name; missing entries are zero.
#[derive(Debug, Clone, Default, PartialEq)]
pub(super) struct Scalars(pub(super) Vec<f64>);

/// The roles `r` has resources reserved for, each once.
pub(super) fn reserved_roles(r: &Resources) -> Vec<&str> {
    let mut roles: Vec<&str> = r
        .iter()
        .filter(|item| item.role != DEFAULT_ROLE)
        .map(|item| item.role.as_str())
        .collect();
    roles.sort_unstable();
    roles.dedup();
    roles
}

pub(super) fn normalized_roles(roles: &[String]) -> Vec<String> {
    if roles.is_empty() {
        vec![DEFAULT_ROLE.to_string()]
    } else {
        let mut out: Vec<String> = Vec::with_capacity(roles.len());
        for r in roles {
            if !out.contains(r) {
                out.push(r.clone());
            }
        }
        out
    }
}

// === impl Scalars ===

impl Scalars {
    pub(super) fn get(&self, i: usize) -> f64 {
        self.0.get(i).copied().unwrap_or(0.0)
    }

    pub(super) fn add(&mut self, i: usize, v: f64) {
        if self.0.len() <= i {
            self.0.resize(i + 1, 0.0);
        }
        self.0[i] = round_scalar(self.0[i] + v).max(0.0);
    }

    pub(super) fn is_zero(&self) -> bool {
        self.0.iter().all(|v| *v <= 0.0)
    }

    /// Renumbers after the scalar names were compacted. A name dropped is
    /// held by nothing, so its quantity here is zero and goes with it.
    pub(super) fn remap(&mut self, remap: &Remap) {
        let mut out = Vec::new();
        for (i, &v) in self.0.iter().enumerate() {
            if let Some(j) = remap.get(i) {
                if out.len() <= j {
                    out.resize(j + 1, 0.0);
                }
                out[j] = v;
            }
        }
        self.0 = out;
    }
}

// === impl DrfAllocator ===

impl DrfAllocator {
    /// What is allocated to the framework on the agent, over all its roles.
    pub fn allocated(&self, framework_id: &FrameworkId, agent_id: &AgentId) -> Resources {
        let (Some(&f), Some(&a)) = (
            self.framework_index.get(framework_id),
            self.agent_index.get(agent_id),
        ) else {
            return Resources::new();
        };
        self.allocated_on(f, a)
    }

    /// What is free on the agent.
    pub fn available(&self, agent_id: &AgentId) -> Resources {
        self.agent_index
            .get(agent_id)
            .and_then(|&a| self.ag(a))
            .map(|ag| ag.available.clone())
            .unwrap_or_default()
    }

    /// Scalars allocated for the role (by name), e.g. to check a quota.
    pub fn role_allocated(&self, role: &str, name: &str) -> f64 {
        match (self.role_index.get(role), self.names.position(name)) {
            (Some(&r), Some(i)) => self.roles[r].allocated.get(i),
            _ => 0.0,
        }
    }

    /// Adds (`sign` 1.0) or subtracts (-1.0) the scalars of `r` to `into`.
    pub(super) fn accumulate(names: &mut Names, into: &mut Scalars, r: &Resources, sign: f64) {
        for item in r.iter() {
            if let Value::Scalar(v) = item.value {
                let i = names.intern(&item.name);
                into.add(i, sign * v);
            }
        }
    }

    /// Adds (`sign` 1.0) or subtracts (-1.0) the scalars of a bag to `into`.
    pub(super) fn accumulate_bag(slots: &Slots, into: &mut Scalars, bag: &Bag, sign: f64) {
        for (s, v) in bag.scalars() {
            into.add(slots.get(s).scalar, sign * v);
        }
    }

    /// `cpus` and `mem` of a bag, summed over roles.
    pub(super) fn cpus_mem(slots: &Slots, bag: &Bag) -> (f64, f64) {
        let (mut cpus, mut mem) = (0.0, 0.0);
        for (s, v) in bag.scalars() {
            match slots.get(s).scalar {
                CPUS => cpus += v,
                MEM => mem += v,
                _ => {}
            }
        }
        (round_scalar(cpus), round_scalar(mem))
    }

    /// The scalars of a bag per name index, when each occurs once and
    /// only the first [`CACHED_NAMES`] names occur.
    pub(super) fn by_name(slots: &Slots, bag: &Bag) -> Option<[f64; CACHED_NAMES]> {
        let mut by_name = [0.0; CACHED_NAMES];
        for (s, v) in bag.scalars() {
            match by_name.get_mut(slots.get(s).scalar) {
                Some(x) if *x == 0.0 => *x = v,
                _ => return None,
            }
        }
        Some(by_name)
    }

    /// Re-derives the cached views of the agent's free pool after it changed.
    pub(super) fn refresh(slots: &Slots, ag: &mut Ag) {
        (ag.free_cpus, ag.free_mem) = Self::cpus_mem(slots, &ag.free);
        ag.free_by_name = Self::by_name(slots, &ag.free);
        ag.free_sig = ag.free.fingerprint();
        ag.free_reserved = ag.free.iter().any(|(s, _)| slots.get(*s).reserved);
        ag.dormant = None;
    }

    pub(super) fn set_framework_roles(&mut self, f: usize, roles: &[String]) {
        self.epoch += 1;
        let roles = normalized_roles(roles);
        let idx: Vec<usize> = roles.iter().map(|r| self.role_idx(r)).collect();
        let Some(fw) = self.frameworks.get_mut(f).and_then(Option::as_mut) else {
            return;
        };
        for fr in &mut fw.roles {
            fr.subscribed = idx.contains(&fr.role);
        }
        for r in idx {
            if !fw.roles.iter().any(|fr| fr.role == r) {
                self.role_refs.hold(r);
                fw.roles.push(FwRole {
                    role: r,
                    subscribed: true,
                    suppressed: false,
                    allocated: Scalars::default(),
                    allocations: 0,
                });
            }
        }
        // Roles left behind with nothing allocated are forgotten.
        Self::forget_idle_roles(fw, &mut self.role_refs);
    }

    /// Drops the framework's roles it neither subscribes to nor holds
    /// anything for.
    pub(super) fn forget_idle_roles(fw: &mut Fw, role_refs: &mut Refs) {
        fw.roles.retain(|fr| {
            let keep = fr.subscribed || !fr.allocated.is_zero();
            if !keep {
                role_refs.release(fr.role);
            }
            keep
        });
    }

    /// Moves `resources` (capped to what is free) from the agent's free
    /// pool to the framework, for `role`. Returns what was actually moved.
    pub(super) fn take(
        &mut self,
        f: usize,
        a: usize,
        role: usize,
        resources: &Resources,
    ) -> Resources {
        let Some(ag) = self.agents.get_mut(a).and_then(Option::as_mut) else {
            return Resources::new();
        };
        let taken = if ag.available.contains(resources) {
            resources.clone()
        } else {
            let rest = ag.available.saturating_sub(resources);
            ag.available.saturating_sub(&rest)
        };
        if taken.is_empty() {
            return taken;
        }
        ag.available = ag.available.saturating_sub(&taken);
        // Every slot of an agent's resources was interned with the agent.
        let bag = self.slots.known_bag(&taken);
        ag.free.sub(&bag);
        Self::refresh(&self.slots, ag);
        self.book(f, a, role, bag, None);
        taken
    }

    /// Records `taken` (already out of the agent's free pool) as allocated
    /// to the framework for `role`; `by_name` is its scalars per name when
    /// known (see [`Ag::free_by_name`]).
    pub(super) fn book(
        &mut self,
        f: usize,
        a: usize,
        role: usize,
        taken: Bag,
        by_name: Option<[f64; CACHED_NAMES]>,
    ) {
        if taken.is_empty() {
            return;
        }
        let (Some(fw), Some(ag)) = (
            self.frameworks.get_mut(f).and_then(Option::as_mut),
            self.agents.get_mut(a).and_then(Option::as_mut),
        ) else {
            return;
        };
        let fr = match fw.roles.iter().position(|fr| fr.role == role) {
            Some(i) => &mut fw.roles[i],
            None => {
                self.role_refs.hold(role);
                fw.roles.push(FwRole {
                    role,
                    subscribed: false,
                    suppressed: false,
                    allocated: Scalars::default(),
                    allocations: 0,
                });
                fw.roles.last_mut().expect("just pushed")
            }
        };
        match by_name {
            // The same additions as per entry: one entry per name.
            Some(sums) => {
                for (i, &v) in sums.iter().enumerate() {
                    if v != 0.0 {
                        fr.allocated.add(i, v);
                        self.roles[role].allocated.add(i, v);
                    }
                }
            }
            None => {
                Self::accumulate_bag(&self.slots, &mut fr.allocated, &taken, 1.0);
                Self::accumulate_bag(&self.slots, &mut self.roles[role].allocated, &taken, 1.0);
            }
        }
        match ag
            .held
            .iter_mut()
            .find(|h| h.framework == f && h.role == role)
        {
            Some(h) => h.bag.add_owned(taken),
            None => {
                self.role_refs.hold(role);
                ag.held.push(Held {
                    framework: f,
                    role,
                    bag: taken,
                });
            }
        }
    }

    /// Takes `resources` out of the framework's books on the agent and
    /// returns what it really held of them.
    pub(super) fn release(&mut self, f: usize, a: usize, resources: &Resources) -> Bag {
        let left = self.slots.known_bag(resources);
        self.release_bag(f, a, left)
    }

    /// [`DrfAllocator::release`] of a bag.
    pub(super) fn release_bag(&mut self, f: usize, a: usize, mut left: Bag) -> Bag {
        let (Some(fw), Some(ag)) = (
            self.frameworks.get_mut(f).and_then(Option::as_mut),
            self.agents.get_mut(a).and_then(Option::as_mut),
        ) else {
            return Bag::default();
        };
        let mut freed = Bag::default();
        // Reserved resources belong to their role's entry; unreserved ones
        // come back from the entries in allocation order.
        let mut order: Vec<usize> = (0..ag.held.len())
            .filter(|&i| ag.held[i].framework == f)
            .collect();
        if order.len() > 1 {
            let slots = &self.slots;
            let held = &ag.held;
            order.sort_by_key(|&i| {
                let role = &self.roles[held[i].role].name;
                !left.iter().any(|(s, _)| slots.get(*s).role == *role)
            });
        }
        for i in order {
            if left.is_empty() {
                break;
            }
            let Held { role, bag, .. } = &mut ag.held[i];
            let part = bag.take_part(&left);
            if part.is_empty() {
                continue;
            }
            left.sub(&part);
            if let Some(fr) = fw.roles.iter_mut().find(|fr| fr.role == *role) {
                Self::accumulate_bag(&self.slots, &mut fr.allocated, &part, -1.0);
            }
            Self::accumulate_bag(&self.slots, &mut self.roles[*role].allocated, &part, -1.0);
            freed.add_owned(part);
        }
        let role_refs = &mut self.role_refs;
        ag.held.retain(|h| {
            if h.bag.is_empty() {
                role_refs.release(h.role);
            }
            !h.bag.is_empty()
        });
        Self::forget_idle_roles(fw, role_refs);
        freed
    }

    pub(super) fn give_back(&mut self, a: usize, freed: &Bag) {
        if freed.is_empty() {
            return;
        }
        if let Some(ag) = self.agents.get_mut(a).and_then(Option::as_mut) {
            self.slots.add_to(&mut ag.available, freed);
            ag.free.add(freed);
            Self::refresh(&self.slots, ag);
        }
    }

    /// The role a framework's used resources count for when the caller
    /// does not say: the role they are reserved for, else its first role.
    pub(super) fn usage_role(&mut self, f: usize, r: &Resource) -> usize {
        if r.role != DEFAULT_ROLE {
            return self.role_idx(&r.role.clone());
        }
        let first = self
            .fw(f)
            .and_then(|fw| fw.roles.iter().find(|fr| fr.subscribed).map(|fr| fr.role));
        match first {
            Some(role) => role,
            None => self.role_idx(DEFAULT_ROLE),
        }
    }

    pub(super) fn use_resources(&mut self, f: usize, a: usize, resources: &Resources) {
        let mut by_role: Vec<(usize, Resources)> = Vec::new();
        for item in resources.iter() {
            let role = self.usage_role(f, item);
            match by_role.iter_mut().find(|(r, _)| *r == role) {
                Some((_, res)) => res.add_resource(item.clone()),
                None => {
                    let mut res = Resources::new();
                    res.add_resource(item.clone());
                    by_role.push((role, res));
                }
            }
        }
        for (role, res) in by_role {
            self.take(f, a, role, &res);
        }
    }

    /// [`DrfAllocator::take`] of everything free on the agent: moves it
    /// instead of subtracting.
    pub(super) fn take_all(&mut self, f: usize, a: usize, role: usize) -> Resources {
        let Some(ag) = self.agents.get_mut(a).and_then(Option::as_mut) else {
            return Resources::new();
        };
        let taken = std::mem::take(&mut ag.available);
        let bag = std::mem::take(&mut ag.free);
        let by_name = ag.free_by_name;
        Self::refresh(&self.slots, ag);
        self.book(f, a, role, bag, by_name);
        taken
    }

    pub(super) fn allocated_on(&self, f: usize, a: usize) -> Resources {
        let mut held = Bag::default();
        if let Some(ag) = self.ag(a) {
            for h in ag.held.iter().filter(|h| h.framework == f) {
                held.add(&h.bag);
            }
        }
        self.slots.resources(&held)
    }
}

#[cfg(test)]
impl DrfAllocator {
    /// Checks every cached view against what it caches: the agents' free
    /// bags, cpus, mem and fingerprints, and the filter expiry bounds.
    pub(super) fn check_books(&self) -> Result<(), String> {
        for ag in self.agents.iter().flatten() {
            if self.slots.known_bag(&ag.available) != ag.free
                || self.slots.resources(&ag.free) != ag.available
            {
                return Err(format!("agent {}: free bag and available differ", ag.id));
            }
            let (cpus, mem) = Self::cpus_mem(&self.slots, &ag.free);
            if (cpus, mem) != (ag.free_cpus, ag.free_mem) || ag.free.fingerprint() != ag.free_sig {
                return Err(format!("agent {}: stale cpus, mem or fingerprint", ag.id));
            }
            match ag.next_expiry {
                Some(t) if ag.filters.values().all(|fl| fl.until >= t) => {}
                None if ag.filters.is_empty() => {}
                _ => return Err(format!("agent {}: filter expiry bound too late", ag.id)),
            }
            if ag
                .filters
                .keys()
                .any(|&f| ag.filter_bits & filter_bit(f) == 0)
            {
                return Err(format!("agent {}: a filter without its bit", ag.id));
            }
            if ag.free_by_name != Self::by_name(&self.slots, &ag.free) {
                return Err(format!("agent {}: stale free scalars by name", ag.id));
            }
        }
        self.check_interned()
    }
}

#[cfg(test)]
mod tests {
    use crate::allocator::drf::tests::*;

    #[test]
    fn reservations_go_only_to_their_role() {
        let mut alloc = DrfAllocator::new(opts());
        alloc.add_framework(&fid("plain"), &[], true);
        alloc.add_agent(
            &aid("s1"),
            &r("cpus(web):4;mem(web):1024;cpus:1;mem:512"),
            &[],
            true,
        );
        let out = alloc.allocate(Instant::now());
        assert_eq!(out.len(), 1);
        assert_eq!(out[0].resources, r("cpus:1;mem:512"));
        alloc.add_framework(&fid("web"), &["web".into()], true);
        let out = alloc.allocate(Instant::now());
        assert_eq!(out.len(), 1);
        assert_eq!(out[0].framework_id, fid("web"));
        assert_eq!(out[0].resources, r("cpus(web):4;mem(web):1024"));
    }

    #[test]
    fn reserved_resources_are_allocated_for_their_role() {
        let mut alloc = DrfAllocator::new(opts());
        alloc.add_framework(&fid("web"), &["web".into(), "*".into()], true);
        alloc.add_agent(&aid("s1"), &r("cpus(web):4;mem(web):1024"), &[], true);
        let out = alloc.allocate(Instant::now());
        assert_eq!(out.len(), 1);
        assert_eq!(out[0].role, "web");
        // Reserved for a role nobody is in: never offered.
        alloc.add_agent(&aid("s2"), &r("cpus(db):4;mem(db):1024"), &[], true);
        assert!(alloc.allocate(Instant::now()).is_empty());
    }
}
