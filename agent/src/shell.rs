//! The agent's I/O shell: the one task that feeds the sans-IO [`Core`]
//! and carries out what it asks for.
//!
//! Connection tasks, the process thread, timers and the checkpoint writer
//! post [`CoreEvent`]s to one queue. The shell keeps what the core must not
//! hold (the writers of the master and executor connections), hands the
//! core each input with the time, and executes the core's [`Action`]s:
//! frames to queue, process requests for the process thread, checkpoints
//! for the writer thread, timers as sleeping tasks. It never blocks: every
//! blocking call happens on the process or writer thread. It publishes the
//! core's `/state` view as a snapshot (at most every [`SNAPSHOT_EVERY`]),
//! which HTTP handlers read without reaching the core.

use agora_proto::hash::HashMap;
use std::sync::Arc;
use std::time::Duration;

use agora_proto::agent::Call;
use tokio::sync::{mpsc, oneshot, watch};
use tokio::time::Instant;

use crate::checkpoint::Writer;
use crate::core::Core;
use crate::messages::{Action, CoreEvent, ExecLink, Input, LinkFull, Request, Snapshot, Stop};
use crate::processes::Processes;

/// Most often the `/state` snapshot is rebuilt while the agent is busy.
pub(crate) const SNAPSHOT_EVERY: Duration = Duration::from_millis(100);

/// Events the core takes in one turn before what they ask for is
/// carried out.
const EVENTS_PER_TURN: usize = 64;

pub(crate) struct Shell {
    core: Core,
    tx: mpsc::Sender<CoreEvent>,
    writer: Writer,
    processes: Processes,
    masters: HashMap<u64, mpsc::Sender<Call>>,
    links: HashMap<u64, ExecLink>,
    snapshots: watch::Sender<Snapshot>,
    last_snapshot: Instant,
    /// Executors being stopped as the agent stops, and how long to wait.
    stopping: Option<(oneshot::Receiver<()>, Duration)>,
}

/// Wall-clock seconds since the epoch.
fn wall_now() -> f64 {
    agora_proto::now_timestamp()
}

async fn sleep_until_opt(deadline: Option<Instant>) {
    match deadline {
        Some(deadline) => tokio::time::sleep_until(deadline).await,
        None => std::future::pending().await,
    }
}

// === impl Shell ===

impl Shell {
    pub(crate) fn new(
        core: Core,
        tx: mpsc::Sender<CoreEvent>,
        writer: Writer,
        processes: Processes,
        snapshots: watch::Sender<Snapshot>,
    ) -> Self {
        Shell {
            core,
            tx,
            writer,
            processes,
            masters: HashMap::default(),
            links: HashMap::default(),
            snapshots,
            last_snapshot: Instant::now(),
            stopping: None,
        }
    }

    /// Carries out what the core asked for so far (recovery, say).
    pub(crate) fn flush(&mut self) {
        let actions = self.core.take_actions();
        self.execute(actions);
        self.publish();
    }

    /// Feeds the core until `shutdown` completes or the master refuses
    /// the agent, then stops it: executors that cannot be recovered later
    /// are killed, the others keep running.
    pub(crate) async fn run(
        mut self,
        mut rx: mpsc::Receiver<CoreEvent>,
        shutdown: impl std::future::Future<Output = ()>,
    ) -> Stop {
        tokio::pin!(shutdown);
        let stop = loop {
            let retry = self.core.next_deadline();
            let snapshot_due = self.last_snapshot + SNAPSHOT_EVERY;
            tokio::select! {
                _ = &mut shutdown => break Stop::Requested,
                event = rx.recv() => match event {
                    Some(event) => {
                        if let Some(stop) = self.events(event, &mut rx) {
                            break stop;
                        }
                    }
                    None => break Stop::Requested,
                },
                _ = sleep_until_opt(retry) => self.core.tick(Instant::now(), wall_now()),
                _ = tokio::time::sleep_until(snapshot_due) => {}
            }
            let actions = self.core.take_actions();
            self.execute(actions);
            if Instant::now() >= self.last_snapshot + SNAPSHOT_EVERY {
                self.publish();
            }
        };
        self.core.stop();
        let actions = self.core.take_actions();
        self.execute(actions);
        if let Some((stopped, wait)) = self.stopping.take() {
            let _ = tokio::time::timeout(wait, stopped).await;
        }
        self.publish();
        // Flush the checkpoint writer.
        let (tx, rx) = oneshot::channel();
        self.writer.submit(
            Vec::new(),
            Some(Box::new(move |_| {
                let _ = tx.send(());
            })),
        );
        let _ = tokio::time::timeout(Duration::from_secs(10), rx).await;
        stop
    }

    /// Rebuilds the `/state` snapshot if anything changed.
    fn publish(&mut self) {
        self.last_snapshot = Instant::now();
        if self.core.take_dirty() {
            let snapshot = self.core.snapshot(self.writer.stats());
            self.snapshots.send_replace(Arc::new(snapshot));
        }
    }

    /// Feeds the core `first` and whatever else is already queued (at
    /// most [`EVENTS_PER_TURN`]), so what they ask for is carried out
    /// together: one wake-up of each connection for a burst of events.
    fn events(&mut self, first: CoreEvent, rx: &mut mpsc::Receiver<CoreEvent>) -> Option<Stop> {
        if let Some(stop) = self.event(first) {
            return Some(stop);
        }
        for _ in 1..EVENTS_PER_TURN {
            let Ok(event) = rx.try_recv() else {
                return None;
            };
            if let Some(stop) = self.event(event) {
                return Some(stop);
            }
        }
        None
    }

    fn event(&mut self, event: CoreEvent) -> Option<Stop> {
        let input = match event {
            CoreEvent::MasterConnected { conn, tx, local_ip } => {
                self.masters.clear();
                self.masters.insert(conn, tx);
                Input::MasterConnected { conn, local_ip }
            }
            CoreEvent::ExecutorSubscribe {
                conn,
                link,
                framework_id,
                executor_id,
                token,
                updates,
                tasks,
            } => {
                self.links.insert(conn, link);
                Input::ExecutorSubscribe {
                    conn,
                    framework_id,
                    executor_id,
                    token,
                    updates,
                    tasks,
                }
            }
            CoreEvent::Publish(done) => {
                // Whatever the core was asked before this is in the view.
                let actions = self.core.take_actions();
                self.execute(actions);
                self.publish();
                let _ = done.send(());
                return None;
            }
            CoreEvent::Input(input) => {
                match &input {
                    Input::MasterDisconnected { conn } => {
                        self.masters.remove(conn);
                    }
                    Input::ExecutorDisconnected { conn } => {
                        self.links.remove(conn);
                    }
                    _ => {}
                }
                input
            }
        };
        self.core.handle(input, Instant::now(), wall_now())
    }

    fn execute(&mut self, actions: Vec<Action>) {
        for action in actions {
            match action {
                Action::ToMaster { conn, call } => {
                    let Some(tx) = self.masters.get(&conn) else {
                        continue;
                    };
                    if let Err(mpsc::error::TrySendError::Full(_)) = tx.try_send(call) {
                        // Reliable updates are retried; anything else is
                        // best effort.
                        tracing::warn!("master outbox full; message dropped");
                    }
                }
                Action::DropMaster { conn } => {
                    // Dropping the writer's sender makes the link reconnect.
                    self.masters.remove(&conn);
                }
                Action::ToExecutor { conn, event, reply } => {
                    let Some(link) = self.links.get(&conn) else {
                        continue;
                    };
                    if reply {
                        link.reply(event);
                    } else if let Err(LinkFull::Full) = link.push(event) {
                        // The reader posts the disconnection once it ends.
                        tracing::warn!(conn, "executor is not reading; closing its connection");
                        link.close(1008, "too slow");
                    }
                }
                Action::CloseExecutor { conn, code, reason } => {
                    if let Some(link) = self.links.remove(&conn) {
                        link.close(code, reason);
                    }
                }
                Action::Process(request) => self.processes.send(request),
                Action::StopExecutors {
                    runs,
                    grace,
                    overrun,
                } => {
                    let (done, stopped) = oneshot::channel();
                    self.processes.send(Request::StopAll {
                        runs,
                        grace,
                        overrun,
                        done,
                    });
                    self.stopping = Some((stopped, grace + overrun + Duration::from_secs(5)));
                }
                Action::Checkpoint { ops, then } => {
                    let done: Option<crate::checkpoint::Done> = then.map(|then| {
                        let tx = self.tx.clone();
                        Box::new(move |result: std::io::Result<()>| {
                            let _ = tx.blocking_send(CoreEvent::Input(Input::Durable(
                                then,
                                result.map_err(|e| e.to_string()),
                            )));
                        }) as crate::checkpoint::Done
                    });
                    self.writer.submit(ops, done);
                }
                Action::Timer { after, timer } => {
                    let tx = self.tx.clone();
                    tokio::spawn(async move {
                        tokio::time::sleep(after).await;
                        let _ = tx.send(CoreEvent::Input(Input::Timer(timer))).await;
                    });
                }
            }
        }
    }
}
