//! Hierarchical dominant resource fairness with quota.
//!
//! **Shares.** Every scalar resource name is interned to an index, so a
//! share is a few float divisions over a small vector. A role's share is
//! the dominant share (max over resources of allocated / cluster total) of
//! everything allocated *for that role*, divided by the role's weight. A
//! framework's share in a role is the dominant share of what is allocated
//! to it for that role; a framework in several roles is a client of each.
//!
//! **A cycle** runs three stages over the agents, starting at a rotating
//! position so no agent is always first:
//!
//! 1. resource requests (`REQUEST`), served once, ahead of fairness;
//! 2. quota: each role below its guarantee, lowest share first, is offered
//!    what it still needs (quota'd scalars capped at the shortfall);
//! 3. fair share: each agent's free resources go to the role with the
//!    lowest weighted share that has an eligible framework, then to that
//!    role's framework with the lowest share. Unreserved resources that
//!    unsatisfied quotas still need (the *headroom*) are held back from
//!    roles that are not themselves short of quota.
//!
//! Reserved resources (`cpus(web):4`) are only ever offered to frameworks
//! of that role, in an allocation for that role.
//!
//! **Books.** Inside the allocator, resources are kept as [`Bag`]s of
//! interned (name, role, kind) slots rather than [`Resources`] (whose
//! every entry owns two `String`s): what each framework holds on an agent
//! lives on the agent, and the agent's free pool is kept both as the
//! `Resources` that offers hand out and as a bag. Offering a whole free
//! pool therefore *moves* both into the offer and the books, and booking
//! it allocates nothing; the strings of the returned [`Allocation`] are
//! the only per-offer heap work left.
//!
//! **Filters.** A decline filter is indexed by agent (probed in O(1) per
//! framework considered, behind a 64-bit mask that answers "no filter"
//! for most frameworks without a probe) and by framework (so revive and
//! framework removal cost the filters they touch). Each agent keeps a lower bound
//! on its filters' expiry, so expired filters are only looked for when
//! one may be due. An agent on which every eligible framework turned out
//! to be filtered is marked *dormant* under the current eligibility
//! epoch; until its free pool changes, one of its filters expires, or the
//! epoch moves on (a framework added, activated, revived or re-roled),
//! later cycles skip it in O(1) instead of probing each framework again.
//!
//! **Cost.** Per cycle: `O(F)` to heap the eligible frameworks, then
//! O(1) per dormant agent, and per other agent with something free
//! `O(log F)` per allocation plus one O(1) filter probe per framework
//! skipped because it filtered the agent (at most the agent's live
//! filters). Removing a framework walks the agents once (its holdings are
//! booked on them). No stage is quadratic; `benches/allocator.rs`
//! measures it.
//!
//! **Interned names are reclaimed.** Roles, scalar names and slots are
//! interned to indexes, and they come from peers, so each table keeps a
//! use count per entry (see [`super::refs`]). A role is in use while a
//! framework subscribes to it or holds resources for it, while an agent
//! has resources reserved for it, or when it has a quota; a slot while a
//! live agent's total has it; a scalar name while a slot in use or a quota
//! names it. After every change that may end a use, a table holding more
//! than twice what is in use (plus some slack) is compacted in place,
//! keeping the order of what is left, so allocations are the same as if
//! nothing had been forgotten; only a role forgotten and seen again is
//! ordered as a new one among roles of equal share.

use agora_proto::hash::HashMap;
use std::borrow::Cow;
use std::cmp::Reverse;
use std::collections::{BTreeSet, BinaryHeap};
use std::hash::{BuildHasherDefault, Hasher};
use std::time::Duration;

use agora_proto::scheduler::ResourceRequest;
use agora_proto::{round_scalar, AgentId, FrameworkId, Resource, Resources, Value, DEFAULT_ROLE};
use tokio::time::Instant;

use super::bag::{Bag, Names, Slots};
use super::refs::{Refs, Remap};
use super::{Allocation, Allocator, AllocatorOptions, Interned};

/// The default [`Allocator`]: hierarchical weighted DRF with reservations
/// and quota. See the module documentation.
#[derive(Debug)]
pub struct DrfAllocator {
    options: AllocatorOptions,
    /// Interned scalar resource names; a [`Scalars`] is indexed by these.
    /// `cpus` and `mem` are always 0 and 1 (always in use, and
    /// compaction keeps the order).
    names: Names,
    /// Interned (name, role, kind) triples; the books are [`Bag`]s of them.
    slots: Slots,
    frameworks: Vec<Option<Fw>>,
    free_frameworks: Vec<usize>,
    framework_index: HashMap<FrameworkId, usize>,
    agents: Vec<Option<Ag>>,
    free_agents: Vec<usize>,
    agent_index: HashMap<AgentId, usize>,
    roles: Vec<Role>,
    /// Uses of each role (see the module documentation).
    role_refs: Refs,
    role_index: HashMap<String, usize>,
    /// Sum of every agent's total, per scalar name.
    total: Scalars,
    cursor: usize,
    /// Bumped whenever a framework may have become eligible for more
    /// agents (added, activated, revived, roles changed): an agent found
    /// fully filtered under one epoch is skipped in O(1) while the epoch,
    /// its free pool and its filters stay as they were.
    epoch: u64,
    /// Scratch buffer for a cycle's agent order.
    agent_order: Vec<usize>,
    /// Tests compare against an allocator that never skips dormant agents.
    #[cfg(test)]
    never_sleep: bool,
    /// And against one that never compacts its interned tables.
    #[cfg(test)]
    never_compact: bool,
}

/// Index of `cpus` in [`DrfAllocator::names`].
const CPUS: usize = 0;
/// Index of `mem` in [`DrfAllocator::names`].
const MEM: usize = 1;
/// How many scalar names an agent caches free totals of (`cpus`, `mem`
/// and the next two interned, usually `disk` and one more).
const CACHED_NAMES: usize = 4;
/// The role table is compacted once it holds more than twice the roles in
/// use plus this many ([`Interned::within_bound`]).
const ROLE_SLACK: usize = 64;
/// The slot table and the scalar name table are each compacted once they
/// hold more than twice what is in use plus this many: together they stay
/// within [`Interned::within_bound`]'s 64.
const NAME_SLACK: usize = 32;

/// Maps keyed by dense slot indexes, hashed with one multiply instead of
/// SipHash (the keys come from this allocator, not from peers).
type IdxMap<V> = std::collections::HashMap<usize, V, BuildHasherDefault<IdxHasher>>;
type IdxSet = std::collections::HashSet<usize, BuildHasherDefault<IdxHasher>>;

/// (agent, framework) pairs already served in this cycle.
type GivenSet = std::collections::HashSet<(usize, usize), BuildHasherDefault<IdxHasher>>;

#[derive(Default)]
struct IdxHasher(u64);

impl Hasher for IdxHasher {
    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 = (self.0.rotate_left(5) ^ u64::from(*b)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        }
    }

    fn write_usize(&mut self, n: usize) {
        self.0 = (self.0.rotate_left(5) ^ n as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    }

    fn finish(&self) -> u64 {
        self.0
    }
}

/// Quantities per interned scalar name; missing entries are zero.
#[derive(Debug, Clone, Default, PartialEq)]
struct Scalars(Vec<f64>);

#[derive(Debug)]
struct Role {
    name: String,
    weight: f64,
    /// The guarantee, per scalar name (empty when the role has no quota).
    quota: Scalars,
    /// Everything allocated for this role, to any framework.
    allocated: Scalars,
}

#[derive(Debug)]
struct Fw {
    id: FrameworkId,
    active: bool,
    /// Every role the framework subscribed to or still holds resources for.
    roles: Vec<FwRole>,
    /// Agents holding a filter of this framework.
    filtered_agents: IdxSet,
    requests: Vec<ResourceRequest>,
}

#[derive(Debug)]
struct FwRole {
    role: usize,
    subscribed: bool,
    suppressed: bool,
    allocated: Scalars,
}

#[derive(Debug)]
struct Ag {
    id: AgentId,
    total: Resources,
    /// What is free, as handed out in offers.
    available: Resources,
    /// The same as a [`Bag`], for the books: an offer of the whole free
    /// pool moves both out without copying a resource.
    free: Bag,
    /// `cpus` and `mem` of `available`, to skip full agents in O(1).
    free_cpus: f64,
    free_mem: f64,
    /// Fingerprint of `free` (see [`Bag::fingerprint`]).
    free_sig: u64,
    /// Whether `available` holds any reserved resource.
    free_reserved: bool,
    /// The scalars of `free` by name index, when no name outside the first
    /// [`CACHED_NAMES`] occurs and none occurs twice (in two roles): then
    /// booking the whole pool adds these without reading the bag, whose
    /// entries are elsewhere in memory.
    free_by_name: Option<[f64; CACHED_NAMES]>,
    active: bool,
    /// Filters by framework index (few per agent).
    filters: IdxMap<Filter>,
    /// Bit `f % 64` is set for every framework `f` with a filter here (and
    /// maybe for some without): most unfiltered frameworks are told apart
    /// without probing `filters`.
    filter_bits: u64,
    /// No filter here expires before this (a lower bound; `None` when
    /// there are no filters), so expiry is checked in O(1) per cycle.
    next_expiry: Option<Instant>,
    /// The epoch under which a fair-share pass found every eligible
    /// framework filtered on this agent; cleared when the free pool
    /// changes or a filter expires.
    dormant: Option<u64>,
    /// What is allocated here, per framework and role; a framework's
    /// entries are in allocation order. Kept on the agent (a handful of
    /// entries whose storage is reused) so booking an offer allocates
    /// nothing.
    held: Vec<Held>,
}

#[derive(Debug)]
struct Held {
    framework: usize,
    role: usize,
    bag: Bag,
}

#[derive(Debug)]
struct Filter {
    until: Instant,
    refused: Bag,
    /// `cpus` and `mem` of `refused`, to rule out most non-matches cheaply.
    cpus: f64,
    mem: f64,
    /// Fingerprint of `refused`: an offer of an agent's whole free pool
    /// with the same fingerprint (and cpus and mem) is what was refused,
    /// and is skipped without walking either bag.
    sig: u64,
}

/// What may be offered on an agent, with its `cpus` and `mem`.
struct Offerable<'a> {
    resources: Cow<'a, Resources>,
    cpus: f64,
    mem: f64,
}

/// Per-cycle ordering of one role's eligible frameworks: a min-heap on
/// (share key, framework), popped in order while looking for a client
/// (cheaper than re-sorting a search tree on every allocation).
#[derive(Debug, Default)]
struct RoleQueue {
    clients: BinaryHeap<Reverse<(u64, usize)>>,
    /// Clients popped while looking, put back before the look ends.
    skipped: Vec<Reverse<(u64, usize)>>,
    key: u64,
}

// === impl Scalars ===

impl Scalars {
    fn get(&self, i: usize) -> f64 {
        self.0.get(i).copied().unwrap_or(0.0)
    }

    fn add(&mut self, i: usize, v: f64) {
        if self.0.len() <= i {
            self.0.resize(i + 1, 0.0);
        }
        self.0[i] = round_scalar(self.0[i] + v).max(0.0);
    }

    fn is_zero(&self) -> bool {
        self.0.iter().all(|v| *v <= 0.0)
    }

    /// Renumbers after the scalar names were compacted. A name dropped is
    /// held by nothing, so its quantity here is zero and goes with it.
    fn remap(&mut self, remap: &Remap) {
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

    /// Dominant share of `self` over `total` (resources with a positive total).
    fn share(&self, total: &Scalars) -> f64 {
        let mut s = 0.0f64;
        for (i, &t) in total.0.iter().enumerate() {
            if t > 0.0 {
                s = s.max(self.get(i) / t);
            }
        }
        s
    }
}

// === impl DrfAllocator ===

impl DrfAllocator {
    /// An empty allocator.
    pub fn new(options: AllocatorOptions) -> Self {
        let mut names = Names::default();
        for pinned in ["cpus", "mem"] {
            let i = names.intern(pinned);
            names.refs.hold(i);
        }
        let mut alloc = DrfAllocator {
            options,
            names,
            slots: Slots::default(),
            frameworks: Vec::new(),
            free_frameworks: Vec::new(),
            framework_index: HashMap::default(),
            agents: Vec::new(),
            free_agents: Vec::new(),
            agent_index: HashMap::default(),
            roles: Vec::new(),
            role_refs: Refs::default(),
            role_index: HashMap::default(),
            total: Scalars::default(),
            cursor: 0,
            epoch: 0,
            agent_order: Vec::new(),
            #[cfg(test)]
            never_sleep: false,
            #[cfg(test)]
            never_compact: false,
        };
        let quota_roles: Vec<String> = alloc.options.role_quotas.keys().cloned().collect();
        for role in quota_roles {
            alloc.role_idx(&role);
        }
        alloc
    }

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

    /// The framework's dominant share of the cluster over everything
    /// allocated to it (all roles, unweighted); 0 when unknown.
    pub fn dominant_share(&self, framework_id: &FrameworkId) -> f64 {
        let Some(fw) = self
            .framework_index
            .get(framework_id)
            .and_then(|&f| self.fw(f))
        else {
            return 0.0;
        };
        let mut sum = Scalars::default();
        for fr in &fw.roles {
            for (i, v) in fr.allocated.0.iter().enumerate() {
                sum.add(i, *v);
            }
        }
        sum.share(&self.total)
    }

    /// The framework's dominant share in one role (unweighted); 0 when unknown.
    pub fn framework_share(&self, framework_id: &FrameworkId, role: &str) -> f64 {
        let (Some(fw), Some(&r)) = (
            self.framework_index
                .get(framework_id)
                .and_then(|&f| self.fw(f)),
            self.role_index.get(role),
        ) else {
            return 0.0;
        };
        fw.roles
            .iter()
            .find(|fr| fr.role == r)
            .map_or(0.0, |fr| fr.allocated.share(&self.total))
    }

    /// The role's dominant share divided by its weight; 0 when unknown.
    pub fn role_share(&self, role: &str) -> f64 {
        self.role_index
            .get(role)
            .map_or(0.0, |&r| self.weighted_role_share(r))
    }

    /// Scalars allocated for the role (by name), e.g. to check a quota.
    pub fn role_allocated(&self, role: &str, name: &str) -> f64 {
        match (self.role_index.get(role), self.names.position(name)) {
            (Some(&r), Some(i)) => self.roles[r].allocated.get(i),
            _ => 0.0,
        }
    }

    fn fw(&self, f: usize) -> Option<&Fw> {
        self.frameworks.get(f).and_then(Option::as_ref)
    }

    fn set_framework_active(&mut self, framework_id: &FrameworkId, active: bool) {
        if active {
            self.epoch += 1;
        }
        if let Some(fw) = self
            .framework_index
            .get(framework_id)
            .and_then(|&f| self.frameworks[f].as_mut())
        {
            fw.active = active;
        }
    }

    fn set_agent_active(&mut self, agent_id: &AgentId, active: bool) {
        if active {
            self.epoch += 1;
        }
        if let Some(ag) = self
            .agent_index
            .get(agent_id)
            .and_then(|&a| self.agents[a].as_mut())
        {
            ag.active = active;
        }
    }

    fn ag(&self, a: usize) -> Option<&Ag> {
        self.agents.get(a).and_then(Option::as_ref)
    }

    /// Adds (`sign` 1.0) or subtracts (-1.0) the scalars of `r` to `into`.
    fn accumulate(names: &mut Names, into: &mut Scalars, r: &Resources, sign: f64) {
        for item in r.iter() {
            if let Value::Scalar(v) = item.value {
                let i = names.intern(&item.name);
                into.add(i, sign * v);
            }
        }
    }

    /// Adds (`sign` 1.0) or subtracts (-1.0) the scalars of a bag to `into`.
    fn accumulate_bag(slots: &Slots, into: &mut Scalars, bag: &Bag, sign: f64) {
        for (s, v) in bag.scalars() {
            into.add(slots.get(s).scalar, sign * v);
        }
    }

    /// `cpus` and `mem` of a bag, summed over roles.
    fn cpus_mem(slots: &Slots, bag: &Bag) -> (f64, f64) {
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
    fn by_name(slots: &Slots, bag: &Bag) -> Option<[f64; CACHED_NAMES]> {
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
    fn refresh(slots: &Slots, ag: &mut Ag) {
        (ag.free_cpus, ag.free_mem) = Self::cpus_mem(slots, &ag.free);
        ag.free_by_name = Self::by_name(slots, &ag.free);
        ag.free_sig = ag.free.fingerprint();
        ag.free_reserved = ag.free.iter().any(|(s, _)| slots.get(*s).reserved);
        ag.dormant = None;
    }

    fn role_idx(&mut self, name: &str) -> usize {
        if let Some(&r) = self.role_index.get(name) {
            return r;
        }
        let weight = self
            .options
            .role_weights
            .get(name)
            .copied()
            .filter(|w| w.is_finite() && *w > 0.0)
            .unwrap_or(1.0);
        let r = self.roles.len();
        self.role_refs.push();
        let mut quota = Scalars::default();
        if let Some(q) = self.options.role_quotas.get(name) {
            let q = q.clone();
            Self::accumulate(&mut self.names, &mut quota, &q, 1.0);
            // A role with a quota, and the names in it, are always in
            // use: the quota is served, and held back from other roles,
            // whoever subscribes.
            self.role_refs.hold(r);
            for (i, _) in quota.0.iter().enumerate().filter(|(_, v)| **v > 0.0) {
                self.names.refs.hold(i);
            }
        }
        self.roles.push(Role {
            name: name.to_string(),
            weight,
            quota,
            allocated: Scalars::default(),
        });
        self.role_index.insert(name.to_string(), r);
        r
    }

    fn weighted_role_share(&self, r: usize) -> f64 {
        let role = &self.roles[r];
        role.allocated.share(&self.total) / role.weight
    }

    /// The role's unmet guarantee per scalar name (all zero when met or none).
    fn quota_shortfall(&self, r: usize) -> Scalars {
        let role = &self.roles[r];
        Scalars(
            role.quota
                .0
                .iter()
                .enumerate()
                .map(|(i, q)| round_scalar(q - role.allocated.get(i)).max(0.0))
                .collect(),
        )
    }

    fn worth_offering(&self, r: &Resources) -> bool {
        let (cpus, mem) = (r.cpus(), r.mem());
        (cpus >= self.options.min_offer_cpus || mem >= self.options.min_offer_mem)
            && (cpus > 0.0 || mem > 0.0)
    }

    fn worth_offering_free(&self, ag: &Ag) -> bool {
        (ag.free_cpus >= self.options.min_offer_cpus || ag.free_mem >= self.options.min_offer_mem)
            && (ag.free_cpus > 0.0 || ag.free_mem > 0.0)
    }

    fn set_framework_roles(&mut self, f: usize, roles: &[String]) {
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
                });
            }
        }
        // Roles left behind with nothing allocated are forgotten.
        Self::forget_idle_roles(fw, &mut self.role_refs);
    }

    /// Drops the framework's roles it neither subscribes to nor holds
    /// anything for.
    fn forget_idle_roles(fw: &mut Fw, role_refs: &mut Refs) {
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
    fn take(&mut self, f: usize, a: usize, role: usize, resources: &Resources) -> Resources {
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
    fn book(
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
    fn release(&mut self, f: usize, a: usize, resources: &Resources) -> Bag {
        let left = self.slots.known_bag(resources);
        self.release_bag(f, a, left)
    }

    /// [`DrfAllocator::release`] of a bag.
    fn release_bag(&mut self, f: usize, a: usize, mut left: Bag) -> Bag {
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

    fn give_back(&mut self, a: usize, freed: &Bag) {
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
    fn usage_role(&mut self, f: usize, r: &Resource) -> usize {
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

    fn use_resources(&mut self, f: usize, a: usize, resources: &Resources) {
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

    /// Whether a live filter of `f` on the agent covers `offer`; drops it
    /// when expired.
    fn filtered(slots: &Slots, ag: &Ag, f: usize, offer: &Offerable<'_>, now: Instant) -> bool {
        if ag.filter_bits & filter_bit(f) == 0 {
            return false;
        }
        ag.filters.get(&f).is_some_and(|filter| {
            filter.until > now
                && offer.cpus <= filter.cpus
                && offer.mem <= filter.mem
                && match &offer.resources {
                    // The whole free pool: `ag.free` is the same as a bag.
                    Cow::Borrowed(_) => {
                        (filter.sig == ag.free_sig
                            && offer.cpus == filter.cpus
                            && offer.mem == filter.mem)
                            || filter.refused.contains(&ag.free)
                    }
                    Cow::Owned(r) => filter.refused.contains_resources(slots, r),
                }
        })
    }

    fn allocation(&self, f: usize, a: usize, role: usize, resources: Resources) -> Allocation {
        Allocation {
            framework_id: self.fw(f).map(|fw| fw.id.clone()).unwrap_or_default(),
            agent_id: self.ag(a).map(|ag| ag.id.clone()).unwrap_or_default(),
            role: self.roles[role].name.clone(),
            resources,
        }
    }

    /// Eligible frameworks per role, ordered by share in the role, and the
    /// roles with at least one, ordered by weighted share.
    fn queues(&self) -> (Vec<RoleQueue>, BTreeSet<(u64, usize)>) {
        let mut queues: Vec<RoleQueue> = (0..self.roles.len())
            .map(|_| RoleQueue::default())
            .collect();
        for (f, slot) in self.frameworks.iter().enumerate() {
            let Some(fw) = slot else { continue };
            if !fw.active {
                continue;
            }
            for fr in &fw.roles {
                if fr.subscribed && !fr.suppressed {
                    queues[fr.role]
                        .clients
                        .push(Reverse((share_key(fr.allocated.share(&self.total)), f)));
                }
            }
        }
        let mut order = BTreeSet::new();
        for (r, q) in queues.iter_mut().enumerate() {
            if !q.clients.is_empty() {
                q.key = share_key(self.weighted_role_share(r));
                order.insert((q.key, r));
            }
        }
        (queues, order)
    }

    /// After `take` for a client `f` picked from `role`'s queue: puts it
    /// back at its new share, and re-sorts the role.
    fn requeue(
        &self,
        queues: &mut [RoleQueue],
        order: &mut BTreeSet<(u64, usize)>,
        f: usize,
        role: usize,
    ) {
        let q = &mut queues[role];
        let new = self
            .fw(f)
            .and_then(|fw| fw.roles.iter().find(|fr| fr.role == role))
            .map_or(0.0, |fr| fr.allocated.share(&self.total));
        q.clients.push(Reverse((share_key(new), f)));
        // Roles only leave `order` within a cycle: one alone stays in
        // order whatever its key, so it is not touched.
        if order.len() > 1 && order.remove(&(q.key, role)) {
            q.key = share_key(self.weighted_role_share(role));
            order.insert((q.key, role));
        }
    }

    /// What of the agent's free resources may go to `role` (borrowed
    /// when it is all of them).
    fn for_role<'a>(available: &'a Resources, role: &str) -> Cow<'a, Resources> {
        if available
            .iter()
            .all(|r| r.role == DEFAULT_ROLE || r.role == role)
        {
            Cow::Borrowed(available)
        } else {
            Cow::Owned(available.filter_roles(|r| r == DEFAULT_ROLE || r == role))
        }
    }

    /// Lowest-share framework of the role that may get `offer` on agent
    /// `a`. It leaves the queue: the caller gives it the offer and puts it
    /// back with [`DrfAllocator::requeue`].
    #[allow(clippy::too_many_arguments)]
    fn pick_client(
        &self,
        q: &mut RoleQueue,
        ag: &Ag,
        a: usize,
        offer: &Offerable<'_>,
        given: &GivenSet,
        local: &[usize],
        now: Instant,
    ) -> Option<usize> {
        let check_given = !given.is_empty();
        let mut found = None;
        while let Some(Reverse((key, f))) = q.clients.pop() {
            if local.contains(&f)
                || (check_given && given.contains(&(a, f)))
                || Self::filtered(&self.slots, ag, f, offer, now)
            {
                q.skipped.push(Reverse((key, f)));
            } else {
                found = Some(f);
                break;
            }
        }
        q.clients.extend(q.skipped.drain(..));
        found
    }

    /// Stage 1; returns whether anything was served (shares moved).
    fn serve_requests(&mut self, given: &mut GivenSet, out: &mut Vec<Allocation>) -> bool {
        let mut served = false;
        for f in 0..self.frameworks.len() {
            let role = match self.frameworks[f].as_mut() {
                Some(fw) if fw.active && !fw.requests.is_empty() => {
                    match fw.roles.iter().find(|fr| fr.subscribed && !fr.suppressed) {
                        Some(fr) => fr.role,
                        None => continue,
                    }
                }
                _ => continue,
            };
            let requests = match self.frameworks[f].as_mut() {
                Some(fw) => std::mem::take(&mut fw.requests),
                None => continue,
            };
            let role_name = self.roles[role].name.clone();
            for req in requests {
                let fits = |this: &Self, a: usize| {
                    this.ag(a).is_some_and(|ag| {
                        let offer = Self::for_role(&ag.available, &role_name);
                        ag.active
                            && !given.contains(&(a, f))
                            && this.worth_offering(&offer)
                            && (req.agent_id.is_some() || offer.contains(&req.resources))
                    })
                };
                let pick = match &req.agent_id {
                    Some(id) => self.agent_index.get(id).copied().filter(|&a| fits(self, a)),
                    None => (0..self.agents.len()).find(|&a| fits(self, a)),
                };
                let Some(a) = pick else { continue };
                let Some(offer) = self
                    .ag(a)
                    .map(|ag| Self::for_role(&ag.available, &role_name).into_owned())
                else {
                    continue;
                };
                let taken = self.take(f, a, role, &offer);
                given.insert((a, f));
                out.push(self.allocation(f, a, role, taken));
                served = true;
            }
        }
        served
    }

    /// Stage 2: each role short of quota gets what it still needs.
    fn serve_quotas(
        &mut self,
        now: Instant,
        agent_order: &[usize],
        queues: &mut [RoleQueue],
        order: &mut BTreeSet<(u64, usize)>,
        given: &mut GivenSet,
        out: &mut Vec<Allocation>,
    ) {
        let quota_roles: Vec<usize> = (0..self.roles.len())
            .filter(|&r| !self.roles[r].quota.is_zero() && !queues[r].clients.is_empty())
            .collect();
        if quota_roles.is_empty() {
            return;
        }
        for &a in agent_order {
            let mut short: Vec<(u64, usize, Scalars)> = quota_roles
                .iter()
                .map(|&r| {
                    (
                        share_key(self.weighted_role_share(r)),
                        r,
                        self.quota_shortfall(r),
                    )
                })
                .filter(|(_, _, need)| !need.is_zero())
                .collect();
            if short.is_empty() {
                return;
            }
            short.sort_by_key(|(k, r, _)| (*k, *r));
            for (_, r, need) in short {
                let Some(ag) = self.ag(a) else { break };
                if !ag.active || !self.worth_offering_free(ag) {
                    break;
                }
                let offer = self.capped_to(&ag.available, r, &need);
                if !self.worth_offering(&offer) {
                    continue;
                }
                let offer = Offerable {
                    cpus: offer.cpus(),
                    mem: offer.mem(),
                    resources: Cow::Owned(offer),
                };
                let Some(f) = self.pick_client(&mut queues[r], ag, a, &offer, given, &[], now)
                else {
                    continue;
                };
                let taken = self.take(f, a, r, &offer.resources);
                self.requeue(queues, order, f, r);
                given.insert((a, f));
                out.push(self.allocation(f, a, r, taken));
            }
        }
    }

    /// The part of `available` a role short of quota is offered: what is
    /// reserved for it, and the unreserved rest with each scalar named in
    /// the role's quota capped at what the guarantee still lacks (after the
    /// reserved part); resources the quota does not name come along whole.
    fn capped_to(&self, available: &Resources, r: usize, need: &Scalars) -> Resources {
        let role = &self.roles[r];
        let mut reserved = Scalars::default();
        for item in available.iter().filter(|it| it.role == role.name) {
            if let (Value::Scalar(v), Some(i)) = (&item.value, self.name_pos(&item.name)) {
                reserved.add(i, *v);
            }
        }
        let mut out = Resources::new();
        for item in available.iter() {
            if item.role == role.name {
                out.add_resource(item.clone());
            } else if item.role == DEFAULT_ROLE {
                match (&item.value, self.name_pos(&item.name)) {
                    (Value::Scalar(v), Some(i)) if role.quota.get(i) > 0.0 => {
                        let cap = round_scalar(need.get(i) - reserved.get(i)).max(0.0);
                        let amount = round_scalar(v.min(cap));
                        if amount > 0.0 {
                            out.add_resource(Resource {
                                name: item.name.clone(),
                                role: item.role.clone(),
                                value: Value::Scalar(amount),
                            });
                        }
                    }
                    _ => out.add_resource(item.clone()),
                }
            }
        }
        out
    }

    fn name_pos(&self, name: &str) -> Option<usize> {
        self.names.position(name)
    }

    /// Unreserved free scalars on active agents minus what unsatisfied
    /// quotas still need: what other roles may take. `None` when no quota
    /// is short (no limit).
    fn headroom_slack(&self) -> Option<Scalars> {
        let mut required = Scalars::default();
        for r in 0..self.roles.len() {
            for (i, v) in self.quota_shortfall(r).0.iter().enumerate() {
                required.add(i, *v);
            }
        }
        if required.is_zero() {
            return None;
        }
        let mut free = Scalars::default();
        for ag in self.agents.iter().flatten().filter(|ag| ag.active) {
            for (s, v) in ag.free.scalars() {
                let slot = self.slots.get(s);
                if !slot.reserved {
                    free.add(slot.scalar, v);
                }
            }
        }
        Some(Scalars(
            required
                .0
                .iter()
                .enumerate()
                .map(|(i, req)| {
                    if *req > 0.0 {
                        free.get(i) - req
                    } else {
                        f64::INFINITY
                    }
                })
                .collect(),
        ))
    }
}

/// A framework's bit in [`Ag::filter_bits`].
fn filter_bit(f: usize) -> u64 {
    1 << (f % 64)
}

fn share_key(s: f64) -> u64 {
    if s.is_finite() && s >= 0.0 {
        s.to_bits()
    } else {
        u64::MAX
    }
}

/// The roles `r` has resources reserved for, each once.
fn reserved_roles(r: &Resources) -> Vec<&str> {
    let mut roles: Vec<&str> = r
        .iter()
        .filter(|item| item.role != DEFAULT_ROLE)
        .map(|item| item.role.as_str())
        .collect();
    roles.sort_unstable();
    roles.dedup();
    roles
}

fn normalized_roles(roles: &[String]) -> Vec<String> {
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

impl DrfAllocator {
    /// Stage 3: fair sharing, role level first, then frameworks in the role.
    fn serve_fair_share(
        &mut self,
        now: Instant,
        agent_order: &[usize],
        queues: &mut [RoleQueue],
        order: &mut BTreeSet<(u64, usize)>,
        given: &mut GivenSet,
        out: &mut Vec<Allocation>,
    ) {
        let mut slack = self.headroom_slack();
        let short: Vec<bool> = (0..self.roles.len())
            .map(|r| !self.quota_shortfall(r).is_zero())
            .collect();
        let mut local: Vec<usize> = Vec::new();
        // Whether an agent found fully filtered may be marked (and skipped)
        // as dormant: not while quota headroom reshapes offers, nor after
        // requests or quota served some pairs out of turn this cycle.
        let may_sleep = slack.is_none() && given.is_empty();
        #[cfg(test)]
        let may_sleep = may_sleep && !self.never_sleep;
        for &a in agent_order {
            self.drop_expired_filters(a, now);
            local.clear();
            if may_sleep && self.ag(a).is_some_and(|ag| ag.dormant == Some(self.epoch)) {
                continue;
            }
            while let Some(ag) = self.ag(a) {
                if !ag.active || !self.worth_offering_free(ag) {
                    break;
                }
                // (role, framework, what to take: None = all)
                let mut pick: Option<(usize, usize, Option<Resources>)> = None;
                for &(_, r) in order.iter() {
                    let role_name = &self.roles[r].name;
                    let mut resources = if ag.free_reserved {
                        Self::for_role(&ag.available, role_name)
                    } else {
                        Cow::Borrowed(&ag.available)
                    };
                    if let (Some(slack), false) = (&slack, short[r]) {
                        if !self.fits_slack(&resources, slack) {
                            // Unreserved resources would eat into quota
                            // headroom: only the role's reservations go.
                            resources = Cow::Owned(
                                resources.filter_roles(|x| x == role_name && x != DEFAULT_ROLE),
                            );
                        }
                    }
                    let offer = match resources {
                        Cow::Borrowed(_) => Offerable {
                            resources,
                            cpus: ag.free_cpus,
                            mem: ag.free_mem,
                        },
                        Cow::Owned(r) => Offerable {
                            cpus: r.cpus(),
                            mem: r.mem(),
                            resources: Cow::Owned(r),
                        },
                    };
                    if !self.worth_offering_scalars(offer.cpus, offer.mem) {
                        continue;
                    }
                    if let Some(f) =
                        self.pick_client(&mut queues[r], ag, a, &offer, given, &local, now)
                    {
                        let part = match offer.resources {
                            Cow::Borrowed(_) => None,
                            Cow::Owned(r) => Some(r),
                        };
                        pick = Some((r, f, part));
                        break;
                    }
                }
                let Some((r, f, part)) = pick else {
                    if may_sleep && local.is_empty() {
                        // Every eligible framework filters this whole pool:
                        // so it stays until the pool changes, a filter
                        // expires or some framework becomes eligible.
                        let epoch = self.epoch;
                        if let Some(ag) = self.agents[a].as_mut() {
                            ag.dormant = Some(epoch);
                        }
                    }
                    break;
                };
                let taken = match part {
                    Some(part) => self.take(f, a, r, &part),
                    None => self.take_all(f, a, r),
                };
                if let Some(slack) = slack.as_mut() {
                    if !short[r] {
                        self.spend_slack(&taken, slack);
                    }
                }
                self.requeue(queues, order, f, r);
                local.push(f);
                out.push(self.allocation(f, a, r, taken));
            }
        }
    }

    /// [`DrfAllocator::take`] of everything free on the agent: moves it
    /// instead of subtracting.
    fn take_all(&mut self, f: usize, a: usize, role: usize) -> Resources {
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

    fn worth_offering_scalars(&self, cpus: f64, mem: f64) -> bool {
        (cpus >= self.options.min_offer_cpus || mem >= self.options.min_offer_mem)
            && (cpus > 0.0 || mem > 0.0)
    }

    /// Whether the unreserved scalars of `offer` fit in the headroom slack.
    fn fits_slack(&self, offer: &Resources, slack: &Scalars) -> bool {
        offer.iter().filter(|r| r.role == DEFAULT_ROLE).all(|item| {
            match (&item.value, self.name_pos(&item.name)) {
                (Value::Scalar(v), Some(i)) => i >= slack.0.len() || *v <= slack.0[i] + 1e-9,
                _ => true,
            }
        })
    }

    fn spend_slack(&self, offer: &Resources, slack: &mut Scalars) {
        for item in offer.iter().filter(|r| r.role == DEFAULT_ROLE) {
            if let (Value::Scalar(v), Some(i)) = (&item.value, self.name_pos(&item.name)) {
                if i < slack.0.len() {
                    slack.0[i] -= v;
                }
            }
        }
    }

    fn drop_expired_filters(&mut self, a: usize, now: Instant) {
        let Some(ag) = self.agents.get_mut(a).and_then(Option::as_mut) else {
            return;
        };
        match ag.next_expiry {
            Some(t) if t <= now => {}
            _ => return,
        }
        let mut expired = Vec::new();
        let mut next: Option<Instant> = None;
        let mut bits = 0;
        ag.filters.retain(|&f, filter| {
            let live = filter.until > now;
            if live {
                next = Some(next.map_or(filter.until, |t| t.min(filter.until)));
                bits |= filter_bit(f);
            } else {
                expired.push(f);
            }
            live
        });
        ag.next_expiry = next;
        ag.filter_bits = bits;
        if !expired.is_empty() {
            ag.dormant = None;
        }
        for f in expired {
            if let Some(fw) = self.frameworks.get_mut(f).and_then(Option::as_mut) {
                fw.filtered_agents.remove(&a);
            }
        }
    }

    fn clear_filters(&mut self, f: usize) {
        self.epoch += 1;
        let Some(fw) = self.frameworks.get_mut(f).and_then(Option::as_mut) else {
            return;
        };
        for a in std::mem::take(&mut fw.filtered_agents) {
            if let Some(ag) = self.agents.get_mut(a).and_then(Option::as_mut) {
                ag.filters.remove(&f);
            }
        }
    }
}

impl Allocator for DrfAllocator {
    fn framework_share(&self, framework_id: &FrameworkId, role: &str) -> Option<f64> {
        Some(DrfAllocator::framework_share(self, framework_id, role))
    }

    fn role_share(&self, role: &str) -> Option<f64> {
        Some(DrfAllocator::role_share(self, role))
    }

    fn interned(&self) -> Interned {
        Interned {
            roles: self.roles.len(),
            roles_in_use: self.role_refs.live(),
            names: self.slots.len() + self.names.len(),
            names_in_use: self.slots.live() + self.names.refs.live(),
        }
    }

    fn agent_accounts(&self, agent_id: &AgentId) -> Option<super::AgentAccounts> {
        let &a = self.agent_index.get(agent_id)?;
        let free = self.ag(a)?.available.clone();
        let mut allocated: Vec<(FrameworkId, Resources)> = self
            .framework_index
            .iter()
            .map(|(fid, &f)| (fid.clone(), self.allocated_on(f, a)))
            .filter(|(_, r)| !r.is_empty())
            .collect();
        allocated.sort_by(|x, y| x.0.cmp(&y.0));
        Some(super::AgentAccounts { free, allocated })
    }

    fn add_framework(&mut self, framework_id: &FrameworkId, roles: &[String], active: bool) {
        let f = match self.framework_index.get(framework_id) {
            Some(&f) => f,
            None => {
                let fw = Fw {
                    id: framework_id.clone(),
                    active,
                    roles: Vec::new(),
                    filtered_agents: IdxSet::default(),
                    requests: Vec::new(),
                };
                let f = match self.free_frameworks.pop() {
                    Some(f) => {
                        self.frameworks[f] = Some(fw);
                        f
                    }
                    None => {
                        self.frameworks.push(Some(fw));
                        self.frameworks.len() - 1
                    }
                };
                self.framework_index.insert(framework_id.clone(), f);
                f
            }
        };
        if let Some(fw) = self.frameworks[f].as_mut() {
            fw.active = active;
        }
        self.set_framework_roles(f, roles);
        self.reclaim();
    }

    fn update_framework(&mut self, framework_id: &FrameworkId, roles: &[String]) {
        if let Some(&f) = self.framework_index.get(framework_id) {
            self.set_framework_roles(f, roles);
            self.reclaim();
        }
    }

    fn remove_framework(&mut self, framework_id: &FrameworkId) {
        let Some(&f) = self.framework_index.get(framework_id) else {
            return;
        };
        self.clear_filters(f);
        // Allocations are booked on the agents, so this walks the cluster
        // once; frameworks leave rarely, offers happen all the time.
        let agents: Vec<usize> = (0..self.agents.len())
            .filter(|&a| {
                self.ag(a)
                    .is_some_and(|ag| ag.held.iter().any(|h| h.framework == f))
            })
            .collect();
        for a in agents {
            let held = self.allocated_on(f, a);
            let freed = self.release(f, a, &held);
            self.give_back(a, &freed);
        }
        self.framework_index.remove(framework_id);
        if let Some(fw) = self.frameworks[f].take() {
            for fr in &fw.roles {
                self.role_refs.release(fr.role);
            }
        }
        self.free_frameworks.push(f);
        self.reclaim();
    }

    fn activate_framework(&mut self, framework_id: &FrameworkId) {
        self.set_framework_active(framework_id, true);
    }

    fn deactivate_framework(&mut self, framework_id: &FrameworkId) {
        self.set_framework_active(framework_id, false);
    }

    fn add_agent(
        &mut self,
        agent_id: &AgentId,
        total: &Resources,
        used: &[(FrameworkId, Resources)],
        active: bool,
    ) {
        if self.agent_index.contains_key(agent_id) {
            self.remove_agent(agent_id);
        }
        let free = self.slots.bag(&mut self.names, total);
        for (s, _) in free.iter() {
            self.slots.hold(&mut self.names, *s);
        }
        let mut ag = Ag {
            id: agent_id.clone(),
            total: total.clone(),
            available: total.clone(),
            free,
            free_cpus: 0.0,
            free_mem: 0.0,
            free_sig: 0,
            free_reserved: false,
            free_by_name: None,
            active,
            filters: IdxMap::default(),
            filter_bits: 0,
            next_expiry: None,
            dormant: None,
            held: Vec::new(),
        };
        Self::refresh(&self.slots, &mut ag);
        let a = match self.free_agents.pop() {
            Some(a) => {
                self.agents[a] = Some(ag);
                a
            }
            None => {
                self.agents.push(Some(ag));
                self.agents.len() - 1
            }
        };
        self.agent_index.insert(agent_id.clone(), a);
        Self::accumulate(&mut self.names, &mut self.total, total, 1.0);
        for role in reserved_roles(total) {
            let r = self.role_idx(role);
            self.role_refs.hold(r);
        }
        for (fid, res) in used {
            if let Some(&f) = self.framework_index.get(fid) {
                self.use_resources(f, a, res);
            }
        }
        self.reclaim();
    }

    fn remove_agent(&mut self, agent_id: &AgentId) {
        let Some(&a) = self.agent_index.get(agent_id) else {
            return;
        };
        let (holders, filters): (Vec<usize>, Vec<usize>) = match self.ag(a) {
            Some(ag) => (
                {
                    let mut holders: Vec<usize> = ag.held.iter().map(|h| h.framework).collect();
                    holders.sort_unstable();
                    holders.dedup();
                    holders
                },
                ag.filters.keys().copied().collect(),
            ),
            None => return,
        };
        for f in holders {
            let held = self.allocated_on(f, a);
            self.release(f, a, &held);
        }
        for f in filters {
            if let Some(fw) = self.frameworks.get_mut(f).and_then(Option::as_mut) {
                fw.filtered_agents.remove(&a);
            }
        }
        self.agent_index.remove(agent_id);
        if let Some(ag) = self.agents[a].take() {
            Self::accumulate(&mut self.names, &mut self.total, &ag.total, -1.0);
            // Everything held here was released above; this only guards
            // the counts.
            for h in &ag.held {
                self.role_refs.release(h.role);
            }
            for role in reserved_roles(&ag.total) {
                if let Some(&r) = self.role_index.get(role) {
                    self.role_refs.release(r);
                }
            }
            for (s, _) in self.slots.known_bag(&ag.total).iter() {
                self.slots.release(&mut self.names, *s);
            }
        }
        self.free_agents.push(a);
        self.reclaim();
    }

    fn activate_agent(&mut self, agent_id: &AgentId) {
        self.set_agent_active(agent_id, true);
    }

    fn deactivate_agent(&mut self, agent_id: &AgentId) {
        self.set_agent_active(agent_id, false);
    }

    fn update_usage(
        &mut self,
        framework_id: &FrameworkId,
        agent_id: &AgentId,
        resources: &Resources,
    ) {
        if let (Some(&f), Some(&a)) = (
            self.framework_index.get(framework_id),
            self.agent_index.get(agent_id),
        ) {
            self.use_resources(f, a, resources);
            self.reclaim();
        }
    }

    fn recover(
        &mut self,
        framework_id: &FrameworkId,
        agent_id: &AgentId,
        resources: &Resources,
        refuse: Option<Duration>,
        now: Instant,
    ) {
        self.recover_and_filter(framework_id, agent_id, resources, refuse, now);
        self.reclaim();
    }

    fn revive(&mut self, framework_id: &FrameworkId, roles: &[String]) {
        let Some(&f) = self.framework_index.get(framework_id) else {
            return;
        };
        let roles: Vec<usize> = roles
            .iter()
            .filter_map(|r| self.role_index.get(r).copied())
            .collect();
        let all = roles.is_empty();
        if let Some(fw) = self.frameworks[f].as_mut() {
            for fr in &mut fw.roles {
                if all || roles.contains(&fr.role) {
                    fr.suppressed = false;
                }
            }
        }
        self.clear_filters(f);
    }

    fn suppress(&mut self, framework_id: &FrameworkId, roles: &[String]) {
        let Some(&f) = self.framework_index.get(framework_id) else {
            return;
        };
        let roles: Vec<usize> = roles
            .iter()
            .filter_map(|r| self.role_index.get(r).copied())
            .collect();
        let all = roles.is_empty();
        if let Some(fw) = self.frameworks[f].as_mut() {
            for fr in &mut fw.roles {
                if all || roles.contains(&fr.role) {
                    fr.suppressed = true;
                }
            }
        }
    }

    fn request_resources(&mut self, framework_id: &FrameworkId, requests: &[ResourceRequest]) {
        if let Some(fw) = self
            .framework_index
            .get(framework_id)
            .and_then(|&f| self.frameworks[f].as_mut())
        {
            fw.requests.extend(requests.iter().cloned());
            // A hint, not a queue: keep it bounded.
            let excess = fw.requests.len().saturating_sub(100);
            fw.requests.drain(..excess);
        }
    }

    fn allocate(&mut self, now: Instant) -> Vec<Allocation> {
        let mut out = Vec::new();
        if self.agent_index.is_empty() || self.framework_index.is_empty() {
            return out;
        }
        let (mut queues, mut order) = self.queues();
        if order.is_empty() {
            return out;
        }
        let mut given = GivenSet::default();
        if self.serve_requests(&mut given, &mut out) {
            (queues, order) = self.queues();
        }

        let n = self.agents.len();
        let start = self.cursor % n;
        self.cursor = self.cursor.wrapping_add(1);
        // The agents' order is a buffer kept between cycles.
        let mut agent_order = std::mem::take(&mut self.agent_order);
        agent_order.clear();
        let mut awake = 0;
        for a in (start..n).chain(0..start) {
            if let Some(ag) = self.ag(a) {
                if ag.active && self.worth_offering_free(ag) {
                    agent_order.push(a);
                    awake += usize::from(ag.dormant != Some(self.epoch));
                }
            }
        }
        // Usually one offer per agent that is not known to be filtered.
        out.reserve(awake);
        self.serve_quotas(
            now,
            &agent_order,
            &mut queues,
            &mut order,
            &mut given,
            &mut out,
        );
        self.serve_fair_share(
            now,
            &agent_order,
            &mut queues,
            &mut order,
            &mut given,
            &mut out,
        );
        self.agent_order = agent_order;
        out
    }
}

impl DrfAllocator {
    fn allocated_on(&self, f: usize, a: usize) -> Resources {
        let mut held = Bag::default();
        if let Some(ag) = self.ag(a) {
            for h in ag.held.iter().filter(|h| h.framework == f) {
                held.add(&h.bag);
            }
        }
        self.slots.resources(&held)
    }
}

impl DrfAllocator {
    /// [`Allocator::recover`], up to its reclaiming of interned names.
    fn recover_and_filter(
        &mut self,
        framework_id: &FrameworkId,
        agent_id: &AgentId,
        resources: &Resources,
        refuse: Option<Duration>,
        now: Instant,
    ) {
        let (Some(&f), Some(&a)) = (
            self.framework_index.get(framework_id),
            self.agent_index.get(agent_id),
        ) else {
            return;
        };
        // Only what is really allocated to this framework comes back, so a
        // confused caller can never make resources appear twice.
        let freed = self.release(f, a, resources);
        self.give_back(a, &freed);
        let Some(until) = refuse
            .filter(|d| !d.is_zero())
            .and_then(|d| now.checked_add(d))
        else {
            return;
        };
        if freed.is_empty() {
            return;
        }
        let Some(ag) = self.agents[a].as_mut() else {
            return;
        };
        match ag.filters.get_mut(&f) {
            Some(filter) if filter.until > now => {
                filter.until = filter.until.max(until);
                filter.refused.add_owned(freed);
                (filter.cpus, filter.mem) = Self::cpus_mem(&self.slots, &filter.refused);
                filter.sig = filter.refused.fingerprint();
            }
            _ => {
                let (cpus, mem) = Self::cpus_mem(&self.slots, &freed);
                ag.filters.insert(
                    f,
                    Filter {
                        until,
                        cpus,
                        mem,
                        sig: freed.fingerprint(),
                        refused: freed,
                    },
                );
            }
        }
        // A lower bound: an extended filter only makes it looser.
        ag.next_expiry = Some(ag.next_expiry.map_or(until, |t| t.min(until)));
        ag.filter_bits |= filter_bit(f);
        if let Some(fw) = self.frameworks[f].as_mut() {
            fw.filtered_agents.insert(a);
        }
    }
}

impl DrfAllocator {
    /// Compacts the interned tables that outgrew what is in use (see the
    /// module documentation). O(1) unless one did; then it rewrites the
    /// books that index it.
    fn reclaim(&mut self) {
        #[cfg(test)]
        if self.never_compact {
            return;
        }
        if self.names.refs.over(NAME_SLACK) {
            self.compact_names();
        } else if self.slots.over(NAME_SLACK) {
            self.compact_slots();
        }
        if self.role_refs.over(ROLE_SLACK) {
            self.compact_roles();
        }
    }

    /// Drops the roles not in use and renumbers the others, in order.
    fn compact_roles(&mut self) {
        let remap = self.role_refs.compact();
        remap.retain(&mut self.roles);
        self.role_index.retain(|_, r| match remap.get(*r) {
            Some(new) => {
                *r = new;
                true
            }
            None => false,
        });
        for fw in self.frameworks.iter_mut().flatten() {
            for fr in &mut fw.roles {
                fr.role = remap.kept(fr.role);
            }
        }
        for ag in self.agents.iter_mut().flatten() {
            for h in &mut ag.held {
                h.role = remap.kept(h.role);
            }
        }
    }

    /// Drops the slots not in use and renumbers the others, in order, so
    /// every bag stays sorted; fingerprints hash slot numbers, so they are
    /// computed again (the free pool's and its filters' alike, so what
    /// matched still matches).
    fn compact_slots(&mut self) {
        let remap = self.slots.compact();
        for ag in self.agents.iter_mut().flatten() {
            ag.free.remap(&remap);
            ag.free_sig = ag.free.fingerprint();
            for h in &mut ag.held {
                h.bag.remap(&remap);
            }
            for filter in ag.filters.values_mut() {
                filter.refused.remap(&remap);
                filter.sig = filter.refused.fingerprint();
            }
        }
    }

    /// Drops the scalar names not in use and renumbers the others, in
    /// order (`cpus` and `mem` stay 0 and 1). The slots are compacted
    /// first, so that no slot is left naming a name dropped.
    fn compact_names(&mut self) {
        self.compact_slots();
        let remap = self.names.compact();
        self.slots.remap_names(&remap);
        self.total.remap(&remap);
        for role in &mut self.roles {
            role.quota.remap(&remap);
            role.allocated.remap(&remap);
        }
        for fw in self.frameworks.iter_mut().flatten() {
            for fr in &mut fw.roles {
                fr.allocated.remap(&remap);
            }
        }
        for ag in self.agents.iter_mut().flatten() {
            ag.free_by_name = Self::by_name(&self.slots, &ag.free);
        }
    }
}

#[cfg(test)]
impl DrfAllocator {
    /// Checks every cached view against what it caches: the agents' free
    /// bags, cpus, mem and fingerprints, and the filter expiry bounds.
    fn check_books(&self) -> Result<(), String> {
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

    /// Counts every use of every interned role, slot and scalar name
    /// again, and checks the use counts and the bound against them.
    fn check_interned(&self) -> Result<(), String> {
        let mut roles = vec![0; self.roles.len()];
        let mut slots = vec![0; self.slots.len()];
        let mut names = vec![0; self.names.len()];
        for (r, role) in self.roles.iter().enumerate() {
            if self.options.role_quotas.contains_key(&role.name) {
                roles[r] += 1;
                for (i, _) in role.quota.0.iter().enumerate().filter(|(_, v)| **v > 0.0) {
                    names[i] += 1;
                }
            }
            if self.role_index.get(&role.name) != Some(&r) {
                return Err(format!("role {} not indexed", role.name));
            }
        }
        names[CPUS] += 1;
        names[MEM] += 1;
        for fw in self.frameworks.iter().flatten() {
            for fr in &fw.roles {
                roles[fr.role] += 1;
            }
        }
        for ag in self.agents.iter().flatten() {
            for h in &ag.held {
                roles[h.role] += 1;
            }
            for role in reserved_roles(&ag.total) {
                roles[self.role_index[role]] += 1;
            }
            for (s, _) in self.slots.known_bag(&ag.total).iter() {
                slots[*s as usize] += 1;
            }
        }
        for (s, &uses) in slots.iter().enumerate() {
            let slot = self.slots.get(s as u32);
            if uses > 0 && slot.scalar != usize::MAX {
                names[slot.scalar] += 1;
            }
        }
        for (table, counted, refs) in [
            ("role", &roles, &self.role_refs),
            ("name", &names, &self.names.refs),
        ] {
            for (i, &n) in counted.iter().enumerate() {
                if refs.count(i) != n {
                    return Err(format!(
                        "{table} {i}: {} uses counted, {n} found",
                        refs.count(i)
                    ));
                }
            }
            if refs.live() != counted.iter().filter(|&&n| n > 0).count() {
                return Err(format!("{table}s: wrong number in use"));
            }
        }
        for (s, &n) in slots.iter().enumerate() {
            if self.slots.uses(s as u32) != n {
                return Err(format!(
                    "slot {s}: {} uses counted, {n} found",
                    self.slots.uses(s as u32)
                ));
            }
        }
        if self.slots.live() != slots.iter().filter(|&&n| n > 0).count() {
            return Err("slots: wrong number in use".into());
        }
        let interned = self.interned();
        if !self.never_compact && !interned.within_bound() {
            return Err(format!("interned tables beyond their bound: {interned:?}"));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::VecDeque;

    fn r(s: &str) -> Resources {
        Resources::parse(s).unwrap()
    }

    fn opts() -> AllocatorOptions {
        AllocatorOptions {
            min_offer_cpus: 0.01,
            min_offer_mem: 32.0,
            ..AllocatorOptions::default()
        }
    }

    fn fid(s: &str) -> FrameworkId {
        FrameworkId::new(s)
    }

    fn aid(s: &str) -> AgentId {
        AgentId::new(s)
    }

    /// Simulates frameworks that each launch one task of `demand` per
    /// offer and decline the rest without a filter.
    fn run_drf(alloc: &mut DrfAllocator, demands: &[(&str, Resources)], cycles: usize) {
        let now = Instant::now();
        for _ in 0..cycles {
            let allocations = alloc.allocate(now);
            if allocations.is_empty() {
                break;
            }
            for a in allocations {
                let demand = &demands
                    .iter()
                    .find(|(f, _)| *f == a.framework_id.as_str())
                    .unwrap()
                    .1;
                let leftover = match a.resources.checked_sub(demand) {
                    Ok(rest) => rest,
                    Err(_) => a.resources.clone(),
                };
                alloc.recover(&a.framework_id, &a.agent_id, &leftover, None, now);
            }
        }
    }

    #[test]
    fn two_frameworks_converge_to_equal_dominant_shares() {
        // The DRF paper's example: 9 cpus, 18 GB; A wants <1 cpu, 4 GB>,
        // B wants <3 cpus, 1 GB>. DRF gives A 3 tasks and B 2 tasks:
        // both dominant shares 2/3.
        let mut alloc = DrfAllocator::new(AllocatorOptions {
            min_offer_cpus: 1.0,
            min_offer_mem: 1024.0,
            ..AllocatorOptions::default()
        });
        alloc.add_framework(&fid("a"), &[], true);
        alloc.add_framework(&fid("b"), &[], true);
        alloc.add_agent(&aid("s1"), &r("cpus:9;mem:18432"), &[], true);
        let demands = [("a", r("cpus:1;mem:4096")), ("b", r("cpus:3;mem:1024"))];
        run_drf(&mut alloc, &demands, 50);
        let sa = alloc.dominant_share(&fid("a"));
        let sb = alloc.dominant_share(&fid("b"));
        assert!((sa - 2.0 / 3.0).abs() < 1e-9, "a share {sa}");
        assert!((sb - 2.0 / 3.0).abs() < 1e-9, "b share {sb}");
    }

    #[test]
    fn many_agents_spread_fairly() {
        let mut alloc = DrfAllocator::new(opts());
        alloc.add_framework(&fid("a"), &[], true);
        alloc.add_framework(&fid("b"), &[], true);
        for i in 0..10 {
            alloc.add_agent(&aid(&format!("s{i}")), &r("cpus:4;mem:4096"), &[], true);
        }
        let out = alloc.allocate(Instant::now());
        assert_eq!(out.len(), 10);
        let to_a = out.iter().filter(|a| a.framework_id == fid("a")).count();
        assert_eq!(to_a, 5);
    }

    #[test]
    fn weights_skew_the_shares() {
        let mut weights = std::collections::BTreeMap::new();
        weights.insert("heavy".to_string(), 3.0);
        let mut alloc = DrfAllocator::new(AllocatorOptions {
            role_weights: weights,
            ..opts()
        });
        alloc.add_framework(&fid("h"), &["heavy".into()], true);
        alloc.add_framework(&fid("l"), &[], true);
        for i in 0..8 {
            alloc.add_agent(&aid(&format!("s{i}")), &r("cpus:1;mem:1024"), &[], true);
        }
        let out = alloc.allocate(Instant::now());
        let heavy = out.iter().filter(|a| a.framework_id == fid("h")).count();
        assert_eq!(heavy, 6, "weight 3 gets three times as much: {out:?}");
    }

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
    fn filters_hold_until_expiry_or_revive() {
        let mut alloc = DrfAllocator::new(opts());
        let t0 = Instant::now();
        alloc.add_framework(&fid("a"), &[], true);
        alloc.add_agent(&aid("s1"), &r("cpus:2;mem:1024"), &[], true);
        let out = alloc.allocate(t0);
        alloc.recover(
            &fid("a"),
            &aid("s1"),
            &out[0].resources,
            Some(Duration::from_secs(5)),
            t0,
        );
        assert!(alloc.allocate(t0 + Duration::from_secs(4)).is_empty());
        let out = alloc.allocate(t0 + Duration::from_secs(5));
        assert_eq!(out.len(), 1);
        alloc.recover(
            &fid("a"),
            &aid("s1"),
            &out[0].resources,
            Some(Duration::from_secs(60)),
            t0,
        );
        assert!(alloc.allocate(t0 + Duration::from_secs(6)).is_empty());
        alloc.revive(&fid("a"), &[]);
        assert_eq!(alloc.allocate(t0 + Duration::from_secs(6)).len(), 1);
    }

    #[test]
    fn filter_yields_when_more_resources_free_up() {
        let mut alloc = DrfAllocator::new(opts());
        let t0 = Instant::now();
        alloc.add_framework(&fid("a"), &[], true);
        alloc.add_agent(&aid("s1"), &r("cpus:2;mem:1024"), &[], true);
        let out = alloc.allocate(t0);
        // Uses 1 cpu / 512 mem, leaves the rest filtered.
        let used = r("cpus:1;mem:512");
        keep_and_decline_rest(&mut alloc, &out[0], &used, Duration::from_secs(60), t0);
        assert!(alloc.allocate(t0).is_empty());
        // The task ends: more is free than what was refused.
        alloc.recover(&fid("a"), &aid("s1"), &used, None, t0);
        let out = alloc.allocate(t0);
        assert_eq!(out.len(), 1);
        assert_eq!(out[0].resources, r("cpus:2;mem:1024"));
    }

    #[test]
    fn suppressed_and_inactive_get_nothing() {
        let mut alloc = DrfAllocator::new(opts());
        alloc.add_framework(&fid("a"), &[], true);
        alloc.add_framework(&fid("b"), &[], false);
        alloc.suppress(&fid("a"), &[]);
        alloc.add_agent(&aid("s1"), &r("cpus:2;mem:1024"), &[], true);
        assert!(alloc.allocate(Instant::now()).is_empty());
        alloc.activate_framework(&fid("b"));
        assert_eq!(alloc.allocate(Instant::now())[0].framework_id, fid("b"));
        alloc.deactivate_agent(&aid("s1"));
        alloc.remove_framework(&fid("b"));
        alloc.revive(&fid("a"), &[]);
        assert!(alloc.allocate(Instant::now()).is_empty());
        alloc.activate_agent(&aid("s1"));
        assert_eq!(alloc.allocate(Instant::now())[0].framework_id, fid("a"));
    }

    #[test]
    fn tiny_leftovers_are_not_offered() {
        let mut alloc = DrfAllocator::new(opts());
        alloc.add_framework(&fid("a"), &[], true);
        alloc.add_agent(&aid("s1"), &r("cpus:0.005;mem:16;disk:100"), &[], true);
        assert!(alloc.allocate(Instant::now()).is_empty());
        alloc.add_agent(&aid("s2"), &r("cpus:0.01;mem:1"), &[], true);
        assert_eq!(alloc.allocate(Instant::now()).len(), 1);
    }

    #[test]
    fn requests_are_served_first() {
        let mut alloc = DrfAllocator::new(opts());
        alloc.add_framework(&fid("a"), &[], true);
        alloc.add_framework(&fid("b"), &[], true);
        alloc.add_agent(&aid("s1"), &r("cpus:1;mem:1024"), &[], true);
        alloc.update_usage(&fid("b"), &aid("s1"), &r("cpus:0.5"));
        // b has a higher share, but asked for s1 explicitly.
        alloc.request_resources(
            &fid("b"),
            &[ResourceRequest {
                agent_id: Some(aid("s1")),
                resources: r("cpus:0.5"),
            }],
        );
        let out = alloc.allocate(Instant::now());
        assert_eq!(out.len(), 1);
        assert_eq!(out[0].framework_id, fid("b"));
    }

    fn role_opts(weights: &[(&str, f64)], quotas: &[(&str, &str)]) -> AllocatorOptions {
        AllocatorOptions {
            role_weights: weights.iter().map(|(r, w)| (r.to_string(), *w)).collect(),
            role_quotas: quotas.iter().map(|(r, q)| (r.to_string(), r_(q))).collect(),
            ..opts()
        }
    }

    fn r_(s: &str) -> Resources {
        r(s)
    }

    fn count(out: &[Allocation], f: &str) -> usize {
        out.iter().filter(|a| a.framework_id == fid(f)).count()
    }

    #[test]
    fn roles_are_shared_before_frameworks() {
        // Role a has two frameworks, role b one: the roles split the
        // cluster evenly, then a's frameworks split a's half (flat DRF
        // across frameworks would give a third each).
        let mut alloc = DrfAllocator::new(opts());
        alloc.add_framework(&fid("a1"), &["a".into()], true);
        alloc.add_framework(&fid("a2"), &["a".into()], true);
        alloc.add_framework(&fid("b1"), &["b".into()], true);
        for i in 0..12 {
            alloc.add_agent(&aid(&format!("s{i}")), &r("cpus:1;mem:1024"), &[], true);
        }
        let out = alloc.allocate(Instant::now());
        assert_eq!(out.len(), 12);
        assert_eq!(count(&out, "b1"), 6, "{out:?}");
        assert_eq!((count(&out, "a1"), count(&out, "a2")), (3, 3));
        assert!(out.iter().all(|a| a.role
            == if a.framework_id == fid("b1") {
                "b"
            } else {
                "a"
            }));
        assert!((alloc.role_share("a") - 0.5).abs() < 1e-9);
        assert!((alloc.framework_share(&fid("a1"), "a") - 0.25).abs() < 1e-9);
    }

    #[test]
    fn role_weights_scale_shares_in_proportion() {
        let mut alloc = DrfAllocator::new(role_opts(&[("web", 2.0), ("batch", 0.5)], &[]));
        alloc.add_framework(&fid("w"), &["web".into()], true);
        alloc.add_framework(&fid("d"), &[], true);
        alloc.add_framework(&fid("b"), &["batch".into()], true);
        for i in 0..14 {
            alloc.add_agent(&aid(&format!("s{i}")), &r("cpus:1;mem:1024"), &[], true);
        }
        let out = alloc.allocate(Instant::now());
        // Weights 2 : 1 : 0.5 over 14 agents: 8, 4, 2.
        assert_eq!(
            (count(&out, "w"), count(&out, "d"), count(&out, "b")),
            (8, 4, 2)
        );
        let (w, d, b) = (
            alloc.role_share("web"),
            alloc.role_share("*"),
            alloc.role_share("batch"),
        );
        assert!(
            (w - d).abs() < 1e-9 && (d - b).abs() < 1e-9,
            "weighted shares equal: {w} {d} {b}"
        );
    }

    #[test]
    fn a_framework_in_two_roles_is_counted_per_role() {
        let mut alloc = DrfAllocator::new(opts());
        alloc.add_framework(&fid("x"), &["web".into(), "batch".into()], true);
        alloc.add_framework(&fid("y"), &["batch".into()], true);
        alloc.add_agent(&aid("s1"), &r("cpus(web):4;mem(web):1024"), &[], true);
        alloc.add_agent(&aid("s2"), &r("cpus:4;mem:1024"), &[], true);
        let out = alloc.allocate(Instant::now());
        let web: Vec<_> = out.iter().filter(|a| a.role == "web").collect();
        assert_eq!(web.len(), 1);
        assert_eq!(web[0].framework_id, fid("x"));
        assert!(alloc.framework_share(&fid("x"), "web") > 0.0);
        // x's web allocation does not count in batch: the unreserved agent
        // goes to whichever batch client is lowest there (both at 0; x or y),
        // and x's batch share only holds what it got for batch.
        let batch: Vec<_> = out.iter().filter(|a| a.role == "batch").collect();
        assert_eq!(batch.len(), 1);
        let x_batch = alloc.framework_share(&fid("x"), "batch");
        let expect = if batch[0].framework_id == fid("x") {
            0.5
        } else {
            0.0
        };
        assert!((x_batch - expect).abs() < 1e-9);
        // Recovering the reserved resources takes them off the web account.
        alloc.recover(
            &fid("x"),
            &aid("s1"),
            &web[0].resources,
            None,
            Instant::now(),
        );
        assert_eq!(alloc.framework_share(&fid("x"), "web"), 0.0);
        assert!((alloc.framework_share(&fid("x"), "batch") - expect).abs() < 1e-9);
    }

    #[test]
    fn quota_is_satisfied_before_fair_sharing() {
        // q already holds more than the other role, so plain DRF would
        // favour "other"; q's guarantee of 8 cpus is met first.
        let mut alloc = DrfAllocator::new(role_opts(&[], &[("q", "cpus:8")]));
        alloc.add_framework(&fid("qf"), &["q".into()], true);
        alloc.add_framework(&fid("other"), &[], true);
        alloc.add_agent(
            &aid("s0"),
            &r("cpus:2;mem:1024"),
            &[(fid("qf"), r("cpus:2;mem:1024"))],
            true,
        );
        for i in 1..5 {
            alloc.add_agent(&aid(&format!("s{i}")), &r("cpus:2;mem:1024"), &[], true);
        }
        let out = alloc.allocate(Instant::now());
        assert_eq!(alloc.role_allocated("q", "cpus"), 8.0, "{out:?}");
        assert_eq!(count(&out, "qf"), 3);
        assert_eq!(count(&out, "other"), 1);
    }

    #[test]
    fn quota_caps_its_offer_at_the_shortfall() {
        let mut alloc = DrfAllocator::new(role_opts(&[], &[("q", "cpus:1")]));
        alloc.add_framework(&fid("qf"), &["q".into()], true);
        alloc.add_agent(&aid("s0"), &r("cpus:4;mem:1024"), &[], true);
        let out = alloc.allocate(Instant::now());
        // Stage 2 offers exactly the missing cpu; fair sharing then gives
        // q the rest too, in a second allocation on the next cycle.
        assert_eq!(out[0].resources, r("cpus:1;mem:1024"));
        assert_eq!(out[0].role, "q");
    }

    #[test]
    fn quota_headroom_is_held_back_from_other_roles() {
        let mut alloc = DrfAllocator::new(role_opts(&[], &[("q", "cpus:4")]));
        alloc.add_framework(&fid("other"), &[], true);
        for i in 0..4 {
            alloc.add_agent(&aid(&format!("s{i}")), &r("cpus:2;mem:1024"), &[], true);
        }
        let t0 = Instant::now();
        let out = alloc.allocate(t0);
        // 8 cpus free, 4 guaranteed to q (no framework yet): other gets 4.
        assert_eq!(count(&out, "other"), 2, "{out:?}");
        assert!(alloc.allocate(t0).is_empty(), "the rest is headroom");
        alloc.add_framework(&fid("qf"), &["q".into()], true);
        let out = alloc.allocate(t0);
        assert_eq!(count(&out, "qf"), 2);
        assert_eq!(alloc.role_allocated("q", "cpus"), 4.0);
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

    #[test]
    fn suppressing_one_role_keeps_the_others() {
        let mut alloc = DrfAllocator::new(opts());
        alloc.add_framework(&fid("x"), &["a".into(), "b".into()], true);
        alloc.add_agent(&aid("sa"), &r("cpus(a):1;mem(a):64"), &[], true);
        alloc.add_agent(&aid("sb"), &r("cpus(b):1;mem(b):64"), &[], true);
        alloc.suppress(&fid("x"), &["a".into()]);
        let out = alloc.allocate(Instant::now());
        assert_eq!(out.len(), 1);
        assert_eq!(
            (out[0].agent_id.as_str(), out[0].role.as_str()),
            ("sb", "b")
        );
        alloc.revive(&fid("x"), &["a".into()]);
        let out = alloc.allocate(Instant::now());
        assert_eq!(
            (out[0].agent_id.as_str(), out[0].role.as_str()),
            ("sa", "a")
        );
    }

    #[test]
    fn unbounded_decline_filters_never_expire_but_revive_clears_them() {
        let mut alloc = DrfAllocator::new(opts());
        let t0 = Instant::now();
        alloc.add_framework(&fid("a"), &[], true);
        alloc.add_framework(&fid("b"), &[], true);
        alloc.add_agent(&aid("s1"), &r("cpus:2;mem:1024"), &[], true);
        let year = Duration::from_secs(365 * 24 * 3600);
        for _ in 0..2 {
            let out = alloc.allocate(t0);
            assert_eq!(out.len(), 1);
            alloc.recover(
                &out[0].framework_id,
                &out[0].agent_id,
                &out[0].resources,
                Some(year),
                t0,
            );
        }
        assert!(alloc.allocate(t0 + Duration::from_secs(3600)).is_empty());
        alloc.revive(&fid("b"), &[]);
        assert_eq!(
            alloc.allocate(t0 + Duration::from_secs(3600))[0].framework_id,
            fid("b")
        );
    }

    /// Declines every allocation with `refuse`.
    /// The framework of `offer` launches `kept` on it and declines the rest
    /// for `refuse`.
    fn keep_and_decline_rest(
        alloc: &mut DrfAllocator,
        offer: &Allocation,
        kept: &Resources,
        refuse: Duration,
        now: Instant,
    ) {
        let rest = offer.resources.checked_sub(kept).unwrap();
        alloc.recover(
            &offer.framework_id,
            &offer.agent_id,
            &rest,
            Some(refuse),
            now,
        );
    }

    fn decline_all(alloc: &mut DrfAllocator, out: &[Allocation], refuse: Duration, now: Instant) {
        for a in out {
            alloc.recover(
                &a.framework_id,
                &a.agent_id,
                &a.resources,
                Some(refuse),
                now,
            );
        }
    }

    #[test]
    fn a_fully_filtered_agent_comes_back_when_its_filter_expires_exactly() {
        let mut alloc = DrfAllocator::new(opts());
        let t0 = Instant::now();
        alloc.add_framework(&fid("a"), &[], true);
        alloc.add_agent(&aid("s1"), &r("cpus:2;mem:1024;ports:[1-10]"), &[], true);
        let out = alloc.allocate(t0);
        assert_eq!(out.len(), 1);
        decline_all(&mut alloc, &out, Duration::from_secs(5), t0);
        // Several cycles while the filter holds (the agent goes dormant).
        for s in [0, 1, 2, 4] {
            assert!(alloc.allocate(t0 + Duration::from_secs(s)).is_empty());
        }
        let just_before = t0 + Duration::from_secs(5) - Duration::from_nanos(1);
        assert!(alloc.allocate(just_before).is_empty());
        // A filter holds while `until > now`: at `until` it is gone.
        let out = alloc.allocate(t0 + Duration::from_secs(5));
        assert_eq!(out.len(), 1);
        assert_eq!(out[0].resources, r("cpus:2;mem:1024;ports:[1-10]"));
    }

    #[test]
    fn the_earliest_of_several_filters_ends_the_wait() {
        let mut alloc = DrfAllocator::new(opts());
        let t0 = Instant::now();
        alloc.add_framework(&fid("a"), &[], true);
        alloc.add_framework(&fid("b"), &[], true);
        alloc.add_agent(&aid("s1"), &r("cpus:2;mem:1024"), &[], true);
        let first = alloc.allocate(t0);
        let long = if first[0].framework_id == fid("a") {
            10
        } else {
            3
        };
        decline_all(&mut alloc, &first, Duration::from_secs(long), t0);
        let second = alloc.allocate(t0);
        assert_ne!(second[0].framework_id, first[0].framework_id);
        decline_all(&mut alloc, &second, Duration::from_secs(13 - long), t0);
        assert!(alloc.allocate(t0 + Duration::from_secs(1)).is_empty());
        assert!(alloc.allocate(t0 + Duration::from_secs(2)).is_empty());
        // The 3 s filter ends first, whichever framework holds it.
        let out = alloc.allocate(t0 + Duration::from_secs(3));
        assert_eq!(out.len(), 1);
        let short_one = if long == 3 { &first } else { &second };
        assert_eq!(out[0].framework_id, short_one[0].framework_id);
    }

    #[test]
    fn revive_wakes_a_fully_filtered_agent() {
        let mut alloc = DrfAllocator::new(opts());
        let t0 = Instant::now();
        alloc.add_framework(&fid("a"), &[], true);
        alloc.add_agent(&aid("s1"), &r("cpus:2;mem:1024"), &[], true);
        let out = alloc.allocate(t0);
        decline_all(&mut alloc, &out, Duration::from_secs(3600), t0);
        assert!(alloc.allocate(t0).is_empty());
        assert!(alloc.allocate(t0).is_empty());
        alloc.revive(&fid("a"), &[]);
        assert_eq!(alloc.allocate(t0).len(), 1);
    }

    #[test]
    fn new_resources_and_new_frameworks_wake_a_fully_filtered_agent() {
        let mut alloc = DrfAllocator::new(opts());
        let t0 = Instant::now();
        alloc.add_framework(&fid("a"), &[], true);
        alloc.add_agent(&aid("s1"), &r("cpus:4;mem:1024"), &[], true);
        let out = alloc.allocate(t0);
        // `a` keeps one cpu (a task) and declines the rest for an hour.
        let task = r("cpus:1");
        keep_and_decline_rest(&mut alloc, &out[0], &task, Duration::from_secs(3600), t0);
        assert!(alloc.allocate(t0).is_empty());
        assert!(alloc.allocate(t0).is_empty());
        // The task ends: more is free than was refused, so it is offered.
        alloc.recover(&fid("a"), &aid("s1"), &task, None, t0);
        let out = alloc.allocate(t0);
        assert_eq!(out.len(), 1);
        assert_eq!(out[0].resources, r("cpus:4;mem:1024"));
        decline_all(&mut alloc, &out, Duration::from_secs(3600), t0);
        assert!(alloc.allocate(t0).is_empty());
        assert!(alloc.allocate(t0).is_empty());
        // A framework that arrives later is offered the agent at once.
        alloc.add_framework(&fid("b"), &[], true);
        let out = alloc.allocate(t0);
        assert_eq!(out.len(), 1);
        assert_eq!(out[0].framework_id, fid("b"));
        decline_all(&mut alloc, &out, Duration::from_secs(3600), t0);
        assert!(alloc.allocate(t0).is_empty());
        // So is one that reconnects after being away, or changes roles.
        alloc.deactivate_framework(&fid("b"));
        alloc.revive(&fid("b"), &[]);
        assert!(alloc.allocate(t0).is_empty(), "inactive");
        alloc.activate_framework(&fid("b"));
        assert_eq!(alloc.allocate(t0)[0].framework_id, fid("b"));
    }

    #[derive(Debug, Clone)]
    enum Op {
        Allocate,
        Recover { pick: usize, part: bool, refuse: u8 },
        Suppress(usize),
        Revive(usize),
        Deactivate(usize),
        Activate(usize),
        AddAgent,
        RemoveAgent(usize),
        RemoveFramework(usize),
        AddFramework,
        Advance(u8),
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            4 => Just(Op::Allocate),
            4 => (any::<usize>(), any::<bool>(), 0u8..10).prop_map(|(pick, part, refuse)| Op::Recover { pick, part, refuse }),
            1 => any::<usize>().prop_map(Op::Suppress),
            1 => any::<usize>().prop_map(Op::Revive),
            1 => any::<usize>().prop_map(Op::Deactivate),
            1 => any::<usize>().prop_map(Op::Activate),
            1 => Just(Op::AddAgent),
            1 => any::<usize>().prop_map(Op::RemoveAgent),
            1 => any::<usize>().prop_map(Op::RemoveFramework),
            1 => Just(Op::AddFramework),
            1 => (0u8..10).prop_map(Op::Advance),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(200))]
        /// Skipping dormant agents changes no allocation: an allocator that
        /// skips them and one that never does hand out exactly the same
        /// offers, whatever happens (filters expire, revive, suppress,
        /// agents and frameworks come and go).
        #[test]
        fn skipping_dormant_agents_changes_nothing(
            ops in proptest::collection::vec(op(), 1..120),
            quota in any::<bool>(),
        ) {
            // Without a quota, headroom never blocks skipping.
            let quotas: &[(&str, &str)] = if quota { &[("web", "cpus:3;mem:512")] } else { &[] };
            let options = role_opts(&[("batch", 0.5)], quotas);
            let mut fast = DrfAllocator::new(options.clone());
            let mut slow = DrfAllocator::new(options);
            slow.never_sleep = true;
            let mut now = Instant::now();
            let mut agents: Vec<AgentId> = Vec::new();
            let mut frameworks: Vec<FrameworkId> = Vec::new();
            let mut held: Vec<Allocation> = Vec::new();
            let mut next = 0;
            let roles = [vec![], vec!["web".to_string()], vec!["web".to_string(), "batch".to_string()]];
            for _ in 0..3 {
                let id = aid(&format!("s{next}"));
                let total = r("cpus:4;mem:4096;cpus(web):2;mem(batch):256;ports:[1-100]");
                let f = fid(&format!("f{next}"));
                for alloc in [&mut fast, &mut slow] {
                    alloc.add_agent(&id, &total, &[], true);
                    alloc.add_framework(&f, &roles[next % 3], true);
                }
                agents.push(id);
                frameworks.push(f);
                next += 1;
            }
            for op in ops {
                match op {
                    Op::Allocate => {
                        let a = fast.allocate(now);
                        let b = slow.allocate(now);
                        prop_assert_eq!(&a, &b);
                        held.extend(a);
                    }
                    Op::Recover { pick, part, refuse } => if !held.is_empty() {
                        let a = held.remove(pick % held.len());
                        let back = if part {
                            let some = r("cpus:1;mem:100");
                            match a.resources.checked_sub(&some) {
                                Ok(rest) => { held.push(Allocation { resources: some, ..a.clone() }); rest }
                                Err(_) => a.resources.clone(),
                            }
                        } else { a.resources.clone() };
                        // Long filters too, so that agents stay dormant.
                        let refuse = (refuse > 0).then(|| Duration::from_secs(u64::from(refuse) * 7));
                        for alloc in [&mut fast, &mut slow] {
                            alloc.recover(&a.framework_id, &a.agent_id, &back, refuse, now);
                        }
                    }
                    Op::Suppress(i) => if !frameworks.is_empty() {
                        let f = &frameworks[i % frameworks.len()];
                        fast.suppress(f, &[]);
                        slow.suppress(f, &[]);
                    },
                    Op::Revive(i) => if !frameworks.is_empty() {
                        let f = &frameworks[i % frameworks.len()];
                        fast.revive(f, &[]);
                        slow.revive(f, &[]);
                    },
                    Op::Deactivate(i) => if !frameworks.is_empty() {
                        let f = &frameworks[i % frameworks.len()];
                        fast.deactivate_framework(f);
                        slow.deactivate_framework(f);
                    },
                    Op::Activate(i) => if !frameworks.is_empty() {
                        let f = &frameworks[i % frameworks.len()];
                        fast.activate_framework(f);
                        slow.activate_framework(f);
                    },
                    Op::AddAgent => {
                        let id = aid(&format!("s{next}"));
                        next += 1;
                        let total = r("cpus:2;mem:2048;cpus(batch):1");
                        fast.add_agent(&id, &total, &[], true);
                        slow.add_agent(&id, &total, &[], true);
                        agents.push(id);
                    }
                    Op::RemoveAgent(i) => if !agents.is_empty() {
                        let id = agents.remove(i % agents.len());
                        fast.remove_agent(&id);
                        slow.remove_agent(&id);
                        held.retain(|a| a.agent_id != id);
                    },
                    Op::RemoveFramework(i) => if !frameworks.is_empty() {
                        let f = frameworks.remove(i % frameworks.len());
                        fast.remove_framework(&f);
                        slow.remove_framework(&f);
                        held.retain(|a| a.framework_id != f);
                    },
                    Op::AddFramework => {
                        let f = fid(&format!("f{next}"));
                        fast.add_framework(&f, &roles[next % 3], true);
                        slow.add_framework(&f, &roles[next % 3], true);
                        next += 1;
                        frameworks.push(f);
                    }
                    Op::Advance(s) => now += Duration::from_secs(u64::from(s)),
                }
            }
        }

        /// Whatever happens, an agent's resources are never handed out
        /// twice, never beyond its total, and never to a suppressed or
        /// inactive framework.
        #[test]
        fn never_double_allocates(ops in proptest::collection::vec(op(), 1..80)) {
            // Three roles, one with a quota, reservations for two of them.
            let mut alloc = DrfAllocator::new(role_opts(&[("batch", 0.5)], &[("web", "cpus:3;mem:512")]));
            let mut now = Instant::now();
            let mut agents: Vec<(AgentId, Resources)> = Vec::new();
            let mut frameworks: Vec<FrameworkId> = Vec::new();
            let mut suppressed: std::collections::HashSet<FrameworkId> = Default::default();
            let mut inactive: std::collections::HashSet<FrameworkId> = Default::default();
            // Model: what is held (offered or used) per (framework, agent).
            let mut held: Vec<Allocation> = Vec::new();
            let mut next = 0;
            let roles = [
                vec![],
                vec!["web".to_string()],
                vec!["web".to_string(), "batch".to_string()],
            ];
            let mut framework_roles: HashMap<FrameworkId, Vec<String>> = HashMap::default();
            for _ in 0..3 {
                let id = aid(&format!("s{next}"));
                let total = r("cpus:4;mem:4096;cpus(web):2;mem(batch):256;ports:[1-100]");
                alloc.add_agent(&id, &total, &[], true);
                agents.push((id, total));
                let f = fid(&format!("f{next}"));
                alloc.add_framework(&f, &roles[next % 3], true);
                framework_roles.insert(f.clone(), normalized_roles(&roles[next % 3]));
                frameworks.push(f);
                next += 1;
            }
            for op in ops {
                match op {
                    Op::Allocate => {
                        let out = alloc.allocate(now);
                        let mut seen = std::collections::HashSet::new();
                        for a in out {
                            prop_assert!(seen.insert((a.framework_id.clone(), a.agent_id.clone())), "two offers for one pair in a cycle");
                            prop_assert!(!suppressed.contains(&a.framework_id));
                            prop_assert!(!inactive.contains(&a.framework_id));
                            prop_assert!(frameworks.contains(&a.framework_id));
                            // Allocated for one of the framework's roles, and
                            // reserved resources only for that very role.
                            prop_assert!(framework_roles[&a.framework_id].contains(&a.role));
                            prop_assert!(a.resources.iter().all(|x| x.role == DEFAULT_ROLE || x.role == a.role));
                            held.push(a);
                        }
                    }
                    Op::Recover { pick, part, refuse } => {
                        if !held.is_empty() {
                            let i = pick % held.len();
                            let a = held.remove(i);
                            let back = if part {
                                let some = r("cpus:1;mem:100");
                                match a.resources.checked_sub(&some) {
                                    Ok(rest) => { held.push(Allocation { resources: some, ..a.clone() }); rest }
                                    Err(_) => a.resources.clone(),
                                }
                            } else { a.resources.clone() };
                            let refuse = (refuse > 0).then(|| Duration::from_secs(refuse as u64));
                            alloc.recover(&a.framework_id, &a.agent_id, &back, refuse, now);
                        }
                    }
                    Op::Suppress(i) => if !frameworks.is_empty() {
                        let f = frameworks[i % frameworks.len()].clone();
                        alloc.suppress(&f, &[]);
                        suppressed.insert(f);
                    },
                    Op::Revive(i) => if !frameworks.is_empty() {
                        let f = frameworks[i % frameworks.len()].clone();
                        alloc.revive(&f, &[]);
                        suppressed.remove(&f);
                    },
                    Op::Deactivate(i) => if !frameworks.is_empty() {
                        let f = frameworks[i % frameworks.len()].clone();
                        alloc.deactivate_framework(&f);
                        inactive.insert(f);
                    },
                    Op::Activate(i) => if !frameworks.is_empty() {
                        let f = frameworks[i % frameworks.len()].clone();
                        alloc.activate_framework(&f);
                        inactive.remove(&f);
                    },
                    Op::AddAgent => {
                        let id = aid(&format!("s{next}"));
                        next += 1;
                        let total = r("cpus:2;mem:2048;cpus(batch):1");
                        alloc.add_agent(&id, &total, &[], true);
                        agents.push((id, total));
                    }
                    Op::RemoveAgent(i) => if !agents.is_empty() {
                        let (id, _) = agents.remove(i % agents.len());
                        alloc.remove_agent(&id);
                        held.retain(|a| a.agent_id != id);
                    },
                    Op::RemoveFramework(i) => if !frameworks.is_empty() {
                        let f = frameworks.remove(i % frameworks.len());
                        alloc.remove_framework(&f);
                        held.retain(|a| a.framework_id != f);
                        suppressed.remove(&f);
                        inactive.remove(&f);
                    },
                    Op::AddFramework => {
                        let f = fid(&format!("f{next}"));
                        alloc.add_framework(&f, &roles[next % 3], true);
                        framework_roles.insert(f.clone(), normalized_roles(&roles[next % 3]));
                        next += 1;
                        frameworks.push(f);
                    }
                    Op::Advance(s) => now += Duration::from_secs(s as u64),
                }
                // Invariant: per agent, held + available == total exactly.
                for (id, total) in &agents {
                    let mut sum = alloc.available(id);
                    for a in held.iter().filter(|a| &a.agent_id == id) {
                        sum += &a.resources;
                    }
                    prop_assert_eq!(&sum, total, "agent {} accounting broke", id);
                }
                // Invariant: the allocator's cached views match their sources.
                if let Err(e) = alloc.check_books() {
                    prop_assert!(false, "{}", e);
                }
                // Invariant: the roles' books add up to what is held.
                let booked: f64 = ["*", "web", "batch"].iter().map(|role| alloc.role_allocated(role, "cpus")).sum();
                let held_cpus: f64 = held.iter().map(|a| a.resources.cpus()).sum();
                prop_assert!((booked - held_cpus).abs() < 1e-6, "roles book {} cpus, {} held", booked, held_cpus);
            }
        }
    }

    /// Runs the same calls on an allocator and on a copy that never
    /// compacts its interned tables.
    struct Twins {
        fast: DrfAllocator,
        reference: DrfAllocator,
    }

    impl Twins {
        fn new(options: AllocatorOptions) -> Self {
            let mut reference = DrfAllocator::new(options.clone());
            reference.never_compact = true;
            Twins {
                fast: DrfAllocator::new(options),
                reference,
            }
        }

        fn each(&mut self, mut call: impl FnMut(&mut DrfAllocator)) {
            call(&mut self.fast);
            call(&mut self.reference);
        }

        /// One cycle: the same allocations from both.
        fn allocate(&mut self, now: Instant) -> Vec<Allocation> {
            let out = self.fast.allocate(now);
            assert_eq!(
                out,
                self.reference.allocate(now),
                "the twins allocate differently"
            );
            out
        }

        fn check(&self) -> Result<(), String> {
            self.fast.check_books()?;
            self.reference.check_books()
        }
    }

    /// An agent with resources reserved for `role` and resources of names
    /// no one else has (a scalar, ranges, a set).
    fn odd_agent(role: &str, n: usize) -> Resources {
        r(&format!(
            "cpus:4;mem:4096;cpus({role}):1;mem({role}):256;gpus{n}:2;dev{n}:[1-4];tag{n}:{{a,b}}"
        ))
    }

    /// Thousands of frameworks come and go, each in roles no one used
    /// before, beside agents that come and go with reservations for those
    /// roles and resources of names no one used before. The interned
    /// tables stay within their bound all along, and every allocation is
    /// the one an allocator that forgets nothing makes.
    #[test]
    fn churning_roles_and_names_stay_within_bound_and_allocate_the_same() {
        let mut twins = Twins::new(role_opts(&[("web", 2.0)], &[("web", "cpus:2;mem:256")]));
        let mut now = Instant::now();
        for i in 0..10 {
            twins.each(|a| {
                a.add_agent(
                    &aid(&format!("s{i}")),
                    &r("cpus:8;mem:8192;ports:[1-100]"),
                    &[],
                    true,
                )
            });
        }
        let mut frameworks: VecDeque<FrameworkId> = VecDeque::new();
        let mut odd_agents: VecDeque<AgentId> = VecDeque::new();
        let mut offers = 0;
        for i in 0..2000 {
            let f = fid(&format!("f{i}"));
            let mut roles = vec![format!("role-{i}"), format!("spare-{i}")];
            if i % 7 == 0 {
                roles.push("web".into());
            }
            twins.each(|a| a.add_framework(&f, &roles, true));
            frameworks.push_back(f.clone());
            if i % 3 == 0 {
                // It moves to another role of its own.
                let roles = [format!("moved-{i}")];
                twins.each(|a| a.update_framework(&f, &roles));
            }
            if i % 10 == 0 {
                let id = aid(&format!("odd{i}"));
                let total = odd_agent(&format!("role-{i}"), i);
                twins.each(|a| a.add_agent(&id, &total, &[], true));
                odd_agents.push_back(id);
            }
            // Each framework keeps a little of every offer and declines
            // the rest for a few seconds.
            for offer in twins.allocate(now) {
                offers += 1;
                let rest = offer
                    .resources
                    .checked_sub(&r("cpus:0.5;mem:64"))
                    .unwrap_or_else(|_| offer.resources.clone());
                let refuse = Some(Duration::from_secs(1 + (i as u64 % 4)));
                twins.each(|a| a.recover(&offer.framework_id, &offer.agent_id, &rest, refuse, now));
            }
            if frameworks.len() > 40 {
                let gone = frameworks.pop_front().unwrap();
                twins.each(|a| a.remove_framework(&gone));
            }
            if odd_agents.len() > 4 {
                let gone = odd_agents.pop_front().unwrap();
                twins.each(|a| a.remove_agent(&gone));
            }
            now += Duration::from_secs(1);
            let interned = twins.fast.interned();
            assert!(interned.within_bound(), "step {i}: {interned:?}");
            if i % 100 == 0 {
                twins.check().unwrap();
            }
        }
        twins.check().unwrap();
        assert!(offers > 2000, "{offers} offers");
        let (fast, reference) = (twins.fast.interned(), twins.reference.interned());
        assert_eq!(
            (fast.roles_in_use, fast.names_in_use),
            (reference.roles_in_use, reference.names_in_use)
        );
        // The forgetful one holds what is in use; the other everything.
        assert!(
            reference.roles > 4600 && reference.names > 1200,
            "{reference:?}"
        );
        assert!(fast.roles < 300 && fast.names < 200, "{fast:?}");
    }

    /// `n` role names never used before.
    fn fresh_roles(n: u8, next: &mut usize) -> Vec<String> {
        (0..n)
            .map(|_| {
                *next += 1;
                format!("r{next}")
            })
            .collect()
    }

    #[derive(Debug, Clone)]
    enum ChurnOp {
        Allocate,
        Recover {
            pick: usize,
            part: bool,
            refuse: u8,
        },
        /// A framework in this many roles never used before (and `web`).
        /// Always some: the default role would be a name used again, and
        /// a role forgotten and seen again may be ordered differently
        /// among roles of equal share.
        AddFramework(u8, bool),
        UpdateFramework(usize, u8),
        RemoveFramework(usize),
        /// An agent reserving for a live framework's role (or a new one),
        /// with resource names never used before.
        AddAgent(usize),
        RemoveAgent(usize),
        Advance(u8),
    }

    fn churn_op() -> impl Strategy<Value = ChurnOp> {
        prop_oneof![
            4 => Just(ChurnOp::Allocate),
            4 => (any::<usize>(), any::<bool>(), 0u8..10).prop_map(|(pick, part, refuse)| ChurnOp::Recover { pick, part, refuse }),
            3 => (1u8..12, any::<bool>()).prop_map(|(n, web)| ChurnOp::AddFramework(n, web)),
            1 => (any::<usize>(), 1u8..12).prop_map(|(i, n)| ChurnOp::UpdateFramework(i, n)),
            3 => any::<usize>().prop_map(ChurnOp::RemoveFramework),
            2 => any::<usize>().prop_map(ChurnOp::AddAgent),
            2 => any::<usize>().prop_map(ChurnOp::RemoveAgent),
            1 => (0u8..10).prop_map(ChurnOp::Advance),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(100))]
        /// Whatever comes and goes, with role and resource names never
        /// used again once forgotten, the interned tables stay within their bound, the
        /// use counts match the books, and the allocations are those of
        /// an allocator that never forgets a name.
        #[test]
        fn forgetting_unused_names_changes_no_allocation(
            ops in proptest::collection::vec(churn_op(), 1..200),
        ) {
            let mut twins = Twins::new(role_opts(&[("web", 0.5)], &[("web", "cpus:3;mem:512;gpus0:1")]));
            let mut now = Instant::now();
            let mut agents: Vec<AgentId> = Vec::new();
            let mut frameworks: Vec<(FrameworkId, Vec<String>)> = Vec::new();
            let mut held: Vec<Allocation> = Vec::new();
            let mut next = 0;
            for _ in 0..2 {
                let id = aid(&format!("s{next}"));
                next += 1;
                twins.each(|a| a.add_agent(&id, &r("cpus:4;mem:4096;ports:[1-100]"), &[], true));
                agents.push(id);
            }
            for op in ops {
                match op {
                    ChurnOp::Allocate => held.extend(twins.allocate(now)),
                    ChurnOp::Recover { pick, part, refuse } => if !held.is_empty() {
                        let a = held.remove(pick % held.len());
                        let back = if part {
                            let some = r("cpus:1;mem:100");
                            match a.resources.checked_sub(&some) {
                                Ok(rest) => { held.push(Allocation { resources: some, ..a.clone() }); rest }
                                Err(_) => a.resources.clone(),
                            }
                        } else { a.resources.clone() };
                        let refuse = (refuse > 0).then(|| Duration::from_secs(u64::from(refuse)));
                        twins.each(|x| x.recover(&a.framework_id, &a.agent_id, &back, refuse, now));
                    }
                    ChurnOp::AddFramework(n, web) => {
                        let f = fid(&format!("f{next}"));
                        next += 1;
                        let mut roles = fresh_roles(n, &mut next);
                        if web {
                            roles.push("web".into());
                        }
                        twins.each(|a| a.add_framework(&f, &roles, true));
                        frameworks.push((f, roles));
                    }
                    ChurnOp::UpdateFramework(i, n) => if !frameworks.is_empty() {
                        let i = i % frameworks.len();
                        let roles = fresh_roles(n, &mut next);
                        twins.each(|a| a.update_framework(&frameworks[i].0, &roles));
                        frameworks[i].1 = roles;
                    },
                    ChurnOp::RemoveFramework(i) => if !frameworks.is_empty() {
                        let (f, _) = frameworks.remove(i % frameworks.len());
                        twins.each(|a| a.remove_framework(&f));
                        held.retain(|a| a.framework_id != f);
                    },
                    ChurnOp::AddAgent(i) => {
                        let role = frameworks
                            .get(i % frameworks.len().max(1))
                            .and_then(|(_, roles)| roles.first().cloned())
                            .unwrap_or_else(|| fresh_roles(1, &mut next).remove(0));
                        let id = aid(&format!("s{next}"));
                        let total = odd_agent(&role, next);
                        next += 1;
                        twins.each(|a| a.add_agent(&id, &total, &[], true));
                        agents.push(id);
                    }
                    ChurnOp::RemoveAgent(i) => if !agents.is_empty() {
                        let id = agents.remove(i % agents.len());
                        twins.each(|a| a.remove_agent(&id));
                        held.retain(|a| a.agent_id != id);
                    },
                    ChurnOp::Advance(s) => now += Duration::from_secs(u64::from(s)),
                }
                if let Err(e) = twins.check() {
                    prop_assert!(false, "{}", e);
                }
            }
        }
    }
}
