//! Tasks: status updates from agents (recorded, forwarded, freed when
//! terminal), acknowledgements forwarded to agents, kill, reconciliation
//! and the bounded list of recently completed tasks.

use agora_proto::scheduler::{Event, ReconcileTask};
use agora_proto::{
    agent, AgentId, ExecutorId, FrameworkId, Reason, Resources, TaskId, TaskInfo, TaskState,
    TaskStatus,
};
use tokio::time::Instant;

use crate::master::{master_status, ConnId, Master};

/// A task the master tracks.
#[derive(Debug, Clone)]
pub(crate) struct Task {
    pub(crate) info: TaskInfo,
    pub(crate) framework_id: FrameworkId,
    pub(crate) agent_id: AgentId,
    pub(crate) executor_id: ExecutorId,
    pub(crate) state: TaskState,
    /// The task's own resources (its executor's are accounted on the agent).
    pub(crate) resources: Resources,
    pub(crate) latest_status: Option<TaskStatus>,
    /// The updates the task went through, as Mesos's `Task.statuses`
    /// (`/master/state`, `/tasks`): the first and the latest
    /// [`MAX_TASK_STATUSES`]` - 1`.
    pub(crate) statuses: Vec<StatusRecord>,
    /// The latest reliable update, until the scheduler acknowledges it.
    pub(crate) pending_update: Option<TaskStatus>,
    /// The uuid of the latest update the scheduler acknowledged: the
    /// agent's re-send of it that crossed the acknowledgement is
    /// acknowledged again, not forwarded.
    pub(crate) acknowledged_uuid: Option<String>,
    /// The state of the latest reliable update received for the task (and
    /// forwarded, or pending for the scheduler). `state` may run ahead of
    /// it when an agent's report says more than its update stream has
    /// delivered yet; reconciliation answers never do.
    pub(crate) update_state: Option<TaskState>,
    /// What its container uses, as its agent last reported (agents with
    /// `--isolation cgroups`).
    pub(crate) usage: Option<agora_proto::agent::ContainerUsage>,
}

/// How many status updates of a task the master keeps for `/master/state`
/// and `/tasks` (Mesos keeps every one; a health-checked task sends one
/// per change of health, without end): the first, which orders `/tasks`,
/// and the latest ones.
pub(crate) const MAX_TASK_STATUSES: usize = 8;

/// One status update of a task, as Mesos's endpoints show it: `state`,
/// `timestamp`, and `healthy` and `labels` when set. (Agora's status
/// updates carry no `container_status`.)
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct StatusRecord {
    pub(crate) state: TaskState,
    pub(crate) timestamp: f64,
    pub(crate) healthy: Option<bool>,
    pub(crate) labels: std::collections::BTreeMap<String, String>,
}

/// A task that reached a terminal state and was forgotten.
#[derive(Debug, Clone)]
pub(crate) struct CompletedTask {
    pub(crate) framework_id: FrameworkId,
    pub(crate) task_id: TaskId,
    pub(crate) name: String,
    pub(crate) agent_id: AgentId,
    pub(crate) executor_id: ExecutorId,
    pub(crate) state: TaskState,
    pub(crate) resources: Resources,
    pub(crate) finished_at: f64,
    /// The uuid of the last reliable update the master took for it: a
    /// retry of that update arriving later (its acknowledgement to the
    /// agent was lost) is about this task, not about a later task with
    /// the same id.
    pub(crate) last_uuid: Option<String>,
    /// Its launch's stamp, when it had one.
    pub(crate) launch_stamp: Option<agora_proto::LaunchStamp>,
    /// Its status updates (see [`Task::statuses`]).
    pub(crate) statuses: Vec<StatusRecord>,
}

// === impl StatusRecord ===

impl StatusRecord {
    pub(crate) fn of(status: &TaskStatus) -> Self {
        StatusRecord {
            state: status.state,
            timestamp: status.timestamp,
            healthy: status.healthy,
            labels: status.labels.clone(),
        }
    }
}

/// Appends `status` to a bounded list of updates: the first is kept, and
/// the oldest after it makes room. An update already recorded (an agent's
/// re-registration reports the latest one again) is not added twice.
pub(crate) fn record_status(statuses: &mut Vec<StatusRecord>, status: &TaskStatus) {
    let record = StatusRecord::of(status);
    if statuses.last() == Some(&record) {
        return;
    }
    if statuses.len() >= MAX_TASK_STATUSES {
        statuses.remove(1);
    }
    statuses.push(record);
}

// === impl Task ===

impl Task {
    pub(crate) fn new(framework_id: FrameworkId, info: TaskInfo, state: TaskState) -> Self {
        let executor_id = executor_id_of(&info);
        Task {
            framework_id,
            agent_id: info.agent_id.clone(),
            executor_id,
            state,
            resources: info.resources.clone(),
            latest_status: None,
            statuses: Vec::new(),
            pending_update: None,
            acknowledged_uuid: None,
            update_state: None,
            usage: None,
            info,
        }
    }

    /// The reconciliation answer: the state the scheduler has been (or is
    /// being) told through reliable updates, so that the answer never
    /// overtakes the task's update stream. `None` when the only newer
    /// state known is a terminal one from an agent's report: its reliable
    /// update is on its way.
    fn reconciliation_status(&self) -> Option<TaskStatus> {
        let state = match self.update_state {
            Some(state) => state,
            None if self.state.is_terminal() => return None,
            None => self.state,
        };
        let mut status = master_status(
            self.info.task_id.clone(),
            state,
            Reason::ReasonReconciliation,
            "reconciliation",
            Some(self.agent_id.clone()),
        );
        if let Some(latest) = &self.latest_status {
            status.message = latest.message.clone().or(status.message);
            status.data = latest.data.clone();
        }
        status.executor_id = Some(self.executor_id.clone());
        Some(status)
    }

    /// Takes `status` as the task's latest update and records it.
    pub(crate) fn set_latest_status(&mut self, status: TaskStatus) {
        record_status(&mut self.statuses, &status);
        self.latest_status = Some(status);
    }
}

// === impl Master: tasks ===

impl Master {
    /// Refuses a task of a launch with `state` (TASK_DROPPED or
    /// TASK_ERROR): tells the framework, and remembers the task among the
    /// completed ones so that reconciling it later answers the same state
    /// (unless a live task has that id: the refusal was of a duplicate; a
    /// task of that id that ended is completed first).
    pub(crate) fn refuse_task(
        &mut self,
        fid: &FrameworkId,
        task: &TaskInfo,
        state: TaskState,
        reason: Reason,
        message: String,
    ) {
        self.metrics.tasks_rejected.inc();
        let status = master_status(
            task.task_id.clone(),
            state,
            reason,
            message,
            Some(task.agent_id.clone()),
        );
        let statuses = vec![StatusRecord::of(&status)];
        self.send_framework(fid, Event::Update { status });
        let existing = self
            .frameworks
            .get(fid)
            .and_then(|fw| fw.tasks.get(&task.task_id))
            .map(|t| t.state.is_terminal());
        if existing == Some(true) {
            // The id belongs to a task that ended: the refused launch
            // supersedes it, as an accepted one would (see
            // `Master::launch`), so that reconciling the id answers the
            // refusal, not the earlier task's end.
            if let Some(old) = self
                .frameworks
                .get_mut(fid)
                .and_then(|fw| fw.tasks.remove(&task.task_id))
            {
                if let Some(agent) = self.agents.get_mut(&old.agent_id) {
                    agent.tasks.remove(&(fid.clone(), task.task_id.clone()));
                }
                let state = old.state;
                self.complete_task(old, state);
            }
        }
        if existing != Some(false) {
            self.push_completed(CompletedTask {
                framework_id: fid.clone(),
                task_id: task.task_id.clone(),
                name: task.name.clone(),
                agent_id: task.agent_id.clone(),
                executor_id: executor_id_of(task),
                state,
                resources: task.resources.clone(),
                finished_at: agora_proto::now_timestamp(),
                last_uuid: None,
                launch_stamp: None,
                statuses,
            });
        }
    }

    /// Appends to the bounded completed list (counted for the next
    /// `/state` delta).
    fn push_completed(&mut self, task: CompletedTask) {
        self.completed_total += 1;
        if let Some(uuid) = &task.last_uuid {
            self.completed_uuids.insert(
                uuid.clone(),
                (task.framework_id.clone(), task.task_id.clone()),
            );
        }
        self.completed.push_back(task);
        while self.completed.len() > self.config.max_completed_tasks {
            if let Some(uuid) = self.completed.pop_front().and_then(|t| t.last_uuid) {
                self.completed_uuids.remove(&uuid);
            }
        }
    }

    /// Whether `uuid` is that of the last update of a completed task with
    /// this id (not of the task that has the id now).
    pub(crate) fn of_completed_task(
        &self,
        fid: &FrameworkId,
        task_id: &TaskId,
        uuid: &str,
    ) -> bool {
        self.completed_uuids
            .get(uuid)
            .is_some_and(|(f, t)| f == fid && t == task_id)
    }

    /// Moves a task to the bounded completed list.
    pub(crate) fn complete_task(&mut self, task: Task, state: TaskState) {
        let last_uuid = task
            .latest_status
            .as_ref()
            .and_then(|s| s.uuid.clone())
            .or_else(|| task.pending_update.as_ref().and_then(|s| s.uuid.clone()));
        let launch_stamp = task.info.launch_stamp;
        self.push_completed(CompletedTask {
            framework_id: task.framework_id,
            task_id: task.info.task_id,
            name: task.info.name,
            agent_id: task.agent_id,
            executor_id: task.executor_id,
            state,
            resources: task.resources,
            finished_at: agora_proto::now_timestamp(),
            last_uuid,
            launch_stamp,
            statuses: task.statuses,
        });
    }

    pub(crate) fn status_update(
        &mut self,
        now: Instant,
        conn: ConnId,
        aid: &AgentId,
        fid: FrameworkId,
        mut status: TaskStatus,
    ) {
        self.metrics.status_updates_received.inc();
        let Some(uuid) = status.uuid.clone() else {
            return self.agent_error(conn, "STATUS_UPDATE must carry a uuid");
        };
        // An update speaks for the agent that sent it, whatever it says.
        status.agent_id = Some(aid.clone());
        self.mark_drain_kill(aid, &fid, &mut status);
        if !self.frameworks.contains_key(&fid)
            && !self.removed_frameworks.contains(&fid)
            && self.agents_may_reregister(now)
        {
            // After a restart the master learns frameworks from agents'
            // reports and from schedulers re-subscribing; this one may be
            // on its way. Not acknowledged: the agent re-sends it.
            tracing::debug!(framework_id = %fid, task_id = %status.task_id, "update for a framework not yet re-subscribed; leaving it to the agent's retry");
            return;
        }
        let Some(fw) = self.frameworks.get_mut(&fid) else {
            // The framework is gone: acknowledge ourselves so the agent's
            // stream drains.
            tracing::debug!(framework_id = %fid, task_id = %status.task_id, "update for a removed framework; acknowledging it");
            return self.acknowledge_unforwarded(conn, fid, status.task_id, uuid);
        };
        if fw.tasks.contains_key(&status.task_id)
            && self.of_completed_task(&fid, &status.task_id, &uuid)
        {
            // A stale retry of the last update of an earlier task with this
            // id, completed here, from an agent whose acknowledgement was
            // lost: applying it would end the task that has the id now
            // (launched on the same agent, or elsewhere) and free its
            // resources while it runs. Acknowledged so the stream drains.
            tracing::warn!(agent_id = %aid, framework_id = %fid, task_id = %status.task_id, state = %status.state, "status update of an earlier task with this id; refused");
            self.metrics.reports_refused_update.inc();
            return self.acknowledge_unforwarded(conn, fid, status.task_id, uuid);
        }
        let Some(fw) = self.frameworks.get_mut(&fid) else {
            return;
        };
        if let Some(owner) = fw
            .tasks
            .get(&status.task_id)
            .map(|t| &t.agent_id)
            .filter(|owner| *owner != aid)
        {
            // A stale report of an earlier task with this id (its
            // acknowledgement was lost while the agent was away): applying it
            // would end the task that runs elsewhere and free its resources
            // twice. Acknowledged so the sender's stream drains.
            tracing::warn!(agent_id = %aid, owner = %owner, framework_id = %fid, task_id = %status.task_id, state = %status.state, "status update for a task that lives on another agent; refused");
            self.metrics.reports_refused_update.inc();
            return self.acknowledge_unforwarded(conn, fid, status.task_id, uuid);
        }
        let earlier = fw.tasks.get(&status.task_id).is_some_and(|task| {
            matches!(
                (status.launch_stamp, task.info.launch_stamp),
                (Some(of), Some(held)) if of < held
            )
        });
        if earlier {
            // An update of an earlier launch of this id, from the agent the
            // id runs on again (re-sent from a log that lost its
            // acknowledgement): that launch's end is settled (the id is
            // launched again only after it), and applying it would speak
            // for the new one. Acknowledged so the stream drains.
            tracing::warn!(agent_id = %aid, framework_id = %fid, task_id = %status.task_id, state = %status.state, "status update of an earlier launch of this task id; refused");
            self.metrics.reports_refused_update.inc();
            return self.acknowledge_unforwarded(conn, fid, status.task_id, uuid);
        }
        let completed = !fw.tasks.contains_key(&status.task_id)
            && self
                .completed
                .iter()
                .any(|c| c.framework_id == fid && c.task_id == status.task_id);
        if completed {
            // The task's terminal state is settled: either the scheduler
            // acknowledged it (this is a re-send whose acknowledgement was
            // lost) or the master decided it (TASK_LOST). Forwarding would
            // show the scheduler a second terminal state; acknowledge it
            // so the agent's stream drains.
            tracing::debug!(framework_id = %fid, task_id = %status.task_id, state = %status.state, "update for a completed task; acknowledging it without forwarding");
            return self.acknowledge_unforwarded(conn, fid, status.task_id, uuid);
        }
        let Some(fw) = self.frameworks.get_mut(&fid) else {
            return;
        };
        let (held, acknowledged) = fw
            .tasks
            .get(&status.task_id)
            .map_or((false, false), |task| {
                let is = |u: Option<&str>| u == Some(uuid.as_str());
                (
                    is(task.pending_update.as_ref().and_then(|p| p.uuid.as_deref())),
                    is(task.acknowledged_uuid.as_deref()),
                )
            });
        if held || acknowledged {
            // The agent re-sent an update the master took already: its
            // retry timer ran while the master or the scheduler was slow,
            // or stopped (a stopped master reads the first copy and every
            // retry at once). Held, the scheduler has it on its connection
            // or gets it again when it subscribes, and its acknowledgement
            // will reach the agent; acknowledged, the copy crossed that
            // acknowledgement and is acknowledged again. Forwarding it
            // would deliver it twice.
            tracing::debug!(framework_id = %fid, task_id = %status.task_id, %uuid, acknowledged, "agent re-sent an update the master took already; not forwarded again");
            self.metrics.status_updates_repeated.inc();
            if acknowledged {
                return self.acknowledge_unforwarded(conn, fid, status.task_id, uuid);
            }
            return;
        }
        let mut freed: Option<(AgentId, Resources)> = None;
        if let Some(task) = fw.tasks.get_mut(&status.task_id) {
            let was_terminal = task.state.is_terminal();
            if !was_terminal {
                task.state = status.state;
                if status.state.is_terminal() {
                    freed = Some((task.agent_id.clone(), task.resources.clone()));
                }
            }
            task.set_latest_status(status.clone());
            task.pending_update = Some(status.clone());
            task.update_state = Some(status.state);
        }
        let conn_fw = fw.conn;
        if let Some((task_agent, resources)) = freed {
            if let Some(agent) = self.agents.get_mut(&task_agent) {
                agent.used = agent.used.saturating_sub(&resources);
            }
            self.allocator
                .recover(&fid, &task_agent, &resources, None, now);
            self.schedule_allocation(now);
        }
        if let Some(conn) = conn_fw {
            self.metrics.status_updates_sent.inc();
            self.send_scheduler(conn, Event::Update { status });
        }
    }

    /// Acknowledges an agent's update that the master does not forward,
    /// so the agent's stream drains.
    fn acknowledge_unforwarded(
        &mut self,
        conn: ConnId,
        fid: FrameworkId,
        task_id: TaskId,
        uuid: String,
    ) {
        self.send_agent_conn(
            conn,
            agent::Event::Acknowledge {
                framework_id: fid,
                task_id,
                uuid,
            },
        );
    }

    pub(crate) fn acknowledge(
        &mut self,
        fid: &FrameworkId,
        agent_id: AgentId,
        task_id: TaskId,
        uuid: String,
    ) {
        let mut done = None;
        if let Some(fw) = self.frameworks.get_mut(fid) {
            if let Some(task) = fw.tasks.get_mut(&task_id) {
                if task
                    .pending_update
                    .as_ref()
                    .is_some_and(|u| u.uuid.as_deref() == Some(uuid.as_str()))
                {
                    // Only the acknowledgement of the terminal update itself
                    // ends the task: later updates may still be on their way.
                    let terminal = task
                        .pending_update
                        .take()
                        .is_some_and(|u| u.state.is_terminal());
                    task.acknowledged_uuid = Some(uuid.clone());
                    if terminal && task.state.is_terminal() {
                        done = fw.tasks.remove(&task_id);
                    }
                }
            }
        }
        if let Some(task) = done {
            if let Some(agent) = self.agents.get_mut(&task.agent_id) {
                agent.tasks.remove(&(fid.clone(), task_id.clone()));
            }
            let state = task.state;
            self.complete_task(task, state);
        }
        let sent = self.send_agent(
            &agent_id,
            agent::Event::Acknowledge {
                framework_id: fid.clone(),
                task_id: task_id.clone(),
                uuid,
            },
        );
        if sent {
            self.metrics.status_updates_acked.inc();
        } else {
            // The agent re-sends the update when it is back; that one is
            // acknowledged then.
            tracing::debug!(agent_id = %agent_id, framework_id = %fid, %task_id, "acknowledgement for an agent that is not connected dropped");
        }
    }

    pub(crate) fn kill(
        &mut self,
        now: Instant,
        fid: &FrameworkId,
        task_id: TaskId,
        agent_id: Option<AgentId>,
    ) {
        let task_agent = self
            .frameworks
            .get(fid)
            .and_then(|f| f.tasks.get(&task_id))
            .map(|t| t.agent_id.clone());
        match task_agent {
            Some(aid) => {
                let sent = self.send_agent(
                    &aid,
                    agent::Event::KillTask {
                        framework_id: fid.clone(),
                        task_id: task_id.clone(),
                    },
                );
                if !sent {
                    tracing::info!(task_id = %task_id, agent_id = %aid, "kill for a task on a disconnected agent; it is sent no further");
                }
            }
            // Already ended: its terminal state again, not a new one.
            None => match self.completed_status(fid, &task_id) {
                Some(status) => {
                    self.send_framework(fid, Event::Update { status });
                }
                None if self.may_still_appear(now, agent_id.as_ref()) => {
                    tracing::debug!(framework_id = %fid, %task_id, "kill of a task on an agent that may still re-register; not answered yet");
                }
                None => {
                    let status = master_status(
                        task_id,
                        TaskState::Lost,
                        Reason::ReasonTaskUnknown,
                        "unknown task",
                        agent_id,
                    );
                    self.send_framework(fid, Event::Update { status });
                }
            },
        }
    }

    /// The reconciliation answer for a task that ended (its terminal
    /// state), if the master still remembers it.
    fn completed_status(&self, fid: &FrameworkId, task_id: &TaskId) -> Option<TaskStatus> {
        let done = self
            .completed
            .iter()
            .rev()
            .find(|c| c.framework_id == *fid && c.task_id == *task_id)?;
        Some(master_status(
            task_id.clone(),
            done.state,
            Reason::ReasonReconciliation,
            "reconciliation: task completed",
            Some(done.agent_id.clone()),
        ))
    }

    /// Whether a task the master does not know may still be running on an
    /// agent of an earlier master that has not re-registered yet, while
    /// agents may re-register ([`Master::agents_may_reregister`]): a task
    /// named with an agent the master has not heard from since it started,
    /// or, with a registry (which lists the agents still to come back), a
    /// task named without an agent. Such a task is neither `TASK_LOST` nor
    /// anything else yet: answering `TASK_LOST` and then forwarding the
    /// task's own terminal update when its agent comes back would give the
    /// framework two terminal states for one task. Without a registry a
    /// task named without an agent is answered `TASK_LOST` as in Mesos:
    /// the master cannot tell a restart from the cluster's first start.
    fn may_still_appear(&self, now: Instant, agent_id: Option<&AgentId>) -> bool {
        if !self.agents_may_reregister(now) {
            return false;
        }
        match agent_id {
            None => self.persistent,
            Some(aid) => match self.agents.get(aid) {
                Some(agent) => agent.recovering,
                None => !self.removed_agents.contains(aid),
            },
        }
    }

    /// Answers `RECONCILE`: the latest known state of each named task (of
    /// every task when none is named). A task the master does not know is
    /// `TASK_LOST` — except one said to be on an agent the master has not
    /// heard of while agents of an earlier master may still re-register
    /// ([`Master::agents_may_reregister`]): that one gets no answer yet,
    /// as in Mesos, and the framework asks again later.
    pub(crate) fn reconcile(&mut self, now: Instant, fid: &FrameworkId, tasks: Vec<ReconcileTask>) {
        let Some(fw) = self.frameworks.get(fid) else {
            return;
        };
        let statuses: Vec<TaskStatus> = if tasks.is_empty() {
            fw.tasks
                .values()
                .filter_map(Task::reconciliation_status)
                .collect()
        } else {
            tasks
                .into_iter()
                .filter_map(|t| {
                    // What the master holds of the id is on another agent
                    // than the framework names, one that may still
                    // re-register: the framework may know a later launch of
                    // the id there (this master learnt the earlier one from
                    // an agent that re-registered first). No answer yet.
                    let elsewhere = |on: &AgentId| {
                        t.agent_id.as_ref().is_some_and(|asked| asked != on)
                            && self.may_still_appear(now, t.agent_id.as_ref())
                    };
                    if let Some(task) = fw.tasks.get(&t.task_id) {
                        if elsewhere(&task.agent_id) {
                            return None;
                        }
                        return task.reconciliation_status();
                    }
                    if let Some(status) = self.completed_status(fid, &t.task_id) {
                        if status.agent_id.as_ref().is_some_and(elsewhere) {
                            return None;
                        }
                        return Some(status);
                    }
                    if self.may_still_appear(now, t.agent_id.as_ref()) {
                        tracing::debug!(framework_id = %fid, task_id = %t.task_id, "reconciliation of a task on an agent that may still re-register; not answered yet");
                        return None;
                    }
                    Some(master_status(
                        t.task_id,
                        TaskState::Lost,
                        Reason::ReasonReconciliation,
                        "unknown task",
                        t.agent_id,
                    ))
                })
                .collect()
        };
        for status in statuses {
            self.send_framework(fid, Event::Update { status });
        }
    }
}

/// The executor a task runs under: its own, or the command executor named
/// after the task.
fn executor_id_of(info: &TaskInfo) -> ExecutorId {
    match &info.executor {
        Some(e) => e.executor_id.clone(),
        None => ExecutorId::new(info.task_id.as_str()),
    }
}

#[cfg(test)]
mod tests {
    use agora_proto::Source;

    use super::*;

    fn status(state: TaskState, timestamp: f64) -> TaskStatus {
        let mut status = TaskStatus::new(TaskId::new("t"), state, Source::SourceExecutor);
        status.timestamp = timestamp;
        status
    }

    #[test]
    fn a_task_keeps_its_first_update_and_the_latest_ones() {
        let mut statuses = Vec::new();
        record_status(&mut statuses, &status(TaskState::Starting, 1.0));
        for i in 0..20 {
            let mut running = status(TaskState::Running, 2.0 + f64::from(i));
            running.healthy = Some(i % 2 == 0);
            record_status(&mut statuses, &running);
        }
        assert_eq!(statuses.len(), MAX_TASK_STATUSES);
        assert_eq!(statuses[0].state, TaskState::Starting);
        let times: Vec<f64> = statuses[1..].iter().map(|s| s.timestamp).collect();
        assert_eq!(times, [15.0, 16.0, 17.0, 18.0, 19.0, 20.0, 21.0]);
        assert_eq!(statuses.last().unwrap().healthy, Some(false));
    }

    #[test]
    fn an_update_reported_again_is_recorded_once() {
        let mut statuses = Vec::new();
        let running = status(TaskState::Running, 5.0);
        record_status(&mut statuses, &running);
        record_status(&mut statuses, &running);
        assert_eq!(statuses.len(), 1);
        record_status(&mut statuses, &status(TaskState::Finished, 6.0));
        assert_eq!(statuses.len(), 2);
    }
}
