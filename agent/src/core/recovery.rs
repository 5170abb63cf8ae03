//! Recovery: what a restarted agent finds checkpointed.

use super::*;
use crate::checkpoint::RecoveredFramework;
use crate::wal::StreamState;

/// What a restarting agent found on disk: read by the shell (file and
/// `/proc` reads), taken in by [`Core::recover`].
pub(crate) struct Recovered {
    pub(crate) agent_id: Option<AgentId>,
    pub(crate) frameworks: Vec<RecoveredFramework>,
    /// Streams whose task was not checkpointed (forgotten).
    pub(crate) orphans: Vec<StreamState>,
    /// The run ids of checkpointed executors found alive (their recorded
    /// pid runs, with the recorded start time).
    pub(crate) alive: HashSet<String>,
}

// === impl Recovered ===

impl Recovered {
    /// Reads what the agent checkpointed under `work_dir`, given the
    /// streams its status update log held.
    pub(crate) fn load(work_dir: &std::path::Path, streams: Vec<StreamState>) -> Recovered {
        let agent_id = checkpoint::read_agent_id(work_dir).map(AgentId::new);
        let (frameworks, orphans) = checkpoint::load(work_dir, streams);
        // An alive command executor's tasks have containers of their own
        // (under cgroups), named by their sandboxes' run ids.
        let alive = frameworks
            .iter()
            .flat_map(|f| &f.executors)
            .filter(|e| {
                e.record.as_ref().is_some_and(|r| {
                    r.pid
                        .is_some_and(|pid| crate::launcher::is_alive(pid, r.start_time))
                })
            })
            .flat_map(|e| {
                let run = e.record.iter().map(|r| r.run_id.clone());
                let tasks = e
                    .tasks
                    .iter()
                    .filter_map(|t| t.sandbox.as_deref().map(paths::run_id_of));
                run.chain(tasks).collect::<Vec<_>>()
            })
            .collect();
        Recovered {
            agent_id,
            frameworks,
            orphans,
            alive,
        }
    }
}

impl Core {
    /// Takes in what a restarting agent found: re-attaches to executors
    /// that survived (or kills them with [`RecoverMode::Cleanup`]) and
    /// gives the tasks of dead ones terminal updates.
    pub(crate) fn recover(&mut self, recovered: Recovered, now: Instant, wall: f64) {
        self.now = now;
        self.wall = wall;
        let config = self.shared.config.clone();
        self.agent_id = recovered.agent_id;
        let Recovered {
            frameworks,
            orphans,
            alive: alive_runs,
            ..
        } = recovered;
        for stream in orphans {
            tracing::debug!(framework_id = %stream.framework_id, task_id = %stream.task_id, "dropping the update stream of a forgotten task");
            self.checkpoint(vec![Op::Wal(WalRecord::End {
                framework_id: stream.framework_id,
                task_id: stream.task_id,
            })]);
        }
        for fw in frameworks {
            let Some(fid) = fw.info.id.clone() else {
                continue;
            };
            self.frameworks.insert(fid.clone(), fw.info);
            for rex in fw.executors {
                let eid = ExecutorId::new(rex.executor_id);
                let ekey = (fid.clone(), eid.clone());
                for rt in rex.tasks {
                    let tid = rt.info.task_id.clone();
                    let (latest, pending, seen, terminal) = match rt.stream {
                        Some(stream) => (
                            stream.latest().cloned(),
                            stream.pending.clone(),
                            stream.seen(),
                            stream.is_terminal(),
                        ),
                        None => (None, Vec::new(), HashSet::default(), false),
                    };
                    if terminal && pending.is_empty() {
                        if let Ok(dir) = paths::meta_task_dir(
                            &config.work_dir,
                            fid.as_str(),
                            eid.as_str(),
                            tid.as_str(),
                        ) {
                            self.checkpoint(vec![
                                Op::Wal(WalRecord::End {
                                    framework_id: fid.clone(),
                                    task_id: tid.clone(),
                                }),
                                Op::RemoveDir { path: dir },
                            ]);
                        }
                        continue;
                    }
                    self.updates.restore(&fid, &tid, seen, pending, terminal);
                    self.insert_task(
                        (fid.clone(), tid),
                        Task {
                            state: latest.as_ref().map_or(TaskState::Staging, |s| s.state),
                            latest,
                            ..Task::staging(eid.clone(), rt.sandbox, rt.info, true)
                        },
                    );
                }
                let alive = rex
                    .record
                    .as_ref()
                    .filter(|r| r.pid.is_some() && alive_runs.contains(&r.run_id));
                match alive {
                    Some(record) => {
                        let record = record.clone();
                        let pid = record.pid.unwrap_or_default();
                        tracing::info!(framework_id = %fid, executor_id = %eid, pid, mode = ?config.recover, "found a live executor");
                        self.executors.insert(
                            ekey.clone(),
                            Executor {
                                info: legacy_executor_api(record.info),
                                run_id: record.run_id.clone(),
                                token: record.token,
                                sandbox: record.sandbox,
                                pid: Some(pid),
                                start_time: record.start_time,
                                is_command: record.is_command,
                                conn: None,
                                subscribed: false,
                                // A task with no update may or may not have
                                // reached it: the executor says which when
                                // it re-subscribes.
                                queued: Vec::new(),
                                killing: false,
                                termination: None,
                                exited: None,
                                assignments: 0,
                                // Unknown: the first task asks.
                                limits_asked: None,
                            },
                        );
                        self.process(Request::Adopt {
                            key: ekey.clone(),
                            run_id: record.run_id.clone(),
                            pid,
                            start_time: record.start_time,
                        });
                        if record.is_command && self.task_containers() {
                            self.adopt_task_containers(&ekey);
                        }
                        match config.recover {
                            RecoverMode::Reconnect => {
                                self.start_registration_timer(ekey.clone(), record.run_id)
                            }
                            RecoverMode::Cleanup => self.kill_executor(
                                &ekey,
                                Some(Termination {
                                    state: TaskState::Lost,
                                    reason: Reason::ReasonAgentRestarted,
                                    message:
                                        "executor killed by agent recovery (--recover cleanup)"
                                            .into(),
                                }),
                            ),
                        }
                    }
                    None => {
                        tracing::info!(framework_id = %fid, executor_id = %eid, "checkpointed executor is gone");
                        let unfinished: Vec<(TaskId, ExecutorId)> = self
                            .executor_tasks(&ekey)
                            .filter(|(_, t)| !t.state.is_terminal())
                            .map(|(tid, t)| (tid.clone(), t.reported_executor_id()))
                            .collect();
                        for (tid, reported_eid) in unfinished {
                            let status = self.agent_status(
                                &tid,
                                Some(reported_eid.clone()),
                                TaskState::Failed,
                                Reason::ReasonExecutorTerminated,
                                format!("executor {reported_eid} exited while the agent was down"),
                            );
                            self.enqueue_update(fid.clone(), status, None);
                        }
                        self.gc_executor(&ekey);
                    }
                }
            }
            if !self.executors.keys().any(|(f, _)| *f == fid)
                && !self.tasks.keys().any(|(f, _)| *f == fid)
            {
                self.frameworks.remove(&fid);
                if let Ok(dir) = paths::meta_framework_dir(&config.work_dir, fid.as_str()) {
                    self.checkpoint(vec![Op::RemoveDir { path: dir }]);
                }
            }
        }
    }
}

impl Core {
    /// The containers of the command tasks of executor `ekey`, recovered
    /// alive, are watched again; those of tasks that ended are ended.
    fn adopt_task_containers(&mut self, ekey: &ExecKey) {
        let tasks: Vec<(StreamKey, String, bool)> = self
            .executor_tasks(ekey)
            .filter_map(|(tid, t)| {
                let name = paths::run_id_of(t.sandbox.as_deref()?);
                Some(((ekey.0.clone(), tid.clone()), name, t.state.is_terminal()))
            })
            .collect();
        for (key, name, ended) in tasks {
            if let Some(task) = self.tasks.get_mut(&key) {
                task.container = Some(name.clone());
            }
            self.process(Request::AdoptTaskContainer {
                key: key.clone(),
                name,
            });
            if ended {
                self.end_task_container(&key);
            }
        }
    }
}

/// An executor checkpointed by an agent from before
/// [`ExecutorInfo::api`] existed was marked as a Mesos one by the reserved
/// variable `AGORA_EXECUTOR_API=mesos-v1` in its environment (which only
/// the master's Mesos front door could set); such an executor, still
/// running, keeps its front door across the agent's upgrade.
fn legacy_executor_api(mut info: ExecutorInfo) -> ExecutorInfo {
    if info.api.is_agora()
        && info
            .command
            .environment
            .get("AGORA_EXECUTOR_API")
            .is_some_and(|api| api == "mesos-v1")
    {
        info.api = agora_proto::ExecutorApi::MesosV1;
    }
    info
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_old_checkpoint_of_a_mesos_executor_keeps_its_api() {
        let old = |env: &str| -> ExecutorInfo {
            serde_json::from_str(&format!(
                r#"{{"executor_id":"e","command":{{"value":"x","environment":{env}}}}}"#
            ))
            .expect("executor info")
        };
        let mesos = legacy_executor_api(old(r#"{"AGORA_EXECUTOR_API":"mesos-v1"}"#));
        assert_eq!(mesos.api, agora_proto::ExecutorApi::MesosV1);
        assert!(legacy_executor_api(old("{}")).api.is_agora());
    }
}
