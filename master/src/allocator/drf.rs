//! Dominant resource fairness. Each cycle visits the agents with free
//! resources (starting at a rotating position) and hands each agent's free
//! resources to the active framework with the lowest weighted dominant
//! share that may use them and has not filtered them. Frameworks are kept
//! in a `BTreeSet` ordered by share, so a cycle costs about
//! `agents × log(frameworks)` plus the filtered pairs it skips.

use std::collections::{BTreeSet, HashMap};
use std::time::Duration;

use agora_proto::scheduler::ResourceRequest;
use agora_proto::{AgentId, FrameworkId, Resources, DEFAULT_ROLE};
use tokio::time::Instant;

use super::{Allocation, Allocator, AllocatorOptions};

/// The default [`Allocator`]: weighted DRF with role reservations.
#[derive(Debug)]
pub struct DrfAllocator {
    options: AllocatorOptions,
    frameworks: Vec<Option<Fw>>,
    free_frameworks: Vec<usize>,
    framework_index: HashMap<FrameworkId, usize>,
    agents: Vec<Option<Ag>>,
    free_agents: Vec<usize>,
    agent_index: HashMap<AgentId, usize>,
    cluster_total: Resources,
    cursor: usize,
}

#[derive(Debug)]
struct Fw {
    id: FrameworkId,
    roles: Vec<String>,
    suppressed: BTreeSet<String>,
    active: bool,
    allocated: Resources,
    per_agent: HashMap<usize, Resources>,
    requests: Vec<ResourceRequest>,
}

#[derive(Debug)]
struct Ag {
    id: AgentId,
    total: Resources,
    available: Resources,
    active: bool,
    filters: HashMap<usize, Filter>,
    frameworks: BTreeSet<usize>,
}

#[derive(Debug)]
struct Filter {
    until: Instant,
    refused: Resources,
}

/// Per-cycle view of a framework.
struct Candidate {
    active_roles: Vec<String>,
    weight: f64,
}

// === impl DrfAllocator ===

impl DrfAllocator {
    /// An empty allocator.
    pub fn new(options: AllocatorOptions) -> Self {
        DrfAllocator {
            options,
            frameworks: Vec::new(),
            free_frameworks: Vec::new(),
            framework_index: HashMap::new(),
            agents: Vec::new(),
            free_agents: Vec::new(),
            agent_index: HashMap::new(),
            cluster_total: Resources::new(),
            cursor: 0,
        }
    }

    /// What is allocated to the framework on the agent (for tests and /state).
    pub fn allocated(&self, framework_id: &FrameworkId, agent_id: &AgentId) -> Resources {
        let (Some(&f), Some(&a)) = (
            self.framework_index.get(framework_id),
            self.agent_index.get(agent_id),
        ) else {
            return Resources::new();
        };
        self.fw(f)
            .and_then(|fw| fw.per_agent.get(&a).cloned())
            .unwrap_or_default()
    }

    /// What is free on the agent.
    pub fn available(&self, agent_id: &AgentId) -> Resources {
        self.agent_index
            .get(agent_id)
            .and_then(|&a| self.ag(a))
            .map(|ag| ag.available.clone())
            .unwrap_or_default()
    }

    /// The framework's weighted dominant share, 0 when unknown.
    pub fn dominant_share(&self, framework_id: &FrameworkId) -> f64 {
        let totals = self.totals();
        self.framework_index
            .get(framework_id)
            .and_then(|&f| self.fw(f))
            .map(|fw| share(&fw.allocated, &totals) / self.weight(&fw.roles))
            .unwrap_or(0.0)
    }

    fn fw(&self, f: usize) -> Option<&Fw> {
        self.frameworks.get(f).and_then(Option::as_ref)
    }

    fn ag(&self, a: usize) -> Option<&Ag> {
        self.agents.get(a).and_then(Option::as_ref)
    }

    fn totals(&self) -> Vec<(String, f64)> {
        self.cluster_total
            .scalar_totals()
            .into_iter()
            .filter(|(_, v)| *v > 0.0)
            .map(|(n, v)| (n.to_string(), v))
            .collect()
    }

    fn weight(&self, roles: &[String]) -> f64 {
        let w = roles
            .iter()
            .map(|r| self.options.role_weights.get(r).copied().unwrap_or(1.0))
            .fold(f64::MIN, f64::max);
        if w.is_finite() && w > 0.0 {
            w
        } else {
            1.0
        }
    }

    fn worth_offering(&self, r: &Resources) -> bool {
        r.at_least(self.options.min_offer_cpus, self.options.min_offer_mem)
            && (r.cpus() > 0.0 || r.mem() > 0.0)
    }

    /// Moves `resources` (capped to what is free) from the agent's free
    /// pool to the framework. Returns what was actually moved.
    fn take(&mut self, f: usize, a: usize, resources: &Resources) -> Resources {
        let Some(ag) = self.agents.get_mut(a).and_then(Option::as_mut) else {
            return Resources::new();
        };
        let rest = ag.available.saturating_sub(resources);
        let taken = ag.available.saturating_sub(&rest);
        ag.available = rest;
        ag.frameworks.insert(f);
        if let Some(fw) = self.frameworks.get_mut(f).and_then(Option::as_mut) {
            fw.allocated += &taken;
            fw.per_agent.entry(a).or_default().add_all(&taken);
        }
        taken
    }

    fn candidate(&self, fw: &Fw) -> Option<Candidate> {
        if !fw.active {
            return None;
        }
        let active_roles: Vec<String> = fw
            .roles
            .iter()
            .filter(|r| !fw.suppressed.contains(*r))
            .cloned()
            .collect();
        if active_roles.is_empty() {
            return None;
        }
        Some(Candidate {
            weight: self.weight(&fw.roles),
            active_roles,
        })
    }

    /// What of `available` the candidate may be offered, unless filtered.
    fn offerable(
        available: &Resources,
        unreserved_only: bool,
        cand: &Candidate,
        filter: Option<&Filter>,
        now: Instant,
    ) -> Option<Resources> {
        let offer = if unreserved_only {
            available.clone()
        } else {
            available.allocatable_to(&cand.active_roles)
        };
        if let Some(filter) = filter {
            if filter.until > now && filter.refused.contains(&offer) {
                return None;
            }
        }
        Some(offer)
    }
}

fn share(allocated: &Resources, totals: &[(String, f64)]) -> f64 {
    totals
        .iter()
        .map(|(name, total)| allocated.scalar(name) / total)
        .fold(0.0, f64::max)
}

fn share_key(s: f64) -> u64 {
    if s.is_finite() && s >= 0.0 {
        s.to_bits()
    } else {
        u64::MAX
    }
}

fn normalized_roles(roles: &[String]) -> Vec<String> {
    if roles.is_empty() {
        vec![DEFAULT_ROLE.to_string()]
    } else {
        roles.to_vec()
    }
}

impl Allocator for DrfAllocator {
    fn add_framework(&mut self, framework_id: &FrameworkId, roles: &[String], active: bool) {
        if let Some(&f) = self.framework_index.get(framework_id) {
            if let Some(fw) = self.frameworks[f].as_mut() {
                fw.roles = normalized_roles(roles);
                fw.active = active;
            }
            return;
        }
        let fw = Fw {
            id: framework_id.clone(),
            roles: normalized_roles(roles),
            suppressed: BTreeSet::new(),
            active,
            allocated: Resources::new(),
            per_agent: HashMap::new(),
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
    }

    fn update_framework(&mut self, framework_id: &FrameworkId, roles: &[String]) {
        if let Some(fw) = self
            .framework_index
            .get(framework_id)
            .and_then(|&f| self.frameworks[f].as_mut())
        {
            fw.roles = normalized_roles(roles);
        }
    }

    fn remove_framework(&mut self, framework_id: &FrameworkId) {
        let Some(f) = self.framework_index.remove(framework_id) else {
            return;
        };
        let Some(fw) = self.frameworks[f].take() else {
            return;
        };
        self.free_frameworks.push(f);
        for (a, res) in fw.per_agent {
            if let Some(ag) = self.agents.get_mut(a).and_then(Option::as_mut) {
                ag.available += &res;
                ag.frameworks.remove(&f);
            }
        }
        for ag in self.agents.iter_mut().flatten() {
            ag.filters.remove(&f);
        }
    }

    fn activate_framework(&mut self, framework_id: &FrameworkId) {
        if let Some(fw) = self
            .framework_index
            .get(framework_id)
            .and_then(|&f| self.frameworks[f].as_mut())
        {
            fw.active = true;
        }
    }

    fn deactivate_framework(&mut self, framework_id: &FrameworkId) {
        if let Some(fw) = self
            .framework_index
            .get(framework_id)
            .and_then(|&f| self.frameworks[f].as_mut())
        {
            fw.active = false;
        }
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
        let ag = Ag {
            id: agent_id.clone(),
            total: total.clone(),
            available: total.clone(),
            active,
            filters: HashMap::new(),
            frameworks: BTreeSet::new(),
        };
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
        self.cluster_total += total;
        for (fid, res) in used {
            if let Some(&f) = self.framework_index.get(fid) {
                self.take(f, a, res);
            }
        }
    }

    fn remove_agent(&mut self, agent_id: &AgentId) {
        let Some(a) = self.agent_index.remove(agent_id) else {
            return;
        };
        let Some(ag) = self.agents[a].take() else {
            return;
        };
        self.free_agents.push(a);
        self.cluster_total = self.cluster_total.saturating_sub(&ag.total);
        for f in ag.frameworks {
            if let Some(fw) = self.frameworks.get_mut(f).and_then(Option::as_mut) {
                if let Some(res) = fw.per_agent.remove(&a) {
                    fw.allocated = fw.allocated.saturating_sub(&res);
                }
            }
        }
    }

    fn activate_agent(&mut self, agent_id: &AgentId) {
        if let Some(ag) = self
            .agent_index
            .get(agent_id)
            .and_then(|&a| self.agents[a].as_mut())
        {
            ag.active = true;
        }
    }

    fn deactivate_agent(&mut self, agent_id: &AgentId) {
        if let Some(ag) = self
            .agent_index
            .get(agent_id)
            .and_then(|&a| self.agents[a].as_mut())
        {
            ag.active = false;
        }
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
            self.take(f, a, resources);
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
        let (Some(&f), Some(&a)) = (
            self.framework_index.get(framework_id),
            self.agent_index.get(agent_id),
        ) else {
            return;
        };
        let Some(fw) = self.frameworks[f].as_mut() else {
            return;
        };
        let Some(mine) = fw.per_agent.get_mut(&a) else {
            return;
        };
        // Only what is really allocated to this framework comes back, so a
        // confused caller can never make resources appear twice.
        let rest = mine.saturating_sub(resources);
        let freed = mine.saturating_sub(&rest);
        *mine = rest;
        if mine.is_empty() {
            fw.per_agent.remove(&a);
        }
        fw.allocated = fw.allocated.saturating_sub(&freed);
        let still_there = fw.per_agent.contains_key(&a);
        let Some(ag) = self.agents[a].as_mut() else {
            return;
        };
        ag.available += &freed;
        if !still_there {
            ag.frameworks.remove(&f);
        }
        if let Some(until) = refuse
            .filter(|d| !d.is_zero())
            .and_then(|d| now.checked_add(d))
        {
            match ag.filters.get_mut(&f) {
                Some(filter) if filter.until > now => {
                    filter.until = filter.until.max(until);
                    filter.refused += &freed;
                }
                _ => {
                    ag.filters.insert(
                        f,
                        Filter {
                            until,
                            refused: freed,
                        },
                    );
                }
            }
        }
    }

    fn revive(&mut self, framework_id: &FrameworkId, roles: &[String]) {
        let Some(&f) = self.framework_index.get(framework_id) else {
            return;
        };
        if let Some(fw) = self.frameworks[f].as_mut() {
            if roles.is_empty() {
                fw.suppressed.clear();
            } else {
                for r in roles {
                    fw.suppressed.remove(r);
                }
            }
        }
        for ag in self.agents.iter_mut().flatten() {
            ag.filters.remove(&f);
        }
    }

    fn suppress(&mut self, framework_id: &FrameworkId, roles: &[String]) {
        if let Some(fw) = self
            .framework_index
            .get(framework_id)
            .and_then(|&f| self.frameworks[f].as_mut())
        {
            let roles = if roles.is_empty() {
                fw.roles.clone()
            } else {
                roles.to_vec()
            };
            fw.suppressed.extend(roles);
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
        if self.agents.is_empty() || self.frameworks.is_empty() {
            return out;
        }
        let totals = self.totals();
        let mut candidates: Vec<Option<Candidate>> = Vec::with_capacity(self.frameworks.len());
        let mut order: BTreeSet<(u64, usize)> = BTreeSet::new();
        for (f, slot) in self.frameworks.iter().enumerate() {
            let cand = slot.as_ref().and_then(|fw| self.candidate(fw));
            if let (Some(c), Some(fw)) = (&cand, slot) {
                order.insert((share_key(share(&fw.allocated, &totals) / c.weight), f));
            }
            candidates.push(cand);
        }
        // Expired filters go first, so they are not looked at again.
        for ag in self.agents.iter_mut().flatten() {
            ag.filters.retain(|_, filter| filter.until > now);
        }
        if order.is_empty() {
            return out;
        }
        let mut given: HashMap<usize, Vec<usize>> = HashMap::new();

        // Resource requests are served first, ahead of fairness, once.
        for (f, cand) in candidates.iter().enumerate() {
            let Some(cand) = cand.as_ref() else {
                continue;
            };
            let requests = match self.frameworks[f].as_mut() {
                Some(fw) if !fw.requests.is_empty() => std::mem::take(&mut fw.requests),
                _ => continue,
            };
            for req in requests {
                let pick = match &req.agent_id {
                    Some(id) => self.agent_index.get(id).copied().filter(|a| {
                        self.ag(*a).is_some_and(|ag| {
                            ag.active
                                && !given.get(a).is_some_and(|g| g.contains(&f))
                                && self.worth_offering(
                                    &ag.available.allocatable_to(&cand.active_roles),
                                )
                        })
                    }),
                    None => self.agents.iter().enumerate().find_map(|(a, slot)| {
                        let ag = slot.as_ref()?;
                        let offer = ag.available.allocatable_to(&cand.active_roles);
                        (ag.active
                            && !given.get(&a).is_some_and(|g| g.contains(&f))
                            && offer.contains(&req.resources)
                            && self.worth_offering(&offer))
                        .then_some(a)
                    }),
                };
                let Some(a) = pick else { continue };
                let offer = match self.ag(a) {
                    Some(ag) => ag.available.allocatable_to(&cand.active_roles),
                    None => continue,
                };
                let old = self
                    .fw(f)
                    .map(|fw| share_key(share(&fw.allocated, &totals) / cand.weight));
                let taken = self.take(f, a, &offer);
                if let (Some(old), Some(fw)) = (old, self.fw(f)) {
                    order.remove(&(old, f));
                    order.insert((share_key(share(&fw.allocated, &totals) / cand.weight), f));
                }
                given.entry(a).or_default().push(f);
                out.push(self.allocation(f, a, taken));
            }
        }

        let n = self.agents.len();
        let start = self.cursor % n;
        self.cursor = self.cursor.wrapping_add(1);
        for i in 0..n {
            let a = (start + i) % n;
            while let Some(ag) = self.ag(a) {
                if !ag.active || !self.worth_offering(&ag.available) {
                    break;
                }
                let unreserved_only = ag.available.iter().all(|r| r.role == DEFAULT_ROLE);
                let done = given.get(&a);
                let mut pick = None;
                for &(key, f) in order.iter() {
                    if done.is_some_and(|g| g.contains(&f)) {
                        continue;
                    }
                    let Some(cand) = candidates[f].as_ref() else {
                        continue;
                    };
                    let Some(offer) = Self::offerable(
                        &ag.available,
                        unreserved_only,
                        cand,
                        ag.filters.get(&f),
                        now,
                    ) else {
                        continue;
                    };
                    if !self.worth_offering(&offer) {
                        continue;
                    }
                    pick = Some((key, f, offer, cand.weight));
                    break;
                }
                let Some((key, f, offer, weight)) = pick else {
                    break;
                };
                let taken = self.take(f, a, &offer);
                order.remove(&(key, f));
                if let Some(fw) = self.fw(f) {
                    order.insert((share_key(share(&fw.allocated, &totals) / weight), f));
                }
                given.entry(a).or_default().push(f);
                out.push(self.allocation(f, a, taken));
            }
        }
        out
    }
}

impl DrfAllocator {
    fn allocation(&self, f: usize, a: usize, resources: Resources) -> Allocation {
        Allocation {
            framework_id: self.fw(f).map(|fw| fw.id.clone()).unwrap_or_default(),
            agent_id: self.ag(a).map(|ag| ag.id.clone()).unwrap_or_default(),
            resources,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn r(s: &str) -> Resources {
        Resources::parse(s).unwrap()
    }

    fn opts() -> AllocatorOptions {
        AllocatorOptions {
            min_offer_cpus: 0.01,
            min_offer_mem: 32.0,
            role_weights: Default::default(),
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
            role_weights: Default::default(),
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
        let rest = out[0].resources.checked_sub(&used).unwrap();
        alloc.recover(
            &fid("a"),
            &aid("s1"),
            &rest,
            Some(Duration::from_secs(60)),
            t0,
        );
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
        /// Whatever happens, an agent's resources are never handed out
        /// twice, never beyond its total, and never to a suppressed or
        /// inactive framework.
        #[test]
        fn never_double_allocates(ops in proptest::collection::vec(op(), 1..80)) {
            let mut alloc = DrfAllocator::new(opts());
            let mut now = Instant::now();
            let mut agents: Vec<(AgentId, Resources)> = Vec::new();
            let mut frameworks: Vec<FrameworkId> = Vec::new();
            let mut suppressed: std::collections::HashSet<FrameworkId> = Default::default();
            let mut inactive: std::collections::HashSet<FrameworkId> = Default::default();
            // Model: what is held (offered or used) per (framework, agent).
            let mut held: Vec<Allocation> = Vec::new();
            let mut next = 0;
            let roles = [vec![], vec!["web".to_string()]];
            for _ in 0..2 {
                let id = aid(&format!("s{next}"));
                let total = r("cpus:4;mem:4096;cpus(web):2;ports:[1-100]");
                alloc.add_agent(&id, &total, &[], true);
                agents.push((id, total));
                let f = fid(&format!("f{next}"));
                alloc.add_framework(&f, &roles[next % 2], true);
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
                        let total = r("cpus:2;mem:2048");
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
                        alloc.add_framework(&f, &roles[next % 2], true);
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
            }
        }
    }
}
