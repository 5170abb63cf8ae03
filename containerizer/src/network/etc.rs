//! The `/etc/hosts`, `/etc/hostname` and `/etc/resolv.conf` of a
//! container on a CNI network, which the runtime binds into it (as
//! Mesos's CNI isolator writes them): `hosts` names localhost and maps
//! the hostname to each of the container's addresses; `resolv.conf` is
//! made from the network's DNS settings (the CNI result's) when the
//! plugins give any, else it is the host's.

use std::io;
use std::net::IpAddr;
use std::path::Path;

use super::plugin::Dns;

/// The host's resolver configuration.
const HOST_RESOLV_CONF: &str = "/etc/resolv.conf";

/// systemd-resolved's list of the real name servers, for a host whose
/// `/etc/resolv.conf` names only its local stub (`127.0.0.53`), which a
/// container's namespace cannot reach (Docker and the kubelet read it
/// for the same reason).
const RESOLVED_UPSTREAM: &str = "/run/systemd/resolve/resolv.conf";

/// Writes the three files into `dir` (made if missing).
pub(crate) fn write(dir: &Path, hostname: &str, ips: &[IpAddr], dns: &Dns) -> io::Result<()> {
    std::fs::create_dir_all(dir)?;
    std::fs::write(dir.join("hosts"), hosts(hostname, ips))?;
    std::fs::write(dir.join("hostname"), format!("{hostname}\n"))?;
    let resolv = if dns.is_empty() {
        host_resolv_conf()
    } else {
        resolv_conf(dns)
    };
    std::fs::write(dir.join("resolv.conf"), resolv)
}

pub(crate) fn hosts(hostname: &str, ips: &[IpAddr]) -> String {
    let mut out = String::from("127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n");
    for ip in ips {
        out.push_str(&format!("{ip}\t{hostname}\n"));
    }
    out
}

pub(crate) fn resolv_conf(dns: &Dns) -> String {
    let mut out = String::new();
    for ns in &dns.nameservers {
        out.push_str(&format!("nameserver {ns}\n"));
    }
    if let Some(domain) = dns.domain.as_deref().filter(|d| !d.is_empty()) {
        out.push_str(&format!("domain {domain}\n"));
    }
    if !dns.search.is_empty() {
        out.push_str(&format!("search {}\n", dns.search.join(" ")));
    }
    if !dns.options.is_empty() {
        out.push_str(&format!("options {}\n", dns.options.join(" ")));
    }
    out
}

/// The host's `resolv.conf`, or systemd-resolved's upstream list when
/// the host's names only loopback servers.
fn host_resolv_conf() -> String {
    let host = std::fs::read_to_string(HOST_RESOLV_CONF).unwrap_or_default();
    if only_loopback_servers(&host) {
        if let Ok(upstream) = std::fs::read_to_string(RESOLVED_UPSTREAM) {
            return upstream;
        }
    }
    host
}

fn only_loopback_servers(resolv: &str) -> bool {
    let servers: Vec<IpAddr> = resolv
        .lines()
        .filter_map(|l| l.trim().strip_prefix("nameserver"))
        .filter_map(|s| s.trim().parse().ok())
        .collect();
    !servers.is_empty() && servers.iter().all(IpAddr::is_loopback)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hosts_maps_the_hostname_to_each_address() {
        let ips = ["10.88.0.2".parse().unwrap(), "fd00::2".parse().unwrap()];
        assert_eq!(
            hosts("web-1", &ips),
            "127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n\
             10.88.0.2\tweb-1\nfd00::2\tweb-1\n"
        );
    }

    #[test]
    fn resolv_conf_from_the_networks_dns() {
        let dns = Dns {
            nameservers: vec!["10.88.0.1".into(), "1.1.1.1".into()],
            domain: Some("cluster.local".into()),
            search: vec!["svc.cluster.local".into(), "cluster.local".into()],
            options: vec!["ndots:5".into()],
        };
        assert_eq!(
            resolv_conf(&dns),
            "nameserver 10.88.0.1\nnameserver 1.1.1.1\ndomain cluster.local\n\
             search svc.cluster.local cluster.local\noptions ndots:5\n"
        );
        assert!(only_loopback_servers(
            "nameserver 127.0.0.53\noptions edns0\n"
        ));
        assert!(!only_loopback_servers(
            "nameserver 127.0.0.53\nnameserver 9.9.9.9\n"
        ));
        assert!(!only_loopback_servers("# nothing\n"));
    }
}
