//! The schedule a seed generates: the cluster's size, the workload, the
//! rates of message faults, and the timed faults (crashes, partitions,
//! failovers, clock jumps), all within the faulty phase; then a quiet
//! phase in which the cluster must finish its work.

use std::collections::BTreeSet;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::executor::ExecFault;
use crate::forgery::{Principal, Victim};
use crate::world::{Ev, Side, Time, World, MS, SEC};

use crate::Options;

/// How long after faults stop the probe tasks go in.
const PROBE_SETTLE: Time = 30 * SEC;
/// Share of (non-calm) seeds whose machine crashes damage synced data.
const MEDIA_ERROR_RATE: f64 = 0.1;
/// Longest executor outage: well within the executors' recovery timeout
/// (60 s in the simulation), so an executor that gives up has not been
/// waiting for an agent that was gone.
const EXEC_OUTAGE_MAX: Time = 40 * SEC;
/// Bytes of updates an executor's burst adds to its backlog, at least:
/// more than a frame holds.
const BURST_BYTES: usize = 20 << 20;
/// Mixed into the seed of the storage faults' generator.
const STORAGE_SALT: u64 = 0x5707_a6e0_d15c_0b5e;
/// Mixed into the seed of the forgeries' generator.
const FORGERY_SALT: u64 = 0xf0e9_ed1d_e471_7a11;
/// Share of (non-calm) seeds with forged registrations.
const FORGERY_RATE: f64 = 0.5;
/// Mixed into the seed of the drains' generator.
const DRAIN_SALT: u64 = 0xd7a1_4a6e_0b5e_55ed;
/// Share of (non-calm) seeds in which an operator drains agents.
const DRAIN_RATE: f64 = 0.3;

/// A timed fault (or the recovery that ends one).
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Fault {
    MasterCrash {
        down: Time,
    },
    MasterRestart,
    /// `machine`: the whole machine (executors and unsynced writes too).
    AgentCrash {
        agent: usize,
        machine: bool,
        down: Time,
    },
    AgentRestart {
        agent: usize,
    },
    /// The agent's machine loses the network to the master and the
    /// schedulers for `heal` (its executors still reach it).
    PartitionAgent {
        agent: usize,
        heal: Time,
    },
    HealAgent {
        agent: usize,
    },
    /// A scheduler loses the network to the master.
    PartitionFramework {
        fw: usize,
        heal: Time,
    },
    HealFramework {
        fw: usize,
    },
    /// Every connection of an agent resets.
    ResetAgent {
        agent: usize,
    },
    SchedCrash {
        fw: usize,
        down: Time,
    },
    SchedRestart {
        fw: usize,
    },
    /// A node's wall clock jumps.
    ClockJump {
        node: Node,
        secs: f64,
    },
    /// More tasks arrive for a framework.
    Arrive {
        fw: usize,
        n: usize,
    },
    /// A scheduler fails over into a role never used before (a framework
    /// whose role names churn: per tenant, per job, per deploy).
    Rerole {
        fw: usize,
    },
    /// The agent's executors lose their connections to it for `heal`
    /// (the agent's executor endpoint is unreachable: a stuck accept loop,
    /// a firewall change) while the agent stays up and registered; an
    /// executor with large updates keeps producing them meanwhile (a
    /// burst), so its unacknowledged backlog outgrows a frame.
    ExecOutage {
        agent: usize,
        heal: Time,
    },
    ExecHeal {
        agent: usize,
    },
    /// A forger under `principal` re-subscribes as a framework or
    /// re-registers as an agent (see `forgery.rs`).
    Forge {
        victim: Victim,
        principal: Principal,
    },
    /// An operator drains the agent (DRAIN_AGENT with `grace`), and
    /// reactivates it after `reactivate`.
    Drain {
        agent: usize,
        grace: Time,
        reactivate: Time,
    },
    Reactivate {
        agent: usize,
    },
}

/// A node, for clock jumps and partitions.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Node {
    Master,
    Agent(usize),
    Framework(usize),
}

/// What a seed chose.
#[derive(Debug, Clone)]
pub(crate) struct Plan {
    pub agents: usize,
    pub fws: usize,
    pub quiet_at: Time,
    pub end_at: Time,
    /// Per frame: the connection resets right after it.
    pub cut_rate: f64,
    /// Per frame of a type delivered at least once: it arrives twice.
    pub dup_rate: f64,
    /// Per frame: a latency spike, up to `spike_max`.
    pub spike_rate: f64,
    pub spike_max: Time,
    /// One frame type that is slow on every link.
    pub slow_type: Option<&'static str>,
    /// How long a reset takes to be noticed.
    pub reset_detect: (Time, Time),
    pub slow_disk_rate: f64,
    pub spawn_failure_rate: f64,
    pub stale_offer_rate: f64,
    /// Executors: how many go wrong.
    pub exec_fault_rate: f64,
    /// Custom executors send large updates.
    pub big_updates: bool,
    /// Share of ended tasks whose framework launches their id again.
    pub reuse_rate: f64,
    /// How long one registry write blocks the master's state task (an
    /// etcd round trip): inputs arriving meanwhile form its next batch.
    pub registry_latency: (Time, Time),
    /// A machine crash also damages an already synced page in the middle
    /// of the agent's log (a media error: bytes flipped or zeroed).
    pub media_errors: bool,
    /// The generator of the storage faults (media errors, executor
    /// outages and their bursts): apart from the main one, so a seed
    /// without them runs as it did before they existed.
    pub storage_rng: StdRng,
    pub faults: Vec<(Time, Fault)>,
}

/// Frame types a seed may make slow.
const SLOW_TYPES: &[&str] = &[
    "STATUS_UPDATE",
    "STATUS_ACK",
    "RUN_TASK",
    "ACKNOWLEDGE",
    "UPDATE",
    "OFFERS",
    "PONG",
    "PING",
    "REGISTER",
    "SUBSCRIBED",
    "EXEC_UPDATE",
    "EXEC_ACKNOWLEDGED",
];

// === impl Plan ===

impl Plan {
    pub(crate) fn generate(rng: &mut StdRng, opts: &Options) -> Plan {
        let agents = rng.random_range(1..=opts.max_agents.max(1));
        let fws = rng.random_range(1..=opts.max_frameworks.max(1));
        let quiet_at = rng.random_range(30..=opts.fault_secs.max(31)) * SEC;
        let end_at = quiet_at + opts.liveness_secs * SEC;
        let calm = rng.random_bool(0.1);
        let mut plan = Plan {
            agents,
            fws,
            quiet_at,
            end_at,
            cut_rate: if calm {
                0.0
            } else {
                pick(rng, &[0.0, 0.0005, 0.002, 0.01])
            },
            dup_rate: if calm {
                0.0
            } else {
                pick(rng, &[0.0, 0.01, 0.05, 0.2])
            },
            spike_rate: pick(rng, &[0.0, 0.01, 0.05]),
            spike_max: pick(rng, &[50 * MS, 500 * MS, 3 * SEC]),
            slow_type: if rng.random_bool(0.3) {
                Some(SLOW_TYPES[rng.random_range(0..SLOW_TYPES.len())])
            } else {
                None
            },
            reset_detect: (100_000, 20 * MS),
            slow_disk_rate: pick(rng, &[0.0, 0.3]),
            spawn_failure_rate: pick(rng, &[0.0, 0.0, 0.05]),
            stale_offer_rate: pick(rng, &[0.0, 0.02]),
            exec_fault_rate: pick(rng, &[0.0, 0.1, 0.3]),
            big_updates: rng.random_bool(opts.big_update_rate),
            reuse_rate: 0.0,
            registry_latency: (MS, 10 * MS),
            media_errors: false,
            // Seeded from the main generator's next value without taking
            // it (a clone draws it).
            storage_rng: StdRng::seed_from_u64(rng.clone().random::<u64>() ^ STORAGE_SALT),
            faults: Vec::new(),
        };
        // Workload: tasks arrive during the faulty phase.
        for f in 0..fws {
            let waves = rng.random_range(1..=4);
            for _ in 0..waves {
                let at = rng.random_range(0..quiet_at);
                let n = rng.random_range(1..=opts.max_tasks_per_wave.max(1));
                plan.faults.push((at, Fault::Arrive { fw: f, n }));
            }
        }
        if !calm {
            let n = rng.random_range(0..=opts.max_faults);
            for _ in 0..n {
                let at = rng.random_range(SEC..quiet_at);
                let fault = match rng.random_range(0..100) {
                    0..=9 => Fault::MasterCrash {
                        down: rng.random_range(0..10 * SEC),
                    },
                    10..=29 => Fault::AgentCrash {
                        agent: rng.random_range(0..agents),
                        machine: rng.random_bool(0.4),
                        down: rng.random_range(0..20 * SEC),
                    },
                    30..=44 => Fault::PartitionAgent {
                        agent: rng.random_range(0..agents),
                        heal: rng.random_range(SEC..40 * SEC),
                    },
                    45..=52 => Fault::PartitionFramework {
                        fw: rng.random_range(0..fws),
                        heal: rng.random_range(SEC..30 * SEC),
                    },
                    53..=64 => Fault::ResetAgent {
                        agent: rng.random_range(0..agents),
                    },
                    65..=79 => Fault::SchedCrash {
                        fw: rng.random_range(0..fws),
                        down: rng.random_range(0..10 * SEC),
                    },
                    _ => {
                        let node = match rng.random_range(0..3) {
                            0 => Node::Master,
                            1 => Node::Agent(rng.random_range(0..agents)),
                            _ => Node::Framework(rng.random_range(0..fws)),
                        };
                        Fault::ClockJump {
                            node,
                            secs: pick(rng, &[-3600.0, -5.0, 5.0, 3600.0, 86_400.0]),
                        }
                    }
                };
                plan.faults.push((at, fault));
            }
        }
        // Some seeds churn role names (drawn last: the rest of the
        // schedule is the same with or without).
        if !calm && rng.random_bool(0.05) {
            for f in 0..fws {
                let mut at = rng.random_range(SEC..3 * SEC);
                while at < quiet_at {
                    plan.faults.push((at, Fault::Rerole { fw: f }));
                    at += rng.random_range(SEC..3 * SEC);
                }
            }
        }
        // Storage faults and forgeries, each from a generator of its own.
        if !calm {
            plan.storage_faults(quiet_at);
            let seed = rng.clone().random::<u64>() ^ FORGERY_SALT;
            plan.forgeries(&mut StdRng::seed_from_u64(seed), quiet_at);
        }
        plan.faults.sort_by_key(|(at, _)| *at);
        // Drawn last, so the rest of the schedule stays what it was.
        if rng.random_bool(0.3) {
            // A slow etcd (disk latency, a compaction, a busy cluster).
            plan.registry_latency = (20 * MS, 500 * MS);
        }
        plan.reuse_rate = pick(rng, &[0.0, 0.1, 0.3, 0.6]);
        // Drains, from a generator of their own (the rest of the
        // schedule stays what it was).
        let seed = rng.clone().random::<u64>() ^ DRAIN_SALT;
        let mut drains = StdRng::seed_from_u64(seed);
        if !calm && drains.random_bool(DRAIN_RATE) {
            for _ in 0..drains.random_range(1..=3) {
                let at = drains.random_range(SEC..quiet_at.max(2 * SEC));
                let fault = Fault::Drain {
                    agent: drains.random_range(0..agents),
                    grace: drains.random_range(0..10 * SEC),
                    reactivate: drains.random_range(SEC..30 * SEC),
                };
                plan.faults.push((at, fault));
            }
            plan.faults.sort_by_key(|(at, _)| *at);
        }
        plan
    }

    /// Media errors in a share of seeds; executor outages in half the
    /// seeds with large updates (and a few others, whose backlogs stay
    /// small).
    fn storage_faults(&mut self, quiet_at: Time) {
        let rng = &mut self.storage_rng;
        self.media_errors = rng.random_bool(MEDIA_ERROR_RATE);
        let outage_rate = if self.big_updates { 0.5 } else { 0.05 };
        if rng.random_bool(outage_rate) {
            for _ in 0..rng.random_range(1..=2) {
                let at = rng.random_range(SEC..quiet_at);
                let fault = Fault::ExecOutage {
                    agent: rng.random_range(0..self.agents),
                    heal: rng.random_range(5 * SEC..EXEC_OUTAGE_MAX),
                };
                self.faults.push((at, fault));
            }
        }
    }

    /// Forged re-subscriptions and re-registrations in a share of the
    /// seeds: each names a framework or an agent, under a principal that
    /// is not its own (another framework's, an agent's, a stranger's or
    /// none).
    fn forgeries(&mut self, rng: &mut StdRng, quiet_at: Time) {
        if !rng.random_bool(FORGERY_RATE) {
            return;
        }
        for _ in 0..rng.random_range(1..=4) {
            let at = rng.random_range(SEC..quiet_at);
            let victim = if rng.random_bool(0.5) {
                Victim::Framework(rng.random_range(0..self.fws))
            } else {
                Victim::Agent(rng.random_range(0..self.agents))
            };
            let own = match victim {
                Victim::Framework(f) => Principal::Framework(f),
                Victim::Agent(i) => Principal::Agent(i),
            };
            let principal = loop {
                let p = match rng.random_range(0..4) {
                    0 => Principal::Framework(rng.random_range(0..self.fws)),
                    1 => Principal::Agent(rng.random_range(0..self.agents)),
                    2 => Principal::Stranger,
                    _ => Principal::Anonymous,
                };
                if p != own {
                    break p;
                }
            };
            self.faults.push((at, Fault::Forge { victim, principal }));
        }
    }

    /// What goes wrong with a new custom executor.
    pub(crate) fn exec_fault(&self, rng: &mut StdRng) -> ExecFault {
        if !rng.random_bool(self.exec_fault_rate) {
            return ExecFault::None;
        }
        match rng.random_range(0..4) {
            0 => ExecFault::Crash(rng.random_range(10 * MS..20 * SEC)),
            1 => ExecFault::Hang(rng.random_range(10 * MS..20 * SEC)),
            2 => ExecFault::ExitAfterTerminal,
            _ => ExecFault::IgnoreSigterm,
        }
    }
}

fn pick<T: Copy>(rng: &mut StdRng, choices: &[T]) -> T {
    choices[rng.random_range(0..choices.len())]
}

/// Nodes cut off from the master right now.
#[derive(Debug, Default)]
pub(crate) struct Partitions {
    pub cut: BTreeSet<Node>,
    /// Agents whose executors cannot reach them.
    pub exec_cut: BTreeSet<usize>,
}

// === impl World: faults ===

impl World {
    /// Builds the cluster and queues the plan.
    pub(crate) fn start(&mut self) {
        for i in 0..self.plan.agents {
            self.agent_add(i);
        }
        for f in 0..self.plan.fws {
            self.fw_add(f);
        }
        self.master_start();
        for i in 0..self.plan.agents {
            let d = self.between(0, 2 * SEC);
            self.after(d, Ev::Fault(Fault::AgentRestart { agent: i }));
        }
        for f in 0..self.plan.fws {
            let d = self.between(0, 3 * SEC);
            self.after(d, Ev::Fault(Fault::SchedRestart { fw: f }));
            self.after(SEC, Ev::FwWake { fw: f });
        }
        for (at, fault) in self.plan.faults.clone() {
            self.at(at, Ev::Fault(fault));
        }
        let quiet = self.plan.quiet_at;
        let end = self.plan.end_at;
        self.at(quiet, Ev::Quiet);
        self.at(end, Ev::End);
    }

    /// Whether a node is cut off from the master.
    pub(crate) fn cut_off(&self, agent: Option<usize>, fw: Option<usize>) -> bool {
        let p = &self.partitions.cut;
        p.contains(&Node::Master)
            || agent.is_some_and(|a| p.contains(&Node::Agent(a)))
            || fw.is_some_and(|f| p.contains(&Node::Framework(f)))
    }

    pub(crate) fn fault(&mut self, fault: Fault) {
        let injecting = !matches!(
            fault,
            Fault::MasterRestart
                | Fault::AgentRestart { .. }
                | Fault::HealAgent { .. }
                | Fault::HealFramework { .. }
                | Fault::SchedRestart { .. }
                | Fault::Arrive { .. }
                | Fault::ExecHeal { .. }
                | Fault::Reactivate { .. }
        );
        if injecting && !self.faulty {
            return;
        }
        match fault {
            Fault::MasterCrash { down } => {
                self.master_crash();
                self.after(down, Ev::Fault(Fault::MasterRestart));
            }
            Fault::MasterRestart => {
                if !self.master.up {
                    self.master_start();
                }
            }
            Fault::AgentCrash {
                agent,
                machine,
                down,
            } => {
                self.agent_crash(agent, machine);
                self.after(down, Ev::Fault(Fault::AgentRestart { agent }));
            }
            Fault::AgentRestart { agent } => self.agent_start(agent),
            Fault::PartitionAgent { agent, heal } => {
                self.partitions
                    .cut
                    .insert(crate::faults::Node::Agent(agent));
                self.partition_conns();
                self.after(heal, Ev::Fault(Fault::HealAgent { agent }));
            }
            Fault::HealAgent { agent } => {
                self.partitions.cut.remove(&Node::Agent(agent));
            }
            Fault::PartitionFramework { fw, heal } => {
                self.partitions.cut.insert(Node::Framework(fw));
                self.partition_conns();
                self.after(heal, Ev::Fault(Fault::HealFramework { fw }));
            }
            Fault::HealFramework { fw } => {
                self.partitions.cut.remove(&Node::Framework(fw));
            }
            Fault::ResetAgent { agent } => {
                let conns: Vec<u64> = self
                    .conns
                    .iter()
                    .filter(|(_, c)| match c.kind {
                        crate::world::ConnKind::Agent { agent: a, .. }
                        | crate::world::ConnKind::Exec { agent: a, .. } => a == agent,
                        _ => false,
                    })
                    .map(|(id, _)| *id)
                    .collect();
                for conn in conns {
                    self.break_conn(conn, (100_000, 20 * MS));
                }
            }
            Fault::ExecOutage { agent, heal } => self.exec_outage(agent, heal),
            Fault::ExecHeal { agent } => {
                self.partitions.exec_cut.remove(&agent);
                self.note(|| format!("agent {agent}: its executors can reach it again"));
            }
            Fault::SchedCrash { fw, down } => {
                self.fw_crash(fw);
                self.after(down, Ev::Fault(Fault::SchedRestart { fw }));
            }
            Fault::SchedRestart { fw } => self.fw_start(fw),
            Fault::ClockJump { node, secs } => match node {
                Node::Master => self.master.clock += secs,
                Node::Agent(a) => self.agents[a].clock += secs,
                Node::Framework(f) => self.fws[f].clock += secs,
            },
            Fault::Arrive { fw, n } => self.fw_enqueue(fw, n, false),
            Fault::Forge { victim, principal } => self.forge(victim, principal),
            Fault::Drain {
                agent,
                grace,
                reactivate,
            } => {
                if let Some(agent_id) = self.agents[agent].id.clone() {
                    self.note(|| format!("operator drains agent {agent} ({agent_id})"));
                    self.master_input(agora_master::sim::Input::OperatorAgent {
                        agent_id,
                        call: agora_master::sim::AgentCall::Drain {
                            max_grace_period: Some(std::time::Duration::from_nanos(grace)),
                            mark_gone: false,
                        },
                        operator: None,
                    });
                }
                self.after(reactivate, Ev::Fault(Fault::Reactivate { agent }));
            }
            Fault::Reactivate { agent } => {
                // As an operator would, until the master shows the agent
                // offered again (a call to a master that is down, or lost
                // with it, is made again).
                let Some(agent_id) = self.agents[agent].id.clone() else {
                    self.after(2 * SEC, Ev::Fault(Fault::Reactivate { agent }));
                    return;
                };
                // Done once the master has the agent connected and not
                // held after the faults stopped (a master still
                // recovering does not know it yet, and one that fails
                // over may not have recorded the call).
                let held = self.t < self.plan.quiet_at
                    || match self.master.core.as_ref() {
                        Some(core) if self.master.up => {
                            core.operator_holds(&agent_id)
                                || !core
                                    .agents()
                                    .iter()
                                    .any(|a| a.id == agent_id && a.connected)
                        }
                        _ => true,
                    };
                if held {
                    self.note(|| format!("operator reactivates agent {agent}"));
                    self.master_input(agora_master::sim::Input::OperatorAgent {
                        agent_id,
                        call: agora_master::sim::AgentCall::Reactivate,
                        operator: None,
                    });
                    self.after(2 * SEC, Ev::Fault(Fault::Reactivate { agent }));
                }
            }
            Fault::Rerole { fw } => {
                self.reroles += 1;
                let role = format!("role-{fw}-{}", self.reroles);
                self.fws[fw].info.roles = vec![role];
                if self.fws[fw].driver.is_some() {
                    self.fw_crash(fw);
                    let down = self.between(MS, 200 * MS);
                    self.after(down, Ev::Fault(Fault::SchedRestart { fw }));
                }
            }
        }
    }

    /// Agent `agent`'s executors lose it for `heal`: their connections
    /// reset and new ones are refused. Each executor with large updates
    /// bursts meanwhile: more than a frame of them, its task kept busy
    /// until after the outage so that the executor is there to reconnect.
    fn exec_outage(&mut self, agent: usize, heal: Time) {
        if !self.partitions.exec_cut.insert(agent) {
            return;
        }
        self.note(|| format!("agent {agent}: its executors lose it for {heal} ns"));
        let conns: Vec<u64> = self
            .conns
            .iter()
            .filter(|(_, c)| matches!(c.kind, crate::world::ConnKind::Exec { agent: a, .. } if a == agent))
            .map(|(id, _)| *id)
            .collect();
        for conn in conns {
            self.break_conn(conn, (100_000, 20 * MS));
        }
        self.after(heal, Ev::Fault(Fault::ExecHeal { agent }));
        for (proc, task, launch) in self.burst_tasks(agent) {
            let data = self
                .plans
                .get(&(task.clone(), launch))
                .map_or(0, |p| p.data)
                .max(1);
            let rng = &mut self.plan.storage_rng;
            let n = BURST_BYTES / data + rng.random_range(0..8);
            let mut times: Vec<Time> = (0..n).map(|_| rng.random_range(0..heal)).collect();
            times.sort_unstable();
            let busy_until = self.t + heal + rng.random_range(SEC..5 * SEC);
            self.exec_hold(proc, &task, busy_until);
            for at in times {
                self.after(
                    at,
                    Ev::ExecTask {
                        proc,
                        task: task.clone(),
                        launch,
                        step: crate::executor::BURST,
                    },
                );
            }
        }
    }

    /// Breaks the connections that cross a partition; each side notices
    /// late (a TCP timeout) unless its own timeouts notice first.
    fn partition_conns(&mut self) {
        let crossing: Vec<u64> = self
            .conns
            .iter()
            .filter(|(_, c)| match c.kind {
                crate::world::ConnKind::Agent { agent, .. } => self.cut_off(Some(agent), None),
                crate::world::ConnKind::Sched { fw, .. } => self.cut_off(None, Some(fw)),
                crate::world::ConnKind::Exec { .. } | crate::world::ConnKind::Forger { .. } => {
                    false
                }
            })
            .map(|(id, _)| *id)
            .collect();
        for conn in crossing {
            self.break_conn(conn, (20 * SEC, 120 * SEC));
        }
    }

    /// Faults stop: partitions heal, stopped nodes come back, and each
    /// framework gets probe tasks, which must finish.
    pub(crate) fn quiet(&mut self) {
        self.faulty = false;
        self.partitions.cut.clear();
        self.partitions.exec_cut.clear();
        self.note(|| "faults stop".into());
        // A connection broken silently (a partition) is noticed soon once
        // the network heals: the next write gets a reset.
        let silent: Vec<(u64, Side)> = self
            .conns
            .iter()
            .filter(|(_, c)| c.broken)
            .flat_map(|(id, c)| {
                [Side::Client, Side::Server]
                    .into_iter()
                    .filter(|s| !c.done[crate::world::idx(*s)])
                    .map(|s| (*id, s))
            })
            .collect();
        for (conn, side) in silent {
            let d = self.between(MS, 200 * MS);
            self.after(d, Ev::Broken { conn, side });
        }
        if !self.master.up {
            self.master_start();
        }
        for i in 0..self.agents.len() {
            if !self.agents[i].up {
                self.agent_start(i);
            }
        }
        for f in 0..self.fws.len() {
            if self.fws[f].driver.is_none() {
                self.fw_start(f);
            }
        }
        // Every agent an operator drained is reactivated (seeds without
        // drains are left as they were).
        let drains = self
            .plan
            .faults
            .iter()
            .any(|(_, f)| matches!(f, Fault::Drain { .. }));
        if drains {
            for agent in 0..self.agents.len() {
                self.after(SEC, Ev::Fault(Fault::Reactivate { agent }));
            }
        }
        // Probes go in once the cluster has settled: agents and frameworks
        // reconnected, the master's re-registration window over.
        self.after(PROBE_SETTLE, Ev::Probes);
    }

    /// The probe tasks, which must finish.
    pub(crate) fn probes(&mut self) {
        for f in 0..self.fws.len() {
            self.fw_enqueue(f, 2, true);
        }
    }

    /// The end: liveness is judged.
    pub(crate) fn end(&mut self) {
        let result = self.check.at_end(&self.fws, self.t);
        if let Err((invariant, detail)) = result {
            let summary = self.summary();
            self.violated(invariant, format!("{detail}\n{summary}"));
        }
    }
}
