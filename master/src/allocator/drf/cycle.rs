//! One allocation cycle.
//!
//! A cycle runs three stages over the agents, starting at a rotating
//! position so no agent is always first:
//!
//! 1. resource requests (`REQUEST`), served once, ahead of fairness;
//! 2. quota (see [`super::quota`]);
//! 3. fair share: each agent's free resources go to the role with the
//!    lowest weighted share that has an eligible framework, then to that
//!    role's framework with the lowest share (see [`super::sorter`]).
//!
//! Reserved resources (`cpus(web):4`) are only ever offered to frameworks
//! of that role, in an allocation for that role.
//!
//! **Cost.** Per cycle: `O(F)` to heap the eligible frameworks, then
//! O(1) per dormant agent, and per other agent with something free
//! `O(log F)` per allocation plus one O(1) filter probe per framework
//! skipped because it filtered the agent (at most the agent's live
//! filters). Removing a framework walks the agents once (its holdings are
//! booked on them). No stage is quadratic; `benches/allocator.rs`
//! measures it.

use std::borrow::Cow;
use std::collections::BTreeSet;

use agora_proto::{Resources, DEFAULT_ROLE};
use tokio::time::Instant;

use super::*;
use crate::allocator::Allocation;

/// What may be offered on an agent, with its `cpus` and `mem`.
pub(super) struct Offerable<'a> {
    pub(super) resources: Cow<'a, Resources>,
    pub(super) cpus: f64,
    pub(super) mem: f64,
}

// === impl DrfAllocator ===

impl DrfAllocator {
    /// One allocation cycle ([`Allocator::allocate`]).
    pub(super) fn cycle(&mut self, now: Instant) -> Vec<Allocation> {
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

    pub(super) fn worth_offering(&self, r: &Resources) -> bool {
        let (cpus, mem) = (r.cpus(), r.mem());
        (cpus >= self.options.min_offer_cpus || mem >= self.options.min_offer_mem)
            && (cpus > 0.0 || mem > 0.0)
    }

    pub(super) fn worth_offering_free(&self, ag: &Ag) -> bool {
        (ag.free_cpus >= self.options.min_offer_cpus || ag.free_mem >= self.options.min_offer_mem)
            && (ag.free_cpus > 0.0 || ag.free_mem > 0.0)
    }

    pub(super) fn allocation(
        &self,
        f: usize,
        a: usize,
        role: usize,
        resources: Resources,
    ) -> Allocation {
        Allocation {
            framework_id: self.fw(f).map(|fw| fw.id.clone()).unwrap_or_default(),
            agent_id: self.ag(a).map(|ag| ag.id.clone()).unwrap_or_default(),
            role: self.roles[role].name.clone(),
            resources,
        }
    }

    /// What of the agent's free resources may go to `role` (borrowed
    /// when it is all of them).
    pub(super) fn for_role<'a>(available: &'a Resources, role: &str) -> Cow<'a, Resources> {
        if available
            .iter()
            .all(|r| r.role == DEFAULT_ROLE || r.role == role)
        {
            Cow::Borrowed(available)
        } else {
            Cow::Owned(available.filter_roles(|r| r == DEFAULT_ROLE || r == role))
        }
    }

    /// Stage 1; returns whether anything was served (shares moved).
    pub(super) fn serve_requests(
        &mut self,
        given: &mut GivenSet,
        out: &mut Vec<Allocation>,
    ) -> bool {
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
                let Some(mut offer) = self
                    .ag(a)
                    .map(|ag| Self::for_role(&ag.available, &role_name).into_owned())
                else {
                    continue;
                };
                if self.roles[role].limit.is_some() {
                    offer = self.capped_to_limit(&offer, role);
                    if !self.worth_offering(&offer) {
                        continue;
                    }
                }
                let taken = self.take(f, a, role, &offer);
                self.count_allocation(f, role);
                given.insert((a, f));
                out.push(self.allocation(f, a, role, taken));
                served = true;
            }
        }
        served
    }

    /// Stage 3: fair sharing, role level first, then frameworks in the role.
    pub(super) fn serve_fair_share(
        &mut self,
        now: Instant,
        agent_order: &[usize],
        queues: &mut [RoleQueue],
        order: &mut BTreeSet<Rank>,
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
        let may_sleep = slack.is_none() && given.is_empty() && self.limited_roles == 0;
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
                for &(_, _, r) in order.iter() {
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
                    if self.roles[r].limit.is_some() {
                        resources = Cow::Owned(self.capped_to_limit(&resources, r));
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

    pub(super) fn worth_offering_scalars(&self, cpus: f64, mem: f64) -> bool {
        (cpus >= self.options.min_offer_cpus || mem >= self.options.min_offer_mem)
            && (cpus > 0.0 || mem > 0.0)
    }
}

#[cfg(test)]
mod tests {
    use crate::allocator::drf::tests::*;

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
}
