//! The reported outcome is the true one: a task whose executor sent a
//! terminal update ends in that state, however soon the executor exits
//! after sending it and however busy the agents are.
//!
//! Thousands of `hasty-executor` processes (each sends TASK_RUNNING and
//! TASK_FINISHED for its one task and exits the moment they are written,
//! without waiting for acknowledgements) run at once on three agents. Before
//! the agent waited for an exited executor's connection to deliver its last
//! frames, some of these tasks ended TASK_FAILED ("executor exited with
//! status 0").

mod support;

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use agora_proto::{
    CommandInfo, ExecutorId, ExecutorInfo, Filters, FrameworkId, FrameworkInfo, MasterInfo, Offer,
    Resources, TaskId, TaskInfo, TaskState, TaskStatus,
};
use agora_scheduler::{DriverConfig, Scheduler, SchedulerDriver};
use support::*;

const TASKS: usize = 2000;

#[derive(Default)]
struct Outcomes {
    pending: VecDeque<usize>,
    terminal: HashMap<TaskId, Vec<(TaskState, String)>>,
}

struct Hasty {
    executor: String,
    outcomes: Arc<Mutex<Outcomes>>,
}

impl Scheduler for Hasty {
    fn registered(&mut self, _d: &SchedulerDriver, _f: &FrameworkId, _m: &MasterInfo) {}

    fn resource_offers(&mut self, driver: &SchedulerDriver, offers: Vec<Offer>) {
        let task_resources = Resources::parse("cpus:0.05;mem:1").unwrap();
        let executor_resources = Resources::parse("cpus:0.01;mem:1").unwrap();
        let both = &task_resources + &executor_resources;
        let mut outcomes = self.outcomes.lock().unwrap();
        for offer in offers {
            let mut left = offer.resources.clone();
            let mut tasks = Vec::new();
            while let Some(&i) = outcomes.pending.front() {
                let Ok(rest) = left.checked_sub(&both) else {
                    break;
                };
                left = rest;
                outcomes.pending.pop_front();
                let id = format!("hasty-{i}");
                tasks.push(TaskInfo {
                    container: None,
                    allocation_role: None,
                    launch_stamp: None,
                    name: id.clone(),
                    task_id: TaskId::new(&id),
                    agent_id: offer.agent_id.clone(),
                    resources: task_resources.clone(),
                    executor: Some(ExecutorInfo {
                        container: None,
                        executor_id: ExecutorId::new(&id),
                        framework_id: None,
                        command: CommandInfo::program(self.executor.clone()),
                        resources: executor_resources.clone(),
                        name: "hasty".into(),
                        source: "true_outcomes".into(),
                        api: Default::default(),
                        shutdown_grace_period: None,
                        data: None,
                        labels: Default::default(),
                    }),
                    command: None,
                    data: None,
                    kill_grace_period: None,
                    labels: BTreeMap::new(),
                    task_group: None,
                });
            }
            let refuse = Filters {
                refuse_seconds: Some(0.1),
            };
            if tasks.is_empty() {
                let _ = driver.decline_offer(&offer.id, refuse);
            } else {
                let _ = driver.launch_tasks(std::slice::from_ref(&offer.id), tasks, refuse);
            }
        }
    }

    fn status_update(&mut self, _d: &SchedulerDriver, status: &TaskStatus) {
        if status.state.is_terminal() {
            self.outcomes
                .lock()
                .unwrap()
                .terminal
                .entry(status.task_id.clone())
                .or_default()
                .push((status.state, status.message.clone().unwrap_or_default()));
        }
    }
}

#[test]
fn thousands_of_executors_exiting_right_after_their_terminal_update_finish() {
    let cluster = TestCluster::start(3, "cpus:32;mem:65536;disk:1024");
    let outcomes = Arc::new(Mutex::new(Outcomes {
        pending: (0..TASKS).collect(),
        ..Outcomes::default()
    }));
    let scheduler = Hasty {
        executor: bin("hasty-executor").display().to_string(),
        outcomes: outcomes.clone(),
    };
    let driver = SchedulerDriver::new(
        scheduler,
        FrameworkInfo::new("true-outcomes"),
        DriverConfig::new(cluster.master_address()),
    );
    driver.start().expect("driver start");
    let deadline = Instant::now() + Duration::from_secs(300);
    loop {
        let done = outcomes.lock().unwrap().terminal.len();
        if done >= TASKS {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "only {done} of {TASKS} tasks ended within 300 s\n{}",
            cluster.logs()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let _ = driver.stop(false);
    let outcomes = outcomes.lock().unwrap();
    let wrong: Vec<_> = outcomes
        .terminal
        .iter()
        .filter(|(_, states)| states.iter().any(|(s, _)| *s != TaskState::Finished))
        .take(5)
        .collect();
    assert!(
        wrong.is_empty(),
        "tasks whose executor reported TASK_FINISHED ended otherwise: {wrong:?}"
    );
}
