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

pub mod hash {
    //! Hash maps whose iteration order depends only on their keys and one
    //! process-wide seed: a random seed in every process (as with std's
    //! maps, so keys a peer chooses cannot be made to collide), a fixed one
    //! in the simulation, so that a simulated run replays step for step.

    use std::collections::hash_map::{DefaultHasher, RandomState};
    use std::hash::{BuildHasher, Hasher};
    use std::sync::OnceLock;

    static SEED: OnceLock<u64> = OnceLock::new();

    /// A map keyed with the process-wide seed.
    pub type HashMap<K, V> = std::collections::HashMap<K, V, Seeded>;
    /// A set keyed with the process-wide seed.
    pub type HashSet<K> = std::collections::HashSet<K, Seeded>;

    /// Builds hashers keyed with the process-wide seed.
    #[derive(Debug, Clone, Copy, Default)]
    pub struct Seeded;

    /// Fixes the process-wide seed (before any map is used); whether it is
    /// now `seed`.
    pub fn fix_seed(seed: u64) -> bool {
        *SEED.get_or_init(|| seed) == seed
    }

    fn seed() -> u64 {
        *SEED.get_or_init(|| RandomState::new().hash_one(0u64))
    }

    impl BuildHasher for Seeded {
        type Hasher = DefaultHasher;

        fn build_hasher(&self) -> DefaultHasher {
            // A secret first word keys SipHash as well as its keys would.
            let mut hasher = DefaultHasher::new();
            hasher.write_u64(seed());
            hasher
        }
    }
}
