//! A bridge network for tests and benchmarks, and the guard of what it
//! leaves on the host: a temporary directory with the configuration
//! directory (a bridge device named after the process, a /24 of
//! 10.88.0.0/16 that no host route uses, portmap), the module's root and
//! host-local's address store; its `Drop` removes the namespaces (their
//! mounts), the bridge, the iptables rules of its network, portmap's
//! shared chains when they were not there before, and puts IPv4 and IPv6
//! forwarding back as they were, even when the test fails.
#![allow(dead_code)]

use std::net::{IpAddr, TcpListener};
use std::path::{Path, PathBuf};

use agora_containerizer::network::{
    AttachRequest, Networks, NetworksConfig, PortMapping, Protocol,
};
use agora_containerizer::runtime::mounts;

pub const PLUGINS_DIR: &str = "/usr/lib/cni";

const IP_FORWARD: &str = "/proc/sys/net/ipv4/ip_forward";
const IPV6_FORWARDING: &str = "/proc/sys/net/ipv6/conf/all/forwarding";

/// Why CNI networks cannot be tested here, if they cannot.
pub fn cannot_run_cni() -> Option<String> {
    if !nix::unistd::geteuid().is_root() {
        return Some("not root".into());
    }
    for plugin in ["bridge", "host-local", "portmap", "loopback"] {
        if !Path::new(PLUGINS_DIR).join(plugin).is_file() {
            return Some(format!(
                "no {PLUGINS_DIR}/{plugin} (install containernetworking-plugins)"
            ));
        }
    }
    for program in ["iptables", "iptables-save", "ip"] {
        if which(program).is_none() {
            return Some(format!("{program} is not on PATH"));
        }
    }
    None
}

/// A test's networks: a temporary directory with the configuration
/// directory, the module's root and the address store; the guard of
/// everything the test may leave on the host.
pub struct Fixture {
    pub tmp: tempfile::TempDir,
    pub network: String,
    pub bridge: String,
    pub subnet: u8,
    shared_chains_before: bool,
    ip_forward_before: String,
    ipv6_forwarding_before: String,
}

impl Fixture {
    pub fn new() -> Fixture {
        let tmp = tempfile::Builder::new()
            .prefix("agora-cni-")
            .tempdir()
            .unwrap();
        let pid = std::process::id();
        let fx = Fixture {
            tmp,
            network: format!("agora-test-{pid}"),
            bridge: format!("agt{pid}"),
            subnet: free_subnet(),
            shared_chains_before: nat_rules().contains(":CNI-HOSTPORT-DNAT"),
            ip_forward_before: std::fs::read_to_string(IP_FORWARD).unwrap_or_default(),
            ipv6_forwarding_before: std::fs::read_to_string(IPV6_FORWARDING).unwrap_or_default(),
        };
        std::fs::create_dir_all(fx.config_dir()).unwrap();
        fx
    }

    pub fn config_dir(&self) -> PathBuf {
        self.tmp.path().join("net.d")
    }

    pub fn root(&self) -> PathBuf {
        self.tmp.path().join("network")
    }

    pub fn gateway(&self) -> IpAddr {
        format!("10.88.{}.1", self.subnet).parse().unwrap()
    }

    /// The bridge network (bridge with host-local addresses, then
    /// portmap) as a `.conflist`.
    pub fn write_bridge_network(&self) {
        let conf = serde_json::json!({
            "cniVersion": "1.0.0",
            "name": self.network,
            "plugins": [
                {
                    "type": "bridge",
                    "bridge": self.bridge,
                    "isGateway": true,
                    "ipMasq": false,
                    "ipam": {
                        "type": "host-local",
                        "ranges": [[{"subnet": format!("10.88.{}.0/24", self.subnet)}]],
                        "routes": [{"dst": "0.0.0.0/0"}],
                        "dataDir": self.tmp.path().join("ipam"),
                    }
                },
                {"type": "portmap", "capabilities": {"portMappings": true}}
            ]
        });
        self.write("10-bridge.conflist", &conf.to_string());
    }

    pub fn write(&self, name: &str, content: &str) -> PathBuf {
        let path = self.config_dir().join(name);
        std::fs::write(&path, content).unwrap();
        path
    }

    pub fn config(&self) -> NetworksConfig {
        let mut config = NetworksConfig::new(self.config_dir(), self.root());
        config.plugins_dir = PLUGINS_DIR.into();
        config
    }

    pub async fn networks(&self) -> Networks {
        Networks::new(self.config()).await.unwrap()
    }

    pub fn request(&self, id: &str, port_mappings: Vec<PortMapping>) -> AttachRequest {
        AttachRequest {
            container_id: id.into(),
            network: self.network.clone(),
            hostname: format!("host-{id}"),
            port_mappings,
            network_info: None,
        }
    }
}

impl Drop for Fixture {
    fn drop(&mut self) {
        // The namespaces go with their mounts (and their veth pairs with
        // them); then the bridge, the network's iptables rules, portmap's
        // shared chains if this test made them, forwarding as it was.
        for (point, error) in mounts::unmount_all_under(self.tmp.path()) {
            eprintln!("cleanup: cannot unmount {}: {error}", point.display());
        }
        if Path::new("/sys/class/net").join(&self.bridge).exists() {
            run("ip", &["link", "del", &self.bridge]);
        }
        remove_nat_rules(&self.network, !self.shared_chains_before);
        // bridge's isGateway turns forwarding on; put it back as it was
        // (IPv6's too, which a dual-stack network turns on).
        let _ = std::fs::write(IP_FORWARD, &self.ip_forward_before);
        let _ = std::fs::write(IPV6_FORWARDING, &self.ipv6_forwarding_before);
    }
}

/// A /24 of 10.88.0.0/16 that no route of the host's uses.
pub fn free_subnet() -> u8 {
    let routes = std::fs::read_to_string("/proc/net/route").unwrap_or_default();
    let used: Vec<u32> = routes
        .lines()
        .skip(1)
        .filter_map(|l| l.split_whitespace().nth(1))
        .filter_map(|d| u32::from_str_radix(d, 16).ok())
        .collect();
    (200..=250u8)
        .find(|x| {
            // /proc/net/route's destinations are little-endian.
            let net = u32::from_le_bytes([10, 88, *x, 0]);
            !used.contains(&net)
        })
        .expect("a free 10.88.x.0/24")
}

pub fn run(program: &str, args: &[&str]) -> String {
    let out = std::process::Command::new(program)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("{program}: {e}"));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

pub fn nat_rules() -> String {
    run("iptables-save", &["-t", "nat"])
}

/// Removes the nat rules (and their chains) that name `network`, and
/// with `shared`, portmap's `CNI-HOSTPORT-*` chains and the rules that
/// jump to them.
pub fn remove_nat_rules(network: &str, shared: bool) {
    let rules = nat_rules();
    let mut chains = Vec::new();
    for line in rules.lines().filter(|l| l.starts_with("-A ")) {
        let ours = line.contains(&format!("name: \\\"{network}\\\""));
        let jumps_to_shared = shared && line.contains("-j CNI-HOSTPORT-");
        if ours || jumps_to_shared {
            let delete = format!("iptables -t nat -D {}", &line[3..]);
            run("sh", &["-c", &delete]);
            if let Some(target) = line.split("-j ").nth(1) {
                let chain = target.split_whitespace().next().unwrap_or_default();
                if ours && chain.starts_with("CNI-DN-") {
                    chains.push(chain.to_string());
                }
            }
        }
    }
    if shared {
        chains.extend(
            [
                "CNI-HOSTPORT-DNAT",
                "CNI-HOSTPORT-MASQ",
                "CNI-HOSTPORT-SETMARK",
            ]
            .map(String::from),
        );
    }
    for chain in chains {
        run("iptables", &["-t", "nat", "-F", &chain]);
        run("iptables", &["-t", "nat", "-X", &chain]);
    }
}

/// An unused port of the host's (bound on 127.0.0.1 and released).
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

pub fn tcp(host_port: u16, container_port: u16) -> PortMapping {
    PortMapping {
        host_port,
        container_port,
        protocol: Protocol::Tcp,
    }
}

pub fn which(program: &str) -> Option<PathBuf> {
    std::env::var_os("PATH")?
        .to_str()?
        .split(':')
        .map(|d| Path::new(d).join(program))
        .find(|p| p.is_file())
}
