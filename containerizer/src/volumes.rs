//! A container's volumes (`ContainerInfo.volumes`): what each one is, the
//! operator's policy over them, and the check that turns them into mounts
//! or refuses them with a message naming the volume.
//!
//! The shapes and rules are Mesos's (`docs/container-volume.md`, the
//! `volume/host_path`, `volume/sandbox_path` and `volume/image` isolators):
//!
//! - `container_path` absolute: the path in the container's root file
//!   system. Without an image (the container shares the host's file
//!   system) it must already exist on the host: nothing is created
//!   outside the work directory.
//! - `container_path` relative: a path in the sandbox (under
//!   `/mnt/mesos/sandbox` with an image, under the host sandbox without
//!   one); its mount point is made in the host sandbox directory.
//! - `HOST_PATH`: an absolute host path, which must exist, unless it is
//!   under one of Mesos's `--host_path_volume_force_creation` directories
//!   (then it is made as a directory). Mesos has no flag that limits which
//!   host paths a task may mount; Agora's `allowed_host_paths` (the name
//!   of Kubernetes' PodSecurityPolicy field) does: a list of directories,
//!   and a host path must be one of them or under one (`None`: any path,
//!   Mesos's behaviour).
//! - `SANDBOX_PATH` `SELF`: a relative path in this container's sandbox,
//!   at an absolute `container_path` (a relative one would mount the
//!   sandbox into itself: Mesos refuses it too). `PARENT`: a relative path
//!   in the parent's (the executor's) sandbox, so the tasks of a group
//!   share a volume. The source directory is made when missing.
//! - `IMAGE`: an image's root file system (its layer directories, from the
//!   provisioner), mounted read-write (over a writable layer of its own)
//!   or read-only.
//!
//! Beyond Mesos, which leaves these as TODOs: no path may hold a `..`
//! component, and a sandbox source that resolves (through symlinks)
//! outside its sandbox is refused.

use std::path::{Component, Path, PathBuf};

/// Where the sandbox appears in a container with an image (Mesos's
/// `--sandbox_directory` default).
pub const SANDBOX_MOUNT_POINT: &str = "/mnt/mesos/sandbox";

/// A volume's access mode.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Read-write.
    Rw,
    /// Read-only.
    Ro,
}

/// Whose sandbox a `SANDBOX_PATH` volume is in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SandboxOf {
    /// The container's own (`SELF`).
    Own,
    /// The parent container's, e.g. the executor's of a task group
    /// (`PARENT`).
    Parent,
}

/// Where a volume comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum VolumeSource {
    /// `HOST_PATH`: a path on the host.
    HostPath {
        /// Absolute host path.
        path: PathBuf,
    },
    /// `SANDBOX_PATH`: a path in a sandbox.
    SandboxPath {
        /// Whose sandbox.
        of: SandboxOf,
        /// Relative path in it.
        path: String,
    },
    /// An image's root file system (`Volume.image`).
    Image {
        /// The image's unpacked layer directories, bottom first.
        layers: Vec<PathBuf>,
    },
}

/// One volume of a container.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Volume {
    /// Where it appears in the container (absolute, or relative to the
    /// sandbox).
    pub container_path: String,
    /// Read-write or read-only.
    pub mode: Mode,
    /// What is mounted.
    pub source: VolumeSource,
}

/// The operator's limits on volumes (agent flags).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct VolumePolicy {
    /// `--allowed-host-paths`: the host directories `HOST_PATH` volumes
    /// may name (each, or anything under it); `None`: any.
    pub allowed_host_paths: Option<Vec<PathBuf>>,
    /// Mesos's `--host_path_volume_force_creation`: directories under
    /// which a missing `HOST_PATH` is made (as a directory) rather than
    /// refused.
    pub host_path_volume_force_creation: Vec<PathBuf>,
}

/// What a container's volumes are checked against.
#[derive(Debug, Clone, Copy)]
pub struct VolumeContext<'a> {
    /// The container's sandbox on the host.
    pub sandbox: &'a Path,
    /// The parent container's sandbox on the host, for `PARENT` volumes.
    pub parent_sandbox: Option<&'a Path>,
    /// Whether the container has its own root file system (an image);
    /// without one it shares the host's.
    pub has_image: bool,
}

/// What a planned mount mounts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MountSource {
    /// A bind mount of this host path.
    Bind(PathBuf),
    /// An overlay of these layer directories (bottom first), made by the
    /// runtime, then bound.
    Image(Vec<PathBuf>),
}

/// A volume checked and ready to mount.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlannedMount {
    /// Index of the volume in the container's list.
    pub index: usize,
    /// What is mounted.
    pub source: MountSource,
    /// Where, as the container sees it (with an image), or on the host
    /// (without one): always absolute.
    pub destination: PathBuf,
    /// Read-only.
    pub read_only: bool,
}

/// A volume refused, and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("volume {index} at '{container_path}' refused: {reason}")]
pub struct VolumeError {
    /// Index of the volume in the container's list.
    pub index: usize,
    /// Its `container_path`.
    pub container_path: String,
    /// Why.
    pub reason: Refusal,
}

/// Why a volume is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    /// An empty `container_path`.
    #[error("container_path is empty")]
    EmptyContainerPath,
    /// A path with a `..` component.
    #[error("path '{0}' has a '..' component (it could escape)")]
    DotDot(String),
    /// A relative `HOST_PATH`.
    #[error("HOST_PATH '{0}' is not absolute")]
    HostPathNotAbsolute(PathBuf),
    /// A `HOST_PATH` outside `--allowed-host-paths`.
    #[error(
        "HOST_PATH '{path}' is not under an allowed host path (--allowed-host-paths: {allowed})"
    )]
    HostPathNotAllowed {
        /// The path.
        path: PathBuf,
        /// The allowed list, comma-separated.
        allowed: String,
    },
    /// A missing `HOST_PATH` outside the force-creation directories.
    #[error("HOST_PATH '{0}' does not exist (and is not under --host_path_volume_force_creation)")]
    HostPathMissing(PathBuf),
    /// An absolute `SANDBOX_PATH` source.
    #[error("SANDBOX_PATH path '{0}' is absolute (it is a path in the sandbox)")]
    SandboxPathAbsolute(String),
    /// `SELF` with a relative `container_path`.
    #[error("a SANDBOX_PATH volume of type SELF needs an absolute container_path")]
    SelfRelative,
    /// `PARENT` without a parent.
    #[error(
        "a SANDBOX_PATH volume of type PARENT needs a parent container (a task group's executor)"
    )]
    NoParent,
    /// A sandbox source resolving outside its sandbox.
    #[error("SANDBOX_PATH '{0}' resolves outside its sandbox")]
    SandboxEscape(String),
    /// An image volume without layers.
    #[error("the image volume has no layers")]
    NoLayers,
    /// An absolute `container_path` missing on the host, for a container
    /// without an image.
    #[error(
        "'{0}' does not exist on the host: a container without an image shares the host's file \
         system, where no mount point is made outside the sandbox"
    )]
    NoMountPointOnHost(PathBuf),
    /// The file system said no.
    #[error("{what} '{path}': {error}")]
    Io {
        /// What was being done.
        what: &'static str,
        /// On which path.
        path: PathBuf,
        /// The error's text.
        error: String,
    },
}

/// Checks `volumes` against `policy` and turns them into mounts, making
/// the directories they need (sandbox sources, force-created host paths,
/// mount points for sandbox-relative container paths). The first volume
/// refused ends the check with an error naming it.
pub fn plan(
    volumes: &[Volume],
    policy: &VolumePolicy,
    ctx: &VolumeContext<'_>,
) -> Result<Vec<PlannedMount>, VolumeError> {
    volumes
        .iter()
        .enumerate()
        .map(|(index, volume)| {
            plan_one(index, volume, policy, ctx).map_err(|reason| VolumeError {
                index,
                container_path: volume.container_path.clone(),
                reason,
            })
        })
        .collect()
}

fn plan_one(
    index: usize,
    volume: &Volume,
    policy: &VolumePolicy,
    ctx: &VolumeContext<'_>,
) -> Result<PlannedMount, Refusal> {
    let container_path = volume.container_path.as_str();
    if container_path.is_empty() {
        return Err(Refusal::EmptyContainerPath);
    }
    no_dot_dot(container_path)?;
    let absolute = container_path.starts_with('/');
    let (source, source_is_dir) = match &volume.source {
        VolumeSource::HostPath { path } => {
            let path = host_path(path, policy)?;
            let is_dir = path.is_dir();
            (MountSource::Bind(path), is_dir)
        }
        VolumeSource::SandboxPath { of, path } => {
            if path.starts_with('/') {
                return Err(Refusal::SandboxPathAbsolute(path.clone()));
            }
            no_dot_dot(path)?;
            let root = match of {
                SandboxOf::Own if !absolute => return Err(Refusal::SelfRelative),
                SandboxOf::Own => ctx.sandbox,
                SandboxOf::Parent => ctx.parent_sandbox.ok_or(Refusal::NoParent)?,
            };
            let source = root.join(path);
            if !source.exists() {
                std::fs::create_dir_all(&source).map_err(|e| io("creating", &source, e))?;
            }
            let real = source
                .canonicalize()
                .map_err(|e| io("resolving", &source, e))?;
            let real_root = root.canonicalize().map_err(|e| io("resolving", root, e))?;
            if !real.starts_with(&real_root) {
                return Err(Refusal::SandboxEscape(path.clone()));
            }
            let is_dir = real.is_dir();
            (MountSource::Bind(real), is_dir)
        }
        VolumeSource::Image { layers } => {
            if layers.is_empty() {
                return Err(Refusal::NoLayers);
            }
            (MountSource::Image(layers.clone()), true)
        }
    };
    let destination = if absolute {
        let destination = PathBuf::from(container_path);
        if !ctx.has_image && !destination.exists() {
            return Err(Refusal::NoMountPointOnHost(destination));
        }
        destination
    } else {
        // The mount point is made in the host sandbox: with an image, the
        // sandbox's own bind mount would hide one made in the root file
        // system.
        let mount_point = ctx.sandbox.join(container_path);
        make_mount_point(&mount_point, source_is_dir)?;
        if ctx.has_image {
            Path::new(SANDBOX_MOUNT_POINT).join(container_path)
        } else {
            mount_point
        }
    };
    Ok(PlannedMount {
        index,
        source,
        destination,
        read_only: volume.mode == Mode::Ro,
    })
}

fn host_path(path: &Path, policy: &VolumePolicy) -> Result<PathBuf, Refusal> {
    if !path.is_absolute() {
        return Err(Refusal::HostPathNotAbsolute(path.to_path_buf()));
    }
    no_dot_dot(&path.to_string_lossy())?;
    if let Some(allowed) = &policy.allowed_host_paths {
        // Symlinks are resolved first, so a link under an allowed
        // directory cannot lead elsewhere.
        let resolved = path.canonicalize().unwrap_or_else(|_| path.to_path_buf());
        if !allowed
            .iter()
            .any(|a| resolved.starts_with(a) && path.starts_with(a))
        {
            return Err(Refusal::HostPathNotAllowed {
                path: path.to_path_buf(),
                allowed: allowed
                    .iter()
                    .map(|a| a.display().to_string())
                    .collect::<Vec<_>>()
                    .join(", "),
            });
        }
    }
    if !path.exists() {
        if policy
            .host_path_volume_force_creation
            .iter()
            .any(|dir| path.starts_with(dir))
        {
            std::fs::create_dir_all(path).map_err(|e| io("creating", path, e))?;
        } else {
            return Err(Refusal::HostPathMissing(path.to_path_buf()));
        }
    }
    Ok(path.to_path_buf())
}

fn make_mount_point(path: &Path, dir: bool) -> Result<(), Refusal> {
    if dir {
        std::fs::create_dir_all(path).map_err(|e| io("creating", path, e))
    } else {
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent).map_err(|e| io("creating", parent, e))?;
        }
        std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .map(drop)
            .map_err(|e| io("creating", path, e))
    }
}

fn no_dot_dot(path: &str) -> Result<(), Refusal> {
    if Path::new(path)
        .components()
        .any(|c| c == Component::ParentDir)
    {
        return Err(Refusal::DotDot(path.into()));
    }
    Ok(())
}

fn io(what: &'static str, path: &Path, error: std::io::Error) -> Refusal {
    Refusal::Io {
        what,
        path: path.to_path_buf(),
        error: error.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Dirs {
        _tmp: tempfile::TempDir,
        sandbox: PathBuf,
        parent: PathBuf,
        host: PathBuf,
    }

    fn dirs() -> Dirs {
        let tmp = tempfile::tempdir().unwrap();
        let sandbox = tmp.path().join("sandbox");
        let parent = tmp.path().join("parent");
        let host = tmp.path().join("host");
        for d in [&sandbox, &parent, &host] {
            std::fs::create_dir_all(d).unwrap();
        }
        Dirs {
            _tmp: tmp,
            sandbox,
            parent,
            host,
        }
    }

    fn ctx(d: &Dirs, has_image: bool) -> VolumeContext<'_> {
        VolumeContext {
            sandbox: &d.sandbox,
            parent_sandbox: Some(&d.parent),
            has_image,
        }
    }

    fn host(container_path: &str, path: &Path, mode: Mode) -> Volume {
        Volume {
            container_path: container_path.into(),
            mode,
            source: VolumeSource::HostPath { path: path.into() },
        }
    }

    fn sandbox(container_path: &str, of: SandboxOf, path: &str) -> Volume {
        Volume {
            container_path: container_path.into(),
            mode: Mode::Rw,
            source: VolumeSource::SandboxPath {
                of,
                path: path.into(),
            },
        }
    }

    fn refusal(volumes: &[Volume], policy: &VolumePolicy, ctx: &VolumeContext<'_>) -> Refusal {
        plan(volumes, policy, ctx).unwrap_err().reason
    }

    #[test]
    fn host_paths_mount_at_absolute_or_sandbox_relative_paths() {
        let d = dirs();
        let volumes = [
            host("/data", &d.host, Mode::Rw),
            host("cache", &d.host, Mode::Ro),
        ];
        let mounts = plan(&volumes, &VolumePolicy::default(), &ctx(&d, true)).unwrap();
        assert_eq!(mounts[0].destination, PathBuf::from("/data"));
        assert_eq!(mounts[0].source, MountSource::Bind(d.host.clone()));
        assert!(!mounts[0].read_only);
        assert_eq!(
            mounts[1].destination,
            PathBuf::from("/mnt/mesos/sandbox/cache")
        );
        assert!(mounts[1].read_only);
        assert!(
            d.sandbox.join("cache").is_dir(),
            "mount point made in the sandbox"
        );
    }

    #[test]
    fn allowed_host_paths_limit_which_host_paths() {
        let d = dirs();
        let policy = VolumePolicy {
            allowed_host_paths: Some(vec![d.host.clone()]),
            ..VolumePolicy::default()
        };
        std::fs::create_dir_all(d.host.join("sub")).unwrap();
        assert!(plan(
            &[host("/x", &d.host.join("sub"), Mode::Rw)],
            &policy,
            &ctx(&d, true)
        )
        .is_ok());
        let err = plan(
            &[host("/x", Path::new("/etc"), Mode::Ro)],
            &policy,
            &ctx(&d, true),
        )
        .unwrap_err();
        assert_eq!(err.index, 0);
        assert!(matches!(err.reason, Refusal::HostPathNotAllowed { .. }));
        assert!(err.to_string().contains("'/x'") && err.to_string().contains("'/etc'"));
        // A symlink inside an allowed directory that leads out of it.
        std::os::unix::fs::symlink("/etc", d.host.join("link")).unwrap();
        assert!(matches!(
            refusal(
                &[host("/x", &d.host.join("link"), Mode::Ro)],
                &policy,
                &ctx(&d, true)
            ),
            Refusal::HostPathNotAllowed { .. }
        ));
    }

    #[test]
    fn missing_host_paths_are_refused_unless_force_created() {
        let d = dirs();
        let missing = d.host.join("missing");
        assert_eq!(
            refusal(
                &[host("/x", &missing, Mode::Ro)],
                &VolumePolicy::default(),
                &ctx(&d, true)
            ),
            Refusal::HostPathMissing(missing.clone())
        );
        let policy = VolumePolicy {
            host_path_volume_force_creation: vec![d.host.clone()],
            ..VolumePolicy::default()
        };
        assert!(plan(&[host("/x", &missing, Mode::Rw)], &policy, &ctx(&d, true)).is_ok());
        assert!(missing.is_dir());
    }

    #[test]
    fn escapes_and_relative_host_paths_are_refused() {
        let d = dirs();
        let p = VolumePolicy::default();
        assert!(matches!(
            refusal(&[host("/a/../../b", &d.host, Mode::Rw)], &p, &ctx(&d, true)),
            Refusal::DotDot(_)
        ));
        assert!(matches!(
            refusal(&[host("../up", &d.host, Mode::Rw)], &p, &ctx(&d, true)),
            Refusal::DotDot(_)
        ));
        assert!(matches!(
            refusal(
                &[host("/x", Path::new("rel/path"), Mode::Rw)],
                &p,
                &ctx(&d, true)
            ),
            Refusal::HostPathNotAbsolute(_)
        ));
        assert!(matches!(
            refusal(&[host("", &d.host, Mode::Rw)], &p, &ctx(&d, true)),
            Refusal::EmptyContainerPath
        ));
        assert!(matches!(
            refusal(
                &[sandbox("/x", SandboxOf::Own, "../../etc")],
                &p,
                &ctx(&d, true)
            ),
            Refusal::DotDot(_)
        ));
        std::os::unix::fs::symlink("/etc", d.sandbox.join("out")).unwrap();
        assert_eq!(
            refusal(&[sandbox("/x", SandboxOf::Own, "out")], &p, &ctx(&d, true)),
            Refusal::SandboxEscape("out".into())
        );
    }

    #[test]
    fn sandbox_paths_self_and_parent() {
        let d = dirs();
        let p = VolumePolicy::default();
        let mounts = plan(
            &[
                sandbox("/tmp", SandboxOf::Own, "tmp"),
                sandbox("shared", SandboxOf::Parent, "shared_volume"),
            ],
            &p,
            &ctx(&d, true),
        )
        .unwrap();
        assert_eq!(
            mounts[0].source,
            MountSource::Bind(d.sandbox.join("tmp").canonicalize().unwrap())
        );
        assert_eq!(mounts[0].destination, PathBuf::from("/tmp"));
        assert!(d.parent.join("shared_volume").is_dir());
        assert_eq!(
            mounts[1].destination,
            PathBuf::from("/mnt/mesos/sandbox/shared")
        );
        assert_eq!(
            refusal(&[sandbox("rel", SandboxOf::Own, "tmp")], &p, &ctx(&d, true)),
            Refusal::SelfRelative
        );
        assert_eq!(
            refusal(&[sandbox("/x", SandboxOf::Own, "/abs")], &p, &ctx(&d, true)),
            Refusal::SandboxPathAbsolute("/abs".into())
        );
        let orphan = VolumeContext {
            parent_sandbox: None,
            ..ctx(&d, true)
        };
        assert_eq!(
            refusal(&[sandbox("x", SandboxOf::Parent, "v")], &p, &orphan),
            Refusal::NoParent
        );
    }

    #[test]
    fn without_an_image_absolute_paths_must_exist_and_relative_ones_are_in_the_host_sandbox() {
        let d = dirs();
        let p = VolumePolicy::default();
        let missing = d.host.join("nope");
        assert_eq!(
            refusal(
                &[host(missing.to_str().unwrap(), &d.host, Mode::Rw)],
                &p,
                &ctx(&d, false)
            ),
            Refusal::NoMountPointOnHost(missing)
        );
        let mounts = plan(&[host("data", &d.host, Mode::Rw)], &p, &ctx(&d, false)).unwrap();
        assert_eq!(mounts[0].destination, d.sandbox.join("data"));
    }

    #[test]
    fn image_volumes_need_layers() {
        let d = dirs();
        let volume = Volume {
            container_path: "/opt/tools".into(),
            mode: Mode::Ro,
            source: VolumeSource::Image { layers: vec![] },
        };
        assert_eq!(
            refusal(&[volume], &VolumePolicy::default(), &ctx(&d, true)),
            Refusal::NoLayers
        );
    }
}
