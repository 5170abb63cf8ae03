//! The test cluster: real `agora-master` and `agora-agent` processes on
//! 127.0.0.1 ephemeral ports, each with its own work dir under one temp
//! dir, plus a recording scheduler that turns driver callbacks into a
//! channel a test can read like a script.
//!
//! The binaries come from the workspace's target dir; build them first
//! with `cargo build --workspace --bins` (the README's test command does).

#![allow(dead_code)]

pub mod ledger;
pub mod lossy_proxy;
pub mod mesos;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use agora_proto::{
    AgentId, CommandInfo, ExecutorId, FrameworkId, FrameworkInfo, MasterInfo, Offer, OfferId,
    Resources, TaskId, TaskInfo, TaskStatus,
};
use agora_scheduler::{DriverConfig, Scheduler, SchedulerDriver};

/// Path of a workspace binary, next to this package's own binaries.
pub fn bin(name: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_BIN_EXE_agora-execute"))
        .parent()
        .expect("binary dir")
        .to_path_buf();
    let path = dir.join(name);
    assert!(
        path.is_file(),
        "{} is missing: run `cargo build --workspace --bins` before the tests",
        path.display()
    );
    path
}

/// One server process, killed when dropped.
pub struct Proc {
    /// What it is, for messages.
    pub name: String,
    /// The address it printed.
    pub addr: SocketAddr,
    /// Its work dir.
    pub work_dir: PathBuf,
    child: Option<Child>,
    log: PathBuf,
    args: Vec<String>,
    program: PathBuf,
}

/// A master and agents as real processes.
pub struct TestCluster {
    /// Holds every work dir and log; removed on drop.
    pub dir: tempfile::TempDir,
    /// The master.
    pub master: Proc,
    /// The agents.
    pub agents: Vec<Proc>,
    /// Sent as `Authorization` with the cluster's own HTTP requests (a
    /// master with `--authenticate-http`).
    pub authorization: Option<String>,
    /// TLS for the cluster's own HTTP requests (a master with
    /// `--tls-cert`).
    pub tls: Option<std::sync::Arc<agora_net::tls::rustls::ClientConfig>>,
}

/// What the recording scheduler saw.
#[derive(Debug, Clone)]
pub enum SchedEvent {
    Registered(FrameworkId),
    Reregistered,
    Disconnected,
    Offers(Vec<Offer>),
    Rescinded(OfferId),
    Update(TaskStatus),
    Message(ExecutorId, AgentId, Vec<u8>),
    AgentLost(AgentId),
    ExecutorLost(ExecutorId, AgentId, Option<i32>),
    Error(String),
}

/// A scheduler that forwards every callback to a channel.
pub struct Recorder(pub mpsc::Sender<SchedEvent>);

// === impl Proc ===

impl Proc {
    /// Starts `program args…` (which must print `… listening on ADDR`)
    /// with stderr and the rest of stdout going to `log`.
    pub fn spawn(name: &str, program: &Path, args: &[String], work_dir: &Path, log: &Path) -> Proc {
        let mut proc = Proc {
            name: name.to_string(),
            addr: SocketAddr::from(([127, 0, 0, 1], 0)),
            work_dir: work_dir.to_path_buf(),
            child: None,
            log: log.to_path_buf(),
            args: args.to_vec(),
            program: program.to_path_buf(),
        };
        proc.start();
        proc
    }

    /// Starts the process with its arguments: again, after
    /// [`Proc::kill`].
    pub fn start(&mut self) {
        let stderr = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .expect("log file");
        let mut child = Command::new(&self.program)
            .args(&self.args)
            .env(
                "RUST_LOG",
                std::env::var("RUST_LOG").unwrap_or_else(|_| "info".into()),
            )
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(stderr)
            .spawn()
            .unwrap_or_else(|e| panic!("starting {}: {e}", self.program.display()));
        let stdout = child.stdout.take().expect("stdout");
        let (tx, rx) = mpsc::channel();
        let log = self.log.clone();
        std::thread::spawn(move || {
            let mut lines = BufReader::new(stdout).lines();
            for line in lines.by_ref().map_while(Result::ok) {
                if let Some((_, addr)) = line.split_once("listening on ") {
                    let _ = tx.send(addr.trim().to_string());
                    break;
                }
            }
            let mut out = std::fs::OpenOptions::new().append(true).open(log).ok();
            for line in lines.map_while(Result::ok) {
                if let Some(out) = out.as_mut() {
                    let _ = writeln!(out, "{line}");
                }
            }
        });
        let addr = rx
            .recv_timeout(Duration::from_secs(20))
            .unwrap_or_else(|_| {
                panic!(
                    "{} did not print its address; log:\n{}",
                    self.name,
                    tail(&self.log)
                )
            });
        self.addr = addr
            .parse()
            .unwrap_or_else(|_| panic!("{} printed a bad address {addr:?}", self.name));
        self.child = Some(child);
    }

    /// The process id.
    pub fn pid(&self) -> i32 {
        self.child.as_ref().map(|c| c.id() as i32).unwrap_or(0)
    }

    /// Sends a signal.
    pub fn signal(&self, signal: nix::sys::signal::Signal) {
        let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(self.pid()), signal);
    }

    /// SIGKILLs the process and reaps it.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// SIGTERMs the process and waits up to `grace` before SIGKILL.
    pub fn terminate(&mut self, grace: Duration) {
        if let Some(mut child) = self.child.take() {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(child.id() as i32),
                nix::sys::signal::Signal::SIGTERM,
            );
            let deadline = Instant::now() + grace;
            while Instant::now() < deadline {
                if let Ok(Some(_)) = child.try_wait() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts the process again with the same arguments (same work dir).
    pub fn restart(&mut self) {
        self.kill();
        self.start();
    }

    /// Starts the process again on the address it had (its `--listen`
    /// becomes that address), so peers that know the address reconnect
    /// to the new process. Retries while the port is not yet free.
    pub fn restart_same_port(&mut self) {
        self.kill();
        let addr = self.addr.to_string();
        match self.args.iter().position(|a| a == "--listen") {
            Some(i) if i + 1 < self.args.len() => self.args[i + 1] = addr,
            _ => {
                self.args.push("--listen".into());
                self.args.push(addr);
            }
        }
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let started = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| self.start()));
            match started {
                Ok(()) => return,
                Err(panic) if Instant::now() >= deadline => std::panic::resume_unwind(panic),
                Err(_) => {
                    self.kill();
                    std::thread::sleep(Duration::from_millis(200));
                }
            }
        }
    }

    /// The last lines of its log.
    pub fn log_tail(&self) -> String {
        tail(&self.log)
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.terminate(Duration::from_secs(5));
    }
}

fn tail(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(40)..].join("\n")
}

/// A client process (e.g. `agora-execute`) running in the background with
/// stdout and stderr in files: it can be SIGKILLed, waited for, and is
/// killed when dropped.
pub struct Background {
    /// What it is, for messages.
    pub name: String,
    /// Where its stdout goes.
    pub stdout: PathBuf,
    /// Where its stderr goes.
    pub stderr: PathBuf,
    child: Option<Child>,
}

// === impl Background ===

impl Background {
    /// Starts `program args…`; output goes to `LOG_DIR/NAME.stdout` and
    /// `.stderr` (appended, so a restart keeps the earlier run's output).
    pub fn spawn(name: &str, program: &Path, args: &[String], log_dir: &Path) -> Background {
        let stdout = log_dir.join(format!("{name}.stdout"));
        let stderr = log_dir.join(format!("{name}.stderr"));
        let open = |path: &Path| {
            std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(path)
                .expect("log file")
        };
        let child = Command::new(program)
            .args(args)
            .env(
                "RUST_LOG",
                std::env::var("RUST_LOG").unwrap_or_else(|_| "info".into()),
            )
            .stdin(Stdio::null())
            .stdout(open(&stdout))
            .stderr(open(&stderr))
            .spawn()
            .unwrap_or_else(|e| panic!("starting {}: {e}", program.display()));
        Background {
            name: name.to_string(),
            stdout,
            stderr,
            child: Some(child),
        }
    }

    /// The process id (0 once reaped).
    pub fn pid(&self) -> i32 {
        self.child.as_ref().map(|c| c.id() as i32).unwrap_or(0)
    }

    /// SIGKILLs the process and reaps it.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Waits up to `timeout` for the process to exit by itself.
    pub fn wait(&mut self, timeout: Duration) -> Option<ExitStatus> {
        let deadline = Instant::now() + timeout;
        let child = self.child.as_mut()?;
        loop {
            if let Ok(Some(status)) = child.try_wait() {
                self.child = None;
                return Some(status);
            }
            if Instant::now() >= deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Its output so far, for failure messages.
    pub fn output(&self) -> String {
        format!(
            "--- {} stdout ---\n{}\n--- {} stderr ---\n{}",
            self.name,
            tail(&self.stdout),
            self.name,
            tail(&self.stderr)
        )
    }
}

impl Drop for Background {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Polls `cond` every 20 ms until it returns something, or panics with
/// `what` (and `context()`) after `timeout`.
pub fn wait_until<T>(
    timeout: Duration,
    what: &str,
    context: impl Fn() -> String,
    mut cond: impl FnMut() -> Option<T>,
) -> T {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(found) = cond() {
            return found;
        }
        if Instant::now() >= deadline {
            panic!(
                "timed out after {timeout:?} waiting for {what}\n{}",
                context()
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

// === impl TestCluster ===

impl TestCluster {
    /// A master (with `master_flags`) and `agents` agents advertising `resources`.
    pub fn start_with(agents: usize, resources: &str, master_flags: &[&str]) -> TestCluster {
        Self::start_full(agents, resources, master_flags, &[])
    }

    /// A master (with `master_flags`) and `agents` agents advertising
    /// `resources`, each started with `agent_flags`.
    pub fn start_full(
        agents: usize,
        resources: &str,
        master_flags: &[&str],
        agent_flags: &[&str],
    ) -> TestCluster {
        Self::start_as(agents, resources, master_flags, agent_flags, None)
    }

    /// [`TestCluster::start_full`] whose own HTTP requests carry
    /// `authorization`.
    pub fn start_as(
        agents: usize,
        resources: &str,
        master_flags: &[&str],
        agent_flags: &[&str],
        authorization: Option<String>,
    ) -> TestCluster {
        Self::start_secure(
            agents,
            resources,
            master_flags,
            agent_flags,
            authorization,
            None,
        )
    }

    /// [`TestCluster::start_as`] whose own HTTP requests go over TLS with
    /// `tls`.
    pub fn start_secure(
        agents: usize,
        resources: &str,
        master_flags: &[&str],
        agent_flags: &[&str],
        authorization: Option<String>,
        tls: Option<std::sync::Arc<agora_net::tls::rustls::ClientConfig>>,
    ) -> TestCluster {
        let dir = tempfile::Builder::new()
            .prefix("agora-test-")
            .tempdir()
            .expect("temp dir");
        let master_dir = dir.path().join("master");
        std::fs::create_dir_all(&master_dir).expect("master dir");
        let mut args = vec![
            "--listen".to_string(),
            "127.0.0.1:0".to_string(),
            "--work-dir".to_string(),
            master_dir.display().to_string(),
        ];
        args.extend(master_flags.iter().map(|s| s.to_string()));
        let master = Proc::spawn(
            "master",
            &bin("agora-master"),
            &args,
            &master_dir,
            &dir.path().join("master.log"),
        );
        let mut cluster = TestCluster {
            dir,
            master,
            agents: Vec::new(),
            authorization,
            tls,
        };
        for _ in 0..agents {
            cluster.add_agent(resources, agent_flags);
        }
        cluster.wait_agents(agents);
        cluster
    }

    /// A master (with `master_flags`) and `agents` agents with their own
    /// host names `h0`, `h1`, … and racks (`h0`, `h1` on `r0`; `h2`,
    /// `h3` on `r1`; `h4` alone on `r2`), for placement tests.
    pub fn start_named(agents: usize, resources: &str, master_flags: &[&str]) -> TestCluster {
        let mut cluster = Self::start_with(0, resources, master_flags);
        for i in 0..agents {
            cluster.add_agent_named(
                &format!("h{i}"),
                &format!("rack:{}", named_rack(i)),
                resources,
                &[],
            );
        }
        cluster.wait_agents(agents);
        cluster
    }

    /// A master and `agents` agents with default flags.
    pub fn start(agents: usize, resources: &str) -> TestCluster {
        Self::start_with(agents, resources, &[])
    }

    /// Starts one more agent.
    pub fn add_agent(&mut self, resources: &str, extra: &[&str]) -> usize {
        let master = self.master.addr.to_string();
        self.add_agent_via(&master, resources, extra)
    }

    /// Starts one more agent that reaches the master at `master` (e.g. a
    /// proxy in front of it).
    pub fn add_agent_via(&mut self, master: &str, resources: &str, extra: &[&str]) -> usize {
        let attributes = format!("rack:r{}", self.agents.len() % 2);
        self.add_agent_as(master, resources, &attributes, extra)
    }

    /// Starts one more agent with its own `--hostname` and attributes
    /// (e.g. `rack:r0`), so placement tests see distinct hosts and racks.
    pub fn add_agent_named(
        &mut self,
        hostname: &str,
        attributes: &str,
        resources: &str,
        extra: &[&str],
    ) -> usize {
        let master = self.master.addr.to_string();
        let mut flags = vec!["--hostname", hostname];
        flags.extend_from_slice(extra);
        self.add_agent_as(&master, resources, attributes, &flags)
    }

    fn add_agent_as(
        &mut self,
        master: &str,
        resources: &str,
        attributes: &str,
        extra: &[&str],
    ) -> usize {
        let i = self.agents.len();
        let work_dir = self.dir.path().join(format!("agent-{i}"));
        std::fs::create_dir_all(&work_dir).expect("agent dir");
        let mut args = vec![
            "--master".to_string(),
            master.to_string(),
            "--listen".to_string(),
            "127.0.0.1:0".to_string(),
            "--work-dir".to_string(),
            work_dir.display().to_string(),
            "--resources".to_string(),
            resources.to_string(),
            "--attributes".to_string(),
            attributes.to_string(),
            "--command-executor".to_string(),
            bin("agora-command-executor").display().to_string(),
        ];
        args.extend(agora_examples::local::agent_user_flags());
        args.extend(extra.iter().map(|s| s.to_string()));
        let log = self.dir.path().join(format!("agent-{i}.log"));
        self.agents.push(Proc::spawn(
            &format!("agent {i}"),
            &bin("agora-agent"),
            &args,
            &work_dir,
            &log,
        ));
        i
    }

    /// The master's `/state`.
    pub fn state(&self) -> serde_json::Value {
        let (code, body) = self.get("/state").expect("GET /state");
        assert_eq!(code, 200, "GET /state: {body}");
        serde_json::from_str(&body).expect("state JSON")
    }

    /// Waits until the master lists `n` connected agents.
    pub fn wait_agents(&self, n: usize) {
        let deadline = Instant::now() + Duration::from_secs(30);
        let mut seen = 0;
        while Instant::now() < deadline {
            if let Ok((200, body)) = self.get("/state") {
                if let Ok(state) = serde_json::from_str::<serde_json::Value>(&body) {
                    seen = agora_examples::local::connected_agents(&state);
                    if seen >= n {
                        return;
                    }
                }
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        panic!("only {seen} of {n} agents registered\n{}", self.logs());
    }

    /// `GET path` from the master, with the cluster's authorization.
    pub fn get(&self, path: &str) -> std::io::Result<(u16, String)> {
        let headers: Vec<(&str, &str)> = self
            .authorization
            .iter()
            .map(|a| ("authorization", a.as_str()))
            .collect();
        let response = match &self.tls {
            None => agora_client::blocking::request(
                agora_client::Method::GET,
                self.master.addr,
                path,
                &headers,
                None,
            ),
            Some(tls) => {
                let http = agora_client::Http::new().with_tls(tls.clone());
                let (addr, path) = (self.master.addr, path.to_string());
                let authorization = self.authorization.clone();
                agora_client::blocking::block_on(async move {
                    let headers: Vec<(&str, &str)> = authorization
                        .iter()
                        .map(|a| ("authorization", a.as_str()))
                        .collect();
                    http.request(agora_client::Method::GET, addr, &path, &headers, None)
                        .await
                })
            }
        }
        .map_err(std::io::Error::other)?;
        Ok((response.status, response.text()))
    }

    /// The master's address as `HOST:PORT`.
    pub fn master_address(&self) -> String {
        self.master.addr.to_string()
    }

    /// Every log's tail, for failure messages.
    pub fn logs(&self) -> String {
        let mut out = format!("--- master log ---\n{}\n", self.master.log_tail());
        for agent in &self.agents {
            out.push_str(&format!(
                "--- {} log ---\n{}\n",
                agent.name,
                agent.log_tail()
            ));
        }
        out
    }

    /// Runs a workspace binary against this cluster and returns (exit ok, stdout, stderr).
    pub fn run_bin(&self, name: &str, args: &[&str], timeout: Duration) -> (bool, String, String) {
        let mut child = Command::new(bin(name))
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("starting {name}: {e}"));
        let mut stdout = child.stdout.take().expect("stdout");
        let mut stderr = child.stderr.take().expect("stderr");
        let out = std::thread::spawn(move || {
            let mut s = String::new();
            let _ = stdout.read_to_string(&mut s);
            s
        });
        let err = std::thread::spawn(move || {
            let mut s = String::new();
            let _ = stderr.read_to_string(&mut s);
            s
        });
        let deadline = Instant::now() + timeout;
        let status = loop {
            if let Ok(Some(status)) = child.try_wait() {
                break Some(status);
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                break None;
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        let (out, err) = (
            out.join().unwrap_or_default(),
            err.join().unwrap_or_default(),
        );
        match status {
            Some(status) => (status.success(), out, err),
            None => panic!(
                "{name} did not finish within {timeout:?}\nstdout:\n{out}\nstderr:\n{err}\n{}",
                self.logs()
            ),
        }
    }
}

impl Drop for TestCluster {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("{}", self.logs());
        }
        for agent in &mut self.agents {
            agent.terminate(Duration::from_secs(5));
        }
        self.master.terminate(Duration::from_secs(5));
        kill_sandboxed_processes(self.dir.path());
    }
}

/// Resources of the agents of placement tests: room for many workers.
pub const NAMED_AGENT: &str = "cpus:8;mem:8192;disk:4096;ports:[31000-32000]";

/// Master flags for fast allocation and agent-loss detection (1 s).
pub const FAST_MASTER_FLAGS: &[&str] = &[
    "--allocation-interval",
    "100ms",
    "--agent-ping-interval",
    "200ms",
    "--max-missed-pings",
    "5",
];

/// The rack of agent `i` of [`TestCluster::start_named`].
pub fn named_rack(i: usize) -> &'static str {
    ["r0", "r0", "r1", "r1", "r2"][i % 5]
}

/// SIGKILLs every process whose `AGORA_SANDBOX` lies under `root`: no
/// executor or task of a test outlives it, whatever went wrong.
pub fn kill_sandboxed_processes(root: &Path) {
    let needle = format!("AGORA_SANDBOX={}", root.display());
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return;
    };
    for entry in entries.flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let Ok(environ) = std::fs::read(entry.path().join("environ")) else {
            continue;
        };
        if environ
            .split(|b| *b == 0)
            .any(|var| var.starts_with(needle.as_bytes()))
        {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
    }
}

/// Whether a process is alive (not gone and not a zombie).
pub fn process_alive(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => !stat
            .rsplit(')')
            .next()
            .map(|rest| rest.trim_start().starts_with('Z'))
            .unwrap_or(false),
        Err(_) => false,
    }
}

/// Blocking `GET http://addr/path`: status and body (through
/// `agora-client`).
pub fn http_get(addr: SocketAddr, path: &str) -> std::io::Result<(u16, String)> {
    let response = agora_client::blocking::get(addr, path).map_err(std::io::Error::other)?;
    Ok((response.status, response.text()))
}

// === impl Recorder ===

impl Scheduler for Recorder {
    fn registered(&mut self, _d: &SchedulerDriver, framework_id: &FrameworkId, _m: &MasterInfo) {
        let _ = self.0.send(SchedEvent::Registered(framework_id.clone()));
    }
    fn reregistered(&mut self, _d: &SchedulerDriver, _m: &MasterInfo) {
        let _ = self.0.send(SchedEvent::Reregistered);
    }
    fn disconnected(&mut self, _d: &SchedulerDriver) {
        let _ = self.0.send(SchedEvent::Disconnected);
    }
    fn resource_offers(&mut self, _d: &SchedulerDriver, offers: Vec<Offer>) {
        let _ = self.0.send(SchedEvent::Offers(offers));
    }
    fn offer_rescinded(&mut self, _d: &SchedulerDriver, offer_id: &OfferId) {
        let _ = self.0.send(SchedEvent::Rescinded(offer_id.clone()));
    }
    fn status_update(&mut self, _d: &SchedulerDriver, status: &TaskStatus) {
        let _ = self.0.send(SchedEvent::Update(status.clone()));
    }
    fn framework_message(
        &mut self,
        _d: &SchedulerDriver,
        e: &ExecutorId,
        a: &AgentId,
        data: &[u8],
    ) {
        let _ = self
            .0
            .send(SchedEvent::Message(e.clone(), a.clone(), data.to_vec()));
    }
    fn agent_lost(&mut self, _d: &SchedulerDriver, agent_id: &AgentId) {
        let _ = self.0.send(SchedEvent::AgentLost(agent_id.clone()));
    }
    fn executor_lost(
        &mut self,
        _d: &SchedulerDriver,
        e: &ExecutorId,
        a: &AgentId,
        status: Option<i32>,
    ) {
        let _ = self
            .0
            .send(SchedEvent::ExecutorLost(e.clone(), a.clone(), status));
    }
    fn error(&mut self, _d: &SchedulerDriver, message: &str) {
        let _ = self.0.send(SchedEvent::Error(message.to_string()));
    }
}

/// Command task `id` running `command` (`/bin/sh -c`) with `resources` on
/// `offer`'s agent, killed with a 1 s grace period.
pub fn command_task(id: &str, offer: &Offer, command: &str, resources: &str) -> TaskInfo {
    TaskInfo {
        container: None,
        allocation_role: None,
        launch_stamp: None,
        name: id.to_string(),
        task_id: TaskId::new(id),
        agent_id: offer.agent_id.clone(),
        resources: Resources::parse(resources).unwrap(),
        executor: None,
        command: Some(CommandInfo::shell(command)),
        data: None,
        kill_grace_period: Some(1.0),
        labels: Default::default(),
        task_group: None,
    }
}

/// Starts a recording framework against `master`.
pub fn start_framework(
    master: &str,
    info: FrameworkInfo,
) -> (SchedulerDriver, mpsc::Receiver<SchedEvent>) {
    let (tx, rx) = mpsc::channel();
    let driver = SchedulerDriver::new(Recorder(tx), info, DriverConfig::new(master));
    driver.start().expect("driver start");
    (driver, rx)
}

/// Reads events until `pick` returns something, or panics after `timeout`.
pub fn wait_for<T>(
    rx: &mpsc::Receiver<SchedEvent>,
    timeout: Duration,
    mut pick: impl FnMut(&SchedEvent) -> Option<T>,
) -> T {
    let deadline = Instant::now() + timeout;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match rx.recv_timeout(left) {
            Ok(event) => {
                if let Some(found) = pick(&event) {
                    return found;
                }
            }
            Err(_) => panic!("timed out after {timeout:?} waiting for an event"),
        }
    }
}
