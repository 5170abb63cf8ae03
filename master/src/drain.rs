//! Draining, deactivating and marking agents gone: the operator calls
//! DRAIN_AGENT, DEACTIVATE_AGENT, REACTIVATE_AGENT and MARK_AGENT_GONE
//! (Mesos's maintenance primitives, `master.proto`).
//!
//! A deactivated agent gets no offers; its tasks go on. A draining agent
//! is deactivated too; `max_grace_period` after the drain began (at once
//! without one) the master kills every task still live there, each with
//! its own kill grace on the agent, and their terminal updates carry
//! `REASON_AGENT_DRAINING`. Once no live task is left the agent is
//! DRAINED, and with `mark_gone` it is then marked gone. REACTIVATE_AGENT
//! ends both, and the agent is offered again. An agent marked gone is
//! removed as an agent that missed its pings is, but its live tasks are
//! `TASK_LOST` with `REASON_AGENT_REMOVED_BY_OPERATOR` (which a
//! partition-aware framework hears as `TASK_GONE_BY_OPERATOR`), and its
//! id is refused from then on. The operator state is kept in the agent's
//! registry record, so a new leader keeps it; a drain's grace period
//! starts again at the failover.
//!
//! The unavailability an agent reports itself (a full disk:
//! `Agent::unavailable`) is independent: the agent is offered only when
//! neither holds it back.

use std::time::Duration;

use agora_proto::hash::HashSet;
use agora_proto::{agent::Event, AgentId, FrameworkId, Reason, TaskId, TaskStatus};
use serde::{Deserialize, Serialize};
use tokio::time::Instant;

use crate::master::Master;

/// An operator's call about one agent, checked by the HTTP side (the
/// agent was known, the grace period is not negative).
#[derive(Debug, Clone, PartialEq)]
pub enum AgentCall {
    /// DRAIN_AGENT.
    Drain {
        max_grace_period: Option<Duration>,
        mark_gone: bool,
    },
    /// DEACTIVATE_AGENT.
    Deactivate,
    /// REACTIVATE_AGENT.
    Reactivate,
    /// MARK_AGENT_GONE.
    MarkGone,
}

/// What the registry keeps of a drain.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DrainRecord {
    /// Seconds; none: tasks are killed at once, each with its own grace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) max_grace_period: Option<f64>,
    #[serde(default)]
    pub(crate) mark_gone: bool,
    /// DRAINED (else DRAINING).
    #[serde(default)]
    pub(crate) drained: bool,
}

/// A drain in progress (or done) on an agent.
#[derive(Debug, Clone)]
pub(crate) struct Drain {
    pub(crate) record: DrainRecord,
    /// When the tasks still live there are killed.
    pub(crate) kill_at: Instant,
    /// Whether they were.
    pub(crate) kills_sent: bool,
    /// The tasks killed by the drain: their terminal updates carry
    /// `REASON_AGENT_DRAINING`.
    pub(crate) killed: HashSet<(FrameworkId, TaskId)>,
}

// === impl Drain ===

impl Drain {
    pub(crate) fn new(now: Instant, record: DrainRecord) -> Drain {
        let grace = record
            .max_grace_period
            .map(|s| Duration::from_secs_f64(s.clamp(0.0, 10.0 * 365.0 * 86400.0)))
            .unwrap_or_default();
        Drain {
            record,
            kill_at: now + grace,
            kills_sent: false,
            killed: HashSet::default(),
        }
    }
}

// === impl Master: operator calls on agents ===

impl Master {
    /// Carries out an operator's `call` on agent `aid` (unknown: ignored,
    /// the HTTP side answered already).
    pub(crate) fn operator_agent_call(
        &mut self,
        now: Instant,
        aid: &AgentId,
        call: AgentCall,
        operator: Option<String>,
    ) {
        if !self.agents.contains_key(aid) {
            tracing::warn!(agent_id = %aid, ?call, "operator call for an agent the master no longer has; ignored");
            return;
        }
        tracing::info!(agent_id = %aid, ?call, ?operator, "operator call on an agent");
        match call {
            AgentCall::Drain {
                max_grace_period,
                mark_gone,
            } => {
                let record = DrainRecord {
                    max_grace_period: max_grace_period.map(|d| d.as_secs_f64()),
                    mark_gone,
                    drained: false,
                };
                if let Some(agent) = self.agents.get_mut(aid) {
                    agent.deactivated = true;
                    agent.drain = Some(Drain::new(now, record));
                }
                self.draining.insert(aid.clone());
                self.hold_agent(now, aid);
                self.persist_agent(aid);
                self.drain_agents(now);
            }
            AgentCall::Deactivate => {
                if let Some(agent) = self.agents.get_mut(aid) {
                    agent.deactivated = true;
                }
                self.hold_agent(now, aid);
                self.persist_agent(aid);
            }
            AgentCall::Reactivate => {
                let unavailable = match self.agents.get_mut(aid) {
                    Some(agent) => {
                        agent.deactivated = false;
                        agent.drain = None;
                        agent.unavailable.is_some()
                    }
                    None => return,
                };
                self.draining.remove(aid);
                if !unavailable && self.agents.get(aid).is_some_and(|a| a.conn.is_some()) {
                    self.allocator.activate_agent(aid);
                    self.schedule_allocation(now);
                }
                self.persist_agent(aid);
            }
            AgentCall::MarkGone => self.mark_agent_gone(now, aid),
        }
    }

    /// No offers of agent `aid` from now on; outstanding ones rescinded.
    fn hold_agent(&mut self, now: Instant, aid: &AgentId) {
        self.allocator.deactivate_agent(aid);
        self.withdraw_agent_offers(now, aid, true);
    }

    fn persist_agent(&mut self, aid: &AgentId) {
        if let Some(op) = self.agents.get(aid).map(|a| a.registry_record()) {
            self.persist(op);
        }
    }

    /// Removes agent `aid` for good: its live tasks end, frameworks hear
    /// it is lost, and its id is refused from now on.
    pub(crate) fn mark_agent_gone(&mut self, now: Instant, aid: &AgentId) {
        tracing::warn!(agent_id = %aid, "agent marked gone by an operator");
        self.draining.remove(aid);
        self.gone_agents.insert(aid.clone());
        self.remove_agent_for(
            now,
            aid,
            "agent marked gone by an operator",
            Reason::ReasonAgentRemovedByOperator,
        );
    }

    /// Runs the drains: kills the tasks of drains whose grace is over,
    /// marks agents with no live task left DRAINED (and gone, when the
    /// drain asked for it).
    pub(crate) fn drain_agents(&mut self, now: Instant) {
        if self.draining.is_empty() {
            return;
        }
        let ids: Vec<AgentId> = self.draining.iter().cloned().collect();
        for aid in ids {
            let Some(agent) = self.agents.get(&aid) else {
                self.draining.remove(&aid);
                continue;
            };
            let Some(drain) = &agent.drain else {
                self.draining.remove(&aid);
                continue;
            };
            let live: Vec<(FrameworkId, TaskId)> = agent
                .tasks
                .iter()
                .filter(|(fid, tid)| {
                    self.frameworks
                        .get(fid)
                        .and_then(|f| f.tasks.get(tid))
                        .is_some_and(|t| t.agent_id == aid && !t.state.is_terminal())
                })
                .cloned()
                .collect();
            if !drain.kills_sent && now >= drain.kill_at {
                tracing::info!(agent_id = %aid, tasks = live.len(), "drain grace period over; killing the agent's tasks");
                if let Some(drain) = self.agents.get_mut(&aid).and_then(|a| a.drain.as_mut()) {
                    drain.kills_sent = true;
                    drain.killed.extend(live.iter().cloned());
                }
                for (framework_id, task_id) in live.iter().cloned() {
                    self.send_agent(
                        &aid,
                        Event::KillTask {
                            framework_id,
                            task_id,
                        },
                    );
                }
            }
            let drained = self
                .agents
                .get(&aid)
                .and_then(|a| a.drain.as_ref())
                .is_some_and(|d| d.record.drained);
            if live.is_empty() && !drained {
                tracing::info!(agent_id = %aid, "agent drained");
                let mark_gone = match self.agents.get_mut(&aid).and_then(|a| a.drain.as_mut()) {
                    Some(drain) => {
                        drain.record.drained = true;
                        drain.record.mark_gone
                    }
                    None => false,
                };
                if mark_gone {
                    self.mark_agent_gone(now, &aid);
                } else {
                    self.persist_agent(&aid);
                    self.draining.remove(&aid);
                }
            }
        }
    }

    /// When a drain next has tasks to kill.
    pub(crate) fn next_drain_deadline(&self) -> Option<Instant> {
        self.draining
            .iter()
            .filter_map(|aid| self.agents.get(aid)?.drain.as_ref())
            .filter(|d| !d.kills_sent)
            .map(|d| d.kill_at)
            .min()
    }

    /// A terminal update of a task a drain killed carries
    /// `REASON_AGENT_DRAINING`.
    pub(crate) fn mark_drain_kill(
        &self,
        aid: &AgentId,
        fid: &FrameworkId,
        status: &mut TaskStatus,
    ) {
        if !status.state.is_terminal() {
            return;
        }
        let killed = self
            .agents
            .get(aid)
            .and_then(|a| a.drain.as_ref())
            .is_some_and(|d| d.killed.contains(&(fid.clone(), status.task_id.clone())));
        if killed {
            status.reason = Some(Reason::ReasonAgentDraining);
            status.message = Some("the agent is draining".into());
        }
    }

    /// Whether an operator holds agent `aid` back from offers.
    pub(crate) fn operator_holds(&self, aid: &AgentId) -> bool {
        self.agents
            .get(aid)
            .is_some_and(|a| a.deactivated || a.drain.is_some())
    }
}
