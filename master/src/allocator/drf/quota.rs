//! Quota: guarantees per role.
//!
//! Each role below its guarantee, lowest share first, is offered what it
//! still needs (quota'd scalars capped at the shortfall) before fair
//! sharing. Unreserved resources that unsatisfied quotas still need (the
//! *headroom*) are held back from roles that are not themselves short of
//! quota.

use std::borrow::Cow;
use std::collections::BTreeSet;

use agora_proto::{round_scalar, Resource, Resources, Value, DEFAULT_ROLE};
use tokio::time::Instant;

use super::*;
use crate::allocator::Allocation;

// === impl DrfAllocator ===

impl DrfAllocator {
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
}
