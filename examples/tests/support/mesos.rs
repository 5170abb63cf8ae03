//! Real Mesos client libraries as test frameworks: the Python ones
//! (pymesos 0.3.15, mesoshttp 0.4.2) from the venv `.ci/run` builds, and
//! a mesos-go scheduler (`tests/mesos-go/scheduler`) built here with
//! Debian's Go toolchain and `golang-github-mesos-mesos-go-dev`. Each runs
//! as a process that prints one JSON object per line (`{"event": …}`),
//! read by [`Client`].
//!
//! A missing client is skipped with a message, except under `CI=true`,
//! where it fails the test.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{mpsc, Mutex};
use std::time::{Duration, Instant};

use super::TestCluster;

/// How long a client script may take for one step.
pub const SCRIPT_TIMEOUT: Duration = Duration::from_secs(120);

/// Where Debian's `golang-github-mesos-mesos-go-dev` puts its sources.
const DEBIAN_GOPATH: &str = "/usr/share/gocode";
const MESOS_GO_LIB: &str = "src/github.com/mesos/mesos-go/api/v1/lib";

/// One `go build` at a time: the first fills the build cache, the
/// others only link.
static GO_BUILD: Mutex<()> = Mutex::new(());

/// A codec of mesos-go's scheduler client.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GoCodec {
    /// `application/x-protobuf`, mesos-go's default.
    Protobuf,
    /// `application/json`.
    Json,
}

/// A mesos-go program, built; removed when dropped.
pub struct GoProgram {
    /// The executable.
    pub path: PathBuf,
    _dir: tempfile::TempDir,
}

/// A client process running in the background, its JSON lines on a
/// channel; killed when dropped.
pub struct Client {
    /// The process.
    pub child: Child,
    lines: mpsc::Receiver<serde_json::Value>,
    seen: Vec<serde_json::Value>,
    stderr: PathBuf,
}

// === impl GoCodec ===

impl GoCodec {
    /// Its name for the scheduler's `-codec` flag.
    pub fn flag(self) -> &'static str {
        match self {
            GoCodec::Protobuf => "protobuf",
            GoCodec::Json => "json",
        }
    }
}

// === impl Client ===

impl Client {
    /// Starts `program args…` with stderr in `dir/LABEL.stderr`.
    pub fn start(program: &Path, args: &[&str], dir: &Path, label: &str) -> Client {
        let stderr = dir.join(format!("{}.stderr", label.replace(['/', ':', ' '], "_")));
        let mut child = Command::new(program)
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(&stderr).expect("stderr file"))
            .spawn()
            .unwrap_or_else(|e| panic!("starting {}: {e}", program.display()));
        let stdout = child.stdout.take().expect("stdout");
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                match serde_json::from_str(&line) {
                    Ok(value) => {
                        if tx.send(value).is_err() {
                            break;
                        }
                    }
                    Err(_) => eprintln!("client: {line}"),
                }
            }
        });
        Client {
            child,
            lines,
            seen: Vec::new(),
            stderr,
        }
    }

    /// A Python client script of `examples/tests/mesos/`.
    pub fn python(python: &Path, script: &str, args: &[&str], dir: &Path) -> Client {
        let path = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/mesos")
            .join(script);
        let mut all = vec![path.to_str().expect("script path")];
        all.extend_from_slice(args);
        Client::start(python, &all, dir, &format!("{script}-{}", args.join("-")))
    }

    /// The mesos-go scheduler of [`go_scheduler`], running
    /// `scenario` against the scheduler API at `master` (`HOST:PORT`).
    pub fn go(
        scheduler: &GoProgram,
        codec: GoCodec,
        master: &str,
        scenario: &str,
        extra: &[&str],
        dir: &Path,
    ) -> Client {
        let url = format!("http://{master}/api/v1/scheduler");
        let mut args = vec!["-url", &url, "-codec", codec.flag(), "-scenario", scenario];
        args.extend_from_slice(extra);
        let label = format!("mesos-go-{}-{scenario}", codec.flag());
        Client::start(&scheduler.path, &args, dir, &label)
    }

    /// What the client printed so far and its stderr, for messages.
    pub fn context(&self) -> String {
        format!(
            "events: {:#?}\nstderr:\n{}",
            self.seen,
            std::fs::read_to_string(&self.stderr).unwrap_or_default()
        )
    }

    /// Waits for an event named `event`; `logs` adds the servers' logs to
    /// a failure message.
    pub fn expect(&mut self, event: &str, logs: &dyn Fn() -> String) -> serde_json::Value {
        self.expect_that(event, |v| v["event"] == event, logs)
    }

    /// Waits for an event that `matches` (`what` names it in a failure).
    pub fn expect_that(
        &mut self,
        what: &str,
        matches: impl Fn(&serde_json::Value) -> bool,
        logs: &dyn Fn() -> String,
    ) -> serde_json::Value {
        let deadline = Instant::now() + SCRIPT_TIMEOUT;
        while Instant::now() < deadline {
            match self.lines.recv_timeout(Duration::from_millis(200)) {
                Ok(value) => {
                    self.seen.push(value.clone());
                    if value["event"] == "failed" {
                        panic!("client failed: {value}\n{}\n{}", self.context(), logs());
                    }
                    if matches(&value) {
                        return value;
                    }
                }
                Err(mpsc::RecvTimeoutError::Timeout) => {}
                Err(mpsc::RecvTimeoutError::Disconnected) => break,
            }
        }
        panic!("no {what} from the client\n{}\n{}", self.context(), logs());
    }

    /// Every event printed so far (those already waited for included).
    pub fn seen(&self) -> &[serde_json::Value] {
        &self.seen
    }

    /// Waits for the client's "done" and for it to exit successfully;
    /// returns every event it printed.
    pub fn finish(mut self, logs: &dyn Fn() -> String) -> Vec<serde_json::Value> {
        self.expect("done", logs);
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(status) = self.child.try_wait().expect("wait") {
                assert!(
                    status.success(),
                    "client exited with {status}\n{}",
                    self.context()
                );
                break;
            }
            assert!(
                Instant::now() < deadline,
                "client did not exit\n{}",
                self.context()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        while let Ok(value) = self.lines.try_recv() {
            self.seen.push(value);
        }
        std::mem::take(&mut self.seen)
    }
}

impl Drop for Client {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Skips (`None`) a test whose tool is missing, or fails it under CI.
fn missing<T>(what: &str, how: &str) -> Option<T> {
    assert!(
        std::env::var("CI").as_deref() != Ok("true"),
        "{what} is missing ({how}); under CI=true this fails the run"
    );
    eprintln!("skipping: {what} is missing ({how})");
    None
}

/// The venv's python with pymesos and mesoshttp, or `None` (skip)
/// outside CI when it is missing.
pub fn python() -> Option<PathBuf> {
    let venv = std::env::var_os("AGORA_MESOS_VENV")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/opt/agora-mesos-venv"));
    let python = venv.join("bin/python");
    let usable = python.is_file()
        && Command::new(&python)
            .args(["-c", "import pymesos, mesoshttp"])
            .status()
            .is_ok_and(|s| s.success());
    if usable {
        return Some(python);
    }
    missing(
        &format!(
            "the Mesos client venv {} (pymesos, mesoshttp)",
            venv.display()
        ),
        ".ci/run builds it",
    )
}

/// The venv's python with avmesos-cli 1.3 (the Mesos CLI), or `None`
/// (skip) outside CI when it is missing.
pub fn mesos_cli_python() -> Option<PathBuf> {
    let venv = std::env::var_os("AGORA_MESOS_CLI_VENV")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/opt/agora-mesos-cli-venv"));
    let python = venv.join("bin/python");
    let usable = python.is_file()
        && Command::new(&python)
            .args([
                "-c",
                "import avmesos.cli.mesos, avmesos.cli.plugins.task.main",
            ])
            .status()
            .is_ok_and(|s| s.success());
    if usable {
        return Some(python);
    }
    missing(
        &format!("the Mesos CLI venv {} (avmesos-cli 1.3.0)", venv.display()),
        ".ci/run builds it",
    )
}

/// The mesos-go scheduler (`tests/mesos-go/scheduler`), built.
pub fn go_scheduler() -> Option<GoProgram> {
    go_build("scheduler")
}

/// The mesos-go operator watcher (`tests/mesos-go/operator`), built.
pub fn go_operator() -> Option<GoProgram> {
    go_build("operator")
}

/// The mesos-go executor (`tests/mesos-go/executor`), built.
pub fn go_executor() -> Option<GoProgram> {
    go_build("executor")
}

/// Builds the Go program `tests/mesos-go/PACKAGE` into a temp dir with
/// `go build` in GOPATH mode against Debian's mesos-go, or `None` (skip)
/// outside CI when Go or mesos-go is not installed. A build that fails
/// is a test failure.
fn go_build(package: &str) -> Option<GoProgram> {
    let gopath = std::env::var("AGORA_MESOS_GOPATH").unwrap_or_else(|_| DEBIAN_GOPATH.into());
    let has_go = Command::new("go")
        .arg("version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    let has_lib = std::env::split_paths(&gopath).any(|p| p.join(MESOS_GO_LIB).is_dir());
    if !has_go || !has_lib {
        return missing(
            "Go with mesos-go's v1 library",
            "apt-get install golang-go golang-github-mesos-mesos-go-dev; .ci/run does",
        );
    }
    let source = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../tests/mesos-go")
        .join(package);
    let dir = tempfile::Builder::new()
        .prefix("agora-mesos-go-")
        .tempdir()
        .expect("temp dir");
    let binary = dir.path().join(format!("mesos-go-{package}"));
    let _one_at_a_time = GO_BUILD.lock().unwrap_or_else(|e| e.into_inner());
    let started = Instant::now();
    let output = Command::new("go")
        .args(["build", "-o"])
        .arg(&binary)
        .arg(".")
        .current_dir(&source)
        // GOPATH mode: Debian ships mesos-go as sources in its GOPATH and
        // no module proxy is reachable.
        .env("GO111MODULE", "off")
        .env("GOFLAGS", "")
        .env("GOPROXY", "off")
        .env("GOPATH", &gopath)
        .env(
            "GOCACHE",
            Path::new(env!("CARGO_TARGET_TMPDIR")).join("go-build-cache"),
        )
        .output()
        .expect("running go build");
    assert!(
        output.status.success(),
        "go build of {} failed:\n{}{}",
        source.display(),
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    eprintln!(
        "built the mesos-go {package} in {:.1} s",
        started.elapsed().as_secs_f64()
    );
    Some(GoProgram {
        path: binary,
        _dir: dir,
    })
}

/// The states of the updates of `task` a client printed, in order.
pub fn updates<'a>(events: &'a [serde_json::Value], task: &str) -> Vec<&'a str> {
    events
        .iter()
        .filter(|e| e["event"] == "update" && e["task_id"] == task)
        .filter_map(|e| e["state"].as_str())
        .collect()
}

/// The `frameworks` of a `/master/state`.
pub fn frameworks(state: &serde_json::Value) -> &Vec<serde_json::Value> {
    state["frameworks"].as_array().expect("frameworks")
}

/// Waits until `/master/state` of the master at `addr` says `check`.
pub fn wait_state(
    addr: std::net::SocketAddr,
    what: &str,
    logs: &dyn Fn() -> String,
    check: impl Fn(&serde_json::Value) -> bool,
) {
    super::wait_until(Duration::from_secs(20), what, logs, || {
        let (code, body) = super::http_get(addr, "/master/state").ok()?;
        let state: serde_json::Value = serde_json::from_str(&body).ok()?;
        (code == 200 && check(&state)).then_some(())
    })
}

/// Scheduler failover, as each client plays it on a one-agent cluster:
/// `start(scenario, framework_id)` runs the client's "failover-1" (a long
/// task RUNNING, "ready" with the framework id, then death without a
/// teardown) and "failover-2" (re-subscription with that id, the task
/// found by reconciliation, killed, teardown).
pub fn failover_keeps_the_framework_and_its_task(
    cluster: &TestCluster,
    start: impl Fn(&str, Option<&str>) -> Client,
) {
    let logs = || cluster.logs();
    let mut first = start("failover-1", None);
    let ready = first.expect("ready", &logs);
    let framework_id = ready["framework_id"]
        .as_str()
        .expect("framework id")
        .to_string();
    let _ = first.child.wait();
    wait_framework_awaits_failover(cluster.master.addr, &framework_id, &logs);
    let events = start("failover-2", Some(&framework_id)).finish(&logs);
    assert_eq!(
        updates(&events, "survivor"),
        ["TASK_RUNNING", "TASK_KILLED"]
    );
    wait_state(cluster.master.addr, "the framework torn down", &logs, |s| {
        frameworks(s).is_empty()
    });
}

/// A master restart, as each client plays it: `client` runs the
/// client's "restart" scenario (a long task RUNNING, "ready"), the master
/// restarts on its port, the client re-subscribes by itself with the same
/// framework id ("reregistered"), finds its task again and kills it.
pub fn resubscribes_after_a_master_restart(cluster: &mut TestCluster, mut client: Client) {
    let ready = client.expect("ready", &|| cluster.logs());
    cluster.master.restart_same_port();
    let again = client.expect("reregistered", &|| cluster.logs());
    assert_eq!(again["framework_id"], ready["framework_id"]);
    let events = client.finish(&|| cluster.logs());
    assert_eq!(
        updates(&events, "steady").last(),
        Some(&"TASK_KILLED"),
        "{events:#?}"
    );
}

/// Waits until framework `id` is disconnected at the master at `addr`
/// with its one task kept: its scheduler died without a teardown and the
/// framework waits for it to fail over.
pub fn wait_framework_awaits_failover(
    addr: std::net::SocketAddr,
    id: &str,
    logs: &dyn Fn() -> String,
) {
    wait_state(
        addr,
        "the framework disconnected, its task kept",
        logs,
        |s| {
            frameworks(s).iter().any(|f| {
                f["id"] == id
                    && f["connected"] == false
                    && f["tasks"].as_array().is_some_and(|t| t.len() == 1)
            })
        },
    )
}

/// Blocking `POST http://addr/path` with `headers` and `body`, answered
/// with `Connection: close`: status and response head.
pub fn http_post_head(
    addr: std::net::SocketAddr,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> std::io::Result<(u16, String)> {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(5))?;
    stream.set_read_timeout(Some(Duration::from_secs(10)))?;
    let mut request = format!(
        "POST {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\nContent-Length: {}\r\n",
        body.len()
    );
    for (name, value) in headers {
        request.push_str(&format!("{name}: {value}\r\n"));
    }
    request.push_str("\r\n");
    stream.write_all(request.as_bytes())?;
    stream.write_all(body)?;
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw)?;
    let text = String::from_utf8_lossy(&raw);
    let head = text
        .split("\r\n\r\n")
        .next()
        .unwrap_or_default()
        .to_string();
    let code = head
        .get(9..12)
        .and_then(|c| c.parse().ok())
        .ok_or_else(|| std::io::Error::other(format!("bad response head {head:?}")))?;
    Ok((code, head))
}

/// The value of header `name` in a response head.
pub fn header<'a>(head: &'a str, name: &str) -> Option<&'a str> {
    head.lines().skip(1).find_map(|line| {
        let (k, v) = line.split_once(':')?;
        k.trim().eq_ignore_ascii_case(name).then(|| v.trim())
    })
}
