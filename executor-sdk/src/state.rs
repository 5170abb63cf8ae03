//! The executor driver's sans-IO core.
//!
//! [`DriverCore`] decides everything about the executor's side of the
//! channel: the subscription, the ordered list of updates not yet
//! acknowledged (re-sent in every `SUBSCRIBE`), the tasks with no
//! acknowledged update, recovery after a lost agent, and the flush on stop.
//! The network loop in [`crate::driver`] feeds it connection events,
//! frames, user commands and clock ticks and carries out the [`Action`]s it
//! returns.

use std::collections::VecDeque;
use std::time::Duration;

use agora_discovery::{Backoff, DEFAULT_JITTER};
use agora_proto::executor::{Call, Event};
use agora_proto::{
    AgentId, ExecutorInfo, FrameworkInfo, Source, TaskId, TaskInfo, TaskStatus, PROTOCOL_VERSION,
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

/// What the user (or the driver itself) asked for.
#[derive(Debug, Clone, PartialEq)]
pub enum Command {
    /// A status update to send reliably.
    Update(TaskStatus),
    /// Bytes for the scheduler (best effort).
    Message(Vec<u8>),
    /// Flush unacknowledged updates (bounded by `grace`), then end.
    Stop,
    /// End now.
    Abort,
}

/// An executor callback to run on the callback thread.
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
        sandbox: Option<String>,
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

#[derive(Debug, Clone, PartialEq)]
struct Pending {
    status: TaskStatus,
    /// Written on the current connection (or listed in its `SUBSCRIBE`).
    sent: bool,
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
    /// In launch order.
    unacknowledged_tasks: Vec<TaskInfo>,
    /// When the agent was lost (or, before the first subscription, when
    /// the driver started).
    lost_since: Option<Instant>,
    /// Set by `Stop`: end once everything is acknowledged or at this time.
    flush_deadline: Option<Instant>,
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
            unacknowledged_tasks: Vec::new(),
            lost_since: Some(now),
            flush_deadline: None,
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

    fn is_subscribed(&self) -> bool {
        self.conn == Conn::Subscribed
    }

    /// Called before each connection attempt: gives up once the agent has
    /// been gone for longer than the recovery timeout.
    pub(crate) fn before_connect(&mut self, now: Instant) -> Vec<Action> {
        match self.lost_since {
            Some(since)
                if !self.finished
                    && now.saturating_duration_since(since) >= self.config.recovery_timeout =>
            {
                self.abort(format!(
                    "the agent did not come back within the recovery timeout ({:?})",
                    self.config.recovery_timeout
                ))
            }
            _ => Vec::new(),
        }
    }

    /// The WebSocket is open: subscribe, listing what is unacknowledged.
    pub(crate) fn on_connected(&mut self, now: Instant) -> Vec<Action> {
        if self.finished {
            return Vec::new();
        }
        self.conn = Conn::Subscribing { since: now };
        for pending in &mut self.unacknowledged {
            pending.sent = true;
        }
        vec![Action::Send(Call::Subscribe {
            protocol: PROTOCOL_VERSION,
            framework_id: self.config.framework_id.clone(),
            executor_id: self.config.executor_id.clone(),
            token: self.config.token.clone(),
            unacknowledged_updates: self
                .unacknowledged
                .iter()
                .map(|p| p.status.clone())
                .collect(),
            unacknowledged_tasks: self.unacknowledged_tasks.clone(),
        })]
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
        self.lost_since.get_or_insert(now);
        let mut actions = Vec::new();
        if was_subscribed {
            actions.push(Action::Callback(Callback::Disconnected));
        }
        if self.flush_deadline.is_some() {
            tracing::warn!(
                unacknowledged = self.unacknowledged.len(),
                "connection lost while stopping; ending without acknowledgements"
            );
            self.finished = true;
            actions.push(Action::Finish(Outcome::Stopped));
        } else if self.subscribed_before && !self.config.checkpoint {
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
            } => self.on_subscribed(executor_info, framework_info, agent_id),
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
            _ if self.flush_deadline.is_some() => {
                tracing::debug!("ignoring an event received while stopping");
                Vec::new()
            }
            Event::Launch { task, sandbox } => {
                if !self
                    .unacknowledged_tasks
                    .iter()
                    .any(|t| t.task_id == task.task_id)
                {
                    self.unacknowledged_tasks.push(task.clone());
                }
                vec![Action::Callback(Callback::LaunchTask { task, sandbox })]
            }
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
        if self.flush_deadline.is_none() {
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
        // Updates made while the SUBSCRIBE was in flight were not in it.
        for pending in self.unacknowledged.iter_mut().filter(|p| !p.sent) {
            pending
                .status
                .agent_id
                .get_or_insert_with(|| agent_id.clone());
            pending.sent = true;
            actions.push(Action::Send(Call::Update {
                status: pending.status.clone(),
            }));
        }
        actions
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
        self.unacknowledged.remove(i);
        if self.flush_deadline.is_some() {
            return self.finish_flush_if_done(now);
        }
        vec![Action::Callback(Callback::Acknowledged { task_id, uuid })]
    }

    /// A user command.
    pub(crate) fn on_command(&mut self, command: Command, now: Instant) -> Vec<Action> {
        if self.finished {
            return Vec::new();
        }
        match command {
            Command::Update(status) => {
                let status = self.complete(status);
                let mut pending = Pending {
                    status,
                    sent: false,
                };
                let mut actions = Vec::new();
                if self.is_subscribed() {
                    pending.sent = true;
                    actions.push(Action::Send(Call::Update {
                        status: pending.status.clone(),
                    }));
                }
                self.unacknowledged.push_back(pending);
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
                if self.flush_deadline.is_none() {
                    self.flush_deadline = Some(now + self.grace);
                }
                if !self.is_subscribed() && !matches!(self.conn, Conn::Subscribing { .. }) {
                    self.finished = true;
                    return vec![Action::Finish(Outcome::Stopped)];
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
        if let Some(deadline) = self.flush_deadline {
            if now >= deadline {
                tracing::warn!(
                    unacknowledged = self.unacknowledged.len(),
                    "stopping before every update was acknowledged: grace period over"
                );
                self.finished = true;
                return vec![Action::Finish(Outcome::Stopped)];
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

    fn finish_flush_if_done(&mut self, now: Instant) -> Vec<Action> {
        match self.flush_deadline {
            Some(deadline) if self.unacknowledged.is_empty() || now >= deadline => {
                self.finished = true;
                vec![Action::Finish(Outcome::Stopped)]
            }
            _ => Vec::new(),
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

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use agora_proto::{CommandInfo, ExecutorId, FrameworkId, Resources, TaskState};

    use super::*;

    fn config(checkpoint: bool) -> ExecutorConfig {
        ExecutorConfig {
            agent_endpoint: "ws://127.0.0.1:1/api/executor".into(),
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
                executor_id: ExecutorId::new("ex-1"),
                framework_id: None,
                command: CommandInfo::default(),
                resources: Resources::new(),
                name: String::new(),
                source: String::new(),
            },
            framework_info: FrameworkInfo::new("fw"),
            agent_id: AgentId::new("agent-1"),
            hostname: "host".into(),
        }
    }

    fn task(id: &str) -> TaskInfo {
        TaskInfo {
            name: id.into(),
            task_id: TaskId::new(id),
            agent_id: AgentId::new("agent-1"),
            resources: Resources::new(),
            executor: None,
            command: None,
            data: None,
            kill_grace_period: None,
            labels: Default::default(),
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
            },
            now,
        );
        core.on_event(
            Event::Launch {
                task: task("t2"),
                sandbox: None,
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
}
