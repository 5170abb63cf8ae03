//! High availability through etcd (feature `etcd`, flag `--etcd`).
//!
//! Every master started with `--etcd` serves HTTP at once but campaigns
//! before it acts: it creates `PREFIX/leader` (a [`LeaderInfo`]) attached
//! to a lease of `--etcd-lease-ttl`, in a transaction that succeeds only
//! if the key does not exist. The winner is the leader; the others are
//! standbys that poll the key and campaign again when it disappears
//! (when the leader's lease expires or is revoked).
//!
//! - A **standby** answers `/health` (`standby`, with the leader's
//!   address), `/version` and `/metrics`; everything else, the scheduler
//!   and agent WebSockets included, gets `503` with the leader's address
//!   in the `X-Agora-Leader` header and the body, so clients detect again;
//!   the Mesos v1 APIs and `/master/redirect` get `307` to the leader
//!   instead (`Location: //LEADER/PATH`, as Mesos writes it), which Mesos
//!   clients follow (`503` while there is none).
//! - The **leader** loads the registry from etcd ([`EtcdRegistry`]) and
//!   only then opens its gate. Every registry write is a transaction
//!   fenced on the leader key's create revision, so a deposed leader's
//!   write fails.
//! - It renews its lease every quarter TTL. It holds leadership only
//!   until the last successful renewal's send time plus the TTL; the
//!   state task checks that before every registry write and every
//!   delivery ([`crate::event_loop::Leadership`]), so a leader that was
//!   frozen past its lease (or cut off from etcd) sends nothing once it
//!   runs again. A leader that loses its lease stops: it closes every
//!   connection and [`crate::run`] returns [`crate::MasterError::Deposed`];
//!   `agora-master` then exits non-zero, and its supervisor restarts it
//!   as a fresh candidate.

mod registry;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use agora_discovery::{leader_key, random_sample, Backoff, DEFAULT_JITTER};
use agora_etcd::{Client, EtcdError};
use agora_proto::LeaderInfo;
use axum::extract::{Request, State};
use axum::http::{header, HeaderValue, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::Json;
use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

pub(crate) use registry::EtcdRegistry;

use crate::config::EtcdOptions;
use crate::event_loop::Leadership;

/// How often a standby reads the leader key.
const STANDBY_POLL: Duration = Duration::from_millis(200);
/// First pause after etcd could not be reached during a campaign
/// (doubling, with jitter, up to [`CAMPAIGN_RETRY_MAX`]).
const CAMPAIGN_RETRY: Duration = Duration::from_millis(500);
const CAMPAIGN_RETRY_MAX: Duration = Duration::from_secs(2);
/// Header carrying the leader's address on a standby's refusals.
pub(crate) const LEADER_HEADER: &str = "x-agora-leader";

/// What this master is right now; read by [`gate`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Role {
    /// Campaigning; `leader` is the current leader's address if any.
    Standby { leader: Option<String> },
    /// Won and loaded the registry: serving.
    Leader,
    /// Lost its lease: stopping.
    Deposed,
}

/// One master's candidacy.
pub(crate) struct Election {
    client: Client,
    prefix: String,
    leader_key: String,
    lease_ttl: Duration,
    me: LeaderInfo,
    role: watch::Sender<Role>,
}

/// The leader's hold on its lease, shared by the renewal task and the
/// state task.
#[derive(Debug)]
pub(crate) struct Lease {
    base: Instant,
    /// Nanoseconds after `base` until which the lease surely holds.
    valid_until: AtomicU64,
    lost: AtomicBool,
    reason: Mutex<Option<String>>,
}

/// What winning gives the state task.
pub(crate) struct Won {
    pub(crate) store: EtcdRegistry,
    pub(crate) lease: Arc<Lease>,
}

// === impl Election ===

impl Election {
    /// A candidate that will publish `me`; the receiver drives [`gate`].
    pub(crate) fn new(
        options: &EtcdOptions,
        me: LeaderInfo,
    ) -> Result<(Election, watch::Receiver<Role>), EtcdError> {
        let client = Client::new(&options.endpoint)?;
        let (role, role_rx) = watch::channel(Role::Standby { leader: None });
        let election = Election {
            client,
            prefix: options.prefix.trim_end_matches('/').to_string(),
            leader_key: leader_key(&options.prefix),
            lease_ttl: options.lease_ttl,
            me,
            role,
        };
        Ok((election, role_rx))
    }

    /// Campaigns until this master leads (`Some`) or `shutdown` fires
    /// (`None`). On winning, starts renewing the lease and loads the
    /// registry; the gate stays closed until [`Election::open`].
    pub(crate) async fn campaign(
        &self,
        removed_capacity: usize,
        shutdown: &CancellationToken,
    ) -> Option<Result<Won, crate::RegistryError>> {
        let ttl_secs = self.lease_ttl.as_secs_f64().ceil().max(1.0) as i64;
        let value = serde_json::to_vec(&self.me).unwrap_or_default();
        let mut retry = Backoff::new(CAMPAIGN_RETRY, CAMPAIGN_RETRY_MAX, DEFAULT_JITTER);
        loop {
            if shutdown.is_cancelled() {
                return None;
            }
            let attempt = self.try_win(ttl_secs, &value).await;
            let pause = match attempt {
                Ok(Attempt::Won {
                    lease_id,
                    ttl,
                    revision,
                    sent,
                }) => {
                    tracing::info!(
                        lease_id,
                        revision,
                        "won the leader election; loading the registry from etcd"
                    );
                    let lease = Arc::new(Lease::new(sent + ttl));
                    tokio::spawn(renew(
                        self.client.clone(),
                        (lease_id, self.leader_key.clone(), revision),
                        ttl,
                        lease.clone(),
                        self.role.clone(),
                        shutdown.clone(),
                    ));
                    let client = agora_etcd::blocking::Client::from(self.client.clone());
                    let prefix = self.prefix.clone();
                    let key = self.leader_key.clone();
                    let store = tokio::task::spawn_blocking(move || {
                        EtcdRegistry::load(client, &prefix, key, revision, removed_capacity)
                    })
                    .await
                    .unwrap_or_else(|e| Err(crate::RegistryError::Etcd(e.to_string())));
                    return Some(store.map(|store| Won { store, lease }));
                }
                Ok(Attempt::Lost(leader)) => {
                    retry.reset();
                    let leader = leader.map(|l| l.address);
                    self.role.send_if_modified(|role| {
                        let next = Role::Standby {
                            leader: leader.clone(),
                        };
                        if *role != next {
                            tracing::info!(?leader, "standing by");
                            *role = next;
                            true
                        } else {
                            false
                        }
                    });
                    STANDBY_POLL
                }
                Err(e) => {
                    tracing::warn!(error = %e, "cannot campaign: etcd is unreachable");
                    retry.next_delay(random_sample())
                }
            };
            tokio::select! {
                _ = shutdown.cancelled() => return None,
                _ = tokio::time::sleep(pause) => {}
            }
        }
    }

    /// Opens the gate: from now on connections are served.
    pub(crate) fn open(&self) {
        self.role.send_replace(Role::Leader);
    }

    async fn try_win(&self, ttl_secs: i64, value: &[u8]) -> Result<Attempt, EtcdError> {
        let client = &self.client;
        let key = &self.leader_key;
        if let Some(leader) = self.leader().await? {
            return Ok(Attempt::Lost(Some(leader)));
        }
        let sent = Instant::now();
        let lease_id = client.grant(ttl_secs).await?;
        let result = client.create(key.as_bytes(), value, lease_id).await?;
        if result.succeeded {
            return Ok(Attempt::Won {
                lease_id,
                ttl: Duration::from_secs(ttl_secs.max(1) as u64),
                revision: result.revision,
                sent,
            });
        }
        // Someone else won in between; our lease holds nothing.
        let _ = client.revoke(lease_id).await;
        Ok(Attempt::Lost(self.leader().await?))
    }

    /// The leader recorded in the key (an unreadable record counts as
    /// none: it is replaced when its lease runs out).
    async fn leader(&self) -> Result<Option<LeaderInfo>, EtcdError> {
        let kv = self.client.get(self.leader_key.as_bytes()).await?;
        Ok(kv.and_then(|kv| serde_json::from_slice(&kv.value).ok()))
    }
}

enum Attempt {
    Won {
        lease_id: i64,
        ttl: Duration,
        revision: i64,
        sent: Instant,
    },
    Lost(Option<LeaderInfo>),
}

/// Renews the lease every quarter TTL, and checks the leader key is
/// still the one we created, until either fails or `shutdown` fires
/// (then revokes the lease, so a standby takes over at once).
async fn renew(
    client: Client,
    (lease_id, key, revision): (i64, String, i64),
    ttl: Duration,
    lease: Arc<Lease>,
    role: watch::Sender<Role>,
    shutdown: CancellationToken,
) {
    let period = ttl / 4;
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => break,
            _ = tokio::time::sleep(period) => {}
        }
        let now = Instant::now();
        if !lease.holds(now) {
            lease.lose(
                "the lease expired before it could be renewed",
                &role,
                &shutdown,
            );
            return;
        }
        let sent = now;
        let renewal = async {
            let remaining = client.keep_alive(lease_id).await?;
            let ours = client
                .get(key.as_bytes())
                .await?
                .is_some_and(|kv| kv.create_revision == revision);
            Ok::<_, EtcdError>((remaining, ours))
        };
        // An etcd that does not answer must not keep us leading past the
        // lease: stop at its deadline even while the request hangs.
        let answer = tokio::select! {
            answer = renewal => answer,
            _ = tokio::time::sleep_until(lease.deadline()) => {
                lease.lose("the lease ran out while etcd did not answer", &role, &shutdown);
                return;
            }
        };
        match answer {
            Ok((remaining, true)) if remaining > 0 => {
                lease.extend(sent + Duration::from_secs(remaining as u64).min(ttl));
            }
            Ok((remaining, _)) if remaining <= 0 => {
                lease.lose("etcd says the lease is gone", &role, &shutdown);
                return;
            }
            Ok(_) => {
                lease.lose("the leader key is no longer ours", &role, &shutdown);
                return;
            }
            // Retried on the next period while the lease still holds.
            Err(e) => tracing::warn!(error = %e, "cannot renew the leader lease"),
        }
    }
    if !lease.is_lost() {
        // A clean shutdown hands leadership over without waiting for the TTL.
        let _ = client.revoke(lease_id).await;
        tracing::info!("leadership released");
    }
}

// === impl Lease ===

impl Lease {
    fn new(valid_until: Instant) -> Lease {
        let base = Instant::now();
        let lease = Lease {
            base,
            valid_until: AtomicU64::new(0),
            lost: AtomicBool::new(false),
            reason: Mutex::new(None),
        };
        lease.extend(valid_until);
        lease
    }

    fn extend(&self, until: Instant) {
        let nanos = until.saturating_duration_since(self.base).as_nanos() as u64;
        self.valid_until.fetch_max(nanos, Ordering::SeqCst);
    }

    fn deadline(&self) -> Instant {
        self.base + Duration::from_nanos(self.valid_until.load(Ordering::SeqCst))
    }

    fn is_lost(&self) -> bool {
        self.lost.load(Ordering::SeqCst)
    }

    /// Marks leadership lost, closes the gate and stops the master.
    pub(crate) fn lose(&self, reason: &str, role: &watch::Sender<Role>, stop: &CancellationToken) {
        if self.lost.swap(true, Ordering::SeqCst) {
            return;
        }
        tracing::error!(
            reason,
            "lost leadership; stopping at once (restart the master to campaign again)"
        );
        if let Ok(mut r) = self.reason.lock() {
            *r = Some(reason.to_string());
        }
        role.send_replace(Role::Deposed);
        stop.cancel();
    }

    /// Why leadership was lost, once it was.
    pub(crate) fn lost_reason(&self) -> Option<String> {
        if !self.is_lost() {
            return None;
        }
        self.reason
            .lock()
            .ok()
            .and_then(|r| r.clone())
            .or_else(|| Some("leadership lost".into()))
    }
}

impl Leadership for Arc<Lease> {
    fn holds(&self, now: Instant) -> bool {
        !self.is_lost() && now < self.deadline()
    }

    fn lost(&self, reason: &str) {
        if let Ok(mut r) = self.reason.lock() {
            r.get_or_insert_with(|| reason.to_string());
        }
        self.lost.store(true, Ordering::SeqCst);
    }
}

/// Middleware: a master that is not the leader serves only `/health`,
/// `/version` and `/metrics`, and refuses the rest with the leader's
/// address.
pub(crate) async fn gate(
    State(role): State<watch::Receiver<Role>>,
    request: Request,
    next: Next,
) -> Response {
    let role = role.borrow().clone();
    let (state, leader) = match role {
        Role::Leader => return next.run(request).await,
        Role::Standby { leader } => ("standby", leader),
        Role::Deposed => ("deposed", None),
    };
    match request.uri().path() {
        "/version" | "/metrics" => next.run(request).await,
        // Mesos clients follow a 307 to the leader. The Location is
        // Mesos's own: `//host:port/PATH`, the request's path on the
        // leader, scheme-relative. pymesos and mesos-go keep only its
        // host:port; mesoshttp's `requests` follows it as a URL, which
        // needs the path. `/master/redirect` answers `//host:port`.
        path @ ("/api/v1/scheduler"
        | "/master/api/v1/scheduler"
        | "/api/v1"
        | "/master/api/v1"
        | "/api/v1/operator"
        | "/master/api/v1/operator"
        | "/master/redirect"
        | "/redirect") => match &leader {
            Some(l) => {
                let location = if path.ends_with("redirect") {
                    format!("//{l}")
                } else {
                    format!("//{l}{path}")
                };
                let mut response = (
                    StatusCode::TEMPORARY_REDIRECT,
                    format!("not the leader; the leader is {l}"),
                )
                    .into_response();
                if let Ok(value) = HeaderValue::from_str(&location) {
                    response.headers_mut().insert(header::LOCATION, value);
                }
                response
            }
            None => (
                StatusCode::SERVICE_UNAVAILABLE,
                "not the leader; no leader elected yet",
            )
                .into_response(),
        },
        "/health" => {
            let wants_json = request
                .headers()
                .get(header::ACCEPT)
                .and_then(|v| v.to_str().ok())
                .is_some_and(|v| v.contains("application/json"));
            if wants_json {
                Json(serde_json::json!({ "status": state, "role": state, "leader": leader }))
                    .into_response()
            } else {
                match &leader {
                    Some(l) => format!("{state}; the leader is {l}").into_response(),
                    None => format!("{state}; no leader elected yet").into_response(),
                }
            }
        }
        _ => {
            let body = match &leader {
                Some(l) => format!("not the leader; the leader is {l}"),
                None => "not the leader; no leader elected yet".to_string(),
            };
            let mut response = (StatusCode::SERVICE_UNAVAILABLE, body).into_response();
            if let Some(value) = leader.and_then(|l| HeaderValue::from_str(&l).ok()) {
                response.headers_mut().insert(LEADER_HEADER, value);
            }
            response
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn lease_holds_until_its_deadline() {
        let lease = Arc::new(Lease::new(Instant::now() + Duration::from_secs(60)));
        assert!(lease.holds(Instant::now()));
        assert!(!lease.holds(Instant::now() + Duration::from_secs(61)));
        Leadership::lost(&lease, "test");
        assert!(!lease.holds(Instant::now()));
        assert_eq!(lease.lost_reason().as_deref(), Some("test"));
    }
}
