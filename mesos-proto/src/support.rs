//! What Agora carries out of what Mesos clients send, in one place.
//!
//! [`CARRIED`] lists, for every message a client's call can reach
//! through fields Agora reads, the fields Agora carries out; every other
//! field of those messages is refused when it is set, and so is every
//! field of a message not listed at all. [`CARRIED_VALUES`] lists, for
//! the enum fields where Agora does only some of what Mesos does (call
//! types, offer operations, capabilities, ...), the values it carries out.
//! Nothing is ignored: a field is carried out or refused by name
//! ([`Refusal`], "TaskInfo.container is not supported").
//!
//! Turning a refusal into a feature is one edit here (and the row of
//! `docs/mesos.md`, whose table a test compares with these lists).
//!
//! The check walks a message's protobuf encoding with rules built once
//! from the descriptors (no allocation per field, no reflection per
//! call), so it is cheap enough for every call, task and update. A
//! message's "set" fields are those its encoding holds: proto2 optional
//! fields that were given (even their default value) and non-empty
//! repeated fields.

use std::collections::HashMap;
use std::fmt;
use std::sync::LazyLock;

use prost::encoding::{decode_key, decode_varint, WireType};
use prost_reflect::{EnumDescriptor, Kind, ReflectMessage};

use crate::DESCRIPTOR_POOL;

/// The fields Agora carries out of one message.
#[derive(Debug, Clone, Copy)]
pub struct Carried {
    /// The message's full name (`mesos.v1.TaskInfo`).
    pub message: &'static str,
    /// The fields carried out; any other field, when set, is refused.
    pub fields: &'static [&'static str],
}

/// The values Agora carries out of one enum field.
#[derive(Debug, Clone, Copy)]
pub struct CarriedValues {
    /// The field's full name (`mesos.v1.Offer.Operation.type`).
    pub field: &'static str,
    /// The values carried out; any other, when set, is refused.
    pub values: &'static [&'static str],
}

/// A field (or one value of it) that Agora does not carry out.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    /// The field, as its message's name in its package below `mesos.v1`
    /// and the field's name: `TaskInfo.container`,
    /// `scheduler.Call.Kill.kill_policy`.
    pub field: String,
    /// The value refused, for an enum field: `RESERVE` (a number when the
    /// enum has no such value).
    pub value: Option<String>,
}

const fn carried(message: &'static str, fields: &'static [&'static str]) -> Carried {
    Carried { message, fields }
}

const fn values(field: &'static str, values: &'static [&'static str]) -> CarriedValues {
    CarriedValues { field, values }
}

/// Every message Agora reads from a Mesos client, with the fields it
/// carries out. See the module documentation.
pub const CARRIED: &[Carried] = &[
    // The scheduler API (`/api/v1/scheduler`).
    carried(
        "mesos.v1.scheduler.Call",
        &[
            "framework_id",
            "type",
            "subscribe",
            "accept",
            "decline",
            "revive",
            "kill",
            "shutdown",
            "acknowledge",
            "reconcile",
            "message",
            "request",
            "suppress",
        ],
    ),
    carried("mesos.v1.scheduler.Call.Subscribe", &["framework_info"]),
    carried(
        "mesos.v1.scheduler.Call.Accept",
        &["offer_ids", "operations", "filters"],
    ),
    carried("mesos.v1.scheduler.Call.Decline", &["offer_ids", "filters"]),
    carried("mesos.v1.scheduler.Call.Revive", &["roles"]),
    carried("mesos.v1.scheduler.Call.Suppress", &["roles"]),
    carried("mesos.v1.scheduler.Call.Kill", &["task_id", "agent_id"]),
    carried(
        "mesos.v1.scheduler.Call.Shutdown",
        &["executor_id", "agent_id"],
    ),
    carried(
        "mesos.v1.scheduler.Call.Acknowledge",
        &["agent_id", "task_id", "uuid"],
    ),
    carried("mesos.v1.scheduler.Call.Reconcile", &["tasks"]),
    carried(
        "mesos.v1.scheduler.Call.Reconcile.Task",
        &["task_id", "agent_id"],
    ),
    carried(
        "mesos.v1.scheduler.Call.Message",
        &["agent_id", "executor_id", "data"],
    ),
    carried("mesos.v1.scheduler.Call.Request", &["requests"]),
    carried("mesos.v1.Request", &["agent_id", "resources"]),
    // Frameworks.
    carried(
        "mesos.v1.FrameworkInfo",
        &[
            "user",
            "name",
            "id",
            "failover_timeout",
            "checkpoint",
            "role",
            "roles",
            "hostname",
            "principal",
            "webui_url",
            "capabilities",
        ],
    ),
    carried("mesos.v1.FrameworkInfo.Capability", &["type"]),
    // Offers and their operations.
    carried(
        "mesos.v1.Offer.Operation",
        &["type", "launch", "launch_group"],
    ),
    carried("mesos.v1.Offer.Operation.Launch", &["task_infos"]),
    carried(
        "mesos.v1.Offer.Operation.LaunchGroup",
        &["executor", "task_group"],
    ),
    carried("mesos.v1.TaskGroupInfo", &["tasks"]),
    carried("mesos.v1.Filters", &["refuse_seconds"]),
    // Tasks, executors, commands.
    carried(
        "mesos.v1.TaskInfo",
        &[
            "name",
            "task_id",
            "agent_id",
            "resources",
            "executor",
            "command",
            "kill_policy",
            "data",
            "labels",
            "container",
        ],
    ),
    carried(
        "mesos.v1.ExecutorInfo",
        &[
            "type",
            "executor_id",
            "framework_id",
            "command",
            "resources",
            "name",
            "source",
            "data",
            "shutdown_grace_period",
            "labels",
        ],
    ),
    // Containers (issue 26): images run on the agent's OCI runtime, with
    // host-path and sandbox-path volumes. CNI networks, port mappings and
    // the Docker daemon's own options are refused by name.
    carried(
        "mesos.v1.ContainerInfo",
        &["type", "volumes", "hostname", "docker", "mesos"],
    ),
    carried(
        "mesos.v1.ContainerInfo.DockerInfo",
        &["image", "network", "force_pull_image"],
    ),
    carried("mesos.v1.ContainerInfo.MesosInfo", &["image"]),
    carried("mesos.v1.Image", &["type", "docker", "cached"]),
    carried("mesos.v1.Image.Docker", &["name"]),
    carried(
        "mesos.v1.Volume",
        &["mode", "container_path", "host_path", "source"],
    ),
    carried(
        "mesos.v1.Volume.Source",
        &["type", "host_path", "sandbox_path"],
    ),
    carried("mesos.v1.Volume.Source.HostPath", &["path"]),
    carried("mesos.v1.Volume.Source.SandboxPath", &["type", "path"]),
    carried(
        "mesos.v1.CommandInfo",
        &["uris", "environment", "shell", "value", "arguments"],
    ),
    carried(
        "mesos.v1.CommandInfo.URI",
        &["value", "executable", "extract", "output_file"],
    ),
    carried("mesos.v1.Environment", &["variables"]),
    carried("mesos.v1.Environment.Variable", &["name", "type", "value"]),
    carried("mesos.v1.KillPolicy", &["grace_period"]),
    // Resources.
    carried(
        "mesos.v1.Resource",
        &[
            "name",
            "type",
            "scalar",
            "ranges",
            "set",
            "role",
            "allocation_info",
            "reservations",
        ],
    ),
    carried("mesos.v1.Resource.AllocationInfo", &["role"]),
    carried("mesos.v1.Resource.ReservationInfo", &["type", "role"]),
    carried("mesos.v1.Value.Scalar", &["value"]),
    carried("mesos.v1.Value.Ranges", &["range"]),
    carried("mesos.v1.Value.Range", &["begin", "end"]),
    carried("mesos.v1.Value.Set", &["item"]),
    // Small shared messages.
    carried("mesos.v1.FrameworkID", &["value"]),
    carried("mesos.v1.AgentID", &["value"]),
    carried("mesos.v1.TaskID", &["value"]),
    carried("mesos.v1.ExecutorID", &["value"]),
    carried("mesos.v1.OfferID", &["value"]),
    carried("mesos.v1.Labels", &["labels"]),
    carried("mesos.v1.Label", &["key", "value"]),
    carried("mesos.v1.DurationInfo", &["nanoseconds"]),
    // The executor API (the agent's `/api/v1/executor`).
    carried(
        "mesos.v1.executor.Call",
        &[
            "executor_id",
            "framework_id",
            "type",
            "subscribe",
            "update",
            "message",
        ],
    ),
    carried(
        "mesos.v1.executor.Call.Subscribe",
        &["unacknowledged_tasks", "unacknowledged_updates"],
    ),
    carried("mesos.v1.executor.Call.Update", &["status"]),
    carried("mesos.v1.executor.Call.Message", &["data"]),
    carried(
        "mesos.v1.TaskStatus",
        &[
            "task_id",
            "state",
            "message",
            "source",
            "reason",
            "data",
            "agent_id",
            "executor_id",
            "timestamp",
            "uuid",
            "healthy",
            "labels",
        ],
    ),
    // The operator API (the master's `/api/v1`).
    carried(
        "mesos.v1.master.Call",
        &[
            "type",
            "get_metrics",
            "teardown",
            "drain_agent",
            "deactivate_agent",
            "reactivate_agent",
            "mark_agent_gone",
            "update_quota",
            "update_weights",
        ],
    ),
    carried("mesos.v1.agent.Call", &["type", "get_containers"]),
    carried(
        "mesos.v1.agent.Call.GetContainers",
        &["show_nested", "show_standalone"],
    ),
    carried("mesos.v1.master.Call.GetMetrics", &["timeout"]),
    carried("mesos.v1.master.Call.Teardown", &["framework_id"]),
    carried(
        "mesos.v1.master.Call.DrainAgent",
        &["agent_id", "max_grace_period", "mark_gone"],
    ),
    carried("mesos.v1.master.Call.DeactivateAgent", &["agent_id"]),
    carried("mesos.v1.master.Call.ReactivateAgent", &["agent_id"]),
    carried("mesos.v1.master.Call.MarkAgentGone", &["agent_id"]),
    carried("google.protobuf.Duration", &["seconds", "nanos"]),
    carried(
        "mesos.v1.master.Call.UpdateQuota",
        &["force", "quota_configs"],
    ),
    carried(
        "mesos.v1.quota.QuotaConfig",
        &["role", "guarantees", "limits"],
    ),
    carried(
        "mesos.v1.quota.QuotaConfig.GuaranteesEntry",
        &["key", "value"],
    ),
    carried("mesos.v1.quota.QuotaConfig.LimitsEntry", &["key", "value"]),
    carried("mesos.v1.master.Call.UpdateWeights", &["weight_infos"]),
    carried("mesos.v1.WeightInfo", &["weight", "role"]),
];

/// The enum fields of which Agora carries out only some values. See the
/// module documentation.
pub const CARRIED_VALUES: &[CarriedValues] = &[
    values(
        "mesos.v1.scheduler.Call.type",
        &[
            "SUBSCRIBE",
            "TEARDOWN",
            "ACCEPT",
            "DECLINE",
            "REVIVE",
            "KILL",
            "SHUTDOWN",
            "ACKNOWLEDGE",
            "RECONCILE",
            "MESSAGE",
            "REQUEST",
            "SUPPRESS",
        ],
    ),
    values("mesos.v1.Offer.Operation.type", &["LAUNCH", "LAUNCH_GROUP"]),
    values(
        "mesos.v1.FrameworkInfo.Capability.type",
        &[
            "TASK_KILLING_STATE",
            "GPU_RESOURCES",
            "PARTITION_AWARE",
            "MULTI_ROLE",
            "RESERVATION_REFINEMENT",
        ],
    ),
    values("mesos.v1.Environment.Variable.type", &["VALUE"]),
    values("mesos.v1.ContainerInfo.DockerInfo.network", &["HOST"]),
    values("mesos.v1.Image.type", &["DOCKER"]),
    values(
        "mesos.v1.Volume.Source.type",
        &["HOST_PATH", "SANDBOX_PATH"],
    ),
    values("mesos.v1.Resource.type", &["SCALAR", "RANGES", "SET"]),
    values("mesos.v1.Resource.ReservationInfo.type", &["STATIC"]),
    values(
        "mesos.v1.executor.Call.type",
        &["SUBSCRIBE", "UPDATE", "MESSAGE", "HEARTBEAT"],
    ),
    values(
        "mesos.v1.agent.Call.type",
        &[
            "GET_STATE",
            "GET_FRAMEWORKS",
            "GET_EXECUTORS",
            "GET_TASKS",
            "GET_CONTAINERS",
        ],
    ),
    values(
        "mesos.v1.master.Call.type",
        &[
            "GET_HEALTH",
            "GET_VERSION",
            "GET_METRICS",
            "GET_STATE",
            "GET_AGENTS",
            "GET_FRAMEWORKS",
            "GET_EXECUTORS",
            "GET_TASKS",
            "GET_MASTER",
            "SUBSCRIBE",
            "TEARDOWN",
            "DRAIN_AGENT",
            "DEACTIVATE_AGENT",
            "REACTIVATE_AGENT",
            "MARK_AGENT_GONE",
            "GET_ROLES",
            "GET_WEIGHTS",
            "UPDATE_WEIGHTS",
            "GET_QUOTA",
            "UPDATE_QUOTA",
        ],
    ),
];

/// Whether Agora carries out `field` (full name: `mesos.v1.TaskInfo.container`).
pub fn carries_field(field: &str) -> bool {
    let Some((message, name)) = field.rsplit_once('.') else {
        return false;
    };
    CARRIED
        .iter()
        .any(|c| c.message == message && c.fields.contains(&name))
}

/// Whether Agora carries out `value` (a number) of the enum field `field`
/// (full name). A field without a restriction in [`CARRIED_VALUES`]
/// carries every value its enum defines.
pub fn carries_value(field: &str, value: i32) -> bool {
    RULES.value_allowed(field, value)
}

/// Whether Agora carries out the value named `value` of `field`.
pub fn carries_value_named(field: &str, value: &str) -> bool {
    match CARRIED_VALUES.iter().find(|v| v.field == field) {
        Some(v) => v.values.contains(&value),
        None => true,
    }
}

/// The first field (or enum value) of `message` that Agora does not
/// carry out, if any.
pub fn refusal<M: ReflectMessage + Default + 'static>(message: &M) -> Option<Refusal> {
    refusal_outside(message, &[])
}

/// As [`refusal`], but the fields named in `own` (full names, e.g.
/// `mesos.v1.scheduler.Call.Accept.operations`) are not looked into:
/// their caller checks them itself, with a refusal of its own (a task's
/// refused field is a `TASK_ERROR` for that task, not for the call).
pub fn refusal_outside<M: ReflectMessage + Default + 'static>(
    message: &M,
    own: &[&str],
) -> Option<Refusal> {
    let index = *RULES.by_name.get(message.descriptor().full_name())?;
    if !RULES.messages[index].refusable {
        return None;
    }
    let own: Vec<(usize, u32)> = own.iter().filter_map(|f| RULES.field(f)).collect();
    let bytes = message.encode_to_vec();
    RULES.walk(index, &bytes, &own, 0)
}

// === impl Refusal ===

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.value {
            Some(value) => write!(f, "{} {value} is not supported", self.field),
            None => write!(f, "{} is not supported", self.field),
        }
    }
}

impl std::error::Error for Refusal {}

// --- the rules, built once from the descriptors ---

/// Deepest nesting the walk follows (deeper is refused as such).
const MAX_DEPTH: usize = 32;

/// Every message of the pool with what the walk needs of it.
struct Rules {
    messages: Vec<MessageRules>,
    by_name: HashMap<String, usize>,
}

struct MessageRules {
    /// The name below `mesos.v1.` (`TaskInfo`, `scheduler.Call.Kill`).
    name: String,
    /// Its fields, by number.
    fields: Vec<FieldRule>,
    /// Whether anything at or below it can be refused: a walk skips a
    /// subtree that cannot.
    refusable: bool,
}

struct FieldRule {
    number: u32,
    name: String,
    carried: bool,
    /// A message-typed field's message.
    child: Option<usize>,
    /// An enum field's allowed values, and its enum (for names).
    allowed: Option<(Vec<i32>, EnumDescriptor)>,
}

static RULES: LazyLock<Rules> = LazyLock::new(Rules::build);

// === impl Rules ===

impl Rules {
    fn build() -> Rules {
        let messages: Vec<_> = DESCRIPTOR_POOL.all_messages().collect();
        let by_name: HashMap<String, usize> = messages
            .iter()
            .enumerate()
            .map(|(i, m)| (m.full_name().to_string(), i))
            .collect();
        let mut rules: Vec<MessageRules> = messages
            .iter()
            .map(|m| {
                let carried = CARRIED.iter().find(|c| c.message == m.full_name());
                let fields = m
                    .fields()
                    .map(|f| {
                        // A restricted enum field allows its listed
                        // values; any other enum field the values its
                        // enum defines (a number it does not define
                        // means nothing Agora could carry out).
                        let restricted = CARRIED_VALUES.iter().find(|v| v.field == f.full_name());
                        let allowed = match f.kind() {
                            Kind::Enum(e) => Some((
                                e.values()
                                    .filter(|value| {
                                        restricted.is_none_or(|r| r.values.contains(&value.name()))
                                    })
                                    .map(|value| value.number())
                                    .collect(),
                                e,
                            )),
                            _ => None,
                        };
                        FieldRule {
                            number: f.number(),
                            name: f.name().to_string(),
                            carried: carried.is_some_and(|c| c.fields.contains(&f.name())),
                            child: match f.kind() {
                                Kind::Message(inner) => by_name.get(inner.full_name()).copied(),
                                _ => None,
                            },
                            allowed,
                        }
                    })
                    .collect::<Vec<_>>();
                let refusable = fields.iter().any(|f| !f.carried || f.allowed.is_some());
                MessageRules {
                    name: m
                        .full_name()
                        .strip_prefix("mesos.v1.")
                        .unwrap_or(m.full_name())
                        .to_string(),
                    fields,
                    refusable,
                }
            })
            .collect();
        // Whether a refusable message is reachable through carried
        // fields, to a fixed point (types recurse).
        let mut changed = true;
        while changed {
            changed = false;
            for i in 0..rules.len() {
                if rules[i].refusable {
                    continue;
                }
                let below = rules[i]
                    .fields
                    .iter()
                    .filter_map(|f| f.child)
                    .any(|c| rules[c].refusable);
                if below {
                    rules[i].refusable = true;
                    changed = true;
                }
            }
        }
        Rules {
            messages: rules,
            by_name,
        }
    }

    /// A field's (message index, number), from its full name.
    fn field(&self, full: &str) -> Option<(usize, u32)> {
        let (message, name) = full.rsplit_once('.')?;
        let index = *self.by_name.get(message)?;
        let field = self.messages[index]
            .fields
            .iter()
            .find(|f| f.name == name)?;
        Some((index, field.number))
    }

    fn value_allowed(&self, field: &str, value: i32) -> bool {
        let Some((index, number)) = self.field(field) else {
            return true;
        };
        self.messages[index]
            .fields
            .iter()
            .find(|f| f.number == number)
            .and_then(|f| f.allowed.as_ref())
            .is_none_or(|(allowed, _)| allowed.contains(&value))
    }

    fn walk(
        &self,
        index: usize,
        bytes: &[u8],
        own: &[(usize, u32)],
        depth: usize,
    ) -> Option<Refusal> {
        let message = &self.messages[index];
        if depth > MAX_DEPTH {
            return Some(Refusal {
                field: format!("{} nested deeper than {MAX_DEPTH}", message.name),
                value: None,
            });
        }
        let mut buf = bytes;
        while !buf.is_empty() {
            // The bytes are prost's own encoding of a typed message: they
            // are well formed, and every number is a field of the message.
            let (number, wire_type) = decode_key(&mut buf).ok()?;
            let field = message.fields.iter().find(|f| f.number == number);
            let refused = |value: Option<String>| {
                Some(Refusal {
                    field: format!(
                        "{}.{}",
                        message.name,
                        field.map_or_else(|| number.to_string(), |f| f.name.clone())
                    ),
                    value,
                })
            };
            let Some(field) = field.filter(|f| f.carried) else {
                return refused(None);
            };
            match wire_type {
                WireType::Varint => {
                    let value = decode_varint(&mut buf).ok()?;
                    if let Some((allowed, enumeration)) = &field.allowed {
                        // Enums are int32 on the wire, sign-extended.
                        let value = value as i32;
                        if !allowed.contains(&value) {
                            return refused(Some(value_name(enumeration, value)));
                        }
                    }
                }
                WireType::SixtyFourBit => buf = buf.get(8..)?,
                WireType::ThirtyTwoBit => buf = buf.get(4..)?,
                WireType::LengthDelimited => {
                    let len = usize::try_from(decode_varint(&mut buf).ok()?).ok()?;
                    let payload = buf.get(..len)?;
                    buf = &buf[len..];
                    if let Some((allowed, enumeration)) = &field.allowed {
                        // A packed repeated enum.
                        let mut packed = payload;
                        while !packed.is_empty() {
                            let value = decode_varint(&mut packed).ok()? as i32;
                            if !allowed.contains(&value) {
                                return refused(Some(value_name(enumeration, value)));
                            }
                        }
                    } else if let Some(child) = field.child {
                        if self.messages[child].refusable && !own.contains(&(index, number)) {
                            if let Some(refusal) = self.walk(child, payload, own, depth + 1) {
                                return Some(refusal);
                            }
                        }
                    }
                }
                WireType::StartGroup | WireType::EndGroup => return refused(None),
            }
        }
        None
    }
}

fn value_name(enumeration: &EnumDescriptor, value: i32) -> String {
    enumeration
        .get_value(value)
        .map_or_else(|| value.to_string(), |v| v.name().to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::v1;

    fn task() -> v1::TaskInfo {
        v1::TaskInfo {
            name: "t".into(),
            task_id: v1::TaskId { value: "t".into() },
            agent_id: v1::AgentId { value: "a".into() },
            command: Some(v1::CommandInfo {
                value: Some("true".into()),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn a_task_of_carried_fields_passes_and_each_refused_field_is_named() {
        assert_eq!(refusal(&task()), None);
        // A Docker image is carried; the Docker daemon's options are not.
        let mut t = task();
        let mut container = v1::ContainerInfo {
            docker: Some(v1::container_info::DockerInfo {
                image: "busybox:1".into(),
                ..Default::default()
            }),
            ..Default::default()
        };
        container.set_type(v1::container_info::Type::Docker);
        t.container = Some(container);
        assert_eq!(refusal(&t), None);
        let docker = t.container.as_mut().unwrap().docker.as_mut().unwrap();
        docker.parameters.push(v1::Parameter {
            key: "cap-add".into(),
            value: "ALL".into(),
        });
        assert_eq!(
            refusal(&t).unwrap().to_string(),
            "ContainerInfo.DockerInfo.parameters is not supported"
        );
        let mut t = task();
        t.health_check = Some(v1::HealthCheck::default());
        assert_eq!(
            refusal(&t).unwrap().to_string(),
            "TaskInfo.health_check is not supported"
        );
        // Set, even to the empty string, is set.
        let mut t = task();
        t.command.as_mut().unwrap().user = Some(String::new());
        assert_eq!(
            refusal(&t).unwrap().to_string(),
            "CommandInfo.user is not supported"
        );
        let mut t = task();
        t.limits
            .insert("cpus".into(), v1::value::Scalar { value: 1.0 });
        assert_eq!(refusal(&t).unwrap().field, "TaskInfo.limits");
    }

    #[test]
    fn enum_values_are_refused_by_name() {
        let mut t = task();
        let mut variable = v1::environment::Variable {
            name: "X".into(),
            ..Default::default()
        };
        variable.set_type(v1::environment::variable::Type::Secret);
        t.command.as_mut().unwrap().environment = Some(v1::Environment {
            variables: vec![variable],
        });
        assert_eq!(
            refusal(&t).unwrap().to_string(),
            "Environment.Variable.type SECRET is not supported"
        );
        let mut operation = v1::offer::Operation::default();
        operation.set_type(v1::offer::operation::Type::Reserve);
        assert_eq!(
            refusal(&operation).unwrap().to_string(),
            "Offer.Operation.type RESERVE is not supported"
        );
        // A number the enum does not have.
        operation.r#type = Some(99);
        assert_eq!(refusal(&operation).unwrap().value.as_deref(), Some("99"));
        assert!(carries_value("mesos.v1.Offer.Operation.type", 1));
        assert!(!carries_value("mesos.v1.Offer.Operation.type", 2));
        // An unrestricted field carries every value its enum defines.
        assert!(carries_value("mesos.v1.TaskStatus.state", 1));
        assert!(!carries_value("mesos.v1.TaskStatus.state", 99));
    }

    #[test]
    fn resources_are_refused_by_the_field_agora_does_not_carry_out() {
        use v1::resource::{reservation_info, ReservationInfo};
        let cpus = || {
            let mut r = v1::Resource {
                name: "cpus".into(),
                scalar: Some(v1::value::Scalar { value: 1.0 }),
                ..Default::default()
            };
            r.set_type(v1::value::Type::Scalar);
            r
        };
        let reserved = |kind: reservation_info::Type| {
            let mut r = cpus();
            let mut reservation = ReservationInfo {
                role: Some("web".into()),
                ..Default::default()
            };
            reservation.set_type(kind);
            r.reservations.push(reservation);
            r
        };
        assert_eq!(refusal(&cpus()), None);
        assert_eq!(refusal(&reserved(reservation_info::Type::Static)), None);
        let cases: Vec<(v1::Resource, &str)> = vec![
            (
                reserved(reservation_info::Type::Dynamic),
                "Resource.ReservationInfo.type DYNAMIC is not supported",
            ),
            (
                v1::Resource {
                    revocable: Some(Default::default()),
                    ..cpus()
                },
                "Resource.revocable is not supported",
            ),
            (
                v1::Resource {
                    shared: Some(Default::default()),
                    ..cpus()
                },
                "Resource.shared is not supported",
            ),
            (
                v1::Resource {
                    provider_id: Some(v1::ResourceProviderId { value: "p".into() }),
                    ..cpus()
                },
                "Resource.provider_id is not supported",
            ),
            (
                v1::Resource {
                    disk: Some(Default::default()),
                    ..cpus()
                },
                "Resource.disk is not supported",
            ),
            (
                v1::Resource {
                    r#type: v1::value::Type::Text as i32,
                    ..cpus()
                },
                "Resource.type TEXT is not supported",
            ),
        ];
        for (resource, message) in cases {
            assert_eq!(
                refusal(&resource).map(|r| r.to_string()).as_deref(),
                Some(message)
            );
        }
    }

    #[test]
    fn fields_a_caller_checks_itself_are_not_looked_into() {
        use v1::scheduler::call;
        let mut operation = v1::offer::Operation::default();
        operation.set_type(v1::offer::operation::Type::Reserve);
        let mut c = v1::scheduler::Call {
            accept: Some(call::Accept {
                operations: vec![operation],
                ..Default::default()
            }),
            ..Default::default()
        };
        c.set_type(call::Type::Accept);
        assert!(refusal(&c).is_some());
        assert_eq!(
            refusal_outside(&c, &["mesos.v1.scheduler.Call.Accept.operations"]),
            None
        );
    }

    #[test]
    fn every_listed_name_exists() {
        for c in CARRIED {
            let message = DESCRIPTOR_POOL
                .get_message_by_name(c.message)
                .unwrap_or_else(|| panic!("{} is not a message", c.message));
            for f in c.fields {
                assert!(
                    message.get_field_by_name(f).is_some(),
                    "{}.{f} is not a field",
                    c.message
                );
            }
        }
        for v in CARRIED_VALUES {
            let (message, name) = v.field.rsplit_once('.').unwrap();
            let field = DESCRIPTOR_POOL
                .get_message_by_name(message)
                .and_then(|m| m.get_field_by_name(name))
                .unwrap_or_else(|| panic!("{} is not a field", v.field));
            let Kind::Enum(e) = field.kind() else {
                panic!("{} is not an enum field", v.field)
            };
            for value in v.values {
                assert!(e.get_value_by_name(value).is_some(), "{}: {value}", v.field);
            }
            assert!(carries_field(v.field), "{} itself is refused", v.field);
        }
    }

    /// Every message reachable through a carried field is listed, so that
    /// none is refused whole by omission (and the table shows it).
    #[test]
    fn every_message_reached_through_carried_fields_is_listed() {
        for c in CARRIED {
            let message = DESCRIPTOR_POOL.get_message_by_name(c.message).unwrap();
            for f in c.fields {
                let field = message.get_field_by_name(f).unwrap();
                if let Kind::Message(inner) = field.kind() {
                    assert!(
                        CARRIED.iter().any(|c| c.message == inner.full_name()),
                        "{}.{f} is carried but {} is not listed",
                        c.message,
                        inner.full_name()
                    );
                }
            }
        }
    }
}
