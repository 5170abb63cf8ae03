//! `agora-minijob` end to end (issue 12), on real master and agent
//! processes with distinct host names and racks: every subtask runs near
//! its inputs; workers lost with their agent are replaced; and (feature
//! `etcd`, with Debian's `etcd-server`) two runtimes contend on etcd, the
//! leader is killed and the other finishes the job, while a deposed
//! leader's calls and store writes are refused.

mod support;

use std::time::Duration;

use support::{bin, wait_until, Background, TestCluster, FAST_MASTER_FLAGS, NAMED_AGENT};

fn cluster(n: usize) -> TestCluster {
    TestCluster::start_named(n, NAMED_AGENT, FAST_MASTER_FLAGS)
}

fn summary(stdout: &str) -> serde_json::Value {
    let line = stdout
        .lines()
        .rev()
        .find(|l| l.starts_with('{'))
        .unwrap_or_else(|| panic!("no JSON summary in:\n{stdout}"));
    serde_json::from_str(line).expect("summary JSON")
}

/// Twenty subtasks, inputs spread over five hosts: all finish, and
/// (with room everywhere) every one runs on its input's host.
#[test]
fn minijob_runs_every_subtask_on_its_inputs_host() {
    let cluster = cluster(5);
    let master = cluster.master_address();
    let (ok, out, err) = cluster.run_bin(
        "agora-minijob",
        &[
            "--master",
            &master,
            "--subtasks",
            "20",
            "--slots-per-worker",
            "2",
            "--locality-wait",
            "1s",
            "--json",
        ],
        Duration::from_secs(90),
    );
    assert!(ok, "agora-minijob failed\n{out}\n{err}");
    let s = summary(&out);
    assert_eq!(s["subtasks"], 20);
    assert_eq!(s["finished"], 20);
    assert_eq!(s["workers_started"], 10, "{s}");
    assert_eq!(s["locality"]["host"], 20, "{s}");
    assert!(s["time_to_workers_ms"]["p99"].as_f64().unwrap() > 0.0);
}

/// An inputs file, and an agent killed mid-job: its workers are
/// replaced, their subtasks placed again, and the job still ends with
/// every subtask finished.
#[test]
fn minijob_replaces_workers_lost_with_their_agent() {
    let mut cluster = cluster(3);
    let master = cluster.master_address();
    let inputs = cluster.dir.path().join("inputs");
    let lines: String = (0..12)
        .map(|i| format!("{i} h{},h{}\n", i % 3, (i + 1) % 3))
        .collect();
    std::fs::write(&inputs, lines).unwrap();
    let args: Vec<String> = [
        "--master",
        &master,
        "--subtasks",
        "12",
        "--slots-per-worker",
        "2",
        "--subtask-duration",
        "3s",
        "--locality-wait",
        "500ms",
        "--inputs",
        &inputs.display().to_string(),
        "--json",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let mut job = Background::spawn("minijob", &bin("agora-minijob"), &args, cluster.dir.path());
    // Wait until h2's workers run subtasks, then take h2 away.
    wait_until(
        Duration::from_secs(60),
        "subtasks running on h2",
        || job.output(),
        || {
            let state = cluster.state();
            let running = state["frameworks"][0]["tasks"]
                .as_array()
                .map(|t| t.iter().filter(|t| t["state"] == "TASK_RUNNING").count())
                .unwrap_or(0);
            (running >= 6).then_some(())
        },
    );
    std::thread::sleep(Duration::from_millis(500));
    cluster.agents[2].kill();
    let status = job.wait(Duration::from_secs(120));
    let out = std::fs::read_to_string(&job.stdout).unwrap_or_default();
    assert!(status.is_some_and(|s| s.success()), "{}", job.output());
    let s = summary(&out);
    assert_eq!(s["finished"], 12, "{s}");
    assert!(s["workers_lost"].as_u64().unwrap() >= 1, "{s}");
    assert!(
        s["workers_started"].as_u64().unwrap() > 6,
        "lost workers were replaced: {s}"
    );
}

#[cfg(feature = "etcd")]
mod elected {
    use super::*;
    use std::sync::{Arc, Mutex};

    use agora_etcd::testing::TestEtcd as Etcd;
    use agora_proto::Resources;
    use agora_workers::election::{
        current_leader, ElectionOptions, LeaderContender, LeaderElection, LeaderEpoch,
    };
    use agora_workers::store::{EtcdStore, StoreOp, WorkerStore};
    use agora_workers::{
        DriverOptions, FatalError, RequestError, WorkerDriver, WorkerEventHandler, WorkerSpec,
    };

    fn contender(cluster: &TestCluster, etcd: &Etcd, name: &str) -> Background {
        let args: Vec<String> = [
            "--master",
            &cluster.master_address(),
            "--subtasks",
            "16",
            "--slots-per-worker",
            "2",
            "--subtask-duration",
            "1500ms",
            "--locality-wait",
            "500ms",
            "--etcd",
            &etcd.endpoint,
            "--etcd-prefix",
            "/minijob",
            "--etcd-lease-ttl",
            "2s",
            "--timeout",
            "3m",
            "--json",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        Background::spawn(name, &bin("agora-minijob"), &args, cluster.dir.path())
    }

    /// Two runtimes on etcd: the leader is SIGKILLed mid-job; the other
    /// takes over, recovers the launched workers (which re-register with
    /// it through the leader key) and finishes every subtask.
    #[test]
    fn minijob_leader_killed_the_other_contender_finishes_the_job() {
        let cluster = cluster(3);
        let Some(etcd) = Etcd::start(cluster.dir.path()) else {
            return;
        };
        let mut a = contender(&cluster, &etcd, "contender-a");
        std::thread::sleep(Duration::from_millis(500));
        let mut b = contender(&cluster, &etcd, "contender-b");
        let context = |a: &Background, b: &Background| format!("{}\n{}", a.output(), b.output());
        wait_until(
            Duration::from_secs(60),
            "a leader with running workers",
            || context(&a, &b),
            || {
                let leader = current_leader(&etcd.endpoint, "/minijob").ok()??;
                leader.address.as_ref()?;
                let state = cluster.state();
                let running = state["frameworks"][0]["tasks"]
                    .as_array()
                    .map(|t| t.iter().filter(|t| t["state"] == "TASK_RUNNING").count())
                    .unwrap_or(0);
                (running >= 4).then_some(())
            },
        );
        let leads_a = std::fs::read_to_string(&a.stdout)
            .unwrap_or_default()
            .contains("leading");
        let (leader, other) = if leads_a {
            (&mut a, &mut b)
        } else {
            (&mut b, &mut a)
        };
        let framework = cluster.state()["frameworks"][0]["id"].clone();
        leader.kill();
        let status = other.wait(Duration::from_secs(150));
        let out = std::fs::read_to_string(&other.stdout).unwrap_or_default();
        assert!(status.is_some_and(|s| s.success()), "{}", other.output());
        assert!(out.contains("leading the job"), "{out}");
        let s = summary(&out);
        assert_eq!(s["finished"], 16, "{s}");
        assert!(
            s["workers_recovered"].as_u64().unwrap() >= 1,
            "the new leader recovered workers: {s}"
        );
        let frameworks = cluster.state()["frameworks"].clone();
        assert!(
            frameworks
                .as_array()
                .is_none_or(|f| f.iter().all(|f| f["id"] == framework)),
            "one framework, failed over: {frameworks}"
        );
    }

    struct Grants(Mutex<Vec<Option<LeaderEpoch>>>);
    impl LeaderContender for Grants {
        fn grant_leadership(&self, epoch: LeaderEpoch) {
            self.0.lock().unwrap().push(Some(epoch));
        }
        fn revoke_leadership(&self) {
            self.0.lock().unwrap().push(None);
        }
    }

    #[derive(Default)]
    struct Errors(Mutex<Vec<String>>);
    impl WorkerEventHandler for Errors {
        fn on_error(&self, error: &FatalError) {
            self.0.lock().unwrap().push(error.to_string());
        }
    }

    fn granted(g: &Grants) -> Option<LeaderEpoch> {
        g.0.lock().unwrap().last().copied().flatten()
    }

    /// §7 test 12: a deposed leader is fenced. Contender A leads and
    /// runs a driver; A's election ends and B wins a newer epoch; B's
    /// driver (same framework, store fenced on B's epoch) takes the
    /// framework over. A's driver is ended by the master, its pending
    /// request fails, its calls are refused, and its store writes fail.
    #[test]
    fn a_deposed_leaders_calls_and_writes_are_refused() {
        let cluster = cluster(1);
        let Some(etcd) = Etcd::start(cluster.dir.path()) else {
            return;
        };
        let rt = tokio::runtime::Runtime::new().unwrap();
        let mut opts = ElectionOptions::new(etcd.endpoint.clone(), "/fence");
        opts.lease_ttl = Duration::from_secs(2);
        let grants_a = Arc::new(Grants(Mutex::new(Vec::new())));
        let election_a = LeaderElection::start(opts.clone(), grants_a.clone()).unwrap();
        let epoch_a = wait_until(Duration::from_secs(10), "A leads", String::new, || {
            granted(&grants_a)
        });
        assert!(election_a
            .confirm_leadership(epoch_a, "127.0.0.1:1")
            .unwrap());
        let key = election_a.leader_key().to_string();
        let store = |epoch| EtcdStore::new(&etcd.endpoint, "/fence", &key, epoch).unwrap();
        let errors_a = Arc::new(Errors::default());
        let mut options = DriverOptions::new(cluster.master_address(), "fenced");
        options.reconnect_backoff_max = Duration::from_millis(300);
        let driver_a =
            WorkerDriver::initialize(options.clone(), Box::new(store(epoch_a)), errors_a.clone())
                .unwrap();
        wait_until(Duration::from_secs(20), "A registered", String::new, || {
            driver_a.framework_id()
        });
        let nowhere = WorkerSpec::new(
            "w",
            Resources::parse("cpus:0.1;mem:32").unwrap(),
            "sleep 600",
        )
        .constraint(agora_workers::Constraint::equals("hostname", "nowhere"));
        let pending = driver_a.request_worker(nowhere);

        // A loses the election (closing gives the lease back); B wins.
        election_a.close();
        assert_eq!(
            grants_a.0.lock().unwrap().last(),
            Some(&None),
            "A was told to revoke"
        );
        let mut opts_b = opts.clone();
        opts_b.contender = "b".into();
        let grants_b = Arc::new(Grants(Mutex::new(Vec::new())));
        let election_b = LeaderElection::start(opts_b, grants_b.clone()).unwrap();
        let epoch_b = wait_until(Duration::from_secs(10), "B leads", String::new, || {
            granted(&grants_b)
        });
        assert!(epoch_b > epoch_a);
        assert!(
            !election_b.confirm_leadership(epoch_a, "x").unwrap(),
            "a stale epoch confirms nothing"
        );
        // A's store is fenced off; B's is not.
        let mut stale = store(epoch_a);
        assert!(matches!(
            stale.apply(&[StoreOp::SetAttempt { attempt: 99 }]),
            Err(agora_workers::StoreError::Fenced(_))
        ));
        let errors_b = Arc::new(Errors::default());
        let driver_b =
            WorkerDriver::initialize(options, Box::new(store(epoch_b)), errors_b.clone()).unwrap();
        wait_until(Duration::from_secs(20), "B registered", String::new, || {
            driver_b.framework_id()
        });
        assert_eq!(
            driver_b.framework_id(),
            driver_a.framework_id(),
            "B took the stored framework over"
        );
        // The master ended A's subscription: A stops and refuses calls.
        let end = rt
            .block_on(async {
                tokio::time::timeout(Duration::from_secs(20), driver_a.wait()).await
            })
            .expect("A ended");
        assert!(end.contains("master ended"), "{end}");
        assert!(
            errors_a
                .0
                .lock()
                .unwrap()
                .iter()
                .any(|e| e.contains("another connection")),
            "{:?}",
            errors_a.0.lock().unwrap()
        );
        assert!(matches!(rt.block_on(pending), Err(RequestError::Fatal(_))));
        assert!(driver_a
            .release_worker(&agora_workers::WorkerId::new("worker-1-1"))
            .is_err());
        assert!(matches!(
            rt.block_on(driver_a.request_worker(WorkerSpec::new("w", Resources::new(), "true"))),
            Err(RequestError::Stopped)
        ));
        assert!(errors_b.0.lock().unwrap().is_empty());
        rt.block_on(driver_b.terminate());
        drop(election_b);
    }
}
