//! Status updates: the agent's own, and the way every update goes:
//! checkpointed when its task is, into its stream, acknowledged to its
//! executor.

use super::*;

impl Core {
    pub(super) fn agent_status(
        &mut self,
        task_id: &TaskId,
        executor_id: Option<ExecutorId>,
        state: TaskState,
        reason: Reason,
        message: String,
    ) -> TaskStatus {
        let mut status = TaskStatus::new(task_id.clone(), state, Source::SourceAgent)
            .with_reason(reason)
            .with_message(message);
        status.uuid = Some(self.uuid().to_string());
        status.timestamp = self.wall;
        status.agent_id = self.agent_id.clone();
        status.executor_id = executor_id;
        status
    }

    /// Puts an update on its way: checkpointed first when its task is,
    /// then into the stream, then acknowledged to `ack_to`.
    pub(super) fn enqueue_update(
        &mut self,
        fid: FrameworkId,
        mut status: TaskStatus,
        ack_to: Option<ExecKey>,
    ) {
        let Some(uuid) = status.uuid.clone() else {
            return;
        };
        // Which launch of the id it is about: the one this agent holds.
        status.launch_stamp = self
            .tasks
            .get(&(fid.clone(), status.task_id.clone()))
            .and_then(|t| t.info.launch_stamp);
        let pkey = (fid.clone(), status.task_id.clone(), uuid.clone());
        if self.pending_durable.contains(&pkey) {
            // The acknowledgement follows once the first copy is durable.
            return;
        }
        if self.updates.has_uuid(&fid, &status.task_id, &uuid) {
            if let Some(ekey) = ack_to {
                self.ack_executor(&ekey, &status.task_id, &uuid);
            }
            return;
        }
        let key = (fid.clone(), status.task_id.clone());
        let Some(executor_id) = self
            .tasks
            .get(&key)
            .filter(|t| t.checkpointed)
            .map(|t| t.executor_id.clone())
        else {
            self.append_to_stream(fid, status, ack_to);
            return;
        };
        self.pending_durable.insert(pkey);
        let record = WalRecord::Update {
            framework_id: fid.clone(),
            executor_id,
            status: status.clone(),
        };
        self.actions.push(Action::Checkpoint {
            ops: vec![Op::Wal(record)],
            then: Some(Durable::Update {
                framework_id: fid,
                status,
                ack_to,
            }),
        });
    }

    pub(super) fn append_to_stream(
        &mut self,
        fid: FrameworkId,
        status: TaskStatus,
        ack_to: Option<ExecKey>,
    ) {
        let task_id = status.task_id.clone();
        let uuid = status.uuid.clone().unwrap_or_default();
        match self.updates.update(&fid, status.clone(), self.now) {
            UpdateOutcome::Added { send } => {
                tracing::debug!(framework_id = %fid, %task_id, state = %status.state, "status update queued");
                if let Some(task) = self.tasks.get_mut(&(fid.clone(), task_id.clone())) {
                    task.state = status.state;
                    task.latest = Some(status);
                }
                if let Some(status) = send {
                    self.send_master(agent_api::Call::StatusUpdate {
                        framework_id: fid,
                        status,
                    });
                }
            }
            UpdateOutcome::AfterTerminal => {
                tracing::debug!(framework_id = %fid, %task_id, "update after a terminal one dropped");
            }
            UpdateOutcome::Duplicate | UpdateOutcome::MissingUuid => {}
        }
        if let Some(ekey) = ack_to {
            self.ack_executor(&ekey, &task_id, &uuid);
        }
    }

    pub(super) fn ack_executor(&mut self, ekey: &ExecKey, task_id: &TaskId, uuid: &str) {
        self.reply_exec(
            ekey,
            exec_api::Event::Acknowledged {
                task_id: task_id.clone(),
                uuid: uuid.to_string(),
            },
        );
    }
}
