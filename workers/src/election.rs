//! Leader election for job runtimes on etcd (feature `etcd`), after
//! Flink's `LeaderContender` / `LeaderElection` (seed 003).
//!
//! Each runtime process is a contender for `PREFIX/leader`: it creates
//! the key on a lease of `lease_ttl` in a transaction that succeeds only
//! if the key does not exist. The winner's [`LeaderEpoch`] is the key's
//! create revision, which grows with every new leader.
//!
//! - On winning, [`LeaderContender::grant_leadership`] runs with the new
//!   epoch. The contender starts its worker driver (with an
//!   [`EtcdStore`](crate::store::EtcdStore) fenced on that epoch) and only
//!   then calls [`LeaderElection::confirm_leadership`], which publishes
//!   its address in the key, if it still leads. Workers and clients read
//!   the address with [`current_leader`]; an unconfirmed leader has none.
//! - The lease is renewed every quarter TTL, and each renewal checks that
//!   the key is still the one this contender created. Leadership is held
//!   only until the last successful renewal's send time plus the TTL: a
//!   process frozen past that, or cut off from etcd, revokes itself
//!   ([`LeaderContender::revoke_leadership`]) instead of acting on, then
//!   campaigns again.
//! - A deposed leader is fenced twice: its store writes fail (they are
//!   transactions on its epoch), and the master ends its scheduler
//!   connection when the new leader subscribes with the framework id.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread;
use std::time::{Duration, Instant};

use agora_discovery::{random_sample, Backoff, DEFAULT_JITTER};
use agora_etcd::blocking::Client;
use agora_etcd::{EtcdError, TxnOp};
use serde::{Deserialize, Serialize};

/// Longest pause between campaign attempts while etcd fails (the first
/// is twice the poll; each doubles, with jitter).
const ERROR_PAUSE_MAX: Duration = Duration::from_secs(5);

/// `PREFIX/leader`: the key runtimes campaign for.
fn leader_key(prefix: &str) -> String {
    format!("{}/leader", prefix.trim_end_matches('/'))
}

/// A leader's term: the create revision of the leader key it won.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct LeaderEpoch(pub i64);

/// What a leader publishes in the key.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RuntimeLeader {
    /// The contender's id (new per process).
    pub contender: String,
    /// `HOST:PORT` the leader serves on, once it confirmed leadership.
    #[serde(default)]
    pub address: Option<String>,
    /// Its epoch (filled in from the key's create revision when read).
    #[serde(default)]
    pub epoch: Option<LeaderEpoch>,
}

/// A process taking part in the election. Callbacks run on the
/// election's thread, one at a time; they must return quickly (start or
/// stop work on another thread or task).
pub trait LeaderContender: Send + Sync + 'static {
    /// This contender now leads with `epoch`.
    fn grant_leadership(&self, epoch: LeaderEpoch);
    /// This contender no longer leads: stop acting as leader at once.
    fn revoke_leadership(&self);
    /// etcd could not be reached for a while (leadership, if held, is
    /// revoked separately once the lease runs out).
    fn handle_error(&self, error: &ElectionError) {
        let _ = error;
    }
}

/// Where the election runs and how.
#[derive(Debug, Clone)]
pub struct ElectionOptions {
    /// etcd `HOST:PORT`.
    pub endpoint: String,
    /// Key prefix; the key is `PREFIX/leader`.
    pub prefix: String,
    /// Lease time to live. Default 5 s.
    pub lease_ttl: Duration,
    /// How often a follower reads the key. Default 200 ms.
    pub poll: Duration,
    /// This contender's id.
    pub contender: String,
}

/// Why an election call failed.
#[derive(Debug, thiserror::Error)]
pub enum ElectionError {
    /// etcd failed.
    #[error(transparent)]
    Etcd(#[from] EtcdError),
    /// The election's thread could not start.
    #[error("cannot start the election: {0}")]
    Io(#[from] std::io::Error),
}

/// A running candidacy; stops campaigning when closed or dropped.
pub struct LeaderElection {
    inner: Arc<Inner>,
    thread: Option<thread::JoinHandle<()>>,
}

struct Inner {
    client: Client,
    key: String,
    options: ElectionOptions,
    closed: AtomicBool,
    held: Mutex<Option<Held>>,
}

#[derive(Debug, Clone, Copy)]
struct Held {
    epoch: LeaderEpoch,
    lease: i64,
}

// === impl ElectionOptions ===

impl ElectionOptions {
    /// An election in etcd at `endpoint` under `prefix`, with defaults.
    pub fn new(endpoint: impl Into<String>, prefix: impl Into<String>) -> Self {
        ElectionOptions {
            endpoint: endpoint.into(),
            prefix: prefix.into(),
            lease_ttl: Duration::from_secs(5),
            poll: Duration::from_millis(200),
            contender: format!("{}-{}", std::process::id(), rand::random::<u32>()),
        }
    }
}

// === impl LeaderElection ===

impl LeaderElection {
    /// Starts campaigning for `contender`.
    pub fn start(
        options: ElectionOptions,
        contender: Arc<dyn LeaderContender>,
    ) -> Result<LeaderElection, ElectionError> {
        let client = Client::new(&options.endpoint)?;
        let inner = Arc::new(Inner {
            client,
            key: leader_key(&options.prefix),
            options,
            closed: AtomicBool::new(false),
            held: Mutex::new(None),
        });
        let campaign = inner.clone();
        let thread = thread::Builder::new()
            .name("agora-runtime-election".into())
            .spawn(move || campaign.run(contender))?;
        Ok(LeaderElection {
            inner,
            thread: Some(thread),
        })
    }

    /// The leader key (`PREFIX/leader`), for the fenced store.
    pub fn leader_key(&self) -> &str {
        &self.inner.key
    }

    /// Publishes `address` as the leader's, if `epoch` still leads.
    /// Returns whether it did (a contender deposed meanwhile gets `false`).
    pub fn confirm_leadership(
        &self,
        epoch: LeaderEpoch,
        address: &str,
    ) -> Result<bool, ElectionError> {
        let Some(held) = self.inner.held() else {
            return Ok(false);
        };
        if held.epoch != epoch {
            return Ok(false);
        }
        let value = RuntimeLeader {
            contender: self.inner.options.contender.clone(),
            address: Some(address.to_string()),
            epoch: None,
        };
        let put = TxnOp::Put {
            key: self.inner.key.clone().into_bytes(),
            value: serde_json::to_vec(&value).unwrap_or_default(),
            lease: held.lease,
        };
        let done =
            self.inner
                .client
                .txn_if_created_at(self.inner.key.as_bytes(), epoch.0, &[put])?;
        Ok(done.succeeded)
    }

    /// Whether this contender leads with `epoch` right now (as far as its
    /// last renewal knows).
    pub fn has_leadership(&self, epoch: LeaderEpoch) -> bool {
        self.inner.held().is_some_and(|h| h.epoch == epoch)
    }

    /// Stops campaigning; a leader gives its lease back (the next
    /// contender takes over at once) after being told to revoke.
    pub fn close(mut self) {
        self.shutdown();
    }

    fn shutdown(&mut self) {
        self.inner.closed.store(true, Ordering::SeqCst);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

impl Drop for LeaderElection {
    fn drop(&mut self) {
        self.shutdown();
    }
}

/// Reads the current leader under `prefix` (`None`: nobody leads).
pub fn current_leader(
    endpoint: &str,
    prefix: &str,
) -> Result<Option<RuntimeLeader>, ElectionError> {
    let client = Client::new(endpoint)?;
    let Some(kv) = client.get(leader_key(prefix).as_bytes())? else {
        return Ok(None);
    };
    let mut leader: RuntimeLeader = serde_json::from_slice(&kv.value).unwrap_or(RuntimeLeader {
        contender: String::new(),
        address: None,
        epoch: None,
    });
    leader.epoch = Some(LeaderEpoch(kv.create_revision));
    Ok(Some(leader))
}

// === impl Inner ===

impl Inner {
    fn held(&self) -> Option<Held> {
        *self.held.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn set_held(&self, held: Option<Held>) {
        *self.held.lock().unwrap_or_else(PoisonError::into_inner) = held;
    }

    fn closed(&self) -> bool {
        self.closed.load(Ordering::SeqCst)
    }

    /// Sleeps up to `d`, waking early when closed.
    fn pause(&self, d: Duration) {
        let end = Instant::now() + d;
        while !self.closed() {
            let left = end.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return;
            }
            thread::sleep(left.min(Duration::from_millis(50)));
        }
    }

    fn run(self: Arc<Self>, contender: Arc<dyn LeaderContender>) {
        let ttl = self.options.lease_ttl.max(Duration::from_secs(1));
        let ttl_secs = ttl.as_secs_f64().ceil() as i64;
        let mut retry = Backoff::new(self.options.poll * 2, ERROR_PAUSE_MAX, DEFAULT_JITTER);
        while !self.closed() {
            match self.try_win(ttl_secs) {
                Ok(Some((held, sent))) => {
                    tracing::info!(epoch = held.epoch.0, "won the runtime leader election");
                    self.set_held(Some(held));
                    contender.grant_leadership(held.epoch);
                    let reason = self.hold(held, sent, ttl);
                    self.set_held(None);
                    tracing::warn!(epoch = held.epoch.0, %reason, "runtime leadership ended");
                    contender.revoke_leadership();
                }
                Ok(None) => {
                    retry.reset();
                    self.pause(self.options.poll);
                }
                Err(e) => {
                    contender.handle_error(&e);
                    self.pause(retry.next_delay(random_sample()));
                }
            }
        }
    }

    /// One campaign attempt: the epoch and the time the lease was asked
    /// for when it won.
    fn try_win(&self, ttl_secs: i64) -> Result<Option<(Held, Instant)>, ElectionError> {
        if self.client.get(self.key.as_bytes())?.is_some() {
            return Ok(None);
        }
        let sent = Instant::now();
        let lease = self.client.grant(ttl_secs)?;
        let value = RuntimeLeader {
            contender: self.options.contender.clone(),
            address: None,
            epoch: None,
        };
        let created = self.client.create(
            self.key.as_bytes(),
            &serde_json::to_vec(&value).unwrap_or_default(),
            lease,
        )?;
        if !created.succeeded {
            let _ = self.client.revoke(lease);
            return Ok(None);
        }
        Ok(Some((
            Held {
                epoch: LeaderEpoch(created.revision),
                lease,
            },
            sent,
        )))
    }

    /// Renews the lease until leadership is lost or the election closes;
    /// returns why it ended.
    fn hold(&self, held: Held, sent: Instant, ttl: Duration) -> String {
        let mut valid_until = sent + ttl;
        loop {
            self.pause(ttl / 4);
            if self.closed() {
                let _ = self.client.revoke(held.lease);
                return "the election was closed; lease given back".into();
            }
            let now = Instant::now();
            if now >= valid_until {
                return "the lease ran out before it was renewed".into();
            }
            let renewed = self.client.keep_alive(held.lease).and_then(|remaining| {
                let ours = self
                    .client
                    .get(self.key.as_bytes())?
                    .is_some_and(|kv| kv.create_revision == held.epoch.0);
                Ok((remaining, ours))
            });
            // Frozen during the renewal? Then the answer is too old to trust.
            if Instant::now() >= valid_until {
                return "the lease ran out while renewing".into();
            }
            match renewed {
                Ok((remaining, true)) if remaining > 0 => {
                    valid_until = now + Duration::from_secs(remaining as u64).min(ttl);
                }
                Ok((remaining, _)) if remaining <= 0 => {
                    return "etcd says the lease is gone".into()
                }
                Ok(_) => return "the leader key is no longer ours".into(),
                Err(e) => tracing::warn!(error = %e, "cannot renew the runtime leader lease"),
            }
        }
    }
}
