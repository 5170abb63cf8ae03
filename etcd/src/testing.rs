//! An etcd server of a test's own (feature `testing`), on 127.0.0.1
//! ephemeral ports with its own data dir (Debian's `etcd-server`).
//! Without the binary, [`TestEtcd::start`] returns `None` with a printed
//! reason, so the test is skipped, except under `CI=true`, where it
//! panics: CI must not pass without running what needs etcd.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use nix::sys::signal::Signal;

/// How long a started etcd has to answer.
const START_WAIT: Duration = Duration::from_secs(20);

/// An etcd server of our own; killed when dropped.
#[derive(Debug)]
pub struct TestEtcd {
    child: Child,
    /// `HOST:PORT` of its client port.
    pub endpoint: String,
    log: PathBuf,
}

// === impl TestEtcd ===

impl TestEtcd {
    /// Starts etcd with its data and log in `dir`, or `None` (skip) when
    /// it is not installed outside CI.
    pub fn start(dir: &Path) -> Option<TestEtcd> {
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
        let log = dir.join("etcd.log");
        let file = std::fs::File::create(&log).expect("etcd log");
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
            .stdout(file.try_clone().expect("log"))
            .stderr(file)
            .spawn()
            .expect("start etcd");
        let etcd = TestEtcd {
            child,
            endpoint: format!("127.0.0.1:{client}"),
            log,
        };
        let client = etcd.client();
        let deadline = Instant::now() + START_WAIT;
        while client.get(b"/probe").is_err() {
            assert!(
                Instant::now() < deadline,
                "etcd did not answer within {START_WAIT:?}:\n{}",
                etcd.log_text()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        Some(etcd)
    }

    /// A blocking client for it.
    pub fn client(&self) -> crate::blocking::Client {
        crate::blocking::Client::new(&self.endpoint).expect("etcd endpoint")
    }

    /// Its process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Sends it a signal (SIGSTOP freezes it, SIGCONT thaws it).
    pub fn signal(&self, signal: Signal) {
        let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(self.child.id() as i32), signal);
    }

    /// What it logged.
    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for TestEtcd {
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
