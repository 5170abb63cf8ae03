//! Agent nodes: the real sans-IO agent core, with the simulation playing
//! its shell: the master link (pings, silence, reconnect backoff), the
//! executor endpoint (subscription, the frame cap), the process thread
//! (executors are simulated processes that outlive an agent process but
//! not its machine) and the checkpoint writer over a simulated disk that
//! keeps what was synced, and on a machine crash a torn, partly persisted
//! tail of what was not; in some seeds a machine crash also damages a
//! synced page of the log (a media error). A restarted agent must read its
//! log back up to the first damaged record and nothing after it
//! ([`crate::check::LOG_PREFIX`]).

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::path::{Path, PathBuf};
use std::time::Duration;

use agora_agent::sim::{
    wal_decode, wal_encode, Action, Durable, Input, Op, Request, SimAgent, Started, Stop,
    StreamState, Streams, WalRecord,
};
use agora_agent::Config;
use agora_discovery::{Backoff, DEFAULT_JITTER};
use agora_proto::agent as agent_api;
use agora_proto::executor as exec_api;
use agora_proto::{FrameworkId, Resources, TaskId};
use rand::Rng;

use crate::check::{FRAMES_FIT, LOG_PREFIX};
use crate::world::{ConnKind, Ev, Msg, Side, Time, World, MS, SEC};

/// How long an agent's link waits for `REGISTERED` on a new connection.
const REGISTRATION_WAIT: Time = 10 * SEC;
/// Pings the master may skip before the link gives up on it.
const SILENT_PINGS: u64 = 3;
/// A page of the simulated disk (what a machine crash tears).
const PAGE: usize = 4096;

/// One agent machine: the agent process (which may crash and restart),
/// its disk and the processes it started (which survive the agent process
/// but not the machine).
pub(crate) struct AgentNode {
    pub name: String,
    pub config: Config,
    /// The agent's work dir, materialised from the simulated disk when
    /// the agent recovers.
    pub work_dir: tempfile::TempDir,
    pub core: Option<SimAgent>,
    /// Process incarnation.
    pub inc: u64,
    /// Machine boot: executors of an earlier boot are gone.
    pub boot: u64,
    pub up: bool,
    pub link: Link,
    pub disk: Disk,
    /// Executor connections of this process: subscribed yet?
    pub exec_conns: BTreeMap<u64, bool>,
    /// Executor runs started on this machine (this boot): run id to
    /// process.
    pub runs: BTreeMap<String, u64>,
    pub tick_at: Option<Time>,
    /// Wall clock offset (clock jumps).
    pub clock: f64,
    /// The master shut this agent down or refused it, at least once.
    pub shut_down: bool,
    /// The launch of each task id this machine was given last (a
    /// RUN_TASK's labels), for updates its agent makes of a task it no
    /// longer holds.
    pub launches: BTreeMap<(FrameworkId, TaskId), u32>,
    /// The RUN_TASK being handled: updates the agent makes for its task id
    /// meanwhile answer it.
    pub running: Option<(FrameworkId, TaskId, u32)>,
    /// The id the master gave it last (what a forger names).
    pub id: Option<agora_proto::AgentId>,
}

/// The master link as the agent's shell runs it.
pub(crate) struct Link {
    pub conn: Option<u64>,
    pub backoff: Backoff,
    /// When silence ends the connection.
    pub deadline: Time,
    pub silence: Time,
    pub check_at: Option<Time>,
}

/// The simulated disk of an agent machine.
#[derive(Default)]
pub(crate) struct Disk {
    /// Files as the page cache has them (what a restarted process reads).
    pub files: BTreeMap<PathBuf, Vec<u8>>,
    /// Files as a machine crash leaves them.
    pub durable: BTreeMap<PathBuf, Vec<u8>>,
    pub dirs: BTreeSet<PathBuf>,
    /// The status update log as written, and how much of it is synced.
    pub wal: Vec<u8>,
    pub synced: usize,
    /// The log's live streams (for compaction).
    pub streams: Streams,
    /// Checkpoint requests not yet done, in order; the first is being
    /// written.
    pub queue: VecDeque<(u64, Vec<Op>, Option<Durable>)>,
    pub next_batch: u64,
    /// How long a sync takes on this disk.
    pub sync_time: (Time, Time),
    /// The log as the agent wrote it, when a machine crash changed what
    /// the disk keeps of it (kept until the agent reads it back).
    pub written: Option<Vec<u8>>,
}

/// A media error: one byte flipped, or a page zeroed, somewhere in the
/// synced part of the log.
#[derive(Debug, Clone, Copy)]
pub(crate) struct MediaError {
    /// Where (modulo the synced length).
    at: u64,
    zero_page: bool,
    /// What the byte is XORed with (non-zero).
    flip: u8,
}

// === impl World: agents ===

impl World {
    /// Adds agent `i` (not started).
    pub(crate) fn agent_add(&mut self, i: usize) {
        let work_dir = tempfile::Builder::new()
            .prefix("agora-sim-agent-")
            .tempdir()
            .unwrap_or_else(|e| panic!("cannot create a temporary work dir: {e}"));
        let mut config = Config::new("sim-master:5050", work_dir.path().to_path_buf());
        let cpus = self.rng.random_range(2..=8);
        let mem = 1024 * self.rng.random_range(2..=8);
        config.resources = Resources::parse(&format!(
            "cpus:{cpus};mem:{mem};disk:10000;ports:[31000-31099]"
        ))
        .expect("valid resources");
        config.hostname = format!("h{i}");
        config.command_executor = vec!["sim-command-executor".into()];
        config.users = agora_agent::UserPolicy::agent_user();
        config.executor_registration_timeout = Duration::from_secs(20);
        config.executor_shutdown_grace_period = Duration::from_secs(3);
        config.status_update_retry_min = Duration::from_secs(1);
        config.status_update_retry_max = Duration::from_secs(10);
        config.executor_recovery_timeout = Duration::from_secs(60);
        config.command_executor_idle = Duration::from_secs(5);
        let slow = self.chance(self.plan.slow_disk_rate);
        let sync_time = if slow {
            (5 * MS, 300 * MS)
        } else {
            (200_000, 3 * MS)
        };
        self.agents.push(AgentNode {
            name: format!("a{i}"),
            config,
            work_dir,
            core: None,
            inc: 0,
            boot: 1,
            up: false,
            link: Link {
                conn: None,
                backoff: Backoff::new(
                    Duration::from_millis(100),
                    Duration::from_secs(5),
                    DEFAULT_JITTER,
                ),
                deadline: 0,
                silence: REGISTRATION_WAIT,
                check_at: None,
            },
            disk: Disk {
                sync_time,
                ..Disk::default()
            },
            exec_conns: BTreeMap::new(),
            runs: BTreeMap::new(),
            tick_at: None,
            clock: 0.0,
            shut_down: false,
            launches: BTreeMap::new(),
            running: None,
            id: None,
        });
    }

    /// Starts agent `i`'s process: fresh, or recovering what its disk
    /// kept.
    pub(crate) fn agent_start(&mut self, i: usize) {
        let seed = self.rng.random();
        let now = self.now();
        let a = &mut self.agents[i];
        if a.up {
            return;
        }
        a.inc += 1;
        a.up = true;
        a.exec_conns.clear();
        a.tick_at = None;
        a.link.conn = None;
        a.link.check_at = None;
        a.link.backoff.reset();
        let clock = a.clock;
        let wall = self.wall(clock);
        let a = &mut self.agents[i];
        let mut core = SimAgent::new(a.config.clone(), seed, now, wall);
        // What the disk kept: the files as a restarted process reads them,
        // and the log (compacted as the agent does on opening it).
        a.disk.queue.clear();
        materialise(a.work_dir.path(), &a.disk);
        let streams = wal_decode(&a.disk.wal);
        let read_back = a
            .disk
            .written
            .take()
            .map(|written| read_back(i, &written, &a.disk.wal, &streams));
        let records: Vec<WalRecord> = streams.iter().cloned().map(WalRecord::Stream).collect();
        a.disk.wal = wal_encode(&records);
        a.disk.synced = a.disk.wal.len();
        a.disk.streams = Streams::default();
        for r in records {
            a.disk.streams.apply(r);
        }
        let procs = &self.procs;
        let runs = &a.runs;
        let boot = a.boot;
        core.recover(
            a.work_dir.path(),
            streams,
            |run_id| {
                runs.get(run_id)
                    .and_then(|p| procs.get(p))
                    .is_some_and(|p| p.alive && p.boot == boot)
            },
            now,
            wall,
        );
        a.core = Some(core);
        let inc = a.inc;
        self.note(|| format!("agent {i} started (incarnation {inc})"));
        if let Some(read_back) = read_back {
            self.note(|| {
                format!(
                    "agent {i}: its log was cut at byte {} of {}; {} updates lost with it",
                    read_back.intact,
                    read_back.written,
                    read_back.lost.len()
                )
            });
            self.check.lost_on_disk(read_back.lost);
            if let Some(detail) = read_back.wrong {
                self.violated(LOG_PREFIX, detail);
            }
        }
        self.agent_after_step(i);
        let d = self.between(0, 50 * MS);
        self.after(d, Ev::AgentConnect { agent: i, inc });
    }

    /// Crashes agent `i`'s process (`machine`: the whole machine, with its
    /// executors and what the disk had not synced).
    pub(crate) fn agent_crash(&mut self, i: usize, machine: bool) {
        let a = &mut self.agents[i];
        if !a.up && !machine {
            return;
        }
        let was_up = a.up;
        a.up = false;
        a.core = None;
        a.tick_at = None;
        a.link.conn = None;
        // The writer's current request may be part done; the rest of the
        // queue is lost with the process.
        let prefix = if let Some((_, ops, _)) = a.disk.queue.front() {
            let n = ops.len();
            self.rng.random_range(0..=n)
        } else {
            0
        };
        let a = &mut self.agents[i];
        if let Some((_, ops, _)) = a.disk.queue.pop_front() {
            for op in ops.into_iter().take(prefix) {
                a.disk.write(op, false);
            }
        }
        a.disk.queue.clear();
        if machine {
            let tear = self.rng.random::<u64>();
            let keep_length = self.rng.random_bool(0.5);
            let media = self.plan.media_errors.then(|| {
                let rng = &mut self.plan.storage_rng;
                MediaError {
                    at: rng.random(),
                    zero_page: rng.random_bool(0.5),
                    flip: rng.random_range(1..=u8::MAX),
                }
            });
            if let Some(damage) = self.agents[i].disk.machine_crash(tear, keep_length, media) {
                self.note(|| format!("agent {i}: a media error {damage}"));
            }
            self.agents[i].boot += 1;
            self.agents[i].runs.clear();
        }
        let inc = self.agents[i].inc;
        let conns: Vec<(u64, Side)> = self
            .conns
            .iter()
            .filter_map(|(id, c)| match c.kind {
                ConnKind::Agent { agent, inc: ci, .. } if agent == i && ci == inc => {
                    Some((*id, Side::Client))
                }
                ConnKind::Exec { agent, inc: ci, .. } if agent == i && ci == inc => {
                    Some((*id, Side::Server))
                }
                _ => None,
            })
            .collect();
        for (conn, side) in conns {
            self.drop_side(conn, side, (100_000, 5 * MS));
        }
        self.agents[i].exec_conns.clear();
        if machine {
            let procs: Vec<u64> = self
                .procs
                .iter()
                .filter(|(_, p)| p.agent == i && p.alive)
                .map(|(id, _)| *id)
                .collect();
            for p in procs {
                self.exec_exit(p, None, "the machine crashed".into());
            }
        }
        if was_up || machine {
            self.note(|| format!("agent {i} crashed (machine: {machine})"));
        }
    }

    pub(crate) fn agent_input(&mut self, i: usize, inc: u64, input: Input) {
        let a = &mut self.agents[i];
        if !a.up || a.inc != inc {
            return;
        }
        if let Input::MasterEvent { event, .. } = &input {
            if let agent_api::Event::RunTask { framework, task } = &**event {
                if let Some(fid) = &framework.id {
                    let launch = crate::framework::launch_of(&task.labels).unwrap_or(0);
                    self.check
                        .run_task_delivered(fid, &task.task_id, launch, self.t);
                    let a = &mut self.agents[i];
                    a.launches
                        .insert((fid.clone(), task.task_id.clone()), launch);
                    a.running = Some((fid.clone(), task.task_id.clone(), launch));
                }
            }
        }
        let now = self.now();
        let wall = self.wall(self.agents[i].clock);
        let stop = self.agents[i]
            .core
            .as_mut()
            .and_then(|core| core.handle(input, now, wall));
        self.agent_after_step(i);
        self.agents[i].running = None;
        if let Some(stop) = stop {
            self.agent_stopped(i, stop);
        }
    }

    pub(crate) fn agent_tick(&mut self, i: usize, inc: u64, at: Time) {
        let a = &mut self.agents[i];
        // Only the tick queued last counts.
        if !a.up || a.inc != inc || a.tick_at != Some(at) {
            return;
        }
        a.tick_at = None;
        let now = self.now();
        let wall = self.wall(self.agents[i].clock);
        if let Some(core) = self.agents[i].core.as_mut() {
            if core.next_deadline().is_some_and(|d| d <= now) {
                core.tick(now, wall);
            }
        }
        self.agent_after_step(i);
    }

    /// The master refused the agent: the process exits; an operator (or
    /// its supervisor) starts it again a while later.
    fn agent_stopped(&mut self, i: usize, stop: Stop) {
        self.note(|| format!("agent {i} stopped: {stop:?}"));
        self.agents[i].shut_down = true;
        self.check.agent_refused(i);
        self.agent_crash(i, false);
        let d = self.between(5 * SEC, 20 * SEC);
        self.after(
            d,
            Ev::Fault(crate::faults::Fault::AgentRestart { agent: i }),
        );
    }

    /// Carries out the core's actions, and queues its next tick.
    fn agent_after_step(&mut self, i: usize) {
        let Some(core) = self.agents[i].core.as_mut() else {
            return;
        };
        let actions = core.take_actions();
        let deadline = core.next_deadline();
        let inc = self.agents[i].inc;
        for action in &actions {
            self.agent_created(i, action);
        }
        for action in actions {
            self.agent_action(i, inc, action);
        }
        if let Some(deadline) = deadline {
            let at = self.time_of(deadline).max(self.t + MS);
            if self.agents[i].tick_at.is_none_or(|t| at < t) {
                self.agents[i].tick_at = Some(at);
                self.at(at, Ev::AgentTick { agent: i, inc, at });
            }
        }
    }

    /// Notes the launch each reliable update the agent made itself is
    /// about (an executor's were noted as it sent them): the RUN_TASK
    /// being handled, when of the same task id; else the launch of the
    /// task the agent holds; else the one the machine was given last.
    fn agent_created(&mut self, i: usize, action: &Action) {
        let updates: Vec<(&FrameworkId, &agora_proto::TaskStatus)> = match action {
            Action::ToMaster {
                call:
                    agent_api::Call::StatusUpdate {
                        framework_id,
                        status,
                    },
                ..
            } => vec![(framework_id, status)],
            Action::Checkpoint { ops, .. } => ops
                .iter()
                .filter_map(|op| match op {
                    Op::Wal(WalRecord::Update {
                        framework_id,
                        status,
                        ..
                    }) => Some((framework_id, status)),
                    _ => None,
                })
                .collect(),
            _ => Vec::new(),
        };
        for (fid, status) in updates {
            let Some(uuid) = status.uuid.as_deref() else {
                continue;
            };
            if self.check.origin(uuid).is_some() {
                continue;
            }
            let a = &self.agents[i];
            let task = &status.task_id;
            let launch = match &a.running {
                Some((f, t, launch)) if f == fid && t == task => Some(*launch),
                _ => None,
            }
            .or_else(|| {
                a.core
                    .as_ref()
                    .and_then(|core| core.task_info(fid, task))
                    .and_then(|info| crate::framework::launch_of(&info.labels))
            })
            .or_else(|| a.launches.get(&(fid.clone(), task.clone())).copied());
            if let Some(launch) = launch {
                self.check.created(uuid, task, launch);
            }
        }
    }

    fn agent_action(&mut self, i: usize, inc: u64, action: Action) {
        match action {
            Action::ToMaster { conn, call } => {
                if self.agents[i].link.conn == Some(conn) {
                    self.send(conn, Side::Client, Msg::AgentCall(Box::new(call)));
                }
            }
            Action::DropMaster { conn } => {
                if self.agents[i].link.conn == Some(conn) {
                    self.agent_link_drop(i, inc, conn);
                }
            }
            Action::ToExecutor { conn, event, .. } => {
                if self.agents[i].exec_conns.contains_key(&conn) {
                    self.send(conn, Side::Server, Msg::ExecEvent(Box::new(event)));
                }
            }
            Action::CloseExecutor { conn, reason, .. } => {
                if let Some(subscribed) = self.agents[i].exec_conns.remove(&conn) {
                    self.close(conn, Side::Server, &reason);
                    if subscribed {
                        self.after(
                            0,
                            Ev::AgentInput {
                                agent: i,
                                inc,
                                input: Box::new(Input::ExecutorDisconnected { conn }),
                            },
                        );
                    }
                }
            }
            Action::Process(request) => self.agent_process(i, inc, request),
            Action::StopExecutors { runs, grace, .. } => {
                for (run_id, _) in runs {
                    self.agent_process(i, inc, Request::Terminate { run_id, grace });
                }
            }
            Action::Checkpoint { ops, then } => {
                let disk = &mut self.agents[i].disk;
                let batch = disk.next_batch;
                disk.next_batch += 1;
                disk.queue.push_back((batch, ops, then));
                if disk.queue.len() == 1 {
                    self.disk_start(i, inc);
                }
            }
            Action::Timer { after, timer } => self.after_dur(
                after,
                Ev::AgentTimer {
                    agent: i,
                    inc,
                    timer,
                },
            ),
        }
    }

    // --- the checkpoint writer ---

    fn disk_start(&mut self, i: usize, inc: u64) {
        let Some((batch, _, _)) = self.agents[i].disk.queue.front() else {
            return;
        };
        let batch = *batch;
        let (lo, hi) = self.agents[i].disk.sync_time;
        let d = self.between(lo, hi);
        self.after(
            d,
            Ev::DiskDone {
                agent: i,
                inc,
                batch,
            },
        );
    }

    pub(crate) fn disk_done(&mut self, i: usize, inc: u64, batch: u64) {
        let a = &mut self.agents[i];
        if !a.up || a.inc != inc {
            return;
        }
        if a.disk.queue.front().map(|(b, _, _)| *b) != Some(batch) {
            return;
        }
        let (_, ops, then) = a.disk.queue.pop_front().expect("checked above");
        for op in ops {
            a.disk.write(op, true);
        }
        a.disk.synced = a.disk.wal.len();
        if let Some(then) = then {
            self.agent_input(i, inc, Input::Durable(then, Ok(())));
        }
        self.disk_start(i, inc);
    }

    // --- the process thread ---

    /// Delivers `input` to agent `i` (incarnation `inc`) after `d`.
    fn agent_input_after(&mut self, d: Time, i: usize, inc: u64, input: Input) {
        self.after(
            d,
            Ev::AgentInput {
                agent: i,
                inc,
                input: Box::new(input),
            },
        );
    }

    fn agent_process(&mut self, i: usize, inc: u64, request: Request) {
        match request {
            Request::Launch { key, run_id, spec } => {
                let boot = self.agents[i].boot;
                let failed = self.faulty && self.chance(self.plan.spawn_failure_rate);
                let result = if failed {
                    Err("simulated spawn failure: Resource temporarily unavailable".to_string())
                } else {
                    let proc = self.exec_spawn(i, boot, key.clone(), run_id.clone(), &spec);
                    self.agents[i].runs.insert(run_id.clone(), proc);
                    let pid = self.procs[&proc].pid;
                    Ok(Started {
                        pid,
                        start_time: Some(boot * 1_000_000 + u64::from(pid)),
                    })
                };
                let d = self.between(MS, 20 * MS);
                self.after(
                    d,
                    Ev::AgentInput {
                        agent: i,
                        inc,
                        input: Box::new(Input::ExecutorLaunched {
                            key,
                            run_id,
                            result,
                        }),
                    },
                );
            }
            Request::Adopt { key, run_id, .. } => {
                let boot = self.agents[i].boot;
                let proc = self.agents[i].runs.get(&run_id).copied();
                match proc.and_then(|p| self.procs.get_mut(&p)) {
                    Some(p) if p.alive && p.boot == boot => p.watched = Some(inc),
                    _ => {
                        let d = self.between(100_000, MS);
                        self.after(
                            d,
                            Ev::AgentInput {
                                agent: i,
                                inc,
                                input: Box::new(Input::ExecutorExited {
                                    key,
                                    run_id,
                                    code: None,
                                    message: "not running".into(),
                                }),
                            },
                        );
                    }
                }
            }
            Request::CreateDir { path, .. } => {
                self.agents[i].disk.dirs.insert(path);
            }
            Request::Fetch { key, sandbox, .. } => {
                // Simulated tasks ask for no URIs; should one, every
                // fetch succeeds after a moment.
                self.agents[i].disk.dirs.insert(sandbox);
                let d = self.between(MS, 20 * MS);
                self.after(
                    d,
                    Ev::AgentInput {
                        agent: i,
                        inc,
                        input: Box::new(Input::TaskFetched {
                            key,
                            result: Ok(Default::default()),
                        }),
                    },
                );
            }
            Request::Terminate { run_id, grace } => {
                if let Some(p) = self.agents[i].runs.get(&run_id).copied() {
                    self.exec_sigterm(p);
                    self.after_dur(grace, Ev::ExecSigkill { proc: p });
                }
            }
            Request::Release { run_id } => {
                if let Some(p) = self.agents[i].runs.remove(&run_id) {
                    if let Some(proc) = self.procs.get_mut(&p) {
                        proc.watched = None;
                    }
                    self.exec_sigkill(p);
                }
            }
            // Containers (--isolation cgroups) are not simulated.
            Request::Update { .. }
            | Request::AdoptTaskContainer { .. }
            | Request::TaskOutOfMemory { .. } => {}
            // A made or ended one is answered for after a moment.
            Request::TaskContainer { key, .. } => {
                let d = self.between(100_000, MS);
                let result = Ok(Default::default());
                self.agent_input_after(d, i, inc, Input::TaskFetched { key, result });
            }
            // Simulated tasks name no image.
            Request::PrepareImage { key, .. } => {
                let d = self.between(100_000, MS);
                let result = Err("the simulation runs no image".into());
                self.agent_input_after(d, i, inc, Input::ImagePrepared { key, result });
            }
            Request::EndTaskContainer { key, .. } | Request::EndImageContainer { key, .. } => {
                let d = self.between(100_000, MS);
                let limitation = None;
                self.agent_input_after(d, i, inc, Input::TaskContainerEnded { key, limitation });
            }
            Request::StopAll { .. } => {
                unreachable!("the core asks for StopExecutors, never StopAll")
            }
        }
    }

    /// An executor process this agent process watches exited.
    pub(crate) fn agent_saw_exit(&mut self, proc: u64) {
        let Some(p) = self.procs.get(&proc) else {
            return;
        };
        let (i, watched, boot) = (p.agent, p.watched, p.boot);
        let a = &self.agents[i];
        if !a.up || Some(a.inc) != watched || a.boot != boot {
            return;
        }
        let input = Input::ExecutorExited {
            key: p.key.clone(),
            run_id: p.run_id.clone(),
            code: p.exit.as_ref().and_then(|(code, _)| *code),
            message: p.exit.as_ref().map(|(_, m)| m.clone()).unwrap_or_default(),
        };
        let inc = a.inc;
        let d = self.between(100_000, 5 * MS);
        self.after(
            d,
            Ev::AgentInput {
                agent: i,
                inc,
                input: Box::new(input),
            },
        );
    }

    // --- the master link ---

    pub(crate) fn agent_connect(&mut self, i: usize, inc: u64) {
        let a = &self.agents[i];
        if !a.up || a.inc != inc || a.link.conn.is_some() {
            return;
        }
        let cut_off = self.cut_off(Some(i), None);
        if !self.master.up || cut_off {
            let fail = self.connect_failure_delay(cut_off);
            let sample = self.rng.random::<f64>();
            let backoff = self.agents[i].link.backoff.next_delay(sample);
            let d = fail + u64::try_from(backoff.as_nanos()).unwrap_or(u64::MAX / 4);
            self.after(d, Ev::AgentConnect { agent: i, inc });
            return;
        }
        let conn = self.open(ConnKind::Agent {
            agent: i,
            inc,
            master: self.master.inc,
        });
        let link = &mut self.agents[i].link;
        link.conn = Some(conn);
        link.silence = REGISTRATION_WAIT;
        link.deadline = self.t + REGISTRATION_WAIT;
        self.agent_link_schedule_check(i, inc, conn);
        self.agent_input(
            i,
            inc,
            Input::MasterConnected {
                conn,
                local_ip: None,
            },
        );
    }

    fn agent_link_schedule_check(&mut self, i: usize, inc: u64, conn: u64) {
        let at = self.agents[i].link.deadline;
        if self.agents[i].link.check_at.is_none_or(|t| at < t) {
            self.agents[i].link.check_at = Some(at);
            self.at(
                at,
                Ev::AgentLinkCheck {
                    agent: i,
                    inc,
                    conn,
                    at,
                },
            );
        }
    }

    pub(crate) fn agent_link_check(&mut self, i: usize, inc: u64, conn: u64, at: Time) {
        let a = &mut self.agents[i];
        if !a.up || a.inc != inc || a.link.conn != Some(conn) || a.link.check_at != Some(at) {
            return;
        }
        a.link.check_at = None;
        if self.t >= a.link.deadline {
            self.note(|| format!("agent {i}: the master is silent; reconnecting"));
            self.agent_link_drop(i, inc, conn);
        } else {
            self.agent_link_schedule_check(i, inc, conn);
        }
    }

    /// The link drops its connection and connects anew after a backoff.
    fn agent_link_drop(&mut self, i: usize, inc: u64, conn: u64) {
        self.close(conn, Side::Client, "agent reconnecting");
        self.agent_link_ended(i, inc, conn);
    }

    pub(crate) fn agent_link_ended(&mut self, i: usize, inc: u64, conn: u64) {
        let a = &mut self.agents[i];
        if !a.up || a.inc != inc || a.link.conn != Some(conn) {
            return;
        }
        a.link.conn = None;
        a.link.check_at = None;
        let sample = self.rng.random::<f64>();
        let backoff = self.agents[i].link.backoff.next_delay(sample);
        self.after_dur(backoff, Ev::AgentConnect { agent: i, inc });
        self.after(
            0,
            Ev::AgentInput {
                agent: i,
                inc,
                input: Box::new(Input::MasterDisconnected { conn }),
            },
        );
    }

    pub(crate) fn agent_master_event(
        &mut self,
        i: usize,
        inc: u64,
        conn: u64,
        event: agent_api::Event,
    ) {
        let a = &mut self.agents[i];
        if !a.up || a.inc != inc || a.link.conn != Some(conn) {
            return;
        }
        match &event {
            agent_api::Event::Ping => {
                a.link.deadline = self.t + a.link.silence;
                self.send(
                    conn,
                    Side::Client,
                    Msg::AgentCall(Box::new(agent_api::Call::Pong)),
                );
                return;
            }
            agent_api::Event::Registered {
                ping_interval_seconds,
                agent_id,
                ..
            } => {
                a.id = Some(agent_id.clone());
                let interval = if ping_interval_seconds.is_finite() && *ping_interval_seconds > 0.0
                {
                    (ping_interval_seconds.min(86_400.0) * SEC as f64) as Time
                } else {
                    15 * SEC
                };
                a.link.silence = interval * (SILENT_PINGS + 1);
                a.link.backoff.reset();
            }
            agent_api::Event::Shutdown { .. } => {
                a.shut_down = true;
                self.check.agent_refused(i);
            }
            _ => {}
        }
        let a = &mut self.agents[i];
        a.link.deadline = self.t + a.link.silence;
        self.agent_input(
            i,
            inc,
            Input::MasterEvent {
                conn,
                event: Box::new(event),
            },
        );
    }

    // --- the executor endpoint ---

    pub(crate) fn agent_exec_call(&mut self, i: usize, inc: u64, conn: u64, call: exec_api::Call) {
        let a = &self.agents[i];
        if !a.up || a.inc != inc {
            return;
        }
        let Some(subscribed) = a.exec_conns.get(&conn).copied() else {
            return;
        };
        let size = agora_proto::encode(&call).len();
        if size > agora_proto::MAX_FRAME_BYTES {
            self.note(|| format!("agent {i}: executor frame over the cap on conn {conn}"));
            let what = match &call {
                exec_api::Call::Subscribe {
                    executor_id,
                    unacknowledged_updates,
                    ..
                } => format!(
                    "SUBSCRIBE of executor {executor_id} listing {} unacknowledged updates",
                    unacknowledged_updates.len()
                ),
                exec_api::Call::Update { status } => {
                    format!("UPDATE of task {}", status.task_id)
                }
                _ => "a call".to_string(),
            };
            self.violated(
                FRAMES_FIT,
                format!(
                    "agent {i} refused {what} on conn {conn}: {size} bytes, over the {}-byte frame cap (what it carries cannot be delivered)",
                    agora_proto::MAX_FRAME_BYTES
                ),
            );
            self.agents[i].exec_conns.remove(&conn);
            self.close(
                conn,
                Side::Server,
                &format!(
                    "frame exceeds the {}-byte limit",
                    agora_proto::MAX_FRAME_BYTES
                ),
            );
            if subscribed {
                self.agent_input(i, inc, Input::ExecutorDisconnected { conn });
            }
            return;
        }
        match call {
            exec_api::Call::Subscribe {
                framework_id,
                executor_id,
                token,
                unacknowledged_updates,
                unacknowledged_tasks,
                ..
            } => {
                self.agents[i].exec_conns.insert(conn, true);
                self.agent_input(
                    i,
                    inc,
                    Input::ExecutorSubscribe {
                        conn,
                        framework_id,
                        executor_id,
                        token: Some(token),
                        updates: unacknowledged_updates,
                        tasks: unacknowledged_tasks,
                    },
                );
            }
            _ if !subscribed => self.send(
                conn,
                Side::Server,
                Msg::ExecEvent(Box::new(exec_api::Event::Error {
                    message: "subscribe first".into(),
                    fatal: false,
                })),
            ),
            call => self.agent_input(i, inc, Input::ExecutorCall { conn, call }),
        }
    }

    pub(crate) fn agent_exec_ended(&mut self, i: usize, inc: u64, conn: u64) {
        let a = &mut self.agents[i];
        if !a.up || a.inc != inc {
            return;
        }
        if let Some(subscribed) = a.exec_conns.remove(&conn) {
            if subscribed {
                self.agent_input(i, inc, Input::ExecutorDisconnected { conn });
            }
        }
    }

    /// Accepts an executor's connection: whether the agent process is up.
    pub(crate) fn agent_accept(&mut self, i: usize, proc: u64) -> Option<u64> {
        let a = &self.agents[i];
        if !a.up {
            return None;
        }
        let inc = a.inc;
        let conn = self.open(ConnKind::Exec {
            proc,
            agent: i,
            inc,
        });
        self.agents[i].exec_conns.insert(conn, false);
        Some(conn)
    }
}

// === impl Disk ===

impl Disk {
    /// Carries out one op: on the page cache, and when `synced` (or the op
    /// syncs itself) on what survives a machine crash.
    fn write(&mut self, op: Op, synced: bool) {
        match op {
            Op::Replace { path, bytes } => {
                // Written to a temporary file, synced, renamed: durable
                // once done.
                self.durable.insert(path.clone(), bytes.clone());
                self.files.insert(path, bytes);
            }
            Op::Wal(record) => {
                self.wal
                    .extend_from_slice(&wal_encode(std::slice::from_ref(&record)));
                self.streams.apply(record);
                if synced {
                    self.synced = self.wal.len();
                }
            }
            Op::WalForget(framework_id) => {
                // A new segment, synced, renamed over the log.
                self.streams.forget(framework_id.as_ref());
                let records: Vec<WalRecord> = self
                    .streams
                    .states()
                    .cloned()
                    .map(WalRecord::Stream)
                    .collect();
                self.wal = wal_encode(&records);
                self.synced = self.wal.len();
            }
            Op::RemoveDir { path } => {
                // Not synced: a machine crash may bring it back.
                self.files.retain(|p, _| !p.starts_with(&path));
                self.dirs.retain(|p| !p.starts_with(&path));
                if synced {
                    self.durable.retain(|p, _| !p.starts_with(&path));
                }
            }
            Op::RemoveFile { path } => {
                self.files.remove(&path);
                self.durable.remove(&path);
            }
        }
    }

    /// What a machine crash leaves: synced files; of the log, the synced
    /// part and of the rest a random subset of its pages (the length may
    /// have reached the disk while some pages did not); with a media
    /// error, the synced part has a damaged page too.
    /// Says what a media error did.
    fn machine_crash(
        &mut self,
        tear: u64,
        keep_length: bool,
        media: Option<MediaError>,
    ) -> Option<String> {
        self.files = self.durable.clone();
        let synced = self.synced;
        if (self.wal.len() > synced || media.is_some()) && self.written.is_none() {
            self.written = Some(self.wal.clone());
        }
        if self.wal.len() > self.synced {
            let mut tail = self.wal.split_off(self.synced);
            if keep_length {
                let first_page = self.synced / PAGE;
                let mut bits = tear;
                for (n, chunk) in tail.chunks_mut(PAGE).enumerate() {
                    // Pages straddle the synced boundary at the start.
                    let _ = first_page + n;
                    if bits & 1 == 0 {
                        chunk.iter_mut().for_each(|b| *b = 0);
                    }
                    bits = bits.rotate_right(1);
                }
                self.wal.extend_from_slice(&tail);
            } else {
                let keep = (tear as usize) % (tail.len() + 1);
                self.wal.extend_from_slice(&tail[..keep]);
            }
        }
        let damage = media.filter(|_| synced > 0).map(|media| {
            let at = (media.at % synced as u64) as usize;
            if media.zero_page {
                let page = at / PAGE * PAGE;
                let end = (page + PAGE).min(synced);
                self.wal[page..end].fill(0);
                format!("zeroed bytes {page}..{end} of the {synced} synced bytes of its log")
            } else {
                self.wal[at] ^= media.flip;
                format!("flipped byte {at} of the {synced} synced bytes of its log")
            }
        });
        if self.written.as_deref() == Some(self.wal.as_slice()) {
            self.written = None;
        }
        self.synced = self.wal.len();
        let streams = wal_decode(&self.wal);
        self.streams = Streams::default();
        for s in streams {
            self.streams.apply(WalRecord::Stream(s));
        }
        damage
    }
}

/// How a restarted agent read back a log a machine crash changed.
struct ReadBack {
    /// Bytes the agent had written.
    written: usize,
    /// Where its records stop being intact: the end of the last record
    /// before the first changed byte.
    intact: usize,
    /// Uuids of updates whose records were at or after that point and
    /// that the agent did not recover: lost with the damage.
    lost: BTreeSet<String>,
    /// What is wrong when the agent recovered anything but the intact
    /// records.
    wrong: Option<String>,
}

/// Compares what agent `i` recovered (`recovered`, from the bytes the disk
/// `kept`) with what it `written`: it must be exactly the records before
/// the first damaged one.
fn read_back(i: usize, written: &[u8], kept: &[u8], recovered: &[StreamState]) -> ReadBack {
    let changed = written
        .iter()
        .zip(kept)
        .position(|(w, k)| w != k)
        .unwrap_or(written.len().min(kept.len()));
    // Records end in a newline, which JSON never holds raw.
    let intact = written[..changed]
        .iter()
        .rposition(|b| *b == b'\n')
        .map_or(0, |p| p + 1);
    let key = |s: &StreamState| (s.framework_id.clone(), s.task_id.clone());
    let mut expected = wal_decode(&written[..intact]);
    expected.sort_by_key(key);
    let mut got = recovered.to_vec();
    got.sort_by_key(key);
    let uuids = |streams: &[StreamState]| -> BTreeSet<String> {
        streams
            .iter()
            .flat_map(|s| {
                s.acked
                    .iter()
                    .cloned()
                    .chain(s.pending.iter().filter_map(|u| u.uuid.clone()))
                    .chain(s.last_acked.as_ref().and_then(|u| u.uuid.clone()))
            })
            .collect()
    };
    let kept_uuids = uuids(&got);
    let lost = record_uuids(&written[intact..])
        .into_iter()
        .filter(|u| !kept_uuids.contains(u))
        .collect();
    let wrong = (expected != got).then(|| {
        let show = |s: &StreamState| {
            format!(
                "{}: acked {}, pending {:?}, latest {:?}",
                s.task_id,
                s.acked.len(),
                s.pending
                    .iter()
                    .map(|u| format!("{}/{}", u.state.as_str(), u.uuid.as_deref().map_or("-", |u| &u[..8.min(u.len())])))
                    .collect::<Vec<_>>(),
                s.pending
                    .last()
                    .or(s.last_acked.as_ref())
                    .map(|u| u.state.as_str())
            )
        };
        let diff: Vec<String> = expected
            .iter()
            .chain(&got)
            .map(key)
            .collect::<BTreeSet<_>>()
            .into_iter()
            .filter_map(|k| {
                let e = expected.iter().find(|s| key(s) == k);
                let g = got.iter().find(|s| key(s) == k);
                (e != g).then(|| {
                    format!(
                        "intact records say {}; recovered {}",
                        e.map_or("nothing".into(), show),
                        g.map_or("nothing".into(), show)
                    )
                })
            })
            .take(3)
            .collect();
        format!(
            "agent {i}'s log was damaged at byte {changed} of {}: the records before byte {intact} hold {} streams, but the agent recovered {}: {}",
            written.len(),
            expected.len(),
            got.len(),
            diff.join("; ")
        )
    });
    ReadBack {
        written: written.len(),
        intact,
        lost,
        wrong,
    }
}

/// The uuids of the updates that records (intact lines of a log) hold.
fn record_uuids(records: &[u8]) -> BTreeSet<String> {
    let mut uuids = BTreeSet::new();
    for line in records.split(|b| *b == b'\n') {
        let json = match line.iter().rposition(|b| *b == b'\t') {
            Some(tab) => &line[..tab],
            None => line,
        };
        match serde_json::from_slice::<WalRecord>(json) {
            Ok(WalRecord::Update { status, .. }) => uuids.extend(status.uuid),
            Ok(WalRecord::Stream(s)) => {
                uuids.extend(s.acked);
                uuids.extend(s.pending.into_iter().filter_map(|u| u.uuid));
                uuids.extend(s.last_acked.and_then(|u| u.uuid));
            }
            _ => {}
        }
    }
    uuids
}

/// Writes what the disk kept into `work_dir` (emptied first), for the
/// agent's recovery to read.
fn materialise(work_dir: &Path, disk: &Disk) {
    if let Ok(entries) = std::fs::read_dir(work_dir) {
        for entry in entries.flatten() {
            let path = entry.path();
            let _ = if path.is_dir() {
                std::fs::remove_dir_all(&path)
            } else {
                std::fs::remove_file(&path)
            };
        }
    }
    for dir in &disk.dirs {
        if dir.starts_with(work_dir) {
            let _ = std::fs::create_dir_all(dir);
        }
    }
    for (path, bytes) in &disk.files {
        if !path.starts_with(work_dir) {
            continue;
        }
        if let Some(parent) = path.parent() {
            let _ = std::fs::create_dir_all(parent);
        }
        std::fs::write(path, bytes)
            .unwrap_or_else(|e| panic!("cannot write {}: {e}", path.display()));
    }
}
