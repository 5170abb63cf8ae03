//! Interned names are reclaimed.
//!
//! Roles, scalar names and slots are interned to indexes, and they come
//! from peers, so each table keeps a use count per entry (see
//! [`crate::allocator::refs`]). A role is in use while a framework
//! subscribes to it or holds resources for it, while an agent has
//! resources reserved for it, or when it has a quota; a slot while a live
//! agent's total has it; a scalar name while a slot in use or a quota
//! names it. After every change that may end a use, a table holding more
//! than twice what is in use (plus some slack) is compacted in place,
//! keeping the order of what is left, so allocations are the same as if
//! nothing had been forgotten; only a role forgotten and seen again is
//! ordered as a new one among roles of equal share.

use super::*;

/// The role table is compacted once it holds more than twice the roles in
/// use plus this many ([`Interned::within_bound`]).
pub(super) const ROLE_SLACK: usize = 64;

/// The slot table and the scalar name table are each compacted once they
/// hold more than twice what is in use plus this many: together they stay
/// within [`Interned::within_bound`]'s 64.
pub(super) const NAME_SLACK: usize = 32;

// === impl DrfAllocator ===

impl DrfAllocator {
    /// Compacts the interned tables that outgrew what is in use (see the
    /// module documentation). O(1) unless one did; then it rewrites the
    /// books that index it.
    pub(super) fn reclaim(&mut self) {
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
    pub(super) fn compact_roles(&mut self) {
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
    pub(super) fn compact_slots(&mut self) {
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
    pub(super) fn compact_names(&mut self) {
        self.compact_slots();
        let remap = self.names.compact();
        self.slots.remap_names(&remap);
        self.total.remap(&remap);
        for role in &mut self.roles {
            role.quota.remap(&remap);
            role.allocated.remap(&remap);
            if let Some(limit) = &mut role.limit {
                for (i, _) in limit.iter_mut() {
                    *i = remap.kept(*i);
                }
            }
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
    /// Counts every use of every interned role, slot and scalar name
    /// again, and checks the use counts and the bound against them.
    pub(super) fn check_interned(&self) -> Result<(), String> {
        let mut roles = vec![0; self.roles.len()];
        let mut slots = vec![0; self.slots.len()];
        let mut names = vec![0; self.names.len()];
        for (r, role) in self.roles.iter().enumerate() {
            if self.options.role_quotas.contains_key(&role.name)
                || self.options.role_limits.contains_key(&role.name)
            {
                roles[r] += 1;
                for i in Self::quota_names(&role.quota, role.limit.as_deref()) {
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
    use crate::allocator::drf::tests::*;

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
