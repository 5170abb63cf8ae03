//! Golden tests: the bytes both codecs write for representative events,
//! and what they read from the shapes real clients send. A change to the
//! wire format shows up here as a diff.

use agora_mesos_proto::convert::{self, Capabilities};
use agora_mesos_proto::v1::scheduler::{call, event};
use agora_mesos_proto::{v1, Codec, CodecError};

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn json(message: &impl prost_reflect::ReflectMessage) -> String {
    String::from_utf8(Codec::Json.encode(message).unwrap()).unwrap()
}

fn update() -> v1::scheduler::Event {
    let status = convert::mesos_status(&agora_proto::TaskStatus {
        container_status: None,
        launch_stamp: None,
        task_id: agora_proto::TaskId::new("t-1"),
        state: agora_proto::TaskState::Running,
        message: Some("café ☕".into()),
        source: agora_proto::Source::SourceExecutor,
        reason: None,
        data: Some(agora_proto::Bytes(vec![0, 1, 2, 255])),
        agent_id: Some(agora_proto::AgentId::new("a-1")),
        executor_id: Some(agora_proto::ExecutorId::new("t-1")),
        timestamp: 1_700_000_000.5,
        uuid: Some("00010203-0405-0607-0809-0a0b0c0d0e0f".into()),
        labels: [("k".to_string(), "v\nw".to_string())].into(),
        healthy: None,
    });
    let mut e = v1::scheduler::Event {
        update: Some(event::Update { status }),
        ..Default::default()
    };
    e.set_type(event::Type::Update);
    e
}

#[test]
fn json_is_written_as_mesos_writes_it() {
    assert_eq!(
        json(&update()),
        r#"{"type":"UPDATE","update":{"status":{"task_id":{"value":"t-1"},"state":"TASK_RUNNING","data":"AAEC/w==","message":"caf\u00e9 \u2615","agent_id":{"value":"a-1"},"timestamp":1700000000.5,"executor_id":{"value":"t-1"},"source":"SOURCE_EXECUTOR","uuid":"AAECAwQFBgcICQoLDA0ODw==","labels":{"labels":[{"key":"k","value":"v\nw"}]}}}}"#
    );
    let offer = agora_proto::Offer {
        id: agora_proto::OfferId::new("o-1"),
        framework_id: agora_proto::FrameworkId::new("f-1"),
        agent_id: agora_proto::AgentId::new("a-1"),
        hostname: "h".into(),
        resources: agora_proto::Resources::parse(
            "cpus:1.5;ports:[31000-31001,4294967296-4294967297]",
        )
        .unwrap(),
        attributes: agora_proto::Attributes::parse("rack:r1;level:2").unwrap(),
        executor_ids: vec![],
        allocation_role: Some("*".into()),
    };
    let mut offers = v1::scheduler::Event {
        offers: Some(event::Offers {
            offers: vec![convert::mesos_offer(&offer, Capabilities::default())],
        }),
        ..Default::default()
    };
    offers.set_type(event::Type::Offers);
    assert_eq!(
        json(&offers),
        r#"{"type":"OFFERS","offers":{"offers":[{"id":{"value":"o-1"},"framework_id":{"value":"f-1"},"agent_id":{"value":"a-1"},"hostname":"h","resources":[{"name":"cpus","type":"SCALAR","scalar":{"value":1.5},"role":"*"},{"name":"ports","type":"RANGES","ranges":{"range":[{"begin":31000,"end":31001},{"begin":4294967296,"end":4294967297}]},"role":"*"}],"attributes":[{"name":"rack","type":"TEXT","text":{"value":"r1"}},{"name":"level","type":"SCALAR","scalar":{"value":2.0}}]}]}}"#
    );
    // One line, ASCII only: line-splitting clients depend on it.
    let text = json(&update());
    assert!(text.is_ascii() && !text.contains('\n'));
}

#[test]
fn protobuf_is_the_mesos_v1_encoding() {
    let mut heartbeat = v1::scheduler::Event::default();
    heartbeat.set_type(event::Type::Heartbeat);
    // Field 1 (type), varint 8 (HEARTBEAT).
    assert_eq!(hex(&Codec::Protobuf.encode(&heartbeat).unwrap()), "0808");
    let mut subscribed = v1::scheduler::Event {
        subscribed: Some(event::Subscribed {
            framework_id: v1::FrameworkId { value: "f".into() },
            heartbeat_interval_seconds: Some(15.0),
            master_info: None,
        }),
        ..Default::default()
    };
    subscribed.set_type(event::Type::Subscribed);
    // type=1; subscribed (field 2) { framework_id (1) {value "f"}, heartbeat (2) double 15.0 }
    assert_eq!(
        hex(&Codec::Protobuf.encode(&subscribed).unwrap()),
        "0801120e0a030a0166110000000000002e40"
    );
    let bytes = Codec::Protobuf.encode(&update()).unwrap();
    let back: v1::scheduler::Event = Codec::Protobuf.decode(&bytes).unwrap();
    assert_eq!(back, update());
}

#[test]
fn calls_decode_as_clients_send_them() {
    // pymesos's SUBSCRIBE.
    let call: v1::scheduler::Call = Codec::Json
        .decode(br#"{"type":"SUBSCRIBE","subscribe":{"framework_info":{"user":"","name":"x","failover_timeout":100,"capabilities":[{"type":"GPU_RESOURCES"}],"hostname":"","webui_url":""}}}"#)
        .unwrap();
    // A key Mesos does not know is an error naming it, never dropped.
    let unknown = Codec::Json
        .decode::<v1::scheduler::Call>(br#"{"type":"SUBSCRIBE","subscribe":{"framework_info":{"user":"","name":"x"},"credentials":[]}}"#)
        .unwrap_err();
    assert!(
        unknown
            .to_string()
            .contains("unrecognized field name 'credentials'"),
        "{unknown}"
    );
    assert_eq!(call.r#type(), call::Type::Subscribe);
    assert_eq!(
        call.subscribe.unwrap().framework_info.failover_timeout,
        Some(100.0)
    );
    // 64-bit numbers may come as strings; null means unset.
    let call: v1::scheduler::Call = Codec::Json
        .decode(br#"{"type":"DECLINE","framework_id":{"value":"f"},"decline":{"offer_ids":[{"value":"o"}],"filters":null}}"#)
        .unwrap();
    assert!(call.decline.unwrap().filters.is_none());
    // Required fields are enforced, with their paths.
    let missing = Codec::Json
        .decode::<v1::scheduler::Call>(br#"{"type":"KILL","framework_id":{"value":"f"},"kill":{}}"#)
        .unwrap_err();
    assert_eq!(
        missing,
        CodecError::MissingRequired(vec!["kill.task_id".into()])
    );
    assert!(matches!(
        Codec::Json.decode::<v1::scheduler::Call>(b"{not json"),
        Err(CodecError::Json { .. })
    ));
    assert!(matches!(
        Codec::Protobuf.decode::<v1::scheduler::Call>(&[0xff, 0xff, 0xff]),
        Err(CodecError::Protobuf { .. })
    ));
    // A protobuf KILL without its required task id.
    let mut kill = v1::scheduler::Call::default();
    kill.set_type(call::Type::Kill);
    let bytes = {
        use prost::Message;
        // kill (field 6) as an empty message.
        let mut b = kill.encode_to_vec();
        b.extend([0x32, 0x00]);
        b
    };
    assert_eq!(
        Codec::Protobuf
            .decode::<v1::scheduler::Call>(&bytes)
            .unwrap_err(),
        CodecError::MissingRequired(vec!["kill.task_id".into()])
    );
}

/// Executor events, as pymesos's and mesos-go's executors read them.
#[test]
fn executor_events_are_written_as_mesos_writes_them() {
    use agora_mesos_proto::executor::EventTranslator;
    use agora_proto::executor::Event;
    let mut events = EventTranslator::new(5051);
    let ack = events
        .translate(Event::Acknowledged {
            task_id: agora_proto::TaskId::new("t-1"),
            uuid: "00010203-0405-0607-0809-0a0b0c0d0e0f".into(),
        })
        .unwrap();
    assert_eq!(
        json(&ack),
        r#"{"type":"ACKNOWLEDGED","acknowledged":{"task_id":{"value":"t-1"},"uuid":"AAECAwQFBgcICQoLDA0ODw=="}}"#
    );
    assert_eq!(
        hex(&Codec::Protobuf.encode(&ack).unwrap()),
        // type = 4; acknowledged (3) { task_id (1) { value }, uuid (2) }
        "0804\
         1a19\
         0a050a03742d31\
         1210000102030405060708090a0b0c0d0e0f"
    );
    let kill = events
        .translate(Event::Kill {
            task_id: agora_proto::TaskId::new("t-1"),
            grace_period_seconds: Some(2.5),
        })
        .unwrap();
    assert_eq!(
        json(&kill),
        r#"{"type":"KILL","kill":{"task_id":{"value":"t-1"},"kill_policy":{"grace_period":{"nanoseconds":2500000000}}}}"#
    );
    let message = events
        .translate(Event::Message {
            data: agora_proto::Bytes(b"hi".to_vec()),
        })
        .unwrap();
    assert_eq!(
        json(&message),
        r#"{"type":"MESSAGE","message":{"data":"aGk="}}"#
    );
    let error = events
        .translate(Event::Error {
            message: "no".into(),
            fatal: false,
        })
        .unwrap();
    assert_eq!(json(&error), r#"{"type":"ERROR","error":{"message":"no"}}"#);
}

/// A task group for a custom executor arrives in one LAUNCH_GROUP, whose
/// tasks name no executor (as Mesos's); HEARTBEAT has no inner key.
#[test]
fn launch_group_and_heartbeat_are_written_as_mesos_writes_them() {
    use agora_mesos_proto::executor::EventTranslator;
    use agora_proto::executor::Event;
    let executor = agora_proto::ExecutorInfo {
        container: None,
        executor_id: agora_proto::ExecutorId::new("e"),
        framework_id: Some(agora_proto::FrameworkId::new("f")),
        command: agora_proto::CommandInfo::shell("./run"),
        resources: agora_proto::Resources::default(),
        name: String::new(),
        source: String::new(),
        api: agora_proto::ExecutorApi::MesosV1,
        shutdown_grace_period: Some(2.5),
        data: Some(agora_proto::Bytes(b"hi".to_vec())),
        labels: [("k".to_string(), "v".to_string())].into(),
    };
    let task = agora_proto::TaskInfo {
        container: None,
        allocation_role: None,
        launch_stamp: None,
        name: "a".into(),
        task_id: agora_proto::TaskId::new("t"),
        agent_id: agora_proto::AgentId::new("x"),
        resources: agora_proto::Resources::default(),
        executor: Some(executor.clone()),
        command: None,
        data: None,
        kill_grace_period: None,
        labels: Default::default(),
        task_group: Some("o1/0".into()),
    };
    let mut events = EventTranslator::new(5051);
    let group = events
        .translate(Event::LaunchGroup { tasks: vec![task] })
        .unwrap();
    assert_eq!(
        json(&group),
        r#"{"type":"LAUNCH_GROUP","launch_group":{"task_group":{"tasks":[{"name":"a","task_id":{"value":"t"},"agent_id":{"value":"x"}}]}}}"#
    );
    assert_eq!(
        hex(&Codec::Protobuf.encode(&group).unwrap()),
        // type = 8; launch_group (8) { task_group (1) { tasks (1) {
        // name (1), task_id (2) { value }, agent_id (3) { value } } } }
        "0808\
         4211\
         0a0f\
         0a0d\
         0a0161\
         12030a0174\
         1a030a0178"
    );
    let heartbeat = EventTranslator::heartbeat();
    assert_eq!(json(&heartbeat), r#"{"type":"HEARTBEAT"}"#);
    assert_eq!(hex(&Codec::Protobuf.encode(&heartbeat).unwrap()), "0809");

    // SUBSCRIBED gives the executor its grace period, data and labels.
    let mut framework = agora_proto::FrameworkInfo::new("fw");
    framework.id = Some(agora_proto::FrameworkId::new("f"));
    let subscribed = events
        .translate(Event::Subscribed {
            executor_info: executor,
            framework_info: framework,
            agent_id: agora_proto::AgentId::new("x"),
            hostname: "h".into(),
        })
        .unwrap();
    assert_eq!(
        json(&subscribed.subscribed.unwrap().executor_info),
        r#"{"executor_id":{"value":"e"},"data":"aGk=","command":{"value":"./run","shell":true},"framework_id":{"value":"f"},"shutdown_grace_period":{"nanoseconds":2500000000},"labels":{"labels":[{"key":"k","value":"v"}]},"type":"CUSTOM"}"#
    );
}
