//! Resource isolation on real agents (`--isolation cgroups`): an
//! out-of-memory task fails alone with `REASON_CONTAINER_LIMITATION_MEMORY`,
//! CPU is capped by the CFS quota, a fork bomb stays inside its pids
//! limit, a kill leaves no process and no cgroup behind, a restarted
//! agent keeps live containers and destroys orphans, and an ended task's
//! or executor's empty container is reused by the next one.
//!
//! Each test needs root and either the cgroup v1 controllers (cpu,
//! cpuacct, memory, pids, freezer) or, where v1 does not have them all, a
//! cgroup v2 hierarchy that offers cpu, memory and pids, present and
//! writable (the agent's own choice: v1 first); elsewhere it prints why
//! it skips (and fails under `CI=true`, where they must run). Each uses a
//! `--cgroups-root` of its own (`agora-test-PID-NAME`), destroyed at the
//! end whatever happens.

#![cfg(feature = "local")]

mod support;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::mpsc::Receiver;
use std::time::{Duration, Instant};

use agora_agent::isolation::{check_cgroups, destroy_cgroups_root};
use agora_proto::{
    CommandInfo, ExecutorId, ExecutorInfo, Filters, FrameworkInfo, Offer, Reason, Resources,
    TaskId, TaskInfo, TaskState, TaskStatus,
};
use support::{bin, command_task, http_get, start_framework, wait_for, SchedEvent, TestCluster};

const AGENT: &str = "cpus:2;mem:1024;disk:1024;ports:[31000-31100]";

/// A cluster whose agents isolate with cgroups under a root of this
/// test's own, removed on drop after the agents stopped.
struct Isolated {
    cluster: Option<TestCluster>,
    root: String,
}

impl Isolated {
    /// As [`Isolated::start`], for a test of container reuse (cgroup v1
    /// only), with the memory hierarchy's directory of its root.
    fn start_reusing(test: &str) -> Option<(Isolated, PathBuf)> {
        let isolated = Isolated::start(test, &[])?;
        if driven_as_v2() {
            eprintln!("skipping: cgroup v2 cannot rename a cgroup, so containers are not reused");
            return None;
        }
        let memory = controller_base("memory", &isolated.root).expect("memory hierarchy");
        Some((isolated, memory))
    }

    /// `None` (with the reason printed) where cgroups cannot be used.
    fn start(test: &str, extra: &[&str]) -> Option<Isolated> {
        let root = format!("agora-test-{}-{test}", std::process::id());
        if let Err(why) = check_cgroups(&root) {
            // CI runs as root on a machine with the controllers: there a
            // skip would hide a broken setup.
            assert!(
                std::env::var("CI").as_deref() != Ok("true"),
                "{test}: cgroups isolation cannot run here: {why}"
            );
            eprintln!("skipping {test}: cgroups isolation cannot run here: {why}");
            return None;
        }
        let mut flags = vec!["--isolation", "cgroups", "--cgroups-root", &root];
        if !extra.contains(&"--command-executor-idle") {
            // A command executor (one per task here) ends soon after its
            // task, and with it the container.
            flags.extend_from_slice(&["--command-executor-idle", "200ms"]);
        }
        flags.extend_from_slice(extra);
        let cluster = TestCluster::start_full(1, AGENT, &[], &flags);
        Some(Isolated {
            cluster: Some(cluster),
            root,
        })
    }

    fn cluster(&self) -> &TestCluster {
        self.cluster.as_ref().expect("cluster")
    }

    fn cluster_mut(&mut self) -> &mut TestCluster {
        self.cluster.as_mut().expect("cluster")
    }

    /// The `/monitor/statistics` entry of the container of command task
    /// `task` (its own, apart from its command executor's; waits up to
    /// 10 s).
    fn task_entry(&self, task: &str) -> serde_json::Value {
        let agent = self.cluster().agents[0].addr;
        let mut found = None;
        eventually(
            Duration::from_secs(10),
            || format!("no container of {task} in /monitor/statistics"),
            || {
                let (code, body) = http_get(agent, "/monitor/statistics").unwrap();
                assert_eq!(code, 200, "{body}");
                let entries: serde_json::Value = serde_json::from_str(&body).unwrap();
                found = entries
                    .as_array()
                    .into_iter()
                    .flatten()
                    .find(|e| e["tasks"] == serde_json::json!([task]))
                    .cloned();
                found.is_some()
            },
        );
        found.unwrap()
    }

    /// The name of the directories of command task `task`'s container (as
    /// [`Isolated::task_entry`] gives it).
    fn task_container(&self, task: &str) -> String {
        let entry = self.task_entry(task);
        entry["cgroup"].as_str().expect("cgroup").to_string()
    }

    /// Whether container `name` is gone from every hierarchy.
    fn container_gone(&self, name: &str) -> bool {
        ["cpu", "cpuacct", "memory", "pids", "freezer"]
            .iter()
            .filter_map(|c| controller_base(c, &self.root))
            .all(|base| !base.join(name).exists())
    }

    /// The containers under this test's root (in the freezer hierarchy).
    fn containers(&self) -> Vec<PathBuf> {
        let Some(base) = controller_base("freezer", &self.root) else {
            return Vec::new();
        };
        std::fs::read_dir(base)
            .map(|entries| {
                entries
                    .flatten()
                    .map(|e| e.path())
                    .filter(|p| p.is_dir())
                    .collect()
            })
            .unwrap_or_default()
    }
}

impl Drop for Isolated {
    fn drop(&mut self) {
        drop(self.cluster.take());
        if let Err(e) = destroy_cgroups_root(&self.root) {
            eprintln!("cleaning up cgroups root {}: {e}", self.root);
        }
    }
}

/// Where the agent keeps `controller`'s containers under `--cgroups-root
/// root`: on cgroup v1 `<controller mount>/<this process's cgroup
/// there>/<root>`; on a host the agent drives as v2, `<cgroup2
/// mount>/<root>`, the same directory for every controller.
fn controller_base(controller: &str, root: &str) -> Option<PathBuf> {
    if driven_as_v2() {
        return Some(unified_mount()?.join(root));
    }
    let own = std::fs::read_to_string("/proc/self/cgroup").ok()?;
    let path = own.lines().find_map(|l| {
        let mut parts = l.splitn(3, ':');
        let _ = parts.next();
        let controllers = parts.next()?;
        let path = parts.next()?;
        controllers
            .split(',')
            .any(|c| c == controller)
            .then(|| path.to_string())
    })?;
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    let mount = mounts.lines().find_map(|l| {
        let (left, right) = l.split_once(" - ")?;
        let fields: Vec<&str> = left.split(' ').collect();
        (right.starts_with("cgroup ")
            && right.split(' ').nth(2)?.split(',').any(|o| o == controller))
        .then(|| PathBuf::from(fields[4]))
    })?;
    Some(mount.join(path.trim_start_matches('/')).join(root))
}

/// The fstype, super options and mount point of each cgroup mount.
fn cgroup_mounts() -> Vec<(String, String, PathBuf)> {
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    mounts
        .lines()
        .filter_map(|l| {
            let (left, right) = l.split_once(" - ")?;
            let mut right = right.split(' ');
            let fstype = right.next()?;
            let options = right.nth(1).unwrap_or_default();
            (fstype == "cgroup" || fstype == "cgroup2").then(|| {
                let point = PathBuf::from(left.split(' ').nth(4).unwrap_or_default());
                (fstype.to_string(), options.to_string(), point)
            })
        })
        .collect()
}

/// Where the cgroup2 hierarchy is mounted, if it is.
fn unified_mount() -> Option<PathBuf> {
    cgroup_mounts()
        .into_iter()
        .find(|(fstype, _, _)| fstype == "cgroup2")
        .map(|(_, _, point)| point)
}

/// Whether the agent drives this host's cgroups as v2: it prefers v1,
/// when a v1 hierarchy has each controller it needs.
fn driven_as_v2() -> bool {
    let mounts = cgroup_mounts();
    !["cpu", "cpuacct", "memory", "pids", "freezer"]
        .iter()
        .all(|controller| {
            mounts.iter().any(|(fstype, options, _)| {
                fstype == "cgroup" && options.split(',').any(|o| o == *controller)
            })
        })
}

/// CPU time container `name` under `--cgroups-root root` used, seconds.
fn cpu_usage_secs(root: &str, name: &std::ffi::OsStr) -> f64 {
    if driven_as_v2() {
        let stat = controller_base("cpu", root)
            .unwrap()
            .join(name)
            .join("cpu.stat");
        return read_number(&stat, Some("usage_usec ")) as f64 / 1e6;
    }
    let usage = controller_base("cpuacct", root)
        .unwrap()
        .join(name)
        .join("cpuacct.usage");
    read_number(&usage, None) as f64 / 1e9
}

/// Marks the cgroup v1 directory `dir` (a new cgroup takes its parent's
/// `cgroup.clone_children`, 0 here, and the flag does nothing outside
/// cpuset): inode numbers cannot tell a reused cgroup from a new one,
/// since the kernel gives a removed cgroup's number to the next.
fn mark(dir: &Path) {
    std::fs::write(dir.join("cgroup.clone_children"), "1").unwrap();
}

/// Whether `dir` is a cgroup [`mark`]ed before.
fn marked(dir: &Path) -> bool {
    std::fs::read_to_string(dir.join("cgroup.clone_children"))
        .unwrap()
        .trim()
        == "1"
}

fn next_offer(rx: &Receiver<SchedEvent>) -> Offer {
    wait_for(rx, Duration::from_secs(20), |e| match e {
        SchedEvent::Offers(offers) if !offers.is_empty() => Some(offers[0].clone()),
        _ => None,
    })
}

fn terminal(rx: &Receiver<SchedEvent>, task: &str) -> TaskStatus {
    wait_for(rx, Duration::from_secs(60), |e| match e {
        SchedEvent::Update(s) if s.task_id.as_str() == task && s.state.is_terminal() => {
            Some(s.clone())
        }
        _ => None,
    })
}

fn running(rx: &Receiver<SchedEvent>, task: &str) -> TaskStatus {
    wait_for(rx, Duration::from_secs(30), |e| match e {
        SchedEvent::Update(s) if s.task_id.as_str() == task => Some(s.clone()),
        _ => None,
    })
}

/// The agent still runs tasks: command `command` as task `after` on the
/// next offer finishes.
fn another_task_finishes(
    driver: &agora_scheduler::SchedulerDriver,
    rx: &Receiver<SchedEvent>,
    command: &str,
) {
    let offer = next_offer(rx);
    launch(
        driver,
        &offer,
        vec![command_task("after", &offer, command, "cpus:0.1;mem:32")],
    );
    let finished = terminal(rx, "after");
    assert_eq!(finished.state, TaskState::Finished, "{finished:?}");
}

fn launch(driver: &agora_scheduler::SchedulerDriver, offer: &Offer, tasks: Vec<TaskInfo>) {
    driver
        .launch_tasks(
            std::slice::from_ref(&offer.id),
            tasks,
            Filters {
                refuse_seconds: Some(0.0),
            },
        )
        .unwrap();
}

fn agent_alive(isolated: &Isolated) -> bool {
    let agent = &isolated.cluster().agents[0];
    support::process_alive(agent.pid()) && matches!(http_get(agent.addr, "/health"), Ok((200, _)))
}

/// Task `name` with `resources` on `offer`'s agent, run by executor
/// `executor_id` (`test-executor`, cpus:0.01;mem:32 of its own), which
/// acts on `data` (`run PROGRAM ARGS...`).
fn executor_task(
    name: &str,
    executor_id: &str,
    offer: &Offer,
    resources: &str,
    data: String,
) -> TaskInfo {
    let program = bin("test-executor").display().to_string();
    TaskInfo {
        container: None,
        allocation_role: None,
        launch_stamp: None,
        name: name.into(),
        task_id: TaskId::new(name),
        agent_id: offer.agent_id.clone(),
        resources: Resources::parse(resources).unwrap(),
        executor: Some(ExecutorInfo {
            container: None,
            executor_id: ExecutorId::new(executor_id),
            framework_id: None,
            command: CommandInfo::program(program),
            resources: Resources::parse("cpus:0.01;mem:32").unwrap(),
            name: executor_id.into(),
            source: "isolation".into(),
            api: Default::default(),
            shutdown_grace_period: None,
            data: None,
            labels: Default::default(),
        }),
        command: None,
        data: Some(data.into_bytes().into()),
        kill_grace_period: None,
        labels: BTreeMap::new(),
        task_group: None,
    }
}

#[test]
fn an_out_of_memory_task_fails_alone_with_the_memory_limitation() {
    let Some(isolated) = Isolated::start("oom", &[]) else {
        return;
    };
    let cluster = isolated.cluster();
    let (driver, rx) = start_framework(&cluster.master_address(), FrameworkInfo::new("balloon"));
    let offer = next_offer(&rx);
    launch(
        &driver,
        &offer,
        vec![command_task(
            "balloon",
            &offer,
            "tail /dev/zero",
            "cpus:0.1;mem:64",
        )],
    );
    let failed = terminal(&rx, "balloon");
    assert_eq!(failed.state, TaskState::Failed, "{failed:?}");
    assert_eq!(
        failed.reason,
        Some(Reason::ReasonContainerLimitationMemory),
        "{failed:?}"
    );
    let message = failed.message.clone().unwrap_or_default();
    assert!(message.contains("Memory limit exceeded"), "{message}");
    // The task's own container: its mem:64 alone.
    assert!(message.contains("64 MiB"), "{message}");
    assert!(agent_alive(&isolated), "the agent died\n{}", cluster.logs());

    // The agent keeps running tasks.
    another_task_finishes(&driver, &rx, "echo still here");
    assert!(agent_alive(&isolated));
    // agora-execute says why (once this framework no longer holds the
    // agent's offer).
    driver.stop(false).unwrap();
    let (ok, out, err) = cluster.run_bin(
        "agora-execute",
        &[
            "--master",
            &cluster.master_address(),
            "--name",
            "hog",
            "--command",
            "tail /dev/zero",
            "--resources",
            "cpus:0.1;mem:64",
            "--timeout",
            "60s",
        ],
        Duration::from_secs(90),
    );
    assert!(!ok, "{out}\n{err}");
    assert!(
        out.contains("hog-0 TASK_FAILED REASON_CONTAINER_LIMITATION_MEMORY: Memory limit exceeded"),
        "{out}\n{err}"
    );
    // The out-of-memory containers are gone.
    let deadline = Instant::now() + Duration::from_secs(10);
    while !isolated.containers().is_empty() {
        assert!(
            Instant::now() < deadline,
            "containers left: {:?}",
            isolated.containers()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Waits until `cond` holds, or panics with `what` after `timeout`.
fn eventually(timeout: Duration, what: impl Fn() -> String, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + timeout;
    while !cond() {
        assert!(Instant::now() < deadline, "{}", what());
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn read_number(path: &Path, key: Option<&str>) -> u64 {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    match key {
        None => text.trim().parse().unwrap_or(0),
        Some(key) => text
            .lines()
            .find_map(|l| l.strip_prefix(key)?.trim().parse().ok())
            .unwrap_or(0),
    }
}

#[test]
fn the_containers_root_weighs_the_agents_cpus() {
    let Some(isolated) = Isolated::start("weight", &[]) else {
        return;
    };
    // `AGENT` offers cpus:2: the root weighs two processes' worth
    // (cpu.shares 2048 on v1; on v2 its cpu.weight, mapped as runc maps
    // shares), not one for all the containers together.
    let base = controller_base("cpu", &isolated.root).expect("cpu hierarchy");
    let (file, expected) = if driven_as_v2() {
        ("cpu.weight", 1 + (2048 - 2) * 9_999 / (262_144 - 2))
    } else {
        ("cpu.shares", 2048)
    };
    let written = std::fs::read_to_string(base.join(file)).unwrap();
    assert_eq!(written.trim(), expected.to_string(), "{}", base.display());
}

#[test]
fn cpu_is_capped_by_the_cfs_quota() {
    let Some(isolated) = Isolated::start("cpu", &[]) else {
        return;
    };
    let cluster = isolated.cluster();
    // The spin runs under a custom executor of negligible resources, so
    // the container's quota is the task's cpus:0.5 (plus 0.01).
    let script = cluster.dir.path().join("spin.sh");
    let started = cluster.dir.path().join("spin.started");
    std::fs::write(
        &script,
        "touch \"$1\"\ntimeout 2 sh -c 'while :; do :; done'\nexit 0\n",
    )
    .unwrap();
    let (driver, rx) = start_framework(&cluster.master_address(), FrameworkInfo::new("spin"));
    let offer = next_offer(&rx);
    let task = executor_task(
        "spin",
        "spinner",
        &offer,
        "cpus:0.5;mem:64",
        format!("run /bin/sh {} {}", script.display(), started.display()),
    );
    launch(&driver, &offer, vec![task]);
    // The same spin unconfined, at the same time: how much CPU this
    // machine gives a spinning process now.
    eventually(
        Duration::from_secs(30),
        || "the spin never started".into(),
        || started.exists(),
    );
    let free = unconfined_spin_secs(Duration::from_secs(2));
    let done = terminal(&rx, "spin");
    assert_eq!(done.state, TaskState::Finished, "{done:?}");
    // The executor stays (a custom one is not stopped when idle): its
    // container's CPU time is the spin's plus the executor's little.
    let container = isolated
        .containers()
        .pop()
        .expect("the spinner's container");
    let capped = cpu_usage_secs(&isolated.root, container.file_name().unwrap());
    let throttled = read_number(
        &controller_base("cpu", &isolated.root)
            .unwrap()
            .join(container.file_name().unwrap())
            .join("cpu.stat"),
        Some("nr_throttled "),
    );
    eprintln!(
        "2 s of spinning: {capped:.2} s of CPU with cpus:0.5 ({throttled} periods throttled), {free:.2} s unconfined"
    );
    assert!(capped <= 1.2, "cpus:0.5 for 2 s used {capped:.2} s of CPU");
    // On a machine too busy to give a spin more than the quota, neither
    // the lower bound nor throttling can show.
    if free >= 1.6 {
        assert!(throttled > 0, "the CFS quota never throttled the spin");
        assert!(
            capped >= 0.8,
            "cpus:0.5 for 2 s used only {capped:.2} s of CPU"
        );
    } else {
        eprintln!(
            "not checking the lower bound (0.8 s) nor throttling: this machine gave an unconfined spin only {free:.2} s of the same 2 s"
        );
    }
    driver.stop(false).unwrap();
}

/// CPU time an unconfined spinning shell gets in `wall`: how much this
/// machine gives a spinning process now.
fn unconfined_spin_secs(wall: Duration) -> f64 {
    let mut child = std::process::Command::new("/bin/sh")
        .args(["-c", "while :; do :; done"])
        .spawn()
        .unwrap();
    std::thread::sleep(wall);
    let stat = std::fs::read_to_string(format!("/proc/{}/stat", child.id())).unwrap_or_default();
    let _ = child.kill();
    let _ = child.wait();
    let Some(end) = stat.rfind(')') else {
        return 0.0;
    };
    // After the state letter: ppid pgrp session tty tpgid flags minflt
    // cminflt majflt cmajflt utime stime.
    // (tpgid is -1 without a terminal.)
    let fields: Vec<i64> = stat[end + 1..]
        .split_whitespace()
        .skip(1)
        .map(|f| f.parse().unwrap_or(0))
        .collect();
    let ticks = nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK)
        .ok()
        .flatten()
        .unwrap_or(100) as f64;
    (fields[10] + fields[11]) as f64 / ticks
}

#[test]
fn a_fork_bomb_stays_inside_its_pids_limit() {
    // The bomb's subshell gives up once a fork fails; the task then
    // stays (exec, no fork), and so does its container with its
    // pids.events, until it is killed.
    let flags = ["--cgroups-pids-max", "64", "--command-executor-idle", "5s"];
    let Some(isolated) = Isolated::start("pids", &flags) else {
        return;
    };
    let cluster = isolated.cluster();
    let (driver, rx) = start_framework(&cluster.master_address(), FrameworkInfo::new("bomb"));
    let offer = next_offer(&rx);
    launch(
        &driver,
        &offer,
        vec![command_task(
            "bomb",
            &offer,
            "(for i in $(seq 1 300); do sleep 60 & done); exec sleep 60",
            "cpus:0.1;mem:64",
        )],
    );
    assert_eq!(running(&rx, "bomb").state, TaskState::Running);
    let pids = controller_base("pids", &isolated.root).expect("pids hierarchy");
    // The container hit pids.max and never held more.
    eventually(
        Duration::from_secs(20),
        || "the fork bomb never hit pids.max".into(),
        || {
            std::fs::read_dir(&pids)
                .into_iter()
                .flatten()
                .flatten()
                .any(|c| {
                    read_number(&c.path().join("pids.events"), Some("max ")) > 0
                        && read_number(&c.path().join("pids.current"), None) <= 64
                })
        },
    );
    // The agent keeps serving; the bomb is killed whole, and the agent
    // runs another task.
    assert!(agent_alive(&isolated), "the agent died\n{}", cluster.logs());
    driver.kill_task(&TaskId::new("bomb")).unwrap();
    let ended = terminal(&rx, "bomb");
    assert_eq!(ended.state, TaskState::Killed, "{ended:?}");
    another_task_finishes(&driver, &rx, "echo fine");
    eventually(
        Duration::from_secs(20),
        || format!("containers left: {:?}", isolated.containers()),
        || isolated.containers().is_empty(),
    );
    driver.stop(false).unwrap();
}

/// Pids whose `/proc/PID/cgroup` names `container`.
fn processes_in(container: &str) -> Vec<i32> {
    std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| {
            std::fs::read_to_string(format!("/proc/{pid}/cgroup"))
                .is_ok_and(|text| text.contains(container))
        })
        .filter(|pid| support::process_alive(*pid))
        .collect()
}

#[test]
fn a_killed_task_leaves_no_process_and_no_cgroup() {
    let Some(isolated) = Isolated::start("kill", &[]) else {
        return;
    };
    let cluster = isolated.cluster();
    let (driver, rx) = start_framework(&cluster.master_address(), FrameworkInfo::new("escape"));
    let offer = next_offer(&rx);
    launch(
        &driver,
        &offer,
        vec![command_task(
            "escape",
            &offer,
            "setsid sleep 1000 & sleep 1000",
            "cpus:0.1;mem:64",
        )],
    );
    assert_eq!(running(&rx, "escape").state, TaskState::Running);
    // The task has a container of its own (its command executor, which
    // could run more tasks, has another).
    let container = isolated.task_container("escape");
    let name = format!("/{container}");
    // The shell and both sleeps.
    eventually(
        Duration::from_secs(10),
        || format!("processes: {:?}", processes_in(&name)),
        || processes_in(&name).len() >= 3,
    );
    let before = processes_in(&name);
    // What the container uses, as the agent reports it.
    let agent = cluster.agents[0].addr;
    let (code, body) = http_get(agent, "/monitor/statistics").unwrap();
    assert_eq!(code, 200, "{body}");
    let entries: serde_json::Value = serde_json::from_str(&body).unwrap();
    let entry = entries
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["cgroup"] == container)
        .expect("the task's container");
    assert_eq!(entry["tasks"][0], "escape", "{body}");
    let stats = &entry["statistics"];
    // The task's mem:64 and cpus:0.1.
    assert_eq!(stats["mem_limit_bytes"], 64u64 << 20, "{body}");
    assert!(
        (stats["cpus_limit"].as_f64().unwrap() - 0.1).abs() < 1e-9,
        "{body}"
    );
    assert!(stats["processes"].as_u64().unwrap() >= 3, "{body}");
    assert!(stats["mem_total_bytes"].as_u64().unwrap() > 0, "{body}");
    assert_eq!(stats["processes_limit"], 4096, "{body}");
    let (_, metrics) = http_get(agent, "/metrics").unwrap();
    assert!(
        metrics.contains("agora_agent_container_memory_limit_bytes{framework_id="),
        "{metrics}"
    );
    // The master shows it on the task (agents report every 5 s).
    let mut usage = serde_json::Value::Null;
    eventually(
        Duration::from_secs(15),
        || "no usage on the task in the master's /state".into(),
        || {
            let state = cluster.state();
            usage = state["frameworks"]
                .as_array()
                .into_iter()
                .flatten()
                .flat_map(|f| f["tasks"].as_array().into_iter().flatten())
                .find(|t| t["id"] == "escape")
                .map(|t| t["usage"].clone())
                .unwrap_or_default();
            !usage.is_null()
        },
    );
    assert_eq!(usage["mem_limit_bytes"], 64u64 << 20, "{usage}");
    assert!(usage["processes"].as_u64().unwrap() >= 3, "{usage}");
    assert_eq!(usage["tasks"][0], "escape", "{usage}");
    driver.kill_task(&TaskId::new("escape")).unwrap();
    let killed = terminal(&rx, "escape");
    assert_eq!(killed.state, TaskState::Killed, "{killed:?}");
    eventually(
        Duration::from_secs(20),
        || format!("still in {name}: {:?}", processes_in(&name)),
        || processes_in(&name).is_empty(),
    );
    for pid in before {
        assert!(!support::process_alive(pid), "{pid} survived the kill");
    }
    eventually(
        Duration::from_secs(10),
        || format!("cgroups left: {:?}", isolated.containers()),
        || isolated.container_gone(&container),
    );
    // Its command executor goes too once the framework does.
    driver.stop(false).unwrap();
    eventually(
        Duration::from_secs(20),
        || format!("cgroups left: {:?}", isolated.containers()),
        || isolated.containers().is_empty(),
    );
}

#[test]
fn a_restarted_agent_keeps_live_containers_and_destroys_orphans() {
    let Some(mut isolated) = Isolated::start("recovery", &[]) else {
        return;
    };
    let mut info = FrameworkInfo::new("survivor");
    info.checkpoint = true;
    info.failover_timeout = 60.0;
    let (driver, rx) = start_framework(&isolated.cluster().master_address(), info);
    // A first task, whose ended container (and its command executor's,
    // once idle) the second reuses.
    let offer = next_offer(&rx);
    launch(
        &driver,
        &offer,
        vec![command_task("short", &offer, "true", "cpus:0.1;mem:64")],
    );
    assert_eq!(terminal(&rx, "short").state, TaskState::Finished);
    let spares = isolated.containers();
    eventually(
        Duration::from_secs(10),
        || "the first task's containers still hold processes".into(),
        || {
            spares.iter().all(|c| {
                processes_in(&format!("/{}", c.file_name().unwrap().to_string_lossy())).is_empty()
            })
        },
    );
    let offer = next_offer(&rx);
    launch(
        &driver,
        &offer,
        vec![command_task(
            "long",
            &offer,
            "sleep 1000",
            "cpus:0.1;mem:64",
        )],
    );
    assert_eq!(running(&rx, "long").state, TaskState::Running);
    // The task's container and its command executor's: the first task's
    // reused, which keeps its directories' name and holds the second's
    // run.
    let entry = isolated.task_entry("long");
    assert_ne!(entry["container_id"], entry["cgroup"], "{entry}");
    let containers = isolated.containers();
    assert_eq!(containers.len(), 2, "{containers:?}");
    let members: Vec<i32> = containers
        .iter()
        .flat_map(|c| processes_in(&format!("/{}", c.file_name().unwrap().to_string_lossy())))
        .collect();
    assert!(members.len() >= 2, "{members:?}");

    // SIGKILL and restart: the executor is recovered, the containers kept.
    isolated.cluster_mut().agents[0].restart_same_port();
    std::thread::sleep(Duration::from_secs(2));
    for container in &containers {
        assert!(
            container.exists(),
            "the recovered executor's container {} was removed",
            container.display()
        );
    }
    // The task's container is still watched and reported, found by the
    // run it holds.
    let after = isolated.task_entry("long");
    assert_eq!(after["container_id"], entry["container_id"], "{after}");
    assert_eq!(after["cgroup"], entry["cgroup"], "{after}");
    for pid in &members {
        assert!(support::process_alive(*pid), "{pid} died in recovery");
    }
    assert!(agent_alive(&isolated));

    // SIGKILL, forget everything (no checkpoint), restart: the container
    // is an orphan and is destroyed.
    let work_dir = isolated.cluster().agents[0].work_dir.clone();
    isolated.cluster_mut().agents[0].kill();
    std::fs::remove_dir_all(work_dir.join("meta")).unwrap();
    isolated.cluster_mut().agents[0].restart_same_port();
    eventually(
        Duration::from_secs(10),
        || format!("orphan containers still there: {containers:?}"),
        || containers.iter().all(|c| !c.exists()),
    );
    for pid in &members {
        assert!(
            !support::process_alive(*pid),
            "{pid} outlived its orphan container"
        );
    }
    driver.stop(false).unwrap();
}

#[test]
fn the_agent_refuses_cgroups_it_cannot_use() {
    let dir = tempfile::tempdir().unwrap();
    let output = std::process::Command::new(bin("agora-agent"))
        .args(["--master", "127.0.0.1:1", "--listen", "127.0.0.1:0"])
        .arg("--work-dir")
        .arg(dir.path())
        .args(["--isolation", "cgroups", "--cgroups-root", "../escape"])
        .output()
        .unwrap();
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("invalid --cgroups-root"), "{stderr}");
}

/// The cgroup v2 run: on a host the agent drives as v2 the tests above
/// ran against it; elsewhere this says why they did not.
#[test]
fn cgroup_v2_is_tested_where_the_host_offers_it() {
    let Some(unified) = unified_mount() else {
        eprintln!("skipping the cgroup v2 run: no cgroup2 hierarchy is mounted here");
        return;
    };
    let controllers =
        std::fs::read_to_string(unified.join("cgroup.controllers")).unwrap_or_default();
    let missing: Vec<&str> = ["cpu", "memory", "pids"]
        .into_iter()
        .filter(|c| !controllers.split_whitespace().any(|x| x == *c))
        .collect();
    if !driven_as_v2() {
        let why = if missing.is_empty() {
            String::new()
        } else {
            format!(
                ", not {missing:?}: they are bound to the v1 hierarchies (a controller is in one \
                 hierarchy at a time, and a private mount namespace mounts the same unified \
                 hierarchy, so it cannot offer them either)"
            )
        };
        eprintln!(
            "skipping the cgroup v2 run: this host mounts the cgroup v1 controllers, which the \
             agent prefers, so the tests above ran against v1; the unified hierarchy at {} \
             offers {:?}{why}",
            unified.display(),
            controllers.trim()
        );
        return;
    }
    if !missing.is_empty() {
        eprintln!(
            "skipping the cgroup v2 run: the unified hierarchy at {} offers {:?}, not {missing:?}",
            unified.display(),
            controllers.trim()
        );
        return;
    }
    eprintln!(
        "the tests above ran against cgroup v2 at {} (controllers {:?})",
        unified.display(),
        controllers.trim()
    );
}

#[test]
fn the_next_task_with_the_same_resources_reuses_an_ended_tasks_container() {
    let Some((isolated, memory)) = Isolated::start_reusing("reuse") else {
        return;
    };
    let cluster = isolated.cluster();
    let (driver, rx) = start_framework(&cluster.master_address(), FrameworkInfo::new("reuse"));
    let mut reused = Vec::new();
    for (task, command) in [
        (
            "first",
            "head -c 20000000 /dev/zero | tail -c 1 > /dev/null; sleep 1",
        ),
        ("second", "sleep 1"),
        // The executor enters this one through the files it kept open
        // from the second task, under the container's lasting name.
        ("third", "sleep 1"),
    ] {
        let offer = next_offer(&rx);
        launch(
            &driver,
            &offer,
            vec![command_task(task, &offer, command, "cpus:0.1;mem:64")],
        );
        assert_eq!(running(&rx, task).state, TaskState::Running);
        // Named by this task's run, wherever it came from.
        let container = isolated.task_container(task);
        let dir = memory.join(&container);
        if task == "first" {
            mark(&dir);
        } else {
            reused.push(marked(&dir));
        }
        // The task's process runs in it, under its name of now.
        eventually(
            Duration::from_secs(5),
            || format!("no process of {task} in its container {container}"),
            || !processes_in(&container).is_empty(),
        );
        if task != "first" {
            // What the first task used does not show as the second's.
            let peak = read_number(&dir.join("memory.max_usage_in_bytes"), None);
            assert!(peak < 10 << 20, "the second task's peak is {peak} bytes");
        }
        let done = terminal(&rx, task);
        assert_eq!(done.state, TaskState::Finished, "{done:?}");
    }
    assert!(
        reused == [true, true],
        "a later task got a new container, not the first one's: {reused:?}"
    );
    driver.stop(false).unwrap();
    // Spares go after a while unused.
    eventually(
        Duration::from_secs(20),
        || format!("cgroups left: {:?}", isolated.containers()),
        || isolated.containers().is_empty(),
    );
}

#[test]
fn an_ended_executors_container_is_reused_by_the_next_executor() {
    let Some((isolated, memory)) = Isolated::start_reusing("executor-reuse") else {
        return;
    };
    let cluster = isolated.cluster();
    let mut reused = false;
    for name in ["first", "second"] {
        let (driver, rx) = start_framework(&cluster.master_address(), FrameworkInfo::new(name));
        let offer = next_offer(&rx);
        let task = executor_task(
            name,
            &format!("executor-{name}"),
            &offer,
            "cpus:0.1;mem:64",
            "run /bin/sleep 1".into(),
        );
        launch(&driver, &offer, vec![task]);
        assert_eq!(running(&rx, name).state, TaskState::Running);
        // Named by the executor's run, wherever it came from.
        let container = isolated.task_container(name);
        match name {
            "first" => mark(&memory.join(&container)),
            _ => reused = marked(&memory.join(&container)),
        }
        let done = terminal(&rx, name);
        assert_eq!(done.state, TaskState::Finished, "{done:?}");
        // The framework's end ends its executor, whose container is then
        // kept empty for the next one.
        driver.stop(false).unwrap();
        eventually(
            Duration::from_secs(20),
            || format!("the executor of {name} still runs in {container}"),
            || processes_in(&container).is_empty(),
        );
    }
    assert!(
        reused,
        "the second executor got a new container, not the first one's"
    );
}

/// With `--container-logger logrotate`, a command task in a container
/// of its own (its process started straight into the cgroup) still has
/// its output rotated by size, by loggers that stay outside the
/// container.
#[test]
fn a_contained_tasks_output_is_rotated_by_loggers_outside_its_container() {
    let Some(isolated) = Isolated::start(
        "logrotate",
        &[
            "--container-logger",
            "logrotate",
            "--logrotate-max-stdout-size",
            "8KB",
            "--logrotate-max-files",
            "1",
        ],
    ) else {
        return;
    };
    let cluster = isolated.cluster();
    let (driver, rx) = start_framework(&cluster.master_address(), FrameworkInfo::new("rotated"));
    let offer = next_offer(&rx);
    launch(
        &driver,
        &offer,
        vec![command_task(
            "rotated",
            &offer,
            "while true; do echo a line of a contained task; done",
            "cpus:0.1;mem:64",
        )],
    );
    assert_eq!(running(&rx, "rotated").state, TaskState::Running);
    let container = isolated.task_container("rotated");
    let (_, body) = http_get(cluster.agents[0].addr, "/state").unwrap();
    let state: serde_json::Value = serde_json::from_str(&body).unwrap();
    let sandbox = state["frameworks"][0]["executors"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["id"] == "rotated")
        .and_then(|e| e["directory"].as_str())
        .expect("the task's sandbox")
        .to_string();
    let size = |name: &str| {
        std::fs::metadata(Path::new(&sandbox).join(name))
            .map(|m| m.len())
            .ok()
    };
    eventually(
        Duration::from_secs(15),
        || format!("no stdout.1 in {sandbox}"),
        || size("stdout.1").is_some(),
    );
    for _ in 0..4 {
        std::thread::sleep(Duration::from_millis(250));
        assert!(size("stdout").unwrap_or(0) <= 8192, "{:?}", size("stdout"));
        assert!(size("stdout.1").is_some_and(|s| s <= 8192));
        assert_eq!(size("stdout.2"), None);
    }
    let inside = processes_in(&format!("/{container}"));
    let loggers: Vec<i32> = std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|c| {
                let c = String::from_utf8_lossy(&c);
                c.contains("agora-logrotate-logger") && c.contains(&sandbox)
            })
        })
        .filter(|pid| support::process_alive(*pid))
        .collect();
    assert_eq!(loggers.len(), 2, "a logger per stream: {loggers:?}");
    assert!(
        loggers.iter().all(|pid| !inside.contains(pid)),
        "loggers {loggers:?} in the container with {inside:?}"
    );
    driver.kill_task(&TaskId::new("rotated")).unwrap();
    assert_eq!(terminal(&rx, "rotated").state, TaskState::Killed);
    driver.stop(false).unwrap();
}
