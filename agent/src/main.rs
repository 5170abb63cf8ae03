//! `agora-agent`: parses flags, sets up logging and runs
//! [`agora_agent::run`] until Ctrl-C or SIGTERM.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use agora_agent::{parse_duration, CgroupsConfig, Config, Isolation, RecoverMode};
use agora_proto::{Attributes, Resources};
use clap::Parser;

// mimalloc rather than the system allocator: the message paths allocate
// and free small buffers per frame (JSON, ids); bench-status-updates runs
// 15-35% faster with it.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Runs an Agora agent: offers this machine's resources to the master and
/// runs the executors of the tasks launched on it.
#[derive(Debug, Parser)]
#[command(name = "agora-agent", version)]
struct Flags {
    /// The master, HOST:PORT; with high-availability masters,
    /// etcd://HOST:PORT/PREFIX to follow the current leader.
    #[arg(long, value_parser = parse_master)]
    master: String,
    /// Principal to authenticate as to the master (with --secret-file or
    /// AGORA_SECRET), for a master with --authenticate-agents.
    #[arg(long, env = "AGORA_PRINCIPAL")]
    principal: Option<String>,
    /// File holding the principal's secret (trailing newline ignored).
    #[arg(long)]
    secret_file: Option<PathBuf>,
    /// File holding the key (32 bytes or more) that signs executor tokens
    /// (default: a random key kept in the work directory).
    #[arg(long)]
    executor_secret_key: Option<PathBuf>,
    /// Principals and secrets operators authenticate with on this agent's
    /// HTTP endpoints (the master's --credentials format).
    #[arg(long)]
    credentials: Option<PathBuf>,
    /// Operators must authenticate (Basic or Bearer) on every HTTP
    /// endpoint but /health, /version and the executor APIs.
    #[arg(long)]
    authenticate_http: bool,
    /// Authorization rules (the master's --acls format, JSON or a file);
    /// the agent decides access_sandboxes.
    #[arg(long)]
    acls: Option<String>,
    /// Require Mesos v1 executors to present their token on every call
    /// (401 without or with a forged one, 403 for another executor's).
    #[arg(long)]
    authenticate_executors: bool,
    /// Web origins (comma separated, `http://HOST:PORT`) whose pages may
    /// read this agent's HTTP answers, such as the master's web UI as
    /// users reach it (default: the --master address, when HOST:PORT).
    #[arg(long, value_delimiter = ',')]
    allowed_origins: Option<Vec<String>>,
    #[command(flatten)]
    tls: agora_net::TlsFlags,
    #[command(flatten)]
    limits: agora_net::LimitFlags,
    /// Address to serve executors and HTTP on.
    #[arg(long, default_value = "127.0.0.1:5051")]
    listen: SocketAddr,
    /// Directory for sandboxes and checkpoints.
    #[arg(long)]
    work_dir: PathBuf,
    /// Resources to offer, Mesos syntax, e.g.
    /// `cpus:4;mem:8192;disk:20000;ports:[31000-32000]` (default: detected).
    #[arg(long, value_parser = parse_resources)]
    resources: Option<Resources>,
    /// Attributes, e.g. `rack:a;zone:b`.
    #[arg(long, value_parser = parse_attributes)]
    attributes: Option<Attributes>,
    /// Host name reported to the master, the name shown to users (default:
    /// this machine's).
    #[arg(long)]
    hostname: Option<String>,
    /// IP address the master and clients reach this agent at (default: the
    /// listen address, or with a wildcard listen address the local address
    /// of the agent's connection to the master).
    #[arg(long)]
    advertise_ip: Option<std::net::IpAddr>,
    /// Port the master and clients reach this agent at (default: the listen
    /// port).
    #[arg(long)]
    advertise_port: Option<u16>,
    /// Program of the built-in command executor (default:
    /// `agora-command-executor` next to this binary).
    #[arg(long)]
    command_executor: Option<String>,
    /// Time an executor has to subscribe before it is killed.
    #[arg(long, default_value = "1m", value_parser = duration)]
    executor_registration_timeout: Duration,
    /// Time between asking an executor to stop and SIGKILL (unless its
    /// ExecutorInfo.shutdown_grace_period says otherwise).
    #[arg(long, default_value = "5s", value_parser = duration)]
    executor_shutdown_grace_period: Duration,
    /// Time between the HEARTBEAT events on a Mesos v1 executor's
    /// subscription stream (the first this long after SUBSCRIBED).
    #[arg(long, default_value = "30m", value_parser = heartbeat_interval)]
    executor_heartbeat_interval: Duration,
    /// First retry interval of an unacknowledged status update.
    #[arg(long, default_value = "10s", value_parser = duration)]
    status_update_retry_min: Duration,
    /// Cap of the status update retry interval.
    #[arg(long, default_value = "10m", value_parser = duration)]
    status_update_retry_max: Duration,
    /// Cap of the delay between attempts to reach the master.
    #[arg(long, default_value = "5s", value_parser = duration)]
    reconnect_backoff_max: Duration,
    /// How long checkpointing executors wait for a restarted agent.
    #[arg(long, default_value = "15m", value_parser = duration)]
    executor_recovery_timeout: Duration,
    /// What to do with executors found on restart: reconnect or cleanup.
    #[arg(long, default_value = "reconnect")]
    recover: RecoverMode,
    /// Events the agent's core may have queued before senders wait.
    #[arg(long, default_value_t = agora_agent::DEFAULT_CORE_QUEUE, value_parser = positive)]
    core_queue: usize,
    /// Events queued for one executor connection: past this many the agent
    /// reads no more of the executor's frames, and an executor that leaves
    /// them unread for --executor-stall-timeout is disconnected.
    #[arg(long, default_value_t = agora_agent::DEFAULT_EXECUTOR_OUTBOX, value_parser = positive)]
    executor_outbox: usize,
    /// How long an executor may leave --executor-outbox events unread.
    #[arg(long, default_value = "10s", value_parser = duration)]
    executor_stall_timeout: Duration,
    /// Calls queued for the master connection.
    #[arg(long, default_value_t = agora_agent::DEFAULT_MASTER_OUTBOX, value_parser = positive)]
    master_outbox: usize,
    /// Command tasks one command executor process runs at once (1: a
    /// command executor per task, as in Mesos). Default: 128. With
    /// --isolation cgroups each command task still gets a container of
    /// its own (except on cgroup v2 when the agent switches users, where
    /// each command task gets a command executor of its own).
    #[arg(long, value_parser = positive)]
    command_executor_tasks: Option<usize>,
    /// How long a command executor with no task waits for one before it is
    /// shut down.
    #[arg(long, default_value = "10s", value_parser = duration)]
    command_executor_idle: Duration,
    /// How often the work directory's free space is checked (also at
    /// once after a write failed for lack of space).
    #[arg(long, default_value = "5s", value_parser = duration)]
    disk_check_interval: Duration,
    /// Below this much free space (e.g. 64MB) the work directory is full:
    /// the agent refuses new tasks and the master offers none of its
    /// resources until there is room again; running tasks go on.
    #[arg(long, default_value = "64MB", value_parser = agora_agent::disk::parse_bytes)]
    disk_min_free: u64,
    /// Space kept allocated in the work directory (meta/disk-reserve) and
    /// released when it fills, so the agent can still record its tasks'
    /// status updates (0: none).
    #[arg(long, default_value = "8MB", value_parser = agora_agent::disk::parse_bytes)]
    disk_reserve: u64,
    /// How long after an executor's run ended its sandbox is removed
    /// (Mesos's --gc_delay); sooner as the disk fills (see
    /// --gc-disk-headroom). Checked every --disk-check-interval.
    #[arg(long, default_value = "1weeks", value_parser = duration)]
    gc_delay: Duration,
    /// Share of the disk (0 to 1) kept as headroom: an ended run's sandbox
    /// is removed once older than gc-delay * max(0, 1 - headroom - disk
    /// usage) (Mesos's --gc_disk_headroom).
    #[arg(long, default_value_t = agora_agent::DEFAULT_GC_DISK_HEADROOM, value_parser = headroom)]
    gc_disk_headroom: f64,
    /// What takes executors' and command tasks' output: sandbox (appended
    /// to the sandbox's stdout and stderr, never rotated) or logrotate
    /// (through agora-logrotate-logger, which rotates the files by size:
    /// stdout.1, stdout.2, ...). Mesos's --container_logger.
    #[arg(long, default_value = "sandbox", value_parser = ["sandbox", "logrotate"])]
    container_logger: String,
    /// With --container-logger logrotate: size at which stdout is rotated
    /// (at least 4KB).
    #[arg(long, default_value = "10MB", value_parser = agora_agent::disk::parse_bytes)]
    logrotate_max_stdout_size: u64,
    /// With --container-logger logrotate: size at which stderr is rotated
    /// (at least 4KB).
    #[arg(long, default_value = "10MB", value_parser = agora_agent::disk::parse_bytes)]
    logrotate_max_stderr_size: u64,
    /// With --container-logger logrotate: rotated files kept of each
    /// stream (stdout.1 ... stdout.N); older ones are deleted.
    #[arg(long, default_value_t = agora_agent::logrotate::DEFAULT_MAX_FILES)]
    logrotate_max_files: usize,
    /// With --container-logger logrotate: the logger program. Default:
    /// agora-logrotate-logger next to this executable.
    #[arg(long)]
    logrotate_logger: Option<PathBuf>,
    /// How executors are isolated: posix (nothing is enforced; resources
    /// are bookkeeping only) or cgroups (a cgroup container per executor
    /// run with CPU, memory and pids limits; needs root and the cgroup v1
    /// cpu, cpuacct, memory, pids and freezer controllers, else a cgroup
    /// v2 hierarchy offering cpu, memory and pids).
    #[arg(long, default_value = "posix")]
    isolation: Isolation,
    /// With --isolation cgroups: the cgroup that holds the containers,
    /// under the agent's own in each v1 hierarchy, or under the cgroup2
    /// mount point on v2. The agent gives it the CPU weight of the cpus it
    /// offers (cpu.shares 1024 per cpu, or the cpu.weight mapped from
    /// them).
    #[arg(long, default_value = agora_agent::isolation::DEFAULT_CGROUPS_ROOT)]
    cgroups_root: String,
    /// With --isolation cgroups: enforce a hard CFS quota of the cpus a
    /// container has (not only shares).
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    cgroups_enable_cfs: bool,
    /// With --isolation cgroups: pids.max of a container whose resources
    /// have no `pids`.
    #[arg(long, default_value_t = agora_agent::isolation::DEFAULT_CGROUPS_PIDS_MAX)]
    cgroups_pids_max: u64,
    /// Run each framework's executors and tasks as the user the framework
    /// names (needs the agent to run as root); false: as the agent's own
    /// user.
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set, num_args = 0..=1, default_missing_value = "true")]
    switch_user: bool,
    /// Allow tasks to run as root (uid 0): a framework naming root, or
    /// naming no user on an agent that runs as root. Refused by default.
    #[arg(long)]
    allow_root_tasks: bool,
    /// Which kinds of image tasks may name, comma-separated: docker, oci
    /// (Mesos's --image_providers). None (the default): a task that names
    /// an image is refused (TASK_FAILED, REASON_CONTAINER_LAUNCH_FAILED).
    /// Needs root, overlayfs, and Debian's crun and conmon.
    #[arg(long, value_parser = image_providers)]
    image_providers: Option<ImageProviders>,
    /// Where Docker image names without a registry host are pulled from
    /// (https://HOST[:PORT], or http:// for a plain-HTTP registry).
    #[arg(long, default_value = agora_containerizer::provisioner::DEFAULT_DOCKER_REGISTRY)]
    docker_registry: String,
    /// Registries (HOST:PORT, comma-separated) reached over TLS without
    /// verifying their certificate, or else over plain HTTP.
    #[arg(long, value_delimiter = ',')]
    docker_insecure_registries: Vec<String>,
    /// Docker's config.json with registry credentials (`auths`: basic auth
    /// and registry tokens).
    #[arg(long)]
    docker_config: Option<PathBuf>,
    /// The image layer store (default: WORK_DIR/store/docker).
    #[arg(long)]
    docker_store_dir: Option<PathBuf>,
    /// How long pulling a task's image may take before the task fails.
    #[arg(long, default_value = "5m", value_parser = duration)]
    image_pull_timeout: Duration,
    /// Host directories (comma-separated) that HOST_PATH volumes may name,
    /// each or anything under it (default: any, as Mesos).
    #[arg(long, value_delimiter = ',')]
    allowed_host_paths: Option<Vec<PathBuf>>,
    /// Log format: text or json (filter with RUST_LOG).
    #[arg(long, default_value = "text", value_parser = ["text", "json"], env = "AGORA_LOG_FORMAT")]
    log_format: String,
}

/// `--image-providers`' list.
#[derive(Debug, Clone)]
struct ImageProviders(Vec<agora_containerizer::provisioner::Provider>);

fn image_providers(text: &str) -> Result<ImageProviders, String> {
    agora_containerizer::provisioner::Provider::parse_list(text)
        .map(ImageProviders)
        .map_err(|e| e.to_string())
}

fn duration(text: &str) -> Result<Duration, String> {
    parse_duration(text).map_err(|e| e.to_string())
}

fn heartbeat_interval(text: &str) -> Result<Duration, String> {
    match duration(text)? {
        d if d.is_zero() => Err("must be longer than zero".into()),
        d => Ok(d),
    }
}

fn headroom(text: &str) -> Result<f64, String> {
    match text.parse::<f64>() {
        Ok(v) if (0.0..=1.0).contains(&v) => Ok(v),
        Ok(v) => Err(format!("{v} is not between 0 and 1")),
        Err(e) => Err(e.to_string()),
    }
}

fn positive(text: &str) -> Result<usize, String> {
    match text.parse::<usize>() {
        Ok(0) => Err("must be at least 1".into()),
        Ok(n) => Ok(n),
        Err(e) => Err(e.to_string()),
    }
}

fn parse_resources(text: &str) -> Result<Resources, String> {
    Resources::parse(text).map_err(|e| e.to_string())
}

fn parse_attributes(text: &str) -> Result<Attributes, String> {
    Attributes::parse(text).map_err(|e| e.to_string())
}

/// `HOST:PORT`, or `etcd://HOST:PORT/PREFIX` when built with etcd support.
fn parse_master(text: &str) -> Result<String, String> {
    agora_discovery::MasterLocator::new(text)
        .map(|_| text.trim().to_string())
        .map_err(|e| e.to_string())
}

fn main() -> ExitCode {
    let flags = Flags::parse();
    init_logging(&flags.log_format);
    if flags.status_update_retry_min > flags.status_update_retry_max {
        eprintln!("error: --status-update-retry-min must not exceed --status-update-retry-max");
        return ExitCode::from(2);
    }
    let mut config = Config::new(flags.master, flags.work_dir);
    if let Some(origins) = flags.allowed_origins {
        config.allowed_origins = origins;
    }
    config.executor_secret_key = flags.executor_secret_key;
    config.tls = flags.tls.options();
    config.limits = flags.limits.limits();
    if let Err(e) = config.limits.validate(agora_proto::MAX_FRAME_BYTES) {
        eprintln!("error: invalid flags: {e}");
        return ExitCode::from(2);
    }
    config.authenticate_http = flags.authenticate_http;
    if let Some(path) = &flags.credentials {
        match agora_proto::Credentials::load(path) {
            Ok(credentials) => config.credentials = Some(credentials),
            Err(e) => {
                eprintln!("error: {e}");
                return ExitCode::from(2);
            }
        }
    }
    if config.authenticate_http && config.credentials.is_none() {
        eprintln!("error: --authenticate-http needs --credentials");
        return ExitCode::from(2);
    }
    if let Some(acls) = &flags.acls {
        match agora_proto::acls::Acls::load(acls) {
            Ok(acls) => config.acls = std::sync::Arc::new(acls),
            Err(e) => {
                eprintln!("error: {e}");
                return ExitCode::from(2);
            }
        }
    }
    config.authenticate_executors = flags.authenticate_executors;
    match agora_proto::Credential::from_flags(flags.principal, flags.secret_file.as_deref()) {
        Ok(credential) => config.credential = credential,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(2);
        }
    }
    if let Some(resources) = flags.resources {
        config.resources = resources;
    }
    if let Some(attributes) = flags.attributes {
        config.attributes = attributes;
    }
    if let Some(hostname) = flags.hostname {
        config.hostname = hostname;
    }
    config.advertise_ip = flags.advertise_ip;
    config.advertise_port = flags.advertise_port;
    if let Some(program) = flags.command_executor {
        config.command_executor = vec![program];
    }
    config.executor_registration_timeout = flags.executor_registration_timeout;
    config.executor_shutdown_grace_period = flags.executor_shutdown_grace_period;
    config.executor_heartbeat_interval = flags.executor_heartbeat_interval;
    config.status_update_retry_min = flags.status_update_retry_min;
    config.status_update_retry_max = flags.status_update_retry_max;
    config.reconnect_backoff_max = flags.reconnect_backoff_max;
    config.executor_recovery_timeout = flags.executor_recovery_timeout;
    config.recover = flags.recover;
    config.core_queue = flags.core_queue;
    config.executor_outbox = flags.executor_outbox;
    config.executor_stall_timeout = flags.executor_stall_timeout;
    config.master_outbox = flags.master_outbox;
    config.isolation = flags.isolation;
    config.cgroups = CgroupsConfig {
        root: flags.cgroups_root,
        enable_cfs: flags.cgroups_enable_cfs,
        pids_max: flags.cgroups_pids_max,
    };
    config.command_executor_tasks = flags
        .command_executor_tasks
        .unwrap_or(agora_agent::DEFAULT_COMMAND_EXECUTOR_TASKS);
    config.command_executor_idle = flags.command_executor_idle;
    config.disk_check_interval = flags.disk_check_interval;
    config.disk_min_free = flags.disk_min_free;
    config.disk_reserve = flags.disk_reserve;
    config.gc_delay = flags.gc_delay;
    config.gc_disk_headroom = flags.gc_disk_headroom;
    if flags.container_logger == "logrotate" {
        let too_small = [
            (
                "--logrotate-max-stdout-size",
                flags.logrotate_max_stdout_size,
            ),
            (
                "--logrotate-max-stderr-size",
                flags.logrotate_max_stderr_size,
            ),
        ]
        .into_iter()
        .find(|(_, size)| *size < agora_agent::logrotate::MIN_MAX_SIZE);
        if let Some((flag, size)) = too_small {
            eprintln!(
                "error: {flag} {size} is below the smallest size, {} bytes",
                agora_agent::logrotate::MIN_MAX_SIZE
            );
            return ExitCode::FAILURE;
        }
        config.container_logger = Some(agora_agent::logrotate::Logrotate {
            program: flags
                .logrotate_logger
                .clone()
                .unwrap_or_else(agora_agent::logrotate::default_program),
            max_stdout_size: flags.logrotate_max_stdout_size,
            max_stderr_size: flags.logrotate_max_stderr_size,
            max_files: flags.logrotate_max_files,
        });
    }
    config.users = agora_agent::UserPolicy {
        switch_user: flags.switch_user,
        allow_root_tasks: flags.allow_root_tasks,
    };
    config.images.image_providers = flags
        .image_providers
        .clone()
        .map(|p| p.0)
        .unwrap_or_default();
    config.images.docker_registry = flags.docker_registry.clone();
    config.images.docker_insecure_registries = flags.docker_insecure_registries.clone();
    config.images.docker_config = flags.docker_config.clone();
    if let Some(dir) = &flags.docker_store_dir {
        config.images.docker_store_dir = dir.clone();
    }
    config.images.image_pull_timeout = flags.image_pull_timeout;
    config.allowed_host_paths = flags.allowed_host_paths.clone();

    let runtime = match tokio::runtime::Runtime::new() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    runtime.block_on(async move {
        let listener = match tokio::net::TcpListener::bind(flags.listen).await {
            Ok(l) => l,
            Err(e) => {
                eprintln!("error: cannot listen on {}: {e}", flags.listen);
                return ExitCode::FAILURE;
            }
        };
        match listener.local_addr() {
            Ok(addr) => println!("agora-agent listening on {addr}"),
            Err(e) => {
                eprintln!("error: {e}");
                return ExitCode::FAILURE;
            }
        }
        match agora_agent::run(listener, config, shutdown_signal()).await {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("error: {e}");
                ExitCode::FAILURE
            }
        }
    })
}

fn init_logging(format: &str) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    // A log line that cannot be written (stderr on a full disk) is lost,
    // not reported with eprintln!, whose panic would abort the agent.
    let builder = tracing_subscriber::fmt()
        .log_internal_errors(false)
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    if format == "json" {
        builder.json().init();
    } else {
        builder.init();
    }
}

async fn shutdown_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    _ = ctrl_c => {}
                    _ = term.recv() => {}
                }
            }
            Err(_) => {
                let _ = ctrl_c.await;
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = ctrl_c.await;
    }
    tracing::info!("shutdown requested");
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Result<Flags, clap::Error> {
        let mut argv = vec!["agora-agent", "--master", "m:5050", "--work-dir", "/tmp/w"];
        argv.extend_from_slice(args);
        Flags::try_parse_from(argv)
    }

    #[test]
    fn defaults() {
        let f = parse(&[]).unwrap();
        assert_eq!(f.listen, "127.0.0.1:5051".parse().unwrap());
        assert_eq!(f.executor_registration_timeout, Duration::from_secs(60));
        assert_eq!(f.executor_shutdown_grace_period, Duration::from_secs(5));
        assert_eq!(f.executor_heartbeat_interval, Duration::from_secs(30 * 60));
        assert_eq!(f.status_update_retry_min, Duration::from_secs(10));
        assert_eq!(f.status_update_retry_max, Duration::from_secs(600));
        assert_eq!(f.recover, RecoverMode::Reconnect);
        assert!(f.resources.is_none());
        assert_eq!(f.isolation, Isolation::Posix);
        assert_eq!(f.cgroups_root, "agora");
        assert!(f.cgroups_enable_cfs);
        assert_eq!(f.cgroups_pids_max, 4096);
        assert!(f.switch_user);
        assert!(!f.allow_root_tasks);
        assert_eq!(f.command_executor_tasks, None);
    }

    #[test]
    fn user_flags() {
        let f = parse(&["--switch-user=false", "--allow-root-tasks"]).unwrap();
        assert!(!f.switch_user);
        assert!(f.allow_root_tasks);
        assert!(parse(&["--switch-user"]).unwrap().switch_user);
        assert!(parse(&["--switch-user", "maybe"]).is_err());
    }

    #[test]
    fn image_flags() {
        let f = parse(&[
            "--image-providers",
            "docker,OCI",
            "--docker-registry",
            "http://127.0.0.1:5000",
            "--docker-insecure-registries",
            "127.0.0.1:5000,10.0.0.1:443",
            "--allowed-host-paths",
            "/srv,/data",
        ])
        .unwrap();
        assert_eq!(f.image_providers.unwrap().0.len(), 2);
        assert_eq!(f.docker_registry, "http://127.0.0.1:5000");
        assert_eq!(f.docker_insecure_registries.len(), 2);
        assert_eq!(f.allowed_host_paths.unwrap().len(), 2);
        assert!(parse(&["--image-providers", "appc"]).is_err());
        let f = parse(&[]).unwrap();
        assert!(f.image_providers.is_none());
        assert_eq!(f.docker_registry, "https://registry-1.docker.io");
    }

    #[test]
    fn isolation_flags() {
        let f = parse(&[
            "--isolation",
            "cgroups",
            "--cgroups-enable-cfs=false",
            "--cgroups-pids-max",
            "64",
            "--cgroups-root",
            "agora-test",
        ])
        .unwrap();
        assert_eq!(f.isolation, Isolation::Cgroups);
        assert!(!f.cgroups_enable_cfs);
        assert_eq!(f.cgroups_pids_max, 64);
        assert_eq!(f.cgroups_root, "agora-test");
        assert!(parse(&["--isolation", "docker"]).is_err());
    }

    #[test]
    fn values_are_parsed() {
        let f = parse(&[
            "--resources",
            "cpus:2;mem:512;ports:[31000-31009]",
            "--attributes",
            "rack:a",
            "--executor-registration-timeout",
            "500ms",
            "--status-update-retry-min",
            "2",
            "--recover",
            "cleanup",
            "--executor-heartbeat-interval",
            "2s",
            "--log-format",
            "json",
        ])
        .unwrap();
        let r = f.resources.unwrap();
        assert_eq!(r.cpus(), 2.0);
        assert_eq!(r.range_count("ports"), 10);
        assert_eq!(f.attributes.unwrap().text("rack"), Some("a"));
        assert_eq!(f.executor_registration_timeout, Duration::from_millis(500));
        assert_eq!(f.status_update_retry_min, Duration::from_secs(2));
        assert_eq!(f.executor_heartbeat_interval, Duration::from_secs(2));
        assert!(parse(&["--executor-heartbeat-interval", "0s"]).is_err());
        assert_eq!(f.recover, RecoverMode::Cleanup);
    }

    #[test]
    fn bad_values_are_refused() {
        assert!(parse(&["--resources", "cpus:-1"]).is_err());
        assert!(parse(&["--attributes", "rack"]).is_err());
        assert!(parse(&["--recover", "maybe"]).is_err());
        assert!(parse(&["--executor-shutdown-grace-period", "soon"]).is_err());
        assert!(parse(&["--log-format", "xml"]).is_err());
        assert!(Flags::try_parse_from(["agora-agent", "--work-dir", "/w"]).is_err());
    }
}
