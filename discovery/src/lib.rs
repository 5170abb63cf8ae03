//! Master discovery: where the leading master is, and how long to wait
//! before trying again.
//!
//! - [`MasterLocator`]: the one implementation of "follow the leader"
//!   used by agents, scheduler drivers and the CLI. Given `HOST:PORT`, the
//!   master is that address. Given `etcd://HOST:PORT/PREFIX` (feature
//!   `etcd`), it is the [`LeaderInfo`](agora_proto::LeaderInfo) the
//!   leading master keeps at `PREFIX/leader`: one background task per
//!   locator watches that key with etcd's watch API (one long-lived
//!   request, no polling), and [`Located::changed`] completes the moment
//!   the master a client uses stops leading.
//! - [`Backoff`]: exponential backoff with jitter, sans-IO (the caller
//!   passes the randomness), shared by every reconnect loop: the agent's
//!   master link, the scheduler and executor drivers, the agent's status
//!   update retries and the masters' election.

mod backoff;
#[cfg(feature = "etcd")]
mod etcd;
mod locator;

pub use backoff::{random_sample, Backoff, DEFAULT_JITTER};
#[cfg(feature = "etcd")]
pub use etcd::{leader_key, EtcdUrl, LEADER_UNREACHABLE_AFTER, NEW_LEADER_PATIENCE};
pub use locator::{DiscoveryError, LeaderChanged, Located, MasterLocator};
