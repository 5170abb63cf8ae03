//! No collapse at high concurrency: a job of 10,000 `/bin/true` tasks with
//! 2,000 concurrent slots on three agents finishes, every task
//! TASK_FINISHED (one terminal state, delivered at least once), through
//! the separate binaries
//! (`agora-master`, three `agora-agent`, `agora-execute`) and through
//! `agora-local`. (Before, 3,000 such tasks through `agora-local` did not
//! finish within ten minutes.) Throughput is `bench-launch`'s business.

mod support;

use std::collections::BTreeMap;
use std::process::Command;
use std::time::{Duration, Instant};

use support::ledger::Ledger;
use support::*;

const TASKS: usize = 10_000;

/// The two tests run one at a time: each alone is the load it is about.
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());
/// 67 cpus per agent, 0.1 per task: 670 slots each, 2,010 in all.
const AGENT: &str = "cpus:67;mem:100000;disk:1000";

#[test]
fn ten_thousand_tasks_on_two_thousand_slots_through_the_binaries() {
    let _alone = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let cluster = TestCluster::start(3, AGENT);
    let ledger = cluster.dir.path().join("scale.ledger");
    let started = Instant::now();
    let (ok, out, err) = cluster.run_bin(
        "agora-execute",
        &[
            "--master",
            &cluster.master_address(),
            "--name",
            "scale",
            "--command",
            "/bin/true",
            "--resources",
            "cpus:0.1;mem:32",
            "--instances",
            &TASKS.to_string(),
            "--ledger",
            &ledger.display().to_string(),
            "--timeout",
            "300s",
            "--quiet",
        ],
        Duration::from_secs(330),
    );
    let context = || format!("stdout:\n{out}\nstderr:\n{err}\n{}", cluster.logs());
    assert!(ok, "agora-execute failed\n{}", context());
    let check = Ledger::read(&ledger).check("scale", TASKS);
    check.assert_ok(&context());
    assert_eq!(check.tasks, TASKS);
    assert_eq!(
        check.terminal,
        BTreeMap::from([("TASK_FINISHED".to_string(), TASKS)]),
        "{check}"
    );
    eprintln!(
        "{TASKS} tasks through the binaries in {:.1} s: {check}",
        started.elapsed().as_secs_f64()
    );
}

#[test]
fn ten_thousand_tasks_on_two_thousand_slots_through_agora_local() {
    let _alone = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let work = tempfile::tempdir().expect("temp dir");
    let started = Instant::now();
    let output = Command::new(bin("agora-local"))
        .args([
            "--agents",
            "3",
            "--agent-resources",
            AGENT,
            "--work-dir",
            &work.path().display().to_string(),
            "--command",
            "/bin/true",
            "--instances",
            &TASKS.to_string(),
            "--timeout",
            "300s",
        ])
        .env("RUST_LOG", "warn")
        .output()
        .expect("running agora-local");
    let out = String::from_utf8_lossy(&output.stdout);
    let err = String::from_utf8_lossy(&output.stderr);
    let tail = |s: &str| s.lines().rev().take(30).collect::<Vec<_>>().join("\n");
    assert!(
        output.status.success(),
        "agora-local failed: {}\nstdout (end):\n{}\nstderr (end):\n{}",
        output.status,
        tail(&out),
        tail(&err)
    );
    // Each printed update is `TASK_ID STATE (message)`.
    let mut terminal: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for line in out.lines() {
        let mut words = line.split_whitespace();
        if let (Some(task), Some(state)) = (words.next(), words.next()) {
            if task.starts_with("agora-local-") && ledger::is_terminal(state) {
                terminal.entry(task).or_default().push(state);
            }
        }
    }
    assert_eq!(terminal.len(), TASKS, "tasks with a terminal update");
    // One terminal state per task, TASK_FINISHED. (Delivery is at least
    // once: on a loaded machine an update whose acknowledgement took longer
    // than the retry interval arrives again; such repeats are counted.)
    let wrong: Vec<_> = terminal
        .iter()
        .filter(|(_, states)| states.iter().any(|s| *s != "TASK_FINISHED"))
        .take(10)
        .collect();
    assert!(wrong.is_empty(), "not TASK_FINISHED: {wrong:?}");
    let repeats: usize = terminal.values().map(|s| s.len() - 1).sum();
    assert!(
        out.contains(&format!("finished {TASKS}/{TASKS}")),
        "{}",
        tail(&out)
    );
    eprintln!(
        "{TASKS} tasks through agora-local in {:.1} s ({repeats} terminal updates delivered again)",
        started.elapsed().as_secs_f64()
    );
}
