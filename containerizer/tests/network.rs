//! CNI networks with real parts: Debian's plugins (`bridge`, `host-local`,
//! `portmap`, `loopback`), iptables, network namespaces, and for the last
//! test crun and a busybox image. Each test writes a bridge network of
//! its own into a temporary configuration directory, and a guard removes
//! everything it may have left, even when the test fails (see
//! `support/cni.rs`).
//!
//! Skips, saying why, when not root or without the plugins, iptables or
//! `ip` (which only the guard uses, to remove the bridge).
//!
//! The tests run one at a time (they share the bridge name and
//! iptables' chains).

#[path = "support/cni.rs"]
mod cni;
mod support;

use std::io::{Read, Write};
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use agora_containerizer::network::{
    config::ConfigError, AttachRequest, Attachment, NetworkChoice, NetworkError, Networks,
    PluginError, Protocol,
};
use agora_containerizer::runtime::{CommandSpec, RootFs, Runtime};
use cni::{cannot_run_cni, free_port, nat_rules, run, tcp, Fixture};

/// The tests share the bridge device and iptables' chains.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

fn skip(test: &str) -> bool {
    match cannot_run_cni() {
        Some(why) => {
            eprintln!("skipping {test}: {why}");
            true
        }
        None => false,
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
            // Both families where the kernel has IPv6.
            let listener = TcpListener::bind(("::", port))
                .or_else(|_| TcpListener::bind(("0.0.0.0", port)))
                .unwrap();
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
async fn a_dual_stack_network_gives_an_ipv4_and_an_ipv6_address() {
    if skip("a_dual_stack_network_gives_an_ipv4_and_an_ipv6_address") {
        return;
    }
    if !Path::new("/proc/net/if_inet6").exists() {
        eprintln!("skipping a_dual_stack_network...: no IPv6 in this kernel");
        return;
    }
    let _one = ONE_AT_A_TIME.lock().await;
    let fx = Fixture::new();
    let conf = serde_json::json!({
        "cniVersion": "1.0.0",
        "name": fx.network,
        "plugins": [{
            "type": "bridge",
            "bridge": fx.bridge,
            "isGateway": true,
            "ipam": {
                "type": "host-local",
                "ranges": [
                    [{"subnet": format!("10.88.{}.0/24", fx.subnet)}],
                    [{"subnet": format!("fd00:88:{}::/64", fx.subnet)}]
                ],
                "dataDir": fx.tmp.path().join("ipam"),
            }
        }]
    });
    fx.write("10-dual.conflist", &conf.to_string());
    let networks = fx.networks().await;
    let a = networks.attach(fx.request("dual", vec![])).await.unwrap();
    let v4: Vec<_> = a.ip_addresses.iter().filter(|ip| ip.is_ipv4()).collect();
    let v6: Vec<_> = a.ip_addresses.iter().filter(|ip| ip.is_ipv6()).collect();
    assert_eq!((v4.len(), v6.len()), (1, 1), "{:?}", a.ip_addresses);
    assert!(
        v6[0]
            .to_string()
            .starts_with(&format!("fd00:88:{}:", fx.subnet)),
        "{v6:?}"
    );
    let hosts = std::fs::read_to_string(a.etc_dir.join("hosts")).unwrap();
    assert!(
        hosts.contains(&format!("{}\thost-dual\n", v6[0])),
        "{hosts}"
    );
    let _s = Server::start(&a.netns, 8080, "over v6");
    let deadline = Instant::now() + Duration::from_secs(5);
    // The address is usable once duplicate address detection is done.
    let answer = loop {
        match fetch(SocketAddr::new(*v6[0], 8080)) {
            Ok(answer) => break answer,
            Err(e) if Instant::now() > deadline => panic!("[{}]:8080: {e}", v6[0]),
            Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
        }
    };
    assert_eq!(answer, "over v6");
    drop(_s);
    networks.detach("dual").await.unwrap();
    assert_gone(&a);
}

#[tokio::test]
async fn concurrent_attaches_get_distinct_addresses_and_concurrent_detaches_leave_nothing() {
    if skip("concurrent_attaches_get_distinct_addresses...") {
        return;
    }
    let _one = ONE_AT_A_TIME.lock().await;
    let fx = Fixture::new();
    fx.write_bridge_network();
    let networks = Arc::new(fx.networks().await);
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..8 {
        let networks = networks.clone();
        let request = fx.request(&format!("many-{i}"), vec![tcp(free_port(), 80)]);
        tasks.spawn(async move { networks.attach(request).await });
    }
    let mut attached = Vec::new();
    while let Some(done) = tasks.join_next().await {
        attached.push(done.unwrap().unwrap());
    }
    let mut ips: Vec<IpAddr> = attached.iter().map(|a| a.ip_addresses[0]).collect();
    ips.sort();
    ips.dedup();
    assert_eq!(ips.len(), 8, "{ips:?}");
    assert_eq!(networks.list().len(), 8);
    // The same container twice is refused while attached.
    let again = networks.attach(fx.request("many-0", vec![])).await;
    assert!(
        matches!(again, Err(NetworkError::AlreadyAttached(_))),
        "{again:?}"
    );
    let mut detaches = tokio::task::JoinSet::new();
    for a in &attached {
        let networks = networks.clone();
        let id = a.container_id.clone();
        detaches.spawn(async move { networks.detach(&id).await });
    }
    while let Some(done) = detaches.join_next().await {
        done.unwrap().unwrap();
    }
    for a in &attached {
        assert_gone(a);
    }
    assert!(networks.list().is_empty());
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
async fn a_detach_that_fails_keeps_the_attachment_for_another_try() {
    if skip("a_detach_that_fails_keeps_the_attachment_for_another_try") {
        return;
    }
    let _one = ONE_AT_A_TIME.lock().await;
    let fx = Fixture::new();
    fx.write_bridge_network();
    // A plugins directory of links to Debian's, so portmap can go away.
    let plugins = fx.tmp.path().join("plugins");
    std::fs::create_dir_all(&plugins).unwrap();
    for entry in std::fs::read_dir(cni::PLUGINS_DIR).unwrap().flatten() {
        std::os::unix::fs::symlink(entry.path(), plugins.join(entry.file_name())).unwrap();
    }
    let mut config = fx.config();
    config.plugins_dir = plugins.clone();
    let networks = Networks::new(config).await.unwrap();
    let port = free_port();
    let a = networks
        .attach(fx.request("kept", vec![tcp(port, 80)]))
        .await
        .unwrap();
    std::fs::rename(plugins.join("portmap"), fx.tmp.path().join("portmap")).unwrap();
    let err = networks.detach("kept").await.unwrap_err();
    assert!(
        matches!(&err, NetworkError::Detach { .. }) && err.to_string().contains("portmap"),
        "{err}"
    );
    // The namespace went (the container is gone), the rest is kept.
    assert!(!a.netns.exists());
    assert_eq!(networks.list(), vec![a.clone()]);
    assert!(nat_rules().contains("id: \\\"kept\\\""));
    std::fs::rename(fx.tmp.path().join("portmap"), plugins.join("portmap")).unwrap();
    networks.detach("kept").await.unwrap();
    assert_gone(&a);
    assert!(networks.list().is_empty());
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
