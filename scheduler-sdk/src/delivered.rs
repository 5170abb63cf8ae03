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
//! whether a terminal update was delivered. It lives as long as the
//! driver: reconnections and master failovers keep it, a new scheduler
//! process starts without it.

use std::collections::VecDeque;

use agora_proto::hash::HashMap;
use agora_proto::{TaskId, TaskStatus};

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
    /// answer, `TASK_LOST`) about a task whose terminal update was
    /// delivered: the scheduler has its end already.
    AfterEnd,
}

/// The memory of delivered updates, bounded to `capacity` tasks: when it
/// is full the task remembered longest ago (since its first delivery or
/// its end, whichever was later) is forgotten.
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
            if let Some(uuid) = &status.uuid {
                if let Some((_, acknowledged)) = record.uuids.iter().find(|(u, _)| u == uuid) {
                    return Verdict::Repeat {
                        acknowledged: *acknowledged,
                    };
                }
            } else if record.ended {
                return Verdict::AfterEnd;
            }
        }
        let stamp = self.stamp();
        let order = &mut self.order;
        let record = self.tasks.entry(status.task_id.clone()).or_insert_with(|| {
            order.push_back((status.task_id.clone(), stamp));
            Record {
                uuids: VecDeque::new(),
                ended: false,
                stamp,
            }
        });
        if let Some(uuid) = &status.uuid {
            record.uuids.push_back((uuid.clone(), false));
            if record.uuids.len() > UUIDS_KEPT_PER_TASK {
                record.uuids.pop_front();
            }
        }
        if status.state.is_terminal() && !record.ended {
            // Remembered from its end on: what follows an end is what
            // must not be delivered.
            record.ended = true;
            if record.stamp != stamp {
                record.stamp = stamp;
                self.order.push_back((status.task_id.clone(), stamp));
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

    /// The scheduler launches `task_id` (again): what was delivered of an
    /// earlier task with the id is not about this one.
    pub(crate) fn launched(&mut self, task_id: &TaskId) {
        self.tasks.remove(task_id);
    }

    /// Tasks remembered.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.tasks.len()
    }

    fn stamp(&mut self) -> u64 {
        self.next_stamp += 1;
        self.next_stamp
    }

    /// Forgets the oldest tasks beyond the capacity; keeps the order
    /// queue within twice the capacity (each task has at most two live
    /// entries, the rest are stale).
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

    #[test]
    fn a_uuid_is_delivered_once_and_acknowledged_again_once_acknowledged() {
        let mut d = Delivered::new(10);
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
        // Another task's update with the same uuid is its own.
        assert_eq!(
            d.check(&reliable("other", TaskState::Running, "u1")),
            Verdict::Deliver
        );
    }

    #[test]
    fn after_an_end_only_new_reliable_updates_are_delivered() {
        let mut d = Delivered::new(10);
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
        // The task's own report after an end the master made up (TASK_LOST
        // of an agent that came back) is its true end: delivered.
        assert_eq!(d.check(&answer("s", TaskState::Lost)), Verdict::Deliver);
        assert_eq!(
            d.check(&reliable("s", TaskState::Finished, "s1")),
            Verdict::Deliver
        );
        // Launched again, the id starts afresh.
        d.launched(&TaskId::new("t"));
        assert_eq!(d.check(&answer("t", TaskState::Lost)), Verdict::Deliver);
    }

    #[test]
    fn the_oldest_tasks_are_forgotten_and_ends_count_as_recent() {
        let mut d = Delivered::new(3);
        for task in ["a", "b", "c"] {
            d.check(&reliable(task, TaskState::Running, &format!("{task}1")));
        }
        // "a" ends: it is now the most recent.
        d.check(&reliable("a", TaskState::Finished, "a2"));
        d.check(&reliable("d", TaskState::Running, "d1"));
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
            d.check(&reliable("x", TaskState::Finished, &format!("x{i}")));
        }
        assert!(d.order.len() <= 6, "{}", d.order.len());
        assert!(d.len() <= 3);
    }

    #[test]
    fn only_the_latest_uuids_of_a_task_are_kept() {
        let mut d = Delivered::new(10);
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
