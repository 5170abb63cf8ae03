//! Resource isolation on real agents (`--isolation cgroups`): an
//! out-of-memory task fails alone with `REASON_CONTAINER_LIMITATION_MEMORY`,
//! CPU is capped by the CFS quota, a fork bomb stays inside its pids
//! limit, a kill leaves no process and no cgroup behind, and a restarted
//! agent keeps live containers and destroys orphans.
//!
//! Each test needs root and the cgroup v1 controllers (cpu, cpuacct,
//! memory, pids, freezer) present and writable; elsewhere it prints why
//! it skips. Each uses a `--cgroups-root` of its own
//! (`agora-test-PID-NAME`), destroyed at the end whatever happens.

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
use support::{bin, http_get, start_framework, wait_for, SchedEvent, TestCluster};

const AGENT: &str = "cpus:2;mem:1024;disk:1024;ports:[31000-31100]";

/// A cluster whose agents isolate with cgroups under a root of this
/// test's own, removed on drop after the agents stopped.
struct Isolated {
    cluster: Option<TestCluster>,
    root: String,
}

impl Isolated {
    /// `None` (with the reason printed) where cgroups cannot be used.
    fn start(test: &str, extra: &[&str]) -> Option<Isolated> {
        let root = format!("agora-test-{}-{test}", std::process::id());
        if let Err(why) = check_cgroups(&root) {
            eprintln!("skipping {test}: cgroups isolation cannot run here: {why}");
            return None;
        }
        let mut flags = vec![
            "--isolation",
            "cgroups",
            "--cgroups-root",
            &root,
            "--command-executor-idle",
            "200ms",
        ];
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

    /// The containers under this test's root (in the freezer hierarchy).
    fn containers(&self) -> Vec<PathBuf> {
        let Some(base) = freezer_base(&self.root) else {
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

/// `<freezer mount>/<this process's freezer cgroup>/<root>`.
fn freezer_base(root: &str) -> Option<PathBuf> {
    let own = std::fs::read_to_string("/proc/self/cgroup").ok()?;
    let path = own.lines().find_map(|l| {
        let mut parts = l.splitn(3, ':');
        let _ = parts.next();
        let controllers = parts.next()?;
        let path = parts.next()?;
        controllers.split(',').any(|c| c == "freezer").then(|| path.to_string())
    })?;
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    let mount = mounts.lines().find_map(|l| {
        let (left, right) = l.split_once(" - ")?;
        let fields: Vec<&str> = left.split(' ').collect();
        (right.starts_with("cgroup ") && right.split(' ').nth(2)?.split(',').any(|o| o == "freezer"))
            .then(|| PathBuf::from(fields[4]))
    })?;
    Some(mount.join(path.trim_start_matches('/')).join(root))
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

fn command_task(id: &str, offer: &Offer, command: &str, resources: &str) -> TaskInfo {
    TaskInfo {
        name: id.to_string(),
        task_id: TaskId::new(id),
        agent_id: offer.agent_id.clone(),
        resources: Resources::parse(resources).unwrap(),
        executor: None,
        command: Some(CommandInfo {
            value: command.to_string(),
            shell: true,
            ..CommandInfo::default()
        }),
        data: None,
        kill_grace_period: Some(1.0),
        labels: BTreeMap::new(),
    }
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

/// Files named `name` under `dir`.
fn find_files(dir: &Path, name: &str) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
            let path = entry.path();
            if path.is_dir() {
                stack.push(path);
            } else if path.file_name().is_some_and(|n| n == name) {
                out.push(path);
            }
        }
    }
    out
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
        vec![command_task("balloon", &offer, "tail /dev/zero", "cpus:0.1;mem:64")],
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
    // mem:64 plus the command executor's 32.
    assert!(message.contains("96 MiB"), "{message}");
    assert!(agent_alive(&isolated), "the agent died\n{}", cluster.logs());

    // The agent keeps running tasks.
    let offer = next_offer(&rx);
    launch(
        &driver,
        &offer,
        vec![command_task("after", &offer, "echo still here", "cpus:0.1;mem:32")],
    );
    let finished = terminal(&rx, "after");
    assert_eq!(finished.state, TaskState::Finished, "{finished:?}");
    assert!(agent_alive(&isolated));
    // The out-of-memory container is gone.
    let deadline = Instant::now() + Duration::from_secs(10);
    while isolated.containers().len() > 1 {
        assert!(
            Instant::now() < deadline,
            "containers left: {:?}",
            isolated.containers()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    driver.stop(false).unwrap();
}
