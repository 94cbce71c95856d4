//! The learned map on disk: `<state-dir>/dns-learned.json`.
//!
//! Written atomically as the snapshot is (temp file, fsync, rename, fsync of the directory), at
//! most once a second while it changes and at shutdown; loaded at start with expired entries
//! dropped, so a restarted agent (even after `felixrs cleanup` or a reboot) creates its domain
//! sets full. JSON, because operators and `felixrs trace --dns-learned FILE` read it:
//!
//! ```json
//! {"version":1,"entries":[{"name":"api.example.com","addr":"192.0.2.1",
//!   "learned_at_ms":1764100000000,"ttl_secs":60,"expires_at_ms":1764100060000}]}
//! ```
//!
//! Entries are listed least recently learned first, so loading keeps the LRU order. A file that
//! does not parse is reported and ignored as a whole (the agent then starts with nothing learned:
//! domain rules deny until answers arrive again, never allow more).

use std::fs;
use std::net::IpAddr;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::learned::{Entry, LearnedMap};
use crate::agent::snapshot::write_atomically;

/// File name inside `--state-dir`.
pub const FILE_NAME: &str = "dns-learned.json";
const VERSION: u32 = 1;

#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct File1 {
    version: u32,
    entries: Vec<Row>,
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Row {
    name: String,
    addr: IpAddr,
    learned_at_ms: u64,
    ttl_secs: u32,
    expires_at_ms: u64,
}

#[derive(Debug, thiserror::Error)]
pub enum PersistError {
    #[error("learned DNS map {path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("learned DNS map {path}: {reason}")]
    Format {
        path: PathBuf,
        #[source]
        reason: FormatError,
    },
}

/// Why a learned map's bytes are not one.
#[derive(Debug, thiserror::Error)]
pub enum FormatError {
    #[error("{0}")]
    Json(#[from] serde_json::Error),
    #[error("version {0} is not supported (expected {VERSION})")]
    Version(u32),
}

/// The map as JSON.
pub fn encode(map: &LearnedMap) -> Vec<u8> {
    let file = File1 {
        version: VERSION,
        entries: map
            .iter_lru()
            .map(|(name, addr, e)| Row {
                name: name.to_string(),
                addr,
                learned_at_ms: e.learned_at_ms,
                ttl_secs: e.ttl_secs,
                expires_at_ms: e.expires_at_ms,
            })
            .collect(),
    };
    serde_json::to_vec(&file).expect("plain data always serialises")
}

/// Parses a file's bytes into a map of at most `cap` entries, dropping those expired at `now_ms`
/// and names that are not plain lowercase DNS names.
pub fn decode(bytes: &[u8], cap: usize, now_ms: u64) -> Result<LearnedMap, FormatError> {
    let file: File1 = serde_json::from_slice(bytes)?;
    if file.version != VERSION {
        return Err(FormatError::Version(file.version));
    }
    let mut map = LearnedMap::new(cap);
    for r in file.entries {
        let plain = !r.name.is_empty()
            && r.name.split('.').all(|l| {
                !l.is_empty()
                    && l.bytes().all(|b| {
                        b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'_'
                    })
            });
        if !plain || r.expires_at_ms <= now_ms {
            continue;
        }
        map.insert(
            &r.name,
            r.addr,
            Entry {
                learned_at_ms: r.learned_at_ms,
                ttl_secs: r.ttl_secs,
                expires_at_ms: r.expires_at_ms,
            },
        );
    }
    // Keep the cap (a file written with a larger one): the most recent win.
    let over = map.len().saturating_sub(cap);
    if over > 0 {
        let mut trimmed = LearnedMap::new(cap);
        for (name, addr, e) in map.iter_lru().skip(over) {
            trimmed.insert(name, addr, e);
        }
        map = trimmed;
    }
    Ok(map)
}

/// Writes `bytes` to `path` atomically (as the snapshot is).
pub fn save(path: &Path, bytes: &[u8]) -> Result<(), PersistError> {
    write_atomically(path, &path.with_extension("json.tmp"), bytes)
        .map_err(|(path, source)| PersistError::Io { path, source })
}

/// Loads the map; `Ok(None)` when there is no file.
pub fn load(path: &Path, cap: usize, now_ms: u64) -> Result<Option<LearnedMap>, PersistError> {
    match fs::read(path) {
        Ok(bytes) => decode(&bytes, cap, now_ms)
            .map(Some)
            .map_err(|reason| PersistError::Format {
                path: path.to_path_buf(),
                reason,
            }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(source) => Err(PersistError::Io {
            path: path.to_path_buf(),
            source,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_drops_expired_and_keeps_lru_order() {
        let mut m = LearnedMap::new(10);
        m.learn("a.example.com", "192.0.2.1".parse().unwrap(), 10, 1_000);
        m.learn("b.example.com", "2001:db8::1".parse().unwrap(), 100, 2_000);
        m.learn("c.example.com", "192.0.2.3".parse().unwrap(), 100, 3_000);
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state").join(FILE_NAME);
        save(&path, &encode(&m)).unwrap();
        assert!(!path.with_extension("json.tmp").exists());
        let back = load(&path, 10, 20_000).unwrap().unwrap();
        let rows: Vec<_> = back
            .iter_lru()
            .map(|(n, a, e)| (n.to_string(), a, e))
            .collect();
        let want: Vec<_> = m
            .iter_lru()
            .skip(1)
            .map(|(n, a, e)| (n.to_string(), a, e))
            .collect();
        assert_eq!(rows, want);
        // A smaller cap keeps the most recent.
        let small = load(&path, 1, 20_000).unwrap().unwrap();
        assert_eq!(small.iter_lru().next().unwrap().0, "c.example.com");
        assert!(
            load(&dir.path().join("none.json"), 10, 0)
                .unwrap()
                .is_none()
        );
    }

    #[test]
    fn bad_files_are_errors_naming_the_file_and_odd_names_are_dropped() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(FILE_NAME);
        fs::write(&path, b"{not json").unwrap();
        let e = load(&path, 10, 0).unwrap_err().to_string();
        assert!(e.contains(FILE_NAME), "{e}");
        fs::write(&path, br#"{"version":2,"entries":[]}"#).unwrap();
        assert!(
            load(&path, 10, 0)
                .unwrap_err()
                .to_string()
                .contains("version 2")
        );
        fs::write(
            &path,
            br#"{"version":1,"entries":[{"name":"X\n-j ACCEPT","addr":"192.0.2.1","learned_at_ms":0,"ttl_secs":9,"expires_at_ms":9000}]}"#,
        )
        .unwrap();
        assert!(load(&path, 10, 0).unwrap().unwrap().is_empty());
    }
}
