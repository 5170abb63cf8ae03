//! The `/state` snapshot: a serializable copy of the master's state that
//! the state task publishes (at most every `state_snapshot_interval`), so
//! serving `/state` never waits for the event loop.

use agora_proto::{
    AgentId, Attributes, ExecutorId, FrameworkId, MasterInfo, OfferId, Resources, TaskId, TaskState,
};
use serde::Serialize;

use crate::master::Master;

/// Everything `/state` shows.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct StateSnapshot {
    pub(crate) master: MasterInfo,
    pub(crate) generated_at: f64,
    pub(crate) agents: Vec<AgentState>,
    pub(crate) frameworks: Vec<FrameworkState>,
    pub(crate) offers: Vec<OfferState>,
    pub(crate) completed_tasks: Vec<TaskView>,
    pub(crate) removed_agents: usize,
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
        let mut agents: Vec<AgentState> = self
            .agents
            .values()
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
        agents.sort_by(|a, b| a.id.cmp(&b.id));
        let mut frameworks: Vec<FrameworkState> = self
            .frameworks
            .values()
            .map(|f| {
                let mut tasks: Vec<TaskView> = f
                    .tasks
                    .values()
                    .map(|t| TaskView {
                        id: t.info.task_id.clone(),
                        name: t.info.name.clone(),
                        framework_id: f.id.clone(),
                        state: t.state,
                        agent_id: t.agent_id.clone(),
                        resources: view(&t.resources),
                        finished_at: None,
                    })
                    .collect();
                tasks.sort_by(|a, b| a.id.cmp(&b.id));
                FrameworkState {
                    id: f.id.clone(),
                    name: f.info.name.clone(),
                    roles: f.roles(),
                    connected: f.conn.is_some(),
                    suppressed: f.suppressed,
                    recovered: f.recovered,
                    failover_timeout: f.info.failover_timeout,
                    offers: f.offers.len(),
                    tasks,
                    registered_at: f.registered_at,
                }
            })
            .collect();
        frameworks.sort_by(|a, b| a.id.cmp(&b.id));
        let mut offers: Vec<OfferState> = self
            .offers
            .values()
            .map(|o| OfferState {
                id: o.offer.id.clone(),
                framework_id: o.offer.framework_id.clone(),
                agent_id: o.offer.agent_id.clone(),
                resources: view(&o.offer.resources),
            })
            .collect();
        offers.sort_by(|a, b| a.id.cmp(&b.id));
        StateSnapshot {
            master: self.info.clone(),
            generated_at: agora_proto::now_timestamp(),
            agents,
            frameworks,
            offers,
            completed_tasks: self
                .completed
                .iter()
                .map(|c| TaskView {
                    id: c.task_id.clone(),
                    name: c.name.clone(),
                    framework_id: c.framework_id.clone(),
                    state: c.state,
                    agent_id: c.agent_id.clone(),
                    resources: view(&c.resources),
                    finished_at: Some(c.finished_at),
                })
                .collect(),
            removed_agents: self.removed_agents.len(),
        }
    }
}
