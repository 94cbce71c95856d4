//! The datastore edge: a small trait the syncer drives, and its etcd v3 implementation.
//!
//! The trait speaks only in raw keys and values and etcd-style revisions, so the syncer's
//! reconnect/resync logic is independent of the client library.

use std::future::Future;
use std::path::Path;
use std::time::Duration;

use etcd_client::{
    Client, ConnectOptions, EventType, GetOptions, SortOrder, SortTarget, WatchOptions, WatchStream,
};

use super::watch_liveness::timeout_running;

/// Keys per page of the initial list.
const PAGE_SIZE: i64 = 2000;

/// One changed key; `value: None` is a deletion.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Change {
    pub key: String,
    pub value: Option<Vec<u8>>,
    pub mod_revision: i64,
}

/// Everything under a prefix at one revision.
#[derive(Debug, Clone, Default)]
pub struct Listing {
    pub revision: i64,
    pub kvs: Vec<(String, Vec<u8>)>,
}

/// What a watch delivers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WatchMessage {
    /// Changes, in revision order; every change up to `revision` has now been delivered.
    Changes { revision: i64, changes: Vec<Change> },
    /// A progress notification: the store was at `revision` when it was generated.
    Progress { revision: i64 },
    /// The start revision was compacted away: the caller must list again.
    Compacted { compact_revision: i64 },
    /// The watch was created; `revision` is the store's revision at that moment (events up to it
    /// may still be queued for delivery if the watch started in the past).
    Created { revision: i64 },
}

#[derive(Debug, thiserror::Error)]
pub enum DatastoreError {
    #[error("etcd: {}", describe(.0))]
    Etcd(#[from] etcd_client::Error),
    /// etcd could not be reached or the connection broke (TCP, TLS handshake, HTTP/2), as opposed to
    /// an error answered by etcd itself.
    #[error("etcd at {endpoints}: {message}")]
    Connection { endpoints: String, message: String },
    #[error("etcd request timed out after {0:?}")]
    Timeout(Duration),
    #[error("etcd watch stream ended")]
    WatchEnded,
    /// An open watch delivered nothing, not even an answer to a progress request, for this long:
    /// the connection is presumed dead (a stopped member, a half-open TCP connection).
    /// (Two checks in a row unanswered, see `watch_liveness`.)
    #[error("etcd watch silent for {0:?} (no event and no progress answer): presumed dead")]
    WatchSilent(Duration),
    #[error("etcd watch canceled: {0}")]
    WatchCanceled(String),
    #[error("etcd tls file {path}: {source}")]
    TlsFile {
        path: String,
        source: std::io::Error,
    },
}

/// A datastore the syncer can list and watch.
pub trait Datastore: Send + 'static {
    type Watch: DatastoreWatch;
    /// Lists every key under `prefix` at one revision.
    fn list(
        &mut self,
        prefix: &str,
    ) -> impl Future<Output = Result<Listing, DatastoreError>> + Send;
    /// Watches `prefix` from `start_revision` (inclusive), with progress notifications.
    fn watch(
        &mut self,
        prefix: &str,
        start_revision: i64,
    ) -> impl Future<Output = Result<Self::Watch, DatastoreError>> + Send;
    /// Forgets the connection: the next request opens a new one (after a watch went silent, the
    /// old connection may be half dead and would hold every request until its timeout).
    fn reset(&mut self);
}

/// An open watch.
pub trait DatastoreWatch: Send + 'static {
    fn next(&mut self) -> impl Future<Output = Result<WatchMessage, DatastoreError>> + Send;
    /// Asks the server for a progress notification as soon as possible.
    fn request_progress(&mut self) -> impl Future<Output = Result<(), DatastoreError>> + Send;
    /// One small request over the watch's connection, answered by the nearest server (for etcd a
    /// serializable read of one key, which a grpc-proxy answers from its cache): `Ok` means the
    /// connection is alive. The request owns what it needs, so it runs beside [`Self::next`] (an
    /// event that arrives meanwhile is taken, and counts as alive too).
    fn ping(&self) -> impl Future<Output = Result<(), DatastoreError>> + Send + 'static;
}

/// TLS material for etcd, as paths.
#[derive(Debug, Clone, Default)]
pub struct EtcdTls {
    pub ca: Option<String>,
    pub cert: Option<String>,
    pub key: Option<String>,
}

/// etcd v3 through etcd-client. Connects lazily and reconnects after errors.
pub struct EtcdDatastore {
    endpoints: Vec<String>,
    tls: EtcdTls,
    timeout: Duration,
    client: Option<Client>,
}

impl EtcdDatastore {
    /// Turns a connection-level etcd error into [`DatastoreError::Connection`] naming the endpoints
    /// and, with TLS configured, saying that the TLS connection failed (and that no client
    /// certificate was offered, when none was configured): "transport error" alone tells an operator
    /// nothing.
    fn explain(&self, e: DatastoreError) -> DatastoreError {
        let inner = match &e {
            DatastoreError::Etcd(inner) if is_connection_error(inner) => inner,
            _ => return e,
        };
        let detail = describe(inner);
        let message = if self.tls.ca.is_some() || self.tls.cert.is_some() {
            let lower = detail.to_ascii_lowercase();
            let tls_said = ["certificate", "tls", "alert", "handshake"]
                .iter()
                .any(|k| lower.contains(k));
            let mut m = if tls_said {
                format!("TLS handshake failed: {detail}")
            } else {
                format!("TLS connection failed: {detail}")
            };
            if self.tls.cert.is_none() {
                m.push_str(
                    " (no client certificate configured: if etcd requires one, set --etcd-cert and --etcd-key)",
                );
            }
            m
        } else {
            format!("connection failed: {detail}")
        };
        DatastoreError::Connection {
            endpoints: self.endpoints.join(","),
            message,
        }
    }

    /// A request failed: the next one reconnects. The error, explained.
    fn failed(&mut self, e: DatastoreError) -> DatastoreError {
        self.client = None;
        self.explain(e)
    }

    pub fn new(endpoints: Vec<String>, tls: EtcdTls, timeout: Duration) -> Self {
        Self {
            endpoints,
            tls,
            timeout,
            client: None,
        }
    }

    fn options(&self) -> Result<ConnectOptions, DatastoreError> {
        // No HTTP/2 keepalive pings: etcd 3.4's grpc-proxy (grpc-go's default enforcement policy)
        // closes a client that pings more often than every 5 minutes with GOAWAY "too many
        // pings". A dead connection is found by the syncer's watch liveness check instead
        // (progress answers, or a ping read where those never come; see syncer.rs) and every
        // other request has a timeout.
        let mut opts = ConnectOptions::new().with_connect_timeout(self.timeout);
        let cert_and_key = self
            .tls
            .cert
            .as_deref()
            .map(Path::new)
            .zip(self.tls.key.as_deref().map(Path::new));
        let tls = etcd_tls::tls_options(self.tls.ca.as_deref().map(Path::new), cert_and_key)
            .map_err(|e| DatastoreError::TlsFile {
                path: e.path.display().to_string(),
                source: e.source,
            })?;
        if let Some(tls) = tls {
            opts = opts.with_tls(tls);
        }
        Ok(opts)
    }

    async fn client(&mut self) -> Result<Client, DatastoreError> {
        if let Some(c) = &self.client {
            return Ok(c.clone());
        }
        let opts = self.options()?;
        let connect = Client::connect(self.endpoints.clone(), Some(opts));
        let client = timeout_running(self.timeout, connect)
            .await
            .map_err(|_| DatastoreError::Timeout(self.timeout))?
            .map_err(|e| self.explain(e.into()))?;
        self.client = Some(client.clone());
        Ok(client)
    }

    async fn list_pages(client: &mut Client, prefix: &str) -> Result<Listing, DatastoreError> {
        let end = prefix_end(prefix.as_bytes());
        let mut from = prefix.as_bytes().to_vec();
        let mut listing = Listing::default();
        loop {
            let mut opts = GetOptions::new()
                .with_range(end.clone())
                .with_limit(PAGE_SIZE)
                .with_sort(SortTarget::Key, SortOrder::Ascend);
            if listing.revision > 0 {
                opts = opts.with_revision(listing.revision);
            }
            let resp = client.get(from.clone(), Some(opts)).await?;
            if listing.revision == 0 {
                listing.revision = resp.header().map_or(0, |h| h.revision());
            }
            let more = resp.more();
            let mut last = None;
            for kv in resp.kvs() {
                last = Some(kv.key().to_vec());
                // Non-UTF-8 keys cannot be Calico keys; the syncer counts them as malformed.
                let key = String::from_utf8_lossy(kv.key()).into_owned();
                listing.kvs.push((key, kv.value().to_vec()));
            }
            match (more, last) {
                (true, Some(mut last)) => {
                    last.push(0);
                    from = last;
                }
                _ => return Ok(listing),
            }
        }
    }
}

/// Whether `e` is about reaching etcd (connect, TLS, HTTP/2 transport) rather than an answer from it:
/// tonic wraps transport failures in a status that carries the transport error as its source.
fn is_connection_error(e: &etcd_client::Error) -> bool {
    use std::error::Error as _;
    match e {
        etcd_client::Error::TransportError(_) | etcd_client::Error::IoError(_) => true,
        etcd_client::Error::GRpcStatus(s) => s.source().is_some(),
        _ => false,
    }
}

/// One line for an etcd-client error: for gRPC statuses the message and then each distinct cause
/// (where rustls/hyper say what went wrong, e.g. `invalid peer certificate: UnknownIssuer`), instead
/// of the status's debug dump.
fn describe(e: &etcd_client::Error) -> String {
    use std::error::Error as _;
    let (mut text, mut cause) = match e {
        etcd_client::Error::GRpcStatus(s) => (s.message().to_string(), s.source()),
        etcd_client::Error::TransportError(t) => (t.to_string(), t.source()),
        other => return other.to_string(),
    };
    while let Some(c) = cause {
        let msg = c.to_string();
        if !msg.is_empty() && !text.contains(&msg) {
            text.push_str(": ");
            text.push_str(&msg);
        }
        cause = c.source();
    }
    text
}

/// The first key after every key that starts with `prefix`.
fn prefix_end(prefix: &[u8]) -> Vec<u8> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return end;
        }
    }
    vec![0]
}

impl Datastore for EtcdDatastore {
    type Watch = EtcdWatch;

    fn reset(&mut self) {
        self.client = None;
    }

    async fn list(&mut self, prefix: &str) -> Result<Listing, DatastoreError> {
        let mut client = self.client().await?;
        let timeout = self.timeout * 10;
        timeout_running(timeout, Self::list_pages(&mut client, prefix))
            .await
            .map_err(|_| DatastoreError::Timeout(timeout))
            .and_then(|r| r)
            .map_err(|e| self.failed(e))
    }

    async fn watch(
        &mut self,
        prefix: &str,
        start_revision: i64,
    ) -> Result<EtcdWatch, DatastoreError> {
        let mut client = self.client().await?;
        if let Some(compacted) = self
            .probe_compacted(&mut client, prefix, start_revision)
            .await?
        {
            return Ok(EtcdWatch {
                stream: None,
                compacted: Some(compacted),
                client,
                key: prefix.to_string(),
            });
        }
        let opts = WatchOptions::new()
            .with_prefix()
            .with_start_revision(start_revision)
            .with_progress_notify();
        let stream = timeout_running(self.timeout, client.watch(prefix, Some(opts)))
            .await
            .map_err(|_| DatastoreError::Timeout(self.timeout))
            .and_then(|r| r.map_err(DatastoreError::from))
            .map_err(|e| self.failed(e))?;
        Ok(EtcdWatch {
            stream: Some(stream),
            compacted: None,
            client,
            key: prefix.to_string(),
        })
    }
}

impl EtcdDatastore {
    /// Whether a watch from `start_revision` would start in compacted history, asked of etcd with a
    /// linearizable read of one key at `start_revision - 1` (the last revision the caller holds):
    /// `Some(start_revision)` when it is compacted. etcd 3.4's grpc-proxy does not reliably pass a
    /// watch's compaction on: a watch at a compacted revision, opened while the proxy (re)starts,
    /// can join the proxy's dead broadcast for that revision and then deliver nothing, ever
    /// (etcd-io/etcd#10650, seen in the fan-out bench's proxy-restart storm). Asking first costs one
    /// small read per watch (a reconnect or a relist), and a relist is always correct. A read
    /// cannot tell a revision compacted exactly at `start_revision` from an older one, so that case
    /// lists again too.
    async fn probe_compacted(
        &mut self,
        client: &mut Client,
        prefix: &str,
        start_revision: i64,
    ) -> Result<Option<i64>, DatastoreError> {
        if start_revision <= 1 {
            return Ok(None);
        }
        let opts = GetOptions::new()
            .with_revision(start_revision - 1)
            .with_keys_only()
            .with_limit(1);
        let got = timeout_running(self.timeout, client.get(prefix, Some(opts)))
            .await
            .map_err(|_| DatastoreError::Timeout(self.timeout))
            .and_then(|r| r.map_err(DatastoreError::from));
        match got {
            Ok(_) => Ok(None),
            Err(DatastoreError::Etcd(etcd_client::Error::GRpcStatus(s)))
                // etcd's ErrCompacted, "etcdserver: mvcc: required revision has been compacted".
                if s.message().contains("required revision has been compacted") =>
            {
                Ok(Some(start_revision))
            }
            Err(e) => Err(self.failed(e)),
        }
    }
}

/// An open etcd watch stream, or a watch that would start in compacted history (it reports the
/// compaction and nothing else).
pub struct EtcdWatch {
    stream: Option<WatchStream>,
    compacted: Option<i64>,
    /// The connection the watch runs on, for [`DatastoreWatch::ping`].
    client: Client,
    /// The watched prefix, read as one key by [`DatastoreWatch::ping`].
    key: String,
}

impl DatastoreWatch for EtcdWatch {
    async fn next(&mut self) -> Result<WatchMessage, DatastoreError> {
        if let Some(compact_revision) = self.compacted.take() {
            return Ok(WatchMessage::Compacted { compact_revision });
        }
        let Some(stream) = self.stream.as_mut() else {
            return Err(DatastoreError::WatchEnded);
        };
        let Some(resp) = stream.message().await? else {
            return Err(DatastoreError::WatchEnded);
        };
        if resp.canceled() {
            if resp.compact_revision() > 0 {
                return Ok(WatchMessage::Compacted {
                    compact_revision: resp.compact_revision(),
                });
            }
            return Err(DatastoreError::WatchCanceled(
                resp.cancel_reason().to_string(),
            ));
        }
        if resp.created() {
            // The creation header carries the store's revision, not what has been delivered.
            let revision = resp.header().map_or(0, |h| h.revision());
            return Ok(WatchMessage::Created { revision });
        }
        if resp.events().is_empty() {
            let revision = resp.header().map_or(0, |h| h.revision());
            return Ok(WatchMessage::Progress { revision });
        }
        let mut changes = Vec::with_capacity(resp.events().len());
        let mut revision = 0;
        for ev in resp.events() {
            let Some(kv) = ev.kv() else { continue };
            revision = revision.max(kv.mod_revision());
            let key = String::from_utf8_lossy(kv.key()).into_owned();
            let value = match ev.event_type() {
                EventType::Put => Some(kv.value().to_vec()),
                EventType::Delete => None,
            };
            changes.push(Change {
                key,
                value,
                mod_revision: kv.mod_revision(),
            });
        }
        // An event response's header may be ahead of the events it carries (etcd splits large
        // catch-ups), so only the events' own revisions count as delivered.
        Ok(WatchMessage::Changes { revision, changes })
    }

    async fn request_progress(&mut self) -> Result<(), DatastoreError> {
        match self.stream.as_mut() {
            Some(stream) => Ok(stream.request_progress().await?),
            None => Ok(()),
        }
    }

    fn ping(&self) -> impl Future<Output = Result<(), DatastoreError>> + Send + 'static {
        let (mut client, key) = (self.client.clone(), self.key.clone());
        async move {
            let opts = GetOptions::new().with_serializable().with_keys_only();
            client.get(key, Some(opts)).await?;
            Ok(())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::prefix_end;

    #[test]
    fn prefix_end_increments_last_byte() {
        assert_eq!(prefix_end(b"/calico/"), b"/calico0".to_vec());
        assert_eq!(prefix_end(b"a\xff"), b"b".to_vec());
        assert_eq!(prefix_end(b"\xff"), vec![0]);
    }
}
