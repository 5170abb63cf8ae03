//! The master served in-process on an ephemeral port, spoken to over real
//! WebSockets and HTTP: bad frames, over-size frames, the HTTP endpoints
//! and a launch from scheduler to agent.

use std::time::Duration;

use agora_proto::{agent, scheduler, AgentInfo, FrameworkInfo, Resources, PROTOCOL_VERSION};
use futures::{SinkExt, StreamExt};
use tokio::net::TcpStream;
use tokio_tungstenite::tungstenite::protocol::WebSocketConfig;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::{MaybeTlsStream, WebSocketStream};

type Ws = WebSocketStream<MaybeTlsStream<TcpStream>>;

const WAIT: Duration = Duration::from_secs(10);

struct Master {
    addr: std::net::SocketAddr,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<Result<(), agora_master::MasterError>>,
}

async fn start() -> Master {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let config = agora_master::Config {
        allocation_interval: Duration::from_millis(100),
        ..Default::default()
    };
    let task = tokio::spawn(agora_master::run(listener, config, async move {
        let _ = stopped.await;
    }));
    Master {
        addr,
        stop: Some(stop),
        task,
    }
}

impl Master {
    async fn stop(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        let result = tokio::time::timeout(WAIT, self.task)
            .await
            .unwrap()
            .unwrap();
        assert!(result.is_ok(), "{result:?}");
    }
}

async fn connect(addr: std::net::SocketAddr, path: &str) -> Ws {
    let config = WebSocketConfig::default()
        .max_message_size(Some(64 << 20))
        .max_frame_size(Some(64 << 20));
    let (ws, _) = tokio_tungstenite::connect_async_with_config(
        format!("ws://{addr}{path}"),
        Some(config),
        false,
    )
    .await
    .unwrap();
    ws
}

async fn send<T: serde::Serialize>(ws: &mut Ws, msg: &T) {
    ws.send(Message::Text(agora_proto::encode(msg).into()))
        .await
        .unwrap();
}

async fn next_text(ws: &mut Ws) -> String {
    loop {
        match tokio::time::timeout(WAIT, ws.next()).await.unwrap() {
            Some(Ok(Message::Text(t))) => return t.to_string(),
            Some(Ok(Message::Ping(_) | Message::Pong(_))) => continue,
            other => panic!("expected a text frame, got {other:?}"),
        }
    }
}

async fn next_sched(ws: &mut Ws) -> scheduler::Event {
    agora_proto::decode(&next_text(ws).await).unwrap()
}

async fn next_agent(ws: &mut Ws) -> agent::Event {
    agora_proto::decode(&next_text(ws).await).unwrap()
}

fn subscribe(name: &str) -> scheduler::Call {
    scheduler::Call::Subscribe {
        protocol: PROTOCOL_VERSION,
        framework_info: FrameworkInfo::new(name),
        force: false,
    }
}

/// `GET path`: (the status code as text, the body).
async fn http_get(addr: std::net::SocketAddr, path: &str) -> (String, String) {
    let response = agora_client::Http::new()
        .with_timeout(WAIT)
        .get(addr, path)
        .await
        .unwrap();
    (response.status.to_string(), response.text())
}

#[tokio::test]
async fn malformed_frames_get_errors_and_the_connection_keeps_working() {
    let master = start().await;
    let mut ws = connect(master.addr, "/api/scheduler").await;
    ws.send(Message::Text("this is not json".into()))
        .await
        .unwrap();
    match next_sched(&mut ws).await {
        scheduler::Event::Error { message, fatal } => {
            assert!(!fatal);
            assert!(message.contains("malformed"), "{message}");
        }
        e => panic!("{e:?}"),
    }
    ws.send(Message::Text(r#"{"type":"FROM_THE_FUTURE"}"#.into()))
        .await
        .unwrap();
    assert!(
        matches!(next_sched(&mut ws).await, scheduler::Event::Error { fatal: false, message } if message.contains("unknown message type"))
    );
    ws.send(Message::Binary(vec![1, 2, 3].into()))
        .await
        .unwrap();
    assert!(
        matches!(next_sched(&mut ws).await, scheduler::Event::Error { fatal: false, message } if message.contains("binary"))
    );
    send(&mut ws, &scheduler::Call::Revive { roles: vec![] }).await;
    assert!(
        matches!(next_sched(&mut ws).await, scheduler::Event::Error { fatal: false, message } if message.contains("subscribe first"))
    );
    send(&mut ws, &subscribe("fw")).await;
    assert!(matches!(
        next_sched(&mut ws).await,
        scheduler::Event::Subscribed {
            reregistered: false,
            ..
        }
    ));
    master.stop().await;
}

#[tokio::test]
async fn oversize_frame_closes_only_that_connection() {
    let master = start().await;
    let mut good = connect(master.addr, "/api/scheduler").await;
    let mut bad = connect(master.addr, "/api/scheduler").await;
    let huge = "x".repeat(agora_proto::MAX_FRAME_BYTES + 1);
    let _ = bad.send(Message::Text(huge.into())).await;
    let code = loop {
        match tokio::time::timeout(WAIT, bad.next()).await.unwrap() {
            Some(Ok(Message::Close(Some(frame)))) => break u16::from(frame.code),
            Some(Ok(_)) => continue,
            other => panic!("expected a close frame, got {other:?}"),
        }
    };
    assert_eq!(code, 1009);
    send(&mut good, &subscribe("still-fine")).await;
    assert!(matches!(
        next_sched(&mut good).await,
        scheduler::Event::Subscribed { .. }
    ));
    master.stop().await;
}

#[tokio::test]
async fn http_endpoints_answer() {
    let master = start().await;
    let (status, body) = http_get(master.addr, "/health").await;
    assert!(status.contains("200"), "{status}");
    assert_eq!(body, "ok");
    let (status, body) = http_get(master.addr, "/version").await;
    assert!(status.contains("200"));
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    // Mesos's shape: a purely numeric Mesos API version, Agora's own beside it.
    let version = v["version"].as_str().unwrap();
    assert!(
        version.split('.').all(|n| n.parse::<u32>().is_ok()),
        "{version}"
    );
    assert_eq!(v["agora_version"], agora_proto::VERSION);
    let (status, body) = http_get(master.addr, "/state").await;
    assert!(status.contains("200"));
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["master"]["address"], master.addr.to_string());
    assert!(v["agents"].is_array() && v["frameworks"].is_array());
    master.stop().await;
}

#[tokio::test]
async fn offer_launch_and_update_round_trip() {
    let master = start().await;
    let mut agent_ws = connect(master.addr, "/api/agent").await;
    send(
        &mut agent_ws,
        &agent::Call::Register {
            protocol: PROTOCOL_VERSION,
            agent_info: AgentInfo {
                id: None,
                hostname: "h".into(),
                address: "127.0.0.1:1".into(),
                resources: Resources::parse("cpus:2;mem:1024").unwrap(),
                attributes: Default::default(),
            },
            tasks: vec![],
            executors: vec![],
            frameworks: vec![],
        },
    )
    .await;
    let agent_id = match next_agent(&mut agent_ws).await {
        agent::Event::Registered { agent_id, .. } => agent_id,
        e => panic!("{e:?}"),
    };
    let mut sched = connect(master.addr, "/api/scheduler").await;
    send(&mut sched, &subscribe("fw")).await;
    let framework_id = match next_sched(&mut sched).await {
        scheduler::Event::Subscribed { framework_id, .. } => framework_id,
        e => panic!("{e:?}"),
    };
    let offer = loop {
        if let scheduler::Event::Offers { mut offers } = next_sched(&mut sched).await {
            break offers.remove(0);
        }
    };
    assert_eq!(offer.agent_id, agent_id);
    let task = agora_proto::TaskInfo {
        container: None,
        allocation_role: None,
        launch_stamp: None,
        name: "t".into(),
        task_id: "t1".into(),
        agent_id: agent_id.clone(),
        resources: Resources::parse("cpus:1;mem:128").unwrap(),
        executor: None,
        command: Some(agora_proto::CommandInfo {
            value: "true".into(),
            ..Default::default()
        }),
        data: None,
        kill_grace_period: None,
        labels: Default::default(),
        task_group: None,
    };
    send(
        &mut sched,
        &scheduler::Call::Launch {
            offer_ids: vec![offer.id],
            tasks: vec![task],
            filters: Default::default(),
        },
    )
    .await;
    loop {
        match next_agent(&mut agent_ws).await {
            agent::Event::RunTask { task, framework } => {
                assert_eq!(task.task_id.as_str(), "t1");
                assert_eq!(framework.id.as_ref(), Some(&framework_id));
                break;
            }
            agent::Event::Ping => continue,
            e => panic!("{e:?}"),
        }
    }
    let status = agora_proto::TaskStatus::new(
        "t1".into(),
        agora_proto::TaskState::Running,
        agora_proto::Source::SourceExecutor,
    )
    .with_new_uuid();
    let uuid = status.uuid.clone().unwrap();
    send(
        &mut agent_ws,
        &agent::Call::StatusUpdate {
            framework_id: framework_id.clone(),
            status,
        },
    )
    .await;
    loop {
        match next_sched(&mut sched).await {
            scheduler::Event::Update { status } => {
                assert_eq!(status.state, agora_proto::TaskState::Running);
                break;
            }
            scheduler::Event::Offers { .. } | scheduler::Event::Heartbeat => continue,
            e => panic!("{e:?}"),
        }
    }
    send(
        &mut sched,
        &scheduler::Call::Acknowledge {
            agent_id,
            task_id: "t1".into(),
            uuid: uuid.clone(),
        },
    )
    .await;
    match next_agent(&mut agent_ws).await {
        agent::Event::Acknowledge { uuid: got, .. } => assert_eq!(got, uuid),
        e => panic!("{e:?}"),
    }
    master.stop().await;
}

/// A key Agora's types do not have is refused by name: in a task, that
/// task gets TASK_ERROR while the launch's other task runs; in a call's
/// body, the call gets an error event.
#[tokio::test]
async fn unknown_keys_of_a_scheduler_call_are_refused_by_name() {
    let master = start().await;
    let mut agent_ws = connect(master.addr, "/api/agent").await;
    send(
        &mut agent_ws,
        &agent::Call::Register {
            protocol: PROTOCOL_VERSION,
            agent_info: AgentInfo {
                id: None,
                hostname: "h".into(),
                address: "127.0.0.1:1".into(),
                resources: Resources::parse("cpus:2;mem:1024").unwrap(),
                attributes: Default::default(),
            },
            tasks: vec![],
            executors: vec![],
            frameworks: vec![],
        },
    )
    .await;
    let agent_id = match next_agent(&mut agent_ws).await {
        agent::Event::Registered { agent_id, .. } => agent_id,
        e => panic!("{e:?}"),
    };
    let mut sched = connect(master.addr, "/api/scheduler").await;
    send(&mut sched, &subscribe("fw")).await;
    assert!(matches!(
        next_sched(&mut sched).await,
        scheduler::Event::Subscribed { .. }
    ));
    let offer = loop {
        if let scheduler::Event::Offers { mut offers } = next_sched(&mut sched).await {
            break offers.remove(0);
        }
    };
    // A body key.
    sched
        .send(Message::Text(
            r#"{"type":"REVIVE","roles":[],"role":"web"}"#.into(),
        ))
        .await
        .unwrap();
    match next_sched(&mut sched).await {
        scheduler::Event::Error { message, fatal } => {
            assert!(!fatal);
            assert!(message.contains("`role`"), "{message}");
        }
        e => panic!("{e:?}"),
    }
    // A task key.
    let launch = format!(
        r#"{{"type":"LAUNCH","offer_ids":["{offer}"],"tasks":[
            {{"name":"a","task_id":"boxed","agent_id":"{agent_id}","resources":[{{"name":"cpus","scalar":0.5}}],
              "command":{{"value":"true"}},"health_check":{{"command":"false"}}}},
            {{"name":"b","task_id":"plain","agent_id":"{agent_id}","resources":[{{"name":"cpus","scalar":0.5}}],
              "command":{{"value":"true"}}}}]}}"#,
        offer = offer.id
    );
    sched.send(Message::Text(launch.into())).await.unwrap();
    loop {
        match next_sched(&mut sched).await {
            scheduler::Event::Update { status } => {
                assert_eq!(status.task_id.as_str(), "boxed");
                assert_eq!(status.state, agora_proto::TaskState::Error);
                assert_eq!(status.reason, Some(agora_proto::Reason::ReasonTaskInvalid));
                assert_eq!(
                    status.message.as_deref(),
                    Some("TaskInfo.health_check is not a field Agora knows")
                );
                break;
            }
            scheduler::Event::Heartbeat | scheduler::Event::Offers { .. } => continue,
            e => panic!("{e:?}"),
        }
    }
    loop {
        match next_agent(&mut agent_ws).await {
            agent::Event::RunTask { task, .. } => {
                assert_eq!(task.task_id.as_str(), "plain");
                break;
            }
            agent::Event::Ping => continue,
            e => panic!("{e:?}"),
        }
    }
    master.stop().await;
}
