//! Command tasks in images: the part of the face the agent calls for a
//! task whose `TaskInfo.container` names an image (Mesos's unified
//! containerizer running a command task with `ContainerInfo`).
//!
//! [`ImageContainers::prepare`] pulls the image (the [`Provisioner`],
//! with the agent's `--docker-*` flags), checks the volumes
//! (`--allowed-host-paths`), writes the OCI bundle (an overlay of the
//! layers with its upper directory in the run directory, the image
//! config's `Entrypoint`/`Cmd`/`Env`/`WorkingDir`/`User` under Mesos's
//! `CommandInfo` rules, the sandbox at `/mnt/mesos/sandbox` with
//! `MESOS_SANDBOX` pointing there, pid/mount/ipc/uts namespaces, the
//! cgroup limits of the task's resources) and has the runtime create
//! the container, its first process waiting. It hands back
//! [`Prepared::command`]: the command the task's executor runs in place
//! of the task's own, which starts the container, forwards SIGTERM to
//! it and exits with its status, so the executor's running, killing and
//! reporting work as for any command task.
//!
//! [`ImageContainers::destroy`] ends a container whole (its processes,
//! its overlay and volume mounts, its cgroup, its run directory); the
//! agent calls it once the task's executor reported it ended, before the
//! terminal update goes on, so nothing of the task is left when the
//! framework hears of its end. A failure is a [`PrepareError`] whose text
//! names the image and the cause, for the task's status message.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, PoisonError};

use agora_proto::{CommandInfo, ContainerInfo, ImageType, VolumeMode, VolumeSource};

use crate::provisioner::{self, Provider, ProvisionError, ProvisionedImage, Provisioner, Pull};
use crate::runtime::{
    self, CommandSpec, Container, ContainerSpec, Network, RootFs, Runtime, RuntimeConfig,
    RuntimeError,
};
use crate::volumes::{Mode, SandboxOf, Volume, VolumeSource as Source};

/// What the agent's image flags set up.
#[derive(Debug, Clone)]
pub struct ImagesConfig {
    /// `--image-providers`, `--docker-*`, `--image-pull-timeout`.
    pub provisioner: provisioner::Config,
    /// The runtime's state (`WORK_DIR/runtime`) and `--allowed-host-paths`.
    pub runtime: RuntimeConfig,
    /// The containers' run directories (bundles, overlay upper
    /// directories): `WORK_DIR/containers`.
    pub runs_dir: PathBuf,
    /// The cgroup parent of the containers under `--isolation cgroups`
    /// (`--cgroups-root`); `None`: crun's default place, no limits.
    pub cgroups_root: Option<String>,
}

/// One command task to run in its image.
#[derive(Debug, Clone)]
pub struct ImageTask {
    /// The container's id (the task's sandbox run id).
    pub id: String,
    /// The task's sandbox on the host.
    pub sandbox: PathBuf,
    /// Its container, as the framework asked.
    pub container: ContainerInfo,
    /// Its command (Mesos's rules over the image's config).
    pub command: CommandInfo,
    /// What the container is limited to (under `--isolation cgroups`).
    pub limits: Option<crate::Limits>,
}

/// A container made and waiting for its executor to start it.
#[derive(Debug, Clone)]
pub struct Prepared {
    /// The container's id.
    pub id: String,
    /// What the task's executor runs in place of the task's command.
    pub command: CommandInfo,
    /// The container's first process, as the host sees it.
    pub pid: u32,
}

/// Why an image task's container could not be made; nothing of it is
/// left.
#[derive(Debug, thiserror::Error)]
pub enum PrepareError {
    /// The container asks for what this agent does not do.
    #[error("{0}")]
    Refused(String),
    /// The image could not be pulled ("image busybox:1: no such image in ...").
    #[error(transparent)]
    Provision(#[from] ProvisionError),
    /// The bundle or the runtime failed.
    #[error("image {image}: {error}")]
    Runtime {
        /// The image.
        image: String,
        /// What failed.
        error: RuntimeError,
    },
}

/// Pulls images and makes and ends the containers of image tasks. Cheap
/// to clone.
#[derive(Clone)]
pub struct ImageContainers {
    inner: Arc<Inner>,
}

struct Inner {
    provisioner: Provisioner,
    runtime: Runtime,
    runs_dir: PathBuf,
    cgroups_root: Option<String>,
    /// Live containers, with the images whose layers they hold.
    live: Mutex<HashMap<String, Live>>,
}

struct Live {
    /// Keeps the monitor's handle (conmon is reaped when it ends).
    _container: Container,
    /// Keeps the layers from image GC.
    _image: ProvisionedImage,
}

// === impl ImageContainers ===

impl ImageContainers {
    /// Sets up the provisioner (the layer store) and the runtime (crun
    /// and conmon must be installed); an error names the flag or program
    /// at fault.
    pub fn start(config: ImagesConfig) -> Result<ImageContainers, String> {
        let provisioner = Provisioner::new(config.provisioner).map_err(|e| e.to_string())?;
        let runtime = Runtime::new(config.runtime).map_err(|e| e.to_string())?;
        std::fs::create_dir_all(&config.runs_dir)
            .map_err(|e| format!("cannot create {}: {e}", config.runs_dir.display()))?;
        Ok(ImageContainers {
            inner: Arc::new(Inner {
                provisioner,
                runtime,
                runs_dir: config.runs_dir,
                cgroups_root: config.cgroups_root,
                live: Mutex::new(HashMap::new()),
            }),
        })
    }

    /// The runtime (for recovery and tests).
    pub fn runtime(&self) -> &Runtime {
        &self.inner.runtime
    }

    /// Pulls `task`'s image and makes its container, its first process
    /// waiting for [`Prepared::command`] to start it. See the module
    /// documentation.
    pub async fn prepare(&self, task: ImageTask) -> Result<Prepared, PrepareError> {
        let Some(image) = task.container.image.clone() else {
            return Err(PrepareError::Refused(
                "ContainerInfo without an image: a container on the host's file system is not supported; name an image"
                    .into(),
            ));
        };
        if !task.container.network_infos.is_empty() {
            return Err(PrepareError::Refused(
                "ContainerInfo.network_infos: CNI networks are not enabled on this agent (the task would use the host's network)"
                    .into(),
            ));
        }
        let provider = match image.kind {
            ImageType::Docker => Provider::Docker,
            ImageType::Oci => Provider::Oci,
            ImageType::Unknown => {
                return Err(PrepareError::Refused(format!(
                    "image {}: unknown image type",
                    image.name
                )))
            }
        };
        let volumes = task
            .container
            .volumes
            .iter()
            .enumerate()
            .map(|(index, v)| volume(index, v))
            .collect::<Result<Vec<_>, _>>()?;
        let pull = if image.cached {
            Pull::IfMissing
        } else {
            Pull::Always
        };
        let provisioned = self
            .inner
            .provisioner
            .provision(provider, &image.name, pull)
            .await?;
        let config = &provisioned.config;
        let runtime_config = runtime::ImageConfig {
            entrypoint: config.entrypoint.clone().unwrap_or_default(),
            cmd: config.cmd.clone().unwrap_or_default(),
            env: config.env.clone(),
            working_dir: config.working_dir.clone(),
            user: config.user.clone(),
        };
        let command = &task.command;
        let spec = ContainerSpec {
            id: task.id.clone(),
            run_dir: self.inner.runs_dir.join(&task.id),
            sandbox: task.sandbox.clone(),
            parent_sandbox: None,
            rootfs: RootFs::Image {
                layers: provisioned.layers.clone(),
                config: runtime_config,
            },
            command: CommandSpec {
                shell: command.shell,
                value: Some(command.value.clone()).filter(|v| !v.is_empty()),
                arguments: command.arguments.clone(),
            },
            env: command
                .environment
                .iter()
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect(),
            user: None,
            hostname: task.container.hostname.clone(),
            network: Network::Host,
            cgroups_path: match (&self.inner.cgroups_root, &task.limits) {
                (Some(root), Some(_)) => Some(format!("/{}/{}", root.trim_matches('/'), task.id)),
                _ => None,
            },
            limits: task.limits.map(runtime_limits).unwrap_or_default(),
            volumes,
        };
        let container =
            self.inner
                .runtime
                .create(spec)
                .await
                .map_err(|error| PrepareError::Runtime {
                    image: image.name.clone(),
                    error,
                })?;
        let pid = container.pid();
        let command = self.start_command(&task.id);
        self.inner
            .live
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(
                task.id.clone(),
                Live {
                    _container: container,
                    _image: provisioned,
                },
            );
        Ok(Prepared {
            id: task.id,
            command,
            pid,
        })
    }

    /// Imports the images of `archive` (a `docker save` or OCI-layout
    /// tarball) into the layer store, under the names it gives them, for
    /// hosts without a registry (`agora image import FILE`).
    pub async fn import(
        &self,
        archive: &std::path::Path,
    ) -> Result<Vec<provisioner::ImportedImage>, ProvisionError> {
        self.inner.provisioner.import(archive).await
    }

    /// Ends container `id` whole: kills what runs in it, removes its
    /// mounts, cgroup and run directory. A container already gone is not
    /// an error.
    pub async fn destroy(&self, id: &str) -> Result<(), RuntimeError> {
        let result = self.inner.runtime.destroy(id).await;
        self.inner
            .live
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(id);
        result
    }

    /// The shell command that starts container `id`, passes SIGTERM (and
    /// SIGINT) on to it, waits for it to end and exits with its status.
    fn start_command(&self, id: &str) -> CommandInfo {
        let runtime = &self.inner.runtime;
        let start = shell_words(&runtime.start_command(id));
        let kill = shell_words(&runtime.kill_command(id));
        let exit = shell_quote(&runtime.exit_file(id).to_string_lossy());
        // The wait polls: conmon writes the exit file when the container's
        // first process ends (and with it, its pid namespace).
        let script = format!(
            "trap '{kill} TERM' TERM; trap '{kill} INT' INT; \
             {start} || exit 125; \
             while [ ! -s {exit} ]; do sleep 0.05; done; \
             exit \"$(cat {exit})\"",
            kill = kill.replace('\'', "'\\''"),
        );
        CommandInfo {
            value: script,
            shell: true,
            arguments: Vec::new(),
            environment: Default::default(),
            uris: Vec::new(),
        }
    }
}

/// A task's volume as the runtime's, refused by name when this agent
/// cannot mount it.
fn volume(index: usize, v: &agora_proto::Volume) -> Result<Volume, PrepareError> {
    let source = match &v.source {
        VolumeSource::HostPath { path } => Source::HostPath { path: path.into() },
        VolumeSource::SandboxPath { of, path } => Source::SandboxPath {
            of: match of {
                agora_proto::SandboxOf::Own => SandboxOf::Own,
                agora_proto::SandboxOf::Parent => SandboxOf::Parent,
            },
            path: path.clone(),
        },
        VolumeSource::Unknown => {
            return Err(PrepareError::Refused(format!(
                "volume {index} at '{}': unknown source type",
                v.container_path
            )))
        }
    };
    Ok(Volume {
        container_path: v.container_path.clone(),
        mode: match v.mode {
            VolumeMode::Rw => Mode::Rw,
            VolumeMode::Ro => Mode::Ro,
        },
        source,
    })
}

/// The cgroup limits of a task's resources, as crun writes them (CPU
/// shares of 1024 per CPU, a hard CFS quota, memory in bytes).
fn runtime_limits(limits: crate::Limits) -> runtime::Limits {
    let cpus = limits.cpus.max(0.01);
    runtime::Limits {
        cpu_shares: Some(((cpus * 1024.0) as u64).max(2)),
        cpu_quota_us: Some((cpus * 100_000.0) as i64),
        cpu_period_us: Some(100_000),
        memory_bytes: Some((limits.mem_mib.max(4.0) * 1024.0 * 1024.0) as i64),
        pids_max: limits.pids.map(|p| p as i64),
    }
}

fn shell_words(argv: &[String]) -> String {
    argv.iter()
        .map(|a| shell_quote(a))
        .collect::<Vec<_>>()
        .join(" ")
}

fn shell_quote(word: &str) -> String {
    if !word.is_empty()
        && word
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "/_-.=:,+".contains(c))
    {
        word.to_string()
    } else {
        format!("'{}'", word.replace('\'', "'\\''"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn words_are_quoted_for_the_shell_only_when_they_need_it() {
        assert_eq!(shell_quote("/usr/bin/crun"), "/usr/bin/crun");
        assert_eq!(shell_quote("--root=/var/x"), "--root=/var/x");
        assert_eq!(shell_quote("a b"), "'a b'");
        assert_eq!(shell_quote("it's"), "'it'\\''s'");
    }

    #[test]
    fn limits_follow_the_task_resources() {
        let limits = runtime_limits(crate::Limits {
            cpus: 0.5,
            mem_mib: 64.0,
            pids: None,
        });
        assert_eq!(limits.cpu_shares, Some(512));
        assert_eq!(limits.cpu_quota_us, Some(50_000));
        assert_eq!(limits.memory_bytes, Some(64 << 20));
    }
}
