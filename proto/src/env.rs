//! The environment an agent gives each executor it forks: the contract
//! between the agent and the executor SDK. The `MESOS_*` names are set
//! alongside for executors written against Mesos conventions.

/// `ws://host:port/api/executor` of the agent.
pub const AGENT_ENDPOINT: &str = "AGORA_AGENT_ENDPOINT";
/// The agent's id.
pub const AGENT_ID: &str = "AGORA_AGENT_ID";
/// The framework's id.
pub const FRAMEWORK_ID: &str = "AGORA_FRAMEWORK_ID";
/// The executor's id.
pub const EXECUTOR_ID: &str = "AGORA_EXECUTOR_ID";
/// Absolute path of the executor's sandbox (also its working directory).
pub const SANDBOX: &str = "AGORA_SANDBOX";
/// Secret the executor presents when subscribing. An agent hands it to
/// executors of Agora's executor API through [`SECRETS_FD`], never in
/// their environment (which a same-user process can read from
/// `/proc/PID/environ`); an executor SDK also takes it from the
/// environment, for agents that put it there.
pub const EXECUTOR_TOKEN: &str = "AGORA_EXECUTOR_TOKEN";
/// The number of an inherited descriptor (a Unix socket) from which an
/// executor reads its secrets once, at start, to its end: lines of
/// `NAME=VALUE` ([`EXECUTOR_TOKEN`], [`TLS_CERT`], [`TLS_KEY`]), as they
/// would have been in its environment. The executor closes it after
/// reading, so its tasks do not inherit it.
pub const SECRETS_FD: &str = "AGORA_EXECUTOR_SECRETS_FD";
/// The descriptor an agent gives executors their secrets on.
pub const SECRETS_FD_NUMBER: i32 = 3;
/// Variables that carry a secret, or the path of one: an agent gives none
/// of them to an executor through its environment, not even those it
/// inherited itself (its own `AGORA_SECRET`, `AGORA_TLS_KEY`, ...), and an
/// executor passes none to its tasks. A Mesos v1 executor still gets
/// [`MESOS_EXECUTOR_AUTHENTICATION_TOKEN`] in its environment, as Mesos's
/// executor API asks (see `docs/mesos.md`).
pub const SECRET_VARIABLES: &[&str] = &[
    EXECUTOR_TOKEN,
    MESOS_EXECUTOR_AUTHENTICATION_TOKEN,
    TLS_CERT,
    TLS_KEY,
    SECRET,
    SECRETS_FD,
];
/// `1` when the framework checkpoints: the executor then waits for a
/// restarted agent instead of exiting when the connection drops.
pub const CHECKPOINT: &str = "AGORA_CHECKPOINT";
/// Seconds the executor waits for its agent to come back before exiting.
pub const RECOVERY_TIMEOUT: &str = "AGORA_RECOVERY_TIMEOUT";
/// Seconds the executor has to exit after a shutdown request.
pub const SHUTDOWN_GRACE_PERIOD: &str = "AGORA_SHUTDOWN_GRACE_PERIOD";
/// `json` makes every Agora binary (master, agent, executors, examples,
/// CLI) log JSON lines instead of text; filter with `RUST_LOG`. Executors
/// inherit it from their agent.
pub const LOG_FORMAT: &str = "AGORA_LOG_FORMAT";

/// Mesos-compatible alias of [`FRAMEWORK_ID`].
pub const MESOS_FRAMEWORK_ID: &str = "MESOS_FRAMEWORK_ID";
/// Mesos-compatible alias of [`EXECUTOR_ID`].
pub const MESOS_EXECUTOR_ID: &str = "MESOS_EXECUTOR_ID";
/// Mesos-compatible alias of [`AGENT_ID`].
pub const MESOS_SLAVE_ID: &str = "MESOS_SLAVE_ID";
/// Mesos-compatible alias of [`SANDBOX`].
pub const MESOS_SANDBOX: &str = "MESOS_SANDBOX";
/// Mesos-compatible alias of [`SANDBOX`] (older name).
pub const MESOS_DIRECTORY: &str = "MESOS_DIRECTORY";
/// Mesos-compatible alias of [`CHECKPOINT`].
pub const MESOS_CHECKPOINT: &str = "MESOS_CHECKPOINT";
/// `host:port` of the agent, for executors of the Mesos v1 executor API
/// (`POST http://$MESOS_AGENT_ENDPOINT/api/v1/executor`).
pub const MESOS_AGENT_ENDPOINT: &str = "MESOS_AGENT_ENDPOINT";
/// Mesos-compatible alias of [`AGENT_ID`] (the newer name).
pub const MESOS_AGENT_ID: &str = "MESOS_AGENT_ID";
/// Mesos's shutdown grace period, in Mesos's duration format (`5secs`).
pub const MESOS_EXECUTOR_SHUTDOWN_GRACE_PERIOD: &str = "MESOS_EXECUTOR_SHUTDOWN_GRACE_PERIOD";
/// How long a checkpointing Mesos executor waits for its agent to come
/// back (Mesos duration format); set only when the framework checkpoints.
pub const MESOS_RECOVERY_TIMEOUT: &str = "MESOS_RECOVERY_TIMEOUT";
/// Longest backoff between a checkpointing Mesos executor's subscription
/// attempts (Mesos duration format); set only when the framework
/// checkpoints.
pub const MESOS_SUBSCRIPTION_BACKOFF_MAX: &str = "MESOS_SUBSCRIPTION_BACKOFF_MAX";
/// TLS for an executor's connection to its agent (`wss://` endpoints):
/// the CA to trust, and the certificate and key to present.
pub const TLS_CA: &str = "AGORA_TLS_CA";
/// See [`TLS_CA`].
pub const TLS_CERT: &str = "AGORA_TLS_CERT";
/// See [`TLS_CA`].
pub const TLS_KEY: &str = "AGORA_TLS_KEY";
/// A client's principal (`--principal`).
pub const PRINCIPAL: &str = "AGORA_PRINCIPAL";
/// A client's secret, when no `--secret-file` is given.
pub const SECRET: &str = "AGORA_SECRET";
/// The executor's token, which a Mesos v1 executor sends as
/// `Authorization: Bearer`; set when the agent authenticates executors.
pub const MESOS_EXECUTOR_AUTHENTICATION_TOKEN: &str = "MESOS_EXECUTOR_AUTHENTICATION_TOKEN";
/// `0`: the executor is not Mesos's HTTP command executor.
pub const MESOS_HTTP_COMMAND_EXECUTOR: &str = "MESOS_HTTP_COMMAND_EXECUTOR";

/// Mesos's text form of a duration (stout's `Duration`), as Mesos
/// executors parse it: whole seconds as `5secs`, anything finer in
/// milliseconds (`250ms`).
pub fn mesos_duration(d: std::time::Duration) -> String {
    if d.subsec_nanos() == 0 {
        format!("{}secs", d.as_secs())
    } else {
        format!("{}ms", d.as_millis())
    }
}

/// With the agent's `--container-logger logrotate`: the logger program
/// a command executor pipes each task's output through (the agent's
/// `agora-logrotate-logger`).
pub const LOGROTATE_LOGGER: &str = "AGORA_LOGROTATE_LOGGER";
/// With [`LOGROTATE_LOGGER`]: the size (bytes) at which a task's
/// `stdout` is rotated.
pub const LOGROTATE_MAX_STDOUT_SIZE: &str = "AGORA_LOGROTATE_MAX_STDOUT_SIZE";
/// With [`LOGROTATE_LOGGER`]: the size (bytes) at which a task's
/// `stderr` is rotated.
pub const LOGROTATE_MAX_STDERR_SIZE: &str = "AGORA_LOGROTATE_MAX_STDERR_SIZE";
/// With [`LOGROTATE_LOGGER`]: rotated files kept (`stdout.1` … `stdout.N`).
pub const LOGROTATE_MAX_FILES: &str = "AGORA_LOGROTATE_MAX_FILES";
