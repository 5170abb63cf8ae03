//! The first complete path on real processes: a master and two agents on
//! 127.0.0.1, frameworks launching command tasks and custom-executor
//! tasks, kills, and launches on stale offers.

mod support;

use std::collections::HashMap;
use std::time::{Duration, Instant};

use agora_proto::{Filters, FrameworkInfo, Reason, TaskId, TaskState, TaskStatus};
use support::{command_task, process_alive, start_framework, wait_for, SchedEvent, TestCluster};

const AGENT: &str = "cpus:4;mem:4096;disk:4096;ports:[31000-32000]";

fn next_offers(rx: &std::sync::mpsc::Receiver<SchedEvent>) -> Vec<agora_proto::Offer> {
    wait_for(rx, Duration::from_secs(20), |e| match e {
        SchedEvent::Offers(offers) if !offers.is_empty() => Some(offers.clone()),
        _ => None,
    })
}

fn next_update(rx: &std::sync::mpsc::Receiver<SchedEvent>, task: &str) -> TaskStatus {
    wait_for(rx, Duration::from_secs(30), |e| match e {
        SchedEvent::Update(s) if s.task_id.as_str() == task => Some(s.clone()),
        _ => None,
    })
}

#[test]
fn agora_execute_runs_fifty_instances_to_completion() {
    let cluster = TestCluster::start(2, AGENT);
    let started = Instant::now();
    let (ok, out, err) = cluster.run_bin(
        "agora-execute",
        &[
            "--master",
            &cluster.master_address(),
            "--name",
            "fifty",
            "--command",
            "echo hello from $AGORA_EXECUTOR_ID",
            "--resources",
            "cpus:0.1;mem:32",
            "--instances",
            "50",
            "--timeout",
            "120s",
        ],
        Duration::from_secs(150),
    );
    assert!(
        ok,
        "agora-execute failed\nstdout:\n{out}\nstderr:\n{err}\n{}",
        cluster.logs()
    );
    // Every instance went RUNNING then FINISHED, each exactly once.
    let mut states: HashMap<String, Vec<String>> = HashMap::new();
    for line in out.lines() {
        let mut words = line.split_whitespace();
        if let (Some(task), Some(state)) = (words.next(), words.next()) {
            if task.starts_with("fifty-") && state.starts_with("TASK_") {
                states
                    .entry(task.to_string())
                    .or_default()
                    .push(state.to_string());
            }
        }
    }
    assert_eq!(states.len(), 50, "{out}");
    for (task, seen) in &states {
        assert_eq!(
            seen.last().map(String::as_str),
            Some("TASK_FINISHED"),
            "{task}: {seen:?}"
        );
        assert_eq!(
            seen.iter().filter(|s| *s == "TASK_FINISHED").count(),
            1,
            "{task}: {seen:?}"
        );
        assert!(
            seen.contains(&"TASK_RUNNING".to_string()),
            "{task}: {seen:?}"
        );
    }
    assert!(out.contains("finished 50/50"), "{out}");
    // The command's output landed in its sandbox.
    let found = walk(cluster.dir.path())
        .into_iter()
        .filter(|p| p.file_name().is_some_and(|n| n == "stdout"))
        .filter_map(|p| std::fs::read_to_string(p).ok())
        .any(|text| text.contains("hello from fifty-"));
    assert!(found, "no sandbox stdout holds the command's output");
    eprintln!("50 instances in {:.2} s", started.elapsed().as_secs_f64());
}

fn walk(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    if let Ok(entries) = std::fs::read_dir(dir) {
        for entry in entries.flatten() {
            let path = entry.path();
            if path.is_dir() {
                out.extend(walk(&path));
            } else {
                out.push(path);
            }
        }
    }
    out
}

#[test]
fn test_framework_runs_tasks_on_its_custom_executor() {
    let cluster = TestCluster::start(2, AGENT);
    let (ok, out, err) = cluster.run_bin(
        "test-framework",
        &[
            "--master",
            &cluster.master_address(),
            "--tasks",
            "6",
            "--timeout",
            "90s",
        ],
        Duration::from_secs(120),
    );
    assert!(
        ok,
        "test-framework failed\nstdout:\n{out}\nstderr:\n{err}\n{}",
        cluster.logs()
    );
    assert!(out.contains("finished 6/6 tasks, 0 failed"), "{out}");
    // Framework messages travelled both ways: each running task was pinged
    // and the executor's pong came back.
    assert!(out.contains("message from executor test-executor"), "{out}");
    assert!(out.contains("finished after ping"), "{out}");
}

#[test]
fn killing_a_running_task_yields_task_killed_and_ends_its_processes() {
    let cluster = TestCluster::start(2, AGENT);
    let (driver, rx) = start_framework(&cluster.master_address(), FrameworkInfo::new("killer"));
    let offer = next_offers(&rx).remove(0);
    let task = command_task(
        "sleeper",
        &offer,
        "echo $$ > pid; exec sleep 60",
        "cpus:0.5;mem:64",
    );
    driver
        .launch_tasks(
            std::slice::from_ref(&offer.id),
            vec![task],
            Filters::default(),
        )
        .unwrap();
    let running = next_update(&rx, "sleeper");
    assert_eq!(running.state, TaskState::Running, "{running:?}");
    // The command wrote its pid into its sandbox.
    let deadline = Instant::now() + Duration::from_secs(10);
    let pid = loop {
        let pid = walk(cluster.dir.path())
            .into_iter()
            .find(|p| p.file_name().is_some_and(|n| n == "pid"))
            .and_then(|p| std::fs::read_to_string(p).ok())
            .and_then(|s| s.trim().parse::<i32>().ok());
        if let Some(pid) = pid {
            break pid;
        }
        assert!(Instant::now() < deadline, "the task never wrote its pid");
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(process_alive(pid));
    driver.kill_task(&TaskId::new("sleeper")).unwrap();
    let killed = wait_for(&rx, Duration::from_secs(20), |e| match e {
        SchedEvent::Update(s) if s.state.is_terminal() => Some(s.clone()),
        _ => None,
    });
    assert_eq!(killed.state, TaskState::Killed, "{killed:?}");
    let deadline = Instant::now() + Duration::from_secs(10);
    while process_alive(pid) {
        assert!(
            Instant::now() < deadline,
            "the killed task's process {pid} is still alive"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    // Killing a task the master does not know is answered, not ignored.
    driver.kill_task(&TaskId::new("no-such-task")).unwrap();
    let lost = next_update(&rx, "no-such-task");
    assert_eq!(lost.state, TaskState::Lost, "{lost:?}");
    driver.stop(false).unwrap();
}

#[test]
fn launches_on_stale_offers_and_invalid_tasks_get_error_updates() {
    let cluster = TestCluster::start(2, AGENT);
    let (driver, rx) = start_framework(&cluster.master_address(), FrameworkInfo::new("stale"));
    let offers = next_offers(&rx);
    let stale = offers[0].clone();
    driver
        .decline_offer(
            &stale.id,
            Filters {
                refuse_seconds: Some(0.0),
            },
        )
        .unwrap();
    let task = command_task("on-stale", &stale, "true", "cpus:0.1;mem:32");
    driver
        .launch_tasks(
            std::slice::from_ref(&stale.id),
            vec![task],
            Filters::default(),
        )
        .unwrap();
    let dropped = next_update(&rx, "on-stale");
    assert_eq!(dropped.state, TaskState::Dropped, "{dropped:?}");
    assert_eq!(dropped.reason, Some(Reason::ReasonInvalidOffers));
    assert!(dropped.message.is_some());

    // A fresh offer: two tasks with one id, and one too big for the offer.
    let offer = wait_for(&rx, Duration::from_secs(20), |e| match e {
        SchedEvent::Offers(offers) => offers.iter().find(|o| o.id != stale.id).cloned(),
        _ => None,
    });
    let twin_a = command_task("twin", &offer, "true", "cpus:0.1;mem:32");
    let twin_b = command_task("twin", &offer, "true", "cpus:0.1;mem:32");
    let huge = command_task("huge", &offer, "true", "cpus:1000;mem:32");
    driver
        .launch_tasks(
            std::slice::from_ref(&offer.id),
            vec![twin_a, twin_b, huge],
            Filters::default(),
        )
        .unwrap();
    let mut twin_states = Vec::new();
    let mut huge_state = None;
    let deadline = Instant::now() + Duration::from_secs(30);
    while (twin_states.len() < 2
        || !twin_states
            .iter()
            .any(|s: &TaskStatus| s.state == TaskState::Finished))
        || huge_state.is_none()
    {
        assert!(
            Instant::now() < deadline,
            "twins {twin_states:?} huge {huge_state:?}"
        );
        if let Ok(SchedEvent::Update(s)) = rx.recv_timeout(Duration::from_secs(1)) {
            match s.task_id.as_str() {
                "twin" if s.state != TaskState::Running => twin_states.push(s),
                "huge" => huge_state = Some(s),
                _ => {}
            }
        }
    }
    let huge = huge_state.unwrap();
    assert_eq!(huge.state, TaskState::Error, "{huge:?}");
    assert_eq!(huge.reason, Some(Reason::ReasonInsufficientResources));
    let dup = twin_states
        .iter()
        .find(|s| s.state == TaskState::Error)
        .unwrap_or_else(|| panic!("no TASK_ERROR for the duplicate id: {twin_states:?}"));
    assert_eq!(dup.reason, Some(Reason::ReasonTaskInvalid));
    driver.stop(false).unwrap();
}
