//! The bridge's wire: one JSON object per line, commands on stdin (from
//! the Flink driver) and events on stdout (to it).
//!
//! Commands carry `"op"`, events `"event"`. A command with an unknown op
//! or field is refused with a `refused` event naming it; nothing is
//! ignored. The spec of a request maps onto [`WorkerSpec`] one to one.

use std::collections::BTreeMap;
use std::time::Duration;

use agora_workers::proto::Resources;
use agora_workers::{
    Artifact, ConnectionState, Constraint, FinalStatus, TerminationCause, WorkerHandle, WorkerId,
    WorkerSpec,
};
use serde::{Deserialize, Serialize};

/// A command from the driver.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case", deny_unknown_fields)]
pub enum Command {
    /// Request one worker; answered by `placed` or `request_failed` with
    /// the same `request` number.
    Request {
        /// The driver's number for this request.
        request: u64,
        /// What to start.
        spec: Box<SpecJson>,
    },
    /// Withdraw a request not placed yet.
    Cancel {
        /// The request's number.
        request: u64,
    },
    /// Release a worker (it is killed; `terminated` says `killed`).
    Release {
        /// The worker.
        worker: WorkerId,
    },
    /// End the application: every worker is killed, the store cleared,
    /// the framework torn down; `ended` follows and the bridge exits.
    Deregister {
        /// The application's final status.
        status: StatusJson,
        /// Why, for the log.
        #[serde(default)]
        diagnostics: Option<String>,
    },
    /// Stop in failover mode: workers keep running for the next attempt;
    /// `ended` follows and the bridge exits. Closing stdin does the same.
    Terminate {},
}

/// The final status of a deregistration (Flink's `ApplicationStatus`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StatusJson {
    /// `SUCCEEDED`.
    Succeeded,
    /// `FAILED`.
    Failed,
    /// `CANCELED`.
    Canceled,
    /// `UNKNOWN`.
    Unknown,
}

/// A worker spec as the driver sends it.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SpecJson {
    /// The spec name (workers of one name are counted together by
    /// `UNIQUE` and `MAX_PER`).
    pub name: String,
    /// Resources in Mesos syntax, without ports: `cpus:1;mem:1024`.
    pub resources: String,
    /// Named ports, each one port of the offer in `AGORA_PORT_<NAME>`.
    #[serde(default)]
    pub ports: Vec<String>,
    /// The `/bin/sh -c` command.
    pub command: String,
    /// Extra environment.
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// Files on the agent's machine copied into the sandbox first.
    #[serde(default)]
    pub artifacts: Vec<String>,
    /// Seconds between SIGTERM and SIGKILL on release.
    #[serde(default)]
    pub kill_grace_period: Option<f64>,
    /// Hard constraints, `FIELD:OP[:VALUE]` with OP one of `EQUALS`
    /// (or `CLUSTER`), `LIKE`, `UNLIKE`, `UNIQUE`, `MAX_PER`.
    #[serde(default)]
    pub constraints: Vec<String>,
    /// Preferred host names (HOST level), each with a weight.
    #[serde(default)]
    pub prefer_hosts: Vec<Preference>,
    /// Preferred agent ids (LOCAL level).
    #[serde(default)]
    pub prefer_agents: Vec<Preference>,
    /// Preferred racks (RACK level).
    #[serde(default)]
    pub prefer_racks: Vec<Preference>,
    /// Wait per locality level, in milliseconds (the bridge's default
    /// when absent).
    #[serde(default)]
    pub locality_wait_ms: Option<u64>,
}

/// A weighted preference.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Preference {
    /// Host, agent id or rack.
    pub name: String,
    /// Its weight (default 1).
    #[serde(default = "one")]
    pub weight: f64,
}

/// An event for the driver.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "event", rename_all = "snake_case")]
pub enum Event {
    /// The workers of earlier attempts still recorded as launched: comes
    /// exactly once, first, before any request is answered.
    Recovered {
        /// The workers.
        workers: Vec<WorkerHandle>,
    },
    /// A request's worker is placed; its task is about to be sent.
    Placed {
        /// The request.
        request: u64,
        /// The worker.
        worker: WorkerHandle,
    },
    /// A request failed (cancelled, deregistered, stopped).
    RequestFailed {
        /// The request.
        request: u64,
        /// Why.
        error: String,
    },
    /// A worker's task runs (first time only).
    Running {
        /// The worker.
        worker: WorkerId,
    },
    /// A worker ended (exactly once per worker, never before its
    /// `placed` or `recovered`).
    Terminated {
        /// The worker.
        worker: WorkerId,
        /// `exited(N)`, `failed`, `killed`, `agent_lost`, `launch_failed`,
        /// `lost_after_reconciliation`.
        cause: String,
        /// The master's words.
        diagnostics: String,
    },
    /// The connection to the master changed.
    Connection {
        /// `connected`, `disconnected`, `reconnected`.
        state: ConnectionState,
    },
    /// A command was refused; the bridge goes on.
    Refused {
        /// The offending line (cut to 200 characters).
        line: String,
        /// Why.
        error: String,
    },
    /// The bridge cannot go on (store failure, deposed, framework removed).
    Error {
        /// Why.
        message: String,
    },
    /// The last line: the bridge exits.
    Ended {
        /// `deregistered`, `terminated`, or the error.
        reason: String,
    },
}

/// Why a spec cannot become a [`WorkerSpec`].
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
pub enum SpecError {
    /// The resources do not parse.
    #[error("resources {0:?}: {1}")]
    Resources(String, String),
    /// A constraint does not parse.
    #[error("constraint {0:?}: {1}")]
    Constraint(String, String),
    /// A weight is not a positive number.
    #[error("preference {0:?}: the weight must be a positive number")]
    Weight(String),
}

fn one() -> f64 {
    1.0
}

// === impl StatusJson ===

impl From<StatusJson> for FinalStatus {
    fn from(status: StatusJson) -> Self {
        match status {
            StatusJson::Succeeded => FinalStatus::Succeeded,
            StatusJson::Failed => FinalStatus::Failed,
            StatusJson::Canceled => FinalStatus::Canceled,
            StatusJson::Unknown => FinalStatus::Unknown,
        }
    }
}

// === impl SpecJson ===

impl SpecJson {
    /// The worker spec this describes.
    pub fn to_spec(&self) -> Result<WorkerSpec, SpecError> {
        let resources = Resources::parse(&self.resources)
            .map_err(|e| SpecError::Resources(self.resources.clone(), e.to_string()))?;
        let mut spec = WorkerSpec::new(&self.name, resources, &self.command);
        for port in &self.ports {
            spec = spec.port(port);
        }
        for (key, value) in &self.env {
            spec = spec.env(key, value);
        }
        for source in &self.artifacts {
            spec = spec.artifact(Artifact {
                source: source.clone(),
                extract: false,
                executable: false,
            });
        }
        spec.launch.kill_grace_period = self.kill_grace_period;
        for text in &self.constraints {
            spec = spec.constraint(parse_constraint(text)?);
        }
        for p in &self.prefer_hosts {
            spec = spec.prefer_host(&p.name, weight(p)?);
        }
        for p in &self.prefer_agents {
            spec = spec.prefer_agent(agora_workers::proto::AgentId::new(&p.name), weight(p)?);
        }
        for p in &self.prefer_racks {
            spec = spec.prefer_rack(&p.name, weight(p)?);
        }
        if let Some(ms) = self.locality_wait_ms {
            spec = spec.locality_wait(Duration::from_millis(ms));
        }
        Ok(spec)
    }
}

fn weight(p: &Preference) -> Result<f64, SpecError> {
    if p.weight.is_finite() && p.weight > 0.0 {
        Ok(p.weight)
    } else {
        Err(SpecError::Weight(p.name.clone()))
    }
}

/// Parses `FIELD:OP[:VALUE]` (Marathon's operators; `VALUE` may contain
/// colons).
pub fn parse_constraint(text: &str) -> Result<Constraint, SpecError> {
    let bad = |why: &str| SpecError::Constraint(text.to_string(), why.to_string());
    let mut parts = text.splitn(3, ':');
    let field = parts.next().unwrap_or("").trim();
    let op = parts.next().unwrap_or("").trim().to_ascii_uppercase();
    let value = parts.next();
    if field.is_empty() {
        return Err(bad("no field"));
    }
    let needed = bad("this operator needs a value");
    let need = move |value: Option<&'_ str>| value.map(str::to_string).ok_or(needed.clone());
    let none = |value: Option<&str>| match value {
        Some(_) => Err(bad("this operator takes no value")),
        None => Ok(()),
    };
    match op.as_str() {
        "EQUALS" | "CLUSTER" => Ok(Constraint::equals(field, need(value)?)),
        "LIKE" => Constraint::like(field, &need(value)?).map_err(|e| bad(&e.to_string())),
        "UNLIKE" => Constraint::unlike(field, &need(value)?).map_err(|e| bad(&e.to_string())),
        "UNIQUE" => {
            none(value)?;
            Ok(Constraint::Unique {
                field: field.to_string(),
            })
        }
        "MAX_PER" => {
            let max = need(value)?
                .trim()
                .parse::<usize>()
                .ok()
                .filter(|m| *m > 0)
                .ok_or_else(|| bad("MAX_PER needs a positive whole number"))?;
            Ok(Constraint::MaxPer {
                field: field.to_string(),
                max,
            })
        }
        "" => Err(bad("no operator")),
        other => Err(bad(&format!(
            "unknown operator {other} (EQUALS, CLUSTER, LIKE, UNLIKE, UNIQUE, MAX_PER)"
        ))),
    }
}

// === impl Event ===

impl Event {
    /// The termination event of a worker.
    pub fn terminated(id: &WorkerId, cause: TerminationCause, diagnostics: &str) -> Event {
        Event::Terminated {
            worker: id.clone(),
            cause: cause.name(),
            diagnostics: diagnostics.to_string(),
        }
    }

    /// The worker this event is about, when it must follow the worker's
    /// `placed` or `recovered`.
    pub fn follows_worker(&self) -> Option<&WorkerId> {
        match self {
            Event::Running { worker } | Event::Terminated { worker, .. } => Some(worker),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn command(line: &str) -> Result<Command, serde_json::Error> {
        serde_json::from_str(line)
    }

    #[test]
    fn commands_parse() {
        let c = command(
            r#"{"op":"request","request":3,"spec":{"name":"tm","resources":"cpus:1;mem:1024",
                "ports":["rpc","data"],"command":"exec tm","env":{"A":"1"},
                "constraints":["hostname:UNIQUE"],"prefer_hosts":[{"name":"h1","weight":2}],
                "locality_wait_ms":500}}"#,
        )
        .unwrap();
        let Command::Request { request, spec } = c else {
            panic!("not a request")
        };
        assert_eq!(request, 3);
        let spec = spec.to_spec().unwrap();
        assert_eq!(spec.ports, vec!["rpc", "data"]);
        assert_eq!(
            spec.placement.preferences.hosts,
            vec![("h1".to_string(), 2.0)]
        );
        assert_eq!(
            spec.placement.locality_wait,
            Some(Duration::from_millis(500))
        );
        assert_eq!(
            spec.launch.environment.get("A").map(String::as_str),
            Some("1")
        );
        assert_eq!(
            command(r#"{"op":"release","worker":"worker-1-1"}"#).unwrap(),
            Command::Release {
                worker: WorkerId::new("worker-1-1")
            }
        );
        assert_eq!(
            command(r#"{"op":"terminate"}"#).unwrap(),
            Command::Terminate {}
        );
        assert!(matches!(
            command(r#"{"op":"deregister","status":"succeeded"}"#).unwrap(),
            Command::Deregister {
                status: StatusJson::Succeeded,
                diagnostics: None
            }
        ));
    }

    #[test]
    fn unknown_ops_and_fields_are_refused_by_name() {
        let e = command(r#"{"op":"release","worker":"w","force":true}"#).unwrap_err();
        assert!(e.to_string().contains("force"), "{e}");
        let e = command(r#"{"op":"explode"}"#).unwrap_err();
        assert!(e.to_string().contains("explode"), "{e}");
        let e = command(
            r#"{"op":"request","request":1,"spec":{"name":"tm","resources":"cpus:1","command":"x","gpu_model":"a100"}}"#,
        )
        .unwrap_err();
        assert!(e.to_string().contains("gpu_model"), "{e}");
        let e = command(r#"{"op":"terminate","now":true}"#).unwrap_err();
        assert!(e.to_string().contains("now"), "{e}");
    }

    #[test]
    fn constraints_parse_or_say_why_not() {
        assert!(matches!(
            parse_constraint("hostname:UNIQUE").unwrap(),
            Constraint::Unique { .. }
        ));
        assert!(matches!(
            parse_constraint("rack:max_per:2").unwrap(),
            Constraint::MaxPer { max: 2, .. }
        ));
        assert!(matches!(
            parse_constraint("zone:CLUSTER:a:b").unwrap(),
            Constraint::Equals { value, .. } if value == "a:b"
        ));
        assert!(parse_constraint("rack:LIKE:r[01]").is_ok());
        for bad in [
            "",
            "rack",
            "rack:NEAR:x",
            "rack:UNIQUE:x",
            "rack:MAX_PER:0",
            "rack:LIKE",
        ] {
            let e = parse_constraint(bad).unwrap_err();
            assert!(e.to_string().contains(bad), "{e}");
        }
        assert!(matches!(
            parse_constraint("rack:LIKE:(").unwrap_err(),
            SpecError::Constraint(..)
        ));
    }

    #[test]
    fn bad_specs_are_refused() {
        let spec = |resources: &str, weight: f64| SpecJson {
            name: "tm".into(),
            resources: resources.into(),
            ports: vec![],
            command: "x".into(),
            env: BTreeMap::new(),
            artifacts: vec![],
            kill_grace_period: None,
            constraints: vec![],
            prefer_hosts: vec![Preference {
                name: "h".into(),
                weight,
            }],
            prefer_agents: vec![],
            prefer_racks: vec![],
            locality_wait_ms: None,
        };
        assert!(matches!(
            spec("cpus:lots", 1.0).to_spec().unwrap_err(),
            SpecError::Resources(..)
        ));
        assert!(matches!(
            spec("cpus:1", 0.0).to_spec().unwrap_err(),
            SpecError::Weight(..)
        ));
    }

    #[test]
    fn events_serialize_with_their_tag() {
        let e = Event::terminated(&WorkerId::new("w"), TerminationCause::Killed, "released");
        assert_eq!(
            serde_json::to_string(&e).unwrap(),
            r#"{"event":"terminated","worker":"w","cause":"killed","diagnostics":"released"}"#
        );
        let e = Event::Connection {
            state: ConnectionState::Reconnected,
        };
        assert_eq!(
            serde_json::to_string(&e).unwrap(),
            r#"{"event":"connection","state":"reconnected"}"#
        );
    }
}
