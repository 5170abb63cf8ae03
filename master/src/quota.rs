//! Quota and weights set at run time (`UPDATE_QUOTA`, `UPDATE_WEIGHTS` of
//! the v1 operator API).
//!
//! A quota is Mesos's quota v2 (`QuotaConfig`): guarantees, served first
//! and held back from other roles (as `--quotas` does), and limits, above
//! which the role is never allocated. The HTTP side checks a request
//! ([`quota_record`], [`weight_record`]) and the operator's right to make
//! it; the state task applies it to the allocator, the `/state` snapshot
//! and the registry, so a restarted master or a new leader keeps it. The
//! start-up flags are the initial values only where the registry holds
//! none for a role.

use agora_proto::{Resources, DEFAULT_ROLE};

use crate::allocator::Limits;
use crate::master::Master;
use crate::registry::{QuotaRecord, RegistryOp, RegistryState, WeightRecord};

/// The resource names a quota may name (Mesos's).
pub(crate) const QUOTA_RESOURCES: &[&str] = &["cpus", "mem", "disk", "gpus"];

/// Why a quota or weight request is refused.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub(crate) enum QuotaError {
    #[error("invalid role {0:?}: a role is 1 to 128 of a-z A-Z 0-9 . _ - /, not '.' or '..', not starting with '-' (and not '*' for a quota)")]
    BadRole(String),
    #[error(
        "quota of role {role}: unknown resource {name:?} (a quota names cpus, mem, disk or gpus)"
    )]
    UnknownResource { role: String, name: String },
    #[error("quota of role {role}: {name} must be a non-negative number, not {value}")]
    BadValue {
        role: String,
        name: String,
        value: f64,
    },
    #[error(
        "quota of role {role}: the guarantee of {name} ({guarantee}) is above its limit ({limit})"
    )]
    GuaranteeAboveLimit {
        role: String,
        name: String,
        guarantee: f64,
        limit: f64,
    },
    #[error("role {0} appears more than once in one call")]
    Duplicate(String),
    #[error("weight of role {role} must be a positive number, not {weight}")]
    BadWeight { role: String, weight: f64 },
}

/// Checks a role name as Mesos does (and as reservations are checked).
pub(crate) fn check_role(role: &str) -> Result<(), QuotaError> {
    let bad = role.is_empty()
        || role.len() > 128
        || role.starts_with('-')
        || role.starts_with('/')
        || role.ends_with('/')
        || role.contains("//")
        || role.split('/').any(|part| part == "." || part == "..")
        || role
            .chars()
            .any(|c| !(c.is_ascii_alphanumeric() || "._-/".contains(c)));
    if bad {
        Err(QuotaError::BadRole(role.to_string()))
    } else {
        Ok(())
    }
}

/// A quota from a request's guarantees and limits (name, value pairs);
/// `None` limits: no limit.
pub(crate) fn quota_record(
    role: &str,
    guarantees: &[(String, f64)],
    limits: &[(String, f64)],
) -> Result<QuotaRecord, QuotaError> {
    if role == DEFAULT_ROLE {
        return Err(QuotaError::BadRole(role.to_string()));
    }
    check_role(role)?;
    for (name, value) in guarantees.iter().chain(limits) {
        if !QUOTA_RESOURCES.contains(&name.as_str()) {
            return Err(QuotaError::UnknownResource {
                role: role.to_string(),
                name: name.clone(),
            });
        }
        if !value.is_finite() || *value < 0.0 || *value > agora_proto::MAX_SCALAR {
            return Err(QuotaError::BadValue {
                role: role.to_string(),
                name: name.clone(),
                value: *value,
            });
        }
    }
    let limits: Option<Limits> =
        (!limits.is_empty()).then(|| limits.iter().cloned().collect::<Limits>());
    if let Some(limits) = &limits {
        for (name, guarantee) in guarantees {
            if let Some(&limit) = limits.get(name) {
                if *guarantee > limit {
                    return Err(QuotaError::GuaranteeAboveLimit {
                        role: role.to_string(),
                        name: name.clone(),
                        guarantee: *guarantee,
                        limit,
                    });
                }
            }
        }
    }
    let mut text = Vec::new();
    for (name, value) in guarantees.iter().filter(|(_, v)| *v > 0.0) {
        text.push(format!("{name}:{value}"));
    }
    let guarantees = Resources::parse(&text.join(";")).map_err(|_| QuotaError::BadValue {
        role: role.to_string(),
        name: "guarantees".into(),
        value: f64::NAN,
    })?;
    Ok(QuotaRecord {
        role: role.to_string(),
        guarantees,
        limits,
    })
}

/// A weight from a request.
pub(crate) fn weight_record(role: &str, weight: f64) -> Result<WeightRecord, QuotaError> {
    if role != DEFAULT_ROLE {
        check_role(role)?;
    }
    if !weight.is_finite() || weight <= 0.0 {
        return Err(QuotaError::BadWeight {
            role: role.to_string(),
            weight,
        });
    }
    Ok(WeightRecord {
        role: role.to_string(),
        weight,
    })
}

/// Refuses a call that names one role twice.
pub(crate) fn no_duplicates<'a>(roles: impl Iterator<Item = &'a str>) -> Result<(), QuotaError> {
    let mut seen = std::collections::BTreeSet::new();
    for role in roles {
        if !seen.insert(role) {
            return Err(QuotaError::Duplicate(role.to_string()));
        }
    }
    Ok(())
}

// === impl Master ===

impl Master {
    /// An operator set these quotas (checked and authorized by the HTTP
    /// side): applied from the next allocation cycle, and stored.
    pub(crate) fn operator_quotas(&mut self, quotas: Vec<QuotaRecord>, operator: Option<String>) {
        for record in quotas {
            tracing::info!(role = %record.role, guarantees = %record.guarantees, limits = ?record.limits, ?operator, "quota updated by an operator");
            self.apply_quota(&record);
            self.persist(RegistryOp::PutQuota(record));
        }
    }

    /// An operator set these weights.
    pub(crate) fn operator_weights(
        &mut self,
        weights: Vec<WeightRecord>,
        operator: Option<String>,
    ) {
        for record in weights {
            tracing::info!(role = %record.role, weight = record.weight, ?operator, "weight updated by an operator");
            self.apply_weight(&record);
            self.persist(RegistryOp::PutWeight(record));
        }
    }

    /// Takes the quotas and weights a registry kept over the start-up ones.
    pub(crate) fn recover_quotas(&mut self, state: &RegistryState) {
        for record in state.quotas.values() {
            self.apply_quota(record);
        }
        for (role, &weight) in &state.weights {
            self.apply_weight(&WeightRecord {
                role: role.clone(),
                weight,
            });
        }
    }

    fn apply_quota(&mut self, record: &QuotaRecord) {
        let role = record.role.clone();
        if record.guarantees.is_empty() {
            self.config.role_quotas.remove(&role);
        } else {
            self.config
                .role_quotas
                .insert(role.clone(), record.guarantees.clone());
        }
        match &record.limits {
            Some(limits) => {
                self.config.role_limits.insert(role.clone(), limits.clone());
            }
            None => {
                self.config.role_limits.remove(&role);
            }
        }
        self.allocator
            .set_quota(&role, &record.guarantees, record.limits.as_ref());
        self.dirty = true;
    }

    fn apply_weight(&mut self, record: &WeightRecord) {
        self.config
            .role_weights
            .insert(record.role.clone(), record.weight);
        self.allocator.set_weight(&record.role, record.weight);
        self.dirty = true;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pairs(s: &[(&str, f64)]) -> Vec<(String, f64)> {
        s.iter().map(|(k, v)| (k.to_string(), *v)).collect()
    }

    #[test]
    fn refusals_name_what_is_wrong() {
        let err = |role: &str, g: &[(&str, f64)], l: &[(&str, f64)]| {
            quota_record(role, &pairs(g), &pairs(l))
                .unwrap_err()
                .to_string()
        };
        assert!(err("web", &[("cpus", 4.0)], &[("cpus", 2.0)]).contains("above its limit"));
        assert!(err("web", &[("bananas", 1.0)], &[]).contains("unknown resource \"bananas\""));
        assert!(err("web", &[], &[("mem", -1.0)]).contains("non-negative"));
        assert!(err("web", &[("cpus", f64::NAN)], &[]).contains("non-negative"));
        for role in [
            "", "*", ".", "..", "-x", "a b", "a//b", "/a", "a/", "a/../b",
        ] {
            assert!(err(role, &[], &[]).contains("invalid role"), "{role:?}");
        }
        assert!(weight_record("web", 0.0).is_err());
        assert!(weight_record("web", -2.0).is_err());
        assert!(no_duplicates(["a", "b", "a"].into_iter()).is_err());
    }

    #[test]
    fn a_quota_keeps_zero_limits_and_drops_zero_guarantees() {
        let q = quota_record(
            "a/b",
            &pairs(&[("cpus", 1.0), ("mem", 0.0)]),
            &pairs(&[("cpus", 2.0), ("mem", 0.0)]),
        )
        .unwrap();
        assert_eq!(q.guarantees, Resources::parse("cpus:1").unwrap());
        assert_eq!(q.limits.unwrap()["mem"], 0.0);
        let none = quota_record("web", &[], &[]).unwrap();
        assert!(none.guarantees.is_empty() && none.limits.is_none());
    }
}
