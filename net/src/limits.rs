//! What a peer may hold of a server, and for how long: connections (in
//! all, below the process's file descriptor limit), a request's headers,
//! an idle connection, a request body or WebSocket message (time and
//! memory). The same flags
//! on the master and the agent ([`LimitFlags`]).

use std::time::Duration;

/// Default [`Limits::header_timeout`].
pub const DEFAULT_HEADER_TIMEOUT: Duration = Duration::from_secs(10);
/// Default [`Limits::idle_timeout`].
pub const DEFAULT_IDLE_TIMEOUT: Duration = Duration::from_secs(60);
/// Default [`Limits::body_timeout`].
pub const DEFAULT_BODY_TIMEOUT: Duration = Duration::from_secs(10);
/// Default [`Limits::body_min_rate`]: 1 MiB/s.
pub const DEFAULT_BODY_MIN_RATE: u64 = 1024 * 1024;
/// Default [`Limits::body_memory`]: 48 MiB (two bodies of the largest
/// size at once, beside the small ones).
pub const DEFAULT_BODY_MEMORY: usize = 48 * 1024 * 1024;

/// Bounds on what peers may hold.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Limits {
    /// Connections open at once, from everyone (default: the file
    /// descriptor limit less a tenth, at least 64 less, see
    /// [`default_max_connections`]). At the cap a new connection closes
    /// the oldest one that has not shown who it is; when all have, it is
    /// refused.
    pub max_connections: usize,
    /// How long a request's headers may take to arrive, from their first
    /// byte (default 10 s).
    pub header_timeout: Duration,
    /// How long a connection may stay open with no request (default 60 s).
    pub idle_timeout: Duration,
    /// How long a request body may take to arrive, plus one second per
    /// [`Limits::body_min_rate`] bytes it has (default 10 s).
    pub body_timeout: Duration,
    /// The slowest a request body may arrive, in bytes per second, on
    /// average (default 1 MiB/s).
    pub body_min_rate: u64,
    /// Bytes of request bodies held at once, from everyone (default 48
    /// MiB): a body waits for room (within its deadline) before it is
    /// read. A quarter is kept for bodies of at most 64 KiB, so large
    /// uploads cannot hold up small calls.
    pub body_memory: usize,
}

/// The flags of [`Limits`] (flatten into a binary's clap `Parser`).
#[derive(Debug, Clone, clap::Args)]
pub struct LimitFlags {
    /// Connections open at once, from everyone (default: the open file
    /// limit less a tenth). At the cap a new connection closes the oldest
    /// that has not authenticated or subscribed; when all have, it is
    /// refused.
    #[arg(long)]
    pub max_connections: Option<usize>,
    /// How long a request's headers may take to arrive, from their first
    /// byte; then the connection is closed.
    #[arg(long, default_value = "10s", value_parser = agora_proto::parse_duration)]
    pub http_header_timeout: Duration,
    /// How long a connection may stay open with no request; then it is
    /// closed (WebSockets and event streams are not idle).
    #[arg(long, default_value = "60s", value_parser = agora_proto::parse_duration)]
    pub idle_connection_timeout: Duration,
    /// How long a request body may take to arrive (plus a second per
    /// --http-body-min-rate bytes it declares); then 408 and the
    /// connection is closed. A WebSocket message in progress has as
    /// long (plus a second per --http-body-min-rate bytes it declares).
    #[arg(long, default_value = "10s", value_parser = agora_proto::parse_duration)]
    pub http_body_timeout: Duration,
    /// The slowest average rate, in bytes per second, a request body or
    /// WebSocket message may arrive at (with --http-body-timeout).
    #[arg(long, default_value_t = DEFAULT_BODY_MIN_RATE)]
    pub http_body_min_rate: u64,
    /// Bytes of request bodies and WebSocket messages held at once, from
    /// all peers; a body or a WebSocket frame waits (within its deadline)
    /// for room before it is read.
    #[arg(long, default_value_t = DEFAULT_BODY_MEMORY)]
    pub max_http_body_memory: usize,
}

/// Open files kept at least for everything but connections: the
/// process's own files, and connections closed to make room that do not
/// hold their descriptors for long.
pub const RESERVED_FILES: u64 = 64;

/// The process's open file limit (soft), if it can be read.
pub fn open_file_limit() -> Option<u64> {
    nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE)
        .ok()
        .map(|(soft, _)| soft)
}

/// [`Limits::max_connections`] for an open file limit of `nofile`: a
/// tenth (at least 64) is kept for everything else (the registry, logs,
/// etcd, executors' pipes), and for the connections accepted while
/// others close to make room.
pub fn default_max_connections(nofile: Option<u64>) -> usize {
    let nofile = nofile.unwrap_or(1024).min(usize::MAX as u64 / 2) as usize;
    nofile
        .saturating_sub((nofile / 10).max(RESERVED_FILES as usize))
        .max(16)
}

// === impl Limits ===

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_connections: default_max_connections(open_file_limit()),
            header_timeout: DEFAULT_HEADER_TIMEOUT,
            idle_timeout: DEFAULT_IDLE_TIMEOUT,
            body_timeout: DEFAULT_BODY_TIMEOUT,
            body_min_rate: DEFAULT_BODY_MIN_RATE,
            body_memory: DEFAULT_BODY_MEMORY,
        }
    }
}

impl Limits {
    /// Checks that the limits are usable: `max_body` is the largest body
    /// the process accepts, which must fit in `body_memory`.
    pub fn validate(&self, max_body: usize) -> Result<(), String> {
        for (name, d) in [
            ("http_header_timeout", self.header_timeout),
            ("idle_connection_timeout", self.idle_timeout),
            ("http_body_timeout", self.body_timeout),
        ] {
            if d.is_zero() {
                return Err(format!("{name} must be greater than zero"));
            }
        }
        if self.max_connections == 0 {
            return Err("max_connections must be at least 1".into());
        }
        if self.body_memory < max_body || self.body_memory > u32::MAX as usize {
            return Err(format!(
                "max_http_body_memory must be between {max_body} (the largest request body) and {}",
                u32::MAX
            ));
        }
        if let Some(nofile) = open_file_limit() {
            if self.max_connections as u64 + RESERVED_FILES > nofile {
                return Err(format!(
                    "max_connections ({}) must be at least {RESERVED_FILES} below the open file limit ({nofile})",
                    self.max_connections
                ));
            }
        }
        Ok(())
    }
}

impl LimitFlags {
    /// The limits these flags say.
    pub fn limits(&self) -> Limits {
        Limits {
            max_connections: self
                .max_connections
                .unwrap_or_else(|| default_max_connections(open_file_limit())),
            header_timeout: self.http_header_timeout,
            idle_timeout: self.idle_connection_timeout,
            body_timeout: self.http_body_timeout,
            body_min_rate: self.http_body_min_rate,
            body_memory: self.max_http_body_memory,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_connection_cap_stays_below_the_file_limit() {
        assert_eq!(default_max_connections(Some(1024)), 922);
        assert_eq!(default_max_connections(Some(256)), 192);
        assert_eq!(default_max_connections(Some(1 << 20)), 943_719);
        assert_eq!(default_max_connections(Some(10)), 16);
        let limits = Limits::default();
        if let Some(nofile) = open_file_limit() {
            assert!((limits.max_connections as u64) < nofile.max(17));
        }
        assert!(limits.validate(16 << 20).is_ok());
        let small = Limits {
            body_memory: 1024,
            ..limits
        };
        assert!(small.validate(16 << 20).is_err());
    }
}
