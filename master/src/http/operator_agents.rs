//! The operator's calls on one agent: DRAIN_AGENT, DEACTIVATE_AGENT,
//! REACTIVATE_AGENT and MARK_AGENT_GONE (through `POST /api/v1`, and the
//! `agora agent` commands). Like TEARDOWN they change the cluster: they
//! need an authenticated principal whenever the master has credentials.
//! An agent the master does not have, or a negative grace period, is
//! refused with `400` naming it; else the call is handed to the master
//! (`drain.rs`) and answered `200`.

use std::time::Duration;

use agora_mesos_proto::v1;
use agora_mesos_proto::v1::master::call::Type;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};

use super::AppState;
use crate::drain::AgentCall;
use crate::master::Input;

/// Carries out `call` (one of the four types above).
pub(crate) async fn handle(
    app: &AppState,
    headers: &HeaderMap,
    call: &v1::master::Call,
) -> Response {
    let kind = call.r#type();
    let operator = match app.auth.operator_writer(headers) {
        Ok(operator) => operator,
        Err(refusal) => {
            tracing::warn!(
                call = kind.as_str_name(),
                "operator call refused: not authenticated"
            );
            return refusal;
        }
    };
    let (agent_id, agent_call) = match parse(call) {
        Ok(parsed) => parsed,
        Err(message) => return (StatusCode::BAD_REQUEST, message).into_response(),
    };
    let snapshot = app.snapshot.borrow().clone();
    let Some(agent) = snapshot.agents.iter().find(|a| a.id.as_str() == agent_id) else {
        return (
            StatusCode::BAD_REQUEST,
            format!("No agent found with specified ID {agent_id:?}"),
        )
            .into_response();
    };
    let input = Input::OperatorAgent {
        agent_id: agent.id.clone(),
        call: agent_call,
        operator,
    };
    match app.inputs.send(input).await {
        Ok(()) => StatusCode::OK.into_response(),
        Err(_) => (StatusCode::SERVICE_UNAVAILABLE, "the master is stopping").into_response(),
    }
}

/// The agent id and what to do to it, or why the call is refused.
fn parse(call: &v1::master::Call) -> Result<(String, AgentCall), String> {
    let missing = |field: &str| format!("Expecting '{field}' to be present");
    match call.r#type() {
        Type::DrainAgent => {
            let drain = call
                .drain_agent
                .as_ref()
                .ok_or_else(|| missing("drain_agent"))?;
            let max_grace_period = match &drain.max_grace_period {
                None => None,
                Some(d) => {
                    if d.seconds < 0 || d.nanos < 0 {
                        return Err(format!(
                            "drain_agent.max_grace_period must not be negative (got {}s {}ns)",
                            d.seconds, d.nanos
                        ));
                    }
                    Some(Duration::new(d.seconds as u64, d.nanos as u32))
                }
            };
            Ok((
                drain.agent_id.value.clone(),
                AgentCall::Drain {
                    max_grace_period,
                    mark_gone: drain.mark_gone.unwrap_or(false),
                },
            ))
        }
        Type::DeactivateAgent => call
            .deactivate_agent
            .as_ref()
            .map(|c| (c.agent_id.value.clone(), AgentCall::Deactivate))
            .ok_or_else(|| missing("deactivate_agent")),
        Type::ReactivateAgent => call
            .reactivate_agent
            .as_ref()
            .map(|c| (c.agent_id.value.clone(), AgentCall::Reactivate))
            .ok_or_else(|| missing("reactivate_agent")),
        Type::MarkAgentGone => call
            .mark_agent_gone
            .as_ref()
            .map(|c| (c.agent_id.value.clone(), AgentCall::MarkGone))
            .ok_or_else(|| missing("mark_agent_gone")),
        other => Err(format!("{} is not an agent call", other.as_str_name())),
    }
}
