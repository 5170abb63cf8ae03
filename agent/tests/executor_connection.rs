//! The executor connection under load: an executor that sends a burst of
//! updates while the agent's core is busy gets every one acknowledged.
//!
//! Regression test for a stall (1 run in 6 of `bench-status-updates`): the
//! connection task waited for room in the core's queue without writing
//! what the core had queued for the executor; the core saw the executor's
//! queue full, "closed" it for being slow, but the close itself could not
//! be queued, so the connection stayed open while the core ignored every
//! later update on it. The executor waited for acknowledgements forever.

mod support;

use std::collections::HashSet;
use std::time::{Duration, Instant};

use agora_proto::agent::Event as AgentEvent;
use agora_proto::executor::{Call as ExecCall, Event as ExecEvent};
use agora_proto::{TaskState, TaskStatus};
use futures::{SinkExt, StreamExt};
use support::*;
use tokio_tungstenite::tungstenite::Message;

const UPDATES: usize = 600;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_of_updates_is_acknowledged_with_tiny_queues() {
    // Queues this small make every burst fill them.
    let (_dir, agent, _conn, env) = task_on_tiny_queues(2, 4).await;
    let endpoint = env["AGORA_AGENT_ENDPOINT"].clone();

    let updates: Vec<TaskStatus> = (0..UPDATES)
        .map(|_| executor_status("task-1", TaskState::Running))
        .collect();
    let mut acked: HashSet<String> = HashSet::new();
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut connections = 0;
    // Like the executor SDK: after a lost connection, subscribe again
    // with everything not yet acknowledged.
    while acked.len() < UPDATES && Instant::now() < deadline {
        connections += 1;
        let (ws, _) = tokio_tungstenite::connect_async(endpoint.as_str())
            .await
            .unwrap();
        let (mut sink, mut stream) = ws.split();
        let pending: Vec<TaskStatus> = updates
            .iter()
            .filter(|u| !acked.contains(u.uuid.as_deref().unwrap()))
            .cloned()
            .collect();
        let resubscribing = connections > 1;
        let first = if resubscribing {
            pending.clone()
        } else {
            vec![]
        };
        sink.send(Message::text(agora_proto::encode(&subscribe(
            &env,
            first,
            vec![],
        ))))
        .await
        .unwrap();
        let sender = tokio::spawn(async move {
            if !resubscribing {
                for status in pending {
                    let call = ExecCall::Update { status };
                    if sink
                        .send(Message::text(agora_proto::encode(&call)))
                        .await
                        .is_err()
                    {
                        break;
                    }
                }
            }
            sink
        });
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let frame = match tokio::time::timeout(left, stream.next()).await {
                Ok(Some(Ok(frame))) => frame,
                Ok(_) | Err(_) => break,
            };
            let Message::Text(text) = frame else {
                if matches!(frame, Message::Close(_)) {
                    break;
                }
                continue;
            };
            if let Ok(ExecEvent::Acknowledged { uuid, .. }) = agora_proto::decode(text.as_str()) {
                acked.insert(uuid);
                if acked.len() == UPDATES {
                    break;
                }
            }
        }
        let _ = sender.await;
    }
    assert_eq!(
        acked.len(),
        UPDATES,
        "updates acknowledged within 30 s over {connections} connection(s)"
    );
    assert_eq!(connections, 1, "the executor was never disconnected");
    agent.stop().await;
}

/// An executor that subscribes again with more unacknowledged updates
/// than the agent queues for a connection gets them all acknowledged on
/// that connection: answers to its own calls are never refused (before,
/// the acknowledgements overflowed the queue, the agent closed the
/// connection as slow, and the executor re-subscribed with the same list
/// forever).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_subscription_carrying_many_updates_is_acknowledged() {
    let (_dir, agent, _conn, env) = task_on_tiny_queues(agora_agent::DEFAULT_CORE_QUEUE, 4).await;
    let endpoint = env["AGORA_AGENT_ENDPOINT"].clone();
    let updates: Vec<TaskStatus> = (0..UPDATES)
        .map(|_| executor_status("task-1", TaskState::Running))
        .collect();
    let mut exec = ExecClient::connect(&endpoint).await;
    exec.send(&subscribe(&env, updates, vec![])).await;
    let mut acked = HashSet::new();
    while acked.len() < UPDATES {
        match exec.next_raw().await {
            Some(Message::Text(text)) => {
                if let Ok(ExecEvent::Acknowledged { uuid, .. }) = agora_proto::decode(text.as_str())
                {
                    acked.insert(uuid);
                }
            }
            Some(Message::Close(frame)) => panic!("closed after {} acks: {frame:?}", acked.len()),
            Some(_) => {}
            None => panic!("connection ended after {} acks", acked.len()),
        }
    }
    agent.stop().await;
}

/// An agent with these queue bounds, registered with a fake master (whose
/// connection is returned, to keep it open), that was given command task
/// `task-1` of checkpointing framework `fw-1`; the environment of the
/// command executor it started for it.
async fn task_on_tiny_queues(
    core_queue: usize,
    executor_outbox: usize,
) -> (
    tempfile::TempDir,
    Agent,
    MasterConn,
    std::collections::HashMap<String, String>,
) {
    let dir = tempfile::tempdir().unwrap();
    let script = sleeper_script(dir.path());
    let work = dir.path().join("work");
    let master = FakeMaster::bind().await;
    let mut config = config(&master.addr(), &work, &script);
    config.core_queue = core_queue;
    config.executor_outbox = executor_outbox;
    let agent = Agent::start(config).await;
    let mut conn = master.accept().await;
    conn.register("agent-1").await;
    conn.send(&AgentEvent::RunTask {
        framework: framework("fw-1", true),
        task: command_task("task-1"),
    })
    .await;
    let (_sandbox, env) = command_executor_env(&work, "fw-1").await;
    (dir, agent, conn, env)
}

/// An executor that stops reading is disconnected once it has left
/// `--executor-outbox` events unread for `--executor-stall-timeout` (a busy
/// one that is only behind catches up and keeps its connection).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_executor_that_does_not_read_is_disconnected() {
    let dir = tempfile::tempdir().unwrap();
    let script = sleeper_script(dir.path());
    let work = dir.path().join("work");
    let master = FakeMaster::bind().await;
    let mut config = config(&master.addr(), &work, &script);
    config.executor_outbox = 4;
    config.executor_stall_timeout = Duration::from_millis(300);
    let agent = Agent::start(config).await;
    let mut conn = master.accept().await;
    conn.register("agent-1").await;
    conn.send(&AgentEvent::RunTask {
        framework: framework("fw-1", false),
        task: command_task("task-1"),
    })
    .await;
    let (_sandbox, env) = command_executor_env(&work, "fw-1").await;
    let host = env["AGORA_EXECUTOR_ID"].clone();
    let mut exec = ExecClient::connect(&env["AGORA_AGENT_ENDPOINT"]).await;
    exec.send(&subscribe(&env, vec![], vec![])).await;
    assert!(matches!(exec.recv().await, ExecEvent::Subscribed { .. }));
    // From now on the executor reads nothing. Framework messages of 1 MiB
    // fill the socket's buffers, then the queue.
    let data = vec![b'x'; 1 << 20];
    let connected = |state: &serde_json::Value| {
        state["frameworks"][0]["command_executors"][0]["connected"].as_bool()
    };
    let started = Instant::now();
    let mut disconnected = false;
    for _ in 0..200 {
        conn.send(&AgentEvent::Message {
            framework_id: agora_proto::FrameworkId::new("fw-1"),
            executor_id: agora_proto::ExecutorId::new(&host),
            data: data.clone().into(),
        })
        .await;
        let (_, body) = agent.get("/state").await;
        let state: serde_json::Value = serde_json::from_str(&body).unwrap();
        if connected(&state) == Some(false) {
            disconnected = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(
        disconnected,
        "the executor that reads nothing kept its connection"
    );
    assert!(
        started.elapsed() >= Duration::from_millis(300),
        "disconnected before the stall timeout"
    );
    drop(exec);
    agent.stop().await;
}
