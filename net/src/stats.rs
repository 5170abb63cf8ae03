//! What the accept loop and the body reader counted, for a process's
//! `/metrics` (Prometheus text, under the process's prefix).

use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};

/// Counters of connections and request bodies.
#[derive(Debug, Default)]
pub struct NetStats {
    /// Connections open now.
    pub open: AtomicU64,
    /// Connections that showed who they are (see
    /// [`crate::Connection::establish`]), since start.
    pub established: AtomicU64,
    /// New connections closed at once: every open one was established
    /// and the global cap reached.
    pub refused: AtomicU64,
    /// Connections not established closed to make room for a new one
    /// from the same address.
    pub closed_peer_cap: AtomicU64,
    /// Connections not established closed to make room at the global cap.
    pub closed_global_cap: AtomicU64,
    /// Connections closed because a request's headers did not all arrive
    /// in time.
    pub closed_header_timeout: AtomicU64,
    /// Idle connections closed.
    pub closed_idle_timeout: AtomicU64,
    /// WebSocket connections closed because a message did not all arrive
    /// in time.
    pub closed_message_timeout: AtomicU64,
    /// Request bodies refused for their size (declared or read).
    pub bodies_too_large: AtomicU64,
    /// Request bodies that did not arrive in time.
    pub bodies_timed_out: AtomicU64,
    /// Bytes of request bodies and WebSocket messages held now.
    pub body_bytes: AtomicU64,
}

impl NetStats {
    /// The counters as Prometheus text, each name under `prefix` (e.g.
    /// `agora_master`).
    pub fn render(&self, prefix: &str, out: &mut String) {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        let mut family = |name: &str, kind: &str, help: &str, series: &[(&str, u64)]| {
            let _ = writeln!(out, "# HELP {prefix}_{name} {help}");
            let _ = writeln!(out, "# TYPE {prefix}_{name} {kind}");
            for (labels, value) in series {
                if labels.is_empty() {
                    let _ = writeln!(out, "{prefix}_{name} {value}");
                } else {
                    let _ = writeln!(out, "{prefix}_{name}{{{labels}}} {value}");
                }
            }
        };
        family(
            "connections_open",
            "gauge",
            "Connections open now",
            &[("", get(&self.open))],
        );
        family(
            "connections_established_total",
            "counter",
            "Connections that authenticated or carry a framework or agent (exempt from the per-address cap)",
            &[("", get(&self.established))],
        );
        family(
            "connections_refused_total",
            "counter",
            "New connections closed at once at the global connection cap (every open one established)",
            &[("", get(&self.refused))],
        );
        family(
            "connections_closed_total",
            "counter",
            "Connections closed by the server: to make room (peer_cap, global_cap) or after a timeout (header, idle, a WebSocket message not received in time)",
            &[
                ("reason=\"peer_cap\"", get(&self.closed_peer_cap)),
                ("reason=\"global_cap\"", get(&self.closed_global_cap)),
                ("reason=\"header_timeout\"", get(&self.closed_header_timeout)),
                ("reason=\"idle_timeout\"", get(&self.closed_idle_timeout)),
                (
                    "reason=\"message_timeout\"",
                    get(&self.closed_message_timeout),
                ),
            ],
        );
        family(
            "http_bodies_refused_total",
            "counter",
            "Request bodies refused: too large (413) or not sent in time (408)",
            &[
                ("reason=\"too_large\"", get(&self.bodies_too_large)),
                ("reason=\"timeout\"", get(&self.bodies_timed_out)),
            ],
        );
        family(
            "http_body_bytes",
            "gauge",
            "Bytes of request bodies and WebSocket messages being read now",
            &[("", get(&self.body_bytes))],
        );
    }
}
