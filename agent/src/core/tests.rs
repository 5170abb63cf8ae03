//! The agent core on its own: inputs in, actions out, no IO.

use super::*;

use std::net::SocketAddr;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;

use agora_proto::MasterInfo;

use crate::Config;

#[test]
fn token_comparison() {
    assert!(tokens_equal("abc", "abc"));
    assert!(!tokens_equal("abc", "abd"));
    assert!(!tokens_equal("abc", "abcd"));
}

const MASTER: u64 = 1;

/// A core registered with a master, and the actions of its last input.
struct H {
    core: Core,
    now: Instant,
    _dir: tempfile::TempDir,
}

impl H {
    fn new() -> H {
        H::with(|_| {})
    }

    /// An agent whose configuration `adjust` changed.
    fn with(adjust: impl FnOnce(&mut Config)) -> H {
        H::start(adjust, None)
    }

    /// An agent that restarted and found `recovered` on disk.
    fn restarted(recovered: Recovered) -> H {
        H::start(|_| {}, Some(recovered))
    }

    fn start(adjust: impl FnOnce(&mut Config), recovered: Option<Recovered>) -> H {
        let dir = tempfile::tempdir().expect("temp dir");
        let mut config = Config::new("master:5050", dir.path().to_path_buf());
        config.users = crate::users::UserPolicy::agent_user();
        config.resources = Resources::parse("cpus:8;mem:8192").expect("resources");
        config.command_executor = vec!["command-executor".into()];
        config.executor_shutdown_grace_period = Duration::from_secs(3);
        adjust(&mut config);
        let listen: SocketAddr = ([127, 0, 0, 1], 5051).into();
        let shared = Shared {
            executor_endpoint: format!("ws://{listen}/api/executor"),
            listen,
            config: Arc::new(config),
            next_conn: Arc::new(AtomicU64::new(100)),
            counters: Arc::default(),
            identity: Arc::new(crate::identity::ExecutorIdentity::new(&[3; 32])),
            client_tls: None,
            delegates_cgroups: false,
        };
        let now = Instant::now();
        let mut core = Core::new(shared, 7, now, 1_000.0);
        if let Some(recovered) = recovered {
            core.recover(recovered, now, 1_000.0);
        }
        let mut h = H {
            core,
            now,
            _dir: dir,
        };
        h.input(Input::MasterConnected {
            conn: MASTER,
            local_ip: None,
        });
        h.master(agent_api::Event::Registered {
            agent_id: AgentId::new("a1"),
            ping_interval_seconds: 5.0,
            master_info: MasterInfo {
                id: "m".into(),
                address: "master:5050".into(),
                version: "test".into(),
            },
            reregistered: false,
        });
        h
    }

    fn input(&mut self, input: Input) -> Vec<Action> {
        self.core.handle(input, self.now, 1_000.0);
        self.core.take_actions()
    }

    fn master(&mut self, event: agent_api::Event) -> Vec<Action> {
        self.input(Input::MasterEvent {
            conn: MASTER,
            event: Box::new(event),
        })
    }

    /// Runs task `id` of framework `fw` on its own custom executor `e-<id>`
    /// and completes every checkpoint asked for.
    fn run(&mut self, id: &str) -> Vec<Action> {
        let actions = self.master(agent_api::Event::RunTask {
            framework: framework(),
            task: custom_task(id),
        });
        self.complete(actions)
    }

    /// Completes the checkpoints among `actions`; returns them and what
    /// the completions led to.
    fn complete(&mut self, actions: Vec<Action>) -> Vec<Action> {
        let mut all = Vec::new();
        let mut next = actions;
        while !next.is_empty() {
            let mut later = Vec::new();
            for action in next {
                if let Action::Checkpoint {
                    then: Some(then), ..
                } = &action
                {
                    let then = clone_durable(then);
                    later.extend(self.input(Input::Durable(then, Ok(()))));
                }
                all.push(action);
            }
            next = later;
        }
        all
    }

    fn subscribe(&mut self, conn: u64, id: &str, tasks: Vec<TaskInfo>) -> Vec<Action> {
        let token = self
            .core
            .executors
            .get(&ekey(id))
            .map(|e| e.token.clone())
            .expect("executor");
        self.input(Input::ExecutorSubscribe {
            conn,
            framework_id: fid(),
            executor_id: ExecutorId::new(format!("e-{id}")),
            token: Some(token),
            updates: Vec::new(),
            tasks,
        })
    }

    /// The executor on connection `conn` sends an update of task `task`;
    /// the checkpoints asked for are completed.
    fn executor_sends(
        &mut self,
        conn: u64,
        task: &str,
        state: TaskState,
        uuid: &str,
    ) -> Vec<Action> {
        let actions = self.input(Input::ExecutorCall {
            conn,
            call: exec_api::Call::Update {
                status: executor_status(task, state, uuid),
            },
        });
        self.complete(actions)
    }

    /// The master acknowledges update `uuid` of task `task`; the
    /// checkpoints asked for are completed.
    fn master_acks(&mut self, task: &str, uuid: &str) -> Vec<Action> {
        let actions = self.master(agent_api::Event::Acknowledge {
            framework_id: fid(),
            task_id: TaskId::new(task),
            uuid: uuid.into(),
        });
        self.complete(actions)
    }

    /// The tasks the agent reports (id and state) when it registers again
    /// after its master connection broke (left waiting for the answer).
    fn reregistration(&mut self) -> Vec<(String, TaskState)> {
        self.input(Input::MasterDisconnected { conn: MASTER });
        let actions = self.input(Input::MasterConnected {
            conn: MASTER,
            local_ip: None,
        });
        let mut tasks: Vec<(String, TaskState)> = actions
            .into_iter()
            .find_map(|a| match a {
                Action::ToMaster {
                    call: agent_api::Call::Register { tasks, .. },
                    ..
                } => Some(tasks),
                _ => None,
            })
            .expect("a registration")
            .into_iter()
            .map(|t| (t.task.task_id.to_string(), t.state))
            .collect();
        tasks.sort_by(|a, b| a.0.cmp(&b.0));
        tasks
    }

    /// The tasks the agent holds: id, executor, state and updates not
    /// acknowledged by the master.
    fn tasks(&self) -> Vec<(String, String, TaskState, usize)> {
        self.core
            .task_views()
            .into_iter()
            .map(|(_, tid, eid, state, pending)| (tid.to_string(), eid.to_string(), state, pending))
            .collect()
    }

    fn launched_ok(&mut self, id: &str) -> Vec<Action> {
        let run_id = self.core.executors[&ekey(id)].run_id.clone();
        self.input(Input::ExecutorLaunched {
            key: ekey(id),
            run_id,
            result: Ok(Started {
                pid: 4242,
                start_time: None,
            }),
        })
    }
}

fn clone_durable(d: &Durable) -> Durable {
    match d {
        Durable::Update {
            framework_id,
            status,
            ack_to,
        } => Durable::Update {
            framework_id: framework_id.clone(),
            status: status.clone(),
            ack_to: ack_to.clone(),
        },
        Durable::Ack {
            framework_id,
            task_id,
        } => Durable::Ack {
            framework_id: framework_id.clone(),
            task_id: task_id.clone(),
        },
        Durable::Task { key } => Durable::Task { key: key.clone() },
        Durable::Tasks { keys } => Durable::Tasks { keys: keys.clone() },
    }
}

fn fid() -> FrameworkId {
    FrameworkId::new("fw")
}

fn ekey(id: &str) -> ExecKey {
    (fid(), ExecutorId::new(format!("e-{id}")))
}

fn framework() -> FrameworkInfo {
    serde_json::from_value(json!({
        "user": "u", "name": "fw", "id": "fw", "checkpoint": true
    }))
    .expect("framework info")
}

fn custom_task(id: &str) -> TaskInfo {
    serde_json::from_value(json!({
        "name": id,
        "task_id": id,
        "agent_id": "a1",
        "resources": resources("cpus:1;mem:64"),
        "executor": {
            "executor_id": format!("e-{id}"),
            "command": {"value": "run-executor"},
            "resources": resources("cpus:0.1;mem:32")
        }
    }))
    .expect("task info")
}

fn resources(text: &str) -> serde_json::Value {
    serde_json::to_value(Resources::parse(text).expect("resources")).expect("json")
}

fn launches(actions: &[Action]) -> usize {
    actions
        .iter()
        .filter(|a| matches!(a, Action::Process(Request::Launch { .. })))
        .count()
}

fn to_executor(actions: &[Action], conn: u64) -> Vec<&exec_api::Event> {
    actions
        .iter()
        .filter_map(|a| match a {
            Action::ToExecutor { conn: c, event, .. } if *c == conn => Some(event),
            _ => None,
        })
        .collect()
}

fn launched_to(actions: &[Action], conn: u64) -> Vec<String> {
    to_executor(actions, conn)
        .into_iter()
        .filter_map(|e| match e {
            exec_api::Event::Launch { task, .. } => Some(task.task_id.to_string()),
            _ => None,
        })
        .collect()
}

/// The updates among `actions` that go to disk.
fn checkpointed_statuses(actions: &[Action]) -> Vec<&TaskStatus> {
    actions
        .iter()
        .filter_map(|a| match a {
            Action::Checkpoint {
                then: Some(Durable::Update { status, .. }),
                ..
            } => Some(status),
            _ => None,
        })
        .collect()
}

/// Updates the core asked to checkpoint (its own, e.g. `TASK_KILLED`):
/// task and state.
fn checkpointed_updates(actions: &[Action]) -> Vec<(String, TaskState)> {
    checkpointed_statuses(actions)
        .into_iter()
        .map(|status| (status.task_id.to_string(), status.state))
        .collect()
}

fn to_master_updates(actions: &[Action]) -> Vec<(String, TaskState)> {
    actions
        .iter()
        .filter_map(|a| match a {
            Action::ToMaster {
                call: agent_api::Call::StatusUpdate { status, .. },
                ..
            } => Some((status.task_id.to_string(), status.state)),
            _ => None,
        })
        .collect()
}

fn executor_status(task: &str, state: TaskState, uuid: &str) -> TaskStatus {
    let mut status = TaskStatus::new(TaskId::new(task), state, Source::SourceExecutor);
    status.uuid = Some(uuid.into());
    status
}

/// The acknowledgements executor connection `conn` was sent: task, uuid.
fn acks_to(actions: &[Action], conn: u64) -> Vec<(String, String)> {
    to_executor(actions, conn)
        .into_iter()
        .filter_map(|e| match e {
            exec_api::Event::Acknowledged { task_id, uuid } => {
                Some((task_id.to_string(), uuid.clone()))
            }
            _ => None,
        })
        .collect()
}

/// The tasks whose record the core asked to write.
fn task_records(actions: &[Action]) -> Vec<String> {
    actions
        .iter()
        .filter_map(|a| match a {
            Action::Checkpoint { ops, .. } => Some(ops),
            _ => None,
        })
        .flatten()
        .filter_map(|op| match op {
            Op::Wal(WalRecord::Task { task, .. }) => Some(task.task_id.to_string()),
            _ => None,
        })
        .collect()
}

#[test]
fn a_task_starts_only_once_its_checkpoint_is_durable() {
    // Found by the simulation: the agent sent a task to its executor
    // before the task's record reached the disk; a crash in between left
    // a restarted agent that could not report the task, and the master
    // answered a reconciliation TASK_LOST for a task that then ran.
    let mut h = H::new();
    let actions = h.master(agent_api::Event::RunTask {
        framework: framework(),
        task: custom_task("t1"),
    });
    assert_eq!(launches(&actions), 0, "{actions:?}");
    let key = (fid(), TaskId::new("t1"));
    assert!(actions.iter().any(|a| matches!(
        a,
        Action::Checkpoint { then: Some(Durable::Task { key: k }), .. } if *k == key
    )));
    let actions = h.input(Input::Durable(Durable::Task { key }, Ok(())));
    assert_eq!(launches(&actions), 1, "{actions:?}");
}

#[test]
fn a_task_killed_while_its_checkpoint_is_written_never_starts() {
    let mut h = H::new();
    h.master(agent_api::Event::RunTask {
        framework: framework(),
        task: custom_task("t1"),
    });
    h.master(agent_api::Event::KillTask {
        framework_id: fid(),
        task_id: TaskId::new("t1"),
    });
    let key = (fid(), TaskId::new("t1"));
    let actions = h.input(Input::Durable(Durable::Task { key }, Ok(())));
    assert_eq!(launches(&actions), 0, "{actions:?}");
    assert_eq!(
        checkpointed_updates(&actions),
        [("t1".to_string(), TaskState::Killed)]
    );
}

fn command_task_with_uri(id: &str) -> TaskInfo {
    serde_json::from_value(json!({
        "name": id,
        "task_id": id,
        "agent_id": "a1",
        "resources": resources("cpus:1;mem:64"),
        "command": {"value": "./run.sh", "uris": [{"value": "/srv/run.sh", "executable": true}]}
    }))
    .expect("task info")
}

fn fetches(actions: &[Action]) -> Vec<String> {
    actions
        .iter()
        .filter_map(|a| match a {
            Action::Process(Request::Fetch { key, uris, .. }) => {
                assert_eq!(uris[0].value, "/srv/run.sh");
                Some(key.1.to_string())
            }
            _ => None,
        })
        .collect()
}

#[test]
fn a_command_task_starts_only_once_its_uris_are_fetched_and_its_checkpoint_durable() {
    let key = (fid(), TaskId::new("t1"));
    // Checkpoint first, then the fetch.
    let mut h = H::new();
    let actions = h.master(agent_api::Event::RunTask {
        framework: framework(),
        task: command_task_with_uri("t1"),
    });
    assert_eq!(fetches(&actions), ["t1"]);
    let actions = h.input(Input::Durable(Durable::Task { key: key.clone() }, Ok(())));
    assert_eq!(launches(&actions), 0, "{actions:?}");
    let actions = h.input(Input::TaskFetched {
        key: key.clone(),
        result: Ok(TaskEntry::default()),
    });
    assert_eq!(launches(&actions), 1, "{actions:?}");

    // The fetch first, then the checkpoint.
    let mut h = H::new();
    h.master(agent_api::Event::RunTask {
        framework: framework(),
        task: command_task_with_uri("t1"),
    });
    let actions = h.input(Input::TaskFetched {
        key: key.clone(),
        result: Ok(TaskEntry::default()),
    });
    assert_eq!(launches(&actions), 0, "{actions:?}");
    let actions = h.input(Input::Durable(Durable::Task { key }, Ok(())));
    assert_eq!(launches(&actions), 1, "{actions:?}");

    // A task without URIs asks for no fetch.
    let mut h = H::new();
    let mut task = command_task_with_uri("t2");
    task.command.as_mut().expect("command").uris.clear();
    let actions = h.master(agent_api::Event::RunTask {
        framework: framework(),
        task,
    });
    assert!(fetches(&actions).is_empty());
    assert!(actions
        .iter()
        .any(|a| matches!(a, Action::Process(Request::CreateDir { .. }))));
}

#[test]
fn a_command_task_whose_uri_cannot_be_fetched_fails_without_starting() {
    let key = (fid(), TaskId::new("t1"));
    let mut h = H::new();
    h.master(agent_api::Event::RunTask {
        framework: framework(),
        task: command_task_with_uri("t1"),
    });
    h.input(Input::Durable(Durable::Task { key: key.clone() }, Ok(())));
    let actions = h.input(Input::TaskFetched {
        key: key.clone(),
        result: Err("failed to fetch URI '/srv/run.sh': gone".into()),
    });
    assert_eq!(launches(&actions), 0, "{actions:?}");
    let failed = *checkpointed_statuses(&actions).first().expect("an update");
    assert_eq!(failed.state, TaskState::Failed);
    assert_eq!(failed.reason, Some(Reason::ReasonExecutorLaunchFailed));
    assert_eq!(
        failed.message.as_deref(),
        Some("failed to launch task t1: failed to fetch URI '/srv/run.sh': gone")
    );

    // Killed while fetching: TASK_KILLED, whatever the fetch did.
    let mut h = H::new();
    h.master(agent_api::Event::RunTask {
        framework: framework(),
        task: command_task_with_uri("t1"),
    });
    h.master(agent_api::Event::KillTask {
        framework_id: fid(),
        task_id: TaskId::new("t1"),
    });
    h.input(Input::Durable(Durable::Task { key: key.clone() }, Ok(())));
    let actions = h.input(Input::TaskFetched {
        key,
        result: Err("failed to fetch URI '/srv/run.sh': gone".into()),
    });
    assert_eq!(launches(&actions), 0, "{actions:?}");
    assert_eq!(
        checkpointed_updates(&actions),
        [("t1".to_string(), TaskState::Killed)]
    );
}

#[test]
fn a_launch_lost_with_a_broken_executor_connection_is_sent_again() {
    // Found by the simulation: the executor's connection broke with the
    // launch in it; the executor re-subscribed without the task and the
    // task stayed STAGING for ever.
    let mut h = H::new();
    h.run("t1");
    h.launched_ok("t1");
    let actions = h.subscribe(10, "t1", Vec::new());
    assert_eq!(launched_to(&actions, 10), ["t1"]);
    // The connection breaks before the executor read it.
    h.input(Input::ExecutorDisconnected { conn: 10 });
    let actions = h.subscribe(11, "t1", Vec::new());
    assert_eq!(launched_to(&actions, 11), ["t1"], "{actions:?}");
    // An executor that has the task (it lists it) does not get it twice.
    h.input(Input::ExecutorDisconnected { conn: 11 });
    let actions = h.subscribe(12, "t1", vec![custom_task("t1")]);
    assert!(launched_to(&actions, 12).is_empty(), "{actions:?}");
}

#[test]
fn a_kill_of_a_launch_lost_with_the_connection_ends_the_task_killed() {
    let mut h = H::new();
    h.run("t1");
    h.launched_ok("t1");
    h.subscribe(10, "t1", Vec::new());
    h.input(Input::ExecutorDisconnected { conn: 10 });
    h.master(agent_api::Event::KillTask {
        framework_id: fid(),
        task_id: TaskId::new("t1"),
    });
    let actions = h.subscribe(11, "t1", Vec::new());
    assert!(launched_to(&actions, 11).is_empty(), "{actions:?}");
    assert_eq!(
        checkpointed_updates(&actions),
        [("t1".to_string(), TaskState::Killed)]
    );
}

#[test]
fn a_container_out_of_memory_fails_its_tasks_with_the_limitation() {
    use agora_containerizer::{Isolation, Limitation, Limits};
    let mut h = H::with(|c| c.isolation = Isolation::Cgroups);
    let actions = h.run("t1");
    // The container holds the executor's resources and the task's.
    let limits = actions.iter().find_map(|a| match a {
        Action::Process(Request::Launch { spec, .. }) => Some(spec.limits),
        _ => None,
    });
    let expected = Limits {
        cpus: 1.1,
        mem_mib: 96.0,
        pids: None,
    };
    assert!(
        limits
            .flatten()
            .is_some_and(|l| (l.cpus - expected.cpus).abs() < 1e-9
                && l.mem_mib == expected.mem_mib
                && l.pids.is_none()),
        "{limits:?}"
    );
    h.launched_ok("t1");
    h.subscribe(10, "t1", Vec::new());
    let run_id = h.core.executors[&ekey("t1")].run_id.clone();
    let actions = h.input(Input::ContainerLimited {
        key: ekey("t1"),
        run_id: run_id.clone(),
        limitation: Limitation {
            reason: Reason::ReasonContainerLimitationMemory,
            message: "Memory limit exceeded: 96 MiB".into(),
        },
    });
    // Destroyed at once.
    assert!(
        actions.iter().any(|a| matches!(
            a,
            Action::Process(Request::Terminate { grace, .. }) if grace.is_zero()
        )),
        "{actions:?}"
    );
    // The executor saw its command killed; the task failed of the limit.
    let status = TaskStatus::new(TaskId::new("t1"), TaskState::Failed, Source::SourceExecutor)
        .with_message("command exited with status 137");
    let mut status = status;
    status.uuid = Some("u1".into());
    let actions = h.input(Input::ExecutorCall {
        conn: 10,
        call: exec_api::Call::Update { status },
    });
    let checkpointed = checkpointed_statuses(&actions);
    assert_eq!(checkpointed.len(), 1, "{actions:?}");
    assert_eq!(checkpointed[0].state, TaskState::Failed);
    assert_eq!(
        checkpointed[0].reason,
        Some(Reason::ReasonContainerLimitationMemory)
    );
    assert_eq!(
        checkpointed[0].message.as_deref(),
        Some("Memory limit exceeded: 96 MiB")
    );
}

#[test]
fn a_command_task_in_a_container_of_its_own_ends_once_the_container_is_gone() {
    use agora_containerizer::{Isolation, Limitation, Limits};
    let mut h = H::with(|c| c.isolation = Isolation::Cgroups);
    let mut task = command_task_with_uri("t1");
    task.command.as_mut().expect("command").uris.clear();
    let actions = h.master(agent_api::Event::RunTask {
        framework: framework(),
        task,
    });
    // The task's container is named by its sandbox's run, with its
    // resources.
    let sandbox = actions
        .iter()
        .find_map(|a| match a {
            Action::Process(Request::CreateDir { path, .. }) => Some(path.clone()),
            _ => None,
        })
        .expect("a sandbox for the task");
    let (key, name, limits) = actions
        .iter()
        .find_map(|a| match a {
            Action::Process(Request::TaskContainer {
                key, name, limits, ..
            }) => Some((key.clone(), name.clone(), *limits)),
            _ => None,
        })
        .expect("a container for the task");
    assert_eq!(name, crate::paths::run_id_of(&sandbox));
    assert_eq!((limits.cpus, limits.mem_mib), (1.0, 64.0));
    let actions = h.complete(actions);
    assert_eq!(launches(&actions), 0, "{actions:?}");
    let files = vec!["/cgroup/freezer/agora/run/tasks".to_string()];
    let actions = h.input(Input::TaskFetched {
        key: key.clone(),
        result: Ok(TaskEntry {
            files: files.clone(),
            lasting: Some("first-run".into()),
        }),
    });
    // The command executor's own container holds only the executor.
    let (ekey, spec) = actions
        .iter()
        .find_map(|a| match a {
            Action::Process(Request::Launch { key, spec, .. }) => Some((key.clone(), spec)),
            _ => None,
        })
        .expect("a command executor");
    let own = Limits::of(&Resources::parse(COMMAND_EXECUTOR_RESOURCES).expect("resources"));
    assert_eq!(spec.limits, Some(own));
    let run_id = h.core.executors[&ekey].run_id.clone();
    let token = h.core.executors[&ekey].token.clone();
    h.input(Input::ExecutorLaunched {
        key: ekey.clone(),
        run_id,
        result: Ok(Started {
            pid: 4242,
            start_time: None,
        }),
    });
    let actions = h.input(Input::ExecutorSubscribe {
        conn: 10,
        framework_id: fid(),
        executor_id: ekey.1.clone(),
        token: Some(token),
        updates: Vec::new(),
        tasks: Vec::new(),
    });
    // The executor is told where the task's process goes.
    let entry = actions.iter().find_map(|a| match a {
        Action::ToExecutor {
            event: exec_api::Event::Launch {
                cgroups, container, ..
            },
            ..
        } => Some((cgroups.clone(), container.clone())),
        _ => None,
    });
    assert_eq!(
        entry,
        Some((files, Some("first-run".to_string()))),
        "{actions:?}"
    );
    // Its terminal update waits for the container to be ended (repeats
    // too), then goes on as the container's limitation.
    for _ in 0..2 {
        let actions = h.executor_sends(10, "t1", TaskState::Failed, "u1");
        assert!(checkpointed_updates(&actions).is_empty(), "{actions:?}");
        let ends: Vec<_> = actions
            .iter()
            .filter(|a| matches!(a, Action::Process(Request::EndTaskContainer { name: n, .. }) if *n == name))
            .collect();
        assert!(ends.len() <= 1, "{actions:?}");
    }
    let actions = h.input(Input::TaskContainerEnded {
        key,
        limitation: Some(Limitation {
            reason: Reason::ReasonContainerLimitationMemory,
            message: "Memory limit exceeded: 64 MiB".into(),
        }),
    });
    let checkpointed = checkpointed_statuses(&actions);
    assert_eq!(checkpointed.len(), 1, "{actions:?}");
    assert_eq!(checkpointed[0].state, TaskState::Failed);
    assert_eq!(
        checkpointed[0].reason,
        Some(Reason::ReasonContainerLimitationMemory)
    );
}

#[test]
fn without_cgroups_executors_get_no_container() {
    let mut h = H::new();
    let actions = h.run("t1");
    assert!(actions.iter().any(|a| matches!(
        a,
        Action::Process(Request::Launch { spec, .. }) if spec.limits.is_none()
    )));
}

#[test]
fn an_executor_that_does_not_kill_its_task_in_time_is_shut_down() {
    // Found by the simulation: a hung executor kept its task for ever;
    // the framework's kills went unanswered.
    let mut h = H::new();
    h.run("t1");
    h.launched_ok("t1");
    h.subscribe(10, "t1", Vec::new());
    let actions = h.master(agent_api::Event::KillTask {
        framework_id: fid(),
        task_id: TaskId::new("t1"),
    });
    let timer = actions
        .iter()
        .find_map(|a| match a {
            Action::Timer {
                after,
                timer: timer @ Timer::KillOverrun { .. },
            } => Some((*after, timer.clone())),
            _ => None,
        })
        .expect("a kill overrun timer");
    assert_eq!(timer.0, Duration::from_secs(3));
    let actions = h.input(Input::Timer(timer.1));
    assert!(
        to_executor(&actions, 10)
            .iter()
            .any(|e| matches!(e, exec_api::Event::Shutdown { .. })),
        "{actions:?}"
    );
    // When the executor is gone, the task ends KILLED (not FAILED).
    let run_id = h.core.executors[&ekey("t1")].run_id.clone();
    let actions = h.input(Input::ExecutorExited {
        key: ekey("t1"),
        run_id,
        code: Some(0),
        message: "exited with status 0".into(),
    });
    assert!(checkpointed_updates(&actions).is_empty(), "{actions:?}");
    // Once its connection has drained.
    let actions = h.input(Input::ExecutorDisconnected { conn: 10 });
    assert_eq!(
        checkpointed_updates(&actions),
        [("t1".to_string(), TaskState::Killed)]
    );
}

#[test]
fn updates_of_an_agent_the_master_removed_are_dropped() {
    // Found by the simulation: a removed agent's updates, on their way to
    // disk when the master shut it down, went out after it registered
    // anew and gave tasks the master had declared lost a second terminal
    // state.
    let mut h = H::new();
    h.run("t1");
    h.launched_ok("t1");
    h.subscribe(10, "t1", Vec::new());
    let status: TaskStatus = serde_json::from_value(json!({
        "task_id": "t1", "state": "TASK_RUNNING", "source": "SOURCE_EXECUTOR",
        "uuid": "u-1", "timestamp": 1.0
    }))
    .expect("status");
    let actions = h.input(Input::ExecutorCall {
        conn: 10,
        call: exec_api::Call::Update {
            status: status.clone(),
        },
    });
    let durable = actions
        .iter()
        .find_map(|a| match a {
            Action::Checkpoint { then: Some(d), .. } => Some(clone_durable(d)),
            _ => None,
        })
        .expect("the update is checkpointed");
    h.master(agent_api::Event::Shutdown {
        message: "agent a1 was removed by the master; register as a new agent".into(),
    });
    let actions = h.input(Input::Durable(durable, Ok(())));
    assert!(to_master_updates(&actions).is_empty(), "{actions:?}");
}

/// Runs task `t1` on executor `e-t1` (connection 10) to `TASK_FINISHED`:
/// the executor reports `old-1` (running) and `old-2` (finished), the
/// master acknowledges both and the agent forgets the task.
fn run_t1_to_its_end() -> H {
    let mut h = H::new();
    h.run("t1");
    h.launched_ok("t1");
    let actions = h.subscribe(10, "t1", Vec::new());
    assert_eq!(launched_to(&actions, 10), ["t1"]);
    for (state, uuid) in [
        (TaskState::Running, "old-1"),
        (TaskState::Finished, "old-2"),
    ] {
        let actions = h.executor_sends(10, "t1", state, uuid);
        assert_eq!(to_master_updates(&actions), [("t1".to_string(), state)]);
        assert_eq!(
            acks_to(&actions, 10),
            [("t1".to_string(), uuid.to_string())]
        );
        h.master_acks("t1", uuid);
    }
    assert!(h.tasks().is_empty(), "t1 is forgotten: {:?}", h.tasks());
    h
}

#[test]
fn a_resent_update_of_an_ended_task_does_not_touch_a_new_task_with_its_id() {
    // Found by the simulation: the executor re-sent an update of the
    // earlier t1 (its acknowledgement was lost) once the master had
    // launched a new t1 on it; the agent applied it to the new t1, which
    // it ended, and dropped the new t1's own updates.
    let mut h = run_t1_to_its_end();
    let actions = h.run("t1");
    assert_eq!(launched_to(&actions, 10), ["t1"], "{actions:?}");

    for (state, uuid) in [
        (TaskState::Running, "old-1"),
        (TaskState::Finished, "old-2"),
    ] {
        let actions = h.executor_sends(10, "t1", state, uuid);
        assert_eq!(
            acks_to(&actions, 10),
            [("t1".to_string(), uuid.to_string())],
            "the executor may drop it"
        );
        assert!(to_master_updates(&actions).is_empty(), "{actions:?}");
        assert!(checkpointed_updates(&actions).is_empty(), "{actions:?}");
    }
    // The same through a re-subscription that re-sends it.
    h.input(Input::ExecutorDisconnected { conn: 10 });
    let actions = h.input(Input::ExecutorSubscribe {
        conn: 11,
        framework_id: fid(),
        executor_id: ekey("t1").1,
        token: Some(h.core.executors[&ekey("t1")].token.clone()),
        updates: vec![executor_status("t1", TaskState::Finished, "old-2")],
        tasks: vec![custom_task("t1")],
    });
    let actions = h.complete(actions);
    assert_eq!(
        acks_to(&actions, 11),
        [("t1".to_string(), "old-2".to_string())]
    );
    assert!(to_master_updates(&actions).is_empty(), "{actions:?}");
    assert!(checkpointed_updates(&actions).is_empty(), "{actions:?}");
    assert!(launched_to(&actions, 11).is_empty(), "the executor has it");

    // The new t1 is untouched, still live, and its own updates go on.
    assert_eq!(
        h.tasks(),
        [("t1".into(), "e-t1".into(), TaskState::Staging, 0)]
    );
    assert_eq!(h.core.live_tasks(&ekey("t1")), 1);
    let actions = h.executor_sends(11, "t1", TaskState::Running, "new-1");
    assert_eq!(
        to_master_updates(&actions),
        [("t1".to_string(), TaskState::Running)]
    );
    assert_eq!(
        acks_to(&actions, 11),
        [("t1".to_string(), "new-1".to_string())]
    );
    // Its executor dies: the new t1 fails (it is not taken for ended).
    let run_id = h.core.executors[&ekey("t1")].run_id.clone();
    h.input(Input::ExecutorExited {
        key: ekey("t1"),
        run_id,
        code: Some(1),
        message: "exited with status 1".into(),
    });
    let actions = h.input(Input::ExecutorDisconnected { conn: 11 });
    assert_eq!(
        checkpointed_updates(&actions),
        [("t1".to_string(), TaskState::Failed)]
    );
}

#[test]
fn an_executor_resubscribing_with_a_task_that_ended_here_does_not_get_it_back() {
    // The agent's acknowledgements of t1's updates to its executor were
    // lost with the connection; meanwhile the master acknowledged t1's
    // end and the agent forgot t1. The executor lists t1 again and
    // re-sends its update: t1 ended here, it is not adopted as STAGING.
    let mut h = run_t1_to_its_end();
    h.input(Input::ExecutorDisconnected { conn: 10 });
    let actions = h.input(Input::ExecutorSubscribe {
        conn: 11,
        framework_id: fid(),
        executor_id: ekey("t1").1,
        token: Some(h.core.executors[&ekey("t1")].token.clone()),
        updates: vec![
            executor_status("t1", TaskState::Running, "old-1"),
            executor_status("t1", TaskState::Finished, "old-2"),
        ],
        tasks: vec![custom_task("t1")],
    });
    let actions = h.complete(actions);
    assert_eq!(
        acks_to(&actions, 11),
        [
            ("t1".to_string(), "old-1".to_string()),
            ("t1".to_string(), "old-2".to_string())
        ],
        "{actions:?}"
    );
    assert!(to_master_updates(&actions).is_empty(), "{actions:?}");
    assert!(checkpointed_updates(&actions).is_empty(), "{actions:?}");
    assert!(task_records(&actions).is_empty(), "{actions:?}");
    assert!(launched_to(&actions, 11).is_empty(), "{actions:?}");
    assert!(h.tasks().is_empty(), "{:?}", h.tasks());
    assert!(h.reregistration().is_empty());
}

#[test]
fn an_update_of_an_earlier_task_resent_before_the_new_one_reached_the_executor_is_dropped() {
    // Found by the simulation (seed 589 of issue 25): the agent restarted
    // while t1's executor still held an unacknowledged TASK_FINISHED of
    // an earlier t1 the master had settled; a new t1 arrived before the
    // executor re-subscribed. The executor re-sent the old update: taken
    // for the new t1's, it ended the new t1's stream before it began,
    // and the new t1's own updates were dropped as after its end.
    let mut info = custom_task("t1").executor.expect("an executor");
    info.framework_id = Some(fid());
    let recovered = Recovered {
        agent_id: Some(AgentId::new("a1")),
        frameworks: vec![checkpoint::RecoveredFramework {
            info: framework(),
            executors: vec![checkpoint::RecoveredExecutor {
                executor_id: "e-t1".into(),
                record: Some(ExecutorRecord {
                    framework_id: fid(),
                    info,
                    run_id: "run-1".into(),
                    token: "token-1".into(),
                    pid: Some(4242),
                    start_time: None,
                    sandbox: PathBuf::from("/sandboxes/e-t1"),
                    is_command: false,
                }),
                tasks: Vec::new(),
            }],
        }],
        orphans: Vec::new(),
        alive: ["run-1".to_string()].into_iter().collect(),
    };
    let mut h = H::restarted(recovered);
    let actions = h.run("t1");
    assert!(launched_to(&actions, 10).is_empty(), "not subscribed yet");
    let actions = h.input(Input::ExecutorSubscribe {
        conn: 10,
        framework_id: fid(),
        executor_id: ekey("t1").1,
        token: Some("token-1".into()),
        updates: vec![executor_status("t1", TaskState::Finished, "old-2")],
        tasks: Vec::new(),
    });
    let actions = h.complete(actions);
    assert_eq!(
        acks_to(&actions, 10),
        [("t1".to_string(), "old-2".to_string())]
    );
    assert!(to_master_updates(&actions).is_empty(), "{actions:?}");
    assert!(checkpointed_updates(&actions).is_empty(), "{actions:?}");
    assert_eq!(launched_to(&actions, 10), ["t1"], "{actions:?}");
    // The new t1's own update goes on.
    let actions = h.executor_sends(10, "t1", TaskState::Running, "new-1");
    assert_eq!(
        to_master_updates(&actions),
        [("t1".to_string(), TaskState::Running)]
    );
}

#[test]
fn an_executor_resubscribing_with_tasks_the_agent_lost_in_a_restart_gets_them_adopted() {
    // The agent restarted without the record of t1 and t2 (it never
    // reached the disk); their executor survived and lists them. Neither
    // has an update the agent knows (t2's RUNNING, re-sent, went down
    // with the agent): both are adopted, recorded again, and t2's update
    // goes on to the master.
    let mut info = custom_task("t1").executor.expect("an executor");
    info.framework_id = Some(fid());
    let recovered = Recovered {
        agent_id: Some(AgentId::new("a1")),
        frameworks: vec![checkpoint::RecoveredFramework {
            info: framework(),
            executors: vec![checkpoint::RecoveredExecutor {
                executor_id: "e-t1".into(),
                record: Some(ExecutorRecord {
                    framework_id: fid(),
                    info,
                    run_id: "run-1".into(),
                    token: "token-1".into(),
                    pid: Some(4242),
                    start_time: None,
                    sandbox: PathBuf::from("/sandboxes/e-t1"),
                    is_command: false,
                }),
                tasks: Vec::new(),
            }],
        }],
        orphans: Vec::new(),
        alive: ["run-1".to_string()].into_iter().collect(),
    };
    let mut h = H::restarted(recovered);
    let mut t2 = custom_task("t2");
    t2.executor = custom_task("t1").executor;
    let actions = h.input(Input::ExecutorSubscribe {
        conn: 10,
        framework_id: fid(),
        executor_id: ekey("t1").1,
        token: Some("token-1".into()),
        updates: vec![executor_status("t2", TaskState::Running, "lost-1")],
        tasks: vec![custom_task("t1"), t2],
    });
    let actions = h.complete(actions);
    let mut recorded = task_records(&actions);
    recorded.sort();
    assert_eq!(recorded, ["t1", "t2"], "{actions:?}");
    assert!(
        launched_to(&actions, 10).is_empty(),
        "the executor has them"
    );
    assert_eq!(
        to_master_updates(&actions),
        [("t2".to_string(), TaskState::Running)]
    );
    assert_eq!(
        acks_to(&actions, 10),
        [("t2".to_string(), "lost-1".to_string())]
    );
    assert_eq!(
        h.tasks(),
        [
            ("t1".into(), "e-t1".into(), TaskState::Staging, 0),
            ("t2".into(), "e-t1".into(), TaskState::Running, 1)
        ]
    );
    assert_eq!(
        h.reregistration(),
        [
            ("t1".to_string(), TaskState::Staging),
            ("t2".to_string(), TaskState::Running)
        ]
    );
}

/// Task `id` of group `group` on custom executor `e-grp` (speaking the
/// Mesos v1 API when `mesos`), with a command for the executor.
fn group_task(id: &str, group: &str, mesos: bool) -> TaskInfo {
    serde_json::from_value(json!({
        "name": id,
        "task_id": id,
        "agent_id": "a1",
        "resources": resources("cpus:1;mem:64"),
        "command": {"value": format!("echo {id}")},
        "executor": {
            "executor_id": "e-grp",
            "command": {"value": "run-executor"},
            "resources": resources("cpus:0.1;mem:32"),
            "api": if mesos { "MESOS_V1" } else { "AGORA" },
            "shutdown_grace_period": 7.0,
        },
        "task_group": group,
    }))
    .expect("task info")
}

/// What executor `e-grp` is sent when it subscribes on `conn` (on the
/// Mesos v1 API when `mesos`, else with its token).
fn subscribe_group_executor(h: &mut H, conn: u64, mesos: bool) -> Vec<Action> {
    let key = (fid(), ExecutorId::new("e-grp"));
    let ex = &h.core.executors[&key];
    let (run_id, token) = (ex.run_id.clone(), ex.token.clone());
    h.input(Input::ExecutorLaunched {
        key: key.clone(),
        run_id,
        result: Ok(Started {
            pid: 4242,
            start_time: None,
        }),
    });
    h.input(Input::ExecutorSubscribe {
        conn,
        framework_id: fid(),
        executor_id: key.1,
        token: (!mesos).then_some(token),
        updates: Vec::new(),
        tasks: Vec::new(),
    })
}

/// The tasks of each launch event sent to `conn`: a group's together.
fn launch_events(actions: &[Action], conn: u64) -> Vec<Vec<String>> {
    to_executor(actions, conn)
        .into_iter()
        .filter_map(|e| match e {
            exec_api::Event::Launch { task, .. } => Some(vec![task.task_id.to_string()]),
            exec_api::Event::LaunchGroup { tasks } => {
                Some(tasks.iter().map(|t| t.task_id.to_string()).collect())
            }
            _ => None,
        })
        .collect()
}

#[test]
fn a_task_group_reaches_a_mesos_executor_in_one_launch_group() {
    let mut h = H::new();
    let actions = h.master(agent_api::Event::RunTaskGroup {
        framework: framework(),
        tasks: vec![group_task("g1", "grp", true), group_task("g2", "grp", true)],
    });
    // One record of the whole group; nothing starts before it is durable.
    assert_eq!(launches(&actions), 0, "{actions:?}");
    let keys = vec![(fid(), TaskId::new("g1")), (fid(), TaskId::new("g2"))];
    let writes: Vec<&Action> = actions
        .iter()
        .filter(|a| matches!(a, Action::Checkpoint { then: Some(_), .. }))
        .collect();
    assert_eq!(writes.len(), 1, "{actions:?}");
    assert!(matches!(
        writes[0],
        Action::Checkpoint { then: Some(Durable::Tasks { keys: k }), .. } if *k == keys
    ));
    assert_eq!(task_records(&actions), ["g1", "g2"]);
    let actions = h.complete(actions);
    assert_eq!(launches(&actions), 1, "one executor for the group");
    let actions = subscribe_group_executor(&mut h, 500, true);
    assert_eq!(launch_events(&actions, 500), [vec!["g1", "g2"]]);

    // A later group of the running executor goes at once, in one piece;
    // a lone task of it in a LAUNCH of its own.
    let actions = h.master(agent_api::Event::RunTaskGroup {
        framework: framework(),
        tasks: vec![
            group_task("g3", "grp2", true),
            group_task("g4", "grp2", true),
        ],
    });
    let actions = h.complete(actions);
    assert_eq!(launch_events(&actions, 500), [vec!["g3", "g4"]]);
    let mut lone = group_task("g5", "x", true);
    lone.task_group = None;
    lone.command = None;
    let actions = h.master(agent_api::Event::RunTask {
        framework: framework(),
        task: lone,
    });
    let actions = h.complete(actions);
    assert_eq!(launch_events(&actions, 500), [vec!["g5"]]);
}

#[test]
fn a_task_group_reaches_an_agora_executor_one_launch_per_task() {
    let mut h = H::new();
    let actions = h.master(agent_api::Event::RunTaskGroup {
        framework: framework(),
        tasks: vec![
            group_task("g1", "grp", false),
            group_task("g2", "grp", false),
        ],
    });
    h.complete(actions);
    let actions = subscribe_group_executor(&mut h, 500, false);
    assert_eq!(launch_events(&actions, 500), [vec!["g1"], vec!["g2"]]);
}

#[test]
fn a_task_group_that_cannot_run_here_is_refused_whole() {
    let mut h = H::new();
    // t1 runs here: a group that reuses its id is refused, all of it.
    h.run("t1");
    let actions = h.master(agent_api::Event::RunTaskGroup {
        framework: framework(),
        tasks: vec![group_task("g1", "grp", true), group_task("t1", "grp", true)],
    });
    assert_eq!(launches(&actions), 0, "{actions:?}");
    assert!(task_records(&actions).is_empty(), "{actions:?}");
    // g1's refusal takes a stream of its own; t1's travels on its own,
    // as the stream of the id belongs to the task that runs.
    assert_eq!(
        to_master_updates(&actions),
        [
            ("g1".to_string(), TaskState::Dropped),
            ("t1".to_string(), TaskState::Dropped)
        ]
    );
    assert!(h.core.updates.has_stream(&fid(), &TaskId::new("g1")));
    let messages: Vec<String> = actions
        .iter()
        .filter_map(|a| match a {
            Action::ToMaster {
                call: agent_api::Call::StatusUpdate { status, .. },
                ..
            } => status.message.clone(),
            _ => None,
        })
        .collect();
    assert_eq!(messages.len(), 2);
    assert!(messages
        .iter()
        .all(|m| m.starts_with("task group refused: task t1: task id t1 is still in use")));
    // Two executors in one group.
    let mut other = group_task("g3", "grp", true);
    other.executor.as_mut().unwrap().executor_id = ExecutorId::new("e-other");
    let actions = h.master(agent_api::Event::RunTaskGroup {
        framework: framework(),
        tasks: vec![group_task("g2", "grp", true), other],
    });
    assert_eq!(
        to_master_updates(&actions),
        [
            ("g2".to_string(), TaskState::Error),
            ("g3".to_string(), TaskState::Error)
        ]
    );
}

#[test]
fn an_executors_own_shutdown_grace_period_is_used() {
    let mut h = H::new();
    let actions = h.master(agent_api::Event::RunTaskGroup {
        framework: framework(),
        tasks: vec![group_task("g1", "grp", true)],
    });
    let actions = h.complete(actions);
    let env: HashMap<String, String> = actions
        .iter()
        .find_map(|a| match a {
            Action::Process(Request::Launch { spec, .. }) => {
                Some(spec.env.iter().cloned().collect())
            }
            _ => None,
        })
        .expect("a launch");
    assert_eq!(env["MESOS_EXECUTOR_SHUTDOWN_GRACE_PERIOD"], "7secs");
    assert_eq!(env["AGORA_SHUTDOWN_GRACE_PERIOD"], "7");
    // Connected: SHUTDOWN says 7 s, and the agent waits as long before it
    // terminates the executor.
    subscribe_group_executor(&mut h, 500, true);
    let actions = h.master(agent_api::Event::ShutdownFramework {
        framework_id: fid(),
    });
    assert!(to_executor(&actions, 500).iter().any(|e| matches!(
        e,
        exec_api::Event::Shutdown { grace_period_seconds } if *grace_period_seconds == 7.0
    )));
    assert!(actions.iter().any(|a| matches!(
        a,
        Action::Timer { after, timer: Timer::ShutdownOverrun { .. } } if *after == Duration::from_secs(7)
    )));

    // Not connected: SIGTERM at once, SIGKILL 7 s later.
    let mut h = H::new();
    let actions = h.master(agent_api::Event::RunTaskGroup {
        framework: framework(),
        tasks: vec![group_task("g1", "grp", true)],
    });
    h.complete(actions);
    let key = (fid(), ExecutorId::new("e-grp"));
    let run_id = h.core.executors[&key].run_id.clone();
    h.input(Input::ExecutorLaunched {
        key,
        run_id,
        result: Ok(Started {
            pid: 4242,
            start_time: None,
        }),
    });
    let actions = h.master(agent_api::Event::ShutdownFramework {
        framework_id: fid(),
    });
    assert!(
        actions.iter().any(|a| matches!(
            a,
            Action::Process(Request::Terminate { grace, .. }) if *grace == Duration::from_secs(7)
        )),
        "{actions:?}"
    );
}

/// What the simulation's seeds 589 and 1911 found: tasks whose record is
/// on its way to disk, at a re-registration and an executor's subscription.
mod recording {
    use std::sync::Arc;

    use super::super::*;

    fn core() -> Core {
        let config = crate::Config::new("127.0.0.1:5050", std::env::temp_dir());
        let shared = Shared {
            config: Arc::new(config),
            listen: "127.0.0.1:5051".parse().unwrap(),
            executor_endpoint: String::new(),
            next_conn: Arc::default(),
            counters: Arc::default(),
            identity: Arc::new(crate::identity::ExecutorIdentity::new(&[3; 32])),
            client_tls: None,
            delegates_cgroups: false,
        };
        Core::new(shared, 7, Instant::now(), 0.0)
    }

    fn framework() -> FrameworkInfo {
        let mut info = FrameworkInfo::new("f");
        info.id = Some(FrameworkId::new("f1"));
        info.checkpoint = true;
        info
    }

    fn executor_task(id: &str, executor: &str) -> TaskInfo {
        TaskInfo {
            container: None,
            allocation_role: None,
            launch_stamp: None,
            name: id.into(),
            task_id: TaskId::new(id),
            agent_id: AgentId::new("a1"),
            resources: Resources::parse("cpus:0.5;mem:32").unwrap(),
            executor: Some(ExecutorInfo {
                container: None,
                executor_id: ExecutorId::new(executor),
                framework_id: None,
                command: CommandInfo {
                    value: "./exec".into(),
                    ..Default::default()
                },
                resources: Resources::parse("cpus:0.1;mem:32").unwrap(),
                name: String::new(),
                source: String::new(),
                api: Default::default(),
                shutdown_grace_period: None,
                data: None,
                labels: Default::default(),
            }),
            command: None,
            data: None,
            kill_grace_period: None,
            labels: Default::default(),
            task_group: None,
        }
    }

    /// Connects to the master on `conn` and returns the executors the
    /// registration reports.
    fn register(core: &mut Core, conn: u64) -> Vec<String> {
        let now = Instant::now();
        core.handle(
            Input::MasterConnected {
                conn,
                local_ip: None,
            },
            now,
            0.0,
        );
        let reported = core
            .take_actions()
            .into_iter()
            .find_map(|a| match a {
                Action::ToMaster {
                    call: agent_api::Call::Register { executors, .. },
                    ..
                } => Some(executors),
                _ => None,
            })
            .expect("a registration");
        let event = agent_api::Event::Registered {
            agent_id: AgentId::new("a1"),
            ping_interval_seconds: 15.0,
            master_info: agora_proto::MasterInfo {
                id: "m".into(),
                address: "127.0.0.1:5050".into(),
                version: String::new(),
            },
            reregistered: conn > 1,
        };
        core.handle(
            Input::MasterEvent {
                conn,
                event: Box::new(event),
            },
            now,
            0.0,
        );
        core.take_actions();
        reported
            .into_iter()
            .map(|e| e.executor.executor_id.as_str().to_string())
            .collect()
    }

    fn from_master(core: &mut Core, conn: u64, event: agent_api::Event) {
        let input = Input::MasterEvent {
            conn,
            event: Box::new(event),
        };
        core.handle(input, Instant::now(), 0.0);
        core.take_actions();
    }

    fn reconnect(core: &mut Core, old: u64, new: u64) -> Vec<String> {
        core.handle(Input::MasterDisconnected { conn: old }, Instant::now(), 0.0);
        register(core, new)
    }

    /// The master rebuilds an agent's books from its re-registration: an
    /// executor about to start (its task's checkpoint not yet durable) is
    /// reported with the tasks, or the master would offer its resources
    /// to others while it runs.
    #[test]
    fn reregistration_reports_an_executor_whose_task_is_being_recorded() {
        let mut core = core();
        assert!(register(&mut core, 1).is_empty());
        from_master(
            &mut core,
            1,
            agent_api::Event::RunTask {
                framework: framework(),
                task: executor_task("t1", "e1"),
            },
        );
        // A second task of the same executor: the executor is reported once.
        from_master(
            &mut core,
            1,
            agent_api::Event::RunTask {
                framework: framework(),
                task: executor_task("t2", "e1"),
            },
        );
        assert!(core.executors.is_empty(), "started before the checkpoint");
        assert_eq!(reconnect(&mut core, 1, 2), ["e1"]);

        // Killed before the checkpoint is durable, the tasks never reach the
        // executor, which never starts: it is not reported any more.
        let fid = FrameworkId::new("f1");
        for task in ["t1", "t2"] {
            from_master(
                &mut core,
                2,
                agent_api::Event::KillTask {
                    framework_id: fid.clone(),
                    task_id: TaskId::new(task),
                },
            );
        }
        assert!(reconnect(&mut core, 2, 3).is_empty());
    }

    fn recorded(core: &mut Core, task: &str) -> Vec<Action> {
        let key = (FrameworkId::new("f1"), TaskId::new(task));
        let input = Input::Durable(Durable::Task { key }, Ok(()));
        core.handle(input, Instant::now(), 0.0);
        core.take_actions()
    }

    /// What executor connection `conn` was sent: `launch t`, `kill t`.
    fn to_executor(actions: &[Action], conn: u64) -> Vec<String> {
        actions
            .iter()
            .filter_map(|a| match a {
                Action::ToExecutor { conn: c, event, .. } if *c == conn => match event {
                    exec_api::Event::Launch { task, .. } => {
                        Some(format!("launch {}", task.task_id))
                    }
                    exec_api::Event::Kill { task_id, .. } => Some(format!("kill {task_id}")),
                    _ => None,
                },
                _ => None,
            })
            .collect()
    }

    /// A task reaches its executor only once its checkpoint is durable,
    /// even when the executor subscribes meanwhile; killed before that, it
    /// is ended by the agent alone, so the executor cannot report a second
    /// terminal state the agent would acknowledge and then drop.
    #[test]
    fn a_task_being_recorded_is_not_sent_to_an_executor_that_subscribes_meanwhile() {
        let mut core = core();
        register(&mut core, 1);
        let fid = FrameworkId::new("f1");
        let ekey = (fid.clone(), ExecutorId::new("e1"));
        from_master(
            &mut core,
            1,
            agent_api::Event::RunTask {
                framework: framework(),
                task: executor_task("t1", "e1"),
            },
        );
        let run_id = recorded(&mut core, "t1")
            .into_iter()
            .find_map(|a| match a {
                Action::Process(Request::Launch { run_id, .. }) => Some(run_id),
                _ => None,
            })
            .expect("the executor is started once t1 is recorded");
        let launched = Input::ExecutorLaunched {
            key: ekey.clone(),
            run_id,
            result: Ok(Started {
                pid: 100,
                start_time: None,
            }),
        };
        core.handle(launched, Instant::now(), 0.0);
        from_master(
            &mut core,
            1,
            agent_api::Event::RunTask {
                framework: framework(),
                task: executor_task("t2", "e1"),
            },
        );

        let subscribe = Input::ExecutorSubscribe {
            conn: 50,
            framework_id: fid.clone(),
            executor_id: ekey.1.clone(),
            token: Some(core.executors[&ekey].token.clone()),
            updates: Vec::new(),
            tasks: Vec::new(),
        };
        core.handle(subscribe, Instant::now(), 0.0);
        assert_eq!(to_executor(&core.take_actions(), 50), ["launch t1"]);

        let kill = agent_api::Event::KillTask {
            framework_id: fid.clone(),
            task_id: TaskId::new("t2"),
        };
        core.handle(
            Input::MasterEvent {
                conn: 1,
                event: Box::new(kill),
            },
            Instant::now(),
            0.0,
        );
        assert!(to_executor(&core.take_actions(), 50).is_empty());

        let actions = recorded(&mut core, "t2");
        assert!(to_executor(&actions, 50).is_empty());
        let ended: Vec<(TaskState, Source)> = super::checkpointed_statuses(&actions)
            .into_iter()
            .filter(|status| status.task_id.as_str() == "t2")
            .map(|status| (status.state, status.source))
            .collect();
        assert_eq!(ended, [(TaskState::Killed, Source::SourceAgent)]);
    }
}

#[test]
fn a_task_that_needs_no_more_than_its_executors_container_had_asks_for_nothing() {
    use agora_containerizer::{Isolation, Limits};
    let mut h = H::with(|c| c.isolation = Isolation::Cgroups);
    h.run("t1");
    h.launched_ok("t1");
    h.subscribe(10, "t1", Vec::new());
    let updates = |actions: &[Action]| -> Vec<Limits> {
        actions
            .iter()
            .filter_map(|a| match a {
                Action::Process(Request::Update { limits, .. }) => Some(*limits),
                _ => None,
            })
            .collect()
    };
    let join = |h: &mut H, id: &str| {
        let mut task = custom_task(id);
        task.executor.as_mut().expect("executor").executor_id = ekey("t1").1;
        let actions = h.master(agent_api::Event::RunTask {
            framework: framework(),
            task,
        });
        h.complete(actions)
    };
    // A second task grows the container to hold both.
    let grown = updates(&join(&mut h, "t2"));
    assert_eq!(grown.len(), 1, "{grown:?}");
    assert!((grown[0].cpus - 2.1).abs() < 1e-9, "{grown:?}");
    assert_eq!(grown[0].mem_mib, 160.0);
    // The first ends; a third then needs what the two needed.
    let mut status = TaskStatus::new(
        TaskId::new("t1"),
        TaskState::Finished,
        Source::SourceExecutor,
    );
    status.uuid = Some("u1".into());
    let actions = h.input(Input::ExecutorCall {
        conn: 10,
        call: exec_api::Call::Update { status },
    });
    h.complete(actions);
    assert_eq!(updates(&join(&mut h, "t3")), Vec::<Limits>::new());
    // A fourth, with three running, grows it again.
    let grown = updates(&join(&mut h, "t4"));
    assert_eq!(grown.len(), 1, "{grown:?}");
    assert!((grown[0].cpus - 3.1).abs() < 1e-9, "{grown:?}");
}

/// Every status the agent made for the master among `actions`: through
/// its log, or sent on its own.
fn statuses(actions: &[Action]) -> Vec<&TaskStatus> {
    actions
        .iter()
        .filter_map(|a| match a {
            Action::Checkpoint {
                then: Some(Durable::Update { status, .. }),
                ..
            } => Some(status),
            Action::ToMaster {
                call: agent_api::Call::StatusUpdate { status, .. },
                ..
            } => Some(status),
            _ => None,
        })
        .collect()
}

/// The availability the agent told the master among `actions`.
fn availability(actions: &[Action]) -> Vec<Option<String>> {
    actions
        .iter()
        .filter_map(|a| match a {
            Action::ToMaster {
                call: agent_api::Call::Availability { unavailable },
                ..
            } => Some(unavailable.clone()),
            _ => None,
        })
        .collect()
}

#[test]
fn a_full_work_directory_refuses_launches_and_is_not_offered_until_it_has_room() {
    let mut h = H::new();
    let full = "the agent's work directory /w is full: 0.0 MiB free".to_string();
    let actions = h.input(Input::DiskFull {
        full: Some(full.clone()),
    });
    assert_eq!(availability(&actions), [Some(full.clone())]);
    // A launch meanwhile fails at once, naming the cause, and starts
    // nothing.
    let actions = h.run("t1");
    assert_eq!(launches(&actions), 0, "{actions:?}");
    let refused = statuses(&actions);
    assert_eq!(refused.len(), 1, "{actions:?}");
    assert_eq!(refused[0].state, TaskState::Failed);
    assert_eq!(refused[0].reason, Some(Reason::ReasonExecutorLaunchFailed));
    assert!(
        refused[0].message.as_deref().unwrap_or("").contains(&full),
        "{:?}",
        refused[0]
    );
    // Registered again (a new master, say), it says so again.
    h.input(Input::MasterDisconnected { conn: MASTER });
    h.input(Input::MasterConnected {
        conn: MASTER,
        local_ip: None,
    });
    let actions = h.master(agent_api::Event::Registered {
        agent_id: AgentId::new("a1"),
        ping_interval_seconds: 5.0,
        master_info: MasterInfo {
            id: "m2".into(),
            address: "master:5050".into(),
            version: "test".into(),
        },
        reregistered: true,
    });
    assert_eq!(availability(&actions), [Some(full)]);
    // Room again: the master hears it, and tasks run.
    let actions = h.input(Input::DiskFull { full: None });
    assert_eq!(availability(&actions), [None]);
    let actions = h.run("t2");
    assert_eq!(launches(&actions), 1, "{actions:?}");
}

#[test]
fn an_executor_gets_its_secrets_on_a_descriptor_not_in_its_environment() {
    let mut h = H::with(|c| {
        c.authenticate_executors = true;
        c.tls = agora_net::TlsOptions {
            ca: Some("/etc/agora/ca.pem".into()),
            cert: Some("/etc/agora/agent.pem".into()),
            key: Some("/etc/agora/agent-key.pem".into()),
            ..agora_net::TlsOptions::default()
        };
    });
    let actions = h.run("t1");
    let spec = actions
        .iter()
        .find_map(|a| match a {
            Action::Process(Request::Launch { spec, .. }) => Some(spec.clone()),
            _ => None,
        })
        .expect("a launch");
    for (name, _) in &spec.env {
        assert!(
            !agora_proto::env::SECRET_VARIABLES.contains(&name.as_str()),
            "{name} in the executor's environment"
        );
    }
    let token = h.core.executors[&ekey("t1")].token.clone();
    let secret = |name: &str, value: &str| (name.to_string(), value.to_string());
    assert_eq!(
        spec.secrets,
        [
            secret(agora_proto::env::EXECUTOR_TOKEN, &token),
            secret(agora_proto::env::TLS_CERT, "/etc/agora/agent.pem"),
            secret(agora_proto::env::TLS_KEY, "/etc/agora/agent-key.pem"),
        ]
    );
    assert!(!spec
        .env
        .iter()
        .any(|(_, value)| *value == token || value.contains("agent-key")));
    // The CA is no secret: the executor verifies the agent with it.
    assert!(spec
        .env
        .contains(&secret(agora_proto::env::TLS_CA, "/etc/agora/ca.pem")));

    // A Mesos v1 executor reads its token from the environment, as
    // Mesos's API has it; it gets no descriptor.
    let actions = h.master(agent_api::Event::RunTaskGroup {
        framework: framework(),
        tasks: vec![group_task("g1", "grp", true)],
    });
    let actions = h.complete(actions);
    let spec = actions
        .iter()
        .find_map(|a| match a {
            Action::Process(Request::Launch { spec, .. }) => Some(spec.clone()),
            _ => None,
        })
        .expect("a launch");
    let token = h.core.executors[&(fid(), ExecutorId::new("e-grp"))]
        .token
        .clone();
    assert!(spec.secrets.is_empty());
    assert!(!spec
        .env
        .iter()
        .any(|(_, value)| value.contains("agent-key")));
    let names: Vec<&str> = spec
        .env
        .iter()
        .filter(|(_, value)| *value == token)
        .map(|(name, _)| name.as_str())
        .collect();
    assert_eq!(
        names,
        [agora_proto::env::MESOS_EXECUTOR_AUTHENTICATION_TOKEN]
    );
}

#[test]
fn the_token_of_an_ended_run_is_refused() {
    let mut h = H::new();
    h.run("t1");
    let old_run = h.core.executors[&ekey("t1")].run_id.clone();
    let old_token = h.core.executors[&ekey("t1")].token.clone();
    h.input(Input::ExecutorLaunched {
        key: ekey("t1"),
        run_id: old_run.clone(),
        result: Ok(Started {
            pid: 4242,
            start_time: None,
        }),
    });
    h.input(Input::ExecutorExited {
        key: ekey("t1"),
        run_id: old_run,
        code: Some(1),
        message: "exited with status 1".into(),
    });
    let refused = |actions: &[Action], conn: u64| {
        to_executor(actions, conn)
            .iter()
            .any(|e| matches!(e, exec_api::Event::Error { fatal: true, .. }))
            && actions
                .iter()
                .any(|a| matches!(a, Action::CloseExecutor { conn: c, .. } if *c == conn))
    };
    let subscribe = |h: &mut H, conn: u64, token: &str| {
        h.input(Input::ExecutorSubscribe {
            conn,
            framework_id: fid(),
            executor_id: ExecutorId::new("e-t1"),
            token: Some(token.to_string()),
            updates: Vec::new(),
            tasks: Vec::new(),
        })
    };
    // Its executor is gone: nobody subscribes with its token.
    let actions = subscribe(&mut h, 20, &old_token);
    assert!(refused(&actions, 20), "{actions:?}");
    // A new run of the same executor has a token of its own; the old one
    // is refused, naming the run it was for.
    let mut again = custom_task("t2");
    again.executor.as_mut().expect("an executor").executor_id = ExecutorId::new("e-t1");
    let actions = h.master(agent_api::Event::RunTask {
        framework: framework(),
        task: again,
    });
    h.complete(actions);
    let new_token = h.core.executors[&ekey("t1")].token.clone();
    assert_ne!(new_token, old_token);
    let actions = subscribe(&mut h, 21, &old_token);
    assert!(refused(&actions, 21), "{actions:?}");
    let actions = subscribe(&mut h, 22, &new_token);
    assert!(!refused(&actions, 22), "{actions:?}");
}

fn image_task(id: &str) -> TaskInfo {
    let mut task = command_task_with_uri(id);
    task.command.as_mut().expect("command").uris.clear();
    task.container = Some(Box::new(agora_proto::ContainerInfo::docker(
        "127.0.0.1:5000/app:1",
    )));
    task
}

#[test]
fn a_task_in_an_image_starts_once_its_container_is_made_and_fails_naming_a_pull_failure() {
    use agora_containerizer::provisioner::Provider;
    let key = (fid(), TaskId::new("t1"));
    let images = |c: &mut Config| c.images.image_providers = vec![Provider::Docker];
    let mut h = H::with(images);
    let actions = h.master(agent_api::Event::RunTask {
        framework: framework(),
        task: image_task("t1"),
    });
    let prepared: Vec<_> = actions
        .iter()
        .filter_map(|a| match a {
            Action::Process(Request::PrepareImage { key, task }) => {
                Some((key.clone(), task.clone()))
            }
            _ => None,
        })
        .collect();
    assert_eq!(prepared.len(), 1, "{actions:?}");
    assert_eq!(
        prepared[0].1.container.image.as_ref().unwrap().name,
        "127.0.0.1:5000/app:1"
    );
    assert!(
        !actions
            .iter()
            .any(|a| matches!(a, Action::Process(Request::TaskContainer { .. }))),
        "the image container holds the task: no cgroup of its own"
    );
    let actions = h.input(Input::Durable(Durable::Task { key: key.clone() }, Ok(())));
    assert_eq!(launches(&actions), 0, "{actions:?}");
    let actions = h.input(Input::ImagePrepared {
        key: key.clone(),
        result: Ok(ImageRun {
            id: "run-1".into(),
            command: CommandInfo::shell("crun start run-1"),
            pid: 42,
        }),
    });
    assert_eq!(launches(&actions), 1, "{actions:?}");

    // The pull failed: TASK_FAILED, REASON_CONTAINER_LAUNCH_FAILED, the
    // message naming the image; nothing starts.
    let mut h = H::with(images);
    h.master(agent_api::Event::RunTask {
        framework: framework(),
        task: image_task("t1"),
    });
    h.input(Input::Durable(Durable::Task { key: key.clone() }, Ok(())));
    let actions = h.input(Input::ImagePrepared {
        key,
        result: Err("image 127.0.0.1:5000/app:1: no such image".into()),
    });
    assert_eq!(launches(&actions), 0, "{actions:?}");
    let failed = *checkpointed_statuses(&actions).first().expect("an update");
    assert_eq!(failed.state, TaskState::Failed);
    assert_eq!(failed.reason, Some(Reason::ReasonContainerLaunchFailed));
    assert!(
        failed
            .message
            .as_deref()
            .unwrap_or_default()
            .contains("image 127.0.0.1:5000/app:1: no such image"),
        "{failed:?}"
    );
}

#[test]
fn an_agent_without_image_providers_refuses_a_task_in_an_image() {
    let mut h = H::new();
    let actions = h.master(agent_api::Event::RunTask {
        framework: framework(),
        task: image_task("t1"),
    });
    assert_eq!(launches(&actions), 0, "{actions:?}");
    assert!(!actions
        .iter()
        .any(|a| matches!(a, Action::Process(Request::PrepareImage { .. }))));
    let refused: Vec<&TaskStatus> = checkpointed_statuses(&actions)
        .into_iter()
        .chain(actions.iter().filter_map(|a| match a {
            Action::ToMaster {
                call: agent_api::Call::StatusUpdate { status, .. },
                ..
            } => Some(status),
            _ => None,
        }))
        .collect();
    let status = refused.first().expect("a refusal");
    assert_eq!(status.state, TaskState::Failed);
    assert_eq!(status.reason, Some(Reason::ReasonContainerLaunchFailed));
    assert!(
        status
            .message
            .as_deref()
            .unwrap_or_default()
            .contains("images are not enabled on this agent"),
        "{status:?}"
    );
}
