//! The fetcher: copies the URIs a launch asks for
//! ([`agora_proto::CommandInfo::uris`], Mesos's `CommandInfo.uris`) into
//! the sandbox before the command starts, as Mesos's fetcher does (without
//! its cache): an executor's into the executor's sandbox, a command task's
//! into the task's.
//!
//! A URI is a local path (absolute, or `file://`) or an `http://` URL.
//! The file lands in the sandbox under `output_file`, else the URI's last
//! path segment. `executable` makes it executable (and it is then never
//! unpacked, as in Mesos); otherwise `extract` unpacks `.tar`, `.tar.gz`,
//! `.tgz` and `.zip` archives into the sandbox (entries that would land
//! outside it are refused by the archive crates), keeping the archive.
//! The first URI that cannot be fetched fails the launch with a message
//! that names it. Fetching runs on a thread of its own, never on the
//! process thread or the core's.

use std::fs::File;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::time::Duration;

use agora_proto::FetchUri;

/// How long one URI may take to download.
pub const FETCH_TIMEOUT: Duration = Duration::from_secs(120);
/// The largest file the fetcher downloads or copies.
pub const MAX_FETCH_BYTES: u64 = 1 << 30;

/// Why a URI could not be fetched.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("failed to fetch URI '{uri}': {reason}")]
pub struct FetchError {
    /// The URI.
    pub uri: String,
    /// What went wrong.
    pub reason: String,
}

/// Fetches every URI into `sandbox`, in order; `runtime` runs the HTTP
/// downloads.
pub fn fetch_all(
    uris: &[FetchUri],
    sandbox: &Path,
    runtime: &tokio::runtime::Handle,
) -> Result<(), FetchError> {
    for uri in uris {
        fetch_one(uri, sandbox, runtime).map_err(|reason| FetchError {
            uri: uri.value.clone(),
            reason,
        })?;
    }
    Ok(())
}

fn fetch_one(
    uri: &FetchUri,
    sandbox: &Path,
    runtime: &tokio::runtime::Handle,
) -> Result<(), String> {
    let name = match &uri.output_file {
        Some(name) => name.clone(),
        None => file_name(&uri.value)
            .ok_or("it names no file; set 'output_file'")?
            .to_string(),
    };
    if name.is_empty() || name.contains('/') || name == "." || name == ".." {
        return Err(format!("{name:?} is not a file name in the sandbox"));
    }
    let dest = sandbox.join(&name);
    if let Some(rest) = uri.value.strip_prefix("http://") {
        download(rest, &dest, runtime)?;
    } else if uri.value.contains("://") && !uri.value.starts_with("file://") {
        return Err("unsupported scheme: local paths, file:// and http:// URIs are fetched".into());
    } else {
        let source = PathBuf::from(uri.value.strip_prefix("file://").unwrap_or(&uri.value));
        if !source.is_absolute() {
            return Err("a local path must be absolute".into());
        }
        let size = std::fs::metadata(&source)
            .map_err(|e| format!("{}: {e}", source.display()))?
            .len();
        if size > MAX_FETCH_BYTES {
            return Err(format!(
                "{size} bytes is more than the {MAX_FETCH_BYTES}-byte limit"
            ));
        }
        std::fs::copy(&source, &dest).map_err(|e| format!("copying {}: {e}", source.display()))?;
    }
    if uri.executable {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&dest, std::fs::Permissions::from_mode(0o755))
            .map_err(|e| format!("chmod +x: {e}"))?;
    } else if uri.extract {
        extract(&dest, &name, sandbox)?;
    }
    Ok(())
}

/// The last path segment of a URI, without query or fragment.
fn file_name(uri: &str) -> Option<&str> {
    let path = uri.split(['?', '#']).next().unwrap_or(uri);
    path.rsplit('/').next().filter(|n| !n.is_empty())
}

/// `GET http://HOST:PORT/PATH` (`rest` is what follows `http://`) into
/// `dest`, within [`FETCH_TIMEOUT`] and [`MAX_FETCH_BYTES`].
fn download(rest: &str, dest: &Path, runtime: &tokio::runtime::Handle) -> Result<(), String> {
    let (address, path) = match rest.find('/') {
        Some(i) => (&rest[..i], &rest[i..]),
        None => (rest, "/"),
    };
    if address.is_empty() {
        return Err("no host".into());
    }
    let mut file = File::create(dest).map_err(|e| format!("{}: {e}", dest.display()))?;
    let transfer = async {
        let http = agora_client::Http::new().with_timeout(FETCH_TIMEOUT);
        let mut response = http
            .stream(agora_client::Method::GET, address, path, &[], None)
            .await
            .map_err(|e| e.to_string())?;
        if response.status != 200 {
            return Err(format!("HTTP status {}", response.status));
        }
        let mut written: u64 = 0;
        while let Some(chunk) = response.chunk().await.map_err(|e| e.to_string())? {
            written += chunk.len() as u64;
            if written > MAX_FETCH_BYTES {
                return Err(format!("more than the {MAX_FETCH_BYTES}-byte limit"));
            }
            file.write_all(&chunk)
                .map_err(|e| format!("{}: {e}", dest.display()))?;
        }
        Ok(())
    };
    runtime.block_on(async {
        tokio::time::timeout(FETCH_TIMEOUT, transfer)
            .await
            .unwrap_or_else(|_| Err(format!("not done within {FETCH_TIMEOUT:?}")))
    })?;
    file.sync_all().map_err(|e| e.to_string())
}

/// Unpacks `archive` (named `name`) into `sandbox` when it is one.
fn extract(archive: &Path, name: &str, sandbox: &Path) -> Result<(), String> {
    let open = || File::open(archive).map_err(|e| format!("{}: {e}", archive.display()));
    let lower = name.to_ascii_lowercase();
    let unpacked = if lower.ends_with(".tar.gz") || lower.ends_with(".tgz") {
        tar::Archive::new(flate2::read::GzDecoder::new(open()?)).unpack(sandbox)
    } else if lower.ends_with(".tar") {
        tar::Archive::new(open()?).unpack(sandbox)
    } else if lower.ends_with(".zip") {
        zip::ZipArchive::new(open()?)
            .and_then(|mut zip| zip.extract(sandbox))
            .map_err(std::io::Error::other)
    } else {
        return Ok(());
    };
    unpacked.map_err(|e| format!("extracting {name}: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn uri(value: &str) -> FetchUri {
        FetchUri {
            value: value.to_string(),
            executable: false,
            extract: true,
            output_file: None,
        }
    }

    fn runtime() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap()
    }

    #[test]
    fn local_files_are_copied_made_executable_and_unpacked() {
        let dir = tempfile::tempdir().unwrap();
        let (source, sandbox) = (dir.path().join("src"), dir.path().join("sandbox"));
        std::fs::create_dir_all(&source).unwrap();
        std::fs::create_dir_all(&sandbox).unwrap();
        std::fs::write(source.join("run.sh"), "#!/bin/sh\necho hi\n").unwrap();
        // A .tar.gz holding data/hello.txt.
        let tgz = source.join("bundle.tgz");
        {
            let gz = flate2::write::GzEncoder::new(
                File::create(&tgz).unwrap(),
                flate2::Compression::fast(),
            );
            let mut tar = tar::Builder::new(gz);
            let mut header = tar::Header::new_gnu();
            header.set_size(5);
            header.set_mode(0o644);
            header.set_cksum();
            tar.append_data(&mut header, "data/hello.txt", &b"hello"[..])
                .unwrap();
            tar.into_inner().unwrap().finish().unwrap();
        }
        // A .zip holding notes.txt.
        let zip_path = source.join("notes.zip");
        {
            let mut zip = zip::ZipWriter::new(File::create(&zip_path).unwrap());
            zip.start_file("notes.txt", zip::write::SimpleFileOptions::default())
                .unwrap();
            zip.write_all(b"notes").unwrap();
            zip.finish().unwrap();
        }
        let mut exe = uri(&source.join("run.sh").display().to_string());
        exe.executable = true;
        let mut renamed = uri(&format!("file://{}", source.join("run.sh").display()));
        renamed.output_file = Some("copy.sh".into());
        let mut kept = uri(&zip_path.display().to_string());
        kept.output_file = Some("kept.zip".into());
        kept.extract = false;
        let uris = [
            exe,
            renamed,
            uri(&tgz.display().to_string()),
            uri(&zip_path.display().to_string()),
            kept,
        ];
        fetch_all(&uris, &sandbox, runtime().handle()).unwrap();
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(sandbox.join("run.sh"))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o111, 0o111, "executable");
        assert!(sandbox.join("copy.sh").is_file());
        let read = |p: &str| std::fs::read_to_string(sandbox.join(p)).unwrap();
        assert_eq!(read("data/hello.txt"), "hello");
        assert_eq!(read("notes.txt"), "notes");
        assert!(sandbox.join("kept.zip").is_file());
    }

    #[test]
    fn a_failed_fetch_names_the_uri() {
        let dir = tempfile::tempdir().unwrap();
        for (value, why) in [
            ("/no/such/file", "No such file"),
            ("relative/path", "absolute"),
            ("https://example.invalid/x", "unsupported scheme"),
            ("http://127.0.0.1:1/x", ""),
            ("/", "names no file"),
        ] {
            let err = fetch_all(&[uri(value)], dir.path(), runtime().handle()).unwrap_err();
            assert_eq!(err.uri, value);
            assert!(err.to_string().contains(value), "{err}");
            assert!(err.reason.contains(why), "{value}: {err}");
        }
    }

    #[test]
    fn http_uris_are_downloaded() {
        let dir = tempfile::tempdir().unwrap();
        let rt = runtime();
        let listener = rt
            .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
            .unwrap();
        let addr = listener.local_addr().unwrap();
        let app = axum::Router::new().route(
            "/files/tool",
            axum::routing::get(|| async { "#!/bin/sh\n" }),
        );
        rt.spawn(async move { axum::serve(listener, app).await });
        let mut tool = uri(&format!("http://{addr}/files/tool?v=1"));
        tool.executable = true;
        let missing = uri(&format!("http://{addr}/files/missing"));
        fetch_all(&[tool], dir.path(), rt.handle()).unwrap();
        assert_eq!(
            std::fs::read_to_string(dir.path().join("tool")).unwrap(),
            "#!/bin/sh\n"
        );
        let err = fetch_all(&[missing], dir.path(), rt.handle()).unwrap_err();
        assert!(err.reason.contains("404"), "{err}");
    }
}
