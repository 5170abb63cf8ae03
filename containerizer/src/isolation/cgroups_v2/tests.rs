//! Tests of the cgroup v2 driver: against a fake cgroup2 tree of plain
//! files, and on the host's real unified hierarchy where there is one.

use super::*;
use crate::isolation::cgroups::tests::{fake_cgroup2, is_alive, sh};
use nix::poll::{poll, PollFd, PollFlags, PollTimeout};

fn read(path: &Path) -> String {
    std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .trim()
        .to_string()
}

/// A driver over a fake hierarchy in `tmp` (see [`fake_cgroup2`]).
fn fake(tmp: &Path, config: &CgroupsConfig) -> Cgroups {
    fake_cgroup2(tmp, "cpuset cpu io memory hugetlb pids", &config.root);
    Cgroups::discover_in(config, tmp).unwrap()
}

#[test]
fn discovery_enables_the_controllers_down_to_the_root() {
    let tmp = tempfile::tempdir().unwrap();
    let config = CgroupsConfig::default();
    let cgroups = fake(tmp.path(), &config);
    assert_eq!(cgroups.base, tmp.path().join("agora"));
    for dir in [tmp.path().to_path_buf(), tmp.path().join("agora")] {
        assert_eq!(
            read(&dir.join("cgroup.subtree_control")),
            "+cpu\n+memory\n+pids",
            "{}",
            dir.display()
        );
    }
    // Already enabled: nothing written again (a second agent start).
    Cgroups::discover_in(&config, tmp.path()).unwrap();
    assert_eq!(
        read(&tmp.path().join("cgroup.subtree_control")),
        "+cpu\n+memory\n+pids"
    );
}

#[test]
fn refusals_name_the_controller() {
    let tmp = tempfile::tempdir().unwrap();
    let config = CgroupsConfig::default();
    fake_cgroup2(tmp.path(), "cpu io memory", &config.root);
    let err = Cgroups::discover_in(&config, tmp.path()).unwrap_err();
    assert!(
        matches!(
            err,
            CgroupsError::MissingV2Controller {
                controller: "pids",
                ..
            }
        ),
        "{err}"
    );
    let text = err.to_string();
    assert!(text.contains("needs the pids controller"), "{text}");
    assert!(text.contains("\"cpu io memory\""), "{text}");
    // Offered, but cannot be enabled (here: not a writable file).
    std::fs::write(tmp.path().join("cgroup.controllers"), "cpu memory pids").unwrap();
    let control = tmp.path().join("cgroup.subtree_control");
    std::fs::remove_file(&control).unwrap();
    std::fs::create_dir(&control).unwrap();
    let err = Cgroups::discover_in(&config, tmp.path()).unwrap_err();
    assert!(
        matches!(
            err,
            CgroupsError::CannotEnable {
                controller: "cpu",
                ..
            }
        ),
        "{err}"
    );
    assert!(err.to_string().contains("cannot enable the cpu controller"));
}

#[test]
fn cpu_weight_maps_shares_as_runc_does() {
    assert_eq!(weight_of_shares(2), 1);
    assert_eq!(weight_of_shares(0), 1);
    assert_eq!(weight_of_shares(512), 20);
    assert_eq!(weight_of_shares(1024), 39);
    assert_eq!(weight_of_shares(262_144), 10_000);
    assert_eq!(weight_of_shares(1 << 30), 10_000);
    for cpus in [0.5, 1.0, 4.0, 64.0] {
        let weight = weight_of_shares((1024.0 * cpus) as u64);
        assert!(
            (cpus_of_weight(weight) - cpus).abs() / cpus < 0.03,
            "{cpus}"
        );
    }
}

#[test]
fn the_root_weighs_the_agents_cpus() {
    let tmp = tempfile::tempdir().unwrap();
    let cgroups = fake(tmp.path(), &CgroupsConfig::default());
    let weight = tmp.path().join("agora/cpu.weight");
    assert_eq!(cgroups.weigh_root(2.0).unwrap(), 79);
    assert_eq!(read(&weight), "79");
    // Past the largest shares: the largest weight.
    assert_eq!(cgroups.weigh_root(1000.0).unwrap(), MAX_WEIGHT);
    assert_eq!(read(&weight), MAX_WEIGHT.to_string());
    // No cpus to offer: the smallest.
    assert_eq!(cgroups.weigh_root(0.0).unwrap(), 1);
}

#[test]
fn limits_are_written_and_only_grow() {
    let tmp = tempfile::tempdir().unwrap();
    let cgroups = fake(tmp.path(), &CgroupsConfig::default());
    let limits = Limits {
        cpus: 0.5,
        mem_mib: 64.0,
        pids: Some(64),
    };
    let (container, written) = cgroups.create("run-1", &limits).unwrap();
    assert_eq!(written, limits);
    let dir = tmp.path().join("agora/run-1");
    assert_eq!(container.dir("memory"), Some(dir.as_path()));
    assert_eq!(read(&dir.join("cpu.weight")), "20");
    assert_eq!(read(&dir.join("cpu.max")), "50000 100000");
    assert_eq!(read(&dir.join("memory.max")), (64u64 << 20).to_string());
    assert_eq!(read(&dir.join("pids.max")), "64");
    assert!(!dir.join("memory.swap.max").exists());
    let grown = cgroups
        .set_limits(
            &container,
            Some(written),
            &Limits {
                cpus: 1.0,
                mem_mib: 32.0,
                pids: None,
            },
        )
        .unwrap();
    assert_eq!(
        (grown.cpus, grown.mem_mib, grown.pids),
        (1.0, 64.0, Some(64))
    );
    assert_eq!(read(&dir.join("cpu.weight")), "39");
    assert_eq!(read(&dir.join("cpu.max")), "100000 100000");
    assert_eq!(read(&dir.join("memory.max")), (64u64 << 20).to_string());
    assert_eq!(cgroups.names(), vec!["run-1"]);
    assert!(cgroups.open("run-1").is_some());
    assert!(cgroups.open("run-2").is_none());

    // Without CFS no quota; the default pids limit; swap off where
    // the kernel accounts it; the 32 MiB floor.
    let config = CgroupsConfig {
        enable_cfs: false,
        pids_max: 99,
        ..Default::default()
    };
    let cgroups = Cgroups::discover_in(&config, tmp.path()).unwrap();
    let dir = tmp.path().join("agora/run-2");
    std::fs::create_dir(&dir).unwrap();
    std::fs::write(dir.join("memory.swap.max"), "max").unwrap();
    let small = Limits {
        cpus: 0.1,
        mem_mib: 8.0,
        pids: None,
    };
    cgroups.create("run-2", &small).unwrap();
    assert!(!dir.join("cpu.max").exists());
    assert_eq!(read(&dir.join("cpu.weight")), "4");
    assert_eq!(read(&dir.join("pids.max")), "99");
    assert_eq!(read(&dir.join("memory.max")), (32u64 << 20).to_string());
    assert_eq!(read(&dir.join("memory.swap.max")), "0");
}

#[test]
fn stats_are_read_from_the_v2_files() {
    let tmp = tempfile::tempdir().unwrap();
    let cgroups = fake(tmp.path(), &CgroupsConfig::default());
    let dir = tmp.path().join("agora/run");
    std::fs::create_dir(&dir).unwrap();
    let files = [
        (
            "cpu.stat",
            "usage_usec 3500000\nuser_usec 2500000\nsystem_usec 1000000\nnr_periods 40\nnr_throttled 12\nthrottled_usec 750000\nnr_bursts 0\nburst_usec 0\n",
        ),
        ("cpu.max", "20000 100000\n"),
        ("cpu.weight", "8\n"),
        ("memory.current", "1048576\n"),
        ("memory.peak", "4194304\n"),
        ("memory.max", "100663296\n"),
        (
            "memory.events",
            "low 0\nhigh 0\nmax 17\noom 2\noom_kill 1\noom_group_kill 0\n",
        ),
        ("pids.current", "5\n"),
        ("pids.max", "4096\n"),
        ("pids.events", "max 3\n"),
    ];
    for (file, text) in files {
        std::fs::write(dir.join(file), text).unwrap();
    }
    let container = cgroups.open("run").unwrap();
    assert_eq!(container.oom_kills(), 1);
    assert_eq!(
        container.stats(),
        ContainerStats {
            cpus_user_time_secs: 2.5,
            cpus_system_time_secs: 1.0,
            cpus_limit: 0.2,
            cpus_nr_periods: 40,
            cpus_nr_throttled: 12,
            cpus_throttled_time_secs: 0.75,
            mem_total_bytes: 1 << 20,
            mem_max_bytes: 4 << 20,
            mem_limit_bytes: 96 << 20,
            mem_oom_kills: 1,
            processes: 5,
            processes_limit: 4096,
            processes_limit_hits: 3,
        }
    );
    // No quota: the weight's CPUs (weight 8 stands for 0.18 to 0.2
    // CPUs: a weight step is 0.026 CPUs). No memory.peak (before
    // Linux 5.19): the most memory.current seen.
    std::fs::write(dir.join("cpu.max"), "max 100000\n").unwrap();
    std::fs::remove_file(dir.join("memory.peak")).unwrap();
    std::fs::write(dir.join("memory.max"), "max\n").unwrap();
    let stats = container.stats();
    assert!((stats.cpus_limit - 0.2).abs() < 0.03, "{stats:?}");
    assert_eq!(stats.mem_max_bytes, 1 << 20);
    assert_eq!(stats.mem_limit_bytes, u64::MAX);
    std::fs::write(dir.join("memory.current"), "65536\n").unwrap();
    assert_eq!(container.memory_limit_and_peak(), (u64::MAX, 1 << 20));
}

fn readable(fd: BorrowedFd<'_>, timeout: PollTimeout) -> bool {
    let mut fds = [PollFd::new(fd, PollFlags::POLLIN)];
    poll(&mut fds, timeout).unwrap() == 1
}

#[test]
fn the_oom_fd_becomes_readable_when_memory_events_changes() {
    let tmp = tempfile::tempdir().unwrap();
    let cgroups = fake(tmp.path(), &CgroupsConfig::default());
    let dir = tmp.path().join("agora/run");
    std::fs::create_dir(&dir).unwrap();
    let events = dir.join("memory.events");
    std::fs::write(&events, "low 0\nhigh 0\nmax 0\noom 0\noom_kill 0\n").unwrap();
    let container = cgroups.open("run").unwrap();
    let fd = container.oom_inotify().unwrap();
    assert!(!readable(fd.as_fd(), PollTimeout::ZERO));
    // Reclaim at the limit: readable, but no out-of-memory kill.
    std::fs::write(&events, "low 0\nhigh 0\nmax 4\noom 0\noom_kill 0\n").unwrap();
    assert!(readable(fd.as_fd(), PollTimeout::from(5000u16)));
    assert_eq!(container.oom_event(fd.as_fd()), OomEvent::Nothing);
    assert!(!readable(fd.as_fd(), PollTimeout::ZERO), "drained");
    // The kernel killed a process for lack of memory.
    std::fs::write(&events, "low 0\nhigh 0\nmax 9\noom 1\noom_kill 1\n").unwrap();
    assert!(readable(fd.as_fd(), PollTimeout::from(5000u16)));
    assert_eq!(container.oom_event(fd.as_fd()), OomEvent::OutOfMemory);
    // The container is removed.
    std::fs::remove_dir_all(&dir).unwrap();
    assert!(readable(fd.as_fd(), PollTimeout::from(5000u16)));
    assert_eq!(container.oom_event(fd.as_fd()), OomEvent::Removed);
}

/// A directory of this test's own in the host's real cgroup2
/// hierarchy, removed on drop; `None` (with the reason printed) where
/// there is none or it cannot be written. It has no controllers
/// enabled: processes can be placed, frozen and killed there on any
/// host with a unified hierarchy, hybrid ones included.
struct RealV2(Cgroups);

impl RealV2 {
    fn new(test: &str) -> Option<RealV2> {
        let skip = |why: String| {
            eprintln!("skipping {test}: {why}");
            None
        };
        if !nix::unistd::Uid::effective().is_root() {
            return skip("not running as root".into());
        }
        let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
        let own = std::fs::read_to_string("/proc/self/cgroup").unwrap_or_default();
        let mounts = mountinfo::cgroup_mounts(&mountinfo);
        let Some(mount) = hierarchy(&mounts, &mountinfo::process_cgroups(&own)) else {
            return skip("no cgroup2 hierarchy is mounted".into());
        };
        let base = mount.join(format!("agora-test-{}-{test}", std::process::id()));
        if let Err(e) = std::fs::create_dir(&base) {
            return skip(format!("cannot create {}: {e}", base.display()));
        }
        Some(RealV2(Cgroups {
            base,
            config: CgroupsConfig::default(),
        }))
    }

    /// A container without limits (there are no controllers here).
    fn container(&self, name: &str) -> Container {
        std::fs::create_dir(self.0.base.join(name)).unwrap();
        self.0.open(name).unwrap()
    }
}

impl Drop for RealV2 {
    fn drop(&mut self) {
        if let Err(e) = self.0.destroy_all() {
            eprintln!("cleaning up test cgroups: {e}");
        }
    }
}

/// Spawns `setsid sleep 1000 & sleep 1000` into `container`, checks
/// where it was born, kills the container with `kill` and checks that
/// every process died and the cgroup is gone.
fn born_inside_and_killed_whole(
    cgroups: &Cgroups,
    container: &Container,
    kill: impl Fn(&Container) -> usize,
) {
    let sandbox = tempfile::tempdir().unwrap();
    let script = sh("setsid sleep 1000 & sleep 1000", sandbox.path());
    let mut process = cgroups
        .spawn_inside(container, |birth| script.start(birth))
        .unwrap();
    let suffix = format!("/{}\n", container.name());
    let own = std::fs::read_to_string(format!("/proc/{}/cgroup", process.pid())).unwrap();
    assert!(
        own.lines()
            .any(|l| l.starts_with("0::") && (l.to_string() + "\n").ends_with(&suffix)),
        "{own}"
    );
    // The agent did not move.
    let thread = std::fs::read_to_string("/proc/thread-self/cgroup").unwrap();
    assert!(!thread.contains(container.name()), "{thread}");
    let deadline = Instant::now() + Duration::from_secs(5);
    while container.pids().len() < 3 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
    let pids = container.pids();
    assert_eq!(pids.len(), 3, "sh and two sleeps: {pids:?}");
    assert!(kill(container) >= 3);
    while process.reap().is_none() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(5));
    }
    while !container.remove().unwrap() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(5));
    }
    assert!(!container.dir("memory").unwrap().exists());
    for pid in pids {
        assert!(!is_alive(pid as u32), "{pid} survived");
    }
}

#[test]
fn executors_are_born_in_their_v2_container_and_killed_whole() {
    let Some(real) = RealV2::new("v2born") else {
        return;
    };
    let container = real.container("run-1");
    if container.dir("cpu").unwrap().join("cgroup.kill").exists() {
        born_inside_and_killed_whole(&real.0, &container, Container::kill_all);
    } else {
        eprintln!("no cgroup.kill on this kernel (before 5.14): kill_all freezes");
    }
    // The way of kernels without cgroup.kill.
    let container = real.container("run-2");
    born_inside_and_killed_whole(&real.0, &container, Container::freeze_and_kill);
    assert!(real.0.names().is_empty());
}

#[test]
fn a_failed_v2_spawn_leaves_nothing_behind() {
    let Some(real) = RealV2::new("v2fail") else {
        return;
    };
    let container = real.container("run");
    let sandbox = tempfile::tempdir().unwrap();
    let mut missing = sh("", sandbox.path());
    missing.program = "/nonexistent/executor".into();
    let err = real
        .0
        .spawn_inside(&container, |birth| missing.start(birth))
        .unwrap_err();
    assert_eq!(err.kind(), io::ErrorKind::NotFound, "{err}");
    let gone = sh("true", &sandbox.path().join("gone"));
    assert!(real
        .0
        .spawn_inside(&container, |birth| gone.start(birth))
        .is_err());
    // Reaped: nothing in the container, and it can be removed.
    assert!(container.pids().is_empty());
    assert!(container.remove().unwrap());
}
