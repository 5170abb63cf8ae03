//! A command task's `CommandInfo.uris`, fetched into the task's own
//! sandbox before its command starts, by an in-process agent running the
//! real command executor (`agora-command-executor`, built beside this
//! package's binaries by `cargo build --workspace --bins`): the command
//! runs what was fetched, and a URI that cannot be fetched fails the task
//! with a message naming it.

mod support;

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use agora_proto::agent::{Call as AgentCall, Event as AgentEvent};
use agora_proto::{FetchUri, Reason, TaskInfo, TaskState, TaskStatus};
use support::*;

/// The real command executor, next to this package's `agora-agent`.
fn command_executor() -> PathBuf {
    let path = Path::new(env!("CARGO_BIN_EXE_agora-agent"))
        .parent()
        .expect("binary dir")
        .join("agora-command-executor");
    assert!(
        path.is_file(),
        "{} is missing: run `cargo build --workspace --bins` before the tests",
        path.display()
    );
    path
}

fn task_with_uri(id: &str, command: &str, uri: &str) -> TaskInfo {
    let mut task = command_task(id);
    let info = task.command.as_mut().expect("a command task");
    info.value = command.into();
    info.uris = vec![FetchUri {
        value: uri.into(),
        executable: true,
        extract: true,
        output_file: None,
    }];
    task
}

/// The task's updates (acknowledged) up to its terminal one.
async fn updates_until_terminal(conn: &mut MasterConn) -> Vec<TaskStatus> {
    let mut updates = Vec::new();
    loop {
        match conn.recv().await {
            AgentCall::StatusUpdate {
                framework_id,
                status,
            } => {
                conn.send(&AgentEvent::Acknowledge {
                    framework_id,
                    task_id: status.task_id.clone(),
                    uuid: status.uuid.clone().expect("reliable update has uuid"),
                })
                .await;
                let terminal = status.state.is_terminal();
                updates.push(status);
                if terminal {
                    return updates;
                }
            }
            _ => continue,
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_command_task_runs_the_file_its_uri_fetched() {
    let dir = tempfile::tempdir().unwrap();
    let work = dir.path().join("work");
    // Not executable where it is: `executable` makes the fetched copy so.
    let script = dir.path().join("hello.sh");
    std::fs::write(&script, "#!/bin/sh\necho fetched > ran.txt\n").unwrap();
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o644)).unwrap();
    let master = FakeMaster::bind().await;
    let agent = Agent::start(config(&master.addr(), &work, &command_executor())).await;
    let mut conn = master.accept().await;
    conn.register("agent-1").await;

    // Checkpointing: the task waits for both its checkpoint and its URIs.
    let task = task_with_uri(
        "fetched",
        "./hello.sh && test \"$(cat ran.txt)\" = fetched",
        &script.display().to_string(),
    );
    conn.send(&AgentEvent::RunTask {
        framework: framework("fw", true),
        task,
    })
    .await;
    let updates = updates_until_terminal(&mut conn).await;
    let last = updates.last().unwrap();
    assert_eq!(last.state, TaskState::Finished, "{updates:?}");
    assert!(updates.iter().any(|u| u.state == TaskState::Running));
    agent.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_command_task_whose_uri_cannot_be_fetched_fails_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let work = dir.path().join("work");
    let master = FakeMaster::bind().await;
    let agent = Agent::start(config(&master.addr(), &work, &command_executor())).await;
    let mut conn = master.accept().await;
    conn.register("agent-1").await;

    let missing = dir.path().join("no-such-script.sh").display().to_string();
    conn.send(&AgentEvent::RunTask {
        framework: framework("fw", false),
        task: task_with_uri("unfetchable", "./no-such-script.sh", &missing),
    })
    .await;
    let updates = updates_until_terminal(&mut conn).await;
    assert_eq!(updates.len(), 1, "it never ran: {updates:?}");
    let failed = &updates[0];
    assert_eq!(failed.state, TaskState::Failed);
    assert_eq!(failed.reason, Some(Reason::ReasonExecutorLaunchFailed));
    let message = failed.message.as_deref().unwrap_or_default();
    assert!(
        message.contains(&format!("failed to fetch URI '{missing}'")),
        "{message}"
    );

    // A task without URIs still runs on the same agent.
    let mut plain = command_task("plain");
    plain.command.as_mut().unwrap().value = "true".into();
    conn.send(&AgentEvent::RunTask {
        framework: framework("fw", false),
        task: plain,
    })
    .await;
    let updates = updates_until_terminal(&mut conn).await;
    assert_eq!(
        updates.last().unwrap().state,
        TaskState::Finished,
        "{updates:?}"
    );
    agent.stop().await;
}
