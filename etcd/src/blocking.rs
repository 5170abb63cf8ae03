//! [`Client`]: the etcd calls for code that is not async (the master's
//! registry, the workers' election thread and store, tests). Each call
//! runs on `agora_client::blocking`'s shared runtime and blocks the
//! calling thread for at most [`REQUEST_TIMEOUT`](crate::REQUEST_TIMEOUT).

use crate::{EtcdError, KeyValue, TxnOp, TxnResult};

/// A blocking client for one etcd endpoint.
#[derive(Debug, Clone)]
pub struct Client {
    inner: crate::Client,
}

// === impl Client ===

impl Client {
    /// A client for `endpoint` (`HOST:PORT` or `http://HOST:PORT`).
    pub fn new(endpoint: &str) -> Result<Client, EtcdError> {
        crate::Client::new(endpoint).map(Client::from)
    }

    /// The async client underneath.
    pub fn async_client(&self) -> &crate::Client {
        &self.inner
    }

    /// `HOST:PORT` of etcd.
    pub fn endpoint(&self) -> &str {
        self.inner.endpoint()
    }

    /// See [`crate::Client::grant`].
    pub fn grant(&self, ttl: i64) -> Result<i64, EtcdError> {
        let c = self.inner.clone();
        agora_client::blocking::block_on(async move { c.grant(ttl).await })
    }

    /// See [`crate::Client::keep_alive`].
    pub fn keep_alive(&self, id: i64) -> Result<i64, EtcdError> {
        let c = self.inner.clone();
        agora_client::blocking::block_on(async move { c.keep_alive(id).await })
    }

    /// See [`crate::Client::revoke`].
    pub fn revoke(&self, id: i64) -> Result<(), EtcdError> {
        let c = self.inner.clone();
        agora_client::blocking::block_on(async move { c.revoke(id).await })
    }

    /// See [`crate::Client::get`].
    pub fn get(&self, key: &[u8]) -> Result<Option<KeyValue>, EtcdError> {
        let (c, key) = (self.inner.clone(), key.to_vec());
        agora_client::blocking::block_on(async move { c.get(&key).await })
    }

    /// See [`crate::Client::get_prefix`].
    pub fn get_prefix(&self, prefix: &[u8]) -> Result<Vec<KeyValue>, EtcdError> {
        let (c, prefix) = (self.inner.clone(), prefix.to_vec());
        agora_client::blocking::block_on(async move { c.get_prefix(&prefix).await })
    }

    /// See [`crate::Client::create`].
    pub fn create(&self, key: &[u8], value: &[u8], lease: i64) -> Result<TxnResult, EtcdError> {
        let (c, key, value) = (self.inner.clone(), key.to_vec(), value.to_vec());
        agora_client::blocking::block_on(async move { c.create(&key, &value, lease).await })
    }

    /// See [`crate::Client::txn_if_created_at`].
    pub fn txn_if_created_at(
        &self,
        key: &[u8],
        revision: i64,
        ops: &[TxnOp],
    ) -> Result<TxnResult, EtcdError> {
        let (c, key, ops) = (self.inner.clone(), key.to_vec(), ops.to_vec());
        agora_client::blocking::block_on(
            async move { c.txn_if_created_at(&key, revision, &ops).await },
        )
    }
}

impl From<crate::Client> for Client {
    fn from(inner: crate::Client) -> Client {
        Client { inner }
    }
}
