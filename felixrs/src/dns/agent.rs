//! The learner inside `felixrs agent`: built from the flags before the first apply (so the
//! persisted map fills the domain sets the first apply creates), its queue thread and persister.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::Duration;

use super::learner::{Learner, LearnerConfig, SystemClock, spawn_persister};
use super::metrics::DnsMetrics;
use super::persist;
use super::queue::{QueueThread, spawn_retrying};
use super::setwriter::{NetlinkSetWriter, RestoreSetWriter, SetWriter};
use crate::cmd::shared::dataplane_args::DataplaneArgs;

/// The running learner.
pub struct DnsAgent {
    pub learner: Arc<Learner>,
    queue: QueueThread,
    persister: JoinHandle<()>,
    persister_stop: Arc<AtomicBool>,
}

/// Starts the learner, or says why there is none: without `--dns-trusted-servers` nothing is
/// queued or learned (and nothing is loaded: domain rules match nothing, as the log says).
pub fn start(
    args: &DataplaneArgs,
    min_ttl: u32,
    max_learned: usize,
    state_dir: &Path,
    metrics: DnsMetrics,
) -> Option<DnsAgent> {
    if args.dns_trusted_servers.is_empty() {
        tracing::warn!("no --dns-trusted-servers: DNS names in policy will match nothing");
        return None;
    }
    let cfg = LearnerConfig {
        trusted_servers: args.dns_trusted_servers.clone(),
        min_ttl,
        max_learned,
        persist_path: Some(state_dir.join(persist::FILE_NAME)),
    };
    let map = Learner::load_map(&cfg, &SystemClock);
    let writer: Box<dyn SetWriter> = match NetlinkSetWriter::open() {
        Ok(w) => Box::new(w),
        Err(error) => {
            tracing::warn!(%error, "no ipset netlink socket; learned addresses go through `ipset restore`");
            Box::new(RestoreSetWriter::default())
        }
    };
    tracing::info!(
        servers = ?args.dns_trusted_servers,
        queue = args.dns_queue_num,
        min_ttl,
        max_learned,
        "learning DNS names from the trusted servers' responses"
    );
    let learner = Arc::new(Learner::new(
        cfg,
        map,
        writer,
        Arc::new(SystemClock),
        metrics,
    ));
    let queue = spawn_retrying(args.dns_queue_num, learner.clone());
    let persister_stop = Arc::new(AtomicBool::new(false));
    let persister = spawn_persister(
        learner.clone(),
        Duration::from_secs(1),
        persister_stop.clone(),
    );
    Some(DnsAgent {
        learner,
        queue,
        persister,
        persister_stop,
    })
}

impl DnsAgent {
    /// At shutdown: the map is written one last time. The queue thread is told to stop; it may
    /// stay blocked on an idle queue until the process exits, which unbinds the queue (responses
    /// are then dropped by the kernel until the next agent binds it).
    pub fn stop(self) {
        self.queue.stop();
        self.persister_stop.store(true, Ordering::SeqCst);
        self.persister.thread().unpark();
        let _ = self.persister.join();
        self.learner.persist();
    }
}
