//! The allocator: decides which framework is offered which agent's free
//! resources. It is a pure, synchronous component: the master tells it
//! about agents, frameworks, usage and filters, and calls
//! [`Allocator::allocate`] with the current time; it never touches a
//! socket or a clock itself, so it is tested and benchmarked in isolation.
//!
//! The default implementation is [`DrfAllocator`]: hierarchical dominant
//! resource fairness (roles first, by weighted share; then the frameworks
//! of a role, by their share in that role), with quota guarantees served
//! before fair sharing and quota headroom held back from other roles.

mod bag;
mod drf;
mod refs;

use std::collections::BTreeMap;
use std::time::Duration;

use agora_proto::scheduler::ResourceRequest;
use agora_proto::{AgentId, FrameworkId, Resources};
use tokio::time::Instant;

use crate::Config;

pub use drf::DrfAllocator;

/// Resources on one agent handed to one framework by an allocation cycle.
/// They stay allocated to that framework until [`Allocator::recover`]
/// gives them back.
#[derive(Debug, Clone, PartialEq)]
pub struct Allocation {
    /// Who gets the resources.
    pub framework_id: FrameworkId,
    /// Where they are.
    pub agent_id: AgentId,
    /// The role the resources are allocated for: the framework's share in
    /// this role grows by them. Reserved resources in an allocation are
    /// always reserved for this role.
    pub role: String,
    /// What is allocated (to become one offer).
    pub resources: Resources,
}

/// Settings an allocator needs from the master's configuration.
#[derive(Debug, Clone, PartialEq)]
pub struct AllocatorOptions {
    /// Offers with fewer cpus *and* less mem than these are not made.
    pub min_offer_cpus: f64,
    /// See `min_offer_cpus`.
    pub min_offer_mem: f64,
    /// Weight per role (default 1.0): a role's dominant share is divided
    /// by its weight, so a role of weight 2 gets twice the resources of a
    /// role of weight 1 when both want more.
    pub role_weights: BTreeMap<String, f64>,
    /// Guaranteed minimum per role (scalar resources only, unreserved or
    /// reserved for the role). Served before fair sharing; other roles are
    /// not given unreserved resources that an unsatisfied quota still needs.
    pub role_quotas: BTreeMap<String, Resources>,
    /// Most that may be allocated to a role, per scalar name it names
    /// (Mesos's quota limits); names it does not name are unlimited.
    pub role_limits: BTreeMap<String, Limits>,
}

/// A quota's limits: the most of each scalar resource named (zero is a
/// limit too, which [`Resources`] cannot hold).
pub type Limits = BTreeMap<String, f64>;

impl Default for AllocatorOptions {
    fn default() -> Self {
        AllocatorOptions {
            min_offer_cpus: 0.01,
            min_offer_mem: 32.0,
            role_weights: BTreeMap::new(),
            role_quotas: BTreeMap::new(),
            role_limits: BTreeMap::new(),
        }
    }
}

impl From<&Config> for AllocatorOptions {
    fn from(config: &Config) -> Self {
        AllocatorOptions {
            min_offer_cpus: config.min_offer_cpus,
            min_offer_mem: config.min_offer_mem,
            role_weights: config.role_weights.clone(),
            role_quotas: config.role_quotas.clone(),
            role_limits: config.role_limits.clone(),
        }
    }
}

/// What an allocator must do. Every method is cheap except
/// [`Allocator::allocate`], the hot path.
///
/// Invariants every implementation keeps: a resource is allocated to at
/// most one framework at a time; nothing beyond an agent's total is
/// allocated; inactive or suppressed frameworks and inactive agents get
/// nothing.
pub trait Allocator: Send {
    /// A framework appears (new, or recovered from agents' reports).
    fn add_framework(&mut self, framework_id: &FrameworkId, roles: &[String], active: bool);
    /// The framework's roles changed (re-subscription).
    fn update_framework(&mut self, framework_id: &FrameworkId, roles: &[String]);
    /// The framework is gone; everything allocated to it is free again.
    fn remove_framework(&mut self, framework_id: &FrameworkId);
    /// The framework's scheduler is connected: it may get offers.
    fn activate_framework(&mut self, framework_id: &FrameworkId);
    /// The framework's scheduler is disconnected: no offers.
    fn deactivate_framework(&mut self, framework_id: &FrameworkId);
    /// An agent appears with `total` resources, of which `used` are
    /// already taken by the given frameworks (re-registration).
    fn add_agent(
        &mut self,
        agent_id: &AgentId,
        total: &Resources,
        used: &[(FrameworkId, Resources)],
        active: bool,
    );
    /// The agent is gone; allocations on it vanish.
    fn remove_agent(&mut self, agent_id: &AgentId);
    /// The agent is connected: its resources may be offered.
    fn activate_agent(&mut self, agent_id: &AgentId);
    /// The agent is disconnected: no offers of its resources.
    fn deactivate_agent(&mut self, agent_id: &AgentId);
    /// Marks `resources` on the agent as used by the framework (tasks the
    /// master learnt about from an agent's report).
    fn update_usage(
        &mut self,
        framework_id: &FrameworkId,
        agent_id: &AgentId,
        resources: &Resources,
    );
    /// Gives back resources allocated to the framework on the agent
    /// (declined, left over from a launch, a finished task). With `refuse`,
    /// the framework is not offered these resources on that agent again
    /// before `now + refuse` (unless more become free there). Reserved
    /// resources come back to their role's account; unreserved ones to the
    /// framework's roles in the order they were allocated on that agent.
    fn recover(
        &mut self,
        framework_id: &FrameworkId,
        agent_id: &AgentId,
        resources: &Resources,
        refuse: Option<Duration>,
        now: Instant,
    );
    /// Clears the framework's filters and un-suppresses `roles` (all when empty).
    fn revive(&mut self, framework_id: &FrameworkId, roles: &[String]);
    /// Stops offers to the framework for `roles` (all when empty).
    fn suppress(&mut self, framework_id: &FrameworkId, roles: &[String]);
    /// A hint: the framework is served these first in the next cycle.
    fn request_resources(&mut self, framework_id: &FrameworkId, requests: &[ResourceRequest]);
    /// One allocation cycle: at most one allocation per agent per
    /// framework; returned resources are now allocated.
    fn allocate(&mut self, now: Instant) -> Vec<Allocation>;
    /// The framework's dominant share in `role` (unweighted), for `/state`;
    /// `None` when the allocator does not compute shares.
    fn framework_share(&self, _framework_id: &FrameworkId, _role: &str) -> Option<f64> {
        None
    }
    /// The role's dominant share divided by its weight, for `/state`;
    /// `None` when the allocator does not compute shares.
    fn role_share(&self, _role: &str) -> Option<f64> {
        None
    }
    /// What is free on the agent and what is allocated there (offered or
    /// used) to each framework, for checks of the master's books (the
    /// simulation's); `None` when the allocator does not tell.
    fn agent_accounts(&self, _agent_id: &AgentId) -> Option<AgentAccounts> {
        None
    }
    /// How many role and resource names the allocator has interned, and
    /// how many of them are in use. Roles and resource names are chosen by
    /// peers, so an allocator must not keep what nothing uses: after every
    /// call, [`Interned::within_bound`] holds. Cheap (O(1)): a simulation
    /// checks it after every step.
    fn interned(&self) -> Interned;
    /// Sets a role's quota at run time (`UPDATE_QUOTA`): `guarantee` is
    /// served first and held back from other roles, as a start-up quota;
    /// nothing is allocated to the role above `limit` for the scalars it
    /// names. An empty guarantee and no limit remove the quota. Applies
    /// from the next cycle; what is already allocated stays.
    fn set_quota(&mut self, role: &str, guarantee: &Resources, limit: Option<&Limits>);
    /// Sets a role's weight at run time (`UPDATE_WEIGHTS`); from the next
    /// cycle. A weight that is not finite and positive means 1.
    fn set_weight(&mut self, role: &str, weight: f64);
}

/// The sizes of an allocator's tables of interned names (see
/// [`Allocator::interned`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Interned {
    /// Entries of the role table, in use or not.
    pub roles: usize,
    /// Roles in use: subscribed to by a framework, held resources for,
    /// reserved on a live agent, or given a quota.
    pub roles_in_use: usize,
    /// Entries of the resource-name tables, in use or not: the (name,
    /// role, kind) triples of agents' resources, and the scalar names
    /// that shares are computed over.
    pub names: usize,
    /// Those in use: triples a live agent has, and scalar names of such a
    /// triple or of a quota (`cpus` and `mem` always).
    pub names_in_use: usize,
}

// === impl Interned ===

impl Interned {
    /// Whether the tables are within their bound of what is in use: at
    /// most twice what is in use, plus 64 (roles and names each).
    pub fn within_bound(&self) -> bool {
        self.roles <= 2 * self.roles_in_use + 64 && self.names <= 2 * self.names_in_use + 64
    }
}

/// An allocator's books for one agent (see [`Allocator::agent_accounts`]).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct AgentAccounts {
    /// Free: neither offered nor used.
    pub free: Resources,
    /// Allocated to each framework that has something there.
    pub allocated: Vec<(FrameworkId, Resources)>,
}
