//! The JSON endpoints Mesos tools scrape, in Mesos's shapes, from the
//! latest `/state` snapshot: `/master/state` (also `/state.json` and
//! `/master/state.json`, which mesos-dns still asks for),
//! `/master/state-summary`, `/slaves`, `/frameworks` and `/tasks` (the
//! Mesos CLI's and UIs' lists), `/metrics/snapshot` (the keys
//! mesos_exporter reads), `/master/redirect`, `/master/version` and
//! `/master/health`. Each list is of what the requester may view.
//!
//! `/master/state` omits `pid` for frameworks (they are HTTP frameworks:
//! mesos-dns parses every `pid` it finds as a libprocess UPID) and writes
//! `leader` as `master@ip:port`.

use std::collections::BTreeMap;

use agora_mesos_proto::convert::ResourceStyle;
use agora_proto::{Resources, TaskState};
use axum::extract::{RawQuery, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::{json, Map, Value};

use super::{version_json, MesosState};
use crate::frameworks::CompletedFramework;
use crate::http::AppState;
use crate::state::{AgentState, FrameworkState, StateSnapshot, TaskView};
use crate::tasks::StatusRecord;

pub(crate) async fn version() -> Json<Value> {
    Json(version_json())
}

pub(crate) async fn health() -> StatusCode {
    StatusCode::OK
}

/// 307 to the leading master, `Location: //host:port` as Mesos writes it.
/// (A standby answers through the high-availability gate instead.)
pub(crate) async fn redirect(State(state): State<MesosState>) -> Response {
    let address = state.app.snapshot.borrow().master.address.clone();
    let mut response = StatusCode::TEMPORARY_REDIRECT.into_response();
    if let Ok(location) = HeaderValue::from_str(&format!("//{address}")) {
        response.headers_mut().insert(header::LOCATION, location);
    }
    response
}

pub(crate) async fn state(State(state): State<MesosState>, headers: HeaderMap) -> Response {
    let snapshot = state.app.snapshot_for(&headers);
    match tokio::task::spawn_blocking(move || master_state(&snapshot)).await {
        Ok(body) => Json(body).into_response(),
        Err(e) => (StatusCode::INTERNAL_SERVER_ERROR, e.to_string()).into_response(),
    }
}

pub(crate) async fn state_summary(State(state): State<MesosState>, headers: HeaderMap) -> Response {
    let snapshot = state.app.snapshot_for(&headers);
    match tokio::task::spawn_blocking(move || master_state_summary(&snapshot)).await {
        Ok(body) => Json(body).into_response(),
        Err(e) => (StatusCode::INTERNAL_SERVER_ERROR, e.to_string()).into_response(),
    }
}

pub(crate) async fn metrics_snapshot(
    State(state): State<MesosState>,
) -> Json<BTreeMap<String, f64>> {
    let snapshot = state.app.snapshot.borrow().clone();
    Json(metrics(&state.app, &snapshot))
}

/// How many tasks `/tasks` lists without a `limit` (Mesos's `TASK_LIMIT`).
pub(crate) const TASK_LIMIT: usize = 100;

/// `/slaves` (and `/master/slaves`): the agents as `/master/state` shows
/// them, with the `*_full` resource lists Mesos adds here; `slave_id`
/// selects one.
pub(crate) async fn slaves(
    State(state): State<MesosState>,
    headers: HeaderMap,
    RawQuery(query): RawQuery,
) -> Response {
    let snapshot = state.app.snapshot_for(&headers);
    let query = query.unwrap_or_default();
    match tokio::task::spawn_blocking(move || master_slaves(&snapshot, &Query(&query))).await {
        Ok(body) => Json(body).into_response(),
        Err(e) => (StatusCode::INTERNAL_SERVER_ERROR, e.to_string()).into_response(),
    }
}

/// `/frameworks` (and `/master/frameworks`): the frameworks as
/// `/master/state` shows them; `framework_id` selects one.
pub(crate) async fn frameworks(
    State(state): State<MesosState>,
    headers: HeaderMap,
    RawQuery(query): RawQuery,
) -> Response {
    let snapshot = state.app.snapshot_for(&headers);
    let query = query.unwrap_or_default();
    match tokio::task::spawn_blocking(move || master_frameworks(&snapshot, &Query(&query))).await {
        Ok(body) => Json(body).into_response(),
        Err(e) => (StatusCode::INTERNAL_SERVER_ERROR, e.to_string()).into_response(),
    }
}

/// `/tasks` (and `/master/tasks`, `/tasks.json`, `/master/tasks.json`):
/// the tasks of every framework the requester may see, with Mesos's
/// `framework_id`, `task_id`, `order`, `limit` and `offset`.
pub(crate) async fn tasks(
    State(state): State<MesosState>,
    headers: HeaderMap,
    RawQuery(query): RawQuery,
) -> Response {
    let snapshot = state.app.snapshot_for(&headers);
    let query = query.unwrap_or_default();
    match tokio::task::spawn_blocking(move || master_tasks(&snapshot, &Query(&query))).await {
        Ok(body) => Json(body).into_response(),
        Err(e) => (StatusCode::INTERNAL_SERVER_ERROR, e.to_string()).into_response(),
    }
}

/// A request's query string.
struct Query<'a>(&'a str);

impl Query<'_> {
    fn get(&self, name: &str) -> Option<String> {
        crate::http::url_form_field(self.0.as_bytes(), name)
    }

    /// A count parameter, read as Mesos reads it: an `int` (one that is
    /// absent or not an `int` takes `default`, as Mesos's `numify`
    /// failing does) made a `size_t`, so a negative one is as large as
    /// can be: `limit=-1` (the Mesos CLI's) is no limit.
    fn count(&self, name: &str, default: usize) -> usize {
        match self.get(name).and_then(|v| v.trim().parse::<i32>().ok()) {
            Some(n) => usize::try_from(n).unwrap_or(usize::MAX),
            None => default,
        }
    }
}

/// `host` and `host:port` of an address.
fn host_of(address: &str) -> &str {
    address.rsplit_once(':').map_or(address, |(h, _)| h)
}

/// Mesos's resource map: cpus, gpus, mem and disk always, other scalars,
/// and ranges in their text form (`"[31000-32000]"`).
fn resource_map(resources: &Resources) -> Value {
    let mut map = Map::new();
    for name in ["cpus", "gpus", "mem", "disk"] {
        map.insert(name.into(), json!(resources.scalar(name)));
    }
    for r in resources.iter() {
        match &r.value {
            agora_proto::Value::Scalar(_) => {
                map.entry(r.name.clone())
                    .or_insert_with(|| json!(resources.scalar(&r.name)));
            }
            other => {
                map.insert(r.name.clone(), json!(other.to_string()));
            }
        }
    }
    Value::Object(map)
}

fn reserved_map(resources: &Resources) -> Value {
    let mut roles: BTreeMap<String, Resources> = BTreeMap::new();
    for r in resources.iter().filter(|r| r.is_reserved()) {
        roles
            .entry(r.role.clone())
            .or_default()
            .add_resource(r.clone());
    }
    Value::Object(
        roles
            .into_iter()
            .map(|(role, r)| (role, resource_map(&r)))
            .collect(),
    )
}

fn attribute_map(agent: &AgentState) -> Value {
    Value::Object(
        agent
            .attributes
            .0
            .iter()
            .map(|a| {
                let value = match &a.value {
                    agora_proto::AttributeValue::Text(t) => json!(t),
                    agora_proto::AttributeValue::Scalar(v) => json!(v),
                };
                (a.name.clone(), value)
            })
            .collect(),
    )
}

fn agent_json(a: &AgentState) -> Value {
    let total = a.total.list();
    let mut agent = json!({
        "id": a.id,
        "hostname": a.hostname,
        "port": a.address.rsplit_once(':').and_then(|(_, p)| p.parse::<u16>().ok()).unwrap_or(5051),
        "pid": format!("slave(1)@{}", a.address),
        "attributes": attribute_map(a),
        "registered_time": a.registered_at,
        "resources": resource_map(total),
        "used_resources": resource_map(a.used.list()),
        "offered_resources": resource_map(a.offered.list()),
        "reserved_resources": reserved_map(total),
        "unreserved_resources": resource_map(&total.filter_roles(|r| r == agora_proto::DEFAULT_ROLE)),
        "active": a.connected,
        "deactivated": !a.connected || a.deactivated,
        "version": agora_mesos_proto::MESOS_API_VERSION,
        "capabilities": ["MULTI_ROLE", "HIERARCHICAL_ROLE", "RESERVATION_REFINEMENT"],
    });
    if let Some(drain) = &a.drain_info {
        agent["drain_info"] = serde_json::to_value(drain).unwrap_or(Value::Null);
    }
    agent
}

/// A task as Mesos's `json(Task)` writes it; `role` is the role its
/// resources were allocated to, or else its framework's first.
fn task_json(t: &TaskView, framework_role: Option<&str>) -> Value {
    let mut out = json!({
        "id": t.id,
        "name": t.name,
        "framework_id": t.framework_id,
        "executor_id": t.executor_id,
        "slave_id": t.agent_id,
        "state": t.state.as_str(),
        "resources": resource_map(t.resources.list()),
        "statuses": t.statuses.iter().map(status_json).collect::<Vec<_>>(),
    });
    if let Some(role) = t.role.as_deref().or(framework_role) {
        out["role"] = json!(role);
    }
    out
}

/// One status update as Mesos's `json(TaskStatus)` writes it: `state`,
/// `timestamp`, then `labels` and `healthy` when set.
fn status_json(s: &StatusRecord) -> Value {
    let mut out = json!({
        "state": s.state.as_str(),
        "timestamp": s.timestamp,
    });
    if !s.labels.is_empty() {
        out["labels"] = Value::Array(
            s.labels
                .iter()
                .map(|(key, value)| json!({"key": key, "value": value}))
                .collect(),
        );
    }
    if let Some(healthy) = s.healthy {
        out["healthy"] = json!(healthy);
    }
    out
}

fn framework_json(f: &FrameworkState, s: &StateSnapshot) -> Value {
    let (active, completed): (Vec<_>, Vec<_>) =
        f.tasks.iter().partition(|t| !t.state.is_terminal());
    // As Mesos: a task whose agent is unreachable is listed apart.
    let (unreachable, active): (Vec<_>, Vec<_>) = active
        .into_iter()
        .partition(|t| t.state == TaskState::Unreachable);
    let roles = &f.roles;
    let role = roles.first().map(String::as_str);
    let mut out = json!({
        "id": f.id,
        "name": f.name,
        "user": f.info.user,
        "hostname": f.info.hostname,
        "webui_url": f.info.webui_url.clone().unwrap_or_default(),
        "active": f.connected && !f.suppressed,
        "connected": f.connected,
        "recovered": f.recovered,
        "failover_timeout": f.failover_timeout,
        "checkpoint": f.info.checkpoint,
        "registered_time": f.registered_at,
        "unregistered_time": 0.0,
        "capabilities": if roles.len() > 1 { vec!["MULTI_ROLE"] } else { Vec::new() },
        "used_resources": resource_map(f.used.list()),
        "offered_resources": resource_map(f.offered.list()),
        "resources": resource_map(&(f.used.list() + f.offered.list())),
        "tasks": active.iter().map(|t| task_json(t, role)).collect::<Vec<_>>(),
        "unreachable_tasks": unreachable.iter().map(|t| task_json(t, role)).collect::<Vec<_>>(),
        "completed_tasks": completed.iter().map(|t| task_json(t, role)).collect::<Vec<_>>()
            .into_iter()
            .chain(s.completed_tasks.iter().filter(|t| t.framework_id == f.id).map(|t| task_json(t, role)))
            .collect::<Vec<_>>(),
        "offers": s.offers.iter().filter(|o| o.framework_id == f.id).map(|o| json!({
            "id": o.id,
            "framework_id": o.framework_id,
            "slave_id": o.agent_id,
            "resources": resource_map(o.resources.list()),
        })).collect::<Vec<_>>(),
        "executors": [],
    });
    if let Some(principal) = &f.info.principal {
        out["principal"] = json!(principal);
    }
    if roles.len() == 1 {
        out["role"] = json!(roles[0]);
    } else {
        out["roles"] = json!(roles);
    }
    out
}

/// A removed framework in `/master/state`'s `completed_frameworks`.
fn completed_framework_json(f: &CompletedFramework, s: &StateSnapshot) -> Value {
    let none = Resources::new();
    let role = f.info.effective_roles().into_iter().next();
    json!({
        "id": f.id,
        "name": f.info.name,
        "user": f.info.user,
        "hostname": f.info.hostname,
        "webui_url": f.info.webui_url.clone().unwrap_or_default(),
        "active": false,
        "connected": false,
        "recovered": false,
        "failover_timeout": f.info.failover_timeout,
        "checkpoint": f.info.checkpoint,
        "registered_time": f.registered_at,
        "unregistered_time": f.removed_at,
        "used_resources": resource_map(&none),
        "offered_resources": resource_map(&none),
        "resources": resource_map(&none),
        "tasks": [],
        "unreachable_tasks": [],
        "completed_tasks": s.completed_tasks.iter().filter(|t| t.framework_id == f.id).map(|t| task_json(t, role.as_deref())).collect::<Vec<_>>(),
        "offers": [],
        "executors": [],
    })
}

/// `/master/state` in Mesos's shape.
pub(crate) fn master_state(s: &StateSnapshot) -> Value {
    let host = host_of(&s.master.address);
    let pid = format!("master@{}", s.master.address);
    json!({
        "version": agora_mesos_proto::MESOS_API_VERSION,
        "agora_version": agora_proto::VERSION,
        "build_date": "",
        "build_time": 0.0,
        "build_user": "agora",
        "start_time": s.started_at,
        "elected_time": s.started_at,
        "id": s.master.id,
        "pid": pid,
        "hostname": host,
        "capabilities": ["AGENT_UPDATE"],
        "activated_slaves": s.summary.agents_connected,
        "deactivated_slaves": s.summary.agents_disconnected,
        "unreachable_slaves": 0,
        "leader": pid,
        "leader_info": agora_mesos_proto::codec::to_json_value(&agora_mesos_proto::convert::mesos_master_info(&s.master)),
        "flags": {},
        "slaves": s.agents.iter().map(|a| agent_json(a)).collect::<Vec<_>>(),
        "recovered_slaves": [],
        "frameworks": s.frameworks.iter().map(|f| framework_json(f, s)).collect::<Vec<_>>(),
        "completed_frameworks": s.completed_frameworks.iter().rev().map(|f| completed_framework_json(f, s)).collect::<Vec<_>>(),
        "orphan_tasks": [],
        "unregistered_frameworks": [],
    })
}

/// `/slaves` in Mesos's shape.
fn master_slaves(s: &StateSnapshot, query: &Query<'_>) -> Value {
    let selected = query.get("slave_id");
    let full = |r: &Resources| -> Value {
        Value::Array(
            agora_mesos_proto::convert::mesos_resources(r, &ResourceStyle::default())
                .iter()
                .map(agora_mesos_proto::codec::to_json_value)
                .collect(),
        )
    };
    let slaves: Vec<Value> = s
        .agents
        .iter()
        .filter(|a| selected.as_deref().is_none_or(|id| a.id.as_str() == id))
        .map(|a| {
            let mut v = agent_json(a);
            let total = a.total.list();
            let mut reserved: BTreeMap<String, Resources> = BTreeMap::new();
            for r in total.iter().filter(|r| r.is_reserved()) {
                reserved
                    .entry(r.role.clone())
                    .or_default()
                    .add_resource(r.clone());
            }
            v["reserved_resources_full"] = Value::Object(
                reserved
                    .iter()
                    .map(|(role, r)| (role.clone(), full(r)))
                    .collect(),
            );
            v["unreserved_resources_full"] =
                full(&total.filter_roles(|r| r == agora_proto::DEFAULT_ROLE));
            v["used_resources_full"] = full(a.used.list());
            v["offered_resources_full"] = full(a.offered.list());
            v
        })
        .collect();
    json!({
        "slaves": slaves,
        "recovered_slaves": [],
    })
}

/// `/frameworks` in Mesos's shape.
fn master_frameworks(s: &StateSnapshot, query: &Query<'_>) -> Value {
    let selected = query.get("framework_id");
    let wanted =
        |id: &agora_proto::FrameworkId| selected.as_deref().is_none_or(|s| id.as_str() == s);
    json!({
        "frameworks": s.frameworks.iter().filter(|f| wanted(&f.id)).map(|f| framework_json(f, s)).collect::<Vec<_>>(),
        "completed_frameworks": s.completed_frameworks.iter().rev().filter(|f| wanted(&f.id)).map(|f| completed_framework_json(f, s)).collect::<Vec<_>>(),
        "unregistered_frameworks": [],
    })
}

/// `/tasks` in Mesos's shape: the live and completed tasks of the
/// selected frameworks, ordered by the time of their first status update
/// (descending unless `order=asc`; tasks without one, still staging, come
/// last descending and first ascending, as Mesos's comparator puts them),
/// then `offset` and `limit`.
fn master_tasks(s: &StateSnapshot, query: &Query<'_>) -> Value {
    let framework = query.get("framework_id");
    let task = query.get("task_id");
    let ascending = query.get("order").as_deref() == Some("asc");
    let limit = query.count("limit", TASK_LIMIT);
    let offset = query.count("offset", 0);
    let selected = |t: &TaskView| {
        framework
            .as_deref()
            .is_none_or(|id| t.framework_id.as_str() == id)
            && task.as_deref().is_none_or(|id| t.id.as_str() == id)
    };
    let role_of = |fid: &agora_proto::FrameworkId| -> Option<String> {
        match s.frameworks.iter().find(|f| &f.id == fid) {
            Some(f) => f.roles.first().cloned(),
            None => s
                .completed_frameworks
                .iter()
                .find(|f| &f.id == fid)
                .and_then(|f| f.info.effective_roles().into_iter().next()),
        }
    };
    let mut tasks: Vec<&TaskView> = s
        .frameworks
        .iter()
        .flat_map(|f| f.tasks.iter().map(|t| &***t))
        .chain(s.completed_tasks.iter().map(|t| &***t))
        .filter(|t| selected(t))
        .collect();
    let first = |t: &TaskView| t.statuses.first().map(|s| s.timestamp);
    // A stable sort: tasks of one instant keep the snapshot's order.
    tasks.sort_by(|a, b| {
        use std::cmp::Ordering;
        match (first(a), first(b)) {
            (None, None) => Ordering::Equal,
            (None, Some(_)) => {
                if ascending {
                    Ordering::Less
                } else {
                    Ordering::Greater
                }
            }
            (Some(_), None) => {
                if ascending {
                    Ordering::Greater
                } else {
                    Ordering::Less
                }
            }
            (Some(x), Some(y)) => {
                let o = x.total_cmp(&y);
                if ascending {
                    o
                } else {
                    o.reverse()
                }
            }
        }
    });
    json!({
        "tasks": tasks
            .iter()
            .skip(offset)
            .take(limit)
            .map(|t| task_json(t, role_of(&t.framework_id).as_deref()))
            .collect::<Vec<_>>(),
    })
}

fn state_counts<'a>(tasks: impl Iterator<Item = &'a TaskView>) -> Map<String, Value> {
    let mut counts: BTreeMap<&'static str, u64> = BTreeMap::new();
    for state in [
        TaskState::Staging,
        TaskState::Starting,
        TaskState::Running,
        TaskState::Killing,
        TaskState::Finished,
        TaskState::Killed,
        TaskState::Failed,
        TaskState::Lost,
        TaskState::Error,
        TaskState::Unreachable,
    ] {
        counts.insert(state.as_str(), 0);
    }
    for t in tasks {
        *counts.entry(t.state.as_str()).or_default() += 1;
    }
    counts
        .into_iter()
        .map(|(k, v)| (k.to_string(), json!(v)))
        .collect()
}

/// `/master/state-summary` in Mesos's shape.
pub(crate) fn master_state_summary(s: &StateSnapshot) -> Value {
    let all_tasks = || {
        s.frameworks
            .iter()
            .flat_map(|f| f.tasks.iter().map(|t| &***t))
            .chain(s.completed_tasks.iter().map(|t| &***t))
    };
    let slaves: Vec<Value> = s
        .agents
        .iter()
        .map(|a| {
            let mut v = agent_json(a);
            let tasks: Vec<&TaskView> = all_tasks().filter(|t| t.agent_id == a.id).collect();
            let mut frameworks: Vec<String> =
                tasks.iter().map(|t| t.framework_id.to_string()).collect();
            frameworks.sort();
            frameworks.dedup();
            if let Value::Object(map) = &mut v {
                map.extend(state_counts(tasks.into_iter()));
                map.insert("framework_ids".into(), json!(frameworks));
            }
            v
        })
        .collect();
    let frameworks: Vec<Value> = s
        .frameworks
        .iter()
        .map(|f| {
            let mut v = json!({
                "id": f.id,
                "name": f.name,
                "active": f.connected && !f.suppressed,
                "connected": f.connected,
                "recovered": f.recovered,
                "hostname": f.info.hostname,
                "user": f.info.user,
                "used_resources": resource_map(f.used.list()),
                "offered_resources": resource_map(f.offered.list()),
            });
            let tasks: Vec<&TaskView> = all_tasks().filter(|t| t.framework_id == f.id).collect();
            let mut agents: Vec<String> = tasks.iter().map(|t| t.agent_id.to_string()).collect();
            agents.sort();
            agents.dedup();
            if let Value::Object(map) = &mut v {
                map.extend(state_counts(tasks.into_iter()));
                map.insert("slave_ids".into(), json!(agents));
            }
            v
        })
        .collect();
    json!({
        "hostname": host_of(&s.master.address),
        "slaves": slaves,
        "frameworks": frameworks,
    })
}

/// `/metrics/snapshot`: Mesos's master metric names, with the values
/// Agora has for them.
pub(crate) fn metrics(app: &AppState, s: &StateSnapshot) -> BTreeMap<String, f64> {
    let m = &app.metrics;
    let sum = &s.summary;
    let mut out = BTreeMap::new();
    let mut put = |k: &str, v: f64| {
        out.insert(k.to_string(), v);
    };
    let percent = |used: f64, total: f64| if total > 0.0 { used / total } else { 0.0 };
    put("master/elected", 1.0);
    put(
        "master/uptime_secs",
        (agora_proto::now_timestamp() - s.started_at).max(0.0),
    );
    let mut gpus_total = 0.0;
    let mut gpus_used = 0.0;
    for a in s.agents.iter().filter(|a| a.connected) {
        gpus_total += a.total.list().scalar("gpus");
        gpus_used += a.used.list().scalar("gpus");
    }
    for (name, total, used) in [
        ("cpus", sum.cpus_total, sum.cpus_used),
        ("mem", sum.mem_total, sum.mem_used),
        ("disk", sum.disk_total, sum.disk_used),
        ("gpus", gpus_total, gpus_used),
    ] {
        put(&format!("master/{name}_total"), total);
        put(&format!("master/{name}_used"), used);
        put(&format!("master/{name}_percent"), percent(used, total));
        put(&format!("master/{name}_revocable_total"), 0.0);
        put(&format!("master/{name}_revocable_used"), 0.0);
        put(&format!("master/{name}_revocable_percent"), 0.0);
    }
    put("master/slaves_active", sum.agents_connected as f64);
    put("master/slaves_inactive", sum.agents_disconnected as f64);
    put("master/slaves_connected", sum.agents_connected as f64);
    put("master/slaves_disconnected", sum.agents_disconnected as f64);
    put("master/slaves_unreachable", 0.0);
    put("master/slave_removals", m.agents_removed.get() as f64);
    let connected = sum.frameworks_connected as f64;
    let total = sum.frameworks as f64;
    put("master/frameworks_active", connected);
    put("master/frameworks_inactive", total - connected);
    put("master/frameworks_connected", connected);
    put("master/frameworks_disconnected", total - connected);
    put("master/outstanding_offers", sum.offers_outstanding as f64);
    for state in TaskState::ALL {
        let name = state
            .as_str()
            .trim_start_matches("TASK_")
            .to_ascii_lowercase();
        let active = sum.tasks_by_state.get(&state).copied().unwrap_or(0);
        let completed = sum.completed_by_state.get(&state).copied().unwrap_or(0);
        let value = if state.is_terminal() {
            completed
        } else {
            active
        };
        put(&format!("master/tasks_{name}"), value as f64);
    }
    put(
        "master/messages_status_update",
        m.status_updates_received.get() as f64,
    );
    put(
        "master/messages_acknowledge_status_update",
        m.status_updates_acked.get() as f64,
    );
    put(
        "master/messages_launch_tasks",
        m.tasks_launched.get() as f64,
    );
    put(
        "master/messages_decline_offers",
        m.offers_declined.get() as f64,
    );
    put("master/invalid_status_updates", 0.0);
    put(
        "master/valid_status_updates",
        m.status_updates_received.get() as f64,
    );
    put("master/invalid_framework_to_executor_messages", 0.0);
    put("master/event_queue_messages", 0.0);
    put("master/event_queue_dispatches", 0.0);
    put("master/event_queue_http_requests", 0.0);
    put(
        "allocator/mesos/allocation_runs",
        m.allocation_cycles.count() as f64,
    );
    put(
        "allocator/mesos/allocation_run_ms",
        m.allocation_cycles.mean_ms(),
    );
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_read_as_mesos_reads_them() {
        let query = Query("limit=-1&offset=7&big=3000000000&word=many&neg=-2");
        assert_eq!(query.count("limit", TASK_LIMIT), usize::MAX);
        assert_eq!(query.count("neg", 0), usize::MAX);
        assert_eq!(query.count("offset", 0), 7);
        // Not an `int`: the default, as Mesos's failed `numify` gives.
        assert_eq!(query.count("big", TASK_LIMIT), TASK_LIMIT);
        assert_eq!(query.count("word", TASK_LIMIT), TASK_LIMIT);
        assert_eq!(query.count("absent", TASK_LIMIT), TASK_LIMIT);
    }
}
