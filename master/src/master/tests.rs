//! The protocol rules, checked against the sans-IO state machine with
//! injected time.

use std::time::Duration;

use agora_proto::agent::{self, ExecutorReport, TaskReport};
use agora_proto::scheduler::{self, Event, ReconcileTask};
use agora_proto::{
    AgentId, AgentInfo, CommandInfo, ExecutorId, ExecutorInfo, Filters, FrameworkId, FrameworkInfo,
    LaunchStamp, MasterInfo, Offer, OfferId, Reason, Resources, Source, TaskId, TaskInfo,
    TaskState, TaskStatus, PROTOCOL_VERSION,
};
use tokio::time::Instant;

use super::*;
use crate::allocator::{AllocatorOptions, DrfAllocator};

const S1: ConnId = 1;
const S2: ConnId = 2;
const A1: ConnId = 101;
const A2: ConnId = 102;

fn r(s: &str) -> Resources {
    Resources::parse(s).unwrap()
}

struct H {
    m: Master,
    now: Instant,
    /// Fed the master's incremental `/state` deltas after every step;
    /// its snapshot must equal one built from scratch.
    builder: crate::state::StateBuilder,
}

impl H {
    fn with(config: Config) -> H {
        let now = Instant::now();
        let alloc = DrfAllocator::new(AllocatorOptions::from(&config));
        let info = MasterInfo {
            id: "m".into(),
            address: "127.0.0.1:5050".into(),
            version: "test".into(),
        };
        H {
            m: Master::new(config, info, Box::new(alloc), now),
            now,
            builder: crate::state::StateBuilder::default(),
        }
    }

    fn new() -> H {
        H::with(Config::default())
    }

    fn sched(&mut self, conn: ConnId, call: scheduler::Call) -> Vec<Output> {
        self.input(Input::Scheduler { conn, call })
    }

    fn agent(&mut self, conn: ConnId, call: agent::Call) -> Vec<Output> {
        self.input(Input::Agent {
            conn,
            call,
            principal: None,
        })
    }

    /// A call from an agent connection authenticated as `principal`.
    fn agent_as(&mut self, conn: ConnId, principal: &str, call: agent::Call) -> Vec<Output> {
        self.input(Input::Agent {
            conn,
            call,
            principal: Some(principal.to_string()),
        })
    }

    fn input(&mut self, input: Input) -> Vec<Output> {
        self.m.handle(self.now, input);
        self.check_snapshot();
        self.m.take_outputs()
    }

    /// The snapshot assembled from incremental deltas equals the one
    /// built from scratch.
    fn check_snapshot(&mut self) {
        self.builder.apply(self.m.state_delta());
        let json = |s: &crate::state::StateSnapshot| {
            let mut v = serde_json::to_value(s).unwrap();
            v.as_object_mut().unwrap().remove("generated_at");
            v
        };
        let built = self.builder.build();
        assert_eq!(json(&built), json(&self.m.snapshot()));
        // The text assembled from the views' texts is serde's.
        assert_eq!(built.json().unwrap(), serde_json::to_vec(&built).unwrap());
    }

    /// Moves time forward, running every timer that falls due on the way.
    fn advance(&mut self, d: Duration) -> Vec<Output> {
        let target = self.now + d;
        loop {
            let next = self.m.next_deadline();
            if next > target {
                break;
            }
            self.now = next.max(self.now);
            self.m.tick(self.now);
            self.check_snapshot();
        }
        self.now = target;
        self.m.take_outputs()
    }

    fn subscribe_info(&mut self, conn: ConnId, info: FrameworkInfo, force: bool) -> Vec<Output> {
        self.sched(
            conn,
            scheduler::Call::Subscribe {
                protocol: PROTOCOL_VERSION,
                framework_info: info,
                force,
            },
        )
    }

    fn subscribe(&mut self, conn: ConnId, name: &str) -> FrameworkId {
        let out = self.subscribe_info(conn, FrameworkInfo::new(name), false);
        match sched_events(&out, conn).first() {
            Some(Event::Subscribed { framework_id, .. }) => framework_id.clone(),
            other => panic!("no SUBSCRIBED: {other:?}"),
        }
    }

    fn register_info(
        &mut self,
        conn: ConnId,
        info: AgentInfo,
        tasks: Vec<TaskReport>,
    ) -> Vec<Output> {
        self.agent(
            conn,
            agent::Call::Register {
                protocol: PROTOCOL_VERSION,
                agent_info: info,
                tasks,
                executors: vec![],
                frameworks: vec![],
            },
        )
    }

    fn register(&mut self, conn: ConnId, resources: &str) -> AgentId {
        let out = self.register_info(conn, agent_info(None, resources), vec![]);
        match agent_events(&out, conn).first() {
            Some(agent::Event::Registered { agent_id, .. }) => agent_id.clone(),
            other => panic!("no REGISTERED: {other:?}"),
        }
    }

    /// Runs the next allocation and returns the offers `conn` received.
    /// The offer of `agent`'s resources among those `conn` gets now.
    fn offer_from(&mut self, conn: ConnId, agent: &AgentId) -> Offer {
        self.offers(conn)
            .into_iter()
            .find(|o| o.agent_id == *agent)
            .expect("an offer from the agent")
    }

    fn offers(&mut self, conn: ConnId) -> Vec<Offer> {
        let out = self.advance(Duration::from_secs(1));
        offers_in(&out, conn)
    }

    fn launch(&mut self, conn: ConnId, offers: &[&Offer], tasks: Vec<TaskInfo>) -> Vec<Output> {
        self.sched(
            conn,
            scheduler::Call::Launch {
                offer_ids: offers.iter().map(|o| o.id.clone()).collect(),
                tasks,
                filters: Filters::default(),
            },
        )
    }

    fn status(
        &mut self,
        conn: ConnId,
        fid: &FrameworkId,
        task: &str,
        state: TaskState,
        uuid: &str,
    ) -> Vec<Output> {
        let mut status = TaskStatus::new(TaskId::new(task), state, Source::SourceExecutor);
        status.uuid = Some(uuid.into());
        self.agent(
            conn,
            agent::Call::StatusUpdate {
                framework_id: fid.clone(),
                status,
            },
        )
    }
}

fn agent_info(id: Option<&AgentId>, resources: &str) -> AgentInfo {
    AgentInfo {
        id: id.cloned(),
        hostname: "host1".into(),
        address: "127.0.0.1:5051".into(),
        resources: r(resources),
        attributes: Default::default(),
    }
}

fn command_task(id: &str, agent: &AgentId, resources: &str) -> TaskInfo {
    TaskInfo {
        container: None,
        allocation_role: None,
        launch_stamp: None,
        name: id.into(),
        task_id: TaskId::new(id),
        agent_id: agent.clone(),
        resources: r(resources),
        executor: None,
        command: Some(CommandInfo {
            value: "true".into(),
            ..Default::default()
        }),
        data: None,
        kill_grace_period: None,
        labels: Default::default(),
        task_group: None,
    }
}

fn executor_task(
    id: &str,
    agent: &AgentId,
    resources: &str,
    exec: &str,
    exec_res: &str,
) -> TaskInfo {
    TaskInfo {
        allocation_role: None,
        launch_stamp: None,
        executor: Some(ExecutorInfo {
            container: None,
            executor_id: ExecutorId::new(exec),
            framework_id: None,
            command: CommandInfo {
                value: "./exec".into(),
                ..Default::default()
            },
            resources: r(exec_res),
            name: String::new(),
            source: String::new(),
            api: Default::default(),
            shutdown_grace_period: None,
            data: None,
            labels: Default::default(),
        }),
        command: None,
        ..command_task(id, agent, resources)
    }
}

fn sched_events(out: &[Output], conn: ConnId) -> Vec<Event> {
    out.iter()
        .filter_map(|o| match o {
            Output::Scheduler { conn: c, event } if *c == conn => Some(event.clone()),
            _ => None,
        })
        .collect()
}

fn agent_events(out: &[Output], conn: ConnId) -> Vec<agent::Event> {
    out.iter()
        .filter_map(|o| match o {
            Output::Agent { conn: c, event } if *c == conn => Some(event.clone()),
            _ => None,
        })
        .collect()
}

fn offers_in(out: &[Output], conn: ConnId) -> Vec<Offer> {
    sched_events(out, conn)
        .into_iter()
        .flat_map(|e| match e {
            Event::Offers { offers } => offers,
            _ => vec![],
        })
        .collect()
}

fn updates(out: &[Output], conn: ConnId) -> Vec<TaskStatus> {
    sched_events(out, conn)
        .into_iter()
        .filter_map(|e| match e {
            Event::Update { status } => Some(status),
            _ => None,
        })
        .collect()
}

fn closed(out: &[Output], conn: ConnId) -> bool {
    out.iter()
        .any(|o| matches!(o, Output::Close { conn: c, .. } if *c == conn))
}

fn fatal_error(out: &[Output], conn: ConnId) -> Option<String> {
    sched_events(out, conn).into_iter().find_map(|e| match e {
        Event::Error {
            message,
            fatal: true,
        } => Some(message),
        _ => None,
    })
}

/// One framework on S1, one agent on A1, one offer of everything.
fn setup(resources: &str) -> (H, FrameworkId, AgentId, Offer) {
    let mut h = H::new();
    let fid = h.subscribe(S1, "fw");
    let aid = h.register(A1, resources);
    let offers = h.offers(S1);
    assert_eq!(offers.len(), 1, "one offer");
    let offer = offers.into_iter().next().unwrap();
    (h, fid, aid, offer)
}

// --- subscription ---

#[test]
fn subscribe_assigns_ids_and_checks_protocol() {
    let mut h = H::new();
    let out = h.subscribe_info(S1, FrameworkInfo::new("a"), false);
    match &sched_events(&out, S1)[0] {
        Event::Subscribed {
            framework_id,
            reregistered,
            heartbeat_interval_seconds,
            ..
        } => {
            assert!(!framework_id.as_str().is_empty());
            assert!(!reregistered);
            assert_eq!(*heartbeat_interval_seconds, 15.0);
        }
        e => panic!("{e:?}"),
    }
    let out = h.sched(
        S2,
        scheduler::Call::Subscribe {
            protocol: 99,
            framework_info: FrameworkInfo::new("b"),
            force: false,
        },
    );
    assert!(fatal_error(&out, S2).unwrap().contains("protocol"));
    assert!(closed(&out, S2));
}

#[test]
fn calls_before_subscribe_get_a_non_fatal_error() {
    let mut h = H::new();
    let out = h.sched(S1, scheduler::Call::Revive { roles: vec![] });
    assert!(matches!(
        &sched_events(&out, S1)[0],
        Event::Error { fatal: false, message } if message.contains("subscribe first")
    ));
    assert!(!closed(&out, S1));
    let out = h.agent(A1, agent::Call::Pong);
    assert!(matches!(
        &agent_events(&out, A1)[0],
        agent::Event::Error { fatal: false, .. }
    ));
}

#[test]
fn second_connection_is_refused_unless_forced() {
    let mut h = H::new();
    let fid = h.subscribe(S1, "fw");
    let mut info = FrameworkInfo::new("fw");
    info.id = Some(fid.clone());
    let out = h.subscribe_info(S2, info.clone(), false);
    assert!(fatal_error(&out, S2).unwrap().contains("already connected"));
    assert!(closed(&out, S2) && !closed(&out, S1));
    let out = h.subscribe_info(S2, info, true);
    assert!(matches!(
        &sched_events(&out, S2)[0],
        Event::Subscribed {
            reregistered: true,
            ..
        }
    ));
    assert!(fatal_error(&out, S1).is_some() && closed(&out, S1));
    // The old connection closing later does not disconnect the framework.
    h.input(Input::SchedulerClosed { conn: S1 });
    assert!(h.m.frameworks[&fid].conn == Some(S2));
}

#[test]
fn failover_resubscribe_resends_unacknowledged_updates() {
    let mut h = H::new();
    let mut info = FrameworkInfo::new("fw");
    info.failover_timeout = 60.0;
    let out = h.subscribe_info(S1, info.clone(), false);
    let fid2 = match &sched_events(&out, S1)[0] {
        Event::Subscribed { framework_id, .. } => framework_id.clone(),
        e => panic!("{e:?}"),
    };
    let aid2 = h.register(A1, "cpus:4;mem:4096");
    let offer = h.offers(S1).remove(0);
    h.launch(
        S1,
        &[&offer],
        vec![command_task("t1", &aid2, "cpus:1;mem:128")],
    );
    let out = h.status(A1, &fid2, "t1", TaskState::Running, "u1");
    assert_eq!(updates(&out, S1)[0].uuid.as_deref(), Some("u1"));
    h.input(Input::SchedulerClosed { conn: S1 });
    h.advance(Duration::from_secs(30));
    info.id = Some(fid2.clone());
    let out = h.subscribe_info(S2, info, false);
    let events = sched_events(&out, S2);
    assert!(matches!(
        &events[0],
        Event::Subscribed {
            reregistered: true,
            ..
        }
    ));
    assert!(matches!(&events[1], Event::Update { status } if status.uuid.as_deref() == Some("u1")));
}

#[test]
fn removed_framework_cannot_resubscribe() {
    let mut h = H::new();
    let fid = h.subscribe(S1, "fw");
    let out = h.sched(S1, scheduler::Call::Teardown);
    assert!(fatal_error(&out, S1).unwrap().contains("framework removed"));
    assert!(closed(&out, S1));
    let mut info = FrameworkInfo::new("fw");
    info.id = Some(fid);
    let out = h.subscribe_info(S2, info, false);
    assert!(fatal_error(&out, S2).unwrap().contains("was removed"));
}

#[test]
fn invalid_framework_info_is_refused() {
    let mut h = H::new();
    let mut info = FrameworkInfo::new("fw");
    info.failover_timeout = f64::NAN;
    assert!(fatal_error(&h.subscribe_info(S1, info, false), S1).is_some());
    let mut info = FrameworkInfo::new("fw");
    info.id = Some(FrameworkId::new("../x"));
    assert!(fatal_error(&h.subscribe_info(S2, info, false), S2).is_some());
}

// --- offers and launches ---

#[test]
fn launch_moves_resources_and_sends_run_task() {
    let (mut h, fid, aid, offer) = setup("cpus:4;mem:4096");
    assert_eq!(h.m.agents[&aid].offered, r("cpus:4;mem:4096"));
    let task = executor_task("t1", &aid, "cpus:1;mem:256", "e1", "cpus:0.5;mem:32");
    let out = h.launch(S1, &[&offer], vec![task]);
    assert!(updates(&out, S1).is_empty(), "no update for STAGING");
    match &agent_events(&out, A1)[0] {
        agent::Event::RunTask { framework, task } => {
            assert_eq!(framework.id.as_ref(), Some(&fid));
            assert_eq!(
                task.executor.as_ref().unwrap().framework_id.as_ref(),
                Some(&fid)
            );
        }
        e => panic!("{e:?}"),
    }
    let agent = &h.m.agents[&aid];
    assert_eq!(agent.used, r("cpus:1.5;mem:288"));
    assert!(agent.offered.is_empty());
    assert_eq!(
        h.m.frameworks[&fid].tasks[&TaskId::new("t1")].state,
        TaskState::Staging
    );
    // The leftover is filtered for this framework for the default 5 s.
    assert!(h.offers(S1).is_empty());
    let out = h.advance(Duration::from_secs(5));
    let offers = offers_in(&out, S1);
    assert_eq!(offers[0].resources, r("cpus:2.5;mem:3808"));
    assert_eq!(offers[0].executor_ids, vec![ExecutorId::new("e1")]);
    // A second task on the running executor costs only its own resources.
    let task = executor_task("t2", &aid, "cpus:2.5;mem:3808", "e1", "cpus:0.5;mem:32");
    let out = h.launch(S1, &[&offers[0]], vec![task]);
    assert!(updates(&out, S1).is_empty(), "{out:?}");
    assert_eq!(h.m.agents[&aid].used, r("cpus:4;mem:4096"));
}

/// A task of group `group` on custom executor `e1`.
fn group_task(id: &str, agent: &AgentId, resources: &str, group: &str) -> TaskInfo {
    TaskInfo {
        allocation_role: None,
        task_group: Some(group.into()),
        ..executor_task(id, agent, resources, "e1", "cpus:0.5;mem:32")
    }
}

#[test]
fn a_task_group_launches_whole_in_one_run_task_group() {
    let (mut h, fid, aid, offer) = setup("cpus:4;mem:4096");
    let out = h.launch(
        S1,
        &[&offer],
        vec![
            group_task("g1", &aid, "cpus:1;mem:128", "g"),
            command_task("c", &aid, "cpus:1"),
            group_task("g2", &aid, "cpus:1;mem:128", "g"),
        ],
    );
    assert!(updates(&out, S1).is_empty(), "{out:?}");
    let events = agent_events(&out, A1);
    assert_eq!(events.len(), 2, "{events:?}");
    match &events[0] {
        agent::Event::RunTaskGroup { framework, tasks } => {
            assert_eq!(framework.id.as_ref(), Some(&fid));
            let ids: Vec<&str> = tasks.iter().map(|t| t.task_id.as_str()).collect();
            assert_eq!(ids, ["g1", "g2"]);
            for task in tasks {
                let exec = task.executor.as_ref().unwrap();
                assert_eq!(exec.framework_id.as_ref(), Some(&fid));
                assert_eq!(task.task_group.as_deref(), Some("g"));
            }
            assert!(tasks[0].launch_stamp < tasks[1].launch_stamp);
        }
        e => panic!("{e:?}"),
    }
    assert!(
        matches!(&events[1], agent::Event::RunTask { task, .. } if task.task_id.as_str() == "c")
    );
    // The executor is counted once.
    assert_eq!(h.m.agents[&aid].used, r("cpus:3.5;mem:288"));
    for id in ["g1", "g2", "c"] {
        assert_eq!(
            h.m.frameworks[&fid].tasks[&TaskId::new(id)].state,
            TaskState::Staging
        );
    }

    // The agent lost the launch with its connection: the group goes
    // again, whole.
    h.input(Input::AgentClosed { conn: A1 });
    let out = h.register_info(A2, agent_info(Some(&aid), "cpus:4;mem:4096"), vec![]);
    let groups: Vec<Vec<String>> = agent_events(&out, A2)
        .into_iter()
        .filter_map(|e| match e {
            agent::Event::RunTaskGroup { tasks, .. } => {
                Some(tasks.iter().map(|t| t.task_id.to_string()).collect())
            }
            _ => None,
        })
        .collect();
    assert_eq!(groups, [vec!["g1", "g2"]]);
}

#[test]
fn a_task_group_with_one_task_that_cannot_run_is_refused_whole() {
    let (mut h, fid, aid, offer) = setup("cpus:2;mem:1024");
    // g2 needs more than the offers have left after g1 and the executor.
    let out = h.launch(
        S1,
        &[&offer],
        vec![
            group_task("g1", &aid, "cpus:1;mem:128", "g"),
            group_task("g2", &aid, "cpus:1;mem:128", "g"),
            command_task("c", &aid, "cpus:1"),
        ],
    );
    let refused = updates(&out, S1);
    let ids: Vec<&str> = refused.iter().map(|s| s.task_id.as_str()).collect();
    assert_eq!(ids, ["g1", "g2"]);
    for status in &refused {
        assert_eq!(status.state, TaskState::Error);
        assert_eq!(status.reason, Some(Reason::ReasonTaskGroupInvalid));
        let message = status.message.as_deref().unwrap();
        assert!(
            message.contains("task group refused: task g2 needs"),
            "{message}"
        );
    }
    // The task outside the group runs; nothing of the group does.
    let events = agent_events(&out, A1);
    assert_eq!(events.len(), 1, "{events:?}");
    assert!(
        matches!(&events[0], agent::Event::RunTask { task, .. } if task.task_id.as_str() == "c")
    );
    assert_eq!(h.m.agents[&aid].used, r("cpus:1"));
    assert!(h.m.agents[&aid].executors.is_empty());
    assert!(!h.m.frameworks[&fid].tasks.contains_key(&TaskId::new("g1")));

    // Tasks of one group on two executors, or a command task in a group.
    h.advance(Duration::from_secs(5));
    let offer = h.offers(S1).remove(0);
    let mut other = group_task("h2", &aid, "cpus:0.1", "h");
    other.executor.as_mut().unwrap().executor_id = ExecutorId::new("e2");
    let command = TaskInfo {
        allocation_role: None,
        task_group: Some("i".into()),
        ..command_task("i1", &aid, "cpus:0.1")
    };
    let out = h.launch(
        S1,
        &[&offer],
        vec![group_task("h1", &aid, "cpus:0.1", "h"), other, command],
    );
    let refused = updates(&out, S1);
    let ids: Vec<&str> = refused.iter().map(|s| s.task_id.as_str()).collect();
    assert_eq!(ids, ["h1", "h2", "i1"]);
    assert!(refused.iter().all(|s| s
        .message
        .as_deref()
        .unwrap()
        .contains("must all name the same executor")));
    assert!(agent_events(&out, A1).is_empty());
}

#[test]
fn container_usage_is_kept_on_the_tasks_of_the_reporting_agent() {
    let (mut h, fid, aid, offer) = setup("cpus:4;mem:4096");
    let task = executor_task("t1", &aid, "cpus:1;mem:256", "e1", "cpus:0.5;mem:32");
    h.launch(S1, &[&offer], vec![task]);
    let usage = agent::ContainerUsage {
        framework_id: fid.clone(),
        tasks: vec![TaskId::new("t1"), TaskId::new("not-here")],
        cpus_time_secs: 1.5,
        cpus_limit: 1.5,
        cpus_nr_throttled: 3,
        mem_bytes: 100 << 20,
        mem_max_bytes: 120 << 20,
        mem_limit_bytes: 288 << 20,
        processes: 4,
    };
    // Another agent cannot speak for the task.
    h.register(A2, "cpus:1;mem:128");
    h.agent(
        A2,
        agent::Call::Usage {
            containers: vec![usage.clone()],
        },
    );
    assert_eq!(h.m.frameworks[&fid].tasks[&TaskId::new("t1")].usage, None);
    h.agent(
        A1,
        agent::Call::Usage {
            containers: vec![usage.clone()],
        },
    );
    let task = &h.m.frameworks[&fid].tasks[&TaskId::new("t1")];
    assert_eq!(task.usage.as_ref(), Some(&usage));
    let view = serde_json::to_value(crate::state::task_view(task)).unwrap();
    assert_eq!(view["usage"]["mem_limit_bytes"], 288u64 << 20);
}

#[test]
fn launch_on_invalid_offers_drops_every_task() {
    let (mut h, _fid, aid, offer) = setup("cpus:4;mem:4096");
    let t = || {
        vec![
            command_task("t1", &aid, "cpus:1"),
            command_task("t2", &aid, "cpus:1"),
        ]
    };
    let bogus = OfferId::new("nope");
    let out = h.sched(
        S1,
        scheduler::Call::Launch {
            offer_ids: vec![offer.id.clone(), bogus],
            tasks: t(),
            filters: Filters::default(),
        },
    );
    let ups = updates(&out, S1);
    assert_eq!(ups.len(), 2);
    for u in &ups {
        assert_eq!(u.state, TaskState::Dropped);
        assert_eq!(u.reason, Some(Reason::ReasonInvalidOffers));
        assert_eq!(u.source, Source::SourceMaster);
        assert!(u.uuid.is_none());
    }
    assert!(agent_events(&out, A1).is_empty());
    // The valid offer was given back (without filter): re-offered next cycle.
    assert!(h.m.offers.is_empty());
    let again = h.offers(S1);
    assert_eq!(again.len(), 1);
    // A stale offer (already used) drops too.
    h.launch(S1, &[&again[0]], vec![command_task("t1", &aid, "cpus:1")]);
    let out = h.launch(S1, &[&again[0]], vec![command_task("t3", &aid, "cpus:1")]);
    assert_eq!(updates(&out, S1)[0].state, TaskState::Dropped);
}

#[test]
fn reconciling_a_refused_launch_answers_what_the_refusal_said() {
    let (mut h, _fid, aid, offer) = setup("cpus:4;mem:4096");
    // A duplicate of a live task, then a launch on the used (stale) offer.
    let out = h.launch(
        S1,
        &[&offer],
        vec![
            command_task("live", &aid, "cpus:1"),
            command_task("live", &aid, "cpus:1"),
        ],
    );
    assert_eq!(updates(&out, S1)[0].state, TaskState::Error);
    let out = h.launch(S1, &[&offer], vec![command_task("late", &aid, "cpus:1")]);
    assert_eq!(updates(&out, S1)[0].state, TaskState::Dropped);
    let reconcile = |ids: &[&str]| scheduler::Call::Reconcile {
        tasks: ids
            .iter()
            .map(|id| ReconcileTask {
                task_id: TaskId::new(*id),
                agent_id: None,
            })
            .collect(),
    };
    let out = h.sched(S1, reconcile(&["late", "live"]));
    let ups = updates(&out, S1);
    assert_eq!(ups.len(), 2);
    assert_eq!(
        (ups[0].state, ups[0].reason),
        (TaskState::Dropped, Some(Reason::ReasonReconciliation)),
        "the dropped launch is not 'unknown' (TASK_LOST): {ups:?}"
    );
    assert_eq!(
        ups[1].state,
        TaskState::Staging,
        "the live task, not its refused duplicate"
    );
}

#[test]
fn launch_on_someone_elses_offer_is_dropped() {
    let (mut h, _fid, aid, offer) = setup("cpus:4;mem:4096");
    h.subscribe(S2, "other");
    let out = h.launch(S2, &[&offer], vec![command_task("t1", &aid, "cpus:1")]);
    assert_eq!(updates(&out, S2)[0].state, TaskState::Dropped);
    // The owner's offer is untouched.
    assert!(h.m.offers.contains_key(&offer.id));
}

#[test]
fn launch_across_two_agents_is_dropped() {
    let mut h = H::new();
    h.subscribe(S1, "fw");
    let a1 = h.register(A1, "cpus:1;mem:1024");
    h.register(A2, "cpus:1;mem:1024");
    let offers = h.offers(S1);
    assert_eq!(offers.len(), 2);
    let out = h.launch(
        S1,
        &[&offers[0], &offers[1]],
        vec![command_task("t1", &a1, "cpus:2")],
    );
    assert_eq!(updates(&out, S1)[0].state, TaskState::Dropped);
    assert!(h.m.offers.is_empty(), "both offers given back");
}

#[test]
fn invalid_tasks_get_task_error() {
    let (mut h, fid, aid, offer) = setup("cpus:4;mem:4096");
    let other = AgentId::new("elsewhere");
    let mut both = command_task("both", &aid, "cpus:0.1");
    both.executor = executor_task("x", &aid, "cpus:1", "e", "").executor;
    let mut neither = command_task("neither", &aid, "cpus:0.1");
    neither.command = None;
    let tasks = vec![
        command_task("ok", &aid, "cpus:1"),
        command_task("ok", &aid, "cpus:1"),
        command_task("bad/id", &aid, "cpus:1"),
        command_task("wrong-agent", &other, "cpus:1"),
        both,
        neither,
        command_task("empty", &aid, ""),
        command_task("huge", &aid, "cpus:100"),
        command_task("fits", &aid, "cpus:3"),
        command_task("too-much", &aid, "cpus:0.5"),
    ];
    let out = h.launch(S1, &[&offer], tasks);
    let ups = updates(&out, S1);
    let by_id = |id: &str| ups.iter().find(|u| u.task_id.as_str() == id).cloned();
    for id in ["bad/id", "wrong-agent", "both", "neither", "empty"] {
        let u = by_id(id).unwrap_or_else(|| panic!("no update for {id}"));
        assert_eq!(
            (u.state, u.reason),
            (TaskState::Error, Some(Reason::ReasonTaskInvalid)),
            "{id}"
        );
    }
    let dup: Vec<_> = ups.iter().filter(|u| u.task_id.as_str() == "ok").collect();
    assert_eq!(dup.len(), 1, "second 'ok' refused");
    assert_eq!(dup[0].reason, Some(Reason::ReasonTaskInvalid));
    for id in ["huge", "too-much"] {
        assert_eq!(
            by_id(id).unwrap().reason,
            Some(Reason::ReasonInsufficientResources),
            "{id}"
        );
    }
    assert!(by_id("fits").is_none());
    let runs = agent_events(&out, A1).len();
    assert_eq!(runs, 2, "ok and fits launched");
    // A live task id cannot be reused in a later launch.
    let offer = h.advance(Duration::from_secs(6));
    let offer = offers_in(&offer, S1).remove(0);
    let out = h.launch(S1, &[&offer], vec![command_task("ok", &aid, "cpus:0.1")]);
    assert_eq!(updates(&out, S1)[0].reason, Some(Reason::ReasonTaskInvalid));
    let _ = fid;
}

#[test]
fn a_task_naming_another_allocation_role_than_its_offers_is_refused() {
    let (mut h, _fid, aid, offer) = setup("cpus:4;mem:4096");
    let role = offer
        .allocation_role
        .clone()
        .expect("offers name their role");
    let mut wrong = command_task("wrong", &aid, "cpus:1");
    wrong.allocation_role = Some("not-mine".into());
    let mut right = command_task("right", &aid, "cpus:1");
    right.allocation_role = Some(role.clone());
    let out = h.launch(S1, &[&offer], vec![wrong, right]);
    let ups = updates(&out, S1);
    assert_eq!(ups.len(), 1, "{ups:?}");
    assert_eq!(ups[0].task_id.as_str(), "wrong");
    assert_eq!(
        (ups[0].state, ups[0].reason),
        (TaskState::Error, Some(Reason::ReasonTaskInvalid))
    );
    let message = ups[0].message.as_deref().unwrap_or_default();
    assert!(
        message.contains("\"not-mine\"") && message.contains(&format!("{role:?}")),
        "{message}"
    );
    assert_eq!(agent_events(&out, A1).len(), 1, "the right one launched");
}

#[test]
fn decline_filters_expire_and_revive_clears_them() {
    let (mut h, _fid, _aid, offer) = setup("cpus:4;mem:4096");
    h.sched(
        S1,
        scheduler::Call::Decline {
            offer_ids: vec![offer.id.clone()],
            filters: Filters {
                refuse_seconds: Some(10.0),
            },
        },
    );
    assert!(offers_in(&h.advance(Duration::from_secs(9)), S1).is_empty());
    let offers = offers_in(&h.advance(Duration::from_secs(2)), S1);
    assert_eq!(offers.len(), 1);
    // Default filter: 5 s.
    h.sched(
        S1,
        scheduler::Call::Decline {
            offer_ids: vec![offers[0].id.clone(), OfferId::new("unknown-is-ignored")],
            filters: Filters::default(),
        },
    );
    assert!(offers_in(&h.advance(Duration::from_secs(4)), S1).is_empty());
    assert_eq!(offers_in(&h.advance(Duration::from_secs(2)), S1).len(), 1);
    let offer = h.m.offers.values().next().unwrap().offer.clone();
    h.sched(
        S1,
        scheduler::Call::Decline {
            offer_ids: vec![offer.id],
            filters: Filters {
                refuse_seconds: Some(1e300),
            },
        },
    );
    assert!(offers_in(&h.advance(Duration::from_secs(30)), S1).is_empty());
    h.sched(S1, scheduler::Call::Revive { roles: vec![] });
    let out = h.advance(Duration::from_millis(50));
    assert_eq!(
        offers_in(&out, S1).len(),
        1,
        "revive re-offers within the batch window"
    );
}

#[test]
fn suppress_stops_offers_until_revive() {
    let mut h = H::new();
    h.subscribe(S1, "fw");
    h.sched(S1, scheduler::Call::Suppress { roles: vec![] });
    h.register(A1, "cpus:4;mem:4096");
    assert!(offers_in(&h.advance(Duration::from_secs(5)), S1).is_empty());
    h.sched(S1, scheduler::Call::Revive { roles: vec![] });
    assert_eq!(h.offers(S1).len(), 1);
}

#[test]
fn a_failed_over_scheduler_gets_offers_again() {
    // Found by the simulation: a framework that suppressed, failed over
    // and re-subscribed never got another offer; its new scheduler did not
    // know to revive.
    let mut h = H::new();
    let mut info = FrameworkInfo::new("fw");
    info.failover_timeout = 60.0;
    let out = h.subscribe_info(S1, info.clone(), false);
    let fid = match &sched_events(&out, S1)[0] {
        Event::Subscribed { framework_id, .. } => framework_id.clone(),
        e => panic!("{e:?}"),
    };
    h.sched(S1, scheduler::Call::Suppress { roles: vec![] });
    h.register(A1, "cpus:4;mem:4096");
    assert!(offers_in(&h.advance(Duration::from_secs(5)), S1).is_empty());
    h.input(Input::SchedulerClosed { conn: S1 });
    info.id = Some(fid);
    h.subscribe_info(S2, info, false);
    assert_eq!(h.offers(S2).len(), 1);
}

#[test]
fn events_coalesce_into_one_extra_allocation() {
    let mut h = H::new();
    h.subscribe(S1, "fw");
    for i in 0..5 {
        h.register(A1 + i, "cpus:1;mem:1024");
    }
    // All five agents are offered by one cycle within the batch window.
    let out = h.advance(Duration::from_millis(25));
    let events: Vec<_> = sched_events(&out, S1)
        .into_iter()
        .filter(|e| matches!(e, Event::Offers { .. }))
        .collect();
    assert_eq!(events.len(), 1);
    assert_eq!(offers_in(&out, S1).len(), 5);
}

#[test]
fn offer_timeout_rescinds() {
    let mut h = H::with(Config {
        offer_timeout: Some(Duration::from_secs(30)),
        ..Config::default()
    });
    h.subscribe(S1, "fw");
    h.register(A1, "cpus:1;mem:1024");
    let offer = h.offers(S1).remove(0);
    let out = h.advance(Duration::from_secs(31));
    assert!(sched_events(&out, S1)
        .iter()
        .any(|e| matches!(e, Event::Rescind { offer_id } if *offer_id == offer.id)));
}

#[test]
fn an_agent_that_cannot_take_tasks_is_not_offered_until_it_can() {
    let mut h = H::new();
    h.subscribe(S1, "fw");
    let aid = h.register(A1, "cpus:1;mem:1024");
    let offer = h.offer_from(S1, &aid);
    let out = h.agent(
        A1,
        agent::Call::Availability {
            unavailable: Some("its work directory is full".into()),
        },
    );
    assert!(sched_events(&out, S1)
        .iter()
        .any(|e| matches!(e, Event::Rescind { offer_id } if *offer_id == offer.id)));
    assert!(h.offers(S1).is_empty());
    assert!(offers_in(&h.advance(Duration::from_secs(30)), S1).is_empty());
    assert_eq!(
        h.m.agents[&aid].unavailable.as_deref(),
        Some("its work directory is full"),
        "the reason is kept for /state"
    );
    h.agent(A1, agent::Call::Availability { unavailable: None });
    assert_eq!(h.m.agents[&aid].unavailable, None);
    h.offer_from(S1, &aid);
}

// --- tasks ---

#[test]
fn status_updates_are_forwarded_and_acknowledged() {
    let (mut h, fid, aid, offer) = setup("cpus:4;mem:4096");
    h.launch(
        S1,
        &[&offer],
        vec![command_task("t1", &aid, "cpus:4;mem:4096")],
    );
    let out = h.status(A1, &fid, "t1", TaskState::Running, "u1");
    let u = &updates(&out, S1)[0];
    assert_eq!(
        (u.state, u.agent_id.as_ref()),
        (TaskState::Running, Some(&aid))
    );
    let out = h.sched(
        S1,
        scheduler::Call::Acknowledge {
            agent_id: aid.clone(),
            task_id: TaskId::new("t1"),
            uuid: "u1".into(),
        },
    );
    assert_eq!(
        agent_events(&out, A1),
        vec![agent::Event::Acknowledge {
            framework_id: fid.clone(),
            task_id: TaskId::new("t1"),
            uuid: "u1".into()
        }]
    );
    // Terminal: resources are freed and offered again.
    h.status(A1, &fid, "t1", TaskState::Finished, "u2");
    assert!(h.m.agents[&aid].used.is_empty());
    assert_eq!(h.offers(S1)[0].resources, r("cpus:4;mem:4096"));
    // Until acknowledged it is still known; after, it is completed.
    assert!(h.m.frameworks[&fid].tasks.contains_key(&TaskId::new("t1")));
    h.sched(
        S1,
        scheduler::Call::Acknowledge {
            agent_id: aid.clone(),
            task_id: TaskId::new("t1"),
            uuid: "u2".into(),
        },
    );
    assert!(!h.m.frameworks[&fid].tasks.contains_key(&TaskId::new("t1")));
    assert_eq!(h.m.completed.back().unwrap().state, TaskState::Finished);
}

#[test]
fn an_agents_resend_of_an_unacknowledged_update_is_not_forwarded_again() {
    let mut h = H::new();
    let mut info = FrameworkInfo::new("fw");
    info.failover_timeout = 60.0;
    let out = h.subscribe_info(S1, info.clone(), false);
    let Some(Event::Subscribed { framework_id, .. }) = sched_events(&out, S1).first().cloned()
    else {
        panic!("no SUBSCRIBED");
    };
    let fid = framework_id;
    let aid = h.register(A1, "cpus:4;mem:4096");
    let offer = h.offers(S1).remove(0);
    h.launch(
        S1,
        &[&offer],
        vec![command_task("t1", &aid, "cpus:1;mem:128")],
    );
    let ack = |uuid: &str| scheduler::Call::Acknowledge {
        agent_id: aid.clone(),
        task_id: TaskId::new("t1"),
        uuid: uuid.into(),
    };
    let repeated = |h: &H| h.m.metrics.status_updates_repeated.get();

    let out = h.status(A1, &fid, "t1", TaskState::Running, "u1");
    assert_eq!(updates(&out, S1).len(), 1);
    // The agent's retry timer ran before the scheduler's acknowledgement
    // came back (a stopped master reads both copies at once): the copy is
    // neither forwarded nor acknowledged.
    for _ in 0..3 {
        let out = h.status(A1, &fid, "t1", TaskState::Running, "u1");
        assert!(updates(&out, S1).is_empty(), "forwarded twice: {out:?}");
        assert!(agent_events(&out, A1).is_empty(), "{out:?}");
    }
    assert_eq!(repeated(&h), 3);
    let out = h.sched(S1, ack("u1"));
    assert_eq!(
        agent_events(&out, A1).len(),
        1,
        "the acknowledgement goes on"
    );
    // A copy that crossed the acknowledgement is acknowledged again.
    let out = h.status(A1, &fid, "t1", TaskState::Running, "u1");
    assert!(updates(&out, S1).is_empty(), "forwarded twice: {out:?}");
    assert_eq!(
        agent_events(&out, A1),
        vec![agent::Event::Acknowledge {
            framework_id: fid.clone(),
            task_id: TaskId::new("t1"),
            uuid: "u1".into()
        }]
    );
    assert_eq!(repeated(&h), 4);

    // A terminal update held for a scheduler that is away is sent once
    // when it subscribes again, however often the agent re-sent it.
    let out = h.status(A1, &fid, "t1", TaskState::Finished, "u2");
    assert_eq!(updates(&out, S1).len(), 1);
    h.input(Input::SchedulerClosed { conn: S1 });
    let out = h.status(A1, &fid, "t1", TaskState::Finished, "u2");
    assert!(updates(&out, S1).is_empty() && agent_events(&out, A1).is_empty());
    info.id = Some(fid.clone());
    let out = h.subscribe_info(S2, info, false);
    let resent: Vec<_> = updates(&out, S2);
    assert_eq!(resent.len(), 1, "{resent:?}");
    assert_eq!(resent[0].uuid.as_deref(), Some("u2"));
    let out = h.status(A1, &fid, "t1", TaskState::Finished, "u2");
    assert!(updates(&out, S2).is_empty(), "forwarded twice: {out:?}");
    assert_eq!(repeated(&h), 6);

    // Once acknowledged, a late copy is acknowledged to the agent (its
    // stream drains) and not forwarded: the task is completed.
    h.sched(S2, ack("u2"));
    let out = h.status(A1, &fid, "t1", TaskState::Finished, "u2");
    assert!(updates(&out, S2).is_empty(), "{out:?}");
    assert_eq!(agent_events(&out, A1).len(), 1, "{out:?}");
}

#[test]
fn kill_known_and_unknown_tasks() {
    let (mut h, fid, aid, offer) = setup("cpus:4;mem:4096");
    h.launch(S1, &[&offer], vec![command_task("t1", &aid, "cpus:1")]);
    let out = h.sched(
        S1,
        scheduler::Call::Kill {
            task_id: TaskId::new("t1"),
            agent_id: None,
        },
    );
    assert_eq!(
        agent_events(&out, A1),
        vec![agent::Event::KillTask {
            framework_id: fid,
            task_id: TaskId::new("t1")
        }]
    );
    let out = h.sched(
        S1,
        scheduler::Call::Kill {
            task_id: TaskId::new("ghost"),
            agent_id: None,
        },
    );
    let u = &updates(&out, S1)[0];
    assert_eq!(
        (u.state, u.reason),
        (TaskState::Lost, Some(Reason::ReasonTaskUnknown))
    );
    assert!(u.uuid.is_none());
}

#[test]
fn reconcile_explicit_and_implicit() {
    let (mut h, fid, aid, offer) = setup("cpus:4;mem:4096");
    h.launch(
        S1,
        &[&offer],
        vec![
            command_task("t1", &aid, "cpus:1"),
            command_task("t2", &aid, "cpus:1"),
        ],
    );
    h.status(A1, &fid, "t1", TaskState::Running, "u1");
    let out = h.sched(
        S1,
        scheduler::Call::Reconcile {
            tasks: vec![
                ReconcileTask {
                    task_id: TaskId::new("t1"),
                    agent_id: None,
                },
                ReconcileTask {
                    task_id: TaskId::new("nope"),
                    agent_id: None,
                },
            ],
        },
    );
    let ups = updates(&out, S1);
    assert_eq!(ups.len(), 2);
    assert_eq!(
        (ups[0].state, ups[0].reason),
        (TaskState::Running, Some(Reason::ReasonReconciliation))
    );
    assert!(ups[0].uuid.is_none());
    assert_eq!(ups[1].state, TaskState::Lost);
    assert_eq!(ups[1].reason, Some(Reason::ReasonReconciliation));
    assert_eq!(ups[1].message.as_deref(), Some("unknown task"));
    let out = h.sched(S1, scheduler::Call::Reconcile { tasks: vec![] });
    let mut states: Vec<_> = updates(&out, S1)
        .into_iter()
        .map(|u| (u.task_id.0, u.state))
        .collect();
    states.sort();
    assert_eq!(
        states,
        vec![
            ("t1".into(), TaskState::Running),
            ("t2".into(), TaskState::Staging)
        ]
    );
}

#[test]
fn framework_messages_flow_both_ways() {
    let (mut h, fid, aid, _offer) = setup("cpus:4;mem:4096");
    let out = h.sched(
        S1,
        scheduler::Call::Message {
            agent_id: aid.clone(),
            executor_id: ExecutorId::new("e"),
            data: "hi".into(),
        },
    );
    assert!(
        matches!(&agent_events(&out, A1)[0], agent::Event::Message { framework_id, .. } if *framework_id == fid)
    );
    let out = h.agent(
        A1,
        agent::Call::Message {
            framework_id: fid,
            executor_id: ExecutorId::new("e"),
            data: "yo".into(),
        },
    );
    assert!(
        matches!(&sched_events(&out, S1)[0], Event::Message { agent_id, .. } if *agent_id == aid)
    );
    let out = h.sched(
        S1,
        scheduler::Call::Message {
            agent_id: AgentId::new("ghost"),
            executor_id: ExecutorId::new("e"),
            data: "hi".into(),
        },
    );
    assert!(matches!(
        &sched_events(&out, S1)[0],
        Event::Error { fatal: false, .. }
    ));
}

#[test]
fn executor_exit_reports_failure_and_frees_its_resources() {
    let (mut h, fid, aid, offer) = setup("cpus:4;mem:4096");
    h.launch(
        S1,
        &[&offer],
        vec![executor_task("t1", &aid, "cpus:1", "e1", "cpus:0.5;mem:64")],
    );
    h.status(A1, &fid, "t1", TaskState::Failed, "u1");
    assert_eq!(h.m.agents[&aid].used, r("cpus:0.5;mem:64"));
    let out = h.agent(
        A1,
        agent::Call::ExecutorExited {
            framework_id: fid,
            executor_id: ExecutorId::new("e1"),
            status: Some(1),
            message: "exited".into(),
        },
    );
    assert_eq!(
        sched_events(&out, S1),
        vec![Event::Failure {
            agent_id: aid.clone(),
            executor_id: Some(ExecutorId::new("e1")),
            status: Some(1)
        }]
    );
    assert!(h.m.agents[&aid].used.is_empty());
}

#[test]
fn executor_exit_crossing_a_launch_on_it_keeps_the_executor_on_the_books() {
    // A task is launched on a running executor just as that executor
    // exits: the agent's exit report crosses the RUN_TASK, and the agent
    // starts the executor anew for the task. Its resources stay charged,
    // never offered while it runs.
    let (mut h, fid, aid, offer) = setup("cpus:2;mem:1024");
    h.launch(
        S1,
        &[&offer],
        vec![executor_task(
            "t1",
            &aid,
            "cpus:0.5",
            "e1",
            "cpus:0.5;mem:64",
        )],
    );
    h.status(A1, &fid, "t1", TaskState::Finished, "u1");
    let offers = h.offers(S1);
    assert_eq!(offers.len(), 1, "the task's resources are offered again");
    h.launch(
        S1,
        &[&offers[0]],
        vec![executor_task(
            "t2",
            &aid,
            "cpus:0.5",
            "e1",
            "cpus:0.5;mem:64",
        )],
    );
    assert_eq!(h.m.agents[&aid].used, r("cpus:1;mem:64"));
    h.agent(
        A1,
        agent::Call::ExecutorExited {
            framework_id: fid.clone(),
            executor_id: ExecutorId::new("e1"),
            status: Some(0),
            message: "exited".into(),
        },
    );
    assert_eq!(
        h.m.agents[&aid].used,
        r("cpus:1;mem:64"),
        "the executor t2 restarts stays charged"
    );
    // Once the agent has heard of t2, an exit of e1 is that of the
    // executor that ran it, and frees it.
    h.status(A1, &fid, "t2", TaskState::Finished, "u2");
    h.agent(
        A1,
        agent::Call::ExecutorExited {
            framework_id: fid,
            executor_id: ExecutorId::new("e1"),
            status: Some(0),
            message: "exited".into(),
        },
    );
    assert!(h.m.agents[&aid].used.is_empty());
}

#[test]
fn heartbeats_every_interval() {
    let mut h = H::new();
    h.subscribe(S1, "fw");
    let out = h.advance(Duration::from_secs(31));
    let beats = sched_events(&out, S1)
        .into_iter()
        .filter(|e| matches!(e, Event::Heartbeat))
        .count();
    assert_eq!(beats, 2);
}

// --- failover and teardown ---

#[test]
fn disconnect_with_zero_failover_tears_down_at_once() {
    let (mut h, fid, aid, offer) = setup("cpus:4;mem:4096");
    h.launch(S1, &[&offer], vec![command_task("t1", &aid, "cpus:1")]);
    let out = h.input(Input::SchedulerClosed { conn: S1 });
    assert!(
        agent_events(&out, A1).contains(&agent::Event::ShutdownFramework {
            framework_id: fid.clone()
        })
    );
    assert!(h.m.frameworks.is_empty());
    assert!(h.m.agents[&aid].used.is_empty());
    // A late update for it is acknowledged by the master itself.
    let out = h.status(A1, &fid, "t1", TaskState::Killed, "u9");
    assert!(
        matches!(&agent_events(&out, A1)[0], agent::Event::Acknowledge { uuid, .. } if uuid == "u9")
    );
}

#[test]
fn failover_timeout_tears_down_after_expiry() {
    let mut h = H::new();
    let mut info = FrameworkInfo::new("fw");
    info.failover_timeout = 10.0;
    let out = h.subscribe_info(S1, info, false);
    let fid = match &sched_events(&out, S1)[0] {
        Event::Subscribed { framework_id, .. } => framework_id.clone(),
        e => panic!("{e:?}"),
    };
    let aid = h.register(A1, "cpus:4;mem:4096");
    let offer = h.offers(S1).remove(0);
    h.launch(S1, &[&offer], vec![command_task("t1", &aid, "cpus:1")]);
    h.input(Input::SchedulerClosed { conn: S1 });
    assert!(h.m.offers.is_empty(), "offers withdrawn on disconnect");
    let out = h.advance(Duration::from_secs(9));
    assert!(agent_events(&out, A1)
        .iter()
        .all(|e| !matches!(e, agent::Event::ShutdownFramework { .. })));
    assert!(h.m.frameworks.contains_key(&fid));
    let out = h.advance(Duration::from_secs(2));
    assert!(
        agent_events(&out, A1).contains(&agent::Event::ShutdownFramework {
            framework_id: fid.clone()
        })
    );
    assert!(!h.m.frameworks.contains_key(&fid));
    assert_eq!(h.m.completed.back().unwrap().state, TaskState::Killed);
}

#[test]
fn a_failover_timeout_is_capped_by_the_master() {
    let mut h = H::with(Config {
        max_failover_timeout: Duration::from_secs(100),
        ..Config::default()
    });
    let mut info = FrameworkInfo::new("fw");
    info.failover_timeout = 1e9;
    let out = h.subscribe_info(S1, info, false);
    let fid = match &sched_events(&out, S1)[0] {
        Event::Subscribed { framework_id, .. } => framework_id.clone(),
        e => panic!("{e:?}"),
    };
    h.input(Input::SchedulerClosed { conn: S1 });
    h.advance(Duration::from_secs(99));
    assert!(h.m.frameworks.contains_key(&fid));
    h.advance(Duration::from_secs(2));
    assert!(
        !h.m.frameworks.contains_key(&fid),
        "removed after --max-failover-timeout, not after ~31 years"
    );
    assert!(h.m.removed_frameworks.contains(&fid));
}

#[test]
fn disconnected_frameworks_are_bounded_and_the_longest_disconnected_goes_first() {
    let mut h = H::with(Config {
        max_disconnected_frameworks: 3,
        ..Config::default()
    });
    h.m.recover(&RegistryState::default(), h.now, 1000.0);
    let mut fids = Vec::new();
    for i in 0..5u64 {
        let conn = 1000 + i;
        let mut info = FrameworkInfo::new(format!("fw{i}"));
        info.failover_timeout = 1e9;
        let out = h.subscribe_info(conn, info, false);
        let fid = match &sched_events(&out, conn)[0] {
            Event::Subscribed { framework_id, .. } => framework_id.clone(),
            e => panic!("{e:?}"),
        };
        fids.push(fid);
    }
    // A connected framework does not count.
    let live = h.subscribe(S2, "live");
    ops(&mut h);
    for (i, fid) in fids.iter().enumerate() {
        h.advance(Duration::from_secs(1));
        h.input(Input::SchedulerClosed {
            conn: 1000 + i as u64,
        });
        assert!(h.m.frameworks.contains_key(fid));
    }
    // The first two to disconnect were removed, each as a removal the
    // registry keeps (a restarted or standby master agrees).
    let ops = ops(&mut h);
    for fid in &fids[..2] {
        assert!(!h.m.frameworks.contains_key(fid), "{fid} kept");
        assert!(h.m.removed_frameworks.contains(fid));
        assert!(ops.contains(&RegistryOp::RemoveFramework { id: fid.clone() }));
    }
    for fid in fids[2..].iter().chain([&live]) {
        assert!(h.m.frameworks.contains_key(fid), "{fid} removed");
    }
    assert_eq!(h.m.metrics.frameworks_removed_disconnected_cap.get(), 2);
    // A framework that comes back no longer counts.
    let mut info = FrameworkInfo::new("fw2");
    info.id = Some(fids[2].clone());
    info.failover_timeout = 1e9;
    h.subscribe_info(2000, info, false);
    let mut info = FrameworkInfo::new("fw5");
    info.failover_timeout = 1e9;
    let out = h.subscribe_info(2001, info, false);
    let fifth = match &sched_events(&out, 2001)[0] {
        Event::Subscribed { framework_id, .. } => framework_id.clone(),
        e => panic!("{e:?}"),
    };
    h.input(Input::SchedulerClosed { conn: 2001 });
    assert!(h.m.frameworks.contains_key(&fifth));
    assert!(h.m.frameworks.contains_key(&fids[3]));
}

#[test]
fn disconnected_frameworks_are_bounded_in_bytes_too() {
    let mut h = H::with(Config {
        max_disconnected_framework_bytes: 64 * 1024,
        ..Config::default()
    });
    let mut fids = Vec::new();
    for i in 0..4u64 {
        let conn = 1000 + i;
        let mut info = FrameworkInfo::new(format!("fw{i}-{}", "x".repeat(20_000)));
        info.failover_timeout = 1e9;
        let out = h.subscribe_info(conn, info, false);
        let fid = match &sched_events(&out, conn)[0] {
            Event::Subscribed { framework_id, .. } => framework_id.clone(),
            e => panic!("{e:?}"),
        };
        h.advance(Duration::from_secs(1));
        h.input(Input::SchedulerClosed { conn });
        fids.push(fid);
    }
    // Three of about 20 KB fit in 64 KiB: the first is gone.
    assert!(!h.m.frameworks.contains_key(&fids[0]));
    assert!(fids[1..].iter().all(|f| h.m.frameworks.contains_key(f)));
}

#[test]
fn a_recovered_registry_is_held_to_the_bound_on_disconnected_frameworks() {
    let mut h = H::with(Config {
        max_disconnected_frameworks: 2,
        ..Config::default()
    });
    let mut state = RegistryState::default();
    for (i, at) in [(1, 900.0), (2, 500.0), (3, 950.0)] {
        let id = FrameworkId::new(format!("F{i}"));
        let mut info = FrameworkInfo::new("fw");
        info.id = Some(id.clone());
        info.failover_timeout = 1e9;
        state.frameworks.insert(
            id.clone(),
            crate::registry::FrameworkRecord {
                id,
                info,
                disconnected_at: Some(at),
                launch_epoch: 0,
            },
        );
    }
    h.m.recover(&state, h.now, 1000.0);
    // F2 was disconnected longest (since 500).
    assert!(!h.m.frameworks.contains_key(&FrameworkId::new("F2")));
    assert!(h.m.frameworks.contains_key(&FrameworkId::new("F1")));
    assert!(h.m.frameworks.contains_key(&FrameworkId::new("F3")));
    assert!(ops(&mut h).contains(&RegistryOp::RemoveFramework {
        id: FrameworkId::new("F2")
    }));
}

// --- agents ---

#[test]
fn agent_is_removed_after_missed_pings() {
    // No offer timeout: the offer must still be outstanding when the agent goes.
    let mut h = H::with(Config {
        offer_timeout: None,
        ..Config::default()
    });
    let fid = h.subscribe(S1, "fw");
    let aid = h.register(A1, "cpus:4;mem:4096");
    let offer = h.offers(S1).remove(0);
    h.launch(S1, &[&offer], vec![command_task("t1", &aid, "cpus:1")]);
    let offer2 = h.advance(Duration::from_secs(6));
    let offer2 = offers_in(&offer2, S1).remove(0);
    // Pings are answered for a while.
    let out = h.advance(Duration::from_secs(15));
    assert!(agent_events(&out, A1).contains(&agent::Event::Ping));
    h.agent(A1, agent::Call::Pong);
    let out = h.advance(Duration::from_secs(15 * 5));
    assert!(
        h.m.agents.contains_key(&aid),
        "4 missed pings are tolerated"
    );
    assert!(!closed(&out, A1));
    let out = h.advance(Duration::from_secs(15));
    assert!(!h.m.agents.contains_key(&aid));
    let ups = updates(&out, S1);
    assert_eq!(ups.len(), 1);
    assert_eq!(
        (ups[0].state, ups[0].reason),
        (TaskState::Lost, Some(Reason::ReasonAgentRemoved))
    );
    assert!(ups[0].uuid.is_none());
    let events = sched_events(&out, S1);
    assert!(events.contains(&Event::Rescind {
        offer_id: offer2.id
    }));
    assert!(events.contains(&Event::Failure {
        agent_id: aid.clone(),
        executor_id: None,
        status: None
    }));
    assert!(agent_events(&out, A1)
        .iter()
        .any(|e| matches!(e, agent::Event::Shutdown { .. })));
    // It may not come back with that id.
    let out = h.register_info(A2, agent_info(Some(&aid), "cpus:4;mem:4096"), vec![]);
    assert!(matches!(
        &agent_events(&out, A2)[0],
        agent::Event::Shutdown { .. }
    ));
    assert!(!h.m.agents.contains_key(&aid));
    let _ = fid;
}

#[test]
fn disconnected_agent_keeps_tasks_and_reregisters() {
    let (mut h, fid, aid, offer) = setup("cpus:4;mem:4096");
    let task = command_task("t1", &aid, "cpus:1;mem:512");
    h.launch(S1, &[&offer], vec![task.clone()]);
    let out = h.advance(Duration::from_secs(6));
    let offer2 = offers_in(&out, S1).remove(0);
    let out = h.input(Input::AgentClosed { conn: A1 });
    assert_eq!(
        sched_events(&out, S1),
        vec![Event::Rescind {
            offer_id: offer2.id
        }]
    );
    assert!(h.m.frameworks[&fid].tasks.contains_key(&TaskId::new("t1")));
    assert!(
        h.offers(S1).is_empty(),
        "no offers from a disconnected agent"
    );
    let report = TaskReport {
        framework_id: fid.clone(),
        task,
        state: TaskState::Running,
        latest_status: None,
    };
    let out = h.register_info(A2, agent_info(Some(&aid), "cpus:4;mem:4096"), vec![report]);
    assert!(matches!(
        &agent_events(&out, A2)[0],
        agent::Event::Registered {
            reregistered: true,
            ..
        }
    ));
    assert_eq!(
        h.m.frameworks[&fid].tasks[&TaskId::new("t1")].state,
        TaskState::Running
    );
    assert_eq!(h.offers(S1)[0].resources, r("cpus:3;mem:3584"));
}

#[test]
fn reregistering_agent_without_a_task_marks_it_lost() {
    let (mut h, fid, aid, offer) = setup("cpus:4;mem:4096");
    h.launch(S1, &[&offer], vec![command_task("t1", &aid, "cpus:1")]);
    h.status(A1, &fid, "t1", TaskState::Running, "u1");
    h.input(Input::AgentClosed { conn: A1 });
    let out = h.register_info(A2, agent_info(Some(&aid), "cpus:4;mem:4096"), vec![]);
    let u = &updates(&out, S1)[0];
    assert_eq!(
        (u.state, u.reason),
        (TaskState::Lost, Some(Reason::ReasonAgentRestarted))
    );
    assert!(h.m.agents[&aid].used.is_empty());
    let _ = fid;
}

#[test]
fn reregistering_agent_gets_a_staging_task_it_never_received_again() {
    let (mut h, _fid, aid, offer) = setup("cpus:4;mem:4096");
    h.launch(S1, &[&offer], vec![command_task("t1", &aid, "cpus:1")]);
    // The RUN_TASK died with the connection: the agent reports nothing.
    h.input(Input::AgentClosed { conn: A1 });
    let out = h.register_info(A2, agent_info(Some(&aid), "cpus:4;mem:4096"), vec![]);
    assert!(
        updates(&out, S1).is_empty(),
        "no update: the task is not lost"
    );
    assert!(agent_events(&out, A2).iter().any(|e| matches!(
        e,
        agent::Event::RunTask { task, .. } if task.task_id.as_str() == "t1"
    )));
    assert_eq!(h.m.agents[&aid].used, r("cpus:1"));
}

#[test]
fn reregistration_after_master_restart_rebuilds_state() {
    let mut h = H::new();
    let aid = AgentId::new("old-agent");
    let fid = FrameworkId::new("old-fw");
    let mut fw_info = FrameworkInfo::new("fw");
    fw_info.id = Some(fid.clone());
    fw_info.failover_timeout = 3600.0;
    let task = executor_task("t1", &aid, "cpus:1;mem:512", "e1", "cpus:0.5;mem:32");
    let exec = task.executor.clone().unwrap();
    let out = h.agent(
        A1,
        agent::Call::Register {
            protocol: PROTOCOL_VERSION,
            agent_info: agent_info(Some(&aid), "cpus:4;mem:4096"),
            tasks: vec![TaskReport {
                framework_id: fid.clone(),
                task,
                state: TaskState::Running,
                latest_status: None,
            }],
            executors: vec![ExecutorReport {
                framework_id: fid.clone(),
                executor: exec,
            }],
            frameworks: vec![fw_info.clone()],
        },
    );
    assert!(
        matches!(&agent_events(&out, A1)[0], agent::Event::Registered { reregistered: true, agent_id, .. } if *agent_id == aid)
    );
    assert_eq!(h.m.agents[&aid].used, r("cpus:1.5;mem:544"));
    assert!(h.m.frameworks[&fid].recovered);
    // The scheduler comes back: re-registered, and it can reconcile.
    let out = h.subscribe_info(S1, fw_info, false);
    assert!(matches!(
        &sched_events(&out, S1)[0],
        Event::Subscribed {
            reregistered: true,
            ..
        }
    ));
    let out = h.sched(S1, scheduler::Call::Reconcile { tasks: vec![] });
    assert_eq!(updates(&out, S1)[0].state, TaskState::Running);
    // It gets offers of what is left.
    assert_eq!(h.offers(S1)[0].resources, r("cpus:2.5;mem:3552"));
}

#[test]
fn agent_protocol_and_resources_are_checked() {
    let mut h = H::new();
    let out = h.agent(
        A1,
        agent::Call::Register {
            protocol: 7,
            agent_info: agent_info(None, "cpus:1"),
            tasks: vec![],
            executors: vec![],
            frameworks: vec![],
        },
    );
    assert!(matches!(
        &agent_events(&out, A1)[0],
        agent::Event::Error { fatal: true, .. }
    ));
    assert!(closed(&out, A1));
    let out = h.register_info(A2, agent_info(None, ""), vec![]);
    assert!(matches!(
        &agent_events(&out, A2)[0],
        agent::Event::Error { fatal: true, .. }
    ));
}

#[test]
fn teardown_kills_everything() {
    let (mut h, fid, aid, offer) = setup("cpus:4;mem:4096");
    h.launch(S1, &[&offer], vec![command_task("t1", &aid, "cpus:1")]);
    let out = h.sched(S1, scheduler::Call::Teardown);
    assert!(agent_events(&out, A1).contains(&agent::Event::ShutdownFramework { framework_id: fid }));
    assert!(fatal_error(&out, S1).is_some());
    assert!(closed(&out, S1));
    assert!(h.m.agents[&aid].used.is_empty() && h.m.offers.is_empty());
}

#[test]
fn snapshot_reflects_state() {
    let (mut h, fid, aid, offer) = setup("cpus:4;mem:4096");
    h.launch(S1, &[&offer], vec![command_task("t1", &aid, "cpus:1")]);
    let snap = h.m.snapshot();
    assert_eq!(snap.agents[0].used.text(), "cpus:1");
    assert_eq!(snap.frameworks[0].id, fid);
    assert_eq!(snap.frameworks[0].tasks[0].state, TaskState::Staging);
    let json = serde_json::to_value(&snap).unwrap();
    assert_eq!(json["agents"][0]["connected"], true);
}

#[test]
fn resent_update_of_an_acknowledged_terminal_task_is_acknowledged_not_forwarded() {
    let (mut h, fid, aid, offer) = setup("cpus:4;mem:4096");
    h.launch(S1, &[&offer], vec![command_task("t1", &aid, "cpus:1")]);
    h.status(A1, &fid, "t1", TaskState::Finished, "u1");
    h.sched(
        S1,
        scheduler::Call::Acknowledge {
            agent_id: aid.clone(),
            task_id: TaskId::new("t1"),
            uuid: "u1".into(),
        },
    );
    // The acknowledgement was lost on the way to the agent: it re-sends.
    let out = h.status(A1, &fid, "t1", TaskState::Finished, "u1");
    assert!(updates(&out, S1).is_empty(), "no second terminal update");
    assert!(agent_events(&out, A1).iter().any(|e| matches!(
        e,
        agent::Event::Acknowledge { uuid, .. } if uuid == "u1"
    )));
}

/// Found by the simulation (seed 430, "the same resources are never in
/// two outstanding offers"): an agent whose damaged log lost a task's end
/// reported the task running again when it re-registered; the master
/// adopted it, counting its resources on top of the later task that had
/// them (and would have forwarded a second terminal state).
#[test]
fn reregistration_does_not_revive_a_completed_task() {
    let (mut h, fid, aid, offer) = setup("cpus:4;mem:4096");
    let task = command_task("t1", &aid, "cpus:1");
    h.launch(S1, &[&offer], vec![task.clone()]);
    h.status(A1, &fid, "t1", TaskState::Finished, "u1");
    h.sched(
        S1,
        scheduler::Call::Acknowledge {
            agent_id: aid.clone(),
            task_id: TaskId::new("t1"),
            uuid: "u1".into(),
        },
    );
    assert!(!h.m.frameworks[&fid].tasks.contains_key(&TaskId::new("t1")));
    h.input(Input::AgentClosed { conn: A1 });
    let report = TaskReport {
        framework_id: fid.clone(),
        task,
        state: TaskState::Running,
        latest_status: None,
    };
    let out = h.register_info(A2, agent_info(Some(&aid), "cpus:4;mem:4096"), vec![report]);
    assert!(!h.m.frameworks[&fid].tasks.contains_key(&TaskId::new("t1")));
    assert!(h.m.agents[&aid].used.is_empty());
    assert!(agent_events(&out, A2).iter().any(|e| matches!(
        e,
        agent::Event::KillTask { task_id, .. } if task_id.as_str() == "t1"
    )));
    // The agent's own end of it is acknowledged, not forwarded.
    let out = h.status(A2, &fid, "t1", TaskState::Failed, "u2");
    assert!(updates(&out, S1).is_empty(), "no second terminal update");
    assert!(agent_events(&out, A2).iter().any(|e| matches!(
        e,
        agent::Event::Acknowledge { uuid, .. } if uuid == "u2"
    )));
}

#[test]
fn reconciliation_waits_for_agents_that_may_still_reregister() {
    let mut h = H::new();
    let fid = h.subscribe(S1, "fw");
    let reconcile = || scheduler::Call::Reconcile {
        tasks: vec![ReconcileTask {
            task_id: TaskId::new("t1"),
            agent_id: Some(AgentId::new("agent-of-the-old-master")),
        }],
    };
    // Just after a (re)start the agent may be on its way back: no answer.
    let out = h.sched(S1, reconcile());
    assert!(updates(&out, S1).is_empty());
    // After the ping timeout it is not coming back: the task is lost.
    let config = Config::default();
    h.advance(config.agent_ping_interval * config.max_missed_pings);
    let out = h.sched(S1, reconcile());
    let ups = updates(&out, S1);
    assert_eq!(ups.len(), 1, "{out:?}");
    assert_eq!(ups[0].state, TaskState::Lost);
    let _ = fid;
}

#[test]
fn kill_of_a_task_on_an_agent_still_to_reregister_waits_for_it() {
    // Found by the simulation: a master restarted from its registry
    // answered a KILL for a task of a not yet re-registered agent with
    // TASK_LOST; the agent came back and the task's own TASK_FINISHED
    // followed: two terminal states for one task.
    use crate::registry::{AgentRecord, FrameworkRecord};
    let mut state = RegistryState::default();
    let aid = AgentId::new("back");
    state.agents.insert(
        aid.clone(),
        AgentRecord {
            id: aid.clone(),
            info: agent_info(Some(&aid), "cpus:4;mem:4096"),
            principal: None,
            deactivated: false,
            drain: None,
        },
    );
    let fid = FrameworkId::new("fw");
    let mut info = FrameworkInfo::new("fw");
    info.id = Some(fid.clone());
    info.failover_timeout = 60.0;
    state.frameworks.insert(
        fid.clone(),
        FrameworkRecord {
            launch_epoch: 0,
            id: fid.clone(),
            info: info.clone(),
            disconnected_at: None,
        },
    );
    let config = Config {
        agent_reregister_timeout: Duration::from_secs(30),
        ..Config::default()
    };
    let mut h = H::with(config);
    h.m.recover(&state, h.now, 10_000.0);
    h.subscribe_info(S1, info, false);
    let kill = |agent_id: Option<AgentId>| scheduler::Call::Kill {
        task_id: TaskId::new("t1"),
        agent_id,
    };
    for agent_id in [Some(aid.clone()), None] {
        let out = h.sched(S1, kill(agent_id));
        assert!(updates(&out, S1).is_empty(), "{out:?}");
    }
    let report = TaskReport {
        framework_id: fid.clone(),
        task: command_task("t1", &aid, "cpus:1;mem:128"),
        state: TaskState::Running,
        latest_status: None,
    };
    h.register_info(A1, agent_info(Some(&aid), "cpus:4;mem:4096"), vec![report]);
    let out = h.sched(S1, kill(None));
    assert_eq!(
        agent_events(&out, A1),
        vec![agent::Event::KillTask {
            framework_id: fid.clone(),
            task_id: TaskId::new("t1")
        }]
    );
    // A task nobody has: lost, once no agent can bring it back.
    let ghost = scheduler::Call::Kill {
        task_id: TaskId::new("ghost"),
        agent_id: None,
    };
    let out = h.sched(S1, ghost);
    let u = &updates(&out, S1)[0];
    assert_eq!(
        (u.state, u.reason),
        (TaskState::Lost, Some(Reason::ReasonTaskUnknown))
    );
}

#[test]
fn a_reregistered_agent_counts_the_executors_it_reports_only() {
    // Found by the simulation: an executor whose exit was lost with the
    // agent's connection stayed counted as used after the agent came
    // back; an executor of a terminal task reported again was counted
    // anew. Either overcommits the agent.
    let (mut h, fid, aid, offer) = setup("cpus:4;mem:4096");
    let t1 = executor_task("t1", &aid, "cpus:1;mem:128", "e1", "cpus:0.5;mem:32");
    let t2 = executor_task("t2", &aid, "cpus:1;mem:128", "e2", "cpus:0.5;mem:32");
    h.launch(S1, &[&offer], vec![t1.clone(), t2.clone()]);
    assert_eq!(h.m.agents[&aid].used, r("cpus:3;mem:320"));
    h.input(Input::AgentClosed { conn: A1 });
    // Back: t1 runs on e1; t2 finished and its executor e2 exited while
    // the agent was away.
    let report = |task: &TaskInfo, state| TaskReport {
        framework_id: fid.clone(),
        task: task.clone(),
        state,
        latest_status: None,
    };
    h.agent(
        A2,
        agent::Call::Register {
            protocol: PROTOCOL_VERSION,
            agent_info: agent_info(Some(&aid), "cpus:4;mem:4096"),
            tasks: vec![
                report(&t1, TaskState::Running),
                report(&t2, TaskState::Finished),
            ],
            executors: vec![ExecutorReport {
                framework_id: fid.clone(),
                executor: t1.executor.clone().unwrap(),
            }],
            frameworks: vec![],
        },
    );
    assert_eq!(h.m.agents[&aid].used, r("cpus:1.5;mem:160"));
}

#[test]
fn a_kill_of_a_task_that_ended_answers_its_terminal_state() {
    // Found by the simulation: a kill racing a refused launch got
    // TASK_LOST after TASK_DROPPED, two terminal states.
    let (mut h, _fid, aid, offer) = setup("cpus:4;mem:4096");
    let out = h.launch(
        S1,
        &[&offer, &offer],
        vec![command_task("t1", &aid, "cpus:1")],
    );
    assert_eq!(updates(&out, S1)[0].state, TaskState::Dropped);
    let out = h.sched(
        S1,
        scheduler::Call::Kill {
            task_id: TaskId::new("t1"),
            agent_id: None,
        },
    );
    let ups = updates(&out, S1);
    assert_eq!(ups.len(), 1, "{out:?}");
    assert_eq!(
        (ups[0].state, ups[0].reason),
        (TaskState::Dropped, Some(Reason::ReasonReconciliation))
    );
}

#[test]
fn update_for_a_framework_not_yet_resubscribed_after_restart_is_left_to_retry() {
    let mut h = H::new();
    let aid = h.register(A1, "cpus:4;mem:4096");
    let fid = FrameworkId::new("fw-of-the-old-master");
    let out = h.status(A1, &fid, "t1", TaskState::Running, "u1");
    assert!(
        agent_events(&out, A1).is_empty(),
        "not acknowledged: the agent re-sends it once the framework is back"
    );
    let _ = aid;
}

#[test]
fn reconciliation_never_overtakes_the_update_stream() {
    let (mut h, fid, aid, offer) = setup("cpus:4;mem:4096");
    h.launch(S1, &[&offer], vec![command_task("t1", &aid, "cpus:1")]);
    h.input(Input::AgentClosed { conn: A1 });
    // The agent's executor already finished the task, but its stream
    // still holds TASK_RUNNING and TASK_FINISHED, undelivered.
    let report = TaskReport {
        framework_id: fid.clone(),
        task: command_task("t1", &aid, "cpus:1"),
        state: TaskState::Finished,
        latest_status: None,
    };
    h.register_info(A2, agent_info(Some(&aid), "cpus:4;mem:4096"), vec![report]);
    let reconcile = || scheduler::Call::Reconcile { tasks: vec![] };
    let out = h.sched(S1, reconcile());
    assert!(
        updates(&out, S1).is_empty(),
        "a terminal answer now would come before TASK_RUNNING"
    );
    h.status(A2, &fid, "t1", TaskState::Running, "u1");
    let out = h.sched(S1, reconcile());
    assert_eq!(updates(&out, S1)[0].state, TaskState::Running);
}

// --- registry: what is recorded, and recovery after a restart ---

fn ops(h: &mut H) -> Vec<RegistryOp> {
    h.m.take_registry_ops()
}

#[test]
fn registered_state_changes_are_recorded_for_the_registry() {
    let mut h = H::new();
    h.m.recover(&RegistryState::default(), h.now, 1000.0);
    let aid = h.register(A1, "cpus:4;mem:4096");
    assert!(matches!(&ops(&mut h)[..], [RegistryOp::PutAgent(a)] if a.id == aid));
    let mut info = FrameworkInfo::new("fw");
    info.failover_timeout = 60.0;
    let out = h.subscribe_info(S1, info, false);
    let fid = match &sched_events(&out, S1)[0] {
        Event::Subscribed { framework_id, .. } => framework_id.clone(),
        e => panic!("{e:?}"),
    };
    assert!(matches!(&ops(&mut h)[..],
        [RegistryOp::PutFramework(f)] if f.id == fid && f.disconnected_at.is_none() && f.info.failover_timeout == 60.0));
    // Unchanged re-registration writes nothing; a change is recorded.
    h.input(Input::AgentClosed { conn: A1 });
    h.register_info(A2, agent_info(Some(&aid), "cpus:4;mem:4096"), vec![]);
    assert!(ops(&mut h).is_empty());
    h.input(Input::SchedulerClosed { conn: S1 });
    assert!(matches!(&ops(&mut h)[..],
        [RegistryOp::PutFramework(f)] if f.id == fid && f.disconnected_at.is_some()));
    h.advance(Duration::from_secs(61));
    assert!(ops(&mut h).contains(&RegistryOp::RemoveFramework { id: fid }));
    let config = Config::default();
    h.input(Input::AgentClosed { conn: A2 });
    h.advance(config.agent_ping_interval * (config.max_missed_pings + 1));
    assert!(ops(&mut h).contains(&RegistryOp::RemoveAgent { id: aid }));
}

#[test]
fn without_a_registry_nothing_is_recorded() {
    let mut h = H::new();
    h.register(A1, "cpus:4;mem:4096");
    h.subscribe(S1, "fw");
    assert!(ops(&mut h).is_empty());
}

#[test]
fn recovery_rebuilds_agents_frameworks_and_refusals() {
    use crate::registry::{AgentRecord, FrameworkRecord};
    let wall = 10_000.0;
    let mut state = RegistryState::default();
    let back = AgentId::new("back");
    let gone = AgentId::new("gone");
    for aid in [&back, &gone] {
        state.agents.insert(
            aid.clone(),
            AgentRecord {
                id: aid.clone(),
                info: agent_info(Some(aid), "cpus:4;mem:4096"),
                principal: None,
                deactivated: false,
                drain: None,
            },
        );
    }
    let removed = AgentId::new("removed");
    state.removed_agents.push_back(removed.clone());
    let framework = |id: &str, failover: f64, disconnected_at: Option<f64>| {
        let mut info = FrameworkInfo::new(id);
        info.id = Some(FrameworkId::new(id));
        info.failover_timeout = failover;
        FrameworkRecord {
            launch_epoch: 0,
            id: FrameworkId::new(id),
            info,
            disconnected_at,
        }
    };
    // Connected when the master died; disconnected and expired during the
    // downtime; disconnected with time left.
    for record in [
        framework("live", 60.0, None),
        framework("expired", 30.0, Some(wall - 100.0)),
        framework("waiting", 60.0, Some(wall - 10.0)),
    ] {
        state.frameworks.insert(record.id.clone(), record);
    }
    let config = Config {
        agent_reregister_timeout: Duration::from_secs(30),
        recovered_framework_timeout: Duration::from_secs(120),
        ..Config::default()
    };
    let mut h = H::with(config);
    h.m.recover(&state, h.now, wall);
    let live = FrameworkId::new("live");
    let expired = FrameworkId::new("expired");
    let waiting = FrameworkId::new("waiting");
    assert_eq!(
        ops(&mut h),
        [RegistryOp::RemoveFramework {
            id: expired.clone()
        }]
    );
    assert!(!h.m.frameworks.contains_key(&expired));
    assert_eq!(
        h.m.frameworks[&waiting].failover_deadline,
        Some(h.now + Duration::from_secs(50))
    );
    assert_eq!(
        h.m.frameworks[&live].failover_deadline,
        Some(h.now + Duration::from_secs(120))
    );

    // A removed agent is refused.
    let out = h.register_info(A2, agent_info(Some(&removed), "cpus:1;mem:64"), vec![]);
    assert!(matches!(
        &agent_events(&out, A2)[..],
        [agent::Event::Shutdown { .. }]
    ));

    // A returning agent gets its tasks rebuilt; the expired framework's
    // tasks are shut down.
    let report = |fid: &FrameworkId, tid: &str| TaskReport {
        framework_id: fid.clone(),
        task: command_task(tid, &back, "cpus:1;mem:128"),
        state: TaskState::Running,
        latest_status: None,
    };
    let out = h.register_info(
        A1,
        agent_info(Some(&back), "cpus:4;mem:4096"),
        vec![report(&live, "t1"), report(&expired, "t2")],
    );
    let events = agent_events(&out, A1);
    assert!(matches!(
        &events[0],
        agent::Event::Registered {
            reregistered: true,
            ..
        }
    ));
    assert!(events.iter().any(
        |e| matches!(e, agent::Event::ShutdownFramework { framework_id } if *framework_id == expired)
    ));
    assert!(ops(&mut h).is_empty(), "the agent's record is unchanged");
    assert!(!h.m.agents[&back].recovering);
    assert_eq!(h.m.agents[&back].used, r("cpus:1;mem:128"));

    // The framework comes back; the expired one is refused.
    let mut info = FrameworkInfo::new("live");
    info.id = Some(live.clone());
    let out = h.subscribe_info(S1, info, false);
    assert!(matches!(
        &sched_events(&out, S1)[0],
        Event::Subscribed {
            reregistered: true,
            ..
        }
    ));
    let mut info = FrameworkInfo::new("expired");
    info.id = Some(expired.clone());
    let out = h.subscribe_info(S2, info, false);
    assert!(fatal_error(&out, S2).is_some_and(|m| m.contains("removed")));

    // A task on the agent that has not come back yet: no answer while it
    // may; TASK_LOST once it is removed after the timeout.
    let reconcile = || scheduler::Call::Reconcile {
        tasks: vec![ReconcileTask {
            task_id: TaskId::new("t9"),
            agent_id: Some(gone.clone()),
        }],
    };
    let out = h.sched(S1, reconcile());
    assert!(updates(&out, S1).is_empty());
    let out = h.advance(Duration::from_secs(31));
    // The agent that came back is offered meanwhile.
    assert!(offers_in(&out, S1).iter().all(|o| o.agent_id == back));
    assert!(!offers_in(&out, S1).is_empty());
    assert!(sched_events(&out, S1).iter().any(
        |e| matches!(e, Event::Failure { agent_id, executor_id: None, .. } if *agent_id == gone)
    ));
    assert!(ops(&mut h).contains(&RegistryOp::RemoveAgent { id: gone.clone() }));
    let out = h.sched(S1, reconcile());
    assert_eq!(updates(&out, S1)[0].state, TaskState::Lost);
    assert!(h.m.agents.contains_key(&back));
}

/// The review's sequence: `t1` finishes on agent A while A is away (the
/// acknowledgement to A is dropped), the framework launches `t1` again on
/// agent B, then A comes back reporting the old `t1` and re-sends its
/// TASK_FINISHED. The master must neither end B's task nor charge or free
/// its resources twice: A's reports are refused (and counted), and A's
/// update is acknowledged to A so its stream drains.
#[test]
fn reports_about_a_task_on_another_agent_are_refused() {
    const B1: ConnId = 103;
    const A3: ConnId = 104;
    let mut h = H::new();
    let fid = h.subscribe(S1, "fw");
    let a = h.register(A1, "cpus:2;mem:1024");
    let offer_a = h.offers(S1).remove(0);
    let t1_on_a = command_task("t1", &a, "cpus:1;mem:256");
    h.launch(S1, &[&offer_a], vec![t1_on_a.clone()]);
    h.status(A1, &fid, "t1", TaskState::Finished, "old");
    h.input(Input::AgentClosed { conn: A1 });
    let out = h.sched(
        S1,
        scheduler::Call::Acknowledge {
            agent_id: a.clone(),
            task_id: TaskId::new("t1"),
            uuid: "old".into(),
        },
    );
    assert!(agent_events(&out, A1).is_empty(), "A is away");
    assert!(!h.m.frameworks[&fid].tasks.contains_key(&TaskId::new("t1")));

    let b = h.register(B1, "cpus:2;mem:1024");
    let offer_b = h.offer_from(S1, &b);
    h.launch(
        S1,
        &[&offer_b],
        vec![command_task("t1", &b, "cpus:1;mem:256")],
    );
    h.status(B1, &fid, "t1", TaskState::Running, "b-running");

    // A re-registers, still holding the old t1's unacknowledged stream.
    let mut finished = TaskStatus::new(
        TaskId::new("t1"),
        TaskState::Finished,
        Source::SourceExecutor,
    );
    finished.uuid = Some("old".into());
    let report = TaskReport {
        framework_id: fid.clone(),
        task: t1_on_a,
        state: TaskState::Finished,
        latest_status: Some(finished),
    };
    h.register_info(A3, agent_info(Some(&a), "cpus:2;mem:1024"), vec![report]);
    assert!(!h.m.agents[&a]
        .tasks
        .contains(&(fid.clone(), TaskId::new("t1"))));
    assert!(h.m.agents[&a].used.is_empty(), "nothing charged to A");
    let out = h.status(A3, &fid, "t1", TaskState::Finished, "old");
    assert!(updates(&out, S1).is_empty(), "not forwarded");
    assert_eq!(
        agent_events(&out, A3),
        vec![agent::Event::Acknowledge {
            framework_id: fid.clone(),
            task_id: TaskId::new("t1"),
            uuid: "old".into()
        }]
    );
    let task = &h.m.frameworks[&fid].tasks[&TaskId::new("t1")];
    assert_eq!((task.state, &task.agent_id), (TaskState::Running, &b));
    assert_eq!(h.m.agents[&b].used, r("cpus:1;mem:256"));
    assert_eq!(h.m.metrics.reports_refused_update.get(), 1);
    assert_eq!(h.m.metrics.reports_refused_reregistration.get(), 1);

    // An update claiming another agent's id speaks for its sender.
    let mut forged = TaskStatus::new(TaskId::new("t1"), TaskState::Failed, Source::SourceExecutor);
    forged.uuid = Some("forged".into());
    forged.agent_id = Some(b.clone());
    let out = h.agent(
        A3,
        agent::Call::StatusUpdate {
            framework_id: fid.clone(),
            status: forged,
        },
    );
    assert!(updates(&out, S1).is_empty());
    assert_eq!(
        h.m.frameworks[&fid].tasks[&TaskId::new("t1")].state,
        TaskState::Running
    );
    assert_eq!(h.m.metrics.reports_refused_update.get(), 2);
}

// --- a task id used again: earlier launches' reports and updates ---

fn acknowledge(h: &mut H, aid: &AgentId, task: &str, uuid: &str) -> Vec<Output> {
    h.sched(
        S1,
        scheduler::Call::Acknowledge {
            agent_id: aid.clone(),
            task_id: TaskId::new(task),
            uuid: uuid.into(),
        },
    )
}

fn reconcile(h: &mut H, ids: &[&str]) -> Vec<TaskStatus> {
    let call = scheduler::Call::Reconcile {
        tasks: ids
            .iter()
            .map(|id| ReconcileTask {
                task_id: TaskId::new(*id),
                agent_id: None,
            })
            .collect(),
    };
    let out = h.sched(S1, call);
    updates(&out, S1)
}

/// The tasks of the RUN_TASKs sent to `conn`.
fn run_tasks(out: &[Output], conn: ConnId) -> Vec<TaskInfo> {
    agent_events(out, conn)
        .into_iter()
        .filter_map(|e| match e {
            agent::Event::RunTask { task, .. } => Some(task),
            _ => None,
        })
        .collect()
}

fn acknowledged(out: &[Output], conn: ConnId, uuid: &str) -> bool {
    agent_events(out, conn)
        .iter()
        .any(|e| matches!(e, agent::Event::Acknowledge { uuid: u, .. } if u == uuid))
}

fn report(fid: &FrameworkId, task: &TaskInfo, state: TaskState) -> TaskReport {
    TaskReport {
        framework_id: fid.clone(),
        task: task.clone(),
        state,
        latest_status: None,
    }
}

fn stamped(id: &str, agent: &AgentId, stamp: Option<LaunchStamp>) -> TaskInfo {
    TaskInfo {
        allocation_role: None,
        launch_stamp: stamp,
        ..command_task(id, agent, "cpus:1;mem:128")
    }
}

/// A master just started (no registry) with the scheduler of `fw`
/// subscribed again on S1, waiting for its agents to re-register.
fn restarted_with_framework() -> (H, FrameworkId) {
    let mut h = H::new();
    let fid = FrameworkId::new("fw");
    let mut info = FrameworkInfo::new("fw");
    info.id = Some(fid.clone());
    info.failover_timeout = 3600.0;
    let out = h.subscribe_info(S1, info, false);
    assert!(matches!(
        &sched_events(&out, S1)[0],
        Event::Subscribed {
            reregistered: true,
            ..
        }
    ));
    (h, fid)
}

/// Found by the simulation (bce9b07): an agent whose acknowledgement of a
/// task's terminal update was lost re-sent it after the framework had
/// launched the id again on the same agent; the master took it for the
/// new task, ended it and freed its resources while it ran.
#[test]
fn a_late_resend_of_a_completed_tasks_last_update_leaves_the_new_task_of_its_id_alone() {
    let (mut h, fid, aid, offer) = setup("cpus:4;mem:4096");
    h.launch(S1, &[&offer], vec![command_task("t1", &aid, "cpus:1")]);
    h.status(A1, &fid, "t1", TaskState::Finished, "u1");
    acknowledge(&mut h, &aid, "t1", "u1");
    assert!(!h.m.frameworks[&fid].tasks.contains_key(&TaskId::new("t1")));

    let offer = offers_in(&h.advance(Duration::from_secs(6)), S1).remove(0);
    let out = h.launch(S1, &[&offer], vec![command_task("t1", &aid, "cpus:1")]);
    assert_eq!(run_tasks(&out, A1).len(), 1, "t1 launched again");

    // The acknowledgement of u1 was lost: the agent re-sends it.
    let out = h.status(A1, &fid, "t1", TaskState::Finished, "u1");
    assert!(updates(&out, S1).is_empty(), "not forwarded: {out:?}");
    assert!(
        acknowledged(&out, A1, "u1"),
        "acknowledged so the stream drains"
    );
    assert_eq!(h.m.metrics.reports_refused_update.get(), 1);
    let task = &h.m.frameworks[&fid].tasks[&TaskId::new("t1")];
    assert_eq!((task.state, &task.agent_id), (TaskState::Staging, &aid));
    assert_eq!(h.m.agents[&aid].used, r("cpus:1"), "still charged");
    let offers = offers_in(&h.advance(Duration::from_secs(6)), S1);
    assert_eq!(offers.len(), 1);
    assert_eq!(
        offers[0].resources,
        r("cpus:3;mem:4096"),
        "not offered again"
    );

    // The new task's own updates go through.
    let out = h.status(A1, &fid, "t1", TaskState::Running, "u2");
    assert_eq!(updates(&out, S1)[0].state, TaskState::Running);
    let out = h.status(A1, &fid, "t1", TaskState::Finished, "u3");
    assert_eq!(updates(&out, S1)[0].state, TaskState::Finished);
    assert!(h.m.agents[&aid].used.is_empty());
}

/// Found by the simulation (5e0c9b4): `t1` ends on agent A, its
/// framework launches it again on agent B, and A comes back still
/// holding its ended copy. A's re-registration must not take B's task for
/// its own (TASK_LOST, removed) nor charge A for it.
#[test]
fn an_agent_reporting_an_ended_copy_of_a_task_id_relaunched_elsewhere_leaves_it_alone() {
    const B1: ConnId = 103;
    const A3: ConnId = 104;
    let mut h = H::new();
    let fid = h.subscribe(S1, "fw");
    let a = h.register(A1, "cpus:2;mem:1024");
    let offer_a = h.offers(S1).remove(0);
    let out = h.launch(
        S1,
        &[&offer_a],
        vec![command_task("t1", &a, "cpus:1;mem:256")],
    );
    // As A received it, with the master's stamp.
    let t1_on_a = run_tasks(&out, A1).remove(0);
    h.status(A1, &fid, "t1", TaskState::Finished, "a-finished");
    h.input(Input::AgentClosed { conn: A1 });
    acknowledge(&mut h, &a, "t1", "a-finished");
    assert!(!h.m.frameworks[&fid].tasks.contains_key(&TaskId::new("t1")));

    let b = h.register(B1, "cpus:2;mem:1024");
    let offer_b = h.offer_from(S1, &b);
    h.launch(
        S1,
        &[&offer_b],
        vec![command_task("t1", &b, "cpus:1;mem:256")],
    );
    h.status(B1, &fid, "t1", TaskState::Running, "b-running");

    // A comes back reporting its ended t1 (no latest update: not told
    // apart by its uuid, only by where the id lives now).
    let out = h.register_info(
        A3,
        agent_info(Some(&a), "cpus:2;mem:1024"),
        vec![report(&fid, &t1_on_a, TaskState::Finished)],
    );
    assert!(updates(&out, S1).is_empty(), "no TASK_LOST: {out:?}");
    assert_eq!(h.m.metrics.reports_refused_reregistration.get(), 1);
    let task = &h.m.frameworks[&fid].tasks[&TaskId::new("t1")];
    assert_eq!((task.state, &task.agent_id), (TaskState::Running, &b));
    assert!(!h.m.agents[&a]
        .tasks
        .contains(&(fid.clone(), TaskId::new("t1"))));
    assert!(h.m.agents[&a].used.is_empty(), "nothing charged to A");
    assert_eq!(h.m.agents[&b].used, r("cpus:1;mem:256"));

    // A's re-sent end is acknowledged to A, not forwarded.
    let out = h.status(A3, &fid, "t1", TaskState::Finished, "a-finished");
    assert!(updates(&out, S1).is_empty());
    assert!(acknowledged(&out, A3, "a-finished"));
    assert_eq!(
        h.m.frameworks[&fid].tasks[&TaskId::new("t1")].state,
        TaskState::Running
    );
    let ups = reconcile(&mut h, &["t1"]);
    assert_eq!(
        (ups[0].state, ups[0].agent_id.as_ref()),
        (TaskState::Running, Some(&b))
    );
}

/// The other half of 5e0c9b4: the id is launched again on B before the
/// scheduler acknowledged its end on A. The ended task leaves A's books,
/// so A's re-registration without it neither declares B's task
/// TASK_LOST nor sends it to A again.
#[test]
fn reusing_an_ended_task_id_on_another_agent_takes_it_off_the_old_agents_books() {
    const B1: ConnId = 103;
    const A3: ConnId = 104;
    let mut h = H::new();
    let fid = h.subscribe(S1, "fw");
    let a = h.register(A1, "cpus:2;mem:1024");
    let offer_a = h.offers(S1).remove(0);
    h.launch(
        S1,
        &[&offer_a],
        vec![command_task("t1", &a, "cpus:1;mem:256")],
    );
    let out = h.status(A1, &fid, "t1", TaskState::Finished, "a-finished");
    assert_eq!(updates(&out, S1)[0].state, TaskState::Finished);
    h.input(Input::AgentClosed { conn: A1 });

    let b = h.register(B1, "cpus:2;mem:1024");
    let offer_b = h.offer_from(S1, &b);
    h.launch(
        S1,
        &[&offer_b],
        vec![command_task("t1", &b, "cpus:1;mem:256")],
    );
    let key = (fid.clone(), TaskId::new("t1"));
    assert!(!h.m.agents[&a].tasks.contains(&key));
    assert!(h.m.agents[&b].tasks.contains(&key));
    h.status(B1, &fid, "t1", TaskState::Running, "b-running");

    // A's stream drained elsewhere; it comes back without t1.
    let out = h.register_info(A3, agent_info(Some(&a), "cpus:2;mem:1024"), vec![]);
    assert!(updates(&out, S1).is_empty(), "no TASK_LOST: {out:?}");
    assert!(run_tasks(&out, A3).is_empty(), "B's t1 is not A's to run");
    let task = &h.m.frameworks[&fid].tasks[&TaskId::new("t1")];
    assert_eq!((task.state, &task.agent_id), (TaskState::Running, &b));
    assert!(h.m.agents[&a].used.is_empty());
    assert_eq!(h.m.agents[&b].used, r("cpus:1;mem:256"));

    // The scheduler's late acknowledgement of A's end goes to A and
    // leaves B's task alone.
    let out = acknowledge(&mut h, &a, "t1", "a-finished");
    assert!(acknowledged(&out, A3, "a-finished"));
    let task = &h.m.frameworks[&fid].tasks[&TaskId::new("t1")];
    assert_eq!((task.state, &task.agent_id), (TaskState::Running, &b));
}

/// Found by the simulation (d91c7e0, seed 72): launch 2 of an id whose
/// task had ended was TASK_DROPPED, then reconciliation answered the
/// first task's TASK_FINISHED.
#[test]
fn a_refused_launch_of_an_ended_tasks_id_is_what_reconciliation_answers() {
    let (mut h, fid, aid, offer) = setup("cpus:4;mem:4096");
    h.launch(
        S1,
        &[&offer],
        vec![
            command_task("t1", &aid, "cpus:1"),
            command_task("t2", &aid, "cpus:1"),
        ],
    );
    // Both end; the scheduler has not acknowledged either yet.
    h.status(A1, &fid, "t1", TaskState::Finished, "u1");
    h.status(A1, &fid, "t2", TaskState::Finished, "u2");

    // t1 again on an offer that is no more: TASK_DROPPED.
    let out = h.launch(S1, &[&offer], vec![command_task("t1", &aid, "cpus:1")]);
    let ups = updates(&out, S1);
    assert_eq!(
        (ups[0].state, ups[0].reason),
        (TaskState::Dropped, Some(Reason::ReasonInvalidOffers))
    );
    // t2 again, too big for the offer: TASK_ERROR.
    let offer = offers_in(&h.advance(Duration::from_secs(6)), S1).remove(0);
    let out = h.launch(S1, &[&offer], vec![command_task("t2", &aid, "cpus:100")]);
    let ups = updates(&out, S1);
    assert_eq!(
        (ups[0].state, ups[0].reason),
        (TaskState::Error, Some(Reason::ReasonInsufficientResources))
    );

    let ups = reconcile(&mut h, &["t1", "t2"]);
    let answers: Vec<_> = ups.iter().map(|u| (u.state, u.reason)).collect();
    assert_eq!(
        answers,
        [
            (TaskState::Dropped, Some(Reason::ReasonReconciliation)),
            (TaskState::Error, Some(Reason::ReasonReconciliation)),
        ],
        "the refusals, not the earlier tasks' ends"
    );
    assert!(reconcile(&mut h, &[]).is_empty(), "no live task");
    assert!(h.m.agents[&aid].tasks.is_empty());

    // The earlier t1's end, re-sent, is acknowledged and not forwarded;
    // its late acknowledgement changes nothing.
    let out = h.status(A1, &fid, "t1", TaskState::Finished, "u1");
    assert!(updates(&out, S1).is_empty());
    assert!(acknowledged(&out, A1, "u1"));
    acknowledge(&mut h, &aid, "t1", "u1");
    assert_eq!(reconcile(&mut h, &["t1"])[0].state, TaskState::Dropped);
}

/// The master stamps every launch it accepts, replacing what the
/// scheduler sent, and the stamps of one framework strictly increase:
/// within a subscription, across a re-subscription, and across a master
/// restart from the registry (whose framework record keeps the epoch).
#[test]
fn every_accepted_launch_is_stamped_later_than_the_ones_before() {
    let mut h = H::new();
    h.m.recover(&RegistryState::default(), h.now, 1000.0);
    let mut info = FrameworkInfo::new("fw");
    info.failover_timeout = 60.0;
    let out = h.subscribe_info(S1, info.clone(), false);
    let fid = match &sched_events(&out, S1)[0] {
        Event::Subscribed { framework_id, .. } => framework_id.clone(),
        e => panic!("{e:?}"),
    };
    let last_record = |ops: Vec<RegistryOp>| {
        ops.into_iter()
            .rev()
            .find_map(|op| match op {
                RegistryOp::PutFramework(f) => Some(f),
                _ => None,
            })
            .expect("the framework's record is written")
    };
    let record = last_record(ops(&mut h));
    let epoch1 = record.launch_epoch;
    assert_eq!(h.m.frameworks[&fid].launch_epoch, epoch1);

    let aid = h.register(A1, "cpus:4;mem:4096");
    let offer = h.offers(S1).remove(0);
    let scheduler_stamp = LaunchStamp {
        epoch: u64::MAX,
        seq: u64::MAX,
    };
    let t1 = stamped("t1", &aid, Some(scheduler_stamp));
    let out = h.launch(S1, &[&offer], vec![t1, stamped("t2", &aid, None)]);
    let sent = run_tasks(&out, A1);
    assert_eq!(sent.len(), 2);
    let s1 = sent[0].launch_stamp.expect("t1 stamped");
    let s2 = sent[1].launch_stamp.expect("t2 stamped");
    assert_ne!(s1, scheduler_stamp, "the scheduler's stamp is replaced");
    assert_eq!(s1.epoch, epoch1);
    assert!(s1 < s2, "{s1:?} {s2:?}");
    let held = |h: &H, id: &str| {
        h.m.frameworks[&fid].tasks[&TaskId::new(id)]
            .info
            .launch_stamp
    };
    assert_eq!(held(&h, "t1"), Some(s1), "the master keeps what it sent");

    let offer = offers_in(&h.advance(Duration::from_secs(6)), S1).remove(0);
    let out = h.launch(S1, &[&offer], vec![stamped("t3", &aid, None)]);
    let s3 = run_tasks(&out, A1)[0].launch_stamp.expect("t3 stamped");
    assert!(s2 < s3, "{s2:?} {s3:?}");

    // The scheduler fails over: a new epoch, recorded before SUBSCRIBED.
    h.input(Input::SchedulerClosed { conn: S1 });
    ops(&mut h);
    let info = FrameworkInfo {
        id: Some(fid.clone()),
        ..info
    };
    let out = h.subscribe_info(S2, info.clone(), false);
    assert!(matches!(
        &sched_events(&out, S2)[0],
        Event::Subscribed {
            reregistered: true,
            ..
        }
    ));
    let record = last_record(ops(&mut h));
    let epoch2 = record.launch_epoch;
    assert!(epoch2 > epoch1);
    let offer = h.offers(S2).remove(0);
    let out = h.launch(S2, &[&offer], vec![stamped("t4", &aid, None)]);
    let s4 = run_tasks(&out, A1)[0].launch_stamp.expect("t4 stamped");
    assert_eq!(s4.epoch, epoch2);
    assert!(s3 < s4, "{s3:?} {s4:?}");

    // A new master recovers the record and the scheduler subscribes to
    // it; once with the record as written, once with an epoch far ahead
    // of this machine's clock (written by a master whose clock was).
    let ahead = crate::registry::FrameworkRecord {
        launch_epoch: agora_proto::now_timestamp() as u64 + 1_000_000,
        ..record.clone()
    };
    for record in [record, ahead] {
        let mut state = RegistryState::default();
        state.frameworks.insert(fid.clone(), record.clone());
        let mut h = H::new();
        h.m.recover(&state, h.now, 1000.0);
        h.subscribe_info(S1, info.clone(), false);
        let epoch = last_record(ops(&mut h)).launch_epoch;
        assert!(epoch > record.launch_epoch);
        let aid = h.register(A1, "cpus:4;mem:4096");
        let offer = h.offers(S1).remove(0);
        let out = h.launch(S1, &[&offer], vec![stamped("t5", &aid, None)]);
        let s5 = run_tasks(&out, A1)[0].launch_stamp.expect("t5 stamped");
        assert_eq!(s5.epoch, epoch);
        assert!(s4 < s5, "{s4:?} {s5:?}");
        assert!(
            s5.epoch > record.launch_epoch,
            "later than any launch of the recorded epoch"
        );
    }
}

/// After a master restart two agents report the same task id, launched
/// twice. Whichever re-registers first, the launch with the later stamp
/// is the task: its updates reach the scheduler; the earlier launch is
/// neither adopted nor charged, and its updates are acknowledged to its
/// agent without being forwarded.
#[test]
fn reregistration_keeps_the_later_launch_of_an_id_two_agents_report() {
    let early = LaunchStamp { epoch: 7, seq: 9 };
    let later = LaunchStamp { epoch: 8, seq: 0 };
    for early_first in [true, false] {
        for early_state in [TaskState::Running, TaskState::Finished] {
            let case = format!("early first: {early_first}, early {early_state}");
            let (mut h, fid) = restarted_with_framework();
            let a = AgentId::new("a");
            let b = AgentId::new("b");
            let early_report = report(&fid, &stamped("t1", &a, Some(early)), early_state);
            let later_report = report(&fid, &stamped("t1", &b, Some(later)), TaskState::Running);
            let mut outs = Vec::new();
            let mut reregister = |h: &mut H, conn, aid: &AgentId, rep: &TaskReport| {
                let out = h.register_info(
                    conn,
                    agent_info(Some(aid), "cpus:4;mem:4096"),
                    vec![rep.clone()],
                );
                outs.extend(out);
            };
            if early_first {
                reregister(&mut h, A1, &a, &early_report);
                reregister(&mut h, A2, &b, &later_report);
            } else {
                reregister(&mut h, A2, &b, &later_report);
                reregister(&mut h, A1, &a, &early_report);
            }
            assert!(updates(&outs, S1).is_empty(), "{case}: {outs:?}");
            let task = &h.m.frameworks[&fid].tasks[&TaskId::new("t1")];
            assert_eq!(
                (task.state, &task.agent_id, task.info.launch_stamp),
                (TaskState::Running, &b, Some(later)),
                "{case}"
            );
            let key = (fid.clone(), TaskId::new("t1"));
            assert!(!h.m.agents[&a].tasks.contains(&key), "{case}");
            assert!(h.m.agents[&a].used.is_empty(), "{case}");
            assert_eq!(h.m.agents[&b].used, r("cpus:1;mem:128"), "{case}");
            if early_first && early_state == TaskState::Running {
                assert!(
                    agent_events(&outs, A1).iter().any(|e| matches!(
                        e,
                        agent::Event::KillTask { task_id, .. } if task_id.as_str() == "t1"
                    )),
                    "{case}: the earlier copy, adopted first, is killed"
                );
            }

            only_the_later_end_is_forwarded(&mut h, &fid, &b, TaskState::Killed, &case);
            assert!(h.m.agents[&b].used.is_empty(), "{case}");
        }
    }
}

/// After a master restart: a launch of `t1` completed on agent B; agent
/// A then reports an ended launch of `t1` stamped earlier. It is not
/// adopted (its end was settled: the later launch exists), and its
/// update is acknowledged without being forwarded. An ended launch
/// stamped later than the completed one is adopted, and its end reaches
/// the scheduler.
#[test]
fn reregistration_refuses_an_ended_launch_no_later_than_a_completed_one() {
    const C1: ConnId = 103;
    let (mut h, fid) = restarted_with_framework();
    let a = AgentId::new("a");
    let b = AgentId::new("b");
    let c = AgentId::new("c");
    let stamp = |epoch, seq| Some(LaunchStamp { epoch, seq });
    let t1_on_b = stamped("t1", &b, stamp(8, 0));
    h.register_info(
        A2,
        agent_info(Some(&b), "cpus:4;mem:4096"),
        vec![report(&fid, &t1_on_b, TaskState::Running)],
    );
    let out = h.status(A2, &fid, "t1", TaskState::Finished, "b-end");
    assert_eq!(updates(&out, S1)[0].state, TaskState::Finished);
    acknowledge(&mut h, &b, "t1", "b-end");
    assert!(!h.m.frameworks[&fid].tasks.contains_key(&TaskId::new("t1")));

    for (conn, aid, epoch, seq) in [(A1, &a, 7, 9), (A1, &a, 8, 0)] {
        let case = format!("stamp ({epoch}, {seq})");
        let refused = h.m.metrics.reports_refused_reregistration.get();
        let t1 = stamped("t1", aid, stamp(epoch, seq));
        let out = h.register_info(
            conn,
            agent_info(Some(aid), "cpus:4;mem:4096"),
            vec![report(&fid, &t1, TaskState::Finished)],
        );
        assert!(updates(&out, S1).is_empty(), "{case}");
        assert_eq!(
            h.m.metrics.reports_refused_reregistration.get(),
            refused + 1,
            "{case}"
        );
        assert!(
            !h.m.frameworks[&fid].tasks.contains_key(&TaskId::new("t1")),
            "{case}: not adopted"
        );
        assert!(h.m.agents[aid].tasks.is_empty(), "{case}");
        assert!(h.m.agents[aid].used.is_empty(), "{case}");
        let out = h.status(conn, &fid, "t1", TaskState::Finished, "a-end");
        assert!(updates(&out, S1).is_empty(), "{case}");
        assert!(acknowledged(&out, conn, "a-end"), "{case}");
        let ups = reconcile(&mut h, &["t1"]);
        assert_eq!(
            (ups[0].state, ups[0].agent_id.as_ref()),
            (TaskState::Finished, Some(&b)),
            "{case}: B's end stands"
        );
        h.input(Input::AgentClosed { conn });
    }

    // Stamped later than the completed launch: adopted.
    let t1_on_c = stamped("t1", &c, stamp(9, 0));
    h.register_info(
        C1,
        agent_info(Some(&c), "cpus:4;mem:4096"),
        vec![report(&fid, &t1_on_c, TaskState::Finished)],
    );
    let task = &h.m.frameworks[&fid].tasks[&TaskId::new("t1")];
    assert_eq!((task.state, &task.agent_id), (TaskState::Finished, &c));
    let out = h.status(C1, &fid, "t1", TaskState::Finished, "c-end");
    let ups = updates(&out, S1);
    assert_eq!(ups.len(), 1);
    assert_eq!(
        (ups[0].state, ups[0].agent_id.as_ref()),
        (TaskState::Finished, Some(&c))
    );
}

/// Without launch stamps (agents of before them), a report of the id
/// running is later than the master's record of it ended on another
/// agent (an id is launched again only once its task ended): whichever
/// agent re-registers first, the running one is the task.
#[test]
fn without_stamps_a_running_report_supersedes_an_ended_record_elsewhere() {
    for ended_first in [true, false] {
        let case = format!("ended first: {ended_first}");
        let (mut h, fid) = restarted_with_framework();
        let a = AgentId::new("a");
        let b = AgentId::new("b");
        let mut ended = report(&fid, &stamped("t1", &a, None), TaskState::Finished);
        let mut finished = TaskStatus::new(
            TaskId::new("t1"),
            TaskState::Finished,
            Source::SourceExecutor,
        );
        finished.uuid = Some("a-end".into());
        ended.latest_status = Some(finished);
        let running = report(&fid, &stamped("t1", &b, None), TaskState::Running);
        let mut outs = Vec::new();
        let order = if ended_first {
            [(A1, &a, &ended), (A2, &b, &running)]
        } else {
            [(A2, &b, &running), (A1, &a, &ended)]
        };
        for (conn, aid, rep) in order {
            outs.extend(h.register_info(
                conn,
                agent_info(Some(aid), "cpus:4;mem:4096"),
                vec![rep.clone()],
            ));
        }
        assert!(updates(&outs, S1).is_empty(), "{case}: {outs:?}");
        let task = &h.m.frameworks[&fid].tasks[&TaskId::new("t1")];
        assert_eq!(
            (task.state, &task.agent_id),
            (TaskState::Running, &b),
            "{case}"
        );
        let key = (fid.clone(), TaskId::new("t1"));
        assert!(!h.m.agents[&a].tasks.contains(&key), "{case}");
        assert!(h.m.agents[&b].tasks.contains(&key), "{case}");
        assert!(h.m.agents[&a].used.is_empty(), "{case}");
        assert_eq!(h.m.agents[&b].used, r("cpus:1;mem:128"), "{case}");
        let ups = reconcile(&mut h, &["t1"]);
        assert_eq!(
            (ups[0].state, ups[0].agent_id.as_ref()),
            (TaskState::Running, Some(&b)),
            "{case}"
        );

        only_the_later_end_is_forwarded(&mut h, &fid, &b, TaskState::Finished, &case);
    }
}

/// After a restart, the agent of an earlier launch of `t1` re-registers
/// first (its ended copy); the framework asks about `t1` on the agent of
/// the later launch, which has not re-registered yet. The master does not
/// answer from the earlier launch's record: the framework's copy may be
/// newer. Once the later launch's agent is back, it answers from that.
#[test]
fn reconciliation_of_an_id_held_on_another_agent_waits_for_the_named_agent() {
    use crate::registry::{AgentRecord, FrameworkRecord};
    let old = AgentId::new("old");
    let new = AgentId::new("new");
    let fid = FrameworkId::new("fw");
    let mut state = RegistryState::default();
    for aid in [&old, &new] {
        state.agents.insert(
            aid.clone(),
            AgentRecord {
                id: aid.clone(),
                info: agent_info(Some(aid), "cpus:4;mem:4096"),
                principal: None,
                deactivated: false,
                drain: None,
            },
        );
    }
    let mut info = FrameworkInfo::new("fw");
    info.id = Some(fid.clone());
    info.failover_timeout = 3600.0;
    state.frameworks.insert(
        fid.clone(),
        FrameworkRecord {
            id: fid.clone(),
            info: info.clone(),
            disconnected_at: None,
            launch_epoch: 7,
        },
    );
    let config = Config {
        agent_reregister_timeout: Duration::from_secs(60),
        ..Config::default()
    };
    let mut h = H::with(config);
    h.m.recover(&state, h.now, 1000.0);
    h.subscribe_info(S1, info, false);

    // The earlier launch, ended on `old`, re-registers first.
    let earlier = stamped("t1", &old, Some(LaunchStamp { epoch: 7, seq: 0 }));
    h.register_info(
        A1,
        agent_info(Some(&old), "cpus:4;mem:4096"),
        vec![report(&fid, &earlier, TaskState::Failed)],
    );
    h.status(A1, &fid, "t1", TaskState::Failed, "u-old");
    let ask = |h: &mut H, on: &AgentId| {
        let out = h.sched(
            S1,
            scheduler::Call::Reconcile {
                tasks: vec![ReconcileTask {
                    task_id: TaskId::new("t1"),
                    agent_id: Some(on.clone()),
                }],
            },
        );
        updates(&out, S1)
    };
    assert!(
        ask(&mut h, &new).is_empty(),
        "no answer from the record on `old` while `new` may still re-register"
    );
    // Asked about the agent the master holds it on, it answers.
    let answers = ask(&mut h, &old);
    assert_eq!(answers.len(), 1);
    assert_eq!(answers[0].state, TaskState::Failed);

    // The later launch's agent comes back with it running: that is the
    // answer now.
    let later = stamped("t1", &new, Some(LaunchStamp { epoch: 8, seq: 0 }));
    h.register_info(
        A2,
        agent_info(Some(&new), "cpus:4;mem:4096"),
        vec![report(&fid, &later, TaskState::Running)],
    );
    let answers = ask(&mut h, &new);
    assert_eq!(answers.len(), 1);
    assert_eq!(answers[0].state, TaskState::Running);
    assert_eq!(answers[0].agent_id.as_ref(), Some(&new));
}

/// An agent whose log lost the later launch of an id reports the earlier
/// one it still holds: that report is not adopted, the later launch counts
/// as not reported (lost: it had started), and the agent's re-sent
/// updates of the earlier launch are acknowledged, not forwarded.
#[test]
fn a_reregistration_reporting_an_earlier_launch_than_the_one_sent_loses_the_later() {
    let (mut h, fid, aid, offer) = setup("cpus:4;mem:4096");
    let out = h.launch(S1, &[&offer], vec![command_task("t1", &aid, "cpus:1")]);
    let sent = run_tasks(&out, A1);
    let stamp = sent[0].launch_stamp.expect("stamped");
    h.status(A1, &fid, "t1", TaskState::Running, "u-later");
    h.input(Input::AgentClosed { conn: A1 });

    let earlier = stamped(
        "t1",
        &aid,
        Some(LaunchStamp {
            epoch: stamp.epoch - 1,
            seq: 0,
        }),
    );
    let out = h.register_info(
        A2,
        agent_info(Some(&aid), "cpus:4;mem:4096"),
        vec![report(&fid, &earlier, TaskState::Failed)],
    );
    let lost: Vec<TaskStatus> = updates(&out, S1);
    assert_eq!(lost.len(), 1, "{lost:?}");
    assert_eq!(lost[0].state, TaskState::Lost);
    assert!(
        run_tasks(&out, A2).is_empty(),
        "it had started: not sent again"
    );
    assert_eq!(h.m.agents[&aid].used, Resources::new());

    // The earlier launch's end, re-sent from the agent's log.
    let mut status = TaskStatus::new(TaskId::new("t1"), TaskState::Failed, Source::SourceAgent);
    status.uuid = Some("u-earlier".into());
    status.launch_stamp = earlier.launch_stamp;
    let out = h.agent(
        A2,
        agent::Call::StatusUpdate {
            framework_id: fid.clone(),
            status,
        },
    );
    assert!(acknowledged(&out, A2, "u-earlier"));
    assert!(updates(&out, S1).is_empty());
}

/// The end of `t1` from A (the earlier launch, on A1) is acknowledged and
/// not forwarded; B's (A2) reaches the scheduler, from `b`.
fn only_the_later_end_is_forwarded(
    h: &mut H,
    fid: &FrameworkId,
    b: &AgentId,
    a_state: TaskState,
    case: &str,
) {
    let out = h.status(A1, fid, "t1", a_state, "a-end");
    assert!(updates(&out, S1).is_empty(), "{case}");
    assert!(acknowledged(&out, A1, "a-end"), "{case}");
    let out = h.status(A2, fid, "t1", TaskState::Finished, "b-end");
    let ups = updates(&out, S1);
    assert_eq!(ups.len(), 1, "{case}");
    assert_eq!(
        (ups[0].state, ups[0].agent_id.as_ref()),
        (TaskState::Finished, Some(b)),
        "{case}"
    );
}

#[test]
fn an_agent_offering_more_than_max_agent_resources_is_refused_and_never_offered() {
    let mut h = H::with(Config {
        max_agent_resources: r("cpus:64;gpus:8"),
        ..Config::default()
    });
    let fw = 1;
    h.subscribe(fw, "fw");
    for (conn, resources, named) in [
        (10, "cpus:65;mem:1024", "cpus:65"),
        (11, "cpus:4;mem:1024;gpus:9", "gpus:9"),
        (12, "cpus(web):40;cpus:30;mem:1024", "cpus:70"),
    ] {
        let out = h.register_info(conn, agent_info(None, resources), vec![]);
        match agent_events(&out, conn).as_slice() {
            [agent::Event::Error {
                message,
                fatal: true,
            }] => {
                assert!(message.contains(named), "{message}");
                assert!(message.contains("--max-agent-resources"), "{message}");
            }
            other => panic!("{resources}: expected a fatal refusal, got {other:?}"),
        }
        assert!(out
            .iter()
            .any(|o| matches!(o, Output::Close { conn: c, .. } if *c == conn)));
    }
    // At the limit, and with resources the limit does not name (memory,
    // ports), an agent is welcome.
    let aid = h.register(13, "cpus:64;mem:100000000;gpus:8;ports:[1-60000]");
    assert!(h.m.agents.contains_key(&aid));
    assert_eq!(h.m.agents.len(), 1);
    let offers = h.offers(fw);
    assert_eq!(offers.len(), 1);
    assert_eq!(offers[0].agent_id, aid);
}

// --- identity: principals of frameworks and agents ---

fn info_as(name: &str, principal: Option<&str>, id: Option<&FrameworkId>) -> FrameworkInfo {
    let mut info = FrameworkInfo::new(name);
    info.principal = principal.map(str::to_string);
    info.id = id.cloned();
    info.failover_timeout = 3600.0;
    info
}

fn register_as(h: &mut H, conn: ConnId, principal: Option<&str>, info: AgentInfo) -> Vec<Output> {
    let call = agent::Call::Register {
        protocol: PROTOCOL_VERSION,
        agent_info: info,
        tasks: vec![],
        executors: vec![],
        frameworks: vec![],
    };
    match principal {
        Some(p) => h.agent_as(conn, p, call),
        None => h.agent(conn, call),
    }
}

fn agent_fatal_error(out: &[Output], conn: ConnId) -> Option<String> {
    agent_events(out, conn).into_iter().find_map(|e| match e {
        agent::Event::Error {
            message,
            fatal: true,
        } => Some(message),
        _ => None,
    })
}

fn subscribed(out: &[Output], conn: ConnId) -> Option<FrameworkId> {
    sched_events(out, conn).into_iter().find_map(|e| match e {
        Event::Subscribed { framework_id, .. } => Some(framework_id),
        _ => None,
    })
}

#[test]
fn a_framework_is_subscribed_to_by_its_own_principal_only() {
    const S3: ConnId = 3;
    let mut h = H::new();
    let out = h.subscribe_info(S1, info_as("alice", Some("alice"), None), false);
    let fid = subscribed(&out, S1).expect("alice subscribed");
    let aid = h.register(A1, "cpus:4;mem:4096");
    let offer = h.offer_from(S1, &aid);
    h.launch(
        S1,
        &[&offer],
        vec![command_task("t1", &aid, "cpus:1;mem:128")],
    );
    // bob (and an anonymous client) naming alice's framework, with force:
    // refused, and alice's subscription untouched.
    for (conn, principal) in [(S2, Some("bob")), (S3, None)] {
        let out = h.subscribe_info(conn, info_as("bob", principal, Some(&fid)), true);
        let message = fatal_error(&out, conn).expect("a fatal error");
        assert!(
            message.contains(fid.as_str()) && message.contains("another principal"),
            "{message}"
        );
        assert!(closed(&out, conn));
        assert!(!closed(&out, S1), "alice's connection kept: {out:?}");
        assert!(sched_events(&out, S1).is_empty(), "{out:?}");
        assert!(agent_events(&out, A1).is_empty(), "{out:?}");
    }
    let fw = &h.m.frameworks[&fid];
    assert_eq!(fw.conn, Some(S1));
    assert_eq!(fw.info.principal.as_deref(), Some("alice"));
    assert_eq!(h.m.metrics.refused_framework_principal.get(), 2);
    // bob's connection never subscribed: its calls are refused.
    let out = h.sched(S2, scheduler::Call::Teardown);
    assert!(h.m.frameworks.contains_key(&fid), "{out:?}");
    // alice fails over to a new connection: taken over, as before.
    let out = h.subscribe_info(S3, info_as("alice", Some("alice"), Some(&fid)), true);
    assert_eq!(subscribed(&out, S3), Some(fid.clone()));
    assert!(closed(&out, S1));
}

#[test]
fn a_frameworks_principal_survives_a_master_failover() {
    let mut h = H::new();
    h.m.recover(&RegistryState::default(), h.now, 10_000.0);
    let out = h.subscribe_info(S1, info_as("alice", Some("alice"), None), false);
    let fid = subscribed(&out, S1).expect("alice subscribed");
    let mut state = RegistryState::default();
    for op in h.m.take_registry_ops() {
        state.apply(&op, 100);
    }
    // The registry as etcd or the file keeps it: through JSON.
    let state: RegistryState =
        serde_json::from_str(&serde_json::to_string(&state).unwrap()).unwrap();
    let mut h = H::new();
    h.m.recover(&state, h.now, 10_000.0);
    let out = h.subscribe_info(S2, info_as("bob", Some("bob"), Some(&fid)), true);
    assert!(fatal_error(&out, S2).is_some_and(|m| m.contains("another principal")));
    let out = h.subscribe_info(S1, info_as("alice", Some("alice"), Some(&fid)), false);
    assert_eq!(subscribed(&out, S1), Some(fid));
}

#[test]
fn a_framework_recovered_from_an_agents_report_keeps_its_principal() {
    let fid = FrameworkId::new("m0-F0");
    let aid = AgentId::new("m0-S0");
    let mut h = H::new();
    let report = TaskReport {
        framework_id: fid.clone(),
        task: command_task("t1", &aid, "cpus:1;mem:128"),
        state: TaskState::Running,
        latest_status: None,
    };
    h.agent(
        A1,
        agent::Call::Register {
            protocol: PROTOCOL_VERSION,
            agent_info: agent_info(Some(&aid), "cpus:4;mem:4096"),
            tasks: vec![report.clone()],
            executors: vec![],
            frameworks: vec![info_as("alice", Some("alice"), Some(&fid))],
        },
    );
    let out = h.subscribe_info(S2, info_as("bob", Some("bob"), Some(&fid)), true);
    assert!(fatal_error(&out, S2).is_some());
    let out = h.subscribe_info(S1, info_as("alice", Some("alice"), Some(&fid)), true);
    assert_eq!(subscribed(&out, S1), Some(fid.clone()));

    // An agent that reports the task without its framework's info: the
    // principal is unknown, and the first subscription claims it; from
    // then on it is bound.
    let other = FrameworkId::new("m0-F1");
    let mut h = H::new();
    let report = TaskReport {
        framework_id: other.clone(),
        ..report
    };
    h.register_info(A1, agent_info(Some(&aid), "cpus:4;mem:4096"), vec![report]);
    let out = h.subscribe_info(S1, info_as("alice", Some("alice"), Some(&other)), true);
    assert_eq!(subscribed(&out, S1), Some(other.clone()));
    let out = h.subscribe_info(S2, info_as("bob", Some("bob"), Some(&other)), true);
    assert!(fatal_error(&out, S2).is_some());
}

#[test]
fn an_agent_id_is_re_registered_by_its_own_principal_only() {
    let (mut h, fid, aid, offer) = {
        let mut h = H::new();
        let fid = h.subscribe(S1, "fw");
        let out = register_as(
            &mut h,
            A1,
            Some("agent"),
            agent_info(None, "cpus:4;mem:4096"),
        );
        let aid = match agent_events(&out, A1).first() {
            Some(agent::Event::Registered { agent_id, .. }) => agent_id.clone(),
            other => panic!("no REGISTERED: {other:?}"),
        };
        let offer = h.offer_from(S1, &aid);
        (h, fid, aid, offer)
    };
    h.launch(
        S1,
        &[&offer],
        vec![command_task("t1", &aid, "cpus:1;mem:128")],
    );
    h.status(A1, &fid, "t1", TaskState::Running, "u1");
    // A framework's credential, and an unauthenticated peer, re-register
    // the agent's id: refused, the live agent and its task untouched.
    for principal in [Some("alice"), None] {
        let out = register_as(
            &mut h,
            A2,
            principal,
            agent_info(Some(&aid), "cpus:4;mem:4096"),
        );
        let message = agent_fatal_error(&out, A2).expect("refused");
        assert!(
            message.contains(aid.as_str()) && message.contains("another principal"),
            "{message}"
        );
        assert!(closed(&out, A2));
        assert!(!closed(&out, A1), "{out:?}");
        assert!(updates(&out, S1).is_empty(), "{out:?}");
        assert!(agent_events(&out, A1).is_empty(), "{out:?}");
    }
    assert_eq!(h.m.agents[&aid].conn, Some(A1));
    assert_eq!(h.m.agent_conns.get(&A2), None);
    assert_eq!(
        h.m.frameworks[&fid].tasks[&TaskId::new("t1")].state,
        TaskState::Running
    );
    assert_eq!(h.m.metrics.refused_agent_principal.get(), 2);
    // The agent itself re-registers on a new connection: accepted.
    let out = register_as(
        &mut h,
        A2,
        Some("agent"),
        agent_info(Some(&aid), "cpus:4;mem:4096"),
    );
    assert!(
        matches!(
            agent_events(&out, A2).first(),
            Some(agent::Event::Registered { .. })
        ),
        "{out:?}"
    );
}

#[test]
fn an_agents_principal_survives_a_master_failover() {
    let mut h = H::new();
    h.m.recover(&RegistryState::default(), h.now, 10_000.0);
    let out = register_as(
        &mut h,
        A1,
        Some("agent"),
        agent_info(None, "cpus:4;mem:4096"),
    );
    let Some(agent::Event::Registered { agent_id: aid, .. }) =
        agent_events(&out, A1).first().cloned()
    else {
        panic!("no REGISTERED: {out:?}");
    };
    let mut state = RegistryState::default();
    for op in h.m.take_registry_ops() {
        state.apply(&op, 100);
    }
    let state: RegistryState =
        serde_json::from_str(&serde_json::to_string(&state).unwrap()).unwrap();
    assert_eq!(state.agents[&aid].principal.as_deref(), Some("agent"));
    let mut h = H::new();
    h.m.recover(&state, h.now, 10_000.0);
    let out = register_as(
        &mut h,
        A2,
        Some("alice"),
        agent_info(Some(&aid), "cpus:4;mem:4096"),
    );
    assert!(agent_fatal_error(&out, A2).is_some(), "{out:?}");
    assert!(h.m.agents[&aid].recovering, "still waiting for the agent");
    let out = register_as(
        &mut h,
        A1,
        Some("agent"),
        agent_info(Some(&aid), "cpus:4;mem:4096"),
    );
    assert!(
        matches!(
            agent_events(&out, A1).first(),
            Some(agent::Event::Registered { .. })
        ),
        "{out:?}"
    );
}

#[test]
fn register_agents_acl_admits_the_listed_principals_only() {
    let acls = crate::acls::Acls::parse(
        r#"{"register_agents":[{"principals":{"values":["agent"]},"agents":{"type":"ANY"}},
                               {"principals":{"type":"ANY"},"agents":{"type":"NONE"}}]}"#,
    )
    .unwrap();
    let mut h = H::with(Config {
        acls: std::sync::Arc::new(acls),
        ..Config::default()
    });
    for (conn, principal) in [(A1, None), (A2, Some("alice"))] {
        let out = register_as(&mut h, conn, principal, agent_info(None, "cpus:4;mem:4096"));
        let message = agent_fatal_error(&out, conn).expect("refused");
        assert!(message.contains("register_agents"), "{message}");
    }
    assert!(h.m.agents.is_empty());
    assert_eq!(h.m.metrics.refused_agent_unauthorized.get(), 2);
    let out = register_as(
        &mut h,
        103,
        Some("agent"),
        agent_info(None, "cpus:4;mem:4096"),
    );
    assert!(matches!(
        agent_events(&out, 103).first(),
        Some(agent::Event::Registered { .. })
    ));
}

#[test]
fn agent_registrations_beyond_the_bounds_are_refused_naming_them() {
    let mut h = H::new();
    let big_set = format!(
        "cpus:4;mem:4096;gpus:{{{}}}",
        (0..2000)
            .map(|i| format!("g{i}"))
            .collect::<Vec<_>>()
            .join(",")
    );
    let many_ranges = format!(
        "cpus:4;mem:4096;ports:[{}]",
        (0..1100)
            .map(|i| format!("{}-{}", 2 * i, 2 * i))
            .collect::<Vec<_>>()
            .join(",")
    );
    let many_entries = format!(
        "cpus:4;mem:4096;{}",
        (0..130)
            .map(|i| format!("r{i}:1"))
            .collect::<Vec<_>>()
            .join(";")
    );
    let cases: Vec<(AgentInfo, &str)> = vec![
        (agent_info(None, &big_set), "--max-agent-set-items"),
        (agent_info(None, &many_ranges), "--max-agent-ranges"),
        (
            agent_info(None, &many_entries),
            "--max-agent-resource-entries",
        ),
        (
            agent_info(None, "cpus:4;mem:4096;ports:[0-18446744073709551615]"),
            "highest port 65535",
        ),
        (
            agent_info(None, "cpus:4;mem:4096;ports:[31000-65536]"),
            "highest port 65535",
        ),
        (
            AgentInfo {
                attributes: agora_proto::Attributes::parse(
                    &(0..200)
                        .map(|i| format!("a{i}:x"))
                        .collect::<Vec<_>>()
                        .join(";"),
                )
                .unwrap(),
                ..agent_info(None, "cpus:4;mem:4096")
            },
            "--max-agent-attributes",
        ),
        (
            AgentInfo {
                attributes: agora_proto::Attributes::parse(&format!("rack:{}", "x".repeat(2000)))
                    .unwrap(),
                ..agent_info(None, "cpus:4;mem:4096")
            },
            "--max-agent-text-bytes",
        ),
        (
            AgentInfo {
                hostname: "h".repeat(5000),
                ..agent_info(None, "cpus:4;mem:4096")
            },
            "--max-agent-text-bytes",
        ),
    ];
    let n = cases.len() as u64;
    for (info, bound) in cases {
        let out = register_as(&mut h, A1, None, info);
        let message = agent_fatal_error(&out, A1).expect("refused");
        assert!(message.contains(bound), "{bound}: {message}");
        assert!(closed(&out, A1));
    }
    assert!(h.m.agents.is_empty());
    assert_eq!(h.m.metrics.refused_agent_bounds.get(), n);
    // At the bounds: admitted.
    let at_bounds = format!(
        "cpus:4;mem:4096;ports:[0-65535];gpus:{{{}}}",
        (0..1024)
            .map(|i| format!("g{i}"))
            .collect::<Vec<_>>()
            .join(",")
    );
    h.register(A2, &at_bounds);
}

#[test]
fn an_operator_teardown_is_carried_out_by_the_master() {
    // (The HTTP side authenticates and authorizes it; see
    // `http::operator_teardown`.)
    let (mut h, fid, _, _) = setup("cpus:4;mem:4096");
    let out = h.input(Input::OperatorTeardown {
        framework_id: fid.clone(),
        operator: Some("ops".into()),
    });
    assert!(fatal_error(&out, S1).is_some());
    assert!(h.m.removed_frameworks.contains(&fid));
}

#[test]
fn a_viewer_sees_the_counts_roles_and_executors_of_what_it_may_view() {
    let mut h = H::new();
    let mut alice = info_as("alice", Some("alice"), None);
    alice.user = "alice".into();
    let mut bob = info_as("bob", Some("bob"), None);
    bob.user = "bob".into();
    let fa = subscribed(&h.subscribe_info(S1, alice, false), S1).unwrap();
    let fb = subscribed(&h.subscribe_info(S2, bob, false), S2).unwrap();
    h.register(A1, "cpus:8;mem:8192");
    h.register(A2, "cpus:8;mem:8192");
    let out = h.advance(Duration::from_secs(1));
    for (conn, task) in [(S1, "a1"), (S2, "b1")] {
        let offer = offers_in(&out, conn).remove(0);
        let exec = format!("{task}-exec");
        let aid = offer.agent_id.clone();
        h.launch(
            conn,
            &[&offer],
            vec![executor_task(
                task,
                &aid,
                "cpus:1;mem:128",
                &exec,
                "cpus:0.1;mem:32",
            )],
        );
    }
    let executors = |s: &crate::state::StateSnapshot| -> Vec<ExecutorId> {
        s.agents.iter().flat_map(|a| a.executors.clone()).collect()
    };
    let snapshot = h.m.snapshot();
    assert_eq!(snapshot.summary.frameworks, 2);
    assert_eq!(snapshot.summary.tasks_active, 2);
    assert_eq!(executors(&snapshot).len(), 2);
    let acls = crate::acls::Acls::parse(
        r#"{"view_frameworks":[{"principals":{"values":["alice"]},"users":{"values":["alice"]}},
                               {"principals":{"type":"ANY"},"users":{"type":"NONE"}}]}"#,
    )
    .unwrap();
    let seen = snapshot.viewed_by(&acls, Some("alice")).expect("filtered");
    assert_eq!(seen.frameworks.len(), 1);
    assert_eq!(seen.frameworks[0].id, fa);
    assert_eq!(seen.summary.frameworks, 1);
    assert_eq!(seen.summary.tasks_active, 1);
    assert_eq!(
        executors(&seen),
        vec![ExecutorId::new("a1-exec")],
        "bob's executor is not alice's to see"
    );
    assert!(seen.roles.iter().all(|r| !r.frameworks.contains(&fb)));
    assert!(seen.offers.iter().all(|o| o.framework_id != fb));
    // Nothing for an anonymous reader; the agents' resources stay whole.
    let seen = snapshot.viewed_by(&acls, None).expect("filtered");
    assert_eq!(seen.summary.frameworks, 0);
    assert_eq!(seen.summary.tasks_active, 0);
    assert!(executors(&seen).is_empty());
    assert_eq!(seen.summary.cpus_total, snapshot.summary.cpus_total);
}

mod drain;
