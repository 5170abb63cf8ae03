//! The worker core driven directly: no sockets, no threads, the clock
//! passed in.

use super::*;
use crate::placement::Locality;
use agora_proto::{Attributes, Reason, Resources, Source};

fn config() -> CoreConfig {
    CoreConfig {
        locality_wait: Duration::from_secs(3),
        refuse_unusable: Duration::from_secs(30),
        refuse_idle: Duration::from_secs(60),
        kill_retry: Duration::from_secs(5),
        launch_timeout: Duration::from_secs(30),
        reconcile_min: Duration::from_secs(5),
        reconcile_max: Duration::from_secs(60),
        rack_attribute: "rack".into(),
        seed: 7,
    }
}

fn offer(i: usize, resources: &str) -> Offer {
    Offer {
        id: OfferId::new(format!("o{i}-{}", rand::random::<u32>())),
        framework_id: FrameworkId::new("F"),
        agent_id: AgentId::new(format!("a{i}")),
        hostname: format!("h{i}"),
        resources: Resources::parse(resources).unwrap(),
        attributes: Attributes::parse(&format!("rack:r{}", i % 2)).unwrap(),
        executor_ids: vec![],
        allocation_role: None,
    }
}

fn spec() -> WorkerSpec {
    WorkerSpec::new("tm", Resources::parse("cpus:1;mem:128").unwrap(), "run")
}

const AGENT: &str = "cpus:4;mem:1024";

/// A core that recovered an empty store and subscribed.
fn started(t0: Instant) -> WorkerCore {
    let mut core = WorkerCore::new(config());
    core.recover(StoreState::default(), t0);
    core.on_subscribed(Some(FrameworkId::new("F")), t0);
    core
}

fn status(id: &WorkerId, state: TaskState, uuid: Option<&str>) -> TaskStatus {
    let mut s = TaskStatus::new(TaskId::new(id.as_str()), state, Source::SourceExecutor);
    s.uuid = uuid.map(String::from);
    s.agent_id = Some(AgentId::new("a0"));
    s
}

fn completes(actions: &[Action]) -> Vec<&WorkerHandle> {
    actions
        .iter()
        .filter_map(|a| match a {
            Action::Complete { result: Ok(h), .. } => Some(h),
            _ => None,
        })
        .collect()
}

fn terminations(actions: &[Action]) -> Vec<(WorkerId, TerminationCause)> {
    actions
        .iter()
        .filter_map(|a| match a {
            Action::Event(Event::Terminated { id, cause, .. }) => Some((id.clone(), *cause)),
            _ => None,
        })
        .collect()
}

fn position(actions: &[Action], pred: impl Fn(&Action) -> bool) -> usize {
    actions
        .iter()
        .position(pred)
        .unwrap_or_else(|| panic!("no such action in {actions:#?}"))
}

/// Requests `n` workers and places them on one offer; returns their ids.
fn launch(core: &mut WorkerCore, n: usize, now: Instant) -> Vec<WorkerId> {
    let ids: Vec<WorkerId> = (0..n).map(|_| core.request(spec(), now).0).collect();
    let actions = core.on_offers(vec![offer(0, "cpus:64;mem:65536")], now);
    assert_eq!(completes(&actions).len(), n, "{actions:#?}");
    ids
}

#[test]
fn a_placement_persists_then_completes_then_launches_and_keeps_no_offer() {
    let t0 = Instant::now();
    let mut core = started(t0);
    let (id, actions) = core.request(spec(), t0);
    assert!(matches!(
        &actions[..],
        [Action::Persist(ops)] if matches!(&ops[..], [StoreOp::Put { record }] if record.state == WorkerState::New)
    ));
    assert_eq!(core.flush(), vec![Action::Revive]);
    let offers = vec![offer(0, AGENT), offer(1, "cpus:0.5;mem:64")];
    let actions = core.on_offers(offers.clone(), t0);
    let persist = position(
        &actions,
        |a| matches!(a, Action::Persist(ops) if ops.iter().any(|o| matches!(o, StoreOp::Put { record } if record.state == WorkerState::Launched))),
    );
    let complete = position(
        &actions,
        |a| matches!(a, Action::Complete { id: i, result: Ok(_) } if *i == id),
    );
    let launch = position(&actions, |a| matches!(a, Action::Launch { .. }));
    assert!(persist < complete && complete < launch, "{actions:#?}");
    // Every offer is used or declined in this same round.
    let mut answered: Vec<OfferId> = Vec::new();
    for a in &actions {
        match a {
            Action::Launch { offer_id, .. } => answered.push(offer_id.clone()),
            Action::Decline { offer_ids, .. } => answered.extend(offer_ids.iter().cloned()),
            _ => {}
        }
    }
    answered.sort();
    let mut all: Vec<OfferId> = offers.iter().map(|o| o.id.clone()).collect();
    all.sort();
    assert_eq!(answered, all);
    // The unusable offer is refused for a while; nothing pending: suppress.
    assert!(actions.iter().any(
        |a| matches!(a, Action::Decline { refuse, .. } if *refuse == Duration::from_secs(30))
    ));
    assert_eq!(actions.last(), Some(&Action::Suppress));
}

#[test]
fn offers_are_suppressed_while_idle_and_revived_on_demand() {
    let t0 = Instant::now();
    let mut core = WorkerCore::new(config());
    core.recover(StoreState::default(), t0);
    let actions = core.on_subscribed(Some(FrameworkId::new("F")), t0);
    assert!(
        actions.contains(&Action::Suppress),
        "nothing pending at subscription"
    );
    let actions = core.on_offers(vec![offer(0, AGENT)], t0);
    assert!(
        matches!(&actions[0], Action::Decline { refuse, .. } if *refuse == Duration::from_secs(60))
    );
    // A burst of requests revives once.
    for _ in 0..5 {
        core.request(spec(), t0);
    }
    assert_eq!(core.flush(), vec![Action::Revive]);
    assert!(core.flush().is_empty());
}

#[test]
fn a_terminal_update_is_reported_once_and_acknowledged_after_it() {
    let t0 = Instant::now();
    let mut core = started(t0);
    let id = launch(&mut core, 1, t0).remove(0);
    let running = core.on_status(status(&id, TaskState::Running, Some("u1")), t0);
    assert!(matches!(&running[0], Action::Event(Event::Running(h)) if h.id == id));
    assert!(matches!(running.last(), Some(Action::Acknowledge(_))));
    // Running again (a retransmission) is no new event.
    let again = core.on_status(status(&id, TaskState::Running, Some("u1")), t0);
    assert_eq!(again.len(), 1, "{again:?}");
    let mut failed = status(&id, TaskState::Failed, Some("u2"));
    failed.message = Some("command exited with status 2".into());
    let actions = core.on_status(failed.clone(), t0);
    assert_eq!(
        terminations(&actions),
        vec![(id.clone(), TerminationCause::Exited { code: 2 })]
    );
    let persist = position(&actions, |a| matches!(a, Action::Persist(_)));
    let event = position(&actions, |a| matches!(a, Action::Event(_)));
    let ack = position(&actions, |a| matches!(a, Action::Acknowledge(_)));
    assert!(persist < event && event < ack);
    // At-least-once delivery: the same update again raises nothing.
    let dup = core.on_status(failed, t0);
    assert!(terminations(&dup).is_empty());
    assert!(matches!(&dup[..], [Action::Acknowledge(_)]));
    assert_eq!(core.live_count(), 0);
}

#[test]
fn agent_loss_ends_each_of_its_workers_once() {
    let t0 = Instant::now();
    let mut core = started(t0);
    let ids = launch(&mut core, 3, t0);
    let actions = core.on_agent_lost(&AgentId::new("a0"));
    let lost = terminations(&actions);
    assert_eq!(lost.len(), 3);
    assert!(lost.iter().all(|(_, c)| *c == TerminationCause::AgentLost));
    // The master's TASK_LOST updates that follow are duplicates.
    for id in &ids {
        let mut s = status(id, TaskState::Lost, None);
        s.reason = Some(Reason::ReasonAgentRemoved);
        assert!(terminations(&core.on_status(s, t0)).is_empty());
    }
    assert!(core.on_agent_lost(&AgentId::new("a0")).is_empty());
}

#[test]
fn a_released_worker_is_killed_until_it_is_reported_ended() {
    let t0 = Instant::now();
    let mut core = started(t0);
    let id = launch(&mut core, 1, t0).remove(0);
    let actions = core.release(&id, t0);
    assert!(
        matches!(&actions[0], Action::Persist(ops) if matches!(&ops[..], [StoreOp::Put { record }] if record.state == WorkerState::Released))
    );
    assert!(matches!(&actions[1], Action::Kill { .. }));
    assert!(core.release(&id, t0).is_empty(), "released once");
    // The kill is lost (nothing comes back): retried every 5 s.
    let kills = |actions: &[Action]| {
        actions
            .iter()
            .filter(|a| matches!(a, Action::Kill { .. }))
            .count()
    };
    assert_eq!(kills(&core.on_tick(t0 + Duration::from_secs(4))), 0);
    assert_eq!(kills(&core.on_tick(t0 + Duration::from_secs(5))), 1);
    assert_eq!(kills(&core.on_tick(t0 + Duration::from_secs(6))), 0);
    assert_eq!(kills(&core.on_tick(t0 + Duration::from_secs(10))), 1);
    let actions = core.on_status(
        status(&id, TaskState::Killed, Some("u")),
        t0 + Duration::from_secs(11),
    );
    assert_eq!(terminations(&actions), vec![(id, TerminationCause::Killed)]);
    assert_eq!(kills(&core.on_tick(t0 + Duration::from_secs(20))), 0);
}

#[test]
fn cancelling_five_of_ten_pending_requests_launches_five() {
    let t0 = Instant::now();
    let mut core = started(t0);
    let ids: Vec<WorkerId> = (0..10).map(|_| core.request(spec(), t0).0).collect();
    for id in ids.iter().step_by(2) {
        let actions = core.cancel(id);
        assert!(actions.contains(&Action::Complete {
            id: id.clone(),
            result: Err(RequestError::Cancelled)
        }));
    }
    assert_eq!(core.pending_count(), 5);
    let actions = core.on_offers(vec![offer(0, "cpus:64;mem:65536")], t0);
    let launched: Vec<&WorkerId> = completes(&actions).iter().map(|h| &h.id).collect();
    assert_eq!(launched.len(), 5);
    assert!(launched
        .iter()
        .all(|id| !ids.iter().step_by(2).any(|c| c == *id)));
    let tasks: usize = actions
        .iter()
        .map(|a| match a {
            Action::Launch { tasks, .. } => tasks.len(),
            _ => 0,
        })
        .sum();
    assert_eq!(tasks, 5);
    // Cancelling a placed request changes nothing.
    assert!(core.cancel(launched[0]).is_empty());
}

#[test]
fn recovery_drops_new_reports_launched_and_kills_released() {
    let t0 = Instant::now();
    let mut first = started(t0);
    let ids = launch(&mut first, 3, t0);
    let mut state = StoreState::default();
    // Rebuild what the store holds from the first attempt's writes.
    let mut replay = WorkerCore::new(config());
    for a in replay.recover(StoreState::default(), t0) {
        if let Action::Persist(ops) = a {
            ops.iter().for_each(|op| state.apply(op));
        }
    }
    let mut placed_ops = Vec::new();
    for id in &ids {
        placed_ops.push(StoreOp::Put {
            record: record_of(
                &WorkerHandle {
                    id: id.clone(),
                    spec_name: "tm".into(),
                    agent_id: AgentId::new("a0"),
                    hostname: "h0".into(),
                    rack: Some("r0".into()),
                    locality: Locality::Any,
                    attempt: 1,
                    ports: Default::default(),
                },
                WorkerState::Launched,
            ),
        });
    }
    placed_ops.iter().for_each(|op| state.apply(op));
    state.apply(&StoreOp::Put {
        record: WorkerRecord {
            id: WorkerId::new("worker-1-99"),
            state: WorkerState::New,
            spec_name: "tm".into(),
            placed: None,
        },
    });
    let mut released = state.workers[&ids[2]].clone();
    released.state = WorkerState::Released;
    state.apply(&StoreOp::Put { record: released });

    let mut core = WorkerCore::new(config());
    let actions = core.recover(state, t0);
    assert_eq!(core.attempt(), 2);
    let Action::Persist(ops) = &actions[0] else {
        panic!("{actions:?}")
    };
    assert!(ops.contains(&StoreOp::SetAttempt { attempt: 2 }));
    assert!(ops.contains(&StoreOp::Remove {
        id: WorkerId::new("worker-1-99")
    }));
    let Action::Event(Event::Recovered(recovered)) = &actions[1] else {
        panic!("{actions:?}")
    };
    let recovered: Vec<&WorkerId> = recovered.iter().map(|h| &h.id).collect();
    assert_eq!(recovered, vec![&ids[0], &ids[1]]);
    // Once connected: every worker reconciled, the released one killed,
    // an implicit reconciliation to find unknown tasks.
    let actions = core.on_subscribed(Some(FrameworkId::new("F")), t0);
    assert!(actions.contains(&Action::Kill {
        task_id: TaskId::new(ids[2].as_str()),
        agent_id: Some(AgentId::new("a0"))
    }));
    assert!(actions
        .iter()
        .any(|a| matches!(a, Action::Reconcile(t) if t.len() == 3)));
    assert!(actions.contains(&Action::Reconcile(Vec::new())));
    // A new request's id is of the new attempt.
    assert!(core.request(spec(), t0).0.as_str().starts_with("worker-2-"));
}

#[test]
fn a_silent_launch_is_reconciled_and_ends_lost_after_reconciliation() {
    let t0 = Instant::now();
    let mut core = started(t0);
    let id = launch(&mut core, 1, t0).remove(0);
    let reconciles = |actions: &[Action]| {
        actions
            .iter()
            .filter(|a| matches!(a, Action::Reconcile(t) if !t.is_empty()))
            .count()
    };
    assert_eq!(reconciles(&core.on_tick(t0 + Duration::from_secs(29))), 0);
    assert_eq!(reconciles(&core.on_tick(t0 + Duration::from_secs(30))), 1);
    // Unanswered: retried with backoff (5 s ±20 %), not every tick.
    assert_eq!(reconciles(&core.on_tick(t0 + Duration::from_secs(33))), 0);
    assert_eq!(reconciles(&core.on_tick(t0 + Duration::from_secs(37))), 1);
    let mut answer = status(&id, TaskState::Lost, None);
    answer.source = Source::SourceMaster;
    answer.reason = Some(Reason::ReasonReconciliation);
    answer.message = Some("unknown task".into());
    let actions = core.on_status(answer, t0 + Duration::from_secs(38));
    assert_eq!(
        terminations(&actions),
        vec![(id, TerminationCause::LostAfterReconciliation)]
    );
}

#[test]
fn a_task_the_store_does_not_know_is_killed_silently() {
    let t0 = Instant::now();
    let mut core = started(t0);
    let stranger = WorkerId::new("worker-0-1");
    let actions = core.on_status(status(&stranger, TaskState::Running, Some("u")), t0);
    assert!(
        matches!(
            &actions[..],
            [Action::Kill { task_id, .. }, Action::Acknowledge(s)]
                if task_id.as_str() == "worker-0-1" && s.task_id.as_str() == "worker-0-1"
        ),
        "{actions:?}"
    );
}

#[test]
fn master_failover_keeps_workers_and_reconciles_them() {
    let t0 = Instant::now();
    let mut core = started(t0);
    let ids = launch(&mut core, 20, t0);
    for id in &ids {
        core.on_status(status(id, TaskState::Running, Some("u")), t0);
    }
    let _ = core.request(spec(), t0);
    let actions = core.on_disconnected();
    assert_eq!(
        actions,
        vec![Action::Event(Event::Connection(
            ConnectionState::Disconnected
        ))]
    );
    let actions = core.on_subscribed(None, t0 + Duration::from_secs(2));
    assert!(actions.contains(&Action::Event(Event::Connection(
        ConnectionState::Reconnected
    ))));
    assert!(actions
        .iter()
        .any(|a| matches!(a, Action::Reconcile(t) if t.len() == 20)));
    assert!(
        actions.contains(&Action::Revive),
        "the pending request wants offers"
    );
    assert!(terminations(&actions).is_empty());
    // The master answers with the tasks' states: still no terminations.
    for id in &ids {
        let mut s = status(id, TaskState::Running, None);
        s.reason = Some(Reason::ReasonReconciliation);
        assert!(terminations(&core.on_status(s, t0)).is_empty());
    }
    assert_eq!(core.live_count(), 20);
    assert_eq!(core.pending_count(), 1);
}

#[test]
fn a_delayed_request_revives_offers_when_it_may_step_down() {
    let t0 = Instant::now();
    let mut core = started(t0);
    core.request(spec().prefer_host("h1", 1.0), t0);
    core.flush();
    // Only h0 offers; h1 (rack r1) is preferred; h0 is on rack r0.
    core.topology.learn(&offer(1, AGENT));
    let actions = core.on_offers(vec![offer(0, AGENT)], t0);
    assert!(completes(&actions).is_empty());
    assert!(
        matches!(&actions[..], [Action::Decline { refuse, .. }] if *refuse == Duration::from_secs(3))
    );
    core.on_tick(t0 + Duration::from_secs(2));
    assert!(core.flush().is_empty());
    core.on_tick(t0 + Duration::from_secs(3));
    assert_eq!(core.flush(), vec![Action::Revive]);
    // RACK: still not h0 (another rack); ANY after twice the wait.
    assert!(
        completes(&core.on_offers(vec![offer(0, AGENT)], t0 + Duration::from_secs(4))).is_empty()
    );
    let actions = core.on_offers(vec![offer(0, AGENT)], t0 + Duration::from_secs(6));
    assert_eq!(completes(&actions)[0].locality, Locality::Any);
}

#[test]
fn deregister_fails_pending_requests_and_clears_the_store() {
    let t0 = Instant::now();
    let mut core = started(t0);
    launch(&mut core, 2, t0);
    let (id, _) = core.request(spec(), t0);
    let actions = core.deregister();
    assert_eq!(actions[0], Action::Persist(vec![StoreOp::Clear]));
    assert!(actions.contains(&Action::Complete {
        id,
        result: Err(RequestError::Deregistered)
    }));
    assert_eq!(core.live_count(), 0);
    let (_, after) = core.request(spec(), t0);
    assert!(matches!(
        &after[..],
        [Action::Complete {
            result: Err(RequestError::Stopped),
            ..
        }]
    ));
}
