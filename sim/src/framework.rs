//! Frameworks: the real scheduler driver core, played by the simulation as
//! a framework that runs a workload of tasks (command tasks and tasks of
//! custom executors, each with its plan), kills some, reconciles, and
//! fails over (same framework id) when its process crashes.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::time::Duration;

use agora_proto::scheduler::{self as sched_api, ReconcileTask};
use agora_proto::{
    AgentId, CommandInfo, ExecutorId, ExecutorInfo, Filters, FrameworkId, FrameworkInfo, Offer,
    Resources, TaskId, TaskInfo, TaskState,
};
use agora_scheduler::sim::{Action, Callback, Command, SimScheduler};
use agora_scheduler::DriverConfig;
use rand::Rng;

use crate::executor::TaskPlan;
use crate::world::{ConnKind, Ev, Msg, Side, Time, World, MS, SEC};

/// How a task is run.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Runner {
    Command,
    /// A custom executor of its own.
    Custom,
    /// A custom executor that several tasks share (one per agent).
    Shared,
}

/// The label of a simulated `TaskInfo` that numbers its launch of the
/// task id (from 1): the agents and the master keep a task's labels, so the
/// simulation can tell which launch a record or an update is about.
pub(crate) const LAUNCH_LABEL: &str = "sim-launch";

/// Most launches of one task id.
const MAX_LAUNCHES: u32 = 3;

/// How long a framework keeps an offer for an immediate retry, and how
/// long it waits after giving one back before it keeps another.
const HOLD_LIMIT: Time = 5 * SEC;
const HOLD_PAUSE: Time = 30 * SEC;

/// The launch a task's labels name.
pub(crate) fn launch_of(labels: &BTreeMap<String, String>) -> Option<u32> {
    labels.get(LAUNCH_LABEL).and_then(|l| l.parse().ok())
}

/// A task the framework wants run.
#[derive(Debug, Clone)]
pub(crate) struct Want {
    pub id: TaskId,
    /// Which launch of the id this is (from 1): an id whose task ended may
    /// be launched again.
    pub launch: u32,
    pub cpus: f64,
    pub mem: f64,
    pub runner: Runner,
    /// Kill it this long after launching it.
    pub kill_after: Option<Time>,
    /// A probe after the faults stopped: it must finish.
    pub probe: bool,
}

/// A task the framework launched.
#[derive(Debug, Clone)]
pub(crate) struct FwTask {
    pub launch: u32,
    pub want: Want,
    pub agent: AgentId,
    pub launched_at: Time,
    pub last_heard: Time,
    pub state: Option<TaskState>,
    pub kill_at: Option<Time>,
    pub killed_at: Option<Time>,
    /// The latest launch stamp heard in an update of the id, any launch.
    pub seen_stamp: Option<agora_proto::LaunchStamp>,
    /// The latest stamp heard before this launch: an update stamped no
    /// later is of an earlier launch of the id (the framework tells
    /// launches apart by their stamps, as Agora lets it).
    pub before: Option<agora_proto::LaunchStamp>,
}

/// A framework: its scheduler process (driver and logic) and what it
/// keeps across failovers.
pub(crate) struct FwNode {
    pub name: String,
    pub info: FrameworkInfo,
    pub driver: Option<SimScheduler>,
    pub inc: u64,
    pub conn: Option<u64>,
    pub subscribed: bool,
    pub queue: VecDeque<Want>,
    pub tasks: BTreeMap<TaskId, FwTask>,
    pub suppressed: bool,
    /// An offer kept to use again later (a stale offer: bad input).
    pub stale_offer: Option<Offer>,
    /// An offer kept unused, for retrying a task at once from its status
    /// callback: the launch goes out before the driver's implicit
    /// acknowledgement of the update that ended the task, so the old
    /// task's stream is still open on its agent when the RUN_TASK arrives
    /// (on that agent if the offer is from it).
    pub held_offer: Option<Offer>,
    /// When `held_offer` was kept: a framework gives it back after
    /// [`HOLD_LIMIT`] (hoarding offers starves the others; the master's
    /// offer timeout is only the backstop).
    pub held_since: Time,
    pub next_reconcile: Time,
    pub clock: f64,
    /// The launch the master's record was about when it made the update
    /// being delivered (the simulation's omniscience, for the checker).
    pub delivering: Option<u32>,
    /// The uuids of the updates it has heard: delivery is at least once,
    /// and a repeat says nothing new (about any launch of the id).
    pub heard: BTreeSet<String>,
    /// What the running driver delivered (`ONCE`): each (task, uuid)...
    pub delivered: BTreeSet<(TaskId, String)>,
    /// ...the task ids it launched, with the newest launch stamp it had
    /// delivered of each then...
    pub launched_here: BTreeMap<TaskId, Option<agora_proto::LaunchStamp>>,
    /// ...the newest launch stamp of each id's delivered updates...
    pub newest_stamp: BTreeMap<TaskId, agora_proto::LaunchStamp>,
    /// ...and those of them whose own terminal update (with a uuid, not
    /// stamped older than the launch's other updates nor than what it
    /// knew before the launch) it delivered since it last launched them.
    pub ended: BTreeSet<TaskId>,
}

// === impl World: frameworks ===

impl World {
    pub(crate) fn fw_add(&mut self, f: usize) {
        let role = if self.rng.random_bool(0.5) {
            "*".to_string()
        } else {
            format!("role-{f}")
        };
        let info = FrameworkInfo {
            user: "sim".into(),
            name: format!("fw{f}"),
            id: None,
            failover_timeout: 7.0 * 24.0 * 3600.0,
            checkpoint: true,
            roles: vec![role],
            hostname: format!("s{f}"),
            principal: crate::forgery::Principal::Framework(f).name(),
            webui_url: None,
        };
        self.fws.push(FwNode {
            name: format!("fw{f}"),
            info,
            driver: None,
            inc: 0,
            conn: None,
            subscribed: false,
            queue: VecDeque::new(),
            tasks: BTreeMap::new(),
            suppressed: false,
            stale_offer: None,
            held_offer: None,
            held_since: 0,
            next_reconcile: 30 * SEC,
            clock: 0.0,
            delivering: None,
            heard: BTreeSet::new(),
            delivered: BTreeSet::new(),
            launched_here: BTreeMap::new(),
            newest_stamp: BTreeMap::new(),
            ended: BTreeSet::new(),
        });
    }

    /// Starts (or restarts, failing over) framework `f`'s scheduler.
    pub(crate) fn fw_start(&mut self, f: usize) {
        let fw = &mut self.fws[f];
        if fw.driver.is_some() {
            return;
        }
        fw.inc += 1;
        fw.conn = None;
        fw.subscribed = false;
        // A new scheduler process: its driver remembers nothing.
        fw.delivered.clear();
        fw.launched_here.clear();
        fw.newest_stamp.clear();
        fw.ended.clear();
        let config = DriverConfig {
            master: "sim-master:5050".into(),
            implicit_acknowledgements: true,
            reconnect_backoff_min: Duration::from_millis(100),
            reconnect_backoff_max: Duration::from_secs(5),
            credential: None,
            tls: None,
            remembered_tasks: DriverConfig::DEFAULT_REMEMBERED_TASKS,
        };
        fw.driver = Some(SimScheduler::new(fw.info.clone(), &config));
        let inc = fw.inc;
        self.note(|| format!("framework {f} started (incarnation {inc})"));
        let d = self.between(0, 500 * MS);
        self.after(d, Ev::SchedConnect { fw: f, inc });
        self.after(SEC, Ev::SchedTick { fw: f, inc });
    }

    /// The scheduler process dies (its framework state survives: a real
    /// framework keeps it in a store).
    pub(crate) fn fw_crash(&mut self, f: usize) {
        let fw = &mut self.fws[f];
        if fw.driver.is_none() {
            return;
        }
        fw.driver = None;
        fw.subscribed = false;
        if let Some(conn) = fw.conn.take() {
            self.drop_side(conn, Side::Client, (100_000, 5 * MS));
        }
        self.note(|| format!("framework {f} crashed"));
    }

    pub(crate) fn sched_connect(&mut self, f: usize, inc: u64) {
        let fw = &self.fws[f];
        if fw.inc != inc || fw.driver.is_none() || fw.conn.is_some() {
            return;
        }
        let cut_off = self.cut_off(None, Some(f));
        if !self.master.up || cut_off {
            let fail = self.connect_failure_delay(cut_off);
            let sample = self.rng.random::<f64>();
            let backoff = self.fws[f]
                .driver
                .as_mut()
                .map(|d| d.next_backoff(sample))
                .unwrap_or_default();
            let d = fail + u64::try_from(backoff.as_nanos()).unwrap_or(u64::MAX / 4);
            self.after(d, Ev::SchedConnect { fw: f, inc });
            return;
        }
        let conn = self.open(ConnKind::Sched {
            fw: f,
            inc,
            master: self.master.inc,
        });
        self.fws[f].conn = Some(conn);
        let now = self.now();
        let actions = self.fws[f]
            .driver
            .as_mut()
            .map(|d| d.on_connected(now))
            .unwrap_or_default();
        self.sched_apply(f, actions);
    }

    pub(crate) fn sched_event(
        &mut self,
        f: usize,
        inc: u64,
        conn: u64,
        event: sched_api::Event,
        launch: Option<u32>,
    ) {
        let fw = &self.fws[f];
        if fw.inc != inc || fw.conn != Some(conn) {
            return;
        }
        let now = self.now();
        self.wall(self.fws[f].clock);
        let actions = self.fws[f]
            .driver
            .as_mut()
            .map(|d| d.on_event(event, now))
            .unwrap_or_default();
        self.fws[f].delivering = launch;
        self.sched_apply(f, actions);
        self.fws[f].delivering = None;
    }

    pub(crate) fn sched_conn_ended(&mut self, f: usize, inc: u64, conn: u64, _reason: &str) {
        let fw = &mut self.fws[f];
        if fw.inc != inc || fw.conn != Some(conn) {
            return;
        }
        fw.conn = None;
        fw.subscribed = false;
        let actions = fw
            .driver
            .as_mut()
            .map(|d| d.on_disconnected())
            .unwrap_or_default();
        self.sched_apply(f, actions);
        self.sched_backoff(f, inc);
    }

    fn sched_backoff(&mut self, f: usize, inc: u64) {
        let sample = self.rng.random::<f64>();
        let Some(driver) = self.fws[f].driver.as_mut() else {
            return;
        };
        let d = driver.next_backoff(sample);
        self.after_dur(d, Ev::SchedConnect { fw: f, inc });
    }

    pub(crate) fn sched_tick(&mut self, f: usize, inc: u64) {
        let fw = &self.fws[f];
        if fw.inc != inc || fw.driver.is_none() {
            return;
        }
        let now = self.now();
        let actions = self.fws[f]
            .driver
            .as_mut()
            .map(|d| d.on_tick(now))
            .unwrap_or_default();
        self.sched_apply(f, actions);
        if self.fws[f].inc == inc && self.fws[f].driver.is_some() {
            self.after(SEC, Ev::SchedTick { fw: f, inc });
        }
    }

    fn sched_command(&mut self, f: usize, command: Command) {
        let actions = self.sched_feed(f, command);
        self.sched_apply(f, actions);
    }

    /// Hands a command to framework `f`'s driver.
    fn sched_feed(&mut self, f: usize, command: Command) -> Vec<Action> {
        let fw = &mut self.fws[f];
        if let Command::Launch { tasks, .. } = &command {
            for task in tasks {
                let newest = fw.newest_stamp.get(&task.task_id).copied();
                fw.launched_here.insert(task.task_id.clone(), newest);
                fw.ended.remove(&task.task_id);
            }
        }
        fw.driver
            .as_mut()
            .map(|d| d.on_command(command))
            .unwrap_or_default()
    }

    /// Carries out the driver's actions, running the framework's
    /// callbacks.
    fn sched_apply(&mut self, f: usize, actions: Vec<Action>) {
        let inc = self.fws[f].inc;
        let mut queue: VecDeque<Action> = actions.into();
        while let Some(action) = queue.pop_front() {
            if self.fws[f].inc != inc || self.fws[f].driver.is_none() {
                return;
            }
            match action {
                Action::Send(call) => {
                    if let Some(conn) = self.fws[f].conn {
                        let asked = match &call {
                            sched_api::Call::Reconcile { tasks } => tasks
                                .iter()
                                .map(|t| {
                                    let launch = self.check.current_launch(f, &t.task_id);
                                    (t.task_id.clone(), launch)
                                })
                                .collect(),
                            sched_api::Call::Kill { task_id, .. } => {
                                vec![(task_id.clone(), self.check.current_launch(f, task_id))]
                            }
                            _ => Vec::new(),
                        };
                        self.send(conn, Side::Client, Msg::SchedCall(Box::new(call), asked));
                    }
                }
                Action::Callback(cb) => {
                    let commands = self.fw_callback(f, cb);
                    for command in commands {
                        let more = self.sched_feed(f, command);
                        queue.extend(more);
                    }
                }
                Action::FrameworkId(id) => {
                    self.fws[f].info.id = Some(id.clone());
                    self.check.framework_id(f, id);
                }
                Action::Reconnect(reason) => {
                    if let Some(conn) = self.fws[f].conn.take() {
                        self.close(conn, Side::Client, &reason);
                    }
                    self.fws[f].subscribed = false;
                    let more = self.fws[f]
                        .driver
                        .as_mut()
                        .map(|d| d.on_disconnected())
                        .unwrap_or_default();
                    queue.extend(more);
                    self.sched_backoff(f, inc);
                }
                Action::Finish(outcome) => {
                    self.note(|| format!("framework {f}'s driver ended: {outcome:?}"));
                    if let Some(conn) = self.fws[f].conn.take() {
                        self.close(conn, Side::Client, "driver ended");
                    }
                    self.fws[f].driver = None;
                    // Its supervisor starts it again, failing over.
                    let d = self.between(SEC, 5 * SEC);
                    self.after(d, Ev::Fault(crate::faults::Fault::SchedRestart { fw: f }));
                    return;
                }
            }
        }
    }

    /// The framework's logic: what it does on each callback.
    fn fw_callback(&mut self, f: usize, cb: Callback) -> Vec<Command> {
        match cb {
            Callback::Registered { framework_id, .. } => {
                self.fws[f].info.id = Some(framework_id.clone());
                self.check.framework_id(f, framework_id);
                self.fws[f].subscribed = true;
                self.fws[f].suppressed = false;
                vec![self.fw_reconcile(f)]
            }
            Callback::Reregistered { .. } => {
                self.fws[f].subscribed = true;
                self.fws[f].suppressed = false;
                vec![self.fw_reconcile(f)]
            }
            Callback::ResourceOffers(offers) => self.fw_offers(f, offers),
            Callback::StatusUpdate(status) => {
                let t = self.t;
                let fw = &mut self.fws[f];
                let once = match &status.uuid {
                    Some(uuid) => fw.delivered.insert((status.task_id.clone(), uuid.clone())),
                    None => !fw.ended.contains(&status.task_id),
                };
                if once && status.uuid.is_some() {
                    let newest = fw.newest_stamp.get(&status.task_id).copied();
                    let current = match (status.launch_stamp, fw.launched_here.get(&status.task_id))
                    {
                        (_, None) => false,
                        (Some(stamp), Some(before)) => {
                            newest.is_none_or(|n| stamp >= n) && before.is_none_or(|b| stamp > b)
                        }
                        (None, Some(_)) => newest.is_none(),
                    };
                    if let Some(stamp) = status.launch_stamp {
                        let entry = fw
                            .newest_stamp
                            .entry(status.task_id.clone())
                            .or_insert(stamp);
                        *entry = (*entry).max(stamp);
                    }
                    if current && status.state.is_terminal() {
                        fw.ended.insert(status.task_id.clone());
                    }
                }
                if !once {
                    let detail = format!(
                        "framework {f}'s driver delivered {} {} ({:?}, {:?}, uuid {:?}) again",
                        status.task_id,
                        status.state.as_str(),
                        status.source,
                        status.reason,
                        status.uuid
                    );
                    self.violated(crate::check::ONCE, detail);
                }
                let fw = &mut self.fws[f];
                let tag = fw.delivering;
                let mut ended = None;
                // An answer the master made (no uuid) before it took the
                // framework's latest launch of the id is about an earlier
                // task: Mesos gives it no mark, so a framework that reuses
                // ids must tell by itself (here the simulation tells it).
                let earlier =
                    |launch: u32| status.uuid.is_none() && tag.is_some_and(|l| l < launch);
                let repeat = status
                    .uuid
                    .as_ref()
                    .is_some_and(|u| !fw.heard.insert(u.clone()));
                let mut stale_by_stamp = false;
                if let (Some(task), Some(stamp)) =
                    (fw.tasks.get_mut(&status.task_id), status.launch_stamp)
                {
                    stale_by_stamp = task.before.is_some_and(|before| stamp <= before);
                    task.seen_stamp = task.seen_stamp.max(Some(stamp));
                }
                if let Some(task) = fw
                    .tasks
                    .get_mut(&status.task_id)
                    .filter(|task| !repeat && !earlier(task.launch) && !stale_by_stamp)
                {
                    task.last_heard = t;
                    if task.state.is_none_or(|s| !s.is_terminal()) {
                        task.state = Some(status.state);
                        if status.state.is_terminal() {
                            ended = Some(task.want.clone());
                        }
                    }
                }
                if let Err((invariant, detail)) =
                    self.check.sched_update(f, &status, tag, stale_by_stamp, t)
                {
                    self.violated(invariant, detail);
                }
                let mut commands = Vec::new();
                let relaunched = ended.is_some_and(|want| self.fw_maybe_relaunch(f, want));
                if relaunched {
                    if let Some(launch) = self.fw_launch_held(f) {
                        commands.push(launch);
                    }
                }
                if status.uuid.is_some() {
                    commands.push(Command::Acknowledge {
                        status,
                        implicit: true,
                    });
                }
                if relaunched && self.fws[f].suppressed && self.fws[f].subscribed {
                    self.fws[f].suppressed = false;
                    commands.push(Command::Call(sched_api::Call::Revive { roles: Vec::new() }));
                }
                commands
            }
            Callback::Error(message) => {
                self.note(|| format!("framework {f}: error {message}"));
                Vec::new()
            }
            Callback::Disconnected => {
                self.fws[f].subscribed = false;
                Vec::new()
            }
            Callback::OfferRescinded(id) => {
                if self.fws[f].held_offer.as_ref().is_some_and(|o| o.id == id) {
                    self.fws[f].held_offer = None;
                }
                Vec::new()
            }
            Callback::FrameworkMessage { .. }
            | Callback::AgentLost(_)
            | Callback::ExecutorLost { .. } => Vec::new(),
        }
    }

    /// Explicit reconciliation of every task it has not seen end.
    fn fw_reconcile(&mut self, f: usize) -> Command {
        let tasks = self.fws[f]
            .tasks
            .iter()
            .filter(|(_, t)| t.state.is_none_or(|s| !s.is_terminal()))
            .map(|(id, t)| ReconcileTask {
                task_id: id.clone(),
                agent_id: Some(t.agent.clone()),
            })
            .collect();
        Command::Call(sched_api::Call::Reconcile { tasks })
    }

    fn fw_offers(&mut self, f: usize, offers: Vec<Offer>) -> Vec<Command> {
        let mut commands = Vec::new();
        let fid = self.fws[f].info.id.clone();
        for offer in offers {
            if self.faulty
                && self.fws[f].stale_offer.is_none()
                && self.chance(self.plan.stale_offer_rate)
            {
                // Keep it to launch on again once it is used: a stale
                // offer.
                self.fws[f].stale_offer = Some(offer.clone());
            }
            if self.fws[f].held_offer.is_none()
                && self.fws[f].held_since + HOLD_PAUSE <= self.t
                && self.chance(self.plan.reuse_rate / 2.0)
            {
                self.fws[f].held_offer = Some(offer);
                self.fws[f].held_since = self.t;
                continue;
            }
            let mut free = offer.resources.clone();
            let mut tasks = Vec::new();
            let mut keep = VecDeque::new();
            // A probe that does not fit holds the rest back: launching
            // smaller tasks past it would keep it waiting for good.
            let mut probe_waits = false;
            while let Some(want) = self.fws[f].queue.pop_front() {
                if probe_waits && !want.probe {
                    keep.push_back(want);
                    continue;
                }
                match self.fw_fit(f, &want, &offer, &free, fid.as_ref()) {
                    None if want.probe => {
                        probe_waits = true;
                        keep.push_back(want);
                    }
                    Some(task) => {
                        free = free.saturating_sub(&task.resources);
                        if let Some(e) = &task.executor {
                            free = free.saturating_sub(&e.resources);
                        }
                        self.fw_launched(f, &want, &task);
                        tasks.push(task);
                    }
                    None => keep.push_back(want),
                }
            }
            self.fws[f].queue = keep;
            if tasks.is_empty() {
                let refuse = self.between(SEC, 5 * SEC) as f64 / SEC as f64;
                commands.push(Command::Decline {
                    offer_ids: vec![offer.id],
                    filters: Filters {
                        refuse_seconds: Some(refuse),
                    },
                });
            } else {
                commands.push(Command::Launch {
                    offer_ids: vec![offer.id],
                    tasks,
                    filters: Filters {
                        refuse_seconds: Some(1.0),
                    },
                });
            }
        }
        if self.fws[f].queue.is_empty() && !self.fws[f].suppressed {
            self.fws[f].suppressed = true;
            commands.push(Command::Call(sched_api::Call::Suppress {
                roles: Vec::new(),
            }));
        }
        commands
    }

    /// The task `want` on `offer` if it fits in `free`.
    fn fw_fit(
        &mut self,
        f: usize,
        want: &Want,
        offer: &Offer,
        free: &Resources,
        fid: Option<&FrameworkId>,
    ) -> Option<TaskInfo> {
        let resources = resources(want.cpus, want.mem);
        let executor = match want.runner {
            Runner::Command => None,
            Runner::Custom => Some(executor_info(
                ExecutorId::new(format!("e-{}", want.id)),
                fid,
            )),
            Runner::Shared => Some(executor_info(
                ExecutorId::new(format!("e-{}-shared", self.fws[f].name)),
                fid,
            )),
        };
        let mut need = resources.clone();
        if let Some(e) = &executor {
            if !(want.runner == Runner::Shared && offer.executor_ids.contains(&e.executor_id)) {
                need += &e.resources;
            }
        }
        if !free.contains(&need) {
            return None;
        }
        let command = match want.runner {
            Runner::Command => Some(CommandInfo {
                value: format!("run {}", want.id),
                shell: false,
                arguments: Vec::new(),
                environment: Default::default(),
                uris: Vec::new(),
            }),
            _ => None,
        };
        Some(TaskInfo {
            container: None,
            allocation_role: None,
            launch_stamp: None,
            name: format!("task {}", want.id),
            task_id: want.id.clone(),
            agent_id: offer.agent_id.clone(),
            resources,
            executor,
            command,
            data: None,
            kill_grace_period: None,
            labels: [(LAUNCH_LABEL.to_string(), want.launch.to_string())]
                .into_iter()
                .collect(),
            task_group: None,
        })
    }

    fn fw_launched(&mut self, f: usize, want: &Want, task: &TaskInfo) {
        let t = self.t;
        self.check
            .launched(f, &task.task_id, want.launch, &task.agent_id, want.probe, t);
        let seen = self.fws[f]
            .tasks
            .get(&task.task_id)
            .and_then(|old| old.seen_stamp);
        self.fws[f].tasks.insert(
            task.task_id.clone(),
            FwTask {
                launch: want.launch,
                want: want.clone(),
                agent: task.agent_id.clone(),
                launched_at: t,
                last_heard: t,
                state: None,
                kill_at: want.kill_after.map(|k| t + k),
                killed_at: None,
                seen_stamp: seen,
                before: seen,
            },
        );
    }

    /// The framework's own timers: kills, reconciliation, launching on a
    /// stale offer.
    pub(crate) fn fw_wake(&mut self, f: usize) {
        self.after(SEC, Ev::FwWake { fw: f });
        if !self.fws[f].subscribed || self.fws[f].driver.is_none() {
            return;
        }
        let t = self.t;
        let mut kills = Vec::new();
        let plans = &self.plans;
        for (id, task) in self.fws[f].tasks.iter_mut() {
            if task.state.is_some_and(|s| s.is_terminal()) {
                continue;
            }
            // A task that overran its expected time is killed (a
            // framework's task timeout).
            let expected = plans
                .get(&(id.clone(), task.launch))
                .map_or(0, |p| p.duration);
            if task.kill_at.is_none() && t > task.launched_at + expected + 30 * SEC {
                task.kill_at = Some(t);
            }
            let due = task.kill_at.is_some_and(|k| k <= t)
                && task.killed_at.is_none_or(|k| t >= k + 10 * SEC);
            if due {
                task.killed_at = Some(t);
                kills.push((id.clone(), task.agent.clone()));
            }
        }
        for (task_id, agent_id) in kills {
            self.sched_command(
                f,
                Command::Call(sched_api::Call::Kill {
                    task_id,
                    agent_id: Some(agent_id),
                }),
            );
        }
        if t >= self.fws[f].next_reconcile {
            let d = self.between(20 * SEC, 40 * SEC);
            self.fws[f].next_reconcile = t + d;
            let implicit = self.chance(0.2);
            let command = if implicit {
                Command::Call(sched_api::Call::Reconcile { tasks: Vec::new() })
            } else {
                self.fw_reconcile(f)
            };
            self.sched_command(f, command);
        }
        if self.fws[f].held_since + HOLD_LIMIT <= t {
            if let Some(offer) = self.fws[f].held_offer.take() {
                self.sched_command(
                    f,
                    Command::Decline {
                        offer_ids: vec![offer.id],
                        filters: Filters {
                            refuse_seconds: Some(1.0),
                        },
                    },
                );
            }
        }
        if let Some(offer) = self.fws[f].stale_offer.clone() {
            if self.fws[f]
                .tasks
                .values()
                .any(|task| task.launched_at + SEC < t)
            {
                self.fws[f].stale_offer = None;
                if let Some(want) = self.fws[f].queue.pop_front() {
                    let fid = self.fws[f].info.id.clone();
                    let free = offer.resources.clone();
                    match self.fw_fit(f, &want, &offer, &free, fid.as_ref()) {
                        Some(task) => {
                            self.note(|| {
                                format!(
                                    "framework {f} launches {} on stale offer {}",
                                    task.task_id, offer.id
                                )
                            });
                            self.fw_launched(f, &want, &task);
                            self.sched_command(
                                f,
                                Command::Launch {
                                    offer_ids: vec![offer.id.clone()],
                                    tasks: vec![task],
                                    filters: Filters::default(),
                                },
                            );
                        }
                        None => self.fws[f].queue.push_front(want),
                    }
                }
            }
        }
        if !self.fws[f].queue.is_empty() && self.fws[f].suppressed {
            self.fws[f].suppressed = false;
            self.sched_command(
                f,
                Command::Call(sched_api::Call::Revive { roles: Vec::new() }),
            );
        }
    }

    /// Adds `n` tasks to framework `f`'s queue, with their plans.
    pub(crate) fn fw_enqueue(&mut self, f: usize, n: usize, probe: bool) {
        for _ in 0..n {
            let k = self.check.next_task_number();
            let id = TaskId::new(format!("f{f}-t{k}"));
            // A probe never goes to the shared executor, which a fault may
            // have left hung.
            let runner = match self.rng.random_range(0..10) {
                0..=4 => Runner::Command,
                5..=8 => Runner::Custom,
                _ if probe => Runner::Custom,
                _ => Runner::Shared,
            };
            let want = Want {
                id,
                launch: 1,
                cpus: [0.1, 0.25, 0.5, 1.0][self.rng.random_range(0..4)],
                mem: [32.0, 64.0, 128.0, 256.0][self.rng.random_range(0..4)],
                runner,
                kill_after: None,
                probe,
            };
            let want = self.fw_plan(want);
            // A probe goes first: it measures the cluster, not the
            // backlog ahead of it.
            if probe {
                self.fws[f].queue.push_front(want);
            } else {
                self.fws[f].queue.push_back(want);
            }
        }
        self.fw_revive(f);
    }

    /// Draws how launch `want.launch` of a task goes: its plan, and
    /// whether the framework kills it.
    fn fw_plan(&mut self, mut want: Want) -> Want {
        let probe = want.probe;
        let duration = self.between(200 * MS, 20 * SEC);
        let outcome = if probe || self.rng.random_bool(0.8) {
            TaskState::Finished
        } else {
            TaskState::Failed
        };
        let data = if self.plan.big_updates && !probe && want.runner != Runner::Command {
            self.rng.random_range(256 << 10..1 << 20)
        } else {
            0
        };
        let chatter = if data > 0 {
            self.rng.random_range(5..30)
        } else {
            self.rng.random_range(0..3)
        };
        self.plans.insert(
            (want.id.clone(), want.launch),
            TaskPlan {
                duration,
                outcome,
                data,
                chatter,
            },
        );
        want.kill_after = if !probe && self.chance(0.15) {
            Some(self.between(0, 10 * SEC))
        } else {
            None
        };
        want
    }

    /// The scheduler heard that a task ended: as real frameworks do (a
    /// job's task retried under its name), it may launch the id again,
    /// on whatever agent the next offer comes from (the same one
    /// included). Mesos allows it once the task is terminal; the new
    /// launch is a new task.
    fn fw_maybe_relaunch(&mut self, f: usize, want: Want) -> bool {
        if want.probe
            || !self.faulty
            || want.launch >= MAX_LAUNCHES
            || !self.chance(self.plan.reuse_rate)
        {
            return false;
        }
        let again = self.fw_plan(Want {
            launch: want.launch + 1,
            ..want
        });
        self.note(|| {
            format!(
                "framework {f} launches {} again (launch {})",
                again.id, again.launch
            )
        });
        // Ahead of the backlog: a retry goes out soon, while the old
        // task's stream may still be open on its agent.
        self.fws[f].queue.push_front(again);
        true
    }

    /// Launches the retry at the head of the queue on the held offer, if
    /// it fits there.
    fn fw_launch_held(&mut self, f: usize) -> Option<Command> {
        let offer = self.fws[f].held_offer.take()?;
        let Some(want) = self.fws[f].queue.pop_front() else {
            self.fws[f].held_offer = Some(offer);
            return None;
        };
        let fid = self.fws[f].info.id.clone();
        let Some(task) = self.fw_fit(f, &want, &offer, &offer.resources, fid.as_ref()) else {
            self.fws[f].queue.push_front(want);
            self.fws[f].held_offer = Some(offer);
            return None;
        };
        self.note(|| {
            format!(
                "framework {f} launches {} at once on held offer {}",
                task.task_id, offer.id
            )
        });
        self.fw_launched(f, &want, &task);
        Some(Command::Launch {
            offer_ids: vec![offer.id],
            tasks: vec![task],
            filters: Filters {
                refuse_seconds: Some(1.0),
            },
        })
    }

    fn fw_revive(&mut self, f: usize) {
        if self.fws[f].suppressed && self.fws[f].subscribed {
            self.fws[f].suppressed = false;
            self.sched_command(
                f,
                Command::Call(sched_api::Call::Revive { roles: Vec::new() }),
            );
        }
    }
}

fn resources(cpus: f64, mem: f64) -> Resources {
    Resources::parse(&format!("cpus:{cpus};mem:{mem}")).expect("valid resources")
}

fn executor_info(id: ExecutorId, fid: Option<&FrameworkId>) -> ExecutorInfo {
    ExecutorInfo {
        container: None,
        executor_id: id,
        framework_id: fid.cloned(),
        command: CommandInfo {
            value: "sim-executor".into(),
            shell: false,
            arguments: Vec::new(),
            environment: Default::default(),
            uris: Vec::new(),
        },
        resources: Resources::parse("cpus:0.1;mem:32").expect("valid resources"),
        name: "sim executor".into(),
        source: String::new(),
        api: Default::default(),
        shutdown_grace_period: None,
        data: None,
        labels: Default::default(),
    }
}
