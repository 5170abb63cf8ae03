//! Golden JSON: pins the wire format of representative messages of every
//! channel, so a change to the protocol is a visible diff here.

use std::collections::BTreeMap;

use agora_proto::{
    agent, decode, encode, executor, scheduler, AgentId, Bytes, CommandInfo, DecodeError, Filters,
    FrameworkInfo, OfferId, Reason, Resources, Source, TaskId, TaskInfo, TaskState, TaskStatus,
    MAX_FRAME_BYTES,
};

fn task() -> TaskInfo {
    TaskInfo {
        container: None,
        allocation_role: None,
        launch_stamp: None,
        name: "t".into(),
        task_id: TaskId::new("t1"),
        agent_id: AgentId::new("a1"),
        resources: Resources::parse("cpus:0.5;mem:64;ports:[31000-31001]").unwrap(),
        executor: None,
        command: Some(CommandInfo {
            value: "echo hi".into(),
            ..CommandInfo::default()
        }),
        data: Some(Bytes::from("d")),
        kill_grace_period: None,
        labels: BTreeMap::new(),
        task_group: None,
    }
}

#[test]
fn scheduler_launch() {
    let call = scheduler::Call::Launch {
        offer_ids: vec![OfferId::new("o1")],
        tasks: vec![task()],
        filters: Filters {
            refuse_seconds: Some(1.0),
        },
    };
    let json = encode(&call);
    assert_eq!(
        json,
        r#"{"type":"LAUNCH","offer_ids":["o1"],"tasks":[{"name":"t","task_id":"t1","agent_id":"a1","resources":[{"name":"cpus","scalar":0.5},{"name":"mem","scalar":64.0},{"name":"ports","ranges":[[31000,31001]]}],"command":{"value":"echo hi","shell":true,"arguments":[],"environment":{}},"data":"ZA=="}],"filters":{"refuse_seconds":1.0}}"#
    );
    assert_eq!(decode::<scheduler::Call>(&json).unwrap(), call);
}

#[test]
fn scheduler_subscribe_and_update() {
    let mut info = FrameworkInfo::new("f");
    info.checkpoint = true;
    let call = scheduler::Call::Subscribe {
        protocol: 1,
        framework_info: info,
        force: false,
    };
    assert_eq!(
        encode(&call),
        r#"{"type":"SUBSCRIBE","protocol":1,"framework_info":{"user":"","name":"f","failover_timeout":0.0,"checkpoint":true,"roles":[],"hostname":""},"force":false}"#
    );
    let mut status = TaskStatus::new(TaskId::new("t1"), TaskState::Failed, Source::SourceAgent)
        .with_reason(Reason::ReasonExecutorTerminated)
        .with_message("executor exited with status 1");
    status.timestamp = 1.5;
    status.uuid = Some("u-1".into());
    let event = scheduler::Event::Update { status };
    assert_eq!(
        encode(&event),
        r#"{"type":"UPDATE","status":{"task_id":"t1","state":"TASK_FAILED","message":"executor exited with status 1","source":"SOURCE_AGENT","reason":"REASON_EXECUTOR_TERMINATED","timestamp":1.5,"uuid":"u-1"}}"#
    );
}

#[test]
fn agent_and_executor_channels() {
    assert_eq!(encode(&agent::Event::Ping), r#"{"type":"PING"}"#);
    assert_eq!(encode(&agent::Call::Pong), r#"{"type":"PONG"}"#);
    let ack = executor::Event::Acknowledged {
        task_id: TaskId::new("t1"),
        uuid: "u".into(),
    };
    assert_eq!(
        encode(&ack),
        r#"{"type":"ACKNOWLEDGED","task_id":"t1","uuid":"u"}"#
    );
}

#[test]
fn decoding_is_tolerant_and_strict_where_it_must_be() {
    // Unknown fields of events are ignored (a newer master may add some).
    let event: scheduler::Event =
        decode(r#"{"type":"RESCIND","offer_id":"o","from_the_future":1}"#).unwrap();
    assert!(matches!(event, scheduler::Event::Rescind { .. }));
    // A call's are an error naming them: a scheduler that sends one asks
    // for something the master would not do.
    let err = decode::<scheduler::Call>(r#"{"type":"REVIVE","roles":[],"from_the_future":1}"#)
        .unwrap_err();
    assert!(err.to_string().contains("`from_the_future`"), "{err}");
    // So are those of the records a call carries, found by path: a
    // task's refuse that task only.
    let launch = r#"{"type":"LAUNCH","offer_ids":["o1"],"tasks":[
        {"name":"a","task_id":"a","agent_id":"a1","resources":[{"name":"cpus","scalar":0.5},{"name":"ports","ranges":[[31000,31001]]}],"command":{"value":"true"},"health_check":{"command":"false"}},
        {"name":"b","task_id":"b","agent_id":"a1","resources":[{"name":"cpus","scalar":0.5}],"command":{"value":"true","uris":[{"value":"/x"}]},"labels":{"k":"v"}},
        {"name":"c","task_id":"c","agent_id":"a1","resources":[],"executor":{"executor_id":"e","command":{"value":"x","user":"nobody"}}}],
        "filters":{"refuse_seconds":1.0}}"#;
    assert!(matches!(
        decode::<scheduler::Call>(launch),
        Ok(scheduler::Call::Launch { .. })
    ));
    assert_eq!(
        scheduler::unknown_fields(launch),
        scheduler::UnknownFields {
            call: None,
            tasks: vec![
                (0, "health_check".into()),
                (2, "executor.command.user".into())
            ],
        }
    );
    let subscribe =
        r#"{"type":"SUBSCRIBE","protocol":1,"framework_info":{"name":"f","capabilities":[]}}"#;
    assert_eq!(
        scheduler::unknown_fields(subscribe).call.as_deref(),
        Some("framework_info.capabilities")
    );
    assert_eq!(
        scheduler::unknown_fields(r#"{"type":"DECLINE","offer_ids":[],"filters":{"refuse":1}}"#)
            .call
            .as_deref(),
        Some("filters.refuse")
    );
    // Unknown types are named.
    assert_eq!(
        decode::<scheduler::Call>(r#"{"type":"WARP"}"#),
        Err(DecodeError::UnknownType("WARP".into()))
    );
    // Malformed JSON and impossible resources are errors with a reason.
    assert!(matches!(
        decode::<agent::Call>("{"),
        Err(DecodeError::Malformed(_))
    ));
    let err = decode::<agent::Call>(
        r#"{"type":"REGISTER","protocol":1,"agent_info":{"hostname":"h","address":"a","resources":[{"name":"cpus","scalar":-1}]}}"#,
    )
    .unwrap_err();
    assert!(err.to_string().contains("cpus"), "{err}");
    // Oversized frames are refused before parsing.
    let big = " ".repeat(MAX_FRAME_BYTES + 1);
    assert!(matches!(
        decode::<agent::Call>(&big),
        Err(DecodeError::TooLarge { .. })
    ));
}

/// Floats (timestamps, scalars) survive the wire bit for bit: serde_json's
/// default float parsing may be one unit in the last place off, which
/// showed as a status whose timestamp changed between master and driver.
#[test]
fn floats_round_trip_exactly() {
    let mut status = TaskStatus::new(
        TaskId::new("t1"),
        TaskState::Running,
        Source::SourceExecutor,
    );
    for timestamp in [
        1796261898.0576303_f64,
        1796261898.0576305,
        0.1 + 0.2,
        1e-7,
        123456.789012345,
    ] {
        status.timestamp = timestamp;
        let text = serde_json::to_string(&status).unwrap();
        let back: TaskStatus = serde_json::from_str(&text).unwrap();
        assert_eq!(back.timestamp.to_bits(), timestamp.to_bits(), "{text}");
    }
}

/// The record the leading master keeps in etcd at `PREFIX/leader`,
/// read by every client that follows the leader.
#[test]
fn leader_record() {
    let leader = agora_proto::LeaderInfo {
        address: "10.0.0.1:5050".into(),
        master_id: "m-1".into(),
    };
    let json = serde_json::to_string(&leader).unwrap();
    assert_eq!(json, r#"{"address":"10.0.0.1:5050","master_id":"m-1"}"#);
    let read: agora_proto::LeaderInfo =
        serde_json::from_str(r#"{"master_id":"m-1","address":"10.0.0.1:5050","later":1}"#).unwrap();
    assert_eq!(read, leader);
}
