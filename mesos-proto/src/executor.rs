//! The Mesos v1 executor API (`/api/v1/executor` on the agent) in Agora's
//! terms: a `mesos.v1.executor.Call` becomes an [`ExecutorCall`] for the
//! agent core's executor machinery (the same one that serves Agora's own
//! executor WebSocket), and each native executor event the core sends
//! becomes the `mesos.v1.executor.Event` Mesos would send.
//!
//! Calls are validated as Mesos's agent validates them
//! (`src/common/validation.cpp`): every call names its framework and
//! executor; an update carries a 16-byte uuid, comes from
//! `SOURCE_EXECUTOR`, is not TASK_STAGING and names no other executor.

use agora_proto as agora;
use agora_proto::executor as exec_api;

use crate::convert::{self, ConvertError};
use crate::v1;
use crate::v1::executor::{call, event};

/// A decoded, validated executor call.
#[derive(Debug, Clone, PartialEq)]
pub struct ExecutorCall {
    /// The executor's framework.
    pub framework_id: agora::FrameworkId,
    /// The executor.
    pub executor_id: agora::ExecutorId,
    /// What it asks for.
    pub kind: CallKind,
}

/// What an executor call asks for.
#[derive(Debug, Clone, PartialEq)]
pub enum CallKind {
    /// Open the event stream, with what the executor holds unacknowledged.
    Subscribe {
        /// Updates sent but not acknowledged, oldest first.
        unacknowledged_updates: Vec<agora::TaskStatus>,
        /// Tasks received without an acknowledged update.
        unacknowledged_tasks: Vec<agora::TaskInfo>,
    },
    /// A native call: `UPDATE` or `MESSAGE`.
    Call(exec_api::Call),
    /// `HEARTBEAT`: answered, nothing else.
    Heartbeat,
}

/// Turns the native events the agent core sends an executor into Mesos's,
/// for one subscription: it keeps what `SUBSCRIBED` said about the
/// framework, which every `LAUNCH` repeats.
#[derive(Debug, Clone)]
pub struct EventTranslator {
    agent_port: u16,
    framework_info: Option<v1::FrameworkInfo>,
}

// === impl ExecutorCall ===

impl ExecutorCall {
    /// Validates and translates a decoded call (`now`: seconds since the
    /// epoch, the timestamp of updates that carry none).
    pub fn from_mesos(call: v1::executor::Call, now: f64) -> Result<ExecutorCall, ConvertError> {
        use call::Type;
        // What Agora does not carry out (a status's `check_status`,
        // `container_status`, ..., a call type it does not know) is
        // refused by name, never dropped.
        if let Some(refusal) = crate::support::refusal(&call) {
            return Err(refusal.into());
        }
        let framework_id = convert::framework_id(&call.framework_id)?;
        let executor_id = convert::executor_id(&call.executor_id)?;
        let missing =
            |field: &str| ConvertError::Invalid(format!("Expecting '{field}' to be present"));
        let kind = match call.r#type() {
            Type::Unknown => {
                return Err(ConvertError::Invalid(
                    "Expecting 'type' to be present".into(),
                ))
            }
            Type::Subscribe => {
                let subscribe = call.subscribe.ok_or_else(|| missing("subscribe"))?;
                let unacknowledged_updates = subscribe
                    .unacknowledged_updates
                    .iter()
                    .map(|u| status(&u.status, &executor_id, now))
                    .collect::<Result<_, _>>()?;
                let unacknowledged_tasks = subscribe
                    .unacknowledged_tasks
                    .iter()
                    .map(convert::received_task_info)
                    .collect::<Result<_, _>>()?;
                CallKind::Subscribe {
                    unacknowledged_updates,
                    unacknowledged_tasks,
                }
            }
            Type::Update => {
                let update = call.update.ok_or_else(|| missing("update"))?;
                CallKind::Call(exec_api::Call::Update {
                    status: status(&update.status, &executor_id, now)?,
                })
            }
            Type::Message => {
                let message = call.message.ok_or_else(|| missing("message"))?;
                CallKind::Call(exec_api::Call::Message {
                    data: agora::Bytes(message.data),
                })
            }
            Type::Heartbeat => CallKind::Heartbeat,
        };
        Ok(ExecutorCall {
            framework_id,
            executor_id,
            kind,
        })
    }
}

/// An executor's status update as Agora's, validated as Mesos does.
fn status(
    status: &v1::TaskStatus,
    executor_id: &agora::ExecutorId,
    now: f64,
) -> Result<agora::TaskStatus, ConvertError> {
    let Some(uuid) = status.uuid.as_deref() else {
        return Err(ConvertError::Invalid(
            "'TaskStatus.uuid' must be set in a status update from an executor".into(),
        ));
    };
    let uuid = convert::uuid_text(uuid)?;
    if status.source != Some(v1::task_status::Source::Executor as i32) {
        return Err(ConvertError::Invalid(format!(
            "'TaskStatus.source' must be SOURCE_EXECUTOR in a status update from an executor, got {}",
            status
                .source
                .and_then(|s| v1::task_status::Source::try_from(s).ok())
                .map_or("none".into(), |s| s.as_str_name().to_string())
        )));
    }
    if status.state() == v1::TaskState::TaskStaging {
        return Err(ConvertError::Invalid(
            "an executor may not send TASK_STAGING".into(),
        ));
    }
    if let Some(id) = &status.executor_id {
        if id.value != executor_id.as_str() {
            return Err(ConvertError::Invalid(format!(
                "'TaskStatus.executor_id' ({}) is not the calling executor ({executor_id})",
                id.value
            )));
        }
    }
    Ok(agora::TaskStatus {
        container_status: None,
        launch_stamp: None,
        task_id: convert::task_id(&status.task_id)?,
        state: convert::task_state(status.state()),
        message: status.message.clone(),
        source: agora::Source::SourceExecutor,
        reason: status.reason.and_then(|r| {
            v1::task_status::Reason::try_from(r)
                .ok()
                .map(convert::reason)
        }),
        data: status.data.clone().map(agora::Bytes),
        agent_id: None,
        executor_id: Some(executor_id.clone()),
        timestamp: status.timestamp.filter(|t| t.is_finite()).unwrap_or(now),
        uuid: Some(uuid),
        labels: convert::labels(status.labels.as_ref()),
        healthy: status.healthy,
    })
}

// === impl EventTranslator ===

impl EventTranslator {
    /// A translator for a subscription to the agent listening on
    /// `agent_port`.
    pub fn new(agent_port: u16) -> Self {
        EventTranslator {
            agent_port,
            framework_info: None,
        }
    }

    /// Mesos's event for a native one (`None`: nothing Mesos would send).
    pub fn translate(&mut self, event: exec_api::Event) -> Option<v1::executor::Event> {
        use event::Type;
        let mut out = v1::executor::Event::default();
        match event {
            exec_api::Event::Subscribed {
                executor_info,
                framework_info,
                agent_id,
                hostname,
            } => {
                let framework_info = convert::mesos_framework_info(&framework_info);
                self.framework_info = Some(framework_info.clone());
                out.set_type(Type::Subscribed);
                out.subscribed = Some(event::Subscribed {
                    executor_info: convert::mesos_executor_info(&executor_info),
                    framework_info,
                    agent_info: v1::AgentInfo {
                        hostname,
                        port: Some(i32::from(self.agent_port)),
                        id: (!agent_id.as_str().is_empty())
                            .then(|| convert::mesos_agent_id(&agent_id)),
                        ..Default::default()
                    },
                    container_id: None,
                });
            }
            exec_api::Event::Launch { task, .. } => {
                out.set_type(Type::Launch);
                out.launch = Some(event::Launch {
                    task: convert::mesos_task_info(&task),
                });
            }
            exec_api::Event::LaunchGroup { tasks } => {
                out.set_type(Type::LaunchGroup);
                // As Mesos's: the tasks of a group do not name their
                // executor (the one that gets them).
                let tasks = tasks
                    .iter()
                    .map(|task| v1::TaskInfo {
                        executor: None,
                        ..convert::mesos_task_info(task)
                    })
                    .collect();
                out.launch_group = Some(event::LaunchGroup {
                    task_group: v1::TaskGroupInfo { tasks },
                });
            }
            exec_api::Event::Kill {
                task_id,
                grace_period_seconds,
            } => {
                out.set_type(Type::Kill);
                out.kill = Some(event::Kill {
                    task_id: convert::mesos_task_id(&task_id),
                    kill_policy: grace_period_seconds.map(|secs| v1::KillPolicy {
                        grace_period: Some(convert::mesos_duration(secs)),
                    }),
                });
            }
            exec_api::Event::Acknowledged { task_id, uuid } => {
                out.set_type(Type::Acknowledged);
                out.acknowledged = Some(event::Acknowledged {
                    task_id: convert::mesos_task_id(&task_id),
                    uuid: convert::uuid_bytes(&uuid),
                });
            }
            exec_api::Event::Message { data } => {
                out.set_type(Type::Message);
                out.message = Some(event::Message { data: data.0 });
            }
            exec_api::Event::Shutdown { .. } => out.set_type(Type::Shutdown),
            exec_api::Event::Error { message, .. } => {
                out.set_type(Type::Error);
                out.error = Some(event::Error { message });
            }
            exec_api::Event::Unknown => return None,
        }
        Some(out)
    }

    /// `HEARTBEAT`, which the agent sends on its own (every
    /// `--executor-heartbeat-interval`), not for a native event.
    pub fn heartbeat() -> v1::executor::Event {
        let mut out = v1::executor::Event::default();
        out.set_type(event::Type::Heartbeat);
        out
    }

    /// The framework of this subscription, once `SUBSCRIBED` went out.
    pub fn framework_info(&self) -> Option<&v1::FrameworkInfo> {
        self.framework_info.as_ref()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Codec;

    fn update_call(status: serde_json::Value) -> Result<ExecutorCall, ConvertError> {
        let json = serde_json::json!({
            "type": "UPDATE",
            "framework_id": {"value": "f"},
            "executor_id": {"value": "e"},
            "update": {"status": status},
        });
        let call: v1::executor::Call = Codec::Json
            .decode(json.to_string().as_bytes())
            .expect("decodes");
        ExecutorCall::from_mesos(call, 1.5)
    }

    const UUID_B64: &str = "AAECAwQFBgcICQoLDA0ODw==";

    #[test]
    fn updates_are_validated_as_mesos_does() {
        let good = serde_json::json!({
            "task_id": {"value": "t"}, "state": "TASK_RUNNING",
            "source": "SOURCE_EXECUTOR", "uuid": UUID_B64,
            "labels": {"labels": [{"key": "wallTime", "value": "1.5"}]},
        });
        let call = update_call(good.clone()).unwrap();
        let CallKind::Call(exec_api::Call::Update { status }) = call.kind else {
            panic!("{call:?}")
        };
        assert_eq!(
            status.uuid.as_deref(),
            Some("00010203-0405-0607-0809-0a0b0c0d0e0f")
        );
        assert_eq!(status.timestamp, 1.5, "filled in when missing");
        assert_eq!(status.executor_id.as_ref().map(|e| e.as_str()), Some("e"));
        assert_eq!(status.labels["wallTime"], "1.5", "labels pass through");

        let without = |key: &str| {
            let mut s = good.clone();
            s.as_object_mut().unwrap().remove(key);
            s
        };
        let with = |key: &str, value: serde_json::Value| {
            let mut s = good.clone();
            s[key] = value;
            s
        };
        for (what, status) in [
            ("no uuid", without("uuid")),
            ("short uuid", with("uuid", "AAEC".into())),
            ("no source", without("source")),
            ("agent source", with("source", "SOURCE_AGENT".into())),
            ("staging", with("state", "TASK_STAGING".into())),
            (
                "other executor",
                with("executor_id", serde_json::json!({"value": "x"})),
            ),
        ] {
            assert!(update_call(status).is_err(), "{what} must be refused");
        }
    }

    #[test]
    fn events_carry_every_required_field() {
        let mut events = EventTranslator::new(5051);
        let mut framework = agora::FrameworkInfo::new("fw");
        framework.id = Some(agora::FrameworkId::new("f"));
        let executor = agora::ExecutorInfo {
            container: None,
            executor_id: agora::ExecutorId::new("e"),
            framework_id: Some(agora::FrameworkId::new("f")),
            command: agora::CommandInfo::shell("./run"),
            resources: agora::Resources::default(),
            name: String::new(),
            source: String::new(),
            api: Default::default(),
            shutdown_grace_period: None,
            data: None,
            labels: Default::default(),
        };
        let subscribed = events
            .translate(exec_api::Event::Subscribed {
                executor_info: executor,
                framework_info: framework,
                agent_id: agora::AgentId::new("a"),
                hostname: "host".into(),
            })
            .unwrap();
        let ack = events
            .translate(exec_api::Event::Acknowledged {
                task_id: agora::TaskId::new("t"),
                uuid: "00010203-0405-0607-0809-0a0b0c0d0e0f".into(),
            })
            .unwrap();
        for event in [subscribed, ack] {
            // Decoding enforces proto2 required fields, as mesos-go does.
            let bytes = Codec::Protobuf.encode(&event).unwrap();
            let back: v1::executor::Event = Codec::Protobuf.decode(&bytes).unwrap();
            assert_eq!(back, event);
        }
        let json = String::from_utf8(
            Codec::Json
                .encode(
                    &events
                        .translate(exec_api::Event::Shutdown {
                            grace_period_seconds: 5.0,
                        })
                        .unwrap(),
                )
                .unwrap(),
        )
        .unwrap();
        assert_eq!(json, r#"{"type":"SHUTDOWN"}"#);
    }
}
