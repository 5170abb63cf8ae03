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

pub mod acls;
pub mod agent;
mod attributes;
mod codec;
mod container;
mod credentials;
mod duration;
pub mod env;
pub mod executor;
mod fetch;
mod ids;
mod resources;
pub mod scheduler;
mod types;

pub use attributes::{Attribute, AttributeError, AttributeValue, Attributes};
pub use codec::{decode, encode, DecodeError, Message, MAX_FRAME_BYTES};
pub use container::{
    ContainerInfo, ContainerStatus, ContainerType, Image, ImageType, NetworkInfo, SandboxOf,
    Volume, VolumeMode, VolumeSource,
};
pub use credentials::{
    basic_authorization, bearer_token, parse_basic_authorization, secrets_equal, Credential,
    Credentials, CredentialsError,
};
pub use duration::{parse_duration, DurationError};
pub use fetch::FetchUri;
pub use ids::{
    validate_executor_id, validate_id, AgentId, ExecutorId, FrameworkId, IdError, OfferId, TaskId,
    AGENT_EXECUTOR_PREFIX, MAX_ID_LEN,
};
pub use resources::{
    round_scalar, Range, Resource, ResourceError, Resources, Value, DEFAULT_ROLE, MAX_SCALAR,
    MAX_WIRE_ITEMS,
};
pub use types::{
    now_timestamp, AgentInfo, Bytes, CommandInfo, ExecutorApi, ExecutorInfo, Filters,
    FrameworkInfo, LaunchStamp, LeaderInfo, MasterInfo, Offer, Reason, Source, TaskInfo, TaskState,
    TaskStatus, DEFAULT_REFUSE_SECONDS,
};

/// Version carried in every subscribe/register call.
pub const PROTOCOL_VERSION: u32 = 1;

/// This build's version string.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");

pub mod simulated {
    //! The two sources of nondeterminism the wire types use, the wall
    //! clock (timestamps) and random uuids (reliable updates), as a thread
    //! that runs a simulation sees them: the simulation's virtual wall
    //! clock and uuids drawn from its seed, so a simulated run replays step
    //! for step. Threads that never call [`enter`] (every thread of a
    //! master, agent or driver process) get the real clock and random
    //! uuids.

    use std::cell::Cell;

    thread_local! {
        static STATE: Cell<Option<(f64, u64, u64)>> = const { Cell::new(None) };
    }

    /// Makes this thread simulated: the wall clock reads `wall` and uuids
    /// come from `seed`.
    pub fn enter(wall: f64, seed: u64) {
        STATE.with(|s| s.set(Some((wall, seed, 0))));
    }

    /// Moves this simulated thread's wall clock to `wall`.
    pub fn set_wall(wall: f64) {
        STATE.with(|s| {
            if let Some((_, seed, n)) = s.get() {
                s.set(Some((wall, seed, n)));
            }
        });
    }

    /// Makes this thread real again.
    pub fn leave() {
        STATE.with(|s| s.set(None));
    }

    /// The simulated wall clock, on a simulated thread.
    pub(crate) fn wall() -> Option<f64> {
        STATE.with(|s| s.get().map(|(wall, _, _)| wall))
    }

    /// A version-4 uuid: random, or the next of the seed's on a simulated
    /// thread.
    pub fn uuid() -> String {
        match STATE.with(|s| s.get()) {
            None => uuid::Uuid::new_v4().to_string(),
            Some((wall, seed, n)) => {
                STATE.with(|s| s.set(Some((wall, seed, n + 1))));
                let bits = (u128::from(mix(seed ^ n.rotate_left(32))) << 64)
                    | u128::from(mix(seed
                        .wrapping_add(n)
                        .wrapping_mul(0x9e37_79b9_7f4a_7c15)));
                uuid::Builder::from_random_bytes(bits.to_be_bytes())
                    .into_uuid()
                    .to_string()
            }
        }
    }

    /// SplitMix64's finaliser.
    fn mix(mut z: u64) -> u64 {
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
}

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
