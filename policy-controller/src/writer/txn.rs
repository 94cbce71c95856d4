//! The etcd edge: a full pass's reads, the fence check and the batched compare-and-swap
//! transactions, each recorded in the writer's index when it succeeds.

use std::collections::BTreeMap;
use std::time::Instant;

use etcd_client::{Compare, CompareOp, GetOptions, Txn};

use super::index::Current;
use super::plan::{Change, ChangeKind};
use super::{MAX_TXN_BYTES, MAX_TXN_OPS, OWNER_MARKER_PREFIX, SyncStats, Writer, WriterError};

impl Writer {
    pub(super) async fn read(&mut self) -> Result<Current, WriterError> {
        let etcd = |source| WriterError::Etcd { op: "get", source };
        let resp = self
            .client
            .get(
                self.prefix.resources(),
                Some(GetOptions::new().with_prefix()),
            )
            .await
            .map_err(etcd)?;
        let revision = resp.header().map(|h| h.revision()).unwrap_or(0);
        let mut values = BTreeMap::new();
        for kv in resp.kvs() {
            if let Some(k) = kv.key_str().ok().and_then(|k| self.prefix.to_canonical(k)) {
                values.insert(k, (kv.value().to_vec(), kv.mod_revision()));
            }
        }
        drop(resp);
        // Read markers at the same revision so both views are consistent.
        let marker_prefix = self.prefix.private_key(OWNER_MARKER_PREFIX);
        let resp = self
            .client
            .get(
                marker_prefix.as_str(),
                Some(GetOptions::new().with_prefix().with_revision(revision)),
            )
            .await
            .map_err(etcd)?;
        let mut markers = BTreeMap::new();
        for kv in resp.kvs() {
            if let Ok(k) = kv.key_str()
                && let Some(target) = k.strip_prefix(marker_prefix.as_str())
            {
                markers.insert(target.to_string(), kv.mod_revision());
            }
        }
        Ok(Current {
            values,
            markers,
            revision,
        })
    }

    pub(super) async fn check_fence(&mut self) -> Result<(), WriterError> {
        let Some(f) = self.fence.clone() else {
            return Ok(());
        };
        let resp = self
            .client
            .get(f.key.clone(), None)
            .await
            .map_err(|source| WriterError::Etcd { op: "get", source })?;
        match resp.kvs().first() {
            Some(kv) if kv.create_revision() == f.create_revision => Ok(()),
            _ => Err(WriterError::Fenced(
                String::from_utf8_lossy(&f.key).into_owned(),
            )),
        }
    }

    /// Sends the changes in batches; `Ok(false)` when a compare failed. Each successful batch is
    /// recorded in the writer's index; a failed one (or an etcd error) drops the index.
    pub(super) async fn apply(
        &mut self,
        changes: Vec<Change>,
        stats: &mut SyncStats,
    ) -> Result<bool, WriterError> {
        let fence_cmp = self
            .fence
            .as_ref()
            .map(|f| Compare::create_revision(f.key.clone(), CompareOp::Equal, f.create_revision));
        let reserved = usize::from(fence_cmp.is_some());
        let reserved_bytes = self.fence.as_ref().map_or(0, |f| f.key.len() + 16);
        let mut batch: Vec<Change> = Vec::new();
        let mut batches = Vec::new();
        let (mut n_cmp, mut n_ops, mut n_bytes) = (reserved, 0, reserved_bytes);
        for c in changes {
            if !batch.is_empty()
                && (n_cmp + c.compares.len() > MAX_TXN_OPS
                    || n_ops + c.ops.len() > MAX_TXN_OPS
                    || n_bytes + c.bytes > MAX_TXN_BYTES)
            {
                batches.push(std::mem::take(&mut batch));
                (n_cmp, n_ops, n_bytes) = (reserved, 0, reserved_bytes);
            }
            n_cmp += c.compares.len();
            n_ops += c.ops.len();
            n_bytes += c.bytes;
            batch.push(c);
        }
        if !batch.is_empty() {
            batches.push(batch);
        }
        for batch in batches {
            let mut compares: Vec<Compare> = fence_cmp.iter().cloned().collect();
            let mut ops = Vec::new();
            let mut effects = Vec::new();
            let kinds: Vec<ChangeKind> = batch.iter().map(|c| c.kind).collect();
            for c in batch {
                compares.extend(c.compares);
                ops.extend(c.ops);
                effects.extend(c.effects);
            }
            let started = Instant::now();
            let resp = match self
                .client
                .txn(Txn::new().when(compares).and_then(ops))
                .await
            {
                Ok(r) => r,
                Err(source) => {
                    self.known = None;
                    return Err(WriterError::Etcd { op: "txn", source });
                }
            };
            if let Some(m) = &self.metrics {
                m.observe_write(started.elapsed());
            }
            if !resp.succeeded() {
                self.known = None;
                return Ok(false);
            }
            if let Some(h) = resp.header() {
                stats.revision = h.revision();
                self.revision = h.revision();
            }
            if let Some(known) = &mut self.known {
                known.record(effects, stats.revision);
            }
            for k in kinds {
                match k {
                    ChangeKind::Create => stats.created += 1,
                    ChangeKind::Update => stats.updated += 1,
                    ChangeKind::Delete => stats.deleted += 1,
                    ChangeKind::Adopt | ChangeKind::Cleanup => {}
                }
            }
        }
        if let Some(m) = &self.metrics {
            m.record_sync(stats);
        }
        Ok(true)
    }
}
