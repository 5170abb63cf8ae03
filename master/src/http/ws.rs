//! One WebSocket connection: a reader that decodes frames and forwards
//! calls to the state task (answering undecodable frames itself), and a
//! writer that drains the connection's bounded outbound queue.

use std::sync::atomic::Ordering;
use std::time::Duration;

use agora_proto::{agent, decode, encode, scheduler, DecodeError, MAX_FRAME_BYTES};
use axum::extract::ws::{CloseFrame, Message, WebSocket};
use futures::{SinkExt, StreamExt};
use tokio::sync::mpsc;

use super::{AppState, ConnHandle, Kind, Outbound};
use crate::master::Input;

/// Close code for a frame over the size cap.
const CLOSE_TOO_BIG: u16 = 1009;
/// Close code when the master shuts down.
const CLOSE_GOING_AWAY: u16 = 1001;
/// How long a closing connection may take to flush what is queued.
const FLUSH_TIMEOUT: Duration = Duration::from_secs(5);
/// Most queued frames written with one flush.
const WRITE_BATCH: usize = 256;

/// Sleeps until `at`, or forever.
async fn sleep_until_opt(at: Option<tokio::time::Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// Serves one connection of `kind`; `principal` is who it authenticated
/// as (a scheduler's `SUBSCRIBE` must then name it, or is given it).
pub(crate) async fn serve(
    socket: WebSocket,
    kind: Kind,
    app: AppState,
    principal: Option<String>,
    connection: Option<agora_net::Connection>,
) {
    let conn = app.next_conn.fetch_add(1, Ordering::Relaxed);
    let (tx, mut rx) = mpsc::channel::<Outbound>(app.queue_capacity);
    let cancel = app.shutdown.child_token();
    app.registry.insert(
        conn,
        ConnHandle {
            tx: tx.clone(),
            cancel: cancel.clone(),
        },
    );
    tracing::debug!(conn, ?kind, "connection opened");
    if let Some(connection) = &connection {
        // A message's bytes are charged to the body budget until it is
        // whole, and it has the body deadline to arrive.
        connection.meter_messages(&app.bodies, MAX_FRAME_BYTES);
    }
    let (mut sink, mut stream) = socket.split();

    let writer_cancel = cancel.clone();
    let shutdown = app.shutdown.clone();
    let metrics = app.metrics.clone();
    let mut writer = tokio::spawn(async move {
        loop {
            let next = tokio::select! {
                biased;
                next = rx.recv() => next,
                _ = writer_cancel.cancelled() => {
                    let (code, reason) = if shutdown.is_cancelled() {
                        (CLOSE_GOING_AWAY, "master shutting down")
                    } else {
                        metrics.errors_slow_peer.inc();
                        (1008, "peer is not reading its events")
                    };
                    let frame = Message::Close(Some(CloseFrame { code, reason: reason.into() }));
                    let _ = tokio::time::timeout(Duration::from_secs(1), sink.send(frame)).await;
                    break;
                }
            };
            let Some(mut out) = next else { break };
            // Everything already queued goes out with one flush: a burst
            // of events costs one write, not one per frame.
            let mut queued = 0;
            let mut last = false;
            let mut sent = loop {
                let message = match out {
                    Outbound::Scheduler(event) => Message::Text(encode(&*event).into()),
                    Outbound::Agent(event) => Message::Text(encode(&*event).into()),
                    Outbound::Close { code, reason } => {
                        last = true;
                        Message::Close(Some(CloseFrame {
                            code,
                            reason: reason.into(),
                        }))
                    }
                };
                let fed = tokio::select! {
                    r = sink.feed(message) => r.is_ok(),
                    _ = writer_cancel.cancelled() => false,
                };
                if !fed || last {
                    break fed;
                }
                match kind {
                    Kind::Scheduler => metrics.frames_out_scheduler.inc(),
                    Kind::Agent => metrics.frames_out_agent.inc(),
                }
                queued += 1;
                if queued >= WRITE_BATCH {
                    break true;
                }
                match rx.try_recv() {
                    Ok(more) => out = more,
                    Err(_) => break true,
                }
            };
            if sent {
                sent = tokio::select! {
                    r = sink.flush() => r.is_ok(),
                    _ = writer_cancel.cancelled() => false,
                };
            }
            if !sent || last {
                break;
            }
        }
        // The reader stops too: a connection we stopped writing is done.
        writer_cancel.cancel();
    });

    // The first frame (SUBSCRIBE, REGISTER) must come in time: a peer
    // that connects and says nothing does not hold a connection forever.
    let mut first_frame_by = Some(tokio::time::Instant::now() + app.first_frame_timeout);
    loop {
        let frame = tokio::select! {
            _ = cancel.cancelled() => break,
            frame = stream.next() => frame,
            () = sleep_until_opt(first_frame_by) => {
                tracing::info!(conn, ?kind, timeout = ?app.first_frame_timeout, "no first frame in time; closing");
                let _ = tx.try_send(Outbound::Close {
                    code: 1008,
                    reason: format!(
                        "nothing received within {:?} of connecting",
                        app.first_frame_timeout
                    ),
                });
                break;
            }
        };
        if let (Some(Ok(_)), Some(connection)) = (&frame, &connection) {
            connection.message_done();
        }
        if let Some(Ok(Message::Text(_) | Message::Binary(_))) = &frame {
            first_frame_by = None;
        }
        if let Some(Ok(Message::Text(_) | Message::Binary(_))) = &frame {
            match kind {
                Kind::Scheduler => app.metrics.frames_in_scheduler.inc(),
                Kind::Agent => app.metrics.frames_in_agent.inc(),
            }
        }
        match frame {
            None | Some(Ok(Message::Close(_))) => break,
            Some(Ok(Message::Text(text))) => match parse(kind, conn, text.as_str())
                .and_then(|input| refuse_unknown_fields(input, text.as_str(), &tx))
                .and_then(|input| bind_principal(input, principal.as_deref()))
            {
                Ok(input) => {
                    if let Some(connection) = &connection {
                        // A subscription or a registration: a framework's
                        // or an agent's connection.
                        if matches!(
                            input,
                            Input::Scheduler {
                                call: scheduler::Call::Subscribe { .. },
                                ..
                            } | Input::Agent {
                                call: agent::Call::Register { .. },
                                ..
                            }
                        ) {
                            connection.establish();
                        }
                    }
                    let forwarded = tokio::select! {
                        r = app.inputs.send(input) => r.is_ok(),
                        _ = cancel.cancelled() => false,
                    };
                    if !forwarded {
                        break;
                    }
                }
                Err(Refusal { message, fatal }) => {
                    app.metrics.errors_decode.inc();
                    let _ = tx.try_send(error_event(kind, message.clone(), fatal));
                    if fatal {
                        let _ = tx.try_send(Outbound::Close {
                            code: 1008,
                            reason: crate::master::truncate_reason(&message),
                        });
                        break;
                    }
                }
            },
            Some(Ok(Message::Binary(_))) => {
                app.metrics.errors_decode.inc();
                let _ = tx.try_send(error_event(kind, DecodeError::Binary.to_string(), false));
            }
            Some(Ok(_)) => {}
            Some(Err(e)) => {
                let text = e.to_string();
                if text.contains("Space limit exceeded") || text.contains("too long") {
                    tracing::info!(conn, error = %text, "frame over the size limit; closing the connection");
                    app.metrics.errors_frame_too_large.inc();
                    let _ = tx.try_send(Outbound::Close {
                        code: CLOSE_TOO_BIG,
                        reason: format!("frame exceeds the {MAX_FRAME_BYTES}-byte limit"),
                    });
                } else {
                    tracing::debug!(conn, error = %text, "connection read failed");
                }
                break;
            }
        }
    }
    app.registry.remove(&conn);
    drop(tx);
    if tokio::time::timeout(FLUSH_TIMEOUT, &mut writer)
        .await
        .is_err()
    {
        writer.abort();
    }
    let closed = match kind {
        Kind::Scheduler => Input::SchedulerClosed { conn },
        Kind::Agent => Input::AgentClosed { conn },
    };
    // Even during shutdown, try: the state task may still be running.
    let _ = tokio::time::timeout(FLUSH_TIMEOUT, app.inputs.send(closed)).await;
    tracing::debug!(conn, ?kind, "connection closed");
}

struct Refusal {
    message: String,
    fatal: bool,
}

/// A scheduler's `SUBSCRIBE` on a connection authenticated as
/// `principal` takes that principal: one naming another is refused
/// (fatal), as Mesos refuses a framework whose principal differs from the
/// one it authenticated. An agent's `REGISTER` carries the connection's
/// principal to the master, which binds the agent id to it.
fn bind_principal(mut input: Input, principal: Option<&str>) -> Result<Input, Refusal> {
    if let Input::Agent {
        call: agent::Call::Register { .. },
        principal: bound,
        ..
    } = &mut input
    {
        *bound = principal.map(str::to_string);
        return Ok(input);
    }
    let (
        Some(principal),
        Input::Scheduler {
            call: scheduler::Call::Subscribe { framework_info, .. },
            ..
        },
    ) = (principal, &mut input)
    else {
        return Ok(input);
    };
    match &framework_info.principal {
        Some(named) if named != principal => Err(Refusal {
            message: format!(
                "framework principal {named:?} is not the authenticated principal {principal:?}"
            ),
            fatal: true,
        }),
        _ => {
            framework_info.principal = Some(principal.to_string());
            Ok(input)
        }
    }
}

fn parse(kind: Kind, conn: u64, text: &str) -> Result<Input, Refusal> {
    match kind {
        Kind::Scheduler => decode::<scheduler::Call>(text)
            .map(|call| Input::Scheduler { conn, call })
            .map_err(|e| Refusal {
                message: e.to_string(),
                fatal: false,
            }),
        Kind::Agent => decode::<agent::Call>(text)
            .map(|call| Input::Agent {
                conn,
                call,
                principal: None,
            })
            .map_err(|e| {
                // A registration that does not parse (e.g. impossible
                // resources) is refused outright.
                let is_register = serde_json::from_str::<serde_json::Value>(text)
                    .ok()
                    .and_then(|v| {
                        v.get("type")
                            .and_then(|t| t.as_str())
                            .map(|t| t == "REGISTER")
                    })
                    .unwrap_or(false);
                if is_register && matches!(e, DecodeError::Malformed(_)) {
                    Refusal {
                        message: format!("registration refused: {e}"),
                        fatal: true,
                    }
                } else {
                    Refusal {
                        message: e.to_string(),
                        fatal: false,
                    }
                }
            }),
    }
}

/// Refuses the keys of a scheduler call that no field of Agora's types
/// has (`scheduler::unknown_fields`): a task with one gets `TASK_ERROR`
/// (`REASON_TASK_INVALID`) naming it, on this connection, and is left out
/// of the launch (a launch left with no task declines its offers); one
/// elsewhere refuses the call (a subscription fatally).
fn refuse_unknown_fields(
    input: Input,
    text: &str,
    tx: &mpsc::Sender<Outbound>,
) -> Result<Input, Refusal> {
    use agora_proto::{Reason, Source, TaskState, TaskStatus};
    use scheduler::Call;
    let Input::Scheduler { conn, mut call } = input else {
        return Ok(input);
    };
    // Only calls that carry records can hold such keys (the others'
    // bodies deny unknown keys as they decode).
    if !matches!(
        call,
        Call::Subscribe { .. }
            | Call::Launch { .. }
            | Call::Decline { .. }
            | Call::Reconcile { .. }
            | Call::Request { .. }
    ) {
        return Ok(Input::Scheduler { conn, call });
    }
    let unknown = scheduler::unknown_fields(text);
    if let Some(path) = unknown.call {
        let subscribing = matches!(call, Call::Subscribe { .. });
        let message = format!("{path} is not a field Agora knows; the call is refused");
        return Err(Refusal {
            message: if subscribing {
                format!("subscription refused: {message}")
            } else {
                message
            },
            fatal: subscribing,
        });
    }
    if let Call::Launch { tasks, .. } = &mut call {
        let mut refused = Vec::new();
        for (index, path) in unknown.tasks.iter().rev() {
            if *index >= tasks.len() {
                continue;
            }
            refused.push((tasks.remove(*index), path));
        }
        for (task, path) in refused.into_iter().rev() {
            let mut status = TaskStatus::new(task.task_id, TaskState::Error, Source::SourceMaster)
                .with_reason(Reason::ReasonTaskInvalid)
                .with_message(format!("TaskInfo.{path} is not a field Agora knows"));
            status.agent_id = Some(task.agent_id);
            let _ = tx.try_send(Outbound::Scheduler(Box::new(scheduler::Event::Update {
                status,
            })));
        }
    }
    Ok(Input::Scheduler { conn, call })
}

fn error_event(kind: Kind, message: String, fatal: bool) -> Outbound {
    match kind {
        Kind::Scheduler => {
            Outbound::Scheduler(Box::new(scheduler::Event::Error { message, fatal }))
        }
        Kind::Agent => Outbound::Agent(Box::new(agent::Event::Error { message, fatal })),
    }
}
