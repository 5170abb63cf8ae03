//! Agents: registration and re-registration (rebuilding tasks and
//! frameworks from an agent's report after a master restart), pings and
//! removal after missed pongs, disconnection, executor exits and messages
//! from executors.

use agora_proto::hash::{HashMap, HashSet};

use agora_proto::agent::{Event, ExecutorReport, TaskReport};
use agora_proto::{
    scheduler, AgentId, AgentInfo, Bytes, ExecutorId, ExecutorInfo, FrameworkId, FrameworkInfo,
    OfferId, Reason, Resources, TaskId, TaskInfo, TaskState, PROTOCOL_VERSION,
};
use tokio::time::Instant;

use crate::acls::Action;
use crate::master::{master_status, ConnId, Master, Output, CLOSE_POLICY};
use crate::registry::{AgentRecord, RegistryOp};
use crate::tasks::Task;

/// An agent the master knows.
#[derive(Debug)]
pub(crate) struct Agent {
    pub(crate) id: AgentId,
    /// As registered, with `id` set.
    pub(crate) info: AgentInfo,
    pub(crate) conn: Option<ConnId>,
    pub(crate) total: Resources,
    /// Taken by live tasks and running custom executors.
    pub(crate) used: Resources,
    /// In outstanding offers.
    pub(crate) offered: Resources,
    pub(crate) tasks: HashSet<(FrameworkId, TaskId)>,
    /// Custom executors running here, each accounted once.
    pub(crate) executors: HashMap<(FrameworkId, ExecutorId), ExecutorInfo>,
    pub(crate) offers: HashSet<OfferId>,
    pub(crate) missed_pings: u32,
    pub(crate) awaiting_pong: bool,
    pub(crate) registered_at: f64,
    /// Known from the registry, not re-registered with this master yet.
    pub(crate) recovering: bool,
    /// The principal that registered it (none: an unauthenticated
    /// agent): only that principal may re-register its id.
    pub(crate) principal: Option<String>,
    /// Why the agent cannot take tasks now (its work directory is full,
    /// ...), as it said: its resources are not offered meanwhile.
    pub(crate) unavailable: Option<String>,
    /// DEACTIVATE_AGENT (or a drain): no offers until REACTIVATE_AGENT.
    pub(crate) deactivated: bool,
    /// DRAIN_AGENT (`drain.rs`).
    pub(crate) drain: Option<crate::drain::Drain>,
}

// === impl Agent ===

impl Agent {
    fn new(id: AgentId, mut info: AgentInfo, conn: ConnId, principal: Option<String>) -> Self {
        info.id = Some(id.clone());
        Agent {
            principal,
            id,
            total: info.resources.clone(),
            info,
            conn: Some(conn),
            used: Resources::new(),
            offered: Resources::new(),
            tasks: HashSet::default(),
            executors: HashMap::default(),
            offers: HashSet::default(),
            missed_pings: 0,
            awaiting_pong: false,
            registered_at: agora_proto::now_timestamp(),
            recovering: false,
            unavailable: None,
            deactivated: false,
            drain: None,
        }
    }

    /// An agent the registry lists, waiting to re-register.
    pub(crate) fn recovered(id: AgentId, info: AgentInfo, principal: Option<String>) -> Self {
        let mut agent = Agent::new(id, info, 0, principal);
        agent.conn = None;
        agent.recovering = true;
        agent
    }

    fn record(&self) -> RegistryOp {
        self.registry_record()
    }

    /// Its registry record, with what an operator set on it.
    pub(crate) fn registry_record(&self) -> RegistryOp {
        RegistryOp::PutAgent(AgentRecord {
            id: self.id.clone(),
            info: self.info.clone(),
            principal: self.principal.clone(),
            deactivated: self.deactivated,
            drain: self.drain.as_ref().map(|d| d.record.clone()),
        })
    }
}

// === impl Master: agents ===

impl Master {
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn register_agent(
        &mut self,
        now: Instant,
        conn: ConnId,
        protocol: u32,
        info: AgentInfo,
        tasks: Vec<TaskReport>,
        executors: Vec<ExecutorReport>,
        frameworks: Vec<FrameworkInfo>,
        principal: Option<String>,
    ) {
        if protocol != PROTOCOL_VERSION {
            return self.agent_fatal(
                conn,
                format!("unsupported protocol version {protocol}; this master speaks {PROTOCOL_VERSION}"),
            );
        }
        if let Some(existing) = self.agent_conns.get(&conn) {
            let msg = format!("this connection is already registered as agent {existing}");
            return self.agent_error(conn, msg);
        }
        let acls = &self.config.acls;
        if acls.restricts(Action::RegisterAgents) {
            if let Err(msg) = acls.check(Action::RegisterAgents, principal.as_deref(), None) {
                tracing::warn!(hostname = %info.hostname, ?principal, %msg, "agent registration refused");
                self.metrics.refused_agent_unauthorized.inc();
                return self.agent_fatal(conn, format!("registration refused: {msg}"));
            }
        }
        if info.resources.is_empty() {
            return self.agent_fatal(conn, "registration refused: the agent offers no resources");
        }
        if let Some((name, offered, max)) =
            over_limit(&info.resources, &self.config.max_agent_resources)
        {
            tracing::warn!(hostname = %info.hostname, resource = name, offered, max, "agent registration refused: resources above --max-agent-resources");
            self.metrics.refused_agent_bounds.inc();
            return self.agent_fatal(
                conn,
                format!("registration refused: the agent offers {name}:{offered}, above this master's --max-agent-resources ({name}:{max})"),
            );
        }
        if let Err(msg) = self.config.agent_bounds.check(&info) {
            tracing::warn!(?principal, %msg, "agent registration refused: beyond a bound");
            self.metrics.refused_agent_bounds.inc();
            return self.agent_fatal(conn, format!("registration refused: {msg}"));
        }
        let aid = match &info.id {
            None => {
                let aid = AgentId::new(self.new_id("S"));
                let agent = Agent::new(aid.clone(), info, conn, principal);
                self.allocator.add_agent(&aid, &agent.total, &[], true);
                tracing::info!(agent_id = %aid, hostname = %agent.info.hostname, resources = %agent.total, "agent registered");
                self.persist(agent.record());
                self.agents.insert(aid.clone(), agent);
                self.agent_conns.insert(conn, aid.clone());
                self.send_agent_conn(
                    conn,
                    Event::Registered {
                        agent_id: aid,
                        ping_interval_seconds: self.config.agent_ping_interval.as_secs_f64(),
                        master_info: self.info.clone(),
                        reregistered: false,
                    },
                );
                self.schedule_allocation(now);
                return;
            }
            Some(aid) => aid.clone(),
        };
        if let Err(e) = aid.validate() {
            return self.agent_fatal(conn, format!("registration refused: invalid agent id: {e}"));
        }
        if self.gone_agents.contains(&aid) {
            tracing::warn!(agent_id = %aid, "agent marked gone tried to register again; shutting it down");
            return self.send_agent_conn(
                conn,
                Event::Shutdown {
                    message: format!(
                        "registration refused: agent {aid} was marked gone by an operator and may not register again with this id"
                    ),
                },
            );
        }
        if self.removed_agents.contains(&aid) {
            tracing::info!(agent_id = %aid, "removed agent tried to re-register; shutting it down");
            return self.send_agent_conn(
                conn,
                Event::Shutdown {
                    message: format!(
                        "agent {aid} was removed by the master; register as a new agent"
                    ),
                },
            );
        }
        if let Some(agent) = self.agents.get(&aid) {
            if agent.principal != principal {
                // Another principal's agent id: refused, the agent that
                // has it left as it is (connected or not).
                tracing::warn!(agent_id = %aid, owner = ?agent.principal, ?principal, "re-registration of an agent id by another principal refused");
                self.metrics.refused_agent_principal.inc();
                return self.agent_fatal(
                    conn,
                    format!(
                        "registration refused: agent {aid} belongs to another principal; {} may not re-register it",
                        describe_principal(principal.as_deref())
                    ),
                );
            }
        }
        self.reregister_agent(
            now, conn, aid, info, tasks, executors, frameworks, principal,
        );
    }

    #[allow(clippy::too_many_arguments)]
    fn reregister_agent(
        &mut self,
        now: Instant,
        conn: ConnId,
        aid: AgentId,
        info: AgentInfo,
        tasks: Vec<TaskReport>,
        executors: Vec<ExecutorReport>,
        frameworks: Vec<FrameworkInfo>,
        principal: Option<String>,
    ) {
        let known = self.agents.contains_key(&aid);
        if known {
            self.withdraw_agent_offers(now, &aid, true);
            if let Some(old) = self.agents.get(&aid).and_then(|a| a.conn) {
                if old != conn {
                    self.agent_conns.remove(&old);
                    self.push(Output::Close {
                        conn: old,
                        code: CLOSE_POLICY,
                        reason: "agent re-registered on another connection".into(),
                    });
                }
            }
        }
        let mut agent = self
            .agents
            .remove(&aid)
            .unwrap_or_else(|| Agent::new(aid.clone(), info.clone(), conn, principal));
        // Recorded again only when new to the registry or changed.
        let recorded = known.then(|| agent.info.clone());
        agent.info = AgentInfo {
            id: Some(aid.clone()),
            ..info
        };
        if recorded.as_ref() != Some(&agent.info) {
            self.persist(agent.record());
        }
        agent.recovering = false;
        // What runs there is what the agent reports (every executor it has,
        // launching or running): executors that ended while it was away,
        // their exits lost with the connection, are gone.
        agent.executors.clear();
        agent.total = agent.info.resources.clone();
        agent.conn = Some(conn);
        agent.missed_pings = 0;
        agent.awaiting_pong = false;

        for fw_info in frameworks {
            if let Some(fid) = fw_info.id.clone() {
                if fid.validate().is_ok() {
                    self.recover_framework(now, fw_info, &fid);
                }
            }
        }

        let mut shutdown_frameworks: HashSet<FrameworkId> = HashSet::default();
        let mut reported: HashSet<(FrameworkId, TaskId)> = HashSet::default();
        // Tasks that completed here that the agent reports as running.
        let mut kill: Vec<(FrameworkId, TaskId)> = Vec::new();
        for report in tasks {
            let fid = report.framework_id.clone();
            if self.removed_frameworks.contains(&fid) {
                shutdown_frameworks.insert(fid);
                continue;
            }
            if report.task.task_id.validate().is_err() || fid.validate().is_err() {
                continue;
            }
            if !self.frameworks.contains_key(&fid) {
                let mut fw_info = FrameworkInfo::new(format!("recovered {fid}"));
                fw_info.id = Some(fid.clone());
                self.recover_framework(now, fw_info, &fid);
                if let Some(fw) = self.frameworks.get_mut(&fid) {
                    fw.unclaimed = true;
                }
            }
            let stale = report
                .latest_status
                .as_ref()
                .and_then(|s| s.uuid.as_deref())
                .is_some_and(|uuid| self.of_completed_task(&fid, &report.task.task_id, uuid));
            if stale {
                // An earlier task with this id that completed here (its
                // terminal update was acknowledged while the agent was
                // away): not the task that has the id now, if any. A task
                // of the id on this agent that the agent did not report is
                // sent again below; the stale update is refused when the
                // agent re-sends it.
                tracing::info!(agent_id = %aid, framework_id = %fid, task_id = %report.task.task_id, "re-registration reports a task that completed; not adopted");
                self.metrics.reports_refused_reregistration.inc();
                continue;
            }
            let Some(fw) = self.frameworks.get_mut(&fid) else {
                continue;
            };
            let key = (fid.clone(), report.task.task_id.clone());
            let reported_stamp = report.task.launch_stamp;
            // Whether the record of the id, on another agent, is of an
            // earlier launch than the reported task. Told by the launch
            // stamps when both have one; without, a running report is later
            // than an ended record (the id is launched again only once
            // its task ended).
            let superseded = fw.tasks.get(&report.task.task_id).is_some_and(|task| {
                task.agent_id != aid
                    && match (task.info.launch_stamp, reported_stamp) {
                        (Some(held), Some(reported)) => reported > held,
                        _ => task.state.is_terminal() && !report.state.is_terminal(),
                    }
            });
            if superseded {
                // The record is of an earlier task with this id, on another
                // agent (a master that failed over learnt it from that
                // agent's report of what its log still holds); this agent
                // has the task that has the id now. The earlier one is
                // completed (so that its agent's re-sends are refused, and
                // a copy still running there is killed) and this one
                // adopted below.
                if let Some(old) = fw.tasks.remove(&report.task.task_id) {
                    tracing::info!(agent_id = %aid, old_agent_id = %old.agent_id, framework_id = %fid, task_id = %report.task.task_id, "re-registration reports a later launch of a task id held on another agent; the later one is adopted");
                    let live = !old.state.is_terminal();
                    if let Some(other) = self.agents.get_mut(&old.agent_id) {
                        other
                            .tasks
                            .remove(&(fid.clone(), report.task.task_id.clone()));
                        if live {
                            other.used = other.used.saturating_sub(&old.resources);
                        }
                    }
                    if live {
                        self.allocator
                            .recover(&fid, &old.agent_id, &old.resources, None, now);
                        self.send_agent(
                            &old.agent_id,
                            Event::KillTask {
                                framework_id: fid.clone(),
                                task_id: report.task.task_id.clone(),
                            },
                        );
                    }
                    let state = old.state;
                    self.complete_task(old, state);
                }
            }
            // An ended launch of the id that is not later than one that
            // completed (on any agent): reported by an agent whose log lost
            // the record of that end, or whose acknowledgement was lost.
            let completed_later = reported_stamp.is_some_and(|reported| {
                self.completed.iter().any(|c| {
                    c.framework_id == fid
                        && c.task_id == report.task.task_id
                        && c.launch_stamp.is_some_and(|done| done >= reported)
                })
            });
            let Some(fw) = self.frameworks.get_mut(&fid) else {
                continue;
            };
            let forgotten_later = fw.tasks.get(&report.task.task_id).is_some_and(|task| {
                task.agent_id == aid
                    && matches!(
                        (report.task.launch_stamp, task.info.launch_stamp),
                        (Some(reported), Some(held)) if reported < held
                    )
            });
            if forgotten_later {
                // The agent reports an earlier launch of the id than the one
                // the master sent it: it lost the later one's records (a
                // damaged log). The later launch counts as not reported (sent
                // again if it never started, else lost, below); the earlier
                // one's end is settled, and its re-sent updates are refused
                // by their stamps.
                tracing::warn!(agent_id = %aid, framework_id = %fid, task_id = %report.task.task_id, "re-registration reports an earlier launch of a task id than the one sent to the agent; not adopted");
                self.metrics.reports_refused_reregistration.inc();
                continue;
            }
            let Some(fw) = self.frameworks.get_mut(&fid) else {
                continue;
            };
            match fw.tasks.get_mut(&report.task.task_id) {
                Some(task) if task.agent_id == aid => {
                    if !task.state.is_terminal() {
                        task.state = report.state;
                        if let Some(status) = report.latest_status {
                            task.set_latest_status(status);
                        }
                    }
                }
                Some(task) => {
                    // An earlier task with this id, whose stream this agent
                    // still holds; the task of that id lives elsewhere. A
                    // copy still running here, known by its stamp to be of
                    // an earlier launch, is killed.
                    let earlier = matches!(
                        (report.task.launch_stamp, task.info.launch_stamp),
                        (Some(reported), Some(held)) if reported < held
                    );
                    if earlier && !report.state.is_terminal() {
                        kill.push(key.clone());
                    }
                    tracing::warn!(agent_id = %aid, owner = %task.agent_id, framework_id = %fid, task_id = %report.task.task_id, "re-registration reports a task that lives on another agent; not adopted");
                    self.metrics.reports_refused_reregistration.inc();
                    continue;
                }
                None if completed_later
                    || self.completed.iter().any(|c| {
                        c.framework_id == fid
                            && c.task_id == report.task.task_id
                            && c.agent_id == aid
                            && (c.launch_stamp.is_none()
                                || reported_stamp.is_none()
                                || c.launch_stamp == reported_stamp)
                    }) =>
                {
                    // It ended here and its scheduler was told how: an
                    // agent that reports it again lost the record of that
                    // end (a damaged log). Adopting it would count its
                    // resources twice (they may be in use by a later task
                    // already) and show the scheduler a second terminal
                    // state. A copy still running is killed; its update is
                    // acknowledged without being forwarded, as for any
                    // completed task.
                    tracing::warn!(agent_id = %aid, framework_id = %fid, task_id = %report.task.task_id, state = %report.state, "re-registration reports a task that already completed; not adopted");
                    self.metrics.reports_refused_reregistration.inc();
                    if !report.state.is_terminal() {
                        kill.push(key);
                    }
                    continue;
                }
                None => {
                    let mut task = Task::new(fid.clone(), report.task, report.state);
                    task.agent_id = aid.clone();
                    if let Some(status) = report.latest_status {
                        task.set_latest_status(status);
                    }
                    fw.tasks.insert(task.info.task_id.clone(), task);
                }
            }
            reported.insert(key.clone());
            agent.tasks.insert(key);
        }
        for report in executors {
            let fid = report.framework_id;
            if !self.frameworks.contains_key(&fid) {
                if self.removed_frameworks.contains(&fid) {
                    shutdown_frameworks.insert(fid);
                }
                continue;
            }
            let eid = report.executor.executor_id.clone();
            // The command executor of a command task has the task's id; its
            // resources are the task's, accounted there.
            let is_command = self
                .frameworks
                .get(&fid)
                .and_then(|f| f.tasks.get(&TaskId::new(eid.as_str())))
                .is_some_and(|t| t.info.command.is_some() && t.info.executor.is_none());
            if !is_command {
                let mut exec = report.executor;
                exec.framework_id = Some(fid.clone());
                agent.executors.insert((fid, eid), exec);
            }
        }

        // Tasks the master sent to this agent that it does not report: one
        // still STAGING that the agent never reported on was most likely
        // lost in flight with the old connection (its RUN_TASK never
        // arrived), so it is sent again; any other is lost.
        let mut lost = Vec::new();
        let mut resend = Vec::new();
        let mut resend_executors = Vec::new();
        if known {
            for key in agent.tasks.iter() {
                if reported.contains(key) {
                    continue;
                }
                let Some(fw) = self.frameworks.get(&key.0) else {
                    continue;
                };
                if let Some(task) = fw.tasks.get(&key.1).filter(|t| t.agent_id == aid) {
                    if task.state == TaskState::Staging && task.latest_status.is_none() {
                        if let Some(exec) = &task.info.executor {
                            resend_executors
                                .push(((key.0.clone(), exec.executor_id.clone()), exec.clone()));
                        }
                        resend.push((fw.info.clone(), task.info.clone()));
                    } else if !task.state.is_terminal() {
                        lost.push(key.clone());
                    }
                }
            }
        }
        for (key, exec) in resend_executors {
            agent.executors.entry(key).or_insert(exec);
        }
        for (fid, tid) in &lost {
            if let Some(task) = self
                .frameworks
                .get_mut(fid)
                .and_then(|f| f.tasks.get_mut(tid))
            {
                task.state = TaskState::Lost;
                let status = master_status(
                    tid.clone(),
                    TaskState::Lost,
                    Reason::ReasonAgentRestarted,
                    "the re-registered agent does not have this task",
                    Some(aid.clone()),
                );
                task.set_latest_status(status.clone());
                self.send_framework(fid, scheduler::Event::Update { status });
            }
        }
        for (fid, tid) in lost {
            if let Some(task) = self
                .frameworks
                .get_mut(&fid)
                .and_then(|f| f.tasks.remove(&tid))
            {
                agent.tasks.remove(&(fid, tid));
                self.complete_task(task, TaskState::Lost);
            }
        }

        // Rebuild the accounting from scratch: it is authoritative now.
        let mut per_framework: HashMap<FrameworkId, Resources> = HashMap::default();
        for (fid, tid) in &agent.tasks {
            let task = self.frameworks.get(fid).and_then(|f| f.tasks.get(tid));
            if let Some(task) = task.filter(|t| t.agent_id == aid) {
                if !task.state.is_terminal() {
                    per_framework
                        .entry(fid.clone())
                        .or_default()
                        .add_all(&task.resources);
                }
            }
        }
        for ((fid, _), exec) in &agent.executors {
            per_framework
                .entry(fid.clone())
                .or_default()
                .add_all(&exec.resources);
        }
        agent.used = per_framework
            .values()
            .fold(Resources::new(), |acc, r| &acc + r);
        agent.offered = Resources::new();
        let used: Vec<(FrameworkId, Resources)> = per_framework.into_iter().collect();
        self.allocator.remove_agent(&aid);
        let held = agent.deactivated || agent.drain.is_some();
        self.allocator.add_agent(&aid, &agent.total, &used, !held);

        tracing::info!(agent_id = %aid, hostname = %agent.info.hostname, tasks = agent.tasks.len(), "agent re-registered");
        self.agents.insert(aid.clone(), agent);
        self.agent_conns.insert(conn, aid.clone());
        self.send_agent_conn(
            conn,
            Event::Registered {
                agent_id: aid.clone(),
                ping_interval_seconds: self.config.agent_ping_interval.as_secs_f64(),
                master_info: self.info.clone(),
                reregistered: true,
            },
        );
        for framework_id in shutdown_frameworks {
            self.send_agent_conn(conn, Event::ShutdownFramework { framework_id });
        }
        for (framework_id, task_id) in kill {
            self.send_agent_conn(
                conn,
                Event::KillTask {
                    framework_id,
                    task_id,
                },
            );
        }
        // The tasks of a group go again together, as they went first.
        let mut groups: Vec<(FrameworkInfo, Vec<TaskInfo>)> = Vec::new();
        for (framework, task) in resend {
            tracing::info!(agent_id = %aid, task_id = %task.task_id, "re-sending a task the re-registered agent never received");
            if task.task_group.is_none() {
                self.send_agent_conn(conn, Event::RunTask { framework, task });
                continue;
            }
            let at = groups.iter().position(|(f, tasks)| {
                f.id == framework.id && tasks[0].task_group == task.task_group
            });
            match at {
                Some(at) => groups[at].1.push(task),
                None => groups.push((framework, vec![task])),
            }
        }
        for (framework, mut tasks) in groups {
            tasks.sort_by_key(|t| t.launch_stamp);
            self.send_agent_conn(conn, Event::RunTaskGroup { framework, tasks });
        }
        self.schedule_allocation(now);
    }

    pub(crate) fn agent_closed(&mut self, now: Instant, conn: ConnId) {
        let Some(aid) = self.agent_conns.remove(&conn) else {
            return;
        };
        if let Some(agent) = self.agents.get_mut(&aid) {
            agent.conn = None;
            agent.awaiting_pong = true;
        }
        tracing::info!(agent_id = %aid, "agent disconnected; its tasks are kept until it returns or times out");
        self.allocator.deactivate_agent(&aid);
        self.withdraw_agent_offers(now, &aid, true);
    }

    /// Agent `aid` cannot take new tasks (`unavailable`: why), or can
    /// again: none of its resources is offered meanwhile, and its
    /// outstanding offers are rescinded. Its running tasks go on.
    pub(crate) fn agent_availability(
        &mut self,
        now: Instant,
        aid: &AgentId,
        unavailable: Option<String>,
    ) {
        match unavailable {
            Some(reason) => {
                tracing::warn!(agent_id = %aid, %reason, "agent cannot take tasks; its resources are not offered until it can");
                if let Some(agent) = self.agents.get_mut(aid) {
                    agent.unavailable = Some(reason);
                }
                self.allocator.deactivate_agent(aid);
                self.withdraw_agent_offers(now, aid, true);
            }
            None => {
                tracing::info!(agent_id = %aid, "agent can take tasks again");
                if let Some(agent) = self.agents.get_mut(aid) {
                    agent.unavailable = None;
                }
                if self.operator_holds(aid) {
                    return;
                }
                self.allocator.activate_agent(aid);
                self.schedule_allocation(now);
            }
        }
    }

    pub(crate) fn pong(&mut self, aid: &AgentId) {
        // Ping bookkeeping is not part of `/state`.
        if let Some(agent) = self.agents.untracked_get_mut(aid) {
            agent.missed_pings = 0;
            agent.awaiting_pong = false;
        }
    }

    /// What the containers of agent `aid` use: kept on each running task
    /// they run there, for `/state`. A task the agent does not run is
    /// ignored.
    pub(crate) fn container_usage(
        &mut self,
        aid: &AgentId,
        containers: Vec<agora_proto::agent::ContainerUsage>,
    ) {
        for usage in containers {
            let Some(fw) = self.frameworks.untracked_get_mut(&usage.framework_id) else {
                continue;
            };
            for tid in &usage.tasks {
                let runs_here = fw
                    .tasks
                    .untracked_get_mut(tid)
                    .is_some_and(|t| t.agent_id == *aid && !t.state.is_terminal());
                if runs_here {
                    if let Some(task) = fw.tasks.get_mut(tid) {
                        task.usage = Some(usage.clone());
                    }
                }
            }
        }
    }

    /// Counts a missed ping for every agent that did not answer the last
    /// one, removes those past the limit and pings the connected rest.
    pub(crate) fn ping_agents(&mut self, now: Instant) {
        let max = self.config.max_missed_pings;
        let mut remove = Vec::new();
        let mut ping = Vec::new();
        // Ping bookkeeping is not part of `/state`; removals are tracked.
        for agent in self.agents.untracked_values_mut() {
            if agent.awaiting_pong {
                agent.missed_pings += 1;
            }
            if agent.missed_pings >= max {
                remove.push(agent.id.clone());
            } else if let Some(conn) = agent.conn {
                agent.awaiting_pong = true;
                ping.push(conn);
            }
        }
        for conn in ping {
            self.send_agent_conn(conn, Event::Ping);
        }
        for aid in remove {
            tracing::warn!(agent_id = %aid, missed_pings = max, "agent missed too many pings; removing it");
            self.remove_agent(now, &aid, "agent removed: too many missed pings");
        }
    }

    /// Forgets the agent: offers rescinded, live tasks `TASK_LOST`,
    /// frameworks told with `FAILURE`, id remembered as removed.
    pub(crate) fn remove_agent(&mut self, now: Instant, aid: &AgentId, reason: &str) {
        self.remove_agent_for(now, aid, reason, Reason::ReasonAgentRemoved)
    }

    /// [`Master::remove_agent`], its live tasks' updates with `task_reason`.
    pub(crate) fn remove_agent_for(
        &mut self,
        now: Instant,
        aid: &AgentId,
        reason: &str,
        task_reason: Reason,
    ) {
        self.withdraw_agent_offers(now, aid, true);
        let Some(agent) = self.agents.remove(aid) else {
            return;
        };
        self.metrics.agents_removed.inc();
        if let Some(conn) = agent.conn {
            self.agent_conns.remove(&conn);
            self.send_agent_conn(
                conn,
                Event::Shutdown {
                    message: reason.to_string(),
                },
            );
            self.push(Output::Close {
                conn,
                code: CLOSE_POLICY,
                reason: reason.to_string(),
            });
        }
        for (fid, tid) in agent.tasks {
            // Only a task that lives there: one of that id elsewhere is
            // another task.
            let lives_here = self
                .frameworks
                .get(&fid)
                .and_then(|f| f.tasks.get(&tid))
                .is_some_and(|t| t.agent_id == *aid);
            let Some(mut task) = self
                .frameworks
                .get_mut(&fid)
                .filter(|_| lives_here)
                .and_then(|f| f.tasks.remove(&tid))
            else {
                continue;
            };
            let state = if task.state.is_terminal() {
                task.state
            } else {
                let status =
                    master_status(tid, TaskState::Lost, task_reason, reason, Some(aid.clone()));
                task.set_latest_status(status.clone());
                self.send_framework(&fid, scheduler::Event::Update { status });
                TaskState::Lost
            };
            self.complete_task(task, state);
        }
        self.allocator.remove_agent(aid);
        self.removed_agents.insert(aid.clone());
        self.persist(RegistryOp::RemoveAgent { id: aid.clone() });
        let conns: Vec<ConnId> = self.frameworks.values().filter_map(|f| f.conn).collect();
        for conn in conns {
            self.send_scheduler(
                conn,
                scheduler::Event::Failure {
                    agent_id: aid.clone(),
                    executor_id: None,
                    status: None,
                },
            );
        }
    }

    /// Removes the agents of the registry that did not re-register within
    /// the `agent_reregister_timeout` after a restart. Their tasks were
    /// never rebuilt: frameworks hear `agent_lost` now, and `TASK_LOST`
    /// when they reconcile them.
    pub(crate) fn remove_unreturned_agents(&mut self, now: Instant) {
        let gone: Vec<AgentId> = self
            .agents
            .values()
            .filter(|a| a.recovering)
            .map(|a| a.id.clone())
            .collect();
        for aid in gone {
            tracing::warn!(agent_id = %aid, timeout = ?self.config.agent_reregister_timeout, "agent did not re-register after the master restarted; removing it");
            self.remove_agent(
                now,
                &aid,
                "agent removed: it did not re-register within agent_reregister_timeout after a master restart",
            );
        }
    }

    pub(crate) fn executor_exited(
        &mut self,
        now: Instant,
        aid: &AgentId,
        fid: FrameworkId,
        executor_id: ExecutorId,
        status: Option<i32>,
        message: &str,
    ) {
        tracing::info!(agent_id = %aid, framework_id = %fid, executor_id = %executor_id, ?status, message, "executor exited");
        // A task launched on this executor that the agent has not heard
        // from (STAGING, no update) crossed the exit on the wire: the
        // agent's updates for a task it had travel ahead of the exit on
        // its connection, so it received the RUN_TASK after the executor
        // was gone and starts the executor anew for it. That executor
        // stays on the books (its own exit is reported in turn); else its
        // resources would be offered while it runs.
        let restarting = self.agents.get(aid).is_some_and(|agent| {
            agent.tasks.iter().any(|(f, t)| {
                *f == fid
                    && self
                        .frameworks
                        .get(f)
                        .and_then(|fw| fw.tasks.get(t))
                        .is_some_and(|task| {
                            task.agent_id == *aid
                                && task.executor_id == executor_id
                                && task.state == TaskState::Staging
                                && task.latest_status.is_none()
                        })
            })
        });
        if restarting {
            tracing::info!(agent_id = %aid, framework_id = %fid, executor_id = %executor_id, "a task launched on the exited executor is on its way; the executor stays on the books");
        }
        if let Some(agent) = self.agents.get_mut(aid).filter(|_| !restarting) {
            if let Some(exec) = agent.executors.remove(&(fid.clone(), executor_id.clone())) {
                agent.used = agent.used.saturating_sub(&exec.resources);
                if !exec.resources.is_empty() {
                    self.allocator
                        .recover(&fid, aid, &exec.resources, None, now);
                    self.schedule_allocation(now);
                }
            }
        }
        self.send_framework(
            &fid,
            scheduler::Event::Failure {
                agent_id: aid.clone(),
                executor_id: Some(executor_id),
                status,
            },
        );
    }

    pub(crate) fn message_to_scheduler(
        &mut self,
        aid: &AgentId,
        fid: FrameworkId,
        executor_id: ExecutorId,
        data: Bytes,
    ) {
        let sent = self.send_framework(
            &fid,
            scheduler::Event::Message {
                agent_id: aid.clone(),
                executor_id,
                data,
            },
        );
        if !sent {
            tracing::debug!(framework_id = %fid, "framework not connected; executor message dropped");
        }
    }
}

/// A principal for a refusal's message.
pub(crate) fn describe_principal(principal: Option<&str>) -> String {
    principal.map_or("no principal (unauthenticated)".to_string(), |p| {
        format!("principal {p:?}")
    })
}

/// The first scalar of `resources` (summed over roles) above what `max`
/// allows of it: name, offered, most allowed.
fn over_limit<'a>(resources: &Resources, max: &'a Resources) -> Option<(&'a str, f64, f64)> {
    max.scalar_totals()
        .into_iter()
        .map(|(name, most)| (name, resources.scalar(name), most))
        .find(|(_, offered, most)| offered > most)
}
