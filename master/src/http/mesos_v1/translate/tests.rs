//! The translation rules, sans IO; the reconciliation wording is checked
//! against the real state machine.

use agora_mesos_proto::v1::scheduler::call;
use agora_proto::{Attributes, MasterInfo, Offer, OfferId, Resources};
use tokio::time::Instant;

use super::*;
use crate::allocator::{AllocatorOptions, DrfAllocator};
use crate::master::{Input, Master, Output};
use crate::Config;

struct NoExecutors;

impl ExecutorTasks for NoExecutors {
    fn executor_tasks(&self, _: &FrameworkId, _: &AgentId, _: &ExecutorId) -> Vec<TaskId> {
        Vec::new()
    }
}

fn pa() -> Capabilities {
    Capabilities {
        partition_aware: true,
        ..Capabilities::default()
    }
}

fn master_status(state: TaskState, reason: Reason, message: &str) -> TaskStatus {
    let mut s = TaskStatus::new(TaskId::new("t"), state, Source::SourceMaster)
        .with_reason(reason)
        .with_message(message);
    s.agent_id = Some(AgentId::new("a"));
    s
}

fn command_task(id: &str) -> v1::TaskInfo {
    v1::TaskInfo {
        name: id.into(),
        task_id: v1::TaskId { value: id.into() },
        agent_id: v1::AgentId { value: "a".into() },
        resources: convert::mesos_resources(
            &Resources::parse("cpus:0.1;mem:32").unwrap(),
            &convert::ResourceStyle::default(),
        ),
        command: Some(v1::CommandInfo {
            value: Some("true".into()),
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn accept(operations: Vec<v1::offer::Operation>) -> v1::scheduler::Call {
    let mut c = v1::scheduler::Call {
        accept: Some(call::Accept {
            offer_ids: vec![v1::OfferId { value: "o1".into() }],
            operations,
            filters: None,
        }),
        ..Default::default()
    };
    c.set_type(call::Type::Accept);
    c
}

fn launch(tasks: Vec<v1::TaskInfo>) -> v1::offer::Operation {
    let mut op = v1::offer::Operation {
        launch: Some(v1::offer::operation::Launch { task_infos: tasks }),
        ..Default::default()
    };
    op.set_type(v1::offer::operation::Type::Launch);
    op
}

#[test]
fn states_for_frameworks_with_and_without_partition_awareness() {
    let cases = [
        (
            TaskState::Lost,
            Reason::ReasonAgentRemoved,
            "x",
            TaskState::Unreachable,
        ),
        (
            TaskState::Lost,
            Reason::ReasonAgentRestarted,
            "x",
            TaskState::Gone,
        ),
        (
            TaskState::Lost,
            Reason::ReasonTaskUnknown,
            "x",
            TaskState::Unknown,
        ),
        (
            TaskState::Lost,
            Reason::ReasonReconciliation,
            UNKNOWN_TASK_MESSAGE,
            TaskState::Unknown,
        ),
        (
            TaskState::Lost,
            Reason::ReasonReconciliation,
            "reconciliation: task completed",
            TaskState::Gone,
        ),
        (
            TaskState::Dropped,
            Reason::ReasonInvalidOffers,
            "x",
            TaskState::Dropped,
        ),
        (
            TaskState::Running,
            Reason::ReasonReconciliation,
            "x",
            TaskState::Running,
        ),
    ];
    for (state, reason, message, partition_aware) in cases {
        let status = master_status(state, reason, message);
        assert_eq!(
            state_for(&status, pa()),
            partition_aware,
            "{state:?} {reason:?}"
        );
        let expected = if state == TaskState::Running {
            TaskState::Running
        } else {
            TaskState::Lost
        };
        assert_eq!(state_for(&status, Capabilities::default()), expected);
    }
    let unreachable = mesos_status_for(
        &master_status(TaskState::Lost, Reason::ReasonAgentRemoved, "gone"),
        pa(),
    );
    assert_eq!(unreachable.state(), v1::TaskState::TaskUnreachable);
    assert!(unreachable.unreachable_time.is_some());
    assert!(unreachable.uuid.is_none());
}

#[test]
fn the_masters_unknown_task_answer_is_recognised() {
    let config = Config::default();
    let now = Instant::now();
    let info = MasterInfo {
        id: "m".into(),
        address: "127.0.0.1:5050".into(),
        version: "test".into(),
    };
    let alloc = DrfAllocator::new(AllocatorOptions::from(&config));
    let mut master = Master::new(config, info, Box::new(alloc), now);
    let framework_info = agora_proto::FrameworkInfo {
        user: "u".into(),
        name: "f".into(),
        id: None,
        failover_timeout: 0.0,
        checkpoint: false,
        roles: vec![],
        hostname: String::new(),
        principal: None,
        webui_url: None,
    };
    master.handle(
        now,
        Input::Scheduler {
            conn: 1,
            call: Call::Subscribe {
                protocol: agora_proto::PROTOCOL_VERSION,
                framework_info,
                force: true,
            },
        },
    );
    // Long after start, so agents of an earlier master no longer count.
    let later = now + std::time::Duration::from_secs(24 * 3600);
    master.handle(
        later,
        Input::Scheduler {
            conn: 1,
            call: Call::Reconcile {
                tasks: vec![ReconcileTask {
                    task_id: TaskId::new("nope"),
                    agent_id: Some(AgentId::new("a")),
                }],
            },
        },
    );
    let statuses: Vec<TaskStatus> = master
        .take_outputs()
        .into_iter()
        .filter_map(|o| match o {
            Output::Scheduler {
                event: Event::Update { status },
                ..
            } => Some(status),
            _ => None,
        })
        .collect();
    assert_eq!(statuses.len(), 1, "{statuses:?}");
    assert_eq!(state_for(&statuses[0], pa()), TaskState::Unknown);
    assert_eq!(
        state_for(&statuses[0], Capabilities::default()),
        TaskState::Lost
    );
}

#[test]
fn accept_refuses_what_agora_cannot_run_and_keeps_the_rest_with_their_uris() {
    // Both a command and an executor: which one to run?
    let mut both = command_task("both");
    both.executor = Some(v1::ExecutorInfo {
        executor_id: v1::ExecutorId { value: "e".into() },
        ..Default::default()
    });
    // A custom executor, fetched: it runs.
    let mut custom = command_task("custom");
    let mut executor_command = custom.command.take().unwrap();
    executor_command.uris.push(v1::command_info::Uri {
        value: "/srv/executor.py".into(),
        executable: Some(true),
        ..Default::default()
    });
    custom.executor = Some(v1::ExecutorInfo {
        executor_id: v1::ExecutorId { value: "e".into() },
        command: Some(executor_command),
        ..Default::default()
    });
    let mut with_uri = command_task("uri");
    if let Some(c) = with_uri.command.as_mut() {
        c.uris.push(v1::command_info::Uri {
            value: "http://example.invalid/x".into(),
            ..Default::default()
        });
    }
    let out = translate_call(
        &FrameworkId::new("f"),
        accept(vec![launch(vec![
            command_task("ok"),
            both,
            custom,
            with_uri,
        ])]),
        &NoExecutors,
    )
    .unwrap();
    let refused: Vec<&str> = out.refused.iter().map(|s| s.task_id.as_str()).collect();
    assert_eq!(refused, ["both"]);
    assert!(out
        .refused
        .iter()
        .all(|s| s.state == TaskState::Error && s.uuid.is_none() && s.agent_id.is_some()));
    match &out.calls[..] {
        [Call::Launch {
            tasks, offer_ids, ..
        }] => {
            assert_eq!(tasks.len(), 3);
            assert_eq!(tasks[0].task_id.as_str(), "ok");
            assert!(tasks[0].command.as_ref().unwrap().uris.is_empty());
            let executor = tasks[1].executor.as_ref().expect("a custom executor");
            assert_eq!(executor.api, agora_proto::ExecutorApi::MesosV1);
            assert!(executor.command.environment.is_empty());
            let uris = &executor.command.uris;
            assert_eq!(uris[0].value, "/srv/executor.py");
            assert!(uris[0].executable && uris[0].extract);
            // A command task's URIs are fetched into the task's sandbox.
            let command = tasks[2].command.as_ref().expect("a command task");
            assert_eq!(tasks[2].task_id.as_str(), "uri");
            assert_eq!(command.uris.len(), 1);
            assert_eq!(command.uris[0].value, "http://example.invalid/x");
            assert!(!command.uris[0].executable && command.uris[0].extract);
            assert_eq!(offer_ids, &[OfferId::new("o1")]);
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn accept_without_tasks_declines_and_task_groups_are_all_or_nothing() {
    let out = translate_call(&FrameworkId::new("f"), accept(vec![]), &NoExecutors).unwrap();
    assert!(matches!(&out.calls[..], [Call::Launch { tasks, .. }] if tasks.is_empty()));

    let group = |tasks: Vec<v1::TaskInfo>| {
        let mut op = v1::offer::Operation {
            launch_group: Some(v1::offer::operation::LaunchGroup {
                executor: v1::ExecutorInfo {
                    executor_id: v1::ExecutorId { value: "g".into() },
                    r#type: Some(v1::executor_info::Type::Default as i32),
                    ..Default::default()
                },
                task_group: v1::TaskGroupInfo { tasks },
            }),
            ..Default::default()
        };
        op.set_type(v1::offer::operation::Type::LaunchGroup);
        op
    };
    let out = translate_call(
        &FrameworkId::new("f"),
        accept(vec![group(vec![command_task("g1"), command_task("g2")])]),
        &NoExecutors,
    )
    .unwrap();
    assert!(out.refused.is_empty());
    assert!(matches!(&out.calls[..], [Call::Launch { tasks, .. }] if tasks.len() == 2));

    // The DEFAULT executor's resources are charged with the first task,
    // its shutdown grace period is the tasks' kill grace period, and
    // the fields no command executor has a place for are refused.
    let mut op = group(vec![command_task("d1"), command_task("d2")]);
    let executor = &mut op.launch_group.as_mut().unwrap().executor;
    executor.resources = convert::mesos_resources(
        &Resources::parse("cpus:0.2;mem:64").unwrap(),
        &convert::ResourceStyle::default(),
    );
    executor.shutdown_grace_period = Some(v1::DurationInfo {
        nanoseconds: 7_000_000_000,
    });
    let out = translate_call(
        &FrameworkId::new("f"),
        accept(vec![op.clone()]),
        &NoExecutors,
    )
    .unwrap();
    assert!(out.refused.is_empty());
    let [Call::Launch { tasks, .. }] = &out.calls[..] else {
        panic!("{:?}", out.calls)
    };
    assert_eq!(
        tasks[0].resources,
        Resources::parse("cpus:0.3;mem:96").unwrap()
    );
    assert_eq!(
        tasks[1].resources,
        Resources::parse("cpus:0.1;mem:32").unwrap()
    );
    assert!(tasks.iter().all(|t| t.kill_grace_period == Some(7.0)));
    for field in ["name", "labels"] {
        let mut op = op.clone();
        let executor = &mut op.launch_group.as_mut().unwrap().executor;
        if field == "name" {
            executor.name = Some("x".into());
        } else {
            executor.labels = Some(v1::Labels::default());
        }
        let out = translate_call(&FrameworkId::new("f"), accept(vec![op]), &NoExecutors).unwrap();
        assert_eq!(out.refused.len(), 2, "{field}");
        let message = out.refused[0].message.as_deref().unwrap();
        assert!(
            message.contains(&format!(
                "ExecutorInfo.{field} is not supported for a DEFAULT executor"
            )),
            "{message}"
        );
    }

    let mut bad = command_task("g4");
    bad.command = None;
    let out = translate_call(
        &FrameworkId::new("f"),
        accept(vec![group(vec![command_task("g3"), bad])]),
        &NoExecutors,
    )
    .unwrap();
    assert_eq!(out.refused.len(), 2);
    assert!(matches!(&out.calls[..], [Call::Launch { tasks, .. }] if tasks.is_empty()));
}

/// An ACCEPT with a LAUNCH_GROUP of a CUSTOM executor, as pymesos's
/// `acceptOffers` sends it.
const CUSTOM_GROUP_ACCEPT: &str = r#"{"type":"ACCEPT","framework_id":{"value":"f"},"accept":{
    "offer_ids":[{"value":"o1"}],
    "operations":[{"type":"LAUNCH_GROUP","launch_group":{
        "executor":{"type":"CUSTOM","executor_id":{"value":"e"},
            "command":{"value":"python3 executor.py",
                "uris":[{"value":"/srv/executor.py","executable":true}]},
            "shutdown_grace_period":{"nanoseconds":3000000000},
            "data":"aGk=","labels":{"labels":[{"key":"k","value":"v"}]},
            "resources":[{"name":"cpus","type":"SCALAR","scalar":{"value":0.1}}]},
        "task_group":{"tasks":[
            {"name":"g1","task_id":{"value":"g1"},"agent_id":{"value":"a"},
             "resources":[{"name":"cpus","type":"SCALAR","scalar":{"value":0.1}}],"data":"MQ=="},
            {"name":"g2","task_id":{"value":"g2"},"agent_id":{"value":"a"},
             "resources":[{"name":"cpus","type":"SCALAR","scalar":{"value":0.1}}],
             "command":{"value":"echo two"}}]}}}],
    "filters":{"refuse_seconds":1.0}}}"#;

#[test]
fn a_launch_group_of_a_custom_executor_is_one_native_task_group() {
    use agora_mesos_proto::Codec;
    let from_json: v1::scheduler::Call =
        Codec::Json.decode(CUSTOM_GROUP_ACCEPT.as_bytes()).unwrap();
    let bytes = Codec::Protobuf.encode(&from_json).unwrap();
    let from_protobuf: v1::scheduler::Call = Codec::Protobuf.decode(&bytes).unwrap();
    for call in [from_json, from_protobuf] {
        let out = translate_call(&FrameworkId::new("f"), call, &NoExecutors).unwrap();
        assert!(out.refused.is_empty(), "{:?}", out.refused);
        let [Call::Launch { tasks, filters, .. }] = &out.calls[..] else {
            panic!("{:?}", out.calls)
        };
        assert_eq!(filters.refuse_seconds, Some(1.0));
        let ids: Vec<&str> = tasks.iter().map(|t| t.task_id.as_str()).collect();
        assert_eq!(ids, ["g1", "g2"]);
        for task in tasks {
            assert_eq!(task.task_group.as_deref(), Some("o1/0"));
            let executor = task.executor.as_ref().expect("the group's executor");
            assert_eq!(executor.executor_id.as_str(), "e");
            assert_eq!(executor.api, agora_proto::ExecutorApi::MesosV1);
            assert_eq!(executor.command.uris[0].value, "/srv/executor.py");
            assert_eq!(executor.shutdown_grace_period, Some(3.0));
            assert_eq!(executor.data.as_ref().map(|d| &d.0[..]), Some(&b"hi"[..]));
            assert_eq!(executor.labels["k"], "v");
        }
        assert_eq!(tasks[0].data.as_ref().map(|d| &d.0[..]), Some(&b"1"[..]));
        assert!(tasks[0].command.is_none());
        // A task's command is for the executor to run.
        assert_eq!(
            tasks[1].command.as_ref().map(|c| c.value.as_str()),
            Some("echo two")
        );
    }
}

#[test]
fn custom_task_groups_are_named_apart_and_refused_whole() {
    let executor = |r#type: Option<v1::executor_info::Type>| v1::ExecutorInfo {
        executor_id: v1::ExecutorId { value: "e".into() },
        r#type: r#type.map(|t| t as i32),
        command: Some(v1::CommandInfo {
            value: Some("./exec".into()),
            ..Default::default()
        }),
        ..Default::default()
    };
    let group = |executor: v1::ExecutorInfo, tasks: Vec<v1::TaskInfo>| {
        let mut op = v1::offer::Operation {
            launch_group: Some(v1::offer::operation::LaunchGroup {
                executor,
                task_group: v1::TaskGroupInfo { tasks },
            }),
            ..Default::default()
        };
        op.set_type(v1::offer::operation::Type::LaunchGroup);
        op
    };
    let no_command = |id: &str| v1::TaskInfo {
        command: None,
        ..command_task(id)
    };
    // No type, with a command: a custom executor too. Two groups of one
    // ACCEPT are two native groups.
    let out = translate_call(
        &FrameworkId::new("f"),
        accept(vec![
            group(executor(None), vec![no_command("a1"), no_command("a2")]),
            group(
                executor(Some(v1::executor_info::Type::Custom)),
                vec![no_command("b1")],
            ),
        ]),
        &NoExecutors,
    )
    .unwrap();
    assert!(out.refused.is_empty(), "{:?}", out.refused);
    let [Call::Launch { tasks, .. }] = &out.calls[..] else {
        panic!("{:?}", out.calls)
    };
    let groups: Vec<(&str, Option<&str>)> = tasks
        .iter()
        .map(|t| (t.task_id.as_str(), t.task_group.as_deref()))
        .collect();
    assert_eq!(
        groups,
        [
            ("a1", Some("o1/0")),
            ("a2", Some("o1/0")),
            ("b1", Some("o1/1"))
        ]
    );

    // One bad task (it names an executor of its own) refuses the group;
    // so does a bad executor (a user to run as).
    let mut own = no_command("c2");
    own.executor = Some(executor(None));
    let mut with_user = executor(Some(v1::executor_info::Type::Custom));
    if let Some(c) = with_user.command.as_mut() {
        c.user = Some("root".into());
    }
    let out = translate_call(
        &FrameworkId::new("f"),
        accept(vec![
            group(executor(None), vec![no_command("c1"), own]),
            group(with_user, vec![no_command("d1")]),
            launch(vec![command_task("ok")]),
        ]),
        &NoExecutors,
    )
    .unwrap();
    let refused: Vec<&str> = out.refused.iter().map(|s| s.task_id.as_str()).collect();
    assert_eq!(refused, ["c1", "c2", "d1"]);
    for status in &out.refused {
        assert_eq!(status.state, TaskState::Error);
        assert_eq!(status.reason, Some(Reason::ReasonTaskGroupInvalid));
        let message = status.message.as_deref().unwrap_or_default();
        assert!(message.starts_with("task group refused: "), "{message}");
    }
    assert!(out.refused[0]
        .message
        .as_deref()
        .unwrap()
        .contains("task c2"));
    assert!(out.refused[2]
        .message
        .as_deref()
        .unwrap()
        .contains("CommandInfo.user"));
    // As Mesos says it.
    let mesos = mesos_status_for(&out.refused[0], Capabilities::default());
    assert_eq!(mesos.reason(), v1::task_status::Reason::TaskGroupInvalid);
    assert!(matches!(&out.calls[..], [Call::Launch { tasks, .. }] if tasks.len() == 1));
}

#[test]
fn bad_calls_are_refused_with_mesos_codes() {
    let fid = FrameworkId::new("f");
    let mut ack = v1::scheduler::Call {
        acknowledge: Some(call::Acknowledge {
            agent_id: v1::AgentId { value: "a".into() },
            task_id: v1::TaskId { value: "t".into() },
            uuid: vec![1, 2, 3],
        }),
        ..Default::default()
    };
    ack.set_type(call::Type::Acknowledge);
    assert!(matches!(
        translate_call(&fid, ack, &NoExecutors),
        Err(CallError::BadRequest(m)) if m.contains("16 bytes")
    ));
    let mut no_body = v1::scheduler::Call::default();
    no_body.set_type(call::Type::Kill);
    assert_eq!(
        translate_call(&fid, no_body, &NoExecutors),
        Err(CallError::BadRequest(
            "Expecting 'kill' to be present".into()
        ))
    );
    assert!(matches!(
        translate_call(&fid, v1::scheduler::Call::default(), &NoExecutors),
        Err(CallError::NotImplemented(_))
    ));
    // REVIVE and SUPPRESS may come without a body.
    let mut revive = v1::scheduler::Call::default();
    revive.set_type(call::Type::Revive);
    assert_eq!(
        translate_call(&fid, revive, &NoExecutors).unwrap().calls,
        vec![Call::Revive { roles: vec![] }]
    );
}

#[test]
fn events_follow_the_frameworks_capabilities() {
    let subscribed = translate_event(
        Event::Subscribed {
            framework_id: FrameworkId::new("f"),
            heartbeat_interval_seconds: 15.0,
            master_info: MasterInfo {
                id: "m".into(),
                address: "127.0.0.1:5050".into(),
                version: "x".into(),
            },
            reregistered: false,
        },
        Capabilities::default(),
    );
    let kinds: Vec<_> = subscribed.iter().map(|e| e.r#type()).collect();
    assert_eq!(
        kinds,
        [
            v1::scheduler::event::Type::Subscribed,
            v1::scheduler::event::Type::Heartbeat
        ]
    );
    assert!(translate_event(
        Event::Error {
            message: "x".into(),
            fatal: false
        },
        Capabilities::default()
    )
    .is_empty());
    let failure = translate_event(
        Event::Failure {
            agent_id: AgentId::new("a"),
            executor_id: Some(ExecutorId::new("e")),
            status: None,
        },
        Capabilities::default(),
    );
    assert_eq!(failure[0].failure.as_ref().unwrap().status, Some(-1));

    let offer = Offer {
        id: OfferId::new("o"),
        framework_id: FrameworkId::new("f"),
        agent_id: AgentId::new("a"),
        hostname: "h".into(),
        resources: Resources::parse("cpus:1").unwrap(),
        attributes: Attributes::default(),
        executor_ids: vec![],
        allocation_role: Some("*".into()),
    };
    let plain = translate_event(
        Event::Offers {
            offers: vec![offer.clone()],
        },
        Capabilities::default(),
    );
    let o = &plain[0].offers.as_ref().unwrap().offers[0];
    assert!(o.allocation_info.is_none() && o.resources[0].allocation_info.is_none());
    let multi = translate_event(
        Event::Offers {
            offers: vec![offer],
        },
        Capabilities {
            multi_role: true,
            ..Capabilities::default()
        },
    );
    let o = &multi[0].offers.as_ref().unwrap().offers[0];
    assert!(o.allocation_info.is_some() && o.resources[0].allocation_info.is_some());
}

#[test]
fn a_task_in_an_image_with_volumes_becomes_a_native_task_in_that_container() {
    let mut task = command_task("in-image");
    let mut info = v1::ContainerInfo::default();
    info.set_type(v1::container_info::Type::Docker);
    info.docker = Some(v1::container_info::DockerInfo {
        image: "127.0.0.1:5000/busybox:1".into(),
        force_pull_image: Some(true),
        ..Default::default()
    });
    let mut host = v1::Volume {
        container_path: "/data".into(),
        host_path: Some("/srv".into()),
        ..Default::default()
    };
    host.set_mode(v1::volume::Mode::Ro);
    let mut source = v1::volume::Source {
        sandbox_path: Some(v1::volume::source::SandboxPath {
            path: "shared".into(),
            ..Default::default()
        }),
        ..Default::default()
    };
    source.set_type(v1::volume::source::Type::SandboxPath);
    let mut sandbox = v1::Volume {
        container_path: "/shared".into(),
        source: Some(source),
        ..Default::default()
    };
    sandbox.set_mode(v1::volume::Mode::Rw);
    info.volumes = vec![host, sandbox];
    task.container = Some(info);
    let out = translate_call(
        &FrameworkId::new("f"),
        accept(vec![launch(vec![task])]),
        &NoExecutors,
    )
    .unwrap();
    assert!(out.refused.is_empty(), "{:?}", out.refused);
    let [Call::Launch { tasks, .. }] = &out.calls[..] else {
        panic!("{:?}", out.calls)
    };
    let container = tasks[0]
        .container
        .as_deref()
        .expect("the container is carried");
    assert_eq!(container.kind, agora_proto::ContainerType::Docker);
    let image = container.image.as_ref().unwrap();
    assert_eq!(image.name, "127.0.0.1:5000/busybox:1");
    assert!(!image.cached, "force_pull_image asks the registry again");
    assert_eq!(
        container.volumes[0].source,
        agora_proto::VolumeSource::HostPath {
            path: "/srv".into()
        }
    );
    assert_eq!(container.volumes[0].mode, agora_proto::VolumeMode::Ro);
    assert_eq!(
        container.volumes[1].source,
        agora_proto::VolumeSource::SandboxPath {
            of: agora_proto::SandboxOf::Own,
            path: "shared".into()
        }
    );
}

#[test]
fn a_task_field_agora_does_not_carry_out_refuses_that_task_by_name() {
    let mut container = command_task("container");
    let mut info = v1::ContainerInfo::default();
    info.set_type(v1::container_info::Type::Docker);
    info.docker = Some(v1::container_info::DockerInfo {
        image: "alpine:3.19".into(),
        parameters: vec![v1::Parameter {
            key: "cap-add".into(),
            value: "ALL".into(),
        }],
        ..Default::default()
    });
    container.container = Some(info);
    let mut health = command_task("health");
    health.health_check = Some(v1::HealthCheck {
        command: Some(v1::CommandInfo {
            value: Some("false".into()),
            ..Default::default()
        }),
        ..Default::default()
    });
    let mut user = command_task("user");
    user.command.as_mut().unwrap().user = Some("nobody".into());
    let mut cache = command_task("cache");
    cache
        .command
        .as_mut()
        .unwrap()
        .uris
        .push(v1::command_info::Uri {
            value: "/srv/x".into(),
            cache: Some(true),
            ..Default::default()
        });
    let mut disk = command_task("disk");
    disk.resources[0].disk = Some(v1::resource::DiskInfo::default());
    let out = translate_call(
        &FrameworkId::new("f"),
        accept(vec![launch(vec![
            container,
            health,
            command_task("ok"),
            user,
            cache,
            disk,
        ])]),
        &NoExecutors,
    )
    .unwrap();
    let refused: Vec<(&str, &str)> = out
        .refused
        .iter()
        .map(|s| (s.task_id.as_str(), s.message.as_deref().unwrap_or("")))
        .collect();
    assert_eq!(
        refused,
        [
            (
                "container",
                "ContainerInfo.DockerInfo.parameters is not supported"
            ),
            ("health", "TaskInfo.health_check is not supported"),
            ("user", "CommandInfo.user is not supported"),
            ("cache", "CommandInfo.URI.cache is not supported"),
            ("disk", "Resource.disk is not supported"),
        ]
    );
    for status in &out.refused {
        assert_eq!(status.state, TaskState::Error);
        assert_eq!(status.reason, Some(Reason::ReasonTaskInvalid));
        let mesos = mesos_status_for(status, Capabilities::default());
        assert_eq!(mesos.reason(), v1::task_status::Reason::TaskInvalid);
    }
    assert!(out.error.is_none());
    assert!(
        matches!(&out.calls[..], [Call::Launch { tasks, .. }] if tasks.len() == 1 && tasks[0].task_id.as_str() == "ok")
    );
}

#[test]
fn an_offer_operation_agora_does_not_carry_out_refuses_the_whole_accept() {
    let mut reserve = v1::offer::Operation {
        reserve: Some(v1::offer::operation::Reserve::default()),
        ..Default::default()
    };
    reserve.set_type(v1::offer::operation::Type::Reserve);
    let out = translate_call(
        &FrameworkId::new("f"),
        accept(vec![
            launch(vec![command_task("t1"), command_task("t2")]),
            reserve,
        ]),
        &NoExecutors,
    )
    .unwrap();
    let message =
        "Offer.Operation.type RESERVE is not supported: the whole ACCEPT is refused and its offers declined";
    assert_eq!(out.error, Some(CallError::BadRequest(message.into())));
    let refused: Vec<&str> = out.refused.iter().map(|s| s.task_id.as_str()).collect();
    assert_eq!(refused, ["t1", "t2"]);
    assert!(out.refused.iter().all(|s| s.state == TaskState::Error
        && s.reason == Some(Reason::ReasonTaskInvalid)
        && s.message.as_deref() == Some(message)));
    // The offers go back to the allocator at once.
    assert_eq!(
        out.calls,
        vec![Call::Decline {
            offer_ids: vec![OfferId::new("o1")],
            filters: agora_proto::Filters {
                refuse_seconds: Some(0.0)
            },
        }]
    );
    // So does an operation with operation feedback (`id`), and an
    // operation of no type.
    let mut with_id = launch(vec![command_task("t3")]);
    with_id.id = Some(v1::OperationId { value: "op".into() });
    let mut untyped = launch(vec![]);
    untyped.r#type = None;
    untyped.set_type(v1::offer::operation::Type::Unknown);
    for (operation, field) in [
        (with_id, "Offer.Operation.id is not supported"),
        (untyped, "Offer.Operation.type UNKNOWN is not supported"),
    ] {
        let out = translate_call(
            &FrameworkId::new("f"),
            accept(vec![operation]),
            &NoExecutors,
        )
        .unwrap();
        assert!(
            matches!(&out.error, Some(CallError::BadRequest(m)) if m.starts_with(field)),
            "{:?}",
            out.error
        );
        assert!(matches!(&out.calls[..], [Call::Decline { .. }]));
    }
}

#[test]
fn call_fields_and_types_agora_does_not_carry_out_are_refused_by_name() {
    let fid = FrameworkId::new("f");
    let mut kill = v1::scheduler::Call {
        kill: Some(call::Kill {
            task_id: v1::TaskId { value: "t".into() },
            kill_policy: Some(v1::KillPolicy::default()),
            ..Default::default()
        }),
        ..Default::default()
    };
    kill.set_type(call::Type::Kill);
    assert_eq!(
        translate_call(&fid, kill, &NoExecutors),
        Err(CallError::BadRequest(
            "scheduler.Call.Kill.kill_policy is not supported".into()
        ))
    );
    for (kind, name) in [
        (call::Type::UpdateFramework, "UPDATE_FRAMEWORK"),
        (call::Type::AcceptInverseOffers, "ACCEPT_INVERSE_OFFERS"),
        (call::Type::DeclineInverseOffers, "DECLINE_INVERSE_OFFERS"),
        (
            call::Type::AcknowledgeOperationStatus,
            "ACKNOWLEDGE_OPERATION_STATUS",
        ),
        (call::Type::ReconcileOperations, "RECONCILE_OPERATIONS"),
    ] {
        let mut c = v1::scheduler::Call::default();
        c.set_type(kind);
        assert_eq!(
            translate_call(&fid, c, &NoExecutors),
            Err(CallError::NotImplemented(format!(
                "scheduler.Call.type {name} is not supported"
            )))
        );
    }
}

#[test]
fn a_tasks_allocation_info_names_the_role_the_master_compares() {
    let with_roles = |roles: &[&str]| {
        let mut task = command_task("t");
        task.resources = roles
            .iter()
            .map(|role| v1::Resource {
                allocation_info: Some(v1::resource::AllocationInfo {
                    role: Some((*role).into()),
                }),
                ..task.resources[0].clone()
            })
            .collect();
        task
    };
    let out = translate_call(
        &FrameworkId::new("f"),
        accept(vec![launch(vec![with_roles(&["web"])])]),
        &NoExecutors,
    )
    .unwrap();
    let [Call::Launch { tasks, .. }] = &out.calls[..] else {
        panic!("{:?}", out.calls)
    };
    assert_eq!(tasks[0].allocation_role.as_deref(), Some("web"));

    let mut task = with_roles(&["web", "batch"]);
    task.resources[1].name = "mem".into();
    let out = translate_call(
        &FrameworkId::new("f"),
        accept(vec![launch(vec![task])]),
        &NoExecutors,
    )
    .unwrap();
    assert_eq!(out.refused.len(), 1);
    let message = out.refused[0].message.as_deref().unwrap();
    assert!(
        message.contains("allocation_info name two roles"),
        "{message}"
    );
}

#[test]
fn tasks_of_an_agent_marked_gone_are_gone_by_operator_or_lost() {
    let status = master_status(
        TaskState::Lost,
        Reason::ReasonAgentRemovedByOperator,
        "agent marked gone by an operator",
    );
    assert_eq!(
        mesos_status_for(&status, pa()).state(),
        v1::TaskState::TaskGoneByOperator
    );
    assert_eq!(
        mesos_status_for(&status, Capabilities::default()).state(),
        v1::TaskState::TaskLost
    );
}
