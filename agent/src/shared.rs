//! What every part of the agent shares: its configuration, addresses,
//! counters and executor identity ([`Shared`]), made once by
//! [`crate::run`] and handed to the core, the master link and the HTTP
//! handlers.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use crate::config::Config;
use crate::identity;

/// What every connection task shares: the configuration, the agent's
/// addresses and the connection id counter.
#[derive(Clone)]
pub(crate) struct Shared {
    pub(crate) config: Arc<Config>,
    /// The address the agent listens on.
    pub(crate) listen: SocketAddr,
    /// `ws://host:port/api/executor`, given to executors.
    pub(crate) executor_endpoint: String,
    pub(crate) next_conn: Arc<AtomicU64>,
    /// Counters for `/metrics` that the core bumps.
    pub(crate) counters: Arc<Counters>,
    /// Signs and checks executor tokens.
    pub(crate) identity: Arc<identity::ExecutorIdentity>,
    /// TLS to the master (`--tls-ca`, with `--tls-cert` as the client
    /// certificate), or plaintext.
    pub(crate) client_tls: Option<Arc<agora_net::tls::rustls::ClientConfig>>,
    /// Under `--isolation cgroups`, whether the agent can hand a task's
    /// container to the user the task runs as (cgroup v1: its `tasks`
    /// files; v2 would need the cgroup above every container).
    pub(crate) delegates_cgroups: bool,
}

/// Status update deliveries the core counts for `/metrics`.
#[derive(Debug, Default)]
pub(crate) struct Counters {
    /// Unacknowledged updates sent to the master again when their retry
    /// interval ran out.
    pub(crate) updates_retried_timeout: AtomicU64,
    /// Heads of unacknowledged streams sent to the master when the agent
    /// (re-)registered.
    pub(crate) updates_resent_registered: AtomicU64,
}

// === impl Counters ===

impl Counters {
    pub(crate) fn retried_on_timeout(&self) {
        self.updates_retried_timeout.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn resent_on_registration(&self) {
        self.updates_resent_registered
            .fetch_add(1, Ordering::Relaxed);
    }
}

// === impl Shared ===

impl Shared {
    pub(crate) fn next_conn_id(&self) -> u64 {
        self.next_conn.fetch_add(1, Ordering::Relaxed)
    }

    /// `IP:PORT` of the agent for executors of the Mesos v1 executor API
    /// (`MESOS_AGENT_ENDPOINT`): the listen address, loopback when it is
    /// the wildcard.
    pub(crate) fn mesos_agent_endpoint(&self) -> String {
        loopback_if_unspecified(self.listen).to_string()
    }

    /// `IP:PORT` the master and clients reach this agent at: the advertised
    /// IP and port when given, else the listen address; a wildcard listen
    /// address is replaced by `via`, the local address of the connection to
    /// the master, which the master and its clients can route to (and,
    /// before any connection, by the host name).
    pub(crate) fn advertised_address(&self, via: Option<std::net::IpAddr>) -> String {
        let config = &self.config;
        let port = config.advertise_port.unwrap_or(self.listen.port());
        let ip = config
            .advertise_ip
            .or_else(|| (!self.listen.ip().is_unspecified()).then_some(self.listen.ip()))
            .or(via);
        match ip {
            Some(ip) => SocketAddr::new(ip, port).to_string(),
            None => format!("{}:{port}", config.hostname),
        }
    }
}

/// `addr`, with loopback for a wildcard IP (an address a local process
/// can connect to).
pub(crate) fn loopback_if_unspecified(addr: SocketAddr) -> SocketAddr {
    if addr.ip().is_unspecified() {
        SocketAddr::new(std::net::Ipv4Addr::LOCALHOST.into(), addr.port())
    } else {
        addr
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shared(listen: &str, config: impl FnOnce(&mut Config)) -> Shared {
        let mut c = Config::new("127.0.0.1:5050", std::env::temp_dir());
        c.hostname = "box".into();
        config(&mut c);
        Shared {
            config: Arc::new(c),
            listen: listen.parse().unwrap(),
            executor_endpoint: String::new(),
            next_conn: Arc::default(),
            counters: Arc::default(),
            identity: Arc::new(identity::ExecutorIdentity::new(&[1; 32])),
            client_tls: None,
            delegates_cgroups: false,
        }
    }

    #[test]
    fn the_advertised_address_is_one_clients_can_reach() {
        let via = Some("10.1.2.3".parse().unwrap());
        // A wildcard listen address: the address the master sees.
        let s = shared("0.0.0.0:5051", |_| {});
        assert_eq!(s.advertised_address(via), "10.1.2.3:5051");
        assert_eq!(
            s.advertised_address(None),
            "box:5051",
            "before any connection"
        );
        // A specific listen address is reachable as it is.
        let s = shared("192.168.7.9:6000", |_| {});
        assert_eq!(s.advertised_address(via), "192.168.7.9:6000");
        // --advertise-ip and --advertise-port win.
        let s = shared("0.0.0.0:5051", |c| {
            c.advertise_ip = Some("203.0.113.5".parse().unwrap());
            c.advertise_port = Some(15051);
        });
        assert_eq!(s.advertised_address(via), "203.0.113.5:15051");
        let s = shared("[::]:5051", |_| {});
        let v6 = Some("fd00::7".parse().unwrap());
        assert_eq!(s.advertised_address(v6), "[fd00::7]:5051");
    }
}
