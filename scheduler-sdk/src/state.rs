//! The scheduler driver's sans-IO core.
//!
//! [`DriverCore`] holds everything the driver decides: whether it is
//! subscribed, the framework id, calls queued while disconnected, which
//! acknowledgements to send, when the master counts as gone and how long to
//! wait before reconnecting. The network loop in [`crate::driver`] feeds it
//! connection events, decoded frames, user commands and clock ticks, and
//! carries out the [`Action`]s it returns. Time is passed in, so every rule
//! here is tested without sockets or sleeps. What it has delivered to the
//! scheduler is remembered in [`Delivered`], so that each status update is
//! delivered once.

use std::collections::VecDeque;
use std::time::Duration;

use agora_discovery::{Backoff, DEFAULT_JITTER};
use agora_proto::scheduler::{Call, Event};
use agora_proto::{
    AgentId, ExecutorId, Filters, FrameworkId, FrameworkInfo, MasterInfo, Offer, OfferId, Reason,
    Source, TaskInfo, TaskState, TaskStatus, PROTOCOL_VERSION,
};
use tokio::time::Instant;

use crate::delivered::{Delivered, Verdict};
use crate::DriverConfig;

/// Heartbeat intervals without any frame from the master after which the
/// connection counts as dead.
pub(crate) const HEARTBEAT_MISSES: u32 = 3;

/// How long a connected master may take to answer `SUBSCRIBE`.
pub(crate) const SUBSCRIBE_TIMEOUT: Duration = Duration::from_secs(30);

/// Calls kept while disconnected; beyond this, new calls are dropped.
pub(crate) const MAX_QUEUED_CALLS: usize = 10_000;

/// Message of the `TASK_DROPPED` updates the driver generates.
pub(crate) const DROPPED_MESSAGE: &str = "driver disconnected";

/// What the user asked the driver to do.
#[derive(Debug, Clone, PartialEq)]
pub enum Command {
    /// Launch tasks on offers (dropped when not subscribed).
    Launch {
        offer_ids: Vec<OfferId>,
        tasks: Vec<TaskInfo>,
        filters: Filters,
    },
    /// Decline offers (dropped when not subscribed).
    Decline {
        offer_ids: Vec<OfferId>,
        filters: Filters,
    },
    /// Any other call: sent now, or queued until subscribed.
    Call(Call),
    /// Acknowledge an update: `implicit` after `status_update` returned,
    /// otherwise an explicit `acknowledge_status_update`.
    Acknowledge { status: TaskStatus, implicit: bool },
    /// `stop(failover)`.
    Stop { failover: bool },
    /// `abort()`.
    Abort,
}

/// A scheduler callback to run on the callback thread.
#[derive(Debug, Clone, PartialEq)]
pub enum Callback {
    Registered {
        framework_id: FrameworkId,
        master: MasterInfo,
    },
    Reregistered {
        master: MasterInfo,
    },
    Disconnected,
    ResourceOffers(Vec<Offer>),
    OfferRescinded(OfferId),
    StatusUpdate(TaskStatus),
    FrameworkMessage {
        executor_id: ExecutorId,
        agent_id: AgentId,
        data: Vec<u8>,
    },
    AgentLost(AgentId),
    ExecutorLost {
        executor_id: ExecutorId,
        agent_id: AgentId,
        status: Option<i32>,
    },
    /// The final callback after a fatal error.
    Error(String),
}

/// How the driver ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    Stopped,
    Aborted,
}

/// What the network loop must do, in order.
#[derive(Debug, Clone, PartialEq)]
pub enum Action {
    /// Write this call on the current connection.
    Send(Call),
    /// Run this callback.
    Callback(Callback),
    /// The framework id is now known (for `SchedulerDriver::framework_id`).
    FrameworkId(FrameworkId),
    /// Drop the current connection and reconnect after a backoff.
    Reconnect(String),
    /// Close the connection (after writing what came before) and end.
    Finish(Outcome),
}

/// Where the connection is.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Conn {
    Disconnected,
    Subscribing {
        since: Instant,
    },
    Subscribed {
        heartbeat: Option<Duration>,
        last_seen: Instant,
    },
}

/// The driver's state machine.
#[derive(Debug)]
pub(crate) struct DriverCore {
    framework: FrameworkInfo,
    implicit_acknowledgements: bool,
    conn: Conn,
    subscribed_before: bool,
    /// Started with a framework id: the first subscription is a failover.
    failover: bool,
    queued: VecDeque<Call>,
    finished: bool,
    backoff: Backoff,
    delivered: Delivered,
}

// === impl DriverCore ===

impl DriverCore {
    pub(crate) fn new(framework: FrameworkInfo, config: &DriverConfig) -> Self {
        DriverCore {
            failover: framework.id.is_some(),
            framework,
            implicit_acknowledgements: config.implicit_acknowledgements,
            conn: Conn::Disconnected,
            subscribed_before: false,
            queued: VecDeque::new(),
            finished: false,
            backoff: Backoff::new(
                config.reconnect_backoff_min,
                config.reconnect_backoff_max,
                DEFAULT_JITTER,
            ),
            delivered: Delivered::new(config.remembered_tasks),
        }
    }

    /// The framework id, once known (or as configured for a failover).
    #[cfg(any(test, feature = "sim"))]
    pub(crate) fn framework_id(&self) -> Option<&FrameworkId> {
        self.framework.id.as_ref()
    }

    /// Whether a `SUBSCRIBED` was received on the current connection.
    pub(crate) fn is_subscribed(&self) -> bool {
        matches!(self.conn, Conn::Subscribed { .. })
    }

    /// Whether the driver has ended.
    #[cfg(any(test, feature = "sim"))]
    pub(crate) fn is_finished(&self) -> bool {
        self.finished
    }

    /// Calls waiting for the next subscription.
    #[cfg(test)]
    pub(crate) fn queued_calls(&self) -> usize {
        self.queued.len()
    }

    /// The WebSocket is open: subscribe.
    pub(crate) fn on_connected(&mut self, now: Instant) -> Vec<Action> {
        if self.finished {
            return Vec::new();
        }
        self.conn = Conn::Subscribing { since: now };
        vec![Action::Send(Call::Subscribe {
            protocol: PROTOCOL_VERSION,
            framework_info: self.framework.clone(),
            // After our own earlier subscription the master may still hold
            // the old (half-open) connection: take over from it. A driver
            // started with a framework id is a failover scheduler: the
            // master may not yet have noticed that the old one died
            // (Mesos's driver fails over the same way).
            force: self.subscribed_before || self.failover,
        })]
    }

    /// The connection dropped (or could not be used).
    pub(crate) fn on_disconnected(&mut self) -> Vec<Action> {
        let was_subscribed = self.is_subscribed();
        self.conn = Conn::Disconnected;
        if was_subscribed && !self.finished {
            vec![Action::Callback(Callback::Disconnected)]
        } else {
            Vec::new()
        }
    }

    /// How long to wait before the next connection attempt: doubling up
    /// to the cap, less a jitter that `sample` (uniform in `[0, 1)`)
    /// chooses, so drivers that lost one master do not all come back at
    /// once; reset by a successful subscription.
    pub(crate) fn next_backoff(&mut self, sample: f64) -> Duration {
        self.backoff.next_delay(sample)
    }

    /// One text frame from the master.
    pub(crate) fn on_frame(&mut self, text: &str, now: Instant) -> Vec<Action> {
        match agora_proto::decode::<Event>(text) {
            Ok(event) => self.on_event(event, now),
            Err(error) => {
                tracing::warn!(%error, "ignoring undecodable frame from the master");
                self.touch(now);
                Vec::new()
            }
        }
    }

    /// One decoded event from the master.
    pub(crate) fn on_event(&mut self, event: Event, now: Instant) -> Vec<Action> {
        if self.finished {
            return Vec::new();
        }
        self.touch(now);
        match event {
            Event::Subscribed {
                framework_id,
                heartbeat_interval_seconds,
                master_info,
                reregistered: _,
            } => self.on_subscribed(framework_id, heartbeat_interval_seconds, master_info, now),
            Event::Error { message, fatal } => {
                if fatal {
                    self.finished = true;
                    vec![
                        Action::Finish(Outcome::Aborted),
                        Action::Callback(Callback::Error(message)),
                    ]
                } else {
                    tracing::warn!(%message, "the master reported an error");
                    Vec::new()
                }
            }
            _ if !self.is_subscribed() => {
                tracing::debug!("ignoring an event received before SUBSCRIBED");
                Vec::new()
            }
            Event::Offers { offers } => vec![Action::Callback(Callback::ResourceOffers(offers))],
            Event::Rescind { offer_id } => {
                vec![Action::Callback(Callback::OfferRescinded(offer_id))]
            }
            Event::Update { status } => self.on_update(status),
            Event::Message {
                agent_id,
                executor_id,
                data,
            } => vec![Action::Callback(Callback::FrameworkMessage {
                executor_id,
                agent_id,
                data: data.0,
            })],
            Event::Failure {
                agent_id,
                executor_id: None,
                status: _,
            } => vec![Action::Callback(Callback::AgentLost(agent_id))],
            Event::Failure {
                agent_id,
                executor_id: Some(executor_id),
                status,
            } => vec![Action::Callback(Callback::ExecutorLost {
                executor_id,
                agent_id,
                status,
            })],
            Event::Heartbeat | Event::Unknown => Vec::new(),
        }
    }

    /// A status update from the master: delivered unless the scheduler
    /// has it already.
    fn on_update(&mut self, status: TaskStatus) -> Vec<Action> {
        match self.delivered.check(&status) {
            Verdict::Deliver => vec![Action::Callback(Callback::StatusUpdate(status))],
            Verdict::Repeat { acknowledged } => {
                tracing::debug!(
                    task_id = %status.task_id,
                    uuid = ?status.uuid,
                    acknowledged,
                    "an update delivered before came again; not delivered twice"
                );
                if !acknowledged {
                    // The scheduler's acknowledgement of the first copy
                    // answers this one too.
                    return Vec::new();
                }
                match acknowledgement(&status) {
                    Some(call) => self.send_or_queue(call),
                    None => Vec::new(),
                }
            }
            Verdict::AfterEnd => {
                tracing::debug!(
                    task_id = %status.task_id,
                    state = %status.state,
                    reason = ?status.reason,
                    "the master's word about a task whose end was delivered; not delivered"
                );
                Vec::new()
            }
        }
    }

    fn on_subscribed(
        &mut self,
        framework_id: FrameworkId,
        heartbeat_interval_seconds: f64,
        master: MasterInfo,
        now: Instant,
    ) -> Vec<Action> {
        if !matches!(self.conn, Conn::Subscribing { .. }) {
            tracing::debug!("ignoring a repeated SUBSCRIBED");
            return Vec::new();
        }
        let heartbeat = (heartbeat_interval_seconds.is_finite()
            && heartbeat_interval_seconds > 0.0)
            .then(|| Duration::from_secs_f64(heartbeat_interval_seconds.min(86_400.0)));
        self.conn = Conn::Subscribed {
            heartbeat,
            last_seen: now,
        };
        self.backoff.reset();
        self.framework.id = Some(framework_id.clone());
        let mut actions = vec![Action::FrameworkId(framework_id.clone())];
        actions.push(Action::Callback(if self.subscribed_before {
            Callback::Reregistered { master }
        } else {
            Callback::Registered {
                framework_id,
                master,
            }
        }));
        self.subscribed_before = true;
        actions.extend(self.queued.drain(..).map(Action::Send));
        actions
    }

    /// A user command.
    pub(crate) fn on_command(&mut self, command: Command) -> Vec<Action> {
        if self.finished {
            return Vec::new();
        }
        match command {
            Command::Launch {
                offer_ids,
                tasks,
                filters,
            } => {
                for task in &tasks {
                    self.delivered.launched(&task.task_id);
                }
                if self.is_subscribed() {
                    vec![Action::Send(Call::Launch {
                        offer_ids,
                        tasks,
                        filters,
                    })]
                } else {
                    tracing::info!(
                        tasks = tasks.len(),
                        "dropping a launch made while disconnected: its offers are void"
                    );
                    tasks
                        .into_iter()
                        .map(|task| {
                            let status = dropped_status(task);
                            self.delivered.ended_here(&status);
                            Action::Callback(Callback::StatusUpdate(status))
                        })
                        .collect()
                }
            }
            Command::Decline { offer_ids, filters } => {
                if self.is_subscribed() {
                    vec![Action::Send(Call::Decline { offer_ids, filters })]
                } else {
                    tracing::debug!("dropping a decline made while disconnected");
                    Vec::new()
                }
            }
            Command::Call(call) => {
                if let Call::Launch { tasks, .. } = &call {
                    for task in tasks {
                        self.delivered.launched(&task.task_id);
                    }
                }
                self.send_or_queue(call)
            }
            Command::Acknowledge { status, implicit } => {
                if implicit != self.implicit_acknowledgements {
                    if !implicit {
                        tracing::debug!(
                            task_id = %status.task_id,
                            "ignoring an explicit acknowledgement: the driver acknowledges implicitly"
                        );
                    }
                    return Vec::new();
                }
                match acknowledgement(&status) {
                    Some(call) => {
                        if let Call::Acknowledge { task_id, uuid, .. } = &call {
                            self.delivered.acknowledged(task_id, uuid);
                        }
                        self.send_or_queue(call)
                    }
                    None => Vec::new(),
                }
            }
            Command::Stop { failover } => {
                self.finished = true;
                let mut actions = Vec::new();
                if !failover {
                    if self.is_subscribed() {
                        actions.push(Action::Send(Call::Teardown));
                    } else {
                        tracing::warn!(
                            "stop(false) while disconnected: the master tears the framework \
                             down after its failover timeout"
                        );
                    }
                }
                actions.push(Action::Finish(Outcome::Stopped));
                actions
            }
            Command::Abort => {
                self.finished = true;
                vec![Action::Finish(Outcome::Aborted)]
            }
        }
    }

    /// A clock tick: detect a master that stopped talking.
    pub(crate) fn on_tick(&mut self, now: Instant) -> Vec<Action> {
        if self.finished {
            return Vec::new();
        }
        match self.conn {
            Conn::Subscribing { since }
                if now.saturating_duration_since(since) >= SUBSCRIBE_TIMEOUT =>
            {
                vec![Action::Reconnect(format!(
                    "no SUBSCRIBED within {SUBSCRIBE_TIMEOUT:?}"
                ))]
            }
            Conn::Subscribed {
                heartbeat: Some(interval),
                last_seen,
            } if now.saturating_duration_since(last_seen) >= interval * HEARTBEAT_MISSES => {
                vec![Action::Reconnect(format!(
                    "no frame from the master for {HEARTBEAT_MISSES} heartbeat intervals ({interval:?} each)"
                ))]
            }
            _ => Vec::new(),
        }
    }

    fn touch(&mut self, now: Instant) {
        if let Conn::Subscribed { last_seen, .. } = &mut self.conn {
            *last_seen = now;
        }
    }

    fn send_or_queue(&mut self, call: Call) -> Vec<Action> {
        if self.is_subscribed() {
            return vec![Action::Send(call)];
        }
        if self.queued.len() >= MAX_QUEUED_CALLS {
            tracing::warn!(
                limit = MAX_QUEUED_CALLS,
                "dropping a call: too many calls queued while disconnected"
            );
        } else {
            self.queued.push_back(call);
        }
        Vec::new()
    }
}

/// The `ACKNOWLEDGE` for an update, if it is a reliable one.
pub(crate) fn acknowledgement(status: &TaskStatus) -> Option<Call> {
    let uuid = status.uuid.clone()?;
    let Some(agent_id) = status.agent_id.clone() else {
        tracing::warn!(
            task_id = %status.task_id,
            "cannot acknowledge an update that names no agent"
        );
        return None;
    };
    Some(Call::Acknowledge {
        agent_id,
        task_id: status.task_id.clone(),
        uuid,
    })
}

/// The update the driver makes up for a task of a dropped launch.
fn dropped_status(task: TaskInfo) -> TaskStatus {
    let mut status = TaskStatus::new(task.task_id, TaskState::Dropped, Source::SourceMaster)
        .with_reason(Reason::ReasonInvalidOffers)
        .with_message(DROPPED_MESSAGE);
    status.agent_id = Some(task.agent_id);
    status.executor_id = task.executor.map(|e| e.executor_id);
    status
}

#[cfg(test)]
mod tests {
    use agora_proto::{Resources, TaskId};

    use super::*;

    fn config(implicit: bool) -> DriverConfig {
        let mut config = DriverConfig::new("127.0.0.1:5050");
        config.implicit_acknowledgements = implicit;
        config
    }

    fn master() -> MasterInfo {
        MasterInfo {
            id: "m1".into(),
            address: "127.0.0.1:5050".into(),
            version: "test".into(),
        }
    }

    fn subscribed(id: &str) -> Event {
        Event::Subscribed {
            framework_id: FrameworkId::new(id),
            heartbeat_interval_seconds: 15.0,
            master_info: master(),
            reregistered: false,
        }
    }

    fn task(id: &str) -> TaskInfo {
        TaskInfo {
            container: None,
            allocation_role: None,
            launch_stamp: None,
            name: id.into(),
            task_id: TaskId::new(id),
            agent_id: AgentId::new("a1"),
            resources: Resources::parse("cpus:1").unwrap(),
            executor: None,
            command: None,
            data: None,
            kill_grace_period: None,
            labels: Default::default(),
            task_group: None,
        }
    }

    fn reliable(task: &str, uuid: &str) -> TaskStatus {
        let mut status = TaskStatus::new(
            TaskId::new(task),
            TaskState::Running,
            Source::SourceExecutor,
        );
        status.uuid = Some(uuid.into());
        status.agent_id = Some(AgentId::new("a1"));
        status
    }

    /// A core that has connected and subscribed once as `fw-1`.
    fn subscribed_core(implicit: bool) -> (DriverCore, Instant) {
        let now = Instant::now();
        let mut core = DriverCore::new(FrameworkInfo::new("test"), &config(implicit));
        core.on_connected(now);
        core.on_event(subscribed("fw-1"), now);
        (core, now)
    }

    fn subscribe_call(actions: &[Action]) -> (FrameworkInfo, bool) {
        match actions {
            [Action::Send(Call::Subscribe {
                protocol,
                framework_info,
                force,
            })] => {
                assert_eq!(*protocol, PROTOCOL_VERSION);
                (framework_info.clone(), *force)
            }
            other => panic!("expected one SUBSCRIBE, got {other:?}"),
        }
    }

    #[test]
    fn a_driver_started_with_an_id_takes_the_framework_over() {
        let now = Instant::now();
        let mut info = FrameworkInfo::new("test");
        info.id = Some(FrameworkId::new("fw-1"));
        let mut core = DriverCore::new(info, &config(true));
        let (info, force) = subscribe_call(&core.on_connected(now));
        assert_eq!(info.id, Some(FrameworkId::new("fw-1")));
        assert!(
            force,
            "a failover scheduler replaces a connection the master still holds"
        );
    }

    #[test]
    fn first_subscription_registers() {
        let now = Instant::now();
        let mut core = DriverCore::new(FrameworkInfo::new("test"), &config(true));
        let (info, force) = subscribe_call(&core.on_connected(now));
        assert_eq!(info.id, None);
        assert!(!force);
        assert!(!core.is_subscribed());

        let actions = core.on_event(subscribed("fw-1"), now);
        assert_eq!(
            actions,
            vec![
                Action::FrameworkId(FrameworkId::new("fw-1")),
                Action::Callback(Callback::Registered {
                    framework_id: FrameworkId::new("fw-1"),
                    master: master(),
                }),
            ]
        );
        assert!(core.is_subscribed());
        assert_eq!(core.framework_id(), Some(&FrameworkId::new("fw-1")));
    }

    #[test]
    fn resubscribes_with_framework_id_and_reregisters() {
        let (mut core, now) = subscribed_core(true);
        assert_eq!(
            core.on_disconnected(),
            vec![Action::Callback(Callback::Disconnected)]
        );
        let (info, force) = subscribe_call(&core.on_connected(now));
        assert_eq!(info.id, Some(FrameworkId::new("fw-1")));
        assert!(force, "a re-subscription takes over the old connection");
        let actions = core.on_event(subscribed("fw-1"), now);
        assert_eq!(
            actions[1],
            Action::Callback(Callback::Reregistered { master: master() })
        );
    }

    #[test]
    fn failed_connection_attempts_do_not_repeat_disconnected() {
        let (mut core, now) = subscribed_core(true);
        assert_eq!(core.on_disconnected().len(), 1);
        core.on_connected(now);
        assert!(
            core.on_disconnected().is_empty(),
            "dropping before SUBSCRIBED"
        );
        assert!(core.on_disconnected().is_empty());
    }

    #[test]
    fn calls_made_while_disconnected_are_sent_after_resubscribing() {
        let (mut core, now) = subscribed_core(true);
        core.on_disconnected();
        let kill = Call::Kill {
            task_id: TaskId::new("t1"),
            agent_id: None,
        };
        assert!(core.on_command(Command::Call(kill.clone())).is_empty());
        assert!(core
            .on_command(Command::Call(Call::Revive { roles: vec![] }))
            .is_empty());
        assert_eq!(core.queued_calls(), 2);

        core.on_connected(now);
        // Still not subscribed: keep queueing.
        assert!(core
            .on_command(Command::Call(Call::Reconcile { tasks: vec![] }))
            .is_empty());
        let actions = core.on_event(subscribed("fw-1"), now);
        assert_eq!(
            &actions[2..],
            &[
                Action::Send(kill),
                Action::Send(Call::Revive { roles: vec![] }),
                Action::Send(Call::Reconcile { tasks: vec![] }),
            ]
        );
        assert_eq!(core.queued_calls(), 0);
    }

    #[test]
    fn launch_while_disconnected_is_dropped_with_task_dropped() {
        let (mut core, _) = subscribed_core(true);
        core.on_disconnected();
        let actions = core.on_command(Command::Launch {
            offer_ids: vec![OfferId::new("o1")],
            tasks: vec![task("t1"), task("t2")],
            filters: Filters::default(),
        });
        assert_eq!(actions.len(), 2);
        for (action, id) in actions.iter().zip(["t1", "t2"]) {
            let Action::Callback(Callback::StatusUpdate(status)) = action else {
                panic!("expected a status update, got {action:?}");
            };
            assert_eq!(status.task_id, TaskId::new(id));
            assert_eq!(status.state, TaskState::Dropped);
            assert_eq!(status.source, Source::SourceMaster);
            assert_eq!(status.reason, Some(Reason::ReasonInvalidOffers));
            assert_eq!(status.message.as_deref(), Some(DROPPED_MESSAGE));
            assert_eq!(status.uuid, None, "nothing to acknowledge");
            assert_eq!(status.agent_id, Some(AgentId::new("a1")));
        }
        assert!(core
            .on_command(Command::Decline {
                offer_ids: vec![OfferId::new("o1")],
                filters: Filters::default(),
            })
            .is_empty());
        assert_eq!(
            core.queued_calls(),
            0,
            "launches and declines are not queued"
        );
    }

    #[test]
    fn launch_while_subscribed_is_sent() {
        let (mut core, _) = subscribed_core(true);
        let actions = core.on_command(Command::Launch {
            offer_ids: vec![OfferId::new("o1")],
            tasks: vec![task("t1")],
            filters: Filters::default(),
        });
        assert!(
            matches!(&actions[..], [Action::Send(Call::Launch { tasks, .. })] if tasks.len() == 1)
        );
    }

    #[test]
    fn implicit_mode_acknowledges_after_the_callback_only() {
        let (mut core, _) = subscribed_core(true);
        let status = reliable("t1", "u1");
        let expected = vec![Action::Send(Call::Acknowledge {
            agent_id: AgentId::new("a1"),
            task_id: TaskId::new("t1"),
            uuid: "u1".into(),
        })];
        assert_eq!(
            core.on_command(Command::Acknowledge {
                status: status.clone(),
                implicit: true
            }),
            expected
        );
        assert!(core
            .on_command(Command::Acknowledge {
                status,
                implicit: false
            })
            .is_empty());
    }

    #[test]
    fn explicit_mode_acknowledges_on_request_only() {
        let (mut core, _) = subscribed_core(false);
        let status = reliable("t1", "u1");
        assert!(core
            .on_command(Command::Acknowledge {
                status: status.clone(),
                implicit: true
            })
            .is_empty());
        assert_eq!(
            core.on_command(Command::Acknowledge {
                status,
                implicit: false
            })
            .len(),
            1
        );
    }

    #[test]
    fn updates_without_uuid_are_never_acknowledged() {
        for implicit in [true, false] {
            let (mut core, _) = subscribed_core(implicit);
            let mut status = reliable("t1", "u1");
            status.uuid = None;
            assert!(core
                .on_command(Command::Acknowledge { status, implicit })
                .is_empty());
        }
    }

    #[test]
    fn acknowledgements_made_while_disconnected_are_queued() {
        let (mut core, now) = subscribed_core(true);
        core.on_disconnected();
        core.on_command(Command::Acknowledge {
            status: reliable("t1", "u1"),
            implicit: true,
        });
        core.on_connected(now);
        let actions = core.on_event(subscribed("fw-1"), now);
        assert!(matches!(
            actions.last(),
            Some(Action::Send(Call::Acknowledge { uuid, .. })) if uuid == "u1"
        ));
    }

    fn update(status: TaskStatus) -> Event {
        Event::Update { status }
    }

    fn answer(task: &str, state: TaskState, message: &str) -> TaskStatus {
        let mut status = TaskStatus::new(TaskId::new(task), state, Source::SourceMaster)
            .with_reason(Reason::ReasonReconciliation)
            .with_message(message);
        status.agent_id = Some(AgentId::new("a1"));
        status
    }

    fn delivered(actions: &[Action]) -> Vec<&TaskStatus> {
        actions
            .iter()
            .filter_map(|a| match a {
                Action::Callback(Callback::StatusUpdate(status)) => Some(status),
                _ => None,
            })
            .collect()
    }

    fn acks(actions: &[Action]) -> Vec<&str> {
        actions
            .iter()
            .filter_map(|a| match a {
                Action::Send(Call::Acknowledge { uuid, .. }) => Some(uuid.as_str()),
                _ => None,
            })
            .collect()
    }

    #[test]
    fn a_repeated_uuid_is_delivered_once_even_across_a_new_master() {
        let (mut core, now) = subscribed_core(true);
        let running = reliable("t1", "u1");
        assert_eq!(
            delivered(&core.on_event(update(running.clone()), now)).len(),
            1
        );
        // The copy comes while the first is still in its callback: nothing,
        // the callback's acknowledgement answers both.
        assert!(core.on_event(update(running.clone()), now).is_empty());
        let ack = core.on_command(Command::Acknowledge {
            status: running.clone(),
            implicit: true,
        });
        assert_eq!(acks(&ack), vec!["u1"]);
        // A copy after the acknowledgement (it was lost with the master
        // that took it) is acknowledged again, not delivered.
        let again = core.on_event(update(running.clone()), now);
        assert!(delivered(&again).is_empty());
        assert_eq!(acks(&again), vec!["u1"]);
        // The memory survives a reconnection to another master.
        core.on_disconnected();
        core.on_connected(now);
        core.on_event(subscribed("fw-1"), now);
        let resent = core.on_event(update(running), now);
        assert!(delivered(&resent).is_empty(), "{resent:?}");
        assert_eq!(acks(&resent), vec!["u1"]);
        // The next update of the task is new.
        let mut finished = reliable("t1", "u2");
        finished.state = TaskState::Finished;
        assert_eq!(delivered(&core.on_event(update(finished), now)).len(), 1);
    }

    #[test]
    fn explicit_mode_acknowledges_a_repeat_only_after_the_scheduler_did() {
        let (mut core, now) = subscribed_core(false);
        let running = reliable("t1", "u1");
        assert_eq!(
            delivered(&core.on_event(update(running.clone()), now)).len(),
            1
        );
        assert!(core.on_event(update(running.clone()), now).is_empty());
        core.on_command(Command::Acknowledge {
            status: running.clone(),
            implicit: false,
        });
        assert_eq!(acks(&core.on_event(update(running), now)), vec!["u1"]);
    }

    #[test]
    fn a_reconciliation_answer_after_a_terminal_update_is_not_delivered() {
        let (mut core, now) = subscribed_core(true);
        let launch = |ids: &[&str]| Command::Launch {
            offer_ids: vec![OfferId::new("o1")],
            tasks: ids.iter().map(|id| task(id)).collect(),
            filters: Filters::default(),
        };
        core.on_command(launch(&["t1", "t2"]));
        let mut finished = reliable("t1", "u2");
        finished.state = TaskState::Finished;
        assert_eq!(delivered(&core.on_event(update(finished), now)).len(), 1);
        // The answer to a reconciliation asked before the end arrived, and
        // the answer of a master that has forgotten the task since.
        for late in [
            answer("t1", TaskState::Finished, "reconciliation"),
            answer("t1", TaskState::Lost, "unknown task"),
            answer("t1", TaskState::Running, "reconciliation"),
        ] {
            assert!(core.on_event(update(late), now).is_empty());
        }
        // Answers about a task whose end the scheduler has not seen are
        // delivered, each time it asks, terminal ones included: the
        // master's word ends nothing (it may be about an earlier task with
        // the id), the task's own report does.
        let live = answer("t2", TaskState::Running, "reconciliation");
        let lost = answer("t2", TaskState::Lost, "unknown task");
        for answer in [&live, &live, &lost, &lost] {
            assert_eq!(
                delivered(&core.on_event(update(answer.clone()), now)).len(),
                1
            );
        }
        // Launched again, the id's answers are about the new task.
        core.on_command(launch(&["t1"]));
        let lost = answer("t1", TaskState::Lost, "unknown task");
        assert_eq!(delivered(&core.on_event(update(lost), now)).len(), 1);
    }

    #[test]
    fn a_task_launched_by_an_earlier_scheduler_process_hears_every_answer() {
        // A failover scheduler's driver did not launch t1: the end it is
        // told may be of an earlier launch of the id than its
        // predecessor's last one, so the master's answers go through.
        let (mut core, now) = subscribed_core(true);
        let mut failed = reliable("t1", "u2");
        failed.state = TaskState::Failed;
        assert_eq!(
            delivered(&core.on_event(update(failed.clone()), now)).len(),
            1
        );
        let lost = answer("t1", TaskState::Lost, "unknown task");
        assert_eq!(delivered(&core.on_event(update(lost), now)).len(), 1);
        // Its uuid is still delivered once.
        assert!(delivered(&core.on_event(update(failed), now)).is_empty());
    }

    #[test]
    fn a_launch_dropped_while_disconnected_ends_its_tasks_once() {
        let (mut core, now) = subscribed_core(true);
        core.on_disconnected();
        let dropped = core.on_command(Command::Launch {
            offer_ids: vec![OfferId::new("o1")],
            tasks: vec![task("t1")],
            filters: Filters::default(),
        });
        assert_eq!(delivered(&dropped)[0].state, TaskState::Dropped);
        core.on_connected(now);
        core.on_event(subscribed("fw-1"), now);
        // The master never heard of it.
        let lost = answer("t1", TaskState::Lost, "unknown task");
        assert!(core.on_event(update(lost), now).is_empty());
    }

    #[test]
    fn events_map_to_callbacks() {
        let (mut core, now) = subscribed_core(true);
        let lost = core.on_event(
            Event::Failure {
                agent_id: AgentId::new("a1"),
                executor_id: None,
                status: None,
            },
            now,
        );
        assert_eq!(
            lost,
            vec![Action::Callback(Callback::AgentLost(AgentId::new("a1")))]
        );
        let exited = core.on_event(
            Event::Failure {
                agent_id: AgentId::new("a1"),
                executor_id: Some(ExecutorId::new("e1")),
                status: Some(256),
            },
            now,
        );
        assert_eq!(
            exited,
            vec![Action::Callback(Callback::ExecutorLost {
                executor_id: ExecutorId::new("e1"),
                agent_id: AgentId::new("a1"),
                status: Some(256),
            })]
        );
        assert!(core.on_event(Event::Heartbeat, now).is_empty());
        assert!(core
            .on_event(
                Event::Error {
                    message: "unknown offer".into(),
                    fatal: false
                },
                now
            )
            .is_empty());
        assert!(core.on_frame("{not json", now).is_empty());
        assert!(core
            .on_frame(r#"{"type":"FROM_THE_FUTURE"}"#, now)
            .is_empty());
        assert!(!core.is_finished());
    }

    #[test]
    fn fatal_error_aborts_before_the_error_callback() {
        let (mut core, now) = subscribed_core(true);
        let actions = core.on_event(
            Event::Error {
                message: "framework removed".into(),
                fatal: true,
            },
            now,
        );
        assert_eq!(
            actions,
            vec![
                Action::Finish(Outcome::Aborted),
                Action::Callback(Callback::Error("framework removed".into())),
            ]
        );
        assert!(core.is_finished());
        assert!(core.on_event(Event::Heartbeat, now).is_empty());
        assert!(core.on_command(Command::Abort).is_empty());
    }

    #[test]
    fn stop_without_failover_tears_down() {
        let (mut core, _) = subscribed_core(true);
        assert_eq!(
            core.on_command(Command::Stop { failover: false }),
            vec![
                Action::Send(Call::Teardown),
                Action::Finish(Outcome::Stopped)
            ]
        );
        let (mut core, _) = subscribed_core(true);
        assert_eq!(
            core.on_command(Command::Stop { failover: true }),
            vec![Action::Finish(Outcome::Stopped)]
        );
        let (mut core, _) = subscribed_core(true);
        core.on_disconnected();
        assert_eq!(
            core.on_command(Command::Stop { failover: false }),
            vec![Action::Finish(Outcome::Stopped)]
        );
    }

    #[test]
    fn silent_master_is_dropped_after_three_heartbeats() {
        let (mut core, now) = subscribed_core(true);
        assert!(core.on_tick(now + Duration::from_secs(44)).is_empty());
        core.on_event(Event::Heartbeat, now + Duration::from_secs(30));
        assert!(core.on_tick(now + Duration::from_secs(74)).is_empty());
        assert!(matches!(
            &core.on_tick(now + Duration::from_secs(75))[..],
            [Action::Reconnect(_)]
        ));
    }

    #[test]
    fn unanswered_subscribe_is_retried() {
        let now = Instant::now();
        let mut core = DriverCore::new(FrameworkInfo::new("test"), &config(true));
        core.on_connected(now);
        assert!(core.on_tick(now + Duration::from_secs(1)).is_empty());
        assert!(matches!(
            &core.on_tick(now + SUBSCRIBE_TIMEOUT)[..],
            [Action::Reconnect(_)]
        ));
    }

    #[test]
    fn backoff_doubles_to_the_cap_and_resets_on_subscription() {
        let mut config = config(true);
        config.reconnect_backoff_min = Duration::from_millis(100);
        config.reconnect_backoff_max = Duration::from_millis(350);
        let mut core = DriverCore::new(FrameworkInfo::new("test"), &config);
        let delays: Vec<_> = (0..4).map(|_| core.next_backoff(0.0).as_millis()).collect();
        assert_eq!(delays, vec![100, 200, 350, 350]);
        // The sample takes up to half of each step off.
        assert_eq!(core.next_backoff(0.5), Duration::from_micros(262_500));
        let now = Instant::now();
        core.on_connected(now);
        core.on_event(subscribed("fw-1"), now);
        assert_eq!(core.next_backoff(0.999_999).as_millis(), 50);
        assert_eq!(core.next_backoff(0.0), Duration::from_millis(200));
    }

    #[test]
    fn events_before_subscribed_are_ignored() {
        let now = Instant::now();
        let mut core = DriverCore::new(FrameworkInfo::new("test"), &config(true));
        core.on_connected(now);
        assert!(core
            .on_event(Event::Offers { offers: vec![] }, now)
            .is_empty());
    }
}
