//! Where a worker may run and where it would rather run.
//!
//! A [`Placement`] holds **hard constraints** ([`Constraint`]: attribute
//! equals / like / unlike, unique per attribute, at most k per attribute
//! value; Marathon's and Aurora's operators) and **soft preferences**
//! ([`Preferences`]: agents, hosts and racks with weights). Preferences are
//! resolved by **delay scheduling**: a request first takes only offers at
//! its best [`Locality`] level and steps down one level (LOCAL → HOST →
//! RACK → ANY) each time its locality wait passes without a placement.
//!
//! [`plan`] is the pure placement round the worker driver runs on each
//! batch of offers: pending requests and offers in, assignments and what
//! to do with every unused offer out. It keeps no state of its own; the
//! time a request has waited and the cluster's topology are inputs.

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use agora_proto::{AgentId, Offer, Resource, Resources};
use regex::Regex;
use serde::{Deserialize, Serialize};
use tokio::time::Instant;

use crate::spec::WorkerSpec;
use crate::WorkerId;

/// The attribute field that names the agent's host rather than an attribute.
pub const HOSTNAME_FIELD: &str = "hostname";

/// How close a worker landed to where it was wanted, best first (as
/// Flink's `Locality` and Spark's `TaskLocality`, with a rack level).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Locality {
    /// On a preferred agent.
    Local,
    /// On a preferred host (or the host of a preferred agent).
    Host,
    /// On a preferred rack (or the rack of a preferred host or agent).
    Rack,
    /// Anywhere else, or the request had no preference.
    Any,
}

/// A hard placement rule: an offer that breaks it is never used.
///
/// `field` is an agent attribute name, or `hostname` for the agent's host
/// name. An agent without the attribute fails every operator but
/// [`Constraint::Unlike`], as in Marathon. [`Constraint::Unique`] and
/// [`Constraint::MaxPer`] count the live workers of the same spec name.
#[derive(Debug, Clone)]
pub enum Constraint {
    /// The field equals `value`.
    Equals {
        /// Attribute name or `hostname`.
        field: String,
        /// The required value.
        value: String,
    },
    /// The field matches the regular expression (whole value).
    Like {
        /// Attribute name or `hostname`.
        field: String,
        /// The anchored expression.
        pattern: Regex,
    },
    /// The field is absent or does not match the regular expression.
    Unlike {
        /// Attribute name or `hostname`.
        field: String,
        /// The anchored expression.
        pattern: Regex,
    },
    /// At most one worker of the spec per value of the field.
    Unique {
        /// Attribute name or `hostname`.
        field: String,
    },
    /// At most `max` workers of the spec per value of the field.
    MaxPer {
        /// Attribute name or `hostname`.
        field: String,
        /// The limit per value.
        max: usize,
    },
}

/// Weighted soft preferences. An empty set means "no preference" and the
/// worker goes anywhere at once.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Preferences {
    /// Agents (the LOCAL level) and their weights.
    pub agents: Vec<(AgentId, f64)>,
    /// Host names (the HOST level) and their weights.
    pub hosts: Vec<(String, f64)>,
    /// Rack names, values of the rack attribute (the RACK level), and their weights.
    pub racks: Vec<(String, f64)>,
}

/// Hard constraints, soft preferences, and the locality wait for one spec.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Placement {
    /// Every one must hold.
    pub constraints: Vec<Constraint>,
    /// Resolved by delay scheduling.
    pub preferences: Preferences,
    /// Wait per locality level; the driver's default when `None`.
    pub locality_wait: Option<Duration>,
}

/// Why a constraint could not be built.
#[derive(Debug, thiserror::Error)]
pub enum PlacementError {
    /// The LIKE/UNLIKE expression does not compile.
    #[error("invalid pattern {pattern:?} for field {field}: {source}")]
    InvalidPattern {
        /// The field.
        field: String,
        /// The expression as given.
        pattern: String,
        /// Why.
        source: regex::Error,
    },
    /// `MaxPer` with a limit of 0 would never place anything.
    #[error("max_per({field}, 0) can never be met; use a limit of at least 1")]
    ZeroLimit {
        /// The field.
        field: String,
    },
}

/// What the driver has learnt of the cluster from offers: each agent's
/// host name and attributes, and each host's rack.
#[derive(Debug, Default, Clone)]
pub(crate) struct Topology {
    agents: HashMap<AgentId, AgentFacts>,
    host_rack: HashMap<String, String>,
    rack_attribute: String,
}

/// One agent as offers describe it.
#[derive(Debug, Clone, Default)]
pub(crate) struct AgentFacts {
    pub(crate) hostname: String,
    pub(crate) attributes: agora_proto::Attributes,
}

/// A request waiting for a placement, as [`plan`] sees it.
#[derive(Debug)]
pub(crate) struct PendingRequest<'a> {
    pub(crate) id: &'a WorkerId,
    pub(crate) spec: &'a WorkerSpec,
    /// When the request started waiting (its delay-scheduling clock).
    pub(crate) since: Instant,
}

/// A live worker, for [`Constraint::Unique`] and [`Constraint::MaxPer`].
#[derive(Debug)]
pub(crate) struct LiveWorker<'a> {
    pub(crate) spec_name: &'a str,
    pub(crate) agent_id: &'a AgentId,
}

/// One decision of a placement round.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Assignment {
    pub(crate) worker: WorkerId,
    /// Index into the round's offers.
    pub(crate) offer: usize,
    pub(crate) locality: Locality,
    /// The task's resources, ports included.
    pub(crate) resources: Resources,
    /// Named ports chosen from the offer.
    pub(crate) ports: BTreeMap<String, u64>,
}

/// The outcome of a placement round.
#[derive(Debug, Default, PartialEq)]
pub(crate) struct Plan {
    pub(crate) assignments: Vec<Assignment>,
    /// Offers no pending request could use at any level.
    pub(crate) unusable: Vec<usize>,
    /// Offers some request could use, but not yet at its allowed level.
    pub(crate) delayed: Vec<usize>,
    /// The earliest moment a request waiting on a delayed offer may step
    /// down a level.
    pub(crate) next_level_change: Option<Instant>,
}

// === impl Locality ===

impl Locality {
    /// Every level, best first.
    pub const ALL: [Locality; 4] = [
        Locality::Local,
        Locality::Host,
        Locality::Rack,
        Locality::Any,
    ];

    /// `local`, `host`, `rack` or `any`.
    pub fn as_str(self) -> &'static str {
        match self {
            Locality::Local => "local",
            Locality::Host => "host",
            Locality::Rack => "rack",
            Locality::Any => "any",
        }
    }
}

impl std::fmt::Display for Locality {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

// === impl Constraint ===

impl Constraint {
    /// `field == value`.
    pub fn equals(field: impl Into<String>, value: impl Into<String>) -> Constraint {
        Constraint::Equals {
            field: field.into(),
            value: value.into(),
        }
    }

    /// `field` matches `pattern` (anchored: the whole value).
    pub fn like(field: impl Into<String>, pattern: &str) -> Result<Constraint, PlacementError> {
        let field = field.into();
        let pattern = anchored(&field, pattern)?;
        Ok(Constraint::Like { field, pattern })
    }

    /// `field` is absent or does not match `pattern` (anchored).
    pub fn unlike(field: impl Into<String>, pattern: &str) -> Result<Constraint, PlacementError> {
        let field = field.into();
        let pattern = anchored(&field, pattern)?;
        Ok(Constraint::Unlike { field, pattern })
    }

    /// One worker of the spec per value of `field`.
    pub fn unique(field: impl Into<String>) -> Constraint {
        Constraint::Unique {
            field: field.into(),
        }
    }

    /// At most `max` workers of the spec per value of `field`.
    pub fn max_per(field: impl Into<String>, max: usize) -> Result<Constraint, PlacementError> {
        let field = field.into();
        if max == 0 {
            return Err(PlacementError::ZeroLimit { field });
        }
        Ok(Constraint::MaxPer { field, max })
    }

    /// The field this constraint reads.
    pub fn field(&self) -> &str {
        match self {
            Constraint::Equals { field, .. }
            | Constraint::Like { field, .. }
            | Constraint::Unlike { field, .. }
            | Constraint::Unique { field }
            | Constraint::MaxPer { field, .. } => field,
        }
    }

    /// The per-value limit of a counting constraint.
    fn limit(&self) -> Option<usize> {
        match self {
            Constraint::Unique { .. } => Some(1),
            Constraint::MaxPer { max, .. } => Some(*max),
            _ => None,
        }
    }

    /// Whether an agent whose field has `value` passes, with `count`
    /// workers of the spec already holding that value.
    fn admits(&self, value: Option<&str>, count: usize) -> bool {
        match self {
            Constraint::Equals { value: want, .. } => value == Some(want.as_str()),
            Constraint::Like { pattern, .. } => value.is_some_and(|v| pattern.is_match(v)),
            Constraint::Unlike { pattern, .. } => !value.is_some_and(|v| pattern.is_match(v)),
            Constraint::Unique { .. } | Constraint::MaxPer { .. } => {
                value.is_some() && count < self.limit().unwrap_or(usize::MAX)
            }
        }
    }
}

impl PartialEq for Constraint {
    fn eq(&self, other: &Constraint) -> bool {
        use Constraint::*;
        match (self, other) {
            (Equals { field: a, value: x }, Equals { field: b, value: y }) => a == b && x == y,
            (
                Like {
                    field: a,
                    pattern: x,
                },
                Like {
                    field: b,
                    pattern: y,
                },
            )
            | (
                Unlike {
                    field: a,
                    pattern: x,
                },
                Unlike {
                    field: b,
                    pattern: y,
                },
            ) => a == b && x.as_str() == y.as_str(),
            (Unique { field: a }, Unique { field: b }) => a == b,
            (MaxPer { field: a, max: x }, MaxPer { field: b, max: y }) => a == b && x == y,
            _ => false,
        }
    }
}

fn anchored(field: &str, pattern: &str) -> Result<Regex, PlacementError> {
    Regex::new(&format!("^(?:{pattern})$")).map_err(|source| PlacementError::InvalidPattern {
        field: field.to_string(),
        pattern: pattern.to_string(),
        source,
    })
}

// === impl Preferences ===

impl Preferences {
    /// Whether nothing is preferred.
    pub fn is_empty(&self) -> bool {
        self.agents.is_empty() && self.hosts.is_empty() && self.racks.is_empty()
    }

    /// The levels a request with these preferences steps through, best
    /// first; always ends with ANY.
    pub(crate) fn levels(&self) -> Vec<Locality> {
        let mut levels = Vec::with_capacity(4);
        if !self.agents.is_empty() {
            levels.push(Locality::Local);
        }
        if !self.agents.is_empty() || !self.hosts.is_empty() {
            levels.push(Locality::Host);
        }
        if !self.is_empty() {
            levels.push(Locality::Rack);
        }
        levels.push(Locality::Any);
        levels
    }
}

// === impl Topology ===

impl Topology {
    pub(crate) fn new(rack_attribute: &str) -> Topology {
        Topology {
            rack_attribute: rack_attribute.to_string(),
            ..Topology::default()
        }
    }

    /// Remembers what an offer says about its agent.
    pub(crate) fn learn(&mut self, offer: &Offer) {
        if let Some(rack) = rack_of(&offer.attributes, &self.rack_attribute) {
            self.host_rack.insert(offer.hostname.clone(), rack);
        }
        self.agents.insert(
            offer.agent_id.clone(),
            AgentFacts {
                hostname: offer.hostname.clone(),
                attributes: offer.attributes.clone(),
            },
        );
    }

    /// Remembers a host name known from a stored worker record.
    pub(crate) fn learn_host(&mut self, agent_id: &AgentId, hostname: &str, rack: Option<&str>) {
        self.agents
            .entry(agent_id.clone())
            .or_insert_with(|| AgentFacts {
                hostname: hostname.to_string(),
                attributes: Default::default(),
            });
        if let Some(rack) = rack {
            self.host_rack
                .entry(hostname.to_string())
                .or_insert_with(|| rack.to_string());
        }
    }

    /// The rack of an offer's agent.
    pub(crate) fn rack(&self, offer: &Offer) -> Option<String> {
        rack_of(&offer.attributes, &self.rack_attribute)
    }

    /// The value of `field` on an agent known from offers.
    fn field_of_agent(&self, agent_id: &AgentId, field: &str) -> Option<String> {
        let facts = self.agents.get(agent_id)?;
        if field == HOSTNAME_FIELD {
            return Some(facts.hostname.clone());
        }
        facts.attributes.get(field).map(|v| v.to_string())
    }

    /// The locality an agent would give a request with `prefs`, and the
    /// weight of the preference it meets (0 at ANY).
    pub(crate) fn locality(
        &self,
        prefs: &Preferences,
        agent_id: &AgentId,
        hostname: &str,
        rack: Option<&str>,
    ) -> (Locality, f64) {
        if let Some((_, w)) = prefs.agents.iter().find(|(a, _)| a == agent_id) {
            return (Locality::Local, *w);
        }
        let agent_host = |a: &AgentId| self.agents.get(a).map(|f| f.hostname.as_str());
        let host_weight = prefs
            .hosts
            .iter()
            .filter(|(h, _)| h == hostname)
            .map(|(_, w)| *w)
            .chain(
                prefs
                    .agents
                    .iter()
                    .filter(|(a, _)| agent_host(a) == Some(hostname))
                    .map(|(_, w)| *w),
            )
            .fold(None, |best: Option<f64>, w| {
                Some(best.map_or(w, |b| b.max(w)))
            });
        if let Some(w) = host_weight {
            return (Locality::Host, w);
        }
        let Some(rack) = rack else {
            return (Locality::Any, 0.0);
        };
        let host_rack = |h: &str| self.host_rack.get(h).map(String::as_str);
        let rack_weight = prefs
            .racks
            .iter()
            .filter(|(r, _)| r == rack)
            .map(|(_, w)| *w)
            .chain(
                prefs
                    .hosts
                    .iter()
                    .filter(|(h, _)| host_rack(h) == Some(rack))
                    .map(|(_, w)| *w),
            )
            .chain(
                prefs
                    .agents
                    .iter()
                    .filter(|(a, _)| agent_host(a).and_then(host_rack) == Some(rack))
                    .map(|(_, w)| *w),
            )
            .fold(None, |best: Option<f64>, w| {
                Some(best.map_or(w, |b| b.max(w)))
            });
        match rack_weight {
            Some(w) => (Locality::Rack, w),
            None => (Locality::Any, 0.0),
        }
    }
}

fn rack_of(attributes: &agora_proto::Attributes, name: &str) -> Option<String> {
    attributes.get(name).map(|v| v.to_string())
}

/// The value of `field` for an offer's agent.
fn field_of_offer<'a>(offer: &'a Offer, field: &str) -> Option<std::borrow::Cow<'a, str>> {
    if field == HOSTNAME_FIELD {
        return Some(std::borrow::Cow::Borrowed(offer.hostname.as_str()));
    }
    match offer.attributes.get(field)? {
        agora_proto::AttributeValue::Text(t) => Some(std::borrow::Cow::Borrowed(t.as_str())),
        other => Some(std::borrow::Cow::Owned(other.to_string())),
    }
}

/// The level a request may take now: one step down per `wait` waited.
pub(crate) fn allowed_level(
    levels: &[Locality],
    since: Instant,
    wait: Duration,
    now: Instant,
) -> (Locality, Option<Instant>) {
    let last = levels.len().saturating_sub(1);
    let waited = now.saturating_duration_since(since);
    let step = if wait.is_zero() {
        last
    } else {
        ((waited.as_nanos() / wait.as_nanos()) as usize).min(last)
    };
    let next = (step < last).then(|| since + wait * (step as u32 + 1));
    (levels.get(step).copied().unwrap_or(Locality::Any), next)
}

/// Takes `count` ports from the `ports` ranges of `available`.
fn take_ports(available: &Resources, count: usize) -> Option<Vec<u64>> {
    if count == 0 {
        return Some(Vec::new());
    }
    let mut out = Vec::with_capacity(count);
    for range in available.ports() {
        let mut p = range.begin;
        while p <= range.end && out.len() < count {
            out.push(p);
            p += 1;
        }
        if out.len() == count {
            return Some(out);
        }
    }
    None
}

/// One placement round (see the module docs). `pending` is in request
/// order (first come, first placed); `default_wait` applies to specs
/// without their own locality wait.
pub(crate) fn plan(
    pending: &[PendingRequest<'_>],
    offers: &[Offer],
    live: &[LiveWorker<'_>],
    topology: &Topology,
    default_wait: Duration,
    now: Instant,
) -> Plan {
    let mut remaining: Vec<Resources> = offers.iter().map(|o| o.resources.clone()).collect();
    let mut used = vec![false; offers.len()];
    let mut fits_someone = vec![false; offers.len()];
    let racks: Vec<Option<String>> = offers.iter().map(|o| topology.rack(o)).collect();
    // (spec name, field, value) → workers holding it, for the counting
    // constraints; assignments of this round are added as they are made.
    let mut counts: HashMap<(String, String, String), usize> = HashMap::new();
    let counted_fields: Vec<(&str, &str)> = pending
        .iter()
        .flat_map(|p| {
            p.spec
                .placement
                .constraints
                .iter()
                .filter(|c| c.limit().is_some())
                .map(move |c| (p.spec.name.as_str(), c.field()))
        })
        .collect();
    if !counted_fields.is_empty() {
        for w in live {
            for (spec, field) in &counted_fields {
                if *spec == w.spec_name {
                    if let Some(value) = topology.field_of_agent(w.agent_id, field) {
                        *counts
                            .entry((spec.to_string(), field.to_string(), value))
                            .or_default() += 1;
                    }
                }
            }
        }
    }
    let mut result = Plan::default();
    for request in pending {
        let spec = request.spec;
        let wait = spec.placement.locality_wait.unwrap_or(default_wait);
        let levels = spec.placement.preferences.levels();
        let (allowed, next_change) = allowed_level(&levels, request.since, wait, now);
        // The best offer for this request: locality, then weight, then
        // the most cpus left (spreads workers of equal rank).
        let mut best: Option<(usize, Locality, f64, Vec<u64>)> = None;
        let mut candidates = Vec::new();
        for (i, offer) in offers.iter().enumerate() {
            let Some(ports) = fits(spec, &remaining[i]) else {
                continue;
            };
            let admitted = spec.placement.constraints.iter().all(|c| {
                let value = field_of_offer(offer, c.field());
                let count = match (&value, c.limit()) {
                    (Some(v), Some(_)) => counts
                        .get(&(spec.name.clone(), c.field().to_string(), v.to_string()))
                        .copied()
                        .unwrap_or(0),
                    _ => 0,
                };
                c.admits(value.as_deref(), count)
            });
            if !admitted {
                continue;
            }
            candidates.push(i);
            let (locality, weight) = topology.locality(
                &spec.placement.preferences,
                &offer.agent_id,
                &offer.hostname,
                racks[i].as_deref(),
            );
            let better = match &best {
                None => true,
                Some((b, bl, bw, _)) => {
                    (locality, -weight, -remaining[i].cpus(), i)
                        < (*bl, -*bw, -remaining[*b].cpus(), *b)
                }
            };
            if better {
                best = Some((i, locality, weight, ports));
            }
        }
        let Some((i, locality, _, ports)) = best else {
            continue;
        };
        if locality > allowed {
            // Those offers would do later: declined only until then.
            for c in candidates {
                fits_someone[c] = true;
            }
            if let Some(change) = next_change {
                result.next_level_change = Some(
                    result
                        .next_level_change
                        .map_or(change, |c: Instant| c.min(change)),
                );
            }
            continue;
        }
        let mut resources = spec.resources.clone();
        let names: Vec<&String> = spec.ports.iter().collect();
        let mut named = BTreeMap::new();
        if !ports.is_empty() {
            let ranges: Vec<(u64, u64)> = ports.iter().map(|p| (*p, *p)).collect();
            if let Ok(r) = Resource::ranges("ports", &ranges) {
                resources.add_resource(r);
            }
            for (name, port) in names.into_iter().zip(&ports) {
                named.insert(name.clone(), *port);
            }
        }
        remaining[i] = remaining[i].saturating_sub(&resources);
        used[i] = true;
        for c in &spec.placement.constraints {
            if c.limit().is_some() {
                if let Some(v) = field_of_offer(&offers[i], c.field()) {
                    *counts
                        .entry((spec.name.clone(), c.field().to_string(), v.to_string()))
                        .or_default() += 1;
                }
            }
        }
        result.assignments.push(Assignment {
            worker: request.id.clone(),
            offer: i,
            locality,
            resources,
            ports: named,
        });
    }
    for i in 0..offers.len() {
        if used[i] {
            continue;
        }
        if fits_someone[i] {
            result.delayed.push(i);
        } else {
            result.unusable.push(i);
        }
    }
    result
}

/// The ports a spec would take from `available`, when its resources fit.
fn fits(spec: &WorkerSpec, available: &Resources) -> Option<Vec<u64>> {
    if !available.contains(&spec.resources) {
        return None;
    }
    take_ports(available, spec.ports.len())
}

#[cfg(test)]
mod tests {
    use super::*;
    use agora_proto::{Attributes, FrameworkId, OfferId};

    fn offer(i: usize, host: &str, attrs: &str, resources: &str) -> Offer {
        Offer {
            id: OfferId::new(format!("o{i}")),
            framework_id: FrameworkId::new("f"),
            agent_id: AgentId::new(format!("a{i}")),
            hostname: host.to_string(),
            resources: Resources::parse(resources).unwrap(),
            attributes: Attributes::parse(attrs).unwrap(),
            executor_ids: vec![],
            allocation_role: None,
        }
    }

    fn spec(name: &str) -> WorkerSpec {
        WorkerSpec::new(name, Resources::parse("cpus:1;mem:128").unwrap(), "true")
    }

    fn topology(offers: &[Offer]) -> Topology {
        let mut t = Topology::new("rack");
        for o in offers {
            t.learn(o);
        }
        t
    }

    const BIG: &str = "cpus:8;mem:4096;ports:[31000-31010]";

    fn cluster() -> Vec<Offer> {
        vec![
            offer(0, "h0", "rack:r0;disk:ssd", BIG),
            offer(1, "h1", "rack:r0;disk:hdd", BIG),
            offer(2, "h2", "rack:r1", BIG),
        ]
    }

    fn run(specs: &[(WorkerSpec, Instant)], offers: &[Offer], now: Instant) -> Plan {
        let ids: Vec<WorkerId> = (0..specs.len())
            .map(|i| WorkerId::new(format!("w{i}")))
            .collect();
        let pending: Vec<PendingRequest<'_>> = specs
            .iter()
            .zip(&ids)
            .map(|((spec, since), id)| PendingRequest {
                id,
                spec,
                since: *since,
            })
            .collect();
        plan(
            &pending,
            offers,
            &[],
            &topology(offers),
            Duration::from_secs(3),
            now,
        )
    }

    #[test]
    fn delay_scheduling_steps_down_one_level_per_wait() {
        let levels = [Locality::Host, Locality::Rack, Locality::Any];
        let t0 = Instant::now();
        let wait = Duration::from_secs(3);
        let at = |s: u64| allowed_level(&levels, t0, wait, t0 + Duration::from_secs(s));
        assert_eq!(at(0), (Locality::Host, Some(t0 + wait)));
        assert_eq!(at(2).0, Locality::Host);
        assert_eq!(at(3), (Locality::Rack, Some(t0 + wait * 2)));
        assert_eq!(at(6), (Locality::Any, None));
        assert_eq!(at(600), (Locality::Any, None));
        assert_eq!(
            allowed_level(&[Locality::Any], t0, wait, t0),
            (Locality::Any, None)
        );
    }

    #[test]
    fn preferred_host_wins_and_reports_host_locality() {
        let offers = cluster();
        let now = Instant::now();
        let s = spec("tm").prefer_host("h2", 1.0);
        let plan = run(&[(s, now)], &offers, now);
        assert_eq!(plan.assignments.len(), 1);
        assert_eq!(plan.assignments[0].offer, 2);
        assert_eq!(plan.assignments[0].locality, Locality::Host);
        // The others fit nobody still waiting: refused, not delayed.
        assert!(plan.delayed.is_empty(), "{plan:?}");
    }

    #[test]
    fn preferred_agent_is_local_and_its_rack_mate_is_rack() {
        let offers = cluster();
        let t = topology(&offers);
        let prefs = Preferences {
            agents: vec![(AgentId::new("a0"), 1.0)],
            ..Preferences::default()
        };
        assert_eq!(
            t.locality(&prefs, &AgentId::new("a0"), "h0", Some("r0")).0,
            Locality::Local
        );
        assert_eq!(
            t.locality(&prefs, &AgentId::new("a1"), "h1", Some("r0")).0,
            Locality::Rack
        );
        assert_eq!(
            t.locality(&prefs, &AgentId::new("a2"), "h2", Some("r1")).0,
            Locality::Any
        );
        assert_eq!(
            t.locality(&prefs, &AgentId::new("a9"), "h0", None).0,
            Locality::Host
        );
    }

    #[test]
    fn a_worse_offer_is_delayed_until_the_wait_passes() {
        // Only h1 offers; the request wants h2 (rack r1, alone there).
        let offers = vec![offer(1, "h1", "rack:r0", BIG)];
        let mut t = topology(&offers);
        t.learn(&offer(2, "h2", "rack:r1", BIG));
        let t0 = Instant::now();
        let s = spec("tm").prefer_host("h2", 1.0);
        let id = WorkerId::new("w0");
        let pending = [PendingRequest {
            id: &id,
            spec: &s,
            since: t0,
        }];
        let wait = Duration::from_secs(3);
        let at = |secs: u64| {
            plan(
                &pending,
                &offers,
                &[],
                &t,
                wait,
                t0 + Duration::from_secs(secs),
            )
        };
        let early = at(1);
        assert!(early.assignments.is_empty());
        assert_eq!(early.delayed, vec![0]);
        assert_eq!(early.next_level_change, Some(t0 + wait));
        // RACK level: h1 is on another rack, still too far.
        let rack = at(4);
        assert!(rack.assignments.is_empty());
        assert_eq!(rack.next_level_change, Some(t0 + wait * 2));
        // After twice the wait it takes ANY.
        let late = at(6);
        assert_eq!(late.assignments.len(), 1);
        assert_eq!(late.assignments[0].locality, Locality::Any);
    }

    #[test]
    fn heavier_preference_wins_at_the_same_level() {
        let offers = cluster();
        let now = Instant::now();
        let s = spec("tm").prefer_host("h0", 1.0).prefer_host("h1", 5.0);
        let plan = run(&[(s, now)], &offers, now);
        assert_eq!(plan.assignments[0].offer, 1);
    }

    #[test]
    fn equals_like_unlike_and_missing_attributes() {
        let offers = cluster();
        let now = Instant::now();
        let ssd = spec("a").constraint(Constraint::equals("disk", "ssd"));
        assert_eq!(run(&[(ssd, now)], &offers, now).assignments[0].offer, 0);
        let like = spec("b").constraint(Constraint::like("hostname", "h[12]").unwrap());
        let plan = run(&[(like, now)], &offers, now);
        assert!(matches!(plan.assignments[0].offer, 1 | 2));
        assert!(plan.unusable.contains(&0));
        // UNLIKE accepts the agent without the attribute (h2 has no disk).
        let unlike = spec("c").constraint(Constraint::unlike("disk", "ssd|hdd").unwrap());
        assert_eq!(run(&[(unlike, now)], &offers, now).assignments[0].offer, 2);
        // LIKE on a missing attribute never matches.
        let like_missing = spec("d").constraint(Constraint::like("zone", ".*").unwrap());
        let plan = run(&[(like_missing, now)], &offers, now);
        assert!(plan.assignments.is_empty());
        assert_eq!(plan.unusable.len(), 3);
        assert!(Constraint::like("x", "(").is_err());
        assert!(Constraint::max_per("rack", 0).is_err());
    }

    #[test]
    fn unique_hostname_places_one_per_host_and_leaves_the_rest() {
        let offers = cluster();
        let now = Instant::now();
        let s = spec("tm").constraint(Constraint::unique("hostname"));
        let specs: Vec<_> = (0..4).map(|_| (s.clone(), now)).collect();
        let plan = run(&specs, &offers, now);
        assert_eq!(plan.assignments.len(), 3);
        let mut hosts: Vec<usize> = plan.assignments.iter().map(|a| a.offer).collect();
        hosts.sort();
        assert_eq!(hosts, vec![0, 1, 2]);
    }

    #[test]
    fn unique_counts_live_workers_of_the_same_spec_only() {
        let offers = cluster();
        let t = topology(&offers);
        let now = Instant::now();
        let s = spec("tm").constraint(Constraint::unique("hostname"));
        let id = WorkerId::new("w");
        let pending = [PendingRequest {
            id: &id,
            spec: &s,
            since: now,
        }];
        let (a0, a1) = (AgentId::new("a0"), AgentId::new("a1"));
        let live = [
            LiveWorker {
                spec_name: "tm",
                agent_id: &a0,
            },
            LiveWorker {
                spec_name: "other",
                agent_id: &a1,
            },
        ];
        let plan = plan(&pending, &offers, &live, &t, Duration::ZERO, now);
        assert_eq!(plan.assignments.len(), 1);
        assert_ne!(plan.assignments[0].offer, 0, "h0 already holds a tm");
    }

    #[test]
    fn max_per_rack_holds() {
        let offers = cluster();
        let now = Instant::now();
        let s = spec("tm").constraint(Constraint::max_per("rack", 2).unwrap());
        let specs: Vec<_> = (0..6).map(|_| (s.clone(), now)).collect();
        let plan = run(&specs, &offers, now);
        let mut per_rack: HashMap<&str, usize> = HashMap::new();
        for a in &plan.assignments {
            let rack = if a.offer < 2 { "r0" } else { "r1" };
            *per_rack.entry(rack).or_default() += 1;
        }
        assert_eq!(per_rack.get("r0"), Some(&2));
        assert_eq!(per_rack.get("r1"), Some(&2));
        assert_eq!(plan.assignments.len(), 4);
    }

    #[test]
    fn resources_and_named_ports_are_taken_from_the_offer() {
        let offers = vec![offer(
            0,
            "h0",
            "rack:r0",
            "cpus:2;mem:256;ports:[31000-31002]",
        )];
        let now = Instant::now();
        let s = spec("tm").port("rpc").port("data");
        let plan = run(
            &[(s.clone(), now), (s.clone(), now), (s, now)],
            &offers,
            now,
        );
        assert_eq!(plan.assignments.len(), 1, "one fits by ports and cpus");
        let a = &plan.assignments[0];
        assert_eq!(a.ports.get("rpc"), Some(&31000));
        assert_eq!(a.ports.get("data"), Some(&31001));
        assert_eq!(a.resources.range_count("ports"), 2);
        assert!(offers[0].resources.contains(&a.resources));
    }

    #[test]
    fn offers_nobody_can_use_are_unusable() {
        let offers = vec![offer(0, "h0", "rack:r0", "cpus:0.5;mem:64")];
        let now = Instant::now();
        let plan = run(&[(spec("tm"), now)], &offers, now);
        assert_eq!(plan.unusable, vec![0]);
        assert!(plan.delayed.is_empty());
    }
}
