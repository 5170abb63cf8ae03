//! The operator's network configurations: the `.conf`, `.conflist` and
//! `.json` files of `--network-cni-config-dir`, each naming one network
//! (CNI specification 1.0.0, "Network configuration format").
//!
//! A file holds either a configuration list (`name`, `cniVersion`,
//! `plugins`: the plugins run in order) or, as older runtimes took, one
//! plugin's configuration (`name`, `cniVersion`, `type`), read as a list
//! of that one plugin. Each plugin's object is kept as written and handed
//! to the plugin with only the fields the specification has the runtime
//! add (`name`, `cniVersion`, `prevResult`, `runtimeConfig`, and Mesos's
//! `args."org.apache.mesos"`).
//!
//! Checked when loaded, so that a mistake shows at start and not at a
//! task's launch: the file is a JSON object of either shape; the network
//! name is CNI's (a letter or digit, then letters, digits, `_`, `.`,
//! `-`) and no other file names the same network; the version is one the
//! caller speaks (0.3.0, 0.3.1, 0.4.0, 1.0.0); each plugin (and its
//! `ipam` plugin) is a program in the plugins directory; no plugin sets
//! `args."org.apache.mesos"`, which Mesos reserves for the `NetworkInfo`
//! it passes. Each error names its file.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde_json::Value;

/// The CNI versions this caller speaks (the results of 0.1.0 and 0.2.0
/// have another shape; 1.1.0 adds operations it does not make).
pub const SUPPORTED_VERSIONS: [&str; 4] = ["0.3.0", "0.3.1", "0.4.0", "1.0.0"];

/// The file name endings read from the configuration directory.
const EXTENSIONS: [&str; 3] = ["conf", "conflist", "json"];

/// The key Mesos reserves in a plugin's `args`.
pub(crate) const MESOS_ARGS_KEY: &str = "org.apache.mesos";

/// One network, as configured.
#[derive(Debug, Clone, PartialEq)]
pub struct NetworkConf {
    /// Its name (what `NetworkInfo.name` picks).
    pub name: String,
    /// The CNI version its plugins are spoken to in.
    pub cni_version: String,
    /// The file it was read from.
    pub file: PathBuf,
    /// `disableCheck`: `CHECK` must not be run.
    pub disable_check: bool,
    /// Each plugin's configuration object, in order.
    pub(crate) plugins: Vec<Value>,
}

/// Why the configurations could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The directory could not be read.
    #[error("network configuration directory '{dir}': {error}")]
    Dir {
        /// The directory.
        dir: PathBuf,
        /// The error.
        error: std::io::Error,
    },
    /// A file is not a valid network configuration.
    #[error("network configuration '{file}': {reason}")]
    Invalid {
        /// The file.
        file: PathBuf,
        /// What is wrong.
        reason: String,
    },
    /// Two files name the same network.
    #[error("network '{name}' is configured twice: in '{first}' and in '{second}'")]
    Duplicate {
        /// The network.
        name: String,
        /// The file read first.
        first: PathBuf,
        /// The other.
        second: PathBuf,
    },
}

// === impl NetworkConf ===

impl NetworkConf {
    /// Its plugins' types (their programs' names), in order.
    pub fn plugin_types(&self) -> Vec<&str> {
        self.plugins
            .iter()
            .filter_map(|p| p.get("type").and_then(Value::as_str))
            .collect()
    }

    /// Whether any plugin declares `capability` (e.g. `portMappings`).
    pub fn has_capability(&self, capability: &str) -> bool {
        self.plugins
            .iter()
            .any(|p| plugin_has_capability(p, capability))
    }

    /// Reads one file's content.
    pub(crate) fn parse(file: &Path, bytes: &[u8]) -> Result<NetworkConf, String> {
        let value: Value =
            serde_json::from_slice(bytes).map_err(|e| format!("not valid JSON: {e}"))?;
        let Value::Object(object) = value else {
            return Err("not a JSON object".into());
        };
        let string = |key: &str| -> Result<String, String> {
            match object.get(key) {
                Some(Value::String(s)) => Ok(s.clone()),
                Some(_) => Err(format!("'{key}' must be a string")),
                None => Err(format!("'{key}' is missing")),
            }
        };
        let name = string("name")?;
        check_network_name(&name)?;
        let cni_version = string("cniVersion")?;
        if !SUPPORTED_VERSIONS.contains(&cni_version.as_str()) {
            return Err(format!(
                "cniVersion '{cni_version}' is not one Agora speaks ({})",
                SUPPORTED_VERSIONS.join(", ")
            ));
        }
        let disable_check = match object.get("disableCheck") {
            None => false,
            Some(Value::Bool(b)) => *b,
            Some(Value::String(s)) if s == "true" || s == "false" => s == "true",
            Some(_) => return Err("'disableCheck' must be true or false".into()),
        };
        let plugins = match object.get("plugins") {
            Some(Value::Array(plugins)) if plugins.is_empty() => {
                return Err("'plugins' is empty".into())
            }
            Some(Value::Array(plugins)) => plugins.clone(),
            Some(_) => return Err("'plugins' must be a list".into()),
            None if object.contains_key("type") => vec![Value::Object(object.clone())],
            None => return Err("neither 'plugins' (a list) nor 'type' (one plugin)".into()),
        };
        for (i, plugin) in plugins.iter().enumerate() {
            let which = format!("plugin {} of {}", i + 1, plugins.len());
            let Some(p) = plugin.as_object() else {
                return Err(format!("{which} is not a JSON object"));
            };
            let ty = match p.get("type") {
                Some(Value::String(t)) => t,
                _ => return Err(format!("{which} has no 'type' (its program's name)")),
            };
            check_program_name(ty).map_err(|e| format!("{which}: {e}"))?;
            if let Some(ipam) = p.get("ipam") {
                match ipam.get("type") {
                    Some(Value::String(t)) => {
                        check_program_name(t).map_err(|e| format!("{which}'s ipam: {e}"))?
                    }
                    _ => return Err(format!("{which}'s 'ipam' has no 'type'")),
                }
            }
            match p.get("args") {
                None => {}
                Some(Value::Object(args)) if args.contains_key(MESOS_ARGS_KEY) => {
                    return Err(format!(
                        "{which} sets args.\"{MESOS_ARGS_KEY}\", which is reserved for the \
                         NetworkInfo the agent passes"
                    ))
                }
                Some(Value::Object(_)) => {}
                Some(_) => return Err(format!("{which}'s 'args' must be an object")),
            }
            if let Some(caps) = p.get("capabilities") {
                let ok = caps
                    .as_object()
                    .is_some_and(|c| c.values().all(Value::is_boolean));
                if !ok {
                    return Err(format!(
                        "{which}'s 'capabilities' must map names to true or false"
                    ));
                }
            }
        }
        Ok(NetworkConf {
            name,
            cni_version,
            file: file.to_path_buf(),
            disable_check,
            plugins,
        })
    }

    /// The programs it runs (plugins and IPAM plugins), each once.
    pub(crate) fn programs(&self) -> Vec<String> {
        let mut programs: Vec<String> = Vec::new();
        for p in &self.plugins {
            let ipam = p.get("ipam").and_then(|i| i.get("type"));
            for t in [p.get("type"), ipam].into_iter().flatten() {
                if let Some(t) = t.as_str() {
                    if !programs.iter().any(|x| x == t) {
                        programs.push(t.to_string());
                    }
                }
            }
        }
        programs
    }
}

pub(crate) fn plugin_has_capability(plugin: &Value, capability: &str) -> bool {
    plugin
        .get("capabilities")
        .and_then(|c| c.get(capability))
        .and_then(Value::as_bool)
        .unwrap_or(false)
}

/// Reads every configuration in `dir` (files in name order) and checks
/// that each plugin is a program of `plugins_dir`.
pub(crate) fn load_dir(
    dir: &Path,
    plugins_dir: &Path,
) -> Result<BTreeMap<String, NetworkConf>, ConfigError> {
    let dir_error = |error| ConfigError::Dir {
        dir: dir.to_path_buf(),
        error,
    };
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .map_err(dir_error)?
        .collect::<Result<Vec<_>, _>>()
        .map_err(dir_error)?
        .into_iter()
        .map(|e| e.path())
        .filter(|p| {
            p.extension()
                .and_then(|e| e.to_str())
                .is_some_and(|e| EXTENSIONS.contains(&e))
        })
        .collect();
    files.sort();
    let mut networks: BTreeMap<String, NetworkConf> = BTreeMap::new();
    for file in files {
        let invalid = |reason: String| ConfigError::Invalid {
            file: file.clone(),
            reason,
        };
        let bytes = std::fs::read(&file).map_err(|e| invalid(format!("cannot be read: {e}")))?;
        let conf = NetworkConf::parse(&file, &bytes).map_err(invalid)?;
        for program in conf.programs() {
            let path = plugins_dir.join(&program);
            if !is_executable(&path) {
                return Err(invalid(format!(
                    "plugin '{program}' is not a program in the plugins directory '{}'",
                    plugins_dir.display()
                )));
            }
        }
        if let Some(first) = networks.get(&conf.name) {
            return Err(ConfigError::Duplicate {
                name: conf.name.clone(),
                first: first.file.clone(),
                second: file,
            });
        }
        networks.insert(conf.name.clone(), conf);
    }
    Ok(networks)
}

/// CNI's rule for network names (and container ids): a letter or digit,
/// then letters, digits, `_`, `.` or `-`.
pub(crate) fn is_cni_name(s: &str) -> bool {
    let mut chars = s.chars();
    chars.next().is_some_and(|c| c.is_ascii_alphanumeric())
        && chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-'))
}

fn check_network_name(name: &str) -> Result<(), String> {
    if is_cni_name(name) {
        Ok(())
    } else {
        Err(format!(
            "network name '{name}' must be a letter or digit followed by letters, digits, \
             '_', '.' or '-'"
        ))
    }
}

fn check_program_name(name: &str) -> Result<(), String> {
    if name.is_empty() || name.contains('/') || name == "." || name == ".." {
        Err(format!(
            "'{name}' is not a plugin name (a file name in the plugins directory)"
        ))
    } else {
        Ok(())
    }
}

fn is_executable(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(path).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

/// Whether a CNI version has `CHECK`, and `prevResult` on `DEL` (0.4.0
/// and later).
pub(crate) fn at_least_0_4(version: &str) -> bool {
    version_tuple(version) >= Some((0, 4, 0))
}

pub(crate) fn version_tuple(v: &str) -> Option<(u32, u32, u32)> {
    let mut parts = v.split('.').map(|p| p.parse::<u32>().ok());
    let t = (
        parts.next()??,
        parts.next()??,
        parts.next().unwrap_or(Some(0))?,
    );
    Some(t)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(json: &str) -> Result<NetworkConf, String> {
        NetworkConf::parse(Path::new("/x.conf"), json.as_bytes())
    }

    #[test]
    fn a_list_and_a_single_plugin_file_are_read() {
        let list = parse(
            r#"{"cniVersion":"1.0.0","name":"bridge-net","plugins":[
                {"type":"bridge","ipam":{"type":"host-local"}},
                {"type":"portmap","capabilities":{"portMappings":true}}]}"#,
        )
        .unwrap();
        assert_eq!(list.plugin_types(), vec!["bridge", "portmap"]);
        assert_eq!(list.programs(), vec!["bridge", "host-local", "portmap"]);
        assert!(list.has_capability("portMappings"));
        assert!(at_least_0_4(&list.cni_version));
        let single = parse(r#"{"cniVersion":"0.3.1","name":"n1","type":"bridge"}"#).unwrap();
        assert_eq!(single.plugin_types(), vec!["bridge"]);
        assert!(!single.has_capability("portMappings"));
        assert!(!at_least_0_4(&single.cni_version));
    }

    #[test]
    fn bad_configurations_are_refused_saying_why() {
        let cases = [
            ("[]", "not a JSON object"),
            ("{", "not valid JSON"),
            (
                r#"{"cniVersion":"1.0.0","type":"bridge"}"#,
                "'name' is missing",
            ),
            (
                r#"{"cniVersion":"1.0.0","name":"a b","type":"bridge"}"#,
                "network name 'a b'",
            ),
            (
                r#"{"cniVersion":"0.2.0","name":"n","type":"bridge"}"#,
                "cniVersion '0.2.0'",
            ),
            (r#"{"cniVersion":"1.0.0","name":"n"}"#, "neither 'plugins'"),
            (
                r#"{"cniVersion":"1.0.0","name":"n","plugins":[]}"#,
                "'plugins' is empty",
            ),
            (
                r#"{"cniVersion":"1.0.0","name":"n","plugins":[{}]}"#,
                "plugin 1 of 1 has no 'type'",
            ),
            (
                r#"{"cniVersion":"1.0.0","name":"n","type":"../bin/sh"}"#,
                "not a plugin name",
            ),
            (
                r#"{"cniVersion":"1.0.0","name":"n","type":"bridge","ipam":{}}"#,
                "'ipam' has no 'type'",
            ),
            (
                r#"{"cniVersion":"1.0.0","name":"n","type":"bridge","args":{"org.apache.mesos":{}}}"#,
                "reserved",
            ),
            (
                r#"{"cniVersion":"1.0.0","name":"n","type":"portmap","capabilities":{"portMappings":1}}"#,
                "'capabilities'",
            ),
        ];
        for (json, want) in cases {
            let err = parse(json).unwrap_err();
            assert!(err.contains(want), "{json}: {err}");
        }
    }

    #[test]
    fn versions_compare_as_numbers() {
        assert!(version_tuple("0.10.0") > version_tuple("0.4.0"));
        assert_eq!(version_tuple("1.0"), Some((1, 0, 0)));
        assert_eq!(version_tuple("x"), None);
    }
}
