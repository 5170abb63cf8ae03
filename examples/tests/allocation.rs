//! Allocation on real processes: three frameworks with different task
//! shapes (cpu-heavy, mem-heavy, balanced) keep launching long-running
//! tasks, one per offer, on a master and an agent; once the cluster is
//! full, each framework's dominant share is within 10 % of the DRF ideal.

mod support;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use agora_proto::{
    CommandInfo, Filters, FrameworkInfo, MasterInfo, Offer, Resources, TaskId, TaskInfo,
};
use agora_scheduler::{DriverConfig, Scheduler, SchedulerDriver};
use support::TestCluster;

// One agent: each allocation cycle then offers the whole free pool to the
// framework with the lowest share, which takes one task and gives the rest
// back: DRF's progressive filling, one task at a time. (With several
// agents, every framework gets one agent per cycle and launches one task
// per cycle, whatever its share, so task counts rather than shares even
// out until the cluster is full.)
const AGENT: &str = "cpus:32;mem:32768";
const AGENTS: usize = 1;

/// Launches one `sleep 600` task of `shape` per offer that fits it;
/// declines offers that do not for a second, so others get them.
struct Greedy {
    name: String,
    shape: Resources,
    live: Arc<Mutex<usize>>,
    next: usize,
}

impl Scheduler for Greedy {
    fn registered(&mut self, _d: &SchedulerDriver, _f: &agora_proto::FrameworkId, _m: &MasterInfo) {
    }

    fn resource_offers(&mut self, driver: &SchedulerDriver, offers: Vec<Offer>) {
        for offer in offers {
            if !offer.resources.contains(&self.shape) {
                let _ = driver.decline_offer(
                    &offer.id,
                    Filters {
                        refuse_seconds: Some(1.0),
                    },
                );
                continue;
            }
            self.next += 1;
            let task = TaskInfo {
                container: None,
                allocation_role: None,
                launch_stamp: None,
                name: format!("{}-{}", self.name, self.next),
                task_id: TaskId::new(format!("{}-{}", self.name, self.next)),
                agent_id: offer.agent_id.clone(),
                resources: self.shape.clone(),
                executor: None,
                command: Some(CommandInfo::shell("sleep 600")),
                data: None,
                kill_grace_period: None,
                labels: Default::default(),
                task_group: None,
            };
            *self.live.lock().unwrap() += 1;
            // The rest goes back at once, to whoever has the lowest share.
            let _ = driver.launch_tasks(
                std::slice::from_ref(&offer.id),
                vec![task],
                Filters {
                    refuse_seconds: Some(0.0),
                },
            );
        }
    }

    fn status_update(&mut self, driver: &SchedulerDriver, status: &agora_proto::TaskStatus) {
        if status.state.is_terminal() {
            let mut live = self.live.lock().unwrap();
            *live = live.saturating_sub(1);
        }
        let _ = driver.acknowledge_status_update(status);
    }
}

#[test]
fn three_frameworks_get_drf_shares() {
    let cluster = TestCluster::start(AGENTS, AGENT);
    let shapes = [
        ("cpu-heavy", "cpus:2;mem:512"),
        ("mem-heavy", "cpus:0.5;mem:2048"),
        ("balanced", "cpus:1;mem:1024"),
    ];
    let mut drivers = Vec::new();
    let mut counters = Vec::new();
    for (name, shape) in shapes {
        let live = Arc::new(Mutex::new(0));
        let sched = Greedy {
            name: name.to_string(),
            shape: Resources::parse(shape).unwrap(),
            live: live.clone(),
            next: 0,
        };
        let driver = SchedulerDriver::new(
            sched,
            FrameworkInfo::new(name),
            DriverConfig::new(cluster.master_address()),
        );
        driver.start().expect("driver start");
        drivers.push(driver);
        counters.push(live);
    }

    // Warm-up: until the number of live tasks has not moved for 3 s.
    let deadline = Instant::now() + Duration::from_secs(40);
    let mut last = (0, Instant::now());
    while Instant::now() < deadline {
        let total: usize = counters.iter().map(|c| *c.lock().unwrap()).sum();
        if total != last.0 {
            last = (total, Instant::now());
        } else if total > 0 && last.1.elapsed() > Duration::from_secs(3) {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }

    // Cluster: 32 cpus, 32768 mem. With n_cpu = n_mem = 16 s and
    // n_bal = 32 s, both cpus (72 s <= 32) and mem (73728 s <= 32768)
    // saturate at s = 4/9; with whole tasks, 7 / 7 / 14 tasks: 7/16 each.
    let (cpus, mem) = (32.0 * AGENTS as f64, 32768.0 * AGENTS as f64);
    let ideal = 7.0 / 16.0;
    let mut report = String::new();
    let mut shares = Vec::new();
    for ((name, shape), live) in shapes.iter().zip(&counters) {
        let n = *live.lock().unwrap() as f64;
        let r = Resources::parse(shape).unwrap();
        let share = (n * r.cpus() / cpus).max(n * r.mem() / mem);
        report += &format!("{name}: {n} tasks, dominant share {share:.3}\n");
        shares.push(share);
    }
    for driver in &drivers {
        let _ = driver.stop(false);
    }
    for s in &shares {
        assert!(
            (s - ideal).abs() <= 0.1 * ideal,
            "share {s:.3} is not within 10 % of the DRF ideal {ideal:.3}\n{report}{}",
            cluster.logs()
        );
    }
    println!("{report}");
}

/// Runs `total` tasks of `sleep 0.5` (`cpus:0.25;mem:32`), as many per
/// offer as fit, and notes when the last of them finished.
struct Batch {
    name: String,
    total: usize,
    launched: usize,
    finished: Arc<Mutex<(usize, Option<Instant>)>>,
}

impl Scheduler for Batch {
    fn resource_offers(&mut self, driver: &SchedulerDriver, offers: Vec<Offer>) {
        let shape = Resources::parse("cpus:0.25;mem:32").unwrap();
        for offer in offers {
            let mut left = offer.resources.clone();
            let mut tasks = Vec::new();
            while self.launched < self.total && left.contains(&shape) {
                left = left.checked_sub(&shape).unwrap();
                self.launched += 1;
                let id = format!("{}-{}", self.name, self.launched);
                tasks.push(support::command_task(
                    &id,
                    &offer,
                    "sleep 0.5",
                    "cpus:0.25;mem:32",
                ));
            }
            // What is left goes back. While it still fits a task, at once,
            // for the next cycle to decide; what fits none (memory without
            // cpus) is refused for 5 s, as a Mesos framework's default
            // filter does, so it is not held in an offer that makes this
            // framework look rich when cpus come back.
            let refuse = if left.contains(&shape) { 0.0 } else { 5.0 };
            let _ = driver.launch_tasks(
                std::slice::from_ref(&offer.id),
                tasks,
                Filters {
                    refuse_seconds: Some(refuse),
                },
            );
        }
    }

    fn status_update(&mut self, driver: &SchedulerDriver, status: &agora_proto::TaskStatus) {
        if status.state.is_terminal() {
            let mut finished = self.finished.lock().unwrap();
            finished.0 += 1;
            if finished.0 == self.total {
                finished.1 = Some(Instant::now());
                let _ = driver.suppress_offers();
            }
        }
        let _ = driver.acknowledge_status_update(status);
    }
}

/// Two frameworks with the same demand share one 1-cpu agent: each runs
/// 24 tasks of `sleep 0.5`, four at a time fit. Whenever a batch ends,
/// both are back at share 0; the tie goes to the one with fewer
/// allocations so far (Mesos's DRF sorter), so they take turns and finish
/// within 1.3× of each other. Without the tie-break one framework won
/// every tie and finished in half the time of the other.
#[test]
fn equal_demand_on_one_agent_finishes_together() {
    let cluster = TestCluster::start(1, "cpus:1;mem:1024");
    let start = Instant::now();
    let mut drivers = Vec::new();
    let mut finished = Vec::new();
    for name in ["first", "second"] {
        let done = Arc::new(Mutex::new((0, None)));
        let sched = Batch {
            name: name.to_string(),
            total: 24,
            launched: 0,
            finished: done.clone(),
        };
        let driver = SchedulerDriver::new(
            sched,
            FrameworkInfo::new(name),
            DriverConfig::new(cluster.master_address()),
        );
        driver.start().expect("driver start");
        drivers.push(driver);
        finished.push(done);
    }
    let (a, b) = support::wait_until(
        Duration::from_secs(60),
        "both frameworks to finish their 24 tasks",
        || {
            let counts: Vec<usize> = finished.iter().map(|f| f.lock().unwrap().0).collect();
            format!("finished: {counts:?}\n{}", cluster.logs())
        },
        || {
            let t: Vec<Option<Instant>> = finished.iter().map(|f| f.lock().unwrap().1).collect();
            match (t[0], t[1]) {
                (Some(a), Some(b)) => Some((a - start, b - start)),
                _ => None,
            }
        },
    );
    for driver in &drivers {
        let _ = driver.stop(false);
    }
    let ratio = a.max(b).as_secs_f64() / a.min(b).as_secs_f64();
    println!("first finished after {a:.1?}, second after {b:.1?}: {ratio:.2}×");
    assert!(
        ratio <= 1.3,
        "first finished after {a:.1?}, second after {b:.1?}: {ratio:.2}× apart, more than 1.3×"
    );
}
