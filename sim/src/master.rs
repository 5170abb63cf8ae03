//! The master node: the real sans-IO master with the real DRF allocator,
//! its registry kept by the simulation (as etcd would keep it), crashes
//! and restarts.

use std::collections::VecDeque;
use std::time::Duration;

use agora_master::sim::{Config, Input, Output, RegistryOp, RegistryState, SimMaster};
use agora_proto::agent as agent_api;
use agora_proto::scheduler as sched_api;
use agora_proto::TaskId;

use crate::world::{ConnKind, Ev, Msg, Side, World, MS, SEC};

/// The master process and what outlives it.
#[derive(Default)]
pub(crate) struct MasterNode {
    pub core: Option<SimMaster>,
    /// Process incarnation: connections and timers of an earlier one are
    /// dead.
    pub inc: u64,
    pub up: bool,
    /// What the registry holds (durable).
    pub registry: RegistryState,
    /// When a tick is queued for.
    pub tick_at: Option<u64>,
    /// Wall clock offset (clock jumps).
    pub clock: f64,
    /// The state task is blocked on a registry write: inputs queue, and
    /// its outputs wait for the write (as the real event loop does).
    pub writing: bool,
    /// Inputs that arrived during a write: the next batch.
    pub queued: VecDeque<(Input, Asked)>,
    /// Outputs of the batch being written.
    pub held: Vec<(Output, Option<u32>)>,
    /// Outputs of the inputs handled since the last step ended, each with
    /// the launch an update to a scheduler is about.
    pub outbox: Vec<(Output, Option<u32>)>,
}

/// The master's configuration in the simulation: Mesos's defaults with
/// shorter intervals, so a run covers many of them.
pub(crate) fn config() -> Config {
    Config {
        allocation_interval: Duration::from_millis(500),
        agent_ping_interval: Duration::from_secs(5),
        max_missed_pings: 3,
        heartbeat_interval: Duration::from_secs(5),
        offer_timeout: Some(Duration::from_secs(30)),
        agent_reregister_timeout: Duration::from_secs(30),
        recovered_framework_timeout: Duration::from_secs(60),
        ..Config::default()
    }
}

/// Most removed agents and frameworks the registry keeps.
pub(crate) const REMOVED_CAPACITY: usize = 100;

/// Task ids with a launch of each.
pub(crate) type Asked = Vec<(TaskId, u32)>;

/// Inputs handled per wake-up (the real event loop's `MAX_BATCH`).
const MAX_BATCH: usize = 512;

// === impl World: master ===

impl World {
    /// Starts (or restarts) the master from its registry.
    pub(crate) fn master_start(&mut self) {
        self.master.inc += 1;
        self.master.up = true;
        let now = self.now();
        let wall = self.wall(self.master.clock);
        self.check.master_started();
        let mut core = SimMaster::new(config(), &format!("m{}", self.master.inc), now);
        core.recover(&self.master.registry, now, wall);
        self.master.core = Some(core);
        self.master.tick_at = None;
        self.master_idle();
        self.note(|| "master started".into());
        self.master_after_step();
    }

    /// Crashes the master: every connection to it breaks.
    pub(crate) fn master_crash(&mut self) {
        if !self.master.up {
            return;
        }
        self.master.up = false;
        self.master.core = None;
        self.master_idle();
        let conns: Vec<u64> = self
            .conns
            .iter()
            .filter(|(_, c)| match c.kind {
                ConnKind::Sched { master, .. }
                | ConnKind::Agent { master, .. }
                | ConnKind::Forger { master, .. } => master == self.master.inc,
                ConnKind::Exec { .. } => false,
            })
            .map(|(id, _)| *id)
            .collect();
        for conn in conns {
            self.drop_side(conn, Side::Server, (100_000, 5 * MS));
        }
        self.note(|| "master crashed".into());
    }

    pub(crate) fn master_input(&mut self, input: Input) {
        self.master_input_asked(input, Vec::new());
    }

    /// An input, with the launch each task a RECONCILE or KILL names was
    /// at its scheduler when sent.
    pub(crate) fn master_input_asked(&mut self, input: Input, asked: Asked) {
        if !self.master.up {
            return;
        }
        if self.master.writing {
            self.master.queued.push_back((input, asked));
            return;
        }
        let now = self.now();
        self.wall(self.master.clock);
        let launching = launching(&input);
        self.master_handle(now, input);
        self.master_attribute(&launching, &asked);
        self.master_after_step();
    }

    /// Takes the outputs of the input just handled, which launched
    /// `launching` or asked about `asked` (task ids with their launch),
    /// and notes which launch each update to a scheduler is about: that of
    /// a reliable update's creator; for one the master made itself, the
    /// launch the input carried, or else the one the master's record is
    /// about, or else the one the scheduler asked about, or else the one
    /// of the record it held before this input (it dropped the record
    /// meanwhile; none: the scheduler's latest launch when the update is
    /// sent, see `master_output`).
    fn master_attribute(&mut self, launching: &[(TaskId, u32)], asked: &[(TaskId, u32)]) {
        let Some(core) = self.master.core.as_mut() else {
            return;
        };
        let outputs = core.take_outputs();
        // A task launched now goes to an agent no operator holds back.
        let held: Option<String> = outputs.iter().find_map(|output| match output {
            Output::Agent {
                event: agent_api::Event::RunTask { task, .. },
                ..
            } if launching.iter().any(|(t, _)| *t == task.task_id)
                && core.operator_holds(&task.agent_id) =>
            {
                Some(format!("{} on {}", task.task_id, task.agent_id))
            }
            Output::Agent {
                event: agent_api::Event::RunTaskGroup { tasks, .. },
                ..
            } => tasks
                .iter()
                .find(|t| {
                    launching.iter().any(|(l, _)| *l == t.task_id)
                        && core.operator_holds(&t.agent_id)
                })
                .map(|t| format!("{} on {}", t.task_id, t.agent_id)),
            _ => None,
        });
        if let Some(detail) = held {
            self.violated(crate::check::NOT_HELD, detail);
        }
        for output in outputs {
            let mut tag = None;
            if let Output::Scheduler {
                conn,
                event: sched_api::Event::Update { status },
            } = &output
            {
                tag = self.update_launch(*conn, status, launching, asked);
            }
            self.master.outbox.push((output, tag));
        }
        if let Some(core) = self.master.core.as_ref() {
            self.check.master_records_now(core.task_records());
        }
    }

    fn update_launch(
        &self,
        conn: u64,
        status: &agora_proto::TaskStatus,
        launching: &[(TaskId, u32)],
        asked: &[(TaskId, u32)],
    ) -> Option<u32> {
        if let Some(launch) = status.uuid.as_deref().and_then(|u| self.check.origin(u)) {
            return Some(launch);
        }
        if let Some((_, launch)) = launching.iter().find(|(t, _)| *t == status.task_id) {
            return Some(*launch);
        }
        let asked = asked
            .iter()
            .find(|(t, _)| *t == status.task_id)
            .map(|(_, launch)| *launch);
        let Some(ConnKind::Sched { fw, .. }) = self.conns.get(&conn).map(|c| c.kind) else {
            return asked;
        };
        let Some(fid) = self.fws[fw].info.id.clone() else {
            return asked;
        };
        self.master
            .core
            .as_ref()
            .and_then(|core| core.task_info(&fid, &status.task_id))
            .and_then(|info| crate::framework::launch_of(&info.labels))
            .or(asked)
            .or_else(|| self.check.master_launch(&fid, &status.task_id))
    }

    /// The registry write of the last batch is done: its outputs go out,
    /// and what queued meanwhile is handled as one batch, as the real
    /// event loop drains its channel (so a batch can hold two ops on one
    /// record: a framework that subscribes and disconnects, an agent
    /// admitted and removed).
    pub(crate) fn master_wrote(&mut self, inc: u64) {
        if inc != self.master.inc || !self.master.up || !self.master.writing {
            return;
        }
        self.master.writing = false;
        for (output, launch) in std::mem::take(&mut self.master.held) {
            self.master_output(output, launch);
        }
        let now = self.now();
        self.wall(self.master.clock);
        let n = self.master.queued.len().min(MAX_BATCH + 1);
        let batch: Vec<(Input, Asked)> = self.master.queued.drain(..n).collect();
        for (input, asked) in batch {
            let launching = launching(&input);
            self.master_handle(now, input);
            self.master_attribute(&launching, &asked);
        }
        if let Some(core) = self.master.core.as_mut() {
            if now >= core.next_deadline() {
                core.tick(now);
            }
        }
        self.master_after_step();
    }

    /// No write in flight, nothing queued (a new process).
    fn master_idle(&mut self) {
        self.master.writing = false;
        self.master.queued.clear();
        self.master.held.clear();
        self.master.outbox.clear();
    }

    pub(crate) fn master_tick(&mut self, inc: u64, at: u64) {
        // Only the tick queued last counts.
        if inc != self.master.inc || !self.master.up || self.master.tick_at != Some(at) {
            return;
        }
        self.master.tick_at = None;
        if self.master.writing {
            // The state task looks at its timers once the write is done.
            return;
        }
        let now = self.now();
        self.wall(self.master.clock);
        if let Some(core) = self.master.core.as_mut() {
            if now >= core.next_deadline() {
                core.tick(now);
            }
        }
        self.master_after_step();
    }

    /// Makes the registry changes durable, then sends the outputs (as the
    /// master's event loop does), and queues the next tick.
    fn master_after_step(&mut self) {
        // What the timers sent.
        self.master_attribute(&[], &[]);
        let outputs = std::mem::take(&mut self.master.outbox);
        let Some(core) = self.master.core.as_mut() else {
            return;
        };
        let ops = core.take_registry_ops();
        let deadline = core.next_deadline();
        if !ops.is_empty() {
            if let Err(reason) = self.registry_write(&ops) {
                // The real master stops rather than act on changes it
                // cannot keep.
                self.violated(
                    "the master never stops on a registry write",
                    format!(
                        "the registry refused a write of {} ops: {reason}",
                        ops.len()
                    ),
                );
                self.master_crash();
                return;
            }
        }
        self.check.master_stepped = true;
        if !ops.is_empty() {
            // The write blocks the state task for an etcd round trip (or
            // an fsync); its outputs go out once it is done.
            self.master.writing = true;
            self.master.held = outputs;
            let inc = self.master.inc;
            let (min, max) = self.plan.registry_latency;
            let at = self.t + self.between(min, max);
            self.at(at, Ev::MasterWrote { inc });
            return;
        }
        for (output, launch) in outputs {
            self.master_output(output, launch);
        }
        let at = self.time_of(deadline).max(self.t + MS);
        if self.master.tick_at.is_none_or(|t| at < t) {
            self.master.tick_at = Some(at);
            let inc = self.master.inc;
            self.at(at, Ev::MasterTick { inc, at });
        }
    }

    /// Applies `ops` to the registry, as the etcd registry writes them.
    fn registry_write(&mut self, ops: &[RegistryOp]) -> Result<(), String> {
        crate::registry::check_write(&self.master.registry, ops, REMOVED_CAPACITY)?;
        for op in ops {
            if let RegistryOp::RemoveAgent { id } = op {
                self.check.agent_removed(id);
            }
            self.master.registry.apply(op, REMOVED_CAPACITY);
        }
        Ok(())
    }

    /// Sends an output of the master. An update goes with the launch it is
    /// about, settled now, as the master made it: the frame is what it is
    /// about wherever and however often it arrives (a network duplicate
    /// delivered after the framework launched the id again is still about
    /// the task the master made it for; Mesos gives it no mark, the
    /// simulated framework is told).
    fn master_output(&mut self, output: Output, mut launch: Option<u32>) {
        match output {
            Output::Scheduler { conn, event } => {
                if let sched_api::Event::Update { status } = &event {
                    if let Some(ConnKind::Sched { fw, .. }) = self.conns.get(&conn).map(|c| c.kind)
                    {
                        let about = launch
                            .unwrap_or_else(|| self.check.current_launch(fw, &status.task_id));
                        self.check.master_sent(fw, status, about);
                        launch = Some(about);
                    }
                }
                self.send(conn, Side::Server, Msg::SchedEvent(Box::new(event), launch))
            }
            Output::Agent { conn, event } => {
                self.send(conn, Side::Server, Msg::AgentEvent(Box::new(event)))
            }
            Output::Close { conn, reason, .. } => self.close(conn, Side::Server, &reason),
        }
    }

    /// How long a failed connection attempt takes to fail: at once when
    /// the master is down (refused), a connect timeout when it is cut off.
    pub(crate) fn connect_failure_delay(&mut self, partitioned: bool) -> u64 {
        if partitioned {
            self.between(SEC, 5 * SEC)
        } else {
            self.between(100_000, 2 * MS)
        }
    }
}

/// The tasks an input launches, with their launch numbers.
fn launching(input: &Input) -> Vec<(TaskId, u32)> {
    match input {
        Input::Scheduler {
            call: sched_api::Call::Launch { tasks, .. },
            ..
        } => tasks
            .iter()
            .filter_map(|t| crate::framework::launch_of(&t.labels).map(|l| (t.task_id.clone(), l)))
            .collect(),
        _ => Vec::new(),
    }
}
