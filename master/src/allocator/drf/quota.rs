//! Quota: guarantees and limits per role.
//!
//! Each role below its guarantee, lowest share first, is offered what it
//! still needs (quota'd scalars capped at the shortfall) before fair
//! sharing. Unreserved resources that unsatisfied quotas still need (the
//! *headroom*) are held back from roles that are not themselves short of
//! quota. A role with a limit (Mesos's quota v2) is never offered more of
//! a scalar the limit names than the limit less what it holds; only such
//! roles pay for the check. Quotas and weights change at run time
//! ([`DrfAllocator::set_quota`], [`DrfAllocator::set_weight`]), from the
//! next cycle on.

use std::borrow::Cow;
use std::collections::BTreeSet;

use agora_proto::{round_scalar, Resource, Resources, Value, DEFAULT_ROLE};
use tokio::time::Instant;

use super::*;
use crate::allocator::Allocation;

// === impl DrfAllocator ===

impl DrfAllocator {
    /// Sets the role's guarantee and limit (see [`crate::allocator::Allocator::set_quota`]).
    pub fn set_quota(&mut self, role: &str, guarantee: &Resources, limit: Option<&Limits>) {
        if guarantee.is_empty() {
            self.options.role_quotas.remove(role);
        } else {
            self.options
                .role_quotas
                .insert(role.to_string(), guarantee.clone());
        }
        match limit {
            Some(limit) => {
                self.options
                    .role_limits
                    .insert(role.to_string(), limit.clone());
            }
            None => {
                self.options.role_limits.remove(role);
            }
        }
        let configured = !guarantee.is_empty() || limit.is_some();
        match self.role_index.get(role).copied() {
            Some(r) => {
                let guarantee = (!guarantee.is_empty()).then_some(guarantee);
                self.configure_quota(r, guarantee, limit);
            }
            // A new role is configured from the options.
            None if configured => {
                self.role_idx(role);
            }
            None => {}
        }
        self.epoch += 1;
        self.reclaim();
    }

    /// Sets the role's weight (see [`crate::allocator::Allocator::set_weight`]).
    pub fn set_weight(&mut self, role: &str, weight: f64) {
        let weight = Some(weight)
            .filter(|w| w.is_finite() && *w > 0.0)
            .unwrap_or(1.0);
        self.options.role_weights.insert(role.to_string(), weight);
        if let Some(&r) = self.role_index.get(role) {
            self.roles[r].weight = weight;
        }
        self.epoch += 1;
    }

    /// Replaces role `r`'s guarantee and limit, moving the uses they hold
    /// (the role, and every scalar name either names).
    pub(super) fn configure_quota(
        &mut self,
        r: usize,
        guarantee: Option<&Resources>,
        limit: Option<&Limits>,
    ) {
        // Hold the new uses before releasing the old, so that a name both
        // name is never counted unused in between.
        let mut quota = Scalars::default();
        if let Some(g) = guarantee {
            Self::accumulate(&mut self.names, &mut quota, g, 1.0);
        }
        let limit: Option<Vec<(usize, f64)>> = limit.map(|l| {
            l.iter()
                .map(|(name, v)| (self.names.intern(name), *v))
                .collect()
        });
        let pinned = guarantee.is_some() || limit.is_some();
        let held = Self::quota_names(&quota, limit.as_deref());
        if pinned {
            self.role_refs.hold(r);
            for &i in &held {
                self.names.refs.hold(i);
            }
        }
        let role = &mut self.roles[r];
        let old_names = Self::quota_names(&role.quota, role.limit.as_deref());
        let was_pinned = role.pinned;
        let was_limited = role.limit.is_some();
        role.quota = quota;
        role.pinned = pinned;
        let limited = limit.is_some();
        role.limit = limit;
        if was_pinned {
            for i in old_names {
                self.names.refs.release(i);
            }
            self.role_refs.release(r);
        }
        self.limited_roles = self.limited_roles + usize::from(limited) - usize::from(was_limited);
    }

    /// The scalar names a quota holds: those guaranteed more than zero and
    /// every one a limit names (each once).
    pub(super) fn quota_names(quota: &Scalars, limit: Option<&[(usize, f64)]>) -> Vec<usize> {
        let mut names: Vec<usize> = quota
            .0
            .iter()
            .enumerate()
            .filter(|(_, v)| **v > 0.0)
            .map(|(i, _)| i)
            .chain(limit.unwrap_or(&[]).iter().map(|(i, _)| *i))
            .collect();
        names.sort_unstable();
        names.dedup();
        names
    }

    /// `offer` with each scalar the role's limit names cut to what the
    /// limit still allows (the limit less what the role holds).
    pub(super) fn capped_to_limit(&self, offer: &Resources, r: usize) -> Resources {
        let role = &self.roles[r];
        let Some(limit) = &role.limit else {
            return offer.clone();
        };
        let mut left: Vec<(usize, f64)> = limit
            .iter()
            .map(|&(i, l)| (i, round_scalar(l - role.allocated.get(i)).max(0.0)))
            .collect();
        let mut out = Resources::new();
        for item in offer.iter() {
            let room = match (&item.value, self.name_pos(&item.name)) {
                (Value::Scalar(v), Some(i)) => left
                    .iter_mut()
                    .find(|(j, _)| *j == i)
                    .map(|slot| (*v, &mut slot.1)),
                _ => None,
            };
            match room {
                Some((v, room)) => {
                    let amount = round_scalar(v.min(*room));
                    *room = round_scalar(*room - amount);
                    if amount > 0.0 {
                        out.add_resource(Resource {
                            name: item.name.clone(),
                            role: item.role.clone(),
                            value: Value::Scalar(amount),
                        });
                    }
                }
                None => out.add_resource(item.clone()),
            }
        }
        out
    }

    /// The role's unmet guarantee per scalar name (all zero when met or none).
    pub(super) fn quota_shortfall(&self, r: usize) -> Scalars {
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

    /// Stage 2: each role short of quota gets what it still needs.
    pub(super) fn serve_quotas(
        &mut self,
        now: Instant,
        agent_order: &[usize],
        queues: &mut [RoleQueue],
        order: &mut BTreeSet<Rank>,
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
                let mut offer = self.capped_to(&ag.available, r, &need);
                if self.roles[r].limit.is_some() {
                    offer = self.capped_to_limit(&offer, r);
                }
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
    pub(super) fn capped_to(&self, available: &Resources, r: usize, need: &Scalars) -> Resources {
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

    pub(super) fn name_pos(&self, name: &str) -> Option<usize> {
        self.names.position(name)
    }

    /// Unreserved free scalars on active agents minus what unsatisfied
    /// quotas still need: what other roles may take. `None` when no quota
    /// is short (no limit).
    pub(super) fn headroom_slack(&self) -> Option<Scalars> {
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

    /// Whether the unreserved scalars of `offer` fit in the headroom slack.
    pub(super) fn fits_slack(&self, offer: &Resources, slack: &Scalars) -> bool {
        offer.iter().filter(|r| r.role == DEFAULT_ROLE).all(|item| {
            match (&item.value, self.name_pos(&item.name)) {
                (Value::Scalar(v), Some(i)) => i >= slack.0.len() || *v <= slack.0[i] + 1e-9,
                _ => true,
            }
        })
    }

    pub(super) fn spend_slack(&self, offer: &Resources, slack: &mut Scalars) {
        for item in offer.iter().filter(|r| r.role == DEFAULT_ROLE) {
            if let (Value::Scalar(v), Some(i)) = (&item.value, self.name_pos(&item.name)) {
                if i < slack.0.len() {
                    slack.0[i] -= v;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::allocator::drf::tests::*;

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

    fn lim(s: &str) -> crate::allocator::Limits {
        s.split(';')
            .map(|kv| {
                let (k, v) = kv.split_once(':').unwrap();
                (k.to_string(), v.parse().unwrap())
            })
            .collect()
    }

    #[test]
    fn a_limit_caps_what_the_role_is_offered() {
        let mut alloc = DrfAllocator::new(opts());
        alloc.set_quota("q", &Resources::new(), Some(&lim("cpus:3")));
        alloc.add_framework(&fid("qf"), &["q".into()], true);
        for i in 0..4 {
            alloc.add_agent(&aid(&format!("s{i}")), &r("cpus:2;mem:1024"), &[], true);
        }
        let t0 = Instant::now();
        let mut offered = Vec::new();
        for _ in 0..4 {
            offered.extend(alloc.allocate(t0));
        }
        assert_eq!(alloc.role_allocated("q", "cpus"), 3.0, "{offered:?}");
        // The limit names cpus only: mem still goes, without cpus.
        assert_eq!(alloc.role_allocated("q", "mem"), 4096.0, "{offered:?}");
        // Giving some back makes room again, up to the limit.
        let first = offered[0].clone();
        alloc.recover(
            &first.framework_id,
            &first.agent_id,
            &first.resources,
            None,
            t0,
        );
        let again = alloc.allocate(t0);
        assert!(!again.is_empty());
        assert_eq!(alloc.role_allocated("q", "cpus"), 3.0, "{again:?}");
        alloc.check_interned().unwrap();
    }

    #[test]
    fn quota_and_weights_change_mid_run() {
        let mut alloc = DrfAllocator::new(opts());
        alloc.add_framework(&fid("qf"), &["q".into()], true);
        alloc.add_framework(&fid("other"), &[], true);
        alloc.add_agent(&aid("s0"), &r("cpus:2;mem:1024"), &[], true);
        alloc.add_agent(&aid("s1"), &r("cpus:2;mem:1024"), &[], true);
        let t0 = Instant::now();
        // A limit of nothing: q gets no cpus, the next cycle on.
        alloc.set_quota("q", &Resources::new(), Some(&lim("cpus:0;mem:0")));
        let out = alloc.allocate(t0);
        assert_eq!(count(&out, "qf"), 0, "{out:?}");
        assert_eq!(count(&out, "other"), 2, "{out:?}");
        for a in &out {
            alloc.recover(&a.framework_id, &a.agent_id, &a.resources, None, t0);
        }
        // A guarantee instead: served first, and held back from others.
        alloc.set_quota("q", &r("cpus:4"), None);
        let out = alloc.allocate(t0);
        assert_eq!(alloc.role_allocated("q", "cpus"), 4.0, "{out:?}");
        assert_eq!(count(&out, "other"), 0, "{out:?}");
        alloc.check_interned().unwrap();
        // Removed: the role is no longer in use once nobody is in it.
        alloc.set_quota("q", &Resources::new(), None);
        alloc.remove_framework(&fid("qf"));
        alloc.check_interned().unwrap();
        assert_eq!(alloc.interned().roles_in_use, 1, "only the default role");
        // Weights: the heavier role gets the next agent.
        alloc.set_weight("w", 4.0);
        alloc.add_framework(&fid("wf"), &["w".into()], true);
        alloc.add_framework(&fid("light"), &["l".into()], true);
        alloc.add_agent(&aid("s2"), &r("cpus:1;mem:512"), &[], true);
        alloc.update_usage(&fid("wf"), &aid("s2"), &r("cpus:0.5"));
        alloc.update_usage(&fid("light"), &aid("s2"), &r("cpus:0.25"));
        alloc.add_agent(&aid("s3"), &r("cpus:1;mem:512"), &[], true);
        let out = alloc.allocate(t0);
        let s3 = out.iter().find(|a| a.agent_id == aid("s3")).unwrap();
        assert_eq!(s3.framework_id, fid("wf"), "{out:?}");
        alloc.check_interned().unwrap();
    }

    #[derive(Debug, Clone)]
    enum LimitOp {
        Allocate,
        Recover(usize),
        SetLimit(u8),
        Unlimit,
        AddAgent,
    }

    fn limit_op() -> impl Strategy<Value = LimitOp> {
        prop_oneof![
            4 => Just(LimitOp::Allocate),
            3 => any::<usize>().prop_map(LimitOp::Recover),
            2 => (0u8..9).prop_map(LimitOp::SetLimit),
            1 => Just(LimitOp::Unlimit),
            1 => Just(LimitOp::AddAgent),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(200))]
        /// No cycle takes a role above its limit, whatever it is changed
        /// to (lowering it takes nothing back: the role only gets no more).
        #[test]
        fn no_allocation_above_a_limit(ops in proptest::collection::vec(limit_op(), 1..80)) {
            let mut alloc = DrfAllocator::new(role_opts(&[], &[("q", "cpus:1")]));
            alloc.add_framework(&fid("q1"), &["q".into()], true);
            alloc.add_framework(&fid("q2"), &["q".into(), "x".into()], true);
            alloc.add_framework(&fid("o"), &[], true);
            let mut limit: Option<f64> = None;
            let mut held: Vec<Allocation> = Vec::new();
            let mut next = 0;
            for _ in 0..3 {
                alloc.add_agent(&aid(&format!("s{next}")), &r("cpus:3;mem:2048;cpus(q):1"), &[], true);
                next += 1;
            }
            let t0 = Instant::now();
            for op in ops {
                match op {
                    LimitOp::Allocate => {
                        let before = alloc.role_allocated("q", "cpus");
                        held.extend(alloc.allocate(t0));
                        let after = alloc.role_allocated("q", "cpus");
                        if let Some(l) = limit {
                            prop_assert!(after <= before.max(l) + 1e-9, "{after} > limit {l} (had {before})");
                        }
                    }
                    LimitOp::Recover(i) => if !held.is_empty() {
                        let a = held.remove(i % held.len());
                        alloc.recover(&a.framework_id, &a.agent_id, &a.resources, None, t0);
                    },
                    LimitOp::SetLimit(cpus) => {
                        let l = f64::from(cpus);
                        let guarantee = if l >= 1.0 { r("cpus:1") } else { Resources::new() };
                        alloc.set_quota("q", &guarantee, Some(&lim(&format!("cpus:{l}"))));
                        limit = Some(l);
                    }
                    LimitOp::Unlimit => {
                        alloc.set_quota("q", &r("cpus:1"), None);
                        limit = None;
                    }
                    LimitOp::AddAgent => {
                        alloc.add_agent(&aid(&format!("s{next}")), &r("cpus:2;mem:1024"), &[], true);
                        next += 1;
                    }
                }
                prop_assert_eq!(alloc.check_interned(), Ok(()));
            }
        }
    }
}
