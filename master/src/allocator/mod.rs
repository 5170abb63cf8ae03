//! The allocator: decides which framework is offered which agent's free
//! resources. It is a pure, synchronous component: the master tells it
//! about agents, frameworks, usage and filters, and calls
//! [`Allocator::allocate`] with the current time; it never touches a
//! socket or a clock itself, so it is tested and benchmarked in isolation.
//!
//! The default implementation is [`DrfAllocator`] (dominant resource
//! fairness, weighted by role).

mod drf;

use std::time::Duration;

use agora_proto::scheduler::ResourceRequest;
use agora_proto::{AgentId, FrameworkId, Resources};
use tokio::time::Instant;

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
    /// Weight per role (default 1.0); a framework weighs as its heaviest role.
    pub role_weights: std::collections::BTreeMap<String, f64>,
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
    /// before `now + refuse` (unless more become free there).
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
}
