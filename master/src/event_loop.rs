//! The state task: the one task that owns the [`Master`]. It takes inputs
//! from the bounded queue all connections share, runs the timers, writes
//! the outbox to the connections' queues and publishes `/state` snapshots.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, watch};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::http::{Outbound, Registry};
use crate::master::{Input, Master, Output};
use crate::state::StateSnapshot;

/// Inputs handled per wake-up before timers and writes get their turn.
const MAX_BATCH: usize = 512;

/// Runs until `shutdown` is cancelled or every input sender is gone.
pub(crate) async fn run(
    mut master: Master,
    mut inputs: mpsc::Receiver<Input>,
    registry: Registry,
    snapshots: watch::Sender<Arc<StateSnapshot>>,
    snapshot_interval: Duration,
    shutdown: CancellationToken,
) {
    let mut last_snapshot = Instant::now();
    loop {
        let mut wake = master.next_deadline();
        if master.dirty {
            wake = wake.min(last_snapshot + snapshot_interval);
        }
        tokio::select! {
            biased;
            _ = shutdown.cancelled() => break,
            input = inputs.recv() => {
                let Some(input) = input else { break };
                let now = Instant::now();
                master.handle(now, input);
                for _ in 0..MAX_BATCH {
                    match inputs.try_recv() {
                        Ok(input) => master.handle(now, input),
                        Err(_) => break,
                    }
                }
            }
            _ = tokio::time::sleep_until(wake) => {}
        }
        let now = Instant::now();
        if now >= master.next_deadline() {
            master.tick(now);
        }
        deliver(&registry, master.take_outputs());
        if master.dirty && now >= last_snapshot + snapshot_interval {
            snapshots.send_replace(Arc::new(master.snapshot()));
            master.dirty = false;
            last_snapshot = now;
        }
    }
    tracing::debug!("state task stopped");
}

/// Queues each output on its connection. A connection whose queue is full
/// is not reading: it is disconnected rather than allowed to grow memory.
pub(crate) fn deliver(registry: &Registry, outputs: Vec<Output>) {
    for output in outputs {
        let (conn, frame) = match output {
            Output::Scheduler { conn, event } => (conn, Outbound::Scheduler(Box::new(event))),
            Output::Agent { conn, event } => (conn, Outbound::Agent(Box::new(event))),
            Output::Close { conn, code, reason } => (conn, Outbound::Close { code, reason }),
        };
        let full = match registry.get(&conn) {
            Some(handle) => match handle.tx.try_send(frame) {
                Ok(()) => false,
                Err(mpsc::error::TrySendError::Full(_)) => {
                    handle.cancel.cancel();
                    true
                }
                Err(mpsc::error::TrySendError::Closed(_)) => false,
            },
            None => false,
        };
        if full {
            tracing::warn!(
                conn,
                "peer is not reading its events (outbound queue full); disconnecting it"
            );
            registry.remove(&conn);
        }
    }
}
