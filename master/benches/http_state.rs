//! `/state` and `/metrics` at scale: 10 000 agents and 100 000 running
//! tasks (10 frameworks), built through the master's sans-IO API, then the
//! snapshot, its JSON encoding, the metrics rendering and real HTTP GETs on
//! loopback are timed (medians). Targets: `/state` under 200 ms, `/metrics`
//! under 50 ms.
//!
//! ```text
//! cargo bench -p agora-master --bench http_state               # 10k / 100k
//! cargo bench -p agora-master --bench http_state -- --quick    # 1k / 10k
//! cargo bench -p agora-master --bench http_state -- --agents 1000 --tasks 0
//! ```

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let flag = |name: &str| {
        args.iter()
            .position(|a| a == name)
            .and_then(|i| args.get(i + 1))
            .and_then(|v| v.parse::<usize>().ok())
    };
    let quick = args.iter().any(|a| a == "--quick");
    let (agents, tasks, repeats) = if quick {
        (1_000, 10_000, 3)
    } else {
        (10_000, 100_000, 5)
    };
    let agents = flag("--agents").unwrap_or(agents);
    let tasks = flag("--tasks").unwrap_or(tasks);
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    let started = std::time::Instant::now();
    let r = runtime.block_on(agora_master::bench::run(agents, tasks, 10, repeats));
    println!(
        "state: {} agents, {} running tasks (built in {:.1} s)",
        r.agents,
        r.tasks,
        started.elapsed().as_secs_f64()
    );
    println!("{:<44} {:>10}", "step", "median ms");
    for (name, v) in [
        ("snapshot build (state task)", r.snapshot_ms),
        ("JSON encode of the snapshot", r.encode_ms),
        (
            "GET /state, first after a new snapshot",
            r.get_state_cold_ms,
        ),
        ("GET /state, again (cached body)", r.get_state_warm_ms),
        ("render /metrics", r.render_metrics_ms),
        ("GET /metrics", r.get_metrics_ms),
        ("GET /api/v1/tasks page (state filter)", r.get_tasks_page_ms),
    ] {
        println!("{name:<44} {v:>10.2}");
    }
    println!("/state body: {:.1} MB", r.state_bytes as f64 / 1e6);
    let ok_state = r.get_state_cold_ms < 200.0;
    let ok_metrics = r.get_metrics_ms < 50.0;
    println!(
        "targets: /state < 200 ms {}; /metrics < 50 ms {}",
        if ok_state { "met" } else { "MISSED" },
        if ok_metrics { "met" } else { "MISSED" }
    );
}
