//! The scheduler driver against a fake master: a WebSocket server on an
//! ephemeral 127.0.0.1 port that this test drives by hand, checking the
//! exact frames the driver writes.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use agora_scheduler::proto::scheduler::{Call, Event};
use agora_scheduler::proto::PROTOCOL_VERSION;
use agora_scheduler::{
    AgentId, DriverConfig, DriverError, DriverStatus, ExecutorId, Filters, FrameworkId,
    FrameworkInfo, MasterInfo, OfferId, Reason, Resources, Scheduler, SchedulerDriver, Source,
    TaskId, TaskInfo, TaskState, TaskStatus,
};
use futures::{SinkExt, StreamExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio::time::timeout;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::WebSocketStream;

const STEP: Duration = Duration::from_secs(10);

type Conn = WebSocketStream<TcpStream>;

/// What the test scheduler saw, in order.
#[derive(Debug, Clone, PartialEq)]
enum Seen {
    Registered(FrameworkId),
    Reregistered,
    Disconnected,
    Status(TaskStatus),
    StatusReturned(TaskId),
    Message(ExecutorId, AgentId, Vec<u8>),
    AgentLost(AgentId),
    ExecutorLost(ExecutorId, Option<i32>),
    Error(String),
}

type Hook = Box<dyn FnMut(&SchedulerDriver) + Send>;

struct Recorder {
    seen: mpsc::UnboundedSender<Seen>,
    on_disconnected: Option<Hook>,
    status_delay: Duration,
}

impl Scheduler for Recorder {
    fn registered(&mut self, _: &SchedulerDriver, framework_id: &FrameworkId, _: &MasterInfo) {
        let _ = self.seen.send(Seen::Registered(framework_id.clone()));
    }
    fn reregistered(&mut self, _: &SchedulerDriver, _: &MasterInfo) {
        let _ = self.seen.send(Seen::Reregistered);
    }
    fn disconnected(&mut self, driver: &SchedulerDriver) {
        let _ = self.seen.send(Seen::Disconnected);
        if let Some(hook) = self.on_disconnected.as_mut() {
            hook(driver);
        }
    }
    fn status_update(&mut self, _: &SchedulerDriver, status: &TaskStatus) {
        let _ = self.seen.send(Seen::Status(status.clone()));
        std::thread::sleep(self.status_delay);
        let _ = self.seen.send(Seen::StatusReturned(status.task_id.clone()));
    }
    fn framework_message(&mut self, _: &SchedulerDriver, e: &ExecutorId, a: &AgentId, d: &[u8]) {
        let _ = self
            .seen
            .send(Seen::Message(e.clone(), a.clone(), d.to_vec()));
    }
    fn agent_lost(&mut self, _: &SchedulerDriver, agent_id: &AgentId) {
        let _ = self.seen.send(Seen::AgentLost(agent_id.clone()));
    }
    fn executor_lost(&mut self, _: &SchedulerDriver, e: &ExecutorId, _: &AgentId, s: Option<i32>) {
        let _ = self.seen.send(Seen::ExecutorLost(e.clone(), s));
    }
    fn error(&mut self, driver: &SchedulerDriver, message: &str) {
        assert_eq!(driver.status(), DriverStatus::Aborted);
        let _ = self.seen.send(Seen::Error(message.to_string()));
    }
}

struct Harness {
    listener: TcpListener,
    driver: SchedulerDriver,
    seen: mpsc::UnboundedReceiver<Seen>,
}

async fn harness(configure: impl FnOnce(&mut DriverConfig), hook: Option<Hook>) -> Harness {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let mut config = DriverConfig::new(listener.local_addr().unwrap().to_string());
    config.reconnect_backoff_min = Duration::from_millis(50);
    config.reconnect_backoff_max = Duration::from_millis(200);
    configure(&mut config);
    let (tx, seen) = mpsc::unbounded_channel();
    let recorder = Recorder {
        seen: tx,
        on_disconnected: hook,
        status_delay: Duration::from_millis(200),
    };
    let driver = SchedulerDriver::new(recorder, FrameworkInfo::new("fake-test"), config);
    Harness {
        listener,
        driver,
        seen,
    }
}

impl Harness {
    async fn accept(&self) -> Conn {
        let (stream, _) = timeout(STEP, self.listener.accept())
            .await
            .expect("driver connects")
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
        assert_eq!(path, "/api/scheduler");
        ws
    }

    async fn seen(&mut self) -> Seen {
        timeout(STEP, self.seen.recv())
            .await
            .expect("a callback in time")
            .expect("callback channel open")
    }

    /// Accepts a connection, checks its SUBSCRIBE and answers SUBSCRIBED.
    async fn subscribe(&self, id: &str, expect_id: Option<&str>, expect_force: bool) -> Conn {
        let mut ws = self.accept().await;
        match recv(&mut ws).await {
            Call::Subscribe {
                protocol,
                framework_info,
                force,
            } => {
                assert_eq!(protocol, PROTOCOL_VERSION);
                assert_eq!(framework_info.name, "fake-test");
                assert_eq!(framework_info.id, expect_id.map(FrameworkId::new));
                assert_eq!(force, expect_force);
            }
            other => panic!("expected SUBSCRIBE, got {other:?}"),
        }
        send(&mut ws, &subscribed(id, 15.0)).await;
        ws
    }
}

fn subscribed(id: &str, heartbeat: f64) -> Event {
    Event::Subscribed {
        framework_id: FrameworkId::new(id),
        heartbeat_interval_seconds: heartbeat,
        master_info: MasterInfo {
            id: "fake".into(),
            address: "127.0.0.1".into(),
            version: "test".into(),
        },
        reregistered: false,
    }
}

async fn recv(ws: &mut Conn) -> Call {
    loop {
        let frame = timeout(STEP, ws.next())
            .await
            .expect("a frame in time")
            .expect("connection open")
            .expect("valid frame");
        match frame {
            Message::Text(text) => return agora_scheduler::proto::decode(text.as_str()).unwrap(),
            Message::Ping(_) | Message::Pong(_) => continue,
            other => panic!("expected a text frame, got {other:?}"),
        }
    }
}

/// Waits until the driver closes the connection, returning any calls it
/// wrote first.
async fn drain_until_closed(ws: &mut Conn) -> Vec<Call> {
    let mut calls = Vec::new();
    loop {
        match timeout(STEP, ws.next()).await.expect("close in time") {
            Some(Ok(Message::Text(text))) => {
                calls.push(agora_scheduler::proto::decode(text.as_str()).unwrap())
            }
            Some(Ok(Message::Close(_))) | None | Some(Err(_)) => return calls,
            Some(Ok(_)) => {}
        }
    }
}

async fn send(ws: &mut Conn, event: &Event) {
    ws.send(Message::text(agora_scheduler::proto::encode(event)))
        .await
        .unwrap();
}

fn reliable_update(task: &str, uuid: &str) -> TaskStatus {
    let mut status = TaskStatus::new(
        TaskId::new(task),
        TaskState::Running,
        Source::SourceExecutor,
    );
    status.uuid = Some(uuid.into());
    status.agent_id = Some(AgentId::new("agent-1"));
    status
}

fn task(id: &str) -> TaskInfo {
    TaskInfo {
        container: None,
        allocation_role: None,
        launch_stamp: None,
        name: id.into(),
        task_id: TaskId::new(id),
        agent_id: AgentId::new("agent-1"),
        resources: Resources::parse("cpus:0.1;mem:32").unwrap(),
        executor: None,
        command: None,
        data: None,
        kill_grace_period: None,
        labels: Default::default(),
        task_group: None,
    }
}

async fn join(driver: &SchedulerDriver) -> DriverStatus {
    timeout(STEP, driver.join_async())
        .await
        .expect("driver ends in time")
}

#[tokio::test]
async fn subscribes_acknowledges_after_callback_and_tears_down_on_stop() {
    let mut h = harness(|_| {}, None).await;
    assert_eq!(h.driver.status(), DriverStatus::NotStarted);
    h.driver.start().unwrap();
    assert!(matches!(h.driver.start(), Err(DriverError::AlreadyStarted)));
    let mut ws = h.subscribe("fw-1", None, false).await;
    assert_eq!(h.seen().await, Seen::Registered(FrameworkId::new("fw-1")));
    assert_eq!(h.driver.framework_id(), Some(FrameworkId::new("fw-1")));

    let status = reliable_update("t1", "uuid-1");
    send(
        &mut ws,
        &Event::Update {
            status: status.clone(),
        },
    )
    .await;
    assert_eq!(h.seen().await, Seen::Status(status));
    let ack = recv(&mut ws).await;
    // The acknowledgement is written only after the callback returned.
    assert_eq!(h.seen().await, Seen::StatusReturned(TaskId::new("t1")));
    assert_eq!(
        ack,
        Call::Acknowledge {
            agent_id: AgentId::new("agent-1"),
            task_id: TaskId::new("t1"),
            uuid: "uuid-1".into(),
        }
    );

    // Updates without uuid are not acknowledged; the next frame is the KILL.
    let mut lost = TaskStatus::new(TaskId::new("t2"), TaskState::Lost, Source::SourceMaster);
    lost.agent_id = Some(AgentId::new("agent-1"));
    send(&mut ws, &Event::Update { status: lost }).await;
    assert!(matches!(h.seen().await, Seen::Status(_)));
    assert_eq!(h.seen().await, Seen::StatusReturned(TaskId::new("t2")));
    h.driver.kill_task(&TaskId::new("t2")).unwrap();
    assert_eq!(
        recv(&mut ws).await,
        Call::Kill {
            task_id: TaskId::new("t2"),
            agent_id: None
        }
    );

    send(
        &mut ws,
        &Event::Message {
            agent_id: AgentId::new("agent-1"),
            executor_id: ExecutorId::new("e1"),
            data: "hi".into(),
        },
    )
    .await;
    assert_eq!(
        h.seen().await,
        Seen::Message(
            ExecutorId::new("e1"),
            AgentId::new("agent-1"),
            b"hi".to_vec()
        )
    );
    send(
        &mut ws,
        &Event::Failure {
            agent_id: AgentId::new("agent-1"),
            executor_id: None,
            status: None,
        },
    )
    .await;
    assert_eq!(h.seen().await, Seen::AgentLost(AgentId::new("agent-1")));
    send(
        &mut ws,
        &Event::Failure {
            agent_id: AgentId::new("agent-1"),
            executor_id: Some(ExecutorId::new("e1")),
            status: Some(9),
        },
    )
    .await;
    assert_eq!(
        h.seen().await,
        Seen::ExecutorLost(ExecutorId::new("e1"), Some(9))
    );

    assert_eq!(h.driver.stop(false).unwrap(), DriverStatus::Stopped);
    assert_eq!(drain_until_closed(&mut ws).await, vec![Call::Teardown]);
    assert_eq!(join(&h.driver).await, DriverStatus::Stopped);
    assert!(matches!(
        h.driver.kill_task(&TaskId::new("t1")),
        Err(DriverError::NotRunning(DriverStatus::Stopped))
    ));
}

#[tokio::test]
async fn explicit_mode_acknowledges_only_on_request() {
    let mut h = harness(|c| c.implicit_acknowledgements = false, None).await;
    h.driver.start().unwrap();
    let mut ws = h.subscribe("fw-1", None, false).await;
    assert!(matches!(h.seen().await, Seen::Registered(_)));
    let status = reliable_update("t1", "uuid-1");
    send(
        &mut ws,
        &Event::Update {
            status: status.clone(),
        },
    )
    .await;
    assert!(matches!(h.seen().await, Seen::Status(_)));
    assert_eq!(h.seen().await, Seen::StatusReturned(TaskId::new("t1")));
    // Nothing was acknowledged implicitly: the next frame is ours.
    h.driver.revive_offers().unwrap();
    assert_eq!(recv(&mut ws).await, Call::Revive { roles: vec![] });
    h.driver.acknowledge_status_update(&status).unwrap();
    assert!(matches!(recv(&mut ws).await, Call::Acknowledge { uuid, .. } if uuid == "uuid-1"));
    h.driver.stop(true).unwrap();
    assert_eq!(
        drain_until_closed(&mut ws).await,
        vec![],
        "no TEARDOWN on failover"
    );
    assert_eq!(join(&h.driver).await, DriverStatus::Stopped);
}

#[tokio::test]
async fn reconnects_resubscribes_and_flushes_queued_calls() {
    let hook: Hook = Box::new(|driver: &SchedulerDriver| {
        driver.kill_task(&TaskId::new("t9")).unwrap();
        driver
            .launch_tasks(&[OfferId::new("o1")], vec![task("t1")], Filters::default())
            .unwrap();
        driver
            .decline_offer(&OfferId::new("o2"), Filters::default())
            .unwrap();
    });
    let mut h = harness(|_| {}, Some(hook)).await;
    h.driver.start().unwrap();
    let ws = h.subscribe("fw-1", None, false).await;
    assert!(matches!(h.seen().await, Seen::Registered(_)));
    drop(ws);
    assert_eq!(h.seen().await, Seen::Disconnected);
    match h.seen().await {
        Seen::Status(status) => {
            assert_eq!(status.task_id, TaskId::new("t1"));
            assert_eq!(status.state, TaskState::Dropped);
            assert_eq!(status.source, Source::SourceMaster);
            assert_eq!(status.reason, Some(Reason::ReasonInvalidOffers));
            assert_eq!(status.message.as_deref(), Some("driver disconnected"));
        }
        other => panic!("expected TASK_DROPPED, got {other:?}"),
    }
    assert_eq!(h.seen().await, Seen::StatusReturned(TaskId::new("t1")));

    let mut ws = h.subscribe("fw-1", Some("fw-1"), true).await;
    assert_eq!(h.seen().await, Seen::Reregistered);
    // The queued kill arrives; the launch and decline were dropped.
    assert_eq!(
        recv(&mut ws).await,
        Call::Kill {
            task_id: TaskId::new("t9"),
            agent_id: None
        }
    );
    h.driver.abort().unwrap();
    assert_eq!(drain_until_closed(&mut ws).await, vec![]);
    assert_eq!(join(&h.driver).await, DriverStatus::Aborted);
}

#[tokio::test]
async fn silent_master_counts_as_gone() {
    let mut h = harness(|_| {}, None).await;
    h.driver.start().unwrap();
    let mut ws = h.accept().await;
    assert!(matches!(recv(&mut ws).await, Call::Subscribe { .. }));
    send(&mut ws, &subscribed("fw-1", 0.2)).await;
    assert!(matches!(h.seen().await, Seen::Registered(_)));
    // No heartbeats: after ~0.6 s the driver reconnects on its own.
    assert_eq!(h.seen().await, Seen::Disconnected);
    let ws2 = h.subscribe("fw-1", Some("fw-1"), true).await;
    assert_eq!(h.seen().await, Seen::Reregistered);
    drop(ws);
    h.driver.stop(true).unwrap();
    drop(ws2);
    assert_eq!(join(&h.driver).await, DriverStatus::Stopped);
}

#[tokio::test]
async fn fatal_error_aborts_and_calls_error() {
    let mut h = harness(|_| {}, None).await;
    h.driver.start().unwrap();
    let mut ws = h.accept().await;
    assert!(matches!(recv(&mut ws).await, Call::Subscribe { .. }));
    // A non-fatal error is only logged.
    send(
        &mut ws,
        &Event::Error {
            message: "unknown offer".into(),
            fatal: false,
        },
    )
    .await;
    ws.send(Message::text("{not json")).await.unwrap();
    send(
        &mut ws,
        &Event::Error {
            message: "framework removed".into(),
            fatal: true,
        },
    )
    .await;
    assert_eq!(h.seen().await, Seen::Error("framework removed".into()));
    assert_eq!(join(&h.driver).await, DriverStatus::Aborted);
    assert_eq!(h.driver.join(), DriverStatus::Aborted);
}

#[test]
fn invalid_master_is_rejected_at_start() {
    let driver = SchedulerDriver::new(
        Recorder {
            seen: mpsc::unbounded_channel().0,
            on_disconnected: None,
            status_delay: Duration::ZERO,
        },
        FrameworkInfo::new("x"),
        DriverConfig::new("not a master"),
    );
    assert!(matches!(driver.start(), Err(DriverError::InvalidMaster(m)) if m == "not a master"));
    assert_eq!(driver.status(), DriverStatus::NotStarted);
    assert_eq!(driver.join(), DriverStatus::NotStarted);
    assert!(matches!(
        driver.stop(false),
        Err(DriverError::NotRunning(DriverStatus::NotStarted))
    ));
}

/// Stopping from inside a callback, from sync code, must not deadlock, and
/// `run` returns once the driver is stopped.
#[test]
fn stop_from_a_callback_and_run_from_sync_code() {
    struct StopOnRegistered(Arc<Mutex<Option<FrameworkId>>>);
    impl Scheduler for StopOnRegistered {
        fn registered(&mut self, driver: &SchedulerDriver, id: &FrameworkId, _: &MasterInfo) {
            *self.0.lock().unwrap() = Some(id.clone());
            assert_eq!(driver.stop(false).unwrap(), DriverStatus::Stopped);
            // join from a callback waits for the network loop only.
            assert_eq!(driver.join(), DriverStatus::Stopped);
        }
    }
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let listener = runtime.block_on(TcpListener::bind("127.0.0.1:0")).unwrap();
    let address = listener.local_addr().unwrap().to_string();
    let master = runtime.spawn(async move {
        let (stream, _) = listener.accept().await.unwrap();
        let mut ws = tokio_tungstenite::accept_async(stream).await.unwrap();
        assert!(matches!(recv(&mut ws).await, Call::Subscribe { .. }));
        send(&mut ws, &subscribed("fw-7", 15.0)).await;
        drain_until_closed(&mut ws).await
    });
    let seen = Arc::new(Mutex::new(None));
    let driver = SchedulerDriver::new(
        StopOnRegistered(seen.clone()),
        FrameworkInfo::new("sync"),
        DriverConfig::new(format!("ws://{address}")),
    );
    assert_eq!(driver.run().unwrap(), DriverStatus::Stopped);
    assert_eq!(*seen.lock().unwrap(), Some(FrameworkId::new("fw-7")));
    let calls = runtime.block_on(master).unwrap();
    assert_eq!(calls, vec![Call::Teardown]);
}
