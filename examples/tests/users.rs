//! Which user tasks run as, against a real master and real agents started
//! with the agent's own defaults (`--switch-user` on, root refused): a
//! framework naming root gets its task failed with a message naming root
//! unless the agent runs with `--allow-root-tasks`; an unknown user is
//! named; and, on an agent running as root, a task runs as the user its
//! framework names, in a sandbox that user owns (mode 0750), with that
//! user's environment; a task of another user cannot read it; and a task
//! can neither read its executor's secrets (token, TLS key path) from
//! `/proc` nor pass for its executor to forge a sibling task's update.

mod support;

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::Duration;

use agora_proto::{FetchUri, Filters, FrameworkInfo, Reason, TaskState, TaskStatus};
use support::{bin, command_task, start_framework, wait_for, Proc, SchedEvent, TestCluster};

const AGENT: &str = "cpus:2;mem:1024";

fn is_root() -> bool {
    nix::unistd::Uid::effective().is_root()
}

/// Starts an agent with the agent's default user flags plus `extra`,
/// running `command_executor`, in work dir `work_dir`.
fn add_agent(cluster: &mut TestCluster, work_dir: &Path, command_executor: &Path, extra: &[&str]) {
    std::fs::create_dir_all(work_dir).unwrap();
    let mut args: Vec<String> = [
        "--master",
        &cluster.master_address(),
        "--listen",
        "127.0.0.1:0",
        "--work-dir",
        &work_dir.display().to_string(),
        "--resources",
        AGENT,
        "--command-executor",
        &command_executor.display().to_string(),
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    args.extend(extra.iter().map(|s| s.to_string()));
    let n = cluster.agents.len();
    let log = cluster.dir.path().join(format!("agent-{n}.log"));
    let agent = Proc::spawn(
        &format!("agent {n}"),
        &bin("agora-agent"),
        &args,
        work_dir,
        &log,
    );
    cluster.agents.push(agent);
    cluster.wait_agents(n + 1);
}

/// User `nobody`, where a test can have an agent switch to it (it runs as
/// root and the system has that user); else `None`, with the reason
/// printed.
fn nobody_on_a_root_agent() -> Option<nix::unistd::User> {
    if !is_root() {
        eprintln!(
            "skipping: switching users needs the agent to run as root, and this test does not"
        );
        return None;
    }
    let Ok(Some(nobody)) = nix::unistd::User::from_name("nobody") else {
        eprintln!("skipping: this system has no user nobody");
        return None;
    };
    Some(nobody)
}

/// A cluster with one agent that switches users (the default flags, plus
/// `extra`), whose command executor and directory other users can reach;
/// the agent's work directory.
fn switching_cluster(extra: &[&str]) -> (TestCluster, PathBuf) {
    let mut cluster = TestCluster::start_with(0, AGENT, &[]);
    // The user must reach its sandbox and the command executor: the
    // cluster's directory is the test's own (0700), and the workspace's
    // target directory may sit under one nobody cannot enter.
    let open = |p: &Path| std::fs::set_permissions(p, std::fs::Permissions::from_mode(0o755));
    open(cluster.dir.path()).unwrap();
    let tools = cluster.dir.path().join("bin");
    std::fs::create_dir_all(&tools).unwrap();
    open(&tools).unwrap();
    let executor = tools.join("agora-command-executor");
    std::fs::copy(bin("agora-command-executor"), &executor).unwrap();
    open(&executor).unwrap();
    let work = cluster.dir.path().join("agent-switching");
    add_agent(&mut cluster, &work, &executor, extra);
    (cluster, work)
}

/// Runs `command` as a command task of a framework naming `user`, on the
/// agent with the most recent offer; its terminal update.
fn run_as(cluster: &TestCluster, user: &str, command: &str) -> TaskStatus {
    run_with_uris(cluster, user, command, Vec::new())
}

/// Fails the test with the cluster's logs unless `status` is
/// `TASK_FINISHED`.
fn assert_finished(cluster: &TestCluster, status: &TaskStatus) {
    assert_eq!(
        status.state,
        TaskState::Finished,
        "{status:?}\n{}",
        cluster.logs()
    );
}

/// [`run_as`] with `uris` fetched into the task's sandbox first.
fn run_with_uris(
    cluster: &TestCluster,
    user: &str,
    command: &str,
    uris: Vec<FetchUri>,
) -> TaskStatus {
    let mut info = FrameworkInfo::new(format!("as-{user}"));
    info.user = user.into();
    let (driver, events) = start_framework(&cluster.master_address(), info);
    let offer = wait_for(&events, Duration::from_secs(20), |e| match e {
        SchedEvent::Offers(offers) => offers.first().cloned(),
        _ => None,
    });
    let mut task = command_task("whoami", &offer, command, "cpus:0.5;mem:64");
    task.command.as_mut().expect("a command task").uris = uris;
    driver
        .launch_tasks(
            std::slice::from_ref(&offer.id),
            vec![task],
            Filters::default(),
        )
        .unwrap();
    let status = wait_for(&events, Duration::from_secs(30), |e| match e {
        SchedEvent::Update(s) if s.state.is_terminal() => Some(s.clone()),
        _ => None,
    });
    let _ = driver.stop(false);
    status
}

/// The first file called `name` under `dir`.
fn find(dir: &Path, name: &str) -> Option<PathBuf> {
    for entry in std::fs::read_dir(dir).ok()?.flatten() {
        let path = entry.path();
        if path.file_name().is_some_and(|n| n == name) {
            return Some(path);
        }
        if entry.file_type().is_ok_and(|t| t.is_dir()) {
            if let Some(found) = find(&path, name) {
                return Some(found);
            }
        }
    }
    None
}

#[test]
fn root_tasks_are_refused_unless_the_agent_allows_them() {
    let mut cluster = TestCluster::start_with(0, AGENT, &[]);
    let work = cluster.dir.path().join("agent-default");
    add_agent(&mut cluster, &work, &bin("agora-command-executor"), &[]);

    let status = run_as(&cluster, "root", "id -u");
    assert_eq!(status.state, TaskState::Failed, "{status:?}");
    assert_eq!(status.reason, Some(Reason::ReasonExecutorLaunchFailed));
    let message = status.message.clone().unwrap_or_default();
    assert!(
        message.contains("root") && message.contains("--allow-root-tasks"),
        "{message}"
    );
    if is_root() {
        // A framework naming no user on an agent running as root would run
        // as root too.
        let status = run_as(&cluster, "", "id -u");
        assert_eq!(status.state, TaskState::Failed, "{status:?}");
        assert!(status.message.unwrap_or_default().contains("root"));
    }

    // An unknown user is named.
    let status = run_as(&cluster, "agora-no-such-user", "true");
    assert_eq!(status.state, TaskState::Failed, "{status:?}");
    assert!(
        status
            .message
            .as_deref()
            .unwrap_or_default()
            .contains("\"agora-no-such-user\" does not exist"),
        "{status:?}"
    );

    if !is_root() {
        eprintln!("skipping the --allow-root-tasks half: the test does not run as root, so its agent cannot run tasks as root");
        return;
    }
    // With --allow-root-tasks, the same task runs as root.
    let mut cluster = TestCluster::start_with(0, AGENT, &[]);
    let allowed = cluster.dir.path().join("agent-allowed");
    add_agent(
        &mut cluster,
        &allowed,
        &bin("agora-command-executor"),
        &["--allow-root-tasks"],
    );
    let status = run_as(&cluster, "root", "id -u > uid");
    assert_finished(&cluster, &status);
    let uid = find(&allowed, "uid").expect("the task's uid file");
    assert_eq!(std::fs::read_to_string(uid).unwrap().trim(), "0");
}

#[test]
fn tasks_run_as_the_user_their_framework_names() {
    let Some(nobody) = nobody_on_a_root_agent() else {
        return;
    };
    let (cluster, work) = switching_cluster(&[]);
    let tools = cluster.dir.path().join("bin");

    // A file fetched into the sandbox is the user's too.
    let input = tools.join("input.txt");
    std::fs::write(&input, "fetched\n").unwrap();
    let status = run_with_uris(
        &cluster,
        "nobody",
        "set -e; id -un > who; id -u >> who; stat -c %U . >> who; echo \"$HOME $USER\" >> who; \
         stat -c %U input.txt >> who; echo more >> input.txt",
        vec![FetchUri {
            value: input.display().to_string(),
            executable: false,
            extract: false,
            output_file: None,
        }],
    );
    assert_finished(&cluster, &status);
    let who = find(&work, "who").expect("the task's output");
    let lines: Vec<String> = std::fs::read_to_string(&who)
        .unwrap()
        .lines()
        .map(str::to_string)
        .collect();
    let home = nobody.dir.display().to_string();
    assert_eq!(
        lines,
        [
            "nobody".to_string(),
            nobody.uid.to_string(),
            "nobody".to_string(),
            format!("{home} nobody"),
            "nobody".to_string(),
        ]
    );
    // What the task wrote is the user's, as is its sandbox's output.
    assert_eq!(std::fs::metadata(&who).unwrap().uid(), nobody.uid.as_raw());
    let stdout = who.parent().unwrap().join("stdout");
    assert_eq!(
        std::fs::metadata(stdout).unwrap().uid(),
        nobody.uid.as_raw()
    );
}

#[test]
fn a_task_of_another_user_runs_in_a_container_of_its_own() {
    if nobody_on_a_root_agent().is_none() {
        return;
    }
    let root = format!("agora-test-{}-users", std::process::id());
    if let Err(why) = agora_agent::isolation::check_cgroups(&root) {
        eprintln!("skipping: cgroups isolation cannot run here: {why}");
        return;
    }
    let (cluster, work) = switching_cluster(&["--isolation", "cgroups", "--cgroups-root", &root]);
    // Two tasks one after the other share the user's command executor;
    // each is in its own container, entered by a thread of that
    // executor, which runs as the user.
    for _ in 0..2 {
        let status = run_as(
            &cluster,
            "nobody",
            "set -e; id -un > who; cat /proc/self/cgroup > cgroups",
        );
        assert_finished(&cluster, &status);
    }
    let who = find(&work, "who").expect("the task's output");
    assert_eq!(std::fs::read_to_string(&who).unwrap().trim(), "nobody");
    // The container is named by the task's run (its sandbox's name).
    let run = who.parent().unwrap().file_name().unwrap().to_string_lossy();
    let cgroups = std::fs::read_to_string(who.parent().unwrap().join("cgroups")).unwrap();
    let freezer = cgroups
        .lines()
        .find(|l| {
            l.split(':')
                .nth(1)
                .is_some_and(|c| c.split(',').any(|c| c == "freezer"))
        })
        .or_else(|| cgroups.lines().find(|l| l.starts_with("0::")))
        .expect("a freezer or unified cgroup line");
    assert!(
        freezer.ends_with(&format!("{root}/{run}")),
        "{freezer} is not the task's own container {root}/{run}"
    );
    drop(cluster);
    if let Err(e) = agora_agent::isolation::destroy_cgroups_root(&root) {
        eprintln!("cleaning up cgroups root {root}: {e}");
    }
}

#[test]
fn a_task_cannot_read_the_sandbox_of_another_user() {
    let Some(nobody) = nobody_on_a_root_agent() else {
        return;
    };
    let Ok(Some(daemon)) = nix::unistd::User::from_name("daemon") else {
        eprintln!("skipping: this system has no user daemon (a second user besides nobody)");
        return;
    };
    let (cluster, work) = switching_cluster(&[]);
    let status = run_as(&cluster, "nobody", "echo nobody-secret > mine.txt");
    assert_finished(&cluster, &status);
    let mine = find(&work, "mine.txt").expect("the task's file");
    let sandbox = mine.parent().expect("its sandbox");
    let meta = std::fs::metadata(sandbox).unwrap();
    assert_eq!(meta.uid(), nobody.uid.as_raw());
    assert_eq!(meta.mode() & 0o777, 0o750, "{}", sandbox.display());
    assert_ne!(daemon.gid, nobody.gid, "the two users share a group");

    // A task of another user can neither list the sandbox nor read what
    // is in it.
    let status = run_as(
        &cluster,
        "daemon",
        &format!(
            "ls {dir} > listed 2> listing.err; l=$?; cat {file} > stolen 2> reading.err; r=$?; \
             [ $l -ne 0 ] && [ $r -ne 0 ] && exit 7; exit 0",
            dir = sandbox.display(),
            file = mine.display()
        ),
    );
    assert_eq!(status.state, TaskState::Failed, "{status:?}");
    assert!(
        status
            .message
            .as_deref()
            .unwrap_or_default()
            .contains("status 7"),
        "{status:?}"
    );
    let err = find(&work, "reading.err").expect("the other task's errors");
    let text = std::fs::read_to_string(&err).unwrap();
    assert!(text.contains("Permission denied"), "{text}");
    let stolen = std::fs::read_to_string(err.with_file_name("stolen")).unwrap();
    assert!(!stolen.contains("nobody-secret"));
}

/// What a task dumps of its parent (its command executor) and of itself:
/// whether each of `/proc/$PPID/{environ,cmdline,maps,mem}` could be read,
/// what was read, and the task's own environment.
const THIEF: &str = "env > own-env.txt; ls -a ../../.. > executors.txt; \
    for f in environ cmdline maps mem; do \
      if head -c 65536 /proc/$PPID/$f > parent-$f.txt 2> parent-$f.err; \
      then echo read > parent-$f.status; else echo refused > parent-$f.status; fi; \
    done";

/// An executor that does nothing: the attacker's.
struct Impostor;

impl agora_executor::Executor for Impostor {}

#[test]
fn a_task_can_neither_read_its_executors_secrets_nor_pass_for_it() {
    // As root, a task could read any process's memory: the task runs as
    // another user, as a task of a framework naming one does.
    if nobody_on_a_root_agent().is_none() {
        return;
    }
    let (cluster, work) = switching_cluster(&["--authenticate-executors"]);
    let mut info = FrameworkInfo::new("secrets");
    info.user = "nobody".into();
    let (driver, events) = start_framework(&cluster.master_address(), info);
    let offer = wait_for(&events, Duration::from_secs(20), |e| match e {
        SchedEvent::Offers(offers) => offers.first().cloned(),
        _ => None,
    });
    // Both in one command executor: the thief's parent runs the sibling.
    let sibling = command_task("sibling", &offer, "sleep 6; exit 3", "cpus:0.2;mem:32");
    let thief = command_task("thief", &offer, THIEF, "cpus:0.2;mem:32");
    driver
        .launch_tasks(
            std::slice::from_ref(&offer.id),
            vec![sibling, thief],
            Filters::default(),
        )
        .unwrap();
    let thief_end = wait_for(&events, Duration::from_secs(30), |e| match e {
        SchedEvent::Update(s) if s.task_id.as_str() == "thief" && s.state.is_terminal() => {
            Some(s.clone())
        }
        _ => None,
    });
    assert_finished(&cluster, &thief_end);

    // What the task could see of its executor.
    let own_env = find(&work, "own-env.txt").expect("the thief's output");
    let dump = own_env.parent().unwrap().to_path_buf();
    let read = |name: &str| std::fs::read_to_string(dump.join(name)).unwrap_or_default();
    for secret in ["environ", "maps", "mem"] {
        assert_eq!(
            read(&format!("parent-{secret}.status")).trim(),
            "refused",
            "the task read its executor's {secret}: {}",
            read(&format!("parent-{secret}.txt"))
        );
        assert!(
            read(&format!("parent-{secret}.err")).contains("Permission denied"),
            "{secret}: {}",
            read(&format!("parent-{secret}.err"))
        );
    }
    let seen = format!(
        "{}{}{}",
        read("own-env.txt"),
        read("parent-cmdline.txt"),
        read("parent-environ.txt")
    );
    for secret in [
        "AGORA_EXECUTOR_TOKEN",
        "MESOS_EXECUTOR_AUTHENTICATION_TOKEN",
        "AGORA_TLS_KEY",
        "AGORA_EXECUTOR_SECRETS_FD",
        "eyJ",
    ] {
        assert!(!seen.contains(secret), "{secret} in {seen}");
    }

    // The task passes for its executor with what it found (nothing: a
    // token of its own making) and forges its sibling's end.
    let env: std::collections::HashMap<String, String> = read("own-env.txt")
        .lines()
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    let executor_id = read("executors.txt")
        .lines()
        .find(|l| l.starts_with('~'))
        .expect("the command executor's directory")
        .to_string();
    let config = agora_executor::ExecutorConfig {
        agent_endpoint: env["AGORA_AGENT_ENDPOINT"].clone(),
        tls: agora_net::TlsOptions::default(),
        framework_id: agora_proto::FrameworkId::new(env["AGORA_FRAMEWORK_ID"].clone()),
        executor_id: agora_proto::ExecutorId::new(executor_id),
        agent_id: None,
        sandbox: dump.clone(),
        token: "eyJhbGciOiJIUzI1NiJ9.e30.forged".into(),
        checkpoint: false,
        recovery_timeout: Duration::from_secs(1),
        shutdown_grace_period: Duration::from_secs(1),
    };
    let impostor = agora_executor::ExecutorDriver::new(Impostor, config);
    impostor.start().unwrap();
    let _ = impostor.send_status_update(agora_proto::TaskStatus::new(
        agora_proto::TaskId::new("sibling"),
        TaskState::Finished,
        agora_proto::Source::SourceExecutor,
    ));
    let (tx, rx) = std::sync::mpsc::channel();
    let joining = impostor.clone();
    std::thread::spawn(move || {
        let _ = tx.send(joining.join());
    });
    let ended = rx
        .recv_timeout(Duration::from_secs(20))
        .expect("the impostor's subscription was taken: it still runs");
    assert_eq!(ended, agora_executor::DriverStatus::Aborted);

    // The sibling ends as it really does.
    let sibling_end = wait_for(&events, Duration::from_secs(30), |e| match e {
        SchedEvent::Update(s) if s.task_id.as_str() == "sibling" && s.state.is_terminal() => {
            Some(s.clone())
        }
        _ => None,
    });
    assert_eq!(sibling_end.state, TaskState::Failed, "{sibling_end:?}");
    assert_eq!(
        sibling_end.message.as_deref(),
        Some("command exited with status 3")
    );
    let _ = driver.stop(false);
}
