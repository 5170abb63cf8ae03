//! Principals and secrets: the master's `--credentials` file and the
//! `Authorization` header clients send: `Basic base64(principal:secret)`,
//! or `Bearer SECRET` (a token standing for the principal whose secret it
//! is, as static API tokens do).
//!
//! The file is Mesos's JSON credentials format,
//! `{"credentials": [{"principal": "p", "secret": "s"}, …]}`, or its text
//! format, one `principal secret` pair per line (blank lines and `#`
//! comments skipped). Secrets are compared in constant time, and an
//! unknown principal costs the same comparison as a known one, so the
//! time of an answer tells nothing about either.

use std::path::Path;

use base64::Engine as _;
use serde::Deserialize;

/// One principal and its secret.
#[derive(Clone, PartialEq, Eq, Deserialize)]
pub struct Credential {
    /// Who.
    pub principal: String,
    /// The shared secret.
    pub secret: String,
}

impl std::fmt::Debug for Credential {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Credential")
            .field("principal", &self.principal)
            .field("secret", &"<redacted>")
            .finish()
    }
}

/// The credentials a master accepts.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Credentials {
    credentials: Vec<Credential>,
}

/// Why a credentials file or an `Authorization` header is refused.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum CredentialsError {
    /// The file cannot be read or parsed.
    #[error("credentials file {path}: {reason}")]
    File {
        /// The file.
        path: String,
        /// What is wrong.
        reason: String,
    },
    /// No `Authorization` header.
    #[error("authentication required: send Authorization: Basic with a principal and secret, or Bearer with a token")]
    Missing,
    /// The header is neither `Basic base64(principal:secret)` nor
    /// `Bearer TOKEN`.
    #[error("malformed Authorization header (expected Basic credentials or a Bearer token)")]
    Malformed,
    /// Unknown principal or wrong secret (which of the two is not said).
    #[error("authentication failed: unknown principal or wrong secret")]
    Refused,
}

/// `Basic base64(principal:secret)`, the value of an `Authorization`
/// header.
pub fn basic_authorization(principal: &str, secret: &str) -> String {
    let token = base64::engine::general_purpose::STANDARD.encode(format!("{principal}:{secret}"));
    format!("Basic {token}")
}

/// The principal and secret of a `Basic` `Authorization` header value.
pub fn parse_basic_authorization(value: &str) -> Result<Credential, CredentialsError> {
    let (scheme, token) = value
        .trim()
        .split_once(' ')
        .ok_or(CredentialsError::Malformed)?;
    if !scheme.eq_ignore_ascii_case("basic") {
        return Err(CredentialsError::Malformed);
    }
    let decoded = base64::engine::general_purpose::STANDARD
        .decode(token.trim())
        .map_err(|_| CredentialsError::Malformed)?;
    let text = String::from_utf8(decoded).map_err(|_| CredentialsError::Malformed)?;
    let (principal, secret) = text.split_once(':').ok_or(CredentialsError::Malformed)?;
    Ok(Credential {
        principal: principal.to_string(),
        secret: secret.to_string(),
    })
}

/// The token of a `Bearer` `Authorization` header value.
pub fn bearer_token(value: &str) -> Option<&str> {
    let (scheme, token) = value.trim().split_once(' ')?;
    let token = token.trim();
    (scheme.eq_ignore_ascii_case("bearer") && !token.is_empty()).then_some(token)
}

impl Credential {
    /// The credential a client was given: `principal` (from a flag or
    /// `AGORA_PRINCIPAL`) with the secret in `secret_file` (trailing
    /// newline dropped) or else in `AGORA_SECRET`. `None` without a
    /// principal; an error when the secret cannot be had.
    pub fn from_flags(
        principal: Option<String>,
        secret_file: Option<&Path>,
    ) -> Result<Option<Credential>, String> {
        let Some(principal) = principal.filter(|p| !p.is_empty()) else {
            return match secret_file {
                Some(_) => Err("--secret-file needs --principal (or AGORA_PRINCIPAL)".into()),
                None => Ok(None),
            };
        };
        let secret = match (secret_file, std::env::var(crate::env::SECRET)) {
            (Some(path), _) => std::fs::read_to_string(path)
                .map_err(|e| format!("--secret-file {}: {e}", path.display()))?
                .trim_end_matches(['\n', '\r'])
                .to_string(),
            (None, Ok(secret)) => secret,
            (None, Err(_)) => {
                return Err(format!(
                    "--principal needs --secret-file or {}",
                    crate::env::SECRET
                ))
            }
        };
        if secret.is_empty() {
            return Err(format!("the secret of principal {principal:?} is empty"));
        }
        Ok(Some(Credential { principal, secret }))
    }

    /// This credential as an `Authorization: Basic` header value.
    pub fn authorization(&self) -> String {
        basic_authorization(&self.principal, &self.secret)
    }
}

/// Whether `a` and `b` are equal, in time that depends only on their
/// lengths.
pub fn secrets_equal(a: &[u8], b: &[u8]) -> bool {
    let mut diff = a.len() ^ b.len();
    for i in 0..a.len().max(b.len()) {
        let x = a.get(i).copied().unwrap_or(0);
        let y = b.get(i).copied().unwrap_or(0);
        diff |= usize::from(x ^ y);
    }
    std::hint::black_box(diff) == 0
}

impl Credentials {
    /// The credentials of `list`.
    pub fn new(list: Vec<Credential>) -> Credentials {
        Credentials { credentials: list }
    }

    /// Reads a credentials file (JSON or text, see the module
    /// documentation).
    pub fn load(path: &Path) -> Result<Credentials, CredentialsError> {
        let err = |reason: String| CredentialsError::File {
            path: path.display().to_string(),
            reason,
        };
        let text = std::fs::read_to_string(path).map_err(|e| err(e.to_string()))?;
        Credentials::parse(&text).map_err(err)
    }

    /// Parses a credentials file's text.
    pub fn parse(text: &str) -> Result<Credentials, String> {
        #[derive(Deserialize)]
        struct File {
            credentials: Vec<Credential>,
        }
        let list = if text.trim_start().starts_with('{') {
            serde_json::from_str::<File>(text)
                .map_err(|e| e.to_string())?
                .credentials
        } else {
            let mut list = Vec::new();
            for (n, line) in text.lines().enumerate() {
                let line = line.trim();
                if line.is_empty() || line.starts_with('#') {
                    continue;
                }
                let mut words = line.split_whitespace();
                match (words.next(), words.next(), words.next()) {
                    (Some(principal), Some(secret), None) => list.push(Credential {
                        principal: principal.into(),
                        secret: secret.into(),
                    }),
                    _ => return Err(format!("line {}: expected `principal secret`", n + 1)),
                }
            }
            list
        };
        if list.is_empty() {
            return Err("no credentials".into());
        }
        if let Some(c) = list
            .iter()
            .find(|c| c.principal.is_empty() || c.secret.is_empty() || c.principal.contains(':'))
        {
            return Err(format!(
                "principal {:?}: principals and secrets must be non-empty, principals without ':'",
                c.principal
            ));
        }
        Ok(Credentials::new(list))
    }

    /// The principal an `Authorization` header value (or its absence)
    /// authenticates.
    pub fn authenticate(&self, authorization: Option<&str>) -> Result<String, CredentialsError> {
        let value = authorization.ok_or(CredentialsError::Missing)?;
        if let Some(token) = bearer_token(value) {
            return self.token(token);
        }
        let given = parse_basic_authorization(value)?;
        self.check(&given.principal, &given.secret)?;
        Ok(given.principal)
    }

    /// The principal whose secret `token` is. Every secret is compared,
    /// so the time taken says nothing about which matched.
    pub fn token(&self, token: &str) -> Result<String, CredentialsError> {
        let mut found = None;
        for c in &self.credentials {
            if secrets_equal(c.secret.as_bytes(), token.as_bytes()) && found.is_none() {
                found = Some(c.principal.clone());
            }
        }
        found.ok_or(CredentialsError::Refused)
    }

    /// Whether `secret` is `principal`'s.
    pub fn check(&self, principal: &str, secret: &str) -> Result<(), CredentialsError> {
        let known = self.credentials.iter().find(|c| c.principal == principal);
        // An unknown principal is compared against a secret of its own
        // length, so it takes as long as a wrong secret.
        let expected = known.map_or(secret.as_bytes(), |c| c.secret.as_bytes());
        let equal = secrets_equal(expected, secret.as_bytes());
        if known.is_some() && equal {
            Ok(())
        } else {
            Err(CredentialsError::Refused)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_file_formats_parse_and_bad_ones_are_refused() {
        let json = r#"{"credentials":[{"principal":"web","secret":"s3cret"},{"principal":"agent","secret":"a"}]}"#;
        let text = "# comment\nweb s3cret\n\nagent a\n";
        assert_eq!(Credentials::parse(json), Credentials::parse(text));
        assert!(Credentials::parse(json)
            .unwrap()
            .check("web", "s3cret")
            .is_ok());
        for bad in ["", "{}", r#"{"credentials":[]}"#, "web", "a b c", "a:b c"] {
            assert!(Credentials::parse(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn basic_headers_authenticate_only_the_right_secret() {
        let creds = Credentials::parse("web s3cret\n").unwrap();
        let good = basic_authorization("web", "s3cret");
        assert_eq!(creds.authenticate(Some(&good)), Ok("web".into()));
        assert_eq!(
            creds.authenticate(Some(&basic_authorization("web", "s3cret!"))),
            Err(CredentialsError::Refused)
        );
        assert_eq!(
            creds.authenticate(Some(&basic_authorization("nobody", "s3cret"))),
            Err(CredentialsError::Refused)
        );
        assert_eq!(creds.authenticate(None), Err(CredentialsError::Missing));
        for bad in ["Token abc", "Basic !!!", "Basic", "Basic d2Vi"] {
            assert_eq!(
                creds.authenticate(Some(bad)),
                Err(CredentialsError::Malformed),
                "{bad}"
            );
        }
        // A secret may contain ':' (only the first separates).
        let creds = Credentials::parse("p a:b\n").unwrap();
        assert!(creds
            .authenticate(Some(&basic_authorization("p", "a:b")))
            .is_ok());
    }

    #[test]
    fn bearer_tokens_stand_for_the_principal_whose_secret_they_are() {
        let c = Credentials::parse("web s3cret\nops t0ken\n").unwrap();
        assert_eq!(c.authenticate(Some("Bearer t0ken")), Ok("ops".into()));
        assert_eq!(c.authenticate(Some("bearer  s3cret ")), Ok("web".into()));
        assert_eq!(
            c.authenticate(Some("Bearer nope")),
            Err(CredentialsError::Refused)
        );
        assert_eq!(
            c.authenticate(Some("Bearer ")),
            Err(CredentialsError::Malformed)
        );
        assert_eq!(bearer_token("Basic x"), None);
    }

    #[test]
    fn client_credentials_come_from_a_file_and_need_a_principal() {
        let dir = std::env::temp_dir().join(format!("agora-cred-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("secret");
        std::fs::write(&file, "s3cret\n").unwrap();
        let c = Credential::from_flags(Some("web".into()), Some(&file))
            .unwrap()
            .unwrap();
        assert_eq!((c.principal.as_str(), c.secret.as_str()), ("web", "s3cret"));
        assert_eq!(c.authorization(), basic_authorization("web", "s3cret"));
        assert_eq!(Credential::from_flags(None, None), Ok(None));
        assert!(Credential::from_flags(None, Some(&file)).is_err());
        let missing = dir.join("missing");
        assert!(Credential::from_flags(Some("web".into()), Some(&missing))
            .unwrap_err()
            .contains("missing"));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn secrets_compare_by_value_and_length() {
        assert!(secrets_equal(b"abc", b"abc"));
        assert!(!secrets_equal(b"abc", b"abd"));
        assert!(!secrets_equal(b"abc", b"abcd"));
        assert!(!secrets_equal(b"", b"a"));
        assert!(secrets_equal(b"", b""));
        let debug = format!(
            "{:?}",
            Credential {
                principal: "p".into(),
                secret: "hidden".into()
            }
        );
        assert!(!debug.contains("hidden"), "{debug}");
    }
}
