//! Agora's one HTTP client, shared by the CLI, the tests and master
//! discovery (the etcd client in `agora-etcd` speaks to etcd's JSON
//! gateway through it).
//!
//! - [`Http`]: HTTP/1.1 on hyper's pooled client (`hyper-util`), with a
//!   timeout per request and a cap on the body it reads; [`Streaming`]
//!   answers are read chunk by chunk (etcd's watch, server-sent events).
//! - [`MasterClient`] and [`AgentClient`]: typed calls on a master's
//!   `/state`, `/metrics`, paginated `/api/v1/*` lists and an agent's
//!   sandbox `/files/…`.
//! - [`blocking`]: the same from threads that are not async (tests,
//!   blocking stores), run on one shared background runtime.
//!
//! Nothing here follows redirects or retries: callers decide.

pub mod blocking;
mod http;
mod typed;

pub use http::{ClientError, Http, Response, Streaming, DEFAULT_MAX_BODY, DEFAULT_TIMEOUT};
pub use hyper::{HeaderMap, Method};
pub use typed::{encode, AgentClient, FileChunk, MasterClient, Peer, PAGE};
