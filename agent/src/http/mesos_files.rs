//! Mesos's files API on the agent: `/files/read`, `/files/browse`,
//! `/files/download` and `/files/debug` (each also with Mesos's `.json`
//! suffix), naming a sandbox file by one `path` query parameter (see
//! [`crate::files::MesosPath`]). The same checks as `/files/FID/EID/…`:
//! operator authentication (`--authenticate-http`), the `access_sandboxes`
//! ACL of the path's framework, and the sandbox confinement of
//! [`crate::files`]. Errors are Mesos's: `400` for a bad query, `403` for
//! a refused path, `404` for what is not there.

use std::sync::atomic::Ordering;

use axum::body::Body;
use axum::extract::{Query, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use serde::Deserialize;

use super::{may_read_sandbox, AppState};
use crate::files::{FileError, MesosPath, Target};

/// Query of `/files/read`, `/files/browse` and `/files/download`; the
/// numbers as text, so a bad one gets Mesos's `400` with a message.
#[derive(Debug, Default, Deserialize)]
struct MesosFileParams {
    path: Option<String>,
    offset: Option<String>,
    length: Option<String>,
}

/// The routes, added to the agent's router (before its layers).
pub(super) fn routes(router: Router<AppState>) -> Router<AppState> {
    router
        .route("/files/read", get(read))
        .route("/files/read.json", get(read))
        .route("/files/browse", get(browse))
        .route("/files/browse.json", get(browse))
        .route("/files/download", get(download))
        .route("/files/download.json", get(download))
        .route("/files/debug", get(debug))
        .route("/files/debug.json", get(debug))
}

fn bad_request(message: impl Into<String>) -> Response {
    (StatusCode::BAD_REQUEST, message.into()).into_response()
}

/// The parsed `path`, after the ACL of its framework; `Err` the answer.
#[allow(clippy::result_large_err)] // the error is the answer
fn checked_path(
    app: &AppState,
    headers: &HeaderMap,
    params: &MesosFileParams,
) -> Result<(String, MesosPath), Response> {
    let Some(path) = params.path.clone() else {
        return Err(bad_request("Expecting 'path=value' in query."));
    };
    let parsed =
        MesosPath::parse(&app.shared.config.work_dir, &path).map_err(|e| refusal(app, e))?;
    may_read_sandbox(app, headers, &parsed.framework_id)?;
    Ok((path, parsed))
}

fn refusal(app: &AppState, e: FileError) -> Response {
    let c = &app.counters;
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

/// Runs `f` on a blocking thread; its `FileError` becomes the answer.
async fn blocking<T: Send + 'static>(
    app: &AppState,
    f: impl FnOnce() -> Result<T, FileError> + Send + 'static,
) -> Result<T, Response> {
    match tokio::task::spawn_blocking(f).await {
        Ok(Ok(value)) => Ok(value),
        Ok(Err(e)) => Err(refusal(app, e)),
        Err(_) => Err((StatusCode::INTERNAL_SERVER_ERROR, "file read failed").into_response()),
    }
}

/// `GET /files/read?path=&offset=&length=`: `{"data", "offset"}`
/// ([`crate::files::read_mesos`]).
async fn read(
    State(app): State<AppState>,
    headers: HeaderMap,
    Query(params): Query<MesosFileParams>,
) -> Response {
    let (_, path) = match checked_path(&app, &headers, &params) {
        Ok(p) => p,
        Err(answer) => return answer,
    };
    let offset = match params.offset.as_deref().map(str::parse::<i64>) {
        None => -1,
        Some(Ok(o)) if o >= -1 => o,
        Some(Ok(_)) => return bad_request("Negative offset provided."),
        Some(Err(e)) => return bad_request(format!("Failed to parse offset: {e}")),
    };
    let length = match params.length.as_deref().map(str::parse::<i64>) {
        None => None,
        Some(Ok(-1)) => None,
        Some(Ok(l)) if l >= 0 => Some(l as usize),
        Some(Ok(_)) => return bad_request("Negative length provided."),
        Some(Err(e)) => return bad_request(format!("Failed to parse length: {e}")),
    };
    let work_dir = app.shared.config.work_dir.clone();
    let result = blocking(&app, move || match path.open(&work_dir)? {
        Target::Dir(_) => Ok(None),
        Target::File { mut file, .. } => {
            crate::files::read_mesos(&mut file, offset, length).map(Some)
        }
    })
    .await;
    match result {
        Ok(Some(value)) => {
            app.counters.reads.fetch_add(1, Ordering::Relaxed);
            Json(value).into_response()
        }
        Ok(None) => bad_request("Cannot read a directory."),
        Err(answer) => answer,
    }
}

/// `GET /files/browse?path=`: the directory's entries, Mesos's
/// `[{"path", "nlink", "size", "mtime", "mode", "uid", "gid"}]`.
async fn browse(
    State(app): State<AppState>,
    headers: HeaderMap,
    Query(params): Query<MesosFileParams>,
) -> Response {
    let (asked, path) = match checked_path(&app, &headers, &params) {
        Ok(p) => p,
        Err(answer) => return answer,
    };
    let work_dir = app.shared.config.work_dir.clone();
    match blocking(&app, move || path.browse(&work_dir, &asked)).await {
        Ok(entries) => {
            app.counters.listings.fetch_add(1, Ordering::Relaxed);
            Json(entries).into_response()
        }
        Err(answer) => answer,
    }
}

/// `GET /files/download?path=`: the file itself, as an attachment
/// (`application/octet-stream`), streamed.
async fn download(
    State(app): State<AppState>,
    headers: HeaderMap,
    Query(params): Query<MesosFileParams>,
) -> Response {
    let (_, path) = match checked_path(&app, &headers, &params) {
        Ok(p) => p,
        Err(answer) => return answer,
    };
    let work_dir = app.shared.config.work_dir.clone();
    let name = path
        .relative
        .trim_end_matches('/')
        .rsplit('/')
        .next()
        .unwrap_or_default()
        .to_string();
    let opened = blocking(&app, move || match path.open(&work_dir)? {
        Target::Dir(_) => Ok(None),
        Target::File { file, .. } => Ok(Some(file)),
    })
    .await;
    let file = match opened {
        Ok(Some(file)) => file,
        Ok(None) => return bad_request("Cannot download a directory."),
        Err(answer) => return answer,
    };
    app.counters.reads.fetch_add(1, Ordering::Relaxed);
    let size = file.metadata().map(|m| m.len()).unwrap_or(0);
    let stream = tokio_util::io::ReaderStream::new(tokio::fs::File::from_std(file));
    // A name is a plain path component (checked): only quotes need care.
    let disposition = format!("attachment; filename=\"{}\"", name.replace('"', "_"));
    Response::builder()
        .header(header::CONTENT_TYPE, "application/octet-stream")
        .header(header::CONTENT_DISPOSITION, disposition)
        .header(header::CONTENT_LENGTH, size)
        .body(Body::from_stream(stream))
        .unwrap_or_else(|_| StatusCode::INTERNAL_SERVER_ERROR.into_response())
}

/// `GET /files/debug`: the paths served, as Mesos's map of virtual path
/// to real path: each known executor's sandbox, under its real path and
/// its `/frameworks/FID/executors/EID/runs/latest` (the frameworks the
/// requester may read the sandboxes of).
async fn debug(State(app): State<AppState>, headers: HeaderMap) -> Response {
    let snapshot = app.snapshots.borrow().clone();
    let mut map = serde_json::Map::new();
    for framework in snapshot["frameworks"].as_array().into_iter().flatten() {
        let Some(fid) = framework["id"].as_str() else {
            continue;
        };
        if may_read_sandbox(&app, &headers, fid).is_err() {
            continue;
        }
        for executor in framework["executors"].as_array().into_iter().flatten() {
            let (Some(eid), Some(sandbox)) =
                (executor["id"].as_str(), executor["sandbox"].as_str())
            else {
                continue;
            };
            let latest = format!("/frameworks/{fid}/executors/{eid}/runs/latest");
            map.insert(sandbox.to_string(), sandbox.into());
            map.insert(latest, sandbox.into());
        }
    }
    Json(serde_json::Value::Object(map)).into_response()
}
