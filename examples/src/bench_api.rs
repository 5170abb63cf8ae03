//! The benches' two front doors: the same framework logic driven through
//! the native scheduler SDK (WebSocket) or through the Mesos v1 HTTP
//! scheduler API ([`crate::mesos_v1_client`]).
//!
//! A bench's framework implements [`BenchFramework`]: offers in,
//! [`Action`]s out, updates in. The native mode applies the actions on a
//! `SchedulerDriver` from its `Scheduler` callbacks (implicit
//! acknowledgements, after the callback); [`drive_v1`] applies them as
//! Mesos calls and acknowledges every update that carries a uuid with one
//! ACKNOWLEDGE each, after the update was handled, as Mesos clients do.

use std::fmt;
use std::net::SocketAddr;
use std::str::FromStr;

use anyhow::Context;

use agora_mesos_proto::convert;
use agora_mesos_proto::v1::scheduler::{event, Call};
use agora_mesos_proto::Codec;
use agora_proto::{Filters, FrameworkInfo, Offer, OfferId, TaskInfo, TaskStatus};
use agora_scheduler::{DriverConfig, Scheduler, SchedulerDriver};

use crate::mesos_v1_client::{self as v1c, CallPipeline, Events, HttpVersion};

/// Which API a bench drives.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Api {
    /// Agora's scheduler SDK over `/api/scheduler` (WebSocket, JSON).
    Native,
    /// The Mesos v1 HTTP scheduler API (`/api/v1/scheduler`).
    V1,
}

/// The APIs a run compares, in order (`--api`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Apis(pub Vec<Api>);

/// What a bench framework decides about an offer.
#[derive(Debug, Clone, PartialEq)]
pub enum Action {
    /// Launch `tasks` on the offer.
    Launch {
        /// The offer.
        offer_id: OfferId,
        /// The tasks.
        tasks: Vec<TaskInfo>,
        /// The filter for what is left of the offer.
        filters: Filters,
    },
    /// Decline the offer.
    Decline {
        /// The offer.
        offer_id: OfferId,
        /// For how long.
        filters: Filters,
    },
    /// No more offers, please.
    Suppress,
}

/// A bench's framework, independent of the API that carries it.
pub trait BenchFramework {
    /// What to do with `offers`.
    fn offers(&mut self, offers: Vec<Offer>) -> Vec<Action>;
    /// An update arrived (it is acknowledged once this returns).
    fn update(&mut self, status: &TaskStatus);
}

/// A bench's framework running on one API.
pub enum Framework {
    /// On the native SDK.
    Native(SchedulerDriver),
    /// On the Mesos v1 API: the task reading the event stream, and the
    /// calls it makes, on a thread of their own.
    V1 {
        /// Runs [`drive_v1`].
        task: tokio::task::JoinHandle<anyhow::Result<()>>,
        /// Its calls.
        pipeline: CallPipeline,
        /// The thread they run on.
        thread: FrameworkThread,
    },
}

/// A thread running a single-threaded runtime for one v1 framework, as
/// the native SDK runs its connection on a thread of its own: the
/// framework's work is not queued among the master's and the agent's
/// tasks (in a deployment it is another process). The runtime stops when
/// this is dropped, and every task on it with it.
pub struct FrameworkThread {
    handle: tokio::runtime::Handle,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
}

/// Parses `--api`: `native`, `v1` or `both`.
pub fn parse_apis(text: &str) -> Result<Apis, String> {
    match text {
        "both" => Ok(Apis(vec![Api::Native, Api::V1])),
        other => other.parse().map(|api| Apis(vec![api])),
    }
}

/// Parses `--codec`: `protobuf` (mesos-go's default) or `json`.
pub fn parse_codec(text: &str) -> Result<Codec, String> {
    match text {
        "protobuf" | "proto" => Ok(Codec::Protobuf),
        "json" => Ok(Codec::Json),
        other => Err(format!("expected protobuf or json, not {other:?}")),
    }
}

// === impl Api ===

impl FromStr for Api {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "native" => Ok(Api::Native),
            "v1" => Ok(Api::V1),
            other => Err(format!("expected native, v1 or both, not {other:?}")),
        }
    }
}

impl fmt::Display for Api {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.pad(match self {
            Api::Native => "native",
            Api::V1 => "v1",
        })
    }
}

// === impl Action ===

impl Action {
    /// Carries the action out through the native driver.
    pub fn apply_native(self, driver: &SchedulerDriver) {
        // Errors surface as the driver's error callback, as for any
        // framework on the SDK.
        let _ = match self {
            Action::Launch {
                offer_id,
                tasks,
                filters,
            } => driver.launch_tasks(std::slice::from_ref(&offer_id), tasks, filters),
            Action::Decline { offer_id, filters } => driver.decline_offer(&offer_id, filters),
            Action::Suppress => driver.suppress_offers(),
        };
    }

    /// The action as a Mesos call (ACCEPT with LAUNCH, DECLINE, SUPPRESS).
    pub fn to_v1_call(&self) -> Call {
        match self {
            Action::Launch {
                offer_id,
                tasks,
                filters,
            } => v1c::accept(
                convert::mesos_offer_id(offer_id),
                tasks.iter().map(v1c::mesos_task).collect(),
                v1c::filters(filters.refuse_seconds),
            ),
            Action::Decline { offer_id, filters } => v1c::decline(
                convert::mesos_offer_id(offer_id),
                v1c::filters(filters.refuse_seconds),
            ),
            Action::Suppress => v1c::suppress(),
        }
    }
}

/// Runs `framework` on a subscription's events until the stream ends or a
/// call fails: offers become calls, every update is handled and then
/// acknowledged (one ACKNOWLEDGE per update with a uuid), all through
/// `pipeline`.
pub async fn drive_v1(
    framework: &mut impl BenchFramework,
    events: &mut Events,
    pipeline: &CallPipeline,
) -> anyhow::Result<()> {
    // Calls made while handling the events of one read go out together
    // once they are handled, before waiting for more (pipelined: one
    // write).
    let mut calls = Vec::new();
    loop {
        let event = match events.buffered()? {
            Some(event) => event,
            None => {
                pipeline.send_all(calls.drain(..)).await;
                match events.next().await? {
                    Some(event) => event,
                    None => break,
                }
            }
        };
        match event.r#type() {
            event::Type::Offers => {
                let offers = event
                    .offers
                    .map(|o| o.offers)
                    .unwrap_or_default()
                    .iter()
                    .map(v1c::offer)
                    .collect::<Result<Vec<_>, _>>()?;
                calls.extend(
                    framework
                        .offers(offers)
                        .into_iter()
                        .map(|action| action.to_v1_call()),
                );
            }
            event::Type::Update => {
                let Some(event::Update { status }) = event.update else {
                    continue;
                };
                framework.update(&v1c::task_status(&status)?);
                calls.extend(v1c::acknowledge(&status));
            }
            event::Type::Error => {
                anyhow::bail!(
                    "the master sent ERROR: {}",
                    event.error.map(|e| e.message).unwrap_or_default()
                )
            }
            _ => {}
        }
        if let Some(failure) = pipeline.failure() {
            anyhow::bail!("a Mesos call failed: {failure}");
        }
    }
    anyhow::bail!("the master ended the event stream")
}

/// How a v1 framework speaks: codec, calls in flight, HTTP.
#[derive(Debug, Clone, Copy)]
pub struct V1Options {
    /// Codec of calls and events.
    pub codec: Codec,
    /// Most calls in flight at once.
    pub calls_in_flight: usize,
    /// The HTTP of the calls.
    pub http: HttpVersion,
}

// === impl Framework ===

impl Framework {
    /// Subscribes `bench` as `info` at `master` through `api` (v1: as
    /// `v1` says) and runs it, with TLS and a credential when `secure`.
    /// For v1 it returns once SUBSCRIBED has arrived.
    pub async fn start<B>(
        bench: B,
        info: FrameworkInfo,
        master: SocketAddr,
        api: Api,
        v1: V1Options,
        secure: Option<&crate::secure::Secure>,
    ) -> anyhow::Result<Framework>
    where
        B: Scheduler + BenchFramework + Send + 'static,
    {
        match api {
            Api::Native => {
                let mut config = DriverConfig::new(master.to_string());
                if let Some(secure) = secure {
                    secure.driver(&mut config);
                }
                let driver = SchedulerDriver::new(bench, info, config);
                driver.start().map_err(|e| anyhow::anyhow!("{e}"))?;
                Ok(Framework::Native(driver))
            }
            Api::V1 => {
                if secure.is_some() {
                    anyhow::bail!("the v1 benchmark client speaks plaintext only: run --security secure with --api native");
                }
                let thread = FrameworkThread::start()?;
                let started = thread.handle.spawn(async move {
                    let http = agora_client::Http::new();
                    let mut subscription = v1c::subscribe(
                        &http,
                        &master.to_string(),
                        v1.codec,
                        convert::mesos_framework_info(&info),
                    )
                    .await
                    .context("subscribing through the Mesos v1 API")?;
                    let pipeline =
                        CallPipeline::new(subscription.calls.clone(), v1.calls_in_flight, v1.http);
                    let calls = pipeline.clone();
                    let task = tokio::spawn(async move {
                        let mut bench = bench;
                        let result = drive_v1(&mut bench, &mut subscription.events, &calls).await;
                        // The ERROR that answers our own TEARDOWN is no news.
                        if let Err(e) = &result {
                            if !calls.stopping() {
                                eprintln!("v1 framework: {e:#}");
                            }
                        }
                        result
                    });
                    anyhow::Ok((task, pipeline))
                });
                let (task, pipeline) = started.await.context("the v1 framework thread")??;
                Ok(Framework::V1 {
                    task,
                    pipeline,
                    thread,
                })
            }
        }
    }

    /// Why the framework stopped early, if it did (the v1 stream ended or
    /// a call failed).
    pub fn failed(&self) -> Option<anyhow::Error> {
        match self {
            Framework::Native(_) => None,
            Framework::V1 { task, pipeline, .. } => pipeline
                .failure()
                .map(|f| anyhow::anyhow!("a Mesos call failed: {f}"))
                .or_else(|| {
                    task.is_finished()
                        .then(|| anyhow::anyhow!("the v1 event loop ended (its error is above)"))
                }),
        }
    }

    /// Tears the framework down (native: `stop(false)`; v1: TEARDOWN, then
    /// the stream is dropped).
    pub async fn stop(self) {
        match self {
            Framework::Native(driver) => {
                let _ = driver.stop(false);
            }
            Framework::V1 {
                task,
                pipeline,
                thread,
            } => {
                pipeline.stop();
                pipeline.send(v1c::teardown()).await;
                pipeline.drain().await;
                task.abort();
                drop(thread);
            }
        }
    }
}

// === impl FrameworkThread ===

impl FrameworkThread {
    fn start() -> anyhow::Result<FrameworkThread> {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .context("building the v1 framework's runtime")?;
        let handle = runtime.handle().clone();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        std::thread::Builder::new()
            .name("v1-framework".into())
            .spawn(move || {
                runtime.block_on(async {
                    let _ = stopped.await;
                });
            })
            .context("starting the v1 framework's thread")?;
        Ok(FrameworkThread {
            handle,
            stop: Some(stop),
        })
    }
}

impl Drop for FrameworkThread {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }
}

/// How a bench's table marks a figure against its target.
pub fn verdict(met: bool) -> &'static str {
    if met {
        "met"
    } else {
        "NOT met"
    }
}

/// Rates of a benchmark point's repeated runs: their median and range
/// (what a shared, noisy machine can report).
pub struct Runs {
    pub median: f64,
    pub min: f64,
    pub max: f64,
}

impl Runs {
    /// `None` for no runs.
    pub fn of(mut rates: Vec<f64>) -> Option<Runs> {
        if rates.is_empty() {
            return None;
        }
        rates.sort_by(f64::total_cmp);
        let n = rates.len();
        let median = if n % 2 == 1 {
            rates[n / 2]
        } else {
            (rates[n / 2 - 1] + rates[n / 2]) / 2.0
        };
        Some(Runs {
            median,
            min: rates[0],
            max: rates[n - 1],
        })
    }
}

impl std::fmt::Display for Runs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.min == self.max {
            write!(f, "{:.0}", self.median)
        } else {
            write!(f, "{:.0} [{:.0}-{:.0}]", self.median, self.min, self.max)
        }
    }
}
