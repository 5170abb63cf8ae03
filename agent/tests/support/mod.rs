//! Test fixtures: a fake master speaking the agent channel, a fake executor
//! client speaking the executor channel, and an in-process agent.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::time::Duration;

use agora_proto::agent::{Call as AgentCall, Event as AgentEvent};
use agora_proto::executor::{Call as ExecCall, Event as ExecEvent};
use agora_proto::{
    AgentId, CommandInfo, FrameworkId, FrameworkInfo, MasterInfo, Resources, TaskId, TaskInfo,
};
use futures::{SinkExt, StreamExt};
use tokio::net::{TcpListener, TcpStream};
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::{MaybeTlsStream, WebSocketStream};

pub const WAIT: Duration = Duration::from_secs(10);

pub struct FakeMaster {
    pub listener: TcpListener,
}

pub struct MasterConn {
    ws: WebSocketStream<TcpStream>,
}

pub struct Agent {
    pub addr: std::net::SocketAddr,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    handle: tokio::task::JoinHandle<Result<(), agora_agent::AgentError>>,
}

pub struct ExecClient {
    ws: WebSocketStream<MaybeTlsStream<TcpStream>>,
}

impl FakeMaster {
    pub async fn bind() -> Self {
        FakeMaster {
            listener: TcpListener::bind("127.0.0.1:0").await.unwrap(),
        }
    }

    pub fn addr(&self) -> String {
        self.listener.local_addr().unwrap().to_string()
    }

    pub async fn accept(&self) -> MasterConn {
        let (stream, _) = tokio::time::timeout(WAIT, self.listener.accept())
            .await
            .expect("agent never connected")
            .unwrap();
        MasterConn {
            ws: tokio_tungstenite::accept_async(stream).await.unwrap(),
        }
    }
}

impl MasterConn {
    pub async fn send(&mut self, event: &AgentEvent) {
        self.ws
            .send(Message::text(agora_proto::encode(event)))
            .await
            .unwrap();
    }

    /// The next call, PONGs included.
    pub async fn recv_any(&mut self) -> AgentCall {
        loop {
            let frame = tokio::time::timeout(WAIT, self.ws.next())
                .await
                .expect("no call from agent")
                .expect("agent closed the connection")
                .unwrap();
            if let Message::Text(text) = frame {
                return agora_proto::decode(text.as_str()).unwrap();
            }
        }
    }

    /// The next call other than PONG.
    pub async fn recv(&mut self) -> AgentCall {
        loop {
            match self.recv_any().await {
                AgentCall::Pong => continue,
                call => return call,
            }
        }
    }

    /// Answers the REGISTER that must come first; returns it.
    pub async fn register(&mut self, agent_id: &str) -> AgentCall {
        let call = self.recv().await;
        assert!(matches!(call, AgentCall::Register { .. }), "{call:?}");
        self.send(&AgentEvent::Registered {
            agent_id: AgentId::new(agent_id),
            ping_interval_seconds: 1.0,
            master_info: MasterInfo {
                id: "m".into(),
                address: "127.0.0.1:0".into(),
                version: "test".into(),
            },
            reregistered: false,
        })
        .await;
        call
    }

    /// Receives a STATUS_UPDATE and acknowledges it.
    pub async fn recv_update(&mut self, ack: bool) -> (FrameworkId, agora_proto::TaskStatus) {
        match self.recv().await {
            AgentCall::StatusUpdate {
                framework_id,
                status,
            } => {
                if ack {
                    self.send(&AgentEvent::Acknowledge {
                        framework_id: framework_id.clone(),
                        task_id: status.task_id.clone(),
                        uuid: status.uuid.clone().expect("reliable update has uuid"),
                    })
                    .await;
                }
                (framework_id, status)
            }
            other => panic!("expected STATUS_UPDATE, got {other:?}"),
        }
    }
}

impl Agent {
    pub async fn start(config: agora_agent::Config) -> Agent {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (tx, rx) = tokio::sync::oneshot::channel();
        let handle = tokio::spawn(agora_agent::run(listener, config, async move {
            let _ = rx.await;
        }));
        Agent {
            addr,
            stop: Some(tx),
            handle,
        }
    }

    pub async fn stop(mut self) {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
        tokio::time::timeout(Duration::from_secs(30), self.handle)
            .await
            .expect("agent did not stop")
            .unwrap()
            .unwrap();
    }

    /// `/state` once `ready` holds for it (it is a snapshot, rebuilt at
    /// most every 100 ms); panics after a while.
    pub async fn state_when(
        &self,
        ready: impl Fn(&serde_json::Value) -> bool,
    ) -> serde_json::Value {
        let mut state = serde_json::Value::Null;
        for _ in 0..200 {
            let (status, body) = self.get("/state").await;
            if status == 200 {
                state = serde_json::from_str(&body).expect("/state is JSON");
                if ready(&state) {
                    return state;
                }
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
        panic!("/state never got there: {state}");
    }

    pub async fn get(&self, path: &str) -> (u16, String) {
        let response = agora_client::AgentClient::new(self.addr)
            .get(path)
            .await
            .unwrap();
        (response.status, response.text())
    }
}

impl ExecClient {
    pub async fn connect(endpoint: &str) -> ExecClient {
        let (ws, _) = tokio_tungstenite::connect_async(endpoint).await.unwrap();
        ExecClient { ws }
    }

    pub async fn send(&mut self, call: &ExecCall) {
        self.ws
            .send(Message::text(agora_proto::encode(call)))
            .await
            .unwrap();
    }

    pub async fn send_raw(&mut self, msg: Message) {
        self.ws.send(msg).await.unwrap();
    }

    pub async fn recv(&mut self) -> ExecEvent {
        loop {
            let frame = tokio::time::timeout(WAIT, self.ws.next())
                .await
                .expect("no event from agent")
                .expect("agent closed the executor connection")
                .unwrap();
            if let Message::Text(text) = frame {
                return agora_proto::decode(text.as_str()).unwrap();
            }
        }
    }

    /// The next frame, raw (to observe close frames).
    pub async fn next_raw(&mut self) -> Option<Message> {
        tokio::time::timeout(WAIT, self.ws.next())
            .await
            .expect("no frame")
            .and_then(|r| r.ok())
    }
}

/// A shell script that dumps its environment into `env.txt` in its cwd,
/// with the secrets the agent handed it on a descriptor (see
/// `AGORA_EXECUTOR_SECRETS_FD`), and sleeps: stands in for the command
/// executor.
pub fn sleeper_script(dir: &Path) -> PathBuf {
    let path = dir.join("fake-executor.sh");
    std::fs::write(
        &path,
        "#!/bin/sh\nenv > env.tmp\n\
         if [ -n \"$AGORA_EXECUTOR_SECRETS_FD\" ]; then cat <&3 >> env.tmp; exec 3<&-; fi\n\
         mv env.tmp env.txt\necho started\nexec sleep 60\n",
    )
    .unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    path
}

pub fn config(master: &str, work_dir: &Path, script: &Path) -> agora_agent::Config {
    let mut c = agora_agent::Config::new(master, work_dir.to_path_buf());
    c.resources = Resources::parse("cpus:2;mem:1024").unwrap();
    c.hostname = "test-host".into();
    c.command_executor = vec![script.to_string_lossy().into_owned()];
    c.executor_shutdown_grace_period = Duration::from_millis(500);
    c.status_update_retry_min = Duration::from_secs(30);
    c.reconnect_backoff_max = Duration::from_millis(200);
    // Tasks run as whoever runs the tests (root under CI).
    c.users = agora_agent::UserPolicy::agent_user();
    c
}

pub fn framework(id: &str, checkpoint: bool) -> FrameworkInfo {
    let mut f = FrameworkInfo::new("test-framework");
    f.id = Some(FrameworkId::new(id));
    f.checkpoint = checkpoint;
    f
}

pub fn command_task(id: &str) -> TaskInfo {
    TaskInfo {
        container: None,
        allocation_role: None,
        launch_stamp: None,
        name: format!("task {id}"),
        task_id: TaskId::new(id),
        agent_id: AgentId::new("agent-1"),
        resources: Resources::parse("cpus:0.5;mem:64").unwrap(),
        executor: None,
        command: Some(CommandInfo {
            value: "sleep 100".into(),
            shell: true,
            arguments: vec![],
            environment: [("TASK_VAR".to_string(), "task-value".to_string())].into(),
            uris: Vec::new(),
        }),
        data: None,
        kill_grace_period: None,
        labels: Default::default(),
        task_group: None,
    }
}

/// Waits for the fake executor's `env.txt` under the executor's runs dir
/// and returns it parsed, with the sandbox path.
pub async fn executor_env(
    work_dir: &Path,
    fid: &str,
    eid: &str,
) -> (PathBuf, std::collections::HashMap<String, String>) {
    wait_env(work_dir, fid, |name| name == eid).await
}

/// Like [`executor_env`], for the (only) command executor of `fid`, which
/// runs its command tasks (`~command-…`).
pub async fn command_executor_env(
    work_dir: &Path,
    fid: &str,
) -> (PathBuf, std::collections::HashMap<String, String>) {
    wait_env(work_dir, fid, |name| name.starts_with('~')).await
}

async fn wait_env(
    work_dir: &Path,
    fid: &str,
    executor: impl Fn(&str) -> bool,
) -> (PathBuf, std::collections::HashMap<String, String>) {
    let executors = work_dir.join("frameworks").join(fid).join("executors");
    for _ in 0..400 {
        for dir in std::fs::read_dir(&executors)
            .into_iter()
            .flatten()
            .flatten()
        {
            if !executor(&dir.file_name().to_string_lossy()) {
                continue;
            }
            for entry in std::fs::read_dir(dir.path().join("runs"))
                .into_iter()
                .flatten()
                .flatten()
            {
                let file = entry.path().join("env.txt");
                if let Ok(text) = std::fs::read_to_string(&file) {
                    let env = text
                        .lines()
                        .filter_map(|l| l.split_once('='))
                        .map(|(k, v)| (k.to_string(), v.to_string()))
                        .collect();
                    return (entry.path(), env);
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    panic!("no executor wrote env.txt under {}", executors.display());
}

pub fn subscribe(
    env: &std::collections::HashMap<String, String>,
    updates: Vec<agora_proto::TaskStatus>,
    tasks: Vec<TaskInfo>,
) -> ExecCall {
    ExecCall::Subscribe {
        protocol: agora_proto::PROTOCOL_VERSION,
        framework_id: FrameworkId::new(env["AGORA_FRAMEWORK_ID"].clone()),
        executor_id: agora_proto::ExecutorId::new(env["AGORA_EXECUTOR_ID"].clone()),
        token: env["AGORA_EXECUTOR_TOKEN"].clone(),
        unacknowledged_updates: updates,
        unacknowledged_tasks: tasks,
    }
}

pub fn executor_status(task: &str, state: agora_proto::TaskState) -> agora_proto::TaskStatus {
    agora_proto::TaskStatus::new(
        TaskId::new(task),
        state,
        agora_proto::Source::SourceExecutor,
    )
    .with_new_uuid()
}
