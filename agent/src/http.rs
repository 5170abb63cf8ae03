//! The agent's port: the executor WebSocket at `/api/executor`, and HTTP
//! `/health`, `/state` and `/version`.
//!
//! An executor connection task only decodes, forwards to the core and
//! writes what the core sends back; the core checks tokens and owns all
//! state. Bad frames get a non-fatal `Error`; a frame over
//! [`agora_proto::MAX_FRAME_BYTES`] closes the connection with code 1009.

use agora_proto::executor::{Call, Event};
use axum::extract::ws::{CloseFrame, Message, WebSocket, WebSocketUpgrade};
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use tokio::sync::{mpsc, oneshot};

use crate::agent::CoreEvent;
use crate::Shared;

/// Events queued for one executor connection.
pub(crate) const EXECUTOR_OUTBOX: usize = 1024;

/// What the core sends to an executor connection.
#[derive(Debug)]
pub(crate) enum ExecOut {
    /// An event to write.
    Event(Box<Event>),
    /// Close the connection with this code and reason.
    Close { code: u16, reason: String },
}

#[derive(Clone)]
struct AppState {
    shared: Shared,
    core: mpsc::Sender<CoreEvent>,
}

/// The router for the agent's port.
pub(crate) fn router(shared: Shared, core: mpsc::Sender<CoreEvent>) -> Router {
    Router::new()
        .route("/api/executor", get(executor_ws))
        .route("/health", get(|| async { "ok" }))
        .route("/version", get(|| async { agora_proto::VERSION }))
        .route("/state", get(state))
        .with_state(AppState { shared, core })
}

async fn state(State(app): State<AppState>) -> Response {
    let (reply, rx) = oneshot::channel();
    if app.core.send(CoreEvent::State { reply }).await.is_err() {
        return (
            axum::http::StatusCode::SERVICE_UNAVAILABLE,
            "agent stopping",
        )
            .into_response();
    }
    match rx.await {
        Ok(v) => Json(v).into_response(),
        Err(_) => (
            axum::http::StatusCode::SERVICE_UNAVAILABLE,
            "agent stopping",
        )
            .into_response(),
    }
}

async fn executor_ws(ws: WebSocketUpgrade, State(app): State<AppState>) -> Response {
    ws.max_message_size(agora_proto::MAX_FRAME_BYTES)
        .max_frame_size(agora_proto::MAX_FRAME_BYTES)
        .on_upgrade(move |socket| serve_executor(socket, app))
}

async fn send_event(ws: &mut WebSocket, event: &Event) -> bool {
    ws.send(Message::text(agora_proto::encode(event)))
        .await
        .is_ok()
}

async fn close(ws: &mut WebSocket, code: u16, reason: String) {
    let _ = ws
        .send(Message::Close(Some(CloseFrame {
            code,
            reason: reason.into(),
        })))
        .await;
}

fn is_too_large(e: &axum::Error) -> bool {
    let text = e.to_string();
    text.contains("Space limit exceeded") || text.contains("too long") || text.contains("too big")
}

async fn serve_executor(mut ws: WebSocket, app: AppState) {
    let conn = app.shared.next_conn_id();
    let (tx, mut rx) = mpsc::channel::<ExecOut>(EXECUTOR_OUTBOX);
    let mut subscribed = false;
    loop {
        tokio::select! {
            out = rx.recv() => match out {
                Some(ExecOut::Event(event)) => {
                    let event = *event;
                    if !send_event(&mut ws, &event).await {
                        break;
                    }
                }
                Some(ExecOut::Close { code, reason }) => {
                    close(&mut ws, code, reason).await;
                    break;
                }
                None => break,
            },
            frame = ws.recv() => {
                let text = match frame {
                    None | Some(Ok(Message::Close(_))) => break,
                    Some(Err(e)) => {
                        if is_too_large(&e) {
                            close(
                                &mut ws,
                                1009,
                                format!("frame exceeds the {}-byte limit", agora_proto::MAX_FRAME_BYTES),
                            )
                            .await;
                        }
                        break;
                    }
                    Some(Ok(Message::Binary(_))) => {
                        let message = agora_proto::DecodeError::Binary.to_string();
                        if !send_event(&mut ws, &Event::Error { message, fatal: false }).await {
                            break;
                        }
                        continue;
                    }
                    Some(Ok(Message::Text(text))) => text,
                    Some(Ok(_)) => continue,
                };
                let call = match agora_proto::decode::<Call>(text.as_str()) {
                    Ok(call) => call,
                    Err(e) => {
                        if !send_event(&mut ws, &Event::Error { message: e.to_string(), fatal: false }).await {
                            break;
                        }
                        continue;
                    }
                };
                match call {
                    Call::Subscribe {
                        protocol,
                        framework_id,
                        executor_id,
                        token,
                        unacknowledged_updates,
                        unacknowledged_tasks,
                    } => {
                        if protocol != agora_proto::PROTOCOL_VERSION {
                            let message = format!(
                                "protocol version {protocol} is not supported; this agent speaks {}",
                                agora_proto::PROTOCOL_VERSION
                            );
                            send_event(&mut ws, &Event::Error { message: message.clone(), fatal: true }).await;
                            close(&mut ws, 1002, message).await;
                            break;
                        }
                        subscribed = true;
                        let event = CoreEvent::ExecutorSubscribe {
                            conn,
                            tx: tx.clone(),
                            framework_id,
                            executor_id,
                            token,
                            updates: unacknowledged_updates,
                            tasks: unacknowledged_tasks,
                        };
                        if app.core.send(event).await.is_err() {
                            break;
                        }
                    }
                    _ if !subscribed => {
                        let event = Event::Error { message: "subscribe first".to_string(), fatal: false };
                        if !send_event(&mut ws, &event).await {
                            break;
                        }
                    }
                    call => {
                        if app.core.send(CoreEvent::ExecutorCall { conn, call }).await.is_err() {
                            break;
                        }
                    }
                }
            }
        }
    }
    if subscribed {
        let _ = app
            .core
            .send(CoreEvent::ExecutorDisconnected { conn })
            .await;
    }
}
