//! What the driver has delivered to the [`crate::Scheduler`], so that it
//! delivers each status update once.
//!
//! The master forwards a reliable update at least once: again to a
//! scheduler that re-subscribes before its acknowledgement arrived, again
//! when a new master (after a failover) gets it from the agent's retry.
//! And it answers reconciliation with the state it knows, which for a task
//! whose end the driver delivered is that end again or, once the master
//! has forgotten the task, `TASK_LOST`. [`Delivered`] remembers, for the
//! latest [`DriverConfig::remembered_tasks`](crate::DriverConfig::remembered_tasks)
//! tasks, the uuids of the updates delivered (the last
//! [`UUIDS_KEPT_PER_TASK`]), whether the scheduler acknowledged each, and
//! whether the task ended. It lives as long as the driver: reconnections
//! and master failovers keep it, a new scheduler process starts without
//! it.
//!
//! A task ends here only by what is certainly about the task this driver
//! launched with the id last: its own terminal report (an update with a
//! uuid, from its executor or agent) whose launch stamp is no older than
//! any other update of the id delivered, and newer than any delivered
//! before that launch (an agent whose damaged log lost a later launch may
//! report an earlier one, stamped as such), or a launch the driver dropped
//! itself. The master's word (no uuid) may be about an earlier task with
//! the id (an answer made before the master took the new launch, or about
//! a launch by an earlier scheduler process), so it is delivered as Mesos
//! delivers it and ends nothing here.

use std::collections::VecDeque;

use agora_proto::hash::HashMap;
use agora_proto::{LaunchStamp, TaskId, TaskStatus};

/// Uuids of delivered updates kept per task. Only the head of a task's
/// update stream travels, so a repeat is of one of the task's latest
/// updates.
pub(crate) const UUIDS_KEPT_PER_TASK: usize = 8;

/// What to do with an update from the master.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// Not delivered before: deliver it (it is now remembered).
    Deliver,
    /// A reliable update delivered before. When the scheduler has
    /// acknowledged the first copy, the copy is acknowledged again (that
    /// acknowledgement may have been lost with a connection or a master);
    /// otherwise the scheduler's acknowledgement is still to come.
    Repeat { acknowledged: bool },
    /// The master's word (no uuid: a reconciliation answer, a kill's
    /// answer, `TASK_LOST`) about a task that ended here: the scheduler
    /// has its end already.
    AfterEnd,
}

/// The memory of delivered updates, bounded to `capacity` tasks: when it
/// is full the task remembered longest ago (since its launch, its first
/// delivery or its end, whichever was last) is forgotten.
#[derive(Debug)]
pub(crate) struct Delivered {
    tasks: HashMap<TaskId, Record>,
    /// Tasks in the order they were (re)stamped, oldest first; an entry
    /// whose stamp is not its task's current one is stale and skipped.
    order: VecDeque<(TaskId, u64)>,
    capacity: usize,
    next_stamp: u64,
}

#[derive(Debug)]
struct Record {
    /// Delivered uuids, oldest first, and whether each was acknowledged.
    uuids: VecDeque<(String, bool)>,
    /// This driver launched the id.
    launched_here: bool,
    /// The newest launch stamp of the id's delivered updates...
    newest_stamp: Option<LaunchStamp>,
    /// ...and what it was when this driver last launched the id.
    stamp_before_launch: Option<LaunchStamp>,
    /// The task this driver launched ended (see the module's comment).
    ended: bool,
    stamp: u64,
}

// === impl Delivered ===

impl Delivered {
    /// An empty memory of at most `capacity` tasks (at least one).
    pub(crate) fn new(capacity: usize) -> Self {
        Delivered {
            tasks: HashMap::default(),
            order: VecDeque::new(),
            capacity: capacity.max(1),
            next_stamp: 0,
        }
    }

    /// Whether to deliver `status`; one to deliver is remembered.
    pub(crate) fn check(&mut self, status: &TaskStatus) -> Verdict {
        if let Some(record) = self.tasks.get(&status.task_id) {
            match &status.uuid {
                Some(uuid) => {
                    if let Some((_, acknowledged)) = record.uuids.iter().find(|(u, _)| u == uuid) {
                        return Verdict::Repeat {
                            acknowledged: *acknowledged,
                        };
                    }
                }
                None if record.ended => return Verdict::AfterEnd,
                None => {}
            }
        }
        let record = self.record(&status.task_id);
        if let Some(uuid) = &status.uuid {
            record.uuids.push_back((uuid.clone(), false));
            if record.uuids.len() > UUIDS_KEPT_PER_TASK {
                record.uuids.pop_front();
            }
            let current = match status.launch_stamp {
                Some(stamp) => {
                    record.newest_stamp.is_none_or(|newest| stamp >= newest)
                        && record
                            .stamp_before_launch
                            .is_none_or(|before| stamp > before)
                }
                None => record.newest_stamp.is_none(),
            };
            record.newest_stamp = record.newest_stamp.max(status.launch_stamp);
            if status.state.is_terminal() && record.launched_here && current && !record.ended {
                self.end(&status.task_id);
            }
        }
        self.evict();
        Verdict::Deliver
    }

    /// The scheduler acknowledged the update `uuid` of `task_id`.
    pub(crate) fn acknowledged(&mut self, task_id: &TaskId, uuid: &str) {
        if let Some((_, acknowledged)) = self
            .tasks
            .get_mut(task_id)
            .and_then(|r| r.uuids.iter_mut().find(|(u, _)| u == uuid))
        {
            *acknowledged = true;
        }
    }

    /// The scheduler launches `task_id` (again): the end of an earlier
    /// task with the id is not this one's. Uuids delivered stay known: a
    /// late copy of the earlier task's update is still a repeat.
    pub(crate) fn launched(&mut self, task_id: &TaskId) {
        let record = self.record(task_id);
        record.launched_here = true;
        record.ended = false;
        record.stamp_before_launch = record.newest_stamp;
        self.evict();
    }

    /// The driver itself ended a task it launched (a launch it dropped
    /// while disconnected) and delivers `status`, which says so.
    pub(crate) fn ended_here(&mut self, status: &TaskStatus) {
        self.launched(&status.task_id);
        self.end(&status.task_id);
    }

    /// Tasks remembered.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.tasks.len()
    }

    /// The record of `task_id`, made (as the newest) if there is none.
    fn record(&mut self, task_id: &TaskId) -> &mut Record {
        self.next_stamp += 1;
        let stamp = self.next_stamp;
        let order = &mut self.order;
        self.tasks.entry(task_id.clone()).or_insert_with(|| {
            order.push_back((task_id.clone(), stamp));
            Record {
                uuids: VecDeque::new(),
                launched_here: false,
                newest_stamp: None,
                stamp_before_launch: None,
                ended: false,
                stamp,
            }
        })
    }

    /// The task ended: remembered from now on, since what follows an end
    /// is what must not be delivered.
    fn end(&mut self, task_id: &TaskId) {
        self.next_stamp += 1;
        let stamp = self.next_stamp;
        if let Some(record) = self.tasks.get_mut(task_id) {
            record.ended = true;
            record.stamp = stamp;
            self.order.push_back((task_id.clone(), stamp));
        }
    }

    /// Forgets the oldest tasks beyond the capacity; keeps the order
    /// queue within twice the capacity (beyond it, the oldest entries go
    /// whether stale or not).
    fn evict(&mut self) {
        while self.tasks.len() > self.capacity || self.order.len() > 2 * self.capacity {
            let Some((task_id, stamp)) = self.order.pop_front() else {
                break;
            };
            if self.tasks.get(&task_id).is_some_and(|r| r.stamp == stamp) {
                self.tasks.remove(&task_id);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use agora_proto::{Reason, Source, TaskState};

    use super::*;

    fn reliable(task: &str, state: TaskState, uuid: &str) -> TaskStatus {
        let mut status = TaskStatus::new(TaskId::new(task), state, Source::SourceExecutor);
        status.uuid = Some(uuid.into());
        status
    }

    fn answer(task: &str, state: TaskState) -> TaskStatus {
        TaskStatus::new(TaskId::new(task), state, Source::SourceMaster)
            .with_reason(Reason::ReasonReconciliation)
    }

    fn launched(tasks: &[&str]) -> Delivered {
        let mut d = Delivered::new(10);
        for task in tasks {
            d.launched(&TaskId::new(*task));
        }
        d
    }

    #[test]
    fn a_uuid_is_delivered_once_and_acknowledged_again_once_acknowledged() {
        let mut d = launched(&["t"]);
        let running = reliable("t", TaskState::Running, "u1");
        assert_eq!(d.check(&running), Verdict::Deliver);
        assert_eq!(
            d.check(&running),
            Verdict::Repeat {
                acknowledged: false
            }
        );
        d.acknowledged(&TaskId::new("t"), "u1");
        assert_eq!(d.check(&running), Verdict::Repeat { acknowledged: true });
        // Another task's update with the same uuid is its own, launched
        // here or not.
        assert_eq!(
            d.check(&reliable("other", TaskState::Running, "u1")),
            Verdict::Deliver
        );
        assert!(matches!(
            d.check(&reliable("other", TaskState::Running, "u1")),
            Verdict::Repeat { .. }
        ));
    }

    #[test]
    fn after_its_own_end_a_task_launched_here_hears_nothing_without_a_uuid() {
        let mut d = launched(&["t", "s"]);
        assert_eq!(d.check(&answer("t", TaskState::Running)), Verdict::Deliver);
        assert_eq!(
            d.check(&answer("t", TaskState::Running)),
            Verdict::Deliver,
            "answers about a live task are each delivered"
        );
        assert_eq!(
            d.check(&reliable("t", TaskState::Finished, "u2")),
            Verdict::Deliver
        );
        assert_eq!(
            d.check(&answer("t", TaskState::Finished)),
            Verdict::AfterEnd
        );
        assert_eq!(d.check(&answer("t", TaskState::Lost)), Verdict::AfterEnd);
        // An end the master made (TASK_LOST of an agent that may come
        // back) ends nothing here: the master's words may be about an
        // earlier task of the id; the task's own report follows it.
        assert_eq!(d.check(&answer("s", TaskState::Lost)), Verdict::Deliver);
        assert_eq!(d.check(&answer("s", TaskState::Lost)), Verdict::Deliver);
        assert_eq!(
            d.check(&reliable("s", TaskState::Finished, "s1")),
            Verdict::Deliver
        );
        assert_eq!(d.check(&answer("s", TaskState::Lost)), Verdict::AfterEnd);
        // Launched again, the id's end is to come; a late copy of the
        // earlier task's end is still a repeat.
        d.launched(&TaskId::new("t"));
        assert_eq!(d.check(&answer("t", TaskState::Finished)), Verdict::Deliver);
        assert!(matches!(
            d.check(&reliable("t", TaskState::Finished, "u2")),
            Verdict::Repeat { .. }
        ));
        assert_eq!(
            d.check(&reliable("t", TaskState::Failed, "v2")),
            Verdict::Deliver
        );
        assert_eq!(d.check(&answer("t", TaskState::Failed)), Verdict::AfterEnd);
        // A launch the driver dropped ends for sure.
        let mut dropped = answer("t", TaskState::Dropped);
        dropped.reason = Some(Reason::ReasonInvalidOffers);
        d.ended_here(&dropped);
        assert_eq!(d.check(&answer("t", TaskState::Lost)), Verdict::AfterEnd);
    }

    #[test]
    fn an_older_launchs_report_does_not_end_the_newer_launch() {
        let stamped = |state, uuid: &str, seq| {
            let mut status = reliable("t", state, uuid);
            status.launch_stamp = Some(LaunchStamp { epoch: 1, seq });
            status
        };
        let mut d = launched(&["t"]);
        d.check(&stamped(TaskState::Running, "a1", 1));
        d.check(&stamped(TaskState::Finished, "a2", 1));
        d.launched(&TaskId::new("t"));
        // An agent whose damaged log lost launch 2 reports launch 1 again
        // under a new uuid: delivered (the scheduler tells by the stamp),
        // but launch 2 has not ended.
        assert_eq!(
            d.check(&stamped(TaskState::Failed, "a3", 1)),
            Verdict::Deliver
        );
        assert_eq!(d.check(&answer("t", TaskState::Lost)), Verdict::Deliver);
        // Nor does one older than what launch 2 already said.
        d.check(&stamped(TaskState::Running, "b1", 2));
        d.launched(&TaskId::new("u"));
        assert_eq!(d.check(&answer("t", TaskState::Lost)), Verdict::Deliver);
        d.check(&stamped(TaskState::Finished, "b2", 2));
        assert_eq!(d.check(&answer("t", TaskState::Lost)), Verdict::AfterEnd);
    }

    #[test]
    fn a_task_another_scheduler_process_launched_never_ends_here() {
        // A failover scheduler: the end it is told may be of an earlier
        // launch of the id than the one its predecessor made last.
        let mut d = Delivered::new(10);
        assert_eq!(
            d.check(&reliable("t", TaskState::Failed, "u1")),
            Verdict::Deliver
        );
        assert_eq!(d.check(&answer("t", TaskState::Lost)), Verdict::Deliver);
        assert!(matches!(
            d.check(&reliable("t", TaskState::Failed, "u1")),
            Verdict::Repeat { .. }
        ));
    }

    #[test]
    fn the_oldest_tasks_are_forgotten_and_ends_count_as_recent() {
        let mut d = Delivered::new(3);
        for task in ["a", "b", "c"] {
            d.launched(&TaskId::new(task));
            d.check(&reliable(task, TaskState::Running, &format!("{task}1")));
        }
        // "a" ends: it is now the most recent.
        d.check(&reliable("a", TaskState::Finished, "a2"));
        d.launched(&TaskId::new("d"));
        assert_eq!(d.len(), 3);
        assert_eq!(
            d.check(&reliable("b", TaskState::Running, "b1")),
            Verdict::Deliver,
            "b was forgotten"
        );
        assert_eq!(d.check(&answer("a", TaskState::Lost)), Verdict::AfterEnd);
        // Relaunching one id over and over keeps the queue bounded.
        for i in 0..100 {
            d.launched(&TaskId::new("x"));
            d.check(&reliable("x", TaskState::Running, &format!("r{i}")));
            d.check(&reliable("x", TaskState::Finished, &format!("x{i}")));
        }
        assert!(d.order.len() <= 6, "{}", d.order.len());
        assert!(d.len() <= 3);
    }

    #[test]
    fn only_the_latest_uuids_of_a_task_are_kept() {
        let mut d = launched(&["t"]);
        for i in 0..UUIDS_KEPT_PER_TASK + 2 {
            d.check(&reliable("t", TaskState::Running, &format!("u{i}")));
        }
        assert_eq!(
            d.check(&reliable("t", TaskState::Running, "u0")),
            Verdict::Deliver
        );
        assert!(matches!(
            d.check(&reliable(
                "t",
                TaskState::Running,
                &format!("u{}", UUIDS_KEPT_PER_TASK + 1)
            )),
            Verdict::Repeat { .. }
        ));
    }
}
