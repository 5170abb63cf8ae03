//! HTTP and WebSocket serving on the master's one port: `/api/scheduler`
//! and `/api/agent` (WebSocket); `/health`, `/version`, `/state`,
//! `/metrics`; the web UI at `/` with its list endpoints under `/api/v1/`
//! and its live feed at `/events` (see `docs/http.md`); Mesos's files
//! API, redirected to the agent that holds the sandbox (`files`); the Mesos v1
//! scheduler and operator APIs and Mesos's scraped endpoints (`mesos_v1`).
//! Connection tasks only parse, forward to the state task and write; every
//! HTTP answer comes from the latest published snapshot or from atomics,
//! never from the state task.

mod api;
mod files;
mod mesos_v1;
mod operator_agents;

mod ui;
mod ws;

use std::sync::atomic::AtomicU64;
use std::sync::Arc;

use agora_proto::{agent, scheduler, MAX_FRAME_BYTES};
use axum::extract::{State, WebSocketUpgrade};
use axum::http::{header, HeaderMap};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Extension, Json, Router};
use dashmap::DashMap;
use tokio::sync::{mpsc, watch};
use tokio_util::sync::CancellationToken;

use crate::master::{ConnId, Input};
use crate::metrics::Metrics;
use crate::state::StateSnapshot;

/// A frame queued towards one connection.
#[derive(Debug)]
pub(crate) enum Outbound {
    Scheduler(Box<scheduler::Event>),
    Agent(Box<agent::Event>),
    Close { code: u16, reason: String },
}

/// How the state task reaches a connection.
#[derive(Debug, Clone)]
pub(crate) struct ConnHandle {
    pub(crate) tx: mpsc::Sender<Outbound>,
    /// Cancelled to drop the connection (slow peer, shutdown).
    pub(crate) cancel: CancellationToken,
}

/// Live connections by id, written by connection tasks, read by the state task.
pub(crate) type Registry = Arc<DashMap<ConnId, ConnHandle>>;

/// Shared by every handler.
#[derive(Clone)]
pub(crate) struct AppState {
    pub(crate) inputs: mpsc::Sender<Input>,
    pub(crate) registry: Registry,
    pub(crate) next_conn: Arc<AtomicU64>,
    pub(crate) snapshot: watch::Receiver<Arc<StateSnapshot>>,
    pub(crate) shutdown: CancellationToken,
    pub(crate) queue_capacity: usize,
    /// How long a new WebSocket may stay silent before its first frame
    /// (and a TLS client before its handshake ends).
    pub(crate) first_frame_timeout: std::time::Duration,
    pub(crate) metrics: Arc<Metrics>,
    /// Request bodies' memory budget and deadlines.
    pub(crate) bodies: Arc<agora_net::Bodies>,
    /// The accept loop's counters, for `/metrics`.
    pub(crate) net: Arc<agora_net::NetStats>,
    /// Bytes an operator event stream may have waiting for its reader.
    pub(crate) operator_stream_backlog: usize,
    pub(crate) auth: Arc<Authentication>,
    /// The names of the ways in this master's configuration leaves
    /// unguarded (`Config::open_doors`), for `/health`.
    pub(crate) open_doors: Vec<&'static str>,
}

/// Who must authenticate, against which credentials.
#[derive(Debug, Default)]
pub(crate) struct Authentication {
    pub(crate) credentials: Option<agora_proto::Credentials>,
    pub(crate) frameworks: bool,
    pub(crate) agents: bool,
    /// Operators on every HTTP endpoint but the [`OPEN_PATHS`].
    pub(crate) http: bool,
    /// What operators may see (`view_frameworks`, `view_tasks`).
    pub(crate) acls: Arc<crate::acls::Acls>,
}

/// Who reads the state, under which ACLs: filters each snapshot a
/// stream sends (`/events`, the operator `SUBSCRIBE`) as a single read
/// would be.
#[derive(Debug, Clone)]
pub(crate) struct Viewer {
    acls: Arc<crate::acls::Acls>,
    principal: Option<String>,
}

impl AppState {
    /// The latest snapshot as the requester may see it (`view_*` ACLs,
    /// by the principal its `Authorization` names; none: anonymous).
    pub(crate) fn snapshot_for(&self, headers: &HeaderMap) -> Arc<StateSnapshot> {
        let snapshot = self.snapshot.borrow().clone();
        self.viewer(headers).view(snapshot)
    }

    /// The requester, as [`AppState::snapshot_for`] filters for it.
    pub(crate) fn viewer(&self, headers: &HeaderMap) -> Viewer {
        Viewer {
            acls: self.auth.acls.clone(),
            principal: self.auth.principal(false, headers).ok().flatten(),
        }
    }
}

impl Viewer {
    /// `snapshot` as this viewer may see it.
    pub(crate) fn view(&self, snapshot: Arc<StateSnapshot>) -> Arc<StateSnapshot> {
        match snapshot.viewed_by(&self.acls, self.principal.as_deref()) {
            Some(filtered) => Arc::new(filtered),
            None => snapshot,
        }
    }
}

/// An operator's teardown of framework `fid`: `401` without valid
/// credentials when the master has any (a call that changes the cluster
/// needs a principal, with or without `--authenticate-http`), `400` for a
/// framework the master does not have, `403` when the
/// `teardown_frameworks` ACL refuses the operator (by its principal) the
/// framework (by its principal), else handed to the master and `200`.
pub(crate) async fn operator_teardown(app: &AppState, headers: &HeaderMap, fid: &str) -> Response {
    use axum::http::StatusCode;
    let operator = match app.auth.operator_writer(headers) {
        Ok(operator) => operator,
        Err(refusal) => {
            tracing::warn!(
                framework_id = fid,
                "operator teardown refused: not authenticated"
            );
            return refusal;
        }
    };
    let snapshot = app.snapshot.borrow().clone();
    let Some(framework) = snapshot.frameworks.iter().find(|f| f.id.as_str() == fid) else {
        return (
            StatusCode::BAD_REQUEST,
            format!("No framework found with specified ID {fid:?}"),
        )
            .into_response();
    };
    if let Err(message) = app.auth.acls.check(
        crate::acls::Action::TeardownFrameworks,
        operator.as_deref(),
        framework.principal.as_deref(),
    ) {
        tracing::warn!(framework_id = fid, ?operator, framework_principal = ?framework.principal, "operator teardown refused");
        return (StatusCode::FORBIDDEN, message).into_response();
    }
    let input = Input::OperatorTeardown {
        framework_id: framework.id.clone(),
        operator,
    };
    match app.inputs.send(input).await {
        Ok(()) => StatusCode::OK.into_response(),
        Err(_) => (StatusCode::SERVICE_UNAVAILABLE, "the master is stopping").into_response(),
    }
}

/// `POST /master/teardown` (and `/teardown`) with the form field
/// `frameworkId`, as Mesos's endpoint.
async fn teardown_form(
    State(app): State<AppState>,
    headers: HeaderMap,
    body: axum::body::Body,
) -> Response {
    let body = match app.bodies.read(body, MAX_FORM_BYTES).await {
        Ok(body) => body,
        Err(refusal) => return refusal.into_response(),
    };
    let fid = url_form_field(&body, "frameworkId");
    match fid {
        Some(fid) => operator_teardown(&app, &headers, &fid).await,
        None => (
            axum::http::StatusCode::BAD_REQUEST,
            "Missing 'frameworkId' query parameter in the request body",
        )
            .into_response(),
    }
}

/// Largest form body accepted (`/master/teardown`).
const MAX_FORM_BYTES: usize = 64 * 1024;

/// The (percent-decoded) value of `name` in an
/// `application/x-www-form-urlencoded` body.
pub(crate) fn url_form_field(body: &[u8], name: &str) -> Option<String> {
    let text = std::str::from_utf8(body).ok()?;
    text.split('&').find_map(|pair| {
        let (key, value) = pair.split_once('=')?;
        (key == name).then(|| {
            percent_encoding::percent_decode_str(&value.replace('+', " "))
                .decode_utf8_lossy()
                .into_owned()
        })
    })
}

/// Paths served without operator authentication: probes, the leader
/// lookup, and the framework and agent channels (which authenticate
/// with `--authenticate-frameworks` and `--authenticate-agents`).
const OPEN_PATHS: &[&str] = &[
    "/health",
    "/master/health",
    "/version",
    "/master/version",
    "/redirect",
    "/master/redirect",
    "/api/scheduler",
    "/api/agent",
    "/api/v1/scheduler",
    "/master/api/v1/scheduler",
];

/// With `--authenticate-http`, answers `401` (with a challenge) to an
/// operator request without valid credentials.
async fn operator_auth(
    State(auth): State<Arc<Authentication>>,
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    if auth.http && !OPEN_PATHS.contains(&request.uri().path()) {
        match auth.principal(true, request.headers()) {
            Err(refusal) => {
                tracing::debug!(
                    path = request.uri().path(),
                    "operator request not authenticated"
                );
                return refusal;
            }
            Ok(Some(_)) => {
                if let Some(connection) = request.extensions().get::<agora_net::Connection>() {
                    connection.establish();
                }
            }
            Ok(None) => {}
        }
    }
    next.run(request).await
}

impl Authentication {
    /// The principal of an operator call that changes the cluster
    /// (`TEARDOWN`, and later drain, quota, …): required whenever the
    /// master has credentials, even without `--authenticate-http`; `Err`
    /// the `401` answer. Without credentials there is no one to check:
    /// `Ok(None)` (an open door, warned of at start).
    #[allow(clippy::result_large_err)] // the error is the answer, built once
    pub(crate) fn operator_writer(
        &self,
        headers: &axum::http::HeaderMap,
    ) -> Result<Option<String>, Response> {
        self.principal(self.credentials.is_some(), headers)
    }

    /// The principal `headers` authenticate when `required`: `Ok(None)`
    /// when authentication is not required and none is offered; `Err`
    /// the answer (401) when it is required and missing or wrong.
    #[allow(clippy::result_large_err)] // the error is the answer, built once
    pub(crate) fn principal(
        &self,
        required: bool,
        headers: &axum::http::HeaderMap,
    ) -> Result<Option<String>, Response> {
        agora_net::auth::principal(self.credentials.as_ref(), headers, required)
    }
}

/// Which channel a WebSocket speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    Scheduler,
    Agent,
}

pub(crate) fn router(state: AppState) -> Router {
    let router = Router::new()
        .route("/health", get(health))
        .route("/version", get(version))
        .route("/state", get(state_json))
        .route("/metrics", get(metrics))
        .route("/events", get(api::events))
        .route("/api/v1/summary", get(api::summary))
        .route("/api/v1/agents", get(api::agents))
        .route("/api/v1/frameworks", get(api::frameworks))
        .route("/api/v1/tasks", get(api::tasks))
        .route("/", get(ui::index))
        .route("/ui/{file}", get(ui::asset))
        .route("/api/scheduler", get(scheduler_ws))
        .route("/api/agent", get(agent_ws))
        .route("/master/teardown", axum::routing::post(teardown_form))
        .route("/teardown", axum::routing::post(teardown_form));
    let router = files::routes(router)
        .with_state(state.clone())
        .merge(mesos_v1::router(state.clone()));
    // Without --authenticate-http nothing is checked: no layer, so no
    // per-request cost (every Mesos v1 call is a request).
    if state.auth.http {
        router.layer(axum::middleware::from_fn_with_state(
            state.auth.clone(),
            operator_auth,
        ))
    } else {
        router
    }
}

/// Mesos's `/version`: `version` is the (numeric) Mesos API version Agora
/// implements, `agora_version` Agora's own.
async fn version() -> Json<serde_json::Value> {
    Json(mesos_v1::version_json())
}

/// `ok` as text (load balancers, scripts); with `Accept: application/json`,
/// `{"status": "serving", "master_id", "address", "uptime_seconds",
/// "open_doors"}`, the last the names of the ways in that the master's
/// configuration leaves unguarded (`[]` when none).
async fn health(State(app): State<AppState>, headers: HeaderMap) -> Response {
    let wants_json = headers
        .get(header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.contains("application/json"));
    if !wants_json {
        return "ok".into_response();
    }
    let snapshot = app.snapshot.borrow().clone();
    Json(serde_json::json!({
        "status": "serving",
        "master_id": snapshot.master.id,
        "address": snapshot.master.address,
        "uptime_seconds": (agora_proto::now_timestamp() - snapshot.started_at).max(0.0),
        "open_doors": app.open_doors,
    }))
    .into_response()
}

/// Prometheus text format 0.0.4.
async fn metrics(State(app): State<AppState>) -> Response {
    let snapshot = app.snapshot.borrow().clone();
    let mut text = app.metrics.render(&snapshot);
    app.net.render("agora_master", &mut text);
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        text,
    )
        .into_response()
}

async fn state_json(State(app): State<AppState>, headers: HeaderMap) -> Response {
    let snapshot = app.snapshot_for(&headers);
    let encoded = match snapshot.encoded.get() {
        Some(body) => Ok(body.clone()),
        // Encoding a large state takes tens of milliseconds: not on a
        // worker that other connections share.
        None => match tokio::task::spawn_blocking(move || snapshot.json()).await {
            Ok(encoded) => encoded,
            Err(e) => Err(serde::ser::Error::custom(e)),
        },
    };
    match encoded {
        Ok(body) => ([(header::CONTENT_TYPE, "application/json")], body).into_response(),
        Err(e) => (
            axum::http::StatusCode::INTERNAL_SERVER_ERROR,
            format!("cannot encode state: {e}"),
        )
            .into_response(),
    }
}

/// Upgrades to a WebSocket of `kind` once the peer has authenticated
/// (when its kind must): a missing or wrong `Authorization` is answered
/// 401 before any frame is read.
fn upgrade(
    ws: WebSocketUpgrade,
    app: AppState,
    kind: Kind,
    headers: &axum::http::HeaderMap,
    connection: Option<agora_net::Connection>,
) -> Response {
    let required = match kind {
        Kind::Scheduler => app.auth.frameworks,
        Kind::Agent => app.auth.agents,
    };
    let principal = match app.auth.principal(required, headers) {
        Ok(principal) => principal,
        Err(refusal) => {
            tracing::info!(?kind, "connection refused: not authenticated");
            return refusal;
        }
    };
    if let (Some(_), Some(connection)) = (&principal, &connection) {
        connection.establish();
    }
    ws.max_message_size(MAX_FRAME_BYTES)
        .max_frame_size(MAX_FRAME_BYTES)
        .on_upgrade(move |socket| ws::serve(socket, kind, app, principal, connection))
}

async fn scheduler_ws(
    ws: WebSocketUpgrade,
    State(app): State<AppState>,
    connection: Option<Extension<agora_net::Connection>>,
    headers: axum::http::HeaderMap,
) -> Response {
    let connection = connection.map(|Extension(c)| c);
    upgrade(ws, app, Kind::Scheduler, &headers, connection)
}

async fn agent_ws(
    ws: WebSocketUpgrade,
    State(app): State<AppState>,
    connection: Option<Extension<agora_net::Connection>>,
    headers: axum::http::HeaderMap,
) -> Response {
    let connection = connection.map(|Extension(c)| c);
    upgrade(ws, app, Kind::Agent, &headers, connection)
}
