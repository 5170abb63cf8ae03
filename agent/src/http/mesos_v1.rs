//! The Mesos v1 executor API, `POST /api/v1/executor`: the agent's second
//! front door for executors, beside Agora's WebSocket, onto the same core
//! machinery (subscription, checkpointed and acknowledged status updates,
//! messages, launches, kills, shutdown).
//!
//! - `SUBSCRIBE` answers `200` with a chunked RecordIO stream whose
//!   `Content-Type` is the codec the `Accept` header chose (JSON, else
//!   protobuf): `SUBSCRIBED` first, then the events Mesos sends
//!   (`LAUNCH`, `LAUNCH_GROUP`, `KILL`, `ACKNOWLEDGED` once an update is
//!   checkpointed, `MESSAGE`, `SHUTDOWN`, `ERROR`), translated from the
//!   core's native events by `agora_mesos_proto::executor`, and a
//!   `HEARTBEAT` every `--executor-heartbeat-interval` (30 minutes, as
//!   Mesos; the first one that long after `SUBSCRIBED`), which the stream
//!   writes on its own. A subscription's
//!   `unacknowledged_updates` and `unacknowledged_tasks` go to the core
//!   as a native re-subscription's do. The stream is the connection: when
//!   it ends the core hears the executor disconnected.
//! - `UPDATE`, `MESSAGE` and `HEARTBEAT` come on requests of their own and
//!   are answered `202 Accepted` with an empty body once handed to the
//!   core; they belong to the executor's current subscription.
//!
//! Refusals use Mesos's codes: `405` for a method other than POST, `400`
//! for a missing `Content-Type`, a body that does not decode or a call
//! that fails validation (no uuid, wrong source, …), `415` for another
//! `Content-Type`, `406` when `Accept` allows neither codec, `413` for a
//! body over [`MAX_CALL_BYTES`] (declared or sent), `408` for a body that
//! does not arrive within the agent's body limits
//! (`--http-body-timeout`), `400` for a subscription of an executor
//! the agent does not run (or that is not a Mesos executor), `403` for a
//! call of an executor that is not subscribed, `503` while the agent
//! stops. The executor API carries no stream id and no token: only
//! executors launched as Mesos executors may subscribe here.

use std::convert::Infallible;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use agora_mesos_proto::executor::{CallKind, EventTranslator, ExecutorCall};
use agora_mesos_proto::{recordio, v1, Codec};
use agora_proto::executor::Event;
use axum::body::{Body, Bytes};
use axum::extract::ws::CloseFrame;
use axum::extract::State;
use axum::http::{header, HeaderMap, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use tokio::sync::{mpsc, oneshot, watch};

use super::{AppState, ExecLink, Unwritten, WRITER_LINGER, WRITE_BATCH};
use crate::identity::{Claims, TokenError};
use crate::messages::{CoreEvent, ExecKey, Input};

/// The largest call body accepted (larger ones get `413`).
pub(crate) const MAX_CALL_BYTES: usize = agora_proto::MAX_FRAME_BYTES;
/// How long a subscription waits for the core's answer.
const SUBSCRIBE_TIMEOUT: Duration = Duration::from_secs(10);
/// Encoded events queued for the response body beyond those being
/// written.
const BODY_QUEUE: usize = 4;
/// The shortest time between two HEARTBEAT events on a stream, whatever
/// `--executor-heartbeat-interval` says.
const MIN_HEARTBEAT_INTERVAL: Duration = Duration::from_millis(10);

/// `POST /api/v1/executor`.
pub(super) async fn executor(
    State(app): State<AppState>,
    method: Method,
    connection: Option<axum::Extension<agora_net::Connection>>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let codec = match call_codec(&method, &headers, refuse) {
        Ok(codec) => codec,
        Err(refused) => return refused,
    };
    let connection = connection.map(|axum::Extension(c)| c);
    // With --authenticate-executors, a call without a token of this
    // agent's is refused before a byte of its body is read; whose token it
    // is, is checked once the call names its executor.
    if app.shared.config.authenticate_executors {
        if let Err(refusal) = bearer(&app, &headers) {
            return refusal;
        }
        if let Some(connection) = &connection {
            connection.establish();
        }
    }
    let body = match app.bodies.read(body, MAX_CALL_BYTES).await {
        Ok(body) => body,
        Err(refusal) => return refusal.into_response(),
    };
    let call: v1::executor::Call = match codec.decode(&body) {
        Ok(call) => call,
        Err(e) => {
            return refuse(
                StatusCode::BAD_REQUEST,
                format!("Failed to parse body: {e}"),
            )
        }
    };
    let call = match ExecutorCall::from_mesos(call, agora_proto::now_timestamp()) {
        Ok(call) => call,
        Err(e) => {
            return refuse(
                StatusCode::BAD_REQUEST,
                format!("Failed to validate executor::Call: {e}"),
            )
        }
    };
    let key: ExecKey = (call.framework_id, call.executor_id);
    // With --authenticate-executors every call carries the run's token.
    let identity = if app.shared.config.authenticate_executors {
        match authenticate(&app, &headers, &key) {
            Ok(identity) => Some(identity),
            Err(refusal) => return refusal,
        }
    } else {
        None
    };
    match call.kind {
        CallKind::Subscribe {
            unacknowledged_updates,
            unacknowledged_tasks,
        } => {
            let accept = headers
                .get_all(header::ACCEPT)
                .iter()
                .filter_map(|v| v.to_str().ok());
            let Some(codec) = Codec::negotiate(accept) else {
                return refuse(
                    StatusCode::NOT_ACCEPTABLE,
                    "Expecting 'Accept' to allow application/json or application/x-protobuf",
                );
            };
            if let Some((_, claims)) = &identity {
                // The token must be the current run's, not an earlier
                // run's of the same executor id.
                let snapshot = match fresh_snapshot(&app).await {
                    Ok(snapshot) => snapshot,
                    Err(refusal) => return refusal,
                };
                if let Some(run) = executor_json(&snapshot, &key)
                    .and_then(|e| e["run_id"].as_str().map(str::to_string))
                {
                    if run != claims.cid {
                        return refuse(
                            StatusCode::FORBIDDEN,
                            format!(
                                "the executor token is for run {} of executor {}, not its current run",
                                claims.cid, key.1
                            ),
                        );
                    }
                }
            }
            subscribe(
                app,
                key,
                codec,
                identity,
                unacknowledged_updates,
                unacknowledged_tasks,
                connection,
            )
            .await
        }
        CallKind::Call(call) => {
            let Some(subscription) = app.v1_subscriptions.get(&key).map(|s| s.clone()) else {
                return not_subscribed(&app, &key).await;
            };
            if let Some(refusal) = other_run(&subscription, identity.as_ref(), &key) {
                return refusal;
            }
            let conn = subscription.conn;
            let input = CoreEvent::Input(Input::ExecutorCall { conn, call });
            match app.core.send(input).await {
                Ok(()) => StatusCode::ACCEPTED.into_response(),
                Err(_) => refuse(StatusCode::SERVICE_UNAVAILABLE, "Agent is stopping"),
            }
        }
        CallKind::Heartbeat => match app.v1_subscriptions.get(&key).map(|s| s.clone()) {
            Some(subscription) => other_run(&subscription, identity.as_ref(), &key)
                .unwrap_or_else(|| StatusCode::ACCEPTED.into_response()),
            None => not_subscribed(&app, &key).await,
        },
    }
}

/// A Mesos executor's subscription: the connection its calls belong to,
/// and the run its token named (with `--authenticate-executors`).
#[derive(Debug, Clone)]
pub(super) struct V1Subscription {
    conn: u64,
    run: Option<String>,
}

/// `401` (with a challenge) for a call without a token this agent
/// issued, checked before its body is read.
#[allow(clippy::result_large_err)] // the refusal is the handler's answer
fn bearer(app: &AppState, headers: &HeaderMap) -> Result<(), Response> {
    let token = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(agora_proto::bearer_token);
    let message = match token.map(|token| app.shared.identity.verify(token)) {
        Some(Ok(_)) => return Ok(()),
        Some(Err(e)) => e.to_string(),
        None => "executor calls need 'Authorization: Bearer' with the executor's token".into(),
    };
    tracing::warn!(%message, "Mesos executor call not authenticated");
    Err((
        StatusCode::UNAUTHORIZED,
        [(header::WWW_AUTHENTICATE, "Bearer realm=\"agora-executor\"")],
        message,
    )
        .into_response())
}

/// The token of a call (`Authorization: Bearer`) and its claims: `401`
/// (with a challenge) when there is none or it is not this agent's, `403`
/// when it is another executor's.
#[allow(clippy::result_large_err)] // the refusal is the handler's answer
fn authenticate(
    app: &AppState,
    headers: &HeaderMap,
    key: &ExecKey,
) -> Result<(String, Claims), Response> {
    let unauthorized = |message: String| {
        tracing::warn!(framework_id = %key.0, executor_id = %key.1, %message, "Mesos executor call not authenticated");
        (
            StatusCode::UNAUTHORIZED,
            [(header::WWW_AUTHENTICATE, "Bearer realm=\"agora-executor\"")],
            message,
        )
            .into_response()
    };
    let Some(token) = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(agora_proto::bearer_token)
    else {
        return Err(unauthorized(
            "executor calls need 'Authorization: Bearer' with the executor's token".into(),
        ));
    };
    match app
        .shared
        .identity
        .check(token, key.0.as_str(), key.1.as_str(), None)
    {
        Ok(claims) => Ok((token.to_string(), claims)),
        Err(e @ TokenError::Invalid(_)) => Err(unauthorized(e.to_string())),
        Err(e @ TokenError::NotYours { .. }) => {
            tracing::warn!(framework_id = %key.0, executor_id = %key.1, error = %e, "Mesos executor call with another executor's token");
            Err(refuse(StatusCode::FORBIDDEN, e.to_string()))
        }
    }
}

/// `403` for a call whose token names another run than the one that
/// subscribed.
fn other_run(
    subscription: &V1Subscription,
    identity: Option<&(String, Claims)>,
    key: &ExecKey,
) -> Option<Response> {
    let (Some(run), Some((_, claims))) = (&subscription.run, identity) else {
        return None;
    };
    (*run != claims.cid).then(|| {
        refuse(
            StatusCode::FORBIDDEN,
            format!(
                "the executor token is for run {} of executor {}, not the subscribed run",
                claims.cid, key.1
            ),
        )
    })
}

/// The `/state` view published after this point (the periodic one may
/// predate a launch).
#[allow(clippy::result_large_err)] // the refusal is the handler's answer
pub(super) async fn fresh_snapshot(app: &AppState) -> Result<crate::messages::Snapshot, Response> {
    let (done, published) = oneshot::channel();
    if app.core.send(CoreEvent::Publish(done)).await.is_err() || published.await.is_err() {
        return Err(refuse(StatusCode::SERVICE_UNAVAILABLE, "Agent is stopping"));
    }
    Ok(app.snapshots.borrow().clone())
}

/// An executor in a `/state` view.
fn executor_json<'a>(
    snapshot: &'a serde_json::Value,
    key: &ExecKey,
) -> Option<&'a serde_json::Value> {
    snapshot["frameworks"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|f| f["id"] == key.0.as_str())
        .flat_map(|f| f["executors"].as_array().into_iter().flatten())
        .find(|e| e["id"] == key.1.as_str())
}

fn refuse(code: StatusCode, message: impl Into<String>) -> Response {
    let message = message.into();
    tracing::debug!(%code, %message, "Mesos executor call refused");
    (code, message).into_response()
}

/// A Mesos v1 call's method and `Content-Type`, as the agent's Mesos
/// endpoints check them: its codec, or the answer Mesos gives (`405`
/// with `Allow: POST`; `400` and `415` through the endpoint's `refuse`).
#[allow(clippy::result_large_err)] // the refusal is the handler's answer
pub(super) fn call_codec(
    method: &Method,
    headers: &HeaderMap,
    refuse: impl Fn(StatusCode, &'static str) -> Response,
) -> Result<Codec, Response> {
    if method != Method::POST {
        return Err((
            StatusCode::METHOD_NOT_ALLOWED,
            [(header::ALLOW, "POST")],
            format!("Expecting POST, got {method}"),
        )
            .into_response());
    }
    let Some(content_type) = headers.get(header::CONTENT_TYPE) else {
        return Err(refuse(
            StatusCode::BAD_REQUEST,
            "Expecting 'Content-Type' to be present",
        ));
    };
    content_type
        .to_str()
        .ok()
        .and_then(Codec::from_content_type)
        .ok_or_else(|| {
            refuse(
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                "Expecting 'Content-Type' of application/json or application/x-protobuf",
            )
        })
}

/// `400` for an executor the agent does not know (as a `/state` view
/// published after the call arrived says: the periodic one may predate a
/// launch), `403` for one that is not subscribed.
async fn not_subscribed(app: &AppState, key: &ExecKey) -> Response {
    let snapshot = match fresh_snapshot(app).await {
        Ok(snapshot) => snapshot,
        Err(refusal) => return refusal,
    };
    if executor_json(&snapshot, key).is_some() {
        refuse(StatusCode::FORBIDDEN, "Executor is not subscribed")
    } else {
        refuse(
            StatusCode::BAD_REQUEST,
            format!("Executor {} of framework {} cannot be found", key.1, key.0),
        )
    }
}

/// Hands a subscription to the core and answers with its event stream,
/// or with the core's refusal.
async fn subscribe(
    app: AppState,
    key: ExecKey,
    codec: Codec,
    identity: Option<(String, Claims)>,
    updates: Vec<agora_proto::TaskStatus>,
    tasks: Vec<agora_proto::TaskInfo>,
    connection: Option<agora_net::Connection>,
) -> Response {
    let conn = app.shared.next_conn_id();
    let (token, run) = identity
        .map(|(token, claims)| (Some(token), Some(claims.cid)))
        .unwrap_or_default();
    let (events_tx, mut events) = mpsc::unbounded_channel();
    let (close_tx, close) = watch::channel(None);
    let link = ExecLink {
        events: events_tx,
        unwritten: Arc::default(),
        close: Arc::new(close_tx),
        limit: app.shared.config.executor_outbox.max(1),
        stall: app.shared.config.executor_stall_timeout,
    };
    let (unwritten, limit) = (link.unwritten.clone(), link.limit);
    let subscribe = CoreEvent::ExecutorSubscribe {
        conn,
        link,
        framework_id: key.0.clone(),
        executor_id: key.1.clone(),
        token,
        updates,
        tasks,
    };
    if app.core.send(subscribe).await.is_err() {
        return refuse(StatusCode::SERVICE_UNAVAILABLE, "Agent is stopping");
    }
    let disconnect = Disconnect {
        app: app.clone(),
        key: key.clone(),
        conn,
    };
    let first = match tokio::time::timeout(SUBSCRIBE_TIMEOUT, events.recv()).await {
        Ok(Some(event)) => event,
        Ok(None) => return refuse(StatusCode::SERVICE_UNAVAILABLE, "Agent is stopping"),
        Err(_) => {
            return refuse(
                StatusCode::SERVICE_UNAVAILABLE,
                "the agent did not answer the subscription in time",
            )
        }
    };
    unwritten.count.fetch_sub(1, Ordering::AcqRel);
    match *first {
        Event::Subscribed { .. } => {}
        Event::Error { message, .. } => return refuse(StatusCode::BAD_REQUEST, message),
        other => {
            tracing::error!(event = ?other, "the core answered a subscription with neither SUBSCRIBED nor an error");
            return refuse(StatusCode::INTERNAL_SERVER_ERROR, "subscription failed");
        }
    }
    // An executor this agent runs: its stream is not among the
    // connections closed for room.
    if let Some(connection) = &connection {
        connection.establish();
    }
    // Calls from now on belong to this subscription (a newer one
    // replaces it).
    app.v1_subscriptions
        .insert(key.clone(), V1Subscription { conn, run });
    tracing::info!(framework_id = %key.0, executor_id = %key.1, codec = codec.media_type(), "Mesos executor subscribed");
    let (body_tx, body_rx) = mpsc::channel::<Bytes>(BODY_QUEUE);
    let translator = EventTranslator::new(app.shared.listen.port());
    let writer = EventWriter {
        events,
        unwritten,
        limit,
        close,
        codec,
        translator,
        heartbeat: app.shared.config.executor_heartbeat_interval,
        body: body_tx,
        _disconnect: disconnect,
    };
    tokio::spawn(writer.run(first));
    let stream = futures::stream::unfold(body_rx, |mut rx| async move {
        rx.recv()
            .await
            .map(|chunk| (Ok::<_, Infallible>(chunk), rx))
    });
    Response::builder()
        .status(StatusCode::OK)
        .header(header::CONTENT_TYPE, codec.media_type())
        .header(header::CACHE_CONTROL, "no-cache")
        .body(Body::from_stream(stream))
        .unwrap_or_else(|_| StatusCode::INTERNAL_SERVER_ERROR.into_response())
}

/// Tells the core the subscription is over when dropped (the writer
/// ended: the executor went away, or the core closed the stream).
struct Disconnect {
    app: AppState,
    key: ExecKey,
    conn: u64,
}

impl Drop for Disconnect {
    fn drop(&mut self) {
        self.app
            .v1_subscriptions
            .remove_if(&self.key, |_, s| s.conn == self.conn);
        let core = self.app.core.clone();
        let conn = self.conn;
        tokio::spawn(async move {
            let _ = core
                .send(CoreEvent::Input(Input::ExecutorDisconnected { conn }))
                .await;
        });
    }
}

/// What writes one subscription's events into its response body.
struct EventWriter {
    /// The core's native events for the executor.
    events: mpsc::UnboundedReceiver<Box<Event>>,
    unwritten: Arc<Unwritten>,
    /// `--executor-outbox`.
    limit: usize,
    /// The core asks for the stream to end.
    close: watch::Receiver<Option<CloseFrame>>,
    codec: Codec,
    translator: EventTranslator,
    /// `--executor-heartbeat-interval`.
    heartbeat: Duration,
    /// The response body's queue.
    body: mpsc::Sender<Bytes>,
    _disconnect: Disconnect,
}

impl EventWriter {
    /// Writes the core's events for one subscription as RecordIO records of
    /// Mesos events into the response body, until the core closes the
    /// stream (what was queued before goes first), every sender is gone, or
    /// the executor stops reading the response.
    async fn run(self, first: Box<Event>) {
        let EventWriter {
            mut events,
            unwritten,
            limit,
            mut close,
            codec,
            mut translator,
            heartbeat,
            body,
            _disconnect,
        } = self;
        let heartbeat = heartbeat.max(MIN_HEARTBEAT_INTERVAL);
        let mut beats =
            tokio::time::interval_at(tokio::time::Instant::now() + heartbeat, heartbeat);
        beats.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let beat = match codec.encode(&EventTranslator::heartbeat()) {
            Ok(bytes) => Bytes::from(recordio::frame(&bytes)),
            Err(e) => {
                tracing::error!(error = %e, "cannot encode a Mesos executor HEARTBEAT");
                return;
            }
        };
        let mut record = |event: Event| -> Option<Bytes> {
            let mesos = translator.translate(event)?;
            match codec.encode(&mesos) {
                Ok(bytes) => Some(Bytes::from(recordio::frame(&bytes))),
                Err(e) => {
                    tracing::error!(error = %e, "cannot encode a Mesos executor event");
                    None
                }
            }
        };
        if let Some(chunk) = record(*first) {
            if body.send(chunk).await.is_err() {
                return;
            }
        }
        loop {
            if close.borrow_and_update().is_some() {
                // What was queued before the close goes first (the error
                // that explains it, say), as far as time allows.
                let drain = async {
                    while let Ok(event) = events.try_recv() {
                        if let Some(chunk) = record(*event) {
                            if body.send(chunk).await.is_err() {
                                break;
                            }
                        }
                    }
                };
                let _ = tokio::time::timeout(WRITER_LINGER, drain).await;
                return;
            }
            let event = tokio::select! {
                biased;
                changed = close.changed() => {
                    if changed.is_err() {
                        return;
                    }
                    continue;
                }
                () = body.closed() => return,
                _ = beats.tick() => {
                    // An executor that leaves the body queue full is not
                    // reading: a heartbeat would not reach it either.
                    if let Err(mpsc::error::TrySendError::Closed(_)) = body.try_send(beat.clone()) {
                        return;
                    }
                    continue;
                }
                event = events.recv() => match event {
                    Some(event) => event,
                    None => return,
                },
            };
            let mut batch = vec![event];
            while batch.len() < WRITE_BATCH {
                let Ok(event) = events.try_recv() else { break };
                batch.push(event);
            }
            let queued = batch.len();
            let write = async {
                for event in batch {
                    if let Some(chunk) = record(*event) {
                        body.send(chunk).await.map_err(|_| ())?;
                    }
                }
                Ok::<(), ()>(())
            };
            // An executor that reads nothing never takes a full body
            // queue: a close asked for meanwhile gives it a moment, then
            // ends the stream.
            let closing = async {
                let _ = close.changed().await;
                tokio::time::sleep(WRITER_LINGER).await;
            };
            let written = tokio::select! {
                written = write => written.is_ok(),
                () = closing => false,
            };
            if !written {
                return;
            }
            let left = unwritten.count.fetch_sub(queued, Ordering::AcqRel) - queued;
            if left < limit {
                unwritten.full_since_ms.store(0, Ordering::Release);
            }
            unwritten.drained.notify_one();
        }
    }
}
