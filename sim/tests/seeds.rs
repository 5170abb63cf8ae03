//! The simulation as a test: many generated fault schedules with every
//! invariant checked at every step, and replay step for step.
//!
//! Built with optimisations (`cargo test --release -p agora-sim`, as the
//! README's test command runs it) it runs `SEEDS` seeds. A debug build runs
//! a few only, and says so: unoptimised, a seed takes about 15 times as
//! long.

use agora_sim::{run_seed, run_seeds, Options};

/// Seeds of the full run.
const SEEDS: u64 = 1_000;

/// Seeds of a debug build's run.
const DEBUG_SEEDS: u64 = 40;

fn threads() -> usize {
    std::thread::available_parallelism().map_or(2, |n| n.get())
}

#[test]
fn generated_schedules_break_no_invariant() {
    let count = if cfg!(debug_assertions) {
        eprintln!(
            "debug build: {DEBUG_SEEDS} seeds only; `cargo test --release -p agora-sim` runs {SEEDS}"
        );
        DEBUG_SEEDS
    } else {
        SEEDS
    };
    let started = std::time::Instant::now();
    match run_seeds(0, count, threads(), &Options::default(), |_| {}) {
        Ok(totals) => {
            assert_eq!(totals.seeds, count);
            eprintln!(
                "{count} seeds, 0 violations ({} steps, {} tasks) in {:.1} s",
                totals.steps,
                totals.tasks,
                started.elapsed().as_secs_f64()
            );
        }
        Err(violation) => panic!("{violation}"),
    }
}

#[test]
fn a_seed_replays_step_for_step() {
    let opts = Options::default();
    for seed in [3, 589, 4_242] {
        let first = run_seed(seed, &opts).map_err(|v| v.to_string());
        let again = run_seed(seed, &opts).map_err(|v| v.to_string());
        match (first, again) {
            (Ok(a), Ok(b)) => {
                assert!(a.steps > 100, "seed {seed} did little: {a:?}");
                assert_eq!(a.steps, b.steps, "seed {seed}");
                assert_eq!(a.tasks, b.tasks, "seed {seed}");
                assert_eq!(a.fingerprint, b.fingerprint, "seed {seed}: traces differ");
            }
            // A violation replays too: the same one at the same step.
            (Err(a), Err(b)) => assert_eq!(a, b, "seed {seed}"),
            (a, b) => panic!("seed {seed} ran differently: {a:?} then {b:?}"),
        }
    }
}

#[test]
fn seeds_differ() {
    let opts = Options::default();
    let prints: Vec<u64> = (10..14)
        .filter_map(|seed| run_seed(seed, &opts).ok())
        .map(|r| r.fingerprint)
        .collect();
    let mut distinct = prints.clone();
    distinct.sort_unstable();
    distinct.dedup();
    assert_eq!(distinct.len(), prints.len(), "{prints:?}");
}
