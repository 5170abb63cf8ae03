//! DRAIN_AGENT, DEACTIVATE_AGENT, REACTIVATE_AGENT and MARK_AGENT_GONE
//! (`drain.rs`) against the state machine.

use super::*;
use crate::drain::AgentCall;

fn operator(h: &mut H, aid: &AgentId, call: AgentCall) -> Vec<Output> {
    h.input(Input::OperatorAgent {
        agent_id: aid.clone(),
        call,
        operator: Some("ops".into()),
    })
}

/// A framework on S1 with task `t1` running on a 2-cpu agent on A1.
fn running_task(h: &mut H) -> (FrameworkId, AgentId) {
    let aid = h.register(A1, "cpus:2;mem:512");
    let fid = h.subscribe(S1, "fw");
    let offer = h.offer_from(S1, &aid);
    h.launch(
        S1,
        &[&offer],
        vec![command_task("t1", &aid, "cpus:1;mem:128")],
    );
    h.status(A1, &fid, "t1", TaskState::Running, "u1");
    h.sched(
        S1,
        scheduler::Call::Acknowledge {
            agent_id: aid.clone(),
            task_id: TaskId::new("t1"),
            uuid: "u1".into(),
        },
    );
    (fid, aid)
}

fn drain_state(h: &H, aid: &AgentId) -> Option<&'static str> {
    h.m.snapshot()
        .agents
        .iter()
        .find(|a| a.id == *aid)
        .and_then(|a| a.drain_info.as_ref().map(|d| d.state))
}

fn kills(out: &[Output], conn: ConnId) -> Vec<TaskId> {
    agent_events(out, conn)
        .into_iter()
        .filter_map(|e| match e {
            agent::Event::KillTask { task_id, .. } => Some(task_id),
            _ => None,
        })
        .collect()
}

#[test]
fn drain_kills_after_the_grace_period_then_the_agent_is_drained() {
    let mut h = H::new();
    h.m.recover(&RegistryState::default(), h.now, 1000.0);
    let (fid, aid) = running_task(&mut h);
    let out = operator(
        &mut h,
        &aid,
        AgentCall::Drain {
            max_grace_period: Some(Duration::from_secs(30)),
            mark_gone: false,
        },
    );
    assert!(kills(&out, A1).is_empty(), "killed before the grace period");
    assert_eq!(drain_state(&h, &aid), Some("DRAINING"));
    assert!(h.m.snapshot().agents[0].deactivated);
    // The drain is in the registry.
    let recorded = ops(&mut h).into_iter().any(|op| {
        matches!(op, RegistryOp::PutAgent(r) if r.deactivated && r.drain.as_ref().is_some_and(|d| d.max_grace_period == Some(30.0) && !d.drained))
    });
    assert!(recorded);
    // The free cpu is not offered meanwhile.
    let out = h.advance(Duration::from_secs(29));
    assert!(offers_in(&out, S1).is_empty());
    assert!(kills(&out, A1).is_empty());
    let out = h.advance(Duration::from_secs(2));
    assert_eq!(kills(&out, A1), [TaskId::new("t1")]);
    assert!(offers_in(&out, S1).is_empty());
    // The task's end reaches the framework with REASON_AGENT_DRAINING.
    let out = h.status(A1, &fid, "t1", TaskState::Killed, "u2");
    let update = updates(&out, S1).pop().expect("an update");
    assert_eq!(update.state, TaskState::Killed);
    assert_eq!(update.reason, Some(Reason::ReasonAgentDraining));
    h.advance(Duration::from_secs(1));
    assert_eq!(drain_state(&h, &aid), Some("DRAINED"));
    assert!(h.m.agents.contains_key(&aid), "drained, not gone");
    // Reactivated: offered again.
    operator(&mut h, &aid, AgentCall::Reactivate);
    assert_eq!(drain_state(&h, &aid), None);
    assert!(!h.m.snapshot().agents[0].deactivated);
    h.sched(
        S1,
        scheduler::Call::Acknowledge {
            agent_id: aid.clone(),
            task_id: TaskId::new("t1"),
            uuid: "u2".into(),
        },
    );
    let offer = h.offer_from(S1, &aid);
    assert_eq!(offer.resources.scalar("cpus"), 2.0);
}

#[test]
fn drain_without_a_grace_period_kills_at_once_and_mark_gone_removes_the_agent() {
    let mut h = H::new();
    let (fid, aid) = running_task(&mut h);
    let out = operator(
        &mut h,
        &aid,
        AgentCall::Drain {
            max_grace_period: None,
            mark_gone: true,
        },
    );
    assert_eq!(kills(&out, A1), [TaskId::new("t1")]);
    h.status(A1, &fid, "t1", TaskState::Killed, "u2");
    let out = h.advance(Duration::from_secs(1));
    assert!(
        !h.m.agents.contains_key(&aid),
        "drained with mark_gone: gone"
    );
    assert!(agent_events(&out, A1)
        .iter()
        .any(|e| matches!(e, agent::Event::Shutdown { .. })));
}

#[test]
fn deactivation_and_the_agents_own_unavailability_are_independent() {
    let mut h = H::new();
    let aid = h.register(A1, "cpus:2;mem:512");
    h.subscribe(S1, "fw");
    operator(&mut h, &aid, AgentCall::Deactivate);
    assert!(h.offers(S1).is_empty());
    // The agent says it can take tasks (its disk has room again): still
    // held back by the operator.
    h.agent(
        A1,
        agent::Call::Availability {
            unavailable: Some("disk full".into()),
        },
    );
    h.agent(A1, agent::Call::Availability { unavailable: None });
    assert!(h.offers(S1).is_empty());
    // Reactivated while the agent reports a full disk: still no offers.
    h.agent(
        A1,
        agent::Call::Availability {
            unavailable: Some("disk full".into()),
        },
    );
    operator(&mut h, &aid, AgentCall::Reactivate);
    assert!(h.offers(S1).is_empty());
    h.agent(A1, agent::Call::Availability { unavailable: None });
    assert_eq!(h.offers(S1).len(), 1);
}

#[test]
fn a_gone_agents_tasks_end_and_its_id_is_refused() {
    let mut h = H::new();
    h.m.recover(&RegistryState::default(), h.now, 1000.0);
    let (_fid, aid) = running_task(&mut h);
    let out = operator(&mut h, &aid, AgentCall::MarkGone);
    let update = updates(&out, S1).pop().expect("an update");
    assert_eq!(update.state, TaskState::Lost);
    assert_eq!(update.reason, Some(Reason::ReasonAgentRemovedByOperator));
    assert!(agent_events(&out, A1)
        .iter()
        .any(|e| matches!(e, agent::Event::Shutdown { .. })));
    assert!(ops(&mut h).contains(&RegistryOp::RemoveAgent { id: aid.clone() }));
    // It comes back with its id: refused, told why.
    let out = h.register_info(A2, agent_info(Some(&aid), "cpus:2;mem:512"), vec![]);
    let refusal = agent_events(&out, A2)
        .into_iter()
        .find_map(|e| match e {
            agent::Event::Shutdown { message } => Some(message),
            _ => None,
        })
        .expect("a shutdown");
    assert!(refusal.contains("marked gone"), "{refusal}");
    assert!(!h.m.agents.contains_key(&aid));
}

#[test]
fn a_drain_survives_master_failover() {
    let mut h = H::new();
    h.m.recover(&RegistryState::default(), h.now, 1000.0);
    let aid = h.register(A1, "cpus:2;mem:512");
    operator(
        &mut h,
        &aid,
        AgentCall::Drain {
            max_grace_period: Some(Duration::from_secs(5)),
            mark_gone: false,
        },
    );
    h.advance(Duration::from_secs(1));
    let mut state = RegistryState::default();
    for op in ops(&mut h) {
        state.apply(&op, 100);
    }
    // A new leader recovers the registry; the agent re-registers.
    let mut h = H::new();
    h.m.recover(&state, h.now, 1000.0);
    assert_eq!(drain_state(&h, &aid), Some("DRAINED"));
    h.register_info(A1, agent_info(Some(&aid), "cpus:2;mem:512"), vec![]);
    h.subscribe(S1, "fw");
    assert!(h.offers(S1).is_empty(), "a drained agent is not offered");
    operator(&mut h, &aid, AgentCall::Reactivate);
    assert_eq!(h.offers(S1).len(), 1);
}
