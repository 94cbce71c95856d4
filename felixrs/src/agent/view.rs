//! The applied view: the datastore contents whose effects the kernel holds, served to the
//! operator tools on the node over a unix socket in the state directory (`agent.sock`).
//!
//! Why: the snapshot file is written at most once per `snapshot_interval` (1 s), so for up to a
//! second after `/status` reports a revision applied, `trace --state-dir` read an older view and
//! answered "no such pod" or saw a false kernel mismatch. The apply thread publishes the view of
//! the batch it applied *before* it publishes `applied_revision`, so the view served here is
//! never older than what `/status` reports (nor newer than the kernel). The snapshot file stays
//! what a restart starts from; its writer is unchanged. Cost on the apply path: the changed keys
//! of each batch, applied to the agent's copy of the view (about a microsecond a key, not a copy
//! of the view, nor a file write); copying and encoding the view happen only when a tool asks.
//!
//! Protocol (one request per connection): the client writes `view <revision>\n` (the revision it
//! already holds, `-1` for none); the agent answers one byte, then closes: `U` (unchanged: the
//! applied view is at that revision), `N` (nothing applied yet), or `V` followed by the view in
//! the snapshot file's format ([`super::snapshot::encode`], checksummed). `staged\n` asks for the
//! flow collector's staged counts (`felixrs stats`): `S` followed by a JSON array of
//! [`StagedRow`]s, or `N` when flow logs are off. The socket is only for this node's root (mode
//! 0600, in the state directory), as the snapshot file is.

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use super::snapshot::{KvMap, Snapshot, SnapshotError, decode, encode};
use super::status::StatusHub;
use crate::flowlog::collector::StagedRow;

/// The socket's file name inside `--state-dir`.
pub const SOCKET_NAME: &str = "agent.sock";

/// The view the kernel holds: the datastore contents up to `revision`.
#[derive(Debug, Clone)]
pub struct AppliedView {
    pub revision: i64,
    pub kvs: KvMap,
}

/// Changed keys with their new values (`None`: deleted), in order.
pub type ViewDelta = Vec<(Arc<str>, Option<Arc<[u8]>>)>;

/// The socket of a state directory.
pub fn socket_path(state_dir: &Path) -> PathBuf {
    state_dir.join(SOCKET_NAME)
}

/// Serves the hub's applied view on `state_dir/agent.sock` until `stop` fires, then removes the
/// socket. A socket that cannot be made (read-only or full state directory, a path too long)
/// is logged and the tools read the snapshot file instead: enforcement never depends on it.
pub async fn serve(
    state_dir: PathBuf,
    hub: Arc<StatusHub>,
    stop: tokio_util::sync::WaitForCancellationFutureOwned,
) {
    let path = socket_path(&state_dir);
    let listener = match bind(&path) {
        Ok(l) => l,
        Err(error) => {
            tracing::warn!(path = %path.display(), %error, "cannot serve the applied view to the operator tools; they read the snapshot file");
            return;
        }
    };
    tracing::info!(path = %path.display(), "serving the applied view to the operator tools");
    tokio::pin!(stop);
    loop {
        tokio::select! {
            _ = &mut stop => break,
            conn = listener.accept() => match conn {
                Ok((stream, _)) => {
                    tokio::spawn(answer(stream, hub.clone()));
                }
                Err(error) => {
                    tracing::warn!(%error, "applied view socket: accept failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            },
        }
    }
    let _ = std::fs::remove_file(&path);
}

fn bind(path: &Path) -> std::io::Result<tokio::net::UnixListener> {
    use std::os::unix::fs::{FileTypeExt, PermissionsExt};
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    // A socket left by an agent that was killed: nobody answers on it.
    if let Ok(m) = std::fs::symlink_metadata(path)
        && m.file_type().is_socket()
    {
        std::fs::remove_file(path)?;
    }
    let listener = tokio::net::UnixListener::bind(path)?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))?;
    Ok(listener)
}

async fn answer(mut stream: tokio::net::UnixStream, hub: Arc<StatusHub>) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut req = Vec::with_capacity(32);
    let read = async {
        let mut byte = [0u8; 1];
        while req.len() < 64 && !req.ends_with(b"\n") {
            if stream.read(&mut byte).await? == 0 {
                break;
            }
            req.push(byte[0]);
        }
        std::io::Result::Ok(())
    };
    if !matches!(
        tokio::time::timeout(Duration::from_secs(5), read).await,
        Ok(Ok(()))
    ) {
        return;
    }
    let Some(request) = parse_request(&req) else {
        return;
    };
    let have = match request {
        Request::View(have) => have,
        Request::Staged => {
            let reply = match hub.metrics.flow_logs.staged_rows() {
                Some(rows) => {
                    let mut out = vec![b'S'];
                    out.extend(serde_json::to_vec(&rows).unwrap_or_else(|_| b"[]".to_vec()));
                    out
                }
                None => vec![b'N'],
            };
            let _ = tokio::time::timeout(Duration::from_secs(10), stream.write_all(&reply)).await;
            let _ = stream.shutdown().await;
            return;
        }
    };
    let reply = match hub.applied_view_revision() {
        None => vec![b'N'],
        Some(r) if r == have => vec![b'U'],
        Some(_) => {
            let encoded = tokio::task::spawn_blocking(move || {
                let mut out = vec![b'V'];
                if let Some(v) = hub.applied_view() {
                    out.extend(encode(&Snapshot {
                        revision: v.revision,
                        kvs: v.kvs,
                    }));
                }
                out
            })
            .await;
            match encoded {
                Ok(b) => b,
                Err(_) => return,
            }
        }
    };
    let _ = tokio::time::timeout(Duration::from_secs(10), stream.write_all(&reply)).await;
    let _ = stream.shutdown().await;
}

/// A tool's request.
enum Request {
    /// `view <revision>\n`: the applied view, unless the client holds that revision.
    View(i64),
    /// `staged\n`: the staged counts.
    Staged,
}

fn parse_request(req: &[u8]) -> Option<Request> {
    let line = std::str::from_utf8(req).ok()?.strip_suffix('\n')?;
    if line == "staged" {
        return Some(Request::Staged);
    }
    line.strip_prefix("view ")?.parse().ok().map(Request::View)
}

/// What the running agent answered.
#[derive(Debug)]
pub enum Fetched {
    /// Its applied view.
    View(Snapshot),
    /// The applied view is still at the revision the client holds.
    Unchanged,
    /// It has applied nothing yet.
    NothingApplied,
    /// No agent answers on the state directory's socket.
    NotRunning,
}

/// Why the agent's answer could not be read.
#[derive(Debug, thiserror::Error)]
pub enum FetchError {
    #[error("applied view socket {path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("applied view socket {path}: unexpected answer {first:?}")]
    Answer { path: PathBuf, first: Option<u8> },
    #[error("applied view socket {path}: {source}")]
    Decode {
        path: PathBuf,
        source: SnapshotError,
    },
}

/// Sends one request line to the agent's socket at `path` and reads the whole reply (blocking,
/// 10 s timeouts); `None` when no agent listens there.
fn ask(path: &Path, request: &str) -> Result<Option<Vec<u8>>, FetchError> {
    let io = |source| FetchError::Io {
        path: path.to_path_buf(),
        source,
    };
    let mut stream = match UnixStream::connect(path) {
        Ok(s) => s,
        Err(e)
            if matches!(
                e.kind(),
                std::io::ErrorKind::NotFound | std::io::ErrorKind::ConnectionRefused
            ) =>
        {
            return Ok(None);
        }
        Err(e) => return Err(io(e)),
    };
    let timeout = Some(Duration::from_secs(10));
    stream.set_read_timeout(timeout).map_err(io)?;
    stream.set_write_timeout(timeout).map_err(io)?;
    writeln!(stream, "{request}").map_err(io)?;
    let mut reply = Vec::new();
    stream.read_to_end(&mut reply).map_err(io)?;
    Ok(Some(reply))
}

/// Asks the agent of `state_dir` for its applied view (blocking; `have`: the revision the
/// caller holds, to be told `Unchanged` instead of the whole view).
pub fn fetch(state_dir: &Path, have: Option<i64>) -> Result<Fetched, FetchError> {
    let path = socket_path(state_dir);
    let Some(reply) = ask(&path, &format!("view {}", have.unwrap_or(-1)))? else {
        return Ok(Fetched::NotRunning);
    };
    match reply.split_first() {
        Some((b'U', [])) => Ok(Fetched::Unchanged),
        Some((b'N', [])) => Ok(Fetched::NothingApplied),
        Some((b'V', body)) => {
            decode(body)
                .map(Fetched::View)
                .map_err(|source| FetchError::Decode {
                    path: path.clone(),
                    source,
                })
        }
        other => Err(FetchError::Answer {
            path: path.clone(),
            first: other.map(|(b, _)| *b),
        }),
    }
}

/// Asks the agent of `state_dir` for its flow collector's staged counts (blocking); `None` when
/// no agent answers or its flow logs are off.
pub fn fetch_staged(state_dir: &Path) -> Result<Option<Vec<StagedRow>>, FetchError> {
    let path = socket_path(state_dir);
    let Some(reply) = ask(&path, "staged")? else {
        return Ok(None);
    };
    match reply.split_first() {
        Some((b'N', [])) => Ok(None),
        Some((b'S', body)) => serde_json::from_slice(body)
            .map(Some)
            .map_err(|e| FetchError::Io {
                path: path.clone(),
                source: std::io::Error::new(std::io::ErrorKind::InvalidData, e),
            }),
        other => Err(FetchError::Answer {
            path: path.clone(),
            first: other.map(|(b, _)| *b),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::agent::metrics::Metrics;

    fn kvs(n: usize) -> KvMap {
        (0..n)
            .map(|i| {
                (
                    Arc::from(format!("/calico/resources/v3/projectcalico.org/x/{i}").as_str()),
                    Arc::from(format!("{{\"i\":{i}}}").into_bytes().as_slice()),
                )
            })
            .collect()
    }

    /// Nothing applied, then a view, then the same revision again (unchanged), then a newer one;
    /// a stale socket of a dead agent is replaced; the socket is gone after stop; without an
    /// agent the client says so.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn serves_the_applied_view_to_the_tools() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("state");
        std::fs::create_dir_all(&dir).unwrap();
        // A dead agent's socket.
        drop(std::os::unix::net::UnixListener::bind(socket_path(&dir)).unwrap());
        let hub = StatusHub::new(Metrics::new());
        let cancel = tokio_util::sync::CancellationToken::new();
        let server = tokio::spawn(serve(
            dir.clone(),
            hub.clone(),
            cancel.clone().cancelled_owned(),
        ));
        let ask = |have: Option<i64>| {
            let dir = dir.clone();
            async move {
                for _ in 0..100 {
                    let d = dir.clone();
                    match tokio::task::spawn_blocking(move || fetch(&d, have))
                        .await
                        .unwrap()
                    {
                        Ok(Fetched::NotRunning) => {
                            tokio::time::sleep(Duration::from_millis(20)).await
                        }
                        other => return other,
                    }
                }
                panic!("the agent's socket never answered");
            }
        };
        assert!(matches!(ask(None).await, Ok(Fetched::NothingApplied)));
        hub.apply_view(7, kvs(3).into_iter().map(|(k, v)| (k, Some(v))).collect());
        match ask(None).await {
            Ok(Fetched::View(s)) => assert_eq!((s.revision, s.kvs), (7, kvs(3))),
            other => panic!("{other:?}"),
        }
        assert!(matches!(ask(Some(7)).await, Ok(Fetched::Unchanged)));
        // Two keys more, the first one deleted.
        let mut changes: ViewDelta = kvs(5)
            .into_iter()
            .skip(3)
            .map(|(k, v)| (k, Some(v)))
            .collect();
        changes.push((kvs(1).into_keys().next().unwrap(), None));
        hub.apply_view(9, changes);
        match ask(Some(7)).await {
            Ok(Fetched::View(s)) => {
                let want: KvMap = kvs(5).into_iter().skip(1).collect();
                assert_eq!((s.revision, s.kvs), (9, want));
            }
            other => panic!("{other:?}"),
        }
        cancel.cancel();
        server.await.unwrap();
        assert!(!socket_path(&dir).exists());
        assert!(matches!(fetch(&dir, None), Ok(Fetched::NotRunning)));
    }

    /// The cost the apply path pays per applied change: the changed keys applied to the agent's
    /// copy of the view, at the size of 2,000 policies and 250 pods; against what keeping the
    /// snapshot file in step would cost each apply instead (a whole durable write), and what a
    /// tool's request costs the agent (a copy and an encoding). Printed; bounded generously.
    #[test]
    fn the_view_costs_an_apply_only_its_changes_at_2000_policies() {
        let big: KvMap = (0..2_250)
            .map(|i| {
                (
                    Arc::from(
                        format!("/calico/resources/v3/projectcalico.org/networkpolicies/ns/p-{i}")
                            .as_str(),
                    ),
                    Arc::from(vec![b'x'; 900].as_slice()),
                )
            })
            .collect();
        let hub = StatusHub::new(Metrics::new());
        hub.apply_view(
            1,
            big.iter()
                .map(|(k, v)| (k.clone(), Some(v.clone())))
                .collect(),
        );
        let entries: Vec<(&Arc<str>, &Arc<[u8]>)> = big.iter().collect();
        let n = 1_000;
        let started = std::time::Instant::now();
        for i in 0..n {
            let (k, v) = entries[i % entries.len()];
            hub.apply_view(2 + i as i64, vec![(k.clone(), Some(v.clone()))]);
        }
        let each = started.elapsed() / n as u32;
        let started = std::time::Instant::now();
        let view = hub.applied_view().unwrap();
        let bytes = encode(&Snapshot {
            revision: view.revision,
            kvs: view.kvs,
        })
        .len();
        let request = started.elapsed();
        let tmp = tempfile::tempdir().unwrap();
        let started = std::time::Instant::now();
        super::super::snapshot::SnapshotStore::new(tmp.path())
            .save(&Snapshot {
                revision: 1,
                kvs: big.clone(),
            })
            .unwrap();
        let save = started.elapsed();
        eprintln!(
            "{} keys: one-change apply_view {each:?}; a tool's request (copy + encode, {bytes} bytes) {request:?}; \
             a snapshot file write (encode, write, fsync, rename) {save:?}",
            big.len()
        );
        assert!(each < Duration::from_millis(5), "{each:?}");
    }
}
