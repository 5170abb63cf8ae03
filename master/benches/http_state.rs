//! `/state` and `/metrics` at scale: 10 000 agents and 100 000 running
//! tasks (10 frameworks), built through the master's sans-IO API. Timed
//! (medians): what publishing a snapshot costs on the master's state task
//! (the event loop) when everything changed and after a typical interval
//! of 1 000 task updates, what the builder thread does off the loop, the
//! JSON encoding, the metrics rendering and real HTTP GETs on loopback.
//! Targets: `/state` under 200 ms, `/metrics` under 50 ms, and a few
//! milliseconds on the event loop per incremental snapshot.
//!
//! ```text
//! cargo bench -p agora-master --bench http_state               # 10k / 100k
//! cargo bench -p agora-master --bench http_state -- --quick    # 1k / 10k
//! cargo bench -p agora-master --bench http_state -- --agents 1000 --tasks 0 --updates 100
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
    let updates = flag("--updates").unwrap_or(1_000);
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    let started = std::time::Instant::now();
    let http = agora_client::Http::new();
    let get = |addr: std::net::SocketAddr, path: &'static str| {
        let http = http.clone();
        async move {
            let response = http.get(addr, path).await.expect("GET");
            assert_eq!(response.status, 200, "GET {path}");
        }
    };
    let r = runtime.block_on(agora_master::bench::run(
        agents, tasks, 10, updates, repeats, get,
    ));
    println!(
        "state: {} agents, {} running tasks (built in {:.1} s)",
        r.agents,
        r.tasks,
        started.elapsed().as_secs_f64()
    );
    println!("{:<56} {:>10}", "step", "median ms");
    let incremental = format!("  after {} task updates: take the delta", r.updates);
    for (name, v) in [
        ("on the event loop (state task):", None),
        ("  everything changed: views of all", Some(r.loop_full_ms)),
        (incremental.as_str(), Some(r.loop_incremental_ms)),
        (
            "  nothing changed (timer): shares and roles",
            Some(r.loop_idle_ms),
        ),
        ("off the loop (builder thread):", None),
        ("  assemble from the full delta", Some(r.build_full_ms)),
        (
            "  apply the incremental delta and assemble",
            Some(r.build_incremental_ms),
        ),
        ("serving:", None),
        ("  JSON encode of the new snapshot", Some(r.encode_ms)),
        (
            "  GET /state, first after a new snapshot",
            Some(r.get_state_cold_ms),
        ),
        (
            "  GET /state, again (cached body)",
            Some(r.get_state_warm_ms),
        ),
        ("  render /metrics", Some(r.render_metrics_ms)),
        ("  GET /metrics", Some(r.get_metrics_ms)),
        (
            "  GET /api/v1/tasks page (state filter)",
            Some(r.get_tasks_page_ms),
        ),
    ] {
        match v {
            Some(v) => println!("{name:<56} {v:>10.2}"),
            None => println!("{name}"),
        }
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
