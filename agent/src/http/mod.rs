//! The agent's port: the executor WebSocket at `/api/executor`, the
//! Mesos v1 executor API at `/api/v1/executor` ([`mesos_v1`], a second
//! front door onto the same core machinery), the read-only calls of
//! Mesos's v1 agent operator API at `/api/v1` ([`operator_v1`]), and HTTP
//! `/health`, `/state`, `/version`, `/metrics` (Prometheus text) and
//! `/files/FID/EID[/PATH]` (an executor's sandbox, confined by
//! [`crate::files`]; see `docs/http.md`), and Mesos's files API
//! (`/files/read`, `/files/browse`, `/files/download`, `/files/debug`:
//! [`mesos_files`]). HTTP answers to a page of an
//! allowed origin (by default the master's, whose web UI reads them)
//! carry that origin in `Access-Control-Allow-Origin`; never `*`.
//!
//! An executor connection task only decodes, forwards to the core and
//! writes what the core sends back; the core checks tokens and owns all
//! state. Bad frames get a non-fatal `Error`; a frame over
//! [`agora_proto::MAX_FRAME_BYTES`] closes the connection with code 1009.

use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use agora_proto::executor::{Call, Event};
use axum::extract::ws::{CloseFrame, Message, WebSocket, WebSocketUpgrade};
use axum::extract::{Path, Query, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use futures::{SinkExt, StreamExt};
use serde::Deserialize;
use tokio::sync::{mpsc, watch};
use tokio_util::sync::CancellationToken;

use crate::files::{self, FileError, Target};
use crate::messages::{CoreEvent, ExecKey, ExecLink, Input, Snapshot, Unwritten};
use crate::monitor::Monitor;
use crate::shared::{Counters, Shared};

mod mesos_files;
mod mesos_v1;
mod operator_v1;

/// Most queued events written to an executor with one flush.
const WRITE_BATCH: usize = 256;
/// How long a closing connection may take to write its close frame.
const WRITER_LINGER: std::time::Duration = std::time::Duration::from_secs(1);

#[derive(Clone)]
struct AppState {
    shared: Shared,
    core: mpsc::Sender<CoreEvent>,
    /// The core's latest `/state` view, published by the shell.
    snapshots: watch::Receiver<Snapshot>,
    counters: Arc<FileCounters>,
    /// The connection of each executor subscribed on the Mesos v1
    /// executor API, to which its calls (made on requests of their own)
    /// belong.
    v1_subscriptions: Arc<dashmap::DashMap<ExecKey, mesos_v1::V1Subscription>>,
    /// Container statistics (`--isolation cgroups`).
    monitor: Monitor,
    /// Request bodies' memory budget and deadlines.
    bodies: Arc<agora_net::Bodies>,
    /// The accept loop's counters, for `/metrics`.
    net: Arc<agora_net::NetStats>,
    /// Images (`--image-providers`), for `POST /images/import`.
    images: Option<agora_containerizer::ImageContainers>,
}

/// What `/files` served and refused, for `/metrics`.
#[derive(Debug, Default)]
struct FileCounters {
    reads: AtomicU64,
    listings: AtomicU64,
    forbidden: AtomicU64,
    not_found: AtomicU64,
}

/// `?offset=&length=&run=` of `/files`.
#[derive(Debug, Default, Deserialize)]
struct FileParams {
    /// Byte offset (default 0).
    offset: Option<u64>,
    /// Bytes to read (default 64 KiB, at most 1 MiB).
    length: Option<usize>,
    /// Run id (default: the executor's latest run).
    run: Option<String>,
}

/// The router for the agent's port.
pub(crate) fn router(
    shared: Shared,
    core: mpsc::Sender<CoreEvent>,
    snapshots: watch::Receiver<Snapshot>,
    monitor: Monitor,
    net: Arc<agora_net::NetStats>,
    images: Option<agora_containerizer::ImageContainers>,
) -> Router {
    let app_state = AppState {
        bodies: agora_net::Bodies::new(&shared.config.limits, net.clone()),
        net,
        shared: shared.clone(),
        core,
        snapshots,
        counters: Arc::default(),
        v1_subscriptions: Arc::default(),
        monitor,
        images,
    };
    let router = Router::new()
        .route("/api/executor", get(executor_ws))
        .route("/api/v1/executor", axum::routing::any(mesos_v1::executor))
        .route("/api/v1", axum::routing::any(operator_v1::handle))
        .route("/slave(1)/api/v1", axum::routing::any(operator_v1::handle))
        .route("/health", get(health))
        .route("/version", get(|| async { agora_proto::VERSION }))
        .route("/state", get(state))
        .route("/metrics", get(metrics))
        .route("/monitor/statistics", get(statistics))
        .route("/containers", get(statistics))
        .route("/images/import", axum::routing::post(import_images))
        .route("/files/{framework_id}/{executor_id}", get(files_root))
        .route(
            "/files/{framework_id}/{executor_id}/{*path}",
            get(files_path),
        );
    mesos_files::routes(router)
        .layer(axum::middleware::from_fn_with_state(
            app_state.clone(),
            operator_auth,
        ))
        .layer(axum::middleware::from_fn_with_state(
            Arc::<[String]>::from(shared.config.allowed_origins.clone()),
            allow_cross_origin,
        ))
        .with_state(app_state)
}

/// Most bytes of an archive `POST /images/import` takes.
const MAX_IMAGE_ARCHIVE_BYTES: u64 = 16 << 30;

/// `POST /images/import`: the body is a `docker save` or OCI-layout
/// tarball (gzip or not), streamed to a file under the work directory
/// and imported into the layer store; answers
/// `{"images": [{"names", "digest", "layers"}]}`. `409` when images are
/// not enabled on this agent, `400` (naming the cause) for an archive
/// that is not one, `413` past [`MAX_IMAGE_ARCHIVE_BYTES`].
async fn import_images(State(app): State<AppState>, body: axum::body::Body) -> Response {
    use tokio::io::AsyncWriteExt;
    let Some(images) = app.images.clone() else {
        return (
            StatusCode::CONFLICT,
            "images are not enabled on this agent (start it with --image-providers docker,oci)\n",
        )
            .into_response();
    };
    let dir = app.shared.config.work_dir.join("imports");
    let path = dir.join(format!("{}.tar", uuid::Uuid::new_v4().simple()));
    let written = async {
        tokio::fs::create_dir_all(&dir).await?;
        let mut file = tokio::fs::File::create(&path).await?;
        let mut stream = body.into_data_stream();
        let mut total = 0u64;
        while let Some(chunk) = stream.next().await {
            let chunk = chunk.map_err(std::io::Error::other)?;
            total += chunk.len() as u64;
            if total > MAX_IMAGE_ARCHIVE_BYTES {
                return Ok(false);
            }
            file.write_all(&chunk).await?;
        }
        file.flush().await?;
        Ok::<bool, std::io::Error>(true)
    }
    .await;
    let response = match written {
        Ok(false) => (
            StatusCode::PAYLOAD_TOO_LARGE,
            format!("the archive is larger than {MAX_IMAGE_ARCHIVE_BYTES} bytes\n"),
        )
            .into_response(),
        Err(e) => (
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("cannot store the archive: {e}\n"),
        )
            .into_response(),
        Ok(true) => match images.import(&path).await {
            Ok(imported) => Json(serde_json::json!({
                "images": imported
                    .iter()
                    .map(|i| serde_json::json!({
                        "names": i.names,
                        "digest": i.digest,
                        "layers": i.layers,
                    }))
                    .collect::<Vec<_>>(),
            }))
            .into_response(),
            Err(e) => (StatusCode::BAD_REQUEST, format!("{e}\n")).into_response(),
        },
    };
    let _ = tokio::fs::remove_file(&path).await;
    response
}

/// `ok` as text; with `Accept: application/json`, `{"status": "serving",
/// "open_doors"}`, the names of the ways in that the agent's
/// configuration leaves unguarded (`[]` when none).
async fn health(State(app): State<AppState>, headers: HeaderMap) -> Response {
    let wants_json = headers
        .get(axum::http::header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.contains("application/json"));
    if !wants_json {
        return "ok".into_response();
    }
    let doors = app.shared.config.open_doors();
    axum::Json(serde_json::json!({
        "status": "serving",
        "open_doors": agora_net::doors::names(&doors),
    }))
    .into_response()
}

/// Paths served without operator authentication: probes and the
/// executor APIs (executors present their tokens).
const OPEN_PATHS: &[&str] = &["/health", "/version", "/api/executor", "/api/v1/executor"];

/// The principal a request's `Authorization` names (see
/// [`agora_net::auth::principal`]).
#[allow(clippy::result_large_err)] // the error is the answer
fn principal(
    app: &AppState,
    headers: &HeaderMap,
    required: bool,
) -> Result<Option<String>, Response> {
    agora_net::auth::principal(app.shared.config.credentials.as_ref(), headers, required)
}

/// With `--authenticate-http`, answers `401` (with a challenge) to an
/// operator request without valid credentials.
async fn operator_auth(
    State(app): State<AppState>,
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    if app.shared.config.authenticate_http && !OPEN_PATHS.contains(&request.uri().path()) {
        if let Err(refusal) = principal(&app, request.headers(), true) {
            return refusal;
        }
    }
    next.run(request).await
}

/// `Err` the `403` answer when the `access_sandboxes` ACL refuses the
/// requester the sandboxes of `framework_id` (by the user it runs as).
#[allow(clippy::result_large_err)] // the error is the answer
fn may_read_sandbox(
    app: &AppState,
    headers: &HeaderMap,
    framework_id: &str,
) -> Result<(), Response> {
    use agora_proto::acls::Action;
    let acls = &app.shared.config.acls;
    if !acls.restricts(Action::AccessSandboxes) {
        return Ok(());
    }
    let principal = principal(app, headers, false).ok().flatten();
    let snapshot = app.snapshots.borrow().clone();
    let user = snapshot["frameworks"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|f| f["id"] == framework_id)
        .and_then(|f| f["user"].as_str())
        .map(str::to_string);
    acls.check(
        Action::AccessSandboxes,
        principal.as_deref(),
        user.as_deref(),
    )
    .map_err(|message| {
        app.counters.forbidden.fetch_add(1, Ordering::Relaxed);
        (StatusCode::FORBIDDEN, message).into_response()
    })
}

/// Lets pages of the allowed origins (the master's web UI) read the
/// answer: their `Origin` is echoed in `Access-Control-Allow-Origin`
/// (never `*`); any other origin gets no such header, so a browser keeps
/// the answer from its page.
async fn allow_cross_origin(
    State(allowed): State<Arc<[String]>>,
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    let origin = request.headers().get(header::ORIGIN).cloned();
    let mut response = next.run(request).await;
    let headers = response.headers_mut();
    headers.append(header::VARY, HeaderValue::from_static("Origin"));
    if let Some(origin) = origin {
        let ok = allowed
            .iter()
            .any(|a| a.as_bytes().eq_ignore_ascii_case(origin.as_bytes()));
        if ok {
            headers.insert(header::ACCESS_CONTROL_ALLOW_ORIGIN, origin);
        }
    }
    response
}

/// The core's latest published `/state` view (at most
/// [`crate::shell::SNAPSHOT_EVERY`] old), or `None` when the agent is
/// stopping.
async fn core_state(app: &AppState) -> Option<Snapshot> {
    if app.core.is_closed() {
        return None;
    }
    Some(app.snapshots.borrow().clone())
}

/// Prometheus text: gauges counted from the core's state, plus what
/// `/files` served.
async fn metrics(State(app): State<AppState>) -> Response {
    let Some(state) = core_state(&app).await else {
        return (StatusCode::SERVICE_UNAVAILABLE, "agent stopping").into_response();
    };
    let mut body = render_metrics(&state, &app.counters, &app.shared.counters);
    app.net.render("agora_agent", &mut body);
    if app.monitor.enabled() {
        let monitor = app.monitor.clone();
        let usage = tokio::task::spawn_blocking(move || monitor.usage(&state))
            .await
            .unwrap_or_default();
        agora_containerizer::monitor::render_metrics(&mut body, &usage);
    }
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        body,
    )
        .into_response()
}

fn render_metrics(state: &serde_json::Value, c: &FileCounters, updates: &Counters) -> String {
    let mut out = String::new();
    let mut metric = |name: &str, kind: &str, help: &str, series: &[(String, f64)]| {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
        for (labels, v) in series {
            if labels.is_empty() {
                let _ = writeln!(out, "{name} {v}");
            } else {
                let _ = writeln!(out, "{name}{{{labels}}} {v}");
            }
        }
    };
    let one = |v: f64| vec![(String::new(), v)];
    let registered = state["registered"].as_bool().unwrap_or(false);
    metric(
        "agora_agent_registered",
        "gauge",
        "1 while registered with a master",
        &one(if registered { 1.0 } else { 0.0 }),
    );
    let frameworks = state["frameworks"].as_array().cloned().unwrap_or_default();
    metric(
        "agora_agent_frameworks",
        "gauge",
        "Frameworks with executors or tasks here",
        &one(frameworks.len() as f64),
    );
    let (mut running, mut gone) = (0.0, 0.0);
    let mut tasks: std::collections::BTreeMap<String, f64> = Default::default();
    let mut used: std::collections::BTreeMap<String, f64> = Default::default();
    for ex in frameworks
        .iter()
        .flat_map(|f| f["executors"].as_array().into_iter().flatten())
    {
        if ex["running"].as_bool().unwrap_or(false) {
            running += 1.0;
        } else {
            gone += 1.0;
        }
        for t in ex["tasks"].as_array().into_iter().flatten() {
            let task_state = t["state"].as_str().unwrap_or("UNKNOWN").to_string();
            let terminal = serde_json::from_value::<agora_proto::TaskState>(t["state"].clone())
                .is_ok_and(|s| s.is_terminal());
            *tasks.entry(task_state).or_default() += 1.0;
            if terminal {
                continue;
            }
            if let Ok(r) = serde_json::from_value::<agora_proto::Resources>(t["resources"].clone())
            {
                for (name, v) in r.scalar_totals() {
                    *used.entry(name.to_string()).or_default() += v;
                }
            }
        }
    }
    metric(
        "agora_agent_executors",
        "gauge",
        "Executors by whether their process runs",
        &[
            ("state=\"running\"".into(), running),
            ("state=\"exited\"".into(), gone),
        ],
    );
    let tasks: Vec<(String, f64)> = tasks
        .into_iter()
        .map(|(s, n)| (format!("state=\"{s}\""), n))
        .collect();
    metric(
        "agora_agent_tasks",
        "gauge",
        "Tasks by latest state",
        &tasks,
    );
    let mut resources: Vec<(String, f64)> = Vec::new();
    if let Ok(total) = serde_json::from_value::<agora_proto::Resources>(state["resources"].clone())
    {
        for (name, v) in total.scalar_totals() {
            resources.push((format!("name=\"{name}\",kind=\"total\""), v));
            let u = used.get(name).copied().unwrap_or(0.0);
            resources.push((format!("name=\"{name}\",kind=\"used\""), u));
        }
    }
    metric(
        "agora_agent_resources",
        "gauge",
        "Scalar resources: total advertised, used by active tasks",
        &resources,
    );
    metric(
        "agora_agent_status_update_streams",
        "gauge",
        "Tasks with status updates not yet acknowledged",
        &one(state["status_update_streams"].as_f64().unwrap_or(0.0)),
    );
    metric(
        "agora_agent_status_updates_acknowledged_total",
        "counter",
        "Status updates acknowledged by the scheduler (through the master)",
        &one(state["status_updates_acknowledged"].as_f64().unwrap_or(0.0)),
    );
    let load = |a: &AtomicU64| a.load(Ordering::Relaxed) as f64;
    metric(
        "agora_agent_status_updates_retried_total",
        "counter",
        "Unacknowledged status updates sent to the master again: when their retry interval ran out, or as a stream's head when the agent (re-)registered",
        &[
            ("reason=\"timeout\"".into(), load(&updates.updates_retried_timeout)),
            (
                "reason=\"registered\"".into(),
                load(&updates.updates_resent_registered),
            ),
        ],
    );
    let checkpoint = &state["checkpoint"];
    if let Some(cp) = checkpoint.as_object() {
        let series: Vec<(String, f64)> = cp
            .iter()
            .filter(|(k, _)| !k.starts_with("wal_truncat"))
            .filter_map(|(k, v)| Some((format!("stat=\"{k}\""), v.as_f64()?)))
            .collect();
        metric(
            "agora_agent_checkpoint",
            "gauge",
            "Status update log statistics",
            &series,
        );
    }
    metric(
        "agora_agent_wal_truncations_total",
        "counter",
        "Times the status update log was cut on start at its first bad record (a torn write, damage); that record and every later one were dropped",
        &one(checkpoint["wal_truncations"].as_f64().unwrap_or(0.0)),
    );
    metric(
        "agora_agent_wal_truncated_bytes_total",
        "counter",
        "Bytes cut off the status update log on start",
        &one(checkpoint["wal_truncated_bytes"].as_f64().unwrap_or(0.0)),
    );
    metric(
        "agora_agent_files_requests_total",
        "counter",
        "Sandbox file requests, by outcome",
        &[
            ("outcome=\"read\"".into(), load(&c.reads)),
            ("outcome=\"listed\"".into(), load(&c.listings)),
            ("outcome=\"forbidden\"".into(), load(&c.forbidden)),
            ("outcome=\"not_found\"".into(), load(&c.not_found)),
        ],
    );
    out
}

async fn files_root(
    State(app): State<AppState>,
    headers: HeaderMap,
    Path((framework_id, executor_id)): Path<(String, String)>,
    Query(params): Query<FileParams>,
) -> Response {
    if let Err(refusal) = may_read_sandbox(&app, &headers, &framework_id) {
        return refusal;
    }
    serve_file(app, framework_id, executor_id, String::new(), params).await
}

async fn files_path(
    State(app): State<AppState>,
    headers: HeaderMap,
    Path((framework_id, executor_id, path)): Path<(String, String, String)>,
    Query(params): Query<FileParams>,
) -> Response {
    if let Err(refusal) = may_read_sandbox(&app, &headers, &framework_id) {
        return refusal;
    }
    serve_file(app, framework_id, executor_id, path, params).await
}

/// A sandbox file window as JSON ([`files::FileChunk`]) or a directory
/// listing ([`files::Listing`]); 403 for escapes, 404 for what is missing.
async fn serve_file(
    app: AppState,
    framework_id: String,
    executor_id: String,
    path: String,
    params: FileParams,
) -> Response {
    let work_dir = app.shared.config.work_dir.clone();
    let result = tokio::task::spawn_blocking(move || {
        match files::open(
            &work_dir,
            &framework_id,
            &executor_id,
            params.run.as_deref(),
            &path,
        )? {
            Target::Dir(listing) => Ok(serde_json::to_value(listing).unwrap_or_default()),
            Target::File { mut file, run_id } => {
                let chunk = files::read_chunk(
                    &mut file,
                    &path,
                    run_id,
                    params.offset.unwrap_or(0),
                    params.length.unwrap_or(files::DEFAULT_READ_LENGTH),
                )?;
                Ok(serde_json::to_value(chunk).unwrap_or_default())
            }
        }
    })
    .await;
    let c = &app.counters;
    match result {
        Ok(Ok(value)) => {
            if value.get("entries").is_some() {
                c.listings.fetch_add(1, Ordering::Relaxed);
            } else {
                c.reads.fetch_add(1, Ordering::Relaxed);
            }
            Json(value).into_response()
        }
        Ok(Err(e)) => {
            let code = match &e {
                FileError::Forbidden(_) => {
                    c.forbidden.fetch_add(1, Ordering::Relaxed);
                    StatusCode::FORBIDDEN
                }
                FileError::NotFound(_) => {
                    c.not_found.fetch_add(1, Ordering::Relaxed);
                    StatusCode::NOT_FOUND
                }
                FileError::Io(_) => StatusCode::INTERNAL_SERVER_ERROR,
            };
            tracing::debug!(error = %e, "sandbox file request refused");
            (code, e.to_string()).into_response()
        }
        Err(_) => (StatusCode::INTERNAL_SERVER_ERROR, "file read failed").into_response(),
    }
}

/// `/monitor/statistics` (and `/containers`): what each executor's
/// container uses, with Mesos's `ResourceStatistics` names; an empty list
/// without `--isolation cgroups`.
async fn statistics(State(app): State<AppState>) -> Response {
    let Some(state) = core_state(&app).await else {
        return (StatusCode::SERVICE_UNAVAILABLE, "agent stopping").into_response();
    };
    let monitor = app.monitor.clone();
    let usage = tokio::task::spawn_blocking(move || monitor.usage(&state))
        .await
        .unwrap_or_default();
    let now = agora_proto::now_timestamp();
    let entries: Vec<serde_json::Value> = usage.iter().map(|u| u.to_json(now)).collect();
    Json(entries).into_response()
}

async fn state(State(app): State<AppState>) -> Response {
    match core_state(&app).await {
        Some(v) => Json(&*v).into_response(),
        None => (StatusCode::SERVICE_UNAVAILABLE, "agent stopping").into_response(),
    }
}

async fn executor_ws(
    ws: WebSocketUpgrade,
    State(app): State<AppState>,
    connection: Option<axum::Extension<agora_net::Connection>>,
) -> Response {
    let connection = connection.map(|axum::Extension(c)| c);
    ws.max_message_size(agora_proto::MAX_FRAME_BYTES)
        .max_frame_size(agora_proto::MAX_FRAME_BYTES)
        .on_upgrade(move |socket| serve_executor(socket, app, connection))
}

fn is_too_large(e: &axum::Error) -> bool {
    let text = e.to_string();
    text.contains("Space limit exceeded") || text.contains("too long") || text.contains("too big")
}

/// Serves one executor connection: this task reads and decodes frames
/// and hands calls to the core, waiting when the core's queue is full; a
/// writer task of its own drains the events the core queues meanwhile,
/// so waiting on the core never stops acknowledgements going out. While
/// more than `--executor-outbox` events wait to be written, no further
/// frame is read: an executor that does not read is slowed, not buffered.
async fn serve_executor(ws: WebSocket, app: AppState, connection: Option<agora_net::Connection>) {
    let conn = app.shared.next_conn_id();
    let (events_tx, events_rx) = mpsc::unbounded_channel();
    let (close_tx, close_rx) = watch::channel(None);
    let link = ExecLink {
        events: events_tx,
        unwritten: Arc::default(),
        close: Arc::new(close_tx),
        limit: app.shared.config.executor_outbox.max(1),
        stall: app.shared.config.executor_stall_timeout,
    };
    let done = CancellationToken::new();
    if let Some(connection) = &connection {
        // A message's bytes are charged to the body budget until it is
        // whole, and it has the body deadline to arrive.
        connection.meter_messages(&app.bodies, agora_proto::MAX_FRAME_BYTES);
    }
    let (sink, mut stream) = ws.split();
    let mut writer = tokio::spawn(write_executor(
        sink,
        events_rx,
        link.unwritten.clone(),
        link.limit,
        close_rx,
        done.clone(),
    ));
    let mut subscribed = false;
    let subscribe_timeout = app.shared.config.executor_subscribe_timeout;
    let subscribe_by = tokio::time::Instant::now() + subscribe_timeout;
    loop {
        while link.unwritten.count.load(Ordering::Acquire) > link.limit {
            tokio::select! {
                _ = done.cancelled() => break,
                _ = link.unwritten.drained.notified() => {}
            }
        }
        // A connection that has not subscribed within the deadline is
        // closed: a process that connects and says nothing holds nothing.
        let deadline = async {
            if subscribed {
                std::future::pending::<()>().await
            } else {
                tokio::time::sleep_until(subscribe_by).await
            }
        };
        let frame = tokio::select! {
            _ = done.cancelled() => break,
            frame = stream.next() => frame,
            () = deadline => {
                link.close(
                    1008,
                    format!("no SUBSCRIBE within {subscribe_timeout:?} of connecting"),
                );
                break;
            }
        };
        if let (Some(Ok(_)), Some(connection)) = (&frame, &connection) {
            connection.message_done();
        }
        let text = match frame {
            None | Some(Ok(Message::Close(_))) => break,
            Some(Err(e)) => {
                if is_too_large(&e) {
                    link.close(
                        1009,
                        format!(
                            "frame exceeds the {}-byte limit",
                            agora_proto::MAX_FRAME_BYTES
                        ),
                    );
                }
                break;
            }
            Some(Ok(Message::Binary(_))) => {
                let message = agora_proto::DecodeError::Binary.to_string();
                link.reply(Event::Error {
                    message,
                    fatal: false,
                });
                continue;
            }
            Some(Ok(Message::Text(text))) => text,
            Some(Ok(_)) => continue,
        };
        let call = match agora_proto::decode::<Call>(text.as_str()) {
            Ok(call) => call,
            Err(e) => {
                link.reply(Event::Error {
                    message: e.to_string(),
                    fatal: false,
                });
                continue;
            }
        };
        let event = match call {
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
                    link.reply(Event::Error {
                        message: message.clone(),
                        fatal: true,
                    });
                    link.close(1002, message);
                    break;
                }
                subscribed = true;
                // An executor of this agent's (its token is this agent's):
                // no longer counted among connections that may be closed
                // for room.
                if let Some(connection) = &connection {
                    if app.shared.identity.verify(&token).is_ok() {
                        connection.establish();
                    }
                }
                CoreEvent::ExecutorSubscribe {
                    conn,
                    link: link.clone(),
                    framework_id,
                    executor_id,
                    token: Some(token),
                    updates: unacknowledged_updates,
                    tasks: unacknowledged_tasks,
                }
            }
            _ if !subscribed => {
                link.reply(Event::Error {
                    message: "subscribe first".to_string(),
                    fatal: false,
                });
                continue;
            }
            call => CoreEvent::Input(Input::ExecutorCall { conn, call }),
        };
        let forwarded = tokio::select! {
            r = app.core.send(event) => r.is_ok(),
            _ = done.cancelled() => false,
        };
        if !forwarded {
            break;
        }
    }
    // Everything read was handed over before this: the core learns of
    // the disconnection after the connection's last call.
    if subscribed {
        let _ = app
            .core
            .send(CoreEvent::Input(Input::ExecutorDisconnected { conn }))
            .await;
    }
    // Let the writer finish what is queued (a close frame, an error).
    drop(link);
    if tokio::time::timeout(WRITER_LINGER, &mut writer)
        .await
        .is_err()
    {
        writer.abort();
    }
}

/// Writes what the core queues for one executor, everything already
/// queued with one flush, until a close is asked for (written as a close
/// frame after what was queued before it), every sender is gone, a write
/// fails, or `done` fires.
async fn write_executor(
    mut sink: futures::stream::SplitSink<WebSocket, Message>,
    mut events: mpsc::UnboundedReceiver<Box<Event>>,
    unwritten: Arc<Unwritten>,
    limit: usize,
    mut close: watch::Receiver<Option<CloseFrame>>,
    done: CancellationToken,
) {
    loop {
        let asked = close.borrow_and_update().clone();
        if let Some(frame) = asked {
            // What was queued before the close goes first (the error that
            // explains it, say), as far as time allows.
            let flush = async {
                while let Ok(event) = events.try_recv() {
                    sink.feed(Message::text(agora_proto::encode(&*event)))
                        .await?;
                }
                sink.send(Message::Close(Some(frame))).await
            };
            let _ = tokio::time::timeout(WRITER_LINGER, flush).await;
            break;
        }
        let first = tokio::select! {
            biased;
            _ = done.cancelled() => break,
            changed = close.changed() => {
                if changed.is_err() {
                    break;
                }
                continue;
            }
            event = events.recv() => match event {
                Some(event) => event,
                None => break,
            },
        };
        let batch = async {
            let mut written = sink
                .feed(Message::text(agora_proto::encode(&*first)))
                .await
                .is_ok();
            let mut queued = 1;
            while written && queued < WRITE_BATCH {
                let Ok(event) = events.try_recv() else { break };
                written = sink
                    .feed(Message::text(agora_proto::encode(&*event)))
                    .await
                    .is_ok();
                queued += 1;
            }
            (written && sink.flush().await.is_ok()).then_some(queued)
        };
        // A write to an executor that reads nothing never completes: a
        // close asked for meanwhile gives it a moment, then ends the
        // connection.
        let closing = async {
            let _ = close.changed().await;
            tokio::time::sleep(WRITER_LINGER).await;
        };
        let queued = tokio::select! {
            queued = batch => queued,
            _ = done.cancelled() => None,
            _ = closing => None,
        };
        let Some(queued) = queued else {
            break;
        };
        let left = unwritten.count.fetch_sub(queued, Ordering::AcqRel) - queued;
        if left < limit {
            unwritten.full_since_ms.store(0, Ordering::Release);
        }
        unwritten.drained.notify_one();
    }
    // The reader stops too: a connection we no longer write is over.
    done.cancel();
}
