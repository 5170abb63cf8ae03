//! A fake agent: a WebSocket server on an ephemeral 127.0.0.1 port that a
//! test drives by hand.

#![allow(dead_code)]

use std::time::Duration;

use agora_executor::proto::executor::{Call, Event};
use agora_executor::{
    AgentId, CommandInfo, ExecutorId, ExecutorInfo, FrameworkInfo, TaskId, TaskInfo, TaskStatus,
};
use futures::{SinkExt, StreamExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::time::timeout;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::WebSocketStream;

pub const STEP: Duration = Duration::from_secs(10);

pub type Conn = WebSocketStream<TcpStream>;

pub struct FakeAgent {
    pub listener: TcpListener,
}

impl FakeAgent {
    pub async fn bind() -> Self {
        FakeAgent {
            listener: TcpListener::bind("127.0.0.1:0").await.unwrap(),
        }
    }

    pub fn endpoint(&self) -> String {
        format!("ws://{}/api/executor", self.listener.local_addr().unwrap())
    }

    pub async fn accept(&self) -> Conn {
        let (stream, _) = timeout(STEP, self.listener.accept())
            .await
            .expect("executor connects in time")
            .unwrap();
        let mut path = String::new();
        // tungstenite's callback signature, not ours.
        #[allow(clippy::result_large_err)]
        let ws = tokio_tungstenite::accept_hdr_async(
            stream,
            |request: &tokio_tungstenite::tungstenite::handshake::server::Request, response| {
                path = request.uri().path().to_string();
                Ok(response)
            },
        )
        .await
        .unwrap();
        assert_eq!(path, "/api/executor");
        ws
    }
}

pub async fn recv(ws: &mut Conn) -> Call {
    loop {
        let frame = timeout(STEP, ws.next())
            .await
            .expect("a frame in time")
            .expect("connection open")
            .expect("valid frame");
        match frame {
            Message::Text(text) => return agora_executor::proto::decode(text.as_str()).unwrap(),
            Message::Ping(_) | Message::Pong(_) => continue,
            other => panic!("expected a text frame, got {other:?}"),
        }
    }
}

/// The next UPDATE's status.
pub async fn recv_update(ws: &mut Conn) -> TaskStatus {
    match recv(ws).await {
        Call::Update { status } => status,
        other => panic!("expected UPDATE, got {other:?}"),
    }
}

/// Calls written until the executor closes the connection.
pub async fn drain_until_closed(ws: &mut Conn) -> Vec<Call> {
    let mut calls = Vec::new();
    loop {
        match timeout(STEP, ws.next()).await.expect("close in time") {
            Some(Ok(Message::Text(text))) => {
                calls.push(agora_executor::proto::decode(text.as_str()).unwrap())
            }
            Some(Ok(Message::Close(_))) | None | Some(Err(_)) => return calls,
            Some(Ok(_)) => {}
        }
    }
}

pub async fn send(ws: &mut Conn, event: &Event) {
    ws.send(Message::text(agora_executor::proto::encode(event)))
        .await
        .unwrap();
}

pub fn subscribed(executor_id: &str) -> Event {
    Event::Subscribed {
        executor_info: ExecutorInfo {
            container: None,
            executor_id: ExecutorId::new(executor_id),
            framework_id: None,
            command: CommandInfo::default(),
            resources: Default::default(),
            name: String::new(),
            source: String::new(),
            api: Default::default(),
            shutdown_grace_period: None,
            data: None,
            labels: Default::default(),
        },
        framework_info: FrameworkInfo::new("fake-framework"),
        agent_id: AgentId::new("agent-1"),
        hostname: "localhost".into(),
    }
}

pub async fn ack(ws: &mut Conn, status: &TaskStatus) {
    send(
        ws,
        &Event::Acknowledged {
            task_id: status.task_id.clone(),
            uuid: status.uuid.clone().expect("reliable update"),
        },
    )
    .await;
}

pub fn command_task(id: &str, command: Option<CommandInfo>) -> TaskInfo {
    TaskInfo {
        container: None,
        allocation_role: None,
        launch_stamp: None,
        name: id.into(),
        task_id: TaskId::new(id),
        agent_id: AgentId::new("agent-1"),
        resources: agora_executor::proto::Resources::parse("cpus:0.1;mem:32").unwrap(),
        executor: None,
        command,
        data: None,
        kill_grace_period: None,
        labels: Default::default(),
        task_group: None,
    }
}

pub fn shell(value: &str) -> CommandInfo {
    CommandInfo {
        value: value.into(),
        ..CommandInfo::default()
    }
}
