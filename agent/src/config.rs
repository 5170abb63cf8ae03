//! The agent's configuration: what it offers, where it keeps its state and
//! how patient it is with executors and the master. [`Config::new`] detects
//! the machine's resources the way Mesos does; the binary overrides fields
//! from flags.

use std::path::{Path, PathBuf};
use std::time::Duration;

use agora_proto::{Attributes, Resources};

use agora_containerizer::{CgroupsConfig, Isolation};

/// Memory held back from offers, like Mesos: `min(1 GiB, half of total)`.
const MEM_RESERVE_MIB: u64 = 1024;
/// Disk held back from offers, like Mesos: `min(5 GiB, half of available)`.
const DISK_RESERVE_MIB: u64 = 5 * 1024;
/// Disk offered when the work dir's file system cannot be inspected.
const FALLBACK_DISK_MIB: u64 = 10 * 1024;
/// Default of [`Config::core_queue`].
pub const DEFAULT_CORE_QUEUE: usize = 4096;
/// Default of [`Config::executor_outbox`].
pub const DEFAULT_EXECUTOR_OUTBOX: usize = 1024;
/// Default of [`Config::master_outbox`].
pub const DEFAULT_MASTER_OUTBOX: usize = 10_000;
/// Default of [`Config::executor_heartbeat_interval`]: Mesos's.
pub const DEFAULT_EXECUTOR_HEARTBEAT_INTERVAL: Duration = Duration::from_secs(30 * 60);
/// Default of [`Config::command_executor_tasks`].
pub const DEFAULT_COMMAND_EXECUTOR_TASKS: usize = 128;
/// Ports offered by default, as in Mesos.
const DEFAULT_PORTS: &str = "[31000-32000]";

/// What a restarted agent does with executors it finds checkpointed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum RecoverMode {
    /// Re-attach to executors that are still alive and let them
    /// re-subscribe; tasks of dead ones get terminal updates.
    #[default]
    Reconnect,
    /// Kill every executor found and report its tasks terminal.
    Cleanup,
}

/// Configuration of one agent. Build it with [`Config::new`] and adjust
/// fields as needed.
#[derive(Debug, Clone)]
pub struct Config {
    /// `HOST:PORT` of the master.
    pub master: String,
    /// Principal and secret sent as `Authorization: Basic` when
    /// connecting to the master (for `--authenticate-agents`). Refused,
    /// the agent is not registered and tries again with its backoff.
    pub credential: Option<agora_proto::Credential>,
    /// File holding the key (at least 32 bytes) that signs executor
    /// tokens. Default: a random key the agent keeps in its work
    /// directory, so executors recovered after a restart keep theirs.
    pub executor_secret_key: Option<PathBuf>,
    /// Whether Mesos v1 executors must present their token
    /// (`Authorization: Bearer`, from `MESOS_EXECUTOR_AUTHENTICATION_TOKEN`)
    /// on every call: a missing or forged one gets `401`, one for another
    /// executor or run `403`. Agora's own executors always present theirs.
    pub authenticate_executors: bool,
    /// Principals and secrets operators authenticate with on the agent's
    /// HTTP endpoints (`--credentials`, the master's format).
    pub credentials: Option<agora_proto::Credentials>,
    /// Operators must authenticate (Basic or Bearer) on every HTTP
    /// endpoint but `/health`, `/version` and the executor APIs (whose
    /// callers present executor tokens): `401` otherwise.
    pub authenticate_http: bool,
    /// How long an executor connection may stay without subscribing
    /// before it is closed (default 15 s).
    pub executor_subscribe_timeout: Duration,
    /// Authorization rules (`--acls`, the master's format); the agent
    /// decides `access_sandboxes`: who may read a sandbox through
    /// `/files`, by the user its framework runs as (`403` otherwise).
    pub acls: std::sync::Arc<agora_proto::acls::Acls>,
    /// TLS: the agent's listener (executors, HTTP) with `cert`/`key`;
    /// its connection to the master with `ca` (presenting `cert`).
    pub tls: agora_net::TlsOptions,
    /// What peers may hold of the agent's port: connections in all, how
    /// long a request's headers, an idle connection and a request body
    /// may take, and the memory of request bodies being read (the same
    /// flags as the master's).
    pub limits: agora_net::Limits,
    /// Web origins (`http://HOST:PORT`) whose pages may read this agent's
    /// HTTP answers (the master's web UI reads sandboxes and usage):
    /// answers to a request from one of them carry it in
    /// `Access-Control-Allow-Origin`; others get no such header. Default
    /// ([`Config::new`]): the master's own origin, when `master` is
    /// `HOST:PORT` (with both spellings of a loopback host).
    pub allowed_origins: Vec<String>,
    /// Directory for sandboxes (`frameworks/...`) and checkpoints (`meta/...`).
    pub work_dir: PathBuf,
    /// Everything the agent offers.
    pub resources: Resources,
    /// Facts about the machine, sent with offers.
    pub attributes: Attributes,
    /// Host name reported to the master: the name shown to users.
    pub hostname: String,
    /// IP address the master and clients reach this agent at. Default: the
    /// address it listens on, or, listening on a wildcard address, the
    /// local address of its connection to the master.
    pub advertise_ip: Option<std::net::IpAddr>,
    /// Port the master and clients reach this agent at (behind a port
    /// mapping, say). Default: the port it listens on.
    pub advertise_port: Option<u16>,
    /// Program (and leading arguments) of the built-in command executor.
    /// Default: `agora-command-executor` next to the running executable.
    pub command_executor: Vec<String>,
    /// How long a forked executor has to subscribe (and a recovered one to
    /// re-subscribe) before it is killed.
    pub executor_registration_timeout: Duration,
    /// Time between asking an executor to stop (SIGTERM) and SIGKILL,
    /// unless its `ExecutorInfo.shutdown_grace_period` says otherwise.
    pub executor_shutdown_grace_period: Duration,
    /// Time between the `HEARTBEAT` events on a Mesos v1 executor's
    /// subscription stream, the first one this long after `SUBSCRIBED`
    /// (Mesos's `DEFAULT_EXECUTOR_HEARTBEAT_INTERVAL`, 30 minutes).
    pub executor_heartbeat_interval: Duration,
    /// First retry interval of an unacknowledged status update.
    pub status_update_retry_min: Duration,
    /// Cap of the status update retry interval.
    pub status_update_retry_max: Duration,
    /// First delay before reconnecting to the master.
    pub reconnect_backoff_min: Duration,
    /// Cap of the reconnect delay.
    pub reconnect_backoff_max: Duration,
    /// How long a checkpointing executor waits for a restarted agent
    /// (passed to it as `AGORA_RECOVERY_TIMEOUT`).
    pub executor_recovery_timeout: Duration,
    /// What to do with executors found on restart.
    pub recover: RecoverMode,
    /// Events the core may have queued (from connections, process
    /// watchers, timers and the checkpoint writer) before their senders
    /// wait.
    pub core_queue: usize,
    /// Events queued for one executor connection: past this many, the
    /// agent reads no more of the executor's frames, and an executor that
    /// leaves them unread for `executor_stall_timeout` is disconnected.
    pub executor_outbox: usize,
    /// How long an executor may leave `executor_outbox` events unread.
    pub executor_stall_timeout: Duration,
    /// Calls queued for the master connection.
    pub master_outbox: usize,
    /// Command tasks one command executor runs at once (1: a command
    /// executor per task, as in Mesos).
    pub command_executor_tasks: usize,
    /// How long a command executor with no task waits for one before it
    /// is shut down.
    pub command_executor_idle: Duration,
    /// How executors are isolated (`--isolation`).
    pub isolation: Isolation,
    /// Settings of [`Isolation::Cgroups`].
    pub cgroups: CgroupsConfig,
    /// Images (`--image-providers`, `--docker-registry`,
    /// `--docker-insecure-registries`, `--docker-config`,
    /// `--docker-store-dir`, `--image-pull-timeout`): no provider, the
    /// default, refuses every task that names an image.
    pub images: agora_containerizer::provisioner::Config,
    /// `--allowed-host-paths`: the host directories `HOST_PATH` volumes
    /// may name (each, or anything under it); `None`: any, as Mesos.
    pub allowed_host_paths: Option<Vec<PathBuf>>,
    /// Whom executors run as (`--switch-user`, `--allow-root-tasks`):
    /// by default the framework's user, never root.
    pub users: crate::users::UserPolicy,
    /// How often the work directory's free space is checked
    /// (`--disk-check-interval`), besides at once after a write failed
    /// for lack of space (see [`crate::disk`]).
    pub disk_check_interval: Duration,
    /// Below this many free bytes the work directory is full: the agent
    /// takes no new task and is not offered (`--disk-min-free`).
    pub disk_min_free: u64,
    /// Bytes kept allocated in `meta/disk-reserve` and released when the
    /// work directory fills, for the status update log and checkpoints
    /// (`--disk-reserve`; 0: none).
    pub disk_reserve: u64,
    /// How long after an executor's run ended its sandbox is removed, at
    /// most (`--gc-delay`; see [`crate::gc`]).
    pub gc_delay: Duration,
    /// The share of the disk kept free in computing a sandbox's maximum
    /// age (`--gc-disk-headroom`, 0..=1).
    pub gc_disk_headroom: f64,
    /// `--container-logger logrotate`: executors' (and command tasks')
    /// output rotated by size ([`crate::logrotate`]); `None` (Mesos's
    /// `sandbox` logger): appended to the sandbox's files as it comes.
    pub container_logger: Option<crate::logrotate::Logrotate>,
}

// === impl Config ===

impl Config {
    /// The ways into this agent its configuration leaves unguarded, each
    /// warned of at start and named in `/health` (see `docs/http.md`).
    pub fn open_doors(&self) -> Vec<agora_net::OpenDoor> {
        use agora_net::OpenDoor;
        let mut doors = Vec::new();
        if !self.tls.enabled() {
            doors.push(OpenDoor {
                name: "no_tls",
                warning: "no TLS on the agent's listener: executors' frames and tokens, sandbox files and operator calls cross the network in clear text (set --tls-cert and --tls-key)",
            });
        } else if self.tls.allow_plaintext {
            doors.push(OpenDoor {
                name: "plaintext_allowed",
                warning: "--tls-allow-plaintext: clients may still connect without TLS",
            });
        }
        if self.tls.ca.is_none() {
            doors.push(OpenDoor {
                name: "unverified_master",
                warning: "the master is not verified (no --tls-ca): anyone on the path to it can pose as the master and have this agent run tasks",
            });
        }
        if !self.authenticate_executors {
            doors.push(OpenDoor {
                name: "unauthenticated_executors",
                warning: "Mesos v1 executors' calls need no token: a process that reaches the agent can call as an executor of its framework (set --authenticate-executors; Agora's own executors always present theirs)",
            });
        }
        if !self.authenticate_http {
            doors.push(OpenDoor {
                name: "unauthenticated_http",
                warning: "operator calls are not authenticated: /state, /metrics, /containers and (under the access_sandboxes ACL only) /files answer anyone (set --authenticate-http with --credentials)",
            });
        }
        doors
    }

    /// A configuration with detected resources (all cpus, memory minus a
    /// reserve, disk of the work dir's file system minus a reserve, ports
    /// 31000-32000) and Mesos's defaults elsewhere.
    pub fn new(master: impl Into<String>, work_dir: PathBuf) -> Self {
        let resources = detect_resources(&work_dir);
        let images = agora_containerizer::provisioner::Config::new(&work_dir);
        let master = master.into();
        Config {
            allowed_origins: master_origins(&master),
            credential: None,
            executor_secret_key: None,
            authenticate_executors: false,
            tls: agora_net::TlsOptions::default(),
            limits: agora_net::Limits::default(),
            credentials: None,
            authenticate_http: false,
            executor_subscribe_timeout: Duration::from_secs(15),
            acls: std::sync::Arc::default(),
            master,
            work_dir,
            resources,
            attributes: Attributes::default(),
            hostname: detect_hostname(),
            advertise_ip: None,
            advertise_port: None,
            command_executor: vec![default_command_executor()],
            executor_registration_timeout: Duration::from_secs(60),
            executor_shutdown_grace_period: Duration::from_secs(5),
            executor_heartbeat_interval: DEFAULT_EXECUTOR_HEARTBEAT_INTERVAL,
            status_update_retry_min: Duration::from_secs(10),
            status_update_retry_max: Duration::from_secs(600),
            reconnect_backoff_min: Duration::from_millis(100),
            reconnect_backoff_max: Duration::from_secs(5),
            executor_recovery_timeout: Duration::from_secs(15 * 60),
            recover: RecoverMode::Reconnect,
            core_queue: DEFAULT_CORE_QUEUE,
            executor_outbox: DEFAULT_EXECUTOR_OUTBOX,
            executor_stall_timeout: Duration::from_secs(10),
            master_outbox: DEFAULT_MASTER_OUTBOX,
            command_executor_tasks: DEFAULT_COMMAND_EXECUTOR_TASKS,
            command_executor_idle: Duration::from_secs(10),
            isolation: Isolation::Posix,
            cgroups: CgroupsConfig::default(),
            users: crate::users::UserPolicy::default(),
            images,
            allowed_host_paths: None,
            disk_check_interval: crate::disk::DEFAULT_CHECK_INTERVAL,
            disk_min_free: crate::disk::DEFAULT_MIN_FREE,
            gc_delay: crate::gc::DEFAULT_GC_DELAY,
            gc_disk_headroom: crate::gc::DEFAULT_GC_DISK_HEADROOM,
            container_logger: None,
            disk_reserve: crate::disk::DEFAULT_RESERVE,
        }
    }
}

impl std::str::FromStr for RecoverMode {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "reconnect" => Ok(RecoverMode::Reconnect),
            "cleanup" => Ok(RecoverMode::Cleanup),
            other => Err(format!(
                "invalid recover mode {other:?}: use reconnect or cleanup"
            )),
        }
    }
}

/// The resources Mesos would offer on this machine.
pub(crate) fn detect_resources(work_dir: &Path) -> Resources {
    let cpus = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1);
    let mem = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|text| parse_meminfo_total_mib(&text))
        .map(offerable_mem_mib)
        .unwrap_or(1024);
    let disk = detect_disk_mib(work_dir);
    let text = format!("cpus:{cpus};mem:{mem};disk:{disk};ports:{DEFAULT_PORTS}");
    Resources::parse(&text).unwrap_or_default()
}

/// `MemTotal` of `/proc/meminfo`, in MiB.
pub(crate) fn parse_meminfo_total_mib(meminfo: &str) -> Option<u64> {
    let line = meminfo.lines().find(|l| l.starts_with("MemTotal:"))?;
    let mut words = line["MemTotal:".len()..].split_whitespace();
    let value: u64 = words.next()?.parse().ok()?;
    let factor_kib = match words.next().unwrap_or("kB") {
        "kB" | "KB" | "kb" => 1,
        "mB" | "MB" => 1024,
        "gB" | "GB" => 1024 * 1024,
        _ => return None,
    };
    Some(value * factor_kib / 1024)
}

/// Total memory minus `min(1 GiB, half)`.
pub(crate) fn offerable_mem_mib(total_mib: u64) -> u64 {
    total_mib - MEM_RESERVE_MIB.min(total_mib / 2)
}

/// Available disk minus `min(5 GiB, half)`.
pub(crate) fn offerable_disk_mib(available_mib: u64) -> u64 {
    available_mib - DISK_RESERVE_MIB.min(available_mib / 2)
}

fn detect_disk_mib(work_dir: &Path) -> u64 {
    // The work dir may not exist yet: measure its nearest existing ancestor.
    let probe = work_dir
        .ancestors()
        .find(|p| p.exists())
        .unwrap_or_else(|| Path::new("/"));
    match nix::sys::statvfs::statvfs(probe) {
        Ok(st) => {
            let bytes = (st.blocks_available() as u128) * (st.fragment_size() as u128);
            offerable_disk_mib((bytes / (1024 * 1024)).min(u64::MAX as u128) as u64)
        }
        Err(_) => FALLBACK_DISK_MIB,
    }
}

fn detect_hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .or_else(|_| std::fs::read_to_string("/etc/hostname"))
        .map(|s| s.trim().to_string())
        .ok()
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "localhost".to_string())
}

/// `agora-command-executor` in the directory of the running executable.
pub(crate) fn default_command_executor() -> String {
    std::env::current_exe()
        .ok()
        .and_then(|exe| exe.parent().map(|d| d.join("agora-command-executor")))
        .map(|p| p.to_string_lossy().into_owned())
        .unwrap_or_else(|| "agora-command-executor".to_string())
}

/// The web origins of a master at `master` (`HOST:PORT`; none for a
/// discovery URL such as `etcd://…`): its own, and for a loopback host
/// the other usual spelling of it.
pub fn master_origins(master: &str) -> Vec<String> {
    if master.contains("://") {
        return Vec::new();
    }
    let mut origins = vec![format!("http://{master}")];
    if let Some((host, port)) = master.rsplit_once(':') {
        match host {
            "127.0.0.1" => origins.push(format!("http://localhost:{port}")),
            "localhost" => origins.push(format!("http://127.0.0.1:{port}")),
            _ => {}
        }
    }
    origins
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn meminfo_parsing_and_reserve() {
        let text = "MemTotal:       16303484 kB\nMemFree:         1234 kB\n";
        assert_eq!(parse_meminfo_total_mib(text), Some(15921));
        assert_eq!(parse_meminfo_total_mib("MemFree: 1 kB\n"), None);
        assert_eq!(offerable_mem_mib(16 * 1024), 15 * 1024);
        assert_eq!(offerable_mem_mib(1024), 512);
        assert_eq!(offerable_disk_mib(100 * 1024), 95 * 1024);
        assert_eq!(offerable_disk_mib(4096), 2048);
    }

    #[test]
    fn detected_resources_are_sane() {
        let dir = std::env::temp_dir().join("does/not/exist/yet");
        let r = detect_resources(&dir);
        assert!(r.cpus() >= 1.0);
        assert!(r.mem() > 0.0);
        assert!(r.disk() > 0.0);
        assert_eq!(r.range_count("ports"), 1001);
        let c = Config::new("127.0.0.1:5050", dir);
        assert_eq!(c.executor_registration_timeout, Duration::from_secs(60));
        assert_eq!(c.status_update_retry_max, Duration::from_secs(600));
        assert!(c.command_executor[0].ends_with("agora-command-executor"));
    }

    #[test]
    fn recover_mode() {
        assert_eq!("cleanup".parse::<RecoverMode>(), Ok(RecoverMode::Cleanup));
        assert_eq!(
            "reconnect".parse::<RecoverMode>(),
            Ok(RecoverMode::Reconnect)
        );
        assert!("x".parse::<RecoverMode>().is_err());
    }
}
