//! An etcd server of a test's own, on 127.0.0.1 ephemeral ports with
//! its own data dir (Debian's `etcd-server`). Without the binary a test
//! is skipped with a message, except under `CI=true`, where it fails.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use agora_proto::etcd::Client;
use nix::sys::signal::Signal;

use super::wait_until;

/// An etcd server of our own.
pub struct Etcd {
    child: Child,
    /// `HOST:PORT` of its client port.
    pub endpoint: String,
}

// === impl Etcd ===

impl Etcd {
    /// Starts etcd, or `None` (skip) when it is not installed outside CI.
    pub fn start(dir: &Path) -> Option<Etcd> {
        let Some(program) = etcd_binary() else {
            assert!(
                std::env::var("CI").as_deref() != Ok("true"),
                "etcd is not installed (apt-get install etcd-server); under CI=true this fails the run"
            );
            eprintln!("skipping: etcd is not installed (apt-get install etcd-server)");
            return None;
        };
        let (client, peer) = (free_port(), free_port());
        let data = dir.join("etcd-data");
        let log = std::fs::File::create(dir.join("etcd.log")).expect("etcd log");
        let url = |port: u16| format!("http://127.0.0.1:{port}");
        let child = Command::new(program)
            .args(["--name", "test", "--data-dir"])
            .arg(&data)
            .args(["--listen-client-urls", &url(client)])
            .args(["--advertise-client-urls", &url(client)])
            .args(["--listen-peer-urls", &url(peer)])
            .args(["--initial-advertise-peer-urls", &url(peer)])
            .args(["--initial-cluster", &format!("test={}", url(peer))])
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("log"))
            .stderr(log)
            .spawn()
            .expect("start etcd");
        let etcd = Etcd {
            child,
            endpoint: format!("127.0.0.1:{client}"),
        };
        let client = etcd.client();
        wait_until(
            Duration::from_secs(20),
            "etcd to answer",
            || std::fs::read_to_string(dir.join("etcd.log")).unwrap_or_default(),
            || client.get(b"/probe").ok(),
        );
        Some(etcd)
    }

    /// A client for it.
    pub fn client(&self) -> Client {
        Client::new(&self.endpoint).expect("etcd endpoint")
    }

    /// Sends it a signal (SIGSTOP freezes it).
    pub fn signal(&self, signal: Signal) {
        let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(self.child.id() as i32), signal);
    }
}

impl Drop for Etcd {
    fn drop(&mut self) {
        self.signal(Signal::SIGCONT);
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn etcd_binary() -> Option<PathBuf> {
    std::env::var_os("PATH")
        .into_iter()
        .flat_map(|path| std::env::split_paths(&path).collect::<Vec<_>>())
        .map(|dir| dir.join("etcd"))
        .find(|p| p.is_file())
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("free port")
}
