//! Helpers shared by the allocator's unit tests, and properties of the
//! whole allocator (no resource allocated twice; skipping dormant agents
//! changes no allocation).

pub(super) use super::books::normalized_roles;
pub(super) use super::*;
pub(super) use crate::allocator::{Allocation, Allocator, AllocatorOptions};
pub(super) use agora_proto::{AgentId, FrameworkId, Resources, DEFAULT_ROLE};
pub(super) use proptest::prelude::*;
pub(super) use std::collections::VecDeque;
pub(super) use std::time::Duration;
pub(super) use tokio::time::Instant;

pub(super) fn r(s: &str) -> Resources {
    Resources::parse(s).unwrap()
}

pub(super) fn opts() -> AllocatorOptions {
    AllocatorOptions {
        min_offer_cpus: 0.01,
        min_offer_mem: 32.0,
        ..AllocatorOptions::default()
    }
}

pub(super) fn fid(s: &str) -> FrameworkId {
    FrameworkId::new(s)
}

pub(super) fn aid(s: &str) -> AgentId {
    AgentId::new(s)
}

/// Simulates frameworks that each launch one task of `demand` per
/// offer and decline the rest without a filter.
pub(super) fn run_drf(alloc: &mut DrfAllocator, demands: &[(&str, Resources)], cycles: usize) {
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

pub(super) fn role_opts(weights: &[(&str, f64)], quotas: &[(&str, &str)]) -> AllocatorOptions {
    AllocatorOptions {
        role_weights: weights.iter().map(|(r, w)| (r.to_string(), *w)).collect(),
        role_quotas: quotas.iter().map(|(r, q)| (r.to_string(), r_(q))).collect(),
        ..opts()
    }
}

pub(super) fn r_(s: &str) -> Resources {
    r(s)
}

pub(super) fn count(out: &[Allocation], f: &str) -> usize {
    out.iter().filter(|a| a.framework_id == fid(f)).count()
}

/// Declines every allocation with `refuse`.
/// The framework of `offer` launches `kept` on it and declines the rest
/// for `refuse`.
pub(super) fn keep_and_decline_rest(
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

pub(super) fn decline_all(
    alloc: &mut DrfAllocator,
    out: &[Allocation],
    refuse: Duration,
    now: Instant,
) {
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

#[derive(Debug, Clone)]
pub(super) enum Op {
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

pub(super) fn op() -> impl Strategy<Value = Op> {
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
