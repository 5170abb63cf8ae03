//! Allocator benchmark, built the way Mesos's `DeclineOffers` benchmark is
//! (`src/tests/hierarchical_allocator_tests.cpp`): every agent is
//! `cpus:24;mem:4096;disk:4096;ports:[31000-32000]`, with
//! `cpus:16;mem:1024;disk:1024` and 16 fragmented ports already allocated,
//! round-robin across the frameworks; every framework declines every offer
//! with an unbounded `refuse_seconds`; each round advances the clock by the
//! allocation interval (1 s) and times one `allocate`.
//!
//! A second scenario, `churn`, has every framework launch one
//! `cpus:1;mem:128` task per offer, decline the rest for 5 s, and its tasks
//! finish three rounds later, so filters expire and shares move.
//!
//! Each grid cell runs in its own child process (this binary with
//! `--cell`), so memory per agent is the cell's own RSS growth and no cell
//! inherits another's heap.
//!
//! ```text
//! cargo bench -p agora-master --bench allocator            # full grid
//! cargo bench -p agora-master --bench allocator -- --quick # smoke run
//! # one cell, or a sub-grid, of one scenario:
//! cargo bench -p agora-master --bench allocator -- --agents 10000 --frameworks 100 --scenario decline
//! cargo bench -p agora-master --bench allocator -- --agents 10000,50000 --frameworks 100,1000
//! # steady state: more rounds than frameworks, so every agent ends up filtered by all
//! cargo bench -p agora-master --bench allocator -- --agents 10000 --frameworks 100 --scenario decline --rounds 120
//! # old against new, side by side in one run: keep a copy of the bench binary
//! # built before a change (target/release/deps/allocator-*), then
//! cargo bench -p agora-master --bench allocator -- --quick --against /tmp/allocator-before
//! ```
//!
//! With `--against PATH`, every cell is run by both binaries, one after
//! the other, and a third row gives this build's median over the other's.

use std::process::Command;
use std::time::{Duration, Instant as StdInstant};

use agora_master::allocator::{Allocator, AllocatorOptions, DrfAllocator};
use agora_proto::{AgentId, FrameworkId, Resources};
use tokio::time::Instant;

/// Rounds per cell unless `--rounds` says otherwise.
const ROUNDS: usize = 10;
/// A cell whose rounds take longer than this in total stops early.
const CELL_BUDGET: Duration = Duration::from_secs(60);
const AGENT: &str = "cpus:24;mem:4096;disk:4096;ports:[31000-32000]";
const TASK: &str = "cpus:1;mem:128";
/// Mesos 1.7.1 per-round times quoted in the issue (agents, frameworks, s).
const MESOS: &[(usize, usize, f64)] = &[(10_000, 1_000, 1.06), (10_000, 3_000, 2.5)];
/// Targets (agents, frameworks, ms per round).
const TARGETS: &[(usize, usize, f64)] = &[(10_000, 1_000, 50.0), (10_000, 100, 10.0)];

#[derive(Debug, Clone, Copy, PartialEq)]
enum Scenario {
    Decline,
    Churn,
}

struct CellResult {
    rounds: Vec<Duration>,
    offers: usize,
    events: Duration,
    mem_per_agent: f64,
    setup: Duration,
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if let Some(i) = args.iter().position(|a| a == "--cell") {
        let scenario = match args[i + 1].as_str() {
            "decline" => Scenario::Decline,
            _ => Scenario::Churn,
        };
        let agents: usize = args[i + 2].parse().expect("agents");
        let frameworks: usize = args[i + 3].parse().expect("frameworks");
        let rounds: usize = args
            .get(i + 4)
            .map_or(ROUNDS, |n| n.parse().expect("rounds"));
        let r = run_cell(scenario, agents, frameworks, rounds);
        let ms: Vec<String> = r
            .rounds
            .iter()
            .map(|d| format!("{:.4}", d.as_secs_f64() * 1e3))
            .collect();
        println!(
            "CELL {} {} {:.1} {:.1} {:.1} {}",
            r.offers,
            r.events.as_secs_f64() * 1e3,
            r.mem_per_agent,
            r.setup.as_secs_f64() * 1e3,
            r.rounds.len(),
            ms.join(",")
        );
        return;
    }
    let quick = args.iter().any(|a| a == "--quick");
    let (agent_grid, framework_grid): (&[usize], &[usize]) = if quick {
        (&[1_000, 10_000], &[1, 100])
    } else {
        (&[1_000, 10_000, 50_000], &[1, 100, 1_000, 3_000])
    };
    let agent_grid = list_flag(&args, "--agents").unwrap_or_else(|| agent_grid.to_vec());
    let framework_grid =
        list_flag(&args, "--frameworks").unwrap_or_else(|| framework_grid.to_vec());
    let scenarios: Vec<Scenario> = match flag(&args, "--scenario") {
        Some("decline") => vec![Scenario::Decline],
        Some("churn") => vec![Scenario::Churn],
        _ => vec![Scenario::Decline, Scenario::Churn],
    };
    // More rounds than frameworks show the steady state of DeclineOffers:
    // every framework has declined every agent for good.
    let rounds: usize = flag(&args, "--rounds").map_or(ROUNDS, |n| n.parse().expect("rounds"));
    let exe = std::env::current_exe().expect("own path");
    let against = flag(&args, "--against").map(std::path::PathBuf::from);
    for scenario in scenarios {
        println!();
        println!(
            "== {} ({} rounds, 1 s clock step, times one allocate() per round, one core) ==",
            match scenario {
                Scenario::Decline => "DeclineOffers: every offer declined, refuse_seconds unbounded",
                Scenario::Churn => "Churn: one cpus:1;mem:128 task per offer, rest declined 5 s, tasks end after 3 rounds",
            },
            rounds
        );
        println!(
            "{:>7} {:>6} | {:>9} {:>9} {:>9} {:>9} | {:>8} {:>11} | {:>9} | {:>8} | {:>7} | vs Mesos / target",
            "agents",
            "fwks",
            "min ms",
            "median ms",
            "max ms",
            "last ms",
            "offers/r",
            "offers/s",
            "ns/(a+o)",
            "KiB/agent",
            "evt ms",
        );
        for &agents in &agent_grid {
            for &frameworks in &framework_grid {
                let label = if against.is_some() { "after  " } else { "" };
                let this = run_and_print(&exe, label, scenario, agents, frameworks, rounds);
                if let Some(other) = &against {
                    let base =
                        run_and_print(other, "before ", scenario, agents, frameworks, rounds);
                    if let (Some(this), Some(base)) = (this, base) {
                        println!(
                            "{agents:>7} {frameworks:>6} | median this/before = {:.3}",
                            this / base
                        );
                    }
                }
            }
        }
    }
}

/// Runs one cell in a child process (`exe --cell ...`) and prints its
/// row, labelled with `label`; returns its median ms per round.
fn run_and_print(
    exe: &std::path::Path,
    label: &str,
    scenario: Scenario,
    agents: usize,
    frameworks: usize,
    rounds: usize,
) -> Option<f64> {
    let out = Command::new(exe)
        .args([
            "--cell",
            if scenario == Scenario::Decline {
                "decline"
            } else {
                "churn"
            },
            &agents.to_string(),
            &frameworks.to_string(),
            &rounds.to_string(),
        ])
        .output()
        .expect("run cell");
    let text = String::from_utf8_lossy(&out.stdout);
    let Some(line) = text.lines().find(|l| l.starts_with("CELL ")) else {
        println!(
            "{label}{agents:>7} {frameworks:>6} | cell failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        return None;
    };
    print!("{label}");
    print_row(scenario, agents, frameworks, rounds, line)
}

/// The value after `name`, if given.
fn flag<'a>(args: &'a [String], name: &str) -> Option<&'a str> {
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .map(String::as_str)
}

/// A comma-separated list of counts after `name` (`--agents 1000,10000`).
fn list_flag(args: &[String], name: &str) -> Option<Vec<usize>> {
    flag(args, name).map(|v| {
        v.split(',')
            .map(|n| n.trim().parse().expect("a count"))
            .collect()
    })
}

fn print_row(
    scenario: Scenario,
    agents: usize,
    frameworks: usize,
    wanted: usize,
    line: &str,
) -> Option<f64> {
    let f: Vec<&str> = line.split_whitespace().collect();
    let offers: usize = f[1].parse().unwrap_or(0);
    let events_ms: f64 = f[2].parse().unwrap_or(0.0);
    let mem: f64 = f[3].parse().unwrap_or(0.0);
    let rounds: usize = f[5].parse().unwrap_or(0);
    let mut ms: Vec<f64> = f
        .get(6)
        .map(|s| s.split(',').filter_map(|x| x.parse().ok()).collect())
        .unwrap_or_default();
    let Some(&last) = ms.last() else {
        println!("{agents:>7} {frameworks:>6} | no rounds");
        return None;
    };
    ms.sort_by(|a, b| a.total_cmp(b));
    let (min, max) = (ms[0], ms[ms.len() - 1]);
    let median = ms[ms.len() / 2];
    let total_ms: f64 = ms.iter().sum();
    let per_round = offers as f64 / rounds as f64;
    let offers_s = offers as f64 / (total_ms / 1e3);
    let ns_per = median * 1e6 / (agents as f64 + per_round);
    let mut note = String::new();
    if scenario == Scenario::Decline {
        for &(a, fw, secs) in MESOS {
            if (a, fw) == (agents, frameworks) {
                note += &format!(
                    "Mesos 1.7.1 {:.2} s → {:.0}× faster; ",
                    secs,
                    secs * 1e3 / median
                );
            }
        }
        for &(a, fw, target) in TARGETS {
            if (a, fw) == (agents, frameworks) {
                let verdict = if median <= target { "met" } else { "MISSED" };
                note += &format!(
                    "target ≤ {target} ms {verdict} ({:.1}× headroom)",
                    target / median
                );
            }
        }
    }
    if rounds < wanted {
        note += &format!(
            " only {rounds} rounds (cell budget {}s)",
            CELL_BUDGET.as_secs()
        );
    }
    println!(
        "{agents:>7} {frameworks:>6} | {min:>9.3} {median:>9.3} {max:>9.3} {last:>9.3} | {per_round:>8.0} {offers_s:>11.0} | {ns_per:>9.1} | {mem:>8.2} | {:>7.1} | {note}",
        events_ms / rounds as f64
    );
    Some(median)
}

fn rss_bytes() -> f64 {
    std::fs::read_to_string("/proc/self/statm")
        .ok()
        .and_then(|s| {
            s.split_whitespace()
                .nth(1)
                .and_then(|p| p.parse::<f64>().ok())
        })
        .map_or(0.0, |pages| pages * 4096.0)
}

fn run_cell(
    scenario: Scenario,
    agents: usize,
    frameworks: usize,
    rounds_wanted: usize,
) -> CellResult {
    let agent_total = Resources::parse(AGENT).expect("agent resources");
    let ports: Vec<String> = (0..16)
        .map(|i| format!("{}-{}", 31000 + 2 * i, 31000 + 2 * i))
        .collect();
    let used = Resources::parse(&format!(
        "cpus:16;mem:1024;disk:1024;ports:[{}]",
        ports.join(",")
    ))
    .expect("used resources");
    let task = Resources::parse(TASK).expect("task resources");
    let setup_start = StdInstant::now();
    let rss0 = rss_bytes();
    let mut alloc = DrfAllocator::new(AllocatorOptions::default());
    let fids: Vec<FrameworkId> = (0..frameworks)
        .map(|i| FrameworkId::new(format!("framework-{i}")))
        .collect();
    for f in &fids {
        alloc.add_framework(f, &[], true);
    }
    let aids: Vec<AgentId> = (0..agents)
        .map(|i| AgentId::new(format!("agent-{i}")))
        .collect();
    for (i, a) in aids.iter().enumerate() {
        alloc.add_agent(
            a,
            &agent_total,
            &[(fids[i % frameworks].clone(), used.clone())],
            true,
        );
    }
    let mem_per_agent = (rss_bytes() - rss0).max(0.0) / agents as f64 / 1024.0;
    let setup = setup_start.elapsed();

    let mut now = Instant::now();
    let unbounded = Duration::from_secs(10 * 365 * 24 * 3600);
    let refuse = match scenario {
        Scenario::Decline => unbounded,
        Scenario::Churn => Duration::from_secs(5),
    };
    // (round it ends, framework, agent, resources)
    let mut tasks: Vec<(usize, usize, usize, Resources)> = Vec::new();
    let mut rounds = Vec::new();
    let mut offers = 0;
    let mut events = Duration::ZERO;
    let started = StdInstant::now();
    for round in 0..rounds_wanted {
        now += Duration::from_secs(1);
        let t = StdInstant::now();
        let allocations = alloc.allocate(now);
        rounds.push(t.elapsed());
        offers += allocations.len();
        let t = StdInstant::now();
        if scenario == Scenario::Churn {
            let (done, live): (Vec<_>, Vec<_>) = tasks.drain(..).partition(|t| t.0 <= round);
            tasks = live;
            for (_, f, a, res) in done {
                alloc.recover(&fids[f], &aids[a], &res, None, now);
            }
        }
        for a in allocations {
            let mut rest = a.resources.clone();
            if scenario == Scenario::Churn {
                if let Ok(left) = a.resources.checked_sub(&task) {
                    rest = left;
                    let f = index_of(a.framework_id.as_str());
                    let ag = index_of(a.agent_id.as_str());
                    tasks.push((round + 3, f, ag, task.clone()));
                }
            }
            alloc.recover(&a.framework_id, &a.agent_id, &rest, Some(refuse), now);
        }
        events += t.elapsed();
        if started.elapsed() > CELL_BUDGET {
            break;
        }
    }
    CellResult {
        rounds,
        offers,
        events,
        mem_per_agent,
        setup,
    }
}

fn index_of(id: &str) -> usize {
    id.rsplit('-')
        .next()
        .and_then(|n| n.parse().ok())
        .unwrap_or(0)
}
