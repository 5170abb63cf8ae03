//! The etcd client against a real etcd, started by each test on
//! 127.0.0.1 ephemeral ports (skipped with a message when etcd is not
//! installed, failing under `CI=true`): leases, reads, fenced
//! transactions, and watches (puts, deletes, lease expiry, replay from a
//! revision, the end of a watch when etcd goes away).

use std::time::Duration;

use agora_etcd::testing::TestEtcd;
use agora_etcd::{Client, EventKind, TxnOp, WatchEvent};

/// How long a test waits for a watch event.
const WAIT: Duration = Duration::from_secs(10);

fn etcd() -> Option<(tempfile::TempDir, TestEtcd, Client)> {
    let dir = tempfile::tempdir().expect("temp dir");
    let etcd = TestEtcd::start(dir.path())?;
    let client = Client::new(&etcd.endpoint).expect("client");
    Some((dir, etcd, client))
}

async fn next(watch: &mut agora_etcd::Watch) -> Vec<WatchEvent> {
    tokio::time::timeout(WAIT, watch.next())
        .await
        .expect("a watch event in time")
        .expect("the watch works")
        .expect("the watch goes on")
}

fn put(key: &[u8], value: &[u8]) -> TxnOp {
    TxnOp::Put {
        key: key.to_vec(),
        value: value.to_vec(),
        lease: 0,
    }
}

#[tokio::test]
async fn leases_keys_and_fenced_transactions() {
    let Some((_dir, _etcd, client)) = etcd() else {
        return;
    };
    let key = b"/t/leader";
    assert_eq!(client.get(key).await.unwrap(), None);
    let lease = client.grant(30).await.unwrap();
    let won = client.create(key, b"a", lease).await.unwrap();
    assert!(won.succeeded);
    assert!(!client.create(key, b"b", 0).await.unwrap().succeeded);
    let kv = client.get(key).await.unwrap().expect("the key");
    assert_eq!((kv.value.as_slice(), kv.lease), (&b"a"[..], lease));
    assert_eq!(kv.create_revision, won.revision);
    assert!(client.keep_alive(lease).await.unwrap() > 0);

    // Fenced writes land while the key is the one created...
    let fenced = client
        .txn_if_created_at(
            key,
            won.revision,
            &[put(b"/t/r/x", b"1"), put(b"/t/r/y", b"2")],
        )
        .await
        .unwrap();
    assert!(fenced.succeeded);
    let all = client.get_prefix(b"/t/r/").await.unwrap();
    let keys: Vec<_> = all.iter().map(|kv| kv.key.as_slice()).collect();
    assert_eq!(keys, vec![&b"/t/r/x"[..], b"/t/r/y"]);

    // ...and not once it was re-created by someone else.
    client.revoke(lease).await.unwrap();
    assert_eq!(client.get(key).await.unwrap(), None, "revoking deletes");
    assert!(client.keep_alive(lease).await.unwrap() <= 0);
    assert!(client.create(key, b"b", 0).await.unwrap().succeeded);
    let stale = client
        .txn_if_created_at(key, won.revision, &[put(b"/t/r/x", b"2")])
        .await
        .unwrap();
    assert!(!stale.succeeded);
    assert_eq!(client.get(b"/t/r/x").await.unwrap().unwrap().value, b"1");
}

#[tokio::test]
async fn a_watch_delivers_puts_and_deletes_in_order() {
    let Some((_dir, _etcd, client)) = etcd() else {
        return;
    };
    let key = b"/w/leader";
    let (none, revision) = client.get_at(key).await.unwrap();
    assert_eq!(none, None);
    let mut watch = client.watch(key, revision + 1).await.unwrap();
    let lease = client.grant(30).await.unwrap();
    client.create(key, b"first", lease).await.unwrap();
    let events = next(&mut watch).await;
    assert_eq!(events.len(), 1);
    assert_eq!(events[0].kind, EventKind::Put);
    assert_eq!(events[0].kv.value, b"first");
    assert_eq!(events[0].kv.lease, lease);
    // Another key changing is not seen.
    client.create(b"/w/other", b"x", 0).await.unwrap();
    client.revoke(lease).await.unwrap();
    let events = next(&mut watch).await;
    assert_eq!(events[0].kind, EventKind::Delete);
    assert_eq!(events[0].kv.key, key);
    assert!(watch.revision() > revision);
}

#[tokio::test]
async fn a_watch_from_a_revision_replays_what_came_after_it() {
    let Some((_dir, _etcd, client)) = etcd() else {
        return;
    };
    let key = b"/r/leader";
    let (_, read_at) = client.get_at(key).await.unwrap();
    // Changes between the read and the watch are not lost.
    client.create(key, b"one", 0).await.unwrap();
    let created = client.get(key).await.unwrap().unwrap().create_revision;
    client
        .txn_if_created_at(key, created, &[put(key, b"two")])
        .await
        .unwrap();
    let mut watch = client.watch(key, read_at + 1).await.unwrap();
    let mut values = Vec::new();
    while values.len() < 2 {
        for event in next(&mut watch).await {
            values.push(String::from_utf8(event.kv.value).unwrap());
        }
    }
    assert_eq!(values, ["one", "two"]);
}

#[tokio::test]
async fn an_expired_lease_is_a_delete_event() {
    let Some((_dir, _etcd, client)) = etcd() else {
        return;
    };
    let key = b"/e/leader";
    let lease = client.grant(2).await.unwrap();
    client.create(key, b"mortal", lease).await.unwrap();
    let (_, revision) = client.get_at(key).await.unwrap();
    let mut watch = client.watch(key, revision + 1).await.unwrap();
    let events = next(&mut watch).await;
    assert_eq!(events[0].kind, EventKind::Delete);
    assert_eq!(client.get(key).await.unwrap(), None);
}

#[tokio::test]
async fn a_watch_ends_when_etcd_goes_away() {
    let Some((_dir, etcd, client)) = etcd() else {
        return;
    };
    let mut watch = client.watch(b"/gone", 0).await.unwrap();
    drop(etcd);
    let end = tokio::time::timeout(WAIT, watch.next())
        .await
        .expect("the watch ends in time");
    assert!(matches!(end, Ok(None) | Err(_)), "{end:?}");
    assert!(client.get(b"/gone").await.is_err());
}

/// The blocking client (the registry's, the workers') works from a
/// thread that is itself inside a runtime.
#[tokio::test]
async fn the_blocking_client_works_inside_a_runtime() {
    let Some((_dir, etcd, _client)) = etcd() else {
        return;
    };
    let blocking = etcd.client();
    assert!(blocking.create(b"/b/k", b"v", 0).unwrap().succeeded);
    assert_eq!(blocking.get(b"/b/k").unwrap().unwrap().value, b"v");
    assert_eq!(blocking.get_prefix(b"/b/").unwrap().len(), 1);
}

#[tokio::test]
async fn an_unreachable_etcd_is_an_error_in_time() {
    // A port nothing listens on.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let client = Client::new(&format!("127.0.0.1:{port}")).unwrap();
    let started = std::time::Instant::now();
    assert!(client.get(b"/x").await.is_err());
    assert!(client.watch(b"/x", 0).await.is_err());
    assert!(started.elapsed() < agora_etcd::REQUEST_TIMEOUT * 3);
}
