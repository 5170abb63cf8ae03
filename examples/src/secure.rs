//! A secured cluster for the benchmarks' `--security secure` runs and for
//! tests: mutual TLS with a throwaway CA (every process presents a
//! certificate it signed) and one principal that frameworks, agents and
//! operators authenticate as.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use agora_net::tls::rustls::ClientConfig;
use agora_net::{LocalPki, TlsOptions};
use agora_proto::Credential;
use agora_scheduler::DriverConfig;

/// The files and client settings of a secured cluster.
pub struct Secure {
    /// The credentials file the master reads.
    pub credentials: PathBuf,
    /// The file holding the principal's secret.
    pub secret_file: PathBuf,
    /// The principal and secret.
    pub credential: Credential,
    /// CA, certificate and key (for `localhost` and `127.0.0.1`).
    pub tls: TlsOptions,
    /// The client side of `tls`.
    pub client: Arc<ClientConfig>,
}

impl Secure {
    /// Makes the CA, certificate, credentials and secret under `dir`.
    pub fn create(dir: &Path) -> anyhow::Result<Secure> {
        std::fs::create_dir_all(dir)?;
        let tls = LocalPki::new("agora bench CA")?.write(
            &dir.join("tls"),
            "node",
            &["localhost", "127.0.0.1"],
        )?;
        let client = tls
            .client()?
            .ok_or_else(|| anyhow::anyhow!("no client TLS without a CA"))?;
        let credential = Credential {
            principal: "bench".into(),
            secret: random_hex()?,
        };
        let credentials = dir.join("credentials");
        std::fs::write(
            &credentials,
            format!("{} {}\n", credential.principal, credential.secret),
        )?;
        let secret_file = dir.join("secret");
        std::fs::write(&secret_file, &credential.secret)?;
        Ok(Secure {
            credentials,
            secret_file,
            credential,
            tls,
            client,
        })
    }

    fn tls_flags(&self) -> Vec<String> {
        let path = |p: &Option<PathBuf>| {
            p.as_ref()
                .map(|p| p.display().to_string())
                .unwrap_or_default()
        };
        vec![
            "--tls-cert".into(),
            path(&self.tls.cert),
            "--tls-key".into(),
            path(&self.tls.key),
            "--tls-ca".into(),
            path(&self.tls.ca),
        ]
    }

    /// `agora-master` flags: TLS with client certificates required, and
    /// authentication of frameworks, agents and operators.
    pub fn master_flags(&self) -> Vec<String> {
        let mut flags = self.tls_flags();
        flags.extend(
            [
                "--tls-require-client-cert",
                "--credentials",
                &self.credentials.display().to_string(),
                "--authenticate-frameworks",
                "--authenticate-agents",
                "--authenticate-http",
            ]
            .map(String::from),
        );
        flags
    }

    /// `agora-agent` flags: TLS, and the principal.
    pub fn agent_flags(&self) -> Vec<String> {
        let mut flags = self.tls_flags();
        flags.extend(
            [
                "--principal",
                &self.credential.principal,
                "--secret-file",
                &self.secret_file.display().to_string(),
            ]
            .map(String::from),
        );
        flags
    }

    /// A scheduler driver's TLS and credential.
    pub fn driver(&self, config: &mut DriverConfig) {
        config.credential = Some(self.credential.clone());
        config.tls = Some(self.client.clone());
    }

    /// A client of the master at `addr`, over TLS with the credential.
    pub fn master_client(
        &self,
        addr: impl std::fmt::Display,
    ) -> anyhow::Result<agora_client::MasterClient> {
        let http = agora_client::Http::new()
            .with_tls(self.client.clone())
            .with_authorization(&self.credential.authorization())?;
        Ok(agora_client::MasterClient::with_http(http, addr))
    }

    /// The same, for an in-process master (`agora_master::Config`).
    #[cfg(feature = "local")]
    pub fn master_config(&self, config: &mut agora_master::Config) {
        config.tls = TlsOptions {
            require_client_cert: true,
            ..self.tls.clone()
        };
        config.credentials = Some(agora_proto::Credentials::new(vec![self.credential.clone()]));
        config.authenticate_frameworks = true;
        config.authenticate_agents = true;
        config.authenticate_http = true;
    }

    /// The same, for an in-process agent (`agora_agent::Config`).
    #[cfg(feature = "local")]
    pub fn agent_config(&self, config: &mut agora_agent::Config) {
        config.tls = self.tls.clone();
        config.credential = Some(self.credential.clone());
    }
}

/// 32 hex digits from the system's random source.
fn random_hex() -> std::io::Result<String> {
    use std::io::Read;
    let mut bytes = [0u8; 16];
    std::fs::File::open("/dev/urandom")?.read_exact(&mut bytes)?;
    Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
}

/// Plain, or TLS and authentication: what a benchmark run compares.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Security {
    /// Plaintext, nothing authenticated.
    Plain,
    /// Mutual TLS and authentication of everything.
    Secure,
}

impl std::fmt::Display for Security {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Security::Plain => "plain",
            Security::Secure => "tls+auth",
        })
    }
}

/// `--security plain|secure|both`.
pub fn parse_security(text: &str) -> Result<Vec<Security>, String> {
    match text {
        "plain" => Ok(vec![Security::Plain]),
        "secure" => Ok(vec![Security::Secure]),
        "both" => Ok(vec![Security::Plain, Security::Secure]),
        other => Err(format!("expected plain, secure or both, not {other:?}")),
    }
}
