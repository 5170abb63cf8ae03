//! CNI networks with real parts: Debian's plugins (`bridge`, `host-local`,
//! `portmap`, `loopback`), iptables, network namespaces, and for the last
//! tests crun and a busybox image. Each test writes a bridge network of
//! its own into a temporary configuration directory (a bridge device
//! named after the test process, a /24 of 10.88.0.0/16 that no host
//! route uses, addresses kept in the temporary directory) and a guard
//! removes everything it may have left, even when the test fails: the
//! bridge, the namespaces (their mounts), the iptables rules of its
//! network, and portmap's shared chains when the test made them.
//!
//! Skips, saying why, when not root or without the plugins, iptables or
//! `ip` (which only the guard uses, to remove the bridge).
//!
//! The tests run one at a time (they share the bridge name and
//! iptables' chains).

mod support;

use std::io::{Read, Write};
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use agora_containerizer::network::{
    config::ConfigError, AttachRequest, Attachment, NetworkChoice, NetworkError, Networks,
    NetworksConfig, PluginError, PortMapping, Protocol,
};
use agora_containerizer::runtime::{mounts, CommandSpec, RootFs, Runtime};

/// The tests share the bridge device and iptables' chains.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

const PLUGINS_DIR: &str = "/usr/lib/cni";

/// Why CNI networks cannot be tested here, if they cannot.
fn cannot_run_cni() -> Option<String> {
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
        if support::which(program).is_none() {
            return Some(format!("{program} is not on PATH"));
        }
    }
    None
}

fn skip(test: &str) -> bool {
    match cannot_run_cni() {
        Some(why) => {
            eprintln!("skipping {test}: {why}");
            true
        }
        None => false,
    }
}

/// A test's networks: a temporary directory with the configuration
/// directory, the module's root and the address store; the guard of
/// everything the test may leave on the host.
struct Fixture {
    tmp: tempfile::TempDir,
    network: String,
    bridge: String,
    subnet: u8,
    shared_chains_before: bool,
    ip_forward_before: String,
}

impl Fixture {
    fn new() -> Fixture {
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
            ip_forward_before: std::fs::read_to_string("/proc/sys/net/ipv4/ip_forward")
                .unwrap_or_default(),
        };
        std::fs::create_dir_all(fx.config_dir()).unwrap();
        fx
    }

    fn config_dir(&self) -> PathBuf {
        self.tmp.path().join("net.d")
    }

    fn root(&self) -> PathBuf {
        self.tmp.path().join("network")
    }

    fn gateway(&self) -> IpAddr {
        format!("10.88.{}.1", self.subnet).parse().unwrap()
    }

    /// The bridge network (bridge with host-local addresses, then
    /// portmap) as a `.conflist`.
    fn write_bridge_network(&self) {
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

    fn write(&self, name: &str, content: &str) -> PathBuf {
        let path = self.config_dir().join(name);
        std::fs::write(&path, content).unwrap();
        path
    }

    fn config(&self) -> NetworksConfig {
        let mut config = NetworksConfig::new(self.config_dir(), self.root());
        config.plugins_dir = PLUGINS_DIR.into();
        config
    }

    async fn networks(&self) -> Networks {
        Networks::new(self.config()).await.unwrap()
    }

    fn request(&self, id: &str, port_mappings: Vec<PortMapping>) -> AttachRequest {
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
        // shared chains if this test made them, ip_forward as it was.
        for (point, error) in mounts::unmount_all_under(self.tmp.path()) {
            eprintln!("cleanup: cannot unmount {}: {error}", point.display());
        }
        if Path::new("/sys/class/net").join(&self.bridge).exists() {
            run("ip", &["link", "del", &self.bridge]);
        }
        remove_nat_rules(&self.network, !self.shared_chains_before);
        let _ = std::fs::write("/proc/sys/net/ipv4/ip_forward", &self.ip_forward_before);
    }
}

/// A /24 of 10.88.0.0/16 that no route of the host's uses.
fn free_subnet() -> u8 {
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

fn run(program: &str, args: &[&str]) -> String {
    let out = std::process::Command::new(program)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("{program}: {e}"));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn nat_rules() -> String {
    run("iptables-save", &["-t", "nat"])
}

/// Removes the nat rules (and their chains) that name `network`, and
/// with `shared`, portmap's `CNI-HOSTPORT-*` chains and the rules that
/// jump to them.
fn remove_nat_rules(network: &str, shared: bool) {
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

/// A TCP server in a network namespace, answering each connection with
/// `reply` (bound by a thread that joined the namespace).
struct Server {
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Server {
    fn start(netns: &Path, port: u16, reply: &str) -> Server {
        let netns = std::fs::File::open(netns).unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let (tx, rx) = std::sync::mpsc::channel();
        let reply = reply.to_string();
        let stopping = stop.clone();
        let thread = std::thread::spawn(move || {
            nix::sched::setns(&netns, nix::sched::CloneFlags::CLONE_NEWNET).unwrap();
            let listener = TcpListener::bind(("0.0.0.0", port)).unwrap();
            listener.set_nonblocking(true).unwrap();
            tx.send(()).unwrap();
            while !stopping.load(Ordering::Relaxed) {
                match listener.accept() {
                    Ok((mut conn, _)) => {
                        let _ = conn.write_all(reply.as_bytes());
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(5)),
                }
            }
        });
        rx.recv_timeout(Duration::from_secs(5)).unwrap();
        Server {
            stop,
            thread: Some(thread),
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// What a TCP server at `addr` says (an error if it cannot be reached).
fn fetch(addr: SocketAddr) -> std::io::Result<String> {
    let mut conn = TcpStream::connect_timeout(&addr, Duration::from_secs(2))?;
    conn.set_read_timeout(Some(Duration::from_secs(2)))?;
    let mut out = String::new();
    conn.read_to_string(&mut out)?;
    Ok(out)
}

/// An unused port of the host's (bound on 127.0.0.1 and released).
fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// The host's first global IPv4 address, if it has one.
fn host_ipv4() -> Option<IpAddr> {
    run("ip", &["-4", "-o", "addr", "show", "scope", "global"])
        .lines()
        .find_map(|l| l.split_whitespace().nth(3))
        .and_then(|cidr| cidr.split('/').next())
        .and_then(|ip| ip.parse().ok())
}

fn mounted(path: &Path) -> bool {
    std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.split(' ').nth(4))
        .any(|p| Path::new(p) == path)
}

/// Asserts that nothing of the attachment is left: its namespace (file
/// and mount), its veth on the host, its iptables rules.
fn assert_gone(a: &Attachment) {
    assert!(!a.netns.exists(), "{} still exists", a.netns.display());
    assert!(!mounted(&a.netns), "{} still mounted", a.netns.display());
    for iface in a.host_interfaces() {
        if iface.starts_with("veth") {
            assert!(
                !Path::new("/sys/class/net").join(iface).exists(),
                "host veth {iface} of {} is left",
                a.container_id
            );
        }
    }
    let rules = nat_rules();
    let id = format!("id: \\\"{}\\\"", a.container_id);
    assert!(
        !rules.contains(&id),
        "iptables rules of {} left:\n{rules}",
        a.container_id
    );
    assert!(!a.etc_dir.exists(), "{} left", a.etc_dir.display());
}

fn tcp(host_port: u16, container_port: u16) -> PortMapping {
    PortMapping {
        host_port,
        container_port,
        protocol: Protocol::Tcp,
    }
}

#[tokio::test]
async fn two_containers_get_their_own_addresses_reached_directly_and_through_port_mappings() {
    if skip("two_containers_get_their_own_addresses...") {
        return;
    }
    let _one = ONE_AT_A_TIME.lock().await;
    let fx = Fixture::new();
    fx.write_bridge_network();
    let networks = fx.networks().await;
    let (p1, p2) = (free_port(), free_port());

    let started = Instant::now();
    let a = networks
        .attach(fx.request("web-1", vec![tcp(p1, 8080)]))
        .await
        .unwrap();
    let attach_ms = started.elapsed().as_secs_f64() * 1e3;
    let b = networks
        .attach(fx.request("web-2", vec![tcp(p2, 8080)]))
        .await
        .unwrap();
    assert_eq!(a.ip_addresses.len(), 1, "{a:?}");
    assert_eq!(b.ip_addresses.len(), 1, "{b:?}");
    let (ip_a, ip_b) = (a.ip_addresses[0], b.ip_addresses[0]);
    assert_ne!(ip_a, ip_b);
    for ip in [ip_a, ip_b] {
        assert!(
            ip.to_string().starts_with(&format!("10.88.{}.", fx.subnet)),
            "{ip}"
        );
    }
    assert_eq!(a.network, fx.network);
    assert_eq!(a.ifname, "eth0");
    assert_eq!(a.port_mappings, vec![tcp(p1, 8080)]);
    assert!(a.host_interfaces().contains(&fx.bridge.as_str()), "{a:?}");
    assert_eq!(networks.list(), vec![a.clone(), b.clone()]);

    // The /etc files the runtime binds in.
    let hosts = std::fs::read_to_string(a.etc_dir.join("hosts")).unwrap();
    assert!(hosts.contains("127.0.0.1\tlocalhost"), "{hosts}");
    assert!(hosts.contains(&format!("{ip_a}\thost-web-1\n")), "{hosts}");
    assert_eq!(
        std::fs::read_to_string(a.etc_dir.join("hostname")).unwrap(),
        "host-web-1\n"
    );
    assert_eq!(
        std::fs::read(a.etc_dir.join("resolv.conf")).unwrap(),
        std::fs::read("/etc/resolv.conf").unwrap_or_default(),
        "no DNS from the plugins: the host's resolv.conf"
    );

    let _sa = Server::start(&a.netns, 8080, "from web-1");
    let _sb = Server::start(&b.netns, 8080, "from web-2");
    // Directly at each address, from the host.
    assert_eq!(fetch(SocketAddr::new(ip_a, 8080)).unwrap(), "from web-1");
    assert_eq!(fetch(SocketAddr::new(ip_b, 8080)).unwrap(), "from web-2");
    // Through the port mappings: portmap's DNAT for the host's own
    // addresses (OUTPUT chain), 127.0.0.1 included (portmap sets
    // route_localnet on the bridge and masquerades such connections).
    let mut targets: Vec<IpAddr> = vec!["127.0.0.1".parse().unwrap(), fx.gateway()];
    targets.extend(host_ipv4());
    for host in targets {
        assert_eq!(
            fetch(SocketAddr::new(host, p1)).unwrap(),
            "from web-1",
            "{host}:{p1}"
        );
        assert_eq!(
            fetch(SocketAddr::new(host, p2)).unwrap(),
            "from web-2",
            "{host}:{p2}"
        );
    }

    drop(_sa);
    let started = Instant::now();
    networks.detach("web-1").await.unwrap();
    let detach_ms = started.elapsed().as_secs_f64() * 1e3;
    eprintln!("attach {attach_ms:.1} ms, detach {detach_ms:.1} ms (bridge + portmap, with lo)");
    assert_gone(&a);
    assert!(fetch(SocketAddr::new("127.0.0.1".parse().unwrap(), p1)).is_err());
    assert_eq!(networks.list(), vec![b.clone()], "web-2 stays");
    assert_eq!(
        fetch(SocketAddr::new("127.0.0.1".parse().unwrap(), p2)).unwrap(),
        "from web-2"
    );
    // Detaching again, or what was never attached, does nothing.
    networks.detach("web-1").await.unwrap();
    networks.detach("never").await.unwrap();
    assert!(matches!(
        networks.check("web-1").await,
        Err(NetworkError::NotAttached(_))
    ));

    drop(_sb);
    networks.detach("web-2").await.unwrap();
    assert_gone(&b);
    assert!(networks.list().is_empty());
    // The addresses went back to host-local.
    let ipam = fx.tmp.path().join("ipam").join(&fx.network);
    let held: Vec<_> = std::fs::read_dir(&ipam)
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("10."))
        .collect();
    assert!(held.is_empty(), "addresses still held: {held:?}");
}

#[tokio::test]
async fn recovery_keeps_live_attachments_and_detaches_orphans() {
    if skip("recovery_keeps_live_attachments_and_detaches_orphans") {
        return;
    }
    let _one = ONE_AT_A_TIME.lock().await;
    let fx = Fixture::new();
    fx.write_bridge_network();
    let port = free_port();
    let (live, orphan) = {
        let networks = fx.networks().await;
        let live = networks.attach(fx.request("live", vec![])).await.unwrap();
        let orphan = networks
            .attach(fx.request("orphan", vec![tcp(port, 80)]))
            .await
            .unwrap();
        (live, orphan)
    };
    // An agent restart: a new instance over the same root.
    let networks = fx.networks().await;
    assert!(networks.list().is_empty(), "nothing known before recover");
    let recovered = networks.recover(&|id| id == "live").await.unwrap();
    assert_eq!(recovered.kept, vec![live.clone()]);
    assert_eq!(recovered.detached, vec!["orphan".to_string()]);
    assert!(recovered.failed.is_empty(), "{:?}", recovered.failed);
    assert_gone(&orphan);
    assert_eq!(networks.list(), vec![live.clone()]);
    // The live one still works, and CHECK finds it as ADD left it (a
    // container without port mappings: Debian's portmap 1.1.1 fails CHECK
    // for an IPv4-only container with mappings, containernetworking/
    // plugins#819).
    networks.check("live").await.unwrap();
    let _s = Server::start(&live.netns, 8080, "still here");
    assert_eq!(
        fetch(SocketAddr::new(live.ip_addresses[0], 8080)).unwrap(),
        "still here"
    );
    drop(_s);
    // Once its container is gone too, a later recovery detaches it.
    let networks = fx.networks().await;
    let recovered = networks.recover(&|_| false).await.unwrap();
    assert!(recovered.kept.is_empty());
    assert_eq!(recovered.detached, vec!["live".to_string()]);
    assert_gone(&live);
}

#[tokio::test]
async fn bad_configurations_are_refused_naming_their_file() {
    if skip("bad_configurations_are_refused_naming_their_file") {
        return;
    }
    let _one = ONE_AT_A_TIME.lock().await;
    let fx = Fixture::new();
    fx.write_bridge_network();

    let bad = fx.write("20-broken.conf", "{\"cniVersion\": \"1.0.0\", \"name\": ");
    let err = Networks::new(fx.config()).await.unwrap_err();
    assert!(
        matches!(&err, NetworkError::Config(ConfigError::Invalid { file, .. }) if *file == bad),
        "{err}"
    );
    assert!(err.to_string().contains("20-broken.conf"), "{err}");
    std::fs::remove_file(&bad).unwrap();

    let twin = fx.write(
        "30-twin.conf",
        &format!(
            r#"{{"cniVersion": "1.0.0", "name": "{}", "type": "bridge"}}"#,
            fx.network
        ),
    );
    let err = Networks::new(fx.config()).await.unwrap_err();
    let text = err.to_string();
    assert!(
        text.contains("10-bridge.conflist") && text.contains("30-twin.conf"),
        "{text}"
    );
    std::fs::remove_file(&twin).unwrap();

    let missing = fx.write(
        "40-missing.conf",
        r#"{"cniVersion": "1.0.0", "name": "other", "type": "no-such-plugin"}"#,
    );
    let err = Networks::new(fx.config()).await.unwrap_err().to_string();
    assert!(
        err.contains("40-missing.conf") && err.contains("no-such-plugin"),
        "{err}"
    );
    std::fs::remove_file(&missing).unwrap();

    let old = fx.write(
        "50-old.conf",
        r#"{"cniVersion": "0.2.0", "name": "old", "type": "bridge"}"#,
    );
    let err = Networks::new(fx.config()).await.unwrap_err().to_string();
    assert!(
        err.contains("50-old.conf") && err.contains("0.2.0"),
        "{err}"
    );
    std::fs::remove_file(&old).unwrap();

    let mut config = fx.config();
    config.default_bridge = Some("nope".into());
    let err = Networks::new(config).await.unwrap_err();
    assert!(
        matches!(err, NetworkError::UnknownDefaultBridge(_)),
        "{err}"
    );

    // Configured right: what requests may ask.
    let networks = fx.networks().await;
    assert!(matches!(
        networks.resolve(&NetworkChoice::Bridge),
        Err(NetworkError::NoDefaultBridge)
    ));
    assert!(networks.resolve(&NetworkChoice::Host).unwrap().is_none());
    let mut config = fx.config();
    config.default_bridge = Some(fx.network.clone());
    let with_bridge = Networks::new(config).await.unwrap();
    let conf = with_bridge
        .resolve(&NetworkChoice::Bridge)
        .unwrap()
        .unwrap();
    assert_eq!(conf.name, fx.network);
    assert_eq!(conf.plugin_types(), vec!["bridge", "portmap"]);
    let err = networks
        .attach(AttachRequest {
            network: "elsewhere".into(),
            ..fx.request("c", vec![])
        })
        .await
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("'elsewhere'") && err.contains(&fx.network),
        "{err}"
    );
    let twice = networks
        .attach(fx.request("c", vec![tcp(4000, 80), tcp(4000, 81)]))
        .await
        .unwrap_err();
    assert!(
        matches!(twice, NetworkError::InvalidPortMapping(_)),
        "{twice}"
    );
    assert!(matches!(
        networks.attach(fx.request("bad/id", vec![])).await,
        Err(NetworkError::InvalidContainerId(_))
    ));
    assert!("sctp".parse::<Protocol>().is_err());
}

#[tokio::test]
async fn a_plugin_error_is_reported_with_its_code_and_nothing_is_left() {
    if skip("a_plugin_error_is_reported_with_its_code_and_nothing_is_left") {
        return;
    }
    let _one = ONE_AT_A_TIME.lock().await;
    let fx = Fixture::new();
    // Loads (the plugins exist and speak 1.0.0), but host-local refuses
    // the range when asked for an address.
    let conf = serde_json::json!({
        "cniVersion": "1.0.0",
        "name": fx.network,
        "type": "bridge",
        "bridge": fx.bridge,
        "ipam": {"type": "host-local", "ranges": [[{"subnet": "10.88.0.0/33"}]],
                 "dataDir": fx.tmp.path().join("ipam")}
    });
    fx.write("10-bad-range.conf", &conf.to_string());
    let networks = fx.networks().await;
    let err = networks
        .attach(fx.request("broken", vec![]))
        .await
        .unwrap_err();
    match &err {
        NetworkError::Plugin { plugin, error, .. } => {
            let PluginError::Reported { code, msg, .. } = &**error else {
                panic!("not the plugin's error object: {error}");
            };
            assert_eq!(plugin, "bridge");
            assert!(*code > 0, "{err}");
            assert!(!msg.is_empty(), "{err}");
        }
        other => panic!("not the plugin's error object: {other}"),
    }
    eprintln!("{err}");
    assert!(
        std::fs::read_dir(networks.netns_dir())
            .unwrap()
            .next()
            .is_none(),
        "a namespace is left"
    );
    assert!(
        std::fs::read_dir(fx.root().join("containers"))
            .unwrap()
            .next()
            .is_none(),
        "a checkpoint is left"
    );
    assert!(networks.list().is_empty());
    // Port mappings on a network without portmap are refused up front.
    let err = networks
        .attach(fx.request("mapped", vec![tcp(4000, 80)]))
        .await
        .unwrap_err();
    assert!(
        matches!(err, NetworkError::PortMappingsUnsupported { .. }),
        "{err}"
    );
}

/// busybox `httpd` in a container of the runtime on the bridge network,
/// reached over HTTP from the host at its address and through its port
/// mapping; a container without an image on the same network sees its
/// own address and /etc files.
#[tokio::test]
async fn a_busybox_httpd_container_on_the_network_is_reached_from_the_host() {
    if skip("a_busybox_httpd_container_on_the_network...")
        || support::skip("a_busybox_httpd_container_on_the_network...")
    {
        return;
    }
    let _one = ONE_AT_A_TIME.lock().await;
    let fx = Fixture::new();
    fx.write_bridge_network();
    let networks = fx.networks().await;
    let images = support::Fixture::new();
    let runtime = Runtime::new(images.config()).unwrap();
    let port = free_port();

    let web = networks
        .attach(fx.request("httpd", vec![tcp(port, 8080)]))
        .await
        .unwrap();
    // Another namespace, detached while the container runs: the mount
    // namespace of the container's monitor must not keep it.
    let other = networks.attach(fx.request("other", vec![])).await.unwrap();

    let script = "mkdir -p /tmp/www && echo served-by-busybox > /tmp/www/index.html; \
        cat /etc/hosts > $MESOS_SANDBOX/hosts; hostname > $MESOS_SANDBOX/hostname; \
        /bin/busybox ip -4 addr show eth0 > $MESOS_SANDBOX/addr; \
        exec /bin/busybox httpd -f -p 8080 -h /tmp/www";
    let mut spec = images.spec("httpd", script);
    spec.network = web.runtime_network();
    spec.hostname = Some(web.hostname.clone());
    let mut container = runtime.launch(spec).await.unwrap();
    let ip = web.ip_addresses[0];
    let direct = SocketAddr::new(ip, 8080);
    let mapped = SocketAddr::new("127.0.0.1".parse().unwrap(), port);
    let page = http_get(direct, Duration::from_secs(10));
    let sandbox = images.sandbox("httpd");
    assert!(
        page.contains("served-by-busybox"),
        "GET http://{direct}/: {page}\nstderr: {}",
        support::read(&sandbox, "stderr")
    );
    assert!(
        page.starts_with("HTTP/1.0 200") || page.starts_with("HTTP/1.1 200"),
        "{page}"
    );
    assert!(http_get(mapped, Duration::from_secs(5)).contains("served-by-busybox"));
    let hosts = support::read(&sandbox, "hosts");
    assert!(hosts.contains(&format!("{ip}\thost-httpd")), "{hosts}");
    assert_eq!(support::read(&sandbox, "hostname"), "host-httpd\n");
    assert!(
        support::read(&sandbox, "addr").contains(&format!("inet {ip}/24")),
        "{}",
        support::read(&sandbox, "addr")
    );

    // The container's monitor (conmon, its first process's parent).
    let stat = std::fs::read_to_string(format!("/proc/{}/stat", container.pid())).unwrap();
    let conmon_pid: u32 = stat
        .rsplit_once(')')
        .and_then(|(_, rest)| rest.split_whitespace().nth(1))
        .and_then(|p| p.parse().ok())
        .unwrap();
    let conmon_mounts =
        || std::fs::read_to_string(format!("/proc/{conmon_pid}/mountinfo")).unwrap();
    let other_netns = other.netns.to_string_lossy().into_owned();
    let before = conmon_mounts().contains(&other_netns);
    networks.detach("other").await.unwrap();
    assert_gone(&other);
    // Gone from the monitor's mount namespace too (when it has one of its
    // own, as on a hybrid cgroup host), so nothing holds it alive.
    assert!(
        !conmon_mounts().contains(&other_netns),
        "conmon's mount namespace keeps the detached namespace (mounted there before: {before})"
    );

    runtime.destroy("httpd").await.unwrap();
    let _ = container.wait().await;
    networks.detach("httpd").await.unwrap();
    assert_gone(&web);
    assert!(TcpStream::connect_timeout(&direct, Duration::from_millis(500)).is_err());

    // Without an image: the host's files, its own network and /etc files.
    let plain = networks.attach(fx.request("plain", vec![])).await.unwrap();
    let mut spec = images.spec("plain", "");
    spec.rootfs = RootFs::Host;
    spec.command = CommandSpec {
        shell: true,
        value: Some("cat /etc/hosts; hostname; cat /etc/hostname; cat /proc/net/dev".into()),
        arguments: vec![],
    };
    spec.network = plain.runtime_network();
    spec.hostname = Some(plain.hostname.clone());
    let mut container = runtime.launch(spec).await.unwrap();
    let exit = container.wait().await;
    let out = support::read(&images.sandbox("plain"), "stdout");
    assert!(
        exit.success(),
        "{exit}: {out} {}",
        support::read(&images.sandbox("plain"), "stderr")
    );
    assert!(
        out.contains(&format!("{}\thost-plain", plain.ip_addresses[0])),
        "{out}"
    );
    assert!(out.contains("host-plain\n"), "{out}");
    // Its own interfaces (/proc/net is the reader's namespace's; /sys is
    // the host's, as under Mesos).
    let mut ifaces: Vec<&str> = out
        .lines()
        .filter_map(|l| l.split_once(':'))
        .map(|(name, _)| name.trim())
        .filter(|n| !n.contains(' ') && !n.is_empty())
        .collect();
    ifaces.sort();
    assert_eq!(ifaces, vec!["eth0", "lo"], "{out}");
    runtime.destroy("plain").await.unwrap();
    networks.detach("plain").await.unwrap();
    assert_gone(&plain);
}

/// `GET /` at `addr`, retried until it answers or `within` passes.
fn http_get(addr: SocketAddr, within: Duration) -> String {
    let deadline = Instant::now() + within;
    loop {
        let attempt = (|| -> std::io::Result<String> {
            let mut conn = TcpStream::connect_timeout(&addr, Duration::from_secs(1))?;
            conn.set_read_timeout(Some(Duration::from_secs(2)))?;
            conn.write_all(b"GET / HTTP/1.0\r\nHost: test\r\n\r\n")?;
            let mut out = String::new();
            conn.read_to_string(&mut out)?;
            Ok(out)
        })();
        match attempt {
            Ok(page) if !page.is_empty() => return page,
            other if Instant::now() > deadline => return format!("no answer: {other:?}"),
            _ => std::thread::sleep(Duration::from_millis(50)),
        }
    }
}
