//! The `/state` snapshot: a serializable copy of the master's state that
//! serving `/state`, `/metrics`, `/events` and the UI's list endpoints read,
//! so none of them waits for the event loop, and building it does not
//! stall the event loop either.
//!
//! The work is split in two:
//!
//! - On the state task, [`Master::state_delta`] turns what changed since
//!   the last snapshot into a [`StateDelta`]: a fresh, shared view of each
//!   agent, task and offer that was touched (the master's maps are
//!   [`Tracked`](crate::tracked::Tracked), so it knows which) plus the few
//!   things that are cheap and change everywhere at once (each framework's
//!   dominant shares, the roles). Its cost is proportional to the change.
//! - A [`StateBuilder`] on its own thread (the [`Publisher`]) applies the
//!   deltas in order to its sorted copy of the views and assembles each
//!   [`StateSnapshot`]: lists of shared pointers, the [`Summary`] counts and
//!   the frameworks' resource totals. Lists of frameworks whose tasks did
//!   not change are reused from the previous snapshot.
//!
//! A snapshot is therefore exactly the master's state at the moment its
//! delta was taken. Resource texts are formatted, and the JSON text of a
//! snapshot encoded, at most once, by the first `/state` request that
//! needs it.

use agora_proto::hash::HashMap;
use std::collections::{BTreeMap, BTreeSet, HashSet, VecDeque};
use std::ops::Deref;
use std::sync::{Arc, OnceLock};

use agora_proto::{
    AgentId, Attributes, ExecutorId, FrameworkId, FrameworkInfo, MasterInfo, OfferId, Resources,
    TaskId, TaskState,
};
use axum::body::Bytes;
use serde::ser::SerializeStruct;
use serde::{Serialize, Serializer};
use tokio::sync::{mpsc, watch};

use crate::agents::Agent;
use crate::frameworks::{CompletedFramework, Framework};
use crate::master::Master;
use crate::offers::OfferEntry;
use crate::tasks::{CompletedTask, Task};
use crate::tracked::Change;

/// Buckets of a framework's tasks in the builder (see `FrameworkEntry`).
const TASK_BUCKETS: u64 = 1024;

/// Deltas waiting for the builder thread. When it falls behind, the state
/// task keeps collecting changes and hands them over one interval later.
const DELTA_QUEUE: usize = 2;

/// Everything `/state` shows.
#[derive(Debug, Serialize)]
pub(crate) struct StateSnapshot {
    pub(crate) master: MasterInfo,
    /// Unix time the master started.
    pub(crate) started_at: f64,
    pub(crate) generated_at: f64,
    pub(crate) summary: Summary,
    #[serde(serialize_with = "shared_list")]
    pub(crate) agents: Arc<Vec<Arc<View<AgentState>>>>,
    pub(crate) frameworks: Vec<FrameworkState>,
    pub(crate) roles: Vec<RoleState>,
    #[serde(serialize_with = "shared_list")]
    pub(crate) offers: Arc<Vec<Arc<View<OfferState>>>>,
    #[serde(serialize_with = "shared_list")]
    pub(crate) completed_tasks: Arc<Vec<Arc<View<TaskView>>>>,
    /// Removed frameworks, oldest first (for the Mesos endpoints; not
    /// part of `/state`).
    #[serde(skip)]
    pub(crate) completed_frameworks: Arc<Vec<Arc<CompletedFramework>>>,
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
    /// Whether the weight was set (`--weights`, `UPDATE_WEIGHTS`).
    #[serde(skip)]
    pub(crate) weight_set: bool,
    /// Dominant share divided by weight; `null` if the allocator keeps none.
    pub(crate) share: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) quota: Option<ResourcesView>,
    /// Quota limits (`UPDATE_QUOTA`), when the role has any.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) limits: Option<crate::allocator::Limits>,
    pub(crate) frameworks: Vec<FrameworkId>,
}

/// Resources, serialized as `{"text": Mesos's text form, "list": the proto
/// list}`. The text is formatted when the view is first encoded (not on the
/// state task), and kept: a view shared by many snapshots formats it once.
#[derive(Debug, Clone, Default)]
pub(crate) struct ResourcesView {
    list: Resources,
    text: OnceLock<String>,
}

/// A list of views that snapshots share while it does not change.
pub(crate) type SharedList<T> = Arc<Vec<Arc<View<T>>>>;

/// A view of one agent, task or offer, shared by every snapshot until the
/// entity changes, with its JSON text encoded at most once.
#[derive(Debug)]
pub(crate) struct View<T> {
    value: T,
    json: OnceLock<Box<[u8]>>,
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
    /// The framework of each of `executors`, in the same order (for the
    /// `view_frameworks` ACL; not part of `/state`).
    #[serde(skip)]
    pub(crate) executor_frameworks: Vec<FrameworkId>,
    pub(crate) registered_at: f64,
    /// Why the agent cannot take tasks now, as it said (absent: it can).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) unavailable: Option<String>,
    /// DEACTIVATE_AGENT or a drain holds it back from offers.
    pub(crate) deactivated: bool,
    /// DRAIN_AGENT's state and configuration, as Mesos's `DrainInfo`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) drain_info: Option<DrainInfoView>,
}

/// Mesos's `DrainInfo` in JSON.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct DrainInfoView {
    /// `DRAINING` or `DRAINED`.
    pub(crate) state: &'static str,
    pub(crate) config: DrainConfigView,
}

/// Mesos's `DrainConfig` in JSON.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct DrainConfigView {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) max_grace_period: Option<DurationView>,
    pub(crate) mark_gone: bool,
}

/// Mesos's `DurationInfo` in JSON.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct DurationView {
    pub(crate) nanoseconds: i64,
}

#[derive(Debug, Clone, Serialize)]
pub(crate) struct FrameworkState {
    pub(crate) id: FrameworkId,
    pub(crate) name: String,
    /// The principal it authenticated (or declared itself) as.
    pub(crate) principal: Option<String>,
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
    #[serde(serialize_with = "shared_list")]
    pub(crate) tasks: Arc<Vec<Arc<View<TaskView>>>>,
    pub(crate) registered_at: f64,
    /// As subscribed (for the Mesos endpoints; not part of `/state`).
    #[serde(skip)]
    pub(crate) info: Arc<FrameworkInfo>,
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
    /// What its container uses (agents with `--isolation cgroups`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) usage: Option<agora_proto::agent::ContainerUsage>,
    /// Its status updates, for the Mesos endpoints (`/master/state`,
    /// `/tasks`); not in Agora's own `/state`.
    #[serde(skip)]
    pub(crate) statuses: Vec<crate::tasks::StatusRecord>,
    /// The role its resources were allocated to, when the master knows
    /// it (for the Mesos endpoints).
    #[serde(skip)]
    pub(crate) role: Option<String>,
}

#[derive(Debug, Clone, Serialize)]
pub(crate) struct OfferState {
    pub(crate) id: OfferId,
    pub(crate) framework_id: FrameworkId,
    pub(crate) agent_id: AgentId,
    pub(crate) resources: ResourcesView,
}

/// What the state task hands the builder: the views of what changed since
/// the previous delta (or of everything, when `full`).
#[derive(Debug)]
pub(crate) struct StateDelta {
    /// The builder drops what it holds first.
    full: bool,
    master: MasterInfo,
    started_at: f64,
    generated_at: f64,
    /// New views, or `None` for a removed entry.
    agents: Vec<(AgentId, Option<Arc<View<AgentState>>>)>,
    frameworks: Vec<FrameworkDelta>,
    offers: Vec<(OfferId, Option<Arc<View<OfferState>>>)>,
    /// Every framework's shares (they move whenever anything is allocated).
    shares: HashMap<FrameworkId, BTreeMap<String, Option<f64>>>,
    roles: Vec<RoleState>,
    /// Tasks completed since the previous delta, oldest first.
    completed: Vec<Arc<View<TaskView>>>,
    max_completed: usize,
    /// Frameworks removed since the previous delta, oldest first.
    completed_frameworks: Vec<Arc<CompletedFramework>>,
    max_completed_frameworks: usize,
    removed_agents: usize,
}

/// A framework's part of a [`StateDelta`].
#[derive(Debug)]
enum FrameworkDelta {
    Removed(FrameworkId),
    /// A framework not published before under this id: all of its tasks.
    Replaced {
        meta: FrameworkMeta,
        tasks: Vec<Arc<View<TaskView>>>,
    },
    /// Its changed tasks (`None`: gone).
    Changed {
        meta: FrameworkMeta,
        tasks: Vec<(TaskId, Option<Arc<View<TaskView>>>)>,
    },
}

/// A framework's own fields (its tasks, resources and shares aside).
#[derive(Debug, Clone)]
struct FrameworkMeta {
    id: FrameworkId,
    name: String,
    roles: Vec<String>,
    connected: bool,
    suppressed: bool,
    recovered: bool,
    failover_timeout: f64,
    offers: usize,
    registered_at: f64,
    info: Arc<FrameworkInfo>,
}

/// The builder's copy of the state, in `/state`'s order, with the lists
/// of the previous snapshot kept while they are still valid.
#[derive(Debug, Default)]
pub(crate) struct StateBuilder {
    master: Option<MasterInfo>,
    started_at: f64,
    generated_at: f64,
    agents: BTreeMap<AgentId, Arc<View<AgentState>>>,
    /// The agent list and its part of the summary; `None` once stale.
    agent_list: Option<(SharedList<AgentState>, Summary)>,
    frameworks: BTreeMap<FrameworkId, FrameworkEntry>,
    offers: BTreeMap<OfferId, Arc<View<OfferState>>>,
    /// The offer list and the resources offered to each framework.
    offer_list: Option<(SharedList<OfferState>, HashMap<FrameworkId, Resources>)>,
    shares: HashMap<FrameworkId, BTreeMap<String, Option<f64>>>,
    roles: Vec<RoleState>,
    completed: VecDeque<Arc<View<TaskView>>>,
    completed_frameworks: VecDeque<Arc<CompletedFramework>>,
    removed_agents: usize,
}

#[derive(Debug)]
struct FrameworkEntry {
    meta: FrameworkMeta,
    tasks: BTreeMap<TaskId, Arc<View<TaskView>>>,
    /// The same tasks spread over [`TASK_BUCKETS`] buckets by a hash of
    /// their id (none while it has no task), each with its totals
    /// cached: a changed task re-counts its bucket only. (Resource sums do not depend on the order of the
    /// additions: scalars are rounded to a thousandth at each step.)
    buckets: Vec<Bucket>,
    /// The task list and what is counted from it; `None` once stale.
    list: Option<TaskList>,
}

/// Tasks of one framework whose ids hash alike.
#[derive(Debug, Default)]
struct Bucket {
    tasks: HashMap<TaskId, Arc<View<TaskView>>>,
    /// `None` once stale.
    totals: Option<TaskTotals>,
}

/// Resources of active tasks and tasks by state.
#[derive(Debug, Clone, Default)]
struct TaskTotals {
    used: Resources,
    by_state: BTreeMap<TaskState, usize>,
}

#[derive(Debug)]
struct TaskList {
    tasks: Arc<Vec<Arc<View<TaskView>>>>,
    used: Resources,
    by_state: BTreeMap<TaskState, usize>,
}

/// The builder thread, fed by the state task.
#[derive(Debug)]
pub(crate) struct Publisher {
    tx: mpsc::Sender<StateDelta>,
    /// Set once the builder thread is found gone (it panicked), so that is
    /// logged once.
    builder_gone: bool,
    /// Sees what the builder published, for [`Publisher::publish`].
    #[cfg(feature = "etcd")]
    published: watch::Receiver<Arc<StateSnapshot>>,
}

// === impl ResourcesView ===

impl ResourcesView {
    pub(crate) fn new(list: Resources) -> Self {
        ResourcesView {
            list,
            text: OnceLock::new(),
        }
    }

    /// Mesos's text form, e.g. `cpus:1;mem:128`.
    pub(crate) fn text(&self) -> &str {
        self.text.get_or_init(|| self.list.to_string())
    }

    pub(crate) fn list(&self) -> &Resources {
        &self.list
    }
}

impl Serialize for ResourcesView {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut s = serializer.serialize_struct("ResourcesView", 2)?;
        s.serialize_field("text", self.text())?;
        s.serialize_field("list", &self.list)?;
        s.end()
    }
}

/// A list of shared views, serialized as the list of the views.
fn shared_list<S: Serializer, T: Serialize>(
    list: &Arc<Vec<Arc<View<T>>>>,
    serializer: S,
) -> Result<S::Ok, S::Error> {
    serializer.collect_seq(list.iter().map(|t| &t.value))
}

// === impl View ===

impl<T> View<T> {
    fn shared(value: T) -> Arc<Self> {
        Arc::new(View {
            value,
            json: OnceLock::new(),
        })
    }
}

impl<T> Deref for View<T> {
    type Target = T;

    fn deref(&self) -> &T {
        &self.value
    }
}

impl<T: Serialize> View<T> {
    /// The JSON text of the view, encoded on first use.
    fn json(&self) -> Result<&[u8], serde_json::Error> {
        if let Some(text) = self.json.get() {
            return Ok(text);
        }
        let text = serde_json::to_vec(&self.value)?.into_boxed_slice();
        Ok(self.json.get_or_init(|| text))
    }
}

/// Writes a JSON object field by field, in the text `serde_json` gives a
/// derived `Serialize`, with lists of views copied from their cached texts.
struct JsonWriter {
    out: Vec<u8>,
}

// === impl JsonWriter ===

impl JsonWriter {
    /// `"name":`, after a comma unless `first`. Names are plain words.
    fn key(&mut self, first: bool, name: &str) {
        if !first {
            self.out.push(b',');
        }
        self.out.push(b'"');
        self.out.extend_from_slice(name.as_bytes());
        self.out.extend_from_slice(b"\":");
    }

    fn field<T: Serialize + ?Sized>(
        &mut self,
        first: bool,
        name: &str,
        value: &T,
    ) -> Result<(), serde_json::Error> {
        self.key(first, name);
        serde_json::to_writer(&mut self.out, value)
    }

    fn views<T: Serialize>(
        &mut self,
        name: &str,
        list: &[Arc<View<T>>],
    ) -> Result<(), serde_json::Error> {
        self.key(false, name);
        self.out.push(b'[');
        for (i, view) in list.iter().enumerate() {
            if i > 0 {
                self.out.push(b',');
            }
            self.out.extend_from_slice(view.json()?);
        }
        self.out.push(b']');
        Ok(())
    }
}

// === views of the master's entities ===

fn agent_view(a: &Agent) -> AgentState {
    AgentState {
        id: a.id.clone(),
        hostname: a.info.hostname.clone(),
        address: a.info.address.clone(),
        connected: a.conn.is_some(),
        total: ResourcesView::new(a.total.clone()),
        used: ResourcesView::new(a.used.clone()),
        offered: ResourcesView::new(a.offered.clone()),
        attributes: a.info.attributes.clone(),
        tasks: a.tasks.len(),
        executors: a.executors.keys().map(|(_, e)| e.clone()).collect(),
        executor_frameworks: a.executors.keys().map(|(f, _)| f.clone()).collect(),
        registered_at: a.registered_at,
        unavailable: a.unavailable.clone(),
        deactivated: a.deactivated,
        drain_info: a.drain.as_ref().map(|d| DrainInfoView {
            state: if d.record.drained {
                "DRAINED"
            } else {
                "DRAINING"
            },
            config: DrainConfigView {
                max_grace_period: d.record.max_grace_period.map(|s| DurationView {
                    nanoseconds: (s * 1e9) as i64,
                }),
                mark_gone: d.record.mark_gone,
            },
        }),
    }
}

pub(crate) fn task_view(t: &Task) -> TaskView {
    TaskView {
        id: t.info.task_id.clone(),
        name: t.info.name.clone(),
        framework_id: t.framework_id.clone(),
        state: t.state,
        agent_id: t.agent_id.clone(),
        executor_id: t.executor_id.clone(),
        resources: ResourcesView::new(t.resources.clone()),
        finished_at: None,
        usage: t.usage.clone(),
        statuses: t.statuses.clone(),
        role: t.info.allocation_role.clone(),
    }
}

fn completed_view(c: &CompletedTask) -> TaskView {
    TaskView {
        id: c.task_id.clone(),
        name: c.name.clone(),
        framework_id: c.framework_id.clone(),
        state: c.state,
        agent_id: c.agent_id.clone(),
        executor_id: c.executor_id.clone(),
        resources: ResourcesView::new(c.resources.clone()),
        finished_at: Some(c.finished_at),
        usage: None,
        statuses: c.statuses.clone(),
        role: None,
    }
}

fn offer_view(o: &OfferEntry) -> OfferState {
    OfferState {
        id: o.offer.id.clone(),
        framework_id: o.offer.framework_id.clone(),
        agent_id: o.offer.agent_id.clone(),
        resources: ResourcesView::new(o.offer.resources.clone()),
    }
}

fn framework_meta(f: &Framework) -> FrameworkMeta {
    FrameworkMeta {
        id: f.id.clone(),
        name: f.info.name.clone(),
        roles: f.roles(),
        connected: f.conn.is_some(),
        suppressed: f.suppressed,
        recovered: f.recovered,
        failover_timeout: f.info.failover_timeout,
        offers: f.offers.len(),
        registered_at: f.registered_at,
        info: Arc::new(f.info.clone()),
    }
}

// === impl Master: snapshot ===

impl Master {
    /// The views of what changed since the last delta (or since
    /// [`Master::mark_published`]), and forgets those changes. Runs on the
    /// state task: its cost is proportional to the change, plus a few
    /// allocator reads per framework.
    pub(crate) fn state_delta(&mut self) -> StateDelta {
        let agents = self
            .agents
            .take_changes()
            .into_keys()
            .map(|id| {
                let view = self.agents.get(&id).map(|a| View::shared(agent_view(a)));
                (id, view)
            })
            .collect();
        let offers = self
            .offers
            .take_changes()
            .into_keys()
            .map(|id| {
                let view = self.offers.get(&id).map(|o| View::shared(offer_view(o)));
                (id, view)
            })
            .collect();
        let mut changed = self.frameworks.take_changes();
        // A task is only reached through its framework, which that marks;
        // look at the tasks themselves too rather than rely on it.
        for (fid, fw) in self.frameworks.iter() {
            if fw.tasks.has_changes() && !changed.contains_key(fid) {
                changed.insert(fid.clone(), Change::Modified);
            }
        }
        let mut frameworks = Vec::with_capacity(changed.len());
        for (fid, change) in changed {
            let Some(fw) = self.frameworks.untracked_get_mut(&fid) else {
                frameworks.push(FrameworkDelta::Removed(fid));
                continue;
            };
            let meta = framework_meta(fw);
            frameworks.push(match change {
                Change::Replaced => {
                    fw.tasks.clear_changes();
                    FrameworkDelta::Replaced {
                        meta,
                        tasks: fw
                            .tasks
                            .values()
                            .map(|t| View::shared(task_view(t)))
                            .collect(),
                    }
                }
                Change::Modified => FrameworkDelta::Changed {
                    meta,
                    tasks: fw
                        .tasks
                        .take_changes()
                        .into_keys()
                        .map(|id| {
                            let view = fw.tasks.get(&id).map(|t| View::shared(task_view(t)));
                            (id, view)
                        })
                        .collect(),
                },
            });
        }
        let fresh = usize::try_from(self.completed_total - self.completed_published)
            .unwrap_or(usize::MAX)
            .min(self.completed.len());
        let completed = self
            .completed
            .iter()
            .skip(self.completed.len() - fresh)
            .map(|c| View::shared(completed_view(c)))
            .collect();
        self.completed_published = self.completed_total;
        let fresh =
            usize::try_from(self.completed_frameworks_total - self.completed_frameworks_published)
                .unwrap_or(usize::MAX)
                .min(self.completed_frameworks.len());
        let completed_frameworks = self
            .completed_frameworks
            .iter()
            .skip(self.completed_frameworks.len() - fresh)
            .map(|f| Arc::new(f.clone()))
            .collect();
        self.completed_frameworks_published = self.completed_frameworks_total;
        self.delta(
            false,
            agents,
            frameworks,
            offers,
            completed,
            completed_frameworks,
        )
    }

    /// Views of everything, for a builder that starts empty. Changes stay
    /// recorded: call [`Master::mark_published`] if the delta is published.
    pub(crate) fn full_state_delta(&self) -> StateDelta {
        let agents = self
            .agents
            .values()
            .map(|a| (a.id.clone(), Some(View::shared(agent_view(a)))))
            .collect();
        let offers = self
            .offers
            .values()
            .map(|o| (o.offer.id.clone(), Some(View::shared(offer_view(o)))))
            .collect();
        let frameworks = self
            .frameworks
            .values()
            .map(|f| FrameworkDelta::Replaced {
                meta: framework_meta(f),
                tasks: f
                    .tasks
                    .values()
                    .map(|t| View::shared(task_view(t)))
                    .collect(),
            })
            .collect();
        let completed = self
            .completed
            .iter()
            .map(|c| View::shared(completed_view(c)))
            .collect();
        let completed_frameworks = self
            .completed_frameworks
            .iter()
            .map(|f| Arc::new(f.clone()))
            .collect();
        self.delta(
            true,
            agents,
            frameworks,
            offers,
            completed,
            completed_frameworks,
        )
    }

    /// Forgets the recorded changes: everything up to now is published.
    pub(crate) fn mark_published(&mut self) {
        self.agents.take_changes();
        self.offers.take_changes();
        self.frameworks.take_changes();
        for fw in self.frameworks.untracked_values_mut() {
            fw.tasks.clear_changes();
        }
        self.completed_published = self.completed_total;
        self.completed_frameworks_published = self.completed_frameworks_total;
    }

    /// A complete snapshot, built here and now.
    #[cfg(test)]
    pub(crate) fn snapshot(&self) -> StateSnapshot {
        let mut builder = StateBuilder::default();
        builder.apply(self.full_state_delta());
        builder.build()
    }

    fn delta(
        &self,
        full: bool,
        agents: Vec<(AgentId, Option<Arc<View<AgentState>>>)>,
        frameworks: Vec<FrameworkDelta>,
        offers: Vec<(OfferId, Option<Arc<View<OfferState>>>)>,
        completed: Vec<Arc<View<TaskView>>>,
        completed_frameworks: Vec<Arc<CompletedFramework>>,
    ) -> StateDelta {
        let mut shares =
            HashMap::with_capacity_and_hasher(self.frameworks.len(), Default::default());
        let mut members: BTreeMap<String, BTreeSet<FrameworkId>> = BTreeMap::new();
        for name in self
            .config
            .role_weights
            .keys()
            .chain(self.config.role_quotas.keys())
            .chain(self.config.role_limits.keys())
        {
            members.entry(name.clone()).or_default();
        }
        for f in self.frameworks.values() {
            let roles = f.roles();
            let of_framework = roles
                .iter()
                .map(|r| (r.clone(), self.allocator.framework_share(&f.id, r)))
                .collect();
            shares.insert(f.id.clone(), of_framework);
            for r in roles {
                members.entry(r).or_default().insert(f.id.clone());
            }
        }
        let roles = members
            .into_iter()
            .map(|(name, frameworks)| RoleState {
                weight: self.config.role_weights.get(&name).copied().unwrap_or(1.0),
                weight_set: self.config.role_weights.contains_key(&name),
                share: self.allocator.role_share(&name),
                quota: self
                    .config
                    .role_quotas
                    .get(&name)
                    .map(|q| ResourcesView::new(q.clone())),
                limits: self.config.role_limits.get(&name).cloned(),
                name,
                frameworks: frameworks.into_iter().collect(),
            })
            .collect();
        StateDelta {
            full,
            master: self.info.clone(),
            started_at: self.metrics.started_at,
            generated_at: agora_proto::now_timestamp(),
            agents,
            frameworks,
            offers,
            shares,
            roles,
            completed,
            max_completed: self.config.max_completed_tasks,
            completed_frameworks,
            max_completed_frameworks: self.config.max_completed_frameworks,
            removed_agents: self.removed_agents.len(),
        }
    }
}

// === impl StateBuilder ===

impl StateBuilder {
    /// Brings the copy to the state `delta` was taken from.
    pub(crate) fn apply(&mut self, delta: StateDelta) {
        if delta.full {
            *self = StateBuilder::default();
        }
        self.master = Some(delta.master);
        self.started_at = delta.started_at;
        self.generated_at = delta.generated_at;
        if !delta.agents.is_empty() {
            self.agent_list = None;
        }
        for (id, view) in delta.agents {
            match view {
                Some(v) => self.agents.insert(id, v),
                None => self.agents.remove(&id),
            };
        }
        if !delta.offers.is_empty() {
            self.offer_list = None;
        }
        for (id, view) in delta.offers {
            match view {
                Some(v) => self.offers.insert(id, v),
                None => self.offers.remove(&id),
            };
        }
        for change in delta.frameworks {
            match change {
                FrameworkDelta::Removed(id) => {
                    self.frameworks.remove(&id);
                }
                FrameworkDelta::Replaced { meta, tasks } => {
                    let mut entry = FrameworkEntry::new(meta.clone());
                    for t in tasks {
                        entry.put(t.id.clone(), Some(t));
                    }
                    self.frameworks.insert(meta.id, entry);
                }
                FrameworkDelta::Changed { meta, tasks } => {
                    let entry = self
                        .frameworks
                        .entry(meta.id.clone())
                        .or_insert_with(|| FrameworkEntry::new(meta.clone()));
                    entry.meta = meta;
                    for (id, view) in tasks {
                        entry.put(id, view);
                    }
                }
            }
        }
        self.shares = delta.shares;
        self.roles = delta.roles;
        self.completed.extend(delta.completed);
        while self.completed.len() > delta.max_completed {
            self.completed.pop_front();
        }
        self.completed_frameworks.extend(delta.completed_frameworks);
        while self.completed_frameworks.len() > delta.max_completed_frameworks {
            self.completed_frameworks.pop_front();
        }
        self.removed_agents = delta.removed_agents;
    }

    /// The snapshot of the state last applied. Lists that did not change
    /// since the previous call are shared with it.
    pub(crate) fn build(&mut self) -> StateSnapshot {
        let (agents, mut summary) = self
            .agent_list
            .get_or_insert_with(|| {
                let list: Vec<_> = self.agents.values().cloned().collect();
                let summary = agent_summary(&list);
                (Arc::new(list), summary)
            })
            .clone();
        let (offers, offered) = self.offer_list.get_or_insert_with(|| {
            let list: Vec<_> = self.offers.values().cloned().collect();
            let mut offered: HashMap<FrameworkId, Resources> = HashMap::default();
            for o in &list {
                *offered.entry(o.framework_id.clone()).or_default() += o.resources.list();
            }
            (Arc::new(list), offered)
        });
        let mut frameworks = Vec::with_capacity(self.frameworks.len());
        for entry in self.frameworks.values_mut() {
            let list = task_list(&entry.tasks, &mut entry.buckets, &mut entry.list);
            for (state, n) in &list.by_state {
                *summary.tasks_by_state.entry(*state).or_default() += n;
            }
            summary.tasks_active += list.tasks.len();
            let m = &entry.meta;
            summary.frameworks += 1;
            summary.frameworks_connected += usize::from(m.connected);
            frameworks.push(FrameworkState {
                id: m.id.clone(),
                name: m.name.clone(),
                principal: m.info.principal.clone(),
                roles: m.roles.clone(),
                connected: m.connected,
                suppressed: m.suppressed,
                recovered: m.recovered,
                failover_timeout: m.failover_timeout,
                offers: m.offers,
                used: ResourcesView::new(list.used.clone()),
                offered: ResourcesView::new(offered.get(&m.id).cloned().unwrap_or_default()),
                shares: self.shares.get(&m.id).cloned().unwrap_or_default(),
                tasks: list.tasks.clone(),
                registered_at: m.registered_at,
                info: m.info.clone(),
            });
        }
        summary.offers_outstanding = offers.len();
        for t in &self.completed {
            *summary.completed_by_state.entry(t.state).or_default() += 1;
        }
        StateSnapshot {
            master: self.master.clone().unwrap_or_else(|| MasterInfo {
                id: String::new(),
                address: String::new(),
                version: agora_proto::VERSION.to_string(),
            }),
            started_at: self.started_at,
            generated_at: self.generated_at,
            summary,
            agents,
            frameworks,
            roles: self.roles.clone(),
            offers: offers.clone(),
            completed_tasks: Arc::new(self.completed.iter().cloned().collect()),
            completed_frameworks: Arc::new(self.completed_frameworks.iter().cloned().collect()),
            removed_agents: self.removed_agents,
            encoded: OnceLock::new(),
        }
    }
}

/// The agents' part of the summary: counts and resources of connected agents.
fn agent_summary(agents: &[Arc<View<AgentState>>]) -> Summary {
    let mut s = Summary::default();
    for a in agents {
        if !a.connected {
            s.agents_disconnected += 1;
            continue;
        }
        let (total, used, offered) = (a.total.list(), a.used.list(), a.offered.list());
        s.agents_connected += 1;
        s.cpus_total += total.cpus();
        s.cpus_used += used.cpus();
        s.cpus_offered += offered.cpus();
        s.mem_total += total.mem();
        s.mem_used += used.mem();
        s.mem_offered += offered.mem();
        s.disk_total += total.scalar("disk");
        s.disk_used += used.scalar("disk");
        s.disk_offered += offered.scalar("disk");
    }
    s
}

// === impl FrameworkEntry ===

impl FrameworkEntry {
    fn new(meta: FrameworkMeta) -> Self {
        FrameworkEntry {
            meta,
            tasks: BTreeMap::new(),
            buckets: Vec::new(),
            list: None,
        }
    }

    /// Sets (`Some`) or removes (`None`) the view of task `id`.
    fn put(&mut self, id: TaskId, view: Option<Arc<View<TaskView>>>) {
        // The buckets (over 100 KiB) exist while the framework has tasks:
        // a framework without any (a thousand disconnected ones, say)
        // costs none.
        if self.buckets.is_empty() {
            if view.is_none() {
                return;
            }
            self.buckets = std::iter::repeat_with(Bucket::default)
                .take(TASK_BUCKETS as usize)
                .collect();
        }
        let bucket = &mut self.buckets[bucket_of(&id)];
        bucket.totals = None;
        self.list = None;
        match view {
            Some(v) => {
                bucket.tasks.insert(id.clone(), v.clone());
                self.tasks.insert(id, v);
            }
            None => {
                bucket.tasks.remove(&id);
                self.tasks.remove(&id);
                if self.tasks.is_empty() {
                    self.buckets = Vec::new();
                }
            }
        }
    }
}

/// The sorted task list of a framework and its totals, rebuilt if stale
/// (from the fields of a [`FrameworkEntry`]).
fn task_list<'a>(
    tasks: &BTreeMap<TaskId, Arc<View<TaskView>>>,
    buckets: &mut [Bucket],
    list: &'a mut Option<TaskList>,
) -> &'a TaskList {
    list.get_or_insert_with(|| {
        let mut totals = TaskTotals::default();
        for bucket in buckets.iter_mut() {
            let of_bucket = bucket.totals.get_or_insert_with(|| {
                let mut t = TaskTotals::default();
                for view in bucket.tasks.values() {
                    t.count(view);
                }
                t
            });
            totals.used += &of_bucket.used;
            for (state, n) in &of_bucket.by_state {
                *totals.by_state.entry(*state).or_default() += n;
            }
        }
        TaskList {
            tasks: Arc::new(tasks.values().cloned().collect()),
            used: totals.used,
            by_state: totals.by_state,
        }
    })
}

impl TaskTotals {
    fn count(&mut self, task: &TaskView) {
        *self.by_state.entry(task.state).or_default() += 1;
        if !task.state.is_terminal() {
            self.used += task.resources.list();
        }
    }
}

/// The bucket of a task id: a fixed hash, so the same on every run.
fn bucket_of(id: &TaskId) -> usize {
    use std::hash::{Hash, Hasher};
    let mut hasher = std::hash::DefaultHasher::new();
    id.hash(&mut hasher);
    (hasher.finish() % TASK_BUCKETS) as usize
}

// === impl Publisher ===

impl Publisher {
    /// Starts the builder thread: it applies each delta to `builder` and
    /// publishes the snapshot on `snapshots`. It ends when the publisher
    /// is dropped.
    pub(crate) fn spawn(
        mut builder: StateBuilder,
        snapshots: watch::Sender<Arc<StateSnapshot>>,
    ) -> std::io::Result<Self> {
        let (tx, mut rx) = mpsc::channel::<StateDelta>(DELTA_QUEUE);
        #[cfg(feature = "etcd")]
        let published = snapshots.subscribe();
        std::thread::Builder::new()
            .name("agora-state".into())
            .spawn(move || {
                while let Some(delta) = rx.blocking_recv() {
                    builder.apply(delta);
                    // Deltas that queued meanwhile: publish once for all.
                    while let Ok(delta) = rx.try_recv() {
                        builder.apply(delta);
                    }
                    snapshots.send_replace(Arc::new(builder.build()));
                }
            })?;
        Ok(Publisher {
            tx,
            builder_gone: false,
            #[cfg(feature = "etcd")]
            published,
        })
    }

    /// Hands `delta()` to the builder, unless it is behind (then nothing
    /// is taken: the changes stay recorded for the next try). True if
    /// handed over.
    pub(crate) fn try_publish(&mut self, delta: impl FnOnce() -> StateDelta) -> bool {
        match self.tx.try_reserve() {
            Ok(permit) => {
                permit.send(delta());
                true
            }
            Err(mpsc::error::TrySendError::Full(())) => false,
            Err(mpsc::error::TrySendError::Closed(())) => {
                if !self.builder_gone {
                    self.builder_gone = true;
                    tracing::error!("the /state builder thread ended; /state is no longer updated");
                }
                false
            }
        }
    }

    /// Hands `delta` to the builder and waits until a snapshot that
    /// includes it is published (nothing else may be in flight).
    #[cfg(feature = "etcd")]
    pub(crate) async fn publish(&mut self, delta: StateDelta) {
        self.published.mark_unchanged();
        // The builder thread only stops once this publisher is gone.
        if self.tx.send(delta).await.is_ok() {
            let _ = self.published.changed().await;
        }
    }
}

// === impl StateSnapshot ===

impl StateSnapshot {
    /// The JSON text of the snapshot (encoded once, then shared).
    pub(crate) fn json(&self) -> Result<Bytes, serde_json::Error> {
        if let Some(b) = self.encoded.get() {
            return Ok(b.clone());
        }
        let bytes = Bytes::from(self.encode()?);
        Ok(self.encoded.get_or_init(|| bytes).clone())
    }

    /// The text `serde_json::to_vec(self)` gives, assembled from the
    /// views' cached texts: only views new since the previous snapshot
    /// are encoded.
    fn encode(&self) -> Result<Vec<u8>, serde_json::Error> {
        let tasks: usize = self.frameworks.iter().map(|f| f.tasks.len()).sum();
        let mut w = JsonWriter {
            out: Vec::with_capacity(4096 + 500 * self.agents.len() + 300 * tasks),
        };
        w.out.push(b'{');
        w.field(true, "master", &self.master)?;
        w.field(false, "started_at", &self.started_at)?;
        w.field(false, "generated_at", &self.generated_at)?;
        w.field(false, "summary", &self.summary)?;
        w.views("agents", &self.agents)?;
        w.key(false, "frameworks");
        w.out.push(b'[');
        for (i, f) in self.frameworks.iter().enumerate() {
            if i > 0 {
                w.out.push(b',');
            }
            w.out.push(b'{');
            w.field(true, "id", &f.id)?;
            w.field(false, "name", &f.name)?;
            w.field(false, "principal", &f.principal)?;
            w.field(false, "roles", &f.roles)?;
            w.field(false, "connected", &f.connected)?;
            w.field(false, "suppressed", &f.suppressed)?;
            w.field(false, "recovered", &f.recovered)?;
            w.field(false, "failover_timeout", &f.failover_timeout)?;
            w.field(false, "offers", &f.offers)?;
            w.field(false, "used", &f.used)?;
            w.field(false, "offered", &f.offered)?;
            w.field(false, "shares", &f.shares)?;
            w.views("tasks", &f.tasks)?;
            w.field(false, "registered_at", &f.registered_at)?;
            w.out.push(b'}');
        }
        w.out.push(b']');
        w.field(false, "roles", &self.roles)?;
        w.views("offers", &self.offers)?;
        w.views("completed_tasks", &self.completed_tasks)?;
        w.field(false, "removed_agents", &self.removed_agents)?;
        w.out.push(b'}');
        Ok(w.out)
    }

    /// The snapshot as `principal` may see it under `acls`
    /// (`view_frameworks`, `view_tasks`, by the user a framework runs
    /// as): `None` when it sees everything. A framework it may not view is
    /// left out with its offers, completed tasks, custom executors (in
    /// the agents' lists) and place in its roles' lists; one whose tasks
    /// it may not view is listed with none. The summary counts what is
    /// left (agents' resources stay whole: they are the cluster's).
    pub(crate) fn viewed_by(
        &self,
        acls: &crate::acls::Acls,
        principal: Option<&str>,
    ) -> Option<StateSnapshot> {
        use crate::acls::Action;
        if !acls.restricts(Action::ViewFrameworks) && !acls.restricts(Action::ViewTasks) {
            return None;
        }
        let mut hidden = HashSet::new();
        let mut tasks_hidden = HashSet::new();
        let mut frameworks = Vec::with_capacity(self.frameworks.len());
        for f in &self.frameworks {
            let user = Some(f.info.user.as_str());
            if !acls.allows(Action::ViewFrameworks, principal, user) {
                hidden.insert(f.id.clone());
                continue;
            }
            let mut f = f.clone();
            if !acls.allows(Action::ViewTasks, principal, user) {
                tasks_hidden.insert(f.id.clone());
                f.tasks = Arc::default();
            }
            frameworks.push(f);
        }
        let offers: Vec<_> = self
            .offers
            .iter()
            .filter(|o| !hidden.contains(&o.framework_id))
            .cloned()
            .collect();
        let completed_tasks: Vec<_> = self
            .completed_tasks
            .iter()
            .filter(|t| {
                !hidden.contains(&t.framework_id) && !tasks_hidden.contains(&t.framework_id)
            })
            .cloned()
            .collect();
        let mut summary = self.summary.clone();
        summary.frameworks = frameworks.len();
        summary.frameworks_connected = frameworks.iter().filter(|f| f.connected).count();
        summary.tasks_by_state.clear();
        summary.tasks_active = 0;
        for t in frameworks.iter().flat_map(|f| f.tasks.iter()) {
            *summary.tasks_by_state.entry(t.state).or_default() += 1;
            summary.tasks_active += 1;
        }
        summary.completed_by_state.clear();
        for t in &completed_tasks {
            *summary.completed_by_state.entry(t.state).or_default() += 1;
        }
        summary.offers_outstanding = offers.len();
        let agents = if hidden.is_empty() {
            self.agents.clone()
        } else {
            let list = self.agents.iter().map(|a| {
                if !a.executor_frameworks.iter().any(|f| hidden.contains(f)) {
                    return a.clone();
                }
                let mut a = (***a).clone();
                let (executors, frameworks): (Vec<_>, Vec<_>) = a
                    .executors
                    .into_iter()
                    .zip(a.executor_frameworks)
                    .filter(|(_, f)| !hidden.contains(f))
                    .unzip();
                a.executors = executors;
                a.executor_frameworks = frameworks;
                View::shared(a)
            });
            Arc::new(list.collect())
        };
        let roles = self
            .roles
            .iter()
            .map(|r| {
                let mut r = r.clone();
                r.frameworks.retain(|f| !hidden.contains(f));
                r
            })
            .collect();
        Some(StateSnapshot {
            master: self.master.clone(),
            started_at: self.started_at,
            generated_at: self.generated_at,
            summary,
            agents,
            frameworks,
            roles,
            offers: Arc::new(offers),
            completed_tasks: Arc::new(completed_tasks),
            completed_frameworks: Arc::new(
                self.completed_frameworks
                    .iter()
                    .filter(|f| {
                        acls.allows(
                            Action::ViewFrameworks,
                            principal,
                            Some(f.info.user.as_str()),
                        )
                    })
                    .cloned()
                    .collect(),
            ),
            removed_agents: self.removed_agents,
            encoded: OnceLock::new(),
        })
    }

    /// Every task the snapshot knows: active ones, then completed ones.
    pub(crate) fn all_tasks(&self) -> impl Iterator<Item = &TaskView> {
        self.frameworks
            .iter()
            .flat_map(|f| f.tasks.iter())
            .chain(self.completed_tasks.iter())
            .map(|t| &t.value)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn task(i: usize, state: TaskState) -> Arc<View<TaskView>> {
        let resources = format!(
            "cpus:{}.{:03};mem:{};ports:[{}-{}]",
            i % 3,
            (i * 37) % 1000,
            32 + i % 7,
            31000 + i % 50,
            31000 + i % 50 + i % 3
        );
        View::shared(TaskView {
            id: TaskId::new(format!("t{i}")),
            name: String::new(),
            framework_id: FrameworkId::new("f"),
            state,
            agent_id: AgentId::new("a"),
            executor_id: ExecutorId::new("e"),
            resources: ResourcesView::new(Resources::parse(&resources).unwrap()),
            finished_at: None,
            usage: None,
            statuses: Vec::new(),
            role: None,
        })
    }

    #[test]
    fn bucketed_totals_equal_a_plain_sum() {
        let meta = FrameworkMeta {
            id: FrameworkId::new("f"),
            name: String::new(),
            roles: vec![],
            connected: true,
            suppressed: false,
            recovered: false,
            failover_timeout: 0.0,
            offers: 0,
            registered_at: 0.0,
            info: Arc::new(FrameworkInfo {
                user: String::new(),
                name: "f".into(),
                id: None,
                failover_timeout: 0.0,
                checkpoint: false,
                roles: vec![],
                hostname: String::new(),
                principal: None,
                webui_url: None,
            }),
        };
        let mut entry = FrameworkEntry::new(meta);
        for i in 0..3000 {
            let state = if i % 11 == 0 {
                TaskState::Finished
            } else {
                TaskState::Running
            };
            entry.put(TaskId::new(format!("t{i}")), Some(task(i, state)));
        }
        for round in 0..3 {
            let list = task_list(&entry.tasks, &mut entry.buckets, &mut entry.list);
            let mut plain = TaskTotals::default();
            for t in entry.tasks.values() {
                plain.count(t);
            }
            assert_eq!(list.used, plain.used, "round {round}");
            assert_eq!(list.used.to_string(), plain.used.to_string());
            assert_eq!(list.by_state, plain.by_state);
            assert_eq!(list.tasks.len(), entry.tasks.len());
            // Change a few: states, removals, new tasks.
            for i in (round..3000).step_by(97) {
                entry.put(TaskId::new(format!("t{i}")), None);
                let j = 5000 * (round + 1) + i;
                entry.put(
                    TaskId::new(format!("t{j}")),
                    Some(task(j, TaskState::Staging)),
                );
            }
        }
    }

    #[test]
    fn resources_serialize_as_text_and_list() {
        let r = Resources::parse("cpus:1;mem:128").unwrap();
        let json = serde_json::to_value(ResourcesView::new(r.clone())).unwrap();
        assert_eq!(json["text"], r.to_string());
        assert_eq!(json["list"], serde_json::to_value(&r).unwrap());
        assert_eq!(json.as_object().unwrap().len(), 2);
    }
}
