//! Starts real short processes through the agent's executor launcher and
//! checks what an operator relies on: each executor runs in its own session
//! and process group, in its sandbox, with its output in the sandbox; a
//! kill ends everything it started; its exit status is reported correctly;
//! a process that is not the executor is never signalled.

use std::path::{Path, PathBuf};
use std::process::ExitStatus;
use std::time::Duration;

use agora_agent::launcher::{self, LaunchSpec, Process};
use nix::sys::signal::Signal;

/// Waits for `process` to exit; its status, read without reaping it.
async fn exited(process: &Process, within: Duration) -> Option<ExitStatus> {
    let watch = process.exit_watch().unwrap();
    tokio::time::timeout(within, watch.exited()).await.ok()?;
    process.exit_status()
}

/// What the agent does to stop an executor: SIGTERM to its session, and
/// SIGKILL once `grace` has passed; then leftovers are killed and the
/// leader reaped. Returns the exit status.
async fn terminate(mut process: Process, grace: Duration) -> ExitStatus {
    process.signal_group(Signal::SIGTERM);
    launcher::signal_session_members(&[process.pid()], Signal::SIGTERM);
    let status = match exited(&process, grace).await {
        Some(status) => status,
        None => {
            process.signal_group(Signal::SIGKILL);
            launcher::signal_session_members(&[process.pid()], Signal::SIGKILL);
            exited(&process, Duration::from_secs(10)).await.unwrap()
        }
    };
    process.signal_group(Signal::SIGKILL);
    launcher::signal_session_members(&[process.pid()], Signal::SIGKILL);
    assert_eq!(process.reap(), Some(status));
    status
}

fn shell(script: &str, sandbox: &Path) -> LaunchSpec {
    LaunchSpec {
        program: "/bin/sh".into(),
        argv0: None,
        args: vec!["-c".into(), script.into()],
        env: vec![("AGORA_TEST_VALUE".into(), "forty-two".into())],
        secrets: Vec::new(),
        sandbox: sandbox.to_path_buf(),
        fetch: Vec::new(),
        limits: None,
        user: String::new(),
        logger: None,
    }
}

async fn wait_for_file(path: &Path, needle: &str) -> String {
    for _ in 0..200 {
        if let Ok(text) = std::fs::read_to_string(path) {
            if text.contains(needle) {
                return text;
            }
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    panic!("{} never contained {needle:?}", path.display());
}

async fn wait_gone(pid: i32) -> bool {
    for _ in 0..200 {
        if !launcher::is_alive(pid as u32, None) {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    false
}

fn sandbox() -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let sandbox = dir.path().join("frameworks/f/executors/e/runs/r");
    std::fs::create_dir_all(&sandbox).unwrap();
    (dir, sandbox)
}

#[tokio::test]
async fn executor_runs_in_own_session_with_output_in_sandbox() {
    let (_dir, sandbox) = sandbox();
    let spec = shell(
        "echo \"hello $AGORA_TEST_VALUE\"; pwd; echo oops >&2; sleep 30",
        &sandbox,
    );
    let launched = Process::spawn(&spec).unwrap();
    let pid = launched.pid() as i32;
    let stat = launcher::proc_stat(pid).unwrap();
    assert_eq!(stat.pgrp, pid, "executor leads its own process group");
    assert_eq!(stat.session, pid, "executor leads its own session");
    let me = launcher::proc_stat(std::process::id() as i32).unwrap();
    assert_ne!(stat.session, me.session);
    assert_eq!(launched.start_time(), Some(stat.start_time));
    assert!(launched.is_child() && launched.is_running());

    let out = wait_for_file(&sandbox.join("stdout"), "hello forty-two").await;
    let cwd = std::fs::canonicalize(&sandbox).unwrap();
    assert!(
        out.contains(cwd.to_str().unwrap()),
        "cwd is the sandbox: {out}"
    );
    wait_for_file(&sandbox.join("stderr"), "oops").await;

    let status = terminate(launched, Duration::from_secs(2)).await;
    assert_eq!(launcher::wait_status_code(&status), Some(128 + 15));
    assert_eq!(
        launcher::describe_exit(&status),
        "terminated by signal SIGTERM"
    );
}

#[tokio::test]
async fn kill_ends_grandchildren_and_other_groups_of_the_session() {
    let (_dir, sandbox) = sandbox();
    let has_perl = Path::new("/usr/bin/perl").exists();
    // A grandchild in the executor's group, and (with perl) one that moved
    // to a process group of its own, like a command executor's task.
    let script = if has_perl {
        "sleep 30 & echo $! > grandchild.pid; \
         perl -e 'setpgrp(0,0); sleep 30' & echo $! > own-group.pid; wait"
    } else {
        "sleep 30 & echo $! > grandchild.pid; wait"
    };
    let launched = Process::spawn(&shell(script, &sandbox)).unwrap();
    let grandchild: i32 = wait_for_file(&sandbox.join("grandchild.pid"), "\n")
        .await
        .trim()
        .parse()
        .unwrap();
    assert!(launcher::is_alive(grandchild as u32, None));
    let own_group = if has_perl {
        let pid: i32 = wait_for_file(&sandbox.join("own-group.pid"), "\n")
            .await
            .trim()
            .parse()
            .unwrap();
        // Wait until perl has called setpgrp.
        for _ in 0..200 {
            if launcher::proc_stat(pid).is_some_and(|s| s.pgrp == pid) {
                break;
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
        let stat = launcher::proc_stat(pid).unwrap();
        assert_eq!(stat.pgrp, pid);
        assert_eq!(stat.session, launched.pid() as i32);
        Some(pid)
    } else {
        None
    };
    assert!(launcher::session_members(launched.pid()).contains(&grandchild));

    let status = terminate(launched, Duration::from_secs(2)).await;
    assert!(launcher::wait_status_code(&status).is_some());
    assert!(wait_gone(grandchild).await, "grandchild survived the kill");
    if let Some(pid) = own_group {
        assert!(wait_gone(pid).await, "member of another group survived");
    }
}

#[tokio::test]
async fn sigterm_ignoring_executor_is_killed_after_grace() {
    let (_dir, sandbox) = sandbox();
    let spec = shell(
        "trap '' TERM; echo ready; while :; do sleep 1; done",
        &sandbox,
    );
    let launched = Process::spawn(&spec).unwrap();
    wait_for_file(&sandbox.join("stdout"), "ready").await;
    let started = std::time::Instant::now();
    let status = terminate(launched, Duration::from_millis(300)).await;
    assert!(started.elapsed() >= Duration::from_millis(300));
    assert_eq!(launcher::wait_status_code(&status), Some(128 + 9));
}

#[tokio::test]
async fn exit_codes_are_reported() {
    let (_dir, sandbox) = sandbox();
    let mut launched = Process::spawn(&shell("exit 3", &sandbox)).unwrap();
    let status = exited(&launched, Duration::from_secs(10)).await.unwrap();
    assert_eq!(launcher::wait_status_code(&status), Some(3));
    assert_eq!(launcher::describe_exit(&status), "exited with status 3");
    // Read without reaping: still a zombie, so its pid is not reused.
    assert_eq!(
        launcher::proc_stat(launched.pid() as i32).unwrap().state,
        'Z'
    );
    assert_eq!(launched.reap(), Some(status));
    assert!(launcher::proc_stat(launched.pid() as i32).is_none());

    let launched = Process::spawn(&shell("kill -KILL $$", &sandbox)).unwrap();
    let status = exited(&launched, Duration::from_secs(10)).await.unwrap();
    assert_eq!(launcher::wait_status_code(&status), Some(137));
    assert_eq!(
        launcher::describe_exit(&status),
        "terminated by signal SIGKILL"
    );
}

#[tokio::test]
async fn missing_program_is_a_launch_error() {
    let (_dir, sandbox) = sandbox();
    let spec = LaunchSpec {
        program: "/nonexistent/agora-executor".into(),
        argv0: None,
        args: vec![],
        env: vec![],
        secrets: Vec::new(),
        sandbox,
        fetch: Vec::new(),
        limits: None,
        user: String::new(),
        logger: None,
    };
    let err = Process::spawn(&spec).unwrap_err();
    assert_eq!(err.kind(), std::io::ErrorKind::NotFound);
}

/// Started as another user (the agent being root), the executor has that
/// user's uid, groups and environment, writes its output files as that
/// user, and is still signalled and reaped like any other; the agent's
/// own identity is untouched.
#[tokio::test]
async fn an_executor_runs_as_the_user_it_is_given() {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    if !nix::unistd::Uid::effective().is_root() {
        eprintln!("skipping: starting a process as another user needs root");
        return;
    }
    let policy = agora_agent::UserPolicy {
        switch_user: true,
        allow_root_tasks: false,
    };
    let nobody = match policy.resolve("nobody") {
        Ok(Some(user)) => user,
        other => {
            eprintln!("skipping: no user nobody to switch to ({other:?})");
            return;
        }
    };
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let sandbox = dir.path().join("runs/r");
    nobody.create_dir(&sandbox).unwrap();
    assert_eq!(std::fs::metadata(&sandbox).unwrap().uid(), nobody.uid);
    let spec = shell(
        "id -u; id -g; id -G; echo \"$USER $HOME\"; touch mine",
        &sandbox,
    );
    let mut process = Process::spawn_as(&spec, Some(&nobody)).unwrap();
    let status = exited(&process, Duration::from_secs(10)).await.unwrap();
    assert!(status.success(), "{status:?}");
    assert!(process.reap().is_some());
    let out = std::fs::read_to_string(sandbox.join("stdout")).unwrap();
    let groups: Vec<String> = nobody.groups.iter().map(u32::to_string).collect();
    assert_eq!(
        out.lines().collect::<Vec<_>>(),
        [
            nobody.uid.to_string(),
            nobody.gid.to_string(),
            groups.join(" "),
            format!("nobody {}", nobody.home.display()),
        ]
    );
    for file in ["stdout", "stderr", "mine"] {
        assert_eq!(
            std::fs::metadata(sandbox.join(file)).unwrap().uid(),
            nobody.uid,
            "{file}"
        );
    }
    // The switch happened in the child only.
    assert!(nix::unistd::Uid::effective().is_root());

    // Killed as any executor is.
    let sleeper = Process::spawn_as(&shell("sleep 30", &sandbox), Some(&nobody)).unwrap();
    let status = terminate(sleeper, Duration::from_secs(5)).await;
    assert_eq!(launcher::wait_status_code(&status), Some(143));
}

/// A recorded pid whose start time does not match is another process
/// (the executor died and the pid was given to someone else): it is not
/// adopted, so it is never signalled.
#[tokio::test]
async fn a_reused_pid_is_not_adopted() {
    let (_dir, sandbox) = sandbox();
    let bystander = Process::spawn(&shell("sleep 30", &sandbox)).unwrap();
    let pid = bystander.pid();
    let start = bystander.start_time().unwrap();
    assert!(Process::adopt(pid, Some(start + 1)).is_none());
    let adopted = Process::adopt(pid, Some(start)).expect("the recorded process");
    assert!(!adopted.is_child() && adopted.is_running());
    assert!(Process::adopt(1, None).is_none(), "init is never adopted");
    let status = terminate(bystander, Duration::from_secs(2)).await;
    assert_eq!(launcher::wait_status_code(&status), Some(128 + 15));
    // The adopted handle sees the exit, cannot reap it, and signals nothing.
    assert!(!adopted.is_running());
    assert_eq!(adopted.exit_status(), None);
    adopted.signal_group(Signal::SIGKILL);
}

#[tokio::test]
async fn output_through_the_logrotate_logger_is_rotated_by_size() {
    let (_dir, sandbox) = sandbox();
    let mut spec = shell(
        "i=0; while [ $i -lt 2000 ]; do i=$((i+1)); echo \"line $i\"; done; echo END",
        &sandbox,
    );
    spec.logger = Some(Box::new(agora_agent::logrotate::Logrotate {
        program: env!("CARGO_BIN_EXE_agora-logrotate-logger").into(),
        max_stdout_size: 4096,
        max_stderr_size: 4096,
        max_files: 2,
    }));
    let _process = Process::spawn(&spec).unwrap();
    let last = wait_for_file(&sandbox.join("stdout"), "END").await;
    let size = |name: &str| std::fs::metadata(sandbox.join(name)).map(|m| m.len()).ok();
    assert!(last.len() <= 4096, "{}", last.len());
    assert_eq!(size("stdout.1"), Some(4096));
    assert_eq!(size("stdout.2"), Some(4096));
    assert_eq!(size("stdout.3"), None);
    // What is kept is the end of the output, in order.
    let kept = std::fs::read_to_string(sandbox.join("stdout.1")).unwrap() + &last;
    assert!(kept.ends_with("line 2000\nEND\n"), "{kept}");
}
