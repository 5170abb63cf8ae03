//! Executor processes: the real executor driver core, played by the
//! simulation as the executor program: the agent's command executor
//! (which runs command tasks) or a framework's custom executor. Each task
//! follows its plan; faults from the plan make an executor crash, hang,
//! exit right after its terminal update, ignore SIGTERM, or send large
//! updates.

use std::collections::BTreeMap;

use agora_agent::sim::ExecKey;
use agora_executor::sim::{Action, Callback, Command, SimExecutor};
use agora_proto::executor as exec_api;
use agora_proto::{Bytes, Source, TaskId, TaskState, TaskStatus};
use rand::Rng;

use crate::check::STOP_DELIVERS;
use crate::world::{Ev, Msg, Side, Time, World, MS, SEC};

/// What goes wrong with an executor process.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ExecFault {
    None,
    /// Exits with status 1 at this time after its start.
    Crash(Time),
    /// Stops doing anything at this time after its start (until killed).
    Hang(Time),
    /// Exits as soon as it has sent a terminal update.
    ExitAfterTerminal,
    /// Survives SIGTERM (until SIGKILL).
    IgnoreSigterm,
}

/// How a task goes.
#[derive(Debug, Clone)]
pub(crate) struct TaskPlan {
    /// Running time.
    pub duration: Time,
    /// The terminal state its executor reports when it ends by itself.
    pub outcome: TaskState,
    /// Bytes of data in each of its updates.
    pub data: usize,
    /// Extra RUNNING updates it sends while it runs (progress).
    pub chatter: u32,
}

/// One task in an executor.
#[derive(Debug, Clone)]
struct RunTask {
    /// Which launch of the task id it is.
    launch: u32,
    ended: bool,
    kill: bool,
    /// It does not end by itself before this time (busy with a burst).
    busy_until: Time,
}

/// A simulated executor process.
pub(crate) struct ExecProc {
    pub agent: usize,
    pub boot: u64,
    pub key: ExecKey,
    pub run_id: String,
    pub pid: u32,
    pub alive: bool,
    pub is_command: bool,
    pub driver: Option<SimExecutor>,
    pub conn: Option<u64>,
    /// The agent process incarnation that watches this process's exit.
    pub watched: Option<u64>,
    pub fault: ExecFault,
    pub hung: bool,
    tasks: BTreeMap<TaskId, RunTask>,
    /// Updates sent: uuid to task, launch and state (to know what an
    /// acknowledgement acknowledges).
    sent: BTreeMap<String, (TaskId, u32, TaskState)>,
    pub exit: Option<(Option<i32>, String)>,
    tick_queued: bool,
    registered: bool,
    stopping: bool,
}

// === impl World: executors ===

impl World {
    /// Starts an executor process on agent `i` for `spec`.
    pub(crate) fn exec_spawn(
        &mut self,
        i: usize,
        boot: u64,
        key: ExecKey,
        run_id: String,
        spec: &agora_agent::launcher::LaunchSpec,
    ) -> u64 {
        let id = self.next_proc;
        self.next_proc += 1;
        let now = self.now();
        // The executor reads its environment and the secrets the agent
        // hands it over its inherited socket (its token) alike.
        let vars: Vec<(String, String)> = spec.env.iter().chain(&spec.secrets).cloned().collect();
        let driver = SimExecutor::from_env(&vars, now).ok();
        let is_command = key
            .1
            .as_str()
            .starts_with(agora_proto::AGENT_EXECUTOR_PREFIX);
        let fault = if is_command || !self.faulty {
            ExecFault::None
        } else {
            self.plan.exec_fault(&mut self.rng)
        };
        self.procs.insert(
            id,
            ExecProc {
                agent: i,
                boot,
                key,
                run_id,
                pid: 1000 + u32::try_from(id % 60_000).unwrap_or(0),
                alive: true,
                is_command,
                driver,
                conn: None,
                watched: Some(self.agents[i].inc),
                fault,
                hung: false,
                tasks: BTreeMap::new(),
                sent: BTreeMap::new(),
                exit: None,
                tick_queued: false,
                registered: false,
                stopping: false,
            },
        );
        match fault {
            ExecFault::Crash(at) => self.after(at, Ev::ExecCrash { proc: id }),
            ExecFault::Hang(at) => self.after(
                at,
                Ev::ExecTask {
                    proc: id,
                    task: TaskId::new("~hang"),
                    launch: 0,
                    step: HANG,
                },
            ),
            _ => {}
        }
        if self.procs[&id].driver.is_none() {
            // The environment was unusable: the program exits at once.
            self.after(MS, Ev::ExecCrash { proc: id });
        } else {
            let d = self.between(2 * MS, 30 * MS);
            self.after(d, Ev::ExecConnect { proc: id });
        }
        id
    }

    pub(crate) fn exec_connect(&mut self, proc: u64) {
        let now = self.now();
        let Some(p) = self.procs.get_mut(&proc) else {
            return;
        };
        if !p.alive || p.hung || p.conn.is_some() {
            return;
        }
        let Some(driver) = p.driver.as_mut() else {
            return;
        };
        let actions = driver.before_connect(now);
        if self.exec_apply(proc, actions) {
            return;
        }
        let agent = self.procs[&proc].agent;
        let boot = self.procs[&proc].boot;
        let reachable = !self.partitions.exec_cut.contains(&agent);
        let conn = if self.agents[agent].boot == boot && reachable {
            self.agent_accept(agent, proc)
        } else {
            None
        };
        let now = self.now();
        match conn {
            Some(conn) => {
                let p = self.procs.get_mut(&proc).expect("alive");
                p.conn = Some(conn);
                p.registered = false;
                let actions = p.driver.as_mut().expect("checked").on_connected(now);
                self.exec_apply(proc, actions);
                self.exec_schedule_tick(proc);
            }
            None => {
                let p = self.procs.get_mut(&proc).expect("alive");
                let actions = p.driver.as_mut().expect("checked").on_disconnected(now);
                if self.exec_apply(proc, actions) {
                    return;
                }
                self.exec_backoff(proc, MS);
            }
        }
    }

    fn exec_backoff(&mut self, proc: u64, extra: Time) {
        let sample = self.rng.random::<f64>();
        let Some(p) = self.procs.get_mut(&proc) else {
            return;
        };
        let Some(driver) = p.driver.as_mut() else {
            return;
        };
        let d = driver.next_backoff(sample);
        let nanos = u64::try_from(d.as_nanos()).unwrap_or(u64::MAX / 4);
        self.after(extra + nanos, Ev::ExecConnect { proc });
    }

    pub(crate) fn exec_event(&mut self, proc: u64, conn: u64, event: exec_api::Event) {
        let now = self.now();
        let Some(p) = self.procs.get_mut(&proc) else {
            return;
        };
        if !p.alive || p.hung || p.conn != Some(conn) {
            return;
        }
        let Some(driver) = p.driver.as_mut() else {
            return;
        };
        let actions = driver.on_event(event, now);
        self.exec_apply(proc, actions);
    }

    pub(crate) fn exec_conn_ended(&mut self, proc: u64, conn: u64) {
        let now = self.now();
        let Some(p) = self.procs.get_mut(&proc) else {
            return;
        };
        if !p.alive || p.conn != Some(conn) {
            return;
        }
        p.conn = None;
        if p.hung {
            return;
        }
        let Some(driver) = p.driver.as_mut() else {
            return;
        };
        let actions = driver.on_disconnected(now);
        if self.exec_apply(proc, actions) {
            return;
        }
        self.exec_backoff(proc, 0);
    }

    pub(crate) fn exec_tick(&mut self, proc: u64) {
        let now = self.now();
        let Some(p) = self.procs.get_mut(&proc) else {
            return;
        };
        p.tick_queued = false;
        if !p.alive || p.hung {
            return;
        }
        let Some(driver) = p.driver.as_mut() else {
            return;
        };
        let actions = driver.on_tick(now);
        self.exec_apply(proc, actions);
        self.exec_schedule_tick(proc);
    }

    /// Ticks while the driver has timeouts running (subscribing,
    /// stopping).
    fn exec_schedule_tick(&mut self, proc: u64) {
        let Some(p) = self.procs.get_mut(&proc) else {
            return;
        };
        if p.alive && !p.tick_queued && (!p.registered || p.stopping) && p.conn.is_some() {
            p.tick_queued = true;
            self.after(SEC, Ev::ExecTick { proc });
        }
    }

    /// Carries out the driver's actions; true once the process has ended.
    fn exec_apply(&mut self, proc: u64, actions: Vec<Action>) -> bool {
        let mut queue: std::collections::VecDeque<Action> = actions.into();
        while let Some(action) = queue.pop_front() {
            let Some(p) = self.procs.get_mut(&proc) else {
                return true;
            };
            if !p.alive {
                return true;
            }
            match action {
                Action::Send(call) => {
                    if let exec_api::Call::Update { status } = &call {
                        if let Some(uuid) = &status.uuid {
                            let launch = p.tasks.get(&status.task_id).map_or(0, |t| t.launch);
                            p.sent.insert(
                                uuid.clone(),
                                (status.task_id.clone(), launch, status.state),
                            );
                            self.check.created(uuid, &status.task_id, launch);
                        }
                    }
                    let Some(p) = self.procs.get_mut(&proc) else {
                        return true;
                    };
                    if let Some(conn) = p.conn {
                        self.send(conn, Side::Client, Msg::ExecCall(Box::new(call)));
                    }
                }
                Action::Callback(cb) => {
                    let more = self.exec_callback(proc, cb);
                    queue.extend(more);
                }
                Action::Reconnect(reason) => {
                    let now = self.now();
                    let p = self.procs.get_mut(&proc).expect("alive");
                    if let Some(conn) = p.conn.take() {
                        self.close(conn, Side::Client, &reason);
                    }
                    let p = self.procs.get_mut(&proc).expect("alive");
                    let more = p
                        .driver
                        .as_mut()
                        .map(|d| d.on_disconnected(now))
                        .unwrap_or_default();
                    queue.extend(more);
                    self.exec_backoff(proc, 0);
                }
                Action::Finish(outcome) => {
                    let p = self.procs.get_mut(&proc).expect("alive");
                    // A checkpointing driver waits for a lost agent, so
                    // one that stops while disconnected has nothing left
                    // to deliver (it gives up only by aborting).
                    let undelivered = match (&p.driver, p.conn) {
                        (Some(d), None)
                            if outcome == agora_executor::sim::Outcome::Stopped
                                && d.checkpoint() =>
                        {
                            d.unacknowledged_terminal()
                        }
                        _ => Vec::new(),
                    };
                    if !undelivered.is_empty() {
                        let (agent, key) = (p.agent, p.key.clone());
                        self.violated(
                            STOP_DELIVERS,
                            format!(
                                "executor {proc} ({} of framework {}) on agent {agent} stopped while disconnected with the terminal updates of {undelivered:?} unacknowledged",
                                key.1, key.0
                            ),
                        );
                    }
                    let p = self.procs.get_mut(&proc).expect("alive");
                    if let Some(conn) = p.conn.take() {
                        self.close(conn, Side::Client, "executor finished");
                    }
                    let code = match outcome {
                        agora_executor::sim::Outcome::Stopped => 0,
                        agora_executor::sim::Outcome::Aborted => 1,
                    };
                    self.exec_exit(proc, Some(code), format!("exited with status {code}"));
                    return true;
                }
            }
        }
        false
    }

    /// The executor program's reaction to a callback: commands for its
    /// driver.
    fn exec_callback(&mut self, proc: u64, cb: Callback) -> Vec<Action> {
        let now = self.now();
        let p = self.procs.get_mut(&proc).expect("alive");
        match cb {
            Callback::Registered { .. } | Callback::Reregistered(_) => {
                p.registered = true;
                Vec::new()
            }
            Callback::LaunchTask { task, .. } => {
                let id = task.task_id.clone();
                let launch = crate::framework::launch_of(&task.labels).unwrap_or(0);
                // A launch it has already, or a new one while the task of
                // that id still runs here: the program runs one task per
                // id at a time.
                if p.tasks
                    .get(&id)
                    .is_some_and(|t| t.launch == launch || !t.ended)
                {
                    return Vec::new();
                }
                p.tasks.insert(
                    id.clone(),
                    RunTask {
                        launch,
                        ended: false,
                        kill: false,
                        busy_until: 0,
                    },
                );
                let d = self.between(MS, 20 * MS);
                self.after(
                    d,
                    Ev::ExecTask {
                        proc,
                        task: id,
                        launch,
                        step: 0,
                    },
                );
                Vec::new()
            }
            Callback::KillTask(task_id) => {
                if p.fault == ExecFault::IgnoreSigterm && !p.is_command {
                    return Vec::new();
                }
                if let Some(t) = p.tasks.get_mut(&task_id) {
                    if !t.ended && !t.kill {
                        t.kill = true;
                        let launch = t.launch;
                        let d = self.between(MS, 50 * MS);
                        self.after(
                            d,
                            Ev::ExecTask {
                                proc,
                                task: task_id,
                                launch,
                                step: KILLED,
                            },
                        );
                    }
                }
                Vec::new()
            }
            Callback::Acknowledged { task_id, uuid } => {
                if let Some((tid, launch, state)) = p.sent.get(&uuid).cloned() {
                    let fid = p.key.0.clone();
                    debug_assert_eq!(tid, task_id);
                    self.check.executor_acked(&fid, &tid, launch, &uuid, state);
                }
                Vec::new()
            }
            Callback::Shutdown => {
                p.stopping = true;
                let running: Vec<TaskId> = p
                    .tasks
                    .iter()
                    .filter(|(_, t)| !t.ended)
                    .map(|(id, _)| id.clone())
                    .collect();
                let mut actions = Vec::new();
                for id in running {
                    let status =
                        TaskStatus::new(id.clone(), TaskState::Killed, Source::SourceExecutor)
                            .with_message("executor shutting down");
                    if let Some(t) = p.tasks.get_mut(&id) {
                        t.ended = true;
                    }
                    actions.extend(
                        p.driver
                            .as_mut()
                            .map(|d| d.on_command(Command::Update(status), now))
                            .unwrap_or_default(),
                    );
                }
                actions.extend(
                    p.driver
                        .as_mut()
                        .map(|d| d.on_command(Command::Stop, now))
                        .unwrap_or_default(),
                );
                self.exec_schedule_tick(proc);
                actions
            }
            Callback::Error(message) => {
                self.note(|| format!("executor {proc}: {message}"));
                Vec::new()
            }
            Callback::Disconnected | Callback::FrameworkMessage(_) => Vec::new(),
        }
    }

    /// The next step of a task: started, progress, ended, killed.
    pub(crate) fn exec_task_step(&mut self, proc: u64, task: TaskId, launch: u32, step: u32) {
        let now = self.now();
        let Some(p) = self.procs.get_mut(&proc) else {
            return;
        };
        if !p.alive {
            return;
        }
        if step == HANG {
            p.hung = true;
            self.note(|| format!("executor {proc} hangs"));
            return;
        }
        if p.hung {
            return;
        }
        let Some(t) = p.tasks.get(&task) else {
            return;
        };
        if t.ended || t.launch != launch {
            // Ended, or a step of an earlier launch of the id.
            return;
        }
        let busy_until = t.busy_until;
        let plan = self
            .plans
            .get(&(task.clone(), launch))
            .cloned()
            .unwrap_or(TaskPlan {
                duration: SEC,
                outcome: TaskState::Finished,
                data: 0,
                chatter: 0,
            });
        let ending = step != 0 && !matches!(step, KILLED | BURST) && step > plan.chatter;
        if ending && busy_until > self.t {
            // Still busy with a burst: it ends once that is over.
            self.at(
                busy_until,
                Ev::ExecTask {
                    proc,
                    task,
                    launch,
                    step,
                },
            );
            return;
        }
        let (state, next) = match step {
            KILLED => (TaskState::Killed, None),
            BURST => (TaskState::Running, None),
            0 => (
                TaskState::Running,
                Some((plan.duration / u64::from(plan.chatter + 1), 1)),
            ),
            s if s <= plan.chatter => (
                TaskState::Running,
                Some((plan.duration / u64::from(plan.chatter + 1), s + 1)),
            ),
            _ => (plan.outcome, None),
        };
        let mut status = TaskStatus::new(task.clone(), state, Source::SourceExecutor);
        if plan.data > 0 {
            status.data = Some(Bytes(vec![b'x'; plan.data]));
        }
        let p = self.procs.get_mut(&proc).expect("alive");
        if state.is_terminal() {
            if let Some(t) = p.tasks.get_mut(&task) {
                t.ended = true;
            }
        }
        let actions = p
            .driver
            .as_mut()
            .map(|d| d.on_command(Command::Update(status), now))
            .unwrap_or_default();
        if self.exec_apply(proc, actions) {
            return;
        }
        if let Some((after, s)) = next {
            self.after(
                after,
                Ev::ExecTask {
                    proc,
                    task,
                    launch,
                    step: s,
                },
            );
            return;
        }
        if step == BURST {
            return;
        }
        let p = self.procs.get_mut(&proc).expect("alive");
        if p.fault == ExecFault::ExitAfterTerminal {
            self.exec_exit(
                proc,
                Some(0),
                "exited right after its terminal update".into(),
            );
            return;
        }
        let idle = p.tasks.values().all(|t| t.ended);
        if idle && !p.is_command && !p.stopping {
            // A custom executor with nothing left to run ends (and
            // flushes its updates first).
            p.stopping = true;
            let actions = p
                .driver
                .as_mut()
                .map(|d| d.on_command(Command::Stop, now))
                .unwrap_or_default();
            self.exec_apply(proc, actions);
            self.exec_schedule_tick(proc);
        }
    }

    /// SIGTERM: most executors die of it.
    pub(crate) fn exec_sigterm(&mut self, proc: u64) {
        let Some(p) = self.procs.get(&proc) else {
            return;
        };
        if !p.alive || p.fault == ExecFault::IgnoreSigterm {
            return;
        }
        self.exec_exit(proc, None, "terminated by signal SIGTERM".into());
    }

    /// The running tasks with large updates of agent `i`'s live custom
    /// executors (those that may burst).
    pub(crate) fn burst_tasks(&self, i: usize) -> Vec<(u64, TaskId, u32)> {
        let boot = self.agents[i].boot;
        self.procs
            .iter()
            .filter(|(_, p)| {
                p.agent == i && p.boot == boot && p.alive && !p.hung && !p.stopping && !p.is_command
            })
            .flat_map(|(id, p)| {
                p.tasks
                    .iter()
                    .filter(|(_, t)| !t.ended && !t.kill)
                    .filter(|(task, t)| {
                        self.plans
                            .get(&((*task).clone(), t.launch))
                            .is_some_and(|plan| plan.data > 0)
                    })
                    .map(|(task, t)| (*id, task.clone(), t.launch))
            })
            .collect()
    }

    /// Task `task` of executor `proc` does not end by itself before
    /// `until`.
    pub(crate) fn exec_hold(&mut self, proc: u64, task: &TaskId, until: Time) {
        if let Some(t) = self
            .procs
            .get_mut(&proc)
            .and_then(|p| p.tasks.get_mut(task))
        {
            t.busy_until = t.busy_until.max(until);
        }
    }

    pub(crate) fn exec_sigkill(&mut self, proc: u64) {
        self.exec_exit(proc, None, "killed by signal SIGKILL".into());
    }

    /// The process ends: its connection breaks and the agent that watches
    /// it learns of the exit.
    pub(crate) fn exec_exit(&mut self, proc: u64, code: Option<i32>, message: String) {
        let Some(p) = self.procs.get_mut(&proc) else {
            return;
        };
        if !p.alive {
            return;
        }
        p.alive = false;
        p.exit = Some((code, message.clone()));
        let conn = p.conn.take();
        if let Some(conn) = conn {
            self.drop_side(conn, Side::Client, (50_000, 2 * MS));
        }
        self.note(|| format!("executor {proc} exited: {message}"));
        self.agent_saw_exit(proc);
    }
}

/// Step numbers with a meaning of their own.
const KILLED: u32 = u32::MAX;
const HANG: u32 = u32::MAX - 1;
/// One more RUNNING update with the task's data (a burst).
pub(crate) const BURST: u32 = u32::MAX - 2;
