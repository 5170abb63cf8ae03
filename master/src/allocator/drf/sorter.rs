//! The sorter: shares, weights and ordering.
//!
//! Every scalar resource name is interned to an index, so a share is a
//! few float divisions over a small vector. A role's share is the dominant
//! share (max over resources of allocated / cluster total) of everything
//! allocated *for that role*, divided by the role's weight. A framework's
//! share in a role is the dominant share of what is allocated to it for
//! that role; a framework in several roles is a client of each.
//!
//! Each cycle heaps the eligible frameworks of every role by share, and
//! orders the roles by weighted share; a client served goes back into its
//! heap at its new share. Equal shares are ordered by the number of
//! allocations made so far, fewer first, as Mesos's DRF sorter does: two
//! frameworks that keep returning to share 0 (short tasks on a small
//! cluster) take turns instead of the first one always winning the tie.
//! Then by index, so the order is total and a cycle deterministic.

use std::cmp::Reverse;
use std::collections::{BTreeSet, BinaryHeap};

use agora_proto::FrameworkId;
use tokio::time::Instant;

use super::*;

/// Where a client (a framework in a role, or a role) stands: its share
/// key, then its allocations so far, then its index; lowest first.
pub(super) type Rank = (u64, u64, usize);

/// Per-cycle ordering of one role's eligible frameworks: a min-heap on
/// their [`Rank`], popped in order while looking for a client (cheaper
/// than re-sorting a search tree on every allocation).
#[derive(Debug, Default)]
pub(super) struct RoleQueue {
    pub(super) clients: BinaryHeap<Reverse<Rank>>,
    /// Clients popped while looking, put back before the look ends.
    pub(super) skipped: Vec<Reverse<Rank>>,
    /// The role's own rank in the cycle's order of roles.
    pub(super) rank: Rank,
}

pub(super) fn share_key(s: f64) -> u64 {
    if s.is_finite() && s >= 0.0 {
        s.to_bits()
    } else {
        u64::MAX
    }
}

// === impl Scalars ===

impl Scalars {
    /// Dominant share of `self` over `total` (resources with a positive total).
    pub(super) fn share(&self, total: &Scalars) -> f64 {
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

    pub(super) fn weighted_role_share(&self, r: usize) -> f64 {
        let role = &self.roles[r];
        role.allocated.share(&self.total) / role.weight
    }

    /// Eligible frameworks per role, ordered by share in the role, and the
    /// roles with at least one, ordered by weighted share.
    pub(super) fn queues(&self) -> (Vec<RoleQueue>, BTreeSet<Rank>) {
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
                    queues[fr.role].clients.push(Reverse((
                        share_key(fr.allocated.share(&self.total)),
                        fr.allocations,
                        f,
                    )));
                }
            }
        }
        let mut order = BTreeSet::new();
        for (r, q) in queues.iter_mut().enumerate() {
            if !q.clients.is_empty() {
                q.rank = self.role_rank(r);
                order.insert(q.rank);
            }
        }
        (queues, order)
    }

    /// The role's place among roles: weighted share, then allocations.
    fn role_rank(&self, r: usize) -> Rank {
        (
            share_key(self.weighted_role_share(r)),
            self.roles[r].allocations,
            r,
        )
    }

    /// Counts one allocation to framework `f` for `role` (and to the
    /// role), for the tie-break; returns the client's count.
    pub(super) fn count_allocation(&mut self, f: usize, role: usize) -> u64 {
        self.roles[role].allocations += 1;
        self.frameworks
            .get_mut(f)
            .and_then(Option::as_mut)
            .and_then(|fw| fw.roles.iter_mut().find(|fr| fr.role == role))
            .map_or(0, |fr| {
                fr.allocations += 1;
                fr.allocations
            })
    }

    /// After `take` for a client `f` picked from `role`'s queue: counts
    /// the allocation, puts the client back at its new rank, and re-sorts
    /// the role.
    pub(super) fn requeue(
        &mut self,
        queues: &mut [RoleQueue],
        order: &mut BTreeSet<Rank>,
        f: usize,
        role: usize,
    ) {
        let allocations = self.count_allocation(f, role);
        let q = &mut queues[role];
        let new = self
            .fw(f)
            .and_then(|fw| fw.roles.iter().find(|fr| fr.role == role))
            .map_or(0.0, |fr| fr.allocated.share(&self.total));
        q.clients.push(Reverse((share_key(new), allocations, f)));
        // Roles only leave `order` within a cycle: one alone stays in
        // order whatever its rank, so it is not touched.
        if order.len() > 1 && order.remove(&q.rank) {
            q.rank = self.role_rank(role);
            order.insert(q.rank);
        }
    }

    /// Lowest-share framework of the role that may get `offer` on agent
    /// `a`. It leaves the queue: the caller gives it the offer and puts it
    /// back with [`DrfAllocator::requeue`].
    #[allow(clippy::too_many_arguments)]
    pub(super) fn pick_client(
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
        while let Some(Reverse(rank)) = q.clients.pop() {
            let f = rank.2;
            if local.contains(&f)
                || (check_given && given.contains(&(a, f)))
                || Self::filtered(&self.slots, ag, f, offer, now)
            {
                q.skipped.push(Reverse(rank));
            } else {
                found = Some(f);
                break;
            }
        }
        q.clients.extend(q.skipped.drain(..));
        found
    }
}

#[cfg(test)]
mod tests {
    use crate::allocator::drf::tests::*;

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

    /// Hands the single agent out `n` times; each holder gives it all
    /// back before the next cycle (a short task that ended), so every
    /// cycle starts from equal shares of 0. Returns who got it each time.
    fn turns(alloc: &mut DrfAllocator, n: usize) -> Vec<String> {
        let now = Instant::now();
        (0..n)
            .map(|_| {
                let out = alloc.allocate(now);
                assert_eq!(out.len(), 1, "{out:?}");
                let a = &out[0];
                alloc.recover(&a.framework_id, &a.agent_id, &a.resources, None, now);
                a.framework_id.as_str().to_string()
            })
            .collect()
    }

    #[test]
    fn equal_shares_go_to_the_framework_with_fewer_allocations() {
        let mut alloc = DrfAllocator::new(opts());
        alloc.add_framework(&fid("a"), &[], true);
        alloc.add_framework(&fid("b"), &[], true);
        alloc.add_agent(&aid("s1"), &r("cpus:1;mem:1024"), &[], true);
        // Both at share 0 every time: they take turns.
        assert_eq!(turns(&mut alloc, 6), ["a", "b", "a", "b", "a", "b"]);
        // A newcomer has had nothing yet: it wins the next tie.
        alloc.add_framework(&fid("c"), &[], true);
        assert_eq!(turns(&mut alloc, 1), ["c"]);
    }

    #[test]
    fn equal_role_shares_go_to_the_role_with_fewer_allocations() {
        let mut alloc = DrfAllocator::new(opts());
        alloc.add_framework(&fid("a"), &["x".to_string()], true);
        alloc.add_framework(&fid("b"), &["y".to_string()], true);
        alloc.add_agent(&aid("s1"), &r("cpus:1;mem:1024"), &[], true);
        assert_eq!(turns(&mut alloc, 4), ["a", "b", "a", "b"]);
    }
}
