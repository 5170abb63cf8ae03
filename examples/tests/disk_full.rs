//! An agent whose work directory fills up, against a real master and a
//! real framework: the agent notices, the framework gets no offer of it
//! (a task it ran before still ends and is reported: the agent's own
//! records have their reserve), and once the space is freed the agent is
//! offered again and runs tasks. The work directory is a 20 MB tmpfs, so
//! the test needs root (it skips, saying so, without).

mod support;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use agora_proto::{Filters, FrameworkInfo, TaskState, TaskStatus};
use support::{
    bin, command_task, http_get, start_framework, wait_for, Proc, SchedEvent, TestCluster,
};

const AGENT: &str = "cpus:2;mem:1024";

/// A tmpfs mounted for the test, unmounted when dropped.
struct Tmpfs(PathBuf);

impl Tmpfs {
    fn mount(dir: &Path, size: &str) -> Result<Tmpfs, String> {
        std::fs::create_dir_all(dir).map_err(|e| e.to_string())?;
        let out = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(dir)
            .output()
            .map_err(|e| format!("cannot run mount: {e}"))?;
        if !out.status.success() {
            return Err(String::from_utf8_lossy(&out.stderr).into_owned());
        }
        Ok(Tmpfs(dir.to_path_buf()))
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount")
            .arg("-l")
            .arg(&self.0)
            .status();
    }
}

/// Why the master's `/state` says its one agent cannot take tasks.
fn master_unavailable(master: &Proc) -> Option<String> {
    let (status, body) = http_get(master.addr, "/state").expect("master /state");
    assert_eq!(status, 200, "{body}");
    let state: serde_json::Value = serde_json::from_str(&body).expect("master /state JSON");
    state["agents"][0]["unavailable"]
        .as_str()
        .map(str::to_string)
}

/// The agent's `/state`.
fn agent_state(agent: &Proc) -> serde_json::Value {
    let (status, body) = http_get(agent.addr, "/state").expect("agent /state");
    assert_eq!(status, 200, "{body}");
    serde_json::from_str(&body).expect("agent /state JSON")
}

/// Writes `path` until the file system has no room left.
fn fill(path: &Path) {
    let mut file = std::fs::File::create(path).expect("filler");
    let chunk = vec![7u8; 1 << 20];
    loop {
        if let Err(e) = file.write_all(&chunk) {
            assert_eq!(
                e.raw_os_error(),
                Some(nix::errno::Errno::ENOSPC as i32),
                "{e}"
            );
            break;
        }
    }
    // Whatever partial chunk fits.
    let _ = file.write_all(&chunk[..4096]);
}

fn terminal(events: &std::sync::mpsc::Receiver<SchedEvent>, task: &str) -> TaskStatus {
    wait_for(events, Duration::from_secs(30), |e| match e {
        SchedEvent::Update(s) if s.task_id.as_str() == task && s.state.is_terminal() => {
            Some(s.clone())
        }
        _ => None,
    })
}

#[test]
fn a_full_work_directory_is_not_offered_and_is_offered_again_once_freed() {
    if !nix::unistd::Uid::effective().is_root() {
        eprintln!("skipping: mounting a 20 MB tmpfs as the agent's work directory needs root");
        return;
    }
    let mut cluster = TestCluster::start_with(0, AGENT, &[]);
    let disk = cluster.dir.path().join("disk");
    let _tmpfs = match Tmpfs::mount(&disk, "20m") {
        Ok(t) => t,
        Err(why) => {
            eprintln!("skipping: cannot mount a tmpfs: {why}");
            return;
        }
    };
    let work = disk.join("agent");
    std::fs::create_dir_all(&work).unwrap();
    let args: Vec<String> = [
        "--master",
        &cluster.master_address(),
        "--listen",
        "127.0.0.1:0",
        "--work-dir",
        &work.display().to_string(),
        "--resources",
        AGENT,
        "--command-executor",
        &bin("agora-command-executor").display().to_string(),
        "--allow-root-tasks",
        "--disk-check-interval",
        "200ms",
        "--disk-min-free",
        "2MB",
        "--disk-reserve",
        "2MB",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let log = cluster.dir.path().join("agent-0.log");
    let agent = Proc::spawn("agent 0", &bin("agora-agent"), &args, &work, &log);
    cluster.agents.push(agent);
    cluster.wait_agents(1);
    let agent = &cluster.agents[0];
    // The reserve is allocated.
    let reserve = work.join("meta").join("disk-reserve");
    support::wait_until(
        Duration::from_secs(10),
        "the disk reserve",
        || cluster.logs(),
        || reserve.exists().then_some(()),
    );

    let mut info = FrameworkInfo::new("disk-full");
    info.checkpoint = true;
    let (driver, events) = start_framework(&cluster.master_address(), info);
    let no_refusal = Filters {
        refuse_seconds: Some(0.0),
    };
    let offer = wait_for(&events, Duration::from_secs(20), |e| match e {
        SchedEvent::Offers(offers) => offers.first().cloned(),
        _ => None,
    });
    // A task that is still running when the disk fills.
    let long = command_task("long", &offer, "sleep 3", "cpus:0.5;mem:64");
    driver
        .launch_tasks(std::slice::from_ref(&offer.id), vec![long], no_refusal)
        .unwrap();
    wait_for(&events, Duration::from_secs(20), |e| match e {
        SchedEvent::Update(s) if s.task_id.as_str() == "long" => {
            assert_eq!(s.state, TaskState::Running, "{s:?}\n{}", cluster.logs());
            Some(())
        }
        _ => None,
    });

    fill(&disk.join("filler"));
    let filled = Instant::now();
    support::wait_until(
        Duration::from_secs(10),
        "the agent to say it is full",
        || cluster.logs(),
        || agent_state(agent)["unavailable"].is_string().then_some(()),
    );
    let why = agent_state(agent)["unavailable"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(
        why.contains("is full") && why.contains(&work.display().to_string()),
        "{why}"
    );
    assert!(!reserve.exists(), "the reserve is released");
    // The master shows the operator why the agent is not offered.
    support::wait_until(
        Duration::from_secs(10),
        "the master's /state to show the agent unavailable",
        || cluster.logs(),
        || master_unavailable(&cluster.master).filter(|m| m.contains("is full")),
    );

    // From here on, nothing of the agent is offered: watch for 4 s (the
    // running task ends meanwhile, and is reported).
    let mut long_end = None;
    let mut offered_while_full = Vec::new();
    let watch_from = Instant::now() + Duration::from_millis(500);
    while Instant::now() < watch_from + Duration::from_secs(4) {
        match events.recv_timeout(Duration::from_millis(100)) {
            Ok(SchedEvent::Offers(offers)) if Instant::now() > watch_from => {
                offered_while_full.extend(offers)
            }
            Ok(SchedEvent::Update(s)) if s.task_id.as_str() == "long" && s.state.is_terminal() => {
                long_end = Some(s)
            }
            _ => {}
        }
    }
    assert!(
        offered_while_full.is_empty(),
        "offers of a full agent: {offered_while_full:?}"
    );
    let long_end = long_end.unwrap_or_else(|| terminal(&events, "long"));
    assert_eq!(
        long_end.state,
        TaskState::Finished,
        "{long_end:?}\n{}",
        cluster.logs()
    );
    eprintln!("full for {:?} with no offer", filled.elapsed());

    // Space again: the agent is offered and runs tasks.
    std::fs::remove_file(disk.join("filler")).unwrap();
    let offer = wait_for(&events, Duration::from_secs(20), |e| match e {
        SchedEvent::Offers(offers) => offers.first().cloned(),
        _ => None,
    });
    // (Its /state is a snapshot, which may trail the master by a moment.)
    support::wait_until(
        Duration::from_secs(5),
        "the agent to say it has room",
        || cluster.logs(),
        || agent_state(agent)["unavailable"].is_null().then_some(()),
    );
    assert!(reserve.exists(), "the reserve is taken again");
    support::wait_until(
        Duration::from_secs(5),
        "the master's /state to show the agent available",
        || cluster.logs(),
        || master_unavailable(&cluster.master).is_none().then_some(()),
    );
    let after = command_task("after", &offer, "echo back > back.txt", "cpus:0.5;mem:64");
    driver
        .launch_tasks(std::slice::from_ref(&offer.id), vec![after], no_refusal)
        .unwrap();
    let after_end = terminal(&events, "after");
    assert_eq!(
        after_end.state,
        TaskState::Finished,
        "{after_end:?}\n{}",
        cluster.logs()
    );
    let _ = driver.stop(false);
}
