//! Container networks through CNI (Mesos's `network/cni` isolator): a
//! container on a CNI network gets a network namespace of its own, the
//! network's plugins attach it (an interface, addresses, routes, port
//! mappings), and the runtime runs it in that namespace with the
//! `/etc/hosts`, `/etc/hostname` and `/etc/resolv.conf` written here.
//!
//! The plugins are the operator's (Debian's `containernetworking-plugins`
//! put them in `/usr/lib/cni`); the networks are the `.conf`/`.conflist`
//! files of a configuration directory (Mesos's `--network_cni_config_dir`
//! and `--network_cni_plugins_dir`), read and checked once by
//! [`Networks::new`] ([`config`]). This module is the CNI *runtime* side:
//! it calls the plugins as the CNI specification 1.0.0 says ([`plugin`]):
//!
//! - [`Networks::attach`]: a new namespace (`netns.rs`) under the module's
//!   root; `lo` brought up by the `loopback` plugin; then `ADD` through
//!   the network's plugins in order, each given the network's `name` and
//!   `cniVersion`, the previous plugin's result as `prevResult`, and in
//!   `runtimeConfig` the port mappings if it declares the `portMappings`
//!   capability (the `portmap` plugin). The last result gives the
//!   container's addresses. On any failure everything done is undone.
//! - [`Networks::detach`]: `DEL` through the plugins in reverse order,
//!   with the configuration used at `ADD` and (from CNI 0.4.0) its result
//!   as `prevResult`; the namespace unmounted and its file removed.
//!   Detaching what is not attached is not an error.
//! - [`Networks::check`]: `CHECK` through the plugins (CNI 0.4.0 and
//!   later, unless the network says `disableCheck`).
//! - [`Networks::recover`]: after an agent restart, from the checkpoints
//!   each attachment writes before it touches anything (the network's
//!   configuration as used, the port mappings, the result once there is
//!   one): attachments of live containers are kept, the others (orphans,
//!   and attachments a crash left half made) are detached.
//!
//! A container asks for a network by name; Docker's `BRIDGE` mode is the
//! network the operator named as the default bridge
//! ([`NetworksConfig::default_bridge`]), `HOST` is no namespace at all
//! ([`NetworkChoice`]). One network per container, on `eth0`.
//!
//! On the root directory: `netns/<container>` holds the namespaces,
//! `containers/<container>/` a checkpoint and the `/etc` files. It may be
//! on a file system that a reboot empties (under `/run`) or not: after a
//! reboot the namespaces are gone, and [`Networks::recover`] still runs
//! `DEL` (with no namespace, as CNI allows) so that the address manager
//! frees their addresses.
//!
//! # A bridge network, as an operator writes it
//!
//! ```json
//! {"cniVersion": "1.0.0", "name": "agora-bridge", "plugins": [
//!   {"type": "bridge", "bridge": "agora0", "isGateway": true, "ipMasq": true,
//!    "ipam": {"type": "host-local", "ranges": [[{"subnet": "10.88.0.0/16"}]],
//!             "routes": [{"dst": "0.0.0.0/0"}]}},
//!   {"type": "portmap", "capabilities": {"portMappings": true}}]}
//! ```
//!
//! What the plugins do to the host, which an operator should know:
//! `bridge` with `isGateway` turns on `net.ipv4.ip_forward` (and, for an
//! IPv6 range, IPv6 forwarding on every interface, after which the host
//! ignores router advertisements where `accept_ra` is 1); `ipMasq`
//! adds a masquerading rule for the subnet (needed for containers to reach
//! beyond the host). `portmap` forwards a host port with iptables DNAT
//! (chains `CNI-HOSTPORT-*`, shared by every CNI user of the host, and a
//! `CNI-DN-*` chain per container, removed by its `DEL`): the port is
//! reached at every address of the host, from other hosts and from the
//! host itself, `127.0.0.1` included (`portmap` sets `route_localnet` on
//! the bridge and masquerades such connections). A container's own
//! address is reached from the host directly. Debian 12's `portmap`
//! (1.1.1) fails `CHECK` for an IPv4-only container that has port
//! mappings (containernetworking/plugins#819): set `disableCheck` on such
//! a network if anything calls [`Networks::check`].
//!
//! Timings on a 2-core test machine (`cargo bench -p agora-containerizer
//! --bench cni_attach`): attaching to the network above (with `lo`, one
//! port mapping) takes 85 ms on average, detaching 155 ms; 16 at once
//! attach at about 18 a second (the plugins take the address store's and
//! iptables' locks in turn).

pub mod config;
mod etc;
mod netns;
pub mod plugin;

use std::collections::HashMap;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

pub use config::{ConfigError, NetworkConf};
pub use plugin::{CniResult, Command, Dns, Interface, IpConfig, PluginError};

use crate::runtime;

/// The interface a container gets on its network.
pub const CONTAINER_IFNAME: &str = "eth0";

/// How long one plugin call may take by default.
pub const DEFAULT_PLUGIN_TIMEOUT: Duration = Duration::from_secs(60);

/// Where Debian's `containernetworking-plugins` puts the plugins.
pub const DEFAULT_PLUGINS_DIR: &str = "/usr/lib/cni";

/// The plugin that brings up a namespace's `lo`.
const LOOPBACK_PLUGIN: &str = "loopback";

/// The CNI networks' settings (the agent's flags).
#[derive(Debug, Clone)]
pub struct NetworksConfig {
    /// `--network-cni-config-dir`: the networks' `.conf`/`.conflist`
    /// files.
    pub config_dir: PathBuf,
    /// `--network-cni-plugins-dir`: the plugins' programs.
    pub plugins_dir: PathBuf,
    /// This module's own directory: namespaces and checkpoints.
    pub root: PathBuf,
    /// The network Docker's `BRIDGE` mode means (`None`: `BRIDGE` is
    /// refused).
    pub default_bridge: Option<String>,
    /// How long one plugin call may take before it is killed.
    pub plugin_timeout: Duration,
}

/// Which network a container asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NetworkChoice {
    /// The host's (no namespace): Mesos's default, Docker's `HOST`.
    Host,
    /// Docker's `BRIDGE`: the configured default bridge network.
    Bridge,
    /// A CNI network by name (`NetworkInfo.name`, Docker's `USER`).
    Named(String),
}

/// A transport protocol of a port mapping.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Protocol {
    /// TCP (Mesos's default).
    Tcp,
    /// UDP.
    Udp,
}

/// A host port forwarded to a container port (Mesos's
/// `NetworkInfo.PortMapping`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct PortMapping {
    /// The port on the host (one of the task's offered `ports`: the
    /// caller checks that).
    pub host_port: u16,
    /// The port in the container.
    pub container_port: u16,
    /// TCP or UDP.
    pub protocol: Protocol,
}

/// What to attach.
#[derive(Debug, Clone)]
pub struct AttachRequest {
    /// The container (its id as the runtime knows it): a letter or
    /// digit, then letters, digits, `_`, `.`, `-`.
    pub container_id: String,
    /// The network's name.
    pub network: String,
    /// The container's hostname, mapped to its addresses in `/etc/hosts`
    /// and written to `/etc/hostname`.
    pub hostname: String,
    /// Ports forwarded from the host (the network needs a plugin with the
    /// `portMappings` capability).
    pub port_mappings: Vec<PortMapping>,
    /// Mesos's `NetworkInfo` of the container (its JSON), given to the
    /// plugins as `args."org.apache.mesos".network_info`, as Mesos does
    /// (plugins read its labels there).
    pub network_info: Option<Value>,
}

/// A container attached to a network.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Attachment {
    /// The container.
    pub container_id: String,
    /// The network.
    pub network: String,
    /// The container's network namespace (give it to the runtime).
    pub netns: PathBuf,
    /// The container's interface on the network.
    pub ifname: String,
    /// The hostname written into its `/etc` files.
    pub hostname: String,
    /// Its addresses on the network (IPv4 and IPv6), for
    /// `TaskStatus.container_status.network_infos[].ip_addresses`.
    pub ip_addresses: Vec<IpAddr>,
    /// Ports forwarded from the host.
    pub port_mappings: Vec<PortMapping>,
    /// Where its `hosts`, `hostname` and `resolv.conf` are.
    pub etc_dir: PathBuf,
    /// The plugins' last result (interfaces, addresses, routes, DNS).
    pub result: CniResult,
}

/// What [`Networks::recover`] found.
#[derive(Debug, Default)]
pub struct Recovered {
    /// Attachments of live containers, kept.
    pub kept: Vec<Attachment>,
    /// Containers whose attachment was undone (orphans, half-made ones).
    pub detached: Vec<String>,
    /// Containers whose attachment could not be undone, and why (their
    /// checkpoint stays: a later [`Networks::detach`] or recovery tries
    /// again).
    pub failed: Vec<(String, NetworkError)>,
}

/// What went wrong.
#[derive(Debug, thiserror::Error)]
pub enum NetworkError {
    /// A network configuration was refused.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// A plugin a network uses does not speak the network's CNI version.
    #[error(
        "network configuration '{file}': plugin '{plugin}' does not speak cniVersion \
         '{version}' (it speaks {supported})"
    )]
    PluginVersion {
        /// The network's file.
        file: PathBuf,
        /// The plugin.
        plugin: String,
        /// The network's version.
        version: String,
        /// What the plugin speaks.
        supported: String,
    },
    /// No such network.
    #[error("no CNI network named '{name}' (configured: {known})")]
    UnknownNetwork {
        /// The name asked for.
        name: String,
        /// The configured ones.
        known: String,
    },
    /// The default bridge names no configured network.
    #[error("the default bridge network '{0}' is not configured")]
    UnknownDefaultBridge(String),
    /// `BRIDGE` asked for, with no default bridge network configured.
    #[error("network mode BRIDGE needs a default bridge network, and none is configured")]
    NoDefaultBridge,
    /// A container id CNI cannot take.
    #[error(
        "container id '{0}' must be 1 to 128 letters, digits, '_', '.' or '-', starting with \
         a letter or digit"
    )]
    InvalidContainerId(String),
    /// The container is attached already.
    #[error("container '{0}' is attached to a network already")]
    AlreadyAttached(String),
    /// The container is not attached.
    #[error("container '{0}' is not attached to a network")]
    NotAttached(String),
    /// Another attach or detach of the container is under way.
    #[error("container '{0}' is being attached or detached")]
    Busy(String),
    /// Port mappings asked of a network that cannot make them.
    #[error(
        "network '{network}' has no plugin with the portMappings capability (such as \
         portmap): its containers cannot have port mappings"
    )]
    PortMappingsUnsupported {
        /// The network.
        network: String,
    },
    /// A port mapping that cannot be made.
    #[error("port mapping {0}")]
    InvalidPortMapping(String),
    /// A hostname that cannot be written.
    #[error("hostname '{0}' must be 1 to 253 letters, digits, '-', '_' or '.'")]
    InvalidHostname(String),
    /// A plugin failed.
    #[error("CNI plugin '{plugin}' {command} of container '{container_id}' on network '{network}' failed: {error}")]
    Plugin {
        /// The plugin.
        plugin: String,
        /// The operation.
        command: Command,
        /// The container.
        container_id: String,
        /// The network.
        network: String,
        /// What happened.
        error: Box<PluginError>,
    },
    /// A network namespace could not be made or removed.
    #[error("network namespace '{path}': {error}")]
    Namespace {
        /// Its file.
        path: PathBuf,
        /// The error.
        error: std::io::Error,
    },
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
    /// Detaching failed at one or more plugins (the namespace is removed
    /// all the same; the checkpoint stays for another try).
    #[error("detaching container '{container_id}' from network '{network}': {errors}")]
    Detach {
        /// The container.
        container_id: String,
        /// The network.
        network: String,
        /// Each plugin's failure.
        errors: String,
    },
}

/// The CNI networks and the containers attached to them.
#[derive(Debug)]
pub struct Networks {
    config: NetworksConfig,
    networks: std::collections::BTreeMap<String, NetworkConf>,
    netns_dir: PathBuf,
    containers_dir: PathBuf,
    slots: Mutex<HashMap<String, Slot>>,
}

/// Why an attachment is undone.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Undo {
    /// Asked for: a failed `DEL` keeps the checkpoint for another try.
    Detach,
    /// After a failed `ADD`: everything goes whatever `DEL` says.
    Rollback,
}

#[derive(Debug)]
enum Slot {
    Busy,
    Attached(Box<Attachment>),
}

/// What is checkpointed per attachment: enough to undo it without the
/// configuration files (which may have changed since).
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Checkpoint {
    container_id: String,
    network: String,
    cni_version: String,
    /// The plugins' configuration objects as used at `ADD`.
    plugins: Vec<Value>,
    ifname: String,
    netns: PathBuf,
    hostname: String,
    port_mappings: Vec<PortMapping>,
    #[serde(default)]
    network_info: Option<Value>,
    /// The last plugin's result, once `ADD` went through all of them.
    #[serde(default)]
    result: Option<Value>,
}

/// A container marked busy while it is attached or detached; dropped
/// without [`Reservation::complete`], it frees the mark.
struct Reservation<'a> {
    networks: &'a Networks,
    container_id: String,
    armed: bool,
}

// === impl NetworksConfig ===

impl NetworksConfig {
    /// Networks from `config_dir`, plugins from [`DEFAULT_PLUGINS_DIR`],
    /// state under `root`, no default bridge.
    pub fn new(config_dir: impl Into<PathBuf>, root: impl Into<PathBuf>) -> Self {
        NetworksConfig {
            config_dir: config_dir.into(),
            plugins_dir: PathBuf::from(DEFAULT_PLUGINS_DIR),
            root: root.into(),
            default_bridge: None,
            plugin_timeout: DEFAULT_PLUGIN_TIMEOUT,
        }
    }
}

// === impl Protocol ===

impl std::str::FromStr for Protocol {
    type Err = NetworkError;

    /// Mesos's `PortMapping.protocol` (`tcp` when empty, any case).
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.to_ascii_lowercase().as_str() {
            "" | "tcp" => Ok(Protocol::Tcp),
            "udp" => Ok(Protocol::Udp),
            _ => Err(NetworkError::InvalidPortMapping(format!(
                "protocol '{s}': only tcp and udp are forwarded"
            ))),
        }
    }
}

impl std::fmt::Display for Protocol {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Protocol::Tcp => "tcp",
            Protocol::Udp => "udp",
        })
    }
}

// === impl Attachment ===

impl Attachment {
    /// The network as the runtime takes it: the namespace, and the `/etc`
    /// files to bind into the container.
    pub fn runtime_network(&self) -> runtime::Network {
        runtime::Network::Namespace {
            path: self.netns.clone(),
            etc_dir: Some(self.etc_dir.clone()),
        }
    }

    /// The host-side interfaces the plugins made or used (e.g. the
    /// bridge and the container's veth peer).
    pub fn host_interfaces(&self) -> Vec<&str> {
        self.result
            .interfaces
            .iter()
            .filter(|i| i.sandbox.is_empty())
            .map(|i| i.name.as_str())
            .collect()
    }
}

// === impl Networks ===

impl Networks {
    /// Reads and checks the network configurations (each plugin a program
    /// of the plugins directory that speaks its network's CNI version),
    /// and prepares the root directory. Attachments left by a previous
    /// run are not touched until [`Networks::recover`].
    pub async fn new(config: NetworksConfig) -> Result<Networks, NetworkError> {
        let networks = config::load_dir(&config.config_dir, &config.plugins_dir)?;
        if let Some(bridge) = &config.default_bridge {
            if !networks.contains_key(bridge) {
                return Err(NetworkError::UnknownDefaultBridge(bridge.clone()));
            }
        }
        let mut versions: HashMap<String, Vec<String>> = HashMap::new();
        for conf in networks.values() {
            let mut programs = conf.programs();
            // Every attachment brings `lo` up with it, in the network's
            // version.
            programs.push(LOOPBACK_PLUGIN.into());
            for program in &programs {
                if !versions.contains_key(program) {
                    let supported = plugin_versions(&config, program, &conf.file).await?;
                    versions.insert(program.clone(), supported);
                }
                let supported = &versions[program];
                if !supported.iter().any(|v| v == &conf.cni_version) {
                    return Err(NetworkError::PluginVersion {
                        file: conf.file.clone(),
                        plugin: program.clone(),
                        version: conf.cni_version.clone(),
                        supported: supported.join(", "),
                    });
                }
            }
        }
        let netns_dir = config.root.join("netns");
        let netns_dir = netns::prepare_dir(&netns_dir).map_err(|error| NetworkError::Io {
            what: "creating",
            path: netns_dir.clone(),
            error,
        })?;
        let containers_dir = config.root.join("containers");
        std::fs::create_dir_all(&containers_dir).map_err(|error| NetworkError::Io {
            what: "creating",
            path: containers_dir.clone(),
            error,
        })?;
        Ok(Networks {
            config,
            networks,
            netns_dir,
            containers_dir,
            slots: Mutex::new(HashMap::new()),
        })
    }

    /// The configured networks, by name.
    pub fn networks(&self) -> impl Iterator<Item = &NetworkConf> {
        self.networks.values()
    }

    /// The directory holding the namespaces.
    pub fn netns_dir(&self) -> &Path {
        &self.netns_dir
    }

    /// The network a choice means: `None` for the host's.
    pub fn resolve(&self, choice: &NetworkChoice) -> Result<Option<&NetworkConf>, NetworkError> {
        let name = match choice {
            NetworkChoice::Host => return Ok(None),
            NetworkChoice::Bridge => self
                .config
                .default_bridge
                .as_deref()
                .ok_or(NetworkError::NoDefaultBridge)?,
            NetworkChoice::Named(name) => name,
        };
        self.network(name).map(Some)
    }

    /// Checks a request without attaching anything: the container id,
    /// the network, the hostname and the port mappings.
    pub fn validate(&self, request: &AttachRequest) -> Result<(), NetworkError> {
        check_container_id(&request.container_id)?;
        let conf = self.network(&request.network)?;
        check_hostname(&request.hostname)?;
        if !request.port_mappings.is_empty() && !conf.has_capability("portMappings") {
            return Err(NetworkError::PortMappingsUnsupported {
                network: conf.name.clone(),
            });
        }
        let mut seen = Vec::new();
        for m in &request.port_mappings {
            if m.host_port == 0 || m.container_port == 0 {
                return Err(NetworkError::InvalidPortMapping(format!(
                    "{}:{}/{}: ports must not be 0",
                    m.host_port, m.container_port, m.protocol
                )));
            }
            if seen.contains(&(m.host_port, m.protocol)) {
                return Err(NetworkError::InvalidPortMapping(format!(
                    "host port {}/{} is mapped twice",
                    m.host_port, m.protocol
                )));
            }
            seen.push((m.host_port, m.protocol));
        }
        Ok(())
    }

    /// Attaches a container to a network: a new namespace, `lo` up, the
    /// network's plugins' `ADD`, the `/etc` files. On failure nothing is
    /// left (plugins' `DEL` run, namespace and files removed).
    pub async fn attach(&self, request: AttachRequest) -> Result<Attachment, NetworkError> {
        self.validate(&request)?;
        let id = request.container_id.clone();
        let reservation = self.reserve(&id, false)?;
        let dir = self.containers_dir.join(&id);
        let netns_path = self.netns_dir.join(&id);
        if dir.exists() || netns_path.exists() {
            // Left by an earlier run: recover() or detach() decides.
            return Err(NetworkError::AlreadyAttached(id));
        }
        match self.attach_in(&request, &dir, &netns_path).await {
            Ok(attachment) => {
                reservation.complete(attachment.clone());
                Ok(attachment)
            }
            Err(e) => {
                if let Err(undo) = self.undo(&id, Undo::Rollback).await {
                    tracing::warn!(container_id = %id, error = %undo, "undoing a failed attach");
                }
                Err(e)
            }
        }
    }

    async fn attach_in(
        &self,
        request: &AttachRequest,
        dir: &Path,
        netns_path: &Path,
    ) -> Result<Attachment, NetworkError> {
        let conf = self.network(&request.network)?;
        create_dir(dir)?;
        let mut checkpoint = Checkpoint {
            container_id: request.container_id.clone(),
            network: conf.name.clone(),
            cni_version: conf.cni_version.clone(),
            plugins: conf.plugins.clone(),
            ifname: CONTAINER_IFNAME.into(),
            netns: netns_path.to_path_buf(),
            hostname: request.hostname.clone(),
            port_mappings: request.port_mappings.clone(),
            network_info: request.network_info.clone(),
            result: None,
        };
        self.write_checkpoint(&checkpoint)?;
        netns::create(netns_path)
            .await
            .map_err(|error| NetworkError::Namespace {
                path: netns_path.to_path_buf(),
                error,
            })?;
        let netns_text = netns_path.to_string_lossy().into_owned();
        let loopback = json!({
            "cniVersion": conf.cni_version,
            "name": "loopback",
            "type": LOOPBACK_PLUGIN,
        });
        self.call(
            &checkpoint,
            LOOPBACK_PLUGIN,
            &loopback,
            Command::Add,
            &netns_text,
            "lo",
        )
        .await?;
        for plugin in &conf.plugins {
            let ty = plugin_type(plugin);
            let input = plugin_input(&checkpoint, plugin, checkpoint.result.as_ref());
            let out = self
                .call(
                    &checkpoint,
                    ty,
                    &input,
                    Command::Add,
                    &netns_text,
                    &checkpoint.ifname,
                )
                .await?;
            let fail = |e| plugin_error(&checkpoint, ty, Command::Add, e);
            plugin::parse_result(&out).map_err(fail)?;
            let value: Value = serde_json::from_slice(&out)
                .map_err(|e| fail(PluginError::BadOutput(e.to_string())))?;
            checkpoint.result = Some(value);
            // After each plugin, so that a crash mid-way leaves the
            // result to undo with.
            self.write_checkpoint(&checkpoint)?;
        }
        let result: CniResult = checkpoint
            .result
            .clone()
            .and_then(|r| serde_json::from_value(r).ok())
            .unwrap_or_default();
        let ip_addresses = result.container_ips(&netns_text);
        let etc_dir = dir.join("etc");
        etc::write(&etc_dir, &request.hostname, &ip_addresses, &result.dns).map_err(|error| {
            NetworkError::Io {
                what: "writing /etc files into",
                path: etc_dir.clone(),
                error,
            }
        })?;
        Ok(attachment_of(&checkpoint, &etc_dir, result))
    }

    /// Detaches a container: the plugins' `DEL` in reverse order, the
    /// namespace unmounted and removed, the checkpoint and `/etc` files
    /// removed. Detaching a container that is not attached does nothing.
    pub async fn detach(&self, container_id: &str) -> Result<(), NetworkError> {
        check_container_id(container_id)?;
        let reservation = self.reserve(container_id, true)?;
        let outcome = self.undo(container_id, Undo::Detach).await;
        if outcome.is_err() {
            // Still known (its checkpoint stays) for another try.
            if let Some(Ok(c)) = self.read_checkpoint(container_id) {
                if c.result.is_some() {
                    reservation.complete(self.attachment_from(&c));
                }
            }
        }
        outcome
    }

    /// Runs the network's `CHECK` for a container (nothing for CNI
    /// versions before 0.4.0 or a network with `disableCheck`).
    pub async fn check(&self, container_id: &str) -> Result<(), NetworkError> {
        check_container_id(container_id)?;
        let checkpoint = match self.read_checkpoint(container_id) {
            Some(Ok(c)) if c.result.is_some() => c,
            Some(Err(e)) => return Err(e),
            _ => return Err(NetworkError::NotAttached(container_id.into())),
        };
        let disabled = self
            .networks
            .get(&checkpoint.network)
            .is_some_and(|n| n.disable_check);
        if disabled || !config::at_least_0_4(&checkpoint.cni_version) {
            return Ok(());
        }
        let netns_text = checkpoint.netns.to_string_lossy().into_owned();
        for plugin in &checkpoint.plugins {
            let input = plugin_input(&checkpoint, plugin, checkpoint.result.as_ref());
            self.call(
                &checkpoint,
                plugin_type(plugin),
                &input,
                Command::Check,
                &netns_text,
                &checkpoint.ifname,
            )
            .await?;
        }
        Ok(())
    }

    /// The containers attached now.
    pub fn list(&self) -> Vec<Attachment> {
        let slots = self.slots.lock().unwrap_or_else(|e| e.into_inner());
        let mut list: Vec<Attachment> = slots
            .values()
            .filter_map(|s| match s {
                Slot::Attached(a) => Some((**a).clone()),
                Slot::Busy => None,
            })
            .collect();
        list.sort_by(|a, b| a.container_id.cmp(&b.container_id));
        list
    }

    /// After a restart: keeps the attachments of the containers `live`
    /// says are alive, detaches the others (and attachments a crash left
    /// half made), and removes namespaces no checkpoint accounts for.
    pub async fn recover(&self, live: &dyn Fn(&str) -> bool) -> Result<Recovered, NetworkError> {
        let mut recovered = Recovered::default();
        let entries = read_dir_names(&self.containers_dir)?;
        for id in &entries {
            if check_container_id(id).is_err() {
                tracing::warn!(path = %self.containers_dir.join(id).display(), "not a container's directory; left alone");
                continue;
            }
            match self.read_checkpoint(id) {
                Some(Ok(c)) if c.result.is_some() && live(id) => {
                    if !netns::is_namespace(&c.netns) {
                        tracing::warn!(container_id = %id, netns = %c.netns.display(), "a live container's network namespace is no longer mounted");
                    }
                    let a = self.attachment_from(&c);
                    self.slots
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .insert(id.clone(), Slot::Attached(Box::new(a.clone())));
                    recovered.kept.push(a);
                }
                _ => match self.detach(id).await {
                    Ok(()) => recovered.detached.push(id.clone()),
                    Err(e) => recovered.failed.push((id.clone(), e)),
                },
            }
        }
        for name in read_dir_names(&self.netns_dir)? {
            if !entries.contains(&name) {
                let path = self.netns_dir.join(&name);
                tracing::info!(netns = %path.display(), "removing a network namespace no checkpoint accounts for");
                netns::remove(&path).map_err(|error| NetworkError::Namespace { path, error })?;
            }
        }
        Ok(recovered)
    }

    fn network(&self, name: &str) -> Result<&NetworkConf, NetworkError> {
        self.networks
            .get(name)
            .ok_or_else(|| NetworkError::UnknownNetwork {
                name: name.into(),
                known: if self.networks.is_empty() {
                    "none".into()
                } else {
                    self.networks.keys().cloned().collect::<Vec<_>>().join(", ")
                },
            })
    }

    /// Marks `id` busy until the reservation is completed or dropped;
    /// refuses it when busy already, or attached unless `attached_ok`.
    fn reserve(&self, id: &str, attached_ok: bool) -> Result<Reservation<'_>, NetworkError> {
        let mut slots = self.slots.lock().unwrap_or_else(|e| e.into_inner());
        match slots.get(id) {
            Some(Slot::Busy) => return Err(NetworkError::Busy(id.into())),
            Some(Slot::Attached(_)) if !attached_ok => {
                return Err(NetworkError::AlreadyAttached(id.into()))
            }
            _ => {}
        }
        slots.insert(id.into(), Slot::Busy);
        Ok(Reservation {
            networks: self,
            container_id: id.into(),
            armed: true,
        })
    }

    /// Undoes whatever the checkpoint of `id` says was done.
    async fn undo(&self, id: &str, why: Undo) -> Result<(), NetworkError> {
        let dir = self.containers_dir.join(id);
        let netns_path = self.netns_dir.join(id);
        let checkpoint = match self.read_checkpoint(id) {
            None => {
                remove_namespace(&netns_path)?;
                return remove_dir(&dir);
            }
            Some(Err(e)) => {
                // Without the configuration the plugins cannot be told;
                // what is ours goes.
                tracing::error!(container_id = %id, error = %e, "unreadable network checkpoint: its namespace and files are removed without the plugins' DEL");
                remove_namespace(&netns_path)?;
                return remove_dir(&dir);
            }
            Some(Ok(c)) => c,
        };
        let netns_text = if netns::is_namespace(&checkpoint.netns) {
            checkpoint.netns.to_string_lossy().into_owned()
        } else {
            // Gone (a reboot, a half-made attachment): CNI's DEL takes no
            // namespace then, and still frees what the plugins hold.
            String::new()
        };
        let prev = if config::at_least_0_4(&checkpoint.cni_version) {
            checkpoint.result.as_ref()
        } else {
            None
        };
        let mut errors = Vec::new();
        for plugin in checkpoint.plugins.iter().rev() {
            let input = plugin_input(&checkpoint, plugin, prev);
            if let Err(e) = self
                .call(
                    &checkpoint,
                    plugin_type(plugin),
                    &input,
                    Command::Del,
                    &netns_text,
                    &checkpoint.ifname,
                )
                .await
            {
                errors.push(e.to_string());
            }
        }
        remove_namespace(&checkpoint.netns)?;
        if checkpoint.netns != netns_path {
            remove_namespace(&netns_path)?;
        }
        if !errors.is_empty() && why == Undo::Detach {
            return Err(NetworkError::Detach {
                container_id: id.into(),
                network: checkpoint.network.clone(),
                errors: errors.join("; "),
            });
        }
        if !errors.is_empty() {
            // The ADD that failed is the error the caller hears; a
            // checkpoint kept for a DEL that cannot succeed (a plugin
            // refusing the configuration both ways) would block the
            // container id for ever.
            tracing::warn!(container_id = %id, errors = %errors.join("; "), "DEL after a failed ADD");
        }
        remove_dir(&dir)
    }

    async fn call(
        &self,
        checkpoint: &Checkpoint,
        plugin: &str,
        input: &Value,
        command: Command,
        netns: &str,
        ifname: &str,
    ) -> Result<Vec<u8>, NetworkError> {
        let started = std::time::Instant::now();
        let out = plugin::invoke(
            plugin,
            input,
            &plugin::Invocation {
                command,
                container_id: &checkpoint.container_id,
                netns,
                ifname,
                plugins_dir: &self.config.plugins_dir,
                timeout: self.config.plugin_timeout,
            },
        )
        .await
        .map_err(|e| plugin_error(checkpoint, plugin, command, e));
        tracing::debug!(
            container_id = %checkpoint.container_id,
            network = %checkpoint.network,
            plugin,
            %command,
            elapsed_ms = started.elapsed().as_millis() as u64,
            ok = out.is_ok(),
            "CNI plugin"
        );
        out
    }

    fn attachment_from(&self, c: &Checkpoint) -> Attachment {
        let result = c
            .result
            .clone()
            .and_then(|r| serde_json::from_value(r).ok())
            .unwrap_or_default();
        attachment_of(
            c,
            &self.containers_dir.join(&c.container_id).join("etc"),
            result,
        )
    }

    fn checkpoint_path(&self, id: &str) -> PathBuf {
        self.containers_dir.join(id).join("attachment.json")
    }

    fn write_checkpoint(&self, c: &Checkpoint) -> Result<(), NetworkError> {
        let path = self.checkpoint_path(&c.container_id);
        let tmp = path.with_extension("json.tmp");
        let io = |error: std::io::Error| NetworkError::Io {
            what: "writing",
            path: path.clone(),
            error,
        };
        let bytes = serde_json::to_vec_pretty(c).map_err(|e| io(e.into()))?;
        std::fs::write(&tmp, bytes)
            .and_then(|()| std::fs::rename(&tmp, &path))
            .map_err(io)
    }

    fn read_checkpoint(&self, id: &str) -> Option<Result<Checkpoint, NetworkError>> {
        let path = self.checkpoint_path(id);
        let bytes = match std::fs::read(&path) {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return None,
            Err(error) => {
                return Some(Err(NetworkError::Io {
                    what: "reading",
                    path,
                    error,
                }))
            }
        };
        Some(
            serde_json::from_slice(&bytes).map_err(|e| NetworkError::Io {
                what: "reading",
                path,
                error: e.into(),
            }),
        )
    }
}

// === impl Reservation ===

impl Reservation<'_> {
    /// The container is (still) attached: the slot holds it.
    fn complete(mut self, attachment: Attachment) {
        self.armed = false;
        self.networks
            .slots
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(
                self.container_id.clone(),
                Slot::Attached(Box::new(attachment)),
            );
    }
}

impl Drop for Reservation<'_> {
    /// A finished detach, or a failed or cancelled attach or detach,
    /// frees the mark. A cancelled one may leave its checkpoint:
    /// [`Networks::detach`] or [`Networks::recover`] undoes it.
    fn drop(&mut self) {
        if self.armed {
            self.networks
                .slots
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .remove(&self.container_id);
        }
    }
}

fn attachment_of(c: &Checkpoint, etc_dir: &Path, result: CniResult) -> Attachment {
    Attachment {
        container_id: c.container_id.clone(),
        network: c.network.clone(),
        netns: c.netns.clone(),
        ifname: c.ifname.clone(),
        hostname: c.hostname.clone(),
        ip_addresses: result.container_ips(&c.netns.to_string_lossy()),
        port_mappings: c.port_mappings.clone(),
        etc_dir: etc_dir.to_path_buf(),
        result,
    }
}

/// What a plugin gets on standard input: its configuration object with
/// the network's `name` and `cniVersion`, `prevResult`, the
/// `runtimeConfig` of its declared capabilities, and Mesos's `args`.
fn plugin_input(c: &Checkpoint, plugin: &Value, prev: Option<&Value>) -> Value {
    let mut input = plugin.clone();
    let Some(object) = input.as_object_mut() else {
        return input;
    };
    object.insert("name".into(), Value::String(c.network.clone()));
    object.insert("cniVersion".into(), Value::String(c.cni_version.clone()));
    object.remove("prevResult");
    if let Some(prev) = prev {
        object.insert("prevResult".into(), prev.clone());
    }
    object.remove("runtimeConfig");
    if config::plugin_has_capability(plugin, "portMappings") && !c.port_mappings.is_empty() {
        let mappings: Vec<Value> = c
            .port_mappings
            .iter()
            .map(|m| {
                json!({
                    "hostPort": m.host_port,
                    "containerPort": m.container_port,
                    "protocol": m.protocol.to_string(),
                })
            })
            .collect();
        object.insert("runtimeConfig".into(), json!({ "portMappings": mappings }));
    }
    if let Some(info) = &c.network_info {
        let args = object
            .entry("args")
            .or_insert_with(|| Value::Object(Default::default()));
        if let Some(args) = args.as_object_mut() {
            args.insert(
                config::MESOS_ARGS_KEY.into(),
                json!({ "network_info": info }),
            );
        }
    }
    input
}

fn plugin_type(plugin: &Value) -> &str {
    plugin
        .get("type")
        .and_then(Value::as_str)
        .unwrap_or_default()
}

fn plugin_error(
    c: &Checkpoint,
    plugin: &str,
    command: Command,
    error: PluginError,
) -> NetworkError {
    NetworkError::Plugin {
        plugin: plugin.into(),
        command,
        container_id: c.container_id.clone(),
        network: c.network.clone(),
        error: Box::new(error),
    }
}

/// The CNI versions `program` speaks (`VERSION`).
async fn plugin_versions(
    config: &NetworksConfig,
    program: &str,
    file: &Path,
) -> Result<Vec<String>, NetworkError> {
    let invalid = |reason: String| {
        NetworkError::Config(ConfigError::Invalid {
            file: file.to_path_buf(),
            reason,
        })
    };
    let out = plugin::invoke(
        program,
        &json!({ "cniVersion": "1.0.0" }),
        &plugin::Invocation {
            command: Command::Version,
            container_id: "",
            netns: "",
            ifname: "",
            plugins_dir: &config.plugins_dir,
            timeout: config.plugin_timeout,
        },
    )
    .await
    .map_err(|e| invalid(format!("plugin '{program}' VERSION failed: {e}")))?;
    #[derive(Deserialize)]
    #[serde(rename_all = "camelCase")]
    struct VersionResult {
        supported_versions: Vec<String>,
    }
    serde_json::from_slice::<VersionResult>(&out)
        .map(|v| v.supported_versions)
        .map_err(|e| {
            invalid(format!(
                "plugin '{program}' answered VERSION with no supportedVersions: {e}"
            ))
        })
}

fn check_container_id(id: &str) -> Result<(), NetworkError> {
    if id.len() <= 128 && config::is_cni_name(id) {
        Ok(())
    } else {
        Err(NetworkError::InvalidContainerId(id.into()))
    }
}

fn check_hostname(hostname: &str) -> Result<(), NetworkError> {
    let ok = !hostname.is_empty()
        && hostname.len() <= 253
        && hostname
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_'));
    if ok {
        Ok(())
    } else {
        Err(NetworkError::InvalidHostname(hostname.into()))
    }
}

fn create_dir(path: &Path) -> Result<(), NetworkError> {
    std::fs::create_dir_all(path).map_err(|error| NetworkError::Io {
        what: "creating",
        path: path.to_path_buf(),
        error,
    })
}

fn remove_dir(path: &Path) -> Result<(), NetworkError> {
    match std::fs::remove_dir_all(path) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(NetworkError::Io {
            what: "removing",
            path: path.to_path_buf(),
            error: e,
        }),
        _ => Ok(()),
    }
}

fn remove_namespace(path: &Path) -> Result<(), NetworkError> {
    netns::remove(path).map_err(|error| NetworkError::Namespace {
        path: path.to_path_buf(),
        error,
    })
}

fn read_dir_names(dir: &Path) -> Result<Vec<String>, NetworkError> {
    let entries = std::fs::read_dir(dir).map_err(|error| NetworkError::Io {
        what: "listing",
        path: dir.to_path_buf(),
        error,
    })?;
    let mut names: Vec<String> = entries
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    Ok(names)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn checkpoint(port_mappings: Vec<PortMapping>, network_info: Option<Value>) -> Checkpoint {
        Checkpoint {
            container_id: "c1".into(),
            network: "net1".into(),
            cni_version: "1.0.0".into(),
            plugins: vec![],
            ifname: "eth0".into(),
            netns: "/ns/c1".into(),
            hostname: "h".into(),
            port_mappings,
            network_info,
            result: None,
        }
    }

    #[test]
    fn a_plugin_gets_the_networks_name_and_version_and_the_previous_result() {
        let bridge = json!({"type": "bridge", "bridge": "cni0", "prevResult": {"stale": 1}});
        let c = checkpoint(vec![], None);
        let first = plugin_input(&c, &bridge, None);
        assert_eq!(
            first,
            json!({"type": "bridge", "bridge": "cni0", "name": "net1", "cniVersion": "1.0.0"})
        );
        let prev = json!({"cniVersion": "1.0.0", "ips": [{"address": "10.0.0.2/24"}]});
        let second = plugin_input(&c, &json!({"type": "tuning"}), Some(&prev));
        assert_eq!(second["prevResult"], prev);
        assert!(second.get("runtimeConfig").is_none());
    }

    #[test]
    fn port_mappings_go_only_to_plugins_with_the_capability() {
        let mapping = PortMapping {
            host_port: 31000,
            container_port: 80,
            protocol: Protocol::Udp,
        };
        let c = checkpoint(vec![mapping], None);
        let portmap = json!({"type": "portmap", "capabilities": {"portMappings": true},
                             "runtimeConfig": {"portMappings": [{"hostPort": 1}]}});
        let input = plugin_input(&c, &portmap, None);
        assert_eq!(
            input["runtimeConfig"],
            json!({"portMappings": [{"hostPort": 31000, "containerPort": 80, "protocol": "udp"}]})
        );
        let bridge = plugin_input(&c, &json!({"type": "bridge"}), None);
        assert!(bridge.get("runtimeConfig").is_none());
        // Without mappings, no runtimeConfig (not even one the file had).
        let none = plugin_input(&checkpoint(vec![], None), &portmap, None);
        assert!(none.get("runtimeConfig").is_none());
    }

    #[test]
    fn mesos_network_info_goes_into_args_beside_the_operators() {
        let info = json!({"name": "net1", "labels": {"labels": [{"key": "k", "value": "v"}]}});
        let c = checkpoint(vec![], Some(info.clone()));
        let input = plugin_input(&c, &json!({"type": "bridge", "args": {"mine": 1}}), None);
        assert_eq!(
            input["args"],
            json!({"mine": 1, "org.apache.mesos": {"network_info": info}})
        );
    }

    #[test]
    fn container_ids_and_hostnames_are_checked() {
        assert!(check_container_id("task-1.a_b").is_ok());
        for bad in ["", "-x", "a/b", "a b", &"x".repeat(129)] {
            assert!(check_container_id(bad).is_err(), "{bad}");
        }
        assert!(check_hostname("web-1.example").is_ok());
        for bad in ["", "a b", "a\nb", &"x".repeat(254)] {
            assert!(check_hostname(bad).is_err(), "{bad}");
        }
        assert_eq!("TCP".parse::<Protocol>().unwrap(), Protocol::Tcp);
        assert_eq!("".parse::<Protocol>().unwrap(), Protocol::Tcp);
        assert_eq!("udp".parse::<Protocol>().unwrap(), Protocol::Udp);
        assert!("sctp".parse::<Protocol>().is_err());
    }
}
