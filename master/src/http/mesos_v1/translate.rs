//! Sans-IO translation between the Mesos v1 scheduler API and the master's
//! own scheduler calls and events: what the Mesos front door feeds the
//! state machine, and what it writes back on a subscription stream.
//!
//! Calls: each Mesos call becomes the native calls that do the same thing
//! (ACCEPT → LAUNCH, SHUTDOWN → a KILL per task of the executor, …), plus
//! any task the master must not see because Agora cannot run it as asked
//! (a field Agora does not carry out, such as `TaskInfo.container` or
//! `CommandInfo.user`, both a command and an executor…): those are
//! answered with TASK_ERROR updates (`REASON_TASK_INVALID`, the message
//! naming the field), asynchronously on the stream as Mesos answers
//! invalid tasks. Request-level problems are [`CallError`]s, answered
//! synchronously with Mesos's status codes: a call type Agora does not
//! carry out is `501`, any other field it does not carry out `400`, each
//! naming it (the lists are `agora_mesos_proto::support`'s).
//!
//! An ACCEPT with an offer operation Agora does not carry out (RESERVE,
//! CREATE, ..., or a LAUNCH with an operation `id`) is refused whole: each
//! of its launches gets TASK_ERROR naming the operation, its offers are
//! declined with no filter (their resources go back to the allocator and
//! are offered again), and the call is answered `400` naming it.
//!
//! Events: the per-framework policy lives here. A framework without
//! PARTITION_AWARE hears TASK_LOST where a partition-aware one hears
//! TASK_UNREACHABLE, TASK_GONE, TASK_DROPPED or TASK_UNKNOWN; offers carry
//! `allocation_info` only for MULTI_ROLE frameworks; a SUBSCRIBED is
//! followed at once by a HEARTBEAT (line-buffering clients deliver an
//! event only when the next one starts); the master's non-fatal errors
//! (Mesos has none: its clients treat ERROR as the end of the
//! subscription) are not forwarded.

use agora_mesos_proto::convert::{self, Capabilities};
use agora_mesos_proto::support::{self, Refusal};
use agora_mesos_proto::v1;
use agora_mesos_proto::v1::scheduler::{call, event};
use agora_proto::scheduler::{Call, Event, ReconcileTask, ResourceRequest};
use agora_proto::{
    AgentId, ExecutorId, FrameworkId, Reason, Source, TaskId, TaskInfo, TaskState, TaskStatus,
};

/// The message of the master's reconciliation answer for a task it does
/// not know (`tasks.rs`), which a partition-aware framework hears as
/// TASK_UNKNOWN. A test below runs the real master to keep the two in step.
pub(crate) const UNKNOWN_TASK_MESSAGE: &str = "unknown task";

/// Exit status reported in FAILURE when the executor's is not known:
/// Mesos clients read `status` whenever `executor_id` is set.
const UNKNOWN_EXIT_STATUS: i32 = -1;

/// A call refused synchronously.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum CallError {
    /// 400 Bad Request.
    BadRequest(String),
    /// 501 Not Implemented.
    NotImplemented(String),
}

/// What one Mesos call turns into.
#[derive(Debug, Default, PartialEq)]
pub(crate) struct Translated {
    /// Native calls for the state machine, in order.
    pub(crate) calls: Vec<Call>,
    /// Updates to send the framework at once (tasks refused here).
    pub(crate) refused: Vec<TaskStatus>,
    /// The answer to the call once `calls` and `refused` are carried out,
    /// when it is an error (an ACCEPT refused whole); `202` otherwise.
    pub(crate) error: Option<CallError>,
}

/// The field of an ACCEPT the front door checks operation by operation.
const ACCEPT_OPERATIONS: &str = "mesos.v1.scheduler.Call.Accept.operations";

/// The call type field, whose refusal is `501` rather than `400`.
const CALL_TYPE: &str = "scheduler.Call.type";

/// The fields of an operation whose refusal refuses a task (or a task
/// group), not the whole ACCEPT.
const OPERATION_TASKS: &[&str] = &[
    "mesos.v1.Offer.Operation.Launch.task_infos",
    "mesos.v1.Offer.Operation.LaunchGroup.executor",
    "mesos.v1.Offer.Operation.LaunchGroup.task_group",
];

/// Looks up a framework's live tasks run by an executor on an agent (for
/// SHUTDOWN, which Agora carries out by killing them).
pub(crate) trait ExecutorTasks {
    fn executor_tasks(
        &self,
        framework: &FrameworkId,
        agent: &AgentId,
        executor: &ExecutorId,
    ) -> Vec<TaskId>;
}

/// Translates every call but SUBSCRIBE (handled by the stream itself).
pub(crate) fn translate_call(
    framework: &FrameworkId,
    call: v1::scheduler::Call,
    executors: &dyn ExecutorTasks,
) -> Result<Translated, CallError> {
    use call::Type;
    let missing = |field: &str| CallError::BadRequest(format!("Expecting '{field}' to be present"));
    if let Some(refusal) = support::refusal_outside(&call, &[ACCEPT_OPERATIONS]) {
        return Err(if refusal.field == CALL_TYPE {
            CallError::NotImplemented(refusal.to_string())
        } else {
            CallError::BadRequest(refusal.to_string())
        });
    }
    let mut out = Translated::default();
    match call.r#type() {
        Type::Unknown => {
            return Err(CallError::NotImplemented(
                "Received an UNKNOWN call (or no 'type')".into(),
            ))
        }
        Type::Subscribe => {
            return Err(CallError::BadRequest(
                "SUBSCRIBE is handled on its own stream".into(),
            ))
        }
        Type::Teardown => out.calls.push(Call::Teardown),
        Type::Accept => {
            let accept = call.accept.ok_or_else(|| missing("accept"))?;
            out = translate_accept(accept);
        }
        Type::Decline => {
            let decline = call.decline.ok_or_else(|| missing("decline"))?;
            out.calls.push(Call::Decline {
                offer_ids: decline.offer_ids.iter().map(convert::offer_id).collect(),
                filters: convert::filters(decline.filters.as_ref()),
            });
        }
        Type::Revive => out.calls.push(Call::Revive {
            roles: call.revive.map(|r| r.roles).unwrap_or_default(),
        }),
        Type::Suppress => out.calls.push(Call::Suppress {
            roles: call.suppress.map(|s| s.roles).unwrap_or_default(),
        }),
        Type::Kill => {
            let kill = call.kill.ok_or_else(|| missing("kill"))?;
            out.calls.push(Call::Kill {
                task_id: TaskId::new(kill.task_id.value),
                agent_id: kill.agent_id.map(|a| AgentId::new(a.value)),
            });
        }
        Type::Shutdown => {
            let shutdown = call.shutdown.ok_or_else(|| missing("shutdown"))?;
            let agent = AgentId::new(shutdown.agent_id.value);
            let executor = ExecutorId::new(shutdown.executor_id.value);
            for task_id in executors.executor_tasks(framework, &agent, &executor) {
                out.calls.push(Call::Kill {
                    task_id,
                    agent_id: Some(agent.clone()),
                });
            }
        }
        Type::Acknowledge => {
            let ack = call.acknowledge.ok_or_else(|| missing("acknowledge"))?;
            let uuid = convert::uuid_text(&ack.uuid)
                .map_err(|e| CallError::BadRequest(format!("Invalid 'acknowledge.uuid': {e}")))?;
            out.calls.push(Call::Acknowledge {
                agent_id: AgentId::new(ack.agent_id.value),
                task_id: TaskId::new(ack.task_id.value),
                uuid,
            });
        }
        Type::Reconcile => {
            let reconcile = call.reconcile.ok_or_else(|| missing("reconcile"))?;
            out.calls.push(Call::Reconcile {
                tasks: reconcile
                    .tasks
                    .into_iter()
                    .map(|t| ReconcileTask {
                        task_id: TaskId::new(t.task_id.value),
                        agent_id: t.agent_id.map(|a| AgentId::new(a.value)),
                    })
                    .collect(),
            });
        }
        Type::Message => {
            let message = call.message.ok_or_else(|| missing("message"))?;
            out.calls.push(Call::Message {
                agent_id: AgentId::new(message.agent_id.value),
                executor_id: ExecutorId::new(message.executor_id.value),
                data: agora_proto::Bytes(message.data),
            });
        }
        Type::Request => {
            let request = call.request.ok_or_else(|| missing("request"))?;
            let mut requests = Vec::new();
            for r in &request.requests {
                requests.push(ResourceRequest {
                    agent_id: r.agent_id.as_ref().map(|a| AgentId::new(a.value.clone())),
                    resources: convert::resources(&r.resources).map_err(|e| {
                        CallError::BadRequest(format!("Invalid 'request.requests': {e}"))
                    })?,
                });
            }
            out.calls.push(Call::Request { requests });
        }
        // Refused above (`support::CARRIED_VALUES`): Agora makes no
        // inverse offers and reports no operations; a framework changes
        // its FrameworkInfo by subscribing again.
        other @ (Type::AcceptInverseOffers
        | Type::DeclineInverseOffers
        | Type::AcknowledgeOperationStatus
        | Type::ReconcileOperations
        | Type::UpdateFramework) => {
            return Err(CallError::NotImplemented(format!(
                "{CALL_TYPE} {} is not supported",
                other.as_str_name()
            )))
        }
    }
    Ok(out)
}

/// ACCEPT: the tasks of every LAUNCH and LAUNCH_GROUP operation become one
/// native LAUNCH on the offers (an empty one declines them, as Mesos's
/// ACCEPT without tasks does). An operation Agora does not carry out
/// refuses the whole ACCEPT (see the module documentation).
///
/// A LAUNCH_GROUP is all or nothing. With the DEFAULT executor its tasks
/// become command tasks, each run by Agora's command executor (the first
/// carrying the executor's resources; see `convert::DefaultExecutor`); with a
/// CUSTOM executor (or one of no type that has a command) they become one
/// native task group (`TaskInfo::task_group`, named after the first offer
/// and the operation's place in the ACCEPT), which the master launches
/// all or none and the agent hands to the executor in one LAUNCH_GROUP.
fn translate_accept(accept: call::Accept) -> Translated {
    use v1::offer::operation::Type;
    if let Some(refusal) = accept
        .operations
        .iter()
        .find_map(|op| support::refusal_outside(op, OPERATION_TASKS))
    {
        return refuse_accept(accept, &refusal);
    }
    let mut out = Translated::default();
    let mut tasks: Vec<TaskInfo> = Vec::new();
    let first_offer = accept
        .offer_ids
        .first()
        .map_or_else(String::new, |o| o.value.clone());
    for (index, operation) in accept.operations.iter().enumerate() {
        match operation.r#type() {
            Type::Launch => {
                for task in operation.launch.iter().flat_map(|l| l.task_infos.iter()) {
                    match convert::task_info(task) {
                        Ok(native) => tasks.push(native),
                        Err(e) => out.refused.push(refusal_of(task, e.to_string())),
                    }
                }
            }
            Type::LaunchGroup => {
                let Some(group) = &operation.launch_group else {
                    continue;
                };
                let converted: Vec<Result<TaskInfo, String>> = if runs_custom(&group.executor) {
                    let name = format!("{first_offer}/{index}");
                    match convert::executor_info(&group.executor) {
                        Ok(executor) => group
                            .task_group
                            .tasks
                            .iter()
                            .map(|t| {
                                convert::custom_group_task_info(t, &executor, &name)
                                    .map_err(|e| format!("task {}: {e}", t.task_id.value))
                            })
                            .collect(),
                        Err(e) => vec![Err(format!("its executor: {e}"))],
                    }
                } else {
                    match convert::default_executor(&group.executor) {
                        Ok(executor) => group
                            .task_group
                            .tasks
                            .iter()
                            .enumerate()
                            .map(|(i, t)| {
                                convert::default_group_task_info(t, &executor, i == 0)
                                    .map_err(|e| format!("task {}: {e}", t.task_id.value))
                            })
                            .collect(),
                        Err(e) => vec![Err(format!("its executor: {e}"))],
                    }
                };
                // A task group launches all or nothing.
                if let Some(first) = converted.iter().find_map(|r| r.as_ref().err()) {
                    let message = format!("task group refused: {first}");
                    for t in &group.task_group.tasks {
                        out.refused.push(group_refusal(t, message.clone()));
                    }
                } else {
                    tasks.extend(converted.into_iter().flatten());
                }
            }
            // Refused above, with the whole ACCEPT (`support` carries
            // out LAUNCH and LAUNCH_GROUP only).
            other => {
                let refusal = Refusal {
                    field: "Offer.Operation.type".into(),
                    value: Some(other.as_str_name().into()),
                };
                return refuse_accept(accept, &refusal);
            }
        }
    }
    out.calls.push(Call::Launch {
        offer_ids: accept.offer_ids.iter().map(convert::offer_id).collect(),
        tasks,
        filters: convert::filters(accept.filters.as_ref()),
    });
    out
}

/// An ACCEPT refused whole because of `refusal`: every task it would
/// launch gets TASK_ERROR naming it, its offers are declined with no
/// filter, and the call is answered `400`.
fn refuse_accept(accept: call::Accept, refusal: &Refusal) -> Translated {
    refused_accept(
        accept,
        format!("{refusal}: the whole ACCEPT is refused and its offers declined"),
    )
}

/// An ACCEPT refused whole with `message`: every task it would launch
/// gets TASK_ERROR with it, its offers are declined with no filter, and
/// the call is answered `400` with it.
pub(crate) fn refused_accept(accept: call::Accept, message: String) -> Translated {
    let mut out = Translated::default();
    for operation in &accept.operations {
        let launched = operation
            .launch
            .iter()
            .flat_map(|l| l.task_infos.iter())
            .chain(
                operation
                    .launch_group
                    .iter()
                    .flat_map(|g| g.task_group.tasks.iter()),
            );
        for task in launched {
            out.refused.push(refusal_of(task, message.clone()));
        }
    }
    out.calls.push(Call::Decline {
        offer_ids: accept.offer_ids.iter().map(convert::offer_id).collect(),
        filters: agora_proto::Filters {
            refuse_seconds: Some(0.0),
        },
    });
    out.error = Some(CallError::BadRequest(message));
    out
}

/// Whether a LAUNCH_GROUP's executor is the framework's own (CUSTOM, or
/// of no type with a command) rather than Mesos's default executor.
fn runs_custom(executor: &v1::ExecutorInfo) -> bool {
    use v1::executor_info::Type;
    match executor.r#type() {
        Type::Custom => true,
        Type::Default => false,
        Type::Unknown => executor.command.is_some(),
    }
}

/// The TASK_ERROR update for a task refused by the front door.
fn refusal_of(task: &v1::TaskInfo, message: String) -> TaskStatus {
    refused_with(task, Reason::ReasonTaskInvalid, message)
}

/// The TASK_ERROR update for a task of a group refused by the front door
/// (`REASON_TASK_GROUP_INVALID`, as Mesos says).
fn group_refusal(task: &v1::TaskInfo, message: String) -> TaskStatus {
    refused_with(task, Reason::ReasonTaskGroupInvalid, message)
}

fn refused_with(task: &v1::TaskInfo, reason: Reason, message: String) -> TaskStatus {
    let mut status = TaskStatus::new(
        TaskId::new(task.task_id.value.clone()),
        TaskState::Error,
        Source::SourceMaster,
    )
    .with_reason(reason)
    .with_message(message);
    status.agent_id = Some(AgentId::new(task.agent_id.value.clone()));
    status
}

/// Translates one native event for a framework with `caps`; `None`
/// entries are not for Mesos clients.
pub(crate) fn translate_event(event: Event, caps: Capabilities) -> Vec<v1::scheduler::Event> {
    use event::Type;
    let mut out = v1::scheduler::Event::default();
    match event {
        Event::Subscribed {
            framework_id,
            heartbeat_interval_seconds,
            master_info,
            ..
        } => {
            out.set_type(Type::Subscribed);
            out.subscribed = Some(event::Subscribed {
                framework_id: convert::mesos_framework_id(&framework_id),
                heartbeat_interval_seconds: Some(heartbeat_interval_seconds),
                master_info: Some(convert::mesos_master_info(&master_info)),
            });
            return vec![out, heartbeat()];
        }
        Event::Offers { offers } => {
            out.set_type(Type::Offers);
            out.offers = Some(event::Offers {
                offers: offers
                    .iter()
                    .map(|o| convert::mesos_offer(o, caps))
                    .collect(),
            });
        }
        Event::Rescind { offer_id } => {
            out.set_type(Type::Rescind);
            out.rescind = Some(event::Rescind {
                offer_id: convert::mesos_offer_id(&offer_id),
            });
        }
        Event::Update { status } => {
            out.set_type(Type::Update);
            out.update = Some(event::Update {
                status: mesos_status_for(&status, caps),
            });
        }
        Event::Message {
            agent_id,
            executor_id,
            data,
        } => {
            out.set_type(Type::Message);
            out.message = Some(event::Message {
                agent_id: convert::mesos_agent_id(&agent_id),
                executor_id: convert::mesos_executor_id(&executor_id),
                data: data.0,
            });
        }
        Event::Failure {
            agent_id,
            executor_id,
            status,
        } => {
            out.set_type(Type::Failure);
            let with_executor = executor_id.is_some();
            out.failure = Some(event::Failure {
                agent_id: Some(convert::mesos_agent_id(&agent_id)),
                executor_id: executor_id.as_ref().map(convert::mesos_executor_id),
                status: status.or(with_executor.then_some(UNKNOWN_EXIT_STATUS)),
            });
        }
        Event::Error { message, fatal } => {
            if !fatal {
                tracing::debug!(%message, "non-fatal master error not forwarded to a Mesos scheduler");
                return Vec::new();
            }
            out.set_type(Type::Error);
            out.error = Some(event::Error { message });
        }
        Event::Heartbeat => return vec![heartbeat()],
        Event::Unknown => return Vec::new(),
    }
    vec![out]
}

pub(crate) fn heartbeat() -> v1::scheduler::Event {
    let mut event = v1::scheduler::Event::default();
    event.set_type(event::Type::Heartbeat);
    event
}

/// A status as the framework must hear it (see the module documentation).
pub(crate) fn mesos_status_for(status: &TaskStatus, caps: Capabilities) -> v1::TaskStatus {
    let mut out = convert::mesos_status(status);
    let state = state_for(status, caps);
    out.set_state(convert::mesos_task_state(state));
    if state == TaskState::Gone && status.reason == Some(Reason::ReasonAgentRemovedByOperator) {
        out.set_state(v1::TaskState::TaskGoneByOperator);
    }
    if state == TaskState::Unreachable {
        out.unreachable_time = Some(v1::TimeInfo {
            nanoseconds: (status.timestamp * 1e9) as i64,
        });
    }
    out
}

/// Mesos 1.x's task state policy. A partition-aware framework learns
/// what happened: an agent that stopped answering (`REASON_AGENT_REMOVED`)
/// makes its tasks UNREACHABLE, an agent that restarted without them
/// GONE, a task the master does not know UNKNOWN, and a reconciled task
/// the master settled as lost GONE. Every other framework hears TASK_LOST
/// for all of these and for TASK_DROPPED.
pub(crate) fn state_for(status: &TaskStatus, caps: Capabilities) -> TaskState {
    let state = status.state;
    if !caps.partition_aware {
        return match state {
            TaskState::Dropped | TaskState::Unreachable | TaskState::Gone | TaskState::Unknown => {
                TaskState::Lost
            }
            other => other,
        };
    }
    if state != TaskState::Lost || status.source != Source::SourceMaster {
        return state;
    }
    match status.reason {
        Some(Reason::ReasonAgentRemoved) => TaskState::Unreachable,
        Some(Reason::ReasonAgentRestarted) => TaskState::Gone,
        Some(Reason::ReasonAgentRemovedByOperator) => TaskState::Gone,
        Some(Reason::ReasonTaskUnknown) => TaskState::Unknown,
        Some(Reason::ReasonReconciliation) => {
            if status.message.as_deref() == Some(UNKNOWN_TASK_MESSAGE) {
                TaskState::Unknown
            } else {
                TaskState::Gone
            }
        }
        _ => state,
    }
}

#[cfg(test)]
mod tests;
