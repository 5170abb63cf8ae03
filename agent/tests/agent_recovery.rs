//! Agent restarts with checkpointing frameworks: real executor processes
//! survive the agent, are re-attached, and unacknowledged updates are
//! delivered; executors that died meanwhile leave terminal updates.

mod support;

use std::time::Duration;

use agora_agent::launcher;
use agora_proto::agent::{Call as AgentCall, Event as AgentEvent};
use agora_proto::executor::{Call as ExecCall, Event as ExecEvent};
use agora_proto::{Reason, TaskState};
use support::*;

async fn pid_of(agent: &Agent) -> i32 {
    let state = agent
        .state_when(|s| s["frameworks"][0]["executors"][0]["pid"].is_u64())
        .await;
    state["frameworks"][0]["executors"][0]["pid"]
        .as_u64()
        .unwrap() as i32
}

async fn wait_dead(pid: i32) {
    for _ in 0..200 {
        if !launcher::is_alive(pid as u32, None) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    panic!("process {pid} is still alive");
}

#[tokio::test]
async fn restarted_agent_reattaches_and_resends_pending_updates() {
    let dir = tempfile::tempdir().unwrap();
    let script = sleeper_script(dir.path());
    let work = dir.path().join("work");
    let master = FakeMaster::bind().await;

    let agent = Agent::start(config(&master.addr(), &work, &script)).await;
    let mut conn = master.accept().await;
    conn.register("agent-1").await;
    conn.send(&AgentEvent::RunTask {
        framework: framework("fw", true),
        task: command_task("t"),
    })
    .await;
    let (_, env) = command_executor_env(&work, "fw").await;
    assert_eq!(env["AGORA_CHECKPOINT"], "1");
    assert_eq!(env["MESOS_CHECKPOINT"], "1");
    let mut exec = ExecClient::connect(&env["AGORA_AGENT_ENDPOINT"]).await;
    exec.send(&subscribe(&env, vec![], vec![])).await;
    assert!(matches!(exec.recv().await, ExecEvent::Subscribed { .. }));
    let task = match exec.recv().await {
        ExecEvent::Launch { task, .. } => task,
        e => panic!("{e:?}"),
    };
    let running = executor_status("t", TaskState::Running);
    exec.send(&ExecCall::Update {
        status: running.clone(),
    })
    .await;
    assert!(matches!(exec.recv().await, ExecEvent::Acknowledged { .. }));
    // Acknowledged means durable: the update is in the agent's log.
    let log = work.join("meta/updates.wal");
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(text.contains(running.uuid.as_deref().unwrap()));
    let (_, s) = conn.recv_update(false).await;
    assert_eq!(s.state, TaskState::Running);
    let pid = pid_of(&agent).await;

    // Stop the agent: the checkpointed executor keeps running.
    agent.stop().await;
    drop(conn);
    assert!(launcher::is_alive(pid as u32, None), "executor was killed");

    let agent = Agent::start(config(&master.addr(), &work, &script)).await;
    let mut conn = master.accept().await;
    match conn.register("agent-1").await {
        AgentCall::Register {
            agent_info,
            tasks,
            executors,
            frameworks,
            ..
        } => {
            assert_eq!(agent_info.id.as_ref().map(|a| a.as_str()), Some("agent-1"));
            assert_eq!(tasks.len(), 1);
            assert_eq!(tasks[0].state, TaskState::Running);
            assert!(
                executors.is_empty(),
                "command executors are the agent's own"
            );
            assert!(frameworks[0].checkpoint);
        }
        _ => unreachable!(),
    }
    // The unacknowledged RUNNING is delivered again.
    let (_, s) = conn.recv_update(false).await;
    assert_eq!(s.uuid, running.uuid);
    assert_eq!(pid_of(&agent).await, pid);

    // The executor re-subscribes with the same token; it has the task, so
    // no LAUNCH follows.
    // (A real agent restarts on its old port; this one got a new port.)
    let mut exec = ExecClient::connect(&format!("ws://{}/api/executor", agent.addr)).await;
    let finished = executor_status("t", TaskState::Finished);
    exec.send(&subscribe(&env, vec![finished.clone()], vec![task]))
        .await;
    assert!(matches!(exec.recv().await, ExecEvent::Subscribed { .. }));
    match exec.recv().await {
        ExecEvent::Acknowledged { uuid, .. } => assert_eq!(Some(uuid), finished.uuid),
        e => panic!("expected ACKNOWLEDGED, not {e:?}"),
    }
    // Head acknowledged → FINISHED follows.
    conn.send(&AgentEvent::Acknowledge {
        framework_id: agora_proto::FrameworkId::new("fw"),
        task_id: s.task_id.clone(),
        uuid: s.uuid.clone().unwrap(),
    })
    .await;
    let (_, s) = conn.recv_update(true).await;
    assert_eq!(s.uuid, finished.uuid);

    // The executor, no longer a child of the agent, exits: noticed through
    // its pidfd.
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    // Its checkpoint is cleaned up once everything is delivered.
    let meta = work.join("meta/frameworks/fw");
    for _ in 0..200 {
        if !meta.exists() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    assert!(!meta.exists(), "checkpoint left behind");
    agent.stop().await;
}

#[tokio::test]
async fn executor_that_died_while_agent_was_down_fails_its_tasks() {
    let dir = tempfile::tempdir().unwrap();
    let script = sleeper_script(dir.path());
    let work = dir.path().join("work");
    let master = FakeMaster::bind().await;

    let agent = Agent::start(config(&master.addr(), &work, &script)).await;
    let mut conn = master.accept().await;
    conn.register("agent-1").await;
    conn.send(&AgentEvent::RunTask {
        framework: framework("fw", true),
        task: command_task("t"),
    })
    .await;
    command_executor_env(&work, "fw").await;
    let pid = pid_of(&agent).await;
    agent.stop().await;
    drop(conn);
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    wait_dead(pid).await;

    let agent = Agent::start(config(&master.addr(), &work, &script)).await;
    let mut conn = master.accept().await;
    conn.register("agent-1").await;
    let (_, s) = conn.recv_update(true).await;
    assert_eq!(s.task_id.as_str(), "t");
    assert_eq!(s.state, TaskState::Failed);
    assert_eq!(s.reason, Some(Reason::ReasonExecutorTerminated));
    agent.stop().await;
}

#[tokio::test]
async fn cleanup_mode_kills_survivors_and_reports_tasks_lost() {
    let dir = tempfile::tempdir().unwrap();
    let script = sleeper_script(dir.path());
    let work = dir.path().join("work");
    let master = FakeMaster::bind().await;

    let agent = Agent::start(config(&master.addr(), &work, &script)).await;
    let mut conn = master.accept().await;
    conn.register("agent-1").await;
    conn.send(&AgentEvent::RunTask {
        framework: framework("fw", true),
        task: command_task("t"),
    })
    .await;
    command_executor_env(&work, "fw").await;
    let pid = pid_of(&agent).await;
    agent.stop().await;
    drop(conn);
    assert!(launcher::is_alive(pid as u32, None));

    let mut cfg = config(&master.addr(), &work, &script);
    cfg.recover = agora_agent::RecoverMode::Cleanup;
    let agent = Agent::start(cfg).await;
    let mut conn = master.accept().await;
    conn.register("agent-1").await;
    let mut saw_lost = false;
    let mut saw_exit = false;
    while !(saw_lost && saw_exit) {
        match conn.recv().await {
            AgentCall::StatusUpdate {
                framework_id,
                status,
            } => {
                assert_eq!(status.state, TaskState::Lost);
                assert_eq!(status.reason, Some(Reason::ReasonAgentRestarted));
                conn.send(&AgentEvent::Acknowledge {
                    framework_id,
                    task_id: status.task_id.clone(),
                    uuid: status.uuid.clone().unwrap(),
                })
                .await;
                saw_lost = true;
            }
            AgentCall::ExecutorExited { .. } => saw_exit = true,
            c => panic!("{c:?}"),
        }
    }
    wait_dead(pid).await;
    agent.stop().await;
}

#[tokio::test]
async fn graceful_stop_kills_executors_of_non_checkpointing_frameworks() {
    let dir = tempfile::tempdir().unwrap();
    let script = sleeper_script(dir.path());
    let work = dir.path().join("work");
    let master = FakeMaster::bind().await;
    let agent = Agent::start(config(&master.addr(), &work, &script)).await;
    let mut conn = master.accept().await;
    conn.register("agent-1").await;
    conn.send(&AgentEvent::RunTask {
        framework: framework("fw", false),
        task: command_task("t"),
    })
    .await;
    command_executor_env(&work, "fw").await;
    let pid = pid_of(&agent).await;
    agent.stop().await;
    wait_dead(pid).await;
    assert!(!work.join("meta/frameworks/fw").exists());
}

/// A status update log damaged in the middle is cut at its first bad
/// record when the agent starts: the file is rewritten from what came
/// before it, and `/metrics` and `/state` count what was cut.
#[tokio::test]
async fn a_damaged_status_update_log_is_cut_and_counted() {
    let dir = tempfile::tempdir().unwrap();
    let script = sleeper_script(dir.path());
    let work = dir.path().join("work");
    let log = work.join("meta/updates.wal");
    std::fs::create_dir_all(log.parent().unwrap()).unwrap();
    // A lost page, then a line that parses as JSON but is no record.
    let damage = format!("{}\n{{\"not\":\"a record\"}}\n", "\0".repeat(30));
    std::fs::write(&log, &damage).unwrap();
    let master = FakeMaster::bind().await;

    let agent = Agent::start(config(&master.addr(), &work, &script)).await;
    let state = agent
        .state_when(|s| s["checkpoint"]["wal_truncations"].is_u64())
        .await;
    assert_eq!(state["checkpoint"]["wal_truncations"], 1);
    assert_eq!(state["checkpoint"]["wal_truncated_bytes"], damage.len());
    assert_eq!(state["checkpoint"]["wal_truncated_records"], 2);
    let (code, body) = agent.get("/metrics").await;
    assert_eq!(code, 200);
    for line in [
        "# TYPE agora_agent_wal_truncations_total counter".to_string(),
        "agora_agent_wal_truncations_total 1".to_string(),
        format!("agora_agent_wal_truncated_bytes_total {}", damage.len()),
    ] {
        assert!(body.lines().any(|l| l == line), "missing {line} in\n{body}");
    }
    assert_eq!(
        std::fs::metadata(&log).unwrap().len(),
        0,
        "the damage is still in the log"
    );
    agent.stop().await;

    let agent = Agent::start(config(&master.addr(), &work, &script)).await;
    let state = agent
        .state_when(|s| s["checkpoint"]["wal_truncations"].is_u64())
        .await;
    assert_eq!(state["checkpoint"]["wal_truncations"], 0);
    agent.stop().await;
}
