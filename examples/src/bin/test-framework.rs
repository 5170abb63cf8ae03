//! `test-framework`: a framework with its own executor (`test-executor`),
//! as in Mesos's examples. It launches `--tasks` tasks on the custom
//! executor, pings each running task with a framework message, counts the
//! executor's pongs, and exits 0 once every task finished.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use agora_examples::cli::{init_logging, parse_duration};
use agora_proto::{
    AgentId, Bytes, CommandInfo, ExecutorId, ExecutorInfo, Filters, FrameworkId, FrameworkInfo,
    MasterInfo, Offer, Resources, TaskId, TaskInfo, TaskState, TaskStatus,
};
use agora_scheduler::{DriverConfig, Scheduler, SchedulerDriver};
use clap::Parser;

/// A framework that runs tasks on its own executor.
#[derive(Parser, Debug, Clone)]
#[command(name = "test-framework", version)]
struct Args {
    /// Master address, HOST:PORT.
    #[arg(long)]
    master: String,
    /// Number of tasks.
    #[arg(long, default_value_t = 5)]
    tasks: usize,
    /// Path of the executor binary (default: `test-executor` next to this binary).
    #[arg(long)]
    executor: Option<PathBuf>,
    /// Resources of each task.
    #[arg(long, default_value = "cpus:0.1;mem:32", value_parser = Resources::parse)]
    task_resources: Resources,
    /// Resources of the executor itself.
    #[arg(long, default_value = "cpus:0.1;mem:32", value_parser = Resources::parse)]
    executor_resources: Resources,
    /// Give up after this long.
    #[arg(long, default_value = "2m", value_parser = parse_duration)]
    timeout: Duration,
}

#[derive(Default)]
struct Progress {
    next: usize,
    finished: BTreeSet<TaskId>,
    failed: BTreeMap<TaskId, TaskState>,
    pongs: BTreeSet<String>,
    error: Option<String>,
}

struct TestScheduler {
    args: Args,
    executor_path: PathBuf,
    progress: Arc<Mutex<Progress>>,
}

impl TestScheduler {
    fn executor_info(&self) -> ExecutorInfo {
        let path = self.executor_path.display().to_string();
        ExecutorInfo {
            container: None,
            executor_id: ExecutorId::new("test-executor"),
            framework_id: None,
            command: CommandInfo::program(path),
            resources: self.args.executor_resources.clone(),
            name: "Test Executor (Rust)".to_string(),
            source: "test-framework".to_string(),
            api: Default::default(),
            shutdown_grace_period: None,
            data: None,
            labels: Default::default(),
        }
    }
}

impl Scheduler for TestScheduler {
    fn registered(
        &mut self,
        _driver: &SchedulerDriver,
        framework_id: &FrameworkId,
        _master: &MasterInfo,
    ) {
        println!("registered with framework id {framework_id}");
    }

    fn resource_offers(&mut self, driver: &SchedulerDriver, offers: Vec<Offer>) {
        let mut progress = self.progress.lock().expect("progress lock");
        for offer in offers {
            let mut left = offer.resources.clone();
            // The first task on an agent also pays for the executor.
            if !offer
                .executor_ids
                .iter()
                .any(|e| e.as_str() == "test-executor")
            {
                match left.checked_sub(&self.args.executor_resources) {
                    Ok(rest) => left = rest,
                    Err(_) => {
                        let _ = driver.decline_offer(&offer.id, Filters::default());
                        continue;
                    }
                }
            }
            let mut tasks = Vec::new();
            while progress.next < self.args.tasks {
                let Ok(rest) = left.checked_sub(&self.args.task_resources) else {
                    break;
                };
                left = rest;
                let id = progress.next;
                progress.next += 1;
                println!("launching task {id} on agent {}", offer.agent_id);
                tasks.push(TaskInfo {
                    container: None,
                    allocation_role: None,
                    launch_stamp: None,
                    name: format!("task {id}"),
                    task_id: TaskId::new(format!("task-{id}")),
                    agent_id: offer.agent_id.clone(),
                    resources: self.args.task_resources.clone(),
                    executor: Some(self.executor_info()),
                    command: None,
                    data: Some(Bytes::from(format!("payload of task {id}").as_str())),
                    kill_grace_period: None,
                    labels: BTreeMap::new(),
                    task_group: None,
                });
            }
            if tasks.is_empty() {
                let _ = driver.decline_offer(&offer.id, Filters::default());
            } else {
                let _ =
                    driver.launch_tasks(std::slice::from_ref(&offer.id), tasks, Filters::default());
            }
        }
    }

    fn status_update(&mut self, driver: &SchedulerDriver, status: &TaskStatus) {
        println!(
            "task {} is in state {}{}",
            status.task_id,
            status.state,
            status
                .message
                .as_deref()
                .map(|m| format!(" ({m})"))
                .unwrap_or_default()
        );
        let mut progress = self.progress.lock().expect("progress lock");
        match status.state {
            TaskState::Running => {
                if let (Some(executor_id), Some(agent_id)) = (&status.executor_id, &status.agent_id)
                {
                    let ping = format!("ping {}", status.task_id);
                    let _ = driver.send_framework_message(executor_id, agent_id, ping.into_bytes());
                }
            }
            TaskState::Finished => {
                progress.finished.insert(status.task_id.clone());
            }
            state if state.is_terminal() => {
                progress.failed.insert(status.task_id.clone(), state);
            }
            _ => {}
        }
        if progress.finished.len() + progress.failed.len() == self.args.tasks {
            let _ = driver.stop(false);
        }
    }

    fn framework_message(
        &mut self,
        _driver: &SchedulerDriver,
        executor_id: &ExecutorId,
        agent_id: &AgentId,
        data: &[u8],
    ) {
        let text = String::from_utf8_lossy(data).into_owned();
        println!("message from executor {executor_id} on {agent_id}: {text}");
        self.progress
            .lock()
            .expect("progress lock")
            .pongs
            .insert(text);
    }

    fn error(&mut self, _driver: &SchedulerDriver, message: &str) {
        eprintln!("framework error: {message}");
        self.progress.lock().expect("progress lock").error = Some(message.to_string());
    }
}

#[tokio::main]
async fn main() -> ExitCode {
    let args = Args::parse();
    init_logging(false);
    let executor_path = match &args.executor {
        Some(path) => path.clone(),
        None => match std::env::current_exe() {
            Ok(exe) => exe.with_file_name("test-executor"),
            Err(e) => {
                eprintln!("test-framework: cannot locate test-executor: {e}");
                return ExitCode::FAILURE;
            }
        },
    };
    if !executor_path.is_file() {
        eprintln!(
            "test-framework: executor {} does not exist (build it, or pass --executor)",
            executor_path.display()
        );
        return ExitCode::FAILURE;
    }
    let progress = Arc::new(Mutex::new(Progress::default()));
    let mut framework = FrameworkInfo::new("Test Framework (Rust)");
    framework.user = std::env::var("USER").unwrap_or_default();
    let scheduler = TestScheduler {
        args: args.clone(),
        executor_path,
        progress: progress.clone(),
    };
    let driver = SchedulerDriver::new(scheduler, framework, DriverConfig::new(args.master.clone()));
    if let Err(e) = driver.start() {
        eprintln!("test-framework: {e}");
        return ExitCode::FAILURE;
    }
    if tokio::time::timeout(args.timeout, driver.join_async())
        .await
        .is_err()
    {
        let _ = driver.stop(false);
        eprintln!("test-framework: timed out after {:?}", args.timeout);
        return ExitCode::FAILURE;
    }
    let progress = progress.lock().expect("progress lock");
    println!(
        "finished {}/{} tasks, {} failed, {} pongs",
        progress.finished.len(),
        args.tasks,
        progress.failed.len(),
        progress.pongs.len()
    );
    if progress.error.is_none() && progress.finished.len() == args.tasks {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}
