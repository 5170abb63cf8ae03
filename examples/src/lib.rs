//! Agora's examples, and the pieces they share.
//!
//! - [`execute`]: run K copies of a shell command through the built-in
//!   command executor (the `agora-execute` binary, and `agora-local --command`);
//! - `local` (feature `local`, on by default): a whole cluster — one
//!   master and N agents — on 127.0.0.1 in one process (the `agora-local`
//!   binary and the benches);
//! - [`minijob`]: a mini job runtime on `agora-workers` (the
//!   `agora-minijob` binary): workers placed by the locality of their
//!   inputs, subtasks placed in their slots, leader election on etcd;
//! - [`bench_api`]: the benches' framework logic driven through either
//!   the native SDK or the Mesos v1 API (`--api native|v1|both`);
//! - [`mesos_v1_client`]: a Mesos v1 HTTP scheduler client (SUBSCRIBE
//!   stream, calls answered 202, pipelined acknowledgements), for the
//!   benches' `--api v1` mode;
//! - the `test-framework` and `test-executor` binaries: a framework with its
//!   own executor, exchanging framework messages, as in Mesos's examples.

pub mod bench_api;
pub mod cli;
pub mod execute;
pub mod http1_pipeline;
#[cfg(feature = "local")]
pub mod local;
pub mod mesos_v1_client;
pub mod minijob;
pub mod secure;
