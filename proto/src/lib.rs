#![warn(missing_docs)]
//! Agora's wire protocol: every type that crosses a process boundary.
//!
//! Three channels, each a WebSocket carrying one JSON object per text frame
//! (`{"type": "...", ...}`), each with one `Call` enum (client → server)
//! and one `Event` enum (server → client):
//!
//! - [`scheduler`]: scheduler ↔ master at `/api/scheduler`;
//! - [`agent`]: agent ↔ master at `/api/agent`;
//! - [`executor`]: executor ↔ agent at `/api/executor`.
//!
//! Unknown fields are ignored and unknown `type` values decode to an
//! `Unknown` variant, so peers of different versions can talk; [`decode`]
//! turns the latter into a clear [`DecodeError`]. [`Resources`] carries
//! Mesos's resource arithmetic and syntax.

pub mod agent;
mod attributes;
mod codec;
mod duration;
pub mod env;
pub mod executor;
mod ids;
mod resources;
pub mod scheduler;
mod types;

pub use attributes::{Attribute, AttributeError, AttributeValue, Attributes};
pub use codec::{decode, encode, DecodeError, Message, MAX_FRAME_BYTES};
pub use duration::{parse_duration, DurationError};
pub use ids::{
    validate_executor_id, validate_id, AgentId, ExecutorId, FrameworkId, IdError, OfferId, TaskId,
    AGENT_EXECUTOR_PREFIX, MAX_ID_LEN,
};
pub use resources::{
    round_scalar, Range, Resource, ResourceError, Resources, Value, DEFAULT_ROLE, MAX_SCALAR,
};
pub use types::{
    now_timestamp, AgentInfo, Bytes, CommandInfo, ExecutorInfo, Filters, FrameworkInfo, LeaderInfo,
    MasterInfo, Offer, Reason, Source, TaskInfo, TaskState, TaskStatus, DEFAULT_REFUSE_SECONDS,
};

/// Version carried in every subscribe/register call.
pub const PROTOCOL_VERSION: u32 = 1;

/// This build's version string.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");
