//! Calling one CNI plugin (the CNI specification 1.0.0, "Execution
//! protocol"): the operation and its parameters in `CNI_*` environment
//! variables, the network configuration on standard input, a result or
//! the specification's error object on standard output. Also the result
//! types, which a runtime reads back from `ADD` (versions 0.3.0 to 1.0.0
//! share their shape; 0.3.x and 0.4.0 add a `version` to each IP, which
//! is ignored).

use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::io::AsyncWriteExt;

/// The largest output read from a plugin (a result is a few KiB).
const MAX_OUTPUT: usize = 1 << 20;

/// A CNI operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Command {
    /// Attach the container to the network.
    Add,
    /// Detach it (plugins tolerate resources already gone).
    Del,
    /// Check that the attachment is as `ADD` left it.
    Check,
    /// Report the specification versions the plugin supports.
    Version,
}

/// What a plugin is called with, beside its configuration.
#[derive(Debug, Clone)]
pub(crate) struct Invocation<'a> {
    pub command: Command,
    pub container_id: &'a str,
    /// Empty for a `DEL` of a namespace that is gone.
    pub netns: &'a str,
    pub ifname: &'a str,
    pub plugins_dir: &'a Path,
    pub timeout: Duration,
}

/// The result of a successful `ADD` (`CHECK` and `DEL` return none).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CniResult {
    /// The version the result is written in (the configuration's).
    #[serde(default)]
    pub cni_version: String,
    /// Interfaces made, on the host and in the container.
    #[serde(default)]
    pub interfaces: Vec<Interface>,
    /// Addresses given.
    #[serde(default)]
    pub ips: Vec<IpConfig>,
    /// Routes in the container.
    #[serde(default)]
    pub routes: Vec<serde_json::Value>,
    /// The network's DNS settings, if a plugin knows them.
    #[serde(default)]
    pub dns: Dns,
}

/// One interface of a result.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Interface {
    /// Its name (`eth0`, a host-side `veth...`, the bridge).
    pub name: String,
    /// Its hardware address.
    #[serde(default)]
    pub mac: String,
    /// The network namespace it is in; empty: the host's.
    #[serde(default)]
    pub sandbox: String,
}

/// One address of a result.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct IpConfig {
    /// The address with its prefix length (`10.88.0.2/24`).
    pub address: String,
    /// The subnet's gateway.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gateway: Option<String>,
    /// The index in `interfaces` of the interface it is on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub interface: Option<usize>,
}

/// DNS settings (a result's, or a configuration's).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Dns {
    /// Name servers, in order of preference.
    #[serde(default)]
    pub nameservers: Vec<String>,
    /// The local domain.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub domain: Option<String>,
    /// Search domains.
    #[serde(default)]
    pub search: Vec<String>,
    /// Resolver options.
    #[serde(default)]
    pub options: Vec<String>,
}

/// Why a plugin call failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PluginError {
    /// The plugin reported an error (the specification's error object).
    #[error("error {code} ({}): {msg}{}", code_meaning(*code), details_suffix(details))]
    Reported {
        /// The specification's code (1-99) or the plugin's own (100+).
        code: u32,
        /// Its message.
        msg: String,
        /// Its details.
        details: String,
    },
    /// The plugin could not be started.
    #[error("cannot run '{path}': {error}")]
    Exec {
        /// The plugin's path.
        path: PathBuf,
        /// The error.
        error: String,
    },
    /// The plugin did not finish in time (it was killed).
    #[error("no answer within {0:?} (killed)")]
    Timeout(Duration),
    /// The plugin failed without the error object, or answered with
    /// something that is not a result.
    #[error("{0}")]
    BadOutput(String),
}

// === impl Command ===

impl Command {
    /// Its `CNI_COMMAND` value.
    pub fn as_str(self) -> &'static str {
        match self {
            Command::Add => "ADD",
            Command::Del => "DEL",
            Command::Check => "CHECK",
            Command::Version => "VERSION",
        }
    }
}

impl std::fmt::Display for Command {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

// === impl CniResult ===

impl CniResult {
    /// The addresses on the container's interfaces (those in `netns`;
    /// an address that names no interface counts as the container's).
    pub fn container_ips(&self, netns: &str) -> Vec<IpAddr> {
        self.ips
            .iter()
            .filter(|ip| match ip.interface {
                Some(i) => self
                    .interfaces
                    .get(i)
                    .is_some_and(|iface| iface.sandbox == netns),
                None => true,
            })
            .filter_map(|ip| ip.ip())
            .collect()
    }
}

// === impl IpConfig ===

impl IpConfig {
    /// The address without its prefix length.
    pub fn ip(&self) -> Option<IpAddr> {
        let addr = self.address.split('/').next()?;
        addr.parse().ok()
    }
}

// === impl Dns ===

impl Dns {
    /// Whether it says nothing.
    pub fn is_empty(&self) -> bool {
        self.nameservers.is_empty()
            && self.domain.as_deref().unwrap_or_default().is_empty()
            && self.search.is_empty()
            && self.options.is_empty()
    }
}

/// Runs the plugin `plugin` (a file of `plugins_dir`) with `config` on
/// standard input. Returns what it wrote on standard output when it
/// succeeded (empty for `DEL` and `CHECK`).
pub(crate) async fn invoke(
    plugin: &str,
    config: &serde_json::Value,
    call: &Invocation<'_>,
) -> Result<Vec<u8>, PluginError> {
    let path = call.plugins_dir.join(plugin);
    let stdin = serde_json::to_vec(config).map_err(|e| PluginError::BadOutput(e.to_string()))?;
    let mut command = tokio::process::Command::new(&path);
    // The plugins run iptables and friends from PATH: the environment is
    // the caller's plus CNI's variables.
    command
        .env("CNI_COMMAND", call.command.as_str())
        .env("CNI_CONTAINERID", call.container_id)
        .env("CNI_NETNS", call.netns)
        .env("CNI_IFNAME", call.ifname)
        .env("CNI_ARGS", "")
        .env("CNI_PATH", call.plugins_dir)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    if call.command == Command::Version {
        command
            .env_remove("CNI_CONTAINERID")
            .env_remove("CNI_NETNS")
            .env_remove("CNI_IFNAME");
    }
    let mut child = command.spawn().map_err(|error| PluginError::Exec {
        path: path.clone(),
        error: error.to_string(),
    })?;
    let mut input = child.stdin.take();
    let run = async move {
        if let Some(input) = input.as_mut() {
            // A plugin that exits without reading its input is judged by
            // its exit status, not by the broken pipe.
            let _ = input.write_all(&stdin).await;
        }
        drop(input);
        child.wait_with_output().await
    };
    let output = match tokio::time::timeout(call.timeout, run).await {
        Err(_) => return Err(PluginError::Timeout(call.timeout)),
        Ok(Err(error)) => {
            return Err(PluginError::Exec {
                path,
                error: error.to_string(),
            })
        }
        Ok(Ok(output)) => output,
    };
    let stdout = &output.stdout[..output.stdout.len().min(MAX_OUTPUT)];
    if output.status.success() {
        return Ok(stdout.to_vec());
    }
    #[derive(Deserialize)]
    struct ErrorObject {
        code: u32,
        #[serde(default)]
        msg: String,
        #[serde(default)]
        details: String,
    }
    if let Ok(e) = serde_json::from_slice::<ErrorObject>(stdout) {
        return Err(PluginError::Reported {
            code: e.code,
            msg: e.msg,
            details: e.details,
        });
    }
    let text = |bytes: &[u8]| {
        let s = String::from_utf8_lossy(bytes);
        let s = s.trim();
        s[s.len().saturating_sub(2048)..].replace('\n', "; ")
    };
    let stderr = text(&output.stderr);
    let stdout = text(stdout);
    let said = [stdout, stderr]
        .into_iter()
        .filter(|s| !s.is_empty())
        .collect::<Vec<_>>()
        .join("; ");
    Err(PluginError::BadOutput(format!(
        "{} without an error object{}",
        output.status,
        if said.is_empty() {
            String::new()
        } else {
            format!(": {said}")
        }
    )))
}

/// Reads an `ADD` answer as a result.
pub(crate) fn parse_result(stdout: &[u8]) -> Result<CniResult, PluginError> {
    serde_json::from_slice(stdout).map_err(|e| {
        PluginError::BadOutput(format!(
            "the result is not CNI's result object ({e}): {}",
            String::from_utf8_lossy(&stdout[..stdout.len().min(512)])
        ))
    })
}

/// The specification's meaning of a well-known error code.
fn code_meaning(code: u32) -> &'static str {
    match code {
        1 => "incompatible CNI version",
        2 => "unsupported field in network configuration",
        3 => "container unknown or does not exist",
        4 => "invalid necessary environment variables",
        5 => "I/O failure",
        6 => "failed to decode content",
        7 => "invalid network config",
        11 => "try again later",
        _ => "plugin-specific",
    }
}

fn details_suffix(details: &str) -> String {
    if details.is_empty() {
        String::new()
    } else {
        format!(" ({details})")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn results_of_1_0_and_0_4_are_read_and_the_containers_ips_found() {
        let v1 = br#"{"cniVersion":"1.0.0","interfaces":[{"name":"cni0","mac":"aa"},
            {"name":"veth1","mac":"bb"},{"name":"eth0","mac":"cc","sandbox":"/run/ns/c1"}],
            "ips":[{"interface":2,"address":"10.88.0.2/24","gateway":"10.88.0.1"},
            {"interface":0,"address":"10.88.0.1/24"},
            {"interface":2,"address":"fd00:88::2/64"}],
            "routes":[{"dst":"0.0.0.0/0"}],"dns":{}}"#;
        let r = parse_result(v1).unwrap();
        assert_eq!(
            r.container_ips("/run/ns/c1"),
            vec![
                "10.88.0.2".parse::<IpAddr>().unwrap(),
                "fd00:88::2".parse().unwrap()
            ]
        );
        assert!(r.dns.is_empty());
        let v04 = br#"{"cniVersion":"0.4.0","interfaces":[{"name":"eth0","sandbox":"/n"}],
            "ips":[{"version":"4","interface":0,"address":"10.1.0.5/16"}],
            "dns":{"nameservers":["10.1.0.1"],"search":["svc.local"]}}"#;
        let r = parse_result(v04).unwrap();
        assert_eq!(
            r.container_ips("/n"),
            vec!["10.1.0.5".parse::<IpAddr>().unwrap()]
        );
        assert_eq!(r.dns.nameservers, vec!["10.1.0.1"]);
        assert!(parse_result(b"not json").is_err());
    }

    #[test]
    fn an_error_object_reads_with_the_meaning_of_its_code() {
        let e = PluginError::Reported {
            code: 7,
            msg: "bad subnet".into(),
            details: "10.0.0.0/33".into(),
        };
        assert_eq!(
            e.to_string(),
            "error 7 (invalid network config): bad subnet (10.0.0.0/33)"
        );
    }
}
