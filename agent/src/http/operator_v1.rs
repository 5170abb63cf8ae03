//! `POST /api/v1` on the agent: the read-only calls of Mesos's v1 agent
//! operator API, answered from a `/state` view the core publishes for the
//! call, in the codec `Accept` asks for (JSON or protobuf), behind the
//! same `--authenticate-http` as `/state`.
//!
//! Carried out: `GET_STATE`, `GET_FRAMEWORKS`, `GET_EXECUTORS`,
//! `GET_TASKS` and `GET_CONTAINERS`. Any other call type is refused `501`
//! naming it, any other field `400` naming it
//! (`agora_mesos_proto::support`). What the answers hold:
//!
//! - frameworks: `id`, `name`, `user`, `checkpoint` of each framework
//!   with work on the agent (`completed_frameworks` is empty: the agent
//!   forgets a framework with its last executor);
//! - executors: each custom executor (`executor_id`, `framework_id`,
//!   `name`) and each command task's command executor (named after its
//!   task, as in Mesos), running or with updates still on their way;
//! - tasks: `launched_tasks` the live ones, `terminated_tasks` those that
//!   ended and whose updates the agent still holds, each with `name`,
//!   `task_id`, `framework_id`, `executor_id`, `agent_id`, `state` and
//!   `resources`;
//! - containers: one per running executor, its run id as `container_id`
//!   (the sandbox's `runs/<id>` directory), with `framework_id`,
//!   `executor_id` and `executor_name`; no nested or standalone
//!   containers exist, so `show_nested` and `show_standalone` change
//!   nothing.

use agora_mesos_proto::v1::agent::{call, response, Call, Response as AgentResponse};
use agora_mesos_proto::{support, v1, Codec};
use agora_proto::{Resources, TaskState};
use axum::body::Body;
use axum::extract::State;
use axum::http::{header, HeaderMap, HeaderValue, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::Value;

use super::AppState;

/// `POST /api/v1`.
pub(super) async fn handle(
    State(app): State<AppState>,
    method: Method,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let codec = match super::mesos_v1::call_codec(&method, &headers, refuse) {
        Ok(codec) => codec,
        Err(refused) => return refused,
    };
    let accept: Vec<&str> = headers
        .get_all(header::ACCEPT)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .collect();
    let Some(accept) = Codec::negotiate(accept) else {
        return refuse(
            StatusCode::NOT_ACCEPTABLE,
            "Expecting 'Accept' to allow application/json or application/x-protobuf",
        );
    };
    let body = match app.bodies.read(body, super::mesos_v1::MAX_CALL_BYTES).await {
        Ok(body) => body,
        Err(refusal) => return refusal.into_response(),
    };
    let call: Call = match codec.decode(&body) {
        Ok(call) => call,
        Err(e) => {
            return refuse(
                StatusCode::BAD_REQUEST,
                format!("Failed to parse body into Call: {e}"),
            )
        }
    };
    if let Some(refusal) = support::refusal(&call) {
        let status = if refusal.field == "agent.Call.type" {
            StatusCode::NOT_IMPLEMENTED
        } else {
            StatusCode::BAD_REQUEST
        };
        return refuse(status, refusal.to_string());
    }
    // A view published after the call arrived: the periodic one may
    // predate a launch the caller knows of.
    let state = match super::mesos_v1::fresh_snapshot(&app).await {
        Ok(state) => state,
        Err(refusal) => return refusal,
    };
    use call::Type;
    let response = match call.r#type() {
        Type::GetState => response_of(response::Type::GetState, |r| {
            r.get_state = Some(response::GetState {
                get_tasks: Some(get_tasks(&state)),
                get_executors: Some(get_executors(&state)),
                get_frameworks: Some(get_frameworks(&state)),
            })
        }),
        Type::GetFrameworks => response_of(response::Type::GetFrameworks, |r| {
            r.get_frameworks = Some(get_frameworks(&state))
        }),
        Type::GetExecutors => response_of(response::Type::GetExecutors, |r| {
            r.get_executors = Some(get_executors(&state))
        }),
        Type::GetTasks => response_of(response::Type::GetTasks, |r| {
            r.get_tasks = Some(get_tasks(&state))
        }),
        Type::GetContainers => response_of(response::Type::GetContainers, |r| {
            r.get_containers = Some(get_containers(&state))
        }),
        Type::Unknown => {
            return refuse(
                StatusCode::NOT_IMPLEMENTED,
                "Received an UNKNOWN call (or no 'type')",
            )
        }
        other => {
            return refuse(
                StatusCode::NOT_IMPLEMENTED,
                format!("{} is not supported by this agent", other.as_str_name()),
            )
        }
    };
    match accept.encode(&response) {
        Ok(body) => (
            StatusCode::OK,
            [(
                header::CONTENT_TYPE,
                HeaderValue::from_static(accept.media_type()),
            )],
            body,
        )
            .into_response(),
        Err(e) => refuse(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()),
    }
}

fn refuse(code: StatusCode, message: impl Into<String>) -> Response {
    let message = message.into();
    tracing::debug!(%code, %message, "agent operator call refused");
    (
        code,
        [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
        message,
    )
        .into_response()
}

fn response_of(kind: response::Type, fill: impl FnOnce(&mut AgentResponse)) -> AgentResponse {
    let mut r = AgentResponse::default();
    r.set_type(kind);
    fill(&mut r);
    r
}

fn text(value: &Value) -> String {
    value.as_str().unwrap_or_default().to_string()
}

fn frameworks(state: &Value) -> impl Iterator<Item = &Value> {
    state["frameworks"].as_array().into_iter().flatten()
}

fn executors(framework: &Value) -> impl Iterator<Item = &Value> {
    framework["executors"].as_array().into_iter().flatten()
}

fn get_frameworks(state: &Value) -> response::GetFrameworks {
    response::GetFrameworks {
        frameworks: frameworks(state)
            .map(|f| response::get_frameworks::Framework {
                framework_info: v1::FrameworkInfo {
                    user: text(&f["user"]),
                    name: text(&f["name"]),
                    id: Some(v1::FrameworkId {
                        value: text(&f["id"]),
                    }),
                    checkpoint: f["checkpoint"].as_bool(),
                    ..Default::default()
                },
            })
            .collect(),
        completed_frameworks: Vec::new(),
    }
}

fn get_executors(state: &Value) -> response::GetExecutors {
    let mut out = response::GetExecutors::default();
    for f in frameworks(state) {
        for e in executors(f) {
            out.executors.push(response::get_executors::Executor {
                executor_info: v1::ExecutorInfo {
                    executor_id: v1::ExecutorId {
                        value: text(&e["id"]),
                    },
                    framework_id: Some(v1::FrameworkId {
                        value: text(&f["id"]),
                    }),
                    name: e["name"].as_str().map(str::to_string),
                    ..Default::default()
                },
            });
        }
    }
    out
}

fn get_tasks(state: &Value) -> response::GetTasks {
    let agent_id = v1::AgentId {
        value: text(&state["id"]),
    };
    let mut out = response::GetTasks::default();
    for f in frameworks(state) {
        for e in executors(f) {
            for t in e["tasks"].as_array().into_iter().flatten() {
                let task_state: TaskState =
                    serde_json::from_value(t["state"].clone()).unwrap_or(TaskState::Staging);
                let resources: Resources =
                    serde_json::from_value(t["resources"].clone()).unwrap_or_default();
                let mut task = v1::Task {
                    name: text(&t["name"]),
                    task_id: v1::TaskId {
                        value: text(&t["id"]),
                    },
                    framework_id: v1::FrameworkId {
                        value: text(&f["id"]),
                    },
                    executor_id: Some(v1::ExecutorId {
                        value: text(&e["id"]),
                    }),
                    agent_id: agent_id.clone(),
                    resources: agora_mesos_proto::convert::mesos_resources(
                        &resources,
                        &Default::default(),
                    ),
                    ..Default::default()
                };
                task.set_state(agora_mesos_proto::convert::mesos_task_state(task_state));
                if task_state.is_terminal() {
                    out.terminated_tasks.push(task);
                } else {
                    out.launched_tasks.push(task);
                }
            }
        }
    }
    out
}

fn get_containers(state: &Value) -> response::GetContainers {
    let mut out = response::GetContainers::default();
    for f in frameworks(state) {
        for e in executors(f).filter(|e| e["running"] == true) {
            let Some(run_id) = e["run_id"].as_str() else {
                continue;
            };
            out.containers.push(response::get_containers::Container {
                framework_id: Some(v1::FrameworkId {
                    value: text(&f["id"]),
                }),
                executor_id: Some(v1::ExecutorId {
                    value: text(&e["id"]),
                }),
                executor_name: e["name"].as_str().map(str::to_string),
                container_id: v1::ContainerId {
                    value: run_id.to_string(),
                    parent: None,
                },
                container_status: None,
                resource_statistics: None,
            });
        }
    }
    out
}
