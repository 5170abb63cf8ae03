//! The invariants. The books are checked after every step of the master;
//! each status update is checked as its scheduler gets it; what must hold
//! in the end (every task ended, nothing acknowledged lost, every RUN_TASK
//! answered, the probes finished) is checked once the cluster has had its
//! time after the faults stopped.

use std::collections::{BTreeMap, BTreeSet};

use agora_master::sim::{SimMaster, TaskBooks};
use agora_proto::{
    AgentId, FrameworkId, Reason, Resources, Source, TaskId, TaskInfo, TaskState, TaskStatus,
};

use crate::framework::FwNode;
use crate::world::{Time, World};

/// The names of the invariants.
/// How long a task may take from its launch to its end once faults have
/// stopped: it runs up to 20 s, is killed 30 s after it overran, and a kill
/// an executor ignores ends with its executor's shutdown.
const TASK_BOUND: Time = 120 * crate::world::SEC;

/// How long a framework with tasks waiting may go without launching one.
const QUEUE_STALL: Time = 120 * crate::world::SEC;

pub const BOOKS: &str = "per agent, allocated + offered + free = total";
pub const OFFERS_DISJOINT: &str = "the same resources are never in two outstanding offers";
pub const ONE_TERMINAL: &str = "every launched task reaches exactly one terminal state";
pub const IN_ORDER: &str = "updates arrive in order per task";
pub const NOTHING_LOST: &str = "no update acknowledged to an executor is lost";
pub const NO_RETURN: &str = "no task comes back after a terminal state";
pub const ONCE: &str = "the scheduler SDK delivers each (task, uuid) once, and nothing without a uuid after the own terminal update of a task it launched, to its Scheduler";
pub const EXECUTOR_SAYS: &str = "a task's terminal state is the one its executor reported";
pub const RUN_TASK_ANSWERED: &str = "every RUN_TASK gets an update";
pub const PROGRESS: &str = "the cluster makes progress once faults stop";
pub const BOUNDED: &str = "the allocator's interned names stay bounded";
pub const NOT_HELD: &str = "no task is launched on a draining or deactivated agent";
pub const STALE_REPORT: &str =
    "a report of one launch of a task id is never applied to another launch of it";
pub const FRAMES_FIT: &str = "no frame exceeds the frame cap";
pub const STOP_DELIVERS: &str =
    "an executor stopped while its agent is away delivers its terminal updates before it exits";
pub const LOG_PREFIX: &str =
    "an agent recovers its log up to the first damaged record, nothing after";
pub const IDENTITY: &str = "no action on a framework or agent by a principal other than its own";

/// One launch of a task id by framework `f`: a framework may launch an id
/// again once the task of that id has ended (Mesos allows it), and each
/// launch is a task of its own. Launches of an id are numbered from 1.
pub(crate) type LaunchKey = (usize, TaskId, u32);

/// What a scheduler has heard of one launch of its tasks.
#[derive(Debug, Default)]
struct Heard {
    launched_at: Option<Time>,
    probe: bool,
    /// The agent it was launched on.
    agent: Option<AgentId>,
    uuids: BTreeSet<String>,
    updates: Vec<(TaskState, Source, Option<Reason>, Time)>,
    rank: u8,
    terminal: Option<(TaskState, Source, Option<Reason>)>,
    terminal_uuid: Option<String>,
}

/// The checker's records.
#[derive(Default)]
pub(crate) struct Checker {
    /// The master took a step since the books were last checked.
    pub master_stepped: bool,
    /// The principal each framework and agent id was first bound to.
    framework_principals: BTreeMap<FrameworkId, Option<String>>,
    agent_principals: BTreeMap<AgentId, Option<String>>,
    ids: BTreeMap<FrameworkId, usize>,
    heard: BTreeMap<LaunchKey, Heard>,
    /// The launch of each task id its framework made last: what the
    /// scheduler takes an update with that id to be about.
    current: BTreeMap<(usize, TaskId), u32>,
    /// Every reliable update as it was created (by an executor, or by an
    /// agent for a task it ends itself): its uuid and the launch it is
    /// about.
    origin: BTreeMap<String, (TaskId, u32)>,
    /// Updates agents acknowledged to executors: uuid and state.
    acked: BTreeMap<(FrameworkId, TaskId, u32), Vec<(String, TaskState)>>,
    run_tasks: BTreeMap<(FrameworkId, TaskId, u32), Time>,
    /// Launches the master declared lost with their removed agent (whether
    /// or not the framework was connected to hear it).
    lost_with_agent: BTreeSet<LaunchKey>,
    /// Agents the master removed (from its registry writes).
    removed_agents: BTreeSet<AgentId>,
    refused: BTreeSet<usize>,
    /// The launch of each record the running master held after its last
    /// step (an update it makes as it drops the record, e.g. TASK_LOST
    /// with its agent, is about that launch).
    master_launch: BTreeMap<(FrameworkId, TaskId), u32>,
    /// Uuids of updates whose log records a damaged disk lost (at or
    /// after the damage): exempt from `NOTHING_LOST` and `EXECUTOR_SAYS`.
    lost_on_disk: BTreeSet<String>,
    next_task: u64,
}

// === impl Checker ===

impl Checker {
    pub(crate) fn next_task_number(&mut self) -> u64 {
        self.next_task += 1;
        self.next_task
    }

    pub(crate) fn launched_count(&self) -> usize {
        self.heard
            .values()
            .filter(|h| h.launched_at.is_some())
            .count()
    }

    pub(crate) fn framework_id(&mut self, f: usize, id: FrameworkId) {
        self.ids.insert(id, f);
    }

    /// The principals the master's books bind each framework and agent
    /// to: never another than the first (across master failovers too).
    pub(crate) fn principals(
        &mut self,
        frameworks: &[(FrameworkId, Option<String>)],
        agents: &[(AgentId, Option<String>)],
    ) -> Result<(), (&'static str, String)> {
        fn same<K: Ord + Clone + std::fmt::Debug>(
            first: &mut BTreeMap<K, Option<String>>,
            now: &[(K, Option<String>)],
            what: &str,
        ) -> Result<(), (&'static str, String)> {
            for (id, principal) in now {
                let bound = first.entry(id.clone()).or_insert_with(|| principal.clone());
                if bound != principal {
                    return Err((
                        IDENTITY,
                        format!("{what} {id:?} was bound to {bound:?}, now to {principal:?}"),
                    ));
                }
            }
            Ok(())
        }
        same(&mut self.framework_principals, frameworks, "framework")?;
        same(&mut self.agent_principals, agents, "agent")
    }

    /// Framework `f` launched `task` (its launch `launch`) on `agent`.
    pub(crate) fn launched(
        &mut self,
        f: usize,
        task: &TaskId,
        launch: u32,
        agent: &AgentId,
        probe: bool,
        t: Time,
    ) {
        let h = self.heard.entry((f, task.clone(), launch)).or_default();
        h.launched_at = Some(t);
        h.probe = probe;
        h.agent = Some(agent.clone());
        self.current.insert((f, task.clone()), launch);
    }

    /// The launch framework `f` made last of `task` (0: none).
    pub(crate) fn current_launch(&self, f: usize, task: &TaskId) -> u32 {
        self.current.get(&(f, task.clone())).copied().unwrap_or(0)
    }

    /// A reliable update was created for launch `launch` of `task`.
    pub(crate) fn created(&mut self, uuid: &str, task: &TaskId, launch: u32) {
        self.origin
            .entry(uuid.to_string())
            .or_insert_with(|| (task.clone(), launch));
    }

    /// The launch a reliable update is about, if the simulation saw it
    /// created.
    pub(crate) fn origin(&self, uuid: &str) -> Option<u32> {
        self.origin.get(uuid).map(|(_, launch)| *launch)
    }

    /// The launch of the master's record of `task` after its last step.
    pub(crate) fn master_launch(&self, fid: &FrameworkId, task: &TaskId) -> Option<u32> {
        self.master_launch
            .get(&(fid.clone(), task.clone()))
            .copied()
    }

    /// The master's records after its last input: the launch each is
    /// about (an update it makes as it drops one is about that launch).
    pub(crate) fn master_records_now<'a>(
        &mut self,
        records: impl Iterator<Item = (&'a FrameworkId, &'a TaskInfo)>,
    ) {
        self.master_launch.clear();
        for (fid, info) in records {
            if let Some(launch) = crate::framework::launch_of(&info.labels) {
                self.master_launch
                    .insert((fid.clone(), info.task_id.clone()), launch);
            }
        }
    }

    /// A new master process: it holds no records yet.
    pub(crate) fn master_started(&mut self) {
        self.master_launch.clear();
    }

    /// The master removed agent `id` for good.
    pub(crate) fn agent_removed(&mut self, id: &AgentId) {
        self.removed_agents.insert(id.clone());
    }

    /// The master sent (or tried to send) `status`, about launch `launch`,
    /// to framework `f`.
    pub(crate) fn master_sent(&mut self, f: usize, status: &TaskStatus, launch: u32) {
        if status.reason == Some(Reason::ReasonAgentRemoved) {
            self.lost_with_agent
                .insert((f, status.task_id.clone(), launch));
        }
    }

    pub(crate) fn run_task_delivered(
        &mut self,
        fid: &FrameworkId,
        task: &TaskId,
        launch: u32,
        t: Time,
    ) {
        self.run_tasks
            .entry((fid.clone(), task.clone(), launch))
            .or_insert(t);
    }

    pub(crate) fn executor_acked(
        &mut self,
        fid: &FrameworkId,
        task: &TaskId,
        launch: u32,
        uuid: &str,
        state: TaskState,
    ) {
        let list = self
            .acked
            .entry((fid.clone(), task.clone(), launch))
            .or_default();
        if !list.iter().any(|(u, _)| u == uuid) {
            list.push((uuid.to_string(), state));
        }
    }

    pub(crate) fn agent_refused(&mut self, agent: usize) {
        self.refused.insert(agent);
    }

    /// An agent's disk lost the log records of these updates.
    pub(crate) fn lost_on_disk(&mut self, uuids: BTreeSet<String>) {
        self.lost_on_disk.extend(uuids);
    }

    /// A status update reached scheduler `f`. A reliable update is about
    /// the launch it was created for; one the master made itself (no
    /// uuid) about `tag`, the launch of the master's record of the id (or
    /// of the launch it refused) when it made it, else about the launch
    /// the scheduler made last: an answer from the master's list of
    /// completed tasks, or about a task it does not know, answers the
    /// scheduler's question about its latest launch (for a launch that
    /// never reached the master, with the state of the last task of that
    /// id it knew: Mesos promises no more).
    pub(crate) fn sched_update(
        &mut self,
        f: usize,
        status: &TaskStatus,
        tag: Option<u32>,
        stale_by_stamp: bool,
        t: Time,
    ) -> Result<(), (&'static str, String)> {
        let current = self.current_launch(f, &status.task_id);
        let launch = status
            .uuid
            .as_deref()
            .and_then(|u| self.origin(u))
            .or(tag)
            .unwrap_or(current);
        let h = self
            .heard
            .entry((f, status.task_id.clone(), launch))
            .or_default();
        if let Some(uuid) = &status.uuid {
            if !h.uuids.insert(uuid.clone()) {
                // Delivered at least once: a repeat.
                return Ok(());
            }
        }
        h.updates
            .push((status.state, status.source, status.reason, t));
        let what = || {
            format!(
                "task {} (launch {launch}) of framework {f}: {} ({:?}, {:?}) after {:?}",
                status.task_id,
                status.state.as_str(),
                status.source,
                status.reason,
                h.updates
                    .iter()
                    .map(|(s, src, r, _)| format!("{}/{src:?}/{r:?}", s.as_str()))
                    .collect::<Vec<_>>()
            )
        };
        // (A framework that tells the update's launch stamp for an
        // earlier launch's is not misled either.)
        if launch < current && status.uuid.is_some() && !stale_by_stamp {
            // A new reliable update of an earlier launch, once the
            // scheduler has launched the id again: it takes it for the
            // new task's. (An answer the master made without a uuid may
            // be older than the launch, as any reconciliation answer in
            // flight: best effort.)
            return Err((
                STALE_REPORT,
                format!(
                    "{}; it reached the scheduler after launch {current}",
                    what()
                ),
            ));
        }
        if let Some((terminal, _, _)) = h.terminal {
            // A damaged log lost the record of this end: its agent may
            // report the task again, running or ended otherwise.
            let end_lost = h
                .terminal_uuid
                .as_ref()
                .is_some_and(|u| self.lost_on_disk.contains(u));
            if status.state.is_terminal() {
                if status.state != terminal && !end_lost {
                    return Err((ONE_TERMINAL, what()));
                }
                return Ok(());
            }
            if status.state == TaskState::Unknown || end_lost {
                // Forgotten since (a reconciliation answer).
                return Ok(());
            }
            return Err((NO_RETURN, what()));
        }
        if status.state.is_terminal() {
            h.terminal = Some((status.state, status.source, status.reason));
            h.terminal_uuid = status.uuid.clone();
            h.rank = u8::MAX;
            return Ok(());
        }
        let rank = rank(status.state);
        if rank < h.rank && status.state != TaskState::Unknown {
            return Err((IN_ORDER, what()));
        }
        h.rank = h.rank.max(rank);
        Ok(())
    }

    /// The master's records after a step: each applies only what belongs
    /// to its own launch.
    pub(crate) fn master_records(&self, tasks: &[TaskBooks]) -> Result<(), (&'static str, String)> {
        for t in tasks {
            let Some(launch) = crate::framework::launch_of(&t.labels) else {
                continue;
            };
            let Some(uuid) = &t.latest_uuid else {
                continue;
            };
            let Some((task, from)) = self.origin.get(uuid) else {
                continue;
            };
            if *from != launch || *task != t.task_id {
                return Err((
                    STALE_REPORT,
                    format!(
                        "the master applied update {} of task {task} (launch {from}) to its record of task {} (launch {launch}) on agent {}, now {}",
                        &uuid[..8.min(uuid.len())],
                        t.task_id,
                        t.agent_id,
                        t.state.as_str()
                    ),
                ));
            }
        }
        Ok(())
    }

    /// What must hold once the cluster has had its time.
    pub(crate) fn at_end(&self, fws: &[FwNode], now: Time) -> Result<(), (&'static str, String)> {
        // A framework with tasks waiting keeps launching: its queue is
        // served (a seed's workload may take longer than the liveness
        // bound on a small cluster; that is not a stall).
        for (f, fw) in fws.iter().enumerate() {
            if fw.queue.is_empty() {
                continue;
            }
            let last_launch = self
                .heard
                .iter()
                .filter(|((g, _, _), _)| *g == f)
                .filter_map(|(_, h)| h.launched_at)
                .max();
            if last_launch.is_none_or(|l| l + QUEUE_STALL < now) {
                return Err((
                    PROGRESS,
                    format!(
                        "framework {f} has {} tasks waiting and launched none in the last {} s",
                        fw.queue.len(),
                        QUEUE_STALL / crate::world::SEC
                    ),
                ));
            }
        }
        // Every launch the frameworks made ended (but those made too late
        // to: a task runs up to 20 s, a kill of one that overran takes its
        // grace periods), and the probes finished.
        for ((f, task, launch), h) in &self.heard {
            let Some(launched_at) = h.launched_at else {
                continue;
            };
            let late = !h.probe && launched_at + TASK_BOUND > now;
            let last = h.updates.last().map(|(s, _, _, _)| *s);
            match h.terminal {
                None if late => {}
                None if last == Some(TaskState::Unknown) && !h.probe => {}
                // A launch that never reached an agent (its RUN_TASK, or
                // the LAUNCH itself, was lost with a connection or a master
                // that failed over) after which the scheduler heard an end
                // of the id (an earlier launch's, reported late by an agent
                // whose log lost it): the scheduler took that end for this
                // launch's, as a Mesos framework must; nothing ran.
                None if !self
                    .run_tasks
                    .keys()
                    .any(|(_, t, l)| t == task && l == launch)
                    && self.heard.iter().any(|((g, t, _), other)| {
                        g == f
                            && t == task
                            && other
                                .updates
                                .iter()
                                .any(|(state, _, _, at)| state.is_terminal() && *at >= launched_at)
                    }) => {}
                None => {
                    return Err((
                        PROGRESS,
                        format!(
                            "task {task} (launch {launch}) of framework {f} has not ended: {:?}",
                            h.updates
                        ),
                    ))
                }
                Some((state, _, _)) if h.probe && state != TaskState::Finished => {
                    return Err((
                        PROGRESS,
                        format!(
                            "probe task {task} of framework {f} ended {}: {:?}",
                            state.as_str(),
                            h.updates
                        ),
                    ))
                }
                Some(_) => {}
            }
        }
        // Updates acknowledged to executors reached their schedulers, and
        // an executor's terminal state is its launch's.
        for ((fid, task, launch), acked) in &self.acked {
            let Some(f) = self.ids.get(fid) else {
                continue;
            };
            let key = (*f, task.clone(), *launch);
            let h = self.heard.get(&key);
            let removed = h
                .and_then(|h| h.terminal)
                .is_some_and(|(_, source, reason)| {
                    source == Source::SourceMaster && reason == Some(Reason::ReasonAgentRemoved)
                })
                || self.lost_with_agent.contains(&key)
                || h.and_then(|h| h.agent.as_ref())
                    .is_some_and(|a| self.removed_agents.contains(a));
            if removed {
                // Its agent was removed: its tasks are lost with it (the
                // framework may have heard it only from reconciliation).
                continue;
            }
            // Records a damaged log lost took their updates with them.
            let acked: Vec<&(String, TaskState)> = acked
                .iter()
                .filter(|(uuid, _)| !self.lost_on_disk.contains(uuid))
                .collect();
            for (uuid, state) in acked.iter().copied() {
                if !h.is_some_and(|h| h.uuids.contains(uuid)) {
                    return Err((
                        NOTHING_LOST,
                        format!(
                            "{} ({}) of task {task} (launch {launch}) of framework {f} was acknowledged to its executor but never reached the scheduler, which heard {:?}",
                            state.as_str(),
                            &uuid[..8],
                            h.map(|h| &h.updates)
                        ),
                    ));
                }
            }
            if let Some((_, terminal)) = acked.iter().find(|(_, s)| s.is_terminal()) {
                let got = h.and_then(|h| h.terminal).map(|(s, _, _)| s);
                if got != Some(*terminal) {
                    return Err((
                        EXECUTOR_SAYS,
                        format!(
                            "task {task} (launch {launch}) of framework {f}: its executor reported {} but the scheduler heard {:?}",
                            terminal.as_str(),
                            h.map(|h| &h.updates)
                        ),
                    ));
                }
            }
        }
        for (fid, task, launch) in self.run_tasks.keys() {
            let Some(f) = self.ids.get(fid) else {
                continue;
            };
            let answered = self
                .heard
                .get(&(*f, task.clone(), *launch))
                .is_some_and(|h| !h.updates.is_empty());
            if !answered {
                return Err((
                    RUN_TASK_ANSWERED,
                    format!(
                        "task {task} (launch {launch}) of framework {f} reached an agent and was never heard of"
                    ),
                ));
            }
        }
        Ok(())
    }
}

/// Where a non-terminal state stands in a task's life.
fn rank(state: TaskState) -> u8 {
    match state {
        TaskState::Staging => 0,
        TaskState::Starting => 1,
        TaskState::Running | TaskState::Unreachable | TaskState::Unknown => 2,
        TaskState::Killing => 3,
        _ => 4,
    }
}

// === impl World: checks ===

impl World {
    /// The invariants that hold after every step.
    pub(crate) fn check_step(&mut self) {
        if !std::mem::take(&mut self.check.master_stepped) {
            return;
        }
        let Some(master) = self.master.core.as_ref() else {
            return;
        };
        let tasks = master.tasks();
        if let Err((invariant, detail)) = books(master, &tasks) {
            return self.violated(invariant, detail);
        }
        if let Err((invariant, detail)) = self.check.master_records(&tasks) {
            return self.violated(invariant, detail);
        }
        let interned = master.allocator_interned();
        if !interned.within_bound() {
            return self.violated(BOUNDED, format!("{interned:?}"));
        }
        if let Err((invariant, detail)) = self.check_identity() {
            self.violated(invariant, detail);
        }
    }
}

/// The master's books: each agent's accounts add up, and outstanding
/// offers never overlap.
fn books(master: &SimMaster, tasks: &[TaskBooks]) -> Result<(), (&'static str, String)> {
    let offers = master.offers();
    for a in master.agents() {
        // Used is what its live tasks and custom executors take.
        let mut counted = Resources::new();
        for t in tasks
            .iter()
            .filter(|t| t.agent_id == a.id && !t.state.is_terminal())
        {
            counted += &t.resources;
        }
        for (_, _, r) in &a.executors {
            counted += r;
        }
        if !same(&counted, &a.used) {
            return Err((
                BOOKS,
                format!(
                    "agent {}: used {} but its live tasks and executors take {counted}: tasks {:?}, executors {:?}",
                    a.id,
                    a.used,
                    tasks
                        .iter()
                        .filter(|t| t.agent_id == a.id)
                        .map(|t| format!("{}:{}:{}", t.task_id, t.state.as_str(), t.resources))
                        .collect::<Vec<_>>(),
                    a.executors
                        .iter()
                        .map(|(_, e, r)| format!("{e}:{r}"))
                        .collect::<Vec<_>>()
                ),
            ));
        }
        let mut offered = Resources::new();
        let mut ranges = 0;
        for o in offers.iter().filter(|o| o.agent_id == a.id) {
            offered += &o.resources;
            ranges += o.resources.range_count("ports");
        }
        if !same(&offered, &a.offered) {
            return Err((
                BOOKS,
                format!(
                    "agent {}: its offers hold {offered} but it counts {} offered",
                    a.id, a.offered
                ),
            ));
        }
        let mut in_use = a.used.clone();
        in_use += &offered;
        if in_use.range_count("ports") != ranges + a.used.range_count("ports")
            || !a.total.contains(&in_use)
        {
            return Err((
                OFFERS_DISJOINT,
                format!(
                    "agent {}: total {}, used {}, executors {:?}, offers {:?}, tasks {:?}",
                    a.id,
                    a.total,
                    a.used,
                    a.executors
                        .iter()
                        .map(|(_, e, r)| format!("{e}:{r}"))
                        .collect::<Vec<_>>(),
                    offers
                        .iter()
                        .filter(|o| o.agent_id == a.id)
                        .map(|o| o.resources.to_string())
                        .collect::<Vec<_>>(),
                    tasks
                        .iter()
                        .filter(|t| t.agent_id == a.id)
                        .map(|t| format!("{}:{}:{}", t.task_id, t.state.as_str(), t.resources))
                        .collect::<Vec<_>>()
                ),
            ));
        }
        if let Some(acc) = &a.allocator {
            let mut allocated = Resources::new();
            for (_, r) in &acc.allocated {
                allocated += r;
            }
            let mut sum = acc.free.clone();
            sum += &allocated;
            if !same(&sum, &a.total) || !same(&allocated, &in_use) {
                return Err((
                    BOOKS,
                    format!(
                        "agent {}: total {}, free {} + allocated {} (used {} + offered {})",
                        a.id, a.total, acc.free, allocated, a.used, offered
                    ),
                ));
            }
        }
    }
    Ok(())
}

/// Equal resources (up to rounding).
fn same(a: &Resources, b: &Resources) -> bool {
    a.contains(b) && b.contains(a)
}
