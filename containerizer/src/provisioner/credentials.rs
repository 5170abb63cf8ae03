//! Registry credentials from Docker's `config.json` (`--docker-config`).
//!
//! Each entry of `auths` is keyed by a registry (`host:port`,
//! `https://host/v1/`, ...) and holds `auth` (base64 of `user:password`)
//! or `username` and `password` (basic credentials, also used to get a
//! registry bearer token when the registry asks for one), or
//! `registrytoken` (a bearer token sent as is). Settings that would change
//! how images are pulled but that Agora does not carry out (credential
//! helpers, `identitytoken`, extra HTTP headers, proxies) are refused by
//! name rather than ignored.

use std::collections::HashMap;
use std::path::Path;

use base64::Engine;
use oci_client::secrets::RegistryAuth;
use serde::Deserialize;

/// Credentials by registry host.
#[derive(Default)]
pub(crate) struct Credentials {
    by_host: HashMap<String, Credential>,
}

#[derive(Clone)]
enum Credential {
    Basic { username: String, password: String },
    Token(String),
}

#[derive(Deserialize)]
struct DockerConfig {
    #[serde(default)]
    auths: HashMap<String, AuthEntry>,
    #[serde(rename = "credsStore")]
    creds_store: Option<serde_json::Value>,
    #[serde(rename = "credHelpers")]
    cred_helpers: Option<serde_json::Value>,
    #[serde(rename = "HttpHeaders")]
    http_headers: Option<serde_json::Value>,
    proxies: Option<serde_json::Value>,
}

#[derive(Deserialize)]
struct AuthEntry {
    auth: Option<String>,
    username: Option<String>,
    password: Option<String>,
    identitytoken: Option<String>,
    registrytoken: Option<String>,
}

/// Names under which Docker Hub's credentials may be filed.
const DOCKER_HUB: [&str; 4] = [
    "docker.io",
    "index.docker.io",
    "registry-1.docker.io",
    "registry.hub.docker.com",
];

// === impl Credentials ===

impl Credentials {
    /// Reads `path`; the error says what is wrong with it.
    pub fn load(path: &Path) -> Result<Credentials, String> {
        let text = std::fs::read(path).map_err(|e| format!("cannot read it: {e}"))?;
        Credentials::parse(&text)
    }

    fn parse(text: &[u8]) -> Result<Credentials, String> {
        let config: DockerConfig =
            serde_json::from_slice(text).map_err(|e| format!("not Docker's config.json: {e}"))?;
        for (name, present) in [
            (
                "credsStore (credential helpers)",
                config.creds_store.is_some(),
            ),
            (
                "credHelpers (credential helpers)",
                config.cred_helpers.is_some(),
            ),
            ("HttpHeaders", config.http_headers.is_some()),
            ("proxies", config.proxies.is_some()),
        ] {
            if present {
                return Err(format!(
                    "{name} is not supported: put the credentials in \"auths\""
                ));
            }
        }
        let mut by_host = HashMap::new();
        for (key, entry) in config.auths {
            let host = host_of(&key);
            if entry.identitytoken.is_some() {
                return Err(format!(
                    "auths[{key:?}]: identitytoken (OAuth refresh tokens) is not supported: \
                     give username and password, or registrytoken"
                ));
            }
            let credential = if let Some(token) = entry.registrytoken {
                Credential::Token(token)
            } else if let Some(auth) = entry.auth.filter(|a| !a.is_empty()) {
                let decoded = base64::engine::general_purpose::STANDARD
                    .decode(auth.trim())
                    .map_err(|e| format!("auths[{key:?}].auth is not base64: {e}"))?;
                let decoded = String::from_utf8(decoded)
                    .map_err(|_| format!("auths[{key:?}].auth is not UTF-8"))?;
                let (username, password) = decoded
                    .split_once(':')
                    .ok_or_else(|| format!("auths[{key:?}].auth is not base64 of user:password"))?;
                Credential::Basic {
                    username: username.to_string(),
                    password: password.to_string(),
                }
            } else if let (Some(username), Some(password)) = (entry.username, entry.password) {
                Credential::Basic { username, password }
            } else {
                return Err(format!(
                    "auths[{key:?}] has no credentials (auth, username and password, or registrytoken)"
                ));
            };
            by_host.insert(host, credential);
        }
        Ok(Credentials { by_host })
    }

    /// The credentials for `host` (`HOST[:PORT]`), or anonymous access.
    pub fn for_host(&self, host: &str) -> RegistryAuth {
        let found = self.by_host.get(host).or_else(|| {
            DOCKER_HUB
                .contains(&host)
                .then(|| DOCKER_HUB.iter().find_map(|h| self.by_host.get(*h)))
                .flatten()
        });
        match found {
            Some(Credential::Basic { username, password }) => {
                RegistryAuth::Basic(username.clone(), password.clone())
            }
            Some(Credential::Token(token)) => RegistryAuth::Bearer(token.clone()),
            None => RegistryAuth::Anonymous,
        }
    }
}

/// `https://host:port/v1/` → `host:port`.
fn host_of(key: &str) -> String {
    let rest = key
        .strip_prefix("https://")
        .or_else(|| key.strip_prefix("http://"))
        .unwrap_or(key);
    rest.split('/').next().unwrap_or(rest).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn auths_give_basic_credentials_or_tokens_by_host() {
        let creds = Credentials::parse(
            br#"{"auths": {
                "https://index.docker.io/v1/": {"auth": "dXNlcjpwYTpzcw=="},
                "127.0.0.1:5000": {"username": "u", "password": "p"},
                "http://tok.example:443/v2/": {"registrytoken": "abc"}
            }, "psFormat": "table"}"#,
        )
        .unwrap();
        match creds.for_host("registry-1.docker.io") {
            RegistryAuth::Basic(u, p) => assert_eq!((u.as_str(), p.as_str()), ("user", "pa:ss")),
            other => panic!("{other:?}"),
        }
        assert!(matches!(
            creds.for_host("127.0.0.1:5000"),
            RegistryAuth::Basic(..)
        ));
        assert!(matches!(creds.for_host("tok.example:443"), RegistryAuth::Bearer(t) if t == "abc"));
        assert!(matches!(creds.for_host("other:1"), RegistryAuth::Anonymous));
    }

    #[test]
    fn what_agora_cannot_use_is_refused_by_name() {
        for (text, named) in [
            (r#"{"credsStore": "desktop"}"#, "credsStore"),
            (r#"{"credHelpers": {"x": "y"}}"#, "credHelpers"),
            (
                r#"{"auths": {"h": {"identitytoken": "t"}}}"#,
                "identitytoken",
            ),
            (r#"{"auths": {"h": {"auth": "!!"}}}"#, "base64"),
            (r#"{"auths": {"h": {"email": "a@b"}}}"#, "no credentials"),
            ("[]", "config.json"),
        ] {
            let err = Credentials::parse(text.as_bytes()).err().unwrap();
            assert!(err.contains(named), "{text}: {err}");
        }
    }
}
