//! What a running [`EtcdCluster`] says about itself: its leader and its revision (for fault tests
//! that kill the leader or compact the store). Uses only the cluster's public interface.

use std::time::{Duration, Instant};

use super::cluster::EtcdCluster;

impl EtcdCluster {
    /// `endpoint status` of the running members, as JSON (retried for up to 30 s while a member
    /// is down or an election runs).
    fn status_json(&self) -> serde_json::Value {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let out = self
                .etcdctl(&["endpoint", "status", "-w", "json"])
                .output()
                .expect("run etcdctl endpoint status");
            // etcdctl prints the members it reached even when one fails (and then exits non-zero).
            if let Ok(v) = serde_json::from_slice::<serde_json::Value>(&out.stdout)
                && v.as_array().is_some_and(|a| !a.is_empty())
            {
                return v;
            }
            assert!(
                Instant::now() < deadline,
                "etcdctl endpoint status: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// The index of the member that leads (waits up to 30 s for an election).
    pub fn leader(&self) -> usize {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let v = self.status_json();
            let members = v.as_array().expect("endpoint status array");
            let leader = members
                .iter()
                .filter_map(|m| m["Status"]["leader"].as_u64())
                .find(|l| *l != 0);
            let endpoint = members.iter().find_map(|m| {
                let id = m["Status"]["header"]["member_id"].as_u64()?;
                (Some(id) == leader).then(|| m["Endpoint"].as_str().map(str::to_string))?
            });
            if let Some(i) =
                endpoint.and_then(|e| (0..self.len()).find(|i| self.client_url(*i) == e))
            {
                return i;
            }
            assert!(Instant::now() < deadline, "no etcd leader: {v}");
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// The store's revision, as the running members report it (the highest).
    pub fn revision(&self) -> i64 {
        let v = self.status_json();
        (v.as_array().expect("endpoint status array").iter())
            .filter_map(|m| m["Status"]["header"]["revision"].as_i64())
            .max()
            .unwrap_or_else(|| panic!("no revision in endpoint status: {v}"))
    }

    /// Puts `key` = `value` (no retry) and returns the revision of the write.
    pub fn put_rev(&self, key: &str, value: &str) -> i64 {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let out = self
                .etcdctl(&["put", "-w", "json", key, value])
                .output()
                .expect("run etcdctl put");
            if out.status.success() {
                let v: serde_json::Value =
                    serde_json::from_slice(&out.stdout).expect("etcdctl put json");
                return v["header"]["revision"]
                    .as_i64()
                    .unwrap_or_else(|| panic!("no revision in put answer: {v}"));
            }
            assert!(
                Instant::now() < deadline,
                "etcdctl put {key}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// Compacts (physically) up to `revision`.
    pub fn compact(&self, revision: i64) {
        crate::run_checked(&mut self.etcdctl(&["compact", &revision.to_string(), "--physical"]))
            .unwrap_or_else(|e| panic!("etcdctl compact {revision}: {e}"));
    }
}
