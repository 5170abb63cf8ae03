//! Agora's etcd v3 client.
//!
//! It speaks etcd's JSON gRPC gateway (`POST /v3/...`) through
//! [`agora_client::Http`] (HTTP/1.1 on hyper, pooled connections), so
//! no protobuf tooling is needed to build it. Keys and values travel
//! base64-encoded and 64-bit integers as JSON strings, as the gateway
//! wants.
//!
//! - [`Client`]: leases (grant, keep-alive, revoke), reads, creation
//!   only-if-absent, and transactions fenced on a key's create revision
//!   (how a leader makes sure it still leads when it writes);
//! - [`Watch`]: the gateway's streaming `/v3/watch`: one long-lived
//!   request that delivers every change of a key as it happens, instead
//!   of reading the key again and again;
//! - [`blocking::Client`]: the same calls for code that is not async;
//! - `testing` (feature `testing`): an etcd server of a test's own.
//!
//! Who uses it: masters in high-availability mode (election, lease,
//! registry), `agora-discovery` (following the leader) and
//! `agora-workers` (runtime election, worker store).

pub mod blocking;
mod client;
#[cfg(feature = "testing")]
pub mod testing;
mod watch;

pub use client::{Client, EtcdError, KeyValue, TxnOp, TxnResult, REQUEST_TIMEOUT};
pub use watch::{EventKind, Watch, WatchEvent};
