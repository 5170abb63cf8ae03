//! The runtime with real parts: crun, conmon, overlay, cgroups, and a
//! busybox image built by the test. Each test skips (saying why) where
//! the host cannot run containers: not root, no overlay, no crun, conmon
//! or busybox.

mod support;

use std::path::PathBuf;

use agora_containerizer::runtime::{
    CommandSpec, ExecSpec, Exit, Limits, RootFs, Runtime, RuntimeError,
};
use agora_containerizer::volumes::{Mode, SandboxOf, Volume, VolumeSource};
use nix::sys::signal::Signal;
use support::{alive, memory_cgroup, mounted_under, oom_kills, read, skip, Fixture};

#[tokio::test]
async fn a_container_sees_its_image_its_own_pid_1_hostname_sandbox_and_volumes() {
    if skip("a_container_sees_its_image...") {
        return;
    }
    let fx = Fixture::new();
    let runtime = Runtime::new(fx.config()).unwrap();
    let host_rw = fx.tmp.path().join("host-rw");
    let host_ro = fx.tmp.path().join("host-ro");
    std::fs::create_dir_all(&host_rw).unwrap();
    std::fs::create_dir_all(&host_ro).unwrap();
    std::fs::write(host_rw.join("in"), "host-rw-content\n").unwrap();
    std::fs::write(host_ro.join("in"), "host-ro-content\n").unwrap();
    let script = "cat /etc/os-release; cat /etc/which; echo pid=$$; echo cmdline=$(cat /proc/1/cmdline | tr '\\0' ' '); \
        echo hostname=$(hostname); echo etc-hostname=$(cat /etc/hostname); \
        echo sandbox=$MESOS_SANDBOX cwd=$(pwd) image=$IMAGE_VAR task=$TASK_VAR; \
        cat /data/in; echo written > /data/out; cat /ro/in; \
        (echo x > /ro/x) 2>/dev/null || echo ro-refused; \
        echo shared > /tmp/scratch/file; echo in-sandbox > $MESOS_SANDBOX/made-inside; \
        echo uid=$(id -u); echo to-stderr >&2; ls /proc | grep -c '^[0-9]'";
    let mut spec = fx.spec("look", script);
    spec.volumes = vec![
        Volume {
            container_path: "/data".into(),
            mode: Mode::Rw,
            source: VolumeSource::HostPath {
                path: host_rw.clone(),
            },
        },
        Volume {
            container_path: "/ro".into(),
            mode: Mode::Ro,
            source: VolumeSource::HostPath {
                path: host_ro.clone(),
            },
        },
        Volume {
            container_path: "/tmp/scratch".into(),
            mode: Mode::Rw,
            source: VolumeSource::SandboxPath {
                of: SandboxOf::Own,
                path: "scratch".into(),
            },
        },
    ];
    let run_dir = spec.run_dir.clone();
    let mut container = runtime.launch(spec).await.unwrap();
    let exit = container.wait().await;
    let sandbox = fx.sandbox("look");
    let out = read(&sandbox, "stdout");
    assert_eq!(
        exit,
        Exit::Code(0),
        "stdout: {out}\nstderr: {}",
        read(&sandbox, "stderr")
    );
    assert!(
        out.contains("ID=agora-busybox"),
        "the image's os-release: {out}"
    );
    assert!(!out.contains("debian"), "not the host's: {out}");
    assert!(out.contains("\ntop\n"), "the top layer wins: {out}");
    assert!(out.contains("pid=1\n"), "PID 1 is its own: {out}");
    assert!(out.contains("cmdline=/bin/sh -c"), "{out}");
    assert!(out.contains("hostname=host-look\n"), "{out}");
    assert!(out.contains("etc-hostname=host-look\n"), "{out}");
    assert!(
        out.contains(
            "sandbox=/mnt/mesos/sandbox cwd=/mnt/mesos/sandbox image=from-image task=from-task"
        ),
        "{out}"
    );
    assert!(out.contains("host-rw-content"), "{out}");
    assert!(out.contains("host-ro-content"), "{out}");
    assert!(out.contains("ro-refused"), "read-only volume: {out}");
    assert!(out.contains("uid=0"), "{out}");
    assert_eq!(
        std::fs::read_to_string(host_rw.join("out")).unwrap(),
        "written\n"
    );
    assert!(!host_ro.join("x").exists());
    assert_eq!(read(&sandbox, "scratch/file"), "shared\n");
    assert_eq!(read(&sandbox, "made-inside"), "in-sandbox\n");
    assert_eq!(read(&sandbox, "stderr"), "to-stderr\n");
    // Only the container's processes in its /proc (sh, and ls/grep).
    let procs: u32 = out.lines().last().unwrap().trim().parse().unwrap();
    assert!(procs <= 4, "{procs} processes visible: {out}");

    runtime.destroy("look").await.unwrap();
    assert!(mounted_under(&run_dir).is_empty());
    assert!(!run_dir.exists());
    assert!(sandbox.join("stdout").exists(), "the sandbox stays");
}

#[tokio::test]
async fn exit_codes_and_the_images_command_rules() {
    if skip("exit_codes_and_the_images_command_rules") {
        return;
    }
    let fx = Fixture::new();
    let runtime = Runtime::new(fx.config()).unwrap();
    let mut container = runtime.launch(fx.spec("three", "exit 3")).await.unwrap();
    assert_eq!(container.wait().await, Exit::Code(3));
    assert_eq!(container.wait().await, Exit::Code(3), "asked again");
    runtime.destroy("three").await.unwrap();

    // No value: the image's Entrypoint with the task's arguments in place
    // of its Cmd; working directory and user from the image.
    let mut spec = fx.spec("entry", "");
    spec.command = CommandSpec {
        shell: false,
        value: None,
        arguments: vec![
            "-c".into(),
            "echo args=$0; pwd; id -u; id -g".into(),
            "zero".into(),
        ],
    };
    if let RootFs::Image { config, .. } = &mut spec.rootfs {
        config.entrypoint = vec!["/bin/sh".into()];
        config.cmd = vec!["-c".into(), "echo from-cmd".into()];
        config.working_dir = Some("/work/dir".into());
        config.user = Some("app".into());
    }
    let mut container = runtime.launch(spec).await.unwrap();
    assert_eq!(container.wait().await, Exit::Code(0));
    let out = read(&fx.sandbox("entry"), "stdout");
    assert_eq!(
        out,
        "args=zero\n/work/dir\n1000\n1000\n",
        "{}",
        read(&fx.sandbox("entry"), "stderr")
    );
    runtime.destroy("entry").await.unwrap();
}

#[tokio::test]
async fn a_kill_is_reported_as_a_signal_and_leaves_no_process_mount_or_cgroup() {
    if skip("a_kill_is_reported_as_a_signal...") {
        return;
    }
    let fx = Fixture::new();
    let runtime = Runtime::new(fx.config()).unwrap();
    let spec = fx.spec("victim", "sleep 1000 & sleep 1000 & wait");
    let run_dir = spec.run_dir.clone();
    let cgroup = memory_cgroup(spec.cgroups_path.as_deref().unwrap());
    let mut container = runtime.launch(spec).await.unwrap();
    let pid = container.pid();
    assert!(alive(pid));
    assert!(cgroup.exists());
    assert!(
        !mounted_under(&run_dir).is_empty(),
        "the root file system is mounted"
    );
    let state = runtime.state("victim").await.unwrap();
    assert_eq!((state.status.as_str(), state.pid), ("running", pid));
    let procs = std::fs::read_to_string(cgroup.join("cgroup.procs")).unwrap();
    assert_eq!(
        procs.lines().count(),
        3,
        "sh and two sleeps in the cgroup: {procs}"
    );
    let members: Vec<u32> = procs.lines().map(|l| l.parse().unwrap()).collect();

    runtime.kill("victim", Signal::SIGKILL).await.unwrap();
    assert_eq!(container.wait().await, Exit::Signal(9));
    runtime.destroy("victim").await.unwrap();
    for member in members {
        assert!(!alive(member), "process {member} survived");
    }
    assert!(mounted_under(&run_dir).is_empty());
    assert!(!cgroup.exists(), "cgroup {} left", cgroup.display());
    assert!(!run_dir.exists());
    assert!(runtime.list().await.unwrap().is_empty());
    assert!(matches!(
        runtime.state("victim").await,
        Err(RuntimeError::NotFound(_))
    ));
}

#[tokio::test]
async fn out_of_memory_is_seen_in_the_containers_cgroup() {
    if skip("out_of_memory_is_seen_in_the_containers_cgroup") {
        return;
    }
    let fx = Fixture::new();
    let runtime = Runtime::new(fx.config()).unwrap();
    let mut spec = fx.spec(
        "hog",
        "echo start; x=0123456789abcdef; while true; do x=$x$x; done",
    );
    spec.limits = Limits {
        memory_bytes: Some(32 << 20),
        pids_max: Some(32),
        cpu_shares: Some(512),
        ..Limits::default()
    };
    let cgroup = memory_cgroup(spec.cgroups_path.as_deref().unwrap());
    let mut container = runtime.launch(spec).await.unwrap();
    let limit = std::fs::read_to_string(cgroup.join("memory.limit_in_bytes"))
        .or_else(|_| std::fs::read_to_string(cgroup.join("memory.max")))
        .unwrap();
    assert_eq!(limit.trim(), (32u64 << 20).to_string());
    assert_eq!(container.wait().await, Exit::Signal(9));
    assert!(
        oom_kills(&cgroup) >= 1,
        "no OOM kill counted in {}",
        cgroup.display()
    );
    runtime.destroy("hog").await.unwrap();
    assert!(!cgroup.exists());
}

#[tokio::test]
async fn exec_runs_in_the_running_container() {
    if skip("exec_runs_in_the_running_container") {
        return;
    }
    let fx = Fixture::new();
    let runtime = Runtime::new(fx.config()).unwrap();
    let mut container = runtime
        .launch(fx.spec("target", "sleep 1000"))
        .await
        .unwrap();
    let child = runtime
        .exec(
            "target",
            ExecSpec {
                args: vec![
                    "sh".into(),
                    "-c".into(),
                    "cat /etc/which; hostname; echo $EXTRA $TASK_VAR; pwd; cat /proc/1/cmdline; exit 5".into(),
                ],
                env: vec![("EXTRA".into(), "extra".into())],
                cwd: None,
            },
        )
        .await
        .unwrap();
    let out = child.wait_with_output().await.unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(5),
        "stderr: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        stdout,
        "top\nhost-target\nextra from-task\n/mnt/mesos/sandbox\nsleep\u{0}1000\u{0}"
    );
    runtime.kill("target", Signal::SIGKILL).await.unwrap();
    assert_eq!(container.wait().await, Exit::Signal(9));
    runtime.destroy("target").await.unwrap();
}

#[tokio::test]
async fn a_new_runtime_readopts_live_containers_and_destroys_orphans() {
    if skip("a_new_runtime_readopts_live_containers_and_destroys_orphans") {
        return;
    }
    let fx = Fixture::new();
    let first = Runtime::new(fx.config()).unwrap();
    let kept = first.launch(fx.spec("kept", "sleep 1000")).await.unwrap();
    let orphan = first.launch(fx.spec("orphan", "sleep 1000")).await.unwrap();
    let (kept_pid, orphan_pid) = (kept.pid(), orphan.pid());
    let orphan_run_dir = orphan.run_dir().to_path_buf();
    drop((kept, orphan, first));
    // The orphan has no checkpoint (as if the agent never launched it).
    std::fs::remove_file(fx.tmp.path().join("runtime/containers/orphan.json")).unwrap();

    let second = Runtime::new(fx.config()).unwrap();
    let recovered = second.recover(&|_| true).await.unwrap();
    assert_eq!(recovered.destroyed, vec!["orphan".to_string()]);
    assert!(!alive(orphan_pid));
    assert!(
        mounted_under(&orphan_run_dir).is_empty(),
        "the orphan's mounts are gone"
    );
    assert!(!orphan_run_dir.exists());
    let mut adopted = recovered.adopted;
    assert_eq!(adopted.len(), 1);
    let mut kept = adopted.remove(0);
    assert_eq!((kept.id(), kept.pid()), ("kept", kept_pid));
    assert!(alive(kept_pid));
    let listed: Vec<String> = second
        .list()
        .await
        .unwrap()
        .into_iter()
        .map(|s| s.id)
        .collect();
    assert_eq!(listed, vec!["kept".to_string()]);

    second.kill("kept", Signal::SIGKILL).await.unwrap();
    assert_eq!(
        kept.wait().await,
        Exit::Signal(9),
        "the exit status survives the restart"
    );
    second.destroy("kept").await.unwrap();
    assert!(second.list().await.unwrap().is_empty());
}

#[tokio::test]
async fn refused_launches_say_why_and_leave_nothing() {
    if skip("refused_launches_say_why_and_leave_nothing") {
        return;
    }
    let fx = Fixture::new();
    let mut config = fx.config();
    config.volume_policy.allowed_host_paths = Some(vec![fx.tmp.path().join("allowed")]);
    let runtime = Runtime::new(config).unwrap();

    let mut spec = fx.spec("refused", "true");
    spec.volumes = vec![Volume {
        container_path: "/etc-of-host".into(),
        mode: Mode::Ro,
        source: VolumeSource::HostPath {
            path: "/etc".into(),
        },
    }];
    let run_dir = spec.run_dir.clone();
    let err = runtime.launch(spec).await.unwrap_err();
    assert!(
        err.to_string().contains("volume 0 at '/etc-of-host'"),
        "{err}"
    );
    assert!(err.to_string().contains("--allowed-host-paths"), "{err}");
    assert!(mounted_under(&run_dir).is_empty());
    assert!(!run_dir.exists());

    let mut spec = fx.spec("nolayer", "true");
    spec.rootfs = RootFs::Image {
        layers: vec![PathBuf::from("/nonexistent/layer")],
        config: Default::default(),
    };
    let err = runtime.launch(spec).await.unwrap_err();
    assert!(err.to_string().contains("/nonexistent/layer"), "{err}");

    let mut spec = fx.spec("noprogram", "");
    spec.command = CommandSpec {
        shell: false,
        value: Some("/bin/does-not-exist".into()),
        arguments: vec![],
    };
    let run_dir = spec.run_dir.clone();
    let err = runtime.launch(spec).await.unwrap_err();
    assert!(err.to_string().contains("does-not-exist"), "{err}");
    assert!(mounted_under(&run_dir).is_empty());
    assert!(runtime.list().await.unwrap().is_empty());
}

#[tokio::test]
async fn a_container_without_an_image_shares_the_hosts_file_system_with_its_volumes() {
    if skip("a_container_without_an_image...") {
        return;
    }
    let fx = Fixture::new();
    let runtime = Runtime::new(fx.config()).unwrap();
    let source = fx.tmp.path().join("volume-source");
    let mount_point = fx.tmp.path().join("mount-point");
    std::fs::create_dir_all(&source).unwrap();
    std::fs::create_dir_all(&mount_point).unwrap();
    std::fs::write(source.join("in"), "from-the-volume\n").unwrap();
    let mut spec = fx.spec("hostfs", "");
    spec.rootfs = RootFs::Host;
    spec.command = CommandSpec {
        shell: true,
        value: Some(format!(
            "cat {mp}/in; cat rel/in; echo $MESOS_SANDBOX; pwd",
            mp = mount_point.display()
        )),
        arguments: vec![],
    };
    spec.volumes = vec![
        Volume {
            container_path: mount_point.to_string_lossy().into_owned(),
            mode: Mode::Ro,
            source: VolumeSource::HostPath {
                path: source.clone(),
            },
        },
        Volume {
            container_path: "rel".into(),
            mode: Mode::Ro,
            source: VolumeSource::HostPath {
                path: source.clone(),
            },
        },
    ];
    let mut container = runtime.launch(spec).await.unwrap();
    let sandbox = fx.sandbox("hostfs");
    assert_eq!(
        container.wait().await,
        Exit::Code(0),
        "{}",
        read(&sandbox, "stderr")
    );
    let sb = sandbox.display();
    assert_eq!(
        read(&sandbox, "stdout"),
        format!("from-the-volume\nfrom-the-volume\n{sb}\n{sb}\n")
    );
    assert!(
        !mount_point.join("in").exists(),
        "the mount stayed in the container"
    );
    runtime.destroy("hostfs").await.unwrap();
}

#[tokio::test]
async fn an_image_volume_mounts_another_images_root_file_system() {
    if skip("an_image_volume_mounts_another_images_root_file_system") {
        return;
    }
    let fx = Fixture::new();
    let runtime = Runtime::new(fx.config()).unwrap();
    let mut spec = fx.spec(
        "imgvol",
        "cat /opt/tool/etc/which; cat /mnt/mesos/sandbox/rw/etc/os-release; \
         echo new > /mnt/mesos/sandbox/rw/made; (echo x > /opt/tool/x) 2>/dev/null || echo ro-refused",
    );
    spec.volumes = vec![
        Volume {
            container_path: "/opt/tool".into(),
            mode: Mode::Ro,
            source: VolumeSource::Image {
                layers: fx.layers[..1].to_vec(),
            },
        },
        Volume {
            container_path: "rw".into(),
            mode: Mode::Rw,
            source: VolumeSource::Image {
                layers: fx.layers.clone(),
            },
        },
    ];
    let run_dir = spec.run_dir.clone();
    let mut container = runtime.launch(spec).await.unwrap();
    let sandbox = fx.sandbox("imgvol");
    assert_eq!(
        container.wait().await,
        Exit::Code(0),
        "{}",
        read(&sandbox, "stderr")
    );
    assert_eq!(
        read(&sandbox, "stdout"),
        "bottom\nID=agora-busybox\nro-refused\n"
    );
    assert!(
        !fx.layers[1].join("made").exists(),
        "writes go to the volume's own upper layer"
    );
    runtime.destroy("imgvol").await.unwrap();
    assert!(mounted_under(&run_dir).is_empty());
}
