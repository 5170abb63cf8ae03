//! Image references: `[HOST[:PORT]/]PATH[:TAG][@sha256:HEX]`, split the
//! way Docker splits them.
//!
//! The first path component is a registry host when it has a `.` or a
//! `:` or is `localhost` (Docker's rule); otherwise the name belongs to
//! the default registry (`--docker-registry`), where a one-component
//! name is an official image under `library/` (`busybox` is
//! `library/busybox`). A name with neither tag nor digest means `latest`;
//! a name with both is pulled by its digest. An OCI reference must name
//! its registry: there is no default registry for OCI images.

use std::fmt;

use super::Provider;

/// An image reference, parsed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ImageName {
    /// `HOST[:PORT]` as written, or `None` for the default registry.
    pub registry: Option<String>,
    /// The repository path (`library/busybox`).
    pub repository: String,
    /// The tag or digest pulled.
    pub target: Target,
}

/// What a reference names within its repository.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Target {
    /// A tag (`latest` when none was given).
    Tag(String),
    /// A manifest digest, `sha256:` and 64 hex digits.
    Digest(String),
}

// === impl ImageName ===

impl ImageName {
    /// Parses `reference` for `provider`; the error says what is wrong.
    pub fn parse(provider: Provider, reference: &str) -> Result<ImageName, String> {
        if reference.is_empty() {
            return Err("the reference is empty".into());
        }
        if reference.len() > 4096 {
            return Err("the reference is longer than 4096 bytes".into());
        }
        let (rest, digest) = match reference.split_once('@') {
            Some((rest, digest)) => {
                check_digest(digest)?;
                (rest, Some(digest.to_string()))
            }
            None => (reference, None),
        };
        // A tag follows the last ':' that comes after the last '/' (a
        // ':' before it is a registry port).
        let last_slash = rest.rfind('/').map_or(0, |i| i + 1);
        let (name, tag) = match rest[last_slash..].rfind(':') {
            Some(i) => {
                let tag = &rest[last_slash + i + 1..];
                check_tag(tag)?;
                (&rest[..last_slash + i], Some(tag.to_string()))
            }
            None => (rest, None),
        };
        let (registry, path) = match name.split_once('/') {
            Some((first, path))
                if first.contains('.') || first.contains(':') || first == "localhost" =>
            {
                check_host(first)?;
                (Some(first.to_string()), path)
            }
            _ => (None, name),
        };
        for component in path.split('/') {
            check_component(component)?;
        }
        let repository = match (&registry, provider) {
            (None, Provider::Oci) => {
                return Err(format!(
                    "an OCI image reference names its registry (HOST[:PORT]/{name}); \
                     only Docker images default to --docker-registry"
                ))
            }
            (None, Provider::Docker) if !path.contains('/') => format!("library/{path}"),
            _ => path.to_string(),
        };
        let target = match (digest, tag) {
            (Some(digest), _) => Target::Digest(digest),
            (None, Some(tag)) => Target::Tag(tag),
            (None, None) => Target::Tag("latest".into()),
        };
        Ok(ImageName {
            registry,
            repository,
            target,
        })
    }

    /// The name without its registry host when it has none
    /// (`library/busybox:1`), else with it: the key of the image in the
    /// store, the same whichever `--docker-registry` is in force.
    pub fn key(&self) -> String {
        match &self.registry {
            Some(host) => format!("{host}/{}{}", self.repository, self.target),
            None => format!("{}{}", self.repository, self.target),
        }
    }

    /// The repository and tag or digest (`library/busybox:1`).
    pub fn path(&self) -> String {
        format!("{}{}", self.repository, self.target)
    }
}

impl fmt::Display for Target {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Target::Tag(tag) => write!(f, ":{tag}"),
            Target::Digest(digest) => write!(f, "@{digest}"),
        }
    }
}

/// Whether `digest` is `sha256:` and 64 lowercase hex digits (the only
/// digest Agora's store names content by).
pub(crate) fn is_sha256(digest: &str) -> bool {
    digest.strip_prefix("sha256:").is_some_and(|hex| {
        hex.len() == 64
            && hex
                .bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    })
}

fn check_digest(digest: &str) -> Result<(), String> {
    if is_sha256(digest) {
        Ok(())
    } else if digest.contains(':') && !digest.starts_with("sha256:") {
        Err(format!(
            "digest {digest:?}: only sha256 digests are supported"
        ))
    } else {
        Err(format!(
            "digest {digest:?} is not sha256: and 64 lowercase hex digits"
        ))
    }
}

fn check_tag(tag: &str) -> Result<(), String> {
    let ok = !tag.is_empty()
        && tag.len() <= 128
        && tag
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'.' || b == b'-')
        && !tag.starts_with(['.', '-']);
    if ok {
        Ok(())
    } else {
        Err(format!(
            "tag {tag:?} is not 1 to 128 letters, digits, '_', '.' or '-' (not starting with '.' or '-')"
        ))
    }
}

fn check_host(host: &str) -> Result<(), String> {
    let (name, port) = match host.rsplit_once(':') {
        Some((name, port)) => (name, Some(port)),
        None => (host, None),
    };
    let name_ok = !name.is_empty()
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'.' || b == b'-');
    let port_ok = port.is_none_or(|p| !p.is_empty() && p.parse::<u16>().is_ok());
    if name_ok && port_ok {
        Ok(())
    } else {
        Err(format!("registry {host:?} is not HOST or HOST:PORT"))
    }
}

fn check_component(component: &str) -> Result<(), String> {
    let bytes = component.as_bytes();
    let ok = !bytes.is_empty()
        && bytes
            .iter()
            .all(|&b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"._-".contains(&b))
        && bytes[0].is_ascii_alphanumeric()
        && bytes[bytes.len() - 1].is_ascii_alphanumeric();
    if ok {
        Ok(())
    } else {
        Err(format!(
            "repository component {component:?} is not lowercase letters and digits \
             separated by '.', '_' or '-'"
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn docker(reference: &str) -> ImageName {
        ImageName::parse(Provider::Docker, reference).unwrap()
    }

    #[test]
    fn short_names_are_official_images_of_the_default_registry() {
        let name = docker("busybox");
        assert_eq!(name.registry, None);
        assert_eq!(name.repository, "library/busybox");
        assert_eq!(name.target, Target::Tag("latest".into()));
        assert_eq!(name.key(), "library/busybox:latest");
        assert_eq!(docker("busybox:1.36").key(), "library/busybox:1.36");
        assert_eq!(docker("team/app:v2").key(), "team/app:v2");
    }

    #[test]
    fn a_first_component_with_a_dot_a_port_or_localhost_is_a_registry() {
        let name = docker("127.0.0.1:5000/busybox:1");
        assert_eq!(name.registry.as_deref(), Some("127.0.0.1:5000"));
        assert_eq!(name.repository, "busybox");
        assert_eq!(name.target, Target::Tag("1".into()));
        assert_eq!(
            docker("localhost/a/b").registry.as_deref(),
            Some("localhost")
        );
        assert_eq!(
            docker("registry.example.com/a/b:c").key(),
            "registry.example.com/a/b:c"
        );
        assert_eq!(docker("localhost:5000/x").key(), "localhost:5000/x:latest");
    }

    #[test]
    fn digests_win_over_tags_and_must_be_sha256() {
        let hex = "a".repeat(64);
        let name = docker(&format!("busybox:1@sha256:{hex}"));
        assert_eq!(name.target, Target::Digest(format!("sha256:{hex}")));
        assert_eq!(name.key(), format!("library/busybox@sha256:{hex}"));
        let err = ImageName::parse(Provider::Docker, &format!("busybox@sha512:{hex}")).unwrap_err();
        assert!(err.contains("only sha256"), "{err}");
        assert!(ImageName::parse(Provider::Docker, "busybox@sha256:abc").is_err());
    }

    #[test]
    fn oci_references_name_their_registry() {
        let err = ImageName::parse(Provider::Oci, "busybox:1").unwrap_err();
        assert!(err.contains("names its registry"), "{err}");
        let name = ImageName::parse(Provider::Oci, "127.0.0.1:5000/busybox:1").unwrap();
        assert_eq!(name.repository, "busybox");
    }

    #[test]
    fn malformed_references_say_what_is_wrong() {
        for (reference, expected) in [
            ("", "empty"),
            ("Busybox", "lowercase"),
            ("busybox:", "tag"),
            ("busybox:-x", "tag"),
            ("a//b", "component"),
            ("127.0.0.1:99999/x", "HOST:PORT"),
            ("x/../y", "component"),
        ] {
            let err = ImageName::parse(Provider::Docker, reference).unwrap_err();
            assert!(err.contains(expected), "{reference:?}: {err}");
        }
    }
}
