//! [`ExecutorConfig`]: what an executor needs to reach its agent, read
//! from the environment the agent sets ([`agora_proto::env`]).

use std::path::PathBuf;
use std::time::Duration;

use agora_proto::env;
use agora_proto::{AgentId, ExecutorId, FrameworkId};

use crate::ExecutorError;

/// How an [`ExecutorDriver`](crate::ExecutorDriver) reaches its agent.
/// Usually built with [`ExecutorConfig::from_env`].
#[derive(Debug, Clone, PartialEq)]
pub struct ExecutorConfig {
    /// `ws://host:port/api/executor` of the agent (`wss://` with TLS).
    pub agent_endpoint: String,
    /// TLS to a `wss://` agent: the CA (`AGORA_TLS_CA`) and the client
    /// certificate and key (`AGORA_TLS_CERT`, `AGORA_TLS_KEY`) the agent
    /// gave.
    pub tls: agora_net::TlsOptions,
    /// The executor's framework.
    pub framework_id: FrameworkId,
    /// This executor.
    pub executor_id: ExecutorId,
    /// The agent, when the agent said (otherwise learned on subscription).
    pub agent_id: Option<AgentId>,
    /// The sandbox directory (also the executor's working directory).
    pub sandbox: PathBuf,
    /// Secret presented when subscribing.
    pub token: String,
    /// Whether the framework checkpoints: the driver then waits for a
    /// restarted agent instead of aborting when the connection drops.
    pub checkpoint: bool,
    /// How long to keep reconnecting to a lost agent (checkpointing
    /// frameworks). Default 15 min.
    pub recovery_timeout: Duration,
    /// Time to finish after a shutdown request, and the bound on how long
    /// `stop` waits for a subscribed agent's acknowledgements (while the
    /// agent is away, `stop` waits for it as long as `recovery_timeout`
    /// allows, and the grace period starts again once it is back).
    /// Default 5 s.
    pub shutdown_grace_period: Duration,
}

// === impl ExecutorConfig ===

impl ExecutorConfig {
    /// Default [`ExecutorConfig::recovery_timeout`].
    pub const DEFAULT_RECOVERY_TIMEOUT: Duration = Duration::from_secs(15 * 60);
    /// Default [`ExecutorConfig::shutdown_grace_period`].
    pub const DEFAULT_SHUTDOWN_GRACE_PERIOD: Duration = Duration::from_secs(5);

    /// Reads the configuration from the environment an agent gives its
    /// executors: `AGORA_AGENT_ENDPOINT`, `AGORA_FRAMEWORK_ID`,
    /// `AGORA_EXECUTOR_ID`, `AGORA_SANDBOX` and `AGORA_EXECUTOR_TOKEN` are
    /// required (the `MESOS_*` aliases are accepted for ids and sandbox);
    /// `AGORA_AGENT_ID`, `AGORA_CHECKPOINT` (`1`/`true`),
    /// `AGORA_RECOVERY_TIMEOUT` and `AGORA_SHUTDOWN_GRACE_PERIOD` (seconds,
    /// or a number with `ms`/`s`/`m`/`h`) are optional. The error names the
    /// variable that is missing or invalid.
    ///
    /// The token and the TLS certificate and key paths come from the
    /// descriptor `AGORA_EXECUTOR_SECRETS_FD` names, where an agent puts
    /// them (read to its end and closed, so the executor's tasks do not
    /// inherit it), else from the environment.
    ///
    /// Before anything is read, this process is made non-dumpable
    /// (`PR_SET_DUMPABLE` 0): another process of its user, such as one of
    /// its tasks, can then no longer read its memory, environment or
    /// descriptors under `/proc`, nor attach to it. The secrets'
    /// variables are then removed from this process's environment, so
    /// that the processes the executor starts (its tasks) do not inherit
    /// the executor's identity. Call this before starting threads that
    /// read the environment.
    pub fn from_env() -> Result<Self, ExecutorError> {
        if let Err(error) = nix::sys::prctl::set_dumpable(false) {
            tracing::warn!(%error, "cannot make the executor non-dumpable: processes of its user can read its memory");
        }
        let secrets = match std::env::var(env::SECRETS_FD) {
            Ok(fd) => read_secrets(&fd)?,
            Err(_) => Vec::new(),
        };
        let config = Self::from_lookup(|name| {
            secrets
                .iter()
                .find(|(key, _)| key == name)
                .map(|(_, value)| value.clone())
                .or_else(|| std::env::var(name).ok())
        })?;
        for name in env::SECRET_VARIABLES {
            std::env::remove_var(name);
        }
        Ok(config)
    }

    /// [`ExecutorConfig::from_env`] over any variable lookup.
    pub(crate) fn from_lookup(
        lookup: impl Fn(&str) -> Option<String>,
    ) -> Result<Self, ExecutorError> {
        let first = |names: &[&'static str]| -> Option<(&'static str, String)> {
            names
                .iter()
                .find_map(|name| lookup(name).map(|value| (*name, value)))
        };
        let required = |names: &[&'static str]| -> Result<(&'static str, String), ExecutorError> {
            first(names).ok_or(ExecutorError::MissingEnv(names[0]))
        };

        let (name, agent_endpoint) = required(&[env::AGENT_ENDPOINT])?;
        let rest = agent_endpoint
            .strip_prefix("ws://")
            .or_else(|| agent_endpoint.strip_prefix("wss://"));
        if rest.is_none_or(str::is_empty) {
            return Err(invalid(
                name,
                &agent_endpoint,
                "expected a ws:// or wss:// URL",
            ));
        }
        let tls = agora_net::TlsOptions {
            ca: lookup(env::TLS_CA).map(PathBuf::from),
            cert: lookup(env::TLS_CERT).map(PathBuf::from),
            key: lookup(env::TLS_KEY).map(PathBuf::from),
            ..agora_net::TlsOptions::default()
        };
        let framework_id = FrameworkId::new(id(required(&[
            env::FRAMEWORK_ID,
            env::MESOS_FRAMEWORK_ID,
        ])?)?);
        let executor_id = ExecutorId::new(executor_id(required(&[
            env::EXECUTOR_ID,
            env::MESOS_EXECUTOR_ID,
        ])?)?);
        let agent_id = first(&[env::AGENT_ID, env::MESOS_SLAVE_ID])
            .filter(|(_, value)| !value.is_empty())
            .map(id)
            .transpose()?
            .map(AgentId::new);
        let (name, sandbox) = required(&[env::SANDBOX, env::MESOS_SANDBOX, env::MESOS_DIRECTORY])?;
        if sandbox.is_empty() {
            return Err(invalid(name, &sandbox, "must be a directory path"));
        }
        let (_, token) = required(&[env::EXECUTOR_TOKEN])?;
        let checkpoint = match first(&[env::CHECKPOINT, env::MESOS_CHECKPOINT]) {
            None => false,
            Some((name, value)) => match value.trim().to_ascii_lowercase().as_str() {
                "1" | "true" => true,
                "0" | "false" | "" => false,
                _ => return Err(invalid(name, &value, "expected 1, true, 0 or false")),
            },
        };
        let duration = |name: &'static str, default: Duration| match lookup(name) {
            None => Ok(default),
            Some(value) => parse_duration(&value).ok_or_else(|| {
                invalid(
                    name,
                    &value,
                    "expected seconds (e.g. 5, 0.5) or 500ms, 5s, 15m, 1h",
                )
            }),
        };
        Ok(ExecutorConfig {
            agent_endpoint,
            tls,
            framework_id,
            executor_id,
            agent_id,
            sandbox: PathBuf::from(sandbox),
            token,
            checkpoint,
            recovery_timeout: duration(env::RECOVERY_TIMEOUT, Self::DEFAULT_RECOVERY_TIMEOUT)?,
            shutdown_grace_period: duration(
                env::SHUTDOWN_GRACE_PERIOD,
                Self::DEFAULT_SHUTDOWN_GRACE_PERIOD,
            )?,
        })
    }
}

/// Most bytes of secrets read from the agent's descriptor.
const MAX_SECRETS_BYTES: u64 = 64 << 10;

/// Reads and closes the descriptor `AGORA_EXECUTOR_SECRETS_FD` names
/// (`fd`): its `NAME=VALUE` lines.
#[allow(unsafe_code)]
fn read_secrets(fd: &str) -> Result<Vec<(String, String)>, ExecutorError> {
    use std::io::Read;
    use std::os::fd::{FromRawFd, OwnedFd};
    let number: std::os::fd::RawFd = fd
        .trim()
        .parse()
        .ok()
        .filter(|n| *n > 2)
        .ok_or_else(|| invalid(env::SECRETS_FD, fd, "expected a descriptor number above 2"))?;
    // SAFETY: F_GETFD only reads the descriptor's flags; -1 when it is
    // not open.
    if unsafe { libc::fcntl(number, libc::F_GETFD) } < 0 {
        return Err(invalid(
            env::SECRETS_FD,
            fd,
            "no such descriptor is open in this process",
        ));
    }
    // SAFETY: the descriptor is open, was handed to this process by its
    // agent for this reading alone, and nothing else in it owns it; it is
    // closed once read.
    let file = std::fs::File::from(unsafe { OwnedFd::from_raw_fd(number) });
    let mut text = String::new();
    file.take(MAX_SECRETS_BYTES)
        .read_to_string(&mut text)
        .map_err(|e| invalid(env::SECRETS_FD, fd, format!("cannot read it: {e}")))?;
    Ok(text
        .lines()
        .filter_map(|line| line.split_once('='))
        .map(|(name, value)| (name.to_string(), value.to_string()))
        .collect())
}

fn invalid(name: &'static str, value: &str, reason: impl Into<String>) -> ExecutorError {
    ExecutorError::InvalidEnv {
        name,
        value: value.to_string(),
        reason: reason.into(),
    }
}

fn id((name, value): (&'static str, String)) -> Result<String, ExecutorError> {
    agora_proto::validate_id(&value).map_err(|e| invalid(name, &value, e.to_string()))?;
    Ok(value)
}

fn executor_id((name, value): (&'static str, String)) -> Result<String, ExecutorError> {
    agora_proto::validate_executor_id(&value).map_err(|e| invalid(name, &value, e.to_string()))?;
    Ok(value)
}

/// [`agora_proto::parse_duration`], for variables where `None` means "invalid".
pub(crate) fn parse_duration(text: &str) -> Option<Duration> {
    agora_proto::parse_duration(text).ok()
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    fn base() -> HashMap<&'static str, String> {
        HashMap::from([
            (
                env::AGENT_ENDPOINT,
                "ws://127.0.0.1:5051/api/executor".to_string(),
            ),
            (env::FRAMEWORK_ID, "fw-1".to_string()),
            (env::EXECUTOR_ID, "ex-1".to_string()),
            (env::SANDBOX, "/tmp/sandbox".to_string()),
            (env::EXECUTOR_TOKEN, "secret".to_string()),
        ])
    }

    fn load(vars: &HashMap<&'static str, String>) -> Result<ExecutorConfig, ExecutorError> {
        ExecutorConfig::from_lookup(|name| vars.get(name).cloned())
    }

    #[test]
    fn reads_required_variables_with_defaults() {
        let config = load(&base()).unwrap();
        assert_eq!(config.agent_endpoint, "ws://127.0.0.1:5051/api/executor");
        assert_eq!(config.framework_id, FrameworkId::new("fw-1"));
        assert_eq!(config.executor_id, ExecutorId::new("ex-1"));
        assert_eq!(config.agent_id, None);
        assert_eq!(config.sandbox, PathBuf::from("/tmp/sandbox"));
        assert_eq!(config.token, "secret");
        assert!(!config.checkpoint);
        assert_eq!(config.recovery_timeout, Duration::from_secs(900));
        assert_eq!(config.shutdown_grace_period, Duration::from_secs(5));
    }

    #[test]
    fn reads_optional_variables() {
        let mut vars = base();
        vars.insert(env::AGENT_ID, "agent-1".into());
        vars.insert(env::CHECKPOINT, "true".into());
        vars.insert(env::RECOVERY_TIMEOUT, "60".into());
        vars.insert(env::SHUTDOWN_GRACE_PERIOD, "1.5".into());
        let config = load(&vars).unwrap();
        assert_eq!(config.agent_id, Some(AgentId::new("agent-1")));
        assert!(config.checkpoint);
        assert_eq!(config.recovery_timeout, Duration::from_secs(60));
        assert_eq!(config.shutdown_grace_period, Duration::from_millis(1500));
        vars.insert(env::CHECKPOINT, "1".into());
        assert!(load(&vars).unwrap().checkpoint);
        vars.insert(env::CHECKPOINT, "0".into());
        assert!(!load(&vars).unwrap().checkpoint);
    }

    #[test]
    fn mesos_aliases_are_accepted() {
        let mut vars = base();
        vars.remove(env::FRAMEWORK_ID);
        vars.remove(env::SANDBOX);
        vars.insert(env::MESOS_FRAMEWORK_ID, "fw-m".into());
        vars.insert(env::MESOS_DIRECTORY, "/tmp/m".into());
        let config = load(&vars).unwrap();
        assert_eq!(config.framework_id, FrameworkId::new("fw-m"));
        assert_eq!(config.sandbox, PathBuf::from("/tmp/m"));
    }

    #[test]
    fn errors_name_the_variable() {
        for name in [
            env::AGENT_ENDPOINT,
            env::FRAMEWORK_ID,
            env::EXECUTOR_ID,
            env::SANDBOX,
            env::EXECUTOR_TOKEN,
        ] {
            let mut vars = base();
            vars.remove(name);
            let error = load(&vars).unwrap_err();
            assert!(matches!(error, ExecutorError::MissingEnv(n) if n == name));
            assert!(error.to_string().contains(name));
        }
        for (name, value) in [
            (env::AGENT_ENDPOINT, "http://x:1"),
            (env::FRAMEWORK_ID, "a/b"),
            (env::CHECKPOINT, "maybe"),
            (env::RECOVERY_TIMEOUT, "soon"),
            (env::SHUTDOWN_GRACE_PERIOD, "-1"),
        ] {
            let mut vars = base();
            vars.insert(name, value.into());
            let error = load(&vars).unwrap_err();
            assert!(
                matches!(&error, ExecutorError::InvalidEnv { name: n, .. } if *n == name),
                "{name}: {error}"
            );
            assert!(error.to_string().contains(name));
        }
    }

    #[test]
    fn secrets_are_read_from_the_descriptor() {
        use std::io::Write;
        use std::os::fd::IntoRawFd;
        let (mut agent, executor) = std::os::unix::net::UnixStream::pair().unwrap();
        agent
            .write_all(b"AGORA_EXECUTOR_TOKEN=a.b.c\nAGORA_TLS_KEY=/etc/agent/key.pem\n")
            .unwrap();
        drop(agent);
        let fd = executor.into_raw_fd();
        let secrets = read_secrets(&fd.to_string()).unwrap();
        assert_eq!(
            secrets,
            [
                ("AGORA_EXECUTOR_TOKEN".to_string(), "a.b.c".to_string()),
                (
                    "AGORA_TLS_KEY".to_string(),
                    "/etc/agent/key.pem".to_string()
                ),
            ]
        );
        for bad in ["x", "1", "-4"] {
            let error = read_secrets(bad).unwrap_err();
            assert!(error.to_string().contains(env::SECRETS_FD), "{error}");
        }
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration("5"), Some(Duration::from_secs(5)));
        assert_eq!(parse_duration("0.25"), Some(Duration::from_millis(250)));
        assert_eq!(parse_duration("500ms"), Some(Duration::from_millis(500)));
        assert_eq!(parse_duration("15mins"), Some(Duration::from_secs(900)));
        assert_eq!(parse_duration("2h"), Some(Duration::from_secs(7200)));
        assert_eq!(parse_duration(""), None);
        assert_eq!(parse_duration("1y"), None);
        assert_eq!(parse_duration("NaN"), None);
    }
}
