//! The status update manager: one ordered, deduplicated stream of reliable
//! updates per task, of which only the head is in flight to the master.
//!
//! Sans-IO: the agent feeds it updates, acknowledgements, connection
//! changes and the current time, and sends what it returns. The head of a
//! stream is re-sent with exponential backoff (`retry_min` doubling up to
//! `retry_max`, each retry after the first shortened by up to
//! [`RETRY_JITTER`] of its step, chosen by a hash of the update, so the
//! streams of many agents that lost one master do not retry in lockstep)
//! until the master acknowledges exactly that uuid; then the next update
//! becomes the head. A stream ends, and the task may be
//! forgotten, when its terminal update is acknowledged.

use std::collections::VecDeque;
use std::hash::{Hash, Hasher};

use agora_proto::hash::{HashMap, HashSet};
use std::time::Duration;

use agora_discovery::Backoff;
use agora_proto::{FrameworkId, TaskId, TaskStatus};
use tokio::time::Instant;

use crate::wal::ACKED_UUIDS_KEPT;

/// How much of a retry's step its jitter may take off.
pub const RETRY_JITTER: f64 = 0.25;

/// Identifies a stream: the task within its framework.
pub type StreamKey = (FrameworkId, TaskId);

/// Ended streams whose uuids are kept.
pub const ENDED_STREAMS_KEPT: usize = 1024;

/// What happened to an update given to [`StatusUpdateManager::update`].
// Returned once per update and taken apart at once; boxing the update
// would only add an allocation.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone, PartialEq)]
pub enum UpdateOutcome {
    /// Appended; `send` is the update to send now (it became the head
    /// while the master is connected).
    Added {
        /// Send this to the master now.
        send: Option<TaskStatus>,
    },
    /// The stream already has this uuid; nothing changed.
    Duplicate,
    /// The stream already holds a terminal update; this one is dropped.
    AfterTerminal,
    /// The update has no uuid and cannot be streamed.
    MissingUuid,
}

/// What happened to an acknowledgement.
#[derive(Debug, Clone, PartialEq)]
pub enum AckOutcome {
    /// Not the head of a known stream (stale or duplicate): ignored.
    Ignored,
    /// The head was acknowledged.
    Acknowledged {
        /// The acknowledged update.
        acked: Box<TaskStatus>,
        /// The new head, to send now when connected.
        next: Option<Box<TaskStatus>>,
        /// The terminal update was acknowledged: the stream is gone.
        ended: bool,
    },
}

/// All streams of one agent.
#[derive(Debug)]
pub struct StatusUpdateManager {
    streams: HashMap<StreamKey, Stream>,
    /// The uuids of the streams that ended last (at most
    /// [`ENDED_STREAMS_KEPT`], oldest first in `ended_order`): an
    /// executor's late re-send of an update of an ended stream (its
    /// acknowledgement to the executor was lost, or the frame came twice)
    /// is known as such, even once a new task has the id.
    ended: HashMap<StreamKey, HashSet<String>>,
    ended_order: VecDeque<StreamKey>,
    retry_min: Duration,
    retry_max: Duration,
    connected: bool,
    /// No head is due for a retry before this: a lower bound kept as
    /// heads are sent, made exact by each scan in [`Self::due_retries`],
    /// so the caller's timer costs nothing per update.
    retry_hint: Option<Instant>,
}

#[derive(Debug)]
struct Stream {
    pending: VecDeque<TaskStatus>,
    /// Every uuid this stream has taken and not forgotten: the pending
    /// ones and the latest acknowledged ones.
    seen: HashSet<String>,
    /// Acknowledged uuids in `seen`, oldest first; past
    /// [`ACKED_UUIDS_KEPT`] the oldest is forgotten.
    acked: VecDeque<String>,
    terminal: bool,
    /// When the head was last sent and the current backoff.
    in_flight: Option<InFlight>,
    /// The previous head's acknowledgement is not durable yet: the head
    /// waits for [`StatusUpdateManager::release`], so that a restart can
    /// never re-send an older update after a newer one.
    held: bool,
}

#[derive(Debug, Clone, Copy)]
struct InFlight {
    next_retry: Instant,
    backoff: Backoff,
}

// === impl StatusUpdateManager ===

impl StatusUpdateManager {
    /// An empty manager, disconnected from any master.
    pub fn new(retry_min: Duration, retry_max: Duration) -> Self {
        StatusUpdateManager {
            streams: HashMap::default(),
            ended: HashMap::default(),
            ended_order: VecDeque::new(),
            retry_min: retry_min.max(Duration::from_millis(1)),
            retry_max: retry_max.max(retry_min),
            connected: false,
            retry_hint: None,
        }
    }

    /// A head is sent at `now`: its first retry is due `retry_min` later.
    fn first_flight(&mut self, now: Instant) -> InFlight {
        let mut backoff = Backoff::new(self.retry_min, self.retry_max, RETRY_JITTER);
        let next_retry = now + backoff.next_delay(0.0);
        self.retry_hint = Some(self.retry_hint.map_or(next_retry, |h| h.min(next_retry)));
        InFlight {
            next_retry,
            backoff,
        }
    }

    /// Appends `status` to the stream of `(framework_id, status.task_id)`.
    pub fn update(
        &mut self,
        framework_id: &FrameworkId,
        status: TaskStatus,
        now: Instant,
    ) -> UpdateOutcome {
        let Some(uuid) = status.uuid.clone() else {
            return UpdateOutcome::MissingUuid;
        };
        let key = (framework_id.clone(), status.task_id.clone());
        let stream = self.streams.entry(key.clone()).or_insert_with(|| Stream {
            pending: VecDeque::new(),
            seen: HashSet::default(),
            acked: VecDeque::new(),
            terminal: false,
            in_flight: None,
            held: false,
        });
        if stream.seen.contains(&uuid) {
            return UpdateOutcome::Duplicate;
        }
        if stream.terminal {
            return UpdateOutcome::AfterTerminal;
        }
        stream.seen.insert(uuid);
        stream.terminal = status.state.is_terminal();
        stream.pending.push_back(status);
        if !self.connected || stream.in_flight.is_some() || stream.held {
            return UpdateOutcome::Added { send: None };
        }
        let send = stream.pending.front().cloned();
        let flight = self.first_flight(now);
        if let Some(stream) = self.streams.get_mut(&key) {
            stream.in_flight = Some(flight);
        }
        UpdateOutcome::Added { send }
    }

    /// Handles the master's acknowledgement of `uuid` for a task. With
    /// `hold`, the next head is not sent until [`StatusUpdateManager::release`]
    /// (the caller is making the acknowledgement durable first).
    pub fn acknowledge(
        &mut self,
        framework_id: &FrameworkId,
        task_id: &TaskId,
        uuid: &str,
        hold: bool,
        now: Instant,
    ) -> AckOutcome {
        let key = (framework_id.clone(), task_id.clone());
        let Some(stream) = self.streams.get_mut(&key) else {
            return AckOutcome::Ignored;
        };
        if stream.pending.front().and_then(|s| s.uuid.as_deref()) != Some(uuid) {
            return AckOutcome::Ignored;
        }
        let Some(acked) = stream.pending.pop_front() else {
            return AckOutcome::Ignored;
        };
        stream.acked.push_back(uuid.to_string());
        if stream.acked.len() > ACKED_UUIDS_KEPT {
            if let Some(old) = stream.acked.pop_front() {
                stream.seen.remove(&old);
            }
        }
        stream.in_flight = None;
        if stream.pending.is_empty() && stream.terminal {
            self.end_stream(framework_id, task_id);
            return AckOutcome::Acknowledged {
                acked: Box::new(acked),
                next: None,
                ended: true,
            };
        }
        stream.held = hold;
        let next = if self.connected && !hold {
            stream.pending.front().cloned().map(Box::new)
        } else {
            None
        };
        if next.is_some() {
            let flight = self.first_flight(now);
            if let Some(stream) = self.streams.get_mut(&key) {
                stream.in_flight = Some(flight);
            }
        }
        AckOutcome::Acknowledged {
            acked: Box::new(acked),
            next,
            ended: false,
        }
    }

    /// The held stream of a task may go on: returns its head to send now
    /// (when connected and nothing is in flight).
    pub fn release(
        &mut self,
        framework_id: &FrameworkId,
        task_id: &TaskId,
        now: Instant,
    ) -> Option<TaskStatus> {
        let key = (framework_id.clone(), task_id.clone());
        let stream = self.streams.get_mut(&key)?;
        stream.held = false;
        if !self.connected || stream.in_flight.is_some() {
            return None;
        }
        let head = stream.pending.front().cloned()?;
        let flight = self.first_flight(now);
        if let Some(stream) = self.streams.get_mut(&key) {
            stream.in_flight = Some(flight);
        }
        Some(head)
    }

    /// The agent (re-)registered: every head is to be sent at once.
    pub fn connected(&mut self, now: Instant) -> Vec<(FrameworkId, TaskStatus)> {
        self.connected = true;
        let flight = self.first_flight(now);
        let mut out = Vec::new();
        for ((framework_id, _), stream) in self.streams.iter_mut() {
            if stream.held {
                continue;
            }
            if let Some(head) = stream.pending.front() {
                stream.in_flight = Some(flight);
                out.push((framework_id.clone(), head.clone()));
            }
        }
        out
    }

    /// The master connection dropped: nothing is in flight any more.
    pub fn disconnected(&mut self) {
        self.connected = false;
        self.retry_hint = None;
        for stream in self.streams.values_mut() {
            stream.in_flight = None;
        }
    }

    /// Heads whose retry time has come; their backoff doubles.
    pub fn due_retries(&mut self, now: Instant) -> Vec<(FrameworkId, TaskStatus)> {
        if !self.connected || self.retry_hint.is_none_or(|hint| hint > now) {
            return Vec::new();
        }
        let mut out = Vec::new();
        let mut earliest: Option<Instant> = None;
        for ((framework_id, task_id), stream) in self.streams.iter_mut() {
            let (Some(flight), Some(head)) = (stream.in_flight.as_mut(), stream.pending.front())
            else {
                continue;
            };
            if flight.next_retry <= now {
                let sample = jitter_sample(framework_id, task_id, head, flight.backoff.step());
                flight.next_retry = now + flight.backoff.next_delay(sample);
                out.push((framework_id.clone(), head.clone()));
            }
            earliest = Some(earliest.map_or(flight.next_retry, |e| e.min(flight.next_retry)));
        }
        self.retry_hint = earliest;
        out
    }

    /// When [`Self::due_retries`] should next be called: no retry is due
    /// before it (it may come early, never late). O(1).
    pub fn next_retry(&self) -> Option<Instant> {
        self.retry_hint
    }

    /// Unacknowledged updates of a task, oldest first.
    pub fn pending(&self, framework_id: &FrameworkId, task_id: &TaskId) -> Vec<TaskStatus> {
        self.streams
            .get(&(framework_id.clone(), task_id.clone()))
            .map(|s| s.pending.iter().cloned().collect())
            .unwrap_or_default()
    }

    /// Whether the stream of a task exists (it has not ended).
    pub fn has_stream(&self, framework_id: &FrameworkId, task_id: &TaskId) -> bool {
        self.streams
            .contains_key(&(framework_id.clone(), task_id.clone()))
    }

    /// Whether the stream already took an update with this uuid, or one
    /// of the last ended streams of the task id did.
    pub fn has_uuid(&self, framework_id: &FrameworkId, task_id: &TaskId, uuid: &str) -> bool {
        let key = (framework_id.clone(), task_id.clone());
        self.streams
            .get(&key)
            .is_some_and(|s| s.seen.contains(uuid))
            || self.ended.get(&key).is_some_and(|seen| seen.contains(uuid))
    }

    /// Drops one task's stream, whatever it still holds; its uuids are
    /// kept a while (see [`StatusUpdateManager::has_uuid`]).
    pub fn end_stream(&mut self, framework_id: &FrameworkId, task_id: &TaskId) {
        let key = (framework_id.clone(), task_id.clone());
        let Some(stream) = self.streams.remove(&key) else {
            return;
        };
        if self.ended.insert(key.clone(), stream.seen).is_none() {
            self.ended_order.push_back(key);
        }
        while self.ended_order.len() > ENDED_STREAMS_KEPT {
            if let Some(old) = self.ended_order.pop_front() {
                self.ended.remove(&old);
            }
        }
    }

    /// Drops every stream of a framework (it is gone) or of all (`None`).
    pub fn forget(&mut self, framework_id: Option<&FrameworkId>) {
        match framework_id {
            Some(fid) => {
                self.streams.retain(|(f, _), _| f != fid);
                self.ended.retain(|(f, _), _| f != fid);
                self.ended_order.retain(|(f, _)| f != fid);
            }
            None => {
                self.streams.clear();
                self.ended.clear();
                self.ended_order.clear();
            }
        }
    }

    /// Rebuilds a stream from a checkpoint: `seen` are all uuids the stream
    /// took, `pending` the unacknowledged ones in order.
    pub fn restore(
        &mut self,
        framework_id: &FrameworkId,
        task_id: &TaskId,
        seen: HashSet<String>,
        pending: Vec<TaskStatus>,
        terminal: bool,
    ) {
        if pending.is_empty() && terminal {
            return;
        }
        self.streams.insert(
            (framework_id.clone(), task_id.clone()),
            Stream {
                pending: pending.into(),
                seen,
                acked: VecDeque::new(),
                terminal,
                in_flight: None,
                held: false,
            },
        );
    }

    /// Number of live streams.
    pub fn len(&self) -> usize {
        self.streams.len()
    }

    /// Whether there are no live streams.
    pub fn is_empty(&self) -> bool {
        self.streams.is_empty()
    }
}

/// A uniform sample in `[0, 1)` for a retry's jitter, from the update
/// and the retry's step: deterministic (a replay retries at the same
/// times), different from stream to stream and from agent to agent.
fn jitter_sample(
    framework_id: &FrameworkId,
    task_id: &TaskId,
    head: &TaskStatus,
    step: Duration,
) -> f64 {
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    (framework_id, task_id, &head.uuid, step).hash(&mut hasher);
    (hasher.finish() >> 11) as f64 / (1u64 << 53) as f64
}

#[cfg(test)]
mod tests {
    use super::*;
    use agora_proto::{Source, TaskState};

    fn st(task: &str, state: TaskState, uuid: &str) -> TaskStatus {
        let mut s = TaskStatus::new(TaskId::new(task), state, Source::SourceExecutor);
        s.uuid = Some(uuid.to_string());
        s
    }

    fn uuid_of<S: std::borrow::Borrow<TaskStatus>>(s: &Option<S>) -> Option<&str> {
        s.as_ref().and_then(|s| s.borrow().uuid.as_deref())
    }

    fn mgr() -> StatusUpdateManager {
        StatusUpdateManager::new(Duration::from_secs(10), Duration::from_secs(600))
    }

    #[test]
    fn only_head_in_flight_and_order_kept() {
        let f = FrameworkId::new("f");
        let t0 = Instant::now();
        let mut m = mgr();
        assert!(m.connected(t0).is_empty());
        let out = m.update(&f, st("t", TaskState::Running, "u1"), t0);
        assert_eq!(
            out,
            UpdateOutcome::Added {
                send: Some(st_like(&out))
            }
        );
        // Second update queues behind the head.
        assert_eq!(
            m.update(&f, st("t", TaskState::Finished, "u2"), t0),
            UpdateOutcome::Added { send: None }
        );
        // Another task's stream is independent.
        match m.update(&f, st("other", TaskState::Running, "x1"), t0) {
            UpdateOutcome::Added { send } => assert_eq!(uuid_of(&send), Some("x1")),
            o => panic!("{o:?}"),
        }
        match m.acknowledge(&f, &TaskId::new("t"), "u1", false, t0) {
            AckOutcome::Acknowledged { next, ended, .. } => {
                assert_eq!(uuid_of(&next), Some("u2"));
                assert!(!ended);
            }
            o => panic!("{o:?}"),
        }
        match m.acknowledge(&f, &TaskId::new("t"), "u2", false, t0) {
            AckOutcome::Acknowledged { next, ended, .. } => {
                assert!(next.is_none());
                assert!(ended);
            }
            o => panic!("{o:?}"),
        }
        assert!(!m.has_stream(&f, &TaskId::new("t")));
        assert_eq!(m.len(), 1);
    }

    fn st_like(out: &UpdateOutcome) -> TaskStatus {
        match out {
            UpdateOutcome::Added { send: Some(s) } => s.clone(),
            o => panic!("{o:?}"),
        }
    }

    #[test]
    fn dedupe_by_uuid_and_after_terminal() {
        let f = FrameworkId::new("f");
        let t0 = Instant::now();
        let mut m = mgr();
        assert!(matches!(
            m.update(&f, st("t", TaskState::Running, "u1"), t0),
            UpdateOutcome::Added { send: None }
        ));
        assert_eq!(
            m.update(&f, st("t", TaskState::Running, "u1"), t0),
            UpdateOutcome::Duplicate
        );
        m.update(&f, st("t", TaskState::Failed, "u2"), t0);
        assert_eq!(
            m.update(&f, st("t", TaskState::Finished, "u3"), t0),
            UpdateOutcome::AfterTerminal
        );
        let mut no_uuid = st("t", TaskState::Running, "x");
        no_uuid.uuid = None;
        assert_eq!(m.update(&f, no_uuid, t0), UpdateOutcome::MissingUuid);
        assert_eq!(m.pending(&f, &TaskId::new("t")).len(), 2);
        // Even after the head is acknowledged, its uuid is still a duplicate.
        m.connected(t0);
        m.acknowledge(&f, &TaskId::new("t"), "u1", false, t0);
        assert_eq!(
            m.update(&f, st("t", TaskState::Running, "u1"), t0),
            UpdateOutcome::Duplicate
        );
    }

    #[test]
    fn ack_of_non_head_is_ignored() {
        let f = FrameworkId::new("f");
        let t0 = Instant::now();
        let mut m = mgr();
        m.connected(t0);
        m.update(&f, st("t", TaskState::Running, "u1"), t0);
        m.update(&f, st("t", TaskState::Finished, "u2"), t0);
        assert_eq!(
            m.acknowledge(&f, &TaskId::new("t"), "u2", false, t0),
            AckOutcome::Ignored
        );
        assert_eq!(
            m.acknowledge(&f, &TaskId::new("nope"), "u1", false, t0),
            AckOutcome::Ignored
        );
        assert_eq!(m.pending(&f, &TaskId::new("t")).len(), 2);
        assert!(matches!(
            m.acknowledge(&f, &TaskId::new("t"), "u1", false, t0),
            AckOutcome::Acknowledged { .. }
        ));
        // A repeated ack of the old head is ignored too.
        assert_eq!(
            m.acknowledge(&f, &TaskId::new("t"), "u1", false, t0),
            AckOutcome::Ignored
        );
    }

    #[test]
    fn a_long_stream_remembers_only_its_latest_acknowledged_uuids() {
        let f = FrameworkId::new("f");
        let t = TaskId::new("t");
        let t0 = Instant::now();
        let mut m = mgr();
        m.connected(t0);
        let n = ACKED_UUIDS_KEPT + 100;
        for i in 0..n {
            let uuid = format!("u{i}");
            m.update(&f, st("t", TaskState::Running, &uuid), t0);
            assert!(matches!(
                m.acknowledge(&f, &t, &uuid, false, t0),
                AckOutcome::Acknowledged { .. }
            ));
        }
        let stream = &m.streams[&(f.clone(), t.clone())];
        assert_eq!(stream.seen.len(), ACKED_UUIDS_KEPT);
        // A re-send of a recent update is still recognised...
        let recent = format!("u{}", n - ACKED_UUIDS_KEPT);
        assert_eq!(
            m.update(&f, st("t", TaskState::Running, &recent), t0),
            UpdateOutcome::Duplicate
        );
        // ...one from more than ACKED_UUIDS_KEPT acknowledgements ago is not.
        assert!(matches!(
            m.update(&f, st("t", TaskState::Running, "u0"), t0),
            UpdateOutcome::Added { .. }
        ));
    }

    /// Ends the stream of task `task` with one terminal update, `uuid`,
    /// acknowledged by the master.
    fn end_with(m: &mut StatusUpdateManager, f: &FrameworkId, task: &str, uuid: &str) {
        let t0 = Instant::now();
        m.update(f, st(task, TaskState::Finished, uuid), t0);
        match m.acknowledge(f, &TaskId::new(task), uuid, false, t0) {
            AckOutcome::Acknowledged { ended, .. } => assert!(ended),
            o => panic!("{o:?}"),
        }
    }

    #[test]
    fn the_uuids_of_an_ended_stream_stay_known_to_a_new_stream_of_its_task_id() {
        let f = FrameworkId::new("f");
        let t = TaskId::new("t");
        let t0 = Instant::now();
        let mut m = mgr();
        m.connected(t0);
        m.update(&f, st("t", TaskState::Running, "u1"), t0);
        m.acknowledge(&f, &t, "u1", false, t0);
        end_with(&mut m, &f, "t", "u2");
        assert!(!m.has_stream(&f, &t));
        assert!(m.has_uuid(&f, &t, "u1") && m.has_uuid(&f, &t, "u2"));
        // A new task with the id: its own uuids and the ended ones are
        // known, for that task id only.
        m.update(&f, st("t", TaskState::Running, "v1"), t0);
        assert!(m.has_uuid(&f, &t, "v1"));
        assert!(m.has_uuid(&f, &t, "u2"));
        assert!(!m.has_uuid(&f, &TaskId::new("other"), "u2"));
        assert!(!m.has_uuid(&FrameworkId::new("g"), &t, "u2"));
        // A stream dropped unfinished (its task id was reused) keeps its
        // uuids too, pending ones included.
        m.update(&f, st("s", TaskState::Running, "s1"), t0);
        m.end_stream(&f, &TaskId::new("s"));
        assert!(!m.has_stream(&f, &TaskId::new("s")));
        assert!(m.has_uuid(&f, &TaskId::new("s"), "s1"));
        // A framework that is gone takes its ended streams along.
        m.forget(Some(&f));
        assert!(!m.has_uuid(&f, &t, "u2"));
        assert!(!m.has_uuid(&f, &TaskId::new("s"), "s1"));
    }

    #[test]
    fn only_the_latest_ended_streams_keep_their_uuids() {
        let f = FrameworkId::new("f");
        let t0 = Instant::now();
        let mut m = mgr();
        m.connected(t0);
        for i in 0..ENDED_STREAMS_KEPT + 10 {
            end_with(&mut m, &f, &format!("t{i}"), &format!("u{i}"));
        }
        assert_eq!(m.len(), 0);
        assert_eq!(m.ended.len(), ENDED_STREAMS_KEPT);
        assert_eq!(m.ended_order.len(), ENDED_STREAMS_KEPT);
        // The ten oldest are forgotten, the rest are known.
        for i in 0..ENDED_STREAMS_KEPT + 10 {
            let known = m.has_uuid(&f, &TaskId::new(format!("t{i}")), &format!("u{i}"));
            assert_eq!(known, i >= 10, "stream t{i}");
        }
        // A task id that ends again counts once.
        end_with(&mut m, &f, "t100", "again");
        assert_eq!(m.ended.len(), ENDED_STREAMS_KEPT);
        assert_eq!(m.ended_order.len(), ENDED_STREAMS_KEPT);
        assert!(m.has_uuid(&f, &TaskId::new("t100"), "again"));
    }

    #[test]
    fn retry_backoff_doubles_to_cap() {
        let f = FrameworkId::new("f");
        let t0 = Instant::now();
        let mut m = StatusUpdateManager::new(Duration::from_secs(10), Duration::from_secs(35));
        m.connected(t0);
        m.update(&f, st("t", TaskState::Running, "u1"), t0);
        assert_eq!(m.next_retry(), Some(t0 + Duration::from_secs(10)));
        assert!(m.due_retries(t0 + Duration::from_secs(9)).is_empty());
        let mut now = t0 + Duration::from_secs(10);
        let mut intervals = Vec::new();
        for _ in 0..4 {
            let due = m.due_retries(now);
            assert_eq!(due.len(), 1);
            assert_eq!(due[0].1.uuid.as_deref(), Some("u1"));
            let next = m.next_retry().unwrap();
            intervals.push(next - now);
            now = next;
        }
        // Steps of 20, 35, 35, 35 s, each less up to a quarter (jitter).
        for (interval, step) in intervals.iter().zip([20, 35, 35, 35]) {
            let step = Duration::from_secs(step);
            assert!(
                *interval <= step && *interval >= step.mul_f64(1.0 - RETRY_JITTER),
                "{intervals:?}"
            );
        }
        // Ack resets: the next head starts at retry_min again.
        m.update(&f, st("t", TaskState::Finished, "u2"), now);
        m.acknowledge(&f, &TaskId::new("t"), "u1", false, now);
        assert!(m
            .next_retry()
            .is_some_and(|t| t <= now + Duration::from_secs(10)));
        assert!(m.due_retries(now + Duration::from_secs(9)).is_empty());
        let due = m.due_retries(now + Duration::from_secs(10));
        assert_eq!(due.len(), 1);
        assert_eq!(due[0].1.uuid.as_deref(), Some("u2"));
        let next = m.next_retry().unwrap();
        assert!(next <= now + Duration::from_secs(30) && next >= now + Duration::from_secs(25));
    }

    #[test]
    fn retries_of_many_streams_spread_out() {
        // 100 streams whose heads were sent at the same instant (an agent
        // re-registered): the first retry is together, the later ones
        // spread over a quarter of their step.
        let f = FrameworkId::new("f");
        let t0 = Instant::now();
        let mut m = StatusUpdateManager::new(Duration::from_secs(10), Duration::from_secs(600));
        for i in 0..100 {
            m.update(
                &f,
                st(&format!("t{i}"), TaskState::Running, &format!("u{i}")),
                t0,
            );
        }
        assert_eq!(m.connected(t0).len(), 100);
        let first = t0 + Duration::from_secs(10);
        assert_eq!(m.due_retries(first).len(), 100);
        let mut times = Vec::new();
        while times.len() < 100 {
            let now = m.next_retry().unwrap();
            for _ in m.due_retries(now) {
                times.push(now - first);
            }
        }
        times.sort();
        times.dedup();
        assert!(times.len() > 90, "{} distinct retry times", times.len());
        assert!(
            times[0] >= Duration::from_secs(15)
                && *times.last().unwrap() <= Duration::from_secs(20)
        );
        // The same inputs give the same times (a replay is exact).
        let sample = |uuid: &str| {
            let head = st("t", TaskState::Running, uuid);
            jitter_sample(&f, &TaskId::new("t"), &head, Duration::from_secs(20))
        };
        assert_eq!(sample("a"), sample("a"));
        assert_ne!(sample("a"), sample("b"));
    }

    #[test]
    fn registration_sends_all_heads_and_disconnect_stops_retries() {
        let f = FrameworkId::new("f");
        let t0 = Instant::now();
        let mut m = mgr();
        m.update(&f, st("a", TaskState::Running, "a1"), t0);
        m.update(&f, st("a", TaskState::Finished, "a2"), t0);
        m.update(&f, st("b", TaskState::Running, "b1"), t0);
        assert_eq!(m.next_retry(), None);
        let mut heads: Vec<_> = m
            .connected(t0)
            .into_iter()
            .map(|(_, s)| s.uuid.unwrap())
            .collect();
        heads.sort();
        assert_eq!(heads, vec!["a1", "b1"]);
        m.disconnected();
        assert_eq!(m.next_retry(), None);
        assert!(m.due_retries(t0 + Duration::from_secs(3600)).is_empty());
        // While disconnected an ack still advances the stream but sends nothing.
        match m.acknowledge(&f, &TaskId::new("a"), "a1", false, t0) {
            AckOutcome::Acknowledged { next, .. } => assert!(next.is_none()),
            o => panic!("{o:?}"),
        }
        assert_eq!(m.connected(t0).len(), 2);
    }

    #[test]
    fn held_head_waits_for_release() {
        let f = FrameworkId::new("f");
        let t = TaskId::new("t");
        let t0 = Instant::now();
        let mut m = mgr();
        m.connected(t0);
        m.update(&f, st("t", TaskState::Running, "u1"), t0);
        m.update(&f, st("t", TaskState::Finished, "u2"), t0);
        match m.acknowledge(&f, &t, "u1", true, t0) {
            AckOutcome::Acknowledged { next, .. } => assert!(next.is_none()),
            o => panic!("{o:?}"),
        }
        // Neither retries nor a re-registration send the held head.
        assert!(m.due_retries(t0 + Duration::from_secs(3600)).is_empty());
        assert_eq!(m.next_retry(), None, "the scan found nothing in flight");
        assert!(m.connected(t0).is_empty());
        assert_eq!(m.release(&f, &t, t0).unwrap().uuid.as_deref(), Some("u2"));
        assert!(m.release(&f, &t, t0).is_none(), "already in flight");
        assert_eq!(m.next_retry(), Some(t0 + Duration::from_secs(10)));
    }

    #[test]
    fn restore_rebuilds_pending() {
        let f = FrameworkId::new("f");
        let t0 = Instant::now();
        let mut m = mgr();
        let seen: HashSet<String> = ["u1".to_string(), "u2".to_string()].into_iter().collect();
        m.restore(
            &f,
            &TaskId::new("t"),
            seen,
            vec![st("t", TaskState::Finished, "u2")],
            true,
        );
        assert_eq!(
            m.update(&f, st("t", TaskState::Running, "u1"), t0),
            UpdateOutcome::Duplicate
        );
        assert_eq!(m.connected(t0).len(), 1);
        m.restore(&f, &TaskId::new("done"), HashSet::default(), vec![], true);
        assert!(!m.has_stream(&f, &TaskId::new("done")));
    }
}
