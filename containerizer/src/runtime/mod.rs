//! The runtime: a container run from an OCI bundle by `crun`, watched by
//! `conmon` (Podman's container monitor).
//!
//! [`Runtime::launch`] makes a bundle in the run's directory (outside the
//! sandbox): the root file system is an overlay of the image's layer
//! directories with a writable upper directory beside it (overlay only:
//! without it the launch fails saying so, nothing is copied), and
//! `config.json` says what runs (the image config and the task's command
//! by Mesos's rules, see [`command`]), as whom ([`user`]), with which
//! namespaces, mounts and volumes ([`bundle`], [`crate::volumes`]), in
//! which cgroup (the caller's `cgroups_path`, with the caller's limits)
//! and with the sandbox at `/mnt/mesos/sandbox`. `conmon` then runs
//! `crun create`; the runtime runs `crun start`.
//!
//! Why conmon: only the parent of a container's first process learns how
//! it ended, and `crun create` leaves that process to whoever reaps
//! orphans. `conmon` stays its parent (a child subreaper), hands the
//! container its own standard output and error (the sandbox's `stdout`
//! and `stderr` files: `passthrough`), and writes the exit status to a
//! file, so it is known even when the agent was down at the time. As
//! everywhere in the OCI world (crun, conmon, containerd, Docker), a death
//! by signal N is reported as status 128+N: [`Exit`] reads such a status
//! as the signal, and a process that calls `exit(137)` reads as killed by
//! signal 9.
//!
//! The cgroup stays until [`Runtime::destroy`] (`crun delete`): between
//! the container's exit and its destruction the caller can still read
//! its out-of-memory count and usage there.
//!
//! crun 1.8 refuses a hybrid cgroup host (v1 controllers with a
//! `/sys/fs/cgroup/unified` v2 mount) whose v2 hierarchy has any
//! controller. On such a host (found once, by [`Runtime::new`]) each
//! `crun` runs in a mount namespace of its own, a slave of the host's,
//! where `/sys/fs/cgroup/unified` is unmounted: crun then sees, and uses,
//! the v1 hierarchies only.
//!
//! Recovery: each container has a checkpoint file under the runtime's
//! root; [`Runtime::recover`] lists crun's containers, re-adopts those with
//! a checkpoint the caller wants, and destroys the others (orphans) and
//! whatever is mounted under their bundles.

pub mod bundle;
pub mod command;
pub mod mounts;
mod sys;
pub mod user;

use std::os::fd::{AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::io::unix::AsyncFd;
use tokio::io::{AsyncBufReadExt, BufReader};

pub use command::{CommandError, CommandSpec, ImageConfig, ProcessPlan};
pub use mounts::OverlayError;
pub use user::{ResolvedUser, UserError};

use crate::volumes::{self, MountSource, Volume, VolumeContext, VolumeError, VolumePolicy};

/// How long `conmon` may take to report the container created.
const CREATE_TIMEOUT: Duration = Duration::from_secs(60);

/// How long [`Runtime::destroy`] waits for a killed container's monitor
/// to go.
const MONITOR_EXIT_TIMEOUT: Duration = Duration::from_secs(10);

/// Where a runtime keeps its state, and the programs it runs.
#[derive(Debug, Clone)]
pub struct RuntimeConfig {
    /// The runtime's own directory (e.g. `WORK_DIR/runtime`): crun's
    /// state (`crun/`, crun's `--root`), exit files (`exits/`) and
    /// checkpoints (`containers/`).
    pub root: PathBuf,
    /// The OCI runtime (`crun`, looked up in `PATH` without a `/`).
    pub crun: PathBuf,
    /// The container monitor (`conmon`).
    pub conmon: PathBuf,
    /// What volumes may be.
    pub volume_policy: VolumePolicy,
}

/// A container's root file system.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RootFs {
    /// An image: its layer directories (bottom first) and runtime config.
    Image {
        /// Unpacked layer directories, bottom first.
        layers: Vec<PathBuf>,
        /// `Entrypoint`, `Cmd`, `Env`, `WorkingDir`, `User`.
        config: ImageConfig,
    },
    /// The host's, in a mount namespace of the container's own (for a
    /// task with volumes but no image).
    Host,
}

/// A container's network.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Network {
    /// The host's network namespace (Mesos's default).
    Host,
    /// A network namespace the caller made (e.g. for CNI).
    Namespace {
        /// The namespace's file (e.g. a bind mount of
        /// `/proc/<pid>/ns/net`).
        path: PathBuf,
        /// A directory with the container's `hosts`, `hostname` and
        /// `resolv.conf` (e.g. [`crate::network::Attachment::etc_dir`]),
        /// bound into it as they are; `None`: the runtime writes its own
        /// (`hosts` naming only localhost and the hostname, the host's
        /// `resolv.conf`).
        etc_dir: Option<PathBuf>,
    },
}

/// Resource limits the runtime writes into the container's cgroup.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Limits {
    /// CPU shares (v1 `cpu.shares`; crun maps them to v2's weight).
    pub cpu_shares: Option<u64>,
    /// CFS quota per period, in microseconds.
    pub cpu_quota_us: Option<i64>,
    /// CFS period in microseconds (100 ms when a quota is given alone).
    pub cpu_period_us: Option<u64>,
    /// Memory limit in bytes.
    pub memory_bytes: Option<i64>,
    /// Most processes.
    pub pids_max: Option<i64>,
}

/// One container to launch.
#[derive(Debug, Clone)]
pub struct ContainerSpec {
    /// Its name for crun: letters, digits, `_`, `-`, `.`, at most 128
    /// (not starting with `.`).
    pub id: String,
    /// The run's own directory on the host, outside the sandbox: the
    /// bundle, the overlay's upper and work directories. Removed by
    /// [`Runtime::destroy`].
    pub run_dir: PathBuf,
    /// The sandbox on the host (mounted at `/mnt/mesos/sandbox`; holds
    /// `stdout` and `stderr`).
    pub sandbox: PathBuf,
    /// The parent's (executor's) sandbox, for `PARENT` volumes.
    pub parent_sandbox: Option<PathBuf>,
    /// Image or host root file system.
    pub rootfs: RootFs,
    /// The task's command.
    pub command: CommandSpec,
    /// The task's environment (over the image's).
    pub env: Vec<(String, String)>,
    /// Whom to run as (`name|uid[:group|gid]`, resolved in the image);
    /// `None`: the image's `User`, else root.
    pub user: Option<String>,
    /// The container's hostname (`None`: the host's).
    pub hostname: Option<String>,
    /// Host network or a namespace.
    pub network: Network,
    /// The cgroup (crun's `cgroupsPath`, e.g. `/agora/<container>`); `None`:
    /// crun's default place.
    pub cgroups_path: Option<String>,
    /// Limits written into that cgroup.
    pub limits: Limits,
    /// Volumes.
    pub volumes: Vec<Volume>,
}

/// How a container's first process ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Exit {
    /// It exited with this status.
    Code(i32),
    /// It was killed by this signal (status 128+N, see the module doc).
    Signal(i32),
    /// Not known: the monitor ended without writing a status.
    Unknown,
}

/// A container's state as crun reports it.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct State {
    /// Its id.
    pub id: String,
    /// `creating`, `created`, `running`, `stopped`, `paused`.
    pub status: String,
    /// Its first process (0 once stopped).
    #[serde(default)]
    pub pid: u32,
    /// Its bundle directory.
    #[serde(default)]
    pub bundle: PathBuf,
}

/// A running (or exited, not yet destroyed) container.
#[derive(Debug)]
pub struct Container {
    id: String,
    run_dir: PathBuf,
    pid: u32,
    monitor: Monitor,
    exit_file: PathBuf,
    exit: Option<Exit>,
}

#[derive(Debug)]
enum Monitor {
    /// conmon, started by this runtime.
    Child(tokio::process::Child),
    /// conmon of a container re-adopted after a restart (`None`: already
    /// gone).
    Adopted(Option<AsyncFd<OwnedFd>>),
}

/// What [`Runtime::recover`] found.
#[derive(Debug, Default)]
pub struct Recovered {
    /// Containers re-adopted (running or exited, not yet destroyed).
    pub adopted: Vec<Container>,
    /// Containers destroyed as orphans (no checkpoint, or not wanted).
    pub destroyed: Vec<String>,
}

/// A command run in a container by [`Runtime::exec`]: its standard output
/// and error are piped back.
pub type ExecProcess = tokio::process::Child;

/// What [`Runtime::exec`] runs.
#[derive(Debug, Clone, Default)]
pub struct ExecSpec {
    /// argv (`args[0]` looked up in the container's `PATH`).
    pub args: Vec<String>,
    /// Variables added to the container's environment.
    pub env: Vec<(String, String)>,
    /// Working directory (`None`: the container's).
    pub cwd: Option<String>,
}

/// What went wrong.
#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    /// crun or conmon is not installed.
    #[error("{0} is not installed (not found on PATH): install Debian's crun and conmon")]
    ProgramNotFound(PathBuf),
    /// A container id crun cannot take.
    #[error("container id '{0}' must be 1 to 128 letters, digits, '_', '-' or '.' (not first)")]
    InvalidId(String),
    /// A container with this id exists.
    #[error("container '{0}' already exists")]
    Exists(String),
    /// No such container.
    #[error("no container '{0}'")]
    NotFound(String),
    /// The run directory and the sandbox overlap.
    #[error(
        "the run directory '{run_dir}' and the sandbox '{sandbox}' must not contain each other"
    )]
    RunDirInSandbox {
        /// The run directory.
        run_dir: PathBuf,
        /// The sandbox.
        sandbox: PathBuf,
    },
    /// The command could not be made.
    #[error(transparent)]
    Command(#[from] CommandError),
    /// The user could not be resolved.
    #[error(transparent)]
    User(#[from] UserError),
    /// A volume was refused.
    #[error(transparent)]
    Volume(#[from] VolumeError),
    /// The image's layers could not be mounted.
    #[error(transparent)]
    Overlay(#[from] OverlayError),
    /// `config.json` could not be made.
    #[error("config.json: {0}")]
    Spec(#[from] oci_spec::OciSpecError),
    /// A file operation failed.
    #[error("{what} '{path}': {error}")]
    Io {
        /// What was being done.
        what: &'static str,
        /// On which path.
        path: PathBuf,
        /// The error.
        error: std::io::Error,
    },
    /// crun or conmon failed.
    #[error("{program} {operation} of container '{id}' failed: {message}")]
    Runtime {
        /// `crun` or `conmon`.
        program: &'static str,
        /// What it was asked to do.
        operation: &'static str,
        /// The container.
        id: String,
        /// What it said.
        message: String,
    },
    /// Mounts under a run directory that could not be unmounted.
    #[error("mounts under '{dir}' could not be unmounted: {mounts}")]
    Unmount {
        /// The run directory.
        dir: PathBuf,
        /// The mounts and errors.
        mounts: String,
    },
}

/// The runtime.
#[derive(Debug)]
pub struct Runtime {
    config: RuntimeConfig,
    crun_root: PathBuf,
    exits: PathBuf,
    checkpoints: PathBuf,
    hide_unified: bool,
    exec_seq: AtomicU64,
}

/// What is checkpointed per container.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Checkpoint {
    id: String,
    run_dir: PathBuf,
    #[serde(default)]
    pid: u32,
    #[serde(default)]
    conmon_pid: u32,
}

// === impl Exit ===

impl Exit {
    /// From a status as crun and conmon write it (128+N for signal N).
    pub fn from_status(status: i32) -> Exit {
        if status > 128 && status < 128 + 65 {
            Exit::Signal(status - 128)
        } else {
            Exit::Code(status)
        }
    }

    /// Whether it exited with status 0.
    pub fn success(&self) -> bool {
        *self == Exit::Code(0)
    }
}

impl std::fmt::Display for Exit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Exit::Code(c) => write!(f, "exited with status {c}"),
            Exit::Signal(s) => match nix::sys::signal::Signal::try_from(*s) {
                Ok(sig) => write!(f, "killed by signal {s} ({sig})"),
                Err(_) => write!(f, "killed by signal {s}"),
            },
            Exit::Unknown => write!(f, "ended with an unknown status"),
        }
    }
}

// === impl Container ===

impl Container {
    /// Its id.
    pub fn id(&self) -> &str {
        &self.id
    }

    /// Its first process, as the host sees it.
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// Its run directory (the bundle).
    pub fn run_dir(&self) -> &Path {
        &self.run_dir
    }

    /// Waits for its first process to end (and with it, the pid
    /// namespace's every process). Cancel-safe; returns the same answer
    /// when called again.
    pub async fn wait(&mut self) -> Exit {
        if let Some(exit) = self.exit {
            return exit;
        }
        match &mut self.monitor {
            Monitor::Child(child) => {
                let _ = child.wait().await;
            }
            Monitor::Adopted(Some(fd)) => {
                let _ = fd.readable().await;
            }
            Monitor::Adopted(None) => {}
        }
        let exit = read_exit_file(&self.exit_file);
        self.exit = Some(exit);
        exit
    }
}

// === impl RuntimeConfig ===

impl RuntimeConfig {
    /// `crun` and `conmon` from `PATH`, state under `root`, any volume.
    pub fn new(root: impl Into<PathBuf>) -> Self {
        RuntimeConfig {
            root: root.into(),
            crun: PathBuf::from("crun"),
            conmon: PathBuf::from("conmon"),
            volume_policy: VolumePolicy::default(),
        }
    }
}

// === impl Runtime ===

impl Runtime {
    /// A runtime keeping its state under `config.root` (made if missing).
    pub fn new(mut config: RuntimeConfig) -> Result<Runtime, RuntimeError> {
        // conmon takes the runtime by absolute path only.
        config.crun = find_program(&config.crun)?;
        config.conmon = find_program(&config.conmon)?;
        let crun_root = config.root.join("crun");
        let exits = config.root.join("exits");
        let checkpoints = config.root.join("containers");
        for dir in [&crun_root, &exits, &checkpoints] {
            std::fs::create_dir_all(dir).map_err(|error| RuntimeError::Io {
                what: "creating",
                path: dir.clone(),
                error,
            })?;
        }
        let hide_unified = hybrid_with_v2_controllers();
        if hide_unified {
            tracing::info!(
                "hybrid cgroup host with controllers on /sys/fs/cgroup/unified: \
                 crun runs without that mount (v1 hierarchies only)"
            );
        }
        Ok(Runtime {
            config,
            crun_root,
            exits,
            checkpoints,
            hide_unified,
            exec_seq: AtomicU64::new(0),
        })
    }

    /// crun's state directory (its `--root`).
    pub fn crun_root(&self) -> &Path {
        &self.crun_root
    }

    /// Makes the bundle and starts the container. On failure nothing is
    /// left: no mount, no crun container, no run directory.
    pub async fn launch(&self, spec: ContainerSpec) -> Result<Container, RuntimeError> {
        self.make(spec, true).await
    }

    /// As [`Runtime::launch`], but the container is left created, its
    /// first process waiting to be started by [`Runtime::start_command`]
    /// (`crun start`), e.g. by the executor that runs the task.
    pub async fn create(&self, spec: ContainerSpec) -> Result<Container, RuntimeError> {
        self.make(spec, false).await
    }

    /// The command (argv) that starts a created container.
    pub fn start_command(&self, id: &str) -> Vec<String> {
        vec![
            self.config.crun.to_string_lossy().into_owned(),
            format!("--root={}", self.crun_root.display()),
            "start".into(),
            id.into(),
        ]
    }

    /// The command (argv, without the signal) that signals a container's
    /// first process.
    pub fn kill_command(&self, id: &str) -> Vec<String> {
        vec![
            self.config.crun.to_string_lossy().into_owned(),
            format!("--root={}", self.crun_root.display()),
            "kill".into(),
            id.into(),
        ]
    }

    /// The file the container's exit status is written into once it
    /// ended (as decimal text, 128+N for signal N).
    pub fn exit_file(&self, id: &str) -> PathBuf {
        self.exits.join(id)
    }

    async fn make(&self, spec: ContainerSpec, start: bool) -> Result<Container, RuntimeError> {
        check_id(&spec.id)?;
        if spec.run_dir.starts_with(&spec.sandbox) || spec.sandbox.starts_with(&spec.run_dir) {
            return Err(RuntimeError::RunDirInSandbox {
                run_dir: spec.run_dir.clone(),
                sandbox: spec.sandbox.clone(),
            });
        }
        let checkpoint_path = self.checkpoint_path(&spec.id);
        if checkpoint_path.exists() || self.crun_root.join(&spec.id).exists() {
            return Err(RuntimeError::Exists(spec.id.clone()));
        }
        let mut checkpoint = Checkpoint {
            id: spec.id.clone(),
            run_dir: spec.run_dir.clone(),
            pid: 0,
            conmon_pid: 0,
        };
        create_dir(&spec.run_dir)?;
        self.write_checkpoint(&checkpoint)?;
        match self.launch_in(&spec, start).await {
            Ok((pid, conmon_pid, child)) => {
                checkpoint.pid = pid;
                checkpoint.conmon_pid = conmon_pid;
                if let Err(e) = self.write_checkpoint(&checkpoint) {
                    let _ = self.destroy(&spec.id).await;
                    return Err(e);
                }
                Ok(Container {
                    id: spec.id.clone(),
                    run_dir: spec.run_dir.clone(),
                    pid,
                    monitor: Monitor::Child(child),
                    exit_file: self.exits.join(&spec.id),
                    exit: None,
                })
            }
            Err(e) => {
                if let Err(cleanup) = self.destroy(&spec.id).await {
                    tracing::warn!(id = %spec.id, error = %cleanup, "cleaning up a failed launch");
                }
                Err(e)
            }
        }
    }

    async fn launch_in(
        &self,
        spec: &ContainerSpec,
        start: bool,
    ) -> Result<(u32, u32, tokio::process::Child), RuntimeError> {
        let run_dir = &spec.run_dir;
        let (rootfs, image) = match &spec.rootfs {
            RootFs::Image { layers, config } => {
                if !mounts::overlay_supported() {
                    return Err(OverlayError::Unavailable(
                        "/proc/filesystems does not list overlay".into(),
                    )
                    .into());
                }
                (
                    mounts::mount_overlay(layers, &run_dir.join("rootfs"))?,
                    Some(config),
                )
            }
            RootFs::Host => {
                // An empty directory, onto which the container's mount
                // namespace binds the host's `/` (see [`bundle`]).
                let dir = run_dir.join("rootfs");
                create_dir(&dir)?;
                copy_top_level_symlinks(&dir)?;
                (dir, None)
            }
        };
        let sandbox_seen = match image {
            Some(_) => volumes::SANDBOX_MOUNT_POINT.to_string(),
            None => spec.sandbox.to_string_lossy().into_owned(),
        };
        let process = command::plan(&spec.command, image, &spec.env, &sandbox_seen)?;
        if image.is_some() && process.cwd != sandbox_seen {
            let dir = rootfs.join(process.cwd.trim_start_matches('/'));
            create_dir(&dir)?;
        }
        let user_spec = spec
            .user
            .clone()
            .or_else(|| image.and_then(|i| i.user.clone()))
            .unwrap_or_default();
        let user_root = if image.is_some() {
            rootfs.as_path()
        } else {
            Path::new("/")
        };
        let user = user::resolve(&user_spec, user_root)?;
        let planned = volumes::plan(
            &spec.volumes,
            &self.config.volume_policy,
            &VolumeContext {
                sandbox: &spec.sandbox,
                parent_sandbox: spec.parent_sandbox.as_deref(),
                has_image: image.is_some(),
            },
        )?;
        let mut binds = Vec::with_capacity(planned.len());
        for mount in planned {
            let source = match mount.source {
                MountSource::Bind(path) => path,
                MountSource::Image(layers) => mounts::mount_overlay(
                    &layers,
                    &run_dir.join("volumes").join(mount.index.to_string()),
                )?,
            };
            binds.push((source, mount.destination, mount.read_only));
        }
        let hostname = match &spec.hostname {
            Some(h) => h.clone(),
            None => nix::unistd::gethostname()
                .map(|h| h.to_string_lossy().into_owned())
                .unwrap_or_else(|_| spec.id.clone()),
        };
        let etc_dir = match &spec.network {
            Network::Namespace {
                etc_dir: Some(dir), ..
            } => dir.clone(),
            _ => run_dir.join("etc"),
        };
        let own_etc = !matches!(
            spec.network,
            Network::Namespace {
                etc_dir: Some(_),
                ..
            }
        );
        if own_etc && (image.is_some() || spec.network != Network::Host) {
            bundle::write_etc_files(&etc_dir, &hostname, &spec.network).map_err(|error| {
                RuntimeError::Io {
                    what: "writing /etc files into",
                    path: etc_dir.clone(),
                    error,
                }
            })?;
        }
        let config = bundle::spec(&bundle::BundleConfig {
            rootfs: &rootfs,
            has_image: image.is_some(),
            process: &process,
            user: &user,
            hostname: &hostname,
            network: &spec.network,
            cgroups_path: spec.cgroups_path.as_deref(),
            limits: &spec.limits,
            sandbox: &spec.sandbox,
            etc_dir: &etc_dir,
            volumes: &binds,
        })?;
        config.save(run_dir.join("config.json"))?;
        let (pid, child) = self.create_monitored(spec).await?;
        if start {
            self.crun_checked("start", &spec.id, &["start", &spec.id])
                .await?;
        }
        let conmon_pid = child.id().unwrap_or(0);
        Ok((pid, conmon_pid, child))
    }

    /// `conmon` running `crun create`; returns the container's first
    /// process and conmon.
    async fn create_monitored(
        &self,
        spec: &ContainerSpec,
    ) -> Result<(u32, tokio::process::Child), RuntimeError> {
        let id = &spec.id;
        let run_dir = &spec.run_dir;
        let output = |name: &str| -> Result<std::fs::File, RuntimeError> {
            let path = spec.sandbox.join(name);
            std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(&path)
                .map_err(|error| RuntimeError::Io {
                    what: "opening",
                    path,
                    error,
                })
        };
        let (sync_read, sync_write) =
            nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).map_err(|e| RuntimeError::Io {
                what: "making a pipe for",
                path: run_dir.clone(),
                error: e.into(),
            })?;
        let crun_log = run_dir.join("crun.log");
        let stderr_path = spec.sandbox.join("stderr");
        let stderr_before = std::fs::metadata(&stderr_path)
            .map(|m| m.len())
            .unwrap_or(0);
        let mut command = tokio::process::Command::new(&self.config.conmon);
        command
            .arg("--sync")
            .args(["--api-version", "1"])
            .args(["-c", id, "-u", id, "-n", id])
            .arg("-r")
            .arg(&self.config.crun)
            .arg("-b")
            .arg(run_dir)
            .arg("-p")
            .arg(run_dir.join("init.pid"))
            .arg("-P")
            .arg(run_dir.join("conmon.pid"))
            .args(["-l", "passthrough:"])
            .arg("--exit-dir")
            .arg(&self.exits)
            // conmon writes its `oom` and `exit` marks into the persist
            // directory, else into its working directory.
            .arg("--persist-dir")
            .arg(run_dir)
            .current_dir(run_dir)
            .arg("--no-sync-log")
            .arg("--runtime-arg")
            .arg(format!("--root={}", self.crun_root.display()))
            .arg("--runtime-arg")
            .arg(format!("--log={}", crun_log.display()))
            .env("_OCI_SYNCPIPE", sys::SYNC_FD.to_string())
            .stdin(Stdio::null())
            .stdout(output("stdout")?)
            .stderr(output("stderr")?)
            .kill_on_drop(false);
        sys::prepare_child(
            &mut command,
            Some(sync_write.as_raw_fd()),
            self.hide_unified,
        );
        let mut child = command.spawn().map_err(|error| RuntimeError::Runtime {
            program: "conmon",
            operation: "create",
            id: id.clone(),
            message: format!("cannot run {}: {error}", self.config.conmon.display()),
        })?;
        drop(sync_write);
        let receiver =
            tokio::net::unix::pipe::Receiver::from_owned_fd(sync_read).map_err(|error| {
                RuntimeError::Io {
                    what: "reading the sync pipe of",
                    path: run_dir.clone(),
                    error,
                }
            })?;
        let mut line = String::new();
        let read = tokio::time::timeout(
            CREATE_TIMEOUT,
            BufReader::new(receiver).read_line(&mut line),
        )
        .await;
        let failure = |message: String| RuntimeError::Runtime {
            program: "crun",
            operation: "create",
            id: id.clone(),
            message,
        };
        match read {
            Err(_) => {
                let _ = child.start_kill();
                return Err(failure(format!("no answer within {CREATE_TIMEOUT:?}")));
            }
            Ok(Err(error)) => return Err(failure(format!("reading conmon's sync pipe: {error}"))),
            Ok(Ok(_)) => {}
        }
        #[derive(Deserialize)]
        struct Sync {
            data: i64,
            #[serde(default)]
            message: Option<String>,
        }
        match serde_json::from_str::<Sync>(line.trim()) {
            Ok(Sync { data, .. }) if data > 0 => Ok((data as u32, child)),
            parsed => {
                let _ = child.wait().await;
                let mut message = parsed.ok().and_then(|s| s.message).unwrap_or_default();
                if message.is_empty() {
                    message = crun_log_errors(&crun_log);
                }
                if message.is_empty() {
                    message = appended_since(&stderr_path, stderr_before);
                }
                if message.is_empty() {
                    message = "conmon reported no container".into();
                }
                Err(failure(message))
            }
        }
    }

    /// Sends `signal` to every process of the container (`crun kill
    /// --all`).
    pub async fn kill(
        &self,
        id: &str,
        signal: nix::sys::signal::Signal,
    ) -> Result<(), RuntimeError> {
        check_id(id)?;
        let signal = (signal as i32).to_string();
        self.crun_checked("kill", id, &["kill", "--all", id, &signal])
            .await
            .map(drop)
    }

    /// The container's state (`crun state`).
    pub async fn state(&self, id: &str) -> Result<State, RuntimeError> {
        check_id(id)?;
        let out = self.crun_checked("state", id, &["state", id]).await?;
        serde_json::from_slice(&out).map_err(|e| RuntimeError::Runtime {
            program: "crun",
            operation: "state",
            id: id.into(),
            message: format!("unreadable answer: {e}"),
        })
    }

    /// Every container crun knows under this runtime's root (`crun list`).
    pub async fn list(&self) -> Result<Vec<State>, RuntimeError> {
        let out = self
            .crun_checked("list", "*", &["list", "--format", "json"])
            .await?;
        if out.iter().all(u8::is_ascii_whitespace) {
            return Ok(Vec::new());
        }
        serde_json::from_slice::<Option<Vec<State>>>(&out)
            .map(Option::unwrap_or_default)
            .map_err(|e| RuntimeError::Runtime {
                program: "crun",
                operation: "list",
                id: "*".into(),
                message: format!("unreadable answer: {e}"),
            })
    }

    /// Destroys the container: kills what is left of it (`crun delete
    /// --force`, which also removes its cgroup), unmounts everything under
    /// its run directory, removes the run directory, its exit file and
    /// checkpoint. The sandbox is left alone. Destroying a container that
    /// is already gone is not an error.
    pub async fn destroy(&self, id: &str) -> Result<(), RuntimeError> {
        check_id(id)?;
        let checkpoint = self.read_checkpoint(id);
        let mut run_dir = checkpoint.as_ref().map(|c| c.run_dir.clone());
        if self.crun_root.join(id).exists() {
            if run_dir.is_none() {
                run_dir = self.state(id).await.ok().map(|s| s.bundle);
            }
            let out = self.crun(&["delete", "--force", id]).await?;
            if !out.status.success() && self.crun_root.join(id).exists() {
                return Err(RuntimeError::Runtime {
                    program: "crun",
                    operation: "delete",
                    id: id.into(),
                    message: String::from_utf8_lossy(&out.stderr).trim().to_string(),
                });
            }
        }
        if let Some(conmon_pid) = checkpoint.as_ref().map(|c| c.conmon_pid).filter(|p| *p > 0) {
            wait_gone(conmon_pid, id).await;
        }
        if let Some(dir) = run_dir.filter(|d| !d.as_os_str().is_empty()) {
            let failed = mounts::unmount_all_under(&dir);
            if !failed.is_empty() {
                return Err(RuntimeError::Unmount {
                    dir,
                    mounts: failed
                        .iter()
                        .map(|(p, e)| format!("{} ({e})", p.display()))
                        .collect::<Vec<_>>()
                        .join(", "),
                });
            }
            if dir.exists() {
                std::fs::remove_dir_all(&dir).map_err(|error| RuntimeError::Io {
                    what: "removing",
                    path: dir.clone(),
                    error,
                })?;
            }
        }
        let _ = std::fs::remove_file(self.exits.join(id));
        let _ = std::fs::remove_file(self.checkpoint_path(id));
        Ok(())
    }

    /// After a restart: re-adopts each container crun knows that has a
    /// checkpoint and that `keep` wants, and destroys the others (orphans)
    /// with their mounts; checkpoints whose container crun no longer knows
    /// are cleaned up as well.
    pub async fn recover(&self, keep: &dyn Fn(&str) -> bool) -> Result<Recovered, RuntimeError> {
        let mut recovered = Recovered::default();
        let listed = self.list().await?;
        for state in &listed {
            let checkpoint = self.read_checkpoint(&state.id);
            match checkpoint {
                Some(checkpoint) if keep(&state.id) => {
                    recovered.adopted.push(self.adopt(checkpoint));
                }
                _ => {
                    if check_id(&state.id).is_err() {
                        continue;
                    }
                    // An orphan's bundle is found from crun, not a checkpoint.
                    if !state.bundle.as_os_str().is_empty()
                        && self.read_checkpoint(&state.id).is_none()
                    {
                        self.write_checkpoint(&Checkpoint {
                            id: state.id.clone(),
                            run_dir: state.bundle.clone(),
                            pid: 0,
                            conmon_pid: 0,
                        })?;
                    }
                    self.destroy(&state.id).await?;
                    recovered.destroyed.push(state.id.clone());
                }
            }
        }
        let entries = std::fs::read_dir(&self.checkpoints).map_err(|error| RuntimeError::Io {
            what: "listing",
            path: self.checkpoints.clone(),
            error,
        })?;
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            let Some(id) = name.strip_suffix(".json") else {
                continue;
            };
            if check_id(id).is_ok() && !listed.iter().any(|s| s.id == id) {
                self.destroy(id).await?;
                recovered.destroyed.push(id.to_string());
            }
        }
        Ok(recovered)
    }

    fn adopt(&self, checkpoint: Checkpoint) -> Container {
        let monitor = (checkpoint.conmon_pid > 0)
            .then(|| sys::pidfd_open(checkpoint.conmon_pid).ok())
            .flatten()
            .filter(|_| is_conmon_of(checkpoint.conmon_pid, &checkpoint.id))
            .and_then(|fd| sys::register(fd).ok());
        Container {
            id: checkpoint.id.clone(),
            run_dir: checkpoint.run_dir,
            pid: checkpoint.pid,
            monitor: Monitor::Adopted(monitor),
            exit_file: self.exits.join(&checkpoint.id),
            exit: None,
        }
    }

    /// Runs a command in the running container (its namespaces, cgroup,
    /// user, environment and working directory unless `spec` says
    /// otherwise), with standard output and error piped back.
    pub async fn exec(&self, id: &str, spec: ExecSpec) -> Result<ExecProcess, RuntimeError> {
        check_id(id)?;
        let checkpoint = self
            .read_checkpoint(id)
            .ok_or_else(|| RuntimeError::NotFound(id.into()))?;
        let config = oci_spec::runtime::Spec::load(checkpoint.run_dir.join("config.json"))?;
        let mut process = config.process().clone().unwrap_or_default();
        let mut env = process.env().clone().unwrap_or_default();
        for (name, value) in &spec.env {
            env.retain(|e| e.split_once('=').map(|(n, _)| n) != Some(name.as_str()));
            env.push(format!("{name}={value}"));
        }
        process.set_env(Some(env));
        process.set_args(Some(spec.args.clone()));
        if let Some(cwd) = &spec.cwd {
            process.set_cwd(PathBuf::from(cwd));
        }
        let seq = self.exec_seq.fetch_add(1, Ordering::Relaxed);
        let path = checkpoint
            .run_dir
            .join(format!("exec-{}-{seq}.json", std::process::id()));
        let json = serde_json::to_vec(&process).map_err(|e| RuntimeError::Io {
            what: "writing",
            path: path.clone(),
            error: e.into(),
        })?;
        std::fs::write(&path, json).map_err(|error| RuntimeError::Io {
            what: "writing",
            path: path.clone(),
            error,
        })?;
        let mut command = self.crun_command();
        command
            .arg("exec")
            .arg("--process")
            .arg(&path)
            .arg(id)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        command.spawn().map_err(|error| RuntimeError::Runtime {
            program: "crun",
            operation: "exec",
            id: id.into(),
            message: error.to_string(),
        })
    }

    fn crun_command(&self) -> tokio::process::Command {
        let mut command = tokio::process::Command::new(&self.config.crun);
        command.arg(format!("--root={}", self.crun_root.display()));
        sys::prepare_child(&mut command, None, self.hide_unified);
        command
    }

    async fn crun(&self, args: &[&str]) -> Result<std::process::Output, RuntimeError> {
        let mut command = self.crun_command();
        command.args(args).stdin(Stdio::null());
        command
            .output()
            .await
            .map_err(|error| RuntimeError::Runtime {
                program: "crun",
                operation: "run",
                id: args.last().copied().unwrap_or_default().into(),
                message: format!("cannot run {}: {error}", self.config.crun.display()),
            })
    }

    async fn crun_checked(
        &self,
        operation: &'static str,
        id: &str,
        args: &[&str],
    ) -> Result<Vec<u8>, RuntimeError> {
        let out = self.crun(args).await?;
        if out.status.success() {
            return Ok(out.stdout);
        }
        let message = String::from_utf8_lossy(&out.stderr).trim().to_string();
        if message.contains("does not exist") || message.contains("No such file") {
            return Err(RuntimeError::NotFound(id.into()));
        }
        Err(RuntimeError::Runtime {
            program: "crun",
            operation,
            id: id.into(),
            message,
        })
    }

    fn checkpoint_path(&self, id: &str) -> PathBuf {
        self.checkpoints.join(format!("{id}.json"))
    }

    fn write_checkpoint(&self, checkpoint: &Checkpoint) -> Result<(), RuntimeError> {
        let path = self.checkpoint_path(&checkpoint.id);
        let tmp = path.with_extension("json.tmp");
        let json = serde_json::to_vec(checkpoint).map_err(|e| RuntimeError::Io {
            what: "writing",
            path: path.clone(),
            error: e.into(),
        })?;
        std::fs::write(&tmp, json)
            .and_then(|()| std::fs::rename(&tmp, &path))
            .map_err(|error| RuntimeError::Io {
                what: "writing",
                path,
                error,
            })
    }

    fn read_checkpoint(&self, id: &str) -> Option<Checkpoint> {
        let bytes = std::fs::read(self.checkpoint_path(id)).ok()?;
        serde_json::from_slice(&bytes).ok()
    }
}

/// The host's top-level symlinks (`/bin -> usr/bin`, ...) in `root`.
fn copy_top_level_symlinks(root: &Path) -> Result<(), RuntimeError> {
    for entry in std::fs::read_dir("/").into_iter().flatten().flatten() {
        if entry.file_type().is_ok_and(|t| t.is_symlink()) {
            let link = root.join(entry.file_name());
            let target = std::fs::read_link(entry.path())
                .and_then(|target| std::os::unix::fs::symlink(&target, &link));
            target.map_err(|error| RuntimeError::Io {
                what: "copying the host's symlink to",
                path: link,
                error,
            })?;
        }
    }
    Ok(())
}

/// `program` itself if it has a `/`, else the first of that name in `PATH`.
fn find_program(program: &Path) -> Result<PathBuf, RuntimeError> {
    if program.components().count() > 1 {
        return if program.is_file() {
            Ok(program.to_path_buf())
        } else {
            Err(RuntimeError::ProgramNotFound(program.to_path_buf()))
        };
    }
    std::env::var_os("PATH")
        .iter()
        .flat_map(std::env::split_paths)
        .map(|dir| dir.join(program))
        .find(|p| p.is_file())
        .ok_or_else(|| RuntimeError::ProgramNotFound(program.to_path_buf()))
}

fn check_id(id: &str) -> Result<(), RuntimeError> {
    let ok = !id.is_empty()
        && id.len() <= 128
        && !id.starts_with('.')
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-' || b == b'.');
    if ok {
        Ok(())
    } else {
        Err(RuntimeError::InvalidId(id.into()))
    }
}

fn create_dir(path: &Path) -> Result<(), RuntimeError> {
    std::fs::create_dir_all(path).map_err(|error| RuntimeError::Io {
        what: "creating",
        path: path.to_path_buf(),
        error,
    })
}

fn read_exit_file(path: &Path) -> Exit {
    std::fs::read_to_string(path)
        .ok()
        .and_then(|s| s.trim().parse::<i32>().ok())
        .map(Exit::from_status)
        .unwrap_or(Exit::Unknown)
}

/// The error lines crun wrote into its `--log` file.
fn crun_log_errors(path: &Path) -> String {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .filter(|l| !l.trim().is_empty())
        .collect::<Vec<_>>()
        .join("; ")
}

/// What was written to `path` past its first `from` bytes (at most the
/// last 4 KiB of it).
fn appended_since(path: &Path, from: u64) -> String {
    let bytes = std::fs::read(path).unwrap_or_default();
    let new = bytes.get(from as usize..).unwrap_or_default();
    let tail = &new[new.len().saturating_sub(4096)..];
    String::from_utf8_lossy(tail).trim().replace('\n', "; ")
}

/// Whether `pid` is conmon watching container `id` (and not a process
/// that got its pid since).
fn is_conmon_of(pid: u32, id: &str) -> bool {
    let Ok(cmdline) = std::fs::read(format!("/proc/{pid}/cmdline")) else {
        return false;
    };
    let args: Vec<&[u8]> = cmdline.split(|b| *b == 0).collect();
    args.first().is_some_and(|a| a.ends_with(b"conmon"))
        && args
            .windows(2)
            .any(|w| w[0] == b"-c" && w[1] == id.as_bytes())
}

/// Waits (bounded) for a container's conmon to end.
async fn wait_gone(pid: u32, id: &str) {
    let deadline = tokio::time::Instant::now() + MONITOR_EXIT_TIMEOUT;
    while is_conmon_of(pid, id) && !is_zombie(pid) {
        if tokio::time::Instant::now() > deadline {
            tracing::warn!(id, pid, "conmon still runs after the container was deleted");
            return;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

fn is_zombie(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| {
            s.rsplit_once(')')
                .map(|(_, rest)| rest.trim_start().starts_with('Z'))
        })
        .unwrap_or(true)
}

/// A hybrid cgroup host whose v2 hierarchy has controllers (which crun
/// 1.8 refuses).
fn hybrid_with_v2_controllers() -> bool {
    if Path::new("/sys/fs/cgroup/cgroup.controllers").exists() {
        return false;
    }
    std::fs::read_to_string("/sys/fs/cgroup/unified/cgroup.controllers")
        .map(|s| !s.trim().is_empty())
        .unwrap_or(false)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_crun_can_take() {
        assert!(check_id("task-1_a.b").is_ok());
        for bad in ["", ".hidden", "a/b", "a b", &"x".repeat(129)] {
            assert!(check_id(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn statuses_above_128_are_signals() {
        assert_eq!(Exit::from_status(0), Exit::Code(0));
        assert_eq!(Exit::from_status(7), Exit::Code(7));
        assert_eq!(Exit::from_status(128), Exit::Code(128));
        assert_eq!(Exit::from_status(137), Exit::Signal(9));
        assert_eq!(Exit::from_status(255), Exit::Code(255));
        assert_eq!(Exit::Signal(9).to_string(), "killed by signal 9 (SIGKILL)");
    }
}
