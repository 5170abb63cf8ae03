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
/// Secret the executor presents when subscribing.
pub const EXECUTOR_TOKEN: &str = "AGORA_EXECUTOR_TOKEN";
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
