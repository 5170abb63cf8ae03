//! The master's state machine as the whole-cluster simulation
//! (`agora-sim`) drives it: feature `sim`. Nothing here runs in a master
//! process; it exposes the sans-IO [`Master`](crate::master) with the real
//! DRF allocator, read-only views of its books for the simulation's
//! invariants, and the writes the etcd registry plans for a batch of
//! registry ops ([`etcd_transactions`]).

use std::collections::BTreeMap;

use agora_proto::{
    AgentId, ExecutorId, FrameworkId, MasterInfo, OfferId, Resources, TaskId, TaskInfo, TaskState,
};
use tokio::time::Instant;

pub use crate::allocator::AgentAccounts;
pub use crate::allocator::Interned;
use crate::allocator::{AllocatorOptions, DrfAllocator};
pub use crate::drain::AgentCall;
use crate::master::Master;
pub use crate::master::{ConnId, Input, Output};
pub use crate::registry::{
    etcd_transactions, AgentRecord, FrameworkRecord, KeyWrite, RegistryOp, RegistryState,
    OPS_PER_TXN,
};
pub use crate::{Config, RegistryError};

/// A master for the simulation.
pub struct SimMaster {
    inner: Master,
}

/// What the master's books say about one agent.
#[derive(Debug, Clone, PartialEq)]
pub struct AgentBooks {
    pub id: AgentId,
    pub connected: bool,
    /// The principal the agent id is bound to.
    pub principal: Option<String>,
    pub total: Resources,
    /// Taken by live tasks and custom executors.
    pub used: Resources,
    /// In outstanding offers.
    pub offered: Resources,
    /// The custom executors the master counts there, with their resources.
    pub executors: Vec<(FrameworkId, ExecutorId, Resources)>,
    /// The allocator's books for the agent.
    pub allocator: Option<AgentAccounts>,
}

/// A connection the master takes calls from as a framework or an agent.
#[derive(Debug, Clone, PartialEq)]
pub struct Binding {
    pub conn: ConnId,
    pub bound: Bound,
    /// The principal of the framework or agent it acts as.
    pub principal: Option<String>,
}

/// What a connection acts as.
#[derive(Debug, Clone, PartialEq)]
pub enum Bound {
    Framework(FrameworkId),
    Agent(AgentId),
}

/// One outstanding offer.
#[derive(Debug, Clone, PartialEq)]
pub struct OfferBooks {
    pub id: OfferId,
    pub framework_id: FrameworkId,
    pub agent_id: AgentId,
    pub resources: Resources,
}

/// One task the master tracks.
#[derive(Debug, Clone, PartialEq)]
pub struct TaskBooks {
    pub framework_id: FrameworkId,
    pub task_id: TaskId,
    pub agent_id: AgentId,
    pub state: TaskState,
    pub resources: Resources,
    /// The labels of the `TaskInfo` it was launched (or adopted) with.
    pub labels: BTreeMap<String, String>,
    /// The uuid of the latest status update applied to it.
    pub latest_uuid: Option<String>,
}

// === impl SimMaster ===

impl SimMaster {
    /// A master with id `id`, the DRF allocator configured from `config`,
    /// and its timers started at `now`.
    pub fn new(config: Config, id: &str, now: Instant) -> Self {
        let allocator = Box::new(DrfAllocator::new(AllocatorOptions::from(&config)));
        let info = MasterInfo {
            id: id.to_string(),
            address: format!("{id}:5050"),
            version: agora_proto::VERSION.to_string(),
        };
        SimMaster {
            inner: Master::new(config, info, allocator, now),
        }
    }

    /// Loads what the registry kept (a restarted master).
    pub fn recover(&mut self, state: &RegistryState, now: Instant, wall_now: f64) {
        self.inner.recover(state, now, wall_now);
    }

    /// Handles one input at `now`.
    pub fn handle(&mut self, now: Instant, input: Input) {
        self.inner.handle(now, input);
    }

    /// Runs the timers due at `now`.
    pub fn tick(&mut self, now: Instant) {
        self.inner.tick(now);
    }

    /// When [`SimMaster::tick`] has something to do next.
    pub fn next_deadline(&self) -> Instant {
        self.inner.next_deadline()
    }

    /// What the inputs so far ask to be sent.
    pub fn take_outputs(&mut self) -> Vec<Output> {
        self.inner.take_outputs()
    }

    /// What the inputs so far ask to be sent, left to be taken.
    pub fn peek_outputs(&self) -> &[Output] {
        self.inner.peek_outputs()
    }

    /// What the inputs so far changed in the registered state, to be made
    /// durable before the outputs go out.
    pub fn take_registry_ops(&mut self) -> Vec<RegistryOp> {
        self.inner.take_registry_ops()
    }

    /// The books of every agent the master knows.
    pub fn agents(&self) -> Vec<AgentBooks> {
        let mut out: Vec<AgentBooks> = self
            .inner
            .agents
            .values()
            .map(|a| AgentBooks {
                id: a.id.clone(),
                connected: a.conn.is_some(),
                principal: a.principal.clone(),
                total: a.total.clone(),
                used: a.used.clone(),
                offered: a.offered.clone(),
                executors: a
                    .executors
                    .iter()
                    .map(|((f, e), info)| (f.clone(), e.clone(), info.resources.clone()))
                    .collect(),
                allocator: self.inner.allocator.agent_accounts(&a.id),
            })
            .collect();
        out.sort_by(|a, b| a.id.cmp(&b.id));
        out
    }

    /// The sizes of the allocator's tables of interned role and resource
    /// names, and how much of them is in use; see
    /// [`Interned::within_bound`]. O(1).
    pub fn allocator_interned(&self) -> Interned {
        self.inner.allocator.interned()
    }

    /// Every outstanding offer.
    pub fn offers(&self) -> Vec<OfferBooks> {
        let mut out: Vec<OfferBooks> = self
            .inner
            .offers
            .values()
            .map(|o| OfferBooks {
                id: o.offer.id.clone(),
                framework_id: o.offer.framework_id.clone(),
                agent_id: o.offer.agent_id.clone(),
                resources: o.offer.resources.clone(),
            })
            .collect();
        out.sort_by(|a, b| a.id.cmp(&b.id));
        out
    }

    /// Every task the master tracks (live, or terminal and not yet
    /// acknowledged).
    pub fn tasks(&self) -> Vec<TaskBooks> {
        let mut out: Vec<TaskBooks> = self
            .inner
            .frameworks
            .values()
            .flat_map(|f| {
                f.tasks.values().map(|t| TaskBooks {
                    framework_id: f.id.clone(),
                    task_id: t.info.task_id.clone(),
                    agent_id: t.agent_id.clone(),
                    state: t.state,
                    resources: t.resources.clone(),
                    labels: t.info.labels.clone(),
                    latest_uuid: t.latest_status.as_ref().and_then(|s| s.uuid.clone()),
                })
            })
            .collect();
        out.sort_by(|a, b| (&a.framework_id, &a.task_id).cmp(&(&b.framework_id, &b.task_id)));
        out
    }

    /// The `TaskInfo` of the task the master tracks under this id, if any.
    pub fn task_info(&self, framework_id: &FrameworkId, task_id: &TaskId) -> Option<&TaskInfo> {
        self.inner
            .frameworks
            .get(framework_id)
            .and_then(|f| f.tasks.get(task_id))
            .map(|t| &t.info)
    }

    /// Every task record the master holds, with its framework (in no
    /// particular order; cheaper than [`SimMaster::tasks`]).
    pub fn task_records(&self) -> impl Iterator<Item = (&FrameworkId, &TaskInfo)> {
        self.inner
            .frameworks
            .values()
            .flat_map(|f| f.tasks.values().map(move |t| (&f.id, &t.info)))
    }

    /// The frameworks the master knows, and whether each is subscribed.
    pub fn frameworks(&self) -> Vec<(FrameworkId, bool)> {
        let mut out: Vec<(FrameworkId, bool)> = self
            .inner
            .frameworks
            .values()
            .map(|f| (f.id.clone(), f.conn.is_some()))
            .collect();
        out.sort();
        out
    }

    /// Who may act as what: each connection the master takes calls from
    /// as a framework's scheduler or as an agent, with the principal that
    /// framework or agent is bound to.
    pub fn bindings(&self) -> Vec<Binding> {
        let mut out: Vec<Binding> = self
            .inner
            .scheduler_conns
            .iter()
            .map(|(conn, fid)| Binding {
                conn: *conn,
                bound: Bound::Framework(fid.clone()),
                principal: self
                    .inner
                    .frameworks
                    .get(fid)
                    .and_then(|f| f.info.principal.clone()),
            })
            .chain(self.inner.agent_conns.iter().map(|(conn, aid)| Binding {
                conn: *conn,
                bound: Bound::Agent(aid.clone()),
                principal: self.inner.agents.get(aid).and_then(|a| a.principal.clone()),
            }))
            .collect();
        out.sort_by_key(|b| b.conn);
        out
    }

    /// The principal each framework the master knows is bound to.
    pub fn framework_principals(&self) -> Vec<(FrameworkId, Option<String>)> {
        let mut out: Vec<_> = self
            .inner
            .frameworks
            .values()
            .map(|f| (f.id.clone(), f.info.principal.clone()))
            .collect();
        out.sort();
        out
    }

    /// The principal each agent the master knows is bound to.
    pub fn agent_principals(&self) -> Vec<(AgentId, Option<String>)> {
        let mut out: Vec<_> = self
            .inner
            .agents
            .values()
            .map(|a| (a.id.clone(), a.principal.clone()))
            .collect();
        out.sort();
        out
    }

    /// Whether the framework was torn down (and is refused from now on).
    /// Whether an operator holds agent `agent_id` back from new tasks
    /// (deactivated or draining).
    pub fn operator_holds(&self, agent_id: &AgentId) -> bool {
        self.inner.operator_holds(agent_id)
    }

    pub fn framework_removed(&self, framework_id: &FrameworkId) -> bool {
        self.inner.removed_frameworks.contains(framework_id)
    }
}
