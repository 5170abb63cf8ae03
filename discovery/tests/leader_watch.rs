//! Following the leader through a real etcd (started by each test on
//! 127.0.0.1 ephemeral ports; skipped with a message when etcd is not
//! installed, failing under `CI=true`): the locator names the leader,
//! hears of a new one at once through its watch, waits a moment for a
//! new one when told the old one is gone, tells clients to leave when
//! etcd goes away, and makes no request at all while nothing changes.

#![cfg(feature = "etcd")]

use std::time::{Duration, Instant};

use agora_discovery::{leader_key, DiscoveryError, MasterLocator, NEW_LEADER_PATIENCE};
use agora_etcd::testing::TestEtcd;
use agora_proto::LeaderInfo;

const PREFIX: &str = "/agora";

fn etcd() -> Option<(tempfile::TempDir, TestEtcd, agora_etcd::Client)> {
    let dir = tempfile::tempdir().expect("temp dir");
    let etcd = TestEtcd::start(dir.path())?;
    let client = agora_etcd::Client::new(&etcd.endpoint).expect("client");
    Some((dir, etcd, client))
}

fn url(etcd: &TestEtcd) -> String {
    format!("etcd://{}{PREFIX}", etcd.endpoint)
}

/// Makes `address` the leader, as a master does: the key on a lease.
async fn lead(client: &agora_etcd::Client, address: &str) -> i64 {
    let info = LeaderInfo {
        address: address.into(),
        master_id: format!("id-{address}"),
    };
    let lease = client.grant(30).await.unwrap();
    let value = serde_json::to_vec(&info).unwrap();
    let won = client
        .create(leader_key(PREFIX).as_bytes(), &value, lease)
        .await
        .unwrap();
    assert!(won.succeeded, "{address} could not lead");
    lease
}

#[tokio::test]
async fn the_locator_follows_the_leader_as_it_changes() {
    let Some((_dir, etcd, client)) = etcd() else {
        return;
    };
    let locator = MasterLocator::new(&url(&etcd)).unwrap();
    assert!(matches!(
        locator.locate(None).await,
        Err(DiscoveryError::NoLeader(_))
    ));
    let lease_a = lead(&client, "10.0.0.1:5050").await;
    // The watch brings the new leader; no read is needed.
    let located = tokio::time::timeout(Duration::from_secs(5), async {
        loop {
            if let Ok(located) = locator.locate(None).await {
                return located;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .expect("the leader is seen");
    assert_eq!(located.address, "10.0.0.1:5050");
    let mut changed = located.changed;
    assert!(
        tokio::time::timeout(Duration::from_millis(300), &mut changed)
            .await
            .is_err(),
        "the leader did not change"
    );

    // The leader's lease ends: clients hear it at once.
    let revoked = Instant::now();
    client.revoke(lease_a).await.unwrap();
    tokio::time::timeout(Duration::from_secs(2), changed)
        .await
        .expect("told that the leader changed");
    let heard = revoked.elapsed();
    assert!(heard < Duration::from_secs(1), "heard after {heard:?}");

    // A client that lost A waits for someone else, and gets B as soon
    // as B leads.
    let (located, _) = tokio::join!(locator.locate(Some("10.0.0.1:5050")), async {
        tokio::time::sleep(Duration::from_millis(200)).await;
        lead(&client, "10.0.0.2:5050").await
    });
    assert_eq!(located.unwrap().address, "10.0.0.2:5050");
}

#[tokio::test]
async fn a_lost_leader_still_recorded_is_returned_after_the_patience() {
    let Some((_dir, etcd, client)) = etcd() else {
        return;
    };
    lead(&client, "10.0.0.1:5050").await;
    let locator = MasterLocator::new(&url(&etcd)).unwrap();
    assert_eq!(locator.locate(None).await.unwrap().address, "10.0.0.1:5050");
    let started = Instant::now();
    let located = locator.locate(Some("10.0.0.1:5050")).await.unwrap();
    assert_eq!(located.address, "10.0.0.1:5050");
    let waited = started.elapsed();
    assert!(
        waited >= NEW_LEADER_PATIENCE && waited < NEW_LEADER_PATIENCE * 3,
        "{waited:?}"
    );
}

#[tokio::test]
async fn clients_leave_their_master_when_etcd_goes_away() {
    let Some((_dir, etcd, client)) = etcd() else {
        return;
    };
    lead(&client, "10.0.0.1:5050").await;
    let locator = MasterLocator::new(&url(&etcd)).unwrap();
    let located = locator.locate(None).await.unwrap();
    drop(etcd);
    tokio::time::timeout(Duration::from_secs(15), located.changed)
        .await
        .expect("told to leave once etcd is unreachable");
    assert!(matches!(
        locator.locate(None).await,
        Err(DiscoveryError::Unreachable { .. })
    ));
}

/// What idle following costs etcd: `clients` locators that found the
/// leader make no further request while nothing changes (each holds one
/// watch). The polling loops this replaces read the key every 500 ms from
/// every client: 2 requests per second each.
#[tokio::test]
async fn idle_clients_make_no_requests() {
    let Some((_dir, etcd, client)) = etcd() else {
        return;
    };
    lead(&client, "10.0.0.1:5050").await;
    let clients = 100;
    let locators: Vec<_> = (0..clients)
        .map(|_| MasterLocator::new(&url(&etcd)).unwrap())
        .collect();
    let mut changes = Vec::new();
    for locator in &locators {
        changes.push(locator.locate(None).await.unwrap().changed);
    }
    // Let every watch settle, then count etcd's requests over a while.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let before = requests(&etcd.endpoint).await;
    let idle = Duration::from_secs(3);
    tokio::time::sleep(idle).await;
    let after = requests(&etcd.endpoint).await;
    let per_second = (after.0 - before.0) / idle.as_secs_f64();
    eprintln!(
        "{clients} idle clients: {per_second:.1} unary requests/s to etcd, {} watch streams (polling every 500 ms: {} requests/s)",
        after.1,
        clients * 2
    );
    assert_eq!(per_second, 0.0, "idle clients made requests");
    assert!(after.1 >= clients as f64, "{} watch streams", after.1);
    // Every one of them still hears a change.
    client
        .revoke(
            client
                .get(leader_key(PREFIX).as_bytes())
                .await
                .unwrap()
                .unwrap()
                .lease,
        )
        .await
        .unwrap();
    tokio::time::timeout(Duration::from_secs(5), futures_join_all(changes))
        .await
        .expect("every client heard the change");
}

async fn futures_join_all(changes: Vec<agora_discovery::LeaderChanged>) {
    for change in changes {
        change.await;
    }
}

/// (unary KV and lease requests started, watch streams started) from
/// etcd's `/metrics` (the gRPC server counters behind its JSON gateway).
async fn requests(endpoint: &str) -> (f64, f64) {
    let metrics = agora_client::Http::new()
        .get(endpoint, "/metrics")
        .await
        .expect("etcd metrics")
        .text();
    let mut unary = 0.0;
    let mut watches = 0.0;
    for line in metrics.lines() {
        if !line.starts_with("grpc_server_started_total{") {
            continue;
        }
        let value: f64 = line
            .rsplit(' ')
            .next()
            .and_then(|v| v.parse().ok())
            .unwrap_or(0.0);
        if line.contains("grpc_type=\"unary\"") {
            unary += value;
        } else if line.contains("grpc_method=\"Watch\"") {
            watches += value;
        }
    }
    (unary, watches)
}
