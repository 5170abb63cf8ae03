//! The operator calls on roles: `UPDATE_QUOTA`, `GET_QUOTA`,
//! `UPDATE_WEIGHTS`, `GET_WEIGHTS` and `GET_ROLES`, as Mesos answers them.
//!
//! The writes need an authenticated principal whenever the master has
//! credentials (as `TEARDOWN`), and the `update_quotas` /
//! `update_weights` ACL's leave for every role they name; they are checked
//! here ([`crate::quota`]) and handed to the state task, which applies
//! them from the next allocation cycle and stores them in the registry.
//! `200` means the master took the call; the reads answer from the latest
//! `/state` snapshot, so they show a write after at most one snapshot
//! interval. The reads list only the roles the `view_roles` ACL lets the
//! caller see.

use agora_mesos_proto::convert::{self, ResourceStyle};
use agora_mesos_proto::v1;
use agora_mesos_proto::v1::master::{call, response};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};

use super::error;
use crate::acls::Action;
use crate::http::AppState;
use crate::master::Input;
use crate::quota::{no_duplicates, quota_record, weight_record, QuotaError};
use crate::state::{RoleState, StateSnapshot};

/// `UPDATE_QUOTA`.
pub(super) async fn update_quota(
    app: &AppState,
    headers: &HeaderMap,
    update: Option<&call::UpdateQuota>,
) -> Response {
    let Some(update) = update else {
        return error(
            StatusCode::BAD_REQUEST,
            "Expecting 'update_quota' to be present",
        );
    };
    let operator = match app.auth.operator_writer(headers) {
        Ok(operator) => operator,
        Err(refusal) => return refusal,
    };
    let checked: Result<Vec<_>, QuotaError> =
        no_duplicates(update.quota_configs.iter().map(|c| c.role.as_str())).and_then(|()| {
            update
                .quota_configs
                .iter()
                .map(|c| {
                    let pairs = |m: &std::collections::HashMap<String, v1::value::Scalar>| {
                        let mut v: Vec<(String, f64)> =
                            m.iter().map(|(k, s)| (k.clone(), s.value)).collect();
                        v.sort_by(|a, b| a.0.cmp(&b.0));
                        v
                    };
                    quota_record(&c.role, &pairs(&c.guarantees), &pairs(&c.limits))
                })
                .collect()
        });
    let quotas = match checked {
        Ok(quotas) => quotas,
        Err(e) => return error(StatusCode::BAD_REQUEST, e.to_string()),
    };
    for q in &quotas {
        if let Err(message) =
            app.auth
                .acls
                .check(Action::UpdateQuotas, operator.as_deref(), Some(&q.role))
        {
            tracing::warn!(role = %q.role, ?operator, "quota update refused");
            return error(StatusCode::FORBIDDEN, message);
        }
    }
    if !update.force.unwrap_or(false) {
        if let Err(message) = guarantees_fit(&app.snapshot.borrow(), &quotas) {
            return error(StatusCode::BAD_REQUEST, message);
        }
    }
    let input = Input::OperatorQuotas { quotas, operator };
    match app.inputs.send(input).await {
        Ok(()) => StatusCode::OK.into_response(),
        Err(_) => error(StatusCode::SERVICE_UNAVAILABLE, "the master is stopping"),
    }
}

/// Mesos's overcommit check (skipped with `force`): every role's
/// guarantees together, with this call's in place, fit in what the
/// registered agents have.
fn guarantees_fit(
    snapshot: &StateSnapshot,
    quotas: &[crate::registry::QuotaRecord],
) -> Result<(), String> {
    let mut wanted: std::collections::BTreeMap<String, f64> = Default::default();
    let guarantees = snapshot
        .roles
        .iter()
        .filter(|role| !quotas.iter().any(|q| q.role == role.name))
        .filter_map(|role| role.quota.as_ref().map(|q| q.list()))
        .chain(quotas.iter().map(|q| &q.guarantees));
    for g in guarantees {
        for (name, value) in g.scalar_totals() {
            *wanted.entry(name.to_string()).or_default() += value;
        }
    }
    for (name, value) in wanted {
        let have: f64 = snapshot
            .agents
            .iter()
            .map(|a| a.total.list().scalar(&name))
            .sum();
        if value > have + 1e-9 {
            return Err(format!(
                "the roles' guarantees of {name} ({value}) would exceed the cluster's ({have}); set 'force' to allow it"
            ));
        }
    }
    Ok(())
}

/// `UPDATE_WEIGHTS`.
pub(super) async fn update_weights(
    app: &AppState,
    headers: &HeaderMap,
    update: Option<&call::UpdateWeights>,
) -> Response {
    let Some(update) = update else {
        return error(
            StatusCode::BAD_REQUEST,
            "Expecting 'update_weights' to be present",
        );
    };
    let operator = match app.auth.operator_writer(headers) {
        Ok(operator) => operator,
        Err(refusal) => return refusal,
    };
    let checked: Result<Vec<_>, QuotaError> = no_duplicates(
        update
            .weight_infos
            .iter()
            .map(|w| w.role.as_deref().unwrap_or_default()),
    )
    .and_then(|()| {
        update
            .weight_infos
            .iter()
            .map(|w| weight_record(w.role.as_deref().unwrap_or_default(), w.weight))
            .collect()
    });
    let weights = match checked {
        Ok(weights) => weights,
        Err(e) => return error(StatusCode::BAD_REQUEST, e.to_string()),
    };
    for w in &weights {
        if let Err(message) =
            app.auth
                .acls
                .check(Action::UpdateWeights, operator.as_deref(), Some(&w.role))
        {
            tracing::warn!(role = %w.role, ?operator, "weight update refused");
            return error(StatusCode::FORBIDDEN, message);
        }
    }
    let input = Input::OperatorWeights { weights, operator };
    match app.inputs.send(input).await {
        Ok(()) => StatusCode::OK.into_response(),
        Err(_) => error(StatusCode::SERVICE_UNAVAILABLE, "the master is stopping"),
    }
}

/// The roles of `snapshot` the caller may see (`view_roles`).
fn visible<'a>(
    app: &AppState,
    headers: &HeaderMap,
    snapshot: &'a StateSnapshot,
) -> Vec<&'a RoleState> {
    let acls = &app.auth.acls;
    if !acls.restricts(Action::ViewRoles) {
        return snapshot.roles.iter().collect();
    }
    let principal = app.auth.principal(false, headers).ok().flatten();
    snapshot
        .roles
        .iter()
        .filter(|r| acls.allows(Action::ViewRoles, principal.as_deref(), Some(&r.name)))
        .collect()
}

/// `GET_QUOTA`: each role's `QuotaConfig`, and the deprecated `infos`
/// (the guarantees as resources) Mesos still fills.
pub(super) fn get_quota(
    app: &AppState,
    headers: &HeaderMap,
    snapshot: &StateSnapshot,
) -> response::GetQuota {
    let mut status = v1::quota::QuotaStatus::default();
    for role in visible(app, headers, snapshot) {
        if role.quota.is_none() && role.limits.is_none() {
            continue;
        }
        let guarantees = role
            .quota
            .as_ref()
            .map(|q| q.list().clone())
            .unwrap_or_default();
        status.configs.push(v1::quota::QuotaConfig {
            role: role.name.clone(),
            guarantees: guarantees
                .scalar_totals()
                .into_iter()
                .map(|(name, value)| (name.to_string(), v1::value::Scalar { value }))
                .collect(),
            limits: role
                .limits
                .iter()
                .flatten()
                .map(|(name, value)| (name.clone(), v1::value::Scalar { value: *value }))
                .collect(),
        });
        // Deprecated in Mesos, which still fills it; old clients read it.
        #[allow(deprecated)]
        status.infos.push(v1::quota::QuotaInfo {
            role: Some(role.name.clone()),
            principal: None,
            guarantee: convert::mesos_resources(&guarantees, &ResourceStyle::default()),
        });
    }
    response::GetQuota { status }
}

/// `GET_WEIGHTS`: the roles whose weight was set (as Mesos, which lists
/// only those).
pub(super) fn get_weights(
    app: &AppState,
    headers: &HeaderMap,
    snapshot: &StateSnapshot,
) -> response::GetWeights {
    response::GetWeights {
        weight_infos: visible(app, headers, snapshot)
            .into_iter()
            .filter(|r| r.weight_set)
            .map(|r| v1::WeightInfo {
                weight: r.weight,
                role: Some(r.name.clone()),
            })
            .collect(),
    }
}

/// `GET_ROLES`: every role with a weight, a quota or a framework.
pub(super) fn get_roles(
    app: &AppState,
    headers: &HeaderMap,
    snapshot: &StateSnapshot,
) -> response::GetRoles {
    response::GetRoles {
        roles: visible(app, headers, snapshot)
            .into_iter()
            .map(|r| v1::Role {
                name: r.name.clone(),
                weight: r.weight,
                frameworks: r
                    .frameworks
                    .iter()
                    .map(convert::mesos_framework_id)
                    .collect(),
                resources: Vec::new(),
            })
            .collect(),
    }
}
