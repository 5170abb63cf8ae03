//! [`WorkerSpec`]: what a worker needs (resources, named ports), how it
//! starts (command, environment, artifacts fetched into its sandbox) and
//! where it may run ([`Placement`]).
//!
//! A worker runs as one task under the built-in command executor. Its
//! environment carries the worker's identity and placement, so the
//! process can register with its runtime:
//!
//! | variable | value |
//! | --- | --- |
//! | `AGORA_WORKER_ID` | the worker id (also the task id) |
//! | `AGORA_WORKER_HOST` | the agent's host name |
//! | `AGORA_WORKER_AGENT` | the agent id |
//! | `AGORA_WORKER_RACK` | the agent's rack, when it has one |
//! | `AGORA_PORT_<NAME>` | each named port, `NAME` upper-cased |

use std::collections::BTreeMap;
use std::time::Duration;

use agora_proto::{AgentId, CommandInfo, Resources, TaskId, TaskInfo};

use crate::placement::{Constraint, Placement};
use crate::WorkerId;

/// Environment variable with the worker id.
pub const ENV_WORKER_ID: &str = "AGORA_WORKER_ID";
/// Environment variable with the agent's host name.
pub const ENV_WORKER_HOST: &str = "AGORA_WORKER_HOST";
/// Environment variable with the agent id.
pub const ENV_WORKER_AGENT: &str = "AGORA_WORKER_AGENT";
/// Environment variable with the agent's rack.
pub const ENV_WORKER_RACK: &str = "AGORA_WORKER_RACK";
/// Prefix of the named-port variables.
pub const ENV_PORT_PREFIX: &str = "AGORA_PORT_";
/// Label carrying the spec name on the worker's task.
pub const SPEC_LABEL: &str = "agora.worker.spec";

/// What a worker is: resources, launch and placement.
#[derive(Debug, Clone, PartialEq)]
pub struct WorkerSpec {
    /// The spec's name: workers of one name are counted together by
    /// [`Constraint::Unique`] and [`Constraint::MaxPer`], and by the
    /// worker manager's declarations.
    pub name: String,
    /// cpus, mem, disk, gpus … in Mesos syntax (no ports: see `ports`).
    pub resources: Resources,
    /// Names of the ports the worker needs; each gets one port of the offer.
    pub ports: Vec<String>,
    /// How the worker starts.
    pub launch: Launch,
    /// Where it may and would rather run.
    pub placement: Placement,
}

/// How a worker starts.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Launch {
    /// A `/bin/sh -c` command, run in the sandbox after the artifacts
    /// are in place.
    pub command: String,
    /// Extra environment variables.
    pub environment: BTreeMap<String, String>,
    /// Files copied into the sandbox before the command starts.
    pub artifacts: Vec<Artifact>,
    /// Seconds between SIGTERM and SIGKILL when the worker is released.
    pub kill_grace_period: Option<f64>,
}

/// A file the worker needs in its sandbox.
///
/// The agent has no fetcher of its own yet, so the worker's command
/// starts with a copy step: `source` is a path on the agent's machine (or
/// a `file://` URI), copied into the sandbox under its file name,
/// unpacked when `extract` is set (`.tar`, `.tar.gz`, `.tgz`), made
/// executable when `executable` is set. A failed copy fails the worker
/// with a non-zero exit before the command runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Artifact {
    /// Path or `file://` URI on the agent's machine.
    pub source: String,
    /// Unpack the archive in the sandbox.
    pub extract: bool,
    /// `chmod +x` the copy.
    pub executable: bool,
}

// === impl WorkerSpec ===

impl WorkerSpec {
    /// A spec called `name` needing `resources` and running `command`,
    /// with no ports, artifacts, constraints or preferences.
    pub fn new(name: impl Into<String>, resources: Resources, command: impl Into<String>) -> Self {
        WorkerSpec {
            name: name.into(),
            resources,
            ports: Vec::new(),
            launch: Launch {
                command: command.into(),
                ..Launch::default()
            },
            placement: Placement::default(),
        }
    }

    /// Adds a named port.
    pub fn port(mut self, name: impl Into<String>) -> Self {
        self.ports.push(name.into());
        self
    }

    /// Adds an environment variable.
    pub fn env(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.launch.environment.insert(key.into(), value.into());
        self
    }

    /// Adds an artifact.
    pub fn artifact(mut self, artifact: Artifact) -> Self {
        self.launch.artifacts.push(artifact);
        self
    }

    /// Adds a hard constraint.
    pub fn constraint(mut self, constraint: Constraint) -> Self {
        self.placement.constraints.push(constraint);
        self
    }

    /// Prefers an agent (LOCAL) with `weight`.
    pub fn prefer_agent(mut self, agent: AgentId, weight: f64) -> Self {
        self.placement.preferences.agents.push((agent, weight));
        self
    }

    /// Prefers a host (HOST) with `weight`.
    pub fn prefer_host(mut self, host: impl Into<String>, weight: f64) -> Self {
        self.placement.preferences.hosts.push((host.into(), weight));
        self
    }

    /// Prefers a rack (RACK) with `weight`.
    pub fn prefer_rack(mut self, rack: impl Into<String>, weight: f64) -> Self {
        self.placement.preferences.racks.push((rack.into(), weight));
        self
    }

    /// Sets this spec's wait per locality level.
    pub fn locality_wait(mut self, wait: Duration) -> Self {
        self.placement.locality_wait = Some(wait);
        self
    }

    /// The task that runs this worker on `agent_id`.
    pub(crate) fn task_info(&self, worker: &WorkerLaunch<'_>) -> TaskInfo {
        let mut environment = self.launch.environment.clone();
        environment.insert(ENV_WORKER_ID.into(), worker.id.to_string());
        environment.insert(ENV_WORKER_HOST.into(), worker.hostname.to_string());
        environment.insert(ENV_WORKER_AGENT.into(), worker.agent_id.to_string());
        if let Some(rack) = worker.rack {
            environment.insert(ENV_WORKER_RACK.into(), rack.to_string());
        }
        for (name, port) in worker.ports {
            environment.insert(
                format!("{ENV_PORT_PREFIX}{}", name.to_ascii_uppercase()),
                port.to_string(),
            );
        }
        let mut labels = BTreeMap::new();
        labels.insert(SPEC_LABEL.to_string(), self.name.clone());
        TaskInfo {
            container: None,
            allocation_role: None,
            launch_stamp: None,
            name: format!("worker {} ({})", worker.id, self.name),
            task_id: TaskId::new(worker.id.as_str()),
            agent_id: worker.agent_id.clone(),
            resources: worker.resources.clone(),
            executor: None,
            command: Some(CommandInfo {
                value: self.launch.shell_command(),
                shell: true,
                arguments: Vec::new(),
                environment,
                uris: Vec::new(),
            }),
            data: None,
            kill_grace_period: self.launch.kill_grace_period,
            labels,
            task_group: None,
        }
    }
}

/// Where one worker of a spec goes, for [`WorkerSpec::task_info`].
pub(crate) struct WorkerLaunch<'a> {
    pub(crate) id: &'a WorkerId,
    pub(crate) agent_id: &'a AgentId,
    pub(crate) hostname: &'a str,
    pub(crate) rack: Option<&'a str>,
    pub(crate) resources: &'a Resources,
    pub(crate) ports: &'a BTreeMap<String, u64>,
}

// === impl Launch ===

impl Launch {
    /// The command with the artifact steps in front.
    pub fn shell_command(&self) -> String {
        if self.artifacts.is_empty() {
            return self.command.clone();
        }
        let mut steps: Vec<String> = Vec::new();
        for artifact in &self.artifacts {
            let source = artifact
                .source
                .strip_prefix("file://")
                .unwrap_or(&artifact.source);
            let name = source.rsplit('/').next().unwrap_or(source);
            steps.push(format!("cp -R -- {} ./", quote(source)));
            if artifact.extract {
                steps.push(format!("tar xf {}", quote(name)));
            }
            if artifact.executable {
                steps.push(format!("chmod +x {}", quote(name)));
            }
        }
        format!("{} && {}", steps.join(" && "), self.command)
    }
}

/// Single-quotes `text` for `/bin/sh`.
fn quote(text: &str) -> String {
    format!("'{}'", text.replace('\'', r"'\''"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn artifacts_are_copied_before_the_command() {
        let spec = WorkerSpec::new("w", Resources::new(), "./run.sh").artifact(Artifact {
            source: "file:///opt/it's/run.sh".into(),
            extract: false,
            executable: true,
        });
        assert_eq!(
            spec.launch.shell_command(),
            r"cp -R -- '/opt/it'\''s/run.sh' ./ && chmod +x 'run.sh' && ./run.sh"
        );
        let plain = WorkerSpec::new("w", Resources::new(), "echo hi");
        assert_eq!(plain.launch.shell_command(), "echo hi");
    }

    #[test]
    fn the_task_carries_identity_ports_and_labels() {
        let spec = WorkerSpec::new("tm", Resources::parse("cpus:1").unwrap(), "run")
            .port("rpc")
            .env("A", "1");
        let ports = BTreeMap::from([("rpc".to_string(), 31000)]);
        let id = WorkerId::new("w-1-0");
        let task = spec.task_info(&WorkerLaunch {
            id: &id,
            agent_id: &AgentId::new("a1"),
            hostname: "h1",
            rack: Some("r0"),
            resources: &spec.resources,
            ports: &ports,
        });
        assert_eq!(task.task_id.as_str(), "w-1-0");
        let env = &task.command.as_ref().unwrap().environment;
        assert_eq!(env.get("AGORA_PORT_RPC").map(String::as_str), Some("31000"));
        assert_eq!(env.get(ENV_WORKER_HOST).map(String::as_str), Some("h1"));
        assert_eq!(env.get(ENV_WORKER_RACK).map(String::as_str), Some("r0"));
        assert_eq!(env.get("A").map(String::as_str), Some("1"));
        assert_eq!(task.labels.get(SPEC_LABEL).map(String::as_str), Some("tm"));
    }
}
