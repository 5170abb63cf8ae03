//! Offers: turning allocations into `OFFERS`, launches (validated as a
//! whole, exactly as `docs/protocol.md` says), declines with filters,
//! rescinds and the offer timeout.

use agora_proto::hash::HashSet;
use std::time::Duration;

use agora_proto::scheduler::Event;
use agora_proto::{
    agent, AgentId, ExecutorId, Filters, FrameworkId, FrameworkInfo, Offer, OfferId, Reason,
    Resources, TaskId, TaskInfo, TaskState,
};
use tokio::time::Instant;

use crate::master::{peer_seconds, Master};
use crate::tasks::Task;

/// Offers sent in one `OFFERS` event at most (keeps frames well under the cap).
const MAX_OFFERS_PER_EVENT: usize = 1000;

/// An outstanding offer.
#[derive(Debug, Clone)]
pub(crate) struct OfferEntry {
    pub(crate) offer: Offer,
}

// === impl Master: offers ===

impl Master {
    /// One allocation cycle: asks the allocator and sends the offers.
    pub(crate) fn allocate(&mut self, now: Instant) {
        // Wall time for the histogram only; the logic uses the injected `now`.
        let cycle_started = Instant::now();
        let allocations = self.allocator.allocate(now);
        let mut by_framework: Vec<(FrameworkId, Vec<Offer>)> = Vec::new();
        for a in allocations {
            let framework_ok = self
                .frameworks
                .get(&a.framework_id)
                .is_some_and(|f| f.conn.is_some());
            let agent_ok = self
                .agents
                .get(&a.agent_id)
                .is_some_and(|ag| ag.conn.is_some());
            if !framework_ok || !agent_ok || a.resources.is_empty() {
                // Defensive: the allocator's view lagged; give it back.
                self.allocator
                    .recover(&a.framework_id, &a.agent_id, &a.resources, None, now);
                continue;
            }
            let id = OfferId::new(self.new_id("O"));
            let Some(agent) = self.agents.get_mut(&a.agent_id) else {
                continue;
            };
            let offer = Offer {
                id: id.clone(),
                framework_id: a.framework_id.clone(),
                agent_id: a.agent_id.clone(),
                hostname: agent.info.hostname.clone(),
                resources: a.resources.clone(),
                attributes: agent.info.attributes.clone(),
                executor_ids: agent
                    .executors
                    .keys()
                    .filter(|(f, _)| *f == a.framework_id)
                    .map(|(_, e)| e.clone())
                    .collect(),
                allocation_role: Some(a.role.clone()),
            };
            agent.offered += &a.resources;
            agent.offers.insert(id.clone());
            self.metrics.offers_made.inc();
            if let Some(fw) = self.frameworks.get_mut(&a.framework_id) {
                fw.offers.insert(id.clone());
            }
            if self.config.offer_timeout.is_some() {
                self.offer_expiry.push_back((now, id.clone()));
            }
            self.offers.insert(
                id,
                OfferEntry {
                    offer: offer.clone(),
                },
            );
            match by_framework.iter_mut().find(|(f, _)| *f == a.framework_id) {
                Some((_, list)) => list.push(offer),
                None => by_framework.push((a.framework_id, vec![offer])),
            }
        }
        for (fid, offers) in by_framework {
            tracing::debug!(framework_id = %fid, count = offers.len(), "sending offers");
            for chunk in offers.chunks(MAX_OFFERS_PER_EVENT) {
                self.send_framework(
                    &fid,
                    Event::Offers {
                        offers: chunk.to_vec(),
                    },
                );
            }
        }
        self.metrics
            .allocation_cycles
            .observe(cycle_started.elapsed());
    }

    /// Takes an offer out of the books and gives its resources back to
    /// the allocator (with `refuse` as filter), telling the framework with
    /// `RESCIND` when `notify`. Returns the offer.
    pub(crate) fn withdraw_offer(
        &mut self,
        now: Instant,
        id: &OfferId,
        notify: bool,
        refuse: Option<Duration>,
    ) -> Option<Offer> {
        let entry = self.take_offer(id)?;
        let offer = entry.offer;
        self.allocator.recover(
            &offer.framework_id,
            &offer.agent_id,
            &offer.resources,
            refuse,
            now,
        );
        if notify {
            self.metrics.offers_rescinded.inc();
            self.send_framework(
                &offer.framework_id,
                Event::Rescind {
                    offer_id: id.clone(),
                },
            );
        }
        self.schedule_allocation(now);
        Some(offer)
    }

    /// Removes the offer from every index, without telling the allocator.
    fn take_offer(&mut self, id: &OfferId) -> Option<OfferEntry> {
        let entry = self.offers.remove(id)?;
        if let Some(agent) = self.agents.get_mut(&entry.offer.agent_id) {
            agent.offers.remove(id);
            agent.offered = agent.offered.saturating_sub(&entry.offer.resources);
        }
        if let Some(fw) = self.frameworks.get_mut(&entry.offer.framework_id) {
            fw.offers.remove(id);
        }
        Some(entry)
    }

    pub(crate) fn withdraw_agent_offers(&mut self, now: Instant, aid: &AgentId, notify: bool) {
        let ids: Vec<OfferId> = self
            .agents
            .get(aid)
            .map(|a| a.offers.iter().cloned().collect())
            .unwrap_or_default();
        for id in ids {
            self.withdraw_offer(now, &id, notify, None);
        }
    }

    pub(crate) fn withdraw_framework_offers(
        &mut self,
        now: Instant,
        fid: &FrameworkId,
        notify: bool,
    ) {
        let ids: Vec<OfferId> = self
            .frameworks
            .get(fid)
            .map(|f| f.offers.iter().cloned().collect())
            .unwrap_or_default();
        for id in ids {
            self.withdraw_offer(now, &id, notify, None);
        }
    }

    pub(crate) fn expire_offers(&mut self, now: Instant) {
        let Some(timeout) = self.config.offer_timeout else {
            self.offer_expiry.clear();
            return;
        };
        while let Some((created, id)) = self.offer_expiry.front().cloned() {
            if created + timeout > now {
                break;
            }
            self.offer_expiry.pop_front();
            if let Some(entry) = self.offers.get(&id) {
                let offer = &entry.offer;
                tracing::debug!(offer_id = %id, framework_id = %offer.framework_id, agent_id = %offer.agent_id, "offer timed out; rescinding");
                self.metrics.offers_expired.inc();
                self.withdraw_offer(now, &id, true, None);
            }
        }
    }

    fn refuse_duration(&self, filters: Filters) -> Option<Duration> {
        let secs = filters
            .refuse_seconds
            .filter(|s| s.is_finite())
            .unwrap_or(self.config.default_refuse_seconds);
        peer_seconds(secs)
    }

    pub(crate) fn decline(
        &mut self,
        now: Instant,
        fid: &FrameworkId,
        offer_ids: &[OfferId],
        filters: Filters,
    ) {
        let refuse = self.refuse_duration(filters);
        for id in offer_ids {
            // Unknown offers may have been rescinded meanwhile: ignored.
            if self
                .offers
                .get(id)
                .is_some_and(|o| o.offer.framework_id == *fid)
            {
                self.metrics.offers_declined.inc();
                self.withdraw_offer(now, id, false, refuse);
            }
        }
    }

    /// `LAUNCH`: see `docs/protocol.md`, scheduler rule 3.
    pub(crate) fn launch(
        &mut self,
        now: Instant,
        fid: &FrameworkId,
        offer_ids: Vec<OfferId>,
        tasks: Vec<TaskInfo>,
        filters: Filters,
    ) {
        if tasks.is_empty() {
            return self.decline(now, fid, &offer_ids, filters);
        }
        let mut valid: Vec<OfferId> = Vec::new();
        let mut problem: Option<String> = None;
        let mut seen = HashSet::default();
        let mut agent_id: Option<AgentId> = None;
        if offer_ids.is_empty() {
            problem = Some("a launch must name at least one offer".into());
        }
        for id in &offer_ids {
            if !seen.insert(id.clone()) {
                problem.get_or_insert_with(|| format!("offer {id} is listed twice"));
                continue;
            }
            match self.offers.get(id) {
                None => {
                    problem.get_or_insert_with(|| {
                        format!(
                            "offer {id} is not outstanding (unknown, rescinded or already used)"
                        )
                    });
                }
                Some(entry) if entry.offer.framework_id != *fid => {
                    problem
                        .get_or_insert_with(|| format!("offer {id} belongs to another framework"));
                }
                Some(entry) => {
                    match &agent_id {
                        None => agent_id = Some(entry.offer.agent_id.clone()),
                        Some(a) if *a != entry.offer.agent_id => {
                            problem.get_or_insert_with(|| {
                                "the offers of one launch must all be on one agent".to_string()
                            });
                        }
                        Some(_) => {}
                    }
                    valid.push(id.clone());
                }
            }
        }
        let agent_id = match (problem, agent_id) {
            (None, Some(a)) => a,
            (problem, _) => {
                let message = problem.unwrap_or_else(|| "no valid offers".into());
                for id in &valid {
                    self.withdraw_offer(now, id, false, None);
                }
                for task in &tasks {
                    self.refuse_task(
                        fid,
                        task,
                        TaskState::Dropped,
                        Reason::ReasonInvalidOffers,
                        message.clone(),
                    );
                }
                return;
            }
        };

        let mut remaining = Resources::new();
        let mut allocation_roles: Vec<Option<String>> = Vec::new();
        for id in &valid {
            if let Some(entry) = self.take_offer(id) {
                self.metrics.offers_accepted.inc();
                remaining += &entry.offer.resources;
                if !allocation_roles.contains(&entry.offer.allocation_role) {
                    allocation_roles.push(entry.offer.allocation_role);
                }
            }
        }
        let Some(framework_info) = self.frameworks.get(fid).map(|f| f.info.clone()) else {
            self.allocator
                .recover(fid, &agent_id, &remaining, None, now);
            return;
        };
        let mut booked = Booked {
            remaining,
            allocation_roles,
            task_ids: HashSet::default(),
            new_executors: HashSet::default(),
        };
        for unit in launch_units(tasks) {
            match unit {
                LaunchUnit::Task(task) => {
                    self.launch_task(fid, &agent_id, &framework_info, task, &mut booked)
                }
                LaunchUnit::Group(tasks) => {
                    self.launch_task_group(fid, &agent_id, &framework_info, tasks, &mut booked)
                }
            }
        }
        let remaining = booked.remaining;
        if !remaining.is_empty() {
            let refuse = self.refuse_duration(filters);
            self.allocator
                .recover(fid, &agent_id, &remaining, refuse, now);
            self.schedule_allocation(now);
        }
    }

    /// One task of a launch on agent `agent_id`: checked against what the
    /// launch booked so far, booked and sent to the agent, or refused.
    fn launch_task(
        &mut self,
        fid: &FrameworkId,
        agent_id: &AgentId,
        framework_info: &FrameworkInfo,
        mut task: TaskInfo,
        booked: &mut Booked,
    ) {
        if let Err(message) = self.authorize_run(framework_info) {
            return self.refuse_task(
                fid,
                &task,
                TaskState::Error,
                Reason::ReasonTaskUnauthorized,
                message,
            );
        }
        let (executor_is_new, check) = self.validate_task(
            fid,
            agent_id,
            &mut task,
            &booked.task_ids,
            &booked.new_executors,
        );
        let check =
            check.and_then(
                |()| match allocation_mismatch(&task, &booked.allocation_roles) {
                    Some(message) => Err(message),
                    None => Ok(()),
                },
            );
        if let Err(message) = check {
            return self.refuse_task(
                fid,
                &task,
                TaskState::Error,
                Reason::ReasonTaskInvalid,
                message,
            );
        }
        let needed = needed_for(&task, executor_is_new);
        if !booked.remaining.contains(&needed) {
            let message = format!(
                "task needs {needed}; the offers have {} left",
                booked.remaining
            );
            return self.refuse_task(
                fid,
                &task,
                TaskState::Error,
                Reason::ReasonInsufficientResources,
                message,
            );
        }
        booked.remaining = booked.remaining.saturating_sub(&needed);
        booked.task_ids.insert(task.task_id.clone());
        if let Some(task) = self.commit_task(fid, agent_id, task, &needed, executor_is_new, booked)
        {
            let framework = framework_info.clone();
            self.send_agent(agent_id, agent::Event::RunTask { framework, task });
        }
    }

    /// The tasks of one task group of a launch on agent `agent_id`: each
    /// checked as if the ones before it were launched; all booked and
    /// sent to the agent in one `RUN_TASK_GROUP`, or, when one cannot
    /// run, all refused (`REASON_TASK_GROUP_INVALID`).
    fn launch_task_group(
        &mut self,
        fid: &FrameworkId,
        agent_id: &AgentId,
        framework_info: &FrameworkInfo,
        group: Vec<TaskInfo>,
        booked: &mut Booked,
    ) {
        if let Err(message) = self.authorize_run(framework_info) {
            let message = format!("task group refused: {message}");
            for task in &group {
                self.refuse_task(
                    fid,
                    task,
                    TaskState::Error,
                    Reason::ReasonTaskUnauthorized,
                    message.clone(),
                );
            }
            return;
        }
        let mut trial = booked.clone();
        let mut checked = Vec::with_capacity(group.len());
        let mut problem = None;
        let executor_id = group
            .first()
            .and_then(|t| t.executor.as_ref())
            .map(|e| e.executor_id.clone());
        for task in &group {
            let mut task = task.clone();
            let same_executor =
                task.executor.as_ref().map(|e| &e.executor_id) == executor_id.as_ref();
            if executor_id.is_none() || !same_executor {
                problem = Some(format!(
                    "task {}: the tasks of a group must all name the same executor",
                    task.task_id
                ));
                break;
            }
            let (executor_is_new, check) = self.validate_task(
                fid,
                agent_id,
                &mut task,
                &trial.task_ids,
                &trial.new_executors,
            );
            let check =
                check.and_then(
                    |()| match allocation_mismatch(&task, &trial.allocation_roles) {
                        Some(message) => Err(message),
                        None => Ok(()),
                    },
                );
            if let Err(message) = check {
                problem = Some(format!("task {}: {message}", task.task_id));
                break;
            }
            let needed = needed_for(&task, executor_is_new);
            if !trial.remaining.contains(&needed) {
                problem = Some(format!(
                    "task {} needs {needed}; the offers have {} left",
                    task.task_id, trial.remaining
                ));
                break;
            }
            trial.remaining = trial.remaining.saturating_sub(&needed);
            trial.task_ids.insert(task.task_id.clone());
            if let (true, Some(exec)) = (executor_is_new, &task.executor) {
                trial.new_executors.insert(exec.executor_id.clone());
            }
            checked.push((task, needed, executor_is_new));
        }
        if let Some(problem) = problem {
            let message = format!("task group refused: {problem}");
            for task in &group {
                self.refuse_task(
                    fid,
                    task,
                    TaskState::Error,
                    Reason::ReasonTaskGroupInvalid,
                    message.clone(),
                );
            }
            return;
        }
        *booked = trial;
        let mut tasks = Vec::with_capacity(checked.len());
        for (task, needed, executor_is_new) in checked {
            tasks.extend(self.commit_task(fid, agent_id, task, &needed, executor_is_new, booked));
        }
        if !tasks.is_empty() {
            let framework = framework_info.clone();
            self.send_agent(agent_id, agent::Event::RunTaskGroup { framework, tasks });
        }
    }

    /// Books task `task` (checked, `needed` taken from the offers) on
    /// agent `agent_id` as launched, stamped: what to send the agent
    /// (`None` when the agent is gone).
    fn commit_task(
        &mut self,
        fid: &FrameworkId,
        agent_id: &AgentId,
        mut task: TaskInfo,
        needed: &Resources,
        executor_is_new: bool,
        booked: &mut Booked,
    ) -> Option<TaskInfo> {
        task.launch_stamp = self
            .frameworks
            .get_mut(fid)
            .map(|fw| fw.next_launch_stamp());
        let agent = self.agents.get_mut(agent_id)?;
        agent.used += needed;
        agent.tasks.insert((fid.clone(), task.task_id.clone()));
        if let (true, Some(exec)) = (executor_is_new, &task.executor) {
            booked.new_executors.insert(exec.executor_id.clone());
            agent
                .executors
                .insert((fid.clone(), exec.executor_id.clone()), exec.clone());
        }
        let record = Task::new(fid.clone(), task.clone(), TaskState::Staging);
        let replaced = self
            .frameworks
            .get_mut(fid)
            .and_then(|fw| fw.tasks.insert(task.task_id.clone(), record));
        if let Some(old) = replaced {
            // A terminal task whose id is reused: it is done, and off
            // the books of its agent when the new one runs elsewhere
            // (else that agent's re-registration or removal would take
            // the new task for its own).
            if old.agent_id != *agent_id {
                if let Some(agent) = self.agents.get_mut(&old.agent_id) {
                    agent.tasks.remove(&(fid.clone(), task.task_id.clone()));
                }
            }
            let state = old.state;
            self.complete_task(old, state);
        }
        tracing::info!(framework_id = %fid, agent_id = %agent_id, task_id = %task.task_id, task_group = ?task.task_group, "launching task");
        self.metrics.tasks_launched.inc();
        Some(task)
    }

    /// Whether the framework's principal may run tasks as its user
    /// (`run_tasks`; tasks run as their framework's user).
    fn authorize_run(&self, framework_info: &FrameworkInfo) -> Result<(), String> {
        let acls = &self.config.acls;
        if !acls.restricts(crate::acls::Action::RunTasks) {
            return Ok(());
        }
        acls.check(
            crate::acls::Action::RunTasks,
            framework_info.principal.as_deref(),
            Some(&framework_info.user),
        )
    }

    /// Checks one task of a launch; fills in the executor's framework id.
    /// Returns whether the task starts a new custom executor.
    fn validate_task(
        &self,
        fid: &FrameworkId,
        agent_id: &AgentId,
        task: &mut TaskInfo,
        in_this_launch: &HashSet<TaskId>,
        new_executors: &HashSet<ExecutorId>,
    ) -> (bool, Result<(), String>) {
        let fail = |m: String| (false, Err(m));
        if let Err(e) = task.task_id.validate() {
            return fail(format!("invalid task id: {e}"));
        }
        if in_this_launch.contains(&task.task_id) {
            return fail(format!(
                "task id {} appears twice in this launch",
                task.task_id
            ));
        }
        let live = self
            .frameworks
            .get(fid)
            .and_then(|f| f.tasks.get(&task.task_id))
            .is_some_and(|t| !t.state.is_terminal());
        if live {
            return fail(format!(
                "task id {} is already in use by a live task",
                task.task_id
            ));
        }
        if task.agent_id != *agent_id {
            return fail(format!(
                "task agent_id {} does not match the offers' agent {agent_id}",
                task.agent_id
            ));
        }
        let shape_ok = match (&task.executor, &task.command) {
            (Some(_), Some(_)) => task.task_group.is_some(),
            (executor, command) => executor.is_some() != command.is_some(),
        };
        if !shape_ok {
            return fail("exactly one of executor and command must be set".into());
        }
        if task.resources.is_empty() {
            return fail("task resources must not be empty".into());
        }
        let Some(agent) = self.agents.get(agent_id) else {
            return fail(format!("agent {agent_id} is gone"));
        };
        match &mut task.executor {
            None => {
                let eid = ExecutorId::new(task.task_id.as_str());
                if agent.executors.contains_key(&(fid.clone(), eid))
                    || new_executors.contains(&ExecutorId::new(task.task_id.as_str()))
                {
                    return fail(format!(
                        "a custom executor with id {} runs on the agent; command tasks use their task id as executor id",
                        task.task_id
                    ));
                }
                (false, Ok(()))
            }
            Some(exec) => {
                if let Err(e) = exec.executor_id.validate() {
                    return fail(format!("invalid executor id: {e}"));
                }
                if let Some(grace) = exec.shutdown_grace_period {
                    if !(grace.is_finite() && grace >= 0.0) {
                        return fail(format!(
                            "executor shutdown_grace_period must be a number of seconds, not negative, got {grace}"
                        ));
                    }
                }
                match &exec.framework_id {
                    Some(other) if other != fid => {
                        return fail(format!(
                            "executor framework_id {other} is not this framework"
                        ));
                    }
                    _ => exec.framework_id = Some(fid.clone()),
                }
                if new_executors.contains(&exec.executor_id) {
                    return (false, Ok(()));
                }
                match agent
                    .executors
                    .get(&(fid.clone(), exec.executor_id.clone()))
                {
                    Some(running) if running.command != exec.command => fail(format!(
                        "executor {} already runs on the agent with a different command",
                        exec.executor_id
                    )),
                    Some(_) => (false, Ok(())),
                    None => (true, Ok(())),
                }
            }
        }
    }
}

/// What the tasks of a launch accepted so far took.
#[derive(Clone)]
struct Booked {
    /// The roles the launch's offers were allocated to.
    allocation_roles: Vec<Option<String>>,
    /// What is left of the offers.
    remaining: Resources,
    /// The ids of the tasks.
    task_ids: HashSet<TaskId>,
    /// The executors they start.
    new_executors: HashSet<ExecutorId>,
}

/// What a launch is made of: tasks on their own, and task groups (the
/// tasks of the launch that name one group, in order), each checked and
/// launched as one.
// Built once per task and moved on; boxing the task would only add an
// allocation.
#[allow(clippy::large_enum_variant)]
enum LaunchUnit {
    Task(TaskInfo),
    Group(Vec<TaskInfo>),
}

/// Splits a launch's tasks into units, in the order each first appears.
fn launch_units(tasks: Vec<TaskInfo>) -> Vec<LaunchUnit> {
    let mut units = Vec::with_capacity(tasks.len());
    let mut groups: agora_proto::hash::HashMap<String, usize> = Default::default();
    for task in tasks {
        let Some(name) = task.task_group.clone() else {
            units.push(LaunchUnit::Task(task));
            continue;
        };
        match groups.get(&name) {
            Some(&at) => {
                if let LaunchUnit::Group(group) = &mut units[at] {
                    group.push(task);
                }
            }
            None => {
                groups.insert(name, units.len());
                units.push(LaunchUnit::Group(vec![task]));
            }
        }
    }
    units
}

/// The resources a task takes from its offers: its own, and its
/// executor's when the launch starts the executor.
/// Why `task` may not use offers allocated to `roles`: it names the role
/// its offers were allocated to (`TaskInfo::allocation_role`, Mesos's
/// `Resource.allocation_info.role`) and one of them was not.
fn allocation_mismatch(task: &TaskInfo, roles: &[Option<String>]) -> Option<String> {
    let named = task.allocation_role.as_ref()?;
    let other = roles.iter().find(|r| r.as_ref() != Some(named))?;
    Some(format!(
        "the task's resources are allocated to role {named:?} (allocation_info.role) but its offers were allocated to {}",
        match other {
            Some(role) => format!("role {role:?}"),
            None => "no role".to_string(),
        }
    ))
}

fn needed_for(task: &TaskInfo, executor_is_new: bool) -> Resources {
    let mut needed = task.resources.clone();
    if executor_is_new {
        if let Some(exec) = &task.executor {
            needed += &exec.resources;
        }
    }
    needed
}
