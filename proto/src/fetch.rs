//! URIs an agent fetches into a sandbox before starting a command
//! (Mesos's `CommandInfo.URI`), asked for with [`crate::CommandInfo::uris`].

use serde::{Deserialize, Serialize};

/// One URI to fetch: a local path (absolute, or `file://`) or an
/// `http://` URL.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FetchUri {
    /// Where to fetch from.
    pub value: String,
    /// Make the fetched file executable (`chmod +x`).
    #[serde(default)]
    pub executable: bool,
    /// Unpack archives (`.tar`, `.tar.gz`, `.tgz`, `.zip`) into the
    /// sandbox instead of keeping the file. Mesos's default is true.
    #[serde(default = "default_true")]
    pub extract: bool,
    /// File name in the sandbox (default: the last path segment).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output_file: Option<String>,
}

fn default_true() -> bool {
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn extract_defaults_to_true() {
        let uri: FetchUri = serde_json::from_str(r#"{"value":"/x.tgz"}"#).unwrap();
        assert!(uri.extract && !uri.executable && uri.output_file.is_none());
    }

    #[test]
    fn command_uris_and_executor_api_are_optional_on_the_wire() {
        use crate::{CommandInfo, ExecutorApi, ExecutorInfo};
        // A command or checkpointed executor written before the fields
        // existed decodes with none to fetch and Agora's API, and one
        // without them encodes as before.
        let old = r#"{"executor_id":"e","command":{"value":"run","shell":true,"arguments":[],"environment":{}}}"#;
        let info: ExecutorInfo = serde_json::from_str(old).unwrap();
        assert_eq!(info.api, ExecutorApi::Agora);
        assert!(info.command.uris.is_empty());
        let json = serde_json::to_string(&info).unwrap();
        assert!(!json.contains("uris") && !json.contains("api"), "{json}");

        let mut info = info;
        info.api = ExecutorApi::MesosV1;
        info.command.uris.push(FetchUri {
            value: "/srv/x".into(),
            executable: true,
            extract: false,
            output_file: None,
        });
        let json = serde_json::to_string(&info).unwrap();
        assert!(json.contains(r#""api":"MESOS_V1""#), "{json}");
        assert!(
            json.contains(r#""uris":[{"value":"/srv/x","executable":true,"extract":false}]"#),
            "{json}"
        );
        assert_eq!(serde_json::from_str::<ExecutorInfo>(&json).unwrap(), info);
        let command: CommandInfo =
            serde_json::from_str(r#"{"value":"./x","uris":[{"value":"/srv/x"}]}"#).unwrap();
        assert!(command.uris[0].extract && command.shell);
    }

    #[test]
    fn mesos_durations() {
        use crate::env::mesos_duration;
        use std::time::Duration;
        assert_eq!(mesos_duration(Duration::from_secs(5)), "5secs");
        assert_eq!(mesos_duration(Duration::from_millis(250)), "250ms");
        assert_eq!(mesos_duration(Duration::from_millis(1500)), "1500ms");
    }
}
