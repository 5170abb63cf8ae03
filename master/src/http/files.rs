//! Mesos's files API on the master: `/files/read`, `/files/browse` and
//! `/files/download` (and their `.json` forms) name a sandbox by its
//! `path`, which only the agent that holds it serves. The master finds
//! that agent by the framework and executor the path names (the virtual
//! `/frameworks/FID/executors/EID/runs/…` or the agent's real
//! `…/frameworks/FID/executors/EID/runs/RUN/…`) and answers `307
//! Temporary Redirect` to the same request on the agent; `404` with a
//! message when no agent it knows (of those the requester may view) runs
//! or ran that executor. `/files/debug` answers the master's own map of
//! served paths, which is empty: the master serves no file itself.

use axum::extract::{Query, State};
use axum::http::{header, HeaderMap, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use serde::Deserialize;

use super::AppState;
use crate::state::StateSnapshot;

#[derive(Debug, Default, Deserialize)]
struct PathParam {
    path: Option<String>,
}

/// The routes, added to the master's router.
pub(super) fn routes(router: Router<AppState>) -> Router<AppState> {
    router
        .route("/files/read", get(redirect))
        .route("/files/read.json", get(redirect))
        .route("/files/browse", get(redirect))
        .route("/files/browse.json", get(redirect))
        .route("/files/download", get(redirect))
        .route("/files/download.json", get(redirect))
        .route(
            "/files/debug",
            get(|| async { Json(serde_json::json!({})) }),
        )
        .route(
            "/files/debug.json",
            get(|| async { Json(serde_json::json!({})) }),
        )
}

/// The framework and executor ids of a sandbox path: the last
/// `/frameworks/FID/executors/EID/runs/` in it (a work dir may itself
/// hold the word `frameworks`).
fn sandbox_of(path: &str) -> Option<(&str, &str)> {
    let mut found = None;
    let mut rest = path;
    let mut base = 0;
    while let Some(i) = rest.find("/frameworks/") {
        let start = base + i + "/frameworks/".len();
        let mut parts = path[start..].splitn(5, '/');
        if let (Some(fid), Some("executors"), Some(eid), Some("runs"), Some(_)) = (
            parts.next(),
            parts.next(),
            parts.next(),
            parts.next(),
            parts.next(),
        ) {
            if !fid.is_empty() && !eid.is_empty() {
                found = Some((fid, eid));
            }
        }
        base = start;
        rest = &path[start..];
    }
    found
}

/// The address (`host:port`) of the agent that runs or ran executor
/// `eid` of framework `fid` (a command task's executor id is its task
/// id), among what `snapshot` shows.
fn agent_of(snapshot: &StateSnapshot, fid: &str, eid: &str) -> Option<String> {
    let by_executor = snapshot.agents.iter().find(|a| {
        a.executors
            .iter()
            .zip(&a.executor_frameworks)
            .any(|(e, f)| e.as_str() == eid && f.as_str() == fid)
    });
    if let Some(agent) = by_executor {
        return Some(agent.address.clone());
    }
    let task = snapshot.all_tasks().find(|t| {
        t.framework_id.as_str() == fid && (t.executor_id.as_str() == eid || t.id.as_str() == eid)
    })?;
    snapshot
        .agents
        .iter()
        .find(|a| a.id == task.agent_id)
        .map(|a| a.address.clone())
}

async fn redirect(
    State(app): State<AppState>,
    headers: HeaderMap,
    uri: Uri,
    Query(params): Query<PathParam>,
) -> Response {
    let Some(path) = params.path else {
        return (StatusCode::BAD_REQUEST, "Expecting 'path=value' in query.").into_response();
    };
    let Some((fid, eid)) = sandbox_of(&path) else {
        return (
            StatusCode::NOT_FOUND,
            format!(
                "{path}: not a sandbox path (the master redirects paths of the form \
                 /frameworks/FID/executors/EID/runs/RUN/... to the agent that holds them)"
            ),
        )
            .into_response();
    };
    let snapshot = app.snapshot_for(&headers);
    let Some(address) = agent_of(&snapshot, fid, eid).filter(|a| !a.is_empty()) else {
        return (
            StatusCode::NOT_FOUND,
            format!("no known agent holds the sandbox of executor {eid} of framework {fid}"),
        )
            .into_response();
    };
    let query = uri.query().map(|q| format!("?{q}")).unwrap_or_default();
    let location = format!("http://{address}{}{query}", uri.path());
    (
        StatusCode::TEMPORARY_REDIRECT,
        [(header::LOCATION, location.clone())],
        format!("the sandbox is on the agent at {address}: {location}"),
    )
        .into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sandbox_paths_name_their_framework_and_executor() {
        assert_eq!(
            sandbox_of("/frameworks/f1/executors/e1/runs/latest/stdout"),
            Some(("f1", "e1"))
        );
        assert_eq!(
            sandbox_of("/srv/frameworks/w/frameworks/f1/executors/e1/runs/r1"),
            Some(("f1", "e1"))
        );
        assert_eq!(sandbox_of("/frameworks/f1/executors/e1"), None);
        assert_eq!(sandbox_of("/etc/passwd"), None);
    }
}
