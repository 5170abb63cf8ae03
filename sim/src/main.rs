//! `agora-sim`: runs simulated schedules of a whole cluster.
//!
//! `--seeds N` runs seeds 0..N (or `--from S`..S+N) and ends with
//! `N seeds, 0 violations`, or stops at the first violation with its seed,
//! the invariant and the last steps (exit status 1). `--seed S` replays
//! one schedule step for step.

use std::io::Write;
use std::process::ExitCode;
use std::time::Instant;

use clap::Parser;

#[derive(Parser, Debug)]
#[command(
    name = "agora-sim",
    about = "Deterministic simulation of an Agora cluster"
)]
struct Flags {
    /// Run this many seeds.
    #[arg(long, default_value_t = 100)]
    seeds: u64,
    /// The first seed of `--seeds`.
    #[arg(long, default_value_t = 0)]
    from: u64,
    /// Replay one seed.
    #[arg(long)]
    seed: Option<u64>,
    /// Print every step of `--seed`.
    #[arg(long)]
    verbose: bool,
    /// Threads (default: the machine's cores).
    #[arg(long)]
    threads: Option<usize>,
    /// Steps shown before a violation.
    #[arg(long, default_value_t = 200)]
    trace: usize,
    /// Longest faulty phase, virtual seconds.
    #[arg(long, default_value_t = 120)]
    fault_secs: u64,
    /// Liveness bound after the faults stop, virtual seconds.
    #[arg(long, default_value_t = 300)]
    liveness_secs: u64,
    /// Share of seeds whose custom executors send large updates
    /// (hundreds of KiB each, enough to fill a frame after an outage).
    #[arg(long, default_value_t = agora_sim::Options::default().big_update_rate)]
    big_update_rate: f64,
}

fn main() -> ExitCode {
    let flags = Flags::parse();
    let opts = agora_sim::Options {
        trace: flags.trace,
        verbose: flags.verbose,
        fault_secs: flags.fault_secs,
        liveness_secs: flags.liveness_secs,
        big_update_rate: flags.big_update_rate.clamp(0.0, 1.0),
        ..agora_sim::Options::default()
    };
    let started = Instant::now();
    if let Some(seed) = flags.seed {
        return match agora_sim::run_seed(seed, &opts) {
            Ok(r) => {
                println!(
                    "seed {seed}: {} steps, {} tasks, {:.0} s virtual in {:.2} s; 0 violations",
                    r.steps,
                    r.tasks,
                    r.virtual_secs,
                    started.elapsed().as_secs_f64()
                );
                ExitCode::SUCCESS
            }
            Err(v) => {
                eprintln!("{v}");
                ExitCode::FAILURE
            }
        };
    }
    let threads = flags
        .threads
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
    let total = flags.seeds;
    let every = (total / 20).max(1);
    let result = agora_sim::run_seeds(flags.from, total, threads, &opts, |done| {
        if done % every == 0 {
            eprint!("\r{done}/{total} seeds");
            let _ = std::io::stderr().flush();
        }
    });
    eprintln!();
    match result {
        Ok(t) => {
            println!(
                "{} steps, {} tasks in {:.1} s",
                t.steps,
                t.tasks,
                started.elapsed().as_secs_f64()
            );
            println!("{} seeds, 0 violations", t.seeds);
            ExitCode::SUCCESS
        }
        Err(v) => {
            eprintln!("{v}");
            println!("violation at seed {}", v.seed);
            ExitCode::FAILURE
        }
    }
}
