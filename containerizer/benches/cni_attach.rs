//! How long attaching a container to a CNI bridge network and detaching
//! it take: a new namespace with `lo` up (`loopback`), `bridge` with
//! `host-local` addresses, `portmap` with one port mapping; then `DEL`
//! through both and the namespace removed. Sequential attach/detach
//! pairs, then a batch of attaches at once (as an agent launching many
//! tasks), printing the mean, median, 95th percentile and maximum.
//!
//! `cargo bench -p agora-containerizer --bench cni_attach`; runs as root
//! with Debian's plugins and iptables, and says why it skips otherwise.
//! `BENCH_RUNS` sets the number of pairs (50), `BENCH_BATCH` the batch
//! (16).

#[path = "../tests/support/cni.rs"]
mod cni;

use std::sync::Arc;
use std::time::{Duration, Instant};

fn main() {
    if let Some(why) = cni::cannot_run_cni() {
        println!("cni_attach: skipped ({why})");
        return;
    }
    let env = |name: &str, default: usize| {
        std::env::var(name)
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(default)
    };
    let runs = env("BENCH_RUNS", 50);
    let batch = env("BENCH_BATCH", 16);
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let fx = cni::Fixture::new();
        fx.write_bridge_network();
        let networks = Arc::new(fx.networks().await);
        let (mut attach, mut detach) = (Vec::new(), Vec::new());
        for i in 0..runs {
            let id = format!("bench-{i}");
            let t = Instant::now();
            networks
                .attach(fx.request(&id, vec![cni::tcp(cni::free_port(), 80)]))
                .await
                .expect("attach");
            attach.push(t.elapsed());
            let t = Instant::now();
            networks.detach(&id).await.expect("detach");
            detach.push(t.elapsed());
        }
        println!("CNI bridge + portmap (with lo), {runs} containers one after another:");
        report("attach", &mut attach);
        report("detach", &mut detach);

        let t = Instant::now();
        let mut tasks = tokio::task::JoinSet::new();
        for i in 0..batch {
            let networks = networks.clone();
            let request = fx.request(&format!("batch-{i}"), vec![cni::tcp(cni::free_port(), 80)]);
            tasks.spawn(async move { networks.attach(request).await.map(|_| ()) });
        }
        while let Some(done) = tasks.join_next().await {
            done.unwrap().expect("attach");
        }
        let attached = t.elapsed();
        let t = Instant::now();
        for i in 0..batch {
            let networks = networks.clone();
            tasks.spawn(async move { networks.detach(&format!("batch-{i}")).await });
        }
        while let Some(done) = tasks.join_next().await {
            done.unwrap().expect("detach");
        }
        let detached = t.elapsed();
        println!(
            "{batch} at once: all attached in {:.0} ms ({:.1}/s), all detached in {:.0} ms ({:.1}/s)",
            ms(attached),
            batch as f64 / attached.as_secs_f64(),
            ms(detached),
            batch as f64 / detached.as_secs_f64(),
        );
    });
}

fn report(what: &str, times: &mut [Duration]) {
    times.sort();
    let mean = times.iter().sum::<Duration>() / times.len().max(1) as u32;
    let at = |q: f64| times[((times.len() as f64 * q) as usize).min(times.len() - 1)];
    println!(
        "  {what}: mean {:.1} ms, p50 {:.1} ms, p95 {:.1} ms, max {:.1} ms",
        ms(mean),
        ms(at(0.5)),
        ms(at(0.95)),
        ms(times[times.len() - 1]),
    );
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}
