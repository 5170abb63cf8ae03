//! Hierarchical dominant resource fairness with quota, split along the
//! seams of Mesos's hierarchical allocator:
//!
//! - [`sorter`]: shares, weights and the order in which roles and their
//!   frameworks are served;
//! - [`books`]: what is allocated where, and what is free on each agent;
//! - [`filters`]: decline filters, and agents found fully filtered;
//! - [`quota`]: guarantees served first, and the headroom they hold back;
//! - [`cycle`]: one allocation cycle, which uses all of the above;
//! - [`interned`]: the tables of interned role and resource names, and
//!   their reclaiming.
//!
//! This file holds the allocator's state (frameworks, agents, roles) and
//! the [`Allocator`] trait's face over it.

use agora_proto::hash::HashMap;
use std::hash::{BuildHasherDefault, Hasher};
use std::time::Duration;

use agora_proto::scheduler::ResourceRequest;
use agora_proto::{AgentId, FrameworkId, Resources};
use tokio::time::Instant;

use super::bag::{Bag, Names, Slots};
use super::refs::Refs;
use super::{Allocation, Allocator, AllocatorOptions, Interned, Limits};

mod books;
mod cycle;
mod filters;
mod interned;
mod quota;
mod sorter;
#[cfg(test)]
mod tests;

use books::{reserved_roles, Scalars};
use cycle::Offerable;
use filters::Filter;
use sorter::{share_key, Rank, RoleQueue};

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
    /// Roles with a limit: while there is any, agents are not put to
    /// sleep (a role at its limit may take more once it gives some back,
    /// which changes no other agent's pool).
    limited_roles: usize,
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

#[derive(Debug)]
struct Role {
    name: String,
    weight: f64,
    /// The guarantee, per scalar name (empty when the role has no quota).
    quota: Scalars,
    /// The limit: (scalar name, most allocated) for each name it names;
    /// `None` when the role has no limit.
    limit: Option<Vec<(usize, f64)>>,
    /// Whether the role has a quota (guarantee or limit) configured: it is
    /// then in use, and so are the names its quota names.
    pinned: bool,
    /// Everything allocated for this role, to any framework.
    allocated: Scalars,
    /// Allocations made for this role so far: the sorter's tie-break.
    allocations: u64,
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
    /// Allocations made to this client so far: the sorter's tie-break.
    allocations: u64,
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
        self.cycle(now)
    }

    fn set_quota(&mut self, role: &str, guarantee: &Resources, limit: Option<&Limits>) {
        DrfAllocator::set_quota(self, role, guarantee, limit);
    }

    fn set_weight(&mut self, role: &str, weight: f64) {
        DrfAllocator::set_weight(self, role, weight);
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
            limited_roles: 0,
            #[cfg(test)]
            never_sleep: false,
            #[cfg(test)]
            never_compact: false,
        };
        let quota_roles: Vec<String> = alloc
            .options
            .role_quotas
            .keys()
            .chain(alloc.options.role_limits.keys())
            .cloned()
            .collect();
        for role in quota_roles {
            alloc.role_idx(&role);
        }
        alloc
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
        self.roles.push(Role {
            name: name.to_string(),
            weight,
            quota: Scalars::default(),
            limit: None,
            pinned: false,
            allocated: Scalars::default(),
            allocations: 0,
        });
        self.role_index.insert(name.to_string(), r);
        let guarantee = self.options.role_quotas.get(name).cloned();
        let limit = self.options.role_limits.get(name).cloned();
        if guarantee.is_some() || limit.is_some() {
            self.configure_quota(r, guarantee.as_ref(), limit.as_ref());
        }
        r
    }
}
