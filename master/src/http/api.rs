//! The paginated list endpoints the web UI and the `agora` CLI read
//! (`/api/v1/agents`, `/api/v1/frameworks`, `/api/v1/tasks`,
//! `/api/v1/summary`) and the live feed `/events` (server-sent events).
//!
//! All of them read the latest published snapshot: a page of 100 tasks out
//! of 100 000 costs one filtered scan of the snapshot, not a copy of it, and
//! nothing here waits for the state task.

use std::convert::Infallible;
use std::time::Duration;

use axum::extract::{Query, State};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::Json;
use futures::Stream;
use serde::{Deserialize, Serialize};
use serde_json::json;

use super::AppState;
use crate::state::{AgentState, StateSnapshot, TaskView};

/// Items per page when `limit` is not given.
const DEFAULT_LIMIT: usize = 100;
/// Largest page a client may ask for.
const MAX_LIMIT: usize = 10_000;
/// Least time between two `/events` messages.
const EVENTS_INTERVAL: Duration = Duration::from_secs(1);

/// Query parameters of the list endpoints. Unknown parameters are ignored.
#[derive(Debug, Default, Deserialize)]
pub(crate) struct ListParams {
    /// Items to skip (default 0).
    offset: Option<usize>,
    /// Page size (default 100, at most 10 000).
    limit: Option<usize>,
    /// Case-insensitive substring of an id, name or hostname.
    q: Option<String>,
    /// Task states, comma-separated: `running`, `TASK_RUNNING`, and the
    /// groups `active` (not terminal) and `terminal`.
    state: Option<String>,
    /// Only tasks of this framework.
    framework_id: Option<String>,
    /// Only tasks on this agent.
    agent_id: Option<String>,
}

/// One page of a list.
#[derive(Debug, Serialize)]
struct Page<T> {
    /// Items matching the filters, in all pages.
    total: usize,
    offset: usize,
    limit: usize,
    items: Vec<T>,
}

/// A task with where its sandbox can be read.
#[derive(Debug, Serialize)]
struct TaskItem<'a> {
    #[serde(flatten)]
    task: &'a TaskView,
    /// `host:port` of the agent's HTTP endpoint (its `/files/…`), when
    /// the agent is still known.
    agent_address: Option<&'a str>,
    agent_hostname: Option<&'a str>,
}

/// A compiled `state` filter.
struct StateFilter(Vec<String>);

// === impl ListParams ===

impl ListParams {
    fn window(&self) -> (usize, usize) {
        (
            self.offset.unwrap_or(0),
            self.limit.unwrap_or(DEFAULT_LIMIT).clamp(1, MAX_LIMIT),
        )
    }

    fn query(&self) -> Option<String> {
        self.q
            .as_deref()
            .map(str::trim)
            .filter(|q| !q.is_empty())
            .map(str::to_ascii_lowercase)
    }
}

// === impl StateFilter ===

impl StateFilter {
    fn parse(text: Option<&str>) -> Option<Self> {
        let names: Vec<String> = text?
            .split(',')
            .map(|s| s.trim().to_ascii_uppercase())
            .filter(|s| !s.is_empty())
            .map(|s| match s.as_str() {
                "ACTIVE" | "TERMINAL" => s,
                _ if s.starts_with("TASK_") => s,
                _ => format!("TASK_{s}"),
            })
            .collect();
        (!names.is_empty()).then_some(StateFilter(names))
    }

    fn matches(&self, state: agora_proto::TaskState) -> bool {
        self.0.iter().any(|n| match n.as_str() {
            "ACTIVE" => !state.is_terminal(),
            "TERMINAL" => state.is_terminal(),
            name => state.as_str() == name,
        })
    }
}

fn contains(haystack: &str, needle_lower: &str) -> bool {
    haystack.to_ascii_lowercase().contains(needle_lower)
}

fn page<T, I: Iterator<Item = T>>(items: I, offset: usize, limit: usize) -> Page<T> {
    let mut total = 0;
    let mut out = Vec::new();
    for item in items {
        if total >= offset && out.len() < limit {
            out.push(item);
        }
        total += 1;
    }
    Page {
        total,
        offset,
        limit,
        items: out,
    }
}

fn find_agent<'a>(
    snapshot: &'a StateSnapshot,
    id: &agora_proto::AgentId,
) -> Option<&'a AgentState> {
    snapshot
        .agents
        .binary_search_by(|a| a.id.cmp(id))
        .ok()
        .map(|i| &**snapshot.agents[i])
}

/// `GET /api/v1/summary`: counts and resource totals (as in `/events`),
/// of what the requester may view.
pub(crate) async fn summary(
    State(app): State<AppState>,
    headers: axum::http::HeaderMap,
) -> Response {
    let snapshot = app.snapshot_for(&headers);
    Json(summary_json(&snapshot)).into_response()
}

fn summary_json(snapshot: &StateSnapshot) -> serde_json::Value {
    json!({
        "master": snapshot.master,
        "started_at": snapshot.started_at,
        "generated_at": snapshot.generated_at,
        "summary": snapshot.summary,
        "roles": snapshot.roles,
    })
}

/// `GET /api/v1/agents?offset&limit&q`: agents by id; `q` matches id,
/// hostname or address. Custom executors of frameworks the requester may
/// not view are left out.
pub(crate) async fn agents(
    State(app): State<AppState>,
    headers: axum::http::HeaderMap,
    Query(params): Query<ListParams>,
) -> Response {
    let snapshot = app.snapshot_for(&headers);
    let (offset, limit) = params.window();
    let q = params.query();
    let items = snapshot.agents.iter().map(|a| &***a).filter(|a| {
        q.as_deref().is_none_or(|q| {
            contains(a.id.as_str(), q) || contains(&a.hostname, q) || contains(&a.address, q)
        })
    });
    Json(page(items, offset, limit)).into_response()
}

/// `GET /api/v1/frameworks?offset&limit&q`: frameworks without their task
/// lists (those are paged by `/api/v1/tasks?framework_id=`), with task
/// counts by state instead.
pub(crate) async fn frameworks(
    State(app): State<AppState>,
    headers: axum::http::HeaderMap,
    Query(params): Query<ListParams>,
) -> Response {
    let snapshot = app.snapshot_for(&headers);
    let (offset, limit) = params.window();
    let q = params.query();
    let items = snapshot
        .frameworks
        .iter()
        .filter(|f| {
            q.as_deref()
                .is_none_or(|q| contains(f.id.as_str(), q) || contains(&f.name, q))
        })
        .map(|f| {
            let mut by_state = std::collections::BTreeMap::new();
            for t in f.tasks.iter() {
                *by_state.entry(t.state).or_insert(0usize) += 1;
            }
            json!({
                "id": f.id,
                "name": f.name,
                "roles": f.roles,
                "connected": f.connected,
                "suppressed": f.suppressed,
                "recovered": f.recovered,
                "failover_timeout": f.failover_timeout,
                "offers": f.offers,
                "used": f.used,
                "offered": f.offered,
                "shares": f.shares,
                "tasks": f.tasks.len(),
                "tasks_by_state": by_state,
                "registered_at": f.registered_at,
            })
        });
    Json(page(items, offset, limit)).into_response()
}

/// `GET /api/v1/tasks?offset&limit&q&state&framework_id&agent_id`: active
/// tasks (by framework, then id), then the completed ones (oldest first).
/// `q` matches the task's id or name.
pub(crate) async fn tasks(
    State(app): State<AppState>,
    headers: axum::http::HeaderMap,
    Query(params): Query<ListParams>,
) -> Response {
    let snapshot = app.snapshot_for(&headers);
    let (offset, limit) = params.window();
    let q = params.query();
    let states = StateFilter::parse(params.state.as_deref());
    let items = snapshot.all_tasks().filter(|t| {
        params
            .framework_id
            .as_deref()
            .is_none_or(|f| t.framework_id.as_str() == f)
            && params
                .agent_id
                .as_deref()
                .is_none_or(|a| t.agent_id.as_str() == a)
            && states.as_ref().is_none_or(|s| s.matches(t.state))
            && q.as_deref()
                .is_none_or(|q| contains(t.id.as_str(), q) || contains(&t.name, q))
    });
    // Only the page's items are looked up and copied.
    let found = page(items, offset, limit);
    let items = found
        .items
        .into_iter()
        .map(|t| {
            let agent = find_agent(&snapshot, &t.agent_id);
            TaskItem {
                task: t,
                agent_address: agent.map(|a| a.address.as_str()),
                agent_hostname: agent.map(|a| a.hostname.as_str()),
            }
        })
        .collect();
    Json(Page {
        items,
        total: found.total,
        offset,
        limit,
    })
    .into_response()
}

/// `GET /events`: server-sent events named `summary`, each carrying the
/// JSON of `/api/v1/summary` (as the requester may view it), sent when a
/// new snapshot is published and at most once a second. Ends when the
/// master shuts down.
pub(crate) async fn events(
    State(app): State<AppState>,
    headers: axum::http::HeaderMap,
) -> Sse<impl Stream<Item = Result<Event, Infallible>>> {
    let rx = app.snapshot.clone();
    let shutdown = app.shutdown.clone();
    let viewer = app.viewer(&headers);
    let stream = futures::stream::unfold((rx, shutdown, true), move |(mut rx, shutdown, first)| {
        let viewer = viewer.clone();
        async move {
            if !first {
                tokio::select! {
                    _ = shutdown.cancelled() => return None,
                    _ = tokio::time::sleep(EVENTS_INTERVAL) => {}
                }
                tokio::select! {
                    _ = shutdown.cancelled() => return None,
                    changed = rx.changed() => changed.ok()?,
                }
            }
            let snapshot = rx.borrow_and_update().clone();
            let snapshot = viewer.view(snapshot);
            let event = Event::default()
                .event("summary")
                .data(summary_json(&snapshot).to_string());
            Some((Ok(event), (rx, shutdown, false)))
        }
    });
    Sse::new(stream).keep_alive(KeepAlive::default())
}

#[cfg(test)]
mod tests {
    use super::*;
    use agora_proto::TaskState;

    #[test]
    fn state_filters() {
        let f = StateFilter::parse(Some("running, task_finished")).unwrap();
        assert!(f.matches(TaskState::Running));
        assert!(f.matches(TaskState::Finished));
        assert!(!f.matches(TaskState::Failed));
        let f = StateFilter::parse(Some("active")).unwrap();
        assert!(f.matches(TaskState::Staging));
        assert!(!f.matches(TaskState::Lost));
        assert!(StateFilter::parse(Some(" , ")).is_none());
        assert!(StateFilter::parse(None).is_none());
    }

    #[test]
    fn pages_count_everything_and_keep_one_window() {
        let p = page(0..25, 10, 5);
        assert_eq!((p.total, p.items), (25, vec![10, 11, 12, 13, 14]));
        let p = page(0..3, 10, 5);
        assert_eq!((p.total, p.items.len()), (3, 0));
    }
}
