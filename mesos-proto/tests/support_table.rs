//! The table of `docs/mesos.md` ("What Agora carries out, and what it
//! refuses") against the lists the code refuses by
//! (`agora_mesos_proto::support`) and the descriptors of the vendored
//! protos: every field of every listed message, and every value of every
//! restricted enum field, has one row, marked as the code does; no row
//! names anything else.

use std::collections::BTreeMap;

use agora_mesos_proto::support::{self, CARRIED, CARRIED_VALUES};
use agora_mesos_proto::v1;
use prost_reflect::{Kind, ReflectMessage};

const CARRIED_OUT: &str = "carried out";
const REFUSED: &str = "refused";

/// The messages the issue asks the table to show in full.
const REQUIRED: &[&str] = &[
    "mesos.v1.TaskInfo",
    "mesos.v1.ExecutorInfo",
    "mesos.v1.ContainerInfo",
    "mesos.v1.CommandInfo",
    "mesos.v1.FrameworkInfo",
    "mesos.v1.Resource",
    "mesos.v1.Offer.Operation",
    "mesos.v1.scheduler.Call",
    "mesos.v1.master.Call",
];

/// The table's rows: first cell (without backticks) → second cell.
fn table() -> BTreeMap<String, String> {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/mesos.md");
    let doc = std::fs::read_to_string(path).expect("docs/mesos.md is readable");
    let section = doc
        .split("## What Agora carries out, and what it refuses")
        .nth(1)
        .expect("docs/mesos.md has the section")
        .split("\n## ")
        .next()
        .unwrap_or_default();
    let mut rows = BTreeMap::new();
    for line in section.lines().filter(|l| l.starts_with("| `")) {
        let cells: Vec<&str> = line.trim_matches('|').split(" | ").collect();
        let key = cells[0].trim().trim_matches('`').to_string();
        let status = cells.get(1).map_or("", |c| c.trim()).to_string();
        assert!(
            rows.insert(key.clone(), status).is_none(),
            "{key} has two rows"
        );
    }
    rows
}

fn short(full: &str) -> &str {
    full.strip_prefix("mesos.v1.").unwrap_or(full)
}

fn mark(carried: bool) -> &'static str {
    if carried {
        CARRIED_OUT
    } else {
        REFUSED
    }
}

#[test]
fn the_table_lists_every_field_and_value_as_the_code_treats_it() {
    let pool = v1::TaskInfo::default().descriptor().parent_pool().clone();
    let mut rows = table();
    let mut wrong = Vec::new();
    let mut check = |key: String, carried: bool| match rows.remove(&key) {
        None => wrong.push(format!("no row for `{key}` ({})", mark(carried))),
        Some(status) if status != mark(carried) => wrong.push(format!(
            "`{key}` is \"{status}\" in the table but {} in the code",
            mark(carried)
        )),
        Some(_) => {}
    };
    for required in REQUIRED {
        assert!(
            CARRIED.iter().any(|c| c.message == *required),
            "{required} is not in support::CARRIED"
        );
    }
    for carried in CARRIED {
        let message = pool
            .get_message_by_name(carried.message)
            .expect("a message of the protos");
        for field in message.fields() {
            check(
                format!("{}.{}", short(carried.message), field.name()),
                support::carries_field(field.full_name()),
            );
            let Some(restricted) = CARRIED_VALUES.iter().find(|v| v.field == field.full_name())
            else {
                continue;
            };
            let Kind::Enum(enumeration) = field.kind() else {
                panic!("{} is not an enum field", restricted.field);
            };
            for value in enumeration.values() {
                check(
                    format!(
                        "{}.{} {}",
                        short(carried.message),
                        field.name(),
                        value.name()
                    ),
                    support::carries_value_named(restricted.field, value.name()),
                );
            }
        }
    }
    for key in rows.keys() {
        wrong.push(format!(
            "`{key}` is in the table but is no field or value the code lists"
        ));
    }
    assert!(wrong.is_empty(), "docs/mesos.md:\n{}", wrong.join("\n"));
}

/// The refusal a message gets is the table's name for it.
#[test]
fn refusals_name_rows_of_the_table() {
    let rows = table();
    let mut container = v1::ContainerInfo {
        docker: Some(v1::container_info::DockerInfo {
            image: "busybox:1".into(),
            privileged: Some(true),
            ..Default::default()
        }),
        ..Default::default()
    };
    container.set_type(v1::container_info::Type::Docker);
    let mut task = v1::TaskInfo {
        container: Some(container),
        ..Default::default()
    };
    let refusal = support::refusal(&task).expect("docker.privileged is refused");
    assert_eq!(refusal.field, "ContainerInfo.DockerInfo.privileged");
    assert_eq!(rows[&refusal.field], REFUSED);
    task.container = None;
    let mut operation = v1::offer::Operation::default();
    operation.set_type(v1::offer::operation::Type::Create);
    let refusal = support::refusal(&operation).expect("CREATE is refused");
    let key = format!("{} {}", refusal.field, refusal.value.unwrap());
    assert_eq!(key, "Offer.Operation.type CREATE");
    assert_eq!(rows[&key], REFUSED);
}
