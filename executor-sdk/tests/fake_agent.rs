//! The executor driver against a fake agent, checking the exact frames it
//! writes.

mod common;

use std::path::PathBuf;
use std::time::Duration;

use agora_executor::proto::executor::{Call, Event};
use agora_executor::{
    AgentId, DriverStatus, Executor, ExecutorConfig, ExecutorDriver, ExecutorError, ExecutorId,
    ExecutorInfo, FrameworkId, FrameworkInfo, Source, TaskId, TaskInfo, TaskState, TaskStatus,
};
use common::*;
use tokio::sync::mpsc;
use tokio::time::timeout;

#[derive(Debug, PartialEq)]
enum Seen {
    Registered(AgentId),
    Reregistered,
    Disconnected,
    Launch(TaskId),
    Kill(TaskId),
    Message(Vec<u8>),
    Shutdown,
    Error(String),
}

struct Recorder(mpsc::UnboundedSender<Seen>);

impl Executor for Recorder {
    fn registered(&mut self, _: &ExecutorDriver, _: &ExecutorInfo, _: &FrameworkInfo, a: &AgentId) {
        let _ = self.0.send(Seen::Registered(a.clone()));
    }
    fn reregistered(&mut self, _: &ExecutorDriver, _: &AgentId) {
        let _ = self.0.send(Seen::Reregistered);
    }
    fn disconnected(&mut self, _: &ExecutorDriver) {
        let _ = self.0.send(Seen::Disconnected);
    }
    fn launch_task(&mut self, _: &ExecutorDriver, task: TaskInfo) {
        let _ = self.0.send(Seen::Launch(task.task_id));
    }
    fn kill_task(&mut self, _: &ExecutorDriver, task_id: &TaskId) {
        let _ = self.0.send(Seen::Kill(task_id.clone()));
    }
    fn framework_message(&mut self, _: &ExecutorDriver, data: &[u8]) {
        let _ = self.0.send(Seen::Message(data.to_vec()));
    }
    fn shutdown(&mut self, driver: &ExecutorDriver) {
        let status = TaskStatus::new(TaskId::new("t1"), TaskState::Killed, Source::SourceExecutor);
        driver.send_status_update(status).unwrap();
        let _ = self.0.send(Seen::Shutdown);
    }
    fn error(&mut self, driver: &ExecutorDriver, message: &str) {
        assert_eq!(driver.status(), DriverStatus::Aborted);
        let _ = self.0.send(Seen::Error(message.into()));
    }
}

fn config(endpoint: String, checkpoint: bool) -> ExecutorConfig {
    ExecutorConfig {
        agent_endpoint: endpoint,
        tls: Default::default(),
        framework_id: FrameworkId::new("fw-1"),
        executor_id: ExecutorId::new("ex-1"),
        agent_id: None,
        sandbox: PathBuf::from("."),
        token: "secret".into(),
        checkpoint,
        recovery_timeout: Duration::from_secs(30),
        shutdown_grace_period: Duration::from_secs(5),
    }
}

async fn seen(rx: &mut mpsc::UnboundedReceiver<Seen>) -> Seen {
    timeout(STEP, rx.recv())
        .await
        .expect("a callback in time")
        .unwrap()
}

/// The SUBSCRIBE's unacknowledged updates (as uuids) and tasks.
async fn recv_subscribe(ws: &mut Conn) -> (Vec<(TaskState, String)>, Vec<TaskId>) {
    match recv(ws).await {
        Call::Subscribe {
            token,
            framework_id,
            executor_id,
            unacknowledged_updates,
            unacknowledged_tasks,
            ..
        } => {
            assert_eq!(token, "secret");
            assert_eq!(framework_id, FrameworkId::new("fw-1"));
            assert_eq!(executor_id, ExecutorId::new("ex-1"));
            (
                unacknowledged_updates
                    .into_iter()
                    .map(|s| (s.state, s.uuid.unwrap()))
                    .collect(),
                unacknowledged_tasks
                    .into_iter()
                    .map(|t| t.task_id)
                    .collect(),
            )
        }
        other => panic!("expected SUBSCRIBE, got {other:?}"),
    }
}

fn update(task: &str, state: TaskState) -> TaskStatus {
    TaskStatus::new(TaskId::new(task), state, Source::SourceExecutor)
}

#[tokio::test]
async fn resends_unacknowledged_updates_in_order_after_reconnect() {
    let agent = FakeAgent::bind().await;
    let (tx, mut rx) = mpsc::unbounded_channel();
    let driver = ExecutorDriver::new(Recorder(tx), config(agent.endpoint(), true));
    driver.start().unwrap();
    assert!(matches!(driver.start(), Err(ExecutorError::AlreadyStarted)));

    let mut ws = agent.accept().await;
    assert_eq!(recv_subscribe(&mut ws).await, (vec![], vec![]));
    send(&mut ws, &subscribed("ex-1")).await;
    assert_eq!(
        seen(&mut rx).await,
        Seen::Registered(AgentId::new("agent-1"))
    );
    assert_eq!(driver.agent_id(), Some(AgentId::new("agent-1")));
    for id in ["t1", "t2"] {
        send(
            &mut ws,
            &Event::Launch {
                task: command_task(id, None),
                sandbox: None,
                cgroups: Vec::new(),
                container: None,
            },
        )
        .await;
        assert_eq!(seen(&mut rx).await, Seen::Launch(TaskId::new(id)));
    }

    // An update no frame could carry is refused to the caller, never
    // queued: the first frame written is the next update.
    let mut huge = update("t1", TaskState::Running);
    huge.data = Some(agora_executor::proto::Bytes(vec![
        0;
        agora_executor::MAX_STATUS_UPDATE_BYTES
    ]));
    let error = driver.send_status_update(huge).expect_err("too large");
    assert!(error.to_string().contains("TaskStatus.data"), "{error}");
    let ExecutorError::UpdateTooLarge { task_id, size, max } = error else {
        panic!("expected UpdateTooLarge, got {error:?}");
    };
    assert_eq!(task_id, TaskId::new("t1"));
    assert_eq!(max, agora_executor::MAX_STATUS_UPDATE_BYTES);
    assert!(size > max);
    driver
        .send_status_update(update("t1", TaskState::Running))
        .unwrap();
    driver
        .send_status_update(update("t2", TaskState::Running))
        .unwrap();
    driver
        .send_status_update(update("t1", TaskState::Finished))
        .unwrap();
    let first = recv_update(&mut ws).await;
    assert_eq!(first.data, None);
    assert_eq!(first.source, Source::SourceExecutor);
    assert_eq!(first.executor_id, Some(ExecutorId::new("ex-1")));
    assert_eq!(first.agent_id, Some(AgentId::new("agent-1")));
    let second = recv_update(&mut ws).await;
    let third = recv_update(&mut ws).await;
    assert_eq!(third.state, TaskState::Finished);
    ack(&mut ws, &second).await;
    send(
        &mut ws,
        &Event::Message {
            data: "ping".into(),
        },
    )
    .await;
    assert_eq!(seen(&mut rx).await, Seen::Message(b"ping".to_vec()));

    // The agent restarts.
    drop(ws);
    assert_eq!(seen(&mut rx).await, Seen::Disconnected);
    let mut ws = agent.accept().await;
    let (updates, tasks) = recv_subscribe(&mut ws).await;
    assert_eq!(
        updates,
        vec![
            (TaskState::Running, first.uuid.clone().unwrap()),
            (TaskState::Finished, third.uuid.clone().unwrap()),
        ]
    );
    assert_eq!(
        tasks,
        vec![TaskId::new("t1")],
        "t2 has an acknowledged update"
    );
    send(&mut ws, &subscribed("ex-1")).await;
    assert_eq!(seen(&mut rx).await, Seen::Reregistered);

    // stop() waits for the acknowledgements before closing.
    assert_eq!(driver.stop().unwrap(), DriverStatus::Stopped);
    tokio::time::sleep(Duration::from_millis(200)).await;
    ack(&mut ws, &first).await;
    ack(&mut ws, &third).await;
    assert_eq!(drain_until_closed(&mut ws).await, vec![]);
    assert_eq!(
        timeout(STEP, driver.join_async()).await.unwrap(),
        DriverStatus::Stopped
    );
    assert!(matches!(
        driver.send_status_update(update("t1", TaskState::Running)),
        Err(ExecutorError::NotRunning(DriverStatus::Stopped))
    ));
}

#[tokio::test]
async fn without_checkpoint_a_lost_agent_aborts() {
    let agent = FakeAgent::bind().await;
    let (tx, mut rx) = mpsc::unbounded_channel();
    let driver = ExecutorDriver::new(Recorder(tx), config(agent.endpoint(), false));
    driver.start().unwrap();
    let mut ws = agent.accept().await;
    recv_subscribe(&mut ws).await;
    send(&mut ws, &subscribed("ex-1")).await;
    assert!(matches!(seen(&mut rx).await, Seen::Registered(_)));
    drop(ws);
    assert_eq!(seen(&mut rx).await, Seen::Disconnected);
    assert!(matches!(seen(&mut rx).await, Seen::Error(m) if m.contains("checkpoint")));
    assert_eq!(
        timeout(STEP, driver.join_async()).await.unwrap(),
        DriverStatus::Aborted
    );
}

#[tokio::test]
async fn shutdown_runs_the_callback_then_flushes_and_stops() {
    let agent = FakeAgent::bind().await;
    let (tx, mut rx) = mpsc::unbounded_channel();
    let driver = ExecutorDriver::new(Recorder(tx), config(agent.endpoint(), true));
    driver.start().unwrap();
    let mut ws = agent.accept().await;
    recv_subscribe(&mut ws).await;
    send(&mut ws, &subscribed("ex-1")).await;
    assert!(matches!(seen(&mut rx).await, Seen::Registered(_)));
    send(
        &mut ws,
        &Event::Kill {
            task_id: TaskId::new("t1"),
            grace_period_seconds: None,
        },
    )
    .await;
    assert_eq!(seen(&mut rx).await, Seen::Kill(TaskId::new("t1")));
    send(
        &mut ws,
        &Event::Shutdown {
            grace_period_seconds: 3.0,
        },
    )
    .await;
    assert_eq!(seen(&mut rx).await, Seen::Shutdown);
    let killed = recv_update(&mut ws).await;
    assert_eq!(killed.state, TaskState::Killed);
    ack(&mut ws, &killed).await;
    assert_eq!(drain_until_closed(&mut ws).await, vec![]);
    assert_eq!(
        timeout(STEP, driver.join_async()).await.unwrap(),
        DriverStatus::Stopped
    );
}

/// The executor's last task finishes and it stops while its agent is
/// restarting: the driver waits for the agent past the grace period,
/// re-subscribes with the terminal update, and ends only once the agent
/// has acknowledged it (before, it ended at once and the agent reported
/// the task TASK_FAILED).
#[tokio::test]
async fn stop_while_the_agent_restarts_delivers_the_terminal_update() {
    let agent = FakeAgent::bind().await;
    let addr = agent.listener.local_addr().unwrap();
    let mut config = config(agent.endpoint(), true);
    config.shutdown_grace_period = Duration::from_millis(200);
    let (tx, mut rx) = mpsc::unbounded_channel();
    let driver = ExecutorDriver::new(Recorder(tx), config);
    driver.start().unwrap();
    let mut ws = agent.accept().await;
    recv_subscribe(&mut ws).await;
    send(&mut ws, &subscribed("ex-1")).await;
    assert!(matches!(seen(&mut rx).await, Seen::Registered(_)));

    // The agent goes down: its connection ends, new ones are refused.
    drop(ws);
    drop(agent);
    assert_eq!(seen(&mut rx).await, Seen::Disconnected);
    driver
        .send_status_update(update("t1", TaskState::Finished))
        .unwrap();
    assert_eq!(driver.stop().unwrap(), DriverStatus::Stopped);
    // Down for five grace periods: the driver is still waiting.
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(
        timeout(Duration::from_millis(10), driver.join_async())
            .await
            .is_err(),
        "the driver ended while its agent was down"
    );

    // The agent is back on its port.
    let agent = FakeAgent {
        listener: tokio::net::TcpListener::bind(addr).await.unwrap(),
    };
    let mut ws = agent.accept().await;
    let (updates, _) = recv_subscribe(&mut ws).await;
    let [(TaskState::Finished, uuid)] = &updates[..] else {
        panic!("expected the TASK_FINISHED in the SUBSCRIBE, got {updates:?}");
    };
    send(&mut ws, &subscribed("ex-1")).await;
    send(
        &mut ws,
        &Event::Acknowledged {
            task_id: TaskId::new("t1"),
            uuid: uuid.clone(),
        },
    )
    .await;
    assert_eq!(drain_until_closed(&mut ws).await, vec![]);
    assert_eq!(
        timeout(STEP, driver.join_async()).await.unwrap(),
        DriverStatus::Stopped
    );
}

#[tokio::test]
async fn fatal_error_aborts() {
    let agent = FakeAgent::bind().await;
    let (tx, mut rx) = mpsc::unbounded_channel();
    let driver = ExecutorDriver::new(Recorder(tx), config(agent.endpoint(), true));
    driver.start().unwrap();
    let mut ws = agent.accept().await;
    recv_subscribe(&mut ws).await;
    send(
        &mut ws,
        &Event::Error {
            message: "wrong token".into(),
            fatal: true,
        },
    )
    .await;
    assert_eq!(seen(&mut rx).await, Seen::Error("wrong token".into()));
    assert_eq!(
        timeout(STEP, driver.join_async()).await.unwrap(),
        DriverStatus::Aborted
    );
}

#[test]
fn invalid_endpoint_is_rejected() {
    let (tx, _rx) = mpsc::unbounded_channel();
    let driver = ExecutorDriver::new(Recorder(tx), config("http://nope".into(), false));
    assert!(matches!(
        driver.start(),
        Err(ExecutorError::InvalidEndpoint(_))
    ));
    assert_eq!(driver.join(), DriverStatus::NotStarted);
}
