//! `hasty-executor`: an executor that exits the moment its updates are
//! written. For the one task it is given it sends TASK_RUNNING and
//! TASK_FINISHED and exits at once, without waiting for the agent's
//! acknowledgements. Tests start thousands of them to check that the
//! agent reports the state an executor sent, not its exit, however soon
//! the exit follows.
//!
//! It speaks the executor protocol over a raw WebSocket (no SDK, whose
//! driver waits for acknowledgements before it stops).

use std::process::ExitCode;

use agora_proto::executor::{Call, Event};
use agora_proto::{Source, TaskState, TaskStatus};
use futures::{SinkExt, StreamExt};
use tokio_tungstenite::tungstenite::Message;

async fn run() -> Result<(), String> {
    // The SDK's reading of what the agent gives (its token comes on a
    // descriptor, not in the environment).
    let config = agora_executor::ExecutorConfig::from_env().map_err(|e| e.to_string())?;
    let endpoint = config.agent_endpoint;
    let framework_id = config.framework_id;
    let executor_id = config.executor_id;
    let token = config.token;
    let (ws, _) = tokio_tungstenite::connect_async(endpoint.as_str())
        .await
        .map_err(|e| format!("connecting to {endpoint}: {e}"))?;
    let (mut sink, mut stream) = ws.split();
    let subscribe = Call::Subscribe {
        protocol: agora_proto::PROTOCOL_VERSION,
        framework_id,
        executor_id: executor_id.clone(),
        token,
        unacknowledged_updates: Vec::new(),
        unacknowledged_tasks: Vec::new(),
    };
    sink.send(Message::text(agora_proto::encode(&subscribe)))
        .await
        .map_err(|e| e.to_string())?;
    let mut agent_id = None;
    while let Some(frame) = stream.next().await {
        let Message::Text(text) = frame.map_err(|e| e.to_string())? else {
            continue;
        };
        match agora_proto::decode::<Event>(text.as_str()).map_err(|e| e.to_string())? {
            Event::Subscribed { agent_id: id, .. } => agent_id = Some(id),
            Event::Launch { task, .. } => {
                for state in [TaskState::Running, TaskState::Finished] {
                    let mut status =
                        TaskStatus::new(task.task_id.clone(), state, Source::SourceExecutor)
                            .with_new_uuid();
                    status.executor_id = Some(executor_id.clone());
                    status.agent_id = agent_id.clone();
                    sink.feed(Message::text(agora_proto::encode(&Call::Update { status })))
                        .await
                        .map_err(|e| e.to_string())?;
                }
                // Written to the socket: now go, acknowledged or not.
                sink.flush().await.map_err(|e| e.to_string())?;
                return Ok(());
            }
            Event::Shutdown { .. } => return Ok(()),
            Event::Error {
                message,
                fatal: true,
            } => return Err(message),
            _ => {}
        }
    }
    Err("the agent closed the connection before a task arrived".into())
}

fn main() -> ExitCode {
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("hasty-executor: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run()) {
        // Exit without running destructors or closing the WebSocket
        // politely: as abrupt as an executor can be once its updates are
        // written.
        Ok(()) => std::process::exit(0),
        Err(e) => {
            eprintln!("hasty-executor: {e}");
            ExitCode::FAILURE
        }
    }
}
