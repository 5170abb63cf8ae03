//! Agents on real hosts: a master and two agents, each in a network
//! namespace of its own on a private bridge (each its own address, as on
//! three machines). The agents listen on the wildcard address and
//! advertise the address their connection to the master comes from, so
//! the CLI in the root namespace reads a task's sandbox output from the
//! agent that ran it. (Before, such an agent advertised its host name,
//! which resolved to 127.0.0.1 where the CLI ran: `agora task log` failed
//! with "connection refused".)
//!
//! Needs root and `ip` (iproute2); skipped with the reason printed where
//! namespaces cannot be made, and failing under `CI=true` (CI runs as
//! root).

mod support;

use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use agora_proto::{CommandInfo, Filters, FrameworkInfo, TaskId, TaskInfo, TaskState};
use support::*;

/// The bridge, the namespaces on it and their addresses; removed on drop.
struct Net {
    ip: PathBuf,
    bridge: String,
    namespaces: Vec<String>,
    /// `10.213.N`: the root namespace is `.1`, namespace `i` is `.(i + 2)`.
    prefix: String,
}

impl Net {
    /// Makes `count` namespaces on a new bridge, or says why it cannot.
    fn create(count: usize) -> Result<Net, String> {
        if !nix::unistd::geteuid().is_root() {
            return Err("not root".into());
        }
        let ip = ["/usr/sbin/ip", "/sbin/ip", "/usr/bin/ip", "/bin/ip"]
            .iter()
            .map(PathBuf::from)
            .find(|p| p.is_file())
            .ok_or("no `ip` command (iproute2)")?;
        let id = std::process::id() % 100_000;
        let mut net = Net {
            ip,
            bridge: format!("agbr{id}"),
            namespaces: Vec::new(),
            prefix: format!("10.213.{}", 20 + id % 200),
        };
        net.run(&["link", "add", &net.bridge.clone(), "type", "bridge"])?;
        net.run(&[
            "addr",
            "add",
            &format!("{}.1/24", net.prefix),
            "dev",
            &net.bridge.clone(),
        ])?;
        net.run(&["link", "set", &net.bridge.clone(), "up"])?;
        for i in 0..count {
            let ns = format!("agns{id}-{i}");
            let (host_end, ns_end) = (format!("agv{id}h{i}"), format!("agv{id}n{i}"));
            net.run(&["netns", "add", &ns])?;
            net.namespaces.push(ns.clone());
            net.run(&[
                "link", "add", &host_end, "type", "veth", "peer", "name", &ns_end,
            ])?;
            net.run(&["link", "set", &host_end, "master", &net.bridge.clone()])?;
            net.run(&["link", "set", &host_end, "up"])?;
            net.run(&["link", "set", &ns_end, "netns", &ns])?;
            let addr = format!("{}/24", net.addr(i));
            net.run(&[
                "netns", "exec", &ns, "ip", "addr", "add", &addr, "dev", &ns_end,
            ])?;
            net.run(&["netns", "exec", &ns, "ip", "link", "set", &ns_end, "up"])?;
            net.run(&["netns", "exec", &ns, "ip", "link", "set", "lo", "up"])?;
        }
        Ok(net)
    }

    fn run(&self, args: &[&str]) -> Result<(), String> {
        let out = Command::new(&self.ip)
            .args(args)
            .output()
            .map_err(|e| format!("ip {}: {e}", args.join(" ")))?;
        if out.status.success() {
            Ok(())
        } else {
            Err(format!(
                "ip {}: {}",
                args.join(" "),
                String::from_utf8_lossy(&out.stderr).trim()
            ))
        }
    }

    /// The address of namespace `i`.
    fn addr(&self, i: usize) -> Ipv4Addr {
        format!("{}.{}", self.prefix, i + 2)
            .parse()
            .expect("address")
    }

    /// Starts `program args…` in namespace `i` (it must print its address).
    fn spawn(&self, i: usize, name: &str, program: &Path, args: &[String], dir: &Path) -> Proc {
        let mut all = vec![
            "netns".to_string(),
            "exec".to_string(),
            self.namespaces[i].clone(),
            program.display().to_string(),
        ];
        all.extend(args.iter().cloned());
        std::fs::create_dir_all(dir).expect("work dir");
        Proc::spawn(name, &self.ip, &all, dir, &dir.join("log"))
    }
}

impl Drop for Net {
    fn drop(&mut self) {
        for ns in &self.namespaces {
            let _ = self.run(&["netns", "del", ns]);
        }
        // Deleting the bridge takes the host ends of the veth pairs with it
        // once their namespaces are gone.
        let _ = self.run(&["link", "del", &self.bridge.clone()]);
    }
}

#[test]
fn agents_in_their_own_namespaces_are_reached_at_their_own_addresses() {
    let net = match Net::create(3) {
        Ok(net) => net,
        Err(reason) => {
            assert!(
                std::env::var("CI").as_deref() != Ok("true"),
                "network namespaces are needed under CI: {reason}"
            );
            eprintln!("skipped: cannot make network namespaces here: {reason}");
            return;
        }
    };
    let dir = tempfile::Builder::new()
        .prefix("agora-netns-")
        .tempdir()
        .expect("temp dir");
    let master_ip = net.addr(0);
    let master = net.spawn(
        0,
        "master",
        &bin("agora-master"),
        &[
            "--listen".into(),
            format!("{master_ip}:5050"),
            "--work-dir".into(),
            dir.path().join("master").display().to_string(),
        ],
        &dir.path().join("master"),
    );
    let mut agents = Vec::new();
    for (i, name) in [(1, "agent-one"), (2, "agent-two")] {
        let work = dir.path().join(name);
        agents.push(
            net.spawn(
                i,
                name,
                &bin("agora-agent"),
                &[
                    vec![
                        "--master".into(),
                        master.addr.to_string(),
                        "--listen".into(),
                        "0.0.0.0:5051".into(),
                        "--hostname".into(),
                        name.into(),
                        "--work-dir".into(),
                        work.display().to_string(),
                        "--resources".into(),
                        "cpus:2;mem:1024;disk:1024".into(),
                        "--command-executor".into(),
                        bin("agora-command-executor").display().to_string(),
                    ],
                    agora_examples::local::agent_user_flags(),
                ]
                .concat(),
                &work,
            ),
        );
    }
    let logs = || {
        let mut out = format!("--- master ---\n{}\n", master.log_tail());
        for a in &agents {
            out.push_str(&format!("--- {} ---\n{}\n", a.name, a.log_tail()));
        }
        out
    };

    // The master, from the root namespace, lists each agent under its
    // own name at the address its connection came from.
    let deadline = Instant::now() + Duration::from_secs(30);
    let state = loop {
        if let Ok((200, body)) = http_get(master.addr, "/state") {
            let state: serde_json::Value = serde_json::from_str(&body).expect("/state");
            if agora_examples::local::connected_agents(&state) == 2 {
                break state;
            }
        }
        assert!(
            Instant::now() < deadline,
            "agents did not register\n{}",
            logs()
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    let mut agent_ids = std::collections::HashMap::new();
    for agent in state["agents"].as_array().expect("agents") {
        let hostname = agent["hostname"].as_str().expect("hostname");
        let expected = match hostname {
            "agent-one" => net.addr(1),
            "agent-two" => net.addr(2),
            other => panic!("unexpected agent {other}"),
        };
        assert_eq!(
            agent["address"].as_str(),
            Some(SocketAddr::from((expected, 5051)).to_string().as_str()),
            "{agent}"
        );
        agent_ids.insert(
            hostname.to_string(),
            agent["id"].as_str().unwrap().to_string(),
        );
    }

    // A job from the root namespace: a task that prints and ends on agent
    // one, and one that runs until it is killed on agent two.
    let (driver, rx) = start_framework(&master.addr.to_string(), FrameworkInfo::new("netns"));
    let mut launched = 0;
    while launched < 2 {
        let offers = wait_for(&rx, Duration::from_secs(30), |e| match e {
            SchedEvent::Offers(offers) => Some(offers.clone()),
            _ => None,
        });
        for offer in offers {
            let (id, command) = if offer.agent_id.as_str() == agent_ids["agent-one"] {
                ("printer", "echo printed by the task on agent one")
            } else {
                ("sleeper", "sleep 600")
            };
            let task = TaskInfo {
                container: None,
                allocation_role: None,
                launch_stamp: None,
                name: id.into(),
                task_id: TaskId::new(id),
                agent_id: offer.agent_id.clone(),
                resources: agora_proto::Resources::parse("cpus:0.5;mem:64").unwrap(),
                executor: None,
                command: Some(CommandInfo {
                    value: command.into(),
                    shell: true,
                    ..CommandInfo::default()
                }),
                data: None,
                kill_grace_period: Some(1.0),
                labels: Default::default(),
                task_group: None,
            };
            driver
                .launch_tasks(
                    std::slice::from_ref(&offer.id),
                    vec![task],
                    Filters::default(),
                )
                .expect("launch");
            launched += 1;
        }
    }
    let mut states: std::collections::HashMap<String, TaskState> = Default::default();
    let mut killed = false;
    while states.get("printer") != Some(&TaskState::Finished)
        || states.get("sleeper") != Some(&TaskState::Killed)
    {
        let status = wait_for(&rx, Duration::from_secs(30), |e| match e {
            SchedEvent::Update(status) => Some(status.clone()),
            _ => None,
        });
        states.insert(status.task_id.to_string(), status.state);
        if status.task_id.as_str() == "sleeper" && status.state == TaskState::Running && !killed {
            driver.kill_task(&status.task_id).expect("kill");
            killed = true;
        }
        assert!(
            !status.state.is_terminal()
                || matches!(
                    (status.task_id.as_str(), status.state),
                    ("printer", TaskState::Finished) | ("sleeper", TaskState::Killed)
                ),
            "{status:?}\n{}",
            logs()
        );
    }

    // The operator's CLI, in the root namespace, reads the task's output
    // from the agent that ran it.
    // (/state and the task lists follow the master within a publish
    // interval: a task that just ended may not be listed for a moment.)
    let run_log = || {
        Command::new(bin("agora"))
            .args([
                "--master",
                &master.addr.to_string(),
                "task",
                "log",
                "printer",
            ])
            .output()
            .expect("running agora")
    };
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let mut out = run_log();
    while !out.status.success()
        && String::from_utf8_lossy(&out.stderr).contains("no task printer")
        && std::time::Instant::now() < deadline
    {
        std::thread::sleep(Duration::from_millis(100));
        out = run_log();
    }
    assert!(
        out.status.success(),
        "agora log failed: {}\n{}",
        String::from_utf8_lossy(&out.stderr),
        logs()
    );
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("printed by the task on agent one"),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    let _ = driver.stop(false);
    drop(agents);
    drop(master);
    kill_sandboxed_processes(dir.path());
}
