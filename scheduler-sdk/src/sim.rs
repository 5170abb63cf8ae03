//! The scheduler driver's state machine as the whole-cluster simulation
//! (`agora-sim`) drives it: feature `sim`. The simulation plays the
//! network loop and the framework.

use std::time::Duration;

use agora_proto::scheduler::Event;
use agora_proto::{FrameworkId, FrameworkInfo};
use tokio::time::Instant;

use crate::state::DriverCore;
pub use crate::state::{Action, Callback, Command, Outcome};
use crate::DriverConfig;

/// A scheduler driver core for the simulation.
pub struct SimScheduler {
    core: DriverCore,
}

// === impl SimScheduler ===

impl SimScheduler {
    /// A driver for `framework` (with its id set: a failover).
    pub fn new(framework: FrameworkInfo, config: &DriverConfig) -> Self {
        SimScheduler {
            core: DriverCore::new(framework, config),
        }
    }

    /// The framework id, once known.
    pub fn framework_id(&self) -> Option<&FrameworkId> {
        self.core.framework_id()
    }

    /// Whether it is subscribed.
    pub fn is_subscribed(&self) -> bool {
        self.core.is_subscribed()
    }

    /// Whether it has stopped or aborted.
    pub fn is_finished(&self) -> bool {
        self.core.is_finished()
    }

    /// The connection to the master is open.
    pub fn on_connected(&mut self, now: Instant) -> Vec<Action> {
        self.core.on_connected(now)
    }

    /// The connection dropped (or an attempt failed).
    pub fn on_disconnected(&mut self) -> Vec<Action> {
        self.core.on_disconnected()
    }

    /// Delay before the next connection attempt; `sample` (uniform in
    /// `[0, 1)`) chooses the jitter.
    pub fn next_backoff(&mut self, sample: f64) -> Duration {
        self.core.next_backoff(sample)
    }

    /// An event from the master.
    pub fn on_event(&mut self, event: Event, now: Instant) -> Vec<Action> {
        self.core.on_event(event, now)
    }

    /// Something the framework asks of its driver.
    pub fn on_command(&mut self, command: Command) -> Vec<Action> {
        self.core.on_command(command)
    }

    /// A clock tick.
    pub fn on_tick(&mut self, now: Instant) -> Vec<Action> {
        self.core.on_tick(now)
    }
}
