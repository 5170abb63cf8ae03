//! `POST /api/v1`: the Mesos v1 operator API of the master, answered from
//! the latest `/state` snapshot (never from the state task).
//!
//! GET_HEALTH, GET_VERSION, GET_METRICS, GET_STATE, GET_AGENTS,
//! GET_FRAMEWORKS, GET_EXECUTORS, GET_TASKS and GET_MASTER answer `200`
//! with a `Response` in the negotiated codec. SUBSCRIBE answers a RecordIO
//! stream: SUBSCRIBED with the whole state, a HEARTBEAT, then TASK_ADDED,
//! TASK_UPDATED, AGENT_ADDED, AGENT_REMOVED, FRAMEWORK_ADDED,
//! FRAMEWORK_UPDATED and FRAMEWORK_REMOVED as successive snapshots show
//! them, with a HEARTBEAT every 15 s. A task or a framework that comes
//! and goes between two snapshots is still reported (TASK_ADDED, then
//! TASK_UPDATED to its terminal state; FRAMEWORK_ADDED, then
//! FRAMEWORK_REMOVED, from the snapshot's bounded list of removed
//! frameworks, which GET_FRAMEWORKS also answers as
//! `completed_frameworks`); states that last less than a snapshot interval
//! (`--state-snapshot-interval`) may be folded into the next one. Every
//! answer and the stream show what the caller may view (`view_frameworks`,
//! `view_tasks`); the stream's events are computed once for all its
//! readers of one principal, and a reader that stops reading is cut off
//! (`operator_feed.rs`). TEARDOWN, DRAIN_AGENT, DEACTIVATE_AGENT,
//! REACTIVATE_AGENT, MARK_AGENT_GONE, UPDATE_QUOTA and UPDATE_WEIGHTS
//! change the cluster: they need an authenticated principal whenever the
//! master has credentials (TEARDOWN also the `teardown_frameworks` ACL's
//! leave, the quota calls `update_quotas`/`update_weights`; the agent
//! calls are `operator_agents.rs`'s; the quota and weight calls, with
//! GET_QUOTA, GET_WEIGHTS and GET_ROLES, `operator_quota.rs`'s). Every
//! other call type is answered `501` naming it ("master.Call.type
//! UPDATE_MAINTENANCE_SCHEDULE is not supported"), as is any field Agora
//! does not carry out (`400`); the
//! list is `agora_mesos_proto::support`'s.

use std::collections::{BTreeMap, HashMap};

use agora_mesos_proto::convert::{self, ResourceStyle};
use agora_mesos_proto::support;
use agora_mesos_proto::v1::master::{call, event, response};
use agora_mesos_proto::{v1, MESOS_API_VERSION};
use agora_proto::{AgentId, FrameworkId, Resources, TaskId, TaskState};
use axum::body::Body;
use axum::extract::State;
use axum::http::{header, HeaderMap, HeaderValue, Method, StatusCode};
use axum::response::Response;
use axum::Extension;

use super::operator_feed;
use super::scheduler::read_body;
use super::{encoded, error, request_codec, response_codec, MesosState};
use crate::frameworks::CompletedFramework;
use crate::state::{AgentState, FrameworkState, StateSnapshot, TaskView};

pub(crate) async fn handle(
    State(state): State<MesosState>,
    method: Method,
    connection: Option<Extension<agora_net::Connection>>,
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
    let codec = match request_codec(&headers) {
        Ok(codec) => codec,
        Err(response) => return response,
    };
    let accept = match response_codec(&headers) {
        Ok(codec) => codec,
        Err(response) => return response,
    };
    let bytes = match read_body(&state.app, body).await {
        Ok(bytes) => bytes,
        Err(response) => return response,
    };
    let call: v1::master::Call = match codec.decode(&bytes) {
        Ok(call) => call,
        Err(e) => {
            return error(
                StatusCode::BAD_REQUEST,
                format!("Failed to parse body into Call: {e}"),
            )
        }
    };
    // A call type Agora does not carry out is 501, any other field it does
    // not carry out 400, each naming it (`agora_mesos_proto::support`).
    if let Some(refusal) = support::refusal(&call) {
        let status = if refusal.field == "master.Call.type" {
            StatusCode::NOT_IMPLEMENTED
        } else {
            StatusCode::BAD_REQUEST
        };
        return error(status, refusal.to_string());
    }
    let snapshot = state.app.snapshot_for(&headers);
    use call::Type;
    let response = match call.r#type() {
        Type::Subscribe => {
            let principal = state.app.auth.principal(false, &headers).ok().flatten();
            let connection = connection.map(|Extension(c)| c);
            return operator_feed::subscribe(
                &state.app,
                &state.feeds,
                principal,
                accept,
                connection,
            );
        }
        Type::GetHealth => response_of(response::Type::GetHealth, |r| {
            r.get_health = Some(response::GetHealth { healthy: true })
        }),
        Type::GetVersion => response_of(response::Type::GetVersion, |r| {
            r.get_version = Some(response::GetVersion {
                version_info: version_info(),
            })
        }),
        Type::GetMetrics => {
            let metrics = super::endpoints::metrics(&state.app, &snapshot);
            response_of(response::Type::GetMetrics, |r| {
                r.get_metrics = Some(response::GetMetrics {
                    metrics: metrics
                        .into_iter()
                        .map(|(name, value)| v1::Metric {
                            name,
                            value: Some(value),
                        })
                        .collect(),
                })
            })
        }
        Type::GetState => response_of(response::Type::GetState, |r| {
            r.get_state = Some(get_state(&snapshot))
        }),
        Type::GetAgents => response_of(response::Type::GetAgents, |r| {
            r.get_agents = Some(get_agents(&snapshot))
        }),
        Type::GetFrameworks => response_of(response::Type::GetFrameworks, |r| {
            r.get_frameworks = Some(get_frameworks(&snapshot))
        }),
        Type::GetExecutors => response_of(response::Type::GetExecutors, |r| {
            r.get_executors = Some(get_executors(&snapshot))
        }),
        Type::GetTasks => response_of(response::Type::GetTasks, |r| {
            r.get_tasks = Some(get_tasks(&snapshot))
        }),
        Type::GetMaster => response_of(response::Type::GetMaster, |r| {
            r.get_master = Some(response::GetMaster {
                master_info: Some(convert::mesos_master_info(&snapshot.master)),
                start_time: Some(snapshot.started_at),
                elected_time: Some(snapshot.started_at),
            })
        }),
        Type::Teardown => {
            let Some(fid) = call.teardown.as_ref().map(|t| t.framework_id.value.clone()) else {
                return error(
                    StatusCode::BAD_REQUEST,
                    "Expecting 'teardown' to be present",
                );
            };
            return crate::http::operator_teardown(&state.app, &headers, &fid).await;
        }
        Type::DrainAgent | Type::DeactivateAgent | Type::ReactivateAgent | Type::MarkAgentGone => {
            return crate::http::operator_agents::handle(&state.app, &headers, &call).await;
        }
        Type::UpdateQuota => {
            return super::operator_quota::update_quota(
                &state.app,
                &headers,
                call.update_quota.as_ref(),
            )
            .await;
        }
        Type::UpdateWeights => {
            return super::operator_quota::update_weights(
                &state.app,
                &headers,
                call.update_weights.as_ref(),
            )
            .await;
        }
        Type::GetQuota => response_of(response::Type::GetQuota, |r| {
            r.get_quota = Some(super::operator_quota::get_quota(
                &state.app, &headers, &snapshot,
            ))
        }),
        Type::GetWeights => response_of(response::Type::GetWeights, |r| {
            r.get_weights = Some(super::operator_quota::get_weights(
                &state.app, &headers, &snapshot,
            ))
        }),
        Type::GetRoles => response_of(response::Type::GetRoles, |r| {
            r.get_roles = Some(super::operator_quota::get_roles(
                &state.app, &headers, &snapshot,
            ))
        }),
        Type::Unknown => {
            return error(
                StatusCode::NOT_IMPLEMENTED,
                "Received an UNKNOWN call (or no 'type')",
            )
        }
        other => {
            return error(
                StatusCode::NOT_IMPLEMENTED,
                format!("{} is not supported by this master", other.as_str_name()),
            )
        }
    };
    match accept.encode(&response) {
        Ok(body) => encoded(StatusCode::OK, accept, body),
        Err(e) => error(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()),
    }
}

fn response_of(
    kind: response::Type,
    fill: impl FnOnce(&mut v1::master::Response),
) -> v1::master::Response {
    let mut r = v1::master::Response::default();
    r.set_type(kind);
    fill(&mut r);
    r
}

pub(crate) fn version_info() -> v1::VersionInfo {
    v1::VersionInfo {
        version: MESOS_API_VERSION.to_string(),
        build_user: Some("agora".into()),
        git_tag: Some(format!("agora-{}", agora_proto::VERSION)),
        ..Default::default()
    }
}

fn time_info(secs: f64) -> v1::TimeInfo {
    v1::TimeInfo {
        nanoseconds: (secs * 1e9) as i64,
    }
}

fn resources(r: &Resources) -> Vec<v1::Resource> {
    convert::mesos_resources(r, &ResourceStyle::default())
}

pub(crate) fn get_state(s: &StateSnapshot) -> response::GetState {
    response::GetState {
        get_tasks: Some(get_tasks(s)),
        get_executors: Some(get_executors(s)),
        get_frameworks: Some(get_frameworks(s)),
        get_agents: Some(get_agents(s)),
    }
}

fn mesos_agent(a: &AgentState) -> response::get_agents::Agent {
    response::get_agents::Agent {
        agent_info: convert::mesos_agent_info(&agora_proto::AgentInfo {
            id: Some(a.id.clone()),
            hostname: a.hostname.clone(),
            address: a.address.clone(),
            resources: a.total.list().clone(),
            attributes: a.attributes.clone(),
        }),
        active: a.connected,
        deactivated: Some(a.deactivated),
        drain_info: a.drain_info.as_ref().map(|d| {
            let mut info = v1::DrainInfo {
                config: v1::DrainConfig {
                    max_grace_period: d.config.max_grace_period.as_ref().map(|g| {
                        v1::DurationInfo {
                            nanoseconds: g.nanoseconds,
                        }
                    }),
                    mark_gone: Some(d.config.mark_gone),
                },
                ..Default::default()
            };
            info.set_state(if d.state == "DRAINED" {
                v1::DrainState::Drained
            } else {
                v1::DrainState::Draining
            });
            info
        }),
        version: MESOS_API_VERSION.to_string(),
        pid: Some(format!("slave(1)@{}", a.address)),
        registered_time: Some(time_info(a.registered_at)),
        total_resources: resources(a.total.list()),
        allocated_resources: resources(a.used.list()),
        offered_resources: resources(a.offered.list()),
        ..Default::default()
    }
}

pub(crate) fn get_agents(s: &StateSnapshot) -> response::GetAgents {
    response::GetAgents {
        agents: s.agents.iter().map(|a| mesos_agent(a)).collect(),
        recovered_agents: Vec::new(),
    }
}

fn mesos_framework(f: &FrameworkState, s: &StateSnapshot) -> response::get_frameworks::Framework {
    let hostnames: HashMap<&AgentId, &str> = s
        .agents
        .iter()
        .map(|a| (&a.id, a.hostname.as_str()))
        .collect();
    let mut info = (*f.info).clone();
    info.id = Some(f.id.clone());
    response::get_frameworks::Framework {
        framework_info: convert::mesos_framework_info(&info),
        active: f.connected && !f.suppressed,
        connected: f.connected,
        recovered: f.recovered,
        registered_time: Some(time_info(f.registered_at)),
        offers: s
            .offers
            .iter()
            .filter(|o| o.framework_id == f.id)
            .map(|o| v1::Offer {
                id: convert::mesos_offer_id(&o.id),
                framework_id: convert::mesos_framework_id(&o.framework_id),
                agent_id: convert::mesos_agent_id(&o.agent_id),
                hostname: hostnames
                    .get(&o.agent_id)
                    .map(|h| h.to_string())
                    .unwrap_or_default(),
                resources: resources(o.resources.list()),
                ..Default::default()
            })
            .collect(),
        allocated_resources: resources(f.used.list()),
        offered_resources: resources(f.offered.list()),
        ..Default::default()
    }
}

/// A removed framework as the operator API shows it.
fn mesos_completed_framework(f: &CompletedFramework) -> response::get_frameworks::Framework {
    let mut info = (*f.info).clone();
    info.id = Some(f.id.clone());
    response::get_frameworks::Framework {
        framework_info: convert::mesos_framework_info(&info),
        active: false,
        connected: false,
        recovered: false,
        registered_time: Some(time_info(f.registered_at)),
        unregistered_time: Some(time_info(f.removed_at)),
        ..Default::default()
    }
}

pub(crate) fn get_frameworks(s: &StateSnapshot) -> response::GetFrameworks {
    response::GetFrameworks {
        frameworks: s.frameworks.iter().map(|f| mesos_framework(f, s)).collect(),
        completed_frameworks: s
            .completed_frameworks
            .iter()
            .rev()
            .map(|f| mesos_completed_framework(f))
            .collect(),
        ..Default::default()
    }
}

pub(crate) fn get_executors(s: &StateSnapshot) -> response::GetExecutors {
    let mut executors = Vec::new();
    for f in &s.frameworks {
        let mut seen = std::collections::HashSet::new();
        for t in f.tasks.iter().filter(|t| !t.state.is_terminal()) {
            if seen.insert((t.agent_id.clone(), t.executor_id.clone())) {
                executors.push(response::get_executors::Executor {
                    executor_info: v1::ExecutorInfo {
                        executor_id: convert::mesos_executor_id(&t.executor_id),
                        framework_id: Some(convert::mesos_framework_id(&f.id)),
                        ..Default::default()
                    },
                    agent_id: convert::mesos_agent_id(&t.agent_id),
                });
            }
        }
    }
    response::GetExecutors {
        executors,
        ..Default::default()
    }
}

pub(crate) fn mesos_task(t: &TaskView) -> v1::Task {
    let mut task = v1::Task {
        name: t.name.clone(),
        task_id: convert::mesos_task_id(&t.id),
        framework_id: convert::mesos_framework_id(&t.framework_id),
        executor_id: Some(convert::mesos_executor_id(&t.executor_id)),
        agent_id: convert::mesos_agent_id(&t.agent_id),
        resources: resources(t.resources.list()),
        ..Default::default()
    };
    task.set_state(convert::mesos_task_state(t.state));
    task
}

pub(crate) fn get_tasks(s: &StateSnapshot) -> response::GetTasks {
    let mut out = response::GetTasks::default();
    for t in s.frameworks.iter().flat_map(|f| f.tasks.iter()) {
        if t.state == TaskState::Unreachable {
            out.unreachable_tasks.push(mesos_task(t));
        } else {
            out.tasks.push(mesos_task(t));
        }
    }
    out.completed_tasks = s.completed_tasks.iter().map(|t| mesos_task(t)).collect();
    out
}

// --- SUBSCRIBE ---

/// What the operator stream last reported, to tell what changed.
#[derive(Default)]
pub(super) struct Seen {
    tasks: HashMap<(FrameworkId, TaskId), TaskState>,
    agents: BTreeMap<AgentId, bool>,
    frameworks: HashMap<FrameworkId, (bool, bool, bool)>,
    framework_infos: HashMap<FrameworkId, v1::FrameworkInfo>,
    /// Completed tasks already reported (or completed before the
    /// subscription).
    completed: std::collections::HashSet<(FrameworkId, TaskId)>,
    /// Removed frameworks already reported (or removed before the
    /// subscription).
    completed_frameworks: std::collections::HashSet<FrameworkId>,
}

impl Seen {
    pub(super) fn of(s: &StateSnapshot) -> Seen {
        let mut seen = Seen::default();
        seen.update(s, &mut |_| {});
        seen
    }

    /// Records `s`, calling `emit` for each change since the last one.
    pub(super) fn update(&mut self, s: &StateSnapshot, emit: &mut dyn FnMut(v1::master::Event)) {
        use event::Type;
        for a in s.agents.iter() {
            if self.agents.insert(a.id.clone(), a.connected).is_none() {
                emit(event_of(Type::AgentAdded, |e| {
                    e.agent_added = Some(event::AgentAdded {
                        agent: mesos_agent(a),
                    })
                }));
            }
        }
        let live_agents: std::collections::HashSet<&AgentId> =
            s.agents.iter().map(|a| &a.id).collect();
        let gone: Vec<AgentId> = self
            .agents
            .keys()
            .filter(|id| !live_agents.contains(id))
            .cloned()
            .collect();
        for id in gone {
            self.agents.remove(&id);
            emit(event_of(Type::AgentRemoved, |e| {
                e.agent_removed = Some(event::AgentRemoved {
                    agent_id: convert::mesos_agent_id(&id),
                })
            }));
        }
        let mut live_frameworks = std::collections::HashSet::new();
        for f in &s.frameworks {
            live_frameworks.insert(f.id.clone());
            let flags = (f.connected, f.suppressed, f.recovered);
            match self.frameworks.insert(f.id.clone(), flags) {
                None => emit(event_of(Type::FrameworkAdded, |e| {
                    e.framework_added = Some(event::FrameworkAdded {
                        framework: mesos_framework(f, s),
                    })
                })),
                Some(old) if old != flags => emit(event_of(Type::FrameworkUpdated, |e| {
                    e.framework_updated = Some(event::FrameworkUpdated {
                        framework: mesos_framework(f, s),
                    })
                })),
                Some(_) => {}
            }
            let mut info = (*f.info).clone();
            info.id = Some(f.id.clone());
            self.framework_infos
                .insert(f.id.clone(), convert::mesos_framework_info(&info));
            for t in f.tasks.iter() {
                let key = (t.framework_id.clone(), t.id.clone());
                match self.tasks.insert(key, t.state) {
                    None => emit(event_of(Type::TaskAdded, |e| {
                        e.task_added = Some(event::TaskAdded {
                            task: mesos_task(t),
                        })
                    })),
                    Some(old) if old != t.state => emit(task_updated(t)),
                    Some(_) => {}
                }
            }
        }
        // Tasks that left their framework's list completed: report the
        // terminal state they completed with, if not seen yet.
        let completed: HashMap<(FrameworkId, TaskId), &TaskView> = s
            .completed_tasks
            .iter()
            .map(|t| ((t.framework_id.clone(), t.id.clone()), &***t))
            .collect();
        let listed: std::collections::HashSet<(FrameworkId, TaskId)> = s
            .frameworks
            .iter()
            .flat_map(|f| {
                f.tasks
                    .iter()
                    .map(|t| (t.framework_id.clone(), t.id.clone()))
            })
            .collect();
        let was_live: std::collections::HashSet<(FrameworkId, TaskId)> =
            self.tasks.keys().cloned().collect();
        let left: Vec<(FrameworkId, TaskId)> = self
            .tasks
            .keys()
            .filter(|k| !listed.contains(*k))
            .cloned()
            .collect();
        for key in left {
            let old = self.tasks.remove(&key);
            if let Some(t) = completed.get(&key) {
                if old != Some(t.state) {
                    emit(task_updated(t));
                }
            }
        }
        // A framework that subscribed and was removed between two
        // snapshots was never listed: it is added now, its tasks follow,
        // and it is removed at the end.
        let mut blinked = Vec::new();
        let mut now_removed = std::collections::HashSet::new();
        for f in s.completed_frameworks.iter() {
            let known = self.completed_frameworks.contains(&f.id)
                || self.frameworks.contains_key(&f.id)
                || live_frameworks.contains(&f.id);
            if !known {
                emit(event_of(Type::FrameworkAdded, |e| {
                    e.framework_added = Some(event::FrameworkAdded {
                        framework: mesos_completed_framework(f),
                    })
                }));
                blinked.push(f);
            }
            now_removed.insert(f.id.clone());
        }
        self.completed_frameworks = now_removed;
        // A task launched and completed between two snapshots was never
        // listed: it is added and updated to its terminal state at once.
        let mut now_completed = std::collections::HashSet::new();
        for t in s.completed_tasks.iter() {
            let key = (t.framework_id.clone(), t.id.clone());
            if !self.completed.contains(&key) && !was_live.contains(&key) {
                emit(event_of(Type::TaskAdded, |e| {
                    e.task_added = Some(event::TaskAdded {
                        task: mesos_task(t),
                    })
                }));
                emit(task_updated(t));
            }
            now_completed.insert(key);
        }
        self.completed = now_completed;
        let removed: Vec<FrameworkId> = self
            .frameworks
            .keys()
            .filter(|id| !live_frameworks.contains(*id))
            .cloned()
            .collect();
        for id in removed {
            self.frameworks.remove(&id);
            if let Some(info) = self.framework_infos.remove(&id) {
                emit(event_of(Type::FrameworkRemoved, |e| {
                    e.framework_removed = Some(event::FrameworkRemoved {
                        framework_info: info,
                    })
                }));
            }
        }
        for f in blinked {
            emit(event_of(Type::FrameworkRemoved, |e| {
                e.framework_removed = Some(event::FrameworkRemoved {
                    framework_info: mesos_completed_framework(f).framework_info,
                })
            }));
        }
    }
}

fn task_updated(t: &TaskView) -> v1::master::Event {
    event_of(event::Type::TaskUpdated, |e| {
        let mut status = v1::TaskStatus {
            task_id: convert::mesos_task_id(&t.id),
            agent_id: Some(convert::mesos_agent_id(&t.agent_id)),
            executor_id: Some(convert::mesos_executor_id(&t.executor_id)),
            ..Default::default()
        };
        status.set_state(convert::mesos_task_state(t.state));
        status.set_source(v1::task_status::Source::Master);
        let mut updated = event::TaskUpdated {
            framework_id: convert::mesos_framework_id(&t.framework_id),
            status,
            ..Default::default()
        };
        updated.set_state(convert::mesos_task_state(t.state));
        e.task_updated = Some(updated);
    })
}

pub(super) fn event_of(
    kind: event::Type,
    fill: impl FnOnce(&mut v1::master::Event),
) -> v1::master::Event {
    let mut e = v1::master::Event::default();
    e.set_type(kind);
    fill(&mut e);
    e
}
