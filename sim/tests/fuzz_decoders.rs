//! Fuzzing of every decoder that reads peer input, for a bounded time:
//! native frames (scheduler, agent and executor calls and events), the
//! Mesos v1 messages in protobuf and JSON (scheduler, executor and
//! operator calls, scheduler and executor events), RecordIO framing, and
//! the agent's status update log as a restarted agent reads it back.
//!
//! Inputs are random bytes, or valid encodings with random edits (bit
//! flips, bytes set to ones a parser cares about, insertions, deletions,
//! duplicated and spliced ranges, truncation), from a seeded generator.
//! A decoder may refuse an input, never panic. A panic names the target,
//! the seed and the input (hex), and `FUZZ_SEED=S` replays the run.
//! `FUZZ_SECONDS` (default 2) is each target's budget; the README's test
//! command runs this file in release, with the simulation.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::time::{Duration, Instant};

use agora_agent::sim::{wal_decode, wal_encode, WalRecord};
use agora_mesos_proto::recordio;
use agora_mesos_proto::v1;
use agora_mesos_proto::Codec;
use agora_proto::{
    agent, executor, scheduler, ExecutorId, FrameworkId, FrameworkInfo, Source, TaskId, TaskState,
    TaskStatus, PROTOCOL_VERSION,
};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// Bytes a parser treats specially: JSON and protobuf structure, digits,
/// signs, escapes, and the extremes.
const INTERESTING: &[u8] = b"{}[]:,\"\\-+.eE0179 \n\r\x00\x01\x7f\x80\xff\x08\x0a\x10\x12\x1a";

/// Each target's budget.
fn budget() -> Duration {
    let seconds = std::env::var("FUZZ_SECONDS")
        .ok()
        .and_then(|s| s.parse::<f64>().ok())
        .unwrap_or(2.0);
    Duration::from_secs_f64(seconds)
}

fn seed() -> u64 {
    std::env::var("FUZZ_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos() as u64)
                .unwrap_or(1)
        })
}

/// `seeds` edited at random.
fn mutate(rng: &mut StdRng, seeds: &[Vec<u8>]) -> Vec<u8> {
    if rng.random_bool(0.05) {
        let len = rng.random_range(0..512);
        return (0..len).map(|_| rng.random()).collect();
    }
    let mut data = seeds[rng.random_range(0..seeds.len())].clone();
    for _ in 0..rng.random_range(1..=8) {
        let len = data.len();
        match rng.random_range(0..8) {
            0 if len > 0 => {
                let i = rng.random_range(0..len);
                data[i] ^= 1 << rng.random_range(0..8);
            }
            1 if len > 0 => {
                let i = rng.random_range(0..len);
                data[i] = INTERESTING[rng.random_range(0..INTERESTING.len())];
            }
            2 => {
                let i = rng.random_range(0..=len);
                data.insert(i, INTERESTING[rng.random_range(0..INTERESTING.len())]);
            }
            3 if len > 0 => {
                let start = rng.random_range(0..len);
                let end = rng.random_range(start..=len.min(start + 16));
                data.drain(start..end);
            }
            4 if len > 0 => {
                let start = rng.random_range(0..len);
                let end = rng.random_range(start..=len.min(start + 32));
                let piece = data[start..end].to_vec();
                let at = rng.random_range(0..=len);
                data.splice(at..at, piece);
            }
            5 if len > 0 => data.truncate(rng.random_range(0..len)),
            6 => {
                let other = &seeds[rng.random_range(0..seeds.len())];
                if !other.is_empty() && len > 0 {
                    let from = rng.random_range(0..other.len());
                    let at = rng.random_range(0..len);
                    data.truncate(at);
                    data.extend_from_slice(&other[from..]);
                }
            }
            _ => {
                let i = rng.random_range(0..=len);
                data.insert(i, rng.random());
            }
        }
    }
    data
}

/// Runs `decode` on mutations of `seeds` until the budget is spent.
/// Returns the inputs tried.
fn fuzz(name: &str, seeds: &[Vec<u8>], decode: impl Fn(&[u8])) -> u64 {
    assert!(!seeds.is_empty(), "{name}: no seeds");
    let seed = seed();
    let mut rng = StdRng::seed_from_u64(seed);
    let deadline = Instant::now() + budget();
    let mut tried = 0u64;
    // Every seed as it is first: each must be accepted without a panic.
    for input in seeds {
        decode(input);
    }
    while Instant::now() < deadline {
        for _ in 0..64 {
            let input = mutate(&mut rng, seeds);
            if catch_unwind(AssertUnwindSafe(|| decode(&input))).is_err() {
                let hex: String = input.iter().map(|b| format!("{b:02x}")).collect();
                panic!("{name}: the decoder panicked (FUZZ_SEED={seed}, input #{tried}): {hex}");
            }
            tried += 1;
        }
    }
    eprintln!("{name}: {tried} inputs, no panic (FUZZ_SEED={seed})");
    tried
}

fn status(task: &str) -> TaskStatus {
    let mut status = TaskStatus::new(
        TaskId::new(task),
        TaskState::Running,
        Source::SourceExecutor,
    )
    .with_new_uuid();
    status.message = Some("running \u{e9}".into());
    status.data = Some(b"\x00\x01payload".to_vec().into());
    status
}

fn text_seeds(texts: &[String]) -> Vec<Vec<u8>> {
    texts.iter().map(|t| t.as_bytes().to_vec()).collect()
}

#[test]
fn native_frames() {
    let fid = FrameworkId::new("f-1");
    let schedulers = vec![
        agora_proto::encode(&scheduler::Call::Subscribe {
            protocol: PROTOCOL_VERSION,
            framework_info: FrameworkInfo::new("fuzz"),
            force: false,
        }),
        agora_proto::encode(&scheduler::Call::Acknowledge {
            agent_id: agora_proto::AgentId::new("a-1"),
            task_id: TaskId::new("t-1"),
            uuid: "6c1a8a4e-3f7e-4b7e-9a0e-1f2d3c4b5a69".into(),
        }),
        r#"{"type":"LAUNCH","offer_ids":["o-1"],"tasks":[{"name":"t","task_id":"t","agent_id":"a","resources":[{"name":"cpus","scalar":0.5},{"name":"ports","ranges":[[31000,31010]]}],"command":{"value":"echo hi","shell":true}}],"filters":{"refuse_seconds":5}}"#.to_string(),
        r#"{"type":"DECLINE","offer_ids":["o-1","o-2"],"filters":{"refuse_seconds":1e3}}"#.to_string(),
    ];
    let scheduler_events = [agora_proto::encode(&scheduler::Event::Update {
        status: status("t-1"),
    })];
    let agents = [
        agora_proto::encode(&agent::Call::StatusUpdate {
            framework_id: fid.clone(),
            status: status("t-2"),
        }),
        r#"{"type":"REGISTER","protocol":1,"agent_info":{"hostname":"h","address":"127.0.0.1:1","resources":[{"name":"cpus","scalar":2},{"name":"mem","scalar":1024}],"attributes":{"rack":"r1"}}}"#.to_string(),
        // Sets and ranges: their lists decode bounded (MAX_WIRE_ITEMS).
        r#"{"type":"REGISTER","protocol":1,"agent_info":{"id":"m-S1","hostname":"h","address":"127.0.0.1:1","resources":[{"name":"gpus","set":["g0","g1"]},{"name":"ports","ranges":[[31000,31010],[32000,32000]]},{"name":"disks","set":null,"scalar":1}]}}"#.to_string(),
    ];
    let executors = [
        agora_proto::encode(&executor::Call::Update {
            status: status("t-3"),
        }),
        agora_proto::encode(&executor::Call::Subscribe {
            protocol: PROTOCOL_VERSION,
            framework_id: fid,
            executor_id: ExecutorId::new("e-1"),
            token: "secret".into(),
            unacknowledged_updates: vec![],
            unacknowledged_tasks: vec![],
        }),
    ];
    let mut all = schedulers.clone();
    all.extend(scheduler_events.iter().cloned());
    all.extend(agents.iter().cloned());
    all.extend(executors.iter().cloned());
    let all = text_seeds(&all);
    // Text frames are UTF-8: the WebSocket layer refuses anything else.
    let text = |bytes: &[u8]| String::from_utf8_lossy(bytes).into_owned();
    fuzz("native scheduler calls", &all, |b| {
        let text = text(b);
        // As the master reads them: decoded, then their records' keys
        // checked.
        if agora_proto::decode::<scheduler::Call>(&text).is_ok() {
            let _ = scheduler::unknown_fields(&text);
        }
    });
    fuzz("native scheduler calls' unknown keys", &all, |b| {
        let _ = scheduler::unknown_fields(&text(b));
    });
    fuzz("native scheduler events", &all, |b| {
        let _ = agora_proto::decode::<scheduler::Event>(&text(b));
    });
    fuzz("native agent calls", &all, |b| {
        let _ = agora_proto::decode::<agent::Call>(&text(b));
    });
    fuzz("native agent events", &all, |b| {
        let _ = agora_proto::decode::<agent::Event>(&text(b));
    });
    fuzz("native executor calls", &all, |b| {
        let _ = agora_proto::decode::<executor::Call>(&text(b));
    });
    fuzz("native executor events", &all, |b| {
        let _ = agora_proto::decode::<executor::Event>(&text(b));
    });
}

fn mesos_scheduler_calls() -> Vec<v1::scheduler::Call> {
    use v1::scheduler::call;
    let framework_id = Some(v1::FrameworkId {
        value: "f-1".into(),
    });
    let mut subscribe = v1::scheduler::Call {
        subscribe: Some(call::Subscribe {
            framework_info: v1::FrameworkInfo {
                user: "u".into(),
                name: "fuzz".into(),
                roles: vec!["web".into()],
                capabilities: vec![v1::framework_info::Capability {
                    r#type: Some(v1::framework_info::capability::Type::PartitionAware as i32),
                }],
                ..Default::default()
            },
            ..Default::default()
        }),
        ..Default::default()
    };
    subscribe.set_type(call::Type::Subscribe);
    let mut acknowledge = v1::scheduler::Call {
        framework_id: framework_id.clone(),
        acknowledge: Some(call::Acknowledge {
            agent_id: v1::AgentId { value: "a".into() },
            task_id: v1::TaskId { value: "t".into() },
            uuid: vec![7; 16],
        }),
        ..Default::default()
    };
    acknowledge.set_type(call::Type::Acknowledge);
    let task = v1::TaskInfo {
        name: "t".into(),
        task_id: v1::TaskId { value: "t".into() },
        agent_id: v1::AgentId { value: "a".into() },
        resources: vec![v1::Resource {
            name: "cpus".into(),
            r#type: v1::value::Type::Scalar as i32,
            scalar: Some(v1::value::Scalar { value: 0.5 }),
            ..Default::default()
        }],
        command: Some(v1::CommandInfo {
            value: Some("echo hi".into()),
            uris: vec![v1::command_info::Uri {
                value: "http://127.0.0.1/x.tgz".into(),
                extract: Some(true),
                ..Default::default()
            }],
            ..Default::default()
        }),
        ..Default::default()
    };
    let mut accept = v1::scheduler::Call {
        framework_id,
        accept: Some(call::Accept {
            offer_ids: vec![v1::OfferId { value: "o".into() }],
            operations: vec![v1::offer::Operation {
                r#type: Some(v1::offer::operation::Type::Launch as i32),
                launch: Some(v1::offer::operation::Launch {
                    task_infos: vec![task],
                }),
                ..Default::default()
            }],
            filters: Some(v1::Filters {
                refuse_seconds: Some(5.0),
            }),
        }),
        ..Default::default()
    };
    accept.set_type(call::Type::Accept);
    // An ACCEPT of what Agora refuses: a task in a container with a
    // health check, a RESERVE, mesoshttp's `slave_id` (added in JSON).
    let mut refused = accept.clone();
    if let Some(a) = refused.accept.as_mut() {
        let mut task = a.operations[0].launch.as_ref().unwrap().task_infos[0].clone();
        task.container = Some(v1::ContainerInfo {
            r#type: v1::container_info::Type::Docker as i32,
            docker: Some(v1::container_info::DockerInfo {
                image: "alpine:3.19".into(),
                ..Default::default()
            }),
            ..Default::default()
        });
        task.health_check = Some(v1::HealthCheck::default());
        a.operations[0].launch = Some(v1::offer::operation::Launch {
            task_infos: vec![task],
        });
        a.operations.push(v1::offer::Operation {
            r#type: Some(v1::offer::operation::Type::Reserve as i32),
            reserve: Some(v1::offer::operation::Reserve::default()),
            ..Default::default()
        });
    }
    vec![subscribe, acknowledge, accept, refused]
}

fn mesos_seeds<T: prost_reflect::ReflectMessage>(messages: &[T]) -> Vec<Vec<u8>> {
    messages
        .iter()
        .flat_map(|m| {
            [
                Codec::Protobuf.encode(m).unwrap(),
                Codec::Json.encode(m).unwrap(),
            ]
        })
        .collect()
}

#[test]
fn mesos_v1_messages() {
    let mut seeds = mesos_seeds(&mesos_scheduler_calls());
    seeds.push(
        br#"{"type":"ACCEPT","framework_id":{"value":"f"},"accept":{"offer_ids":[{"value":"o"}],"operations":[{"type":"LAUNCH","launch":{"task_infos":[{"name":"t","task_id":{"value":"t"},"agent_id":{"value":"a"},"slave_id":{"value":"a"},"contaner":{},"command":{"value":"true"}}]}}]}}"#.to_vec(),
    );
    for codec in [Codec::Protobuf, Codec::Json] {
        let tag = if codec == Codec::Json {
            "json"
        } else {
            "protobuf"
        };
        fuzz(&format!("mesos scheduler calls ({tag})"), &seeds, |b| {
            // As the front door reads them: decoded (or, refused, read
            // again for an ACCEPT's offers), then checked for what Agora
            // does not carry out, then converted.
            let call = match codec.decode::<v1::scheduler::Call>(b) {
                Ok(call) => call,
                Err(_) => {
                    let _ = codec.decode_ignoring_unknown_keys::<v1::scheduler::Call>(b);
                    return;
                }
            };
            let _ = agora_mesos_proto::support::refusal(&call);
            for operation in call.accept.iter().flat_map(|a| a.operations.iter()) {
                let _ = agora_mesos_proto::support::refusal(operation);
                for task in operation.launch.iter().flat_map(|l| l.task_infos.iter()) {
                    let _ = agora_mesos_proto::convert::task_info(task);
                }
            }
            if let Some(s) = &call.subscribe {
                let _ = agora_mesos_proto::convert::framework_info(&s.framework_info);
            }
        });
        fuzz(&format!("mesos scheduler events ({tag})"), &seeds, |b| {
            let _ = codec.decode::<v1::scheduler::Event>(b);
        });
        fuzz(&format!("mesos executor calls ({tag})"), &seeds, |b| {
            if let Ok(call) = codec.decode::<v1::executor::Call>(b) {
                let _ = agora_mesos_proto::executor::ExecutorCall::from_mesos(call, 0.0);
            }
        });
        fuzz(&format!("mesos executor events ({tag})"), &seeds, |b| {
            let _ = codec.decode::<v1::executor::Event>(b);
        });
        fuzz(&format!("mesos operator calls ({tag})"), &seeds, |b| {
            if let Ok(call) = codec.decode::<v1::master::Call>(b) {
                let _ = agora_mesos_proto::support::refusal(&call);
            }
        });
    }
}

#[test]
fn recordio_framing() {
    let records: Vec<Vec<u8>> = mesos_seeds(&mesos_scheduler_calls());
    let stream: Vec<u8> = records.iter().flat_map(|r| recordio::frame(r)).collect();
    let seeds = vec![
        stream,
        b"5\nhello3\nabc".to_vec(),
        b"99999999999999999999\n".to_vec(),
    ];
    fuzz("recordio", &seeds, |b| {
        // Fed in two pieces, as a stream arrives.
        let split = b.len() / 3;
        let mut reader = recordio::Reader::new();
        reader.feed(&b[..split]);
        while let Ok(Some(_)) = reader.next_record() {}
        reader.feed(&b[split..]);
        while let Ok(Some(_)) = reader.next_record() {}
    });
}

#[test]
fn agent_status_update_log() {
    let fid = FrameworkId::new("f-1");
    let records = vec![
        WalRecord::Update {
            framework_id: fid.clone(),
            executor_id: ExecutorId::new("e-1"),
            status: status("t-1"),
        },
        WalRecord::Ack {
            framework_id: fid.clone(),
            task_id: TaskId::new("t-1"),
            uuid: "u-1".into(),
        },
        WalRecord::End {
            framework_id: fid,
            task_id: TaskId::new("t-1"),
        },
    ];
    let seeds = vec![wal_encode(&records), wal_encode(&records[..1])];
    fuzz("agent status update log", &seeds, |b| {
        let _ = wal_decode(b);
    });
}

/// The harness finds a decoder's panic and names it.
#[test]
#[should_panic(expected = "the decoder panicked")]
fn a_panicking_decoder_is_caught() {
    let seeds = vec![b"{\"type\":\"SUBSCRIBE\"}".to_vec()];
    fuzz("self-check", &seeds, |b| {
        // A decoder that trips over a byte no seed has.
        assert!(!b.contains(&0xff), "a bug");
    });
}
