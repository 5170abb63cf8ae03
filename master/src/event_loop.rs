//! The state task: the one task that owns the [`Master`]. It takes inputs
//! from the bounded queue all connections share, runs the timers, makes
//! the batch's registry changes durable, then writes the outbox to the
//! connections' queues, and hands what changed to the `/state` snapshot
//! builder (see `state.rs`).
//!
//! The registry write comes first and the task waits for it: nothing the
//! master says depends on a change that could still be lost. If the
//! write fails, the master stops (as Mesos's does) rather than act on
//! state it cannot keep; its peers reconnect when it is restarted.
//!
//! In high-availability mode the task also holds a [`Leadership`]: it
//! checks it before each write and each delivery, and stops the master
//! the moment leadership is gone (a lease that ran out while the process
//! was frozen or cut off from etcd), so a deposed leader sends nothing.

use std::time::Duration;

use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::http::{Outbound, Registry};
use crate::master::{Input, Master, Output};
use crate::registry::{Registry as Store, RegistryOp};
use crate::state::Publisher;

/// Inputs handled per wake-up before timers and writes get their turn.
const MAX_BATCH: usize = 512;

/// Whether this master may still act as the leader.
pub(crate) trait Leadership: Send + Sync {
    /// True while leadership surely holds at `now`.
    fn holds(&self, now: Instant) -> bool;
    /// Records that the state task stopped for `reason`.
    fn lost(&self, reason: &str);
}

/// Runs until `shutdown` is cancelled or every input sender is gone, or
/// until a registry write fails or `leadership` ends: then it cancels
/// `shutdown` and returns (the error, for a failed write).
#[allow(clippy::too_many_arguments)]
pub(crate) async fn run(
    mut master: Master,
    mut inputs: mpsc::Receiver<Input>,
    mut store: Option<Box<dyn Store>>,
    registry: Registry,
    mut snapshots: Publisher,
    snapshot_interval: Duration,
    shutdown: CancellationToken,
    leadership: Option<Box<dyn Leadership>>,
) -> Result<(), crate::RegistryError> {
    let mut last_snapshot = Instant::now();
    let mut outputs = Vec::new();
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
        if !still_leading(leadership.as_deref(), &shutdown) {
            return Ok(());
        }
        let ops = master.take_registry_ops();
        if let Some(store) = store.as_mut() {
            if let Err(e) = persist(store.as_mut(), &ops) {
                tracing::error!(error = %e, "cannot write the registry; the master stops rather than act on changes it cannot keep");
                shutdown.cancel();
                return Err(e);
            }
        }
        // The write may have taken a while: check again before speaking.
        if !still_leading(leadership.as_deref(), &shutdown) {
            return Ok(());
        }
        master.swap_outputs(&mut outputs);
        deliver(&registry, &mut outputs);
        if master.dirty && now >= last_snapshot + snapshot_interval {
            last_snapshot = now;
            // A builder that is behind gets the changes one interval later.
            if snapshots.try_publish(|| master.state_delta()) {
                master.dirty = false;
            }
        }
    }
    tracing::debug!("state task stopped");
    Ok(())
}

/// False (and the master told to stop) once `leadership` no longer holds.
fn still_leading(leadership: Option<&dyn Leadership>, shutdown: &CancellationToken) -> bool {
    match leadership {
        Some(l) if !l.holds(Instant::now()) => {
            let reason = "the leader lease ran out; acting no further";
            tracing::error!("{reason}");
            l.lost(reason);
            shutdown.cancel();
            false
        }
        _ => true,
    }
}

/// Applies `ops` to the store. The write blocks the state task by design;
/// on a multi-threaded runtime the connection tasks move to other workers
/// meanwhile.
pub(crate) fn persist(
    store: &mut dyn Store,
    ops: &[RegistryOp],
) -> Result<(), crate::RegistryError> {
    if ops.is_empty() {
        return Ok(());
    }
    match tokio::runtime::Handle::try_current().map(|h| h.runtime_flavor()) {
        Ok(tokio::runtime::RuntimeFlavor::MultiThread) => {
            tokio::task::block_in_place(|| store.apply(ops))
        }
        _ => store.apply(ops),
    }
}

/// Queues each output on its connection. A connection whose queue is full
/// is not reading: it is disconnected rather than allowed to grow memory.
/// Delivers `outputs`, leaving the vector empty with its capacity, for
/// the next batch (a burst's outbox grows large, and growing it afresh
/// each batch costs fresh pages).
pub(crate) fn deliver(registry: &Registry, outputs: &mut Vec<Output>) {
    for output in outputs.drain(..) {
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
