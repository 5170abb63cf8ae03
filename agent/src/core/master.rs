//! The master's side of the core: registration, the master's commands
//! (run, kill, acknowledge, shut down) and what goes to the master.

use super::*;

impl Core {
    pub(super) fn master_event(&mut self, event: agent_api::Event) -> Option<Stop> {
        use agent_api::Event;
        match event {
            Event::Registered {
                agent_id,
                reregistered,
                master_info,
                ..
            } => {
                if agent_id.validate().is_err() {
                    tracing::error!(%agent_id, "master assigned an unusable agent id; ignored");
                    return None;
                }
                tracing::info!(%agent_id, reregistered, master = %master_info.address, "registered with master");
                if self.agent_id.as_ref() != Some(&agent_id) {
                    self.checkpoint(vec![Op::Replace {
                        path: paths::agent_id_file(&self.shared.config.work_dir),
                        bytes: agent_id.as_str().as_bytes().to_vec(),
                    }]);
                    self.agent_id = Some(agent_id);
                }
                if let Some(m) = self.master.as_mut() {
                    m.registered = true;
                }
                for call in std::mem::take(&mut self.unsent) {
                    self.send_master(call);
                }
                if let Some(full) = &self.disk_full {
                    // A (re-)registered agent is offered again: not while
                    // it cannot run what it would be offered for.
                    self.send_master(agent_api::Call::Availability {
                        unavailable: Some(full.clone()),
                    });
                }
                for (framework_id, status) in self.updates.connected(self.now) {
                    self.shared.counters.resent_on_registration();
                    self.send_master(agent_api::Call::StatusUpdate {
                        framework_id,
                        status,
                    });
                }
            }
            Event::RunTask { framework, task } => self.run_task(framework, task),
            Event::RunTaskGroup { framework, tasks } => self.run_task_group(framework, tasks),
            Event::KillTask {
                framework_id,
                task_id,
            } => self.kill_task(framework_id, task_id),
            Event::Acknowledge {
                framework_id,
                task_id,
                uuid,
            } => self.acknowledge(framework_id, task_id, uuid),
            Event::Message {
                framework_id,
                executor_id,
                data,
            } => {
                let key = (framework_id, executor_id);
                if !self.send_exec(&key, exec_api::Event::Message { data }) {
                    tracing::debug!(framework_id = %key.0, executor_id = %key.1, "framework message for an unconnected executor dropped");
                }
            }
            Event::ShutdownFramework { framework_id } => {
                tracing::info!(%framework_id, "shutting down framework");
                let keys: Vec<ExecKey> = self
                    .executors
                    .keys()
                    .filter(|k| k.0 == framework_id)
                    .cloned()
                    .collect();
                for key in keys {
                    self.kill_executor(
                        &key,
                        Some(Termination {
                            state: TaskState::Killed,
                            reason: Reason::ReasonFrameworkRemoved,
                            message: "framework was shut down".into(),
                        }),
                    );
                }
            }
            Event::Ping => self.send_master(agent_api::Call::Pong),
            Event::Shutdown { message } => self.master_shutdown(&message),
            Event::Error { message, fatal } => {
                if fatal {
                    tracing::error!(%message, "master refused this agent");
                    return Some(Stop::Refused(message));
                }
                tracing::warn!(%message, "error from master");
            }
            Event::Unknown => {}
        }
        None
    }

    pub(super) fn register_call(&self) -> agent_api::Call {
        let config = &self.shared.config;
        let tasks = self
            .tasks
            .iter()
            .map(|((fid, _), t)| TaskReport {
                framework_id: fid.clone(),
                task: t.info.clone(),
                state: t.state,
                latest_status: t.latest.clone(),
            })
            .collect();
        // Command executors are the agent's own: the master knows a command
        // task's executor by the task.
        let mut executors: Vec<ExecutorReport> = self
            .executors
            .iter()
            .filter(|(_, e)| !e.is_command)
            .map(|((fid, _), e)| ExecutorReport {
                framework_id: fid.clone(),
                executor: e.info.clone(),
            })
            .collect();
        // An executor whose first task waits for its checkpoint starts as
        // soon as it is durable: it is as good as running, and the master,
        // which rebuilds its books from this report, must keep counting it.
        let mut starting: HashSet<&ExecKey> = HashSet::default();
        for (key, launch) in &self.recording {
            let will_start = !launch.is_command
                && !self.executors.contains_key(&launch.ekey)
                && self
                    .tasks
                    .get(key)
                    .is_some_and(|t| t.will_run_on_recording());
            if will_start && starting.insert(&launch.ekey) {
                executors.push(ExecutorReport {
                    framework_id: launch.ekey.0.clone(),
                    executor: launch.info.clone(),
                });
            }
        }
        agent_api::Call::Register {
            protocol: agora_proto::PROTOCOL_VERSION,
            agent_info: AgentInfo {
                id: self.agent_id.clone(),
                hostname: config.hostname.clone(),
                address: self.shared.advertised_address(self.master_local_ip),
                resources: config.resources.clone(),
                attributes: config.attributes.clone(),
            },
            tasks,
            executors,
            frameworks: self.frameworks.values().cloned().collect(),
        }
    }

    /// Sends `call` to the master. While unregistered, status updates are
    /// left to their streams (the heads go out on registration) and other
    /// calls wait in a bounded queue.
    pub(super) fn send_master(&mut self, call: agent_api::Call) {
        let Some(master) = self.master.as_ref().filter(|m| m.registered) else {
            if !matches!(
                call,
                agent_api::Call::StatusUpdate { .. }
                    | agent_api::Call::Pong
                    | agent_api::Call::Usage { .. }
                    | agent_api::Call::Availability { .. }
            ) && self.unsent.len() < UNSENT_LIMIT
            {
                self.unsent.push(call);
            }
            return;
        };
        let conn = master.conn;
        self.actions.push(Action::ToMaster { conn, call });
    }

    pub(super) fn master_shutdown(&mut self, message: &str) {
        tracing::warn!(%message, "master shut this agent down; killing everything and registering anew");
        let config = &self.shared.config;
        let runs: Vec<(String, Duration)> = self
            .executors
            .drain()
            .map(|(_, ex)| (ex.run_id, shutdown_grace(&ex.info, config)))
            .collect();
        for (run_id, grace) in runs {
            // Terminated whether or not it has started: the process thread
            // handles requests in order.
            self.process(Request::Terminate { run_id, grace });
        }
        let conns: Vec<u64> = self.exec_conns.drain().map(|(conn, _)| conn).collect();
        for conn in conns {
            self.actions.push(Action::CloseExecutor {
                conn,
                code: 1000,
                reason: "agent shut down by the master".into(),
            });
        }
        self.tasks.clear();
        self.tasks_by_executor.clear();
        self.tasks_by_framework.clear();
        self.frameworks.clear();
        self.updates.forget(None);
        self.pending_durable.clear();
        self.recording.clear();
        self.fetching.clear();
        let work_dir = self.shared.config.work_dir.clone();
        self.checkpoint(vec![
            Op::WalForget(None),
            Op::RemoveDir {
                path: paths::meta_root(&work_dir).join("frameworks"),
            },
        ]);
        self.checkpoint(vec![Op::RemoveFile {
            path: paths::agent_id_file(&work_dir),
        }]);
        self.unsent.clear();
        self.agent_id = None;
        // Dropping the connection makes the link reconnect, and the new
        // connection registers as a new agent.
        if let Some(master) = self.master.take() {
            self.actions.push(Action::DropMaster { conn: master.conn });
        }
        self.updates.disconnected();
    }
}
