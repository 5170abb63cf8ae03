//! Executor identity: each executor run gets a token the agent signs
//! (JWT, HS256, with the agent's executor secret) naming its framework,
//! executor, run and agent. The agent checks it when the executor
//! subscribes (and, with `--authenticate-executors`, on every call of the
//! Mesos v1 executor API), so a process that can reach the agent cannot
//! pass for an executor it is not.
//!
//! The secret is `--executor-secret-key` if given, else 32 random bytes
//! the agent keeps in its work directory (mode 0600), so the tokens of
//! executors that outlive an agent restart stay valid.

use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

use jsonwebtoken::{Algorithm, DecodingKey, EncodingKey, Header, Validation};
use serde::{Deserialize, Serialize};

/// Where the generated secret is kept, under the work directory.
pub(crate) const SECRET_FILE: &str = "executor-secret-key";
/// The fewest bytes a secret may have (HS256's key is 256 bits).
pub(crate) const MIN_SECRET_BYTES: usize = 32;

/// What an executor token says.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Claims {
    /// Always `executor`.
    pub(crate) sub: String,
    /// Framework id.
    pub(crate) fid: String,
    /// Executor id.
    pub(crate) eid: String,
    /// Executor run (container) id.
    pub(crate) cid: String,
    /// Agent id.
    pub(crate) aid: String,
}

impl Claims {
    pub(crate) fn new(fid: &str, eid: &str, run: &str, agent: &str) -> Claims {
        Claims {
            sub: "executor".into(),
            fid: fid.into(),
            eid: eid.into(),
            cid: run.into(),
            aid: agent.into(),
        }
    }
}

/// Why a token is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum TokenError {
    /// Not a token this agent signed (malformed, another key, another
    /// algorithm, `alg: none`): `401`.
    #[error("invalid executor token: {0}")]
    Invalid(String),
    /// Signed here, for another executor or run: `403`.
    #[error("the executor token is for executor {eid} (run {cid}) of framework {fid}")]
    NotYours {
        fid: String,
        eid: String,
        cid: String,
    },
}

/// Signs and checks executor tokens.
pub(crate) struct ExecutorIdentity {
    encoding: EncodingKey,
    decoding: DecodingKey,
    validation: Validation,
}

impl std::fmt::Debug for ExecutorIdentity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ExecutorIdentity { .. }")
    }
}

impl ExecutorIdentity {
    pub(crate) fn new(secret: &[u8]) -> ExecutorIdentity {
        // HS256 only: a token naming any other algorithm (`none`
        // included) fails to decode. Tokens do not expire: they live as
        // long as their executor run, and a run's token names the run.
        let mut validation = Validation::new(Algorithm::HS256);
        validation.required_spec_claims.clear();
        validation.validate_exp = false;
        validation.validate_aud = false;
        ExecutorIdentity {
            encoding: EncodingKey::from_secret(secret),
            decoding: DecodingKey::from_secret(secret),
            validation,
        }
    }

    /// Reads the secret from `explicit`, or from the work directory's
    /// secret file, creating it (mode 0600) on the first start.
    pub(crate) fn load(explicit: Option<&Path>, work_dir: &Path) -> std::io::Result<Self> {
        let secret = match explicit {
            Some(path) => {
                let secret = std::fs::read(path)?;
                let secret = secret.trim_ascii().to_vec();
                if secret.len() < MIN_SECRET_BYTES {
                    return Err(std::io::Error::new(
                        std::io::ErrorKind::InvalidData,
                        format!(
                            "{} holds {} bytes; an executor secret key needs at least {MIN_SECRET_BYTES}",
                            path.display(),
                            secret.len()
                        ),
                    ));
                }
                secret
            }
            None => {
                let path = work_dir.join(SECRET_FILE);
                match std::fs::read(&path) {
                    Ok(secret) if secret.len() >= MIN_SECRET_BYTES => secret,
                    Ok(_) | Err(_) => {
                        let secret: [u8; 32] = rand::random();
                        let tmp = work_dir.join(format!("{SECRET_FILE}.tmp"));
                        let mut file = std::fs::OpenOptions::new()
                            .write(true)
                            .create(true)
                            .truncate(true)
                            .mode(0o600)
                            .open(&tmp)?;
                        file.write_all(&secret)?;
                        file.sync_all()?;
                        std::fs::rename(&tmp, &path)?;
                        secret.to_vec()
                    }
                }
            }
        };
        Ok(ExecutorIdentity::new(&secret))
    }

    /// The token for an executor run.
    pub(crate) fn issue(&self, claims: &Claims) -> String {
        jsonwebtoken::encode(&Header::new(Algorithm::HS256), claims, &self.encoding)
            .expect("HS256 signing of plain claims cannot fail")
    }

    /// The claims of a token this agent signed.
    pub(crate) fn verify(&self, token: &str) -> Result<Claims, TokenError> {
        jsonwebtoken::decode::<Claims>(token, &self.decoding, &self.validation)
            .map(|data| data.claims)
            .map_err(|e| TokenError::Invalid(e.to_string()))
    }

    /// Checks that `token` is this agent's for executor `eid` of
    /// framework `fid`, and for run `run` if given.
    pub(crate) fn check(
        &self,
        token: &str,
        fid: &str,
        eid: &str,
        run: Option<&str>,
    ) -> Result<Claims, TokenError> {
        let claims = self.verify(token)?;
        let mine = claims.sub == "executor"
            && claims.fid == fid
            && claims.eid == eid
            && run.is_none_or(|run| claims.cid == run);
        if mine {
            Ok(claims)
        } else {
            Err(TokenError::NotYours {
                fid: claims.fid,
                eid: claims.eid,
                cid: claims.cid,
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use base64::Engine as _;

    fn identity() -> ExecutorIdentity {
        ExecutorIdentity::new(&[7u8; 32])
    }

    #[test]
    fn a_token_names_its_run_and_verifies() {
        let id = identity();
        let claims = Claims::new("fw", "e1", "run-1", "agent-1");
        let token = id.issue(&claims);
        assert_eq!(token.split('.').count(), 3);
        assert_eq!(id.verify(&token), Ok(claims.clone()));
        assert_eq!(id.check(&token, "fw", "e1", Some("run-1")), Ok(claims));
    }

    #[test]
    fn another_executor_or_run_is_not_yours() {
        let id = identity();
        let token = id.issue(&Claims::new("fw", "e1", "run-1", "agent-1"));
        for (fid, eid, run) in [
            ("fw", "e2", Some("run-1")),
            ("other", "e1", Some("run-1")),
            ("fw", "e1", Some("run-2")),
        ] {
            assert!(matches!(
                id.check(&token, fid, eid, run),
                Err(TokenError::NotYours { .. })
            ));
        }
        assert!(id.check(&token, "fw", "e1", None).is_ok());
    }

    #[test]
    fn another_key_none_and_garbage_are_invalid() {
        let id = identity();
        let claims = Claims::new("fw", "e1", "run-1", "agent-1");
        let other = ExecutorIdentity::new(&[8u8; 32]).issue(&claims);
        assert!(matches!(id.verify(&other), Err(TokenError::Invalid(_))));
        let b64 = base64::engine::general_purpose::URL_SAFE_NO_PAD;
        let unsigned = format!(
            "{}.{}.",
            b64.encode(br#"{"alg":"none","typ":"JWT"}"#),
            b64.encode(serde_json::to_vec(&claims).unwrap())
        );
        assert!(matches!(id.verify(&unsigned), Err(TokenError::Invalid(_))));
        // The right signature over other claims.
        let token = id.issue(&claims);
        let parts: Vec<&str> = token.split('.').collect();
        let forged = format!(
            "{}.{}.{}",
            parts[0],
            b64.encode(serde_json::to_vec(&Claims::new("fw", "e2", "run-1", "agent-1")).unwrap()),
            parts[2]
        );
        assert!(matches!(id.verify(&forged), Err(TokenError::Invalid(_))));
        for junk in ["", "a.b.c", "Bearer x", &"x".repeat(10_000)] {
            assert!(matches!(id.verify(junk), Err(TokenError::Invalid(_))));
        }
    }

    #[test]
    fn the_generated_secret_is_kept_private_and_reused() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let first = ExecutorIdentity::load(None, dir.path()).unwrap();
        let path = dir.path().join(SECRET_FILE);
        let mode = std::fs::metadata(&path).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
        let token = first.issue(&Claims::new("fw", "e1", "r", "a"));
        let again = ExecutorIdentity::load(None, dir.path()).unwrap();
        assert!(
            again.verify(&token).is_ok(),
            "a restarted agent keeps its key"
        );
        let short = dir.path().join("short");
        std::fs::write(&short, "too short").unwrap();
        let error = ExecutorIdentity::load(Some(&short), dir.path()).unwrap_err();
        assert!(error.to_string().contains("at least 32"), "{error}");
    }
}
