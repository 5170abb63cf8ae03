//! Real parts for the image tests: Debian's `docker-registry` started on
//! 127.0.0.1 (plain HTTP, or TLS with htpasswd basic auth), OCI image
//! layouts written here from `busybox-static`, pushed with `skopeo`,
//! and `docker save` archives written here.

use std::fs;
use std::io::Write;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use sha2::{Digest, Sha256};

pub const REGISTRY: &str = "/usr/bin/docker-registry";
pub const SKOPEO: &str = "/usr/bin/skopeo";
pub const BUSYBOX: &str = "/bin/busybox";

/// Whether the registry, skopeo and busybox are installed; says why not.
pub fn tools_present() -> bool {
    for tool in [REGISTRY, SKOPEO, BUSYBOX] {
        if !Path::new(tool).exists() {
            eprintln!(
                "skipping: {tool} is missing (install docker-registry, skopeo and busybox-static)"
            );
            return false;
        }
    }
    true
}

pub fn is_root() -> bool {
    nix::unistd::geteuid().is_root()
}

/// A `docker-registry` process serving a temporary directory.
pub struct Registry {
    child: Child,
    /// `127.0.0.1:PORT`.
    pub addr: String,
    pub dir: tempfile::TempDir,
    log: PathBuf,
}

/// TLS and basic auth for a registry.
pub struct Secured {
    pub user: String,
    pub password: String,
}

impl Registry {
    /// A plain HTTP registry.
    pub fn start() -> Registry {
        Registry::start_with(|_| String::new())
    }

    /// A registry over TLS (a self-signed certificate for 127.0.0.1)
    /// with htpasswd basic auth for `secured`'s user.
    pub fn start_secured(secured: &Secured) -> Registry {
        Registry::start_with(|dir| {
            let key = rcgen::KeyPair::generate().unwrap();
            let mut params = rcgen::CertificateParams::new(vec!["localhost".to_string()]).unwrap();
            params
                .subject_alt_names
                .push(rcgen::SanType::IpAddress("127.0.0.1".parse().unwrap()));
            let cert = params.self_signed(&key).unwrap();
            fs::write(dir.join("cert.pem"), cert.pem()).unwrap();
            fs::write(dir.join("key.pem"), key.serialize_pem()).unwrap();
            let hash = bcrypt::hash(&secured.password, 4).unwrap();
            fs::write(dir.join("htpasswd"), format!("{}:{hash}\n", secured.user)).unwrap();
            format!(
                "  tls:\n    certificate: {}\n    key: {}\nauth:\n  htpasswd:\n    realm: agora-test\n    path: {}\n",
                dir.join("cert.pem").display(),
                dir.join("key.pem").display(),
                dir.join("htpasswd").display(),
            )
        })
    }

    /// A plain HTTP registry that takes bearer tokens from `issuer`.
    pub fn start_with_tokens(issuer: &TokenIssuer) -> Registry {
        Registry::start_with(|dir| {
            fs::write(dir.join("token-cert.pem"), &issuer.cert_pem).unwrap();
            format!(
                "auth:\n  token:\n    realm: {}\n    service: {}\n    issuer: {}\n    rootcertbundle: {}\n",
                issuer.realm,
                TokenIssuer::SERVICE,
                TokenIssuer::ISSUER,
                dir.join("token-cert.pem").display(),
            )
        })
    }

    /// Starts a registry whose configuration ends with what `extra`
    /// writes (given the registry's directory): `http.tls`, `auth`.
    fn start_with(extra: impl FnOnce(&Path) -> String) -> Registry {
        let dir = tempfile::tempdir().unwrap();
        let port = free_port();
        let addr = format!("127.0.0.1:{port}");
        let mut config = format!(
            "version: 0.1\nlog:\n  level: info\nstorage:\n  filesystem:\n    rootdirectory: {}\n  delete:\n    enabled: true\nhttp:\n  addr: {addr}\n",
            dir.path().join("data").display()
        );
        config.push_str(&extra(dir.path()));
        let config_path = dir.path().join("config.yml");
        fs::write(&config_path, config).unwrap();
        let log = dir.path().join("registry.log");
        let out = fs::File::create(&log).unwrap();
        let child = Command::new(REGISTRY)
            .arg("serve")
            .arg(&config_path)
            .stdout(out.try_clone().unwrap())
            .stderr(out)
            .spawn()
            .unwrap();
        let mut registry = Registry {
            child,
            addr,
            dir,
            log,
        };
        registry.wait_ready();
        registry
    }

    fn wait_ready(&mut self) {
        let deadline = Instant::now() + Duration::from_secs(20);
        let addr: SocketAddr = self.addr.parse().unwrap();
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                panic!(
                    "docker-registry exited ({status}): {}",
                    fs::read_to_string(&self.log).unwrap_or_default()
                );
            }
            if TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_ok() {
                return;
            }
            assert!(Instant::now() < deadline, "docker-registry did not listen");
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// `http://ADDR` (for `--docker-registry`).
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// How many times blob `digest` was served (GET answered 200), in
    /// any repository.
    pub fn blob_gets(&self, digest: &str) -> usize {
        let log = fs::read_to_string(&self.log).unwrap();
        let wanted = format!("/blobs/{digest} HTTP/1.1\" 200");
        log.lines()
            .filter(|l| l.contains("\"GET /v2/") && l.contains(&wanted))
            .count()
    }

    /// The file the registry keeps blob `digest` in.
    pub fn blob_file(&self, digest: &str) -> PathBuf {
        let hex = digest.strip_prefix("sha256:").unwrap();
        self.dir
            .path()
            .join("data/docker/registry/v2/blobs/sha256")
            .join(&hex[..2])
            .join(hex)
            .join("data")
    }

    /// Pushes `layout`'s `tag` to `repository:tag` with skopeo.
    /// `extra`: more skopeo arguments (`--all`, `--format v2s2`,
    /// `--dest-creds u:p`).
    pub fn push(&self, layout: &Layout, tag: &str, repository: &str, extra: &[&str]) {
        let output = Command::new(SKOPEO)
            .args([
                "--insecure-policy",
                "copy",
                "--quiet",
                "--dest-tls-verify=false",
            ])
            .args(extra)
            .arg(format!("oci:{}:{tag}", layout.dir.display()))
            .arg(format!("docker://{}/{repository}:{tag}", self.addr))
            .stdin(Stdio::null())
            .output()
            .unwrap();
        assert!(
            output.status.success(),
            "skopeo copy failed: {}",
            String::from_utf8_lossy(&output.stderr)
        );
    }
}

impl Drop for Registry {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A registry token server (Docker's token authentication): answers
/// `GET /token?service=…&scope=repository:NAME:ACTIONS` with an ES256
/// JWT carrying its certificate (`x5c`), for one user's basic
/// credentials; anyone else gets 401.
pub struct TokenIssuer {
    pub realm: String,
    cert_pem: String,
    task: tokio::task::JoinHandle<()>,
}

impl TokenIssuer {
    const SERVICE: &'static str = "agora-test-registry";
    const ISSUER: &'static str = "agora-test-issuer";

    pub async fn start(user: &str, password: &str) -> TokenIssuer {
        use base64::Engine;
        let key = rcgen::KeyPair::generate().unwrap();
        let params = rcgen::CertificateParams::new(vec!["token-issuer".to_string()]).unwrap();
        let cert = params.self_signed(&key).unwrap();
        let x5c = base64::engine::general_purpose::STANDARD.encode(cert.der());
        let signing = jsonwebtoken::EncodingKey::from_ec_der(&key.serialize_der());
        let expected = format!(
            "Basic {}",
            base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}"))
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let realm = format!("http://{}/token", listener.local_addr().unwrap());
        let app = axum::Router::new().route(
            "/token",
            axum::routing::get(
                move |headers: axum::http::HeaderMap,
                      query: axum::extract::Query<std::collections::HashMap<String, String>>| {
                    let granted = headers
                        .get("authorization")
                        .is_some_and(|v| v.as_bytes() == expected.as_bytes());
                    let token = granted.then(|| {
                        let access: Vec<Value> = query
                            .get("scope")
                            .map(|scope| {
                                scope
                                    .split(' ')
                                    .filter_map(|s| {
                                        let mut parts = s.splitn(3, ':');
                                        let kind = parts.next()?;
                                        let name = parts.next()?;
                                        let actions: Vec<&str> = parts.next()?.split(',').collect();
                                        Some(json!({"type": kind, "name": name, "actions": actions}))
                                    })
                                    .collect()
                            })
                            .unwrap_or_default();
                        let now = std::time::SystemTime::now()
                            .duration_since(std::time::UNIX_EPOCH)
                            .unwrap()
                            .as_secs();
                        let claims = json!({
                            "iss": TokenIssuer::ISSUER, "sub": "agora", "aud": TokenIssuer::SERVICE,
                            "exp": now + 300, "nbf": now - 10, "iat": now, "jti": format!("{now}"),
                            "access": access,
                        });
                        let mut header = jsonwebtoken::Header::new(jsonwebtoken::Algorithm::ES256);
                        header.x5c = Some(vec![x5c.clone()]);
                        jsonwebtoken::encode(&header, &claims, &signing).unwrap()
                    });
                    async move {
                        match token {
                            Some(token) => (
                                axum::http::StatusCode::OK,
                                axum::Json(json!({"token": token, "access_token": token, "expires_in": 300})),
                            ),
                            None => (
                                axum::http::StatusCode::UNAUTHORIZED,
                                axum::Json(json!({"details": "bad credentials"})),
                            ),
                        }
                    }
                },
            ),
        );
        let task = tokio::spawn(async move {
            axum::serve(listener, app).await.unwrap();
        });
        TokenIssuer {
            realm,
            cert_pem: cert.pem(),
            task,
        }
    }
}

impl Drop for TokenIssuer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// A port nothing listens on (just released).
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

pub fn sha256(bytes: &[u8]) -> String {
    format!("sha256:{}", hex::encode(Sha256::digest(bytes)))
}

/// A file system entry of a test layer.
pub enum Entry {
    Dir(&'static str),
    File(&'static str, Vec<u8>),
    /// A file with the host file's bytes and mode.
    Host(&'static str, &'static str),
    Symlink(&'static str, &'static str),
}

/// A content blob of a layout.
#[derive(Clone, Debug)]
pub struct Blob {
    pub digest: String,
    pub size: u64,
    pub media_type: String,
}

/// A layer: its compressed blob and the digest of its tar.
#[derive(Clone, Debug)]
pub struct Layer {
    pub blob: Blob,
    pub diff_id: String,
    /// The uncompressed tar.
    pub tar: Vec<u8>,
}

/// An OCI image layout directory being written.
pub struct Layout {
    pub dir: PathBuf,
    tags: Vec<Value>,
}

impl Layout {
    pub fn new(dir: &Path) -> Layout {
        fs::create_dir_all(dir.join("blobs/sha256")).unwrap();
        fs::write(dir.join("oci-layout"), r#"{"imageLayoutVersion":"1.0.0"}"#).unwrap();
        let layout = Layout {
            dir: dir.to_path_buf(),
            tags: Vec::new(),
        };
        layout.write_index();
        layout
    }

    pub fn blob(&self, bytes: &[u8], media_type: &str) -> Blob {
        let digest = sha256(bytes);
        fs::write(
            self.dir
                .join("blobs/sha256")
                .join(digest.strip_prefix("sha256:").unwrap()),
            bytes,
        )
        .unwrap();
        Blob {
            digest,
            size: bytes.len() as u64,
            media_type: media_type.to_string(),
        }
    }

    /// A gzip-compressed layer of `entries`.
    pub fn layer(&self, entries: &[Entry]) -> Layer {
        let tar = tar_of(entries);
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        gz.write_all(&tar).unwrap();
        let gz = gz.finish().unwrap();
        Layer {
            blob: self.blob(&gz, "application/vnd.oci.image.layer.v1.tar+gzip"),
            diff_id: sha256(&tar),
            tar,
        }
    }

    /// An image of `layers` (bottom first) for linux/`arch`, with
    /// `config` as its runtime config; returns its manifest.
    pub fn image(&self, layers: &[&Layer], config: Value, arch: &str) -> Blob {
        let config = json!({
            "architecture": arch,
            "os": "linux",
            "config": config,
            "rootfs": {"type": "layers", "diff_ids": layers.iter().map(|l| l.diff_id.clone()).collect::<Vec<_>>()},
        });
        let config = self.blob(
            &serde_json::to_vec(&config).unwrap(),
            "application/vnd.oci.image.config.v1+json",
        );
        let manifest = json!({
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "config": descriptor(&config),
            "layers": layers.iter().map(|l| descriptor(&l.blob)).collect::<Vec<_>>(),
        });
        self.blob(
            &serde_json::to_vec(&manifest).unwrap(),
            "application/vnd.oci.image.manifest.v1+json",
        )
    }

    /// An index of `manifests`, each for linux/its architecture.
    pub fn index(&self, manifests: &[(&Blob, &str)]) -> Blob {
        let index = json!({
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.index.v1+json",
            "manifests": manifests.iter().map(|(m, arch)| {
                let mut d = descriptor(m);
                d["platform"] = json!({"os": "linux", "architecture": arch});
                d
            }).collect::<Vec<_>>(),
        });
        self.blob(
            &serde_json::to_vec(&index).unwrap(),
            "application/vnd.oci.image.index.v1+json",
        )
    }

    /// Names `manifest` `name` in `index.json`
    /// (`org.opencontainers.image.ref.name`), instead of what had it.
    pub fn tag(&mut self, name: &str, manifest: &Blob) {
        let mut d = descriptor(manifest);
        d["annotations"] = json!({"org.opencontainers.image.ref.name": name});
        self.tags
            .retain(|t| t["annotations"]["org.opencontainers.image.ref.name"] != name);
        self.tags.push(d);
        self.write_index();
    }

    fn write_index(&self) {
        let index = json!({"schemaVersion": 2, "manifests": self.tags});
        fs::write(
            self.dir.join("index.json"),
            serde_json::to_vec(&index).unwrap(),
        )
        .unwrap();
    }

    /// The layout as a tar archive at `path`.
    pub fn archive(&self, path: &Path) {
        let mut builder = tar::Builder::new(fs::File::create(path).unwrap());
        builder.append_dir_all(".", &self.dir).unwrap();
        builder.finish().unwrap();
    }
}

fn descriptor(blob: &Blob) -> Value {
    json!({"mediaType": blob.media_type, "digest": blob.digest, "size": blob.size})
}

/// A tar of `entries` (owned by root, time 0).
pub fn tar_of(entries: &[Entry]) -> Vec<u8> {
    let mut builder = tar::Builder::new(Vec::new());
    for entry in entries {
        let mut header = tar::Header::new_gnu();
        header.set_mtime(0);
        header.set_uid(0);
        header.set_gid(0);
        match entry {
            Entry::Dir(path) => {
                header.set_entry_type(tar::EntryType::Directory);
                header.set_mode(0o755);
                header.set_size(0);
                builder
                    .append_data(&mut header, path, std::io::empty())
                    .unwrap();
            }
            Entry::File(path, data) => {
                header.set_entry_type(tar::EntryType::Regular);
                header.set_mode(0o644);
                header.set_size(data.len() as u64);
                builder.append_data(&mut header, path, &data[..]).unwrap();
            }
            Entry::Host(path, host) => {
                let data = fs::read(host).unwrap();
                header.set_entry_type(tar::EntryType::Regular);
                header.set_mode(0o755);
                header.set_size(data.len() as u64);
                builder.append_data(&mut header, path, &data[..]).unwrap();
            }
            Entry::Symlink(path, target) => {
                header.set_entry_type(tar::EntryType::Symlink);
                header.set_mode(0o777);
                header.set_size(0);
                builder.append_link(&mut header, path, target).unwrap();
            }
        }
    }
    builder.into_inner().unwrap()
}

/// A busybox root: `/bin/busybox`, `sh` and `ls` links, `/etc/passwd`,
/// `/etc/motd`, `/opt/old`.
pub fn busybox_entries() -> Vec<Entry> {
    vec![
        Entry::Dir("bin"),
        Entry::Host("bin/busybox", BUSYBOX),
        Entry::Symlink("bin/sh", "busybox"),
        Entry::Symlink("bin/ls", "busybox"),
        Entry::Dir("etc"),
        Entry::File("etc/passwd", b"root:x:0:0:root:/root:/bin/sh\n".to_vec()),
        Entry::File("etc/motd", b"hello\n".to_vec()),
        Entry::Dir("opt"),
        Entry::File("opt/old", b"old\n".to_vec()),
    ]
}

/// The runtime config the test images carry.
pub fn busybox_config() -> Value {
    json!({
        "Entrypoint": ["/bin/sh", "-c"],
        "Cmd": ["echo hi"],
        "Env": ["PATH=/bin", "GREETING=hello"],
        "WorkingDir": "/opt",
        "User": "0:0",
        "Volumes": {"/data": {}},
        "ExposedPorts": {"8080/tcp": {}, "53/udp": {}},
    })
}

/// Bytes that do not compress.
pub fn noise(len: usize, seed: u8) -> Vec<u8> {
    let mut out = Vec::with_capacity(len + 32);
    let mut block = Sha256::digest([seed]).to_vec();
    while out.len() < len {
        block = Sha256::digest(&block).to_vec();
        out.extend_from_slice(&block);
    }
    out.truncate(len);
    out
}

/// A `docker save` archive at `path` of one image: `layers` (plain
/// tars) under `<n>/layer.tar`, its config under `<hex>.json`, and
/// `tags` in `manifest.json`.
pub fn docker_save(path: &Path, layers: &[&Layer], config: Value, tags: &[&str]) {
    let config = json!({
        "architecture": "amd64",
        "os": "linux",
        "config": config,
        "rootfs": {"type": "layers", "diff_ids": layers.iter().map(|l| l.diff_id.clone()).collect::<Vec<_>>()},
    });
    let config = serde_json::to_vec(&config).unwrap();
    let config_name = format!("{}.json", sha256(&config).strip_prefix("sha256:").unwrap());
    let layer_names: Vec<String> = (0..layers.len())
        .map(|n| format!("{n}/layer.tar"))
        .collect();
    let manifest = json!([{
        "Config": config_name,
        "RepoTags": tags,
        "Layers": layer_names,
    }]);
    let mut builder = tar::Builder::new(fs::File::create(path).unwrap());
    let mut add = |name: &str, data: &[u8]| {
        let mut header = tar::Header::new_gnu();
        header.set_mode(0o644);
        header.set_size(data.len() as u64);
        builder.append_data(&mut header, name, data).unwrap();
    };
    for (name, layer) in layer_names.iter().zip(layers) {
        add(name, &layer.tar);
    }
    add(&config_name, &config);
    add("manifest.json", &serde_json::to_vec(&manifest).unwrap());
    builder.finish().unwrap();
}
