//! The `/state` snapshot: a serializable copy of the master's state that
//! the state task publishes (at most every `state_snapshot_interval`), so
//! serving `/state`, `/metrics`, `/events` and the UI's list endpoints never
//! waits for the event loop.
//!
//! Besides the copy, building a snapshot counts the [`Summary`] (the gauges
//! of `/metrics` and the numbers of the UI's overview) and reads the
//! allocator's dominant shares. The JSON text of a snapshot is encoded at
//! most once, on the first `/state` request that needs it.

use std::collections::BTreeMap;
use std::sync::OnceLock;

use agora_proto::{
    AgentId, Attributes, ExecutorId, FrameworkId, MasterInfo, OfferId, Resources, TaskId, TaskState,
};
use axum::body::Bytes;
use serde::Serialize;

use crate::master::Master;

/// Everything `/state` shows.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct StateSnapshot {
    pub(crate) master: MasterInfo,
    /// Unix time the master started.
    pub(crate) started_at: f64,
    pub(crate) generated_at: f64,
    pub(crate) summary: Summary,
    pub(crate) agents: Vec<AgentState>,
    pub(crate) frameworks: Vec<FrameworkState>,
    pub(crate) roles: Vec<RoleState>,
    pub(crate) offers: Vec<OfferState>,
    pub(crate) completed_tasks: Vec<TaskView>,
    pub(crate) removed_agents: usize,
    /// The JSON text of this snapshot, encoded on first use.
    #[serde(skip)]
    pub(crate) encoded: OnceLock<Bytes>,
}

/// Counts and resource totals: the gauges of `/metrics`, the overview of
/// the UI and the payload of `/events`.
#[derive(Debug, Clone, Default, Serialize)]
pub(crate) struct Summary {
    pub(crate) agents_connected: usize,
    pub(crate) agents_disconnected: usize,
    pub(crate) frameworks: usize,
    pub(crate) frameworks_connected: usize,
    /// Active tasks (not yet acknowledged terminal), by latest state.
    pub(crate) tasks_by_state: BTreeMap<TaskState, usize>,
    /// Tasks in the bounded completed list, by terminal state.
    pub(crate) completed_by_state: BTreeMap<TaskState, usize>,
    pub(crate) tasks_active: usize,
    pub(crate) offers_outstanding: usize,
    /// Resources of connected agents.
    pub(crate) cpus_total: f64,
    pub(crate) cpus_used: f64,
    pub(crate) cpus_offered: f64,
    pub(crate) mem_total: f64,
    pub(crate) mem_used: f64,
    pub(crate) mem_offered: f64,
    pub(crate) disk_total: f64,
    pub(crate) disk_used: f64,
    pub(crate) disk_offered: f64,
}

/// A role: its weight and the allocator's weighted dominant share.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct RoleState {
    pub(crate) name: String,
    pub(crate) weight: f64,
    /// Dominant share divided by weight; `null` if the allocator keeps none.
    pub(crate) share: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) quota: Option<ResourcesView>,
    pub(crate) frameworks: Vec<FrameworkId>,
}

/// Resources as the proto list plus Mesos's text form.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct ResourcesView {
    pub(crate) text: String,
    pub(crate) list: Resources,
}

#[derive(Debug, Clone, Serialize)]
pub(crate) struct AgentState {
    pub(crate) id: AgentId,
    pub(crate) hostname: String,
    pub(crate) address: String,
    pub(crate) connected: bool,
    pub(crate) total: ResourcesView,
    pub(crate) used: ResourcesView,
    pub(crate) offered: ResourcesView,
    pub(crate) attributes: Attributes,
    pub(crate) tasks: usize,
    pub(crate) executors: Vec<ExecutorId>,
    pub(crate) registered_at: f64,
}

#[derive(Debug, Clone, Serialize)]
pub(crate) struct FrameworkState {
    pub(crate) id: FrameworkId,
    pub(crate) name: String,
    pub(crate) roles: Vec<String>,
    pub(crate) connected: bool,
    pub(crate) suppressed: bool,
    pub(crate) recovered: bool,
    pub(crate) failover_timeout: f64,
    pub(crate) offers: usize,
    /// Resources of the framework's active tasks.
    pub(crate) used: ResourcesView,
    /// Resources in the framework's outstanding offers.
    pub(crate) offered: ResourcesView,
    /// Dominant share (unweighted) in each of its roles.
    pub(crate) shares: BTreeMap<String, Option<f64>>,
    pub(crate) tasks: Vec<TaskView>,
    pub(crate) registered_at: f64,
}

#[derive(Debug, Clone, Serialize)]
pub(crate) struct TaskView {
    pub(crate) id: TaskId,
    pub(crate) name: String,
    pub(crate) framework_id: FrameworkId,
    pub(crate) state: TaskState,
    pub(crate) agent_id: AgentId,
    /// The executor running it: with `framework_id` and the agent's
    /// address, where its sandbox is served (`/files/FID/EID/…` on the agent).
    pub(crate) executor_id: ExecutorId,
    pub(crate) resources: ResourcesView,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) finished_at: Option<f64>,
}

#[derive(Debug, Clone, Serialize)]
pub(crate) struct OfferState {
    pub(crate) id: OfferId,
    pub(crate) framework_id: FrameworkId,
    pub(crate) agent_id: AgentId,
    pub(crate) resources: ResourcesView,
}

fn view(r: &Resources) -> ResourcesView {
    ResourcesView {
        text: r.to_string(),
        list: r.clone(),
    }
}

// === impl Master: snapshot ===

impl Master {
    /// Copies the state for `/state`.
    pub(crate) fn snapshot(&self) -> StateSnapshot {
        // Sort references, not the (large) views: moving views dominated
        // the cost at 100 000 tasks.
        let mut agent_refs: Vec<_> = self.agents.values().collect();
        agent_refs.sort_unstable_by(|a, b| a.id.cmp(&b.id));
        let agents: Vec<AgentState> = agent_refs
            .into_iter()
            .map(|a| AgentState {
                id: a.id.clone(),
                hostname: a.info.hostname.clone(),
                address: a.info.address.clone(),
                connected: a.conn.is_some(),
                total: view(&a.total),
                used: view(&a.used),
                offered: view(&a.offered),
                attributes: a.info.attributes.clone(),
                tasks: a.tasks.len(),
                executors: a.executors.keys().map(|(_, e)| e.clone()).collect(),
                registered_at: a.registered_at,
            })
            .collect();
        let mut frameworks: Vec<FrameworkState> = self
            .frameworks
            .values()
            .map(|f| {
                let mut task_refs: Vec<_> = f.tasks.values().collect();
                task_refs.sort_unstable_by(|a, b| a.info.task_id.cmp(&b.info.task_id));
                let tasks: Vec<TaskView> = task_refs
                    .into_iter()
                    .map(|t| TaskView {
                        id: t.info.task_id.clone(),
                        name: t.info.name.clone(),
                        framework_id: f.id.clone(),
                        state: t.state,
                        agent_id: t.agent_id.clone(),
                        executor_id: t.executor_id.clone(),
                        resources: view(&t.resources),
                        finished_at: None,
                    })
                    .collect();
                let mut used = Resources::new();
                for t in f.tasks.values().filter(|t| !t.state.is_terminal()) {
                    used += &t.resources;
                }
                let mut offered = Resources::new();
                for o in f.offers.iter().filter_map(|id| self.offers.get(id)) {
                    offered += &o.offer.resources;
                }
                let roles = f.roles();
                let shares = roles
                    .iter()
                    .map(|r| (r.clone(), self.allocator.framework_share(&f.id, r)))
                    .collect();
                FrameworkState {
                    id: f.id.clone(),
                    name: f.info.name.clone(),
                    roles,
                    connected: f.conn.is_some(),
                    suppressed: f.suppressed,
                    recovered: f.recovered,
                    failover_timeout: f.info.failover_timeout,
                    offers: f.offers.len(),
                    used: view(&used),
                    offered: view(&offered),
                    shares,
                    tasks,
                    registered_at: f.registered_at,
                }
            })
            .collect();
        frameworks.sort_by(|a, b| a.id.cmp(&b.id));
        let mut offer_refs: Vec<_> = self.offers.values().collect();
        offer_refs.sort_unstable_by(|a, b| a.offer.id.cmp(&b.offer.id));
        let offers: Vec<OfferState> = offer_refs
            .into_iter()
            .map(|o| OfferState {
                id: o.offer.id.clone(),
                framework_id: o.offer.framework_id.clone(),
                agent_id: o.offer.agent_id.clone(),
                resources: view(&o.offer.resources),
            })
            .collect();
        let completed_tasks: Vec<TaskView> = self
            .completed
            .iter()
            .map(|c| TaskView {
                id: c.task_id.clone(),
                name: c.name.clone(),
                framework_id: c.framework_id.clone(),
                state: c.state,
                agent_id: c.agent_id.clone(),
                executor_id: c.executor_id.clone(),
                resources: view(&c.resources),
                finished_at: Some(c.finished_at),
            })
            .collect();
        let summary = self.summary(&frameworks, &completed_tasks);
        let roles = self.roles(&frameworks);
        StateSnapshot {
            master: self.info.clone(),
            started_at: self.metrics.started_at,
            generated_at: agora_proto::now_timestamp(),
            summary,
            agents,
            frameworks,
            roles,
            offers,
            completed_tasks,
            removed_agents: self.removed_agents.len(),
            encoded: OnceLock::new(),
        }
    }

    fn summary(&self, frameworks: &[FrameworkState], completed: &[TaskView]) -> Summary {
        let mut s = Summary {
            frameworks: frameworks.len(),
            frameworks_connected: frameworks.iter().filter(|f| f.connected).count(),
            offers_outstanding: self.offers.len(),
            ..Summary::default()
        };
        for a in self.agents.values() {
            if a.conn.is_none() {
                s.agents_disconnected += 1;
                continue;
            }
            s.agents_connected += 1;
            s.cpus_total += a.total.cpus();
            s.cpus_used += a.used.cpus();
            s.cpus_offered += a.offered.cpus();
            s.mem_total += a.total.mem();
            s.mem_used += a.used.mem();
            s.mem_offered += a.offered.mem();
            s.disk_total += a.total.scalar("disk");
            s.disk_used += a.used.scalar("disk");
            s.disk_offered += a.offered.scalar("disk");
        }
        for t in frameworks.iter().flat_map(|f| &f.tasks) {
            *s.tasks_by_state.entry(t.state).or_default() += 1;
            s.tasks_active += 1;
        }
        for t in completed {
            *s.completed_by_state.entry(t.state).or_default() += 1;
        }
        s
    }

    /// Every role a framework is in or the configuration names.
    fn roles(&self, frameworks: &[FrameworkState]) -> Vec<RoleState> {
        let mut roles: BTreeMap<String, Vec<FrameworkId>> = BTreeMap::new();
        for name in self
            .config
            .role_weights
            .keys()
            .chain(self.config.role_quotas.keys())
        {
            roles.entry(name.clone()).or_default();
        }
        for f in frameworks {
            for r in &f.roles {
                roles.entry(r.clone()).or_default().push(f.id.clone());
            }
        }
        roles
            .into_iter()
            .map(|(name, frameworks)| RoleState {
                weight: self.config.role_weights.get(&name).copied().unwrap_or(1.0),
                share: self.allocator.role_share(&name),
                quota: self.config.role_quotas.get(&name).map(view),
                name,
                frameworks,
            })
            .collect()
    }
}

// === impl StateSnapshot ===

impl StateSnapshot {
    /// The JSON text of the snapshot (encoded once, then shared).
    pub(crate) fn json(&self) -> Result<Bytes, serde_json::Error> {
        if let Some(b) = self.encoded.get() {
            return Ok(b.clone());
        }
        let bytes = Bytes::from(serde_json::to_vec(self)?);
        Ok(self.encoded.get_or_init(|| bytes).clone())
    }

    /// Every task the snapshot knows: active ones, then completed ones.
    pub(crate) fn all_tasks(&self) -> impl Iterator<Item = &TaskView> {
        self.frameworks
            .iter()
            .flat_map(|f| &f.tasks)
            .chain(&self.completed_tasks)
    }
}
