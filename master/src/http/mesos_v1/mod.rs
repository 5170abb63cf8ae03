//! The Mesos v1 HTTP API: the master's second front door, for frameworks
//! and tools written against Mesos (pymesos, mesoshttp, mesos-go, …).
//!
//! - `POST /api/v1/scheduler` (`scheduler.rs`): a SUBSCRIBE answers a
//!   chunked RecordIO stream of events in the negotiated codec with a
//!   `Mesos-Stream-Id`; every other call arrives on its own request with
//!   that id and is answered `202 Accepted`. Calls are translated
//!   (`translate.rs`) into the same state machine inputs the native
//!   WebSocket API produces, on a connection id of their own: one master,
//!   two front doors, the same offers, allocator, failover and
//!   reconciliation for both.
//! - `POST /api/v1` (`operator.rs`): the operator API (GET_HEALTH,
//!   GET_VERSION, GET_STATE, GET_AGENTS, GET_FRAMEWORKS, GET_TASKS,
//!   GET_EXECUTORS, GET_MASTER, GET_FLAGS, GET_METRICS and the SUBSCRIBE
//!   event stream), answered from the `/state` snapshot.
//! - `GET /master/state` (also `/state.json`, `/master/state.json`),
//!   `/master/state-summary`, `/slaves`, `/frameworks`, `/tasks` (each
//!   also under `/master/`), `/metrics/snapshot`, `/master/redirect`
//!   (`endpoints.rs`): the JSON that Mesos tools scrape.
//!
//! The paths are also served under Mesos's process prefix
//! (`/master/api/v1/scheduler`, `/master/api/v1`), and the operator API
//! also at `/api/v1/operator` (pymesos's path, which Mesos's prefix
//! routing hands to `/api/v1`).

mod endpoints;
mod operator;
mod operator_feed;
mod operator_quota;
mod scheduler;
mod translate;

use std::sync::Arc;

use agora_mesos_proto::Codec;
use agora_proto::FrameworkId;
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{any, get};
use axum::Router;
use dashmap::DashMap;

use super::AppState;
use crate::master::ConnId;

/// Largest request body accepted (Mesos answers larger ones 413 too).
pub(crate) const MAX_BODY_BYTES: usize = agora_proto::MAX_FRAME_BYTES;

/// The `Mesos-Stream-Id` header.
pub(crate) const STREAM_ID: &str = "Mesos-Stream-Id";

/// The subscription a framework's calls must name.
#[derive(Debug, Clone)]
pub(crate) struct StreamEntry {
    pub(crate) stream_id: String,
    pub(crate) conn: ConnId,
    /// The principal the subscription authenticated as: a call naming the
    /// stream must authenticate as it too.
    pub(crate) principal: Option<String>,
}

/// State of the Mesos front door, as its handlers get it: a request costs
/// one reference count, not one per shared part (several of which, the
/// cancellation token first, take a lock to clone and to drop).
pub(crate) type MesosState = Arc<MesosShared>;

/// What [`MesosState`] shares.
pub(crate) struct MesosShared {
    pub(crate) app: AppState,
    /// Each subscribed framework's current stream.
    pub(crate) streams: Arc<DashMap<FrameworkId, StreamEntry>>,
    /// The operator event stream's feeds.
    pub(crate) feeds: Arc<operator_feed::Feeds>,
}

/// The Mesos routes, to merge into the master's router.
pub(crate) fn router(app: AppState) -> Router {
    let state = Arc::new(MesosShared {
        app,
        streams: Arc::default(),
        feeds: Arc::default(),
    });
    Router::new()
        .route("/api/v1/scheduler", any(scheduler::handle))
        .route("/master/api/v1/scheduler", any(scheduler::handle))
        .route("/api/v1", any(operator::handle))
        .route("/master/api/v1", any(operator::handle))
        // pymesos's operator driver posts to `/api/v1/operator`, which
        // Mesos's prefix routing hands to `/api/v1`.
        .route("/api/v1/operator", any(operator::handle))
        .route("/master/api/v1/operator", any(operator::handle))
        .route("/master/state", get(endpoints::state))
        .route("/master/state.json", get(endpoints::state))
        .route("/state.json", get(endpoints::state))
        .route("/master/state-summary", get(endpoints::state_summary))
        .route("/slaves", get(endpoints::slaves))
        .route("/master/slaves", get(endpoints::slaves))
        .route("/frameworks", get(endpoints::frameworks))
        .route("/master/frameworks", get(endpoints::frameworks))
        .route("/tasks", get(endpoints::tasks))
        .route("/master/tasks", get(endpoints::tasks))
        .route("/tasks.json", get(endpoints::tasks))
        .route("/master/tasks.json", get(endpoints::tasks))
        .route("/metrics/snapshot", get(endpoints::metrics_snapshot))
        .route("/master/redirect", get(endpoints::redirect))
        .route("/redirect", get(endpoints::redirect))
        .route("/master/version", get(endpoints::version))
        .route("/master/health", get(endpoints::health))
        // Mesos (libprocess) splits a path on `/` and drops the empty
        // parts, so `/master/frameworks/` is `/master/frameworks`: the
        // Mesos CLI (avmesos-cli) reads that one.
        .route("/master/state/", get(endpoints::state))
        .route("/master/state-summary/", get(endpoints::state_summary))
        .route("/slaves/", get(endpoints::slaves))
        .route("/master/slaves/", get(endpoints::slaves))
        .route("/frameworks/", get(endpoints::frameworks))
        .route("/master/frameworks/", get(endpoints::frameworks))
        .route("/tasks/", get(endpoints::tasks))
        .route("/master/tasks/", get(endpoints::tasks))
        .with_state(state)
}

/// `/version` (and `/master/version`): Mesos's shape, with the Mesos API
/// version Agora implements as `version` (purely numeric: pymesos parses
/// it as integers), Agora's own as `agora_version`.
pub(crate) fn version_json() -> serde_json::Value {
    serde_json::json!({
        "version": agora_mesos_proto::MESOS_API_VERSION,
        "build_date": "",
        "build_time": 0.0,
        "build_user": "agora",
        "agora_version": agora_proto::VERSION,
        "protocol": agora_proto::PROTOCOL_VERSION,
    })
}

/// A plain-text error answer.
pub(crate) fn error(status: StatusCode, message: impl Into<String>) -> Response {
    let message = message.into();
    tracing::debug!(%status, %message, "Mesos API request refused");
    (
        status,
        [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
        message,
    )
        .into_response()
}

/// The codec of the request body: 400 without `Content-Type`, 415 for a
/// type that is neither JSON nor protobuf.
#[allow(clippy::result_large_err)] // the error is the answer, built once
pub(crate) fn request_codec(headers: &HeaderMap) -> Result<Codec, Response> {
    let Some(value) = headers.get(header::CONTENT_TYPE) else {
        return Err(error(
            StatusCode::BAD_REQUEST,
            "Expecting 'Content-Type' to be present",
        ));
    };
    let text = value.to_str().unwrap_or("");
    Codec::from_content_type(text).ok_or_else(|| {
        error(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            format!(
                "Expecting 'Content-Type' of application/json or application/x-protobuf, got {text:?}"
            ),
        )
    })
}

/// The codec of the response from every `Accept` header: 406 when
/// neither JSON nor protobuf is acceptable.
#[allow(clippy::result_large_err)] // the error is the answer, built once
pub(crate) fn response_codec(headers: &HeaderMap) -> Result<Codec, Response> {
    let accept: Vec<&str> = headers
        .get_all(header::ACCEPT)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .collect();
    Codec::negotiate(accept).ok_or_else(|| {
        error(
            StatusCode::NOT_ACCEPTABLE,
            "Expecting 'Accept' to allow application/json or application/x-protobuf",
        )
    })
}

/// A body in `codec`, with its content type.
pub(crate) fn encoded(status: StatusCode, codec: Codec, body: Vec<u8>) -> Response {
    (
        status,
        [(
            header::CONTENT_TYPE,
            HeaderValue::from_static(codec.media_type()),
        )],
        body,
    )
        .into_response()
}
