//! The ceiling for launching containers: crun alone running a `/bin/true`
//! bundle in a loop (create, start, wait, delete), next to this crate's
//! runtime doing the whole launch path for the same image (overlay mount,
//! bundle, conmon, crun create and start, wait, crun delete, unmount,
//! removal). Prints containers per second for each and their ratio.
//!
//! `cargo bench -p agora-containerizer --bench crun_ceiling`; runs as
//! root with overlay, crun, conmon and busybox, and says why it skips
//! otherwise. `BENCH_RUNS` sets the number of containers (200).

#[path = "../tests/support/mod.rs"]
mod support;

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Instant;

use agora_containerizer::runtime::{mounts, CommandSpec, Runtime};
use nix::sys::wait::waitpid;
use nix::unistd::Pid;

fn main() {
    if let Some(why) = support::cannot_run_containers() {
        println!("crun_ceiling: skipped ({why})");
        return;
    }
    let runs: usize = std::env::var("BENCH_RUNS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(200);
    // On a hybrid cgroup host crun 1.8 wants no v2 controllers: the whole
    // bench runs in a mount namespace of its own without the v2 mount (the
    // runtime does the same per call when it finds such a host).
    hide_unified_once();
    // The container's first process becomes this process's child when
    // `crun create` exits, so it can be waited for.
    nix::sys::prctl::set_child_subreaper(true).expect("PR_SET_CHILD_SUBREAPER");

    let fx = support::Fixture::new();
    let crun = support::which("crun").unwrap();

    // crun alone: one bundle, its root file system mounted once.
    let bundle = fx.tmp.path().join("ceiling");
    let rootfs = mounts::mount_overlay(&fx.layers, &bundle.join("rootfs")).expect("overlay");
    let config = minimal_config(&rootfs);
    std::fs::write(bundle.join("config.json"), config).unwrap();
    let state = fx.tmp.path().join("ceiling-state");
    let start = Instant::now();
    for i in 0..runs {
        let id = format!("ceiling-{i}");
        let pid_file = bundle.join("pid");
        crun_ok(
            &crun,
            &state,
            &[
                "create",
                "--bundle",
                bundle.to_str().unwrap(),
                "--pid-file",
                pid_file.to_str().unwrap(),
                &id,
            ],
        );
        let pid: i32 = std::fs::read_to_string(&pid_file)
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        crun_ok(&crun, &state, &["start", &id]);
        waitpid(Pid::from_raw(pid), None).expect("wait for the container");
        crun_ok(&crun, &state, &["delete", &id]);
    }
    let ceiling = runs as f64 / start.elapsed().as_secs_f64();
    mounts::unmount_all_under(&bundle);

    // This runtime's whole launch path.
    let tokio = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let ours = tokio.block_on(async {
        let runtime = Runtime::new(fx.config()).unwrap();
        let start = Instant::now();
        for i in 0..runs {
            let id = format!("run-{i}");
            let mut spec = fx.spec(&id, "");
            spec.command = CommandSpec {
                shell: false,
                value: Some("/bin/true".into()),
                arguments: vec![],
            };
            let mut container = runtime.launch(spec).await.expect("launch");
            assert!(container.wait().await.success());
            runtime.destroy(&id).await.expect("destroy");
        }
        runs as f64 / start.elapsed().as_secs_f64()
    });

    println!("containers of /bin/true, {runs} in a row, one at a time:");
    println!("  crun alone (create, start, wait, delete):       {ceiling:8.1} containers/s");
    println!("  Runtime (overlay, bundle, conmon, crun, clean): {ours:8.1} containers/s");
    println!(
        "  Runtime / crun alone:                           {:8.2}",
        ours / ceiling
    );
}

fn crun_ok(crun: &Path, root: &Path, args: &[&str]) {
    let status = Command::new(crun)
        .arg(format!("--root={}", root.display()))
        .args(args)
        .stdin(Stdio::null())
        .status()
        .expect("crun");
    assert!(status.success(), "crun {args:?} failed");
}

fn minimal_config(rootfs: &Path) -> String {
    serde_json::json!({
        "ociVersion": "1.0.2",
        "process": {"user": {"uid": 0, "gid": 0}, "args": ["/bin/true"], "env": ["PATH=/bin"], "cwd": "/"},
        "root": {"path": rootfs, "readonly": false},
        "hostname": "ceiling",
        "mounts": [
            {"destination": "/proc", "type": "proc", "source": "proc"},
            {"destination": "/dev", "type": "tmpfs", "source": "tmpfs", "options": ["nosuid", "mode=755"]}
        ],
        "linux": {
            "namespaces": [{"type": "pid"}, {"type": "mount"}, {"type": "ipc"}, {"type": "uts"}],
            "cgroupsPath": "/agora-ceiling/bench"
        }
    })
    .to_string()
}

fn hide_unified_once() {
    use nix::mount::{mount, umount2, MntFlags, MsFlags};
    let unified = Path::new("/sys/fs/cgroup/unified/cgroup.controllers");
    let hybrid = !Path::new("/sys/fs/cgroup/cgroup.controllers").exists()
        && std::fs::read_to_string(unified).is_ok_and(|s| !s.trim().is_empty());
    if !hybrid {
        return;
    }
    nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNS).expect("unshare");
    mount(
        None::<&str>,
        "/",
        None::<&str>,
        MsFlags::MS_REC | MsFlags::MS_SLAVE,
        None::<&str>,
    )
    .expect("make / a slave");
    umount2("/sys/fs/cgroup/unified", MntFlags::MNT_DETACH).expect("umount unified");
}
