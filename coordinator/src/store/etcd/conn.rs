//! One connection to etcd under one prefix, shared by the leadership and the
//! key-value store above it: connecting, with the checks that make a wrong
//! address, certificate or user fail at startup with the fix rather than at
//! the first write; and every request under [`REQUEST_TIMEOUT`], its error
//! naming the endpoints, since a coordinator may be given several.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use etcd_client::{Client, ConnectOptions, GetOptions, KvClient};
use tokio::time::timeout;

use crate::store::backend::{StoreError, StoreResult};
use crate::store::etcd_access::EtcdAccess;

/// How long one etcd request may take before it fails.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);
/// How long startup waits for etcd to answer.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// Largest response a scan page may be (values are whole log batches, reports).
const MAX_RESPONSE_BYTES: usize = 256 * 1024 * 1024;

/// `--etcd-prefix` as used: ending in `/` so that `/gpuctl` and `/gpuctl2`
/// never share keys (an empty prefix stays empty).
pub fn normalize_prefix(prefix: &str) -> String {
    if prefix.is_empty() || prefix.ends_with('/') {
        prefix.to_string()
    } else {
        format!("{prefix}/")
    }
}

pub(super) struct Conn {
    /// The endpoints as given, for messages.
    pub(super) endpoints: String,
    pub(super) prefix: String,
    pub(super) client: Client,
    pub(super) kv: KvClient,
    closed: AtomicBool,
}

impl Conn {
    /// Connects to `endpoints` (comma-separated URLs) over TLS and with
    /// etcd's authentication as `access` says, and checks that etcd answers
    /// a read under the prefix.
    pub(super) async fn open(
        endpoints: &str,
        prefix: &str,
        access: &EtcdAccess,
    ) -> StoreResult<Conn> {
        let list: Vec<String> = endpoints
            .split(',')
            .map(|s| s.trim().to_string())
            .filter(|s| !s.is_empty())
            .collect();
        let unreachable = |e: &dyn std::fmt::Display| {
            let e = e.to_string();
            StoreError::Backend(format!(
                "cannot reach etcd at {endpoints}: {e}; start etcd (or fix --etcd) or use --store embedded; {}",
                access.hint(&e)
            ))
        };
        if list.is_empty() {
            return Err(StoreError::Backend(
                "--etcd is empty: give the etcd URL, e.g. --etcd http://127.0.0.1:2379".into(),
            ));
        }
        if access.tls() {
            if let Some(plain) = list.iter().find(|u| u.starts_with("http://")) {
                return Err(StoreError::Backend(format!(
                    "--etcd {plain}: with --etcd-ca or --etcd-cert give https:// URLs"
                )));
            }
        }
        let options = access.apply(
            ConnectOptions::new()
                .with_connect_timeout(CONNECT_TIMEOUT)
                .with_keep_alive(Duration::from_secs(10), Duration::from_secs(5)),
        )?;
        let mut client = Client::connect(&list, Some(options))
            .await
            .map_err(|e| unreachable(&e))?;
        match timeout(CONNECT_TIMEOUT, client.status()).await {
            Ok(Ok(_)) => {}
            Ok(Err(e)) => return Err(unreachable(&e)),
            Err(_) => {
                return Err(unreachable(&format!(
                    "no answer within {}s",
                    CONNECT_TIMEOUT.as_secs()
                )))
            }
        }
        // `status` answers without a user; a read under the prefix does not.
        let probe = GetOptions::new()
            .with_prefix()
            .with_keys_only()
            .with_limit(1);
        match timeout(
            CONNECT_TIMEOUT,
            client.get(normalize_prefix(prefix), Some(probe)),
        )
        .await
        {
            Ok(Ok(_)) => {}
            Ok(Err(e)) => {
                let e = e.to_string();
                return Err(StoreError::Backend(format!(
                    "etcd at {endpoints} refused a read under {}: {e}; {}",
                    normalize_prefix(prefix),
                    access.hint(&e)
                )));
            }
            Err(_) => return Err(unreachable(&"no answer to a read")),
        }
        let kv = client
            .kv_client()
            .max_decoding_message_size(MAX_RESPONSE_BYTES)
            .max_encoding_message_size(MAX_RESPONSE_BYTES);
        Ok(Conn {
            endpoints: endpoints.to_string(),
            prefix: normalize_prefix(prefix),
            client,
            kv,
            closed: AtomicBool::new(false),
        })
    }

    pub(super) fn full(&self, key: &str) -> String {
        format!("{}{key}", self.prefix)
    }

    pub(super) fn err(&self, what: &str, e: impl std::fmt::Display) -> StoreError {
        StoreError::Backend(format!("etcd at {}: {what}: {e}", self.endpoints))
    }

    /// Runs one request under [`REQUEST_TIMEOUT`].
    pub(super) async fn call<T>(
        &self,
        what: &str,
        fut: impl std::future::Future<Output = Result<T, etcd_client::Error>>,
    ) -> StoreResult<T> {
        if self.closed.load(Ordering::SeqCst) {
            return Err(StoreError::Backend("the store is closed".into()));
        }
        match timeout(REQUEST_TIMEOUT, fut).await {
            Ok(r) => r.map_err(|e| self.err(what, e)),
            Err(_) => Err(self.err(
                what,
                format!("no answer within {}s", REQUEST_TIMEOUT.as_secs()),
            )),
        }
    }

    /// Fails every later request, so that nothing is written after the
    /// leader key is released.
    pub(super) fn close(&self) {
        self.closed.store(true, Ordering::SeqCst);
    }
}
