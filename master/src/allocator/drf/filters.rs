//! Decline filters.
//!
//! A decline filter is indexed by agent (probed in O(1) per framework
//! considered, behind a 64-bit mask that answers "no filter" for most
//! frameworks without a probe) and by framework (so revive and framework
//! removal cost the filters they touch). Each agent keeps a lower bound on
//! its filters' expiry, so expired filters are only looked for when one
//! may be due. An agent on which every eligible framework turned out to be
//! filtered is marked *dormant* under the current eligibility epoch; until
//! its free pool changes, one of its filters expires, or the epoch moves
//! on (a framework added, activated, revived or re-roled), later cycles
//! skip it in O(1) instead of probing each framework again.

use std::borrow::Cow;
use std::time::Duration;

use agora_proto::{AgentId, FrameworkId, Resources};
use tokio::time::Instant;

use super::*;
use crate::allocator::bag::{Bag, Slots};

#[derive(Debug)]
pub(super) struct Filter {
    pub(super) until: Instant,
    pub(super) refused: Bag,
    /// `cpus` and `mem` of `refused`, to rule out most non-matches cheaply.
    pub(super) cpus: f64,
    pub(super) mem: f64,
    /// Fingerprint of `refused`: an offer of an agent's whole free pool
    /// with the same fingerprint (and cpus and mem) is what was refused,
    /// and is skipped without walking either bag.
    pub(super) sig: u64,
}

/// A framework's bit in [`Ag::filter_bits`].
pub(super) fn filter_bit(f: usize) -> u64 {
    1 << (f % 64)
}

// === impl DrfAllocator ===

impl DrfAllocator {
    /// Whether a live filter of `f` on the agent covers `offer`; drops it
    /// when expired.
    pub(super) fn filtered(
        slots: &Slots,
        ag: &Ag,
        f: usize,
        offer: &Offerable<'_>,
        now: Instant,
    ) -> bool {
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

    pub(super) fn drop_expired_filters(&mut self, a: usize, now: Instant) {
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

    pub(super) fn clear_filters(&mut self, f: usize) {
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

    /// [`Allocator::recover`], up to its reclaiming of interned names.
    pub(super) fn recover_and_filter(
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

#[cfg(test)]
mod tests {
    use crate::allocator::drf::tests::*;

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
}
