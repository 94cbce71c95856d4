//! The persisted snapshot: the last in-sync datastore contents (raw key -> value) and their revision.
//!
//! It closes the restart gap Antrea closed in its PR #5739: an agent that restarts while etcd is
//! unreachable programs the kernel from the snapshot instead of waiting (the kernel's old rules keep
//! enforcing either way; the snapshot lets policy written before the outage reach new endpoints).
//!
//! Format (version 1, little endian), chosen by measurement (see `benches/snapshot_format.rs`):
//!
//! ```text
//! magic "FXRSNAP\n" | version u32 | revision i64 | count u64
//! count x ( key_len u32 | key (UTF-8) | value_len u32 | value )
//! sha256 of everything before it (32 bytes)
//! ```
//!
//! Invariants: a file is either absent, complete and verified, or rejected as a whole (never partly
//! loaded). Writes are atomic: temp file, fsync, rename, fsync of the directory.

use std::collections::BTreeMap;
use std::fs::{self, File};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use sha2::{Digest, Sha256};

/// Raw datastore contents. Values are shared so a snapshot can be taken without copying them.
pub type KvMap = BTreeMap<Arc<str>, Arc<[u8]>>;

const MAGIC: &[u8; 8] = b"FXRSNAP\n";
const VERSION: u32 = 1;
const HEADER_LEN: usize = 8 + 4 + 8 + 8;
const DIGEST_LEN: usize = 32;
/// File name inside `--state-dir`.
pub const FILE_NAME: &str = "datastore.snapshot";

/// The datastore contents at one revision.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Snapshot {
    pub revision: i64,
    pub kvs: KvMap,
}

#[derive(Debug, thiserror::Error)]
pub enum SnapshotError {
    #[error("snapshot {path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("snapshot is truncated: {0}")]
    Truncated(&'static str),
    #[error("snapshot has bad magic (not a felixrs snapshot)")]
    BadMagic,
    #[error("snapshot version {0} is not supported (expected {VERSION})")]
    UnsupportedVersion(u32),
    #[error("snapshot checksum mismatch")]
    Checksum,
    #[error("snapshot entry {0} has a key that is not UTF-8")]
    KeyNotUtf8(u64),
    #[error("snapshot has {0} trailing bytes after its entries")]
    TrailingBytes(usize),
}

/// Encodes a snapshot in the version-1 binary format.
pub fn encode(snapshot: &Snapshot) -> Vec<u8> {
    let payload: usize = snapshot
        .kvs
        .iter()
        .map(|(k, v)| 8 + k.len() + v.len())
        .sum();
    let mut out = Vec::with_capacity(HEADER_LEN + payload + DIGEST_LEN);
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&VERSION.to_le_bytes());
    out.extend_from_slice(&snapshot.revision.to_le_bytes());
    out.extend_from_slice(&(snapshot.kvs.len() as u64).to_le_bytes());
    for (k, v) in &snapshot.kvs {
        out.extend_from_slice(&(k.len() as u32).to_le_bytes());
        out.extend_from_slice(k.as_bytes());
        out.extend_from_slice(&(v.len() as u32).to_le_bytes());
        out.extend_from_slice(v);
    }
    let digest = Sha256::digest(&out);
    out.extend_from_slice(&digest);
    out
}

/// Decodes and verifies a version-1 snapshot.
pub fn decode(bytes: &[u8]) -> Result<Snapshot, SnapshotError> {
    if bytes.len() < HEADER_LEN + DIGEST_LEN {
        return Err(SnapshotError::Truncated("shorter than header and checksum"));
    }
    if &bytes[..8] != MAGIC {
        return Err(SnapshotError::BadMagic);
    }
    let version = u32::from_le_bytes(bytes[8..12].try_into().expect("4 bytes"));
    if version != VERSION {
        return Err(SnapshotError::UnsupportedVersion(version));
    }
    let (body, digest) = bytes.split_at(bytes.len() - DIGEST_LEN);
    if Sha256::digest(body).as_slice() != digest {
        return Err(SnapshotError::Checksum);
    }
    let revision = i64::from_le_bytes(body[12..20].try_into().expect("8 bytes"));
    let count = u64::from_le_bytes(body[20..28].try_into().expect("8 bytes"));
    let mut rest = &body[HEADER_LEN..];
    let mut kvs = KvMap::new();
    for i in 0..count {
        let key = take_field(&mut rest)?;
        let value = take_field(&mut rest)?;
        let key = std::str::from_utf8(key).map_err(|_| SnapshotError::KeyNotUtf8(i))?;
        kvs.insert(Arc::from(key), Arc::from(value));
    }
    if !rest.is_empty() {
        return Err(SnapshotError::TrailingBytes(rest.len()));
    }
    Ok(Snapshot { revision, kvs })
}

fn take_field<'a>(rest: &mut &'a [u8]) -> Result<&'a [u8], SnapshotError> {
    if rest.len() < 4 {
        return Err(SnapshotError::Truncated("entry length"));
    }
    let len = u32::from_le_bytes(rest[..4].try_into().expect("4 bytes")) as usize;
    if rest.len() - 4 < len {
        return Err(SnapshotError::Truncated("entry data"));
    }
    let field = &rest[4..4 + len];
    *rest = &rest[4 + len..];
    Ok(field)
}

/// The snapshot file of a state directory.
#[derive(Debug, Clone)]
pub struct SnapshotStore {
    dir: PathBuf,
}

impl SnapshotStore {
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        Self { dir: dir.into() }
    }

    pub fn path(&self) -> PathBuf {
        self.dir.join(FILE_NAME)
    }

    /// Writes atomically ([`write_atomically`]). Returns the number of bytes written.
    pub fn save(&self, snapshot: &Snapshot) -> Result<usize, SnapshotError> {
        let bytes = encode(snapshot);
        let tmp = self.dir.join(format!("{FILE_NAME}.tmp"));
        write_atomically(&self.path(), &tmp, &bytes)
            .map_err(|(path, source)| SnapshotError::Io { path, source })?;
        Ok(bytes.len())
    }

    /// Loads and verifies the snapshot; `Ok(None)` if there is none.
    pub fn load(&self) -> Result<Option<Snapshot>, SnapshotError> {
        let path = self.path();
        match fs::read(&path) {
            Ok(bytes) => decode(&bytes).map(Some),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(source) => Err(SnapshotError::Io { path, source }),
        }
    }
}

/// Replaces `path` with `bytes` so that a crash leaves either the old or the new file, never a
/// torn one: write `tmp` (in the same directory), fsync it, rename it over `path`, fsync the
/// directory (creating it first). A failed write of `tmp` removes it. An error names the file or
/// directory it concerns.
pub(crate) fn write_atomically(
    path: &Path,
    tmp: &Path,
    bytes: &[u8],
) -> Result<(), (PathBuf, std::io::Error)> {
    let at = |p: &Path| {
        let p = p.to_path_buf();
        move |e| (p, e)
    };
    let dir = path.parent().unwrap_or(Path::new("."));
    fs::create_dir_all(dir).map_err(at(dir))?;
    let written = File::create(tmp).and_then(|mut f| {
        f.write_all(bytes)?;
        f.sync_all()
    });
    if let Err(e) = written {
        // A full disk: do not keep its space taken by a partial file (the old file stays).
        let _ = fs::remove_file(tmp);
        return Err((tmp.to_path_buf(), e));
    }
    fs::rename(tmp, path).map_err(at(path))?;
    File::open(dir).and_then(|d| d.sync_all()).map_err(at(dir))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mk_snapshot(n: usize) -> Snapshot {
        let kvs = (0..n)
            .map(|i| {
                (
                    Arc::from(format!("/calico/resources/v3/projectcalico.org/x/{i}").as_str()),
                    Arc::from(format!("{{\"i\":{i}}}").into_bytes().as_slice()),
                )
            })
            .collect();
        Snapshot { revision: 42, kvs }
    }

    #[test]
    fn round_trips_through_a_file() {
        let dir = tempfile::tempdir().unwrap();
        let store = SnapshotStore::new(dir.path().join("state"));
        assert!(store.load().unwrap().is_none());
        let snap = mk_snapshot(50);
        store.save(&snap).unwrap();
        assert_eq!(store.load().unwrap(), Some(snap));
        assert!(
            !dir.path()
                .join("state")
                .join("datastore.snapshot.tmp")
                .exists()
        );
    }

    #[test]
    fn rejects_every_single_byte_corruption() {
        let bytes = encode(&mk_snapshot(3));
        for i in 0..bytes.len() {
            let mut bad = bytes.clone();
            bad[i] ^= 0x01;
            assert!(decode(&bad).is_err(), "flipped byte {i} was accepted");
        }
    }

    #[test]
    fn rejects_truncation_and_other_versions() {
        let bytes = encode(&mk_snapshot(3));
        for len in 0..bytes.len() {
            assert!(
                decode(&bytes[..len]).is_err(),
                "truncated to {len} accepted"
            );
        }
        let mut v2 = bytes.clone();
        v2[8] = 2;
        assert!(matches!(
            decode(&v2),
            Err(SnapshotError::UnsupportedVersion(2))
        ));
    }

    #[test]
    fn empty_snapshot_is_valid() {
        let snap = Snapshot {
            revision: 7,
            kvs: KvMap::new(),
        };
        assert_eq!(decode(&encode(&snap)).unwrap(), snap);
    }
}
