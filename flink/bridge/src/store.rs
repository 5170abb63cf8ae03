//! Which worker store the bridge keeps: none (`memory`), a local file
//! (`file:PATH`), or etcd (`etcd://HOST:PORT/PREFIX`, fenced by an
//! election among the bridges of one Flink cluster).

use std::fmt;
use std::path::PathBuf;
use std::str::FromStr;

/// The `--store` choice.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StoreChoice {
    /// Nothing survives the JobManager: its TaskManagers are not recovered.
    Memory,
    /// A local file (one JobManager at a time holds its lock).
    File(PathBuf),
    /// etcd: the bridge first wins `PREFIX/leader`, and every write is
    /// fenced on that term.
    Etcd {
        /// `HOST:PORT`.
        endpoint: String,
        /// Key prefix.
        prefix: String,
    },
}

/// Why a `--store` value is not understood.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("store {0:?}: expected memory, file:PATH or etcd://HOST:PORT/PREFIX")]
pub struct BadStore(String);

impl FromStr for StoreChoice {
    type Err = BadStore;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let bad = || BadStore(text.to_string());
        if text == "memory" {
            return Ok(StoreChoice::Memory);
        }
        if let Some(path) = text.strip_prefix("file:") {
            let path = path.strip_prefix("//").unwrap_or(path);
            if path.is_empty() {
                return Err(bad());
            }
            return Ok(StoreChoice::File(PathBuf::from(path)));
        }
        if let Some(rest) = text.strip_prefix("etcd://") {
            let (endpoint, prefix) = rest.split_once('/').ok_or_else(bad)?;
            if endpoint.is_empty() || prefix.trim_matches('/').is_empty() {
                return Err(bad());
            }
            return Ok(StoreChoice::Etcd {
                endpoint: endpoint.to_string(),
                prefix: format!("/{}", prefix.trim_matches('/')),
            });
        }
        Err(bad())
    }
}

impl fmt::Display for StoreChoice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StoreChoice::Memory => f.write_str("memory"),
            StoreChoice::File(path) => write!(f, "file:{}", path.display()),
            StoreChoice::Etcd { endpoint, prefix } => write!(f, "etcd://{endpoint}{prefix}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn store_choices_parse() {
        assert_eq!("memory".parse(), Ok(StoreChoice::Memory));
        assert_eq!(
            "file:/var/lib/flink/workers".parse(),
            Ok(StoreChoice::File("/var/lib/flink/workers".into()))
        );
        assert_eq!(
            "file:///tmp/w".parse(),
            Ok(StoreChoice::File("/tmp/w".into()))
        );
        assert_eq!(
            "etcd://127.0.0.1:2379/flink/one/".parse(),
            Ok(StoreChoice::Etcd {
                endpoint: "127.0.0.1:2379".into(),
                prefix: "/flink/one".into()
            })
        );
        for bad in [
            "",
            "file:",
            "etcd://host",
            "etcd://host/",
            "zk://x/y",
            "Memory",
        ] {
            assert!(bad.parse::<StoreChoice>().is_err(), "{bad}");
        }
    }
}
