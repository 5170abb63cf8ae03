//! Real Apache Flink 2.3 on Agora (issue 27): Flink's own JobManager with
//! the Agora resource manager driver (`flink/`), its `agora-flink-bridge`,
//! real `agora-master` and `agora-agent` processes, TaskManagers started
//! as Agora tasks, jobs submitted with Flink's own `bin/flink run`.
//!
//! Needs Java 17 and Flink 2.3.0 in a venv (`AGORA_FLINK_VENV`, default
//! `/opt/agora-flink-venv`: `pip install --no-deps apache-flink-libraries==2.3.0
//! apache-flink==2.3.0`). Without them each test prints why and passes,
//! except under `CI=true`, where they must be there. The Java side is
//! built once per run with `flink/build.sh`.
//!
//! The scenarios run one at a time (each starts two or three JVMs on a
//! 2-core machine), every wait is bounded, and everything started is
//! killed on drop: the JobManager's process group, the cluster's
//! sandboxes.

mod support;

use std::collections::BTreeMap;
use std::net::{SocketAddr, TcpListener};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

use nix::sys::signal::{killpg, Signal};
use nix::unistd::Pid;
use serde_json::Value;
use support::{bin, http_get, wait_until, TestCluster, FAST_MASTER_FLAGS};

/// Flink's version the driver is built for.
const FLINK_VERSION: &str = "2.3.0";

/// Where Flink and the built jars are.
struct FlinkEnv {
    home: PathBuf,
    jobs_jar: PathBuf,
}

/// A JobManager (session or application) and its process group.
struct JobManager {
    child: Option<Child>,
    rest: SocketAddr,
    log: PathBuf,
    conf_dir: PathBuf,
}

/// One Flink cluster's files: its conf dir (config.yaml and log4j), logs.
struct FlinkFiles {
    dir: PathBuf,
    conf_dir: PathBuf,
    rest_port: u16,
    rpc_port: u16,
}

// === the environment ===

/// Runs scenarios one at a time.
fn serial() -> MutexGuard<'static, ()> {
    static SERIAL: Mutex<()> = Mutex::new(());
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

/// Flink and Java, or `None` (printed why) where they are missing.
fn flink_env() -> Option<&'static FlinkEnv> {
    static ENV: OnceLock<Result<FlinkEnv, String>> = OnceLock::new();
    match ENV.get_or_init(prepare) {
        Ok(env) => Some(env),
        Err(why) => {
            assert!(
                std::env::var("CI").as_deref() != Ok("true"),
                "the Flink tests cannot run under CI: {why}"
            );
            eprintln!("skipped: {why}");
            None
        }
    }
}

fn prepare() -> Result<FlinkEnv, String> {
    let java = Command::new("javac").arg("-version").output();
    if !matches!(java, Ok(ref o) if o.status.success()) {
        return Err("javac is not installed (openjdk-17-jdk-headless)".into());
    }
    let venv = std::env::var("AGORA_FLINK_VENV").unwrap_or_else(|_| "/opt/agora-flink-venv".into());
    let lib = Path::new(&venv).join("lib");
    let home = std::fs::read_dir(&lib)
        .ok()
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path().join("site-packages/pyflink"))
        .find(|p| p.join(format!("lib/flink-dist-{FLINK_VERSION}.jar")).is_file())
        .ok_or_else(|| {
            format!(
                "no Flink {FLINK_VERSION} in the venv {venv} (python3 -m venv {venv} && {venv}/bin/pip install --no-deps apache-flink-libraries=={FLINK_VERSION} apache-flink=={FLINK_VERSION})"
            )
        })?;
    let flink_dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../flink");
    let out = Command::new("bash")
        .arg(flink_dir.join("build.sh"))
        .env("FLINK_HOME", &home)
        .output()
        .map_err(|e| format!("running flink/build.sh: {e}"))?;
    assert!(
        out.status.success(),
        "flink/build.sh failed:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(FlinkEnv {
        home,
        jobs_jar: flink_dir.join("target/agora-flink-jobs.jar"),
    })
}

/// A free TCP port on 127.0.0.1.
fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

/// Agent resources: room for several TaskManagers, and ports of its own
/// (all agents share this machine, and TaskManagers bind the offered
/// ports): 20 ports from a base that differs per agent and per run.
fn agent_resources(agent: usize) -> String {
    let run = (std::process::id() as usize + rand_u64() as usize) % 1000;
    let base = 20_000 + ((run * 7 + agent) % 1500) * 20;
    format!("cpus:4;mem:8192;disk:4096;ports:[{base}-{}]", base + 19)
}

/// A master and `n` agents, each with ports of its own.
fn cluster(n: usize) -> TestCluster {
    let mut cluster = TestCluster::start_with(0, &agent_resources(0), FAST_MASTER_FLAGS);
    for i in 0..n {
        cluster.add_agent(&agent_resources(i), &[]);
    }
    cluster.wait_agents(n);
    cluster
}

// === impl FlinkFiles ===

impl FlinkFiles {
    /// A conf dir under `dir` with the stock JVM options and log4j files,
    /// fast heartbeats, small TaskManagers, and `extra`.
    fn new(env: &FlinkEnv, dir: &Path, name: &str, extra: &[(&str, String)]) -> FlinkFiles {
        let dir = dir.join(name);
        let conf_dir = dir.join("conf");
        std::fs::create_dir_all(&conf_dir).unwrap();
        for file in ["log4j-console.properties", "log4j-cli.properties"] {
            std::fs::copy(env.home.join("conf").join(file), conf_dir.join(file)).unwrap();
        }
        let stock = std::fs::read_to_string(env.home.join("conf/config.yaml")).unwrap();
        let java_opts = stock
            .lines()
            .find_map(|l| l.trim().strip_prefix("all: "))
            .expect("env.java.opts.all in the stock config.yaml")
            .to_string();
        let (rest_port, rpc_port) = (free_port(), free_port());
        let mut config: BTreeMap<&str, String> = BTreeMap::from([
            ("env.java.opts.all", java_opts),
            ("jobmanager.rpc.address", "127.0.0.1".into()),
            ("jobmanager.rpc.port", rpc_port.to_string()),
            ("jobmanager.bind-host", "127.0.0.1".into()),
            ("rest.address", "127.0.0.1".into()),
            ("rest.bind-address", "127.0.0.1".into()),
            ("rest.port", rest_port.to_string()),
            ("jobmanager.memory.process.size", "900m".into()),
            ("taskmanager.memory.process.size", "1024m".into()),
            ("taskmanager.numberOfTaskSlots", "1".into()),
            ("parallelism.default", "1".into()),
            ("heartbeat.interval", "2000".into()),
            ("heartbeat.timeout", "12000".into()),
            ("pekko.ask.timeout", "30s".into()),
            ("agora.taskmanager.host", "127.0.0.1".into()),
            ("agora.taskmanager.bind-host", "127.0.0.1".into()),
            ("agora.framework-name", format!("flink-{name}")),
            ("agora.locality.wait", "1s".into()),
        ]);
        for (key, value) in extra {
            config.insert(key, value.clone());
        }
        let text: String = config
            .iter()
            .map(|(k, v)| format!("{k}: {}\n", serde_json::to_string(v).unwrap()))
            .collect();
        std::fs::write(conf_dir.join("config.yaml"), text).unwrap();
        FlinkFiles {
            dir,
            conf_dir,
            rest_port,
            rpc_port,
        }
    }

    /// Runs `bin/flink ARGS` with this conf dir; returns (success, stdout, stderr).
    fn flink_cli(
        &self,
        env: &FlinkEnv,
        args: &[&str],
        timeout: Duration,
    ) -> (bool, String, String) {
        let stamp = rand_u64();
        let out = self.dir.join(format!("cli-{stamp}.out"));
        let err = self.dir.join(format!("cli-{stamp}.err"));
        let mut child = Command::new(env.home.join("bin/flink"))
            .args(args)
            .env("FLINK_HOME", &env.home)
            .env("FLINK_CONF_DIR", &self.conf_dir)
            .env("FLINK_LOG_DIR", self.dir.join("log"))
            .stdin(Stdio::null())
            .stdout(std::fs::File::create(&out).unwrap())
            .stderr(std::fs::File::create(&err).unwrap())
            .process_group(0)
            .spawn()
            .expect("bin/flink");
        let deadline = Instant::now() + timeout;
        let status = loop {
            if let Ok(Some(status)) = child.try_wait() {
                break Some(status);
            }
            if Instant::now() > deadline {
                let _ = killpg(Pid::from_raw(child.id() as i32), Signal::SIGKILL);
                let _ = child.wait();
                break None;
            }
            std::thread::sleep(Duration::from_millis(50));
        };
        let read = |p: &Path| std::fs::read_to_string(p).unwrap_or_default();
        let (stdout, stderr) = (read(&out), read(&err));
        match status {
            Some(status) => (status.success(), stdout, stderr),
            None => {
                panic!("bin/flink {args:?} did not finish within {timeout:?}\n{stdout}\n{stderr}")
            }
        }
    }
}

fn rand_u64() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0)
}

// === impl JobManager ===

impl JobManager {
    /// Starts `flink/bin/SCRIPT ARGS` in its own process group.
    fn start(env: &FlinkEnv, files: &FlinkFiles, script: &str, args: &[String]) -> JobManager {
        let flink_dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../flink");
        let log = files
            .dir
            .join(format!("jobmanager-{}.out", rand_u64() % 100_000));
        let out = std::fs::File::create(&log).unwrap();
        let child = Command::new(flink_dir.join("bin").join(script))
            .args(args)
            .env("FLINK_HOME", &env.home)
            .env("FLINK_CONF_DIR", &files.conf_dir)
            .env("FLINK_LOG_DIR", files.dir.join("log"))
            .env("AGORA_FLINK_BRIDGE", bin("agora-flink-bridge"))
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(out.try_clone().unwrap())
            .stderr(out)
            .process_group(0)
            .spawn()
            .expect("starting the JobManager");
        JobManager {
            child: Some(child),
            rest: SocketAddr::from(([127, 0, 0, 1], files.rest_port)),
            log,
            conf_dir: files.conf_dir.clone(),
        }
    }

    fn session(env: &FlinkEnv, files: &FlinkFiles) -> JobManager {
        let jm = JobManager::start(env, files, "agora-session.sh", &[]);
        jm.wait_rest();
        jm
    }

    /// `GET path` on the REST API, as JSON.
    fn get(&self, path: &str) -> Option<Value> {
        match http_get(self.rest, path) {
            Ok((200, body)) => serde_json::from_str(&body).ok(),
            _ => None,
        }
    }

    fn wait_rest(&self) {
        wait_until(
            Duration::from_secs(90),
            "the JobManager's REST API",
            || self.log_tail(),
            || self.get("/overview"),
        );
    }

    /// The JobManager's output so far (its log and the bridge's).
    fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        let tail = lines[lines.len().saturating_sub(60)..].join("\n");
        format!("--- JobManager {} ---\n{tail}", self.log.display())
    }

    fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Registered TaskManagers' resource ids.
    fn taskmanagers(&self) -> Option<Vec<String>> {
        let tms = self.get("/taskmanagers")?;
        Some(
            tms["taskmanagers"]
                .as_array()?
                .iter()
                .filter_map(|t| t["id"].as_str().map(String::from))
                .collect(),
        )
    }

    /// (job id, state) of each job.
    fn jobs(&self) -> Vec<(String, String)> {
        self.get("/jobs/overview")
            .and_then(|v| {
                v["jobs"].as_array().map(|jobs| {
                    jobs.iter()
                        .map(|j| {
                            (
                                j["jid"].as_str().unwrap_or("").to_string(),
                                j["state"].as_str().unwrap_or("").to_string(),
                            )
                        })
                        .collect()
                })
            })
            .unwrap_or_default()
    }

    /// SIGKILLs the JVM only (a JobManager crash); its bridge sees its
    /// stdin close and stops in failover mode.
    fn crash(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Waits for the JobManager to exit by itself.
    fn wait_exit(&mut self, timeout: Duration) -> Option<std::process::ExitStatus> {
        let deadline = Instant::now() + timeout;
        let child = self.child.as_mut()?;
        loop {
            if let Ok(Some(status)) = child.try_wait() {
                self.child = None;
                return Some(status);
            }
            if Instant::now() > deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

impl Drop for JobManager {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("{}", self.log_tail());
        }
        if let Some(mut child) = self.child.take() {
            let _ = killpg(Pid::from_raw(child.id() as i32), Signal::SIGKILL);
            let _ = child.wait();
        }
        let _ = &self.conf_dir;
    }
}

// === Agora's view ===

/// Tasks (live and completed) of the framework called `name`: (id, state).
fn agora_tasks(cluster: &TestCluster, name: &str) -> Vec<(String, String)> {
    let state = cluster.state();
    let mut ids = Vec::new();
    let mut out = Vec::new();
    for f in state["frameworks"].as_array().into_iter().flatten() {
        if f["name"].as_str() == Some(name) {
            ids.push(f["id"].as_str().unwrap_or("").to_string());
            for t in f["tasks"].as_array().into_iter().flatten() {
                out.push(task_row(t));
            }
        }
    }
    for t in state["completed_tasks"].as_array().into_iter().flatten() {
        if ids
            .iter()
            .any(|id| Some(id.as_str()) == t["framework_id"].as_str())
        {
            out.push(task_row(t));
        }
    }
    out
}

fn task_row(t: &Value) -> (String, String) {
    (
        t["id"].as_str().unwrap_or("").to_string(),
        t["state"].as_str().unwrap_or("").to_string(),
    )
}

fn is_terminal(state: &str) -> bool {
    matches!(
        state,
        "TASK_FINISHED"
            | "TASK_FAILED"
            | "TASK_KILLED"
            | "TASK_LOST"
            | "TASK_ERROR"
            | "TASK_DROPPED"
            | "TASK_GONE"
    )
}

/// The word counts the WordCount job must print for `lines` lines.
fn expected_counts(lines: usize) -> String {
    let mut counts: BTreeMap<String, usize> = BTreeMap::new();
    for i in 0..lines {
        for word in [format!("w{}", i % 7), format!("w{}", i % 3), "agora".into()] {
            *counts.entry(word).or_default() += 1;
        }
    }
    counts.iter().map(|(w, c)| format!("{w} {c}\n")).collect()
}

// === scenarios ===

/// A session cluster starts with no TaskManager; `flink run` of a bounded
/// WordCount at parallelism 2 makes the driver request two TaskManagers
/// through Agora; the result is right; once idle they are released and
/// their tasks end as killed.
#[test]
fn session_cluster_runs_wordcount_on_requested_taskmanagers_and_releases_them() {
    let _serial = serial();
    let Some(env) = flink_env() else { return };
    let cluster = cluster(2);
    let files = FlinkFiles::new(
        env,
        cluster.dir.path(),
        "session",
        &[
            ("agora.master", cluster.master_address()),
            ("resourcemanager.taskmanager-timeout", "5s".into()),
        ],
    );
    let jm = JobManager::session(env, &files);
    let framework = "flink-session";
    assert_eq!(
        jm.taskmanagers(),
        Some(vec![]),
        "no TaskManager before a job"
    );
    assert!(agora_tasks(&cluster, framework).is_empty());

    let output = files.dir.join("wordcount.txt");
    let rest = format!("127.0.0.1:{}", files.rest_port);
    let started = Instant::now();
    let (ok, stdout, stderr) = files.flink_cli(
        env,
        &[
            "run",
            "-m",
            &rest,
            "-p",
            "2",
            env.jobs_jar.to_str().unwrap(),
            "--lines",
            "1000",
            "--output",
            output.to_str().unwrap(),
        ],
        Duration::from_secs(180),
    );
    let took = started.elapsed();
    assert!(
        ok,
        "flink run failed\n{stdout}\n{stderr}\n{}",
        jm.log_tail()
    );
    eprintln!("wordcount on two fresh TaskManagers: {took:.1?} from `flink run` to its exit");
    assert_eq!(
        std::fs::read_to_string(&output).unwrap(),
        expected_counts(1000),
        "the job's counts"
    );

    // Two TaskManagers were Agora tasks of the JobManager's framework, with
    // the worker ids as resource ids.
    let tasks = agora_tasks(&cluster, framework);
    assert_eq!(tasks.len(), 2, "two TaskManager tasks: {tasks:?}");
    let log = jm.log_text();
    for (id, _) in &tasks {
        assert!(
            log.contains(&format!("TaskManager {id} is running")) || log.contains(id.as_str()),
            "the JobManager knows TaskManager {id}"
        );
    }

    // Idle for 5 s, both are released: their tasks end as killed and
    // Flink lists no TaskManager.
    let ended = wait_until(
        Duration::from_secs(60),
        "the idle TaskManagers to be released",
        || {
            format!(
                "{:?}\n{}\n{}",
                agora_tasks(&cluster, framework),
                jm.log_tail(),
                cluster.logs()
            )
        },
        || {
            let tasks = agora_tasks(&cluster, framework);
            (tasks.len() == 2 && tasks.iter().all(|(_, s)| is_terminal(s))).then_some(tasks)
        },
    );
    for (id, state) in &ended {
        assert!(
            state == "TASK_KILLED" || state == "TASK_FINISHED",
            "released TaskManager {id} ended {state}"
        );
    }
    wait_until(
        Duration::from_secs(30),
        "Flink to list no TaskManager",
        || jm.log_tail(),
        || (jm.taskmanagers()? == Vec::<String>::new()).then_some(()),
    );
    assert!(
        log.contains("Agora: releasing TaskManager")
            || jm.log_text().contains("Agora: releasing TaskManager"),
        "the driver released them"
    );
}
