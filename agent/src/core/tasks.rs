//! Tasks: running, killing and forgetting them, and the checkpoint of
//! their frameworks and executors.

use super::*;

/// Why the agent does not run a task the master sent it.
struct Refusal {
    state: TaskState,
    reason: Reason,
    message: String,
}

impl Core {
    pub(super) fn run_task(&mut self, framework: FrameworkInfo, task: TaskInfo) {
        let Some(fid) = framework.id.clone() else {
            // Nothing to address an update to: the master never sends this.
            tracing::error!(task_id = %task.task_id, "RUN_TASK without a framework id; ignored");
            return;
        };
        let info = match self.check_task(&fid, &task) {
            Ok(info) => info,
            Err(refusal) => return self.refuse_task(&fid, &task, refusal),
        };
        self.clear_reused_id(&fid, &task.task_id);
        let key = (fid.clone(), task.task_id.clone());
        let Some(info) = info else {
            self.adopt_framework(framework);
            return self.run_command_task(fid, task);
        };
        let ekey = (fid.clone(), info.executor_id.clone());
        self.adopt_framework(framework);
        let checkpointed = self.checkpointing(&fid);
        tracing::info!(framework_id = %fid, task_id = %task.task_id, executor_id = %ekey.1, "running task");
        self.stage_task(
            key,
            task,
            None,
            PendingLaunch {
                ekey,
                info,
                is_command: false,
            },
            checkpointed,
        );
    }

    /// Runs the tasks of a task group on their executor, all together:
    /// they reach it in one piece (see [`Core::launch_events`]), or, when
    /// one of them cannot run here, none does and each is refused with
    /// what stopped the group.
    pub(super) fn run_task_group(&mut self, framework: FrameworkInfo, tasks: Vec<TaskInfo>) {
        let Some(fid) = framework.id.clone() else {
            tracing::error!(
                tasks = tasks.len(),
                "RUN_TASK_GROUP without a framework id; ignored"
            );
            return;
        };
        let executor_id = tasks
            .first()
            .and_then(|t| t.executor.as_ref())
            .map(|e| e.executor_id.clone());
        let mut seen = HashSet::default();
        let mut info = None;
        let mut problem = None;
        for task in &tasks {
            let check = if executor_id.is_none()
                || task.executor.as_ref().map(|e| &e.executor_id) != executor_id.as_ref()
            {
                Err(Refusal {
                    state: TaskState::Error,
                    reason: Reason::ReasonTaskGroupInvalid,
                    message: "the tasks of a group must all name the same executor".into(),
                })
            } else if !seen.insert(task.task_id.clone()) {
                Err(Refusal {
                    state: TaskState::Error,
                    reason: Reason::ReasonTaskGroupInvalid,
                    message: "the task appears twice in the group".into(),
                })
            } else {
                self.check_task(&fid, task)
            };
            match check {
                Ok(executor) => info = info.or(executor),
                Err(refusal) => {
                    problem = Some((task.task_id.clone(), refusal));
                    break;
                }
            }
        }
        if let Some((task_id, refusal)) = problem {
            let message = format!("task group refused: task {task_id}: {}", refusal.message);
            for task in &tasks {
                let refusal = Refusal {
                    message: message.clone(),
                    ..refusal
                };
                self.refuse_task(&fid, task, refusal);
            }
            return;
        }
        let Some(info) = info else {
            return;
        };
        for task in &tasks {
            self.clear_reused_id(&fid, &task.task_id);
        }
        self.adopt_framework(framework);
        let ekey = (fid.clone(), info.executor_id.clone());
        let checkpointed = self.checkpointing(&fid);
        let keys: Vec<StreamKey> = tasks
            .iter()
            .map(|t| (fid.clone(), t.task_id.clone()))
            .collect();
        tracing::info!(framework_id = %fid, executor_id = %ekey.1, tasks = keys.len(), "running task group");
        if checkpointed {
            // One record of them all: the group reaches its executor as one.
            let ops = tasks
                .iter()
                .map(|t| task_record(&fid, &ekey.1, t, None))
                .collect();
            self.actions.push(Action::Checkpoint {
                ops,
                then: Some(Durable::Tasks { keys: keys.clone() }),
            });
        }
        for (key, task) in keys.iter().zip(tasks) {
            self.insert_task(
                key.clone(),
                Task::staging(ekey.1.clone(), None, task, checkpointed),
            );
            self.recording.insert(
                key.clone(),
                PendingLaunch {
                    ekey: ekey.clone(),
                    info: info.clone(),
                    is_command: false,
                },
            );
        }
        if !checkpointed {
            self.tasks_recorded(keys);
        }
    }

    /// Whether task `task` of framework `fid` can run here: `Ok` with its
    /// custom executor (`framework_id` filled in), or `None` for a command
    /// task.
    fn check_task(
        &self,
        fid: &FrameworkId,
        task: &TaskInfo,
    ) -> Result<Option<ExecutorInfo>, Refusal> {
        if self.task_is_live(fid, &task.task_id) {
            return Err(Refusal {
                state: TaskState::Dropped,
                reason: Reason::ReasonTaskInvalid,
                message: format!(
                    "task id {} is still in use by a running task on this agent",
                    task.task_id
                ),
            });
        }
        if let Some(full) = &self.disk_full {
            // Mesos's REASON_CONTAINER_LAUNCH_FAILED on its v1 API.
            return Err(Refusal {
                state: TaskState::Failed,
                reason: Reason::ReasonExecutorLaunchFailed,
                message: format!("{full}; the agent launches no task until space is freed"),
            });
        }
        let invalid = |message: String| Refusal {
            state: TaskState::Error,
            reason: Reason::ReasonTaskInvalid,
            message,
        };
        let mut info = match (&task.command, &task.executor) {
            (Some(_), None) => None,
            // A task of a group may carry a command for its executor.
            (None, Some(executor)) => Some(executor.clone()),
            (Some(_), Some(executor)) if task.task_group.is_some() => Some(executor.clone()),
            _ => {
                return Err(invalid(
                    "a task needs exactly one of command or executor".into(),
                ))
            }
        };
        if let Some(refusal) = self.check_container(task, info.as_ref()) {
            return Err(refusal);
        }
        let mut ids = vec![("framework", fid.as_str()), ("task", task.task_id.as_str())];
        if let Some(info) = &info {
            ids.push(("executor", info.executor_id.as_str()));
        }
        for (kind, id) in ids {
            if let Err(e) = agora_proto::validate_id(id) {
                return Err(invalid(format!("invalid {kind} id: {e}")));
            }
        }
        if let Some(info) = info.as_mut() {
            info.framework_id = Some(fid.clone());
            let ekey = (fid.clone(), info.executor_id.clone());
            if self.executors.get(&ekey).is_some_and(|e| e.killing) {
                return Err(Refusal {
                    state: TaskState::Dropped,
                    reason: Reason::ReasonExecutorTerminated,
                    message: format!("executor {} is shutting down", ekey.1),
                });
            }
        }
        Ok(info)
    }

    /// Whether this agent can run `task`'s container (a command task's:
    /// with an image, when `--image-providers` enables images; custom
    /// executors do not run in containers yet). Refused as Mesos refuses
    /// a container it cannot launch: `TASK_FAILED`,
    /// `REASON_CONTAINER_LAUNCH_FAILED`, the message naming why.
    fn check_container(&self, task: &TaskInfo, executor: Option<&ExecutorInfo>) -> Option<Refusal> {
        let failed = |message: String| Refusal {
            state: TaskState::Failed,
            reason: Reason::ReasonContainerLaunchFailed,
            message,
        };
        if executor.is_some_and(|e| e.container.is_some()) {
            return Some(failed(
                "ExecutorInfo.container: custom executors do not run in containers on this agent yet (command tasks do)".into(),
            ));
        }
        let container = task.container.as_deref()?;
        if executor.is_some() {
            return Some(failed(
                "TaskInfo.container on a task of a custom executor: only command tasks run in containers on this agent".into(),
            ));
        }
        if self.shared.config.images.image_providers.is_empty() {
            let image = container.image.as_ref().map_or_else(
                || "a container".to_string(),
                |i| format!("image {}", i.name),
            );
            return Some(failed(format!(
                "task {} runs in {image}, but images are not enabled on this agent (start it with --image-providers docker,oci)",
                task.task_id
            )));
        }
        None
    }

    /// Whether task `task_id` of `fid` runs here and has not ended.
    fn task_is_live(&self, fid: &FrameworkId, task_id: &TaskId) -> bool {
        self.tasks
            .get(&(fid.clone(), task_id.clone()))
            .is_some_and(|t| t.is_live())
    }

    /// Answers a launch the agent does not run.
    fn refuse_task(&mut self, fid: &FrameworkId, task: &TaskInfo, refusal: Refusal) {
        if self.task_is_live(fid, &task.task_id) {
            // Its stream belongs to the task that runs: the refusal of the
            // new one travels on its own, unacknowledged (a lost one is
            // answered again when the master re-sends the launch after a
            // re-registration).
            tracing::warn!(framework_id = %fid, task_id = %task.task_id, message = %refusal.message, "RUN_TASK for a task id still running here; dropped");
            let status = self.agent_status(
                &task.task_id,
                None,
                refusal.state,
                refusal.reason,
                refusal.message,
            );
            self.send_master(agent_api::Call::StatusUpdate {
                framework_id: fid.clone(),
                status,
            });
            return;
        }
        self.clear_reused_id(fid, &task.task_id);
        self.reject(fid, task, refusal.state, refusal.reason, refusal.message);
    }

    /// A new task with the id of one that ended here: the master has
    /// settled the old one (it would not launch the id otherwise), so what
    /// its stream still holds is of no use to anyone.
    fn clear_reused_id(&mut self, fid: &FrameworkId, task_id: &TaskId) {
        let key = (fid.clone(), task_id.clone());
        if !self.tasks.contains_key(&key) && !self.updates.has_stream(fid, task_id) {
            return;
        }
        tracing::info!(framework_id = %fid, %task_id, "task id reused; the previous task's stream is dropped");
        self.updates.end_stream(fid, task_id);
        if self.tasks.contains_key(&key) {
            self.forget_task(&key);
        } else {
            self.checkpoint(vec![Op::Wal(WalRecord::End {
                framework_id: fid.clone(),
                task_id: task_id.clone(),
            })]);
        }
    }

    /// Records task `key` and starts it: at once, or once its checkpoint
    /// is durable when its framework checkpoints.
    fn stage_task(
        &mut self,
        key: StreamKey,
        task: TaskInfo,
        sandbox: Option<PathBuf>,
        launch: PendingLaunch,
        checkpointed: bool,
    ) {
        let ekey = launch.ekey.clone();
        if checkpointed {
            self.actions.push(Action::Checkpoint {
                ops: vec![task_record(&key.0, &ekey.1, &task, sandbox.as_ref())],
                then: Some(Durable::Task { key: key.clone() }),
            });
        }
        self.insert_task(
            key.clone(),
            Task::staging(ekey.1.clone(), sandbox, task, checkpointed),
        );
        self.recording.insert(key.clone(), launch);
        if !checkpointed {
            self.task_recorded(key);
        }
    }

    /// Task `key` is on disk (or needs not be): it goes to its executor,
    /// starting the executor if it is not there.
    pub(super) fn task_recorded(&mut self, key: StreamKey) {
        if let Some(preparing) = self.fetching.get_mut(&key) {
            // It goes once its URIs are fetched and its container made
            // too (`task_fetched`).
            preparing.recorded = true;
            return;
        }
        self.tasks_recorded(vec![key]);
    }

    /// Tasks `keys` of one executor (one task, or the tasks of a group)
    /// are on disk (or need not be): they go to their executor together,
    /// starting the executor if it is not there; those killed or ended
    /// meanwhile do not.
    pub(super) fn tasks_recorded(&mut self, keys: Vec<StreamKey>) {
        let mut ready = Vec::with_capacity(keys.len());
        let mut launch = None;
        for key in keys {
            let Some(pending) = self.recording.remove(&key) else {
                continue;
            };
            let Some(task) = self.tasks.get(&key) else {
                continue;
            };
            if task.state.is_terminal() || task.terminal_reported {
                continue;
            }
            if task.kill_requested {
                self.kill_undelivered(&pending.ekey, &key.1);
                continue;
            }
            ready.push(key.1);
            launch = Some(pending);
        }
        let Some(PendingLaunch {
            ekey,
            info,
            is_command,
        }) = launch
        else {
            return;
        };
        match self.executors.get(&ekey) {
            Some(ex) if ex.killing => {
                for task_id in ready {
                    self.end_task(
                        &ekey.0,
                        &task_id,
                        TaskState::Dropped,
                        Reason::ReasonExecutorTerminated,
                        format!("executor {} is shutting down", ekey.1),
                    );
                }
            }
            Some(_) => {
                self.grow_container(&ekey);
                self.deliver_or_queue(&ekey, ready)
            }
            None => self.launch_executor(ekey, info, is_command, ready),
        }
    }

    /// Runs a command task in a command executor of its framework with
    /// room for it, starting one when none has, in a sandbox of its own.
    fn run_command_task(&mut self, fid: FrameworkId, task: TaskInfo) {
        let run_id = self.uuid().to_string();
        let sandbox = match paths::sandbox_dir(
            &self.shared.config.work_dir,
            fid.as_str(),
            task.task_id.as_str(),
            &run_id,
        ) {
            Ok(sandbox) => sandbox,
            Err(e) => {
                let message = format!("no sandbox for the task: {e}");
                self.reject(
                    &fid,
                    &task,
                    TaskState::Error,
                    Reason::ReasonTaskInvalid,
                    message,
                );
                return;
            }
        };
        let containers = self.task_containers();
        let limit = if self.shared.config.isolation == agora_containerizer::Isolation::Cgroups
            && !containers
        {
            // Its container holds the executor and its one task.
            1
        } else {
            self.shared.config.command_executor_tasks.max(1)
        };
        // One that runs, or one that starts once a task's checkpoint is
        // durable.
        let starting = self
            .recording
            .values()
            .filter(|p| p.is_command && p.ekey.0 == fid && !self.executors.contains_key(&p.ekey))
            .map(|p| &p.ekey);
        let host = self
            .executors
            .iter()
            .filter(|((f, _), ex)| *f == fid && ex.is_command && !ex.killing)
            .map(|(key, _)| key)
            .chain(starting)
            .find(|key| self.live_tasks(key) < limit)
            .cloned();
        let ekey = host.clone().unwrap_or_else(|| {
            let id = self.uuid().simple().to_string();
            (
                fid.clone(),
                ExecutorId::new(format!(
                    "{}command-{}",
                    paths::AGENT_EXECUTOR_PREFIX,
                    &id[..12]
                )),
            )
        });
        let uris = task.command.as_ref().map_or(&[][..], |c| &c.uris[..]);
        let user = self.framework_user(&fid);
        // Under cgroups the task gets a container of its own, made with
        // its sandbox; the executor's container holds only the executor.
        let image = task.container.as_deref().cloned();
        let container = (containers && image.is_none()).then(|| {
            (
                paths::run_id_of(&sandbox),
                agora_containerizer::Limits::of(&task.resources),
            )
        });
        // The command starts only once its URIs are in its sandbox (and,
        // when the agent switches users, once the sandbox is the user's,
        // which the executor could not make it itself), and once its
        // container is made: the task waits in `recording` until then.
        let key = (fid.clone(), task.task_id.clone());
        let fetch = !uris.is_empty() || self.shared.config.users.switches();
        let waiting = u8::from(fetch) + u8::from(container.is_some()) + u8::from(image.is_some());
        if waiting > 0 {
            self.fetching.insert(
                key.clone(),
                Preparing {
                    recorded: false,
                    waiting,
                },
            );
        }
        if let Some(container) = image {
            // Its crun container holds it, with the limits of its
            // resources under --isolation cgroups.
            let limits = (self.shared.config.isolation == agora_containerizer::Isolation::Cgroups)
                .then(|| agora_containerizer::Limits::of(&task.resources));
            self.process(Request::PrepareImage {
                key: key.clone(),
                task: Box::new(agora_containerizer::ImageTask {
                    id: paths::run_id_of(&sandbox),
                    sandbox: sandbox.clone(),
                    container,
                    command: task.command.clone().unwrap_or_else(|| CommandInfo {
                        value: String::new(),
                        shell: false,
                        arguments: Vec::new(),
                        environment: Default::default(),
                        uris: Vec::new(),
                    }),
                    limits,
                }),
            });
        }
        if let Some((name, limits)) = &container {
            self.process(Request::TaskContainer {
                key: key.clone(),
                name: name.clone(),
                limits: *limits,
                user: user.clone(),
            });
        }
        if fetch {
            self.process(Request::Fetch {
                key,
                sandbox: sandbox.clone(),
                uris: uris.to_vec(),
                user,
            });
        } else {
            self.process(Request::CreateDir {
                path: sandbox.clone(),
                user,
            });
        }
        let checkpointed = self.checkpointing(&fid);
        tracing::info!(framework_id = %fid, task_id = %task.task_id, executor_id = %ekey.1, "running task");
        if host.is_some() {
            if let Some(ex) = self.executors.get_mut(&ekey) {
                ex.assignments += 1;
            }
        }
        let info = self.command_executor_info(&ekey);
        let key = (fid, task.task_id.clone());
        self.stage_task(
            key.clone(),
            task,
            Some(sandbox),
            PendingLaunch {
                ekey,
                info,
                is_command: true,
            },
            checkpointed,
        );
        if let (Some(task), Some((name, _))) = (self.tasks.get_mut(&key), container) {
            task.container = Some(name);
        }
    }

    /// Whether command tasks get containers of their own, in a command
    /// executor they share: under `--isolation cgroups`, unless the
    /// executor runs as a user the agent cannot hand a container to
    /// (cgroup v2 would need the user to own the cgroup above them all),
    /// where each command task has a command executor of its own and
    /// shares its container.
    pub(super) fn task_containers(&self) -> bool {
        self.shared.config.isolation == agora_containerizer::Isolation::Cgroups
            && (self.shared.delegates_cgroups || !self.shared.config.users.switches())
    }

    /// Asks for command task `key`'s container to be killed whole and
    /// removed, once (the answer is [`Input::TaskContainerEnded`]).
    pub(super) fn end_task_container(&mut self, key: &StreamKey) {
        if let Some((id, _)) = self
            .tasks
            .get_mut(key)
            .and_then(|t| t.image_container.take())
        {
            self.process(Request::EndImageContainer {
                key: key.clone(),
                id,
            });
        }
        let Some(name) = self.tasks.get_mut(key).and_then(|t| t.container.take()) else {
            return;
        };
        self.process(Request::EndTaskContainer {
            key: key.clone(),
            name,
        });
    }

    /// Command task `key`'s container is gone: its executor's terminal
    /// update, held until then, goes on (as the container's limitation
    /// when it reached one and the command did not finish).
    pub(super) fn task_container_ended(
        &mut self,
        key: StreamKey,
        limitation: Option<agora_containerizer::Limitation>,
    ) {
        let Some(task) = self.tasks.get_mut(&key) else {
            return;
        };
        let Some(mut status) = task.held.take() else {
            return;
        };
        let ekey = (key.0.clone(), task.executor_id.clone());
        if let Some(limitation) = limitation.filter(|_| status.state != TaskState::Finished) {
            tracing::warn!(framework_id = %key.0, task_id = %key.1, message = %limitation.message, "the task's container reached its limit");
            status.state = TaskState::Failed;
            status.reason = Some(limitation.reason);
            status.message = Some(limitation.message);
        }
        self.enqueue_update(key.0, status, Some(ekey.clone()));
        self.command_executor_maybe_idle(&ekey);
    }

    /// The URIs of command task `key` were fetched into its sandbox, or
    /// its container made (it goes to its executor once both are done
    /// and its checkpoint is durable), or one could not be: the task
    /// fails as a failed executor launch does.
    pub(super) fn task_fetched(&mut self, key: StreamKey, result: Result<TaskEntry, String>) {
        let Some(preparing) = self.fetching.get_mut(&key) else {
            return;
        };
        match result {
            Ok(entry) => {
                preparing.waiting = preparing.waiting.saturating_sub(1);
                let Preparing { recorded, waiting } = *preparing;
                if !entry.files.is_empty() {
                    if let Some(task) = self.tasks.get_mut(&key) {
                        task.container_entry = entry;
                    }
                }
                if waiting == 0 {
                    self.fetching.remove(&key);
                    if recorded {
                        self.task_recorded(key);
                    }
                }
            }
            Err(message) => {
                self.fetching.remove(&key);
                let Some(launch) = self.recording.remove(&key) else {
                    return;
                };
                let Some(task) = self.tasks.get(&key) else {
                    return;
                };
                if task.state.is_terminal() || task.terminal_reported {
                    return;
                }
                if task.kill_requested {
                    return self.kill_undelivered(&launch.ekey, &key.1);
                }
                tracing::warn!(framework_id = %key.0, task_id = %key.1, %message, "preparing the task failed");
                self.end_task(
                    &key.0,
                    &key.1,
                    TaskState::Failed,
                    Reason::ReasonExecutorLaunchFailed,
                    format!("failed to launch task {}: {message}", key.1),
                );
                if self.executors.contains_key(&launch.ekey) {
                    self.command_executor_maybe_idle(&launch.ekey);
                }
            }
        }
    }

    /// Command task `key`'s image container is made (its executor runs
    /// `run.command` in place of the task's command, which starts it), or
    /// could not be: the task fails with `REASON_CONTAINER_LAUNCH_FAILED`
    /// and a message naming the image and the cause.
    pub(super) fn image_prepared(&mut self, key: StreamKey, result: Result<ImageRun, String>) {
        let live = self
            .tasks
            .get(&key)
            .is_some_and(|t| !t.state.is_terminal() && !t.terminal_reported)
            && self.fetching.contains_key(&key);
        match result {
            Ok(run) if !live => {
                // Killed, or failed otherwise, while its image came.
                self.process(Request::EndImageContainer { key, id: run.id });
            }
            Ok(run) => {
                if let Some(task) = self.tasks.get_mut(&key) {
                    task.info.command = Some(run.command);
                    task.image_container = Some((run.id, run.pid));
                }
                self.task_fetched(key, Ok(TaskEntry::default()));
            }
            Err(message) => {
                self.fetching.remove(&key);
                let Some(launch) = self.recording.remove(&key) else {
                    return;
                };
                let Some(task) = self.tasks.get(&key) else {
                    return;
                };
                if task.state.is_terminal() || task.terminal_reported {
                    return;
                }
                if task.kill_requested {
                    return self.kill_undelivered(&launch.ekey, &key.1);
                }
                tracing::warn!(framework_id = %key.0, task_id = %key.1, %message, "the task's container could not be made");
                self.end_task(
                    &key.0,
                    &key.1,
                    TaskState::Failed,
                    Reason::ReasonContainerLaunchFailed,
                    format!(
                        "failed to launch task {} in its container: {message}",
                        key.1
                    ),
                );
                if self.executors.contains_key(&launch.ekey) {
                    self.command_executor_maybe_idle(&launch.ekey);
                }
            }
        }
    }

    /// Tasks of executor `ekey` without a terminal state, reported or not.
    pub(super) fn live_tasks(&self, ekey: &ExecKey) -> usize {
        self.executor_tasks(ekey)
            .filter(|(_, t)| t.is_live())
            .count()
    }

    /// Whether executor `ekey` runs a task that has not ended: stops at
    /// the first (a command executor may hold a hundred and more, and
    /// this runs as each ends).
    pub(super) fn has_live_tasks(&self, ekey: &ExecKey) -> bool {
        self.executor_tasks(ekey).any(|(_, t)| t.is_live())
    }

    /// An agent-generated update for a task the agent does not run.
    pub(super) fn reject(
        &mut self,
        fid: &FrameworkId,
        task: &TaskInfo,
        state: TaskState,
        reason: Reason,
        message: String,
    ) {
        tracing::warn!(framework_id = %fid, task_id = %task.task_id, %message, "task rejected");
        let status = self.agent_status(&task.task_id, None, state, reason, message);
        self.enqueue_update(fid.clone(), status, None);
    }

    /// What a command executor runs as: the configured program, with the
    /// command executor's own resources.
    pub(super) fn command_executor_info(&self, ekey: &ExecKey) -> ExecutorInfo {
        let program = &self.shared.config.command_executor;
        ExecutorInfo {
            container: None,
            executor_id: ekey.1.clone(),
            framework_id: Some(ekey.0.clone()),
            command: CommandInfo {
                value: program.first().cloned().unwrap_or_default(),
                shell: false,
                arguments: program.clone(),
                environment: Default::default(),
                uris: Vec::new(),
            },
            resources: Resources::parse(COMMAND_EXECUTOR_RESOURCES).unwrap_or_default(),
            name: "Command Executor".into(),
            source: "agora".into(),
            api: Default::default(),
            shutdown_grace_period: None,
            data: None,
            labels: Default::default(),
        }
    }

    pub(super) fn adopt_framework(&mut self, framework: FrameworkInfo) {
        let Some(fid) = framework.id.clone() else {
            return;
        };
        if self.frameworks.get(&fid) == Some(&framework) {
            return;
        }
        if framework.checkpoint {
            if let Ok(dir) = paths::meta_framework_dir(&self.shared.config.work_dir, fid.as_str()) {
                self.checkpoint(vec![Op::Replace {
                    path: dir.join("framework.json"),
                    bytes: checkpoint::json_bytes(&framework),
                }]);
            }
        }
        self.frameworks.insert(fid, framework);
    }

    /// Hands tasks `task_ids` to executor `ekey`, or queues them until it
    /// subscribes.
    pub(super) fn deliver_or_queue(&mut self, ekey: &ExecKey, task_ids: Vec<TaskId>) {
        let Some(ex) = self.executors.get_mut(ekey) else {
            return;
        };
        let connected = ex.subscribed && ex.conn.is_some();
        if !connected {
            ex.queued.extend(task_ids);
            return;
        }
        for event in self.launch_events(ekey, &task_ids) {
            self.send_exec(ekey, event);
        }
    }

    /// The events that launch tasks `task_ids` on executor `ekey`: a
    /// `LAUNCH` each, in order, except that an executor of the Mesos v1
    /// API gets the tasks of a group in one `LAUNCH_GROUP` (where the
    /// group's first task is).
    pub(super) fn launch_events(
        &self,
        ekey: &ExecKey,
        task_ids: &[TaskId],
    ) -> Vec<exec_api::Event> {
        let mesos = self
            .executors
            .get(ekey)
            .is_some_and(|e| speaks_mesos_v1(&e.info));
        let mut events = Vec::with_capacity(task_ids.len());
        let mut groups: Vec<(&str, usize)> = Vec::new();
        for task_id in task_ids {
            let Some(task) = self.tasks.get(&(ekey.0.clone(), task_id.clone())) else {
                continue;
            };
            let group = task.info.task_group.as_deref().filter(|_| mesos);
            let Some(group) = group else {
                events.push(exec_api::Event::Launch {
                    task: task.info.clone(),
                    sandbox: task.sandbox.as_ref().map(|s| s.display().to_string()),
                    cgroups: task.container_entry.files.clone(),
                    container: task.container_entry.lasting.clone(),
                });
                continue;
            };
            match groups.iter().find(|(name, _)| *name == group) {
                Some(&(_, at)) => {
                    if let exec_api::Event::LaunchGroup { tasks } = &mut events[at] {
                        tasks.push(task.info.clone());
                    }
                }
                None => {
                    groups.push((group, events.len()));
                    events.push(exec_api::Event::LaunchGroup {
                        tasks: vec![task.info.clone()],
                    });
                }
            }
        }
        events
    }

    pub(super) fn kill_task(&mut self, fid: FrameworkId, task_id: TaskId) {
        let key = (fid.clone(), task_id.clone());
        let Some(task) = self.tasks.get_mut(&key) else {
            if !self.updates.has_stream(&fid, &task_id) {
                let status = self.agent_status(
                    &task_id,
                    None,
                    TaskState::Lost,
                    Reason::ReasonTaskUnknown,
                    "task is unknown to the agent".into(),
                );
                self.enqueue_update(fid, status, None);
            }
            return;
        };
        if task.state.is_terminal() {
            return;
        }
        task.kill_requested = true;
        if self.recording.contains_key(&key) {
            // Not delivered yet: it ends once its checkpoint is durable
            // (`task_recorded`), without reaching its executor.
            return;
        }
        let ekey = (fid.clone(), task.executor_id.clone());
        let grace = task.info.kill_grace_period;
        let Some(ex) = self.executors.get_mut(&ekey) else {
            return;
        };
        if let Some(pos) = ex.queued.iter().position(|t| *t == task_id) {
            ex.queued.remove(pos);
            self.kill_undelivered(&ekey, &task_id);
            return;
        }
        if !ex.is_command {
            // An executor that does not kill its task in time is shut
            // down (with every task it runs). The command executor is the
            // agent's own and escalates to SIGKILL by itself.
            let after = Duration::from_secs_f64(grace.unwrap_or(0.0).clamp(0.0, 3600.0))
                + shutdown_grace(&ex.info, &self.shared.config);
            let run_id = ex.run_id.clone();
            self.set_timer(
                after,
                Timer::KillOverrun {
                    key: ekey.clone(),
                    run_id,
                    task_id: task_id.clone(),
                },
            );
        }
        if self
            .executors
            .get(&ekey)
            .is_some_and(|ex| ex.subscribed && ex.conn.is_some())
        {
            self.send_exec(
                &ekey,
                exec_api::Event::Kill {
                    task_id,
                    grace_period_seconds: grace,
                },
            );
        }
        // Otherwise the kill is sent when the executor re-subscribes.
    }

    /// Ends task `task_id` of framework `fid` here with an update of the
    /// agent's own, at once: whatever its update's way to disk, the task
    /// counts as ended from now on (it is not started, killed or failed
    /// again).
    pub(super) fn end_task(
        &mut self,
        fid: &FrameworkId,
        task_id: &TaskId,
        state: TaskState,
        reason: Reason,
        message: String,
    ) {
        let key = (fid.clone(), task_id.clone());
        let Some(task) = self.tasks.get(&key) else {
            return;
        };
        let status = self.agent_status(
            task_id,
            Some(task.reported_executor_id()),
            state,
            reason,
            message,
        );
        self.enqueue_update(fid.clone(), status, None);
        if let Some(task) = self.tasks.get_mut(&key) {
            task.terminal_reported = true;
        }
        self.end_task_container(&key);
    }

    /// Ends `task_id`, which its executor never received, `TASK_KILLED`.
    pub(super) fn kill_undelivered(&mut self, ekey: &ExecKey, task_id: &TaskId) {
        self.end_task(
            &ekey.0,
            task_id,
            TaskState::Killed,
            Reason::ReasonTaskKilled,
            "task killed before it was delivered to its executor".into(),
        );
        if self.executors.get(ekey).is_some_and(|ex| ex.is_command) {
            self.command_executor_maybe_idle(ekey);
        } else if !self.has_live_tasks(ekey) {
            self.kill_executor(ekey, None);
        }
    }

    pub(super) fn acknowledge(&mut self, fid: FrameworkId, task_id: TaskId, uuid: String) {
        let key = (fid.clone(), task_id.clone());
        let checkpointed = self.tasks.get(&key).is_some_and(|t| t.checkpointed);
        match self
            .updates
            .acknowledge(&fid, &task_id, &uuid, checkpointed, self.now)
        {
            AckOutcome::Ignored => {
                tracing::debug!(framework_id = %fid, %task_id, %uuid, "acknowledgement for a non-head update ignored");
            }
            AckOutcome::Acknowledged { next, ended, .. } => {
                self.acknowledged += 1;
                let key = (fid.clone(), task_id.clone());
                if checkpointed {
                    // The next update goes out once the acknowledgement is
                    // durable: after a crash the stream resumes exactly
                    // where the master left it.
                    let then = (!ended).then(|| Durable::Ack {
                        framework_id: fid.clone(),
                        task_id: task_id.clone(),
                    });
                    self.actions.push(Action::Checkpoint {
                        ops: vec![Op::Wal(WalRecord::Ack {
                            framework_id: fid.clone(),
                            task_id: task_id.clone(),
                            uuid,
                        })],
                        then,
                    });
                }
                if let Some(status) = next {
                    self.send_master(agent_api::Call::StatusUpdate {
                        framework_id: fid.clone(),
                        status: *status,
                    });
                }
                if ended {
                    self.forget_task(&key);
                }
            }
        }
    }

    pub(super) fn forget_task(&mut self, key: &StreamKey) {
        let dir = self.task_meta_dir(key);
        let Some(task) = self.remove_task(key) else {
            return;
        };
        tracing::debug!(framework_id = %key.0, task_id = %key.1, "task forgotten");
        if let Some(dir) = dir {
            self.checkpoint(vec![
                Op::Wal(WalRecord::End {
                    framework_id: key.0.clone(),
                    task_id: key.1.clone(),
                }),
                Op::RemoveDir { path: dir },
            ]);
        }
        let ekey = (key.0.clone(), task.executor_id);
        if let Some(ex) = self.executors.get_mut(&ekey) {
            ex.queued.retain(|t| *t != key.1);
        }
        self.gc_executor(&ekey);
    }

    /// Records a checkpointed task in the status update log, which starts
    /// its stream: one more record in the next group commit, where a file
    /// of its own would cost a directory, a file and their syncs.
    pub(super) fn checkpoint_task(
        &mut self,
        fid: &FrameworkId,
        executor_id: &ExecutorId,
        task: &TaskInfo,
        sandbox: Option<&PathBuf>,
    ) {
        self.checkpoint(vec![task_record(fid, executor_id, task, sandbox)]);
    }

    /// The directory of a task checkpointed as a `task.json` (by an older
    /// agent): removed when the task is forgotten.
    pub(super) fn task_meta_dir(&self, key: &StreamKey) -> Option<PathBuf> {
        let task = self.tasks.get(key).filter(|t| t.checkpointed)?;
        paths::meta_task_dir(
            &self.shared.config.work_dir,
            key.0.as_str(),
            task.executor_id.as_str(),
            key.1.as_str(),
        )
        .ok()
    }

    /// Removes the checkpoint of a finished executor and the framework
    /// when nothing of them is left.
    pub(super) fn gc_executor(&mut self, ekey: &ExecKey) {
        let has_tasks = self.tasks_by_executor.contains_key(ekey);
        if !self.executors.contains_key(ekey) && !has_tasks && self.checkpointing(&ekey.0) {
            if let Ok(dir) = paths::meta_executor_dir(
                &self.shared.config.work_dir,
                ekey.0.as_str(),
                ekey.1.as_str(),
            ) {
                self.checkpoint(vec![Op::RemoveDir { path: dir }]);
            }
        }
        let fid = &ekey.0;
        let busy = self.tasks_by_framework.contains_key(fid)
            || self.executors.keys().any(|(f, _)| f == fid);
        if !busy {
            if let Some(framework) = self.frameworks.remove(fid) {
                if framework.checkpoint {
                    if let Ok(dir) =
                        paths::meta_framework_dir(&self.shared.config.work_dir, fid.as_str())
                    {
                        self.checkpoint(vec![Op::RemoveDir { path: dir }]);
                    }
                }
            }
        }
    }
}

/// The log record of a task, as written before it runs.
fn task_record(
    fid: &FrameworkId,
    executor_id: &ExecutorId,
    task: &TaskInfo,
    sandbox: Option<&PathBuf>,
) -> Op {
    Op::Wal(WalRecord::Task {
        framework_id: fid.clone(),
        executor_id: executor_id.clone(),
        task: Box::new(task.clone()),
        sandbox: sandbox.cloned(),
    })
}
