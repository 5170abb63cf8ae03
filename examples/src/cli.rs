//! Command-line helpers shared by the example binaries.

pub use agora_proto::parse_duration;

/// Installs the tracing subscriber: `RUST_LOG` filter (default `warn`),
/// text to stderr, or JSON lines when `json` is set or the environment
/// has `AGORA_LOG_FORMAT=json`.
pub fn init_logging(json: bool) {
    let json = json
        || std::env::var(agora_proto::env::LOG_FORMAT)
            .is_ok_and(|f| f.eq_ignore_ascii_case("json"));
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    if json {
        builder.json().init();
    } else {
        builder.init();
    }
}
