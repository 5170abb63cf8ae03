//! An in-process agent against a fake master (and a fake executor client):
//! registration, pings, task launch through the command executor, the
//! executor channel, status update delivery and agent-generated updates.

mod support;

use base64::Engine as _;

use std::time::Duration;

use agora_proto::agent::{Call as AgentCall, Event as AgentEvent};
use agora_proto::executor::{Call as ExecCall, Event as ExecEvent};
use agora_proto::{FrameworkId, Reason, Source, TaskId, TaskState};
use support::*;
use tokio_tungstenite::tungstenite::Message;

#[tokio::test]
async fn registers_pongs_launches_and_delivers_updates() {
    let dir = tempfile::tempdir().unwrap();
    let script = sleeper_script(dir.path());
    let work = dir.path().join("work");
    let master = FakeMaster::bind().await;
    let agent = Agent::start(config(&master.addr(), &work, &script)).await;

    let mut conn = master.accept().await;
    match conn.register("agent-1").await {
        AgentCall::Register {
            protocol,
            agent_info,
            tasks,
            ..
        } => {
            assert_eq!(protocol, agora_proto::PROTOCOL_VERSION);
            assert_eq!(agent_info.id, None);
            assert_eq!(agent_info.hostname, "test-host");
            assert_eq!(agent_info.resources.cpus(), 2.0);
            assert!(tasks.is_empty());
        }
        _ => unreachable!(),
    }
    conn.send(&AgentEvent::Ping).await;
    assert_eq!(conn.recv_any().await, AgentCall::Pong);

    let (status, body) = agent.get("/health").await;
    assert_eq!((status, body.as_str()), (200, "ok"));

    conn.send(&AgentEvent::RunTask {
        framework: framework("fw-1", false),
        task: command_task("task-1"),
    })
    .await;
    // Command tasks run in a command executor of the agent's own.
    let (sandbox, env) = command_executor_env(&work, "fw-1").await;
    let sandbox_s = std::fs::canonicalize(&sandbox).unwrap();
    let sandbox_s = sandbox_s.to_str().unwrap();
    let host_id = env["AGORA_EXECUTOR_ID"].clone();
    assert!(host_id.starts_with("~command-"), "{host_id}");
    assert_eq!(env["AGORA_FRAMEWORK_ID"], "fw-1");
    assert_eq!(env["MESOS_FRAMEWORK_ID"], "fw-1");
    assert_eq!(env["MESOS_EXECUTOR_ID"], host_id);
    assert_eq!(env["AGORA_AGENT_ID"], "agent-1");
    assert_eq!(env["MESOS_SLAVE_ID"], "agent-1");
    assert_eq!(env["AGORA_SANDBOX"], sandbox_s);
    assert_eq!(env["MESOS_SANDBOX"], sandbox_s);
    assert_eq!(env["MESOS_DIRECTORY"], sandbox_s);
    assert_eq!(env["PWD"], sandbox_s);
    assert_eq!(env["AGORA_CHECKPOINT"], "0");
    assert!(
        !env.contains_key("TASK_VAR"),
        "a task's environment is its own, not its executor's"
    );
    assert_eq!(
        env["AGORA_AGENT_ENDPOINT"],
        format!("ws://{}/api/executor", agent.addr)
    );
    assert!(env["AGORA_EXECUTOR_TOKEN"].len() >= 16);
    assert!(env.contains_key("AGORA_SHUTDOWN_GRACE_PERIOD"));
    assert!(env.contains_key("AGORA_RECOVERY_TIMEOUT"));

    // /state shows the task as its own command executor, with the
    // process's pid and the task's own sandbox.
    let state = agent
        .state_when(|s| s["frameworks"][0]["executors"][0]["pid"].is_u64())
        .await;
    assert_eq!(state["id"], "agent-1");
    let ex = &state["frameworks"][0]["executors"][0];
    assert_eq!(ex["id"], "task-1");
    assert_eq!(ex["command_executor"], true);
    assert_eq!(ex["process"], host_id.as_str());
    let pid = ex["pid"].as_u64().unwrap() as i32;
    let task_sandbox = ex["sandbox"].as_str().unwrap().to_string();
    assert!(
        task_sandbox.contains("/frameworks/fw-1/executors/task-1/runs/"),
        "{task_sandbox}"
    );
    assert_eq!(ex["tasks"][0]["state"], "TASK_STAGING");
    let stat = agora_agent::launcher::proc_stat(pid).unwrap();
    assert_eq!(stat.session, pid);
    let host = &state["frameworks"][0]["command_executors"][0];
    assert_eq!(host["id"], host_id.as_str());
    assert_eq!(host["sandbox"], sandbox_s);

    // Act as the executor: a wrong token is refused.
    let endpoint = env["AGORA_AGENT_ENDPOINT"].clone();
    let mut bad = ExecClient::connect(&endpoint).await;
    let mut wrong = env.clone();
    wrong.insert("AGORA_EXECUTOR_TOKEN".into(), "nope".into());
    bad.send(&subscribe(&wrong, vec![], vec![])).await;
    assert!(matches!(
        bad.recv().await,
        ExecEvent::Error { fatal: true, .. }
    ));
    // The token is a JWT the agent signed: the same claims signed with
    // another key, or unsigned (`alg: none`), are refused as invalid.
    let token = &env["AGORA_EXECUTOR_TOKEN"];
    let b64 = base64::engine::general_purpose::URL_SAFE_NO_PAD;
    let payload = token.split('.').nth(1).unwrap();
    let claims: serde_json::Value = serde_json::from_slice(&b64.decode(payload).unwrap()).unwrap();
    let other_key = jsonwebtoken::encode(
        &jsonwebtoken::Header::new(jsonwebtoken::Algorithm::HS256),
        &claims,
        &jsonwebtoken::EncodingKey::from_secret(&[5u8; 32]),
    )
    .unwrap();
    let unsigned = format!(
        "{}.{payload}.",
        b64.encode(br#"{"alg":"none","typ":"JWT"}"#)
    );
    for forged in [other_key, unsigned] {
        let mut bad = ExecClient::connect(&endpoint).await;
        wrong.insert("AGORA_EXECUTOR_TOKEN".into(), forged);
        bad.send(&subscribe(&wrong, vec![], vec![])).await;
        match bad.recv().await {
            ExecEvent::Error {
                fatal: true,
                message,
            } => {
                assert!(message.contains("invalid executor token"), "{message}")
            }
            e => panic!("{e:?}"),
        }
    }

    let mut exec = ExecClient::connect(&endpoint).await;
    // Calls before SUBSCRIBE and undecodable frames get non-fatal errors.
    exec.send(&ExecCall::Message { data: "x".into() }).await;
    match exec.recv().await {
        ExecEvent::Error { message, fatal } => {
            assert!(!fatal);
            assert!(message.contains("subscribe first"));
        }
        e => panic!("{e:?}"),
    }
    exec.send_raw(Message::text("{not json")).await;
    assert!(matches!(
        exec.recv().await,
        ExecEvent::Error { fatal: false, .. }
    ));
    exec.send_raw(Message::text(r#"{"type":"FROM_THE_FUTURE"}"#))
        .await;
    assert!(matches!(
        exec.recv().await,
        ExecEvent::Error { fatal: false, .. }
    ));

    exec.send(&subscribe(&env, vec![], vec![])).await;
    match exec.recv().await {
        ExecEvent::Subscribed {
            executor_info,
            framework_info,
            agent_id,
            hostname,
        } => {
            assert_eq!(executor_info.executor_id.as_str(), host_id);
            assert_eq!(framework_info.id, Some(FrameworkId::new("fw-1")));
            assert_eq!(agent_id.as_str(), "agent-1");
            assert_eq!(hostname, "test-host");
        }
        e => panic!("{e:?}"),
    }
    match exec.recv().await {
        ExecEvent::Launch { task, sandbox, .. } => {
            assert_eq!(task.task_id.as_str(), "task-1");
            assert_eq!(sandbox.as_deref(), Some(task_sandbox.as_str()));
        }
        e => panic!("{e:?}"),
    }

    // RUNNING: acknowledged to the executor, forwarded to the master.
    let running = executor_status("task-1", TaskState::Running);
    let uuid1 = running.uuid.clone().unwrap();
    exec.send(&ExecCall::Update {
        status: running.clone(),
    })
    .await;
    match exec.recv().await {
        ExecEvent::Acknowledged { task_id, uuid } => {
            assert_eq!(task_id.as_str(), "task-1");
            assert_eq!(uuid, uuid1);
        }
        e => panic!("{e:?}"),
    }
    // A duplicate is acknowledged again but not forwarded twice.
    exec.send(&ExecCall::Update {
        status: running.clone(),
    })
    .await;
    assert!(matches!(exec.recv().await, ExecEvent::Acknowledged { .. }));
    let finished = executor_status("task-1", TaskState::Finished);
    exec.send(&ExecCall::Update {
        status: finished.clone(),
    })
    .await;
    assert!(matches!(exec.recv().await, ExecEvent::Acknowledged { .. }));

    // Only the head is in flight: RUNNING first, FINISHED after its ack.
    let (fid, s) = conn.recv_update(false).await;
    assert_eq!(fid.as_str(), "fw-1");
    assert_eq!(s.state, TaskState::Running);
    assert_eq!(s.uuid.as_deref(), Some(uuid1.as_str()));
    assert_eq!(s.agent_id.as_ref().map(|a| a.as_str()), Some("agent-1"));
    assert_eq!(s.executor_id.as_ref().map(|a| a.as_str()), Some("task-1"));
    // An ack for a non-head uuid is ignored; the real one releases FINISHED.
    conn.send(&AgentEvent::Acknowledge {
        framework_id: fid.clone(),
        task_id: TaskId::new("task-1"),
        uuid: finished.uuid.clone().unwrap(),
    })
    .await;
    conn.send(&AgentEvent::Acknowledge {
        framework_id: fid.clone(),
        task_id: TaskId::new("task-1"),
        uuid: uuid1,
    })
    .await;
    let (_, s) = conn.recv_update(true).await;
    assert_eq!(s.state, TaskState::Finished);

    // The command executor exits: its task had ended, so the master hears
    // of no executor.
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    // Everything is forgotten once the terminal update is acknowledged.
    let mut forgotten = false;
    for _ in 0..100 {
        let (_, body) = agent.get("/state").await;
        let state: serde_json::Value = serde_json::from_str(&body).unwrap();
        if state["frameworks"].as_array().is_some_and(|a| a.is_empty()) {
            forgotten = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(forgotten);

    // KILL_TASK for an unknown task → TASK_LOST (REASON_TASK_UNKNOWN).
    conn.send(&AgentEvent::KillTask {
        framework_id: FrameworkId::new("fw-1"),
        task_id: TaskId::new("ghost"),
    })
    .await;
    let (_, s) = conn.recv_update(true).await;
    assert_eq!(s.task_id.as_str(), "ghost");
    assert_eq!(s.state, TaskState::Lost);
    assert_eq!(s.reason, Some(Reason::ReasonTaskUnknown));
    assert_eq!(s.source, Source::SourceAgent);
    agent.stop().await;
}

#[tokio::test]
async fn executor_exit_fails_its_tasks_and_queued_kill_is_agent_generated() {
    let dir = tempfile::tempdir().unwrap();
    let script = sleeper_script(dir.path());
    let work = dir.path().join("work");
    let master = FakeMaster::bind().await;
    let mut c = config(&master.addr(), &work, &script);
    c.command_executor_idle = Duration::from_millis(200);
    let agent = Agent::start(c).await;
    let mut conn = master.accept().await;
    conn.register("agent-1").await;

    // Task a: its command executor subscribes, then dies → TASK_FAILED,
    // and the master hears that task a's executor exited.
    conn.send(&AgentEvent::RunTask {
        framework: framework("fw", false),
        task: command_task("a"),
    })
    .await;
    let (sandbox_a, env) = command_executor_env(&work, "fw").await;
    let mut exec = ExecClient::connect(&env["AGORA_AGENT_ENDPOINT"]).await;
    exec.send(&subscribe(&env, vec![], vec![])).await;
    assert!(matches!(exec.recv().await, ExecEvent::Subscribed { .. }));
    assert!(matches!(exec.recv().await, ExecEvent::Launch { .. }));
    let state = agent
        .state_when(|s| s["frameworks"][0]["executors"][0]["pid"].is_u64())
        .await;
    let pid = state["frameworks"][0]["executors"][0]["pid"]
        .as_u64()
        .unwrap() as i32;
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    let mut saw_update = false;
    let mut saw_exit = false;
    while !(saw_update && saw_exit) {
        match conn.recv().await {
            AgentCall::StatusUpdate {
                framework_id,
                status,
            } => {
                assert_eq!(status.task_id.as_str(), "a");
                assert_eq!(status.state, TaskState::Failed);
                assert_eq!(status.reason, Some(Reason::ReasonExecutorTerminated));
                assert_eq!(status.source, Source::SourceAgent);
                assert_eq!(status.executor_id.as_ref().map(|e| e.as_str()), Some("a"));
                assert!(status.uuid.is_some());
                assert!(
                    status.message.as_deref().unwrap_or("").contains("SIGTERM"),
                    "{status:?}"
                );
                conn.send(&AgentEvent::Acknowledge {
                    framework_id,
                    task_id: status.task_id.clone(),
                    uuid: status.uuid.clone().unwrap(),
                })
                .await;
                saw_update = true;
            }
            AgentCall::ExecutorExited {
                executor_id,
                status,
                ..
            } => {
                assert_eq!(executor_id.as_str(), "a");
                assert_eq!(status, Some(128 + 15));
                saw_exit = true;
            }
            c => panic!("{c:?}"),
        }
    }

    // Task b: killed while still queued (its command executor never
    // subscribed).
    conn.send(&AgentEvent::RunTask {
        framework: framework("fw", false),
        task: command_task("b"),
    })
    .await;
    let sandbox_a = sandbox_a.to_str().unwrap().to_string();
    let state = agent
        .state_when(|s| {
            let host = &s["frameworks"][0]["command_executors"][0];
            host["pid"].is_u64() && host["sandbox"] != sandbox_a.as_str()
        })
        .await;
    let host_b = state["frameworks"][0]["command_executors"][0]["pid"]
        .as_u64()
        .unwrap() as i32;
    conn.send(&AgentEvent::KillTask {
        framework_id: FrameworkId::new("fw"),
        task_id: TaskId::new("b"),
    })
    .await;
    let (_, s) = conn.recv_update(true).await;
    assert_eq!(s.task_id.as_str(), "b");
    assert_eq!(s.state, TaskState::Killed);
    assert_eq!(s.source, Source::SourceAgent);
    // Its command executor has nothing left to do: once idle for
    // --command-executor-idle it is stopped.
    let mut gone = false;
    for _ in 0..200 {
        if agora_agent::launcher::proc_stat(host_b).is_none_or(|s| s.state == 'Z') {
            gone = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    assert!(gone, "the idle command executor was stopped");

    // Invalid task: neither command nor executor → TASK_ERROR.
    let mut bad = command_task("c");
    bad.command = None;
    conn.send(&AgentEvent::RunTask {
        framework: framework("fw", false),
        task: bad,
    })
    .await;
    let (_, s) = conn.recv_update(true).await;
    assert_eq!(s.state, TaskState::Error);
    assert_eq!(s.reason, Some(Reason::ReasonTaskInvalid));

    // An executor id that would escape the sandbox, or that of one of the
    // agent's own command executors → TASK_ERROR.
    for (task, executor_id) in [("d", ".."), ("e", "~command-1")] {
        let mut custom = command_task(task);
        custom.command = None;
        custom.executor = Some(agora_proto::ExecutorInfo {
            container: None,
            executor_id: agora_proto::ExecutorId::new(executor_id),
            framework_id: None,
            command: agora_proto::CommandInfo {
                value: "true".into(),
                shell: true,
                ..Default::default()
            },
            resources: Default::default(),
            name: String::new(),
            source: String::new(),
            api: Default::default(),
            shutdown_grace_period: None,
            data: None,
            labels: Default::default(),
        });
        conn.send(&AgentEvent::RunTask {
            framework: framework("fw", false),
            task: custom,
        })
        .await;
        let (_, s) = conn.recv_update(true).await;
        assert_eq!(s.state, TaskState::Error);
        assert!(s.message.unwrap().contains("executor id"));
    }
    agent.stop().await;
}

#[tokio::test]
async fn registration_timeout_and_launch_failure() {
    let dir = tempfile::tempdir().unwrap();
    let script = sleeper_script(dir.path());
    let work = dir.path().join("work");
    let master = FakeMaster::bind().await;
    let mut cfg = config(&master.addr(), &work, &script);
    cfg.executor_registration_timeout = Duration::from_millis(300);
    let agent = Agent::start(cfg).await;
    let mut conn = master.accept().await;
    conn.register("agent-1").await;

    conn.send(&AgentEvent::RunTask {
        framework: framework("fw", false),
        task: command_task("slow"),
    })
    .await;
    let (_, s) = conn.recv_update(true).await;
    assert_eq!(s.state, TaskState::Failed);
    assert_eq!(s.reason, Some(Reason::ReasonExecutorRegistrationTimeout));
    assert!(matches!(
        conn.recv().await,
        AgentCall::ExecutorExited { .. }
    ));

    // A custom executor whose program does not exist.
    let mut task = command_task("custom");
    task.command = None;
    task.executor = Some(agora_proto::ExecutorInfo {
        container: None,
        executor_id: agora_proto::ExecutorId::new("exec-x"),
        framework_id: None,
        command: agora_proto::CommandInfo {
            value: "/nonexistent/executor".into(),
            shell: false,
            arguments: vec!["executor".into()],
            ..Default::default()
        },
        resources: Default::default(),
        name: String::new(),
        source: String::new(),
        api: Default::default(),
        shutdown_grace_period: None,
        data: None,
        labels: Default::default(),
    });
    conn.send(&AgentEvent::RunTask {
        framework: framework("fw", false),
        task,
    })
    .await;
    let (_, s) = conn.recv_update(true).await;
    assert_eq!(s.state, TaskState::Failed);
    assert_eq!(s.reason, Some(Reason::ReasonExecutorLaunchFailed));
    assert!(s.message.unwrap().contains("No such file"));
    agent.stop().await;
}

#[tokio::test]
async fn reconnects_and_reregisters_with_its_id_and_resends_heads() {
    let dir = tempfile::tempdir().unwrap();
    let script = sleeper_script(dir.path());
    let work = dir.path().join("work");
    let master = FakeMaster::bind().await;
    let agent = Agent::start(config(&master.addr(), &work, &script)).await;
    let (mut conn, mut exec, running) = running_task(&master, &work, "agent-7").await;
    let (_, s) = conn.recv_update(false).await;
    assert_eq!(s.uuid, running.uuid);

    // The master connection drops without an ack.
    drop(conn);
    let mut conn = master.accept().await;
    match conn.register("agent-7").await {
        AgentCall::Register {
            agent_info,
            tasks,
            executors,
            frameworks,
            ..
        } => {
            assert_eq!(agent_info.id.as_ref().map(|a| a.as_str()), Some("agent-7"));
            assert_eq!(tasks.len(), 1);
            assert_eq!(tasks[0].state, TaskState::Running);
            assert!(
                executors.is_empty(),
                "command executors are the agent's own"
            );
            assert_eq!(frameworks.len(), 1);
        }
        _ => unreachable!(),
    }
    // The unacknowledged head is sent again on re-registration.
    let (_, s) = conn.recv_update(true).await;
    assert_eq!(s.uuid, running.uuid);
    let (_, body) = agent.get("/metrics").await;
    assert_eq!(
        metric(
            &body,
            "agora_agent_status_updates_retried_total{reason=\"registered\"}"
        ),
        1.0,
        "{body}"
    );
    assert_eq!(
        std::fs::read_to_string(work.join("agent_id"))
            .unwrap()
            .trim(),
        "agent-7"
    );

    // SHUTDOWN_FRAMEWORK: the executor is told to shut down, then killed.
    conn.send(&AgentEvent::ShutdownFramework {
        framework_id: FrameworkId::new("fw"),
    })
    .await;
    assert!(matches!(exec.recv().await, ExecEvent::Shutdown { .. }));
    let mut saw_killed = false;
    let mut saw_exit = false;
    while !(saw_killed && saw_exit) {
        match conn.recv().await {
            AgentCall::StatusUpdate { status, .. } => {
                assert_eq!(status.state, TaskState::Killed);
                assert_eq!(status.reason, Some(Reason::ReasonFrameworkRemoved));
                saw_killed = true;
            }
            AgentCall::ExecutorExited { .. } => saw_exit = true,
            c => panic!("{c:?}"),
        }
    }

    // SHUTDOWN from the master: forget the id and register anew.
    conn.send(&AgentEvent::Shutdown {
        message: "removed".into(),
    })
    .await;
    let mut conn = master.accept().await;
    match conn.register("agent-8").await {
        AgentCall::Register {
            agent_info, tasks, ..
        } => {
            assert_eq!(agent_info.id, None);
            assert!(tasks.is_empty());
        }
        _ => unreachable!(),
    }
    agent.stop().await;
}

#[tokio::test]
async fn bad_frames_are_errors_and_oversize_frames_close_with_1009() {
    let dir = tempfile::tempdir().unwrap();
    let script = sleeper_script(dir.path());
    let work = dir.path().join("work");
    let master = FakeMaster::bind().await;
    let agent = Agent::start(config(&master.addr(), &work, &script)).await;
    let endpoint = format!("ws://{}/api/executor", agent.addr);

    let mut exec = ExecClient::connect(&endpoint).await;
    exec.send_raw(Message::binary(vec![1, 2, 3])).await;
    match exec.recv().await {
        ExecEvent::Error { message, fatal } => {
            assert!(!fatal);
            assert!(message.contains("binary"), "{message}");
        }
        e => panic!("{e:?}"),
    }
    // Subscribing as an executor the agent does not run is refused.
    let env = [
        ("AGORA_FRAMEWORK_ID".to_string(), "fw".to_string()),
        ("AGORA_EXECUTOR_ID".to_string(), "nobody".to_string()),
        ("AGORA_EXECUTOR_TOKEN".to_string(), "t".to_string()),
    ]
    .into();
    exec.send(&subscribe(&env, vec![], vec![])).await;
    assert!(matches!(
        exec.recv().await,
        ExecEvent::Error { fatal: true, .. }
    ));

    // The close (code 1009) is written before the agent drops the
    // connection; a peer still busy writing may see a reset instead.
    let (ws, _) = tokio_tungstenite::connect_async(endpoint.as_str())
        .await
        .unwrap();
    let (mut sink, mut stream) = futures::StreamExt::split(ws);
    let payload = format!(
        "{{\"type\":\"MESSAGE\",\"data\":\"{}\"}}",
        "A".repeat(agora_proto::MAX_FRAME_BYTES + 10)
    );
    tokio::spawn(async move {
        let _ = futures::SinkExt::send(&mut sink, Message::text(payload)).await;
    });
    let mut outcome = "nothing";
    while let Ok(Some(frame)) =
        tokio::time::timeout(WAIT, futures::StreamExt::next(&mut stream)).await
    {
        match frame {
            Ok(Message::Close(Some(f))) => {
                assert_eq!(u16::from(f.code), 1009);
                assert!(f.reason.contains("limit"));
                outcome = "close 1009";
                break;
            }
            Ok(_) => continue,
            Err(_) => {
                outcome = "reset";
                break;
            }
        }
    }
    eprintln!("oversize frame outcome: {outcome}");
    assert_ne!(outcome, "nothing");
    // The agent is unaffected.
    let (status, _) = agent.get("/health").await;
    assert_eq!(status, 200);
    agent.stop().await;
}

/// The value of a Prometheus series in `text` (0 when absent).
/// Registers the agent as `agent_id`, launches task "t" of the
/// non-checkpointing framework "fw" through the command executor, plays
/// its executor and reports TASK_RUNNING; returns once the agent has
/// acknowledged that update.
async fn running_task(
    master: &FakeMaster,
    work: &std::path::Path,
    agent_id: &str,
) -> (MasterConn, ExecClient, agora_proto::TaskStatus) {
    let mut conn = master.accept().await;
    conn.register(agent_id).await;
    conn.send(&AgentEvent::RunTask {
        framework: framework("fw", false),
        task: command_task("t"),
    })
    .await;
    let (_, env) = command_executor_env(work, "fw").await;
    let mut exec = ExecClient::connect(&env["AGORA_AGENT_ENDPOINT"]).await;
    exec.send(&subscribe(&env, vec![], vec![])).await;
    assert!(matches!(exec.recv().await, ExecEvent::Subscribed { .. }));
    assert!(matches!(exec.recv().await, ExecEvent::Launch { .. }));
    let running = executor_status("t", TaskState::Running);
    exec.send(&ExecCall::Update {
        status: running.clone(),
    })
    .await;
    assert!(matches!(exec.recv().await, ExecEvent::Acknowledged { .. }));
    (conn, exec, running)
}

fn metric(text: &str, series: &str) -> f64 {
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
        .unwrap_or(0.0)
}

#[tokio::test]
async fn unacknowledged_updates_are_retried_and_counted() {
    let dir = tempfile::tempdir().unwrap();
    let script = sleeper_script(dir.path());
    let work = dir.path().join("work");
    let master = FakeMaster::bind().await;
    let mut c = config(&master.addr(), &work, &script);
    c.status_update_retry_min = Duration::from_millis(200);
    c.status_update_retry_max = Duration::from_millis(400);
    let agent = Agent::start(c).await;
    // The executor stays connected for the rest of the test.
    let (mut conn, _exec, running) = running_task(&master, &work, "agent-r").await;

    // Not acknowledged: the same update comes again, and is acknowledged.
    let (_, first) = conn.recv_update(false).await;
    let (_, again) = conn.recv_update(true).await;
    assert_eq!(first.uuid, running.uuid);
    assert_eq!(again.uuid, running.uuid);

    let acked = "agora_agent_status_updates_acknowledged_total";
    let mut body = String::new();
    for _ in 0..200 {
        body = agent.get("/metrics").await.1;
        if metric(&body, acked) >= 1.0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(metric(&body, acked), 1.0, "{body}");
    let retried = "agora_agent_status_updates_retried_total";
    assert!(
        metric(&body, &format!("{retried}{{reason=\"timeout\"}}")) >= 1.0,
        "{body}"
    );
    assert_eq!(
        metric(&body, &format!("{retried}{{reason=\"registered\"}}")),
        0.0,
        "{body}"
    );
    agent.stop().await;
}

/// Every RUN_TASK gets an answer. A second launch of a task id that still
/// runs here is refused with TASK_DROPPED (before, it was ignored and the
/// task stayed STAGING at the master for good); a launch of an id whose
/// previous task ended here (its terminal update not yet acknowledged)
/// starts the new task.
#[tokio::test]
async fn a_launch_of_a_task_id_in_use_is_answered() {
    let dir = tempfile::tempdir().unwrap();
    let script = sleeper_script(dir.path());
    let work = dir.path().join("work");
    let master = FakeMaster::bind().await;
    let agent = Agent::start(config(&master.addr(), &work, &script)).await;
    let (mut conn, mut exec, _running) = running_task(&master, &work, "agent-d").await;
    let (_, first) = conn.recv_update(true).await;
    assert_eq!(first.state, TaskState::Running);

    // Still running: the second launch is dropped, the first goes on.
    conn.send(&AgentEvent::RunTask {
        framework: framework("fw", false),
        task: command_task("t"),
    })
    .await;
    let (_, dropped) = conn.recv_update(true).await;
    assert_eq!(dropped.task_id, TaskId::new("t"));
    assert_eq!(dropped.state, TaskState::Dropped);
    assert_eq!(dropped.reason, Some(Reason::ReasonTaskInvalid));
    assert!(
        dropped.message.as_deref().unwrap().contains("still in use"),
        "{dropped:?}"
    );

    // The task finishes; its terminal update is not acknowledged yet
    // when the id is launched again: the new task is accepted (its
    // executor, still connected, gets it).
    exec.send(&ExecCall::Update {
        status: executor_status("t", TaskState::Finished),
    })
    .await;
    assert!(matches!(exec.recv().await, ExecEvent::Acknowledged { .. }));
    let (_, finished) = conn.recv_update(false).await;
    assert_eq!(finished.state, TaskState::Finished);
    conn.send(&AgentEvent::RunTask {
        framework: framework("fw", false),
        task: command_task("t"),
    })
    .await;
    match exec.recv().await {
        ExecEvent::Launch { task, .. } => assert_eq!(task.task_id, TaskId::new("t")),
        e => panic!("{e:?}"),
    }
    agent
        .state_when(|s| s["frameworks"][0]["executors"][0]["tasks"][0]["state"] == "TASK_STAGING")
        .await;
    agent.stop().await;
}
