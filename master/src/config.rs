//! The master's configuration: every bound and interval has a name and a
//! default here, and a flag of the same name in the `agora-master` binary.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use agora_proto::{Resources, Value, DEFAULT_ROLE};

/// Default [`Config::offer_timeout`].
pub const DEFAULT_OFFER_TIMEOUT: Duration = Duration::from_secs(60);

/// Default [`Config::agent_reregister_timeout`].
pub const DEFAULT_AGENT_REREGISTER_TIMEOUT: Duration = Duration::from_secs(600);

/// How the master runs. [`Config::default`] gives Mesos's defaults.
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    /// Directory for the master's own files (created at start when set).
    /// When set, the registry (admitted agents, frameworks, removed ids)
    /// is kept in `WORK_DIR/registry` and reloaded on start.
    pub work_dir: Option<PathBuf>,
    /// Period of the regular allocation cycle (default 1 s).
    pub allocation_interval: Duration,
    /// After an event that frees resources or adds an agent or framework,
    /// an extra allocation runs this long afterwards, so a burst of events
    /// costs one cycle (default 20 ms).
    pub allocation_batch_window: Duration,
    /// How often the master pings each agent (default 15 s).
    pub agent_ping_interval: Duration,
    /// Unanswered pings after which an agent is removed (default 5).
    pub max_missed_pings: u32,
    /// How often connected schedulers get a `HEARTBEAT` (default 15 s).
    pub heartbeat_interval: Duration,
    /// Outstanding offers older than this are rescinded and their
    /// resources re-offered (default 60 s; `None` never rescinds). Long
    /// enough for any live scheduler to answer (they answer in
    /// milliseconds; the scheduler heartbeat is 15 s), short enough that a
    /// stuck or hoarding framework cannot pin a cluster's resources.
    pub offer_timeout: Option<Duration>,
    /// `refuse_seconds` used when a decline or launch gives no filter (default 5).
    pub default_refuse_seconds: f64,
    /// Smallest cpus worth offering (default 0.01; either minimum suffices).
    pub min_offer_cpus: f64,
    /// Smallest mem (MiB) worth offering (default 32; either minimum suffices).
    pub min_offer_mem: f64,
    /// DRF weight per role; roles not listed weigh 1.0.
    pub role_weights: BTreeMap<String, f64>,
    /// Guaranteed minimum per role (scalars, e.g. `cpus:4;mem:1024`),
    /// allocated before fair sharing; none by default.
    pub role_quotas: BTreeMap<String, Resources>,
    /// Most a role may be allocated, per scalar named (quota limits, set
    /// at run time by `UPDATE_QUOTA`); none by default.
    pub role_limits: BTreeMap<String, crate::allocator::Limits>,
    /// How long a framework learnt only from agents' reports (after a
    /// master restart) is kept without its scheduler subscribing, at least
    /// (its own `failover_timeout` applies when longer; default 10 min).
    pub recovered_framework_timeout: Duration,
    /// After a restart that reloaded the registry, how long agents it
    /// lists have to re-register before they are removed (their tasks
    /// then count as lost). Default 10 min, Mesos's: long enough for an
    /// agent host to reboot and for agents' reconnect backoff, since
    /// removing a live agent kills its tasks; short enough that
    /// frameworks learn of truly gone agents the same hour.
    pub agent_reregister_timeout: Duration,
    /// Principals and secrets (`--credentials`); needed by
    /// `authenticate_frameworks` and `authenticate_agents`.
    pub credentials: Option<agora_proto::Credentials>,
    /// Schedulers (native WebSocket and Mesos v1 API) must authenticate
    /// with `Authorization: Basic` credentials from `credentials`.
    pub authenticate_frameworks: bool,
    /// Agents must authenticate the same way; one that does not is not
    /// registered (it keeps retrying with backoff).
    pub authenticate_agents: bool,
    /// Operators must authenticate on every HTTP endpoint (`/state`, the
    /// web UI, the REST and Mesos operator APIs, `/metrics`, …) but
    /// `/health`, `/version` and `/redirect`: Basic or Bearer, `401` with
    /// a challenge otherwise.
    pub authenticate_http: bool,
    /// How long a new connection has to authenticate: to send its first
    /// frame (SUBSCRIBE, REGISTER) on a WebSocket, or to finish its TLS
    /// handshake; after it the connection is closed (default 15 s,
    /// Mesos's `--authentication_timeout`).
    pub authentication_timeout: Duration,
    /// TLS on the listener (`--tls-cert`, `--tls-key`, `--tls-ca`,
    /// `--tls-require-client-cert`, `--tls-allow-plaintext`).
    pub tls: agora_net::TlsOptions,
    /// Authorization rules (`--acls`): who may register in which role,
    /// run tasks as which user, tear down whose frameworks and see which
    /// frameworks and tasks. Default: none, everything allowed.
    pub acls: std::sync::Arc<crate::acls::Acls>,
    /// The most an agent may offer of each scalar named here (summed over
    /// roles): an agent registering with more is refused, as a broken or
    /// forged agent (default [`DEFAULT_MAX_AGENT_RESOURCES`]).
    pub max_agent_resources: Resources,
    /// The other bounds of an agent's registration: how many resources
    /// and attributes, how large a set or range list, how long a name
    /// (see [`AgentBounds`]).
    pub agent_bounds: AgentBounds,
    /// Completed tasks kept for `/state` and reconciliation (default 1000).
    pub max_completed_tasks: usize,
    /// Removed frameworks kept for `/state` and the operator API
    /// (default 50, Mesos's `--max_completed_frameworks`).
    pub max_completed_frameworks: usize,
    /// Removed agent ids remembered, to refuse them with `SHUTDOWN` (default 100 000).
    pub max_removed_agents: usize,
    /// Frames queued towards one connection before the master gives up on
    /// a peer that does not read and disconnects it (default 10 000).
    pub connection_queue_capacity: usize,
    /// Connections not yet established (authenticated, subscribed,
    /// registered) open at once from one peer address (default
    /// [`DEFAULT_MAX_CONNECTIONS_PER_PEER`]); past it a new one closes the
    /// oldest of them. Established connections do not count.
    pub max_connections_per_peer: usize,
    /// Calls queued from all connections towards the state task (default 8192).
    pub event_queue_capacity: usize,
    /// What peers may hold of the master's port: connections in all,
    /// how long a request's headers, an idle connection and a request
    /// body may take, and the memory of request bodies being read
    /// (`--max-connections`, `--http-header-timeout`,
    /// `--idle-connection-timeout`, `--http-body-timeout`,
    /// `--http-body-min-rate`, `--max-http-body-memory`).
    pub limits: agora_net::Limits,
    /// Bytes of events one operator event stream (`SUBSCRIBE` on
    /// `/api/v1`) may have waiting for its reader; past it the reader is
    /// not reading and the stream is cut off (default
    /// [`DEFAULT_OPERATOR_STREAM_BACKLOG`]).
    pub operator_stream_backlog: usize,
    /// The longest a disconnected framework is kept for its scheduler,
    /// whatever `failover_timeout` it asked for (default one week; Mesos
    /// has no such cap).
    pub max_failover_timeout: Duration,
    /// Disconnected frameworks kept waiting for their schedulers at once
    /// (default 1000); past it, or past
    /// `max_disconnected_framework_bytes`, the one disconnected longest
    /// is removed, as if its failover timeout had expired.
    pub max_disconnected_frameworks: usize,
    /// Bytes of `FrameworkInfo` (as JSON) the disconnected frameworks may
    /// hold in all (default 64 MiB).
    pub max_disconnected_framework_bytes: usize,
    /// Least time between two `/state` snapshots (default 100 ms).
    pub state_snapshot_interval: Duration,
    /// High availability: campaign for leadership in etcd and keep the
    /// registry there (then `work_dir` holds no registry). `None`: a
    /// single master.
    #[cfg(feature = "etcd")]
    pub etcd: Option<EtcdOptions>,
}

/// Bounds of what an agent may register with: a registration beyond any
/// of them is refused with a message naming the bound (and kept nowhere).
/// Ports ranges must also lie within 0–65535. The defaults are far above
/// any real machine; an operator with more (a huge port list, hundreds of
/// attributes) raises the flag of the same name.
#[derive(Debug, Clone, PartialEq)]
pub struct AgentBounds {
    /// Resource entries (one per name, role and kind; default
    /// [`DEFAULT_MAX_AGENT_RESOURCE_ENTRIES`]).
    pub max_resource_entries: usize,
    /// Items of one set resource (default [`DEFAULT_MAX_AGENT_SET_ITEMS`];
    /// at most [`agora_proto::MAX_WIRE_ITEMS`], where decoding stops).
    pub max_set_items: usize,
    /// Ranges of one range resource (default [`DEFAULT_MAX_AGENT_RANGES`];
    /// at most [`agora_proto::MAX_WIRE_ITEMS`]).
    pub max_ranges: usize,
    /// Attributes (default [`DEFAULT_MAX_AGENT_ATTRIBUTES`]).
    pub max_attributes: usize,
    /// Bytes of one name or text: a resource's name, role or set item, an
    /// attribute's name or text, the hostname and address (default
    /// [`DEFAULT_MAX_AGENT_TEXT_BYTES`]).
    pub max_text_bytes: usize,
}

/// Default [`AgentBounds::max_resource_entries`].
pub const DEFAULT_MAX_AGENT_RESOURCE_ENTRIES: usize = 128;
/// Default [`AgentBounds::max_set_items`].
pub const DEFAULT_MAX_AGENT_SET_ITEMS: usize = 1024;
/// Default [`AgentBounds::max_ranges`].
pub const DEFAULT_MAX_AGENT_RANGES: usize = 1024;
/// Default [`AgentBounds::max_attributes`].
pub const DEFAULT_MAX_AGENT_ATTRIBUTES: usize = 128;
/// Default [`AgentBounds::max_text_bytes`].
pub const DEFAULT_MAX_AGENT_TEXT_BYTES: usize = 1024;
/// The highest port: a `ports` range beyond it is refused.
pub const MAX_PORT: u64 = 65_535;

/// Where and how a master campaigns for leadership (see `docs/protocol.md`,
/// "High availability").
#[cfg(feature = "etcd")]
#[derive(Debug, Clone, PartialEq)]
pub struct EtcdOptions {
    /// etcd's client endpoint, `http://HOST:PORT` or `HOST:PORT`.
    pub endpoint: String,
    /// Prefix of every key this cluster uses, e.g. `/agora`.
    pub prefix: String,
    /// TTL of the leader's lease (whole seconds, rounded up; default 2 s):
    /// a dead leader is replaced this long after its last renewal, and a
    /// leader cut off from etcd stops after at most this long.
    pub lease_ttl: Duration,
}

/// Default [`Config::max_agent_resources`]: far beyond any one machine
/// (64 Ki cpus, 1 PiB of memory and of disk, in MiB), so only a broken or
/// forged registration meets it.
pub const DEFAULT_MAX_AGENT_RESOURCES: &str = "cpus:65536;mem:1073741824;disk:1073741824";

/// Default [`Config::max_connections_per_peer`].
pub const DEFAULT_MAX_CONNECTIONS_PER_PEER: usize = 1024;

/// Default [`Config::operator_stream_backlog`]: 16 MiB.
pub const DEFAULT_OPERATOR_STREAM_BACKLOG: usize = 16 * 1024 * 1024;

/// Default [`Config::max_failover_timeout`]: one week.
pub const DEFAULT_MAX_FAILOVER_TIMEOUT: Duration = Duration::from_secs(7 * 24 * 3600);

/// Default [`EtcdOptions::lease_ttl`].
#[cfg(feature = "etcd")]
pub const DEFAULT_ETCD_LEASE_TTL: Duration = Duration::from_secs(2);

impl Default for Config {
    fn default() -> Self {
        Config {
            work_dir: None,
            allocation_interval: Duration::from_secs(1),
            allocation_batch_window: Duration::from_millis(20),
            agent_ping_interval: Duration::from_secs(15),
            max_missed_pings: 5,
            heartbeat_interval: Duration::from_secs(15),
            offer_timeout: Some(DEFAULT_OFFER_TIMEOUT),
            default_refuse_seconds: agora_proto::DEFAULT_REFUSE_SECONDS,
            min_offer_cpus: 0.01,
            min_offer_mem: 32.0,
            role_weights: BTreeMap::new(),
            role_quotas: BTreeMap::new(),
            role_limits: BTreeMap::new(),
            recovered_framework_timeout: Duration::from_secs(600),
            agent_reregister_timeout: DEFAULT_AGENT_REREGISTER_TIMEOUT,
            credentials: None,
            authenticate_frameworks: false,
            authenticate_agents: false,
            authenticate_http: false,
            authentication_timeout: Duration::from_secs(15),
            tls: agora_net::TlsOptions::default(),
            acls: std::sync::Arc::default(),
            max_agent_resources: Resources::parse(DEFAULT_MAX_AGENT_RESOURCES)
                .expect("the default --max-agent-resources parses"),
            agent_bounds: AgentBounds::default(),
            max_completed_tasks: 1000,
            max_completed_frameworks: 50,
            max_removed_agents: 100_000,
            connection_queue_capacity: 10_000,
            max_connections_per_peer: DEFAULT_MAX_CONNECTIONS_PER_PEER,
            event_queue_capacity: 8192,
            limits: agora_net::Limits::default(),
            operator_stream_backlog: DEFAULT_OPERATOR_STREAM_BACKLOG,
            max_failover_timeout: DEFAULT_MAX_FAILOVER_TIMEOUT,
            max_disconnected_frameworks: 1000,
            max_disconnected_framework_bytes: 64 * 1024 * 1024,
            state_snapshot_interval: Duration::from_millis(100),
            #[cfg(feature = "etcd")]
            etcd: None,
        }
    }
}

impl Default for AgentBounds {
    fn default() -> Self {
        AgentBounds {
            max_resource_entries: DEFAULT_MAX_AGENT_RESOURCE_ENTRIES,
            max_set_items: DEFAULT_MAX_AGENT_SET_ITEMS,
            max_ranges: DEFAULT_MAX_AGENT_RANGES,
            max_attributes: DEFAULT_MAX_AGENT_ATTRIBUTES,
            max_text_bytes: DEFAULT_MAX_AGENT_TEXT_BYTES,
        }
    }
}

impl AgentBounds {
    /// The first bound `info` is beyond, as a refusal that names it (and
    /// its flag).
    pub(crate) fn check(&self, info: &agora_proto::AgentInfo) -> Result<(), String> {
        use agora_proto::AttributeValue;
        let text = |what: &str, value: &str| -> Result<(), String> {
            if value.len() > self.max_text_bytes {
                return Err(format!(
                    "{what} is {} bytes long, above --max-agent-text-bytes ({})",
                    value.len(),
                    self.max_text_bytes
                ));
            }
            Ok(())
        };
        text("the hostname", &info.hostname)?;
        text("the address", &info.address)?;
        let entries = info.resources.iter().count();
        if entries > self.max_resource_entries {
            return Err(format!(
                "the agent offers {entries} resource entries, above --max-agent-resource-entries ({})",
                self.max_resource_entries
            ));
        }
        for r in info.resources.iter() {
            text("a resource name", &r.name)?;
            text(&format!("the role of resource {}", r.name), &r.role)?;
            match &r.value {
                Value::Scalar(_) => {}
                Value::Ranges(ranges) => {
                    if ranges.len() > self.max_ranges {
                        return Err(format!(
                            "resource {} has {} ranges, above --max-agent-ranges ({})",
                            r.name,
                            ranges.len(),
                            self.max_ranges
                        ));
                    }
                    if r.name == "ports" {
                        if let Some(range) = ranges.iter().find(|range| range.end > MAX_PORT) {
                            return Err(format!(
                                "resource ports has range [{}-{}], beyond the highest port {MAX_PORT}",
                                range.begin, range.end
                            ));
                        }
                    }
                }
                Value::Set(items) => {
                    if items.len() > self.max_set_items {
                        return Err(format!(
                            "resource {} has {} set items, above --max-agent-set-items ({})",
                            r.name,
                            items.len(),
                            self.max_set_items
                        ));
                    }
                    for item in items {
                        text(&format!("an item of resource {}", r.name), item)?;
                    }
                }
            }
        }
        let attributes = &info.attributes.0;
        if attributes.len() > self.max_attributes {
            return Err(format!(
                "the agent has {} attributes, above --max-agent-attributes ({})",
                attributes.len(),
                self.max_attributes
            ));
        }
        for a in attributes {
            text("an attribute name", &a.name)?;
            if let AttributeValue::Text(value) = &a.value {
                text(&format!("the value of attribute {}", a.name), value)?;
            }
        }
        Ok(())
    }
}

impl Config {
    /// The ways into this master its configuration leaves unguarded, each
    /// warned of at start and named in `/health` (see `docs/http.md`).
    pub fn open_doors(&self) -> Vec<agora_net::OpenDoor> {
        use agora_net::OpenDoor;
        let mut doors = Vec::new();
        if !self.tls.enabled() {
            doors.push(OpenDoor {
                name: "no_tls",
                warning: "no TLS: frames, credentials and task definitions cross the network in clear text, and a peer cannot tell this master from an impostor (set --tls-cert and --tls-key)",
            });
        } else if self.tls.allow_plaintext {
            doors.push(OpenDoor {
                name: "plaintext_allowed",
                warning: "--tls-allow-plaintext: clients may still connect without TLS",
            });
        }
        if !self.authenticate_frameworks {
            doors.push(OpenDoor {
                name: "unauthenticated_frameworks",
                warning: "frameworks are not authenticated: anyone who reaches the master may subscribe, and by declaring a framework's principal re-subscribe as it (set --authenticate-frameworks with --credentials)",
            });
        }
        if !self.authenticate_agents {
            doors.push(OpenDoor {
                name: "unauthenticated_agents",
                warning: "agents are not authenticated: anyone who reaches the master may register an agent, receive tasks and report their states (set --authenticate-agents with --credentials)",
            });
        }
        if !self.authenticate_http {
            doors.push(OpenDoor {
                name: "unauthenticated_http",
                warning: "operator reads are not authenticated: /state, the operator API and the web UI answer anyone (set --authenticate-http with --credentials)",
            });
        }
        if self.credentials.is_none() {
            doors.push(OpenDoor {
                name: "unauthenticated_operator_writes",
                warning: "no --credentials: operator calls that change the cluster (TEARDOWN) are taken from anyone; with credentials they need an authenticated principal",
            });
        }
        doors
    }

    /// Checks values that would make the master misbehave.
    pub fn validate(&self) -> Result<(), String> {
        let positive = [
            ("allocation_interval", self.allocation_interval),
            ("agent_ping_interval", self.agent_ping_interval),
            ("heartbeat_interval", self.heartbeat_interval),
            ("agent_reregister_timeout", self.agent_reregister_timeout),
            ("authentication_timeout", self.authentication_timeout),
        ];
        for (name, d) in positive {
            if d.is_zero() {
                return Err(format!("{name} must be greater than zero"));
            }
        }
        if self.offer_timeout.is_some_and(|d| d.is_zero()) {
            return Err("offer_timeout must be greater than zero when set".into());
        }
        if (self.authenticate_frameworks || self.authenticate_agents || self.authenticate_http)
            && self.credentials.is_none()
        {
            return Err(
                "authenticating frameworks, agents or HTTP operators needs --credentials".into(),
            );
        }
        self.tls.validate()?;
        let wire = agora_proto::MAX_WIRE_ITEMS;
        if self.agent_bounds.max_set_items > wire || self.agent_bounds.max_ranges > wire {
            return Err(format!(
                "max_agent_set_items and max_agent_ranges may be at most {wire}, the most one resource carries in a message"
            ));
        }
        if self.max_connections_per_peer == 0 {
            return Err("max_connections_per_peer must be at least 1".into());
        }
        self.limits.validate(agora_proto::MAX_FRAME_BYTES)?;
        if self.max_disconnected_frameworks == 0 {
            return Err("max_disconnected_frameworks must be at least 1".into());
        }
        if self.operator_stream_backlog == 0 {
            return Err("operator_stream_backlog must be at least 1".into());
        }
        if self.max_missed_pings == 0 {
            return Err("max_missed_pings must be at least 1".into());
        }
        if !self.default_refuse_seconds.is_finite() || self.default_refuse_seconds < 0.0 {
            return Err("default_refuse_seconds must be a non-negative number".into());
        }
        let non_negative = |v: f64| v.is_finite() && v >= 0.0;
        if !(non_negative(self.min_offer_cpus) && non_negative(self.min_offer_mem)) {
            return Err("min_offer_cpus and min_offer_mem must be non-negative numbers".into());
        }
        for (role, w) in &self.role_weights {
            if !w.is_finite() || *w <= 0.0 {
                return Err(format!("weight of role {role} must be a positive number"));
            }
        }
        for (role, quota) in &self.role_quotas {
            if role.is_empty() || role == DEFAULT_ROLE {
                return Err(format!("quota needs a named role, not {role:?}"));
            }
            if quota.iter().any(|r| !matches!(r.value, Value::Scalar(_))) {
                return Err(format!(
                    "quota of role {role} may only name scalar resources"
                ));
            }
            if quota.iter().any(|r| r.role != DEFAULT_ROLE) {
                return Err(format!(
                    "quota of role {role} is written without roles (cpus:4, not cpus(web):4)"
                ));
            }
        }
        #[cfg(feature = "etcd")]
        if let Some(etcd) = &self.etcd {
            if !etcd.prefix.starts_with('/') || etcd.prefix.trim_end_matches('/').is_empty() {
                return Err(format!(
                    "etcd prefix must start with / and name something, not {:?}",
                    etcd.prefix
                ));
            }
            if etcd.lease_ttl < Duration::from_secs(1) {
                return Err("etcd lease TTL must be at least 1 s".into());
            }
        }
        if self.connection_queue_capacity == 0 || self.event_queue_capacity == 0 {
            return Err("queue capacities must be at least 1".into());
        }
        Ok(())
    }
}
