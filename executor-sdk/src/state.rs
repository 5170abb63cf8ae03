//! The executor driver's sans-IO core.
//!
//! [`DriverCore`] decides everything about the executor's side of the
//! channel: the subscription, the ordered list of updates not yet
//! acknowledged (re-sent after every reconnect), the tasks with no
//! acknowledged update, recovery after a lost agent, and the flush on stop.
//!
//! **A stop delivers what is pending.** `Stop` ends the driver once every
//! update is acknowledged, waiting at most the shutdown grace period for
//! a subscribed agent to acknowledge them. A stop made while the agent is
//! gone (restarting, or the connection cut), or a connection lost during
//! the flush, does not end the driver with updates undelivered: it goes
//! on reconnecting as a running driver does, bounded by the recovery
//! timeout, re-subscribes with the updates, and the grace period starts
//! again at `SUBSCRIBED`. Otherwise a command executor that stops once
//! idle would exit with its last task's `TASK_FINISHED` unsent, and the
//! agent would report the task `TASK_FAILED`. Only a driver that gives up
//! on the agent anyway (recovery timeout over; a framework that does not
//! checkpoint) or whose grace period ran out while subscribed ends with
//! updates unacknowledged, and it logs each one it leaves behind.
//! The network loop in [`crate::driver`] feeds it connection events,
//! frames, user commands and clock ticks and carries out the [`Action`]s it
//! returns.
//!
//! **Every frame fits.** However much is unacknowledged after a long agent
//! outage, the `SUBSCRIBE` lists only the oldest updates that fit in
//! [`SUBSCRIBE_BUDGET`] bytes; the others follow it as `UPDATE` calls, in
//! order, as acknowledgements make room in the window of updates in flight
//! ([`MAX_IN_FLIGHT`] updates, [`MAX_IN_FLIGHT_BYTES`] bytes). The agent
//! handles the updates a `SUBSCRIBE` lists before the calls after it, so the
//! order per task holds. An update too large to ever fit in a frame
//! ([`MAX_STATUS_UPDATE_BYTES`]) is refused when it is sent, never queued.

use std::collections::VecDeque;
use std::time::Duration;

use agora_discovery::{Backoff, DEFAULT_JITTER};
use agora_proto::executor::{Call, Event};
use agora_proto::{
    AgentId, ExecutorInfo, FrameworkInfo, Source, TaskId, TaskInfo, TaskStatus, MAX_FRAME_BYTES,
    PROTOCOL_VERSION,
};
use tokio::time::Instant;

use crate::ExecutorConfig;

/// First reconnect delay after a lost agent (before jitter).
pub(crate) const BACKOFF_MIN: Duration = Duration::from_millis(100);
/// Cap of the doubling reconnect delay.
pub(crate) const BACKOFF_MAX: Duration = Duration::from_secs(2);

/// The reconnect backoff: [`BACKOFF_MIN`] doubling to [`BACKOFF_MAX`],
/// with jitter, so the executors of an agent that restarted do not all
/// reconnect at the same instants.
fn backoff() -> Backoff {
    Backoff::new(BACKOFF_MIN, BACKOFF_MAX, DEFAULT_JITTER)
}
/// How long a connected agent may take to answer `SUBSCRIBE`.
pub(crate) const SUBSCRIBE_TIMEOUT: Duration = Duration::from_secs(30);

/// The largest status update the driver accepts, in bytes of its JSON
/// encoding as the executor gives it: the frame cap
/// ([`agora_proto::MAX_FRAME_BYTES`]) less 64 KiB, which leaves room for
/// what the driver fills in (uuid, ids, timestamp) and for the envelopes
/// of the frames that carry the update on to the master and the
/// scheduler. Nearly all of it is `data`, which travels in base64 (4 bytes
/// for every 3). A larger update could never be delivered, so
/// [`crate::ExecutorDriver::send_status_update`] refuses it.
pub const MAX_STATUS_UPDATE_BYTES: usize = MAX_FRAME_BYTES - 64 * 1024;
/// Most bytes of a `SUBSCRIBE` frame (half the frame cap): the tasks and
/// updates it lists are cut there, oldest first.
pub(crate) const SUBSCRIBE_BUDGET: usize = MAX_FRAME_BYTES / 2;
/// Most updates in flight on a connection: listed in its `SUBSCRIBE` or
/// sent on it, and not acknowledged yet. Later ones wait for
/// acknowledgements, so the driver never writes much more than the agent
/// has read (the agent stops reading from an executor that leaves its
/// answers unread, and the driver reads none while it writes).
pub(crate) const MAX_IN_FLIGHT: usize = 1024;
/// Most bytes of updates in flight (measured by [`update_weight`]); one
/// update is always let through, however large.
pub(crate) const MAX_IN_FLIGHT_BYTES: usize = SUBSCRIBE_BUDGET;

/// What the user (or the driver itself) asked for.
#[derive(Debug, Clone, PartialEq)]
pub enum Command {
    /// A status update to send reliably.
    Update(TaskStatus),
    /// Bytes for the scheduler (best effort).
    Message(Vec<u8>),
    /// Flush unacknowledged updates, then end: bounded by the grace
    /// period while subscribed and, while the agent is gone, by the
    /// recovery timeout (the driver reconnects and re-subscribes first).
    Stop,
    /// End now.
    Abort,
}

/// An executor callback to run on the callback thread.
// One callback is in flight at a time (handed over, then run): the size
// of its largest variant, a task, costs nothing worth a box.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone, PartialEq)]
pub enum Callback {
    Registered {
        executor: ExecutorInfo,
        framework: FrameworkInfo,
        agent_id: AgentId,
    },
    Reregistered(AgentId),
    Disconnected,
    LaunchTask {
        task: TaskInfo,
        placement: crate::Placement,
    },
    KillTask(TaskId),
    FrameworkMessage(Vec<u8>),
    /// The agent acknowledged (checkpointed) an update.
    Acknowledged {
        task_id: TaskId,
        uuid: String,
    },
    /// Run `shutdown`, then stop the driver.
    Shutdown,
    /// The final callback after an abort the driver decided on.
    Error(String),
}

/// How the driver ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    Stopped,
    Aborted,
}

/// What the network loop must do, in order.
// Actions live for one trip through the loop; boxing would only add
// allocations.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone, PartialEq)]
pub enum Action {
    Send(Call),
    Callback(Callback),
    /// Drop the connection and reconnect after a backoff.
    Reconnect(String),
    /// Close the connection (after writing what came before) and end.
    Finish(Outcome),
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Conn {
    Disconnected,
    Subscribing { since: Instant },
    Subscribed,
}

/// Where a stop is in flushing the unacknowledged updates.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Flush {
    /// Subscribed: end once everything is acknowledged, or at this time
    /// (the grace period after the stop or the latest `SUBSCRIBED`).
    Until(Instant),
    /// Not subscribed: reconnecting as usual (bounded by the recovery
    /// timeout) to re-subscribe with the updates; `SUBSCRIBED` starts the
    /// grace period.
    AwaitingAgent,
}

#[derive(Debug, Clone, PartialEq)]
struct Pending {
    status: TaskStatus,
    /// Written on the current connection (or listed in its `SUBSCRIBE`).
    /// The updates sent are always the oldest ones: a prefix of
    /// [`DriverCore::unacknowledged`].
    sent: bool,
    /// What it counts for in [`DriverCore::in_flight_bytes`] while sent.
    weight: usize,
}

/// The executor driver's state machine.
#[derive(Debug)]
pub(crate) struct DriverCore {
    config: ExecutorConfig,
    agent_id: Option<AgentId>,
    conn: Conn,
    subscribed_before: bool,
    /// Oldest first.
    unacknowledged: VecDeque<Pending>,
    /// How many of `unacknowledged` are sent (its first ones).
    in_flight: usize,
    /// Their weight.
    in_flight_bytes: usize,
    /// In launch order.
    unacknowledged_tasks: Vec<TaskInfo>,
    /// When the agent was lost (or, before the first subscription, when
    /// the driver started).
    lost_since: Option<Instant>,
    /// Set by `Stop`.
    flush: Option<Flush>,
    grace: Duration,
    finished: bool,
    backoff: Backoff,
}

// === impl DriverCore ===

impl DriverCore {
    pub(crate) fn new(config: ExecutorConfig, now: Instant) -> Self {
        DriverCore {
            agent_id: config.agent_id.clone(),
            grace: config.shutdown_grace_period,
            config,
            conn: Conn::Disconnected,
            subscribed_before: false,
            unacknowledged: VecDeque::new(),
            in_flight: 0,
            in_flight_bytes: 0,
            unacknowledged_tasks: Vec::new(),
            lost_since: Some(now),
            flush: None,
            finished: false,
            backoff: backoff(),
        }
    }

    #[cfg(test)]
    pub(crate) fn unacknowledged(&self) -> Vec<String> {
        self.unacknowledged
            .iter()
            .filter_map(|p| p.status.uuid.clone())
            .collect()
    }

    #[cfg(test)]
    pub(crate) fn is_finished(&self) -> bool {
        self.finished
    }

    /// The tasks of the terminal updates not acknowledged yet.
    #[cfg(feature = "sim")]
    pub(crate) fn unacknowledged_terminal(&self) -> Vec<TaskId> {
        self.unacknowledged
            .iter()
            .filter(|p| p.status.state.is_terminal())
            .map(|p| p.status.task_id.clone())
            .collect()
    }

    /// Whether the framework checkpoints: a lost agent is waited for.
    #[cfg(feature = "sim")]
    pub(crate) fn checkpoint(&self) -> bool {
        self.config.checkpoint
    }

    fn is_subscribed(&self) -> bool {
        self.conn == Conn::Subscribed
    }

    fn is_stopping(&self) -> bool {
        self.flush.is_some()
    }

    /// Called before each connection attempt: gives up once the agent has
    /// been gone for longer than the recovery timeout.
    pub(crate) fn before_connect(&mut self, now: Instant) -> Vec<Action> {
        match self.lost_since {
            Some(since)
                if !self.finished
                    && now.saturating_duration_since(since) >= self.config.recovery_timeout =>
            {
                let reason = format!(
                    "the agent did not come back within the recovery timeout ({:?})",
                    self.config.recovery_timeout
                );
                self.log_undelivered(&reason);
                self.abort(reason)
            }
            _ => Vec::new(),
        }
    }

    /// The WebSocket is open: subscribe, listing the tasks and the oldest
    /// updates that are unacknowledged, as many as fit in
    /// [`SUBSCRIBE_BUDGET`] (the other updates follow `SUBSCRIBED`).
    pub(crate) fn on_connected(&mut self, now: Instant) -> Vec<Action> {
        if self.finished {
            return Vec::new();
        }
        self.conn = Conn::Subscribing { since: now };
        let subscribe = |updates, tasks| Call::Subscribe {
            protocol: PROTOCOL_VERSION,
            framework_id: self.config.framework_id.clone(),
            executor_id: self.config.executor_id.clone(),
            token: self.config.token.clone(),
            unacknowledged_updates: updates,
            unacknowledged_tasks: tasks,
        };
        // The frame's exact size: the call with empty lists, plus each
        // element's encoding and a comma after the first.
        let mut size = agora_proto::encode(&subscribe(Vec::new(), Vec::new())).len();
        // Tasks first: without its task, an agent that lost track of it
        // would drop the task's updates.
        let mut tasks = Vec::new();
        for task in &self.unacknowledged_tasks {
            let more = agora_proto::encode(task).len() + usize::from(!tasks.is_empty());
            if size + more > SUBSCRIBE_BUDGET {
                tracing::warn!(
                    listed = tasks.len(),
                    unacknowledged = self.unacknowledged_tasks.len(),
                    "too many unacknowledged tasks for one SUBSCRIBE; listing the first"
                );
                break;
            }
            size += more;
            tasks.push(task.clone());
        }
        debug_assert_eq!(self.in_flight, 0, "nothing is in flight before SUBSCRIBE");
        let mut updates = Vec::new();
        for pending in &mut self.unacknowledged {
            if updates.len() >= MAX_IN_FLIGHT {
                break;
            }
            let len = agora_proto::encode(&pending.status).len();
            let more = len + usize::from(!updates.is_empty());
            // Oldest first, and none after one that does not fit: those
            // go as UPDATE calls, which the agent handles after this.
            if size + more > SUBSCRIBE_BUDGET {
                break;
            }
            size += more;
            pending.sent = true;
            pending.weight = len;
            self.in_flight += 1;
            self.in_flight_bytes += len;
            updates.push(pending.status.clone());
        }
        if updates.len() < self.unacknowledged.len() {
            tracing::info!(
                listed = updates.len(),
                unacknowledged = self.unacknowledged.len(),
                "the SUBSCRIBE lists the oldest unacknowledged updates; the rest follow it"
            );
        }
        vec![Action::Send(subscribe(updates, tasks))]
    }

    /// The connection dropped (or an attempt failed).
    pub(crate) fn on_disconnected(&mut self, now: Instant) -> Vec<Action> {
        if self.finished {
            return Vec::new();
        }
        let was_subscribed = self.is_subscribed();
        self.conn = Conn::Disconnected;
        for pending in &mut self.unacknowledged {
            pending.sent = false;
        }
        self.in_flight = 0;
        self.in_flight_bytes = 0;
        self.lost_since.get_or_insert(now);
        let mut actions = Vec::new();
        if was_subscribed {
            actions.push(Action::Callback(Callback::Disconnected));
        }
        // Without checkpointing, a restarted agent would not take the
        // executor back.
        let gives_up = self.subscribed_before && !self.config.checkpoint;
        if self.is_stopping() && !gives_up {
            // The agent may be restarting: reconnect and deliver the
            // updates, as a running driver would.
            if self.flush != Some(Flush::AwaitingAgent) {
                tracing::info!(
                    unacknowledged = self.unacknowledged.len(),
                    recovery_timeout = ?self.config.recovery_timeout,
                    "connection lost while stopping; reconnecting to deliver the unacknowledged updates"
                );
            }
            self.flush = Some(Flush::AwaitingAgent);
        } else if self.is_stopping() {
            self.log_undelivered(
                "lost the connection to the agent while stopping and the framework does not checkpoint",
            );
            self.finished = true;
            actions.push(Action::Finish(Outcome::Stopped));
        } else if gives_up {
            actions.extend(self.abort(
                "lost the connection to the agent and the framework does not checkpoint".into(),
            ));
        }
        actions
    }

    /// Delay before the next connection attempt (doubling, reset by a
    /// subscription); `sample` (uniform in `[0, 1)`) chooses the jitter.
    pub(crate) fn next_backoff(&mut self, sample: f64) -> Duration {
        self.backoff.next_delay(sample)
    }

    /// One text frame from the agent.
    pub(crate) fn on_frame(&mut self, text: &str, now: Instant) -> Vec<Action> {
        match agora_proto::decode::<Event>(text) {
            Ok(event) => self.on_event(event, now),
            Err(error) => {
                tracing::warn!(%error, "ignoring undecodable frame from the agent");
                Vec::new()
            }
        }
    }

    /// One decoded event from the agent.
    pub(crate) fn on_event(&mut self, event: Event, now: Instant) -> Vec<Action> {
        if self.finished {
            return Vec::new();
        }
        match event {
            Event::Subscribed {
                executor_info,
                framework_info,
                agent_id,
                hostname: _,
            } => self.on_subscribed(executor_info, framework_info, agent_id, now),
            Event::Error { message, fatal } => {
                if fatal {
                    self.abort(message)
                } else {
                    tracing::warn!(%message, "the agent reported an error");
                    Vec::new()
                }
            }
            Event::Acknowledged { task_id, uuid } => self.on_acknowledged(task_id, uuid, now),
            _ if !self.is_subscribed() => {
                tracing::debug!("ignoring an event received before SUBSCRIBED");
                Vec::new()
            }
            _ if self.is_stopping() => {
                tracing::debug!("ignoring an event received while stopping");
                Vec::new()
            }
            Event::Launch {
                task,
                sandbox,
                cgroups,
                container,
            } => {
                if !self
                    .unacknowledged_tasks
                    .iter()
                    .any(|t| t.task_id == task.task_id)
                {
                    self.unacknowledged_tasks.push(task.clone());
                }
                let placement = crate::Placement {
                    sandbox: sandbox.map(std::path::PathBuf::from),
                    cgroups: cgroups.into_iter().map(std::path::PathBuf::from).collect(),
                    container,
                };
                vec![Action::Callback(Callback::LaunchTask { task, placement })]
            }
            // Agents send Agora executors a group's tasks one LAUNCH
            // each; a LAUNCH_GROUP would be taken so too.
            Event::LaunchGroup { tasks } => tasks
                .into_iter()
                .flat_map(|task| {
                    self.on_event(
                        Event::Launch {
                            task,
                            sandbox: None,
                            cgroups: Vec::new(),
                            container: None,
                        },
                        now,
                    )
                })
                .collect(),
            Event::Kill { task_id, .. } => vec![Action::Callback(Callback::KillTask(task_id))],
            Event::Message { data } => vec![Action::Callback(Callback::FrameworkMessage(data.0))],
            Event::Shutdown {
                grace_period_seconds,
            } => {
                if grace_period_seconds.is_finite() && grace_period_seconds > 0.0 {
                    self.grace = Duration::from_secs_f64(grace_period_seconds.min(86_400.0));
                }
                vec![Action::Callback(Callback::Shutdown)]
            }
            Event::Unknown => Vec::new(),
        }
    }

    fn on_subscribed(
        &mut self,
        executor: ExecutorInfo,
        framework: FrameworkInfo,
        agent_id: AgentId,
        now: Instant,
    ) -> Vec<Action> {
        if !matches!(self.conn, Conn::Subscribing { .. }) {
            tracing::debug!("ignoring a repeated SUBSCRIBED");
            return Vec::new();
        }
        self.conn = Conn::Subscribed;
        self.lost_since = None;
        self.backoff.reset();
        self.agent_id = Some(agent_id.clone());
        let mut actions = Vec::new();
        if self.flush == Some(Flush::AwaitingAgent) {
            // A connected agent gets the whole grace period to
            // acknowledge what the SUBSCRIBE and the calls after it carry.
            tracing::info!(
                unacknowledged = self.unacknowledged.len(),
                grace = ?self.grace,
                "re-subscribed while stopping; waiting for the acknowledgements"
            );
            self.flush = Some(Flush::Until(now + self.grace));
        }
        if !self.is_stopping() {
            actions.push(Action::Callback(if self.subscribed_before {
                Callback::Reregistered(agent_id.clone())
            } else {
                Callback::Registered {
                    executor,
                    framework,
                    agent_id: agent_id.clone(),
                }
            }));
        }
        self.subscribed_before = true;
        // Updates the SUBSCRIBE did not list (no room, or made while it
        // was in flight).
        self.send_unsent(&mut actions);
        actions
    }

    /// Sends the oldest updates not sent on this connection, in order,
    /// while the window of updates in flight has room.
    fn send_unsent(&mut self, actions: &mut Vec<Action>) {
        if !self.is_subscribed() {
            return;
        }
        while let Some(pending) = self.unacknowledged.get_mut(self.in_flight) {
            debug_assert!(!pending.sent, "the updates sent are the oldest");
            let weight = update_weight(&pending.status);
            if self.in_flight > 0
                && (self.in_flight >= MAX_IN_FLIGHT
                    || self.in_flight_bytes + weight > MAX_IN_FLIGHT_BYTES)
            {
                break;
            }
            if let Some(agent_id) = &self.agent_id {
                pending
                    .status
                    .agent_id
                    .get_or_insert_with(|| agent_id.clone());
            }
            pending.sent = true;
            pending.weight = weight;
            self.in_flight += 1;
            self.in_flight_bytes += weight;
            actions.push(Action::Send(Call::Update {
                status: pending.status.clone(),
            }));
        }
    }

    fn on_acknowledged(&mut self, task_id: TaskId, uuid: String, now: Instant) -> Vec<Action> {
        // Acknowledgements come roughly in sending order: search from the
        // oldest.
        let found = self
            .unacknowledged
            .iter()
            .position(|p| p.status.uuid.as_deref() == Some(uuid.as_str()));
        if !self.unacknowledged_tasks.is_empty() {
            self.unacknowledged_tasks.retain(|t| t.task_id != task_id);
        }
        let Some(i) = found else {
            tracing::debug!(%task_id, %uuid, "acknowledgement for an unknown update");
            return self.finish_flush_if_done(now);
        };
        // It may not be in flight: an update the agent received on an
        // earlier connection can be acknowledged on this one.
        if let Some(pending) = self.unacknowledged.remove(i).filter(|p| p.sent) {
            self.in_flight -= 1;
            self.in_flight_bytes -= pending.weight;
        }
        let mut actions = Vec::new();
        if !self.is_stopping() {
            actions.push(Action::Callback(Callback::Acknowledged { task_id, uuid }));
        }
        self.send_unsent(&mut actions);
        actions.extend(self.finish_flush_if_done(now));
        actions
    }

    /// A user command.
    pub(crate) fn on_command(&mut self, command: Command, now: Instant) -> Vec<Action> {
        if self.finished {
            return Vec::new();
        }
        match command {
            Command::Update(status) => {
                if let Err(size) = check_update_size(&status) {
                    // `send_status_update` refuses it before it gets here.
                    tracing::warn!(
                        task_id = %status.task_id,
                        size,
                        max = MAX_STATUS_UPDATE_BYTES,
                        "refusing a status update too large to ever be delivered"
                    );
                    return Vec::new();
                }
                let status = self.complete(status);
                self.unacknowledged.push_back(Pending {
                    status,
                    sent: false,
                    weight: 0,
                });
                let mut actions = Vec::new();
                self.send_unsent(&mut actions);
                actions
            }
            Command::Message(data) => {
                if self.is_subscribed() {
                    vec![Action::Send(Call::Message { data: data.into() })]
                } else {
                    tracing::info!("dropping a framework message: not connected to the agent");
                    Vec::new()
                }
            }
            Command::Stop => {
                if self.flush.is_none() {
                    self.flush = Some(if self.is_subscribed() {
                        Flush::Until(now + self.grace)
                    } else {
                        Flush::AwaitingAgent
                    });
                    if !self.is_subscribed() && !self.unacknowledged.is_empty() {
                        tracing::info!(
                            unacknowledged = self.unacknowledged.len(),
                            recovery_timeout = ?self.config.recovery_timeout,
                            "stopping while not subscribed; waiting for the agent to deliver the unacknowledged updates"
                        );
                    }
                }
                self.finish_flush_if_done(now)
            }
            Command::Abort => {
                self.finished = true;
                vec![Action::Finish(Outcome::Aborted)]
            }
        }
    }

    /// A clock tick: bound the flush and the wait for `SUBSCRIBED`.
    pub(crate) fn on_tick(&mut self, now: Instant) -> Vec<Action> {
        if self.finished {
            return Vec::new();
        }
        if self.flush.is_some() {
            let actions = self.finish_flush_if_done(now);
            if !actions.is_empty() {
                return actions;
            }
        }
        match self.conn {
            Conn::Subscribing { since }
                if now.saturating_duration_since(since) >= SUBSCRIBE_TIMEOUT =>
            {
                vec![Action::Reconnect(format!(
                    "no SUBSCRIBED within {SUBSCRIBE_TIMEOUT:?}"
                ))]
            }
            _ => Vec::new(),
        }
    }

    /// Fills in what the driver knows: uuid, timestamp, source, ids.
    fn complete(&self, mut status: TaskStatus) -> TaskStatus {
        if status.uuid.as_deref().is_none_or(str::is_empty) {
            status = TaskStatus {
                uuid: None,
                ..status
            }
            .with_new_uuid();
        }
        if !(status.timestamp.is_finite() && status.timestamp > 0.0) {
            status.timestamp = agora_proto::now_timestamp();
        }
        status.source = Source::SourceExecutor;
        status.executor_id = Some(self.config.executor_id.clone());
        if let Some(agent_id) = &self.agent_id {
            status.agent_id = Some(agent_id.clone());
        }
        status
    }

    /// Ends a stop once everything is acknowledged, or once its grace
    /// period is over while subscribed. While the agent is gone only the
    /// recovery timeout ([`DriverCore::before_connect`]) ends it.
    fn finish_flush_if_done(&mut self, now: Instant) -> Vec<Action> {
        match self.flush {
            Some(_) if self.unacknowledged.is_empty() => {}
            Some(Flush::Until(deadline)) if now >= deadline => {
                self.log_undelivered("grace period over before every update was acknowledged");
            }
            _ => return Vec::new(),
        }
        self.finished = true;
        vec![Action::Finish(Outcome::Stopped)]
    }

    /// Says what ending now leaves unacknowledged: the count, and each
    /// terminal update (the agent reports those tasks itself, as
    /// `TASK_FAILED` once the executor exits).
    fn log_undelivered(&self, why: &str) {
        if self.unacknowledged.is_empty() {
            return;
        }
        tracing::warn!(
            unacknowledged = self.unacknowledged.len(),
            reason = why,
            "ending with updates the agent never acknowledged"
        );
        for pending in self
            .unacknowledged
            .iter()
            .filter(|p| p.status.state.is_terminal())
        {
            tracing::warn!(
                task_id = %pending.status.task_id,
                state = %pending.status.state,
                uuid = pending.status.uuid.as_deref().unwrap_or(""),
                "terminal update not delivered"
            );
        }
    }

    fn abort(&mut self, message: String) -> Vec<Action> {
        self.finished = true;
        vec![
            Action::Finish(Outcome::Aborted),
            Action::Callback(Callback::Error(message)),
        ]
    }
}

/// Whether the update, as the executor gives it, is small enough to be
/// delivered: at most [`MAX_STATUS_UPDATE_BYTES`] of JSON. `Err` carries
/// its size.
pub(crate) fn check_update_size(status: &TaskStatus) -> Result<(), usize> {
    // The cheap bound settles nearly every update without encoding it.
    if update_weight(status) <= MAX_STATUS_UPDATE_BYTES {
        return Ok(());
    }
    match agora_proto::encode(status).len() {
        size if size <= MAX_STATUS_UPDATE_BYTES => Ok(()),
        size => Err(size),
    }
}

/// An upper bound of the size of an `UPDATE` call of `status`, computed
/// without encoding it: `data` in base64, every string as if each of its
/// bytes needed a six-byte escape, and 512 bytes for field names, enums
/// and numbers.
pub(crate) fn update_weight(status: &TaskStatus) -> usize {
    let strings = status.task_id.as_str().len()
        + status.message.as_ref().map_or(0, String::len)
        + status.agent_id.as_ref().map_or(0, |a| a.as_str().len())
        + status.executor_id.as_ref().map_or(0, |e| e.as_str().len())
        + status.uuid.as_ref().map_or(0, String::len);
    let data = status
        .data
        .as_ref()
        .map_or(0, |d| d.0.len().div_ceil(3) * 4);
    512 + 6 * strings + data
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use agora_proto::{CommandInfo, ExecutorId, FrameworkId, Resources, TaskState};

    use super::*;

    fn config(checkpoint: bool) -> ExecutorConfig {
        ExecutorConfig {
            agent_endpoint: "ws://127.0.0.1:1/api/executor".into(),
            tls: Default::default(),
            framework_id: FrameworkId::new("fw-1"),
            executor_id: ExecutorId::new("ex-1"),
            agent_id: None,
            sandbox: PathBuf::from("/tmp"),
            token: "secret".into(),
            checkpoint,
            recovery_timeout: Duration::from_secs(60),
            shutdown_grace_period: Duration::from_secs(5),
        }
    }

    fn subscribed() -> Event {
        Event::Subscribed {
            executor_info: ExecutorInfo {
                container: None,
                executor_id: ExecutorId::new("ex-1"),
                framework_id: None,
                command: CommandInfo::default(),
                resources: Resources::new(),
                name: String::new(),
                source: String::new(),
                api: Default::default(),
                shutdown_grace_period: None,
                data: None,
                labels: Default::default(),
            },
            framework_info: FrameworkInfo::new("fw"),
            agent_id: AgentId::new("agent-1"),
            hostname: "host".into(),
        }
    }

    fn task(id: &str) -> TaskInfo {
        TaskInfo {
            container: None,
            allocation_role: None,
            launch_stamp: None,
            name: id.into(),
            task_id: TaskId::new(id),
            agent_id: AgentId::new("agent-1"),
            resources: Resources::new(),
            executor: None,
            command: None,
            data: None,
            kill_grace_period: None,
            labels: Default::default(),
            task_group: None,
        }
    }

    fn update(task: &str, state: TaskState, uuid: &str) -> Command {
        let mut status = TaskStatus::new(TaskId::new(task), state, Source::SourceAgent);
        status.uuid = Some(uuid.into());
        Command::Update(status)
    }

    fn connected(checkpoint: bool) -> (DriverCore, Instant) {
        let now = Instant::now();
        let mut core = DriverCore::new(config(checkpoint), now);
        core.on_connected(now);
        core.on_event(subscribed(), now);
        (core, now)
    }

    #[test]
    fn backoff_doubles_with_jitter_and_resets_on_subscription() {
        let now = Instant::now();
        let mut core = DriverCore::new(config(true), now);
        let steps: Vec<_> = (0..6).map(|_| core.next_backoff(0.0).as_millis()).collect();
        assert_eq!(steps, vec![100, 200, 400, 800, 1600, 2000]);
        // At the cap, the sample still spreads the executors out.
        assert_eq!(core.next_backoff(0.5), Duration::from_millis(1500));
        core.on_connected(now);
        core.on_event(subscribed(), now);
        assert_eq!(core.next_backoff(0.999_999).as_millis(), 50);
    }

    fn subscribe_lists(actions: &[Action]) -> (Vec<String>, Vec<TaskId>) {
        match actions {
            [Action::Send(Call::Subscribe {
                protocol,
                framework_id,
                executor_id,
                token,
                unacknowledged_updates,
                unacknowledged_tasks,
            })] => {
                assert_eq!(*protocol, PROTOCOL_VERSION);
                assert_eq!(framework_id, &FrameworkId::new("fw-1"));
                assert_eq!(executor_id, &ExecutorId::new("ex-1"));
                assert_eq!(token, "secret");
                (
                    unacknowledged_updates
                        .iter()
                        .map(|s| s.uuid.clone().unwrap())
                        .collect(),
                    unacknowledged_tasks
                        .iter()
                        .map(|t| t.task_id.clone())
                        .collect(),
                )
            }
            other => panic!("expected one SUBSCRIBE, got {other:?}"),
        }
    }

    #[test]
    fn subscribe_flow_registers_once_then_reregisters() {
        let now = Instant::now();
        let mut core = DriverCore::new(config(true), now);
        assert!(core.before_connect(now).is_empty());
        assert_eq!(subscribe_lists(&core.on_connected(now)), (vec![], vec![]));
        let actions = core.on_event(subscribed(), now);
        assert!(matches!(
            &actions[..],
            [Action::Callback(Callback::Registered { agent_id, .. })] if agent_id.as_str() == "agent-1"
        ));
        assert_eq!(
            core.on_disconnected(now),
            vec![Action::Callback(Callback::Disconnected)]
        );
        core.on_connected(now);
        assert_eq!(
            core.on_event(subscribed(), now),
            vec![Action::Callback(Callback::Reregistered(AgentId::new(
                "agent-1"
            )))]
        );
    }

    #[test]
    fn updates_are_completed_and_kept_until_acknowledged() {
        let (mut core, now) = connected(true);
        let actions = core.on_command(
            Command::Update(TaskStatus::new(
                TaskId::new("t1"),
                TaskState::Running,
                Source::SourceMaster,
            )),
            now,
        );
        let [Action::Send(Call::Update { status })] = &actions[..] else {
            panic!("expected an UPDATE, got {actions:?}");
        };
        assert!(status.uuid.is_some());
        assert_eq!(status.source, Source::SourceExecutor);
        assert_eq!(status.executor_id, Some(ExecutorId::new("ex-1")));
        assert_eq!(status.agent_id, Some(AgentId::new("agent-1")));
        assert!(status.timestamp > 0.0);
        let uuid = status.uuid.clone().unwrap();
        assert_eq!(core.unacknowledged(), vec![uuid.clone()]);
        core.on_event(
            Event::Acknowledged {
                task_id: TaskId::new("t1"),
                uuid,
            },
            now,
        );
        assert!(core.unacknowledged().is_empty());
    }

    #[test]
    fn unacknowledged_updates_and_tasks_are_resent_in_order() {
        let (mut core, now) = connected(true);
        core.on_event(
            Event::Launch {
                task: task("t1"),
                sandbox: None,
                cgroups: Vec::new(),
                container: None,
            },
            now,
        );
        core.on_event(
            Event::Launch {
                task: task("t2"),
                sandbox: None,
                cgroups: Vec::new(),
                container: None,
            },
            now,
        );
        core.on_command(update("t1", TaskState::Running, "u1"), now);
        core.on_command(update("t2", TaskState::Running, "u2"), now);
        core.on_command(update("t1", TaskState::Finished, "u3"), now);
        // The agent acknowledged u2: task t2 is known to it now.
        core.on_event(
            Event::Acknowledged {
                task_id: TaskId::new("t2"),
                uuid: "u2".into(),
            },
            now,
        );
        core.on_disconnected(now);
        // Made while disconnected: listed in the next SUBSCRIBE too.
        core.on_command(update("t1", TaskState::Finished, "u4"), now);
        let (updates, tasks) = subscribe_lists(&core.on_connected(now));
        assert_eq!(updates, vec!["u1", "u3", "u4"]);
        assert_eq!(tasks, vec![TaskId::new("t1")]);
        // Nothing is sent twice after SUBSCRIBED.
        assert_eq!(
            core.on_event(subscribed(), now),
            vec![Action::Callback(Callback::Reregistered(AgentId::new(
                "agent-1"
            )))]
        );
    }

    #[test]
    fn updates_made_while_subscribing_follow_subscribed() {
        let now = Instant::now();
        let mut core = DriverCore::new(config(true), now);
        core.on_connected(now);
        assert!(core
            .on_command(update("t1", TaskState::Running, "u1"), now)
            .is_empty());
        let actions = core.on_event(subscribed(), now);
        assert!(matches!(
            &actions[1..],
            [Action::Send(Call::Update { status })] if status.uuid.as_deref() == Some("u1")
                && status.agent_id == Some(AgentId::new("agent-1"))
        ));
    }

    #[test]
    fn without_checkpoint_a_lost_agent_aborts() {
        let (mut core, now) = connected(false);
        let actions = core.on_disconnected(now);
        assert_eq!(actions[0], Action::Callback(Callback::Disconnected));
        assert_eq!(actions[1], Action::Finish(Outcome::Aborted));
        assert!(
            matches!(&actions[2], Action::Callback(Callback::Error(m)) if m.contains("checkpoint"))
        );
        assert!(core.is_finished());
    }

    #[test]
    fn with_checkpoint_recovery_is_bounded() {
        let (mut core, now) = connected(true);
        assert_eq!(core.on_disconnected(now).len(), 1);
        assert!(core
            .before_connect(now + Duration::from_secs(59))
            .is_empty());
        core.on_disconnected(now + Duration::from_secs(59));
        let actions = core.before_connect(now + Duration::from_secs(60));
        assert_eq!(actions[0], Action::Finish(Outcome::Aborted));
        assert!(
            matches!(&actions[1], Action::Callback(Callback::Error(m)) if m.contains("recovery"))
        );
    }

    #[test]
    fn stop_flushes_until_acknowledged() {
        let (mut core, now) = connected(true);
        core.on_command(update("t1", TaskState::Finished, "u1"), now);
        assert!(core.on_command(Command::Stop, now).is_empty());
        assert!(core.on_tick(now + Duration::from_secs(1)).is_empty());
        // Still processes acknowledgements, and ends on the last one.
        assert_eq!(
            core.on_event(
                Event::Acknowledged {
                    task_id: TaskId::new("t1"),
                    uuid: "u1".into()
                },
                now
            ),
            vec![Action::Finish(Outcome::Stopped)]
        );
    }

    #[test]
    fn stop_flush_is_bounded_by_the_grace_period() {
        let (mut core, now) = connected(true);
        core.on_command(update("t1", TaskState::Finished, "u1"), now);
        core.on_command(Command::Stop, now);
        assert_eq!(
            core.on_tick(now + Duration::from_secs(5)),
            vec![Action::Finish(Outcome::Stopped)]
        );
    }

    #[test]
    fn stop_with_nothing_pending_ends_at_once() {
        let (mut core, now) = connected(true);
        assert_eq!(
            core.on_command(Command::Stop, now),
            vec![Action::Finish(Outcome::Stopped)]
        );
    }

    #[test]
    fn stop_while_disconnected_with_nothing_pending_ends_at_once() {
        let (mut core, now) = connected(true);
        core.on_disconnected(now);
        assert_eq!(
            core.on_command(Command::Stop, now),
            vec![Action::Finish(Outcome::Stopped)]
        );
    }

    /// A task finishes while its agent restarts and the executor, idle,
    /// stops: the terminal update is not dropped. The driver reconnects,
    /// re-subscribes carrying it, and ends once the agent acknowledges it,
    /// however long past the grace period the agent took to come back.
    #[test]
    fn stop_while_disconnected_delivers_the_terminal_update() {
        let (mut core, now) = connected(true);
        core.on_event(
            Event::Launch {
                task: task("t1"),
                sandbox: None,
                cgroups: Vec::new(),
                container: None,
            },
            now,
        );
        core.on_disconnected(now);
        core.on_command(update("t1", TaskState::Finished, "u1"), now);
        assert!(core.on_command(Command::Stop, now).is_empty());
        assert!(!core.is_finished());
        // The agent takes 30 s (six grace periods) to come back.
        let mut t = now;
        while t < now + Duration::from_secs(30) {
            assert!(core.before_connect(t).is_empty());
            assert!(core.on_disconnected(t).is_empty());
            assert!(core.on_tick(t).is_empty());
            t += core.next_backoff(0.5);
        }
        let (updates, tasks) = subscribe_lists(&core.on_connected(t));
        assert_eq!(updates, vec!["u1"]);
        assert_eq!(tasks, vec![TaskId::new("t1")]);
        // Stopping: no callbacks, and no giving up while it waits for
        // SUBSCRIBED.
        assert!(core.on_tick(t + Duration::from_secs(10)).is_empty());
        let t = t + Duration::from_secs(10);
        assert!(core.on_event(subscribed(), t).is_empty());
        assert!(core.on_tick(t + Duration::from_secs(4)).is_empty());
        assert_eq!(
            ack(&mut core, "u1", t + Duration::from_secs(4)),
            vec![Action::Finish(Outcome::Stopped)]
        );
        assert!(core.is_finished());
    }

    /// The connection drops during the flush (the agent restarts): the
    /// updates are re-sent on the next connection, not dropped.
    #[test]
    fn a_connection_lost_during_the_flush_is_recovered() {
        let (mut core, now) = connected(true);
        core.on_command(update("t1", TaskState::Finished, "u1"), now);
        core.on_command(Command::Stop, now);
        assert_eq!(
            core.on_disconnected(now),
            vec![Action::Callback(Callback::Disconnected)]
        );
        let t = now + Duration::from_secs(20);
        assert!(core.before_connect(t).is_empty());
        let (updates, _) = subscribe_lists(&core.on_connected(t));
        assert_eq!(updates, vec!["u1"]);
        assert!(core.on_event(subscribed(), t).is_empty());
        assert_eq!(
            ack(&mut core, "u1", t),
            vec![Action::Finish(Outcome::Stopped)]
        );
    }

    /// The wait for an agent that does not come back is the recovery
    /// timeout, as for a running driver; the grace period bounds the wait
    /// for acknowledgements once it is back.
    #[test]
    fn a_stop_gives_up_on_an_agent_after_the_recovery_timeout() {
        let (mut core, now) = connected(true);
        core.on_command(update("t1", TaskState::Finished, "u1"), now);
        core.on_disconnected(now);
        assert!(core.on_command(Command::Stop, now).is_empty());
        assert!(core
            .before_connect(now + Duration::from_secs(59))
            .is_empty());
        let actions = core.before_connect(now + Duration::from_secs(60));
        assert_eq!(actions[0], Action::Finish(Outcome::Aborted));
        assert!(core.is_finished());
        assert_eq!(core.unacknowledged(), vec!["u1"]);

        // Back within the timeout but never acknowledging: the grace
        // period after SUBSCRIBED ends it.
        let (mut core, now) = connected(true);
        core.on_command(update("t1", TaskState::Finished, "u1"), now);
        core.on_disconnected(now);
        core.on_command(Command::Stop, now);
        let t = now + Duration::from_secs(40);
        core.on_connected(t);
        core.on_event(subscribed(), t);
        assert!(core.on_tick(t + Duration::from_secs(4)).is_empty());
        assert_eq!(
            core.on_tick(t + Duration::from_secs(5)),
            vec![Action::Finish(Outcome::Stopped)]
        );
    }

    /// Without checkpointing a lost agent ends the driver, stopping or
    /// not: a restarted agent would not take the executor back.
    #[test]
    fn without_checkpoint_a_lost_connection_ends_the_flush() {
        let (mut core, now) = connected(false);
        core.on_command(update("t1", TaskState::Finished, "u1"), now);
        core.on_command(Command::Stop, now);
        assert_eq!(
            core.on_disconnected(now),
            vec![
                Action::Callback(Callback::Disconnected),
                Action::Finish(Outcome::Stopped)
            ]
        );
    }

    #[test]
    fn events_map_to_callbacks() {
        let (mut core, now) = connected(true);
        assert_eq!(
            core.on_event(
                Event::Kill {
                    task_id: TaskId::new("t1"),
                    grace_period_seconds: None
                },
                now
            ),
            vec![Action::Callback(Callback::KillTask(TaskId::new("t1")))]
        );
        assert_eq!(
            core.on_event(Event::Message { data: "x".into() }, now),
            vec![Action::Callback(Callback::FrameworkMessage(b"x".to_vec()))]
        );
        assert_eq!(
            core.on_event(
                Event::Shutdown {
                    grace_period_seconds: 2.0
                },
                now
            ),
            vec![Action::Callback(Callback::Shutdown)]
        );
        assert!(core.on_frame("garbage", now).is_empty());
        assert!(core
            .on_event(
                Event::Error {
                    message: "meh".into(),
                    fatal: false
                },
                now
            )
            .is_empty());
        let actions = core.on_event(
            Event::Error {
                message: "bad token".into(),
                fatal: true,
            },
            now,
        );
        assert_eq!(
            actions,
            vec![
                Action::Finish(Outcome::Aborted),
                Action::Callback(Callback::Error("bad token".into()))
            ]
        );
    }

    #[test]
    fn shutdown_grace_bounds_the_flush() {
        let (mut core, now) = connected(true);
        core.on_event(
            Event::Shutdown {
                grace_period_seconds: 1.0,
            },
            now,
        );
        core.on_command(update("t1", TaskState::Killed, "u1"), now);
        core.on_command(Command::Stop, now);
        assert_eq!(
            core.on_tick(now + Duration::from_secs(1)),
            vec![Action::Finish(Outcome::Stopped)]
        );
    }

    /// An update of `task` carrying `bytes` of data.
    fn big_update(task: &str, uuid: &str, bytes: usize) -> Command {
        let mut status =
            TaskStatus::new(TaskId::new(task), TaskState::Running, Source::SourceAgent);
        status.uuid = Some(uuid.into());
        status.data = Some(agora_proto::Bytes(vec![b'x'; bytes]));
        Command::Update(status)
    }

    /// The uuids of the updates in `actions`' SUBSCRIBE and UPDATE calls,
    /// in order, after checking every frame's size.
    fn sent_uuids(actions: &[Action]) -> Vec<String> {
        let mut out = Vec::new();
        for action in actions {
            let Action::Send(call) = action else { continue };
            let frame = agora_proto::encode(call).len();
            match call {
                Call::Subscribe {
                    unacknowledged_updates,
                    ..
                } => {
                    assert!(frame <= SUBSCRIBE_BUDGET, "SUBSCRIBE of {frame} bytes");
                    out.extend(
                        unacknowledged_updates
                            .iter()
                            .map(|s| s.uuid.clone().unwrap()),
                    );
                }
                Call::Update { status } => {
                    assert!(frame <= MAX_FRAME_BYTES, "UPDATE of {frame} bytes");
                    out.push(status.uuid.clone().unwrap());
                }
                _ => {}
            }
        }
        out
    }

    fn ack(core: &mut DriverCore, uuid: &str, now: Instant) -> Vec<Action> {
        let task = core
            .unacknowledged
            .iter()
            .find(|p| p.status.uuid.as_deref() == Some(uuid))
            .map(|p| p.status.task_id.clone())
            .expect("an unacknowledged update");
        core.on_event(
            Event::Acknowledged {
                task_id: task,
                uuid: uuid.into(),
            },
            now,
        )
    }

    /// After a long outage with far more than a frame of updates pending,
    /// the SUBSCRIBE stays within its budget and lists the oldest; the
    /// rest follow as UPDATE calls, in order, each sent once, as
    /// acknowledgements come back.
    #[test]
    fn subscribe_lists_what_fits_and_the_rest_follow_in_order() {
        let (mut core, now) = connected(true);
        core.on_disconnected(now);
        // 3 tasks x 20 updates of 400 KB: about 32 MB of JSON.
        let mut expected = Vec::new();
        for i in 0..60 {
            let uuid = format!("u{i:02}");
            core.on_command(big_update(&format!("t{}", i % 3), &uuid, 400_000), now);
            expected.push(uuid);
        }
        let subscribe = core.on_connected(now);
        let listed = sent_uuids(&subscribe);
        assert!(!listed.is_empty() && listed.len() < 30, "{}", listed.len());
        assert_eq!(listed[..], expected[..listed.len()]);
        let mut sent = listed.clone();
        let mut actions = core.on_event(subscribed(), now);
        // The window lets a few through at once, never the whole backlog.
        let more = sent_uuids(&actions);
        assert!(more.len() < expected.len() - listed.len());
        sent.extend(more);
        let mut acked = 0;
        while acked < sent.len() {
            let uuid = sent[acked].clone();
            actions = ack(&mut core, &uuid, now);
            assert!(matches!(
                actions[0],
                Action::Callback(Callback::Acknowledged { .. })
            ));
            sent.extend(sent_uuids(&actions));
            acked += 1;
        }
        assert_eq!(sent, expected, "every update sent once, oldest first");
        assert!(core.unacknowledged().is_empty());
        assert_eq!((core.in_flight, core.in_flight_bytes), (0, 0));
    }

    /// Many small updates: the SUBSCRIBE lists at most the window, and an
    /// acknowledgement lets the next one go, so the agent never has more
    /// than the window to answer.
    #[test]
    fn a_backlog_of_small_updates_is_sent_as_acknowledgements_come() {
        let (mut core, now) = connected(true);
        core.on_disconnected(now);
        let n = MAX_IN_FLIGHT * 3;
        for i in 0..n {
            core.on_command(update("t1", TaskState::Running, &format!("u{i:05}")), now);
        }
        let listed = sent_uuids(&core.on_connected(now));
        assert_eq!(listed.len(), MAX_IN_FLIGHT);
        assert!(sent_uuids(&core.on_event(subscribed(), now)).is_empty());
        // An update made now queues behind the backlog.
        assert!(core
            .on_command(update("t1", TaskState::Finished, "last"), now)
            .is_empty());
        let mut sent = listed;
        let mut acked = 0;
        while acked < sent.len() {
            let uuid = sent[acked].clone();
            let next = sent_uuids(&ack(&mut core, &uuid, now));
            assert!(next.len() <= 1);
            sent.extend(next);
            acked += 1;
            assert!(core.in_flight <= MAX_IN_FLIGHT);
        }
        let mut expected: Vec<String> = (0..n).map(|i| format!("u{i:05}")).collect();
        expected.push("last".into());
        assert_eq!(sent, expected);
    }

    /// A reconnect in the middle of the backlog starts again from the
    /// oldest unacknowledged update.
    #[test]
    fn a_reconnect_mid_backlog_resends_from_the_oldest() {
        let (mut core, now) = connected(true);
        core.on_disconnected(now);
        for i in 0..40 {
            core.on_command(big_update("t1", &format!("u{i:02}"), 400_000), now);
        }
        let first = sent_uuids(&core.on_connected(now));
        core.on_event(subscribed(), now);
        ack(&mut core, &first[0], now);
        ack(&mut core, &first[1], now);
        core.on_disconnected(now);
        let again = sent_uuids(&core.on_connected(now));
        assert_eq!(again[0], "u02");
        assert!(again.windows(2).all(|w| w[0] < w[1]));
    }

    /// Tasks are listed before updates, within the same budget.
    #[test]
    fn tasks_are_listed_first_within_the_budget() {
        let (mut core, now) = connected(true);
        for i in 0..3 {
            let mut t = task(&format!("t{i}"));
            t.data = Some(agora_proto::Bytes(vec![b'y'; 1_000_000]));
            core.on_event(
                Event::Launch {
                    task: t,
                    sandbox: None,
                    cgroups: Vec::new(),
                    container: None,
                },
                now,
            );
        }
        core.on_disconnected(now);
        for i in 0..10 {
            core.on_command(big_update("t0", &format!("u{i}"), 400_000), now);
        }
        let actions = core.on_connected(now);
        let (updates, tasks) = subscribe_lists(&actions);
        assert_eq!(tasks.len(), 3);
        // 4 MB of tasks (base64) leave room for 8 updates of 533 KB.
        assert_eq!(updates.len(), 8);
        assert_eq!(
            sent_uuids(&actions),
            (0..8).map(|i| format!("u{i}")).collect::<Vec<_>>()
        );
    }

    /// An update that no frame could carry is refused, not queued; one
    /// just under the limit is accepted.
    #[test]
    fn an_update_too_large_for_a_frame_is_refused() {
        let (mut core, now) = connected(true);
        let huge = big_update("t1", "huge", MAX_FRAME_BYTES);
        let Command::Update(status) = &huge else {
            unreachable!()
        };
        assert!(check_update_size(status).is_err());
        assert!(core.on_command(huge, now).is_empty());
        assert!(core.unacknowledged().is_empty());
        // Base64 makes 3 bytes 4: this is just under the limit encoded.
        let fits = (MAX_STATUS_UPDATE_BYTES - 1024) / 4 * 3;
        let ok = big_update("t1", "ok", fits);
        let Command::Update(status) = &ok else {
            unreachable!()
        };
        assert!(check_update_size(status).is_ok());
        let sent = sent_uuids(&core.on_command(ok, now));
        assert_eq!(sent, vec!["ok"]);
        // Alone in flight, it goes even though it outweighs the window.
        core.on_disconnected(now);
        assert!(sent_uuids(&core.on_connected(now)).is_empty());
        assert_eq!(sent_uuids(&core.on_event(subscribed(), now)), vec!["ok"]);
    }

    #[test]
    fn the_weight_bounds_the_encoded_size() {
        let mut status = TaskStatus::new(
            TaskId::new("t\u{1}\"x"),
            TaskState::Running,
            Source::SourceExecutor,
        )
        .with_message("\u{0}\u{1f}\\\"é".repeat(100))
        .with_new_uuid();
        status.data = Some(agora_proto::Bytes(vec![0; 1001]));
        status.agent_id = Some(AgentId::new("a".repeat(255)));
        status.reason = Some(agora_proto::Reason::ReasonExecutorTerminated);
        let call = Call::Update {
            status: status.clone(),
        };
        assert!(agora_proto::encode(&call).len() <= update_weight(&status));
    }
}
