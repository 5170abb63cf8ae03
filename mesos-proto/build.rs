//! Compiles `proto/mesos/v1/**.proto` with protox (pure Rust: no system
//! `protoc`) into a descriptor set, generates the Rust types with
//! prost-build, and writes an `impl prost_reflect::ReflectMessage` for each
//! message so the codecs can walk them by descriptor.

use std::fmt::Write as _;
use std::path::PathBuf;

use heck::{ToSnakeCase, ToUpperCamelCase};

const FILES: &[&str] = &[
    "mesos/v1/mesos.proto",
    "mesos/v1/scheduler/scheduler.proto",
    "mesos/v1/executor/executor.proto",
    "mesos/v1/master/master.proto",
    "mesos/v1/agent/agent.proto",
    "mesos/v1/quota/quota.proto",
    "mesos/v1/maintenance/maintenance.proto",
    "mesos/v1/allocator/allocator.proto",
];

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=proto");
    let out = PathBuf::from(std::env::var("OUT_DIR")?);
    let descriptors = protox::compile(FILES, ["proto"])?;
    std::fs::write(
        out.join("mesos_v1_descriptor.bin"),
        prost::Message::encode_to_vec(&descriptors),
    )?;

    let mut impls = String::new();
    for file in &descriptors.file {
        let package = file.package();
        // Imported well-known types (`google.protobuf.Duration`) are
        // prost-types' own.
        if !package.starts_with("mesos.") {
            continue;
        }
        let module = format!("crate::{}", package.replace('.', "::"));
        for message in &file.message_type {
            reflect_impl(&mut impls, package, &module, message);
        }
    }
    std::fs::write(out.join("mesos_v1_reflect.rs"), impls)?;

    // Mesos's comments hold indented examples that rustdoc would run as
    // doc-tests; the `.proto` files are the documentation.
    prost_build::Config::new()
        .disable_comments(["."])
        .compile_fds(descriptors)?;
    Ok(())
}

/// Writes the `ReflectMessage` impl of a message and of its nested messages
/// (named as prost names them: nested types live in a snake_case module
/// named after their parent).
fn reflect_impl(
    out: &mut String,
    scope: &str,
    module: &str,
    message: &prost_types::DescriptorProto,
) {
    // Map entries are not types of their own in the generated code.
    if message.options.as_ref().is_some_and(|o| o.map_entry()) {
        return;
    }
    let full = format!("{scope}.{}", message.name());
    let rust = format!("{module}::{}", message.name().to_upper_camel_case());
    let _ = writeln!(
        out,
        "impl ::prost_reflect::ReflectMessage for {rust} {{\n    fn descriptor(&self) -> ::prost_reflect::MessageDescriptor {{\n        crate::DESCRIPTOR_POOL\n            .get_message_by_name(\"{full}\")\n            .expect(\"{full} is in the generated descriptor set\")\n    }}\n}}"
    );
    let nested_module = format!("{module}::{}", message.name().to_snake_case());
    for nested in &message.nested_type {
        reflect_impl(out, &full, &nested_module, nested);
    }
}
