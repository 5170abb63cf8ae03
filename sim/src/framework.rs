//! Frameworks: the real scheduler driver core, played by the simulation as
//! a framework that runs a workload of tasks (command tasks and tasks of
//! custom executors, each with its plan), kills some, reconciles, and
//! fails over (same framework id) when its process crashes.

use std::collections::{BTreeMap, VecDeque};
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

/// A task the framework wants run.
#[derive(Debug, Clone)]
pub(crate) struct Want {
    pub id: TaskId,
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
    pub agent: AgentId,
    pub launched_at: Time,
    pub last_heard: Time,
    pub state: Option<TaskState>,
    pub kill_at: Option<Time>,
    pub killed_at: Option<Time>,
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
    pub next_reconcile: Time,
    pub clock: f64,
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
            principal: None,
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
            next_reconcile: 30 * SEC,
            clock: 0.0,
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
        let config = DriverConfig {
            master: "sim-master:5050".into(),
            implicit_acknowledgements: true,
            reconnect_backoff_min: Duration::from_millis(100),
            reconnect_backoff_max: Duration::from_secs(5),
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

    pub(crate) fn sched_event(&mut self, f: usize, inc: u64, conn: u64, event: sched_api::Event) {
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
        self.sched_apply(f, actions);
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
        let actions = self.fws[f]
            .driver
            .as_mut()
            .map(|d| d.on_command(command))
            .unwrap_or_default();
        self.sched_apply(f, actions);
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
                        self.send(conn, Side::Client, Msg::SchedCall(Box::new(call)));
                    }
                }
                Action::Callback(cb) => {
                    let commands = self.fw_callback(f, cb);
                    for command in commands {
                        let more = self.fws[f]
                            .driver
                            .as_mut()
                            .map(|d| d.on_command(command))
                            .unwrap_or_default();
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
                if let Some(task) = fw.tasks.get_mut(&status.task_id) {
                    task.last_heard = t;
                    if task.state.is_none_or(|s| !s.is_terminal()) {
                        task.state = Some(status.state);
                    }
                }
                if let Err((invariant, detail)) = self.check.sched_update(f, &status, t) {
                    self.violated(invariant, detail);
                }
                if status.uuid.is_some() {
                    vec![Command::Acknowledge {
                        status,
                        implicit: true,
                    }]
                } else {
                    Vec::new()
                }
            }
            Callback::Error(message) => {
                self.note(|| format!("framework {f}: error {message}"));
                Vec::new()
            }
            Callback::Disconnected => {
                self.fws[f].subscribed = false;
                Vec::new()
            }
            Callback::OfferRescinded(_)
            | Callback::FrameworkMessage { .. }
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
            let mut free = offer.resources.clone();
            let mut tasks = Vec::new();
            let mut keep = VecDeque::new();
            while let Some(want) = self.fws[f].queue.pop_front() {
                match self.fw_fit(f, &want, &offer, &free, fid.as_ref()) {
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
            name: format!("task {}", want.id),
            task_id: want.id.clone(),
            agent_id: offer.agent_id.clone(),
            resources,
            executor,
            command,
            data: None,
            kill_grace_period: None,
            labels: Default::default(),
        })
    }

    fn fw_launched(&mut self, f: usize, want: &Want, task: &TaskInfo) {
        let t = self.t;
        self.check.launched(f, &task.task_id, want.probe, t);
        self.fws[f].tasks.insert(
            task.task_id.clone(),
            FwTask {
                agent: task.agent_id.clone(),
                launched_at: t,
                last_heard: t,
                state: None,
                kill_at: want.kill_after.map(|k| t + k),
                killed_at: None,
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
            let expected = plans.get(id).map_or(0, |p| p.duration);
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
            let duration = self.between(200 * MS, 20 * SEC);
            let outcome = if probe || self.rng.random_bool(0.8) {
                TaskState::Finished
            } else {
                TaskState::Failed
            };
            let data = if self.plan.big_updates && !probe && runner != Runner::Command {
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
                id.clone(),
                TaskPlan {
                    duration,
                    outcome,
                    data,
                    chatter,
                },
            );
            let kill_after = if !probe && self.chance(0.15) {
                Some(self.between(0, 10 * SEC))
            } else {
                None
            };
            let want = Want {
                id,
                cpus: [0.1, 0.25, 0.5, 1.0][self.rng.random_range(0..4)],
                mem: [32.0, 64.0, 128.0, 256.0][self.rng.random_range(0..4)],
                runner,
                kill_after,
                probe,
            };
            // A probe goes first: it measures the cluster, not the
            // backlog ahead of it.
            if probe {
                self.fws[f].queue.push_front(want);
            } else {
                self.fws[f].queue.push_back(want);
            }
        }
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
    }
}
