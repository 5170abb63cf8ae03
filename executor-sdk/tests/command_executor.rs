//! The real `agora-command-executor` binary against a fake agent.

mod common;

use std::process::Stdio;
use std::time::Duration;

use agora_executor::proto::executor::{Call, Event};
use agora_executor::proto::PROTOCOL_VERSION;
use agora_executor::{AgentId, ExecutorId, FrameworkId, Reason, Source, TaskId, TaskState};
use common::*;
use tokio::process::{Child, Command};
use tokio::time::timeout;

struct Run {
    agent: FakeAgent,
    child: Child,
    sandbox: tempfile::TempDir,
}

async fn start(grace: &str) -> Run {
    start_with(grace, &[]).await
}

/// [`start`] with more environment variables.
async fn start_with(grace: &str, vars: &[(&str, &str)]) -> Run {
    let agent = FakeAgent::bind().await;
    let sandbox = tempfile::tempdir().unwrap();
    let child = Command::new(env!("CARGO_BIN_EXE_agora-command-executor"))
        .envs(vars.iter().copied())
        .env("AGORA_AGENT_ENDPOINT", agent.endpoint())
        .env("AGORA_FRAMEWORK_ID", "fw-1")
        .env("AGORA_EXECUTOR_ID", "task-1")
        .env("AGORA_SANDBOX", sandbox.path())
        .env("AGORA_EXECUTOR_TOKEN", "secret")
        .env("MESOS_EXECUTOR_AUTHENTICATION_TOKEN", "secret")
        .env("AGORA_SHUTDOWN_GRACE_PERIOD", grace)
        .env("RUST_LOG", "warn")
        .current_dir(sandbox.path())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    Run {
        agent,
        child,
        sandbox,
    }
}

/// Accepts the executor's connection, checks its SUBSCRIBE, subscribes it
/// and launches `task`.
async fn launch(run: &Run, task: agora_executor::TaskInfo) -> Conn {
    let mut ws = run.agent.accept().await;
    match recv(&mut ws).await {
        Call::Subscribe {
            protocol,
            framework_id,
            executor_id,
            token,
            unacknowledged_updates,
            unacknowledged_tasks,
        } => {
            assert_eq!(protocol, PROTOCOL_VERSION);
            assert_eq!(framework_id, FrameworkId::new("fw-1"));
            assert_eq!(executor_id, ExecutorId::new("task-1"));
            assert_eq!(token, "secret");
            assert!(unacknowledged_updates.is_empty());
            assert!(unacknowledged_tasks.is_empty());
        }
        other => panic!("expected SUBSCRIBE, got {other:?}"),
    }
    send(&mut ws, &subscribed("task-1")).await;
    send(
        &mut ws,
        &Event::Launch {
            task,
            sandbox: None,
            cgroups: Vec::new(),
            container: None,
        },
    )
    .await;
    ws
}

async fn exit_code(child: &mut Child) -> i32 {
    timeout(STEP, child.wait())
        .await
        .expect("executor exits in time")
        .unwrap()
        .code()
        .expect("exit code")
}

#[tokio::test]
async fn echo_runs_finishes_and_exits_after_acknowledgement() {
    let mut run = start("5").await;
    // The task does not inherit the executor's token.
    let command =
        "echo hi; printenv AGORA_EXECUTOR_TOKEN MESOS_EXECUTOR_AUTHENTICATION_TOKEN; exit 0";
    let mut ws = launch(&run, command_task("task-1", Some(shell(command)))).await;

    let running = recv_update(&mut ws).await;
    assert_eq!(running.task_id, TaskId::new("task-1"));
    assert_eq!(running.state, TaskState::Running);
    assert_eq!(running.source, Source::SourceExecutor);
    assert_eq!(running.executor_id, Some(ExecutorId::new("task-1")));
    assert_eq!(running.agent_id, Some(AgentId::new("agent-1")));
    assert!(running.uuid.is_some());
    ack(&mut ws, &running).await;

    let finished = recv_update(&mut ws).await;
    assert_eq!(finished.state, TaskState::Finished);
    assert_ne!(finished.uuid, running.uuid);
    // Not acknowledged yet: the executor waits.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        run.child.try_wait().unwrap().is_none(),
        "exited before ACKNOWLEDGED"
    );
    ack(&mut ws, &finished).await;
    assert_eq!(drain_until_closed(&mut ws).await, vec![]);
    assert_eq!(exit_code(&mut run.child).await, 0);

    let mut stdout = String::new();
    use tokio::io::AsyncReadExt;
    run.child
        .stdout
        .take()
        .unwrap()
        .read_to_string(&mut stdout)
        .await
        .unwrap();
    assert_eq!(stdout, "hi\n");
}

/// The task finishes while its agent is down (restarting) and the
/// executor, which runs this one task, stops: it waits for the agent past
/// its grace period, re-subscribes with the TASK_FINISHED and exits 0 once
/// that is acknowledged. (It used to exit at once, leaving the agent to
/// report the task TASK_FAILED.)
#[tokio::test]
async fn a_task_that_finishes_while_the_agent_restarts_is_delivered() {
    let run = start_with(
        "1",
        &[("AGORA_CHECKPOINT", "1"), ("AGORA_RECOVERY_TIMEOUT", "30")],
    )
    .await;
    let mut ws = launch(&run, command_task("task-1", Some(shell("sleep 0.5")))).await;
    let Run {
        agent,
        mut child,
        sandbox: _sandbox,
    } = run;
    let addr = agent.listener.local_addr().unwrap();
    let running = recv_update(&mut ws).await;
    assert_eq!(running.state, TaskState::Running);

    // The agent goes down while the command runs, and stays down well
    // past the command's end and the executor's grace period.
    drop(ws);
    drop(agent);
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(
        child.try_wait().unwrap().is_none(),
        "the executor exited with its TASK_FINISHED undelivered"
    );

    // The agent is back on its port: the SUBSCRIBE carries what is
    // unacknowledged, the TASK_FINISHED last.
    let agent = FakeAgent {
        listener: tokio::net::TcpListener::bind(addr).await.unwrap(),
    };
    let mut ws = agent.accept().await;
    let updates = match recv(&mut ws).await {
        Call::Subscribe {
            unacknowledged_updates,
            ..
        } => unacknowledged_updates,
        other => panic!("expected SUBSCRIBE, got {other:?}"),
    };
    let states: Vec<TaskState> = updates.iter().map(|s| s.state).collect();
    assert_eq!(states.last(), Some(&TaskState::Finished), "{states:?}");
    send(&mut ws, &subscribed("task-1")).await;
    for status in &updates {
        ack(&mut ws, status).await;
    }
    assert_eq!(drain_until_closed(&mut ws).await, vec![]);
    assert_eq!(exit_code(&mut child).await, 0);
}

#[tokio::test]
async fn failing_command_reports_its_exit_status() {
    let mut run = start("5").await;
    let mut ws = launch(&run, command_task("task-1", Some(shell("exit 3")))).await;
    let running = recv_update(&mut ws).await;
    assert_eq!(running.state, TaskState::Running);
    let failed = recv_update(&mut ws).await;
    assert_eq!(failed.state, TaskState::Failed);
    assert_eq!(failed.reason, Some(Reason::ReasonCommandExecutorFailed));
    assert!(
        failed.message.as_deref().unwrap().contains('3'),
        "{failed:?}"
    );
    ack(&mut ws, &running).await;
    ack(&mut ws, &failed).await;
    assert_eq!(exit_code(&mut run.child).await, 0);
}

#[tokio::test]
async fn kill_terminates_the_process_group() {
    let mut run = start("5").await;
    // The shell leaves `sleep` running in the background, in its group.
    let script = "sleep 30 & echo $! > sleep.pid; wait";
    let mut ws = launch(&run, command_task("task-1", Some(shell(script)))).await;
    let running = recv_update(&mut ws).await;
    assert_eq!(running.state, TaskState::Running);
    ack(&mut ws, &running).await;

    let pid_file = run.sandbox.path().join("sleep.pid");
    let pid: i32 = timeout(STEP, async {
        loop {
            if let Ok(text) = std::fs::read_to_string(&pid_file) {
                if let Ok(pid) = text.trim().parse() {
                    return pid;
                }
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .expect("the command wrote the sleep's pid");

    let asked = std::time::Instant::now();
    send(
        &mut ws,
        &Event::Kill {
            task_id: TaskId::new("task-1"),
            grace_period_seconds: None,
        },
    )
    .await;
    let killed = recv_update(&mut ws).await;
    assert_eq!(killed.state, TaskState::Killed);
    assert!(
        asked.elapsed() < Duration::from_secs(3),
        "SIGTERM should end it well before the grace period"
    );
    ack(&mut ws, &killed).await;
    assert_eq!(exit_code(&mut run.child).await, 0);
    // The backgrounded sleep went with its group (a zombie waiting for
    // init counts as gone). The signal reached it with the group's, but on
    // a loaded machine it may take a moment to die.
    let gone = |stat: &str| {
        let state = stat
            .rsplit(')')
            .next()
            .unwrap_or("")
            .trim_start()
            .chars()
            .next();
        matches!(state, None | Some('Z') | Some('X'))
    };
    let deadline = std::time::Instant::now() + Duration::from_secs(3);
    let stat = loop {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        if gone(&stat) || std::time::Instant::now() > deadline {
            break stat;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert!(gone(&stat), "sleep {pid} still alive: {stat}");
}

#[tokio::test]
async fn task_without_command_and_second_launch_are_errors() {
    let mut run = start("5").await;
    let mut ws = launch(&run, command_task("task-1", Some(shell("sleep 30")))).await;
    assert_eq!(recv_update(&mut ws).await.state, TaskState::Running);
    send(
        &mut ws,
        &Event::Launch {
            task: command_task("task-2", None),
            sandbox: None,
            cgroups: Vec::new(),
            container: None,
        },
    )
    .await;
    let refused = recv_update(&mut ws).await;
    assert_eq!(refused.task_id, TaskId::new("task-2"));
    assert_eq!(refused.state, TaskState::Error);

    // SHUTDOWN kills the running task and the executor exits.
    send(
        &mut ws,
        &Event::Shutdown {
            grace_period_seconds: 2.0,
        },
    )
    .await;
    let killed = recv_update(&mut ws).await;
    assert_eq!(killed.task_id, TaskId::new("task-1"));
    assert_eq!(killed.state, TaskState::Killed);
    ack(&mut ws, &killed).await;
    assert_eq!(exit_code(&mut run.child).await, 0);
}

#[tokio::test]
async fn missing_environment_is_a_clear_error() {
    let output = Command::new(env!("CARGO_BIN_EXE_agora-command-executor"))
        .env_remove("AGORA_AGENT_ENDPOINT")
        .output()
        .await
        .unwrap();
    assert_eq!(output.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&output.stderr).contains("AGORA_AGENT_ENDPOINT"));
}

/// Given tasks with sandboxes of their own (as the agent gives them), the
/// executor runs them at once, each in its sandbox with its own output and
/// environment, and stays up between tasks until it is shut down.
#[tokio::test]
async fn many_tasks_run_in_their_own_sandboxes_until_shutdown() {
    let mut run = start("4").await;
    let mut ws = launch_none(&run).await;
    let dirs: Vec<tempfile::TempDir> = (0..3).map(|_| tempfile::tempdir().unwrap()).collect();
    let scripts = [
        "echo one; echo \"$AGORA_SANDBOX $MESOS_EXECUTOR_ID $PWD\"; echo err >&2",
        // A plain path: exec'd without a shell.
        "/bin/true",
        "sleep 30",
    ];
    for (i, script) in scripts.iter().enumerate() {
        send(
            &mut ws,
            &Event::Launch {
                task: command_task(&format!("t{i}"), Some(shell(script))),
                sandbox: Some(dirs[i].path().display().to_string()),
                cgroups: Vec::new(),
                container: None,
            },
        )
        .await;
    }
    let mut states: std::collections::HashMap<String, Vec<TaskState>> = Default::default();
    while states.values().map(Vec::len).sum::<usize>() < 5 {
        let update = recv_update(&mut ws).await;
        ack(&mut ws, &update).await;
        states
            .entry(update.task_id.to_string())
            .or_default()
            .push(update.state);
    }
    assert_eq!(states["t0"], vec![TaskState::Running, TaskState::Finished]);
    assert_eq!(states["t1"], vec![TaskState::Running, TaskState::Finished]);
    assert_eq!(states["t2"], vec![TaskState::Running]);
    let out = std::fs::read_to_string(dirs[0].path().join("stdout")).unwrap();
    let dir = dirs[0].path().display().to_string();
    assert_eq!(out, format!("one\n{dir} t0 {dir}\n"));
    let err = std::fs::read_to_string(dirs[0].path().join("stderr")).unwrap();
    assert_eq!(err, "err\n");
    assert!(dirs[1].path().join("stdout").exists());
    assert!(
        run.child.try_wait().unwrap().is_none(),
        "the executor stays up between tasks"
    );

    send(
        &mut ws,
        &Event::Kill {
            task_id: TaskId::new("t2"),
            grace_period_seconds: None,
        },
    )
    .await;
    let killed = recv_update(&mut ws).await;
    assert_eq!(
        (killed.task_id.as_str(), killed.state),
        ("t2", TaskState::Killed)
    );
    ack(&mut ws, &killed).await;
    assert!(run.child.try_wait().unwrap().is_none());
    send(
        &mut ws,
        &Event::Shutdown {
            grace_period_seconds: 2.0,
        },
    )
    .await;
    assert_eq!(drain_until_closed(&mut ws).await, vec![]);
    assert_eq!(exit_code(&mut run.child).await, 0);
}

/// Subscribes the executor without launching anything.
async fn launch_none(run: &Run) -> Conn {
    let mut ws = run.agent.accept().await;
    assert!(matches!(recv(&mut ws).await, Call::Subscribe { .. }));
    send(&mut ws, &subscribed("task-1")).await;
    ws
}
