//! The Mesos v1 executor API at `/api/v1/executor`, spoken as a Mesos
//! executor speaks it: a custom executor launched with the Mesos
//! environment subscribes (JSON or protobuf RecordIO stream), gets its
//! task, sends updates (acknowledged once checkpointed, delivered to the
//! master) and messages both ways; refusals carry Mesos's status codes;
//! an acknowledged update survives an agent restart.

mod support;

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use agora_client::{Http, Method};
use agora_mesos_proto::{recordio, v1, Codec};
use agora_proto::agent::{Call as AgentCall, Event as AgentEvent};
use agora_proto::{
    CommandInfo, ExecutorApi, ExecutorId, ExecutorInfo, FrameworkId, Resources, TaskId, TaskInfo,
    TaskState,
};
use base64::Engine as _;
use serde_json::json;
use support::*;

const JSON: &str = "application/json";
const PROTOBUF: &str = "application/x-protobuf";

/// A task of custom executor `eid` launched as a Mesos framework's: the
/// master's Mesos front door marks it with [`ExecutorApi::MesosV1`].
fn mesos_task(id: &str, eid: &str, script: &Path, mesos: bool) -> TaskInfo {
    let command = CommandInfo::shell(script.display().to_string());
    let mut task = command_task(id);
    task.command = None;
    task.executor = Some(ExecutorInfo {
        container: None,
        executor_id: ExecutorId::new(eid),
        framework_id: None,
        command,
        resources: Resources::parse("cpus:0.1;mem:32").unwrap(),
        name: "mesos executor".into(),
        source: String::new(),
        api: if mesos {
            ExecutorApi::MesosV1
        } else {
            ExecutorApi::Agora
        },
        shutdown_grace_period: None,
        data: None,
        labels: Default::default(),
    });
    task
}

/// An executor's subscription stream.
struct Stream {
    body: agora_client::Streaming,
    reader: recordio::Reader,
    /// Records read and not yet taken.
    pending: std::collections::VecDeque<Vec<u8>>,
    codec: Codec,
}

impl Stream {
    /// The next event, as JSON (protobuf events are decoded, then written
    /// as Mesos's JSON).
    ///
    /// Every stream is read checking that the agent writes one RecordIO
    /// record per HTTP chunk, as libprocess does: hyper hands over a
    /// chunk's data whole or in pieces, never two chunks' together, so a
    /// piece that completes two records would be a chunk holding two.
    async fn next(&mut self) -> serde_json::Value {
        loop {
            if let Some(record) = self.pending.pop_front() {
                let event: v1::executor::Event = self.codec.decode(&record).unwrap();
                let json = agora_mesos_proto::codec::to_json(&event).unwrap();
                return serde_json::from_slice(&json).unwrap();
            }
            let chunk = tokio::time::timeout(WAIT, self.body.chunk())
                .await
                .expect("no event from the agent")
                .unwrap()
                .expect("the agent ended the stream");
            self.reader.feed(&chunk);
            while let Some(record) = self.reader.next_record().unwrap() {
                self.pending.push_back(record);
            }
            assert!(
                self.pending.len() <= 1,
                "one HTTP chunk held {} records",
                self.pending.len()
            );
        }
    }

    /// Whether the agent ends the stream (within a while).
    async fn ends(&mut self) -> bool {
        matches!(
            tokio::time::timeout(WAIT, self.body.chunk()).await,
            Ok(Ok(None) | Err(_))
        )
    }
}

fn call_body(
    env: &HashMap<String, String>,
    kind: &str,
    inner: serde_json::Value,
) -> serde_json::Value {
    let mut call = json!({
        "type": kind,
        "framework_id": {"value": env["MESOS_FRAMEWORK_ID"]},
        "executor_id": {"value": env["MESOS_EXECUTOR_ID"]},
    });
    if !inner.is_null() {
        call[kind.to_ascii_lowercase()] = inner;
    }
    call
}

async fn post(endpoint: &str, headers: &[(&str, &str)], body: Vec<u8>) -> agora_client::Response {
    Http::new()
        .request(
            Method::POST,
            endpoint,
            "/api/v1/executor",
            headers,
            Some(body),
        )
        .await
        .unwrap()
}

async fn post_json(endpoint: &str, call: &serde_json::Value) -> agora_client::Response {
    post(
        endpoint,
        &[("content-type", JSON)],
        call.to_string().into_bytes(),
    )
    .await
}

async fn subscribe_v1(
    env: &HashMap<String, String>,
    codec: Codec,
    unacknowledged: serde_json::Value,
) -> Stream {
    subscribe_v1_with(env, codec, unacknowledged, &[]).await
}

async fn subscribe_v1_with(
    env: &HashMap<String, String>,
    codec: Codec,
    unacknowledged: serde_json::Value,
    headers: &[(&str, &str)],
) -> Stream {
    let call = call_body(env, "SUBSCRIBE", unacknowledged);
    let body = match codec {
        Codec::Json => call.to_string().into_bytes(),
        Codec::Protobuf => {
            let call: v1::executor::Call = Codec::Json.decode(call.to_string().as_bytes()).unwrap();
            Codec::Protobuf.encode(&call).unwrap()
        }
    };
    let media = codec.media_type();
    let mut all = vec![("content-type", media), ("accept", media)];
    all.extend_from_slice(headers);
    let body = Http::new()
        .stream(
            Method::POST,
            &env["MESOS_AGENT_ENDPOINT"],
            "/api/v1/executor",
            &all,
            Some(body),
        )
        .await
        .unwrap();
    assert_eq!(body.status, 200);
    assert_eq!(body.headers["content-type"], media);
    assert!(body.headers.get("content-length").is_none());
    assert_eq!(body.headers["transfer-encoding"], "chunked");
    Stream {
        body,
        reader: recordio::Reader::new(),
        pending: Default::default(),
        codec,
    }
}

/// The status of a POST with no `Content-Type` (the HTTP client always
/// sends one).
async fn status_without_content_type(addr: std::net::SocketAddr, body: &str) -> u16 {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    let request = format!(
        "POST /api/v1/executor HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut response = String::new();
    tokio::time::timeout(WAIT, stream.read_to_string(&mut response))
        .await
        .unwrap()
        .unwrap();
    response[9..12].parse().unwrap()
}

fn b64(bytes: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

fn update(task: &str, state: &str, uuid: &uuid::Uuid) -> serde_json::Value {
    json!({"status": {
        "task_id": {"value": task},
        "state": state,
        "source": "SOURCE_EXECUTOR",
        "uuid": b64(uuid.as_bytes()),
    }})
}

/// A registered agent (fake master) running Mesos executor `e1` for task
/// `t1` of framework `fw` (checkpointing or not): the executor's
/// environment.
async fn mesos_executor(
    checkpoint: bool,
) -> (
    tempfile::TempDir,
    Agent,
    FakeMaster,
    MasterConn,
    HashMap<String, String>,
) {
    let started = Started::with_mesos_task(checkpoint).await;
    let (_sandbox, env) = executor_env(&started.work, "fw", "e1").await;
    (
        started.dir,
        started.agent,
        started.master,
        started.conn,
        env,
    )
}

/// A registered agent (fake master) that was sent Mesos executor `e1` for
/// task `t1` of framework `fw`.
struct Started {
    dir: tempfile::TempDir,
    script: PathBuf,
    work: PathBuf,
    agent: Agent,
    master: FakeMaster,
    conn: MasterConn,
}

impl Started {
    async fn with_mesos_task(checkpoint: bool) -> Started {
        Started::with_mesos_task_and(checkpoint, |_| {}).await
    }

    async fn with_mesos_task_and(
        checkpoint: bool,
        adjust: impl FnOnce(&mut agora_agent::Config),
    ) -> Started {
        let dir = tempfile::tempdir().unwrap();
        let script = sleeper_script(dir.path());
        let work = dir.path().join("work");
        let master = FakeMaster::bind().await;
        let mut config = config(&master.addr(), &work, &script);
        adjust(&mut config);
        let agent = Agent::start(config).await;
        let mut conn = master.accept().await;
        conn.register("agent-1").await;
        conn.send(&AgentEvent::RunTask {
            framework: framework("fw", checkpoint),
            task: mesos_task("t1", "e1", &script, true),
        })
        .await;
        Started {
            dir,
            script,
            work,
            agent,
            master,
            conn,
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mesos_executor_gets_the_mesos_environment() {
    let (_dir, agent, _master, _conn, env) = mesos_executor(true).await;
    assert_eq!(env["MESOS_AGENT_ENDPOINT"], agent.addr.to_string());
    assert_eq!(env["MESOS_FRAMEWORK_ID"], "fw");
    assert_eq!(env["MESOS_EXECUTOR_ID"], "e1");
    assert_eq!(env["MESOS_AGENT_ID"], "agent-1");
    assert_eq!(env["MESOS_SLAVE_ID"], "agent-1");
    assert_eq!(env["MESOS_SANDBOX"], env["MESOS_DIRECTORY"]);
    assert!(Path::new(&env["MESOS_SANDBOX"]).is_absolute());
    assert_eq!(env["MESOS_CHECKPOINT"], "1");
    assert_eq!(env["MESOS_EXECUTOR_SHUTDOWN_GRACE_PERIOD"], "500ms");
    assert_eq!(env["MESOS_RECOVERY_TIMEOUT"], "900secs");
    assert_eq!(env["MESOS_SUBSCRIPTION_BACKOFF_MAX"], "15secs");
    assert_eq!(env["MESOS_HTTP_COMMAND_EXECUTOR"], "0");
    assert!(!env.contains_key("AGORA_EXECUTOR_API"));
    assert!(!env.contains_key("AGORA_FETCH_URIS"));
    agent.stop().await;

    // Without checkpointing, no recovery settings (as Mesos).
    let (_dir, agent, _master, _conn, env) = mesos_executor(false).await;
    assert_eq!(env["MESOS_CHECKPOINT"], "0");
    assert!(!env.contains_key("MESOS_RECOVERY_TIMEOUT"));
    assert!(!env.contains_key("MESOS_SUBSCRIPTION_BACKOFF_MAX"));
    agent.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mesos_executor_runs_its_task_with_acknowledged_updates_and_messages() {
    let (_dir, agent, _master, mut conn, env) = mesos_executor(true).await;
    let endpoint = env["MESOS_AGENT_ENDPOINT"].clone();
    let mut stream = subscribe_v1(&env, Codec::Json, json!({})).await;
    let subscribed = stream.next().await;
    assert_eq!(subscribed["type"], "SUBSCRIBED", "{subscribed}");
    let s = &subscribed["subscribed"];
    // pymesos compares these as whole dicts.
    assert_eq!(s["executor_info"]["executor_id"], json!({"value": "e1"}));
    assert_eq!(s["framework_info"]["id"], json!({"value": "fw"}));
    assert_eq!(s["agent_info"]["id"], json!({"value": "agent-1"}));
    assert_eq!(s["agent_info"]["hostname"], "test-host");
    assert_eq!(s["agent_info"]["port"], agent.addr.port());
    let launch = stream.next().await;
    assert_eq!(launch["type"], "LAUNCH", "{launch}");
    assert_eq!(launch["launch"]["task"]["task_id"]["value"], "t1");
    assert_eq!(
        launch["launch"]["task"]["executor"]["executor_id"]["value"],
        "e1"
    );

    // UPDATE: 202, then ACKNOWLEDGED with the uuid once checkpointed, and
    // the update reaches the master.
    // Its health and Mesos's reason for it reach the master unchanged.
    let running = uuid::Uuid::new_v4();
    let mut healthy = update("t1", "TASK_RUNNING", &running);
    healthy["status"]["healthy"] = true.into();
    healthy["status"]["reason"] = "REASON_TASK_HEALTH_CHECK_STATUS_UPDATED".into();
    let answer = post_json(&endpoint, &call_body(&env, "UPDATE", healthy)).await;
    assert_eq!(answer.status, 202, "{}", answer.text());
    assert!(answer.body.is_empty());
    let ack = stream.next().await;
    assert_eq!(ack["type"], "ACKNOWLEDGED", "{ack}");
    assert_eq!(ack["acknowledged"]["task_id"]["value"], "t1");
    assert_eq!(ack["acknowledged"]["uuid"], b64(running.as_bytes()));
    let (fid, status) = conn.recv_update(true).await;
    assert_eq!(fid.as_str(), "fw");
    assert_eq!(status.state, TaskState::Running);
    assert_eq!(status.uuid, Some(running.to_string()));
    assert_eq!(status.healthy, Some(true));
    assert_eq!(
        status.reason,
        Some(agora_proto::Reason::ReasonTaskHealthCheckStatusUpdated)
    );
    assert_eq!(status.executor_id, Some(ExecutorId::new("e1")));
    assert_eq!(
        status.agent_id.as_ref().map(|a| a.as_str()),
        Some("agent-1")
    );

    // MESSAGE both ways.
    let answer = post_json(
        &endpoint,
        &call_body(&env, "MESSAGE", json!({"data": b64(b"to the scheduler")})),
    )
    .await;
    assert_eq!(answer.status, 202);
    match conn.recv().await {
        AgentCall::Message {
            framework_id,
            executor_id,
            data,
        } => {
            assert_eq!((framework_id.as_str(), executor_id.as_str()), ("fw", "e1"));
            assert_eq!(data.0, b"to the scheduler");
        }
        other => panic!("{other:?}"),
    }
    conn.send(&AgentEvent::Message {
        framework_id: FrameworkId::new("fw"),
        executor_id: ExecutorId::new("e1"),
        data: "to the executor".into(),
    })
    .await;
    let message = stream.next().await;
    assert_eq!(message["type"], "MESSAGE", "{message}");
    assert_eq!(message["message"]["data"], b64(b"to the executor"));

    // KILL, with the task's kill policy.
    conn.send(&AgentEvent::KillTask {
        framework_id: FrameworkId::new("fw"),
        task_id: TaskId::new("t1"),
    })
    .await;
    let kill = stream.next().await;
    assert_eq!(kill["type"], "KILL", "{kill}");
    assert_eq!(kill["kill"]["task_id"]["value"], "t1");
    let killed = uuid::Uuid::new_v4();
    let answer = post_json(
        &endpoint,
        &call_body(&env, "UPDATE", update("t1", "TASK_KILLED", &killed)),
    )
    .await;
    assert_eq!(answer.status, 202);
    assert_eq!(stream.next().await["type"], "ACKNOWLEDGED");
    let (_, status) = conn.recv_update(true).await;
    assert_eq!(status.state, TaskState::Killed);
    // The framework goes away: the executor is shut down.
    conn.send(&AgentEvent::ShutdownFramework {
        framework_id: FrameworkId::new("fw"),
    })
    .await;
    let shutdown = stream.next().await;
    assert_eq!(shutdown, json!({"type": "SHUTDOWN"}));
    agent.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_protobuf_subscription_streams_protobuf_events() {
    let (_dir, agent, _master, _conn, env) = mesos_executor(false).await;
    let mut stream = subscribe_v1(&env, Codec::Protobuf, json!({})).await;
    assert_eq!(stream.next().await["type"], "SUBSCRIBED");
    assert_eq!(stream.next().await["type"], "LAUNCH");
    // A second subscription replaces the first, whose stream ends.
    let mut again = subscribe_v1(&env, Codec::Json, json!({})).await;
    assert_eq!(again.next().await["type"], "SUBSCRIBED");
    assert!(stream.ends().await, "the replaced stream goes on");
    let connected = |s: &serde_json::Value| s["frameworks"][0]["executors"][0]["connected"].clone();
    let state = agent.state_when(|s| connected(s) == true).await;
    assert_eq!(connected(&state), true);
    // The executor goes away: the agent sees it disconnected.
    drop(again);
    agent.state_when(|s| connected(s) == false).await;
    agent.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_are_refused_with_mesos_status_codes() {
    let Started {
        dir: _dir,
        script,
        work,
        agent,
        master: _master,
        mut conn,
    } = Started::with_mesos_task(false).await;
    // And a native custom executor, which has a token to present.
    conn.send(&AgentEvent::RunTask {
        framework: framework("fw", false),
        task: mesos_task("t2", "native", &script, false),
    })
    .await;
    let (_, env) = executor_env(&work, "fw", "e1").await;
    let (_, native_env) = executor_env(&work, "fw", "native").await;
    let endpoint = agent.addr.to_string();
    let code = |r: agora_client::Response| r.status;
    let running = update("t1", "TASK_RUNNING", &uuid::Uuid::new_v4());

    let get = Http::new()
        .get(&endpoint, "/api/v1/executor")
        .await
        .unwrap();
    assert_eq!(get.status, 405);
    let subscribe = call_body(&env, "SUBSCRIBE", json!({})).to_string();
    assert_eq!(
        status_without_content_type(agent.addr, &subscribe).await,
        400,
        "no Content-Type"
    );
    assert_eq!(
        code(
            post(
                &endpoint,
                &[("content-type", "text/plain")],
                subscribe.clone().into_bytes()
            )
            .await
        ),
        415
    );
    assert_eq!(
        code(post(&endpoint, &[("content-type", JSON)], b"{not json".to_vec()).await),
        400
    );
    assert_eq!(
        code(
            post(
                &endpoint,
                &[("content-type", PROTOBUF)],
                b"\xff\xff\xff".to_vec()
            )
            .await
        ),
        400
    );
    assert_eq!(
        code(
            post(
                &endpoint,
                &[("content-type", JSON), ("accept", "text/html")],
                subscribe.clone().into_bytes()
            )
            .await
        ),
        406
    );
    // Required fields: the executor id.
    let anonymous = json!({"type": "SUBSCRIBE", "framework_id": {"value": "fw"}, "subscribe": {}});
    assert_eq!(code(post_json(&endpoint, &anonymous).await), 400);
    let huge = vec![b' '; agora_proto::MAX_FRAME_BYTES + 1];
    assert_eq!(
        code(post(&endpoint, &[("content-type", JSON)], huge).await),
        413
    );
    // An UPDATE without a uuid, or not from the executor.
    let mut no_uuid = running.clone();
    no_uuid["status"].as_object_mut().unwrap().remove("uuid");
    let answer = post_json(&endpoint, &call_body(&env, "UPDATE", no_uuid)).await;
    assert_eq!(answer.status, 400);
    assert!(answer.text().contains("uuid"), "{}", answer.text());
    let mut from_agent = running.clone();
    from_agent["status"]["source"] = "SOURCE_AGENT".into();
    assert_eq!(
        code(post_json(&endpoint, &call_body(&env, "UPDATE", from_agent)).await),
        400
    );
    // What Agora does not carry out is refused by name, and so is a key
    // TaskStatus does not have.
    let mut checked = running.clone();
    checked["status"]["check_status"] = json!({"type": "COMMAND", "command": {"exit_code": 1}});
    let answer = post_json(&endpoint, &call_body(&env, "UPDATE", checked)).await;
    assert_eq!(answer.status, 400);
    assert!(
        answer
            .text()
            .contains("TaskStatus.check_status is not supported"),
        "{}",
        answer.text()
    );
    let mut misspelt = running.clone();
    misspelt["status"]["helthy"] = true.into();
    let answer = post_json(&endpoint, &call_body(&env, "UPDATE", misspelt)).await;
    assert_eq!(answer.status, 400);
    assert!(answer.text().contains("'helthy'"), "{}", answer.text());
    // A known executor that has not subscribed: 403 (mesos-go
    // re-subscribes on it); an unknown one: 400.
    let answer = post_json(&endpoint, &call_body(&env, "UPDATE", running.clone())).await;
    assert_eq!(answer.status, 403, "{}", answer.text());
    let mut stranger = env.clone();
    stranger.insert("MESOS_EXECUTOR_ID".into(), "nobody".into());
    assert_eq!(
        code(post_json(&endpoint, &call_body(&stranger, "UPDATE", running.clone())).await),
        400
    );
    let answer = post_json(&endpoint, &call_body(&stranger, "SUBSCRIBE", json!({}))).await;
    assert_eq!(answer.status, 400);
    assert!(
        answer.text().contains("unknown executor"),
        "{}",
        answer.text()
    );
    // An executor of Agora's API has a token: it cannot subscribe here.
    let mut native = env.clone();
    native.insert(
        "MESOS_EXECUTOR_ID".into(),
        native_env["AGORA_EXECUTOR_ID"].clone(),
    );
    let answer = post_json(&endpoint, &call_body(&native, "SUBSCRIBE", json!({}))).await;
    assert_eq!(answer.status, 400);
    assert!(answer.text().contains("not launched as a Mesos executor"));
    // Nothing of that disturbed the real executor.
    let mut stream = subscribe_v1(&env, Codec::Json, json!({})).await;
    assert_eq!(stream.next().await["type"], "SUBSCRIBED");
    assert_eq!(stream.next().await["type"], "LAUNCH");
    let answer = post_json(&endpoint, &call_body(&env, "HEARTBEAT", json!(null))).await;
    assert_eq!(answer.status, 202);
    let answer = post_json(&endpoint, &call_body(&env, "UPDATE", running)).await;
    assert_eq!(answer.status, 202);
    assert_eq!(stream.next().await["type"], "ACKNOWLEDGED");
    agent.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acknowledged_update_of_a_mesos_executor_survives_an_agent_restart() {
    let (dir, agent, master, mut conn, env) = mesos_executor(true).await;
    let mut stream = subscribe_v1(&env, Codec::Json, json!({})).await;
    assert_eq!(stream.next().await["type"], "SUBSCRIBED");
    assert_eq!(stream.next().await["type"], "LAUNCH");
    let running = uuid::Uuid::new_v4();
    let answer = post_json(
        &env["MESOS_AGENT_ENDPOINT"],
        &call_body(&env, "UPDATE", update("t1", "TASK_RUNNING", &running)),
    )
    .await;
    assert_eq!(answer.status, 202);
    assert_eq!(stream.next().await["type"], "ACKNOWLEDGED");
    // The master never acknowledges it; the agent restarts.
    let (_, status) = conn.recv_update(false).await;
    assert_eq!(status.uuid, Some(running.to_string()));
    agent.stop().await;
    drop(conn);
    assert!(stream.ends().await);

    let script = dir.path().join("fake-executor.sh");
    let work = dir.path().join("work");
    let agent = Agent::start(config(&master.addr(), &work, &script)).await;
    let mut conn = master.accept().await;
    conn.register("agent-1").await;
    let (_, status) = conn.recv_update(false).await;
    assert_eq!(status.uuid, Some(running.to_string()), "delivered again");
    assert_eq!(status.state, TaskState::Running);
    // The executor re-subscribes on the new port with its task: no LAUNCH.
    let mut env = env;
    env.insert("MESOS_AGENT_ENDPOINT".into(), agent.addr.to_string());
    let task = json!({
        "name": "task t1", "task_id": {"value": "t1"}, "agent_id": {"value": "agent-1"},
        "executor": {"executor_id": {"value": "e1"}, "command": {"value": "x"}},
    });
    let finished = uuid::Uuid::new_v4();
    let mut stream = subscribe_v1(
        &env,
        Codec::Json,
        json!({
            "unacknowledged_tasks": [task],
            "unacknowledged_updates": [update("t1", "TASK_FINISHED", &finished)],
        }),
    )
    .await;
    assert_eq!(stream.next().await["type"], "SUBSCRIBED");
    let ack = stream.next().await;
    assert_eq!(ack["type"], "ACKNOWLEDGED", "{ack}");
    assert_eq!(ack["acknowledged"]["uuid"], b64(finished.as_bytes()));
    agent.stop().await;
}

/// A Mesos executor that stops reading its stream is disconnected once it
/// has left `--executor-outbox` events unread for
/// `--executor-stall-timeout`, as one on Agora's WebSocket is.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mesos_executor_that_does_not_read_is_disconnected() {
    let dir = tempfile::tempdir().unwrap();
    let script = sleeper_script(dir.path());
    let work = dir.path().join("work");
    let master = FakeMaster::bind().await;
    let mut config = config(&master.addr(), &work, &script);
    config.executor_outbox = 4;
    config.executor_stall_timeout = std::time::Duration::from_millis(300);
    let agent = Agent::start(config).await;
    let mut conn = master.accept().await;
    conn.register("agent-1").await;
    conn.send(&AgentEvent::RunTask {
        framework: framework("fw", false),
        task: mesos_task("t1", "e1", &script, true),
    })
    .await;
    let (_, env) = executor_env(&work, "fw", "e1").await;
    let mut stream = subscribe_v1(&env, Codec::Json, json!({})).await;
    assert_eq!(stream.next().await["type"], "SUBSCRIBED");
    // From now on the executor reads nothing. Framework messages of 1 MiB
    // fill the socket's buffers, then the queues.
    let data = vec![b'x'; 1 << 20];
    let connected =
        |s: &serde_json::Value| s["frameworks"][0]["executors"][0]["connected"].as_bool();
    let started = std::time::Instant::now();
    let mut disconnected = false;
    for _ in 0..200 {
        conn.send(&AgentEvent::Message {
            framework_id: FrameworkId::new("fw"),
            executor_id: ExecutorId::new("e1"),
            data: data.clone().into(),
        })
        .await;
        let (_, body) = agent.get("/state").await;
        let state: serde_json::Value = serde_json::from_str(&body).unwrap();
        if connected(&state) == Some(false) {
            disconnected = true;
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    assert!(
        disconnected,
        "the executor that reads nothing kept its stream"
    );
    assert!(
        started.elapsed() >= std::time::Duration::from_millis(300),
        "disconnected before the stall timeout"
    );
    drop(stream);
    agent.stop().await;
}

/// A task group of a Mesos executor reaches it in one `LAUNCH_GROUP`; the
/// executor's `shutdown_grace_period`, `data` and `labels` come back to it
/// in `SUBSCRIBED` (the grace period in its environment too); updates of
/// each task flow as usual; `HEARTBEAT`s come every
/// `--executor-heartbeat-interval`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mesos_executor_gets_a_task_group_in_one_launch_group_and_heartbeats() {
    let dir = tempfile::tempdir().unwrap();
    let script = sleeper_script(dir.path());
    let work = dir.path().join("work");
    let master = FakeMaster::bind().await;
    let mut config = config(&master.addr(), &work, &script);
    let interval = std::time::Duration::from_millis(400);
    config.executor_heartbeat_interval = interval;
    let agent = Agent::start(config).await;
    let mut conn = master.accept().await;
    conn.register("agent-1").await;
    let tasks: Vec<TaskInfo> = ["g1", "g2"]
        .into_iter()
        .map(|id| {
            let mut task = mesos_task(id, "e1", &script, true);
            let executor = task.executor.as_mut().unwrap();
            executor.shutdown_grace_period = Some(2.5);
            executor.data = Some("executor data".into());
            executor.labels = [("team".to_string(), "blue".to_string())].into();
            task.command = Some(CommandInfo::shell(format!("echo {id}")));
            task.task_group = Some("o1/0".into());
            task
        })
        .collect();
    conn.send(&AgentEvent::RunTaskGroup {
        framework: framework("fw", true),
        tasks,
    })
    .await;
    let (_, env) = executor_env(&work, "fw", "e1").await;
    assert_eq!(env["MESOS_EXECUTOR_SHUTDOWN_GRACE_PERIOD"], "2500ms");
    let mut stream = subscribe_v1(&env, Codec::Json, json!({})).await;
    let subscribed_at = std::time::Instant::now();
    let subscribed = stream.next().await;
    assert_eq!(subscribed["type"], "SUBSCRIBED", "{subscribed}");
    let info = &subscribed["subscribed"]["executor_info"];
    assert_eq!(
        info["shutdown_grace_period"],
        json!({"nanoseconds": 2_500_000_000u64})
    );
    assert_eq!(info["data"], b64(b"executor data"));
    assert_eq!(
        info["labels"],
        json!({"labels": [{"key": "team", "value": "blue"}]})
    );
    let group = stream.next().await;
    assert_eq!(group["type"], "LAUNCH_GROUP", "{group}");
    let tasks = group["launch_group"]["task_group"]["tasks"]
        .as_array()
        .unwrap();
    let ids: Vec<&str> = tasks
        .iter()
        .map(|t| t["task_id"]["value"].as_str().unwrap())
        .collect();
    assert_eq!(ids, ["g1", "g2"]);
    // As Mesos's: no executor in the tasks of a group; their commands are
    // for the executor.
    assert!(tasks.iter().all(|t| t.get("executor").is_none()), "{group}");
    assert_eq!(tasks[1]["command"]["value"], "echo g2");

    for id in ["g1", "g2"] {
        let finished = uuid::Uuid::new_v4();
        let answer = post_json(
            &env["MESOS_AGENT_ENDPOINT"],
            &call_body(&env, "UPDATE", update(id, "TASK_FINISHED", &finished)),
        )
        .await;
        assert_eq!(answer.status, 202, "{}", answer.text());
        let (_, status) = conn.recv_update(true).await;
        assert_eq!(status.task_id.as_str(), id);
        assert_eq!(status.state, TaskState::Finished);
    }
    // The acknowledgements, then heartbeats at the interval.
    let mut beats = Vec::new();
    let mut acks = 0;
    while beats.len() < 2 {
        let event = stream.next().await;
        match event["type"].as_str() {
            Some("ACKNOWLEDGED") => acks += 1,
            Some("HEARTBEAT") => {
                assert_eq!(event, json!({"type": "HEARTBEAT"}));
                beats.push(std::time::Instant::now());
            }
            _ => panic!("unexpected {event}"),
        }
    }
    assert_eq!(acks, 2);
    let slack = std::time::Duration::from_millis(100);
    assert!(
        beats[0] - subscribed_at + slack >= interval,
        "a heartbeat came early"
    );
    assert!(
        beats[1] - beats[0] + slack >= interval,
        "heartbeats came too often"
    );
    agent.stop().await;
}

/// The claims of a JWT (unverified: what the agent put in it).
fn claims(token: &str) -> serde_json::Value {
    let payload = token.split('.').nth(1).expect("a JWT has three parts");
    let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(payload)
        .unwrap();
    serde_json::from_slice(&bytes).unwrap()
}

fn sign(claims: &serde_json::Value, key: &[u8]) -> String {
    jsonwebtoken::encode(
        &jsonwebtoken::Header::new(jsonwebtoken::Algorithm::HS256),
        claims,
        &jsonwebtoken::EncodingKey::from_secret(key),
    )
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn executors_authenticate_with_their_runs_signed_token() {
    let Started {
        dir: _dir,
        script,
        work,
        agent,
        master: _master,
        mut conn,
    } = Started::with_mesos_task_and(false, |c| c.authenticate_executors = true).await;
    // A second Mesos executor of the same framework.
    conn.send(&AgentEvent::RunTask {
        framework: framework("fw", false),
        task: mesos_task("t2", "e2", &script, true),
    })
    .await;
    let (_, env) = executor_env(&work, "fw", "e1").await;
    let (_, env2) = executor_env(&work, "fw", "e2").await;
    let endpoint = env["MESOS_AGENT_ENDPOINT"].clone();

    // The token: HS256, naming framework, executor, run and agent; in
    // Mesos's variable only (a Mesos executor gets no descriptor of
    // secrets, and Agora's variable would be a second copy of it).
    let token = env["MESOS_EXECUTOR_AUTHENTICATION_TOKEN"].clone();
    assert!(!env.contains_key("AGORA_EXECUTOR_TOKEN"));
    assert!(!env.contains_key("AGORA_EXECUTOR_SECRETS_FD"));
    let header: serde_json::Value = serde_json::from_slice(
        &base64::engine::general_purpose::URL_SAFE_NO_PAD
            .decode(token.split('.').next().unwrap())
            .unwrap(),
    )
    .unwrap();
    assert_eq!(header["alg"], "HS256");
    let state = agent
        .state_when(|s| {
            s["frameworks"][0]["executors"]
                .as_array()
                .is_some_and(|e| e.len() == 2)
        })
        .await;
    let run = state["frameworks"][0]["executors"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["id"] == "e1")
        .unwrap()["run_id"]
        .clone();
    let mine = claims(&token);
    assert_eq!(
        (&mine["fid"], &mine["eid"], &mine["cid"], &mine["aid"]),
        (&json!("fw"), &json!("e1"), &run, &json!("agent-1"))
    );

    let key = std::fs::read(work.join("executor-secret-key")).unwrap();
    let mut other_run = mine.clone();
    other_run["cid"] = json!("an-earlier-run");
    let b64 = base64::engine::general_purpose::URL_SAFE_NO_PAD;
    let unsigned = format!(
        "{}.{}.",
        b64.encode(br#"{"alg":"none","typ":"JWT"}"#),
        b64.encode(mine.to_string())
    );
    let subscribe = call_body(&env, "SUBSCRIBE", json!({}))
        .to_string()
        .into_bytes();
    let attempt = |authorization: Option<String>| {
        let endpoint = endpoint.clone();
        let subscribe = subscribe.clone();
        async move {
            let mut headers = vec![("content-type", JSON)];
            let value = authorization.unwrap_or_default();
            if !value.is_empty() {
                headers.push(("authorization", value.as_str()));
            }
            post(&endpoint, &headers, subscribe).await
        }
    };
    // No token, a token of another key, `alg: none`, junk: 401 with a
    // Bearer challenge.
    let answer = attempt(None).await;
    assert_eq!(answer.status, 401, "{}", answer.text());
    assert_eq!(
        answer.headers["www-authenticate"],
        "Bearer realm=\"agora-executor\""
    );
    for forged in [sign(&mine, &[9u8; 32]), unsigned, "not-a-token".to_string()] {
        let answer = attempt(Some(format!("Bearer {forged}"))).await;
        assert_eq!(answer.status, 401, "{forged}: {}", answer.text());
    }
    assert_eq!(attempt(Some(format!("Basic {token}"))).await.status, 401);
    // Signed by this agent, for another executor or another run: 403.
    let answer = attempt(Some(format!(
        "Bearer {}",
        env2["MESOS_EXECUTOR_AUTHENTICATION_TOKEN"]
    )))
    .await;
    assert_eq!(answer.status, 403, "{}", answer.text());
    let answer = attempt(Some(format!("Bearer {}", sign(&other_run, &key)))).await;
    assert_eq!(answer.status, 403, "{}", answer.text());

    // Each with its own token subscribes.
    let bearer = format!("Bearer {token}");
    let bearer2 = format!("Bearer {}", env2["MESOS_EXECUTOR_AUTHENTICATION_TOKEN"]);
    let mut stream =
        subscribe_v1_with(&env, Codec::Json, json!({}), &[("authorization", &bearer)]).await;
    assert_eq!(stream.next().await["type"], "SUBSCRIBED");
    assert_eq!(stream.next().await["type"], "LAUNCH");
    let mut stream2 = subscribe_v1_with(
        &env2,
        Codec::Json,
        json!({}),
        &[("authorization", &bearer2)],
    )
    .await;
    assert_eq!(stream2.next().await["type"], "SUBSCRIBED");
    assert_eq!(stream2.next().await["type"], "LAUNCH");

    let with = |authorization: &str, call: &serde_json::Value| {
        let endpoint = endpoint.clone();
        let body = call.to_string().into_bytes();
        let authorization = authorization.to_string();
        async move {
            post(
                &endpoint,
                &[("content-type", JSON), ("authorization", &authorization)],
                body,
            )
            .await
            .status
        }
    };
    // e2 forging e1's task: as itself it is refused (t1 is not its task);
    // with e1's id but its own token, 403. Nothing reaches the master.
    let forged = update("t1", "TASK_FAILED", &uuid::Uuid::new_v4());
    assert_eq!(
        with(&bearer2, &call_body(&env2, "UPDATE", forged.clone())).await,
        202
    );
    let error = stream2.next().await;
    assert_eq!(error["type"], "ERROR", "{error}");
    assert_eq!(
        with(&bearer2, &call_body(&env, "UPDATE", forged.clone())).await,
        403
    );
    assert_eq!(
        with("Bearer junk", &call_body(&env, "UPDATE", forged.clone())).await,
        401
    );
    let heartbeat = call_body(&env, "HEARTBEAT", serde_json::Value::Null);
    assert_eq!(with(&bearer2, &heartbeat).await, 403);
    assert_eq!(with(&bearer, &heartbeat).await, 202);
    // e1's own update, with its token, goes through: the only update the
    // master sees.
    let running = uuid::Uuid::new_v4();
    let call = call_body(&env, "UPDATE", update("t1", "TASK_RUNNING", &running));
    assert_eq!(with(&bearer, &call).await, 202);
    assert_eq!(stream.next().await["type"], "ACKNOWLEDGED");
    let (_, status) = conn.recv_update(true).await;
    assert_eq!(
        (status.task_id.as_str(), status.state, status.uuid),
        ("t1", TaskState::Running, Some(running.to_string()))
    );
    // t1 runs (the forged TASK_FAILED never applied).
    let t1 = |s: &serde_json::Value| {
        s["frameworks"][0]["executors"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|e| e["id"] == "e1")
            .map(|e| e["tasks"][0]["state"].clone())
    };
    let state = agent
        .state_when(|s| t1(s) == Some(json!("TASK_RUNNING")))
        .await;
    assert_eq!(t1(&state), Some(json!("TASK_RUNNING")));
    agent.stop().await;
}
