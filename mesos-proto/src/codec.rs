//! The two encodings of the Mesos v1 HTTP APIs.
//!
//! JSON is written the way Mesos's own JSON writer does it, which is not
//! proto3's canonical JSON mapping: field names are the `.proto` names
//! (`framework_id`, never `frameworkId`), enums are their names
//! (`"TASK_RUNNING"`), `bytes` are standard padded base64, 64-bit integers
//! are JSON numbers, and the output is one compact line of ASCII (other
//! characters as `\uXXXX` escapes), because line-splitting clients such as
//! mesoshttp slice decoded text by byte counts. On input, a key that is
//! not a field of its message (or an enum name that is not a value of its
//! enum) is an error naming it, never dropped (the protos are Mesos's
//! complete ones), and proto2 `required` fields are enforced after
//! parsing, as Mesos does (a call that lacks one is refused with the
//! field's path). Protobuf is the `mesos.v1` binary encoding, with the
//! same checks: a field number the message does not have is an error.

use prost_reflect::{
    Cardinality, DeserializeOptions, DynamicMessage, Kind, ReflectMessage, SerializeOptions, Value,
};

use crate::wire::required_fields_present;

/// `application/json`.
pub const MEDIA_JSON: &str = "application/json";
/// `application/x-protobuf`.
pub const MEDIA_PROTOBUF: &str = "application/x-protobuf";

/// An encoding of Mesos v1 messages.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Codec {
    /// `application/json`, Mesos-style (see the module documentation).
    Json,
    /// `application/x-protobuf`.
    Protobuf,
}

/// Why a body could not be decoded or a message encoded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CodecError {
    /// The body is not valid JSON for the message type.
    #[error("failed to parse JSON into {message}: {reason}")]
    Json {
        /// The message type.
        message: String,
        /// What the parser said.
        reason: String,
    },
    /// The body is not a valid protobuf encoding of the message type.
    #[error("failed to parse protobuf into {message}: {reason}")]
    Protobuf {
        /// The message type.
        message: String,
        /// What the parser said.
        reason: String,
    },
    /// A protobuf field number that is not a field of its message (its
    /// path, e.g. `subscribe.framework_info`, and the number).
    #[error("{message}{}: field number {number} is not a field of the message", if .path.is_empty() { String::new() } else { format!(" at {}", .path) })]
    UnknownField {
        /// The type of the message that holds it.
        message: String,
        /// Where that message is in the decoded one (empty: at its top).
        path: String,
        /// The field number.
        number: u32,
    },
    /// Required fields are missing (their paths, e.g. `subscribe.framework_info.user`).
    #[error("missing required fields: {}", .0.join(", "))]
    MissingRequired(Vec<String>),
    /// A message could not be written (a bug, never the peer's fault).
    #[error("failed to encode {message}: {reason}")]
    Encode {
        /// The message type.
        message: String,
        /// Why.
        reason: String,
    },
}

// === impl Codec ===

impl Codec {
    /// The media type, as the `Content-Type` of requests and responses.
    pub fn media_type(self) -> &'static str {
        match self {
            Codec::Json => MEDIA_JSON,
            Codec::Protobuf => MEDIA_PROTOBUF,
        }
    }

    /// The codec of a request's `Content-Type`. Mesos compares the value
    /// exactly; parameters (`; charset=utf-8`) are tolerated here.
    pub fn from_content_type(value: &str) -> Option<Codec> {
        let media = value.split(';').next().unwrap_or("").trim();
        if media.eq_ignore_ascii_case(MEDIA_JSON) {
            Some(Codec::Json)
        } else if media.eq_ignore_ascii_case(MEDIA_PROTOBUF) {
            Some(Codec::Protobuf)
        } else {
            None
        }
    }

    /// The codec of a response, from every `Accept` header of the request
    /// (mesos-go sends two): JSON if acceptable, else protobuf; `None`
    /// when neither is (answer 406). No `Accept` at all accepts anything.
    pub fn negotiate<'a>(accept: impl IntoIterator<Item = &'a str>) -> Option<Codec> {
        let mut ranges = Vec::new();
        for header in accept {
            for item in header.split(',') {
                let mut parts = item.split(';');
                let media = parts.next().unwrap_or("").trim().to_ascii_lowercase();
                if media.is_empty() {
                    continue;
                }
                let q = parts
                    .filter_map(|p| p.trim().strip_prefix("q="))
                    .find_map(|q| q.trim().parse::<f32>().ok())
                    .unwrap_or(1.0);
                ranges.push((media, q));
            }
        }
        if ranges.is_empty() {
            return Some(Codec::Json);
        }
        let quality = |media: &str| -> f32 {
            let (kind, _) = media.split_once('/').unwrap_or((media, ""));
            let mut best: Option<(u8, f32)> = None;
            for (range, q) in &ranges {
                let specificity = if range == media {
                    3
                } else if range.strip_suffix("/*") == Some(kind) {
                    2
                } else if range == "*/*" {
                    1
                } else {
                    continue;
                };
                if best.is_none_or(|(s, _)| specificity > s) {
                    best = Some((specificity, *q));
                }
            }
            best.map_or(0.0, |(_, q)| q)
        };
        let json = quality(MEDIA_JSON);
        let protobuf = quality(MEDIA_PROTOBUF);
        if json > 0.0 && json >= protobuf {
            Some(Codec::Json)
        } else if protobuf > 0.0 {
            Some(Codec::Protobuf)
        } else {
            None
        }
    }

    /// Decodes `body` as `T`, enforcing proto2 required fields.
    pub fn decode<T: ReflectMessage + Default + 'static>(
        self,
        body: &[u8],
    ) -> Result<T, CodecError> {
        if self == Codec::Protobuf {
            // Fast path: a typed decode, once a walk over the wire (no
            // allocation, no descriptor) has seen every required field.
            // Anything it is unsure of takes the reflective path below,
            // which gives the exact error.
            if required_fields_present::<T>(body) {
                if let Ok(message) = T::decode(body) {
                    return Ok(message);
                }
            }
        }
        let descriptor = T::default().descriptor();
        let name = || descriptor.full_name().to_string();
        let dynamic = match self {
            Codec::Json => {
                let mut de = serde_json::Deserializer::from_slice(body);
                let options = DeserializeOptions::new().deny_unknown_fields(true);
                match DynamicMessage::deserialize_with_options(
                    descriptor.clone(),
                    &mut de,
                    &options,
                )
                .and_then(|m| de.end().map(|()| m))
                {
                    Ok(message) => message,
                    // Only when the strict parse fails: the body may use
                    // a Mesos 0.x name of a field (mesoshttp sends
                    // `TaskInfo.slave_id` beside `agent_id`), or a bare
                    // value where a field is repeated (`"roles": "x"`),
                    // which Mesos's parser takes as a one-element list.
                    Err(e) => {
                        leniently(body, &descriptor, &options)?.ok_or_else(|| CodecError::Json {
                            message: name(),
                            reason: e.to_string(),
                        })?
                    }
                }
            }
            Codec::Protobuf => DynamicMessage::decode(descriptor.clone(), body).map_err(|e| {
                CodecError::Protobuf {
                    message: name(),
                    reason: e.to_string(),
                }
            })?,
        };
        if let Some(unknown) = unknown_field(&dynamic, "") {
            return Err(unknown);
        }
        let mut missing = Vec::new();
        missing_required(&dynamic, "", &mut missing);
        if !missing.is_empty() {
            return Err(CodecError::MissingRequired(missing));
        }
        dynamic
            .transcode_to::<T>()
            .map_err(|e| CodecError::Protobuf {
                message: name(),
                reason: e.to_string(),
            })
    }

    /// Decodes a JSON `body` as `T` leaving out keys that are not fields
    /// (and enum names that are not values): never to act on the call,
    /// only to learn, once [`Codec::decode`] refused it, what it named (an
    /// ACCEPT's offers, to give them back). `None` for protobuf, or when
    /// the body does not decode even so.
    pub fn decode_ignoring_unknown_keys<T: ReflectMessage + Default + 'static>(
        self,
        body: &[u8],
    ) -> Option<T> {
        if self != Codec::Json {
            return None;
        }
        let descriptor = T::default().descriptor();
        let mut de = serde_json::Deserializer::from_slice(body);
        let options = DeserializeOptions::new().deny_unknown_fields(false);
        DynamicMessage::deserialize_with_options(descriptor, &mut de, &options)
            .ok()?
            .transcode_to::<T>()
            .ok()
    }

    /// Encodes `message`.
    pub fn encode<T: ReflectMessage>(self, message: &T) -> Result<Vec<u8>, CodecError> {
        match self {
            Codec::Protobuf => Ok(message.encode_to_vec()),
            Codec::Json => to_json(message),
        }
    }

    /// Encodes `message` at the end of `out` (a buffer reused from one
    /// message to the next costs no allocation per message). On an error
    /// `out` is as it was.
    pub fn encode_into<T: ReflectMessage>(
        self,
        message: &T,
        out: &mut Vec<u8>,
    ) -> Result<(), CodecError> {
        match self {
            Codec::Protobuf => {
                out.reserve(message.encoded_len());
                message.encode_raw(out);
                Ok(())
            }
            Codec::Json => {
                out.extend_from_slice(&to_json(message)?);
                Ok(())
            }
        }
    }
}

/// Mesos-style JSON for any message (see the module documentation).
pub fn to_json<T: ReflectMessage>(message: &T) -> Result<Vec<u8>, CodecError> {
    let dynamic = message.transcode_to_dynamic();
    let options = SerializeOptions::new()
        .use_proto_field_name(true)
        .stringify_64_bit_integers(false)
        .use_enum_numbers(false)
        .skip_default_fields(true);
    let mut out = Vec::with_capacity(256);
    let mut ser = serde_json::Serializer::with_formatter(&mut out, AsciiFormatter);
    dynamic
        .serialize_with_options(&mut ser, &options)
        .map_err(|e| CodecError::Encode {
            message: dynamic.descriptor().full_name().to_string(),
            reason: e.to_string(),
        })?;
    Ok(out)
}

/// Mesos-style JSON as a `serde_json::Value` (for endpoints that embed
/// messages in larger documents).
pub fn to_json_value<T: ReflectMessage>(message: &T) -> serde_json::Value {
    to_json(message)
        .ok()
        .and_then(|bytes| serde_json::from_slice(&bytes).ok())
        .unwrap_or(serde_json::Value::Null)
}

/// Fields that Mesos clients still send under their Mesos 0.x name, in
/// JSON: (message, old key, field). The old key is the same field (its
/// number is the field's): a value equal to the field's, or alone, is the
/// field's; a different one is an error.
const V0_NAMES: &[(&str, &str, &str)] = &[("mesos.v1.TaskInfo", "slave_id", "agent_id")];

/// Decodes a JSON `body` of `descriptor` as Mesos's stout parser reads
/// it: after renaming the 0.x keys of [`V0_NAMES`] and making each bare
/// value (string, number, bool or object) of a repeated field a list of
/// that one value. `None` when there is nothing to change (the first error
/// stands).
fn leniently(
    body: &[u8],
    descriptor: &prost_reflect::MessageDescriptor,
    options: &DeserializeOptions,
) -> Result<Option<DynamicMessage>, CodecError> {
    let Ok(mut value) = serde_json::from_slice::<serde_json::Value>(body) else {
        return Ok(None);
    };
    let mut changed = false;
    mesos_shapes(&mut value, descriptor, &mut changed)?;
    if !changed {
        return Ok(None);
    }
    DynamicMessage::deserialize_with_options(descriptor.clone(), value, options)
        .map(Some)
        .map_err(|e| CodecError::Json {
            message: descriptor.full_name().to_string(),
            reason: e.to_string(),
        })
}

fn mesos_shapes(
    value: &mut serde_json::Value,
    descriptor: &prost_reflect::MessageDescriptor,
    changed: &mut bool,
) -> Result<(), CodecError> {
    let serde_json::Value::Object(object) = value else {
        return Ok(());
    };
    for &(message, old, new) in V0_NAMES {
        if descriptor.full_name() != message {
            continue;
        }
        let Some(given) = object.remove(old) else {
            continue;
        };
        *changed = true;
        match object.get(new) {
            Some(current) if *current != given => {
                return Err(CodecError::Json {
                    message: message.to_string(),
                    reason: format!("'{old}' (the Mesos 0.x name of '{new}') differs from '{new}'"),
                })
            }
            Some(_) => {}
            None => {
                object.insert(new.to_string(), given);
            }
        }
    }
    for (key, inner) in object.iter_mut() {
        let Some(field) = descriptor
            .get_field_by_name(key)
            .or_else(|| descriptor.get_field_by_json_name(key))
        else {
            continue;
        };
        if field.is_list()
            && !matches!(inner, serde_json::Value::Array(_) | serde_json::Value::Null)
        {
            *inner = serde_json::Value::Array(vec![inner.take()]);
            *changed = true;
        }
        let Kind::Message(inner_descriptor) = field.kind() else {
            continue;
        };
        if field.is_map() {
            continue;
        }
        match inner {
            serde_json::Value::Array(items) => {
                for item in items {
                    mesos_shapes(item, &inner_descriptor, changed)?;
                }
            }
            other => mesos_shapes(other, &inner_descriptor, changed)?,
        }
    }
    Ok(())
}

/// The first field number of the protobuf input that is not a field of
/// its message, recursively.
fn unknown_field(message: &DynamicMessage, path: &str) -> Option<CodecError> {
    if let Some(field) = message.unknown_fields().next() {
        return Some(CodecError::UnknownField {
            message: message.descriptor().full_name().to_string(),
            path: path.to_string(),
            number: field.number(),
        });
    }
    let join = |name: &str| {
        if path.is_empty() {
            name.to_string()
        } else {
            format!("{path}.{name}")
        }
    };
    for (field, value) in message.fields() {
        let found = match value {
            Value::Message(inner) => unknown_field(inner, &join(field.name())),
            Value::List(items) => items.iter().enumerate().find_map(|(i, item)| match item {
                Value::Message(inner) => {
                    unknown_field(inner, &format!("{}[{i}]", join(field.name())))
                }
                _ => None,
            }),
            Value::Map(entries) => entries.iter().find_map(|(key, value)| match value {
                Value::Message(inner) => {
                    unknown_field(inner, &format!("{}[{key:?}]", join(field.name())))
                }
                _ => None,
            }),
            _ => None,
        };
        if found.is_some() {
            return found;
        }
    }
    None
}

/// Collects the paths of required fields that are not set, recursively.
fn missing_required(message: &DynamicMessage, path: &str, missing: &mut Vec<String>) {
    let join = |name: &str| {
        if path.is_empty() {
            name.to_string()
        } else {
            format!("{path}.{name}")
        }
    };
    for field in message.descriptor().fields() {
        if field.cardinality() == Cardinality::Required && !message.has_field(&field) {
            missing.push(join(field.name()));
            continue;
        }
        if !matches!(field.kind(), Kind::Message(_)) || !message.has_field(&field) {
            continue;
        }
        match &*message.get_field(&field) {
            Value::Message(inner) => missing_required(inner, &join(field.name()), missing),
            Value::List(items) => {
                for (i, item) in items.iter().enumerate() {
                    if let Value::Message(inner) = item {
                        missing_required(inner, &format!("{}[{i}]", join(field.name())), missing);
                    }
                }
            }
            Value::Map(entries) => {
                for (key, value) in entries {
                    if let Value::Message(inner) = value {
                        missing_required(
                            inner,
                            &format!("{}[{key:?}]", join(field.name())),
                            missing,
                        );
                    }
                }
            }
            _ => {}
        }
    }
}

/// serde_json's compact formatter, with every non-ASCII character written
/// as a `\uXXXX` escape (UTF-16 surrogate pairs beyond the BMP).
struct AsciiFormatter;

impl serde_json::ser::Formatter for AsciiFormatter {
    fn write_string_fragment<W: ?Sized + std::io::Write>(
        &mut self,
        writer: &mut W,
        fragment: &str,
    ) -> std::io::Result<()> {
        let mut start = 0;
        for (i, c) in fragment.char_indices() {
            if c.is_ascii() {
                continue;
            }
            writer.write_all(&fragment.as_bytes()[start..i])?;
            let mut units = [0u16; 2];
            for unit in c.encode_utf16(&mut units) {
                write!(writer, "\\u{unit:04x}")?;
            }
            start = i + c.len_utf8();
        }
        writer.write_all(&fragment.as_bytes()[start..])
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use prost::Message;

    #[test]
    fn content_types() {
        assert_eq!(
            Codec::from_content_type("application/json"),
            Some(Codec::Json)
        );
        assert_eq!(
            Codec::from_content_type("application/json; charset=utf-8"),
            Some(Codec::Json)
        );
        assert_eq!(
            Codec::from_content_type("application/x-protobuf"),
            Some(Codec::Protobuf)
        );
        assert_eq!(Codec::from_content_type("text/plain"), None);
    }

    #[test]
    fn protobuf_fast_path_decodes_as_the_reflective_one_and_still_names_missing_fields() {
        use crate::v1;
        use crate::v1::scheduler::call;
        let mut call = v1::scheduler::Call {
            framework_id: Some(v1::FrameworkId { value: "f".into() }),
            acknowledge: Some(call::Acknowledge {
                agent_id: v1::AgentId { value: "a".into() },
                task_id: v1::TaskId { value: "t".into() },
                uuid: vec![7; 16],
            }),
            ..Default::default()
        };
        call.set_type(call::Type::Acknowledge);
        let bytes = call.encode_to_vec();
        let dynamic = DynamicMessage::decode(call.descriptor(), bytes.as_slice()).unwrap();
        assert!(required_fields_present::<v1::scheduler::Call>(&bytes));
        let fast: v1::scheduler::Call = Codec::Protobuf.decode(&bytes).unwrap();
        assert_eq!(fast, call);
        assert_eq!(dynamic.transcode_to::<v1::scheduler::Call>().unwrap(), call);

        // An acknowledgement with only its uuid: the fast path is unsure,
        // the reflective one names both missing fields.
        let mut partial = DynamicMessage::new(call::Acknowledge::default().descriptor());
        partial.set_field_by_name("uuid", Value::Bytes(vec![7u8; 16].into()));
        let bytes = partial.encode_to_vec();
        assert!(!required_fields_present::<call::Acknowledge>(&bytes));
        assert_eq!(
            Codec::Protobuf.decode::<call::Acknowledge>(&bytes),
            Err(CodecError::MissingRequired(vec![
                "agent_id".into(),
                "task_id".into()
            ]))
        );
        // Truncated bytes are not decoded by either path.
        let whole = call.encode_to_vec();
        assert!(!required_fields_present::<v1::scheduler::Call>(
            &whole[..whole.len() - 3]
        ));
        assert!(Codec::Protobuf
            .decode::<v1::scheduler::Call>(&whole[..whole.len() - 3])
            .is_err());
    }

    #[test]
    fn keys_and_field_numbers_a_message_does_not_have_are_errors_naming_them() {
        use crate::v1;
        // JSON: a key beside the real ones, nested, and an enum name.
        let json = br#"{"type":"KILL","kill":{"task_id":{"value":"t"},"tsk":1}}"#;
        let err = Codec::Json
            .decode::<v1::scheduler::Call>(json)
            .unwrap_err()
            .to_string();
        assert!(err.contains("'tsk'"), "{err}");
        let json = br#"{"type":"KILLALL"}"#;
        let err = Codec::Json
            .decode::<v1::scheduler::Call>(json)
            .unwrap_err()
            .to_string();
        assert!(err.contains("'KILLALL'"), "{err}");
        // Protobuf: field 99 inside `kill.task_id`.
        let mut call = v1::scheduler::Call {
            kill: Some(v1::scheduler::call::Kill {
                task_id: v1::TaskId { value: "t".into() },
                ..Default::default()
            }),
            ..Default::default()
        };
        call.set_type(v1::scheduler::call::Type::Kill);
        let good = call.encode_to_vec();
        assert_eq!(
            Codec::Protobuf.decode::<v1::scheduler::Call>(&good),
            Ok(call)
        );
        // `kill` is field 6 and `task_id` field 1 of Kill: append an
        // unknown varint field 99 to the task id.
        let task_id = [0x0a, 0x01, b't', 0x98, 0x06, 0x01];
        let kill = [&[0x0a, task_id.len() as u8][..], &task_id].concat();
        let mut bad = vec![0x10, 0x06];
        bad.extend_from_slice(&[0x32, kill.len() as u8]);
        bad.extend_from_slice(&kill);
        assert!(!required_fields_present::<v1::scheduler::Call>(&bad));
        assert_eq!(
            Codec::Protobuf.decode::<v1::scheduler::Call>(&bad),
            Err(CodecError::UnknownField {
                message: "mesos.v1.TaskID".into(),
                path: "kill.task_id".into(),
                number: 99,
            })
        );
    }

    #[test]
    fn a_mesos_0_x_name_is_its_field() {
        use crate::v1;
        let task = |extra: &str| {
            format!(
                r#"{{"type":"ACCEPT","accept":{{"offer_ids":[{{"value":"o"}}],"operations":[{{"type":"LAUNCH","launch":{{"task_infos":[
                {{"name":"t","task_id":{{"value":"t"}},{extra}"command":{{"value":"true"}}}}]}}}}]}}}}"#
            )
        };
        // As mesoshttp sends it: both names, one value.
        let call: v1::scheduler::Call = Codec::Json
            .decode(task(r#""agent_id":{"value":"a"},"slave_id":{"value":"a"},"#).as_bytes())
            .unwrap();
        let launched = &call.accept.unwrap().operations[0]
            .launch
            .clone()
            .unwrap()
            .task_infos[0];
        assert_eq!(launched.agent_id.value, "a");
        // The old name alone.
        let call: v1::scheduler::Call = Codec::Json
            .decode(task(r#""slave_id":{"value":"b"},"#).as_bytes())
            .unwrap();
        assert_eq!(
            call.accept.unwrap().operations[0]
                .launch
                .as_ref()
                .unwrap()
                .task_infos[0]
                .agent_id
                .value,
            "b"
        );
        // Two different values.
        let err = Codec::Json
            .decode::<v1::scheduler::Call>(
                task(r#""agent_id":{"value":"a"},"slave_id":{"value":"b"},"#).as_bytes(),
            )
            .unwrap_err();
        assert!(err.to_string().contains("'slave_id'"), "{err}");
    }

    #[test]
    fn a_bare_string_of_a_repeated_field_is_a_list_of_one() {
        use crate::v1;
        let call: v1::scheduler::Call = Codec::Json
            .decode(
                br#"{"type":"SUBSCRIBE","subscribe":{"framework_info":{"user":"u","name":"n","roles":"x","capabilities":[{"type":"MULTI_ROLE"}]}}}"#,
            )
            .unwrap();
        assert_eq!(call.subscribe.unwrap().framework_info.roles, vec!["x"]);
    }

    #[test]
    fn a_bare_number_of_a_repeated_field_is_a_list_of_one() {
        use crate::v1;
        let check: v1::HealthCheck = Codec::Json
            .decode(br#"{"type":"HTTP","http":{"port":80,"statuses":200}}"#)
            .unwrap();
        assert_eq!(check.http.unwrap().statuses, vec![200]);
    }

    #[test]
    fn a_bare_object_of_a_repeated_field_is_a_list_of_one_at_any_depth() {
        use crate::v1;
        // A capability, an offer id, an operation and a task, each bare.
        let call: v1::scheduler::Call = Codec::Json
            .decode(
                br#"{"type":"SUBSCRIBE","subscribe":{"framework_info":{"user":"u","name":"n","roles":["x"],"capabilities":{"type":"MULTI_ROLE"}}}}"#,
            )
            .unwrap();
        let info = call.subscribe.unwrap().framework_info;
        assert_eq!(info.capabilities.len(), 1);
        assert_eq!(
            info.capabilities[0].r#type(),
            v1::framework_info::capability::Type::MultiRole
        );
        let call: v1::scheduler::Call = Codec::Json
            .decode(
                br#"{"type":"ACCEPT","accept":{"offer_ids":{"value":"o"},"operations":{"type":"LAUNCH","launch":{"task_infos":{"name":"t","task_id":{"value":"t"},"agent_id":{"value":"a"},"resources":{"name":"cpus","type":"SCALAR","scalar":{"value":1}}}}}}}"#,
            )
            .unwrap();
        let accept = call.accept.unwrap();
        assert_eq!(accept.offer_ids[0].value, "o");
        let task = &accept.operations[0].launch.as_ref().unwrap().task_infos[0];
        assert_eq!(task.task_id.value, "t");
        assert_eq!(task.resources[0].name, "cpus");
    }

    #[test]
    fn leniency_still_refuses_unknown_keys_and_wrong_types() {
        use crate::v1;
        let err = Codec::Json
            .decode::<v1::scheduler::Call>(
                br#"{"type":"SUBSCRIBE","subscribe":{"framework_info":{"user":"u","name":"n","roles":"x","bogus":1}}}"#,
            )
            .unwrap_err();
        assert!(err.to_string().contains("bogus"), "{err}");
        // A number where the list holds strings is no list of one string.
        assert!(Codec::Json
            .decode::<v1::scheduler::Call>(
                br#"{"type":"SUBSCRIBE","subscribe":{"framework_info":{"user":"u","name":"n","roles":7}}}"#,
            )
            .is_err());
    }

    #[test]
    fn accept_negotiation() {
        assert_eq!(Codec::negotiate([]), Some(Codec::Json));
        assert_eq!(Codec::negotiate(["*/*"]), Some(Codec::Json));
        assert_eq!(
            Codec::negotiate(["application/x-protobuf", "application/x-protobuf"]),
            Some(Codec::Protobuf)
        );
        assert_eq!(
            Codec::negotiate(["application/json, application/x-protobuf"]),
            Some(Codec::Json)
        );
        assert_eq!(
            Codec::negotiate(["application/json;q=0, */*"]),
            Some(Codec::Protobuf)
        );
        assert_eq!(Codec::negotiate(["text/html"]), None);
    }
}
