//! URIs an agent fetches into an executor's sandbox before starting it
//! (Mesos's `CommandInfo.URI`), asked for with [`crate::env::FETCH_URIS`].

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
    fn mesos_durations() {
        use crate::env::mesos_duration;
        use std::time::Duration;
        assert_eq!(mesos_duration(Duration::from_secs(5)), "5secs");
        assert_eq!(mesos_duration(Duration::from_millis(250)), "250ms");
        assert_eq!(mesos_duration(Duration::from_millis(1500)), "1500ms");
    }
}
