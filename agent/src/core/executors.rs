//! Executors: launching, subscribing, updates from them, killing them
//! and what happens when they exit.

use super::*;

impl Core {
    pub(super) fn checkpointing(&self, fid: &FrameworkId) -> bool {
        self.frameworks.get(fid).is_some_and(|f| f.checkpoint)
    }

    /// The user framework `fid` names (empty when it names none).
    pub(super) fn framework_user(&self, fid: &FrameworkId) -> String {
        self.frameworks
            .get(fid)
            .map(|f| f.user.clone())
            .unwrap_or_default()
    }

    /// Starts an executor for tasks `first` (and whatever is queued for
    /// it meanwhile): the process thread creates its sandbox and spawns
    /// it; until [`CoreEvent::ExecutorLaunched`] it has no pid.
    pub(super) fn launch_executor(
        &mut self,
        ekey: ExecKey,
        info: ExecutorInfo,
        is_command: bool,
        first: Vec<TaskId>,
    ) {
        let run_id = self.uuid().to_string();
        let agent_id = self
            .agent_id
            .as_ref()
            .map(|a| a.as_str())
            .unwrap_or_default();
        let token = self.shared.identity.issue(&crate::identity::Claims::new(
            ekey.0.as_str(),
            ekey.1.as_str(),
            &run_id,
            agent_id,
        ));
        let sandbox = match paths::sandbox_dir(
            &self.shared.config.work_dir,
            ekey.0.as_str(),
            ekey.1.as_str(),
            &run_id,
        ) {
            Ok(sandbox) => sandbox,
            Err(e) => {
                let message = format!("failed to launch executor {}: {e}", ekey.1);
                for task_id in &first {
                    let status = self.agent_status(
                        task_id,
                        Some(ekey.1.clone()),
                        TaskState::Failed,
                        Reason::ReasonExecutorLaunchFailed,
                        message.clone(),
                    );
                    self.enqueue_update(ekey.0.clone(), status, None);
                }
                return;
            }
        };
        let mut spec = LaunchSpec::from_command(&info.command, sandbox.clone());
        let env = self.executor_env(&ekey, &info, &sandbox, &token);
        // Secrets go to the executor through a descriptor it reads once,
        // not its environment, which a process of its user can read
        // (`/proc/PID/environ`) for as long as it runs. A Mesos v1
        // executor gets its token where Mesos's executor API has it, in
        // MESOS_EXECUTOR_AUTHENTICATION_TOKEN (with
        // --authenticate-executors).
        let (secrets, env): (Vec<_>, Vec<_>) = env.into_iter().partition(|(name, _)| {
            agora_proto::env::SECRET_VARIABLES.contains(&name.as_str())
                && name != agora_proto::env::MESOS_EXECUTOR_AUTHENTICATION_TOKEN
        });
        spec.env.extend(env);
        if !speaks_mesos_v1(&info) {
            spec.secrets = secrets;
        }
        spec.limits = self.container_limits(&ekey, &info, is_command);
        let limits_asked = spec.limits;
        spec.user = self.framework_user(&ekey.0);
        if let Some(logger) = &self.shared.config.container_logger {
            spec.logger = Some(Box::new(logger.clone()));
            if is_command {
                // The command executor pipes its tasks' output through
                // the same logger.
                spec.env.extend(logger.environment());
            }
        }
        let executor = Executor {
            info,
            run_id: run_id.clone(),
            token,
            sandbox,
            pid: None,
            start_time: None,
            is_command,
            conn: None,
            subscribed: false,
            queued: first,
            killing: false,
            termination: None,
            exited: None,
            assignments: 0,
            limits_asked,
        };
        self.executors.insert(ekey.clone(), executor);
        self.process(Request::Launch {
            key: ekey.clone(),
            run_id: run_id.clone(),
            spec,
        });
        self.start_registration_timer(ekey, run_id);
    }

    /// The process thread started an executor, or could not.
    pub(super) fn executor_launched(
        &mut self,
        key: ExecKey,
        run_id: String,
        result: Result<Started, String>,
    ) {
        let Some(ex) = self.executors.get_mut(&key).filter(|e| e.run_id == run_id) else {
            return;
        };
        match result {
            Ok(started) => {
                ex.pid = Some(started.pid);
                ex.start_time = started.start_time;
                let killing = ex.killing;
                let grace = shutdown_grace(&ex.info, &self.shared.config);
                tracing::info!(framework_id = %key.0, executor_id = %key.1, pid = started.pid, sandbox = %ex.sandbox.display(), "executor started");
                self.checkpoint_executor(&key);
                if killing {
                    // Asked to stop while it was being started.
                    self.process(Request::Terminate { run_id, grace });
                }
            }
            Err(message) => {
                tracing::warn!(framework_id = %key.0, executor_id = %key.1, %message, "executor launch failed");
                ex.termination = Some(Termination {
                    state: TaskState::Failed,
                    reason: Reason::ReasonExecutorLaunchFailed,
                    message: format!("failed to launch executor {}: {message}", key.1),
                });
                self.executor_ended(key, None, message);
            }
        }
    }

    /// Under `--isolation cgroups`, what executor `ekey`'s container is
    /// limited to: the executor's own resources (`info`'s) plus those of
    /// its tasks that have not ended. A command executor whose tasks have
    /// containers of their own gets its own resources once per task it
    /// runs (as when each command task had a command executor of its
    /// own, as in Mesos): launching and watching them is its work.
    pub(super) fn container_limits(
        &self,
        ekey: &ExecKey,
        info: &ExecutorInfo,
        is_command: bool,
    ) -> Option<agora_containerizer::Limits> {
        if self.shared.config.isolation != agora_containerizer::Isolation::Cgroups {
            return None;
        }
        if is_command && self.task_containers() {
            let own = agora_containerizer::Limits::of(&info.resources);
            // The tasks it holds, ended ones not yet forgotten included
            // (it keeps them too): counted in O(1), as this runs on every
            // task's launch. In powers of two: a limit is not rewritten
            // for every task.
            let tasks = self.held_tasks(ekey).max(1).next_power_of_two() as f64;
            return Some(agora_containerizer::Limits {
                cpus: own.cpus * tasks,
                mem_mib: own.mem_mib * tasks,
                pids: own.pids,
            });
        }
        let tasks = self
            .executor_tasks(ekey)
            .filter(|(_, t)| t.is_live())
            .map(|(_, t)| &t.info.resources);
        Some(agora_containerizer::Limits::of_all(
            std::iter::once(&info.resources).chain(tasks),
        ))
    }

    /// A task joined running executor `ekey`: its container grows to
    /// hold it.
    pub(super) fn grow_container(&mut self, ekey: &ExecKey) {
        let Some(ex) = self.executors.get(ekey) else {
            return;
        };
        let Some(limits) = self.container_limits(ekey, &ex.info, ex.is_command) else {
            return;
        };
        let Some(ex) = self.executors.get_mut(ekey) else {
            return;
        };
        // The container keeps the largest limits it was given: only more
        // is worth asking for.
        let asked = ex.limits_asked.map_or(limits, |asked| asked.max(&limits));
        if ex.limits_asked == Some(asked) {
            return;
        }
        ex.limits_asked = Some(asked);
        let run_id = ex.run_id.clone();
        self.process(Request::Update {
            run_id,
            limits: asked,
        });
    }

    /// Executor run `run_id`'s container reached a limit: its tasks end
    /// with the limitation (whatever the executor says of them, unless
    /// one finished) and the container is destroyed now, with no grace.
    pub(super) fn container_limited(
        &mut self,
        key: ExecKey,
        run_id: String,
        limitation: agora_containerizer::Limitation,
    ) {
        let Some(ex) = self.executors.get_mut(&key).filter(|e| e.run_id == run_id) else {
            return;
        };
        tracing::warn!(framework_id = %key.0, executor_id = %key.1, reason = ?limitation.reason, message = %limitation.message, "container reached its limit; destroying it");
        ex.termination = Some(Termination {
            state: TaskState::Failed,
            reason: limitation.reason,
            message: limitation.message,
        });
        ex.killing = true;
        if ex.pid.is_some() && ex.exited.is_none() {
            self.process(Request::Terminate {
                run_id,
                grace: Duration::ZERO,
            });
        }
    }

    pub(super) fn start_registration_timer(&mut self, key: ExecKey, run_id: String) {
        let timeout = self.shared.config.executor_registration_timeout;
        self.set_timer(timeout, Timer::RegistrationTimeout { key, run_id });
    }

    pub(super) fn checkpoint_executor(&mut self, ekey: &ExecKey) {
        let Some(ex) = self.executors.get(ekey) else {
            return;
        };
        if !self.checkpointing(&ekey.0) {
            return;
        }
        let Ok(dir) = paths::meta_executor_dir(
            &self.shared.config.work_dir,
            ekey.0.as_str(),
            ekey.1.as_str(),
        ) else {
            return;
        };
        let record = ExecutorRecord {
            framework_id: ekey.0.clone(),
            info: ex.info.clone(),
            run_id: ex.run_id.clone(),
            token: ex.token.clone(),
            pid: ex.pid,
            start_time: ex.start_time,
            sandbox: ex.sandbox.clone(),
            is_command: ex.is_command,
        };
        self.checkpoint(vec![Op::Replace {
            path: dir.join("executor.json"),
            bytes: checkpoint::json_bytes(&record),
        }]);
    }

    pub(super) fn executor_env(
        &self,
        ekey: &ExecKey,
        info: &ExecutorInfo,
        sandbox: &std::path::Path,
        token: &str,
    ) -> Vec<(String, String)> {
        use agora_proto::env;
        let config = &self.shared.config;
        let grace = shutdown_grace(info, config);
        let agent_id = self
            .agent_id
            .as_ref()
            .map(|a| a.to_string())
            .unwrap_or_default();
        let sandbox = sandbox.to_string_lossy().into_owned();
        let checkpoint = if self.checkpointing(&ekey.0) {
            "1"
        } else {
            "0"
        };
        let agora = [
            (env::AGENT_ENDPOINT, self.shared.executor_endpoint.clone()),
            (env::AGENT_ID, agent_id.clone()),
            (env::MESOS_SLAVE_ID, agent_id.clone()),
            (env::FRAMEWORK_ID, ekey.0.to_string()),
            (env::MESOS_FRAMEWORK_ID, ekey.0.to_string()),
            (env::EXECUTOR_ID, ekey.1.to_string()),
            (env::MESOS_EXECUTOR_ID, ekey.1.to_string()),
            (env::SANDBOX, sandbox.clone()),
            (env::MESOS_SANDBOX, sandbox.clone()),
            (env::MESOS_DIRECTORY, sandbox),
            (env::EXECUTOR_TOKEN, token.to_string()),
            (env::CHECKPOINT, checkpoint.to_string()),
            (env::MESOS_CHECKPOINT, checkpoint.to_string()),
            (
                env::RECOVERY_TIMEOUT,
                config.executor_recovery_timeout.as_secs_f64().to_string(),
            ),
            (env::SHUTDOWN_GRACE_PERIOD, grace.as_secs_f64().to_string()),
        ];
        // What Mesos's agent gives an executor (`executorEnvironment` in
        // Mesos's slave.cpp), for executors of the Mesos v1 executor API.
        let mut mesos = vec![
            (
                env::MESOS_AGENT_ENDPOINT,
                self.shared.mesos_agent_endpoint(),
            ),
            (env::MESOS_AGENT_ID, agent_id),
            (
                env::MESOS_EXECUTOR_SHUTDOWN_GRACE_PERIOD,
                env::mesos_duration(grace),
            ),
            (env::MESOS_HTTP_COMMAND_EXECUTOR, "0".to_string()),
        ];
        if config.authenticate_executors && speaks_mesos_v1(info) {
            mesos.push((env::MESOS_EXECUTOR_AUTHENTICATION_TOKEN, token.to_string()));
        }
        // A TLS agent's executors reach it at wss://, trusting its CA and
        // presenting its certificate (as Mesos hands its executors the
        // agent's LIBPROCESS_SSL_* files). The certificate and key paths
        // are secrets (`launch_executor`).
        if config.tls.enabled() {
            let paths = [
                (env::TLS_CA, &config.tls.ca),
                (env::TLS_CERT, &config.tls.cert),
                (env::TLS_KEY, &config.tls.key),
            ];
            for (name, path) in paths
                .iter()
                .filter_map(|(name, path)| path.as_ref().map(|p| (*name, p)))
            {
                mesos.push((name, path.display().to_string()));
            }
        }
        if checkpoint == "1" {
            mesos.push((
                env::MESOS_RECOVERY_TIMEOUT,
                env::mesos_duration(config.executor_recovery_timeout),
            ));
            mesos.push((
                env::MESOS_SUBSCRIPTION_BACKOFF_MAX,
                env::mesos_duration(MESOS_SUBSCRIPTION_BACKOFF_MAX),
            ));
        }
        agora
            .into_iter()
            .chain(mesos)
            .map(|(k, v)| (k.to_string(), v))
            .collect()
    }

    /// Asks an executor to stop: SHUTDOWN when connected, and SIGTERM
    /// then SIGKILL of its session once the grace period (its own, else
    /// the agent's) is over; at once SIGTERM, then SIGKILL after the grace
    /// period, when not connected.
    pub(super) fn kill_executor(&mut self, ekey: &ExecKey, termination: Option<Termination>) {
        let Some(ex) = self.executors.get_mut(ekey) else {
            return;
        };
        let grace = shutdown_grace(&ex.info, &self.shared.config);
        if termination.is_some() && ex.termination.is_none() {
            ex.termination = termination;
        }
        if ex.killing {
            return;
        }
        ex.killing = true;
        let connected = ex.subscribed && ex.conn.is_some();
        let run_id = ex.run_id.clone();
        let Some(pid) = ex.pid else {
            // Still being started: terminated once it is.
            return;
        };
        tracing::info!(framework_id = %ekey.0, executor_id = %ekey.1, pid, connected, "stopping executor");
        if connected {
            self.send_exec(
                ekey,
                exec_api::Event::Shutdown {
                    grace_period_seconds: grace.as_secs_f64(),
                },
            );
            self.set_timer(
                grace,
                Timer::ShutdownOverrun {
                    key: ekey.clone(),
                    run_id,
                },
            );
        } else {
            self.process(Request::Terminate { run_id, grace });
        }
    }

    pub(super) fn executor_subscribe(
        &mut self,
        conn: u64,
        fid: FrameworkId,
        eid: ExecutorId,
        token: Option<String>,
        updates: Vec<TaskStatus>,
        tasks: Vec<TaskInfo>,
    ) {
        let key = (fid.clone(), eid.clone());
        let refusal = match (self.executors.get(&key), &token) {
            (None, _) => Some(format!("unknown executor {eid} of framework {fid}")),
            (Some(ex), Some(token)) if !tokens_equal(&ex.token, token) => {
                // Not this run's token: say whether it is no token of
                // this agent's at all or another executor's (or run's).
                Some(
                    match self.shared.identity.check(
                        token,
                        fid.as_str(),
                        eid.as_str(),
                        Some(&ex.run_id),
                    ) {
                        Err(e) => e.to_string(),
                        Ok(_) => "invalid executor token".to_string(),
                    },
                )
            }
            (Some(ex), None) if !speaks_mesos_v1(&ex.info) => Some(format!(
                "executor {eid} was not launched as a Mesos executor; it subscribes on Agora's executor API"
            )),
            _ => None,
        };
        if let Some(message) = refusal {
            tracing::warn!(framework_id = %fid, executor_id = %eid, %message, "executor subscription refused");
            self.actions.push(Action::ToExecutor {
                conn,
                event: exec_api::Event::Error {
                    message: message.clone(),
                    fatal: true,
                },
                reply: true,
            });
            self.actions.push(Action::CloseExecutor {
                conn,
                code: 1008,
                reason: message,
            });
            return;
        }
        let Some(ex) = self.executors.get_mut(&key) else {
            return;
        };
        if let Some(old) = ex.conn.replace(conn) {
            if old != conn && self.exec_conns.remove(&old).is_some() {
                self.actions.push(Action::CloseExecutor {
                    conn: old,
                    code: 1000,
                    reason: "replaced by a new subscription".into(),
                });
            }
        }
        let resubscribed = ex.subscribed;
        ex.subscribed = true;
        let info = ex.info.clone();
        let killing = ex.killing;
        self.exec_conns.insert(conn, ExecConn { key: key.clone() });
        tracing::info!(framework_id = %fid, executor_id = %eid, resubscribed, "executor subscribed");
        let framework_info = self.frameworks.get(&fid).cloned().unwrap_or_else(|| {
            let mut f = FrameworkInfo::new("");
            f.id = Some(fid.clone());
            f
        });
        self.reply_exec(
            &key,
            exec_api::Event::Subscribed {
                executor_info: info.clone(),
                framework_info,
                agent_id: self.agent_id.clone().unwrap_or_default(),
                hostname: self.shared.config.hostname.clone(),
            },
        );
        // Tasks the executor already has need no LAUNCH; ones the agent
        // lost track of (it died before checkpointing them) are re-adopted.
        // A task whose update the agent took on a stream that has ended
        // since ended here: the executor lists it only because the
        // acknowledgements to it were lost (it is not adopted again).
        let known: HashSet<TaskId> = tasks.iter().map(|t| t.task_id.clone()).collect();
        let ended_here: HashSet<&TaskId> = updates
            .iter()
            .filter(|s| {
                s.uuid
                    .as_deref()
                    .is_some_and(|u| self.updates.has_uuid(&fid, &s.task_id, u))
            })
            .map(|s| &s.task_id)
            .collect();
        let checkpointed = self.checkpointing(&fid);
        for mut task in tasks {
            let tkey = (fid.clone(), task.task_id.clone());
            if self.tasks.contains_key(&tkey)
                || self.updates.has_stream(&fid, &task.task_id)
                || ended_here.contains(&task.task_id)
                || task.task_id.validate().is_err()
            {
                continue;
            }
            // A task of a group, as a Mesos executor has it, does not name
            // its executor: this one.
            if task.executor.is_none() {
                task.executor = Some(info.clone());
            }
            if checkpointed {
                self.checkpoint_task(&fid, &eid, &task, None);
            }
            self.insert_task(tkey, Task::staging(eid.clone(), None, task, checkpointed));
        }
        // A task still queued for the executor is one it has not been
        // given: an update it re-sends with that id is of an earlier task
        // with the id, settled before the master launched the id again
        // (the agent, restarted since, no longer knows its uuid). Taken as
        // the new task's, it would end the new task's stream before it
        // began and drop the new task's own updates.
        let unsent: HashSet<TaskId> = self
            .executors
            .get(&key)
            .map(|ex| ex.queued.iter().cloned().collect())
            .unwrap_or_default();
        for status in updates {
            if unsent.contains(&status.task_id) && !known.contains(&status.task_id) {
                tracing::info!(framework_id = %fid, executor_id = %eid, task_id = %status.task_id, "re-sent update of an earlier task with the id of one not yet launched on the executor; acknowledged and dropped");
                if let Some(uuid) = status.uuid.as_deref() {
                    self.ack_executor(&key, &status.task_id, uuid);
                }
                continue;
            }
            self.executor_update(&key, status);
        }
        let mut queued = self
            .executors
            .get_mut(&key)
            .map(|ex| std::mem::take(&mut ex.queued))
            .unwrap_or_default();
        // A launch sent on an earlier connection that broke before the
        // executor read it, or one the agent cannot know about since it
        // restarted: the executor lists every task it received without
        // an acknowledged update, and the agent has no update for this
        // one, so the executor never had it. Sent (again), or, if a
        // kill came meanwhile, ended here.
        // (A task whose record is still on its way to disk goes when it
        // is there.)
        let lost: Vec<TaskId> = self
            .executor_tasks(&key)
            .filter(|(tid, t)| {
                t.state == TaskState::Staging
                    && !t.terminal_reported
                    && !known.contains(*tid)
                    && !queued.contains(*tid)
                    && !self.recording.contains_key(&(fid.clone(), (*tid).clone()))
            })
            .map(|(tid, _)| tid.clone())
            .collect();
        for task_id in lost {
            tracing::info!(framework_id = %fid, executor_id = %eid, %task_id, "the executor does not have this task; sending it");
            if self.tasks[&(fid.clone(), task_id.clone())].kill_requested {
                self.kill_undelivered(&key, &task_id);
            } else {
                queued.push(task_id);
            }
        }
        queued.retain(|t| !known.contains(t));
        for event in self.launch_events(&key, &queued) {
            self.reply_exec(&key, event);
        }
        let kills: Vec<(TaskId, Option<f64>)> = self
            .tasks
            .iter()
            .filter(|(tkey, t)| {
                // Not those it never got: ended here, or ended once recorded.
                tkey.0 == fid
                    && t.executor_id == eid
                    && t.kill_requested
                    && !t.state.is_terminal()
                    && !t.terminal_reported
                    && !self.recording.contains_key(*tkey)
            })
            .map(|((_, tid), t)| (tid.clone(), t.info.kill_grace_period))
            .collect();
        for (task_id, grace_period_seconds) in kills {
            self.reply_exec(
                &key,
                exec_api::Event::Kill {
                    task_id,
                    grace_period_seconds,
                },
            );
        }
        if killing {
            let grace = shutdown_grace(&info, &self.shared.config);
            self.reply_exec(
                &key,
                exec_api::Event::Shutdown {
                    grace_period_seconds: grace.as_secs_f64(),
                },
            );
        }
    }

    pub(super) fn executor_call(&mut self, conn: u64, call: exec_api::Call) {
        let Some(key) = self.exec_conns.get(&conn).map(|c| c.key.clone()) else {
            return;
        };
        match call {
            exec_api::Call::Update { status } => self.executor_update(&key, status),
            exec_api::Call::Message { data } => self.send_master(agent_api::Call::Message {
                framework_id: key.0,
                executor_id: key.1,
                data,
            }),
            // The connection task turns repeated subscriptions into
            // `ExecutorSubscribe`, and unknown calls into errors.
            exec_api::Call::Subscribe { .. } | exec_api::Call::Unknown => {}
        }
    }

    pub(super) fn executor_update(&mut self, ekey: &ExecKey, mut status: TaskStatus) {
        let Some(uuid) = status.uuid.clone() else {
            self.reply_exec(
                ekey,
                exec_api::Event::Error {
                    message: format!("status update for task {} has no uuid", status.task_id),
                    fatal: false,
                },
            );
            return;
        };
        let tkey = (ekey.0.clone(), status.task_id.clone());
        match self.tasks.get(&tkey) {
            Some(task) if task.executor_id == ekey.1 => {}
            Some(_) => {
                let message = format!(
                    "task {} does not belong to executor {}",
                    status.task_id, ekey.1
                );
                self.reply_exec(
                    ekey,
                    exec_api::Event::Error {
                        message,
                        fatal: false,
                    },
                );
                return;
            }
            None => {
                // Already delivered and forgotten (the acknowledgement to the
                // executor was lost): let the executor drop it.
                tracing::debug!(framework_id = %ekey.0, task_id = %status.task_id, "update for a task the agent no longer has; acknowledged");
                self.ack_executor(ekey, &tkey.1, &uuid);
                return;
            }
        }
        if self.updates.has_uuid(&tkey.0, &tkey.1, &uuid) {
            // A repeat (the executor's re-send or a frame that came twice):
            // of this task's update, or of an earlier task with this id
            // whose stream has ended, which says nothing about the task
            // that has the id now.
            tracing::debug!(framework_id = %ekey.0, task_id = %status.task_id, "repeated update; acknowledged");
            self.ack_executor(ekey, &tkey.1, &uuid);
            return;
        }
        status.agent_id = self.agent_id.clone();
        status.executor_id = self.tasks.get(&tkey).map(Task::reported_executor_id);
        let terminal = status.state.is_terminal();
        if let Some(task) = self.tasks.get_mut(&tkey) {
            if task.held.is_some() {
                // A repeat of the terminal update being held: that one
                // is acknowledged once it goes on.
                return;
            }
            if let Some((id, pid)) = &task.image_container {
                status.container_status = Some(Box::new(agora_proto::ContainerStatus {
                    container_id: Some(id.clone()),
                    network_infos: Vec::new(),
                    executor_pid: Some(*pid),
                }));
            }
            if terminal && (task.container.is_some() || task.image_container.is_some()) {
                // It goes on once nothing of the task is left in its
                // container (`task_container_ended`).
                task.terminal_reported = true;
                task.held = Some(status);
                self.end_task_container(&tkey);
                return;
            }
        }
        // A task that failed or was killed in a container that reached a
        // limit ended because of the limit, whatever its executor saw.
        if let Some(limit) = self.executors.get(ekey).and_then(|e| {
            e.termination
                .as_ref()
                .filter(|t| t.reason == Reason::ReasonContainerLimitationMemory)
        }) {
            if terminal && status.state != TaskState::Finished {
                status.state = limit.state;
                status.reason = Some(limit.reason);
                status.message = Some(limit.message.clone());
            }
        }
        if terminal {
            if let Some(task) = self.tasks.get_mut(&tkey) {
                task.terminal_reported = true;
            }
        }
        self.enqueue_update(ekey.0.clone(), status, Some(ekey.clone()));
        if terminal {
            self.command_executor_maybe_idle(ekey);
        }
    }

    /// Queues an answer to the executor's own calls (see
    /// [`ExecLink::reply`]); whether it is connected.
    pub(super) fn reply_exec(&mut self, ekey: &ExecKey, event: exec_api::Event) -> bool {
        self.queue_for_executor(ekey, event, true)
    }

    /// Queues an event the executor did not ask for; an executor that has
    /// long left too many unread is disconnected (it gets everything again
    /// when it subscribes anew). Whether it is connected.
    pub(super) fn send_exec(&mut self, ekey: &ExecKey, event: exec_api::Event) -> bool {
        self.queue_for_executor(ekey, event, false)
    }

    fn queue_for_executor(&mut self, ekey: &ExecKey, event: exec_api::Event, reply: bool) -> bool {
        let Some(conn) = self
            .executors
            .get(ekey)
            .and_then(|e| e.conn)
            .filter(|c| self.exec_conns.contains_key(c))
        else {
            return false;
        };
        self.actions.push(Action::ToExecutor { conn, event, reply });
        true
    }

    /// An executor process ended. Whatever is left of its session is
    /// killed and it is reaped once the core is done with it.
    pub(super) fn executor_exited(
        &mut self,
        key: ExecKey,
        run_id: String,
        code: Option<i32>,
        message: String,
    ) {
        self.process(Request::Release {
            run_id: run_id.clone(),
        });
        let Some(ex) = self.executors.get_mut(&key).filter(|e| e.run_id == run_id) else {
            return;
        };
        if ex.conn.is_some() {
            // What it sent before exiting (its terminal updates, most
            // likely) may still be unread on its connection: the executor
            // ends when that connection does, after its last frame.
            ex.exited = Some((code, message));
            self.set_timer(EXIT_DRAIN, Timer::ExitDrained { key, run_id });
            return;
        }
        self.executor_ended(key, code, message);
    }

    /// An executor connection ended (after its last call was handled).
    pub(super) fn executor_disconnected(&mut self, conn: u64) {
        let Some(c) = self.exec_conns.remove(&conn) else {
            return;
        };
        let Some(ex) = self.executors.get_mut(&c.key) else {
            return;
        };
        if ex.conn != Some(conn) {
            return;
        }
        ex.conn = None;
        tracing::info!(framework_id = %c.key.0, executor_id = %c.key.1, "executor disconnected");
        if let Some((code, message)) = ex.exited.take() {
            self.executor_ended(c.key, code, message);
        }
    }

    /// Forgets an executor that exited (or never started): its tasks
    /// without a terminal state get one, the master hears of it.
    pub(super) fn executor_ended(&mut self, key: ExecKey, code: Option<i32>, message: String) {
        let Some(ex) = self.executors.remove(&key) else {
            return;
        };
        tracing::info!(framework_id = %key.0, executor_id = %key.1, ?code, %message, "executor exited");
        if let Some(conn) = ex.conn {
            if self.exec_conns.remove(&conn).is_some() {
                self.actions.push(Action::CloseExecutor {
                    conn,
                    code: 1000,
                    reason: "executor exited".into(),
                });
            }
        }
        // Terminal updates it sent that wait for their task's container to
        // end go on now: the executor will not be there to hear of it.
        let held: Vec<StreamKey> = self
            .executor_tasks(&key)
            .filter(|(_, t)| t.held.is_some())
            .map(|(tid, _)| (key.0.clone(), tid.clone()))
            .collect();
        for tkey in held {
            if let Some(status) = self.tasks.get_mut(&tkey).and_then(|t| t.held.take()) {
                self.enqueue_update(tkey.0, status, None);
            }
        }
        let unfinished: Vec<(TaskId, ExecutorId, bool)> = self
            .executor_tasks(&key)
            .filter(|(_, t)| t.is_live())
            .map(|(tid, t)| (tid.clone(), t.reported_executor_id(), t.kill_requested))
            .collect();
        let who = if ex.is_command {
            "command executor".to_string()
        } else {
            format!("executor {}", key.1)
        };
        for (task_id, _, kill_requested) in &unfinished {
            let (state, reason, text) = match &ex.termination {
                Some(t) => (t.state, t.reason, t.message.clone()),
                None if *kill_requested => (
                    TaskState::Killed,
                    Reason::ReasonExecutorTerminated,
                    format!("{who} {message} while the task was being killed"),
                ),
                None => (
                    TaskState::Failed,
                    Reason::ReasonExecutorTerminated,
                    format!("{who} {message}"),
                ),
            };
            // Ended now, though its update may still be on its way to
            // disk: a task still being recorded must not start elsewhere.
            self.end_task(&key.0, task_id, state, reason, text);
        }
        if ex.is_command {
            // The master knows a command task's executor by the task's id:
            // each task whose command executor died hears of it as its own.
            for (_, reported_eid, _) in unfinished {
                self.send_master(agent_api::Call::ExecutorExited {
                    framework_id: key.0.clone(),
                    executor_id: reported_eid,
                    status: code,
                    message: message.clone(),
                });
            }
        } else {
            self.send_master(agent_api::Call::ExecutorExited {
                framework_id: key.0.clone(),
                executor_id: key.1.clone(),
                status: code,
                message,
            });
        }
        self.gc_executor(&key);
    }

    /// A command executor left without a task waits for one for
    /// `--command-executor-idle`, then is shut down.
    pub(super) fn command_executor_maybe_idle(&mut self, ekey: &ExecKey) {
        let Some(ex) = self
            .executors
            .get(ekey)
            .filter(|e| e.is_command && !e.killing)
        else {
            return;
        };
        if self.has_live_tasks(ekey) {
            return;
        }
        let (key, run_id, assignments) = (ekey.clone(), ex.run_id.clone(), ex.assignments);
        let idle = self.shared.config.command_executor_idle;
        self.set_timer(
            idle,
            Timer::CommandExecutorIdle {
                key,
                run_id,
                assignments,
            },
        );
    }

    /// A command executor's idle timer fired.
    pub(super) fn command_executor_idle(&mut self, key: ExecKey, run_id: String, assignments: u64) {
        let still_idle = self
            .executors
            .get(&key)
            .is_some_and(|e| e.run_id == run_id && e.assignments == assignments && !e.killing)
            && !self.has_live_tasks(&key);
        if still_idle {
            tracing::debug!(framework_id = %key.0, executor_id = %key.1, "command executor idle; shutting it down");
            self.kill_executor(&key, None);
        }
    }
}

/// Whether an executor speaks the Mesos v1 executor API (its
/// [`ExecutorInfo::api`]).
pub(super) fn speaks_mesos_v1(info: &ExecutorInfo) -> bool {
    info.api == agora_proto::ExecutorApi::MesosV1
}

/// The longest shutdown grace period an executor may ask for
/// (`ExecutorInfo.shutdown_grace_period`); longer ones are cut to it.
pub(crate) const MAX_EXECUTOR_SHUTDOWN_GRACE: Duration = Duration::from_secs(3600);

/// The time executor `info` gets between being asked to shut down and
/// SIGKILL: its own `shutdown_grace_period` (as Mesos's agent uses
/// `ExecutorInfo.shutdown_grace_period`), else the agent's
/// `--executor-shutdown-grace-period`.
pub(crate) fn shutdown_grace(info: &ExecutorInfo, config: &crate::config::Config) -> Duration {
    info.shutdown_grace_period
        .filter(|secs| secs.is_finite() && *secs >= 0.0)
        .map_or(config.executor_shutdown_grace_period, |secs| {
            Duration::from_secs_f64(secs.min(MAX_EXECUTOR_SHUTDOWN_GRACE.as_secs_f64()))
        })
}
