//! A container's OCI bundle: its `config.json` (through `oci-spec`'s
//! runtime types) and the `/etc/hosts`, `/etc/hostname` and
//! `/etc/resolv.conf` files bound into it.
//!
//! A container with an image gets: pid, mount, ipc and uts namespaces
//! (and a network namespace only when the caller names one: the host's
//! network otherwise, Mesos's default); `/proc`, a tmpfs `/dev` (with the
//! runtime's standard devices), `/dev/pts`, `/dev/shm`, `/dev/mqueue`, a
//! read-only `/sys`; Docker's default capabilities, masked and read-only
//! `/proc` paths, and device rules, so a task is no more privileged than
//! under Docker; the sandbox at [`SANDBOX_MOUNT_POINT`]; the volumes.
//!
//! A container without an image shares the host's root file system (as
//! Mesos's `filesystem/linux` does for a task with volumes and no image):
//! a mount namespace of its own over the host's `/`, where only its
//! volumes are mounted; the host's pid, ipc, uts and network namespaces;
//! the caller's user and capabilities unchanged. Given a network
//! namespace (a CNI network), it joins it and gets a uts namespace with
//! its hostname and its own `/etc/hosts`, `/etc/hostname` and
//! `/etc/resolv.conf` bound over the host's, as Mesos's CNI isolator
//! does.

use std::collections::HashSet;
use std::path::{Path, PathBuf};

use oci_spec::runtime::{
    Capability, LinuxBuilder, LinuxCapabilitiesBuilder, LinuxCpuBuilder, LinuxDeviceCgroupBuilder,
    LinuxDeviceType, LinuxMemoryBuilder, LinuxNamespaceBuilder, LinuxNamespaceType,
    LinuxPidsBuilder, LinuxResourcesBuilder, Mount, MountBuilder, ProcessBuilder, RootBuilder,
    Spec, SpecBuilder, UserBuilder,
};

use super::command::ProcessPlan;
use super::user::ResolvedUser;
use super::{Limits, Network};
use crate::volumes::SANDBOX_MOUNT_POINT;

/// Everything `config.json` is made from.
pub(crate) struct BundleConfig<'a> {
    pub rootfs: &'a Path,
    pub has_image: bool,
    pub process: &'a ProcessPlan,
    pub user: &'a ResolvedUser,
    pub hostname: &'a str,
    pub network: &'a Network,
    pub cgroups_path: Option<&'a str>,
    pub limits: &'a Limits,
    pub sandbox: &'a Path,
    /// `/etc` files written by [`write_etc_files`].
    pub etc_dir: &'a Path,
    /// (source on the host, destination, read-only) per volume.
    pub volumes: &'a [(PathBuf, PathBuf, bool)],
}

/// Docker's default capabilities.
const DEFAULT_CAPABILITIES: [Capability; 14] = [
    Capability::Chown,
    Capability::DacOverride,
    Capability::Fsetid,
    Capability::Fowner,
    Capability::Mknod,
    Capability::NetRaw,
    Capability::Setgid,
    Capability::Setuid,
    Capability::Setfcap,
    Capability::Setpcap,
    Capability::NetBindService,
    Capability::SysChroot,
    Capability::Kill,
    Capability::AuditWrite,
];

const MASKED_PATHS: [&str; 11] = [
    "/proc/asound",
    "/proc/acpi",
    "/proc/kcore",
    "/proc/keys",
    "/proc/latency_stats",
    "/proc/timer_list",
    "/proc/timer_stats",
    "/proc/sched_debug",
    "/proc/scsi",
    "/sys/firmware",
    "/sys/devices/virtual/powercap",
];

const READONLY_PATHS: [&str; 5] = [
    "/proc/bus",
    "/proc/fs",
    "/proc/irq",
    "/proc/sys",
    "/proc/sysrq-trigger",
];

/// Character devices a container may use (null, zero, full, random,
/// urandom, tty, console, ptmx, pts, tun), as Docker's defaults.
const ALLOWED_CHAR_DEVICES: [(i64, Option<i64>); 10] = [
    (1, Some(3)),
    (1, Some(5)),
    (1, Some(7)),
    (1, Some(8)),
    (1, Some(9)),
    (5, Some(0)),
    (5, Some(1)),
    (5, Some(2)),
    (136, None),
    (10, Some(200)),
];

/// `config.json`'s content.
pub(crate) fn spec(c: &BundleConfig<'_>) -> Result<Spec, oci_spec::OciSpecError> {
    let env: Vec<String> = c
        .process
        .env
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect();
    let user = UserBuilder::default()
        .uid(c.user.uid)
        .gid(c.user.gid)
        .additional_gids(c.user.additional_gids.clone())
        .build()?;
    let mut process = ProcessBuilder::default()
        .terminal(false)
        .user(user)
        .args(c.process.args.clone())
        .env(env)
        .cwd(PathBuf::from(&c.process.cwd));
    let mut namespaces = vec![LinuxNamespaceBuilder::default()
        .typ(LinuxNamespaceType::Mount)
        .build()?];
    let mut mounts: Vec<Mount> = Vec::new();
    let mut linux = LinuxBuilder::default();
    if c.has_image {
        let caps: HashSet<Capability> = DEFAULT_CAPABILITIES.into_iter().collect();
        process = process
            .capabilities(
                LinuxCapabilitiesBuilder::default()
                    .bounding(caps.clone())
                    .effective(caps.clone())
                    .permitted(caps)
                    .inheritable(HashSet::new())
                    .ambient(HashSet::new())
                    .build()?,
            )
            .no_new_privileges(false);
        for typ in [
            LinuxNamespaceType::Pid,
            LinuxNamespaceType::Ipc,
            LinuxNamespaceType::Uts,
        ] {
            namespaces.push(LinuxNamespaceBuilder::default().typ(typ).build()?);
        }
        mounts.extend(system_mounts()?);
        mounts.push(bind(c.sandbox, Path::new(SANDBOX_MOUNT_POINT), false)?);
        mounts.extend(etc_mounts(c.etc_dir)?);
        linux = linux
            .masked_paths(
                MASKED_PATHS
                    .iter()
                    .map(|s| s.to_string())
                    .collect::<Vec<_>>(),
            )
            .readonly_paths(
                READONLY_PATHS
                    .iter()
                    .map(|s| s.to_string())
                    .collect::<Vec<_>>(),
            );
    }
    let in_namespace = matches!(c.network, Network::Namespace { .. });
    if let Network::Namespace { path, .. } = c.network {
        namespaces.push(
            LinuxNamespaceBuilder::default()
                .typ(LinuxNamespaceType::Network)
                .path(path.clone())
                .build()?,
        );
        if !c.has_image {
            // A network identity of its own: its hostname too.
            namespaces.push(
                LinuxNamespaceBuilder::default()
                    .typ(LinuxNamespaceType::Uts)
                    .build()?,
            );
        }
    }
    if !c.has_image {
        // The host's root, entry by entry, bound in the container's own
        // mount namespace (so nothing is mounted on the host) into an
        // empty root directory: neither pivot_root nor crun's bind mounts
        // take `/` itself. Top-level symlinks are copied by the caller.
        for entry in std::fs::read_dir("/").into_iter().flatten().flatten() {
            let is_link = entry.file_type().map(|t| t.is_symlink()).unwrap_or(true);
            if !is_link {
                let path = Path::new("/").join(entry.file_name());
                mounts.push(bind(&path, &path, false)?);
            }
        }
        if in_namespace {
            mounts.extend(etc_mounts(c.etc_dir)?);
        }
    }
    for (source, destination, read_only) in c.volumes {
        mounts.push(bind(source, destination, *read_only)?);
    }
    linux = linux.namespaces(namespaces).resources(resources(c)?);
    if let Some(path) = c.cgroups_path {
        linux = linux.cgroups_path(PathBuf::from(path));
    }
    // oci-spec's builders start from its own defaults (youki's: a
    // hostname, capabilities, an open-files limit of 1024, masked paths):
    // what this runtime does not set is cleared, so nothing is imposed
    // that this module does not say.
    let mut process = process.build()?;
    process.set_rlimits(None);
    let mut linux = linux.build()?;
    if !c.has_image {
        process.set_capabilities(None);
        process.set_no_new_privileges(None);
        linux.set_masked_paths(None);
        linux.set_readonly_paths(None);
    }
    let mut spec = SpecBuilder::default()
        .version("1.0.2")
        .root(
            RootBuilder::default()
                .path(c.rootfs)
                .readonly(false)
                .build()?,
        )
        .process(process)
        .mounts(mounts)
        .linux(linux)
        .build()?;
    spec.set_annotations(None);
    spec.set_hostname((c.has_image || in_namespace).then(|| c.hostname.to_string()));
    Ok(spec)
}

fn resources(
    c: &BundleConfig<'_>,
) -> Result<oci_spec::runtime::LinuxResources, oci_spec::OciSpecError> {
    let mut r = LinuxResourcesBuilder::default();
    if c.has_image {
        let mut devices = vec![LinuxDeviceCgroupBuilder::default()
            .allow(false)
            .access("rwm")
            .build()?];
        for (major, minor) in ALLOWED_CHAR_DEVICES {
            let mut d = LinuxDeviceCgroupBuilder::default()
                .allow(true)
                .typ(LinuxDeviceType::C)
                .major(major)
                .access("rwm");
            if let Some(minor) = minor {
                d = d.minor(minor);
            }
            devices.push(d.build()?);
        }
        r = r.devices(devices);
    }
    let l = c.limits;
    if let Some(bytes) = l.memory_bytes {
        r = r.memory(LinuxMemoryBuilder::default().limit(bytes).build()?);
    }
    if l.cpu_shares.is_some() || l.cpu_quota_us.is_some() {
        let mut cpu = LinuxCpuBuilder::default();
        if let Some(shares) = l.cpu_shares {
            cpu = cpu.shares(shares);
        }
        if let Some(quota) = l.cpu_quota_us {
            cpu = cpu.quota(quota).period(l.cpu_period_us.unwrap_or(100_000));
        }
        r = r.cpu(cpu.build()?);
    }
    if let Some(max) = l.pids_max {
        r = r.pids(LinuxPidsBuilder::default().limit(max).build()?);
    }
    r.build()
}

fn system_mounts() -> Result<Vec<Mount>, oci_spec::OciSpecError> {
    let m = |dest: &str, typ: &str, source: &str, options: &[&str]| {
        MountBuilder::default()
            .destination(dest)
            .typ(typ)
            .source(source)
            .options(options.iter().map(|s| s.to_string()).collect::<Vec<_>>())
            .build()
    };
    Ok(vec![
        m("/proc", "proc", "proc", &["nosuid", "noexec", "nodev"])?,
        m(
            "/dev",
            "tmpfs",
            "tmpfs",
            &["nosuid", "strictatime", "mode=755", "size=65536k"],
        )?,
        m(
            "/dev/pts",
            "devpts",
            "devpts",
            &[
                "nosuid",
                "noexec",
                "newinstance",
                "ptmxmode=0666",
                "mode=0620",
                "gid=5",
            ],
        )?,
        m(
            "/dev/shm",
            "tmpfs",
            "shm",
            &["nosuid", "noexec", "nodev", "mode=1777", "size=65536k"],
        )?,
        m(
            "/dev/mqueue",
            "mqueue",
            "mqueue",
            &["nosuid", "noexec", "nodev"],
        )?,
        m(
            "/sys",
            "sysfs",
            "sysfs",
            &["nosuid", "noexec", "nodev", "ro"],
        )?,
    ])
}

/// `hosts`, `hostname` and `resolv.conf` of `etc_dir` over the
/// container's.
fn etc_mounts(etc_dir: &Path) -> Result<Vec<Mount>, oci_spec::OciSpecError> {
    ["hosts", "hostname", "resolv.conf"]
        .into_iter()
        .map(|name| bind(&etc_dir.join(name), &Path::new("/etc").join(name), false))
        .collect()
}

fn bind(
    source: &Path,
    destination: &Path,
    read_only: bool,
) -> Result<Mount, oci_spec::OciSpecError> {
    let mut options = vec!["rbind".to_string(), "rprivate".to_string()];
    if read_only {
        options.push("ro".into());
    }
    MountBuilder::default()
        .destination(destination)
        .typ("bind")
        .source(source)
        .options(options)
        .build()
}

/// Writes `hosts`, `hostname` and `resolv.conf` into `dir`. On the host's
/// network, `hosts` and `resolv.conf` are copies of the host's (with the
/// container's hostname added to `hosts`); in a network namespace given
/// without files of its own, `hosts` names only localhost and the
/// hostname, and `resolv.conf` is the host's (a CNI network's attachment
/// gives its own: [`super::Network::Namespace`]'s `etc_dir`).
pub(crate) fn write_etc_files(
    dir: &Path,
    hostname: &str,
    network: &Network,
) -> std::io::Result<()> {
    std::fs::create_dir_all(dir)?;
    let mut hosts = match network {
        Network::Host => std::fs::read_to_string("/etc/hosts").unwrap_or_default(),
        Network::Namespace { .. } => String::new(),
    };
    if !hosts.is_empty() && !hosts.ends_with('\n') {
        hosts.push('\n');
    }
    if !hosts
        .lines()
        .any(|l| l.split_whitespace().skip(1).any(|n| n == "localhost"))
    {
        hosts.push_str("127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n");
    }
    if !hosts
        .lines()
        .any(|l| !l.starts_with('#') && l.split_whitespace().skip(1).any(|n| n == hostname))
    {
        hosts.push_str(&format!("127.0.1.1\t{hostname}\n"));
    }
    std::fs::write(dir.join("hosts"), hosts)?;
    std::fs::write(dir.join("hostname"), format!("{hostname}\n"))?;
    let resolv = std::fs::read("/etc/resolv.conf").unwrap_or_default();
    std::fs::write(dir.join("resolv.conf"), resolv)
}
