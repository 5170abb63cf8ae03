//! Sandboxes as operators reach and keep them: Mesos's files API on the
//! agent (`/files/read`, `/files/browse`, `/files/download`,
//! `/files/debug`) with its path forms, the master's redirect to the
//! agent that holds a sandbox, followed by real HTTP clients (reqwest,
//! and Python's `requests` as Mesos tools use it), refusals of paths
//! that leave the sandbox; then sandbox garbage collection and the
//! rotation of a task's output.

mod support;

use std::path::Path;
use std::time::Duration;

use agora_proto::{Filters, FrameworkInfo, TaskState};
use support::{command_task, http_get, start_framework, wait_for, SchedEvent, TestCluster};

fn agent_state(cluster: &TestCluster) -> serde_json::Value {
    let (status, body) = http_get(cluster.agents[0].addr, "/state").expect("agent /state");
    assert_eq!(status, 200, "{body}");
    serde_json::from_str(&body).expect("agent /state JSON")
}

/// The `directory` the agent's `/state` gives for executor (or command
/// task) `id`, once it has one.
fn directory_of(cluster: &TestCluster, id: &str) -> String {
    support::wait_until(
        Duration::from_secs(10),
        "the sandbox in the agent's /state",
        || cluster.logs(),
        || {
            let state = agent_state(cluster);
            state["frameworks"]
                .as_array()?
                .iter()
                .flat_map(|f| f["executors"].as_array().into_iter().flatten())
                .find(|e| e["id"] == id)?["directory"]
                .as_str()
                .map(str::to_string)
        },
    )
}

fn query(path: &str) -> String {
    let mut out = String::new();
    for b in path.bytes() {
        if b.is_ascii_alphanumeric() || b"-_.~/".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

fn get(addr: std::net::SocketAddr, path: &str) -> (u16, String) {
    http_get(addr, path).expect("HTTP GET")
}

fn get_json(addr: std::net::SocketAddr, path: &str) -> serde_json::Value {
    let (status, body) = get(addr, path);
    assert_eq!(status, 200, "{path}: {body}");
    serde_json::from_str(&body).unwrap_or_else(|e| panic!("{path}: {e}: {body}"))
}

/// Starts framework `info` and launches command tasks `tasks` (id,
/// command) on one offer; waits until each has run.
fn launch_all(
    cluster: &TestCluster,
    info: FrameworkInfo,
    tasks: &[(&str, &str)],
) -> (
    agora_scheduler::SchedulerDriver,
    std::sync::mpsc::Receiver<SchedEvent>,
    String,
) {
    let (driver, events) = start_framework(&cluster.master_address(), info);
    let framework_id = wait_for(&events, Duration::from_secs(20), |e| match e {
        SchedEvent::Registered(id) => Some(id.to_string()),
        _ => None,
    });
    let offer = wait_for(&events, Duration::from_secs(20), |e| match e {
        SchedEvent::Offers(offers) => offers.first().cloned(),
        _ => None,
    });
    let infos = tasks
        .iter()
        .map(|(id, command)| command_task(id, &offer, command, "cpus:0.25;mem:64"))
        .collect();
    driver
        .launch_tasks(
            std::slice::from_ref(&offer.id),
            infos,
            Filters {
                refuse_seconds: Some(0.0),
            },
        )
        .unwrap();
    let mut running = std::collections::HashSet::new();
    while running.len() < tasks.len() {
        let id = wait_for(&events, Duration::from_secs(20), |e| match e {
            SchedEvent::Update(s) if s.state == TaskState::Running => Some(s.task_id.to_string()),
            SchedEvent::Update(s)
                if s.state.is_terminal() && !running.contains(s.task_id.as_str()) =>
            {
                panic!("{s:?}\n{}", cluster.logs())
            }
            _ => None,
        });
        running.insert(id);
    }
    (driver, events, framework_id)
}

/// Launches command task `id` running `command` and waits for it to run.
fn launch(
    cluster: &TestCluster,
    name: &str,
    id: &str,
    command: &str,
) -> (
    agora_scheduler::SchedulerDriver,
    std::sync::mpsc::Receiver<SchedEvent>,
    String,
) {
    launch_all(cluster, FrameworkInfo::new(name), &[(id, command)])
}

/// Waits for task `id`'s terminal update.
fn terminal(events: &std::sync::mpsc::Receiver<SchedEvent>, id: &str) -> TaskState {
    wait_for(events, Duration::from_secs(30), |e| match e {
        SchedEvent::Update(s) if s.task_id.as_str() == id && s.state.is_terminal() => Some(s.state),
        _ => None,
    })
}

#[test]
fn mesos_files_api_reads_browses_downloads_and_stays_in_the_sandbox() {
    let cluster = TestCluster::start(1, "cpus:2;mem:1024");
    let agent = cluster.agents[0].addr;
    let (driver, _events, fid) = launch(
        &cluster,
        "files",
        "reader",
        "printf 'hello sandbox\\n'; mkdir sub; printf 0123456789 > sub/data; \
         ln -s /etc/passwd leak; ln -s /agora-no-such-file missing-leak; \
         ln -s ../../../../../../../etc/hostname up-leak; touch ready; sleep 120",
    );
    let dir = directory_of(&cluster, "reader");
    assert!(Path::new(&dir).is_absolute(), "{dir}");
    support::wait_until(
        Duration::from_secs(10),
        "the task's files",
        || cluster.logs(),
        || Path::new(&dir).join("ready").exists().then_some(()),
    );
    let read = |path: &str, extra: &str| {
        get_json(agent, &format!("/files/read?path={}{extra}", query(path)))
    };

    // Windows of a file, by the real path /state gives.
    let data = format!("{dir}/sub/data");
    assert_eq!(
        read(&data, "&offset=2&length=3"),
        serde_json::json!({"data": "234", "offset": 2})
    );
    assert_eq!(
        read(&data, "&offset=0"),
        serde_json::json!({"data": "0123456789", "offset": 0})
    );
    // offset=-1 (and no offset): the size, no data.
    assert_eq!(
        read(&data, "&offset=-1"),
        serde_json::json!({"data": "", "offset": 10})
    );
    assert_eq!(
        read(&data, ""),
        serde_json::json!({"data": "", "offset": 10})
    );
    // Past the end: nothing more.
    assert_eq!(read(&data, "&offset=50")["data"], "");
    // The virtual path of the executor's latest run.
    let latest = format!("/frameworks/{fid}/executors/reader/runs/latest");
    assert_eq!(
        read(&format!("{latest}/stdout"), "&offset=0"),
        serde_json::json!({"data": "hello sandbox\n", "offset": 0})
    );
    assert_eq!(
        read(&format!("{latest}/sub/data"), "&offset=8&length=100")["data"],
        "89"
    );
    // Mesos's .json form.
    assert_eq!(
        get_json(
            agent,
            &format!("/files/read.json?path={}&offset=0&length=1", query(&data))
        )["data"],
        "0"
    );

    // Bad queries are 400, as Mesos answers them.
    for bad in [
        "/files/read".to_string(),
        format!("/files/read?path={}&offset=x", query(&data)),
        format!("/files/read?path={}&offset=-2", query(&data)),
        format!("/files/read?path={}&offset=0", query(&dir)),
    ] {
        assert_eq!(get(agent, &bad).0, 400, "{bad}");
    }

    // Browse: Mesos's fields, each entry named under the path asked for.
    for base in [dir.clone(), latest.clone()] {
        let listing = get_json(agent, &format!("/files/browse?path={}", query(&base)));
        let entries = listing.as_array().expect("a list");
        let entry = |name: &str| {
            entries
                .iter()
                .find(|e| e["path"] == format!("{base}/{name}"))
                .unwrap_or_else(|| panic!("{name} in {listing}"))
                .clone()
        };
        let stdout = entry("stdout");
        assert_eq!(stdout["size"], 14, "{stdout}");
        assert_eq!(stdout["nlink"], 1, "{stdout}");
        assert_eq!(stdout["mode"], "-rw-r--r--", "{stdout}");
        assert!(
            stdout["mtime"].as_i64().unwrap() > 1_600_000_000,
            "{stdout}"
        );
        assert!(
            stdout["uid"].is_string() && stdout["gid"].is_string(),
            "{stdout}"
        );
        assert!(
            entry("sub")["mode"].as_str().unwrap().starts_with('d'),
            "{listing}"
        );
        // A symlink is listed as one, its target not looked at.
        assert!(
            entry("leak")["mode"].as_str().unwrap().starts_with('l'),
            "{listing}"
        );
    }
    let sub = get_json(
        agent,
        &format!("/files/browse?path={}", query(&format!("{latest}/sub"))),
    );
    assert_eq!(sub[0]["path"], format!("{latest}/sub/data"), "{sub}");
    assert_eq!(sub[0]["size"], 10, "{sub}");

    // Download: the file itself, as an attachment.
    let response =
        agora_client::blocking::get(agent, &format!("/files/download?path={}", query(&data)))
            .expect("download");
    assert_eq!(response.status, 200);
    assert_eq!(response.text(), "0123456789");
    let header = |name: &str| {
        response
            .headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_string()
    };
    assert_eq!(header("content-type"), "application/octet-stream");
    assert!(
        header("content-disposition").starts_with("attachment"),
        "{}",
        header("content-disposition")
    );
    assert_eq!(
        get(agent, &format!("/files/download?path={}", query(&dir))).0,
        400
    );

    // The CLI's reading of a task's output still works beside them.
    let (ok, out, err) = cluster.run_bin(
        "agora",
        &[
            "--master",
            &cluster.master_address(),
            "task",
            "log",
            "reader",
        ],
        Duration::from_secs(30),
    );
    assert!(ok && out.contains("hello sandbox"), "{out}\n{err}");

    // Debug: the sandbox under both its names.
    let debug = get_json(agent, "/files/debug");
    assert_eq!(debug[&dir], dir, "{debug}");
    assert_eq!(debug[&latest], dir, "{debug}");

    // Out of the sandbox: refused alike whether the target exists.
    for (path, status) in [
        (format!("{dir}/../../../../../../etc/passwd"), 403),
        (format!("{latest}/../../../../../etc/passwd"), 403),
        (format!("{dir}/leak"), 403),
        (format!("{dir}/missing-leak"), 403),
        (format!("{dir}/up-leak"), 403),
        (format!("{dir}/no-such-file"), 404),
        ("/etc/passwd".to_string(), 404),
        ("/etc/no-such-file".to_string(), 404),
        (
            format!("/frameworks/{fid}/executors/nobody/runs/latest/stdout"),
            404,
        ),
    ] {
        for endpoint in ["read", "browse", "download"] {
            let (got, body) = get(
                agent,
                &format!("/files/{endpoint}?path={}&offset=0", query(&path)),
            );
            assert_eq!(got, status, "{endpoint} {path}: {body}");
            assert!(!body.contains("root:"), "{body}");
        }
    }

    // The master redirects to the agent that holds the sandbox.
    let master = cluster.master.addr;
    let (status, body) = get(
        master,
        &format!(
            "/files/read?path={}&offset=0",
            query(&format!("{latest}/stdout"))
        ),
    );
    assert_eq!(status, 307, "{body}");
    assert!(body.contains(&agent.to_string()), "{body}");
    let (status, body) = get(
        master,
        &format!(
            "/files/read?path={}",
            query("/frameworks/nobody/executors/none/runs/latest/stdout")
        ),
    );
    assert_eq!(status, 404, "{body}");
    assert!(body.contains("no known agent"), "{body}");
    assert_eq!(get(master, "/files/read?path=%2Fetc%2Fpasswd").0, 404);
    // A real client follows it.
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    // reqwest's TLS is built without a provider (the workspace's rustls
    // uses ring): installed, though these requests are plain HTTP.
    let _ = agora_net::tls::rustls::crypto::ring::default_provider().install_default();
    let followed = runtime.block_on(async {
        let client = reqwest::Client::new();
        let url = format!("http://{master}/files/read");
        let response = client
            .get(&url)
            .query(&[("path", format!("{dir}/stdout")), ("offset", "0".into())])
            .send()
            .await
            .expect("reqwest");
        assert_eq!(response.status(), 200);
        assert_eq!(
            response.url().port(),
            Some(agent.port()),
            "{}",
            response.url()
        );
        let read: serde_json::Value =
            serde_json::from_str(&response.text().await.unwrap()).unwrap();
        let download = client
            .get(format!("http://{master}/files/download"))
            .query(&[("path", format!("{latest}/sub/data"))])
            .send()
            .await
            .expect("reqwest download");
        (read, download.bytes().await.unwrap().to_vec())
    });
    assert_eq!(
        followed,
        (
            serde_json::json!({"data": "hello sandbox\n", "offset": 0}),
            b"0123456789".to_vec()
        )
    );
    // And so does Python's `requests`, as Mesos's tools read sandboxes.
    if let Some(python) = support::mesos::python() {
        let script = r#"
import json, sys, requests
master, path = sys.argv[1], sys.argv[2]
r = requests.get("http://%s/files/read" % master, params={"path": path, "offset": 0, "length": 5})
r.raise_for_status()
listing = requests.get("http://%s/files/browse" % master, params={"path": path.rsplit("/", 1)[0]}).json()
print(json.dumps({"read": r.json(), "history": [h.status_code for h in r.history],
                  "names": sorted(e["path"].rsplit("/", 1)[1] for e in listing)}))
"#;
        let out = std::process::Command::new(python)
            .args([
                "-c",
                script,
                &master.to_string(),
                &format!("{latest}/stdout"),
            ])
            .output()
            .expect("python");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let seen: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(
            seen["read"],
            serde_json::json!({"data": "hello", "offset": 0})
        );
        assert_eq!(seen["history"], serde_json::json!([307]));
        assert!(
            seen["names"]
                .as_array()
                .unwrap()
                .iter()
                .any(|n| n == "stdout"),
            "{seen}"
        );
    }
    let _ = driver.stop(false);
}

#[test]
fn files_api_needs_credentials_with_authenticate_http() {
    let secrets = tempfile::tempdir().unwrap();
    let credentials = secrets.path().join("credentials");
    std::fs::write(&credentials, "ops o-secret\n").unwrap();
    let credentials = credentials.display().to_string();
    let flags = ["--credentials", credentials.as_str(), "--authenticate-http"];
    let cluster = TestCluster::start_as(
        1,
        "cpus:2;mem:1024",
        &flags,
        &flags,
        Some("Bearer o-secret".into()),
    );
    let path = "/files/read?path=%2Fframeworks%2Ff%2Fexecutors%2Fe%2Fruns%2Flatest%2Fstdout";
    for (who, addr) in [
        ("master", cluster.master.addr),
        ("agent", cluster.agents[0].addr),
    ] {
        for endpoint in [
            path.to_string(),
            path.replace("read", "browse"),
            path.replace("read", "download"),
            "/files/debug".to_string(),
        ] {
            let (status, body) = get(addr, &endpoint);
            assert_eq!(status, 401, "{who} {endpoint}: {body}");
            let response = agora_client::blocking::request(
                hyper::Method::GET,
                addr,
                &endpoint,
                &[("authorization", "Bearer o-secret")],
                None,
            )
            .expect("authenticated GET");
            assert_ne!(response.status, 401, "{who} {endpoint}");
        }
    }
}

#[test]
fn ended_sandboxes_are_collected_after_gc_delay_and_live_ones_kept() {
    let flags = ["--gc-delay", "4s", "--disk-check-interval", "1s"];
    let cluster = TestCluster::start_full(1, "cpus:2;mem:1024", &[], &flags);
    let mut cluster = cluster;
    let mut info = FrameworkInfo::new("gc");
    info.checkpoint = true;
    let (driver, _events, _fid) = launch_all(
        &cluster,
        info,
        &[
            // (Long enough to be seen in the agent's /state, which lists
            // only executors that have not ended.)
            ("quick", "sleep 3; echo done"),
            ("long", "sleep 300"),
            ("later", "sleep 4"),
        ],
    );
    let quick = directory_of(&cluster, "quick");
    let long = directory_of(&cluster, "long");
    let later = directory_of(&cluster, "later");
    // (Its terminal update may have gone by while the others started:
    // the sandbox is watched instead.)
    // Removed within the delay (shortened by what the disk holds) plus
    // a few sweeps; the running task's sandbox stays.
    support::wait_until(
        Duration::from_secs(20),
        "the ended run's sandbox to be collected",
        || cluster.logs(),
        || (!Path::new(&quick).exists()).then_some(()),
    );
    assert!(Path::new(&long).is_dir(), "{}", cluster.logs());
    // The executor's directory goes with its only run (removed after
    // the run's, by the same sweep or the next).
    let executor_dir = Path::new(&quick).parent().unwrap().parent().unwrap();
    support::wait_until(
        Duration::from_secs(10),
        "the ended executor's directory to be collected",
        || cluster.logs(),
        || (!executor_dir.exists()).then_some(()),
    );

    // An ended run is checkpointed; a restarted agent collects it.
    let checkpoint = cluster.agents[0].work_dir.join("meta").join("gc.json");
    support::wait_until(
        Duration::from_secs(10),
        "the ended run in the collector's checkpoint",
        || cluster.logs(),
        || {
            let text = std::fs::read_to_string(&checkpoint).ok()?;
            text.contains(&later).then_some(())
        },
    );
    cluster.agents[0].restart();
    support::wait_until(
        Duration::from_secs(30),
        "the restarted agent to collect the ended run",
        || cluster.logs(),
        || (!Path::new(&later).exists()).then_some(()),
    );
    // The recovered running task's sandbox is still there.
    assert!(Path::new(&long).is_dir(), "{}", cluster.logs());
    let _ = driver.stop(false);
}

/// Pids of the running `agora-logrotate-logger` processes writing under
/// `dir`.
fn loggers_under(dir: &str) -> Vec<i32> {
    let mut pids = Vec::new();
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let Ok(cmdline) = std::fs::read(entry.path().join("cmdline")) else {
            continue;
        };
        let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
        let zombie = std::fs::read_to_string(entry.path().join("stat"))
            .is_ok_and(|s| s.split(") ").nth(1).is_some_and(|r| r.starts_with('Z')));
        if cmdline.contains("agora-logrotate-logger") && cmdline.contains(dir) && !zombie {
            pids.push(pid);
        }
    }
    pids
}

#[test]
fn a_task_printing_forever_stays_under_the_logrotate_cap() {
    const MAX: u64 = 64 * 1024;
    let flags = [
        "--container-logger",
        "logrotate",
        "--logrotate-max-stdout-size",
        "64KB",
        "--logrotate-max-stderr-size",
        "64KB",
        "--logrotate-max-files",
        "2",
    ];
    let cluster = TestCluster::start_full(1, "cpus:2;mem:1024", &[], &flags);
    let (driver, events, _fid) = launch(
        &cluster,
        "chatty",
        "chatty",
        "i=0; while true; do i=$((i+1)); echo \"line $i of a task that never stops\"; \
         echo \"err $i\" >&2; done",
    );
    let dir = directory_of(&cluster, "chatty");
    let file = |name: &str| Path::new(&dir).join(name);
    let size = |name: &str| std::fs::metadata(file(name)).map(|m| m.len()).ok();
    support::wait_until(
        Duration::from_secs(30),
        "stdout and stderr to be rotated twice",
        || cluster.logs(),
        || (size("stdout.2").is_some() && size("stderr.2").is_some()).then_some(()),
    );
    // Go on printing a while: the cap holds whatever it prints.
    let mut last_line = 0u64;
    for _ in 0..6 {
        std::thread::sleep(Duration::from_millis(500));
        for stream in ["stdout", "stderr"] {
            assert!(
                size(stream).unwrap_or(0) <= MAX,
                "{stream}: {:?}",
                size(stream)
            );
            // (A file may be missing for the instant of a rotation,
            // whose renames shift each suffix up before the oldest goes.)
            for n in 1..=2 {
                let rotated = format!("{stream}.{n}");
                assert!(size(&rotated).is_none_or(|s| s <= MAX), "{rotated}");
            }
            let third = format!("{stream}.3");
            let kept = (0..20).all(|_| {
                let there = size(&third).is_some();
                if there {
                    std::thread::sleep(Duration::from_millis(50));
                }
                there
            });
            assert!(!kept, "only 2 rotated files, yet {third} stays");
        }
        // The output goes on (the logger keeps up): the newest line number grows.
        let newest = ["stdout", "stdout.1", "stdout.2"]
            .iter()
            .filter_map(|name| std::fs::read_to_string(file(name)).ok())
            .flat_map(|text| {
                text.lines()
                    .filter_map(|l| l.split(' ').nth(1)?.parse::<u64>().ok())
                    .collect::<Vec<_>>()
            })
            .max()
            .unwrap_or(0);
        assert!(newest >= last_line, "{newest} < {last_line}");
        last_line = newest;
    }
    assert!(last_line > 1000, "the task printed {last_line} lines");
    let total: u64 = std::fs::read_dir(&dir)
        .unwrap()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with("std"))
        .map(|e| e.metadata().unwrap().len())
        .sum();
    assert!(total <= 6 * MAX, "{total} bytes of output kept");
    // The files API lists the rotated files.
    let listing = get_json(
        cluster.agents[0].addr,
        &format!("/files/browse?path={}", query(&dir)),
    );
    assert!(
        listing
            .as_array()
            .unwrap()
            .iter()
            .any(|e| e["path"] == format!("{dir}/stdout.1")),
        "{listing}"
    );
    // The loggers end with the task.
    assert_eq!(loggers_under(&dir).len(), 2, "a logger per stream");
    driver
        .kill_task(&agora_proto::TaskId::new("chatty"))
        .unwrap();
    assert_eq!(terminal(&events, "chatty"), TaskState::Killed);
    support::wait_until(
        Duration::from_secs(10),
        "the loggers to end with the task",
        || cluster.logs(),
        || loggers_under(&dir).is_empty().then_some(()),
    );
    // `agora task log --follow` reads the current file and ends with the task.
    let (ok, out, err) = cluster.run_bin(
        "agora",
        &[
            "--master",
            &cluster.master_address(),
            "task",
            "log",
            "--follow",
            "chatty",
        ],
        Duration::from_secs(30),
    );
    assert!(ok, "{out}\n{err}");
    assert!(out.contains("of a task that never stops"), "{out}");
    let _ = driver.stop(false);
}
