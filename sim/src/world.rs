//! The simulated world: one virtual clock, one queue of timed events, the
//! connections between nodes, and the loop that takes the next event,
//! hands it to the node it concerns and checks the invariants.
//!
//! Every choice (latencies, faults, workloads, ids) comes from one seeded
//! generator, and the cores' own ids from seeds drawn from it, so a seed
//! replays step for step.

use std::collections::{BTreeMap, BinaryHeap, VecDeque};
use std::fmt::Write as _;
use std::time::Duration;

use agora_proto::agent as agent_api;
use agora_proto::executor as exec_api;
use agora_proto::scheduler as sched_api;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tokio::time::Instant;

use crate::agent::AgentNode;
use crate::check::Checker;
use crate::executor::ExecProc;
use crate::faults::Plan;
use crate::framework::FwNode;
use crate::master::MasterNode;
use crate::{Options, Violation};

/// Virtual time: nanoseconds since the start of the run.
pub(crate) type Time = u64;

pub(crate) const MS: Time = 1_000_000;
pub(crate) const SEC: Time = 1_000_000_000;

/// The wall clock at virtual time zero (a fixed date, so runs replay).
const WALL_ZERO: f64 = 1_800_000_000.0;

/// Who a message or notice is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Side {
    /// The side that opened the connection (scheduler, agent link,
    /// executor).
    Client,
    /// The side that accepted it (master, agent's executor endpoint).
    Server,
}

/// What a connection joins.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ConnKind {
    /// Scheduler `fw` (incarnation `inc`) to master incarnation `master`.
    Sched { fw: usize, inc: u64, master: u64 },
    /// Agent `agent`'s master link (process incarnation `inc`) to master
    /// incarnation `master`.
    Agent { agent: usize, inc: u64, master: u64 },
    /// Executor process `proc` to agent `agent` (process incarnation
    /// `inc`).
    Exec { proc: u64, agent: usize, inc: u64 },
    /// A forger under `principal` to master incarnation `master`, posing
    /// as an agent (`agent`) or a scheduler (see `forgery.rs`).
    Forger {
        master: u64,
        agent: bool,
        principal: crate::forgery::Principal,
    },
}

/// A connection: frames in order per direction until it closes or breaks.
#[derive(Debug)]
pub(crate) struct Conn {
    pub kind: ConnKind,
    /// Broken (reset, crash, partition): nothing more gets through.
    pub broken: bool,
    /// Each side, once it has closed or learnt of the end.
    pub done: [bool; 2],
    /// Delivery time of the last frame sent each way (frames keep their
    /// order).
    pub last: [Time; 2],
}

/// A frame on a connection.
#[derive(Debug, Clone)]
pub(crate) enum Msg {
    /// With, for a RECONCILE or a KILL, the launch each task it names was
    /// at its scheduler when sent (for the checker).
    SchedCall(Box<sched_api::Call>, Vec<(agora_proto::TaskId, u32)>),
    /// With the launch the master's record was about when it made it (an
    /// update's, for the checker).
    SchedEvent(Box<sched_api::Event>, Option<u32>),
    AgentCall(Box<agent_api::Call>),
    AgentEvent(Box<agent_api::Event>),
    ExecCall(Box<exec_api::Call>),
    ExecEvent(Box<exec_api::Event>),
    /// A close frame: the sender closed the connection after what it sent
    /// before.
    Close(String),
}

/// Something that happens at a time.
#[derive(Debug)]
pub(crate) enum Ev {
    /// A frame reaches `to`.
    Deliver { conn: u64, to: Side, msg: Msg },
    /// `side` learns that connection `conn` broke.
    Broken { conn: u64, side: Side },
    /// The master's timers.
    MasterTick { inc: u64, at: Time },
    /// The master's registry write of its last batch is done.
    MasterWrote { inc: u64 },
    /// An agent's status update retries.
    AgentTick { agent: usize, inc: u64, at: Time },
    /// A timer an agent core set.
    AgentTimer {
        agent: usize,
        inc: u64,
        timer: agora_agent::sim::Timer,
    },
    /// An input for an agent core from its process thread or disk.
    AgentInput {
        agent: usize,
        inc: u64,
        input: Box<agora_agent::sim::Input>,
    },
    /// An agent's checkpoint writer finished its current batch.
    DiskDone { agent: usize, inc: u64, batch: u64 },
    /// An agent's master link tries to connect.
    AgentConnect { agent: usize, inc: u64 },
    /// An agent's master link checks for silence.
    AgentLinkCheck {
        agent: usize,
        inc: u64,
        conn: u64,
        at: Time,
    },
    /// A scheduler tries to connect.
    SchedConnect { fw: usize, inc: u64 },
    /// A scheduler's clock tick.
    SchedTick { fw: usize, inc: u64 },
    /// The framework's own timers (kills, reconciliation, launches).
    FwWake { fw: usize },
    /// An executor process tries to connect to its agent.
    ExecConnect { proc: u64 },
    /// An executor driver's clock tick.
    ExecTick { proc: u64 },
    /// A step of an executor's task (running, ending).
    ExecTask {
        proc: u64,
        task: agora_proto::TaskId,
        launch: u32,
        step: u32,
    },
    /// An executor process exits on its own (a crash).
    ExecCrash { proc: u64 },
    /// SIGKILL for a process still running after its grace period.
    ExecSigkill { proc: u64 },
    /// A scheduled fault.
    Fault(crate::faults::Fault),
    /// Faults stop from here on.
    Quiet,
    /// Probe tasks go in (a while after `Quiet`).
    Probes,
    /// The end of the run: liveness is judged.
    End,
}

struct Queued {
    at: Time,
    seq: u64,
    ev: Ev,
}

impl PartialEq for Queued {
    fn eq(&self, other: &Self) -> bool {
        (self.at, self.seq) == (other.at, other.seq)
    }
}
impl Eq for Queued {}
impl PartialOrd for Queued {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Queued {
    // Earliest first in a max-heap.
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        (other.at, other.seq).cmp(&(self.at, self.seq))
    }
}

/// The whole simulated cluster.
pub(crate) struct World {
    pub seed: u64,
    pub opts: Options,
    pub rng: StdRng,
    base: Instant,
    pub t: Time,
    queue: BinaryHeap<Queued>,
    seq: u64,
    pub step: u64,
    pub conns: BTreeMap<u64, Conn>,
    next_conn: u64,
    pub master: MasterNode,
    pub agents: Vec<AgentNode>,
    pub fws: Vec<FwNode>,
    pub procs: BTreeMap<u64, ExecProc>,
    pub next_proc: u64,
    pub plan: Plan,
    /// Every task's plan, by task id and launch.
    pub plans: BTreeMap<(agora_proto::TaskId, u32), crate::executor::TaskPlan>,
    pub partitions: crate::faults::Partitions,
    pub check: Checker,
    /// Faults still happen.
    pub faulty: bool,
    /// Roles handed out by `Rerole` faults.
    pub reroles: u64,
    trace: VecDeque<String>,
    /// A hash of every trace line: two runs of a seed match step for step
    /// when theirs do.
    fingerprint: std::hash::DefaultHasher,
    /// The first invariant broken.
    pub violation: Option<Violation>,
}

// === impl World ===

impl World {
    pub(crate) fn new(seed: u64, opts: Options) -> World {
        let mut rng = StdRng::seed_from_u64(seed);
        let plan = Plan::generate(&mut rng, &opts);
        agora_proto::simulated::enter(WALL_ZERO, rng.random());
        let base = Instant::now();
        let mut world = World {
            seed,
            opts,
            rng,
            base,
            t: 0,
            queue: BinaryHeap::new(),
            seq: 0,
            step: 0,
            conns: BTreeMap::new(),
            next_conn: 1,
            master: MasterNode::default(),
            agents: Vec::new(),
            fws: Vec::new(),
            procs: BTreeMap::new(),
            next_proc: 1,
            plan,
            plans: BTreeMap::new(),
            partitions: crate::faults::Partitions::default(),
            check: Checker::default(),
            faulty: true,
            reroles: 0,
            trace: VecDeque::new(),
            fingerprint: std::hash::DefaultHasher::new(),
            violation: None,
        };
        world.start();
        world
    }

    /// Runs to the end or the first violation.
    pub(crate) fn run(mut self) -> Result<crate::Report, Box<Violation>> {
        while let Some(q) = self.queue.pop() {
            debug_assert!(q.at >= self.t);
            self.t = q.at;
            self.step += 1;
            if self.opts.trace > 0 {
                let line = format!("{:>10.3}s #{} {}", secs(self.t), self.step, describe(&q.ev));
                if self.opts.verbose {
                    eprintln!("{line}");
                }
                std::hash::Hash::hash(&line, &mut self.fingerprint);
                self.trace.push_back(line);
                while self.trace.len() > self.opts.trace {
                    self.trace.pop_front();
                }
            }
            let end = matches!(q.ev, Ev::End);
            self.dispatch(q.ev);
            if self.violation.is_none() {
                self.check_step();
            }
            if let Some(mut v) = self.violation.take() {
                v.seed = self.seed;
                v.step = self.step;
                v.time = secs(self.t);
                v.trace = self.trace.iter().cloned().collect();
                return Err(Box::new(v));
            }
            if end {
                break;
            }
        }
        agora_proto::simulated::leave();
        Ok(crate::Report {
            steps: self.step,
            tasks: self.check.launched_count(),
            virtual_secs: secs(self.t),
            fingerprint: std::hash::Hasher::finish(&self.fingerprint),
        })
    }

    fn dispatch(&mut self, ev: Ev) {
        match ev {
            Ev::Deliver { conn, to, msg } => self.deliver(conn, to, msg),
            Ev::Broken { conn, side } => self.learn_broken(conn, side),
            Ev::MasterTick { inc, at } => self.master_tick(inc, at),
            Ev::MasterWrote { inc } => self.master_wrote(inc),
            Ev::AgentTick { agent, inc, at } => self.agent_tick(agent, inc, at),
            Ev::AgentTimer { agent, inc, timer } => {
                self.agent_input(agent, inc, agora_agent::sim::Input::Timer(timer))
            }
            Ev::AgentInput { agent, inc, input } => self.agent_input(agent, inc, *input),
            Ev::DiskDone { agent, inc, batch } => self.disk_done(agent, inc, batch),
            Ev::AgentConnect { agent, inc } => self.agent_connect(agent, inc),
            Ev::AgentLinkCheck {
                agent,
                inc,
                conn,
                at,
            } => self.agent_link_check(agent, inc, conn, at),
            Ev::SchedConnect { fw, inc } => self.sched_connect(fw, inc),
            Ev::SchedTick { fw, inc } => self.sched_tick(fw, inc),
            Ev::FwWake { fw } => self.fw_wake(fw),
            Ev::ExecConnect { proc } => self.exec_connect(proc),
            Ev::ExecTick { proc } => self.exec_tick(proc),
            Ev::ExecTask {
                proc,
                task,
                launch,
                step,
            } => self.exec_task_step(proc, task, launch, step),
            Ev::ExecCrash { proc } => self.exec_exit(proc, Some(1), "crashed".into()),
            Ev::ExecSigkill { proc } => self.exec_sigkill(proc),
            Ev::Fault(f) => {
                // An operator's reactivation goes on after the faults stop.
                if self.faulty || matches!(f, crate::faults::Fault::Reactivate { .. }) {
                    self.fault(f)
                }
            }
            Ev::Quiet => self.quiet(),
            Ev::Probes => self.probes(),
            Ev::End => self.end(),
        }
    }

    // --- time ---

    /// The virtual time as the cores see it.
    pub(crate) fn now(&self) -> Instant {
        self.base + Duration::from_nanos(self.t)
    }

    /// The wall clock as a node with clock offset `offset` sees it; also
    /// what timestamps read until the next call.
    pub(crate) fn wall(&self, offset: f64) -> f64 {
        let wall = WALL_ZERO + secs(self.t) + offset;
        agora_proto::simulated::set_wall(wall);
        wall
    }

    /// Queues `ev` at `at` (not before now).
    pub(crate) fn at(&mut self, at: Time, ev: Ev) {
        self.seq += 1;
        self.queue.push(Queued {
            at: at.max(self.t),
            seq: self.seq,
            ev,
        });
    }

    /// Queues `ev` after `after`.
    pub(crate) fn after(&mut self, after: Time, ev: Ev) {
        self.at(self.t.saturating_add(after), ev);
    }

    /// Queues `ev` after `d`.
    pub(crate) fn after_dur(&mut self, d: Duration, ev: Ev) {
        let nanos = u64::try_from(d.as_nanos()).unwrap_or(u64::MAX / 4);
        self.after(nanos.min(u64::MAX / 4), ev);
    }

    /// A time between `lo` and `hi`.
    pub(crate) fn between(&mut self, lo: Time, hi: Time) -> Time {
        if hi <= lo {
            lo
        } else {
            self.rng.random_range(lo..hi)
        }
    }

    /// True with probability `p`.
    pub(crate) fn chance(&mut self, p: f64) -> bool {
        p > 0.0 && self.rng.random_bool(p.min(1.0))
    }

    /// Converts the cores' clock to virtual time.
    pub(crate) fn time_of(&self, i: Instant) -> Time {
        u64::try_from(i.saturating_duration_since(self.base).as_nanos()).unwrap_or(u64::MAX / 4)
    }

    // --- connections ---

    /// Opens a connection.
    pub(crate) fn open(&mut self, kind: ConnKind) -> u64 {
        let id = self.next_conn;
        self.next_conn += 1;
        self.conns.insert(
            id,
            Conn {
                kind,
                broken: false,
                done: [false; 2],
                last: [self.t; 2],
            },
        );
        id
    }

    /// Whether `side` of `conn` may still send and receive.
    pub(crate) fn usable(&self, conn: u64, side: Side) -> bool {
        self.conns
            .get(&conn)
            .is_some_and(|c| !c.broken && !c.done[idx(side)])
    }

    /// Sends `msg` from `from` on `conn` (dropped when the connection is
    /// gone, or lost with it under a fault).
    pub(crate) fn send(&mut self, conn: u64, from: Side, msg: Msg) {
        if !self.usable(conn, from) {
            return;
        }
        let to = other(from);
        let Some(kind) = self.conns.get(&conn).map(|c| c.kind) else {
            return;
        };
        let latency = self.latency(kind, &msg);
        let duplicate = self.faulty && self.duplicable(&msg) && self.chance(self.plan.dup_rate);
        let cut = self.faulty && self.chance(self.plan.cut_rate);
        let c = self.conns.get_mut(&conn).expect("checked above");
        let at = (self.t + latency).max(c.last[idx(to)]);
        c.last[idx(to)] = at;
        if cut {
            // The connection resets right after this frame left: it and
            // everything after it are lost.
            self.break_conn(conn, self.plan.reset_detect);
            return;
        }
        if duplicate {
            let again = msg.clone();
            self.at(at, Ev::Deliver { conn, to, msg });
            let extra = self.between(0, 200 * MS);
            let c = self.conns.get_mut(&conn).expect("checked above");
            let at2 = (at + extra).max(c.last[idx(to)]);
            c.last[idx(to)] = at2;
            self.at(
                at2,
                Ev::Deliver {
                    conn,
                    to,
                    msg: again,
                },
            );
        } else {
            self.at(at, Ev::Deliver { conn, to, msg });
        }
    }

    /// Closes `conn` from `from` after what it sent before (a close
    /// frame); `from` hears nothing more on it.
    pub(crate) fn close(&mut self, conn: u64, from: Side, reason: &str) {
        if !self.usable(conn, from) {
            if let Some(c) = self.conns.get_mut(&conn) {
                c.done[idx(from)] = true;
            }
            return;
        }
        self.send(conn, from, Msg::Close(reason.to_string()));
        if let Some(c) = self.conns.get_mut(&conn) {
            c.done[idx(from)] = true;
        }
    }

    /// Breaks `conn`: nothing more gets through; each side still on it
    /// learns of it after `detect` (bounds of a random delay).
    pub(crate) fn break_conn(&mut self, conn: u64, detect: (Time, Time)) {
        let Some(c) = self.conns.get_mut(&conn) else {
            return;
        };
        if c.broken {
            return;
        }
        c.broken = true;
        let done = c.done;
        for side in [Side::Client, Side::Server] {
            if !done[idx(side)] {
                let d = self.between(detect.0, detect.1);
                self.after(d, Ev::Broken { conn, side });
            }
        }
    }

    /// Forgets `conn` on `side` at once (a process that died): the other
    /// side learns of it after `detect`.
    pub(crate) fn drop_side(&mut self, conn: u64, side: Side, detect: (Time, Time)) {
        let Some(c) = self.conns.get_mut(&conn) else {
            return;
        };
        c.done[idx(side)] = true;
        if c.broken {
            return;
        }
        c.broken = true;
        if !c.done[idx(other(side))] {
            let d = self.between(detect.0, detect.1);
            self.after(
                d,
                Ev::Broken {
                    conn,
                    side: other(side),
                },
            );
        }
    }

    fn deliver(&mut self, conn: u64, to: Side, msg: Msg) {
        let Some(c) = self.conns.get(&conn) else {
            return;
        };
        if c.broken || c.done[idx(to)] {
            return;
        }
        let kind = c.kind;
        if let Msg::Close(reason) = &msg {
            if let Some(c) = self.conns.get_mut(&conn) {
                c.done[idx(to)] = true;
            }
            self.conn_ended(conn, kind, to, reason.clone());
            return;
        }
        match (kind, to, msg) {
            (ConnKind::Sched { .. }, Side::Server, Msg::SchedCall(call, asked)) => self
                .master_input_asked(
                    agora_master::sim::Input::Scheduler { conn, call: *call },
                    asked,
                ),
            (ConnKind::Agent { agent, .. }, Side::Server, Msg::AgentCall(call)) => {
                // The connection's principal goes with its REGISTER, as
                // the master's WebSocket layer hands it on.
                let principal = matches!(*call, agent_api::Call::Register { .. })
                    .then(|| crate::forgery::Principal::Agent(agent).name())
                    .flatten();
                self.master_input(agora_master::sim::Input::Agent {
                    conn,
                    call: *call,
                    principal,
                })
            }
            (ConnKind::Forger { principal, .. }, Side::Server, Msg::AgentCall(call)) => self
                .master_input(agora_master::sim::Input::Agent {
                    conn,
                    call: *call,
                    principal: principal.name(),
                }),
            (ConnKind::Forger { .. }, Side::Server, Msg::SchedCall(call, _)) => {
                self.master_input(agora_master::sim::Input::Scheduler { conn, call: *call })
            }
            (ConnKind::Forger { principal, .. }, Side::Client, msg) => {
                self.forger_heard(conn, principal, msg)
            }
            (ConnKind::Sched { fw, inc, .. }, Side::Client, Msg::SchedEvent(event, launch)) => {
                self.sched_event(fw, inc, conn, *event, launch)
            }
            (ConnKind::Agent { agent, inc, .. }, Side::Client, Msg::AgentEvent(event)) => {
                self.agent_master_event(agent, inc, conn, *event)
            }
            (ConnKind::Exec { agent, inc, .. }, Side::Server, Msg::ExecCall(call)) => {
                self.agent_exec_call(agent, inc, conn, *call)
            }
            (ConnKind::Exec { proc, .. }, Side::Client, Msg::ExecEvent(event)) => {
                self.exec_event(proc, conn, *event)
            }
            (kind, to, msg) => panic!("a frame on the wrong connection: {kind:?} {to:?} {msg:?}"),
        }
    }

    fn learn_broken(&mut self, conn: u64, side: Side) {
        let Some(c) = self.conns.get_mut(&conn) else {
            return;
        };
        if c.done[idx(side)] {
            return;
        }
        c.done[idx(side)] = true;
        let kind = c.kind;
        self.conn_ended(conn, kind, side, "connection broken".into());
    }

    /// `side` of `conn` learnt that it ended.
    fn conn_ended(&mut self, conn: u64, kind: ConnKind, side: Side, reason: String) {
        if let Some(c) = self.conns.get(&conn) {
            if c.done == [true, true] {
                self.conns.remove(&conn);
            }
        }
        match (kind, side) {
            (ConnKind::Sched { master, .. }, Side::Server) => {
                if master == self.master.inc && self.master.up {
                    self.master_input(agora_master::sim::Input::SchedulerClosed { conn });
                }
            }
            (ConnKind::Agent { master, .. }, Side::Server)
            | (
                ConnKind::Forger {
                    master,
                    agent: true,
                    ..
                },
                Side::Server,
            ) => {
                if master == self.master.inc && self.master.up {
                    self.master_input(agora_master::sim::Input::AgentClosed { conn });
                }
            }
            (
                ConnKind::Forger {
                    master,
                    agent: false,
                    ..
                },
                Side::Server,
            ) => {
                if master == self.master.inc && self.master.up {
                    self.master_input(agora_master::sim::Input::SchedulerClosed { conn });
                }
            }
            (ConnKind::Forger { .. }, Side::Client) => {}
            (ConnKind::Sched { fw, inc, .. }, Side::Client) => {
                self.sched_conn_ended(fw, inc, conn, &reason)
            }
            (ConnKind::Agent { agent, inc, .. }, Side::Client) => {
                self.agent_link_ended(agent, inc, conn)
            }
            (ConnKind::Exec { agent, inc, .. }, Side::Server) => {
                self.agent_exec_ended(agent, inc, conn)
            }
            (ConnKind::Exec { proc, .. }, Side::Client) => self.exec_conn_ended(proc, conn),
        }
    }

    /// How long a frame of `kind` takes; slow links and spikes from the
    /// plan.
    fn latency(&mut self, kind: ConnKind, msg: &Msg) -> Time {
        let local = matches!(kind, ConnKind::Exec { .. });
        let mut d = if local {
            self.between(20_000, 300_000)
        } else {
            self.between(100_000, 3 * MS)
        };
        if self.faulty && !local && self.chance(self.plan.spike_rate) {
            d += self.between(10 * MS, self.plan.spike_max);
        }
        if self.faulty && self.plan.slow_type.is_some_and(|t| t == msg_type(msg)) {
            d += self.between(0, self.plan.spike_max);
        }
        d
    }

    /// Frames a fault may deliver twice: those the protocol delivers at
    /// least once anyway (retried updates and acknowledgements), and
    /// offers (a scheduler may use an offer twice: the second use must be
    /// refused cleanly).
    fn duplicable(&self, msg: &Msg) -> bool {
        match msg {
            Msg::AgentCall(c) => matches!(**c, agent_api::Call::StatusUpdate { .. }),
            Msg::AgentEvent(e) => matches!(**e, agent_api::Event::Acknowledge { .. }),
            Msg::SchedCall(c, _) => matches!(
                **c,
                sched_api::Call::Acknowledge { .. } | sched_api::Call::Reconcile { .. }
            ),
            Msg::SchedEvent(e, _) => matches!(
                **e,
                sched_api::Event::Update { .. } | sched_api::Event::Offers { .. }
            ),
            Msg::ExecCall(c) => matches!(**c, exec_api::Call::Update { .. }),
            Msg::ExecEvent(e) => matches!(**e, exec_api::Event::Acknowledged { .. }),
            Msg::Close(_) => false,
        }
    }

    // --- trace and invariants ---

    /// Adds a line to the trace.
    pub(crate) fn note(&mut self, line: impl FnOnce() -> String) {
        if self.opts.trace > 0 {
            let line = format!("{:>10.3}s      {}", secs(self.t), line());
            if self.opts.verbose {
                eprintln!("{line}");
            }
            std::hash::Hash::hash(&line, &mut self.fingerprint);
            self.trace.push_back(line);
            while self.trace.len() > self.opts.trace {
                self.trace.pop_front();
            }
        }
    }

    /// Records a broken invariant (the first one wins).
    pub(crate) fn violated(&mut self, invariant: &'static str, detail: String) {
        if self.violation.is_none() {
            self.violation = Some(Violation {
                seed: self.seed,
                invariant,
                detail,
                step: self.step,
                time: secs(self.t),
                trace: Vec::new(),
            });
        }
    }

    /// A summary of the world for a failure report.
    pub(crate) fn summary(&self) -> String {
        let mut s = String::new();
        let _ = writeln!(
            s,
            "master: up {} inc {}; agents: {}; frameworks: {}; executors alive: {}",
            self.master.up,
            self.master.inc,
            self.agents
                .iter()
                .map(|a| format!("{}{}", a.name, if a.up { "" } else { "(down)" }))
                .collect::<Vec<_>>()
                .join(" "),
            self.fws.len(),
            self.procs.values().filter(|p| p.alive).count()
        );
        s
    }
}

pub(crate) fn idx(side: Side) -> usize {
    match side {
        Side::Client => 0,
        Side::Server => 1,
    }
}

pub(crate) fn other(side: Side) -> Side {
    match side {
        Side::Client => Side::Server,
        Side::Server => Side::Client,
    }
}

pub(crate) fn secs(t: Time) -> f64 {
    t as f64 / SEC as f64
}

/// A short name for a frame's type (for per-type faults and traces).
pub(crate) fn msg_type(msg: &Msg) -> &'static str {
    match msg {
        Msg::SchedCall(c, _) => match **c {
            sched_api::Call::Subscribe { .. } => "SUBSCRIBE",
            sched_api::Call::Teardown => "TEARDOWN",
            sched_api::Call::Launch { .. } => "LAUNCH",
            sched_api::Call::Decline { .. } => "DECLINE",
            sched_api::Call::Revive { .. } => "REVIVE",
            sched_api::Call::Suppress { .. } => "SUPPRESS",
            sched_api::Call::Kill { .. } => "KILL",
            sched_api::Call::Acknowledge { .. } => "ACKNOWLEDGE",
            sched_api::Call::Reconcile { .. } => "RECONCILE",
            _ => "SCHED_OTHER",
        },
        Msg::SchedEvent(e, _) => match **e {
            sched_api::Event::Subscribed { .. } => "SUBSCRIBED",
            sched_api::Event::Offers { .. } => "OFFERS",
            sched_api::Event::Rescind { .. } => "RESCIND",
            sched_api::Event::Update { .. } => "UPDATE",
            sched_api::Event::Heartbeat => "HEARTBEAT",
            sched_api::Event::Error { .. } => "ERROR",
            _ => "SCHED_EVENT_OTHER",
        },
        Msg::AgentCall(c) => match **c {
            agent_api::Call::Register { .. } => "REGISTER",
            agent_api::Call::StatusUpdate { .. } => "STATUS_UPDATE",
            agent_api::Call::Pong => "PONG",
            _ => "AGENT_OTHER",
        },
        Msg::AgentEvent(e) => match **e {
            agent_api::Event::Registered { .. } => "REGISTERED",
            agent_api::Event::RunTask { .. } => "RUN_TASK",
            agent_api::Event::KillTask { .. } => "KILL_TASK",
            agent_api::Event::Acknowledge { .. } => "STATUS_ACK",
            agent_api::Event::Ping => "PING",
            agent_api::Event::Shutdown { .. } => "SHUTDOWN",
            _ => "AGENT_EVENT_OTHER",
        },
        Msg::ExecCall(c) => match **c {
            exec_api::Call::Subscribe { .. } => "EXEC_SUBSCRIBE",
            exec_api::Call::Update { .. } => "EXEC_UPDATE",
            _ => "EXEC_OTHER",
        },
        Msg::ExecEvent(e) => match **e {
            exec_api::Event::Subscribed { .. } => "EXEC_SUBSCRIBED",
            exec_api::Event::Launch { .. } => "EXEC_LAUNCH",
            exec_api::Event::Kill { .. } => "EXEC_KILL",
            exec_api::Event::Acknowledged { .. } => "EXEC_ACKNOWLEDGED",
            exec_api::Event::Shutdown { .. } => "EXEC_SHUTDOWN",
            _ => "EXEC_EVENT_OTHER",
        },
        Msg::Close(_) => "CLOSE",
    }
}

fn describe(ev: &Ev) -> String {
    match ev {
        Ev::Deliver { conn, to, msg } => {
            let detail = match msg {
                Msg::SchedCall(c, _) => match &**c {
                    sched_api::Call::Launch {
                        tasks, offer_ids, ..
                    } => format!(
                        " {:?} on {:?}",
                        tasks.iter().map(|t| t.task_id.as_str()).collect::<Vec<_>>(),
                        offer_ids.iter().map(|o| o.as_str()).collect::<Vec<_>>()
                    ),
                    sched_api::Call::Kill { task_id, .. } => format!(" {task_id}"),
                    sched_api::Call::Acknowledge { task_id, uuid, .. } => {
                        format!(" {task_id} {}", &uuid[..8.min(uuid.len())])
                    }
                    _ => String::new(),
                },
                Msg::SchedEvent(e, _) => match &**e {
                    sched_api::Event::Update { status } => status_line(status),
                    sched_api::Event::Offers { offers } => format!(
                        " {:?}",
                        offers
                            .iter()
                            .map(|o| format!(
                                "{} {} {} executors {:?}",
                                o.id, o.agent_id, o.resources, o.executor_ids
                            ))
                            .collect::<Vec<_>>()
                    ),
                    sched_api::Event::Error { message, .. } => format!(" {message}"),
                    _ => String::new(),
                },
                Msg::AgentCall(c) => match &**c {
                    agent_api::Call::StatusUpdate { status, .. } => status_line(status),
                    agent_api::Call::Register {
                        tasks, executors, ..
                    } => format!(
                        " tasks {:?} executors {:?}",
                        tasks
                            .iter()
                            .map(|t| format!(
                                "{}:{}:{}",
                                t.task.task_id,
                                t.state.as_str(),
                                t.task.resources
                            ))
                            .collect::<Vec<_>>(),
                        executors
                            .iter()
                            .map(|e| format!("{}:{}", e.executor.executor_id, e.executor.resources))
                            .collect::<Vec<_>>()
                    ),
                    _ => String::new(),
                },
                Msg::AgentEvent(e) => match &**e {
                    agent_api::Event::RunTask { task, .. } => format!(" {}", task.task_id),
                    agent_api::Event::KillTask { task_id, .. } => format!(" {task_id}"),
                    agent_api::Event::Acknowledge { task_id, uuid, .. } => {
                        format!(" {task_id} {}", &uuid[..8.min(uuid.len())])
                    }
                    agent_api::Event::Registered { agent_id, .. } => format!(" {agent_id}"),
                    agent_api::Event::Shutdown { message } => format!(" {message}"),
                    agent_api::Event::Error { message, .. } => format!(" {message}"),
                    _ => String::new(),
                },
                Msg::ExecCall(c) => match &**c {
                    exec_api::Call::Update { status } => status_line(status),
                    exec_api::Call::Subscribe {
                        unacknowledged_updates,
                        ..
                    } => format!(" {} unacknowledged", unacknowledged_updates.len()),
                    _ => String::new(),
                },
                Msg::ExecEvent(e) => match &**e {
                    exec_api::Event::Launch { task, .. } => format!(" {}", task.task_id),
                    exec_api::Event::Kill { task_id, .. } => format!(" {task_id}"),
                    exec_api::Event::Acknowledged { task_id, uuid } => {
                        format!(" {task_id} {}", &uuid[..8.min(uuid.len())])
                    }
                    _ => String::new(),
                },
                Msg::Close(reason) => format!(" ({reason})"),
            };
            format!("conn {conn} -> {to:?}: {}{detail}", msg_type(msg))
        }
        Ev::AgentInput { agent, input, .. } => format!("agent {agent}: {}", input_line(input)),
        Ev::Fault(f) => format!("FAULT {f:?}"),
        other => format!("{other:?}"),
    }
}

fn status_line(status: &agora_proto::TaskStatus) -> String {
    format!(
        " {} {} {:?} {}",
        status.task_id,
        status.state.as_str(),
        status.source,
        status
            .uuid
            .as_deref()
            .map(|u| &u[..8.min(u.len())])
            .unwrap_or("-")
    )
}

fn input_line(input: &agora_agent::sim::Input) -> String {
    use agora_agent::sim::Input;
    match input {
        Input::ExecutorLaunched { run_id, result, .. } => {
            format!(
                "launched {} {:?}",
                &run_id[..8.min(run_id.len())],
                result.as_ref().map(|s| s.pid)
            )
        }
        Input::ExecutorExited {
            run_id,
            code,
            message,
            ..
        } => format!(
            "exited {} {code:?} {message}",
            &run_id[..8.min(run_id.len())]
        ),
        Input::Durable(d, r) => format!("durable {d:?} {r:?}"),
        other => format!("{other:?}"),
    }
}
