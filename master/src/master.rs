//! The master's state machine, sans IO. One [`Master`] owns every
//! framework, agent, offer and task. It is fed [`Input`]s (calls from
//! connections, connection closes) and [`Master::tick`]s with the current
//! time, and answers by pushing [`Output`]s (an event for a connection, a
//! close) into its outbox, which the event loop drains and writes. It never
//! reads a clock or touches a socket, so every rule of the protocol is
//! unit-tested with injected time.
//!
//! The handlers live beside the domain they change: `frameworks.rs`
//! (subscription, teardown, failover), `agents.rs` (registration, pings,
//! removal), `offers.rs` (allocation, launch, decline, rescind) and
//! `tasks.rs` (status updates, acknowledgements, kill, reconcile).

use agora_proto::hash::{HashMap, HashSet};
use std::collections::VecDeque;
use std::hash::Hash;
use std::time::Duration;

use agora_proto::{agent, scheduler, AgentId, FrameworkId, MasterInfo, OfferId};
use agora_proto::{Reason, Source, TaskId, TaskState, TaskStatus};
use tokio::time::Instant;

use crate::agents::Agent;
use crate::allocator::Allocator;
use crate::frameworks::{CompletedFramework, Framework};
use crate::offers::OfferEntry;
use crate::registry::{RegistryOp, RegistryState};
use crate::tasks::CompletedTask;
use crate::tracked::Tracked;
use crate::Config;

/// Identifies one WebSocket connection for the lifetime of the master.
pub type ConnId = u64;

/// Something that happened on a connection.
#[derive(Debug)]
pub enum Input {
    /// A decoded call from a scheduler connection.
    Scheduler { conn: ConnId, call: scheduler::Call },
    /// A scheduler connection ended.
    SchedulerClosed { conn: ConnId },
    /// A decoded call from an agent connection.
    Agent {
        conn: ConnId,
        call: agent::Call,
        /// With a `REGISTER`: the principal the connection authenticated
        /// as (`--authenticate-agents`), none for an unauthenticated one.
        /// Read only there (the connection's first call binds it).
        principal: Option<String>,
    },
    /// An agent connection ended.
    AgentClosed { conn: ConnId },
    /// An operator tears a framework down (authorized by the HTTP side).
    OperatorTeardown {
        framework_id: FrameworkId,
        /// Who asked, for the log.
        operator: Option<String>,
    },
    /// An operator drains, deactivates, reactivates or marks gone an
    /// agent (authorized and checked by the HTTP side).
    OperatorAgent {
        agent_id: AgentId,
        call: crate::drain::AgentCall,
        /// Who asked, for the log.
        operator: Option<String>,
    },
    /// An operator sets roles' quotas (checked and authorized by the HTTP
    /// side; see [`crate::quota`]).
    OperatorQuotas {
        quotas: Vec<crate::registry::QuotaRecord>,
        operator: Option<String>,
    },
    /// An operator sets roles' weights (likewise).
    OperatorWeights {
        weights: Vec<crate::registry::WeightRecord>,
        operator: Option<String>,
    },
}

/// Something the master wants done to a connection.
// Outputs live only until the event loop drains the outbox; boxing every
// agent event would cost more than the size difference.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone, PartialEq)]
pub enum Output {
    /// Send an event to a scheduler connection.
    Scheduler {
        conn: ConnId,
        event: scheduler::Event,
    },
    /// Send an event to an agent connection.
    Agent { conn: ConnId, event: agent::Event },
    /// Close a connection (after what was queued before) with a code and reason.
    Close {
        conn: ConnId,
        code: u16,
        reason: String,
    },
}

/// WebSocket close code for a refused or removed peer (policy violation).
pub(crate) const CLOSE_POLICY: u16 = 1008;
/// WebSocket close code for a normal end.
pub(crate) const CLOSE_NORMAL: u16 = 1000;

/// Most outputs whose room the outbox keeps between batches.
const MAX_SPARE_OUTPUTS: usize = 16 * 1024;
/// Refuse/failover durations from peers are capped so `Instant`
/// arithmetic cannot overflow.
const MAX_PEER_DURATION: Duration = Duration::from_secs(10 * 365 * 24 * 3600);

/// The master's whole state. See the module documentation.
pub(crate) struct Master {
    pub(crate) config: Config,
    pub(crate) info: MasterInfo,
    pub(crate) allocator: Box<dyn Allocator>,
    pub(crate) frameworks: Tracked<FrameworkId, Framework>,
    pub(crate) removed_frameworks: BoundedSet<FrameworkId>,
    pub(crate) agents: Tracked<AgentId, Agent>,
    pub(crate) removed_agents: BoundedSet<AgentId>,
    /// Agents marked gone by an operator (a subset of `removed_agents`
    /// this master knows why of): their registration is refused.
    pub(crate) gone_agents: HashSet<AgentId>,
    /// Agents with a drain not DRAINED yet (`drain.rs`).
    pub(crate) draining: std::collections::BTreeSet<AgentId>,
    pub(crate) offers: Tracked<OfferId, OfferEntry>,
    /// Offers in creation order, for the offer timeout.
    pub(crate) offer_expiry: VecDeque<(Instant, OfferId)>,
    pub(crate) completed: VecDeque<CompletedTask>,
    /// The `last_uuid` of each task in `completed` that has one, with its
    /// framework and task id.
    pub(crate) completed_uuids: HashMap<String, (FrameworkId, TaskId)>,
    /// Tasks ever pushed to `completed`, and how many of them the last
    /// `/state` delta had seen.
    pub(crate) completed_total: u64,
    pub(crate) completed_published: u64,
    /// Removed frameworks, the last `max_completed_frameworks`; counted
    /// like `completed`.
    pub(crate) completed_frameworks: VecDeque<CompletedFramework>,
    pub(crate) completed_frameworks_total: u64,
    pub(crate) completed_frameworks_published: u64,
    pub(crate) scheduler_conns: HashMap<ConnId, FrameworkId>,
    pub(crate) agent_conns: HashMap<ConnId, AgentId>,
    pub(crate) next_allocation: Instant,
    pub(crate) next_heartbeat: Instant,
    pub(crate) next_ping: Instant,
    pub(crate) next_framework_seq: u64,
    pub(crate) next_agent_seq: u64,
    pub(crate) next_offer_seq: u64,
    /// Something changed since the last `/state` snapshot.
    pub(crate) dirty: bool,
    /// When this master started: agents of an earlier master have until
    /// the ping timeout after this to re-register (see
    /// [`Master::agents_may_reregister`]).
    pub(crate) started: Instant,
    /// Counters for `/metrics`, shared with the HTTP handlers.
    pub(crate) metrics: std::sync::Arc<crate::metrics::Metrics>,
    /// Whether changes to the registered state are recorded as
    /// [`RegistryOp`]s for a registry (set by [`Master::recover`]).
    pub(crate) persistent: bool,
    /// After [`Master::recover`]: when agents of the registry that have
    /// not re-registered yet are removed.
    pub(crate) reregister_deadline: Option<Instant>,
    outbox: Vec<Output>,
    registry_ops: Vec<RegistryOp>,
}

/// A set that forgets its oldest members beyond a capacity.
#[derive(Debug)]
pub(crate) struct BoundedSet<T> {
    order: VecDeque<T>,
    members: HashSet<T>,
    capacity: usize,
}

// === impl Master ===

impl Master {
    /// A master with no agents or frameworks; `now` starts its timers.
    pub(crate) fn new(
        config: Config,
        info: MasterInfo,
        allocator: Box<dyn Allocator>,
        now: Instant,
    ) -> Self {
        Master {
            removed_frameworks: BoundedSet::new(config.max_removed_agents),
            removed_agents: BoundedSet::new(config.max_removed_agents),
            gone_agents: HashSet::default(),
            draining: Default::default(),
            next_allocation: now + config.allocation_interval,
            next_heartbeat: now + config.heartbeat_interval,
            next_ping: now + config.agent_ping_interval,
            config,
            info,
            allocator,
            frameworks: Tracked::default(),
            agents: Tracked::default(),
            offers: Tracked::default(),
            offer_expiry: VecDeque::new(),
            completed: VecDeque::new(),
            completed_uuids: HashMap::default(),
            completed_total: 0,
            completed_published: 0,
            completed_frameworks: VecDeque::new(),
            completed_frameworks_total: 0,
            completed_frameworks_published: 0,
            scheduler_conns: HashMap::default(),
            agent_conns: HashMap::default(),
            next_framework_seq: 0,
            next_agent_seq: 0,
            next_offer_seq: 0,
            dirty: true,
            started: now,
            metrics: std::sync::Arc::new(crate::metrics::Metrics::new()),
            persistent: false,
            reregister_deadline: None,
            outbox: Vec::new(),
            registry_ops: Vec::new(),
        }
    }

    /// Loads what a registry kept and records changes for it from now
    /// on. Agents it lists wait (unconnected, offering nothing) for up to
    /// `agent_reregister_timeout` to re-register; frameworks it lists are
    /// known but disconnected: one that was connected when the previous
    /// master stopped has its failover timeout (at least the
    /// `recovered_framework_timeout`) from now to re-subscribe; one that
    /// was disconnected keeps the deadline it had, counted in wall time
    /// across the downtime, and is torn down now if that has passed.
    /// `wall_now` is Unix time in seconds.
    pub(crate) fn recover(&mut self, state: &RegistryState, now: Instant, wall_now: f64) {
        self.persistent = true;
        self.recover_quotas(state);
        for aid in &state.removed_agents {
            self.removed_agents.insert(aid.clone());
        }
        for fid in &state.removed_frameworks {
            self.removed_frameworks.insert(fid.clone());
        }
        for record in state.agents.values() {
            let mut agent = Agent::recovered(
                record.id.clone(),
                record.info.clone(),
                record.principal.clone(),
            );
            agent.deactivated = record.deactivated;
            agent.drain = record
                .drain
                .clone()
                .map(|d| crate::drain::Drain::new(now, d));
            if agent.drain.as_ref().is_some_and(|d| !d.record.drained) {
                self.draining.insert(record.id.clone());
            }
            self.agents.insert(record.id.clone(), agent);
        }
        if !state.agents.is_empty() {
            self.reregister_deadline = now.checked_add(self.config.agent_reregister_timeout);
        }
        let mut expired = Vec::new();
        for record in state.frameworks.values() {
            let fid = record.id.clone();
            let timeout = self.failover_timeout(&record.info);
            let mut fw = Framework::new(fid.clone(), record.info.clone());
            fw.recovered = true;
            fw.launch_epoch = record.launch_epoch;
            // Disconnected since then (as far as the wall clock tells),
            // or since now: the order the bound on disconnected
            // frameworks removes them in.
            let since = record
                .disconnected_at
                .and_then(|at| Duration::try_from_secs_f64(wall_now - at).ok())
                .and_then(|down| now.checked_sub(down))
                .unwrap_or(now);
            fw.mark_disconnected(since);
            fw.failover_deadline = match record.disconnected_at {
                None => now.checked_add(
                    timeout
                        .unwrap_or(Duration::ZERO)
                        .max(self.config.recovered_framework_timeout),
                ),
                Some(at) => {
                    let down = Duration::try_from_secs_f64(wall_now - at).unwrap_or(Duration::ZERO);
                    match timeout.and_then(|t| t.checked_sub(down)) {
                        Some(left) if !left.is_zero() => now.checked_add(left),
                        _ => {
                            expired.push(fid.clone());
                            Some(now)
                        }
                    }
                }
            };
            self.allocator.add_framework(&fid, &fw.roles(), false);
            self.frameworks.insert(fid, fw);
        }
        tracing::info!(
            agents = state.agents.len(),
            frameworks = state.frameworks.len(),
            removed_agents = state.removed_agents.len(),
            "registry recovered"
        );
        for fid in expired {
            tracing::info!(framework_id = %fid, "failover timeout passed while the master was down; tearing down");
            self.teardown(now, &fid, "framework removed: failover timeout expired");
        }
        self.bound_disconnected_frameworks(now);
    }

    /// Records a change for the registry (when there is one). The state
    /// task makes it durable before it delivers the outputs pushed with it.
    pub(crate) fn persist(&mut self, op: RegistryOp) {
        if self.persistent {
            self.registry_ops.push(op);
        }
    }

    /// Registry changes recorded since the last call, in order.
    pub(crate) fn take_registry_ops(&mut self) -> Vec<RegistryOp> {
        std::mem::take(&mut self.registry_ops)
    }

    /// Handles one input at time `now`.
    pub(crate) fn handle(&mut self, now: Instant, input: Input) {
        self.dirty = true;
        match input {
            Input::Scheduler { conn, call } => self.scheduler_call(now, conn, call),
            Input::SchedulerClosed { conn } => self.scheduler_closed(now, conn),
            Input::Agent {
                conn,
                call,
                principal,
            } => self.agent_call(now, conn, call, principal),
            Input::AgentClosed { conn } => self.agent_closed(now, conn),
            Input::OperatorTeardown {
                framework_id,
                operator,
            } => {
                tracing::info!(%framework_id, ?operator, "framework torn down by an operator");
                self.teardown(
                    now,
                    &framework_id,
                    "framework removed: torn down by an operator",
                )
            }
            Input::OperatorAgent {
                agent_id,
                call,
                operator,
            } => self.operator_agent_call(now, &agent_id, call, operator),
            Input::OperatorQuotas { quotas, operator } => self.operator_quotas(quotas, operator),
            Input::OperatorWeights { weights, operator } => {
                self.operator_weights(weights, operator)
            }
        }
    }

    /// Runs every timer that is due at `now`: heartbeats, agent pings,
    /// failover timeouts, offer timeouts and allocation.
    pub(crate) fn tick(&mut self, now: Instant) {
        self.dirty = true;
        if now >= self.next_heartbeat {
            self.send_heartbeats();
            self.next_heartbeat = now + self.config.heartbeat_interval;
        }
        if now >= self.next_ping {
            self.ping_agents(now);
            self.next_ping = now + self.config.agent_ping_interval;
        }
        if self.reregister_deadline.is_some_and(|d| now >= d) {
            self.reregister_deadline = None;
            self.remove_unreturned_agents(now);
        }
        self.expire_frameworks(now);
        self.expire_offers(now);
        self.drain_agents(now);
        if now >= self.next_allocation {
            self.allocate(now);
            self.next_allocation = now + self.config.allocation_interval;
        }
    }

    /// When [`Master::tick`] next has something to do.
    pub(crate) fn next_deadline(&self) -> Instant {
        let mut next = self
            .next_allocation
            .min(self.next_heartbeat)
            .min(self.next_ping);
        if let Some(d) = self.reregister_deadline {
            next = next.min(d);
        }
        if let Some(d) = self.next_drain_deadline() {
            next = next.min(d);
        }
        for fw in self.frameworks.values() {
            if let Some(d) = fw.failover_deadline {
                next = next.min(d);
            }
        }
        if let (Some(timeout), Some((created, _))) =
            (self.config.offer_timeout, self.offer_expiry.front())
        {
            next = next.min(*created + timeout);
        }
        next
    }

    /// Whether agents that registered with an earlier master (before a
    /// restart) may still be on their way back. With a registry: while
    /// one it lists has not re-registered and the
    /// `agent_reregister_timeout` runs. Without one: the master's first
    /// ping timeout (`agent_ping_interval × max_missed_pings`). Until then
    /// the master cannot tell a task it does not know from one on an
    /// agent that has not re-registered yet.
    pub(crate) fn agents_may_reregister(&self, now: Instant) -> bool {
        if self.persistent {
            return self.reregister_deadline.is_some_and(|d| now < d)
                && self.agents.values().any(|a| a.recovering);
        }
        let window = self
            .config
            .agent_ping_interval
            .saturating_mul(self.config.max_missed_pings.max(1));
        now.saturating_duration_since(self.started) < window
    }

    /// Everything pushed since the last call, in order.
    pub(crate) fn take_outputs(&mut self) -> Vec<Output> {
        std::mem::take(&mut self.outbox)
    }

    /// Everything pushed since the last take, left in place.
    #[cfg(feature = "sim")]
    pub(crate) fn peek_outputs(&self) -> &[Output] {
        &self.outbox
    }

    /// Swaps the outputs so far with `spare` (empty, delivered): the
    /// outbox keeps a capacity from batch to batch (up to a bound).
    pub(crate) fn swap_outputs(&mut self, spare: &mut Vec<Output>) {
        debug_assert!(spare.is_empty());
        spare.shrink_to(MAX_SPARE_OUTPUTS);
        std::mem::swap(&mut self.outbox, spare);
    }

    /// Asks for an allocation cycle soon: within the batch window, so a
    /// burst of events costs one cycle.
    pub(crate) fn schedule_allocation(&mut self, now: Instant) {
        let soon = now + self.config.allocation_batch_window;
        if soon < self.next_allocation {
            self.next_allocation = soon;
        }
    }

    fn scheduler_call(&mut self, now: Instant, conn: ConnId, call: scheduler::Call) {
        use scheduler::Call;
        if let Call::Subscribe {
            protocol,
            framework_info,
            force,
        } = call
        {
            return self.subscribe(now, conn, protocol, framework_info, force);
        }
        let Some(fid) = self.scheduler_conns.get(&conn).cloned() else {
            return self
                .scheduler_error(conn, "subscribe first: send SUBSCRIBE before other calls");
        };
        match call {
            Call::Subscribe { .. } | Call::Unknown => {}
            Call::Teardown => self.teardown(now, &fid, "framework removed: teardown requested"),
            Call::Launch {
                offer_ids,
                tasks,
                filters,
            } => self.launch(now, &fid, offer_ids, tasks, filters),
            Call::Decline { offer_ids, filters } => self.decline(now, &fid, &offer_ids, filters),
            Call::Revive { roles } => self.revive(now, &fid, &roles),
            Call::Suppress { roles } => self.suppress(&fid, &roles),
            Call::Kill { task_id, agent_id } => self.kill(now, &fid, task_id, agent_id),
            Call::Acknowledge {
                agent_id,
                task_id,
                uuid,
            } => self.acknowledge(&fid, agent_id, task_id, uuid),
            Call::Reconcile { tasks } => self.reconcile(now, &fid, tasks),
            Call::Message {
                agent_id,
                executor_id,
                data,
            } => self.message_to_executor(conn, &fid, agent_id, executor_id, data),
            Call::Request { requests } => self.request_resources(now, &fid, &requests),
        }
    }

    fn agent_call(
        &mut self,
        now: Instant,
        conn: ConnId,
        call: agent::Call,
        principal: Option<String>,
    ) {
        use agent::Call;
        if let Call::Register {
            protocol,
            agent_info,
            tasks,
            executors,
            frameworks,
        } = call
        {
            return self.register_agent(
                now, conn, protocol, agent_info, tasks, executors, frameworks, principal,
            );
        }
        let Some(aid) = self.agent_conns.get(&conn).cloned() else {
            return self.agent_error(conn, "register first: send REGISTER before other calls");
        };
        match call {
            Call::Register { .. } | Call::Unknown => {}
            Call::StatusUpdate {
                framework_id,
                status,
            } => self.status_update(now, conn, &aid, framework_id, status),
            Call::ExecutorExited {
                framework_id,
                executor_id,
                status,
                message,
            } => self.executor_exited(now, &aid, framework_id, executor_id, status, &message),
            Call::Message {
                framework_id,
                executor_id,
                data,
            } => self.message_to_scheduler(&aid, framework_id, executor_id, data),
            Call::Pong => self.pong(&aid),
            Call::Usage { containers } => self.container_usage(&aid, containers),
            Call::Availability { unavailable } => self.agent_availability(now, &aid, unavailable),
        }
    }

    // --- output helpers ---

    pub(crate) fn push(&mut self, output: Output) {
        self.outbox.push(output);
    }

    pub(crate) fn send_scheduler(&mut self, conn: ConnId, event: scheduler::Event) {
        self.outbox.push(Output::Scheduler { conn, event });
    }

    /// Sends to the framework's scheduler if it is connected; returns whether it was.
    pub(crate) fn send_framework(&mut self, fid: &FrameworkId, event: scheduler::Event) -> bool {
        match self.frameworks.get(fid).and_then(|f| f.conn) {
            Some(conn) => {
                self.send_scheduler(conn, event);
                true
            }
            None => false,
        }
    }

    pub(crate) fn send_agent_conn(&mut self, conn: ConnId, event: agent::Event) {
        self.outbox.push(Output::Agent { conn, event });
    }

    /// Sends to the agent if it is connected; returns whether it was.
    pub(crate) fn send_agent(&mut self, aid: &AgentId, event: agent::Event) -> bool {
        match self.agents.get(aid).and_then(|a| a.conn) {
            Some(conn) => {
                self.send_agent_conn(conn, event);
                true
            }
            None => false,
        }
    }

    pub(crate) fn scheduler_error(&mut self, conn: ConnId, message: impl Into<String>) {
        self.metrics.errors_scheduler.inc();
        self.send_scheduler(
            conn,
            scheduler::Event::Error {
                message: message.into(),
                fatal: false,
            },
        );
    }

    /// A fatal error, then the connection is closed.
    pub(crate) fn scheduler_fatal(&mut self, conn: ConnId, message: impl Into<String>, code: u16) {
        self.metrics.errors_scheduler_fatal.inc();
        let message = message.into();
        self.send_scheduler(
            conn,
            scheduler::Event::Error {
                message: message.clone(),
                fatal: true,
            },
        );
        self.push(Output::Close {
            conn,
            code,
            reason: truncate_reason(&message),
        });
    }

    pub(crate) fn agent_error(&mut self, conn: ConnId, message: impl Into<String>) {
        self.metrics.errors_agent.inc();
        self.send_agent_conn(
            conn,
            agent::Event::Error {
                message: message.into(),
                fatal: false,
            },
        );
    }

    pub(crate) fn agent_fatal(&mut self, conn: ConnId, message: impl Into<String>) {
        self.metrics.errors_agent_fatal.inc();
        let message = message.into();
        self.send_agent_conn(
            conn,
            agent::Event::Error {
                message: message.clone(),
                fatal: true,
            },
        );
        self.push(Output::Close {
            conn,
            code: CLOSE_POLICY,
            reason: truncate_reason(&message),
        });
    }

    pub(crate) fn new_id(&mut self, kind: &str) -> String {
        let seq = match kind {
            "F" => &mut self.next_framework_seq,
            "S" => &mut self.next_agent_seq,
            _ => &mut self.next_offer_seq,
        };
        let id = format!("{}-{kind}{}", self.info.id, *seq);
        *seq += 1;
        id
    }
}

/// A status the master generates: no uuid, needs no acknowledgement.
pub(crate) fn master_status(
    task_id: TaskId,
    state: TaskState,
    reason: Reason,
    message: impl Into<String>,
    agent_id: Option<AgentId>,
) -> TaskStatus {
    let mut status = TaskStatus::new(task_id, state, Source::SourceMaster)
        .with_reason(reason)
        .with_message(message);
    status.agent_id = agent_id;
    status
}

/// Seconds from a peer as a duration: `None` for zero, negative or not a number;
/// capped at ten years.
pub(crate) fn peer_seconds(secs: f64) -> Option<Duration> {
    if !secs.is_finite() || secs <= 0.0 {
        return None;
    }
    Some(Duration::try_from_secs_f64(secs).map_or(MAX_PEER_DURATION, |d| d.min(MAX_PEER_DURATION)))
}

/// WebSocket close reasons are limited to 123 bytes.
pub(crate) fn truncate_reason(message: &str) -> String {
    let mut end = message.len().min(120);
    while !message.is_char_boundary(end) {
        end -= 1;
    }
    message[..end].to_string()
}

// === impl BoundedSet ===

impl<T: Eq + Hash + Clone> BoundedSet<T> {
    pub(crate) fn new(capacity: usize) -> Self {
        BoundedSet {
            order: VecDeque::new(),
            members: HashSet::default(),
            capacity: capacity.max(1),
        }
    }

    pub(crate) fn insert(&mut self, value: T) {
        if self.members.insert(value.clone()) {
            self.order.push_back(value);
            while self.order.len() > self.capacity {
                if let Some(old) = self.order.pop_front() {
                    self.members.remove(&old);
                }
            }
        }
    }

    pub(crate) fn contains(&self, value: &T) -> bool {
        self.members.contains(value)
    }

    pub(crate) fn len(&self) -> usize {
        self.members.len()
    }
}

#[cfg(test)]
mod tests;
