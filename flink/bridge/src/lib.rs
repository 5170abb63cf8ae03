//! `agora-flink-bridge`: the process between Apache Flink's Agora
//! resource manager driver (Java, in `flink/`) and [`agora_workers`].
//!
//! The driver starts the bridge as a child and talks to it in JSON lines
//! ([`protocol`]): `request` / `cancel` / `release` / `deregister` /
//! `terminate` on stdin; `recovered` (once, first), `placed`,
//! `request_failed`, `running`, `terminated`, `connection`, `refused`,
//! `error` and finally `ended` on stdout. The bridge owns a
//! [`WorkerDriver`](agora_workers::WorkerDriver) and its worker store, so
//! offers, placement, locality, the write-ahead store, reconciliation and
//! master failover are `agora-workers`' and are not written again in Java.
//!
//! Closing stdin is `terminate`: a JobManager that dies (even by SIGKILL)
//! leaves its TaskManagers running for the next attempt, and its bridge
//! lets go of the store (the file lock, or the etcd lease).

pub mod bridge;
pub mod protocol;
pub mod store;

pub use bridge::{run, BridgeOptions, Outcome};
pub use store::StoreChoice;
