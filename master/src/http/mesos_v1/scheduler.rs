//! `POST /api/v1/scheduler`: the Mesos v1 scheduler API.
//!
//! A SUBSCRIBE gets `200` at once with `Content-Type` equal to the codec
//! the request's `Accept` allows, a `Mesos-Stream-Id`, and a chunked body
//! of RecordIO records, one per HTTP chunk as libprocess writes them
//! (hyper writes the chunks that are ready together): SUBSCRIBED (then a
//! HEARTBEAT) or, when the master
//! refuses the framework, ERROR and the end of the stream. The stream is a
//! connection like a native WebSocket: it has a connection id in the
//! master, a bounded queue the state task writes to, and it is closed
//! (starting the framework's failover timeout) when the client goes away.
//! A new SUBSCRIBE of the same framework takes over: the old stream gets
//! ERROR and ends, as in Mesos.
//!
//! Every other call names the framework and carries its current stream id;
//! it is checked here (400 malformed or a field Agora does not carry out,
//! 403 not subscribed or authenticated as another principal than the
//! subscription, 415/406 media types, 413 too large, 501 unknown or
//! refused call type), translated, queued for the state task and answered
//! `202 Accepted` without waiting for its effects, which reach the
//! framework as events. An ACCEPT refused whole (an offer operation Agora
//! does not carry out, or a key it should not have) still has its effects
//! (its offers declined, its launches answered TASK_ERROR) and is
//! answered `400` naming why.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::sync::atomic::Ordering;

use agora_mesos_proto::convert::{self, Capabilities, ConvertError};
use agora_mesos_proto::support;
use agora_mesos_proto::{recordio, v1, Codec};
use agora_net::Connection;
use agora_proto::scheduler::{Call, Event};
use agora_proto::{AgentId, ExecutorId, FrameworkId, TaskId, PROTOCOL_VERSION};
use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{header, HeaderMap, HeaderValue, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Extension;
use std::sync::Arc;

use tokio::sync::{mpsc, watch};
use tokio_util::sync::CancellationToken;

use super::translate::{self, CallError, ExecutorTasks};
use super::{error, request_codec, response_codec, MesosState, StreamEntry, STREAM_ID};
use crate::http::{AppState, ConnHandle, Outbound};
use crate::master::{ConnId, Input};
use crate::state::StateSnapshot;

/// Most queued events taken from the queue at once (each is its own
/// chunk; hyper writes the ready chunks together).
const WRITE_BATCH: usize = 256;

pub(crate) async fn handle(
    State(state): State<MesosState>,
    method: Method,
    connection: Option<Extension<Connection>>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    if method != Method::POST {
        let mut response = error(
            StatusCode::METHOD_NOT_ALLOWED,
            format!("Expecting 'POST', received '{method}'"),
        );
        response
            .headers_mut()
            .insert(header::ALLOW, HeaderValue::from_static("POST"));
        return response;
    }
    let connection = connection.map(|Extension(c)| c);
    // Who it is, before a byte of the body is read.
    let principal = match state
        .app
        .auth
        .principal(state.app.auth.frameworks, &headers)
    {
        Ok(principal) => principal,
        Err(refusal) => return refusal,
    };
    if let (Some(_), Some(connection)) = (&principal, &connection) {
        connection.establish();
    }
    let codec = match request_codec(&headers) {
        Ok(codec) => codec,
        Err(response) => return response,
    };
    let bytes = match read_body(&state.app, body).await {
        Ok(bytes) => bytes,
        Err(response) => return response,
    };
    let call: v1::scheduler::Call = match codec.decode(&bytes) {
        Ok(call) => call,
        Err(e) => {
            state.app.metrics.errors_decode.inc();
            let message = format!("Failed to parse body into Call: {e}");
            // An ACCEPT refused for a key it should not have still names
            // its offers and tasks: they are given back and answered, as
            // for any ACCEPT refused whole, rather than held until the
            // offers time out.
            if let Some(call) = codec
                .decode_ignoring_unknown_keys::<v1::scheduler::Call>(&bytes)
                .filter(|c| c.r#type() == v1::scheduler::call::Type::Accept)
            {
                return other_call(state, &headers, call, connection, principal, Some(message))
                    .await;
            }
            return error(StatusCode::BAD_REQUEST, message);
        }
    };
    if call.r#type() == v1::scheduler::call::Type::Subscribe {
        subscribe(state, &headers, call, principal, connection).await
    } else {
        other_call(state, &headers, call, connection, principal, None).await
    }
}

/// Reads a request body of at most [`super::MAX_BODY_BYTES`] within the
/// master's body limits (413 for a larger one, declared or sent; 408 for
/// one that does not arrive in time).
#[allow(clippy::result_large_err)] // the error is the answer, built once
pub(crate) async fn read_body(app: &AppState, body: Body) -> Result<Bytes, Response> {
    app.bodies
        .read(body, super::MAX_BODY_BYTES)
        .await
        .map_err(IntoResponse::into_response)
}

async fn subscribe(
    state: MesosState,
    headers: &HeaderMap,
    call: v1::scheduler::Call,
    principal: Option<String>,
    connection: Option<Connection>,
) -> Response {
    if headers.contains_key(STREAM_ID) {
        return error(
            StatusCode::BAD_REQUEST,
            "Subscribe calls should not include the 'Mesos-Stream-Id' header",
        );
    }
    let codec = match response_codec(headers) {
        Ok(codec) => codec,
        Err(response) => return response,
    };
    // A field Agora does not carry out refuses the subscription, as an
    // invalid FrameworkInfo does (below).
    let refused = support::refusal(&call);
    let Some(subscribe) = call.subscribe else {
        return error(
            StatusCode::BAD_REQUEST,
            "Expecting 'subscribe' to be present",
        );
    };
    let info = &subscribe.framework_info;
    if call.framework_id != info.id {
        return error(
            StatusCode::BAD_REQUEST,
            "'framework_id' differs from 'subscribe.framework_info.id'",
        );
    }
    if let (Some(authenticated), Some(named)) = (&principal, &info.principal) {
        if authenticated != named {
            return error(
                StatusCode::FORBIDDEN,
                format!("Framework principal '{named}' is not the authenticated principal '{authenticated}'"),
            );
        }
    }
    let caps = Capabilities::of(info);
    let app = &state.app;
    let conn = app.next_conn.fetch_add(1, Ordering::Relaxed);
    let (tx, rx) = mpsc::channel::<Outbound>(app.queue_capacity);
    let cancel = app.shutdown.child_token();
    app.registry.insert(
        conn,
        ConnHandle {
            tx: tx.clone(),
            cancel: cancel.clone(),
        },
    );
    let stream_id = uuid::Uuid::new_v4().to_string();
    let ended = CancellationToken::new();
    if let Some(connection) = &connection {
        cut_off_when_cancelled(&state, conn, connection.clone(), &cancel, &ended);
    }
    let guard = StreamGuard {
        conn,
        stream_id: stream_id.clone(),
        framework: None,
        principal: principal.clone(),
        state: state.clone(),
        connection,
        _ended: ended.drop_guard(),
    };
    let converted = match refused {
        Some(refusal) => Err(ConvertError::from(refusal)),
        None => convert::framework_info(info),
    };
    match converted {
        Ok(mut framework_info) => {
            if principal.is_some() {
                framework_info.principal = principal;
            }
            tracing::info!(conn, name = %framework_info.name, id = ?framework_info.id, "Mesos scheduler subscribing");
            let input = Input::Scheduler {
                conn,
                call: Call::Subscribe {
                    protocol: PROTOCOL_VERSION,
                    framework_info,
                    // Mesos semantics: a new subscription of a connected
                    // framework is a failover and takes over.
                    force: true,
                },
            };
            if app.inputs.send(input).await.is_err() {
                return error(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "the master is shutting down",
                );
            }
        }
        Err(e) => {
            // FrameworkInfo problems are 200 + ERROR + end of stream in Mesos.
            let message = format!("Subscription refused: {e}");
            let _ = tx.try_send(Outbound::Scheduler(Box::new(Event::Error {
                message: message.clone(),
                fatal: true,
            })));
            let _ = tx.try_send(Outbound::Close {
                code: crate::master::CLOSE_POLICY,
                reason: message,
            });
        }
    }
    drop(tx);
    let subscription = Subscription {
        rx,
        cancel,
        codec,
        caps,
        guard,
        pending: VecDeque::new(),
        record: Vec::new(),
        closing: false,
        last_was_heartbeat: false,
    };
    let body = Body::from_stream(futures::stream::unfold(subscription, Subscription::next));
    let mut response = (StatusCode::OK, body).into_response();
    let h = response.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static(codec.media_type()),
    );
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    if let Ok(value) = HeaderValue::from_str(&stream_id) {
        h.insert(STREAM_ID, value);
    }
    response
}

/// When the master gives up on the stream `conn` (its queue is full: the
/// client does not read its events) and is not shutting down, the
/// connection is closed and counted: hyper may not be polling the stream
/// to see its end (the socket is full), and a stream nobody reads holds
/// the master's memory.
fn cut_off_when_cancelled(
    state: &MesosState,
    conn: ConnId,
    connection: Connection,
    cancel: &CancellationToken,
    ended: &CancellationToken,
) {
    let (cancel, ended) = (cancel.clone(), ended.clone());
    let app = state.app.clone();
    tokio::spawn(async move {
        tokio::select! {
            () = cancel.cancelled() => {
                if !app.shutdown.is_cancelled() {
                    app.metrics.streams_cut_scheduler_v1.inc();
                    tracing::warn!(conn, peer = %connection.peer(), "Mesos scheduler stream cut off: its client is not reading its events; connection closed");
                    connection.close();
                }
            }
            () = ended.cancelled() => {}
        }
    });
}

/// Every call but SUBSCRIBE; `refused`: the reason an ACCEPT is refused
/// whole before its translation (see [`handle`]).
async fn other_call(
    state: MesosState,
    headers: &HeaderMap,
    mut call: v1::scheduler::Call,
    connection: Option<Connection>,
    principal: Option<String>,
    refused: Option<String>,
) -> Response {
    let Some(framework_id) = call.framework_id.take() else {
        return error(
            StatusCode::BAD_REQUEST,
            "Expecting 'framework_id' to be present",
        );
    };
    let Some(stream_id) = headers.get(STREAM_ID).and_then(|v| v.to_str().ok()) else {
        return error(
            StatusCode::BAD_REQUEST,
            "All non-subscribe calls should include the 'Mesos-Stream-Id' header",
        );
    };
    let fid = FrameworkId::new(framework_id.value);
    let conn = match state.streams.get(&fid) {
        None => {
            return error(
                StatusCode::FORBIDDEN,
                format!("Framework {fid} is not subscribed"),
            )
        }
        Some(entry) if entry.stream_id != stream_id => {
            return error(
                StatusCode::BAD_REQUEST,
                format!("The stream ID '{stream_id}' included in this request didn't match the stream ID currently associated with framework ID {fid}"),
            )
        }
        // A stream id is no credential: a call must come from the
        // principal that subscribed (as in Mesos).
        Some(entry) if principal.is_some() && entry.principal != principal => {
            return error(
                StatusCode::FORBIDDEN,
                format!(
                    "The authenticated principal '{}' is not the principal of framework {fid}",
                    principal.unwrap_or_default()
                ),
            )
        }
        Some(entry) => entry.conn,
    };
    // The call names its framework's live stream: a framework's connection.
    if let Some(connection) = connection {
        connection.establish();
    }
    let translated = match (refused, call.accept.take()) {
        (Some(message), Some(accept)) => translate::refused_accept(accept, message),
        (Some(message), None) => return error(StatusCode::BAD_REQUEST, message),
        (None, accept) => {
            call.accept = accept;
            match translate::translate_call(&fid, call, &SnapshotTasks(&state.app.snapshot)) {
                Ok(t) => t,
                Err(CallError::BadRequest(m)) => return error(StatusCode::BAD_REQUEST, m),
                Err(CallError::NotImplemented(m)) => return error(StatusCode::NOT_IMPLEMENTED, m),
            }
        }
    };
    if !translated.refused.is_empty() {
        if let Some(handle) = state.app.registry.get(&conn) {
            for status in translated.refused {
                let _ = handle
                    .tx
                    .try_send(Outbound::Scheduler(Box::new(Event::Update { status })));
            }
        }
    }
    let answer = translated.error;
    for call in translated.calls {
        let input = Input::Scheduler { conn, call };
        // Most calls find room in the queue: no permit future to build
        // and poll for them; a full queue is waited on (backpressure).
        let sent = match state.app.inputs.try_send(input) {
            Ok(()) => Ok(()),
            Err(mpsc::error::TrySendError::Full(input)) => {
                state.app.inputs.send(input).await.map_err(drop)
            }
            Err(mpsc::error::TrySendError::Closed(_)) => Err(()),
        };
        if sent.is_err() {
            return error(
                StatusCode::SERVICE_UNAVAILABLE,
                "the master is shutting down",
            );
        }
    }
    match answer {
        None => StatusCode::ACCEPTED.into_response(),
        Some(CallError::BadRequest(m)) => error(StatusCode::BAD_REQUEST, m),
        Some(CallError::NotImplemented(m)) => error(StatusCode::NOT_IMPLEMENTED, m),
    }
}

/// A framework's live tasks by executor, from the latest snapshot (looked
/// at only by the calls that need it: most calls, ACKNOWLEDGE first, do
/// not).
struct SnapshotTasks<'a>(&'a watch::Receiver<Arc<StateSnapshot>>);

impl ExecutorTasks for SnapshotTasks<'_> {
    fn executor_tasks(
        &self,
        framework: &FrameworkId,
        agent: &AgentId,
        executor: &ExecutorId,
    ) -> Vec<TaskId> {
        let snapshot = self.0.borrow().clone();
        snapshot
            .frameworks
            .iter()
            .filter(|f| f.id == *framework)
            .flat_map(|f| f.tasks.iter())
            .filter(|t| {
                t.agent_id == *agent && t.executor_id == *executor && !t.state.is_terminal()
            })
            .map(|t| t.id.clone())
            .collect()
    }
}

/// One subscription stream: what the state task queues for the
/// connection, translated, encoded and framed.
struct Subscription {
    rx: mpsc::Receiver<Outbound>,
    cancel: CancellationToken,
    codec: Codec,
    caps: Capabilities,
    guard: StreamGuard,
    pending: VecDeque<Bytes>,
    /// One event's encoding, reused from event to event.
    record: Vec<u8>,
    closing: bool,
    last_was_heartbeat: bool,
}

/// Forgets the stream when it ends, however it ends (the client went
/// away, the master closed it, shutdown): the connection is removed and
/// the state task told, as for a closed WebSocket.
struct StreamGuard {
    conn: ConnId,
    stream_id: String,
    framework: Option<FrameworkId>,
    principal: Option<String>,
    state: MesosState,
    connection: Option<Connection>,
    /// Ends the cut-off watch with the stream.
    _ended: tokio_util::sync::DropGuard,
}

// === impl Subscription ===

impl Subscription {
    async fn next(mut self) -> Option<(Result<Bytes, Infallible>, Self)> {
        loop {
            if let Some(chunk) = self.pending.pop_front() {
                return Some((Ok(chunk), self));
            }
            if self.closing {
                return None;
            }
            let first = tokio::select! {
                biased;
                out = self.rx.recv() => out,
                _ = self.cancel.cancelled() => None,
            };
            let first = first?;
            // Everything already queued is taken at once, one record per
            // chunk as libprocess writes them (clients such as mesos-go's
            // and pymesos's decode the records of a chunk one by one, and
            // some read one per chunk); hyper writes the chunks that are
            // ready together, so a burst is still one socket write.
            let mut next = Some(first);
            let mut taken = 0;
            let mut records = 0;
            while let Some(out) = next.take() {
                records += self.write(out);
                taken += 1;
                if self.closing || taken >= WRITE_BATCH {
                    break;
                }
                next = self.rx.try_recv().ok();
            }
            if records > 0 {
                // Line-reading JSON clients (mesoshttp) hand an event over
                // only once the next record begins: a HEARTBEAT after each
                // burst delivers the burst now rather than at the next
                // heartbeat interval.
                if self.codec == Codec::Json && !self.last_was_heartbeat && !self.closing {
                    if let Ok(bytes) = self.codec.encode(&translate::heartbeat()) {
                        self.pending.push_back(Bytes::from(recordio::frame(&bytes)));
                        self.last_was_heartbeat = true;
                    }
                }
            }
        }
    }

    /// Queues `out`'s records, one chunk each; how many.
    fn write(&mut self, out: Outbound) -> usize {
        let event = match out {
            Outbound::Scheduler(event) => *event,
            Outbound::Close { .. } => {
                self.closing = true;
                return 0;
            }
            Outbound::Agent(_) => return 0,
        };
        if let Event::Subscribed { framework_id, .. } = &event {
            self.guard.subscribed(framework_id.clone());
        }
        let mut records = 0;
        for mesos in translate::translate_event(event, self.caps) {
            self.last_was_heartbeat = mesos.r#type() == v1::scheduler::event::Type::Heartbeat;
            self.record.clear();
            match self.codec.encode_into(&mesos, &mut self.record) {
                Ok(()) => {
                    self.pending
                        .push_back(Bytes::from(recordio::frame(&self.record)));
                    records += 1;
                }
                Err(e) => {
                    tracing::error!(error = %e, "cannot encode a Mesos scheduler event; dropped")
                }
            }
        }
        let metrics = &self.guard.state.app.metrics;
        metrics.frames_out_scheduler.inc();
        records
    }
}

// === impl StreamGuard ===

impl StreamGuard {
    /// The master accepted the subscription: calls naming this stream id
    /// now reach this connection.
    fn subscribed(&mut self, framework: FrameworkId) {
        self.state.streams.insert(
            framework.clone(),
            StreamEntry {
                stream_id: self.stream_id.clone(),
                conn: self.conn,
                principal: self.principal.clone(),
            },
        );
        self.framework = Some(framework);
        if let Some(connection) = &self.connection {
            connection.establish();
        }
    }
}

impl Drop for StreamGuard {
    fn drop(&mut self) {
        let app = &self.state.app;
        app.registry.remove(&self.conn);
        if let Some(fid) = &self.framework {
            self.state
                .streams
                .remove_if(fid, |_, e| e.stream_id == self.stream_id);
        }
        tracing::debug!(conn = self.conn, "Mesos scheduler stream ended");
        let closed = Input::SchedulerClosed { conn: self.conn };
        if let Err(mpsc::error::TrySendError::Full(closed)) = app.inputs.try_send(closed) {
            if let Ok(runtime) = tokio::runtime::Handle::try_current() {
                let inputs = app.inputs.clone();
                runtime.spawn(async move {
                    let _ = inputs.send(closed).await;
                });
            }
        }
    }
}
