//! The executor driver's state machine as the whole-cluster simulation
//! (`agora-sim`) drives it: feature `sim`. The simulation plays the
//! network loop and the executor.

use std::time::Duration;

use agora_proto::executor::Event;
use tokio::time::Instant;

use crate::state::DriverCore;
pub use crate::state::{Action, Callback, Command, Outcome};
use crate::ExecutorConfig;

/// An executor driver core for the simulation.
pub struct SimExecutor {
    core: DriverCore,
}

// === impl SimExecutor ===

impl SimExecutor {
    /// A driver with the configuration an agent's environment gives.
    pub fn new(config: ExecutorConfig, now: Instant) -> Self {
        SimExecutor {
            core: DriverCore::new(config, now),
        }
    }

    /// A driver configured from the environment an agent gave its
    /// executor (`vars`), as [`ExecutorConfig::from_env`] reads it.
    pub fn from_env(vars: &[(String, String)], now: Instant) -> Result<Self, crate::ExecutorError> {
        let config = ExecutorConfig::from_lookup(|name| {
            vars.iter().find(|(n, _)| n == name).map(|(_, v)| v.clone())
        })?;
        Ok(SimExecutor::new(config, now))
    }

    /// Before each connection attempt: gives up once the agent has been
    /// gone for longer than the recovery timeout.
    pub fn before_connect(&mut self, now: Instant) -> Vec<Action> {
        self.core.before_connect(now)
    }

    /// The connection to the agent is open.
    pub fn on_connected(&mut self, now: Instant) -> Vec<Action> {
        self.core.on_connected(now)
    }

    /// The connection dropped (or an attempt failed).
    pub fn on_disconnected(&mut self, now: Instant) -> Vec<Action> {
        self.core.on_disconnected(now)
    }

    /// Delay before the next connection attempt; `sample` (uniform in
    /// `[0, 1)`) chooses the jitter.
    pub fn next_backoff(&mut self, sample: f64) -> Duration {
        self.core.next_backoff(sample)
    }

    /// An event from the agent.
    pub fn on_event(&mut self, event: Event, now: Instant) -> Vec<Action> {
        self.core.on_event(event, now)
    }

    /// Something the executor asks of its driver.
    pub fn on_command(&mut self, command: Command, now: Instant) -> Vec<Action> {
        self.core.on_command(command, now)
    }

    /// A clock tick.
    pub fn on_tick(&mut self, now: Instant) -> Vec<Action> {
        self.core.on_tick(now)
    }

    /// The tasks whose terminal update the agent has not acknowledged.
    pub fn unacknowledged_terminal(&self) -> Vec<agora_proto::TaskId> {
        self.core.unacknowledged_terminal()
    }

    /// Whether the framework checkpoints (the driver then waits for a
    /// lost agent, stopping or not).
    pub fn checkpoint(&self) -> bool {
        self.core.checkpoint()
    }
}
