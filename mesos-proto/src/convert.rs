//! Translation between `mesos.v1` messages and `agora-proto` types.
//!
//! Inbound (a Mesos client's call → an Agora call) is fallible: what
//! Agora cannot honour is refused with a [`ConvertError`] that says so,
//! never silently dropped. The public inbound functions first refuse any
//! field Agora does not carry out ([`crate::support`], one list for every
//! front door), then check what Mesos checks of the fields they carry. Outbound (Agora → Mesos) always succeeds and
//! fills every field a proto2 `required` label demands, because mesos-go
//! rejects protobuf events that lack one.

use std::collections::BTreeMap;
use std::net::{Ipv4Addr, SocketAddr};

use agora_proto as agora;
use agora_proto::{Reason, Source, TaskState};

use crate::support::{self, Refusal};
use crate::v1;
use crate::v1::task_status::{Reason as MesosReason, Source as MesosSource};
use crate::MESOS_API_VERSION;

/// Mesos's cap on `Filters.refuse_seconds` (one year).
pub const MAX_REFUSE_SECONDS: f64 = 31_536_000.0;

/// Why a Mesos message cannot be turned into an Agora one.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ConvertError {
    /// A resource is invalid (bad name, negative scalar, overlapping ranges…).
    #[error("invalid resources: {0}")]
    Resources(String),
    /// An id is not usable (Agora ids become path components).
    #[error("invalid {kind} {value:?}: {reason}")]
    Id {
        /// Which id.
        kind: &'static str,
        /// The value given.
        value: String,
        /// Why it is refused.
        reason: String,
    },
    /// The message sets a field (or a value of one) that Agora does not
    /// carry out.
    #[error("{0}")]
    Refused(#[from] Refusal),
    /// The message is inconsistent.
    #[error("{0}")]
    Invalid(String),
}

/// What a framework declared about itself that changes how Mesos talks to
/// it (from `FrameworkInfo.capabilities`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Capabilities {
    /// `PARTITION_AWARE`: gets TASK_UNREACHABLE, TASK_GONE, TASK_DROPPED,
    /// TASK_UNKNOWN… where others get TASK_LOST.
    pub partition_aware: bool,
    /// `MULTI_ROLE`: uses `roles`; offers carry `allocation_info`.
    pub multi_role: bool,
    /// `RESERVATION_REFINEMENT`: reserved resources are written with
    /// `reservations` instead of the deprecated `role`.
    pub reservation_refinement: bool,
}

// === impl Capabilities ===

impl Capabilities {
    /// The capabilities a `FrameworkInfo` declares.
    pub fn of(info: &v1::FrameworkInfo) -> Capabilities {
        use v1::framework_info::capability::Type;
        let mut caps = Capabilities::default();
        for capability in &info.capabilities {
            match capability.r#type() {
                Type::PartitionAware => caps.partition_aware = true,
                Type::MultiRole => caps.multi_role = true,
                Type::ReservationRefinement => caps.reservation_refinement = true,
                _ => {}
            }
        }
        caps
    }
}

/// Refuses the first field of `message` Agora does not carry out.
fn supported<M: prost_reflect::ReflectMessage + Default + 'static>(
    message: &M,
) -> Result<(), ConvertError> {
    match support::refusal(message) {
        Some(refusal) => Err(refusal.into()),
        None => Ok(()),
    }
}

// --- ids ---

/// Checks an id a Mesos client chose.
fn checked_id(kind: &'static str, value: &str) -> Result<(), ConvertError> {
    agora::validate_id(value).map_err(|e| ConvertError::Id {
        kind,
        value: value.to_string(),
        reason: e.to_string(),
    })
}

/// A Mesos framework id as Agora's.
pub fn framework_id(id: &v1::FrameworkId) -> Result<agora::FrameworkId, ConvertError> {
    checked_id("framework_id", &id.value)?;
    Ok(agora::FrameworkId::new(id.value.clone()))
}

/// A Mesos agent id as Agora's.
pub fn agent_id(id: &v1::AgentId) -> Result<agora::AgentId, ConvertError> {
    checked_id("agent_id", &id.value)?;
    Ok(agora::AgentId::new(id.value.clone()))
}

/// A Mesos task id as Agora's.
pub fn task_id(id: &v1::TaskId) -> Result<agora::TaskId, ConvertError> {
    checked_id("task_id", &id.value)?;
    Ok(agora::TaskId::new(id.value.clone()))
}

/// A Mesos executor id as Agora's.
pub fn executor_id(id: &v1::ExecutorId) -> Result<agora::ExecutorId, ConvertError> {
    checked_id("executor_id", &id.value)?;
    Ok(agora::ExecutorId::new(id.value.clone()))
}

/// A Mesos offer id as Agora's (not validated: an unknown offer is the
/// master's business, answered with TASK_DROPPED / TASK_LOST).
pub fn offer_id(id: &v1::OfferId) -> agora::OfferId {
    agora::OfferId::new(id.value.clone())
}

/// Agora's framework id as Mesos's.
pub fn mesos_framework_id(id: &agora::FrameworkId) -> v1::FrameworkId {
    v1::FrameworkId {
        value: id.to_string(),
    }
}

/// Agora's agent id as Mesos's.
pub fn mesos_agent_id(id: &agora::AgentId) -> v1::AgentId {
    v1::AgentId {
        value: id.to_string(),
    }
}

/// Agora's task id as Mesos's.
pub fn mesos_task_id(id: &agora::TaskId) -> v1::TaskId {
    v1::TaskId {
        value: id.to_string(),
    }
}

/// Agora's executor id as Mesos's.
pub fn mesos_executor_id(id: &agora::ExecutorId) -> v1::ExecutorId {
    v1::ExecutorId {
        value: id.to_string(),
    }
}

/// Agora's offer id as Mesos's.
pub fn mesos_offer_id(id: &agora::OfferId) -> v1::OfferId {
    v1::OfferId {
        value: id.to_string(),
    }
}

// --- update uuids ---

/// An Agora update uuid (a UUID's text) as Mesos's 16 bytes. A uuid that is
/// not a UUID's text (no Agora component makes one) travels as its UTF-8.
pub fn uuid_bytes(uuid: &str) -> Vec<u8> {
    match uuid::Uuid::parse_str(uuid) {
        Ok(u) => u.as_bytes().to_vec(),
        Err(_) => uuid.as_bytes().to_vec(),
    }
}

/// A Mesos update uuid (16 bytes) as Agora's text form.
pub fn uuid_text(bytes: &[u8]) -> Result<String, ConvertError> {
    uuid::Uuid::from_slice(bytes)
        .map(|u| u.to_string())
        .map_err(|_| {
            ConvertError::Invalid(format!(
                "uuid must be 16 bytes (a UUID), got {} bytes",
                bytes.len()
            ))
        })
}

// --- resources and attributes ---

/// How resources are written for one framework.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ResourceStyle {
    /// Write reservations as `reservations` (RESERVATION_REFINEMENT)
    /// rather than the deprecated `role`.
    pub refinement: bool,
    /// Attach `allocation_info { role }` (MULTI_ROLE frameworks; the
    /// operator API).
    pub allocation_role: Option<String>,
}

/// Mesos resources as Agora's (validated: names, non-negative finite
/// scalars, well-formed ranges and sets). A static reservation (in
/// `reservations`, or the deprecated `role` of frameworks without
/// RESERVATION_REFINEMENT) gives the role; `allocation_info` names the
/// role the offer was allocated to, as the offer's resources say it
/// (the master accounts a launch to its offers' role).
pub fn resources(list: &[v1::Resource]) -> Result<agora::Resources, ConvertError> {
    for r in list {
        supported(r)?;
    }
    resources_of(list)
}

/// [`resources`] of resources already checked by [`supported`].
#[allow(deprecated)] // `Resource.role`
fn resources_of(list: &[v1::Resource]) -> Result<agora::Resources, ConvertError> {
    use v1::value::Type;
    let mut wire = Vec::with_capacity(list.len());
    for r in list {
        if r.reservations.len() > 1 {
            // Refinements are dynamic reservations, refused above.
            return Err(ConvertError::Resources(format!(
                "resource {} has {} reservations; a static reservation has one",
                r.name,
                r.reservations.len()
            )));
        }
        let role = r
            .reservations
            .last()
            .and_then(|res| res.role.clone())
            .or_else(|| r.role.clone())
            .unwrap_or_else(|| agora::DEFAULT_ROLE.to_string());
        let mut entry = serde_json::Map::new();
        entry.insert("name".into(), r.name.clone().into());
        entry.insert("role".into(), role.into());
        match r.r#type() {
            Type::Scalar => {
                let value = r.scalar.as_ref().map(|s| s.value).ok_or_else(|| {
                    ConvertError::Resources(format!("resource {} is SCALAR without scalar", r.name))
                })?;
                let number = serde_json::Number::from_f64(value).ok_or_else(|| {
                    ConvertError::Resources(format!("resource {} has value {value}", r.name))
                })?;
                entry.insert("scalar".into(), number.into());
            }
            Type::Ranges => {
                let ranges: Vec<serde_json::Value> = r
                    .ranges
                    .iter()
                    .flat_map(|rs| rs.range.iter())
                    .map(|range| serde_json::json!([range.begin, range.end]))
                    .collect();
                entry.insert("ranges".into(), ranges.into());
            }
            Type::Set => {
                let items: Vec<serde_json::Value> = r
                    .set
                    .iter()
                    .flat_map(|s| s.item.iter())
                    .map(|i| i.clone().into())
                    .collect();
                entry.insert("set".into(), items.into());
            }
            // Refused by `supported`.
            Type::Text => {
                return Err(Refusal {
                    field: "Resource.type".into(),
                    value: Some("TEXT".into()),
                }
                .into())
            }
        }
        wire.push(serde_json::Value::Object(entry));
    }
    serde_json::from_value(serde_json::Value::Array(wire))
        .map_err(|e| ConvertError::Resources(e.to_string()))
}

/// Agora's resources as Mesos's.
#[allow(deprecated)] // `Resource.role`: the format of frameworks without RESERVATION_REFINEMENT
pub fn mesos_resources(resources: &agora::Resources, style: &ResourceStyle) -> Vec<v1::Resource> {
    use v1::value::Type;
    resources
        .iter()
        .map(|r| {
            let mut out = v1::Resource {
                name: r.name.clone(),
                allocation_info: style.allocation_role.as_ref().map(|role| {
                    v1::resource::AllocationInfo {
                        role: Some(role.clone()),
                    }
                }),
                ..Default::default()
            };
            match &r.value {
                agora::Value::Scalar(v) => {
                    out.set_type(Type::Scalar);
                    out.scalar = Some(v1::value::Scalar { value: *v });
                }
                agora::Value::Ranges(ranges) => {
                    out.set_type(Type::Ranges);
                    out.ranges = Some(v1::value::Ranges {
                        range: ranges
                            .iter()
                            .map(|x| v1::value::Range {
                                begin: x.begin,
                                end: x.end,
                            })
                            .collect(),
                    });
                }
                agora::Value::Set(items) => {
                    out.set_type(Type::Set);
                    out.set = Some(v1::value::Set {
                        item: items.iter().cloned().collect(),
                    });
                }
            }
            if style.refinement {
                if r.is_reserved() {
                    out.reservations.push(v1::resource::ReservationInfo {
                        r#type: Some(v1::resource::reservation_info::Type::Static as i32),
                        role: Some(r.role.clone()),
                        ..Default::default()
                    });
                }
            } else {
                out.role = Some(r.role.clone());
            }
            out
        })
        .collect()
}

/// Agora's attributes as Mesos's (text or scalar values).
pub fn mesos_attributes(attributes: &agora::Attributes) -> Vec<v1::Attribute> {
    use v1::value::Type;
    attributes
        .0
        .iter()
        .map(|a| {
            let mut out = v1::Attribute {
                name: a.name.clone(),
                ..Default::default()
            };
            match &a.value {
                agora::AttributeValue::Text(t) => {
                    out.set_type(Type::Text);
                    out.text = Some(v1::value::Text { value: t.clone() });
                }
                agora::AttributeValue::Scalar(v) => {
                    out.set_type(Type::Scalar);
                    out.scalar = Some(v1::value::Scalar { value: *v });
                }
            }
            out
        })
        .collect()
}

// --- task states, sources, reasons ---

/// Agora's task state as Mesos's (the same set, less TASK_GONE_BY_OPERATOR).
pub fn mesos_task_state(state: TaskState) -> v1::TaskState {
    use v1::TaskState as M;
    match state {
        TaskState::Staging => M::TaskStaging,
        TaskState::Starting => M::TaskStarting,
        TaskState::Running => M::TaskRunning,
        TaskState::Killing => M::TaskKilling,
        TaskState::Finished => M::TaskFinished,
        TaskState::Failed => M::TaskFailed,
        TaskState::Killed => M::TaskKilled,
        TaskState::Lost => M::TaskLost,
        TaskState::Error => M::TaskError,
        TaskState::Dropped => M::TaskDropped,
        TaskState::Gone => M::TaskGone,
        TaskState::Unreachable => M::TaskUnreachable,
        TaskState::Unknown => M::TaskUnknown,
    }
}

/// A Mesos task state as Agora's (TASK_GONE_BY_OPERATOR is TASK_GONE).
pub fn task_state(state: v1::TaskState) -> TaskState {
    use v1::TaskState as M;
    match state {
        M::TaskStaging => TaskState::Staging,
        M::TaskStarting => TaskState::Starting,
        M::TaskRunning => TaskState::Running,
        M::TaskKilling => TaskState::Killing,
        M::TaskFinished => TaskState::Finished,
        M::TaskFailed => TaskState::Failed,
        M::TaskKilled => TaskState::Killed,
        M::TaskLost => TaskState::Lost,
        M::TaskError => TaskState::Error,
        M::TaskDropped => TaskState::Dropped,
        M::TaskGone | M::TaskGoneByOperator => TaskState::Gone,
        M::TaskUnreachable => TaskState::Unreachable,
        M::TaskUnknown => TaskState::Unknown,
    }
}

/// Agora's update source as Mesos's.
pub fn mesos_source(source: Source) -> MesosSource {
    match source {
        Source::SourceMaster => MesosSource::Master,
        Source::SourceAgent => MesosSource::Agent,
        Source::SourceExecutor => MesosSource::Executor,
    }
}

/// Agora's reason as Mesos's, where Mesos has one. Agora's
/// `REASON_INSUFFICIENT_RESOURCES` is Mesos's `REASON_TASK_INVALID` (the
/// message says which resources), a launch failure is
/// `REASON_CONTAINER_LAUNCH_FAILED`; a kill on request carries no reason
/// in Mesos.
pub fn mesos_reason(reason: Reason) -> Option<MesosReason> {
    Some(match reason {
        Reason::ReasonCommandExecutorFailed => MesosReason::CommandExecutorFailed,
        Reason::ReasonExecutorTerminated | Reason::ReasonExecutorShutdown => {
            MesosReason::ExecutorTerminated
        }
        Reason::ReasonExecutorRegistrationTimeout => MesosReason::ExecutorRegistrationTimeout,
        Reason::ReasonExecutorLaunchFailed => MesosReason::ContainerLaunchFailed,
        Reason::ReasonContainerLaunchFailed => MesosReason::ContainerLaunchFailed,
        Reason::ReasonInvalidOffers => MesosReason::InvalidOffers,
        Reason::ReasonTaskInvalid | Reason::ReasonInsufficientResources => MesosReason::TaskInvalid,
        Reason::ReasonAgentRemoved => MesosReason::AgentRemoved,
        Reason::ReasonAgentRestarted => MesosReason::AgentRestarted,
        Reason::ReasonAgentUnknown => MesosReason::AgentUnknown,
        Reason::ReasonAgentDisconnected => MesosReason::AgentDisconnected,
        Reason::ReasonReconciliation => MesosReason::Reconciliation,
        Reason::ReasonFrameworkRemoved => MesosReason::FrameworkRemoved,
        Reason::ReasonTaskUnknown => MesosReason::TaskUnknown,
        Reason::ReasonContainerLimitationMemory => MesosReason::ContainerLimitationMemory,
        Reason::ReasonTaskGroupInvalid => MesosReason::TaskGroupInvalid,
        Reason::ReasonTaskUnauthorized => MesosReason::TaskUnauthorized,
        Reason::ReasonContainerLimitation => MesosReason::ContainerLimitation,
        Reason::ReasonContainerLimitationDisk => MesosReason::ContainerLimitationDisk,
        Reason::ReasonContainerPreempted => MesosReason::ContainerPreempted,
        Reason::ReasonContainerUpdateFailed => MesosReason::ContainerUpdateFailed,
        Reason::ReasonMaxCompletionTimeReached => MesosReason::MaxCompletionTimeReached,
        Reason::ReasonExecutorReregistrationTimeout => MesosReason::ExecutorReregistrationTimeout,
        Reason::ReasonExecutorUnregistered => MesosReason::ExecutorUnregistered,
        Reason::ReasonGcError => MesosReason::GcError,
        Reason::ReasonInvalidFrameworkid => MesosReason::InvalidFrameworkid,
        Reason::ReasonIoSwitchboardExited => MesosReason::IoSwitchboardExited,
        Reason::ReasonMasterDisconnected => MesosReason::MasterDisconnected,
        Reason::ReasonResourcesUnknown => MesosReason::ResourcesUnknown,
        Reason::ReasonAgentDraining => MesosReason::AgentDraining,
        Reason::ReasonAgentRemovedByOperator => MesosReason::AgentRemovedByOperator,
        Reason::ReasonAgentReregistered => MesosReason::AgentReregistered,
        Reason::ReasonTaskKilledDuringLaunch => MesosReason::TaskKilledDuringLaunch,
        Reason::ReasonTaskCheckStatusUpdated => MesosReason::TaskCheckStatusUpdated,
        Reason::ReasonTaskHealthCheckStatusUpdated => MesosReason::TaskHealthCheckStatusUpdated,
        Reason::ReasonTaskGroupUnauthorized => MesosReason::TaskGroupUnauthorized,
        Reason::ReasonTaskKilled | Reason::ReasonUnknown => return None,
    })
}

/// A Mesos reason as Agora's: Agora has a word for each, so a Mesos
/// executor's reason reaches the scheduler unchanged.
pub fn reason(reason: MesosReason) -> Reason {
    match reason {
        MesosReason::CommandExecutorFailed => Reason::ReasonCommandExecutorFailed,
        MesosReason::ExecutorTerminated => Reason::ReasonExecutorTerminated,
        MesosReason::ExecutorRegistrationTimeout => Reason::ReasonExecutorRegistrationTimeout,
        MesosReason::ContainerLaunchFailed => Reason::ReasonExecutorLaunchFailed,
        MesosReason::InvalidOffers => Reason::ReasonInvalidOffers,
        MesosReason::TaskInvalid => Reason::ReasonTaskInvalid,
        MesosReason::AgentRemoved => Reason::ReasonAgentRemoved,
        MesosReason::AgentRestarted => Reason::ReasonAgentRestarted,
        MesosReason::AgentUnknown => Reason::ReasonAgentUnknown,
        MesosReason::AgentDisconnected => Reason::ReasonAgentDisconnected,
        MesosReason::Reconciliation => Reason::ReasonReconciliation,
        MesosReason::FrameworkRemoved => Reason::ReasonFrameworkRemoved,
        MesosReason::TaskUnknown => Reason::ReasonTaskUnknown,
        MesosReason::TaskGroupInvalid => Reason::ReasonTaskGroupInvalid,
        MesosReason::TaskUnauthorized => Reason::ReasonTaskUnauthorized,
        MesosReason::ContainerLimitationMemory => Reason::ReasonContainerLimitationMemory,
        MesosReason::ContainerLimitation => Reason::ReasonContainerLimitation,
        MesosReason::ContainerLimitationDisk => Reason::ReasonContainerLimitationDisk,
        MesosReason::ContainerPreempted => Reason::ReasonContainerPreempted,
        MesosReason::ContainerUpdateFailed => Reason::ReasonContainerUpdateFailed,
        MesosReason::MaxCompletionTimeReached => Reason::ReasonMaxCompletionTimeReached,
        MesosReason::ExecutorReregistrationTimeout => Reason::ReasonExecutorReregistrationTimeout,
        MesosReason::ExecutorUnregistered => Reason::ReasonExecutorUnregistered,
        MesosReason::GcError => Reason::ReasonGcError,
        MesosReason::InvalidFrameworkid => Reason::ReasonInvalidFrameworkid,
        MesosReason::IoSwitchboardExited => Reason::ReasonIoSwitchboardExited,
        MesosReason::MasterDisconnected => Reason::ReasonMasterDisconnected,
        MesosReason::ResourcesUnknown => Reason::ReasonResourcesUnknown,
        MesosReason::AgentDraining => Reason::ReasonAgentDraining,
        MesosReason::AgentRemovedByOperator => Reason::ReasonAgentRemovedByOperator,
        MesosReason::AgentReregistered => Reason::ReasonAgentReregistered,
        MesosReason::TaskKilledDuringLaunch => Reason::ReasonTaskKilledDuringLaunch,
        MesosReason::TaskCheckStatusUpdated => Reason::ReasonTaskCheckStatusUpdated,
        MesosReason::TaskHealthCheckStatusUpdated => Reason::ReasonTaskHealthCheckStatusUpdated,
        MesosReason::TaskGroupUnauthorized => Reason::ReasonTaskGroupUnauthorized,
    }
}

/// Agora's task status as Mesos's, state unchanged (see the master's
/// Mesos front door for the per-framework state policy). `uuid` is set
/// only on reliable updates, and those always carry `agent_id`.
pub fn mesos_status(status: &agora::TaskStatus) -> v1::TaskStatus {
    let mut out = v1::TaskStatus {
        task_id: mesos_task_id(&status.task_id),
        message: status.message.clone(),
        agent_id: status.agent_id.as_ref().map(mesos_agent_id),
        executor_id: status.executor_id.as_ref().map(mesos_executor_id),
        timestamp: Some(status.timestamp),
        data: status.data.as_ref().map(|d| d.0.clone()),
        uuid: status.uuid.as_deref().map(uuid_bytes),
        labels: mesos_labels(&status.labels),
        healthy: status.healthy,
        container_status: status
            .container_status
            .as_deref()
            .map(mesos_container_status),
        ..Default::default()
    };
    out.set_state(mesos_task_state(status.state));
    out.set_source(mesos_source(status.source));
    if let Some(reason) = status.reason.and_then(mesos_reason) {
        out.set_reason(reason);
    }
    out
}

// --- frameworks ---

#[allow(deprecated)] // `FrameworkInfo.role`: the single role of frameworks without MULTI_ROLE
/// A Mesos `FrameworkInfo` as Agora's. A MULTI_ROLE framework names its
/// roles in `roles` (and must not set `role`); the others in `role`
/// (default `*`), as Mesos validates.
pub fn framework_info(info: &v1::FrameworkInfo) -> Result<agora::FrameworkInfo, ConvertError> {
    supported(info)?;
    let caps = Capabilities::of(info);
    let roles = if caps.multi_role {
        if info.role.is_some() {
            return Err(ConvertError::Invalid(
                "'FrameworkInfo.role' must not be set by a MULTI_ROLE framework; use 'roles'"
                    .into(),
            ));
        }
        let mut seen = std::collections::BTreeSet::new();
        for role in &info.roles {
            if !seen.insert(role) {
                return Err(ConvertError::Invalid(format!(
                    "'FrameworkInfo.roles' lists {role:?} twice"
                )));
            }
        }
        info.roles.clone()
    } else {
        if !info.roles.is_empty() {
            return Err(ConvertError::Invalid(
                "'FrameworkInfo.roles' needs the MULTI_ROLE capability; use 'role'".into(),
            ));
        }
        vec![info
            .role
            .clone()
            .unwrap_or_else(|| agora::DEFAULT_ROLE.to_string())]
    };
    let id = info.id.as_ref().map(framework_id).transpose()?;
    Ok(agora::FrameworkInfo {
        user: info.user.clone(),
        name: info.name.clone(),
        id,
        failover_timeout: info.failover_timeout.unwrap_or(0.0),
        checkpoint: info.checkpoint.unwrap_or(false),
        roles,
        hostname: info.hostname.clone().unwrap_or_default(),
        principal: info.principal.clone().filter(|p| !p.is_empty()),
        webui_url: info.webui_url.clone().filter(|u| !u.is_empty()),
    })
}

#[allow(deprecated)] // `FrameworkInfo.role`
/// Agora's `FrameworkInfo` as Mesos's. Agora keeps no capabilities for
/// frameworks: a single role is written as `role`, several as MULTI_ROLE
/// `roles`.
pub fn mesos_framework_info(info: &agora::FrameworkInfo) -> v1::FrameworkInfo {
    let roles = info.effective_roles();
    let mut out = v1::FrameworkInfo {
        user: info.user.clone(),
        name: info.name.clone(),
        id: info.id.as_ref().map(mesos_framework_id),
        failover_timeout: Some(info.failover_timeout),
        checkpoint: Some(info.checkpoint),
        hostname: (!info.hostname.is_empty()).then(|| info.hostname.clone()),
        principal: info.principal.clone(),
        webui_url: info.webui_url.clone(),
        ..Default::default()
    };
    if roles.len() == 1 {
        out.role = roles.into_iter().next();
    } else {
        out.roles = roles;
        out.capabilities.push(v1::framework_info::Capability {
            r#type: Some(v1::framework_info::capability::Type::MultiRole as i32),
        });
    }
    out
}

// --- commands, executors, tasks ---

/// A Mesos `CommandInfo` (a command task's or a custom executor's) as
/// Agora's: the agent fetches its `uris` into the sandbox before it starts
/// the command. Agora runs a framework's commands as the user its
/// `FrameworkInfo` names (not one per command), so `user` is refused, as
/// are secret environment variables and the fetcher cache.
pub fn command_info(command: &v1::CommandInfo) -> Result<agora::CommandInfo, ConvertError> {
    supported(command)?;
    command_of(command)
}

/// [`command_info`] of a command already checked by [`supported`].
fn command_of(command: &v1::CommandInfo) -> Result<agora::CommandInfo, ConvertError> {
    let mut out = command_fields(command)?;
    out.uris.reserve_exact(command.uris.len());
    for uri in &command.uris {
        if uri.value.trim().is_empty() {
            return Err(ConvertError::Invalid(
                "CommandInfo.uris: a URI's 'value' is empty".into(),
            ));
        }
        if let Some(name) = uri.output_file.as_deref() {
            if name.is_empty() || name.contains('/') || name == "." || name == ".." {
                return Err(ConvertError::Invalid(format!(
                    "CommandInfo.uris: output_file {name:?} must be a file name in the sandbox"
                )));
            }
        }
        out.uris.push(agora::FetchUri {
            value: uri.value.clone(),
            executable: uri.executable.unwrap_or(false),
            extract: uri.extract.unwrap_or(true),
            output_file: uri.output_file.clone(),
        });
    }
    Ok(out)
}

/// The fields of a `CommandInfo` both kinds share.
fn command_fields(command: &v1::CommandInfo) -> Result<agora::CommandInfo, ConvertError> {
    let mut environment = BTreeMap::new();
    for variable in command.environment.iter().flat_map(|e| e.variables.iter()) {
        // Secret variables are refused by `supported`: a variable is its value.
        environment.insert(
            variable.name.clone(),
            variable.value.clone().unwrap_or_default(),
        );
    }
    let shell = command.shell.unwrap_or(true);
    let value = command.value.clone().unwrap_or_default();
    if shell && value.trim().is_empty() {
        return Err(ConvertError::Invalid(
            "CommandInfo.value must be set for a shell command".into(),
        ));
    }
    if !shell && value.is_empty() {
        return Err(ConvertError::Invalid(
            "CommandInfo.value (the program) must be set when 'shell' is false".into(),
        ));
    }
    Ok(agora::CommandInfo {
        value,
        shell,
        arguments: command.arguments.clone(),
        environment,
        uris: Vec::new(),
    })
}

/// A Mesos framework's custom executor (`ExecutorInfo` of type CUSTOM, or
/// with no type, with a `command`) as Agora's, with its
/// `shutdown_grace_period`, `data` and `labels`. The DEFAULT executor
/// belongs to LAUNCH_GROUP and is not accepted here.
pub fn executor_info(info: &v1::ExecutorInfo) -> Result<agora::ExecutorInfo, ConvertError> {
    supported(info)?;
    executor_of(info)
}

/// [`executor_info`] of an executor already checked by [`supported`].
#[allow(deprecated)] // `ExecutorInfo.source`
fn executor_of(info: &v1::ExecutorInfo) -> Result<agora::ExecutorInfo, ConvertError> {
    if info.r#type() == v1::executor_info::Type::Default {
        return Err(ConvertError::Invalid(
            "ExecutorInfo of type DEFAULT is Mesos's default executor, for LAUNCH_GROUP; a task's executor must be CUSTOM".into(),
        ));
    }
    checked_id("executor_id", &info.executor_id.value)?;
    agora::validate_executor_id(&info.executor_id.value)
        .ok()
        .filter(|()| {
            !info
                .executor_id
                .value
                .starts_with(agora::AGENT_EXECUTOR_PREFIX)
        })
        .ok_or_else(|| ConvertError::Id {
            kind: "executor_id",
            value: info.executor_id.value.clone(),
            reason: format!(
                "ids starting with {:?} are the agent's own",
                agora::AGENT_EXECUTOR_PREFIX
            ),
        })?;
    let Some(command) = &info.command else {
        return Err(ConvertError::Invalid(
            "ExecutorInfo.command must be set for a CUSTOM executor".into(),
        ));
    };
    let shutdown_grace_period = match &info.shutdown_grace_period {
        Some(d) if d.nanoseconds < 0 => {
            return Err(ConvertError::Invalid(format!(
                "ExecutorInfo.shutdown_grace_period must not be negative, got {} ns",
                d.nanoseconds
            )))
        }
        Some(d) => Some(d.nanoseconds as f64 / 1e9),
        None => None,
    };
    Ok(agora::ExecutorInfo {
        executor_id: agora::ExecutorId::new(info.executor_id.value.clone()),
        framework_id: info.framework_id.as_ref().map(framework_id).transpose()?,
        command: command_of(command)?,
        resources: resources_of(&info.resources)?,
        name: info.name.clone().unwrap_or_default(),
        source: info.source.clone().unwrap_or_default(),
        // A Mesos framework's executor speaks Mesos's executor API.
        api: agora::ExecutorApi::MesosV1,
        shutdown_grace_period,
        data: info.data.clone().map(agora::Bytes),
        labels: labels(info.labels.as_ref()),
        container: info
            .container
            .as_ref()
            .map(container_of)
            .transpose()?
            .map(Box::new),
    })
}

/// Agora's `CommandInfo` as Mesos's.
pub fn mesos_command_info(command: &agora::CommandInfo) -> v1::CommandInfo {
    let variables: Vec<v1::environment::Variable> = command
        .environment
        .iter()
        .map(|(name, value)| v1::environment::Variable {
            name: name.clone(),
            value: Some(value.clone()),
            r#type: Some(v1::environment::variable::Type::Value as i32),
            ..Default::default()
        })
        .collect();
    v1::CommandInfo {
        value: Some(command.value.clone()),
        shell: Some(command.shell),
        arguments: command.arguments.clone(),
        environment: (!variables.is_empty()).then_some(v1::Environment { variables }),
        uris: command
            .uris
            .iter()
            .map(|u| v1::command_info::Uri {
                value: u.value.clone(),
                executable: Some(u.executable),
                extract: Some(u.extract),
                output_file: u.output_file.clone(),
                cache: None,
            })
            .collect(),
        ..Default::default()
    }
}

/// Agora's `ExecutorInfo` as Mesos's.
#[allow(deprecated)] // `ExecutorInfo.source`
pub fn mesos_executor_info(executor: &agora::ExecutorInfo) -> v1::ExecutorInfo {
    v1::ExecutorInfo {
        executor_id: mesos_executor_id(&executor.executor_id),
        framework_id: executor.framework_id.as_ref().map(mesos_framework_id),
        command: Some(mesos_command_info(&executor.command)),
        resources: mesos_resources(&executor.resources, &ResourceStyle::default()),
        name: (!executor.name.is_empty()).then(|| executor.name.clone()),
        source: (!executor.source.is_empty()).then(|| executor.source.clone()),
        r#type: Some(v1::executor_info::Type::Custom as i32),
        shutdown_grace_period: executor.shutdown_grace_period.map(mesos_duration),
        data: executor.data.as_ref().map(|d| d.0.clone()),
        labels: mesos_labels(&executor.labels),
        container: executor.container.as_deref().map(mesos_container_info),
        ..Default::default()
    }
}

/// Mesos labels as Agora's map (a repeated key keeps its last value; a
/// label without a value maps to the empty string).
pub fn labels(labels: Option<&v1::Labels>) -> BTreeMap<String, String> {
    labels
        .iter()
        .flat_map(|l| l.labels.iter())
        .map(|l| (l.key.clone(), l.value.clone().unwrap_or_default()))
        .collect()
}

/// Agora's labels as Mesos's.
pub fn mesos_labels(labels: &BTreeMap<String, String>) -> Option<v1::Labels> {
    (!labels.is_empty()).then(|| v1::Labels {
        labels: labels
            .iter()
            .map(|(key, value)| v1::Label {
                key: key.clone(),
                value: Some(value.clone()),
            })
            .collect(),
    })
}

/// A Mesos task as Agora's: a command task (`TaskInfo.command`), run by
/// the built-in command executor, or a task of a custom executor
/// (`TaskInfo.executor`), which the agent starts with the Mesos
/// environment and which talks to the agent's `/api/v1/executor`.
pub fn task_info(task: &v1::TaskInfo) -> Result<agora::TaskInfo, ConvertError> {
    supported(task)?;
    match (&task.command, &task.executor) {
        (Some(command), None) => command_task(task, command),
        (None, Some(executor)) => {
            let mut out = task_fields(task)?;
            out.executor = Some(executor_of(executor)?);
            Ok(out)
        }
        (Some(_), Some(_)) => Err(ConvertError::Invalid(
            "TaskInfo must set one of 'command' and 'executor', not both".into(),
        )),
        (None, None) => Err(ConvertError::Invalid(
            "TaskInfo must set 'command' or 'executor'".into(),
        )),
    }
}

/// What Agora carries out of a LAUNCH_GROUP's DEFAULT executor (Mesos's
/// default executor). Agora runs each task of such a group under a
/// command executor of its own, so of the executor's fields it keeps:
/// `executor_id` and `framework_id` (checked), `resources` (charged with
/// the group's first task, so that the offer pays for them as in Mesos),
/// and `shutdown_grace_period` (the kill grace period of every task of
/// the group without a `kill_policy`). `command`, `data`, `name`,
/// `source` and `labels` have no place there and are refused by name.
#[derive(Debug, Clone, PartialEq)]
pub struct DefaultExecutor {
    /// Charged with the group's first task.
    pub resources: agora::Resources,
    /// The kill grace period of tasks without their own.
    pub shutdown_grace_period: Option<f64>,
}

/// Checks a LAUNCH_GROUP's DEFAULT executor (see [`DefaultExecutor`]).
#[allow(deprecated)] // `ExecutorInfo.source`
pub fn default_executor(info: &v1::ExecutorInfo) -> Result<DefaultExecutor, ConvertError> {
    supported(info)?;
    let unused = [
        ("command", info.command.is_some()),
        ("data", info.data.is_some()),
        ("name", info.name.is_some()),
        ("source", info.source.is_some()),
        ("labels", info.labels.is_some()),
    ];
    if let Some((field, _)) = unused.iter().find(|(_, set)| *set) {
        return Err(ConvertError::Invalid(format!(
            "ExecutorInfo.{field} is not supported for a DEFAULT executor: Agora runs each task of the group under a command executor of its own"
        )));
    }
    checked_id("executor_id", &info.executor_id.value)?;
    if info
        .executor_id
        .value
        .starts_with(agora::AGENT_EXECUTOR_PREFIX)
    {
        return Err(ConvertError::Id {
            kind: "executor_id",
            value: info.executor_id.value.clone(),
            reason: format!(
                "ids starting with {:?} are the agent's own",
                agora::AGENT_EXECUTOR_PREFIX
            ),
        });
    }
    info.framework_id.as_ref().map(framework_id).transpose()?;
    let shutdown_grace_period = match &info.shutdown_grace_period {
        Some(d) if d.nanoseconds < 0 => {
            return Err(ConvertError::Invalid(format!(
                "ExecutorInfo.shutdown_grace_period must not be negative, got {} ns",
                d.nanoseconds
            )))
        }
        Some(d) => Some(d.nanoseconds as f64 / 1e9),
        None => None,
    };
    Ok(DefaultExecutor {
        resources: resources_of(&info.resources)?,
        shutdown_grace_period,
    })
}

/// One task of a LAUNCH_GROUP with the DEFAULT executor `executor`, the
/// group's `first` or not: as [`group_task_info`], with what it carries
/// of the executor (see [`DefaultExecutor`]).
pub fn default_group_task_info(
    task: &v1::TaskInfo,
    executor: &DefaultExecutor,
    first: bool,
) -> Result<agora::TaskInfo, ConvertError> {
    let mut out = group_task_info(task)?;
    if out.kill_grace_period.is_none() {
        out.kill_grace_period = executor.shutdown_grace_period;
    }
    if first {
        out.resources += &executor.resources;
    }
    Ok(out)
}

/// One task of a LAUNCH_GROUP with the default executor: its command runs
/// under Agora's command executor like any command task.
pub fn group_task_info(task: &v1::TaskInfo) -> Result<agora::TaskInfo, ConvertError> {
    supported(task)?;
    if task.executor.is_some() {
        return Err(ConvertError::Invalid(
            "a task of a task group must not set 'executor'".into(),
        ));
    }
    let Some(command) = &task.command else {
        return Err(ConvertError::Invalid(
            "a task of a task group must set 'command'".into(),
        ));
    };
    command_task(task, command)
}

/// A task as an executor lists it among the tasks it received
/// (`SUBSCRIBE.unacknowledged_tasks`): as the agent sent it, so with
/// `command`, `executor`, both (a task of a group with a custom executor
/// may carry a command for it) or neither (a task of a group, which does
/// not name its executor).
pub fn received_task_info(task: &v1::TaskInfo) -> Result<agora::TaskInfo, ConvertError> {
    supported(task)?;
    let mut out = task_fields(task)?;
    out.command = task.command.as_ref().map(command_of).transpose()?;
    out.executor = task.executor.as_ref().map(executor_of).transpose()?;
    Ok(out)
}

/// One task of a LAUNCH_GROUP with a custom executor (`executor`, the
/// group's, already converted), as a task of Agora's task group `group`:
/// the agent hands the whole group to that executor at once. A `command`
/// the task carries is the executor's to run (the agent fetches none of
/// its URIs). As in Mesos, the task itself must not name an executor.
pub fn custom_group_task_info(
    task: &v1::TaskInfo,
    executor: &agora::ExecutorInfo,
    group: &str,
) -> Result<agora::TaskInfo, ConvertError> {
    supported(task)?;
    if task.executor.is_some() {
        return Err(ConvertError::Invalid(
            "a task of a task group must not set 'executor'; the group's executor runs it".into(),
        ));
    }
    let mut out = task_fields(task)?;
    out.command = task.command.as_ref().map(command_of).transpose()?;
    out.executor = Some(executor.clone());
    out.task_group = Some(group.to_string());
    Ok(out)
}

fn command_task(
    task: &v1::TaskInfo,
    command: &v1::CommandInfo,
) -> Result<agora::TaskInfo, ConvertError> {
    let mut out = task_fields(task)?;
    out.command = Some(command_of(command)?);
    Ok(out)
}

/// The role a task's resources say their offers were allocated to
/// (`Resource.allocation_info.role`), which the master compares with its
/// offers'; resources naming two roles are refused.
fn allocation_role(list: &[v1::Resource]) -> Result<Option<String>, ConvertError> {
    let mut role: Option<&String> = None;
    for r in list {
        let Some(named) = r.allocation_info.as_ref().and_then(|a| a.role.as_ref()) else {
            continue;
        };
        match role {
            Some(first) if first != named => {
                return Err(ConvertError::Resources(format!(
                    "the resources' allocation_info name two roles, {first:?} and {named:?}; a task's offers are allocated to one"
                )));
            }
            _ => role = Some(named),
        }
    }
    Ok(role.cloned())
}

/// A task's fields other than its command and executor.
fn task_fields(task: &v1::TaskInfo) -> Result<agora::TaskInfo, ConvertError> {
    let kill_grace_period = task
        .kill_policy
        .as_ref()
        .and_then(|k| k.grace_period.as_ref())
        .map(|d| (d.nanoseconds.max(0) as f64) / 1e9);
    Ok(agora::TaskInfo {
        container: task
            .container
            .as_ref()
            .map(container_of)
            .transpose()?
            .map(Box::new),
        allocation_role: allocation_role(&task.resources)?,
        launch_stamp: None,
        name: task.name.clone(),
        task_id: task_id(&task.task_id)?,
        agent_id: agent_id(&task.agent_id)?,
        resources: resources_of(&task.resources)?,
        executor: None,
        command: None,
        data: task.data.clone().map(agora::Bytes),
        kill_grace_period,
        labels: labels(task.labels.as_ref()),
        task_group: None,
    })
}

/// Agora's task as Mesos's (what an executor gets in LAUNCH).
pub fn mesos_task_info(task: &agora::TaskInfo) -> v1::TaskInfo {
    v1::TaskInfo {
        name: task.name.clone(),
        task_id: mesos_task_id(&task.task_id),
        agent_id: mesos_agent_id(&task.agent_id),
        resources: mesos_resources(&task.resources, &ResourceStyle::default()),
        executor: task.executor.as_ref().map(mesos_executor_info),
        command: task.command.as_ref().map(mesos_command_info),
        data: task.data.as_ref().map(|d| d.0.clone()),
        labels: mesos_labels(&task.labels),
        kill_policy: task.kill_grace_period.map(|secs| v1::KillPolicy {
            grace_period: Some(mesos_duration(secs)),
        }),
        container: task.container.as_deref().map(mesos_container_info),
        ..Default::default()
    }
}

// --- containers ---

/// A Mesos `ContainerInfo` (its fields already checked by
/// [`crate::support`]) as Agora's: `MESOS` with `mesos.image` or
/// `DOCKER` with `docker.image` (both run on the agent's OCI runtime;
/// `docker.force_pull_image` is `cached: false`), its volumes (host
/// paths, the deprecated `host_path` included, and sandbox paths) and
/// hostname.
pub fn container_of(info: &v1::ContainerInfo) -> Result<agora::ContainerInfo, ConvertError> {
    use v1::container_info::Type;
    let (kind, image) = match info.r#type() {
        Type::Docker => {
            let Some(docker) = &info.docker else {
                return Err(ConvertError::Invalid(
                    "ContainerInfo of type DOCKER needs 'docker' with its image".into(),
                ));
            };
            if docker.image.is_empty() {
                return Err(ConvertError::Invalid(
                    "ContainerInfo.docker.image is empty".into(),
                ));
            }
            let image = agora::Image {
                kind: agora::ImageType::Docker,
                name: docker.image.clone(),
                cached: !docker.force_pull_image.unwrap_or(false),
            };
            (agora::ContainerType::Docker, Some(image))
        }
        Type::Mesos => {
            if info.docker.is_some() {
                return Err(ConvertError::Invalid(
                    "ContainerInfo of type MESOS must not set 'docker' (name the image in mesos.image)"
                        .into(),
                ));
            }
            let image = info
                .mesos
                .as_ref()
                .and_then(|m| m.image.as_ref())
                .map(image_of)
                .transpose()?;
            (agora::ContainerType::Mesos, image)
        }
    };
    let volumes = info
        .volumes
        .iter()
        .enumerate()
        .map(|(index, volume)| volume_of(volume).map_err(|e| volume_error(index, e)))
        .collect::<Result<_, _>>()?;
    Ok(agora::ContainerInfo {
        kind,
        image,
        volumes,
        network_infos: Vec::new(),
        hostname: info.hostname.clone().filter(|h| !h.is_empty()),
    })
}

fn volume_error(index: usize, e: ConvertError) -> ConvertError {
    ConvertError::Invalid(format!("ContainerInfo.volumes[{index}]: {e}"))
}

/// A Mesos `Image` (type `DOCKER`, the only one carried) as Agora's.
fn image_of(image: &v1::Image) -> Result<agora::Image, ConvertError> {
    let Some(docker) = image.docker.as_ref().filter(|d| !d.name.is_empty()) else {
        return Err(ConvertError::Invalid(
            "Image of type DOCKER needs docker.name".into(),
        ));
    };
    Ok(agora::Image {
        kind: agora::ImageType::Docker,
        name: docker.name.clone(),
        cached: image.cached.unwrap_or(true),
    })
}

/// A Mesos `Volume` as Agora's: `source` (`HOST_PATH`, `SANDBOX_PATH`)
/// or the deprecated `host_path`.
fn volume_of(volume: &v1::Volume) -> Result<agora::Volume, ConvertError> {
    use v1::volume::source::{sandbox_path, Type};
    let mode = match volume.mode() {
        v1::volume::Mode::Rw => agora::VolumeMode::Rw,
        v1::volume::Mode::Ro => agora::VolumeMode::Ro,
    };
    let source = match (&volume.source, &volume.host_path) {
        (Some(_), Some(_)) => {
            return Err(ConvertError::Invalid(
                "set one of 'source' and the deprecated 'host_path', not both".into(),
            ))
        }
        (None, Some(path)) => agora::VolumeSource::HostPath { path: path.clone() },
        (None, None) => {
            return Err(ConvertError::Invalid(
                "a volume needs a 'source' (HOST_PATH or SANDBOX_PATH)".into(),
            ))
        }
        (Some(source), None) => match source.r#type() {
            Type::HostPath => match &source.host_path {
                Some(host) => agora::VolumeSource::HostPath {
                    path: host.path.clone(),
                },
                None => {
                    return Err(ConvertError::Invalid(
                        "a HOST_PATH source needs 'host_path'".into(),
                    ))
                }
            },
            Type::SandboxPath => match &source.sandbox_path {
                Some(sandbox) => agora::VolumeSource::SandboxPath {
                    of: match sandbox.r#type() {
                        sandbox_path::Type::Parent => agora::SandboxOf::Parent,
                        // Mesos reads an unset type as SELF.
                        _ => agora::SandboxOf::Own,
                    },
                    path: sandbox.path.clone(),
                },
                None => {
                    return Err(ConvertError::Invalid(
                        "a SANDBOX_PATH source needs 'sandbox_path'".into(),
                    ))
                }
            },
            other => {
                return Err(ConvertError::Invalid(format!(
                    "Volume.Source.type {} is not supported",
                    other.as_str_name()
                )))
            }
        },
    };
    Ok(agora::Volume {
        container_path: volume.container_path.clone(),
        mode,
        source,
    })
}

/// Agora's `ContainerInfo` as Mesos's (what a Mesos executor gets).
pub fn mesos_container_info(info: &agora::ContainerInfo) -> v1::ContainerInfo {
    use v1::container_info::{DockerInfo, MesosInfo, Type};
    let mut out = v1::ContainerInfo {
        hostname: info.hostname.clone(),
        volumes: info.volumes.iter().map(mesos_volume).collect(),
        network_infos: info.network_infos.iter().map(mesos_network_info).collect(),
        ..Default::default()
    };
    match info.kind {
        agora::ContainerType::Docker => {
            out.set_type(Type::Docker);
            out.docker = info.image.as_ref().map(|image| DockerInfo {
                image: image.name.clone(),
                force_pull_image: (!image.cached).then_some(true),
                ..Default::default()
            });
        }
        _ => {
            out.set_type(Type::Mesos);
            out.mesos = Some(MesosInfo {
                image: info.image.as_ref().map(|image| {
                    let mut out = v1::Image {
                        docker: Some(v1::image::Docker {
                            name: image.name.clone(),
                            ..Default::default()
                        }),
                        cached: Some(image.cached),
                        ..Default::default()
                    };
                    out.set_type(v1::image::Type::Docker);
                    out
                }),
            });
        }
    }
    out
}

fn mesos_volume(volume: &agora::Volume) -> v1::Volume {
    use v1::volume::source::{sandbox_path, HostPath, SandboxPath, Type};
    let mut source = v1::volume::Source::default();
    match &volume.source {
        agora::VolumeSource::HostPath { path } => {
            source.set_type(Type::HostPath);
            source.host_path = Some(HostPath {
                path: path.clone(),
                mount_propagation: None,
            });
        }
        agora::VolumeSource::SandboxPath { of, path } => {
            source.set_type(Type::SandboxPath);
            let mut sandbox = SandboxPath {
                path: path.clone(),
                ..Default::default()
            };
            sandbox.set_type(match of {
                agora::SandboxOf::Own => sandbox_path::Type::Self_,
                agora::SandboxOf::Parent => sandbox_path::Type::Parent,
            });
            source.sandbox_path = Some(sandbox);
        }
        agora::VolumeSource::Unknown => source.set_type(Type::Unknown),
    }
    let mut out = v1::Volume {
        container_path: volume.container_path.clone(),
        source: Some(source),
        ..Default::default()
    };
    out.set_mode(match volume.mode {
        agora::VolumeMode::Rw => v1::volume::Mode::Rw,
        agora::VolumeMode::Ro => v1::volume::Mode::Ro,
    });
    out
}

fn mesos_network_info(network: &agora::NetworkInfo) -> v1::NetworkInfo {
    v1::NetworkInfo {
        name: network.name.clone(),
        ip_addresses: network
            .ip_addresses
            .iter()
            .map(|ip| v1::network_info::IpAddress {
                protocol: Some(if ip.contains(':') {
                    v1::network_info::Protocol::IPv6 as i32
                } else {
                    v1::network_info::Protocol::IPv4 as i32
                }),
                ip_address: Some(ip.clone()),
            })
            .collect(),
        ..Default::default()
    }
}

/// Agora's `ContainerStatus` as Mesos's.
pub fn mesos_container_status(status: &agora::ContainerStatus) -> v1::ContainerStatus {
    v1::ContainerStatus {
        container_id: status.container_id.as_ref().map(|id| v1::ContainerId {
            value: id.clone(),
            parent: None,
        }),
        network_infos: status
            .network_infos
            .iter()
            .map(mesos_network_info)
            .collect(),
        executor_pid: status.executor_pid,
        cgroup_info: None,
    }
}

/// Seconds as a Mesos `DurationInfo`.
pub fn mesos_duration(secs: f64) -> v1::DurationInfo {
    v1::DurationInfo {
        nanoseconds: (secs.max(0.0) * 1e9) as i64,
    }
}

// --- offers, filters ---

/// Agora's offer as Mesos's, for a framework with `caps`: allocation info
/// only for MULTI_ROLE frameworks (mesos-go compares it when matching
/// resources), reservations in the format the framework understands.
pub fn mesos_offer(offer: &agora::Offer, caps: Capabilities) -> v1::Offer {
    let allocation_role = caps.multi_role.then(|| {
        offer
            .allocation_role
            .clone()
            .unwrap_or_else(|| agora::DEFAULT_ROLE.to_string())
    });
    let style = ResourceStyle {
        refinement: caps.reservation_refinement,
        allocation_role: allocation_role.clone(),
    };
    v1::Offer {
        id: mesos_offer_id(&offer.id),
        framework_id: mesos_framework_id(&offer.framework_id),
        agent_id: mesos_agent_id(&offer.agent_id),
        hostname: offer.hostname.clone(),
        resources: mesos_resources(&offer.resources, &style),
        attributes: mesos_attributes(&offer.attributes),
        executor_ids: offer.executor_ids.iter().map(mesos_executor_id).collect(),
        allocation_info: allocation_role
            .map(|role| v1::resource::AllocationInfo { role: Some(role) }),
        ..Default::default()
    }
}

/// Mesos filters as Agora's. An absent `Filters` leaves the master's
/// default; a present one without `refuse_seconds` means Mesos's default
/// 5 s. Values are clamped to `[0, MAX_REFUSE_SECONDS]`; not-a-number is 0.
pub fn filters(filters: Option<&v1::Filters>) -> agora::Filters {
    agora::Filters {
        refuse_seconds: filters.map(|f| {
            let secs = f.refuse_seconds.unwrap_or(agora::DEFAULT_REFUSE_SECONDS);
            if secs.is_nan() {
                0.0
            } else {
                secs.clamp(0.0, MAX_REFUSE_SECONDS)
            }
        }),
    }
}

// --- masters and agents ---

/// Splits `host:port`; the port defaults to `default_port`.
fn host_port(address: &str, default_port: u16) -> (String, u16) {
    if let Ok(addr) = address.parse::<SocketAddr>() {
        return (addr.ip().to_string(), addr.port());
    }
    match address.rsplit_once(':') {
        Some((host, port)) => (host.to_string(), port.parse().unwrap_or(default_port)),
        None => (address.to_string(), default_port),
    }
}

/// Mesos's integer form of an IPv4 address: the four bytes in network
/// order read as a little-endian integer (0 when not an IPv4 address).
pub fn mesos_ip(host: &str) -> u32 {
    host.parse::<Ipv4Addr>()
        .map(|ip| u32::from_le_bytes(ip.octets()))
        .unwrap_or(0)
}

/// Agora's `MasterInfo` as Mesos's, with every required field.
pub fn mesos_master_info(info: &agora::MasterInfo) -> v1::MasterInfo {
    let (host, port) = host_port(&info.address, 5050);
    v1::MasterInfo {
        id: info.id.clone(),
        ip: mesos_ip(&host),
        port: u32::from(port),
        pid: Some(format!("master@{host}:{port}")),
        hostname: Some(host.clone()),
        version: Some(MESOS_API_VERSION.to_string()),
        address: Some(v1::Address {
            hostname: Some(host.clone()),
            ip: host.parse::<Ipv4Addr>().ok().map(|ip| ip.to_string()),
            port: i32::from(port),
        }),
        ..Default::default()
    }
}

/// Agora's `AgentInfo` as Mesos's.
pub fn mesos_agent_info(info: &agora::AgentInfo) -> v1::AgentInfo {
    let (_, port) = host_port(&info.address, 5051);
    v1::AgentInfo {
        hostname: info.hostname.clone(),
        port: Some(i32::from(port)),
        resources: mesos_resources(&info.resources, &ResourceStyle::default()),
        attributes: mesos_attributes(&info.attributes),
        id: info.id.as_ref().map(mesos_agent_id),
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uuids_round_trip() {
        let text = uuid::Uuid::new_v4().to_string();
        let bytes = uuid_bytes(&text);
        assert_eq!(bytes.len(), 16);
        assert_eq!(uuid_text(&bytes).unwrap(), text);
        assert!(uuid_text(&[1, 2, 3]).is_err());
    }

    #[test]
    #[allow(deprecated)]
    fn resources_round_trip_and_validate() {
        let native =
            agora::Resources::parse("cpus:2;mem:512;ports:[31000-31005];cpus(web):1").unwrap();
        let mesos = mesos_resources(&native, &ResourceStyle::default());
        assert_eq!(resources(&mesos).unwrap(), native);
        let refined = mesos_resources(
            &native,
            &ResourceStyle {
                refinement: true,
                allocation_role: Some("web".into()),
            },
        );
        assert!(refined.iter().all(|r| r.role.is_none()));
        assert_eq!(resources(&refined).unwrap(), native);
        let mut bad = mesos[0].clone();
        bad.scalar = Some(v1::value::Scalar { value: -1.0 });
        assert!(matches!(resources(&[bad]), Err(ConvertError::Resources(_))));
    }

    #[test]
    fn master_ip_is_network_order() {
        assert_eq!(mesos_ip("127.0.0.1"), 16_777_343);
        let info = mesos_master_info(&agora::MasterInfo {
            id: "m".into(),
            address: "127.0.0.1:5050".into(),
            version: "0.1.0".into(),
        });
        assert_eq!(info.port, 5050);
        assert_eq!(info.version.as_deref(), Some(MESOS_API_VERSION));
    }

    #[test]
    fn filters_are_clamped() {
        let f = |s: f64| {
            filters(Some(&v1::Filters {
                refuse_seconds: Some(s),
            }))
            .refuse_seconds
        };
        assert_eq!(f(f64::from(u32::MAX)), Some(MAX_REFUSE_SECONDS));
        assert_eq!(f(-3.0), Some(0.0));
        assert_eq!(f(f64::NAN), Some(0.0));
        assert_eq!(filters(None).refuse_seconds, None);
        assert_eq!(
            filters(Some(&v1::Filters::default())).refuse_seconds,
            Some(5.0)
        );
    }

    /// A Mesos TaskInfo as pymesos writes it, JSON, with a command
    /// task's or a custom executor's URIs.
    fn task_json(body: &str) -> Vec<u8> {
        format!(
            r#"{{"name":"t","task_id":{{"value":"t1"}},"agent_id":{{"value":"a1"}},
                "resources":[{{"name":"cpus","type":"SCALAR","scalar":{{"value":0.1}}}}],
                {body}}}"#
        )
        .into_bytes()
    }

    #[test]
    fn command_task_uris_become_native_uris_from_json_and_protobuf() {
        use crate::Codec;
        let json = task_json(
            r#""command":{"value":"./run.sh","uris":[
                {"value":"/srv/run.sh","executable":true},
                {"value":"http://h:80/d.tgz","output_file":"data.tgz","extract":false},
                {"value":"file:///srv/x.zip"}]}"#,
        );
        let mesos: v1::TaskInfo = Codec::Json.decode(&json).unwrap();
        let protobuf = Codec::Protobuf.encode(&mesos).unwrap();
        let from_protobuf: v1::TaskInfo = Codec::Protobuf.decode(&protobuf).unwrap();
        for mesos in [mesos, from_protobuf] {
            let task = task_info(&mesos).unwrap();
            let command = task.command.expect("a command task");
            assert!(command.environment.is_empty());
            let uris: Vec<_> = command
                .uris
                .iter()
                .map(|u| {
                    (
                        u.value.as_str(),
                        u.executable,
                        u.extract,
                        u.output_file.as_deref(),
                    )
                })
                .collect();
            assert_eq!(
                uris,
                [
                    ("/srv/run.sh", true, true, None),
                    ("http://h:80/d.tgz", false, false, Some("data.tgz")),
                    ("file:///srv/x.zip", false, true, None),
                ]
            );
            // And back: the Mesos form keeps them.
            let back = mesos_command_info(&command);
            assert_eq!(back.uris.len(), 3);
            assert_eq!(back.uris[1].output_file.as_deref(), Some("data.tgz"));
        }
    }

    #[test]
    fn custom_executor_is_marked_mesos_and_keeps_its_uris_out_of_the_environment() {
        use crate::Codec;
        let json = task_json(
            r#""executor":{"type":"CUSTOM","executor_id":{"value":"e"},
                "command":{"value":"python3 executor.py",
                  "environment":{"variables":[{"name":"AGORA_FETCH_URIS","value":"[]"}]},
                  "uris":[{"value":"/srv/executor.py","executable":true}]}}"#,
        );
        let mesos: v1::TaskInfo = Codec::Json.decode(&json).unwrap();
        let executor = task_info(&mesos).unwrap().executor.expect("an executor");
        assert_eq!(executor.api, agora::ExecutorApi::MesosV1);
        assert_eq!(executor.command.uris.len(), 1);
        assert_eq!(executor.command.uris[0].value, "/srv/executor.py");
        // Once reserved, now a variable like any other: it asks nothing
        // of the agent.
        assert_eq!(executor.command.environment["AGORA_FETCH_URIS"], "[]");
    }

    #[test]
    fn executor_info_keeps_grace_data_and_labels_both_ways() {
        use crate::Codec;
        let json = task_json(
            r#""executor":{"type":"CUSTOM","executor_id":{"value":"e"},
                "command":{"value":"./exec"},
                "shutdown_grace_period":{"nanoseconds":2500000000},
                "data":"AAEC/w==",
                "labels":{"labels":[{"key":"team","value":"blue"},{"key":"bare"}]}}"#,
        );
        let mesos: v1::TaskInfo = Codec::Json.decode(&json).unwrap();
        let protobuf = Codec::Protobuf.encode(&mesos).unwrap();
        let from_protobuf: v1::TaskInfo = Codec::Protobuf.decode(&protobuf).unwrap();
        for mesos in [mesos, from_protobuf] {
            let executor = task_info(&mesos).unwrap().executor.expect("an executor");
            assert_eq!(executor.shutdown_grace_period, Some(2.5));
            assert_eq!(
                executor.data.as_ref().map(|d| &d.0[..]),
                Some(&[0, 1, 2, 255][..])
            );
            assert_eq!(executor.labels["team"], "blue");
            assert_eq!(executor.labels["bare"], "");
            // What the executor gets back in SUBSCRIBED.
            let back = mesos_executor_info(&executor);
            assert_eq!(
                back.shutdown_grace_period,
                Some(v1::DurationInfo {
                    nanoseconds: 2_500_000_000
                })
            );
            assert_eq!(back.data.as_deref(), Some(&[0, 1, 2, 255][..]));
            assert_eq!(back.labels.as_ref().map(|l| l.labels.len()), Some(2));
        }
        let negative = task_json(
            r#""executor":{"executor_id":{"value":"e"},"command":{"value":"./exec"},
                "shutdown_grace_period":{"nanoseconds":-1}}"#,
        );
        let mesos: v1::TaskInfo = Codec::Json.decode(&negative).unwrap();
        assert!(
            matches!(task_info(&mesos), Err(ConvertError::Invalid(m)) if m.contains("shutdown_grace_period"))
        );
    }

    #[test]
    fn tasks_of_a_custom_group_run_on_the_groups_executor() {
        use crate::Codec;
        let executor = executor_info(&v1::ExecutorInfo {
            executor_id: v1::ExecutorId { value: "e".into() },
            command: Some(v1::CommandInfo {
                value: Some("./exec".into()),
                ..Default::default()
            }),
            ..Default::default()
        })
        .unwrap();
        // With a command for the executor, or without one.
        for body in [r#""command":{"value":"echo hi"}"#, r#""data":"aGk=""#] {
            let mesos: v1::TaskInfo = Codec::Json.decode(&task_json(body)).unwrap();
            let task = custom_group_task_info(&mesos, &executor, "o1/0").unwrap();
            assert_eq!(task.executor.as_ref(), Some(&executor));
            assert_eq!(task.task_group.as_deref(), Some("o1/0"));
            assert_eq!(task.command.is_some(), body.contains("command"));
            // As an executor lists it when it subscribes again: the
            // group's tasks name no executor.
            let listed = v1::TaskInfo {
                executor: None,
                ..mesos_task_info(&task)
            };
            let back = received_task_info(&listed).unwrap();
            assert_eq!(back.task_id.as_str(), "t1");
            assert!(back.executor.is_none());
        }
        // A task of a group must not name an executor of its own.
        let own = task_json(r#""executor":{"executor_id":{"value":"x"},"command":{"value":"y"}}"#);
        let mesos: v1::TaskInfo = Codec::Json.decode(&own).unwrap();
        assert!(custom_group_task_info(&mesos, &executor, "g").is_err());
    }

    #[test]
    fn bad_uris_are_refused() {
        use crate::Codec;
        for bad in [
            r#"{"value":" "}"#,
            r#"{"value":"/x","output_file":"a/b"}"#,
            r#"{"value":"/x","output_file":".."}"#,
        ] {
            let json = task_json(&format!(r#""command":{{"value":"true","uris":[{bad}]}}"#));
            let mesos: v1::TaskInfo = Codec::Json.decode(&json).unwrap();
            assert!(
                matches!(task_info(&mesos), Err(ConvertError::Invalid(_))),
                "{bad}"
            );
        }
    }

    #[test]
    fn roles_follow_multi_role() {
        let mut info = v1::FrameworkInfo {
            user: "u".into(),
            name: "n".into(),
            roles: vec!["a".into()],
            ..Default::default()
        };
        assert!(framework_info(&info).is_err());
        info.capabilities.push(v1::framework_info::Capability {
            r#type: Some(v1::framework_info::capability::Type::MultiRole as i32),
        });
        assert_eq!(framework_info(&info).unwrap().roles, vec!["a".to_string()]);
        info.capabilities.clear();
        info.roles.clear();
        assert_eq!(framework_info(&info).unwrap().roles, vec!["*".to_string()]);
    }
}
