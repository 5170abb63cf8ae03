//! Command tasks in images (issue 26), end to end: real `agora-master`
//! and `agora-agent` processes, a real registry (Debian's
//! `docker-registry` on 127.0.0.1, an ephemeral port), a busybox image
//! built here from `busybox-static` with `umoci` and pushed with
//! `skopeo`, and the agent running tasks in it with crun under conmon.
//!
//! - The native SDK and a pymesos 0.3.15 framework
//!   (`mesos/pymesos_containers.py`) each run a task in the image that
//!   sees the image's `/etc/os-release` (not the host's Debian one), is
//!   PID 1 of its own pid namespace, reads a host volume (`RO`) and
//!   writes a `SANDBOX_PATH` volume, with its output in its sandbox and
//!   `MESOS_SANDBOX=/mnt/mesos/sandbox`.
//! - A task naming an image the registry does not have ends
//!   `TASK_FAILED` / `REASON_CONTAINER_LAUNCH_FAILED`, the message naming
//!   the image and the cause.
//! - A killed task in an image leaves no process, mount or crun
//!   container.
//! - `docker.parameters` is still refused by name through pymesos.
//! - An agent without `--image-providers` refuses a task that names an
//!   image, saying images are not enabled there.
//!
//! Each test needs root, overlayfs, crun, conmon, docker-registry,
//! skopeo, umoci and `/bin/busybox`; without one it prints why and
//! skips (under `CI=true` it fails instead).

#![cfg(feature = "local")]

mod support;

use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::Receiver;
use std::time::{Duration, Instant};

use agora_proto::{
    CommandInfo, ContainerInfo, ContainerType, FrameworkInfo, Image, ImageType, Reason, SandboxOf,
    TaskState, TaskStatus, Volume, VolumeMode, VolumeSource,
};
use support::mesos::{python, Client};
use support::{command_task, start_framework, wait_for, SchedEvent, TestCluster};

const AGENT: &str = "cpus:2;mem:1024;disk:1024;ports:[31000-31100]";
const IMAGE: &str = "agora/busybox:1";

/// What a task in the image prints: its os-release, its pid, its pid
/// namespace against the host's, its volumes and its sandbox variable.
const PROBE: &str = "cat /etc/os-release; echo pid=$$; \
    [ \"$(readlink /proc/1/ns/pid)\" = \"$(readlink /proc/self/ns/pid)\" ] && echo own-pid-ns; \
    cat /data/greeting; echo written > /shared/out; echo sandbox=$MESOS_SANDBOX";

/// A registry serving the test image, and the host directory of the
/// host volume.
struct Fixture {
    registry: Child,
    addr: String,
    dir: tempfile::TempDir,
}

// === impl Fixture ===

impl Fixture {
    /// Starts a registry and pushes the busybox image to it; `None`
    /// (with the reason printed) where the parts are missing.
    fn start(test: &str) -> Option<Fixture> {
        if let Some(why) = cannot_run() {
            assert!(
                std::env::var("CI").as_deref() != Ok("true"),
                "{test}: containers cannot run here: {why}"
            );
            eprintln!("skipping {test}: {why}");
            return None;
        }
        let dir = tempfile::Builder::new()
            .prefix("agora-containers-")
            .tempdir()
            .unwrap();
        let port = free_port();
        let addr = format!("127.0.0.1:{port}");
        let config = dir.path().join("registry.yml");
        std::fs::write(
            &config,
            format!(
                "version: 0.1\nlog:\n  level: warn\nstorage:\n  filesystem:\n    rootdirectory: {}\nhttp:\n  addr: {addr}\n",
                dir.path().join("registry").display()
            ),
        )
        .unwrap();
        let log = std::fs::File::create(dir.path().join("registry.log")).unwrap();
        let registry = Command::new("docker-registry")
            .arg("serve")
            .arg(&config)
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap();
        let fixture = Fixture {
            registry,
            addr,
            dir,
        };
        let deadline = Instant::now() + Duration::from_secs(20);
        while TcpStream::connect(&fixture.addr).is_err() {
            assert!(Instant::now() < deadline, "docker-registry did not listen");
            std::thread::sleep(Duration::from_millis(50));
        }
        fixture.push_busybox();
        std::fs::create_dir_all(fixture.host_dir()).unwrap();
        std::fs::write(fixture.host_dir().join("greeting"), "from-the-host\n").unwrap();
        Some(fixture)
    }

    /// Builds a one-layer image of `/bin/busybox` (with an os-release of
    /// its own) with umoci and pushes it as [`IMAGE`].
    fn push_busybox(&self) {
        let work = self.dir.path().join("image");
        std::fs::create_dir_all(&work).unwrap();
        let layout = work.join("layout");
        let bundle = work.join("bundle");
        let image = format!("{}:1", layout.display());
        run("umoci", &["init", "--layout", path(&layout)]);
        run("umoci", &["new", "--image", &image]);
        run("umoci", &["unpack", "--image", &image, path(&bundle)]);
        let rootfs = bundle.join("rootfs");
        for dir in ["bin", "etc", "tmp", "data", "shared"] {
            std::fs::create_dir_all(rootfs.join(dir)).unwrap();
        }
        std::fs::copy("/bin/busybox", rootfs.join("bin/busybox")).unwrap();
        for tool in ["sh", "cat", "echo", "readlink", "sleep", "ls"] {
            std::os::unix::fs::symlink("busybox", rootfs.join("bin").join(tool)).unwrap();
        }
        std::fs::write(
            rootfs.join("etc/os-release"),
            "NAME=\"Agora test busybox\"\nID=agora-busybox\n",
        )
        .unwrap();
        run("umoci", &["repack", "--image", &image, path(&bundle)]);
        run(
            "umoci",
            &[
                "config",
                "--image",
                &image,
                "--config.env",
                "PATH=/bin",
                "--config.cmd",
                "/bin/sh",
            ],
        );
        run(
            "skopeo",
            &[
                "--insecure-policy",
                "copy",
                "--quiet",
                "--dest-tls-verify=false",
                &format!("oci:{image}"),
                &format!("docker://{}/{IMAGE}", self.addr),
            ],
        );
    }

    /// The agent flags that pull from this registry.
    fn agent_flags(&self) -> Vec<String> {
        vec![
            "--image-providers".into(),
            "docker".into(),
            "--docker-registry".into(),
            format!("http://{}", self.addr),
            "--executor-shutdown-grace-period".into(),
            "1s".into(),
        ]
    }

    /// The host directory of the host volume.
    fn host_dir(&self) -> PathBuf {
        self.dir.path().join("host-volume")
    }

    /// The container of a probe task: the image, the host directory
    /// read-only at `/data`, `shared` of its sandbox at `/shared`.
    fn probe_container(&self, image: &str) -> ContainerInfo {
        ContainerInfo {
            kind: ContainerType::Mesos,
            image: Some(Image {
                kind: ImageType::Docker,
                name: format!("{}/{image}", self.addr),
                cached: true,
            }),
            volumes: vec![
                Volume {
                    container_path: "/data".into(),
                    mode: VolumeMode::Ro,
                    source: VolumeSource::HostPath {
                        path: self.host_dir().display().to_string(),
                    },
                },
                Volume {
                    container_path: "/shared".into(),
                    mode: VolumeMode::Rw,
                    source: VolumeSource::SandboxPath {
                        of: SandboxOf::Own,
                        path: "shared".into(),
                    },
                },
            ],
            network_infos: Vec::new(),
            hostname: None,
        }
    }
}

impl Drop for Fixture {
    fn drop(&mut self) {
        let _ = self.registry.kill();
        let _ = self.registry.wait();
    }
}

/// Why containers cannot run here, if they cannot.
fn cannot_run() -> Option<String> {
    if !nix::unistd::geteuid().is_root() {
        return Some("not running as root".into());
    }
    let filesystems = std::fs::read_to_string("/proc/filesystems").unwrap_or_default();
    if !filesystems.contains("overlay") {
        return Some("no overlayfs in /proc/filesystems".into());
    }
    for program in ["crun", "conmon", "docker-registry", "skopeo", "umoci"] {
        if which(program).is_none() {
            return Some(format!(
                "{program} is not installed (crun, conmon, docker-registry, skopeo, umoci)"
            ));
        }
    }
    if !Path::new("/bin/busybox").exists() {
        return Some("/bin/busybox is missing (busybox-static)".into());
    }
    None
}

fn which(program: &str) -> Option<PathBuf> {
    std::env::var_os("PATH")?
        .to_str()?
        .split(':')
        .map(|dir| Path::new(dir).join(program))
        .find(|p| p.is_file())
}

fn path(p: &Path) -> &str {
    p.to_str().unwrap()
}

fn run(program: &str, args: &[&str]) {
    let out = Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("{program}: {e}"));
    assert!(
        out.status.success(),
        "{program} {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// The sandbox of task `task` under the agent's work dir (its latest
/// run).
fn sandbox_of(work_dir: &Path, task: &str) -> PathBuf {
    fn walk(dir: &Path, task: &str, found: &mut Vec<PathBuf>) {
        let Ok(entries) = std::fs::read_dir(dir) else {
            return;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            if !entry.file_type().is_ok_and(|t| t.is_dir()) {
                continue;
            }
            if path.join("stdout").is_file() && path.components().any(|c| c.as_os_str() == task) {
                found.push(path.clone());
            }
            walk(&path, task, found);
        }
    }
    let mut found = Vec::new();
    walk(&work_dir.join("frameworks"), task, &mut found);
    found.sort_by_key(|p| std::fs::metadata(p).and_then(|m| m.modified()).ok());
    found
        .pop()
        .unwrap_or_else(|| panic!("no sandbox of {task} under {}", work_dir.display()))
}

/// What a probe task's sandbox shows: it ran in the image, as PID 1 of
/// its own pid namespace, with both volumes.
fn assert_probe_ran_in_the_image(sandbox: &Path) {
    let stdout = std::fs::read_to_string(sandbox.join("stdout")).unwrap();
    let stderr = std::fs::read_to_string(sandbox.join("stderr")).unwrap_or_default();
    let context = format!("stdout:\n{stdout}\nstderr:\n{stderr}");
    assert!(stdout.contains("ID=agora-busybox"), "{context}");
    assert!(!stdout.contains("debian"), "{context}");
    assert!(stdout.contains("pid=1\n"), "{context}");
    assert!(stdout.contains("own-pid-ns"), "{context}");
    assert!(stdout.contains("from-the-host"), "{context}");
    assert!(stdout.contains("sandbox=/mnt/mesos/sandbox"), "{context}");
    assert_eq!(
        std::fs::read_to_string(sandbox.join("shared/out")).unwrap(),
        "written\n",
        "{context}"
    );
}

/// Mounts under `dir`, from this process's mount table.
fn mounts_under(dir: &Path) -> Vec<String> {
    let dir = dir.display().to_string();
    std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap_or_default()
        .lines()
        .filter(|l| l.split(' ').nth(4).is_some_and(|m| m.starts_with(&dir)))
        .map(str::to_string)
        .collect()
}

/// The terminal update of `task`.
fn terminal(rx: &Receiver<SchedEvent>, task: &str) -> TaskStatus {
    wait_for(rx, Duration::from_secs(120), |e| match e {
        SchedEvent::Update(s) if s.task_id.as_str() == task && s.state.is_terminal() => {
            Some(s.clone())
        }
        _ => None,
    })
}

fn next_offer(rx: &Receiver<SchedEvent>) -> agora_proto::Offer {
    wait_for(rx, Duration::from_secs(30), |e| match e {
        SchedEvent::Offers(offers) => offers.first().cloned(),
        _ => None,
    })
}

#[test]
fn a_native_task_runs_in_its_image_with_volumes_and_a_missing_image_fails_naming_it() {
    let Some(fixture) = Fixture::start("native") else {
        return;
    };
    let flags = fixture.agent_flags();
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    let cluster = TestCluster::start_full(1, AGENT, &[], &flags);
    let work_dir = cluster.dir.path().join("agent-0");
    let (driver, rx) = start_framework(&cluster.master_address(), FrameworkInfo::new("images"));
    let offer = next_offer(&rx);
    let mut probe = command_task("probe", &offer, PROBE, "cpus:0.2;mem:64");
    probe.container = Some(Box::new(fixture.probe_container(IMAGE)));
    let mut missing = command_task("missing", &offer, "true", "cpus:0.2;mem:64");
    missing.container = Some(Box::new(ContainerInfo::docker(format!(
        "{}/agora/nothing-here:1",
        fixture.addr
    ))));
    let mut sleeper = command_task("sleeper", &offer, "sleep 600", "cpus:0.2;mem:64");
    sleeper.container = Some(Box::new(ContainerInfo::docker(format!(
        "{}/{IMAGE}",
        fixture.addr
    ))));
    driver
        .launch_tasks(
            std::slice::from_ref(&offer.id),
            vec![probe, missing, sleeper],
            Default::default(),
        )
        .unwrap();
    let mut statuses = std::collections::HashMap::new();
    let mut sleeper_running = false;
    let deadline = Instant::now() + Duration::from_secs(120);
    while statuses.len() < 2 || !sleeper_running {
        assert!(
            Instant::now() < deadline,
            "{statuses:?}\n{}",
            cluster.logs()
        );
        if let Ok(SchedEvent::Update(status)) = rx.recv_timeout(Duration::from_secs(1)) {
            if status.task_id.as_str() == "sleeper" && status.state == TaskState::Running {
                sleeper_running = true;
                assert!(
                    status
                        .container_status
                        .as_ref()
                        .is_some_and(|c| c.executor_pid.is_some()),
                    "{status:?}"
                );
            }
            if status.state.is_terminal() {
                statuses.insert(status.task_id.to_string(), status);
            }
        }
    }
    let probe = &statuses["probe"];
    assert_eq!(
        probe.state,
        TaskState::Finished,
        "{probe:?}\n{}",
        cluster.logs()
    );
    assert_probe_ran_in_the_image(&sandbox_of(&work_dir, "probe"));
    let missing = &statuses["missing"];
    assert_eq!(missing.state, TaskState::Failed, "{missing:?}");
    assert_eq!(missing.reason, Some(Reason::ReasonContainerLaunchFailed));
    let message = missing.message.as_deref().unwrap_or_default();
    assert!(
        message.contains("agora/nothing-here:1") && message.contains("no such image"),
        "{message}"
    );

    // A kill leaves nothing of the container.
    driver
        .kill_task(&agora_proto::TaskId::new("sleeper"))
        .unwrap();
    let killed = terminal(&rx, "sleeper");
    assert_eq!(killed.state, TaskState::Killed, "{killed:?}");
    let containers = work_dir.join("containers");
    let leftovers = mounts_under(&containers);
    assert!(leftovers.is_empty(), "mounts left: {leftovers:?}");
    let crun = Command::new("crun")
        .arg(format!(
            "--root={}",
            work_dir.join("runtime/crun").display()
        ))
        .arg("list")
        .arg("-q")
        .output()
        .unwrap();
    let listed = String::from_utf8_lossy(&crun.stdout).trim().to_string();
    assert!(listed.is_empty(), "crun still lists: {listed}");
    let runs: Vec<_> = std::fs::read_dir(&containers)
        .map(|d| d.flatten().map(|e| e.path()).collect())
        .unwrap_or_default();
    assert!(runs.is_empty(), "run directories left: {runs:?}");
    let _ = driver.stop(false);
}

#[test]
fn an_agent_without_image_providers_refuses_a_task_that_names_an_image() {
    let cluster = TestCluster::start(1, AGENT);
    let (driver, rx) = start_framework(&cluster.master_address(), FrameworkInfo::new("no-images"));
    let offer = next_offer(&rx);
    let mut task = command_task("in-image", &offer, "true", "cpus:0.2;mem:32");
    task.container = Some(Box::new(ContainerInfo::docker("busybox:1")));
    task.command = Some(CommandInfo::shell("touch /tmp/should-not-run-on-the-host"));
    driver
        .launch_tasks(
            std::slice::from_ref(&offer.id),
            vec![task],
            Default::default(),
        )
        .unwrap();
    let status = terminal(&rx, "in-image");
    assert_eq!(status.state, TaskState::Failed, "{status:?}");
    assert_eq!(status.reason, Some(Reason::ReasonContainerLaunchFailed));
    let message = status.message.as_deref().unwrap_or_default();
    assert!(
        message.contains("images are not enabled on this agent")
            && message.contains("--image-providers"),
        "{message}"
    );
    let _ = driver.stop(false);
}

#[test]
fn pymesos_runs_a_task_in_an_image_and_hears_refusals_by_name() {
    let Some(python) = python() else { return };
    let Some(fixture) = Fixture::start("pymesos") else {
        return;
    };
    let flags = fixture.agent_flags();
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    let cluster = TestCluster::start_full(1, AGENT, &["--allocation-interval", "200ms"], &flags);
    let work_dir = cluster.dir.path().join("agent-0");
    let image = format!("{}/{IMAGE}", fixture.addr);
    let missing = format!("{}/agora/nothing-here:1", fixture.addr);
    let host = fixture.host_dir().display().to_string();
    let probe = cluster.dir.path().join("probe.sh");
    std::fs::write(&probe, PROBE).unwrap();
    let client = Client::python(
        &python,
        "pymesos_containers.py",
        &[
            &cluster.master_address(),
            &image,
            &missing,
            &host,
            path(&probe),
        ],
        cluster.dir.path(),
    );
    let events = client.finish(&|| cluster.logs());
    let last = |task: &str| {
        events
            .iter()
            .rev()
            .find(|e| e["event"] == "update" && e["task_id"] == task)
            .cloned()
            .unwrap_or_else(|| panic!("no update of {task}: {events:?}"))
    };
    let probe = last("probe");
    assert_eq!(
        probe["state"],
        "TASK_FINISHED",
        "{probe}\n{}",
        cluster.logs()
    );
    assert_probe_ran_in_the_image(&sandbox_of(&work_dir, "probe"));
    let missing = last("missing");
    assert_eq!(missing["state"], "TASK_FAILED", "{missing}");
    assert_eq!(
        missing["reason"], "REASON_CONTAINER_LAUNCH_FAILED",
        "{missing}"
    );
    let message = missing["message"].as_str().unwrap_or_default();
    assert!(message.contains("agora/nothing-here:1"), "{message}");
    let refused = last("privileged-ish");
    assert_eq!(refused["state"], "TASK_ERROR", "{refused}");
    assert_eq!(refused["reason"], "REASON_TASK_INVALID", "{refused}");
    assert!(
        refused["message"]
            .as_str()
            .unwrap_or_default()
            .contains("ContainerInfo.DockerInfo.parameters is not supported"),
        "{refused}"
    );
}

/// A directory named `name` under `base`, at most `depth` levels down.
fn find_dir(base: &Path, name: &str, depth: usize) -> Option<PathBuf> {
    let entries = std::fs::read_dir(base).ok()?;
    for entry in entries.flatten() {
        if !entry.file_type().is_ok_and(|t| t.is_dir()) {
            continue;
        }
        let path = entry.path();
        if entry.file_name() == name {
            return Some(path);
        }
        if depth > 0 {
            if let Some(found) = find_dir(&path, name, depth - 1) {
                return Some(found);
            }
        }
    }
    None
}

#[test]
fn under_cgroups_isolation_the_container_gets_its_task_memory_limit() {
    let Some(fixture) = Fixture::start("cgroups") else {
        return;
    };
    let root = format!("agora-test-{}-images", std::process::id());
    if let Err(why) = agora_agent::isolation::check_cgroups(&root) {
        assert!(
            std::env::var("CI").as_deref() != Ok("true"),
            "cgroups isolation cannot run here: {why}"
        );
        eprintln!("skipping: cgroups isolation cannot run here: {why}");
        return;
    }
    if !Path::new("/sys/fs/cgroup/memory").is_dir() {
        eprintln!("skipping: no cgroup v1 memory hierarchy to read the limit from");
        return;
    }
    let mut flags = fixture.agent_flags();
    flags.extend([
        "--isolation".into(),
        "cgroups".into(),
        "--cgroups-root".into(),
        root.clone(),
    ]);
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    let cluster = TestCluster::start_full(1, AGENT, &[], &flags);
    let (driver, rx) = start_framework(&cluster.master_address(), FrameworkInfo::new("limits"));
    let offer = next_offer(&rx);
    let mut task = command_task("limited", &offer, "sleep 600", "cpus:0.5;mem:48");
    task.container = Some(Box::new(ContainerInfo::docker(format!(
        "{}/{IMAGE}",
        fixture.addr
    ))));
    driver
        .launch_tasks(
            std::slice::from_ref(&offer.id),
            vec![task],
            Default::default(),
        )
        .unwrap();
    let running = wait_for(&rx, Duration::from_secs(120), |e| match e {
        SchedEvent::Update(s) if s.task_id.as_str() == "limited" => {
            assert!(!s.state.is_terminal(), "{s:?}\n{}", cluster.logs());
            (s.state == TaskState::Running).then(|| s.clone())
        }
        _ => None,
    });
    let id = running
        .container_status
        .as_ref()
        .and_then(|c| c.container_id.clone())
        .expect("the update names the container");
    let cgroup = find_dir(Path::new("/sys/fs/cgroup/memory"), &id, 4)
        .unwrap_or_else(|| panic!("no memory cgroup {id}"));
    assert!(
        cgroup.to_string_lossy().contains(&root),
        "{} is not under --cgroups-root {root}",
        cgroup.display()
    );
    let limit = std::fs::read_to_string(cgroup.join("memory.limit_in_bytes")).unwrap();
    assert_eq!(limit.trim(), (48u64 << 20).to_string());
    driver
        .kill_task(&agora_proto::TaskId::new("limited"))
        .unwrap();
    let killed = terminal(&rx, "limited");
    assert_eq!(killed.state, TaskState::Killed, "{killed:?}");
    assert!(!cgroup.exists(), "{} is left", cgroup.display());
    let _ = driver.stop(false);
    drop(cluster);
    if let Err(e) = agora_agent::isolation::destroy_cgroups_root(&root) {
        eprintln!("cleaning up cgroups root {root}: {e}");
    }
}

#[test]
fn an_image_imported_with_agora_image_import_runs_without_a_registry() {
    let Some(fixture) = Fixture::start("import") else {
        return;
    };
    // A `docker save` archive of the test image under a name no registry
    // has.
    let archive = fixture.dir.path().join("saved.tar");
    let layout = fixture.dir.path().join("image/layout");
    run(
        "skopeo",
        &[
            "--insecure-policy",
            "copy",
            "--quiet",
            &format!("oci:{}:1", layout.display()),
            &format!("docker-archive:{}:airgapped/busybox:1", archive.display()),
        ],
    );
    let flags = fixture.agent_flags();
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    let cluster = TestCluster::start_full(1, AGENT, &[], &flags);
    let agent = cluster.agents[0].addr.to_string();
    let (ok, out, err) = cluster.run_bin(
        "agora",
        &["image", "import", path(&archive), "--agent", &agent],
        Duration::from_secs(120),
    );
    assert!(
        ok,
        "agora image import failed: {out}\n{err}\n{}",
        cluster.logs()
    );
    assert!(out.contains("airgapped/busybox:1"), "{out}");
    // Not an archive: refused, naming the cause.
    let junk = fixture.dir.path().join("junk.tar");
    std::fs::write(&junk, b"not a tarball").unwrap();
    let (ok, _, err) = cluster.run_bin(
        "agora",
        &["image", "import", path(&junk), "--agent", &agent],
        Duration::from_secs(60),
    );
    assert!(!ok && err.contains("400"), "{err}");

    let (driver, rx) = start_framework(&cluster.master_address(), FrameworkInfo::new("imported"));
    let offer = next_offer(&rx);
    let mut task = command_task(
        "from-archive",
        &offer,
        "cat /etc/os-release",
        "cpus:0.2;mem:32",
    );
    task.container = Some(Box::new(ContainerInfo::docker("airgapped/busybox:1")));
    driver
        .launch_tasks(
            std::slice::from_ref(&offer.id),
            vec![task],
            Default::default(),
        )
        .unwrap();
    let status = terminal(&rx, "from-archive");
    assert_eq!(
        status.state,
        TaskState::Finished,
        "{status:?}\n{}",
        cluster.logs()
    );
    let sandbox = sandbox_of(&cluster.dir.path().join("agent-0"), "from-archive");
    let stdout = std::fs::read_to_string(sandbox.join("stdout")).unwrap();
    assert!(stdout.contains("ID=agora-busybox"), "{stdout}");
    let _ = driver.stop(false);
}
