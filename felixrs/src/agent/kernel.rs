//! The real part behind the agent's dataplane seam: the renderer + iptables/ipset applier (both
//! families) as the [`Dataplane`]. (The graph side, [`GraphPipeline`], is in `pipeline.rs`;
//! re-exported here, where callers have always found it.)
//!
//! The iptables backend is detected once per agent, right before the first program, and shared
//! by both families; the full saves detection had to read seed both appliers' first kernel view.
//! The v4 and v6 appliers program their (independent) kernel objects concurrently; a program
//! succeeds only when both families did, and each family's error is reported under its name.
//!
//! Addresses that leave a local endpoint (the endpoint is removed or loses the address) have
//! their conntrack flows deleted once the kernel no longer has the endpoint's rules, as Felix
//! does: otherwise an established flow would outlive the pod and pass the `ESTABLISHED` accept
//! of whichever pod gets the address next (see `iptables::apply::conntrack`). If the program
//! fails, the addresses wait for the next successful one.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::net::IpAddr;
use std::time::{Duration, Instant};

use calc_graph::proto::{EndpointId, IpVersion, Output, PolicyId};
use iptables::apply::{Applier, ApplierConfig, Backend, Runner, backend};
use iptables::desired::{DesiredState, TableName};
use iptables::render::{RenderConfig, RenderError, Renderer};
use iptables::stats::Attribution;

use std::sync::Arc;

use super::apply_loop::{ApplyReport, Dataplane, DataplaneError, Drift, FamilyError};
use super::counters::{CounterHub, Published};
use super::metrics::felix::TableCount;
use super::stale_flows::Cleaner;
use crate::dns::Learner;

pub use super::pipeline::GraphPipeline;

/// Renderer plus one applier per family.
pub struct KernelDataplane<R: Runner + Clone + 'static> {
    renderer: Renderer,
    v4: Applier<R>,
    v6: Applier<R>,
    runner: R,
    /// `Auto` and not detected yet.
    detect: bool,
    /// Addresses of each local endpoint in the desired state.
    endpoints: HashMap<EndpointId, Vec<IpAddr>>,
    policies: HashSet<PolicyId>,
    /// Addresses that left a local endpoint: their flows go after the next successful program.
    stale_flows: BTreeSet<IpAddr>,
    /// Deletes the flows of `stale_flows` after each program, off the apply path.
    cleaner: Cleaner<R>,
    /// Where the counter thread learns what our rules count towards.
    counters: Option<Arc<CounterHub>>,
    /// The filter chains changed since the attribution was last published.
    attribution_stale: bool,
    /// When the attribution was last published (`None`: not yet, the first program does).
    attribution_at: Option<Instant>,
    /// The DNS learner (FQDN policy): fills new domain sets, and is told after each successful
    /// program which domain sets the kernel has.
    learner: Option<Arc<Learner>>,
    /// When [`Dataplane::prepare`] read the kernel ahead of the first apply.
    read_ahead_at: Option<Instant>,
    /// The read [`Dataplane::prepare`] started, still running: it owns the appliers (`v4`/`v6`
    /// are placeholders meanwhile) and gives them back, with `detect`, when joined
    /// ([`KernelDataplane::settle`]). The first batch is rendered while it runs.
    read_ahead: Option<ReadAhead<R>>,
    backend: Backend,
    /// The host endpoints without `interfaceName` on no interface, as last logged.
    unresolved_heps: Vec<String>,
    /// The staged view (flow logs on): fed every batch the enforced renderer gets.
    staged: Option<Arc<crate::staged::SharedStagedView>>,
    /// The flow collector's names (flow logs on): their policy names are set from the renderer
    /// after each render that changed a policy, before the kernel gets its rules.
    flow_names: Option<Arc<std::sync::RwLock<crate::flowlog::names::Names>>>,
}

/// The kernel read ahead of the first apply, on its own thread: it hands back the appliers with
/// their view, whether detection is still to do, and when it finished.
type ReadAhead<R> = std::thread::JoinHandle<(Applier<R>, Applier<R>, bool, Instant)>;

/// A view read ahead of the first apply is used only while younger than this (the first batch
/// follows the snapshot read and graph, a fraction of a second; after a slow datastore, the
/// kernel is read again, with the render).
const READ_AHEAD_MAX_AGE: Duration = Duration::from_secs(2);

impl<R: Runner + Clone + 'static> KernelDataplane<R> {
    pub fn new(runner: R, backend: Backend, render: RenderConfig) -> anyhow::Result<Self> {
        let renderer = Renderer::new(render).map_err(|e| anyhow::anyhow!("renderer: {e}"))?;
        let [v4, v6] = fresh_appliers(&runner, backend);
        let cleaner = Cleaner::new(runner.clone());
        Ok(Self {
            renderer,
            v4,
            v6,
            detect: backend == Backend::Auto,
            runner,
            endpoints: HashMap::new(),
            policies: HashSet::new(),
            stale_flows: BTreeSet::new(),
            cleaner,
            counters: None,
            attribution_stale: true,
            attribution_at: None,
            learner: None,
            read_ahead_at: None,
            read_ahead: None,
            backend,
            unresolved_heps: Vec::new(),
            staged: None,
            flow_names: None,
        })
    }

    /// Waits for the read ahead of the first apply, if one is running, and takes the appliers
    /// back. If its thread died, fresh appliers (without a view) read the kernel again.
    fn settle(&mut self) {
        let Some(handle) = self.read_ahead.take() else {
            return;
        };
        match handle.join() {
            Ok((v4, v6, detect, at)) => {
                (self.v4, self.v6, self.detect) = (v4, v6, detect);
                self.read_ahead_at = Some(at);
            }
            Err(_) => {
                tracing::warn!("the kernel read ahead of the first apply panicked; reading again");
                [self.v4, self.v6] = fresh_appliers(&self.runner, self.backend);
                self.detect = self.backend == Backend::Auto;
            }
        }
    }

    /// Wires the DNS learner in: the renderer creates domain sets full of what it learned (the
    /// persisted map included, so call this before the first apply), and after every successful
    /// program the learner gets the domain sets now in the kernel.
    pub fn with_learner(mut self, learner: Arc<Learner>) -> Self {
        self.renderer.set_domain_members(learner.clone());
        self.learner = Some(learner);
        self
    }

    /// Feeds `view` every batch of graph outputs the enforced renderer gets (the flow collector
    /// reads it as its pending policies).
    pub fn with_staged_view(mut self, view: Arc<crate::staged::SharedStagedView>) -> Self {
        self.staged = Some(view);
        self
    }

    /// Names the enforced policies to the flow collector: set after every render that changed a
    /// policy and before the kernel has its rules, so no NFLOG prefix arrives unnamed.
    pub fn with_flow_names(
        mut self,
        names: Arc<std::sync::RwLock<crate::flowlog::names::Names>>,
    ) -> Self {
        names
            .write()
            .expect("flow names lock")
            .set_policies(&self.renderer);
        self.flow_names = Some(names);
        self
    }

    /// Counts the conntrack flows deleted (and the deletions that failed) into these counters.
    pub fn with_conntrack_metrics(
        mut self,
        deleted: prometheus_client::metrics::counter::Counter,
        errors: prometheus_client::metrics::counter::Counter,
    ) -> Self {
        self.cleaner = self.cleaner.with_metrics(deleted, errors);
        self
    }

    /// Publishes what each rule of ours counts towards (for the counter thread,
    /// [`super::counters`]) after a program that changed the filter chains: right after the
    /// first apply is reported, then when the apply thread goes idle, or after an apply when the
    /// last one is older than [`ATTRIBUTION_MAX_AGE`] (a churn that never lets it idle). Building
    /// it walks every rendered chain (~16 ms at 2,000 policies): it must sit on no apply's path
    /// (it delayed the first program's `programmed`, and the next change after every apply).
    pub fn with_counters(mut self, hub: Arc<CounterHub>) -> Self {
        self.counters = Some(hub);
        self
    }

    fn publish_attribution(&mut self) {
        if self.counters.is_none() || !self.attribution_stale {
            return;
        }
        self.settle();
        let Some(hub) = &self.counters else { return };
        let Ok(mode) = self.v4.mode() else { return };
        hub.publish(Published {
            mode,
            v4: Attribution::new(&self.renderer, IpVersion::V4),
            v6: Attribution::new(&self.renderer, IpVersion::V6),
        });
        self.attribution_stale = false;
        self.attribution_at = Some(Instant::now());
    }

    fn track(&mut self, o: &Output) {
        match o {
            Output::EndpointUpdated(ep) => {
                let addrs: Vec<IpAddr> = ep
                    .ipv4_nets
                    .iter()
                    .chain(&ep.ipv6_nets)
                    .map(|n| n.addr())
                    .collect();
                // An address given to an endpoint waits for a deletion of its old flows still
                // running (before this apply programs the endpoint).
                self.cleaner.wait_for(addrs.iter());
                let old = self.endpoints.insert(ep.id.clone(), addrs.clone());
                self.stale_flows
                    .extend(old.into_iter().flatten().filter(|a| !addrs.contains(a)));
            }
            Output::EndpointRemoved(id) => {
                self.stale_flows
                    .extend(self.endpoints.remove(id).into_iter().flatten());
            }
            // Felix counts enforced policies only as active local policies, never staged ones.
            Output::PolicyUpdated(p) if !p.id.kind.is_staged() => {
                self.policies.insert(p.id.clone());
            }
            Output::PolicyRemoved(id) => {
                self.policies.remove(id);
            }
            _ => {}
        }
    }

    /// Detects the iptables backend once (`Auto`), for both appliers.
    fn detect_backend(&mut self) -> Result<(), DataplaneError> {
        self.settle();
        detect_for(&self.runner, &mut self.detect, [&mut self.v4, &mut self.v6])
    }

    /// Renders `outputs`; meanwhile, an applier without a view of the kernel (the first apply
    /// after a restart, or after a failure) reads it, detecting the backend first if that is
    /// still to do: a restart costs about the longer of rendering and the saves, not their sum.
    /// A failed detection or read is left for `program` to retry and report.
    fn render(&mut self, outputs: Vec<Output>) -> Vec<RenderError> {
        if self.read_ahead.as_ref().is_some_and(|h| h.is_finished()) {
            self.settle();
        }
        if self
            .read_ahead_at
            .take()
            .is_some_and(|at| at.elapsed() > READ_AHEAD_MAX_AGE)
        {
            self.v4.invalidate();
            self.v6.invalidate();
        }
        // While the read ahead of the first apply still runs, `program` waits for it.
        let read_now = self.read_ahead.is_none() && !(self.v4.has_view() && self.v6.has_view());
        let renderer = &mut self.renderer;
        let (runner, detect) = (&self.runner, &mut self.detect);
        let appliers = [&mut self.v4, &mut self.v6];
        std::thread::scope(|s| {
            if read_now {
                s.spawn(move || read_kernel(runner, detect, appliers, "ahead of the apply"));
            }
            let mut errors = renderer.apply_all(outputs);
            if renderer.needs_host_interfaces() {
                set_host_interfaces(renderer, runner);
            }
            errors.extend(renderer.flush());
            errors
        })
    }

    /// Re-reads the node's interfaces while a host endpoint is placed by its `expectedIPs`,
    /// and renders what that changes; whether it changed anything.
    fn follow_host_interfaces(&mut self) -> bool {
        if !self.renderer.needs_host_interfaces()
            || !set_host_interfaces(&mut self.renderer, &self.runner)
        {
            return false;
        }
        for error in self.renderer.flush() {
            tracing::warn!(%error, "render error");
        }
        self.note_unresolved();
        true
    }

    /// Logs the host endpoints without `interfaceName` whose addresses are on no interface
    /// (not programmed, as in Felix), when that list changes.
    fn note_unresolved(&mut self) {
        let now = self.renderer.unresolved_host_endpoints();
        if now != self.unresolved_heps.as_slice() {
            if !now.is_empty() {
                tracing::warn!(
                    endpoints = ?now,
                    "host endpoints without interfaceName whose expectedIPs are on no interface are not programmed"
                );
            }
            self.unresolved_heps = now.to_vec();
        }
    }

    fn program(&mut self, refresh: bool) -> Result<ApplyReport, DataplaneError> {
        let mut report = ApplyReport {
            local_endpoints: self.endpoints.len(),
            local_host_endpoints: self.renderer.host_endpoints().count(),
            active_policies: self.policies.len(),
            ..ApplyReport::default()
        };
        self.detect_backend()?;
        // What changed since the last program: the appliers plan only that (a new view, after a
        // restart or a failure, is planned whole).
        let changes = [IpVersion::V4, IpVersion::V6].map(|v| self.renderer.take_changes(v));
        let renderer = &self.renderer;
        // Borrow the renderer's state: an owned copy of ~50k rules costs more than the diff.
        let run = |v: IpVersion, applier: &mut Applier<R>| {
            let desired = renderer.desired_ref(v);
            let res = if refresh {
                applier.refresh(desired)
            } else {
                applier.apply_changes(desired, &changes[usize::from(v == IpVersion::V6)])
            };
            (desired, res)
        };
        let (v4, v6) = (&mut self.v4, &mut self.v6);
        let (r4, r6) = std::thread::scope(|s| {
            let h6 = s.spawn(|| run(IpVersion::V6, v6));
            let r4 = run(IpVersion::V4, v4);
            (r4, h6.join())
        });
        let r6 = r6.map_err(|_| DataplaneError::FamilyPanicked(IpVersion::V6))?;
        let mut errors = Vec::new();
        for (v, (desired, res)) in [(IpVersion::V4, r4), (IpVersion::V6, r6)] {
            let r = match res {
                Ok(r) => r,
                Err(error) => {
                    errors.push(FamilyError { family: v, error });
                    continue;
                }
            };
            // One line per family and apply, payloads quoted (the pod churn bench replays them).
            tracing::debug!(family = v.number(), ipsets = ?r.ipset_updates, iptables = ?r.iptables, ipset_deletions = ?r.ipset_deletions, saves = r.saves, "applied");
            count(desired, &mut report);
            if r.iptables.contains_key(&TableName::Filter) {
                self.attribution_stale = true;
            }
            report.restore_calls += u64::from(!r.ipset_updates.is_empty())
                + r.iptables.len() as u64
                + u64::from(!r.ipset_deletions.is_empty());
            report.restore_errors += u64::from(r.retries);
            for (table, payload) in r.iptables.iter().chain(&r.other_backend) {
                let lines = payload.lines().count() as u64;
                report
                    .iptables_lines
                    .push((v.number(), table.as_str(), lines));
            }
            report.ipset_lines +=
                (r.ipset_updates.lines().count() + r.ipset_deletions.lines().count()) as u64;
        }
        if !errors.is_empty() {
            return Err(DataplaneError::Families(errors));
        }
        if let Some(l) = &self.learner {
            l.set_active(self.renderer.active_domain_sets());
        }
        Ok(report)
    }
}

/// The v4 and v6 appliers of `backend`, without a view of the kernel yet.
/// Reads the node's interfaces into the renderer (for host endpoints without
/// `interfaceName`); whether that changes what is rendered. A failed read keeps the last one.
fn set_host_interfaces<R: Runner>(renderer: &mut Renderer, runner: &R) -> bool {
    match super::host_ifaces::read(runner) {
        Ok(ifaces) => renderer.set_host_interfaces(ifaces),
        Err(error) => {
            tracing::warn!(%error, "reading the host's interfaces for host endpoints");
            false
        }
    }
}

fn fresh_appliers<R: Runner + Clone + 'static>(runner: &R, backend: Backend) -> [Applier<R>; 2] {
    let [v4, mut v6] = [IpVersion::V4, IpVersion::V6].map(|family| {
        Applier::new(
            runner.clone(),
            ApplierConfig {
                family,
                backend,
                ..ApplierConfig::default()
            },
        )
    });
    // One nft generation for both: neither takes the other's writes for drift.
    v6.share_restore_count(&v4);
    [v4, v6]
}

/// Detects the backend if that is still to do, then reads the kernel into both appliers at once.
/// A failure is logged (`when`: which read) and left for `program` to retry and report.
fn read_kernel<R: Runner + Clone + 'static>(
    runner: &R,
    detect: &mut bool,
    appliers: [&mut Applier<R>; 2],
    when: &str,
) {
    let [v4, v6] = appliers;
    if let Err(error) = detect_for(runner, detect, [&mut *v4, &mut *v6]) {
        tracing::warn!(%error, "reading the kernel {when}");
        return;
    }
    std::thread::scope(|s| {
        for applier in [v4, v6] {
            s.spawn(move || {
                if let Err(error) = applier.read_kernel() {
                    tracing::warn!(%error, "reading the kernel {when}");
                }
            });
        }
    });
}

/// Detects the backend once (`detect` is cleared when done) and seeds both appliers with the
/// saves detection read.
fn detect_for<R: Runner + Clone + 'static>(
    runner: &R,
    detect: &mut bool,
    appliers: [&mut Applier<R>; 2],
) -> Result<(), DataplaneError> {
    if *detect {
        let d = backend::detect(runner, Backend::Auto).map_err(DataplaneError::Detection)?;
        tracing::info!(backend = ?d.mode, reason = ?d.reason, saves = d.saves_run(), "iptables backend selected");
        for a in appliers {
            a.use_detection(&d);
        }
        *detect = false;
    }
    Ok(())
}

/// The oldest the published attribution gets while applies keep coming (see
/// [`KernelDataplane::with_counters`]): half the default `--counters-interval`, so a read under
/// a churn that never lets the apply thread idle misses at most the rules of the last 5 s (they
/// count from the next read). 1 s cost a 20-pod/s churn one apply in 13 paying ~40 ms.
const ATTRIBUTION_MAX_AGE: Duration = Duration::from_secs(5);

fn count(d: &DesiredState, report: &mut ApplyReport) {
    report.ip_sets += d.ip_sets.len();
    for (name, t) in &d.tables {
        let rules = t.chains.values().map(Vec::len).sum::<usize>() + t.hooks.len();
        report.chains += t.chains.len();
        report.rules += rules;
        report.tables.push(TableCount {
            ip_version: d.family.number(),
            table: name.as_str(),
            chains: t.chains.len(),
            rules,
        });
    }
    // Selector and named-port sets (`cali40s:`, `cali40n:`), one per active selector; both
    // families hold the same ones.
    let selectors = d
        .ip_sets
        .keys()
        .filter(|n| n.get(6..8).is_some_and(|k| k == "s:" || k == "n:"))
        .count();
    report.active_selectors = report.active_selectors.max(selectors);
}

impl<R: Runner + Clone + 'static> Dataplane for KernelDataplane<R> {
    fn apply(&mut self, outputs: Vec<Output>) -> Result<ApplyReport, DataplaneError> {
        for o in &outputs {
            self.track(o);
        }
        if let Some(staged) = &self.staged {
            staged.apply(outputs.iter().cloned());
        }
        let policies_changed = outputs
            .iter()
            .any(|o| matches!(o, Output::PolicyUpdated(_) | Output::PolicyRemoved(_)));
        for error in self.render(outputs) {
            // The object was rendered fail-closed (or left out); the rest is applied.
            tracing::warn!(%error, "render error");
        }
        if let Some(names) = self.flow_names.as_ref().filter(|_| policies_changed) {
            names
                .write()
                .expect("flow names lock")
                .set_policies(&self.renderer);
        }
        self.note_unresolved();
        let report = self.program(false)?;
        self.cleaner.start(std::mem::take(&mut self.stale_flows));
        Ok(report)
    }

    /// Detects the backend and reads the kernel (both families at once) on its own thread, while
    /// the snapshot or the datastore is read, the graph computed and the first batch rendered:
    /// the first program waits only for what is left of the read ([`Self::settle`]).
    fn prepare(&mut self) {
        let started = Instant::now();
        let runner = self.runner.clone();
        let [p4, p6] = fresh_appliers(&self.runner, self.backend);
        let mut v4 = std::mem::replace(&mut self.v4, p4);
        let mut v6 = std::mem::replace(&mut self.v6, p6);
        let mut detect = self.detect;
        let read = move || {
            read_kernel(
                &runner,
                &mut detect,
                [&mut v4, &mut v6],
                "ahead of the first apply",
            );
            tracing::debug!(
                took_ms = started.elapsed().as_millis(),
                "kernel read ahead of the first apply"
            );
            (v4, v6, detect, Instant::now())
        };
        match std::thread::Builder::new()
            .name("read-ahead".into())
            .spawn(read)
        {
            Ok(handle) => self.read_ahead = Some(handle),
            // The closure (and the appliers) went with the failed spawn: the placeholders read
            // the kernel with the first render instead.
            Err(error) => tracing::warn!(%error, "reading the kernel ahead of the first apply"),
        }
    }

    fn refresh(&mut self) -> Result<ApplyReport, DataplaneError> {
        self.follow_host_interfaces();
        let report = self.program(true)?;
        self.cleaner.start(std::mem::take(&mut self.stale_flows));
        Ok(report)
    }

    /// The attribution of the last programs, once the first was published (before that the
    /// read ahead may still run: joining it here would stop the first batch's render from
    /// overlapping it).
    fn idle(&mut self) {
        if self.attribution_at.is_some() {
            self.publish_attribution();
        }
    }

    /// The attribution after the first program, and under a churn that never lets the apply
    /// thread idle once the published one is [`ATTRIBUTION_MAX_AGE`] old: after the apply was
    /// reported, so it delays no `applied_revision` (only a batch that arrives meanwhile).
    fn after_apply(&mut self) {
        if self
            .attribution_at
            .is_none_or(|at| at.elapsed() >= ATTRIBUTION_MAX_AGE)
        {
            self.publish_attribution();
        }
    }

    fn check_drift(&mut self) -> Result<Drift, DataplaneError> {
        self.settle();
        if self.follow_host_interfaces() {
            // An address moved: the endpoints without interfaceName follow it now.
            self.program(false)?;
        }
        let mut drift = Drift::default();
        let mut errors = Vec::new();
        // One `ipset save` for both families' set checks (a large node's is most of a check).
        let sets = (self.v4.runner().run("ipset", &["save"], None))
            .ok()
            .filter(|out| out.status.success())
            .map(|out| String::from_utf8_lossy(&out.stdout).into_owned());
        for (v, applier) in [(IpVersion::V4, &mut self.v4), (IpVersion::V6, &mut self.v6)] {
            match applier.check_drift(self.renderer.desired_ref(v), sets.as_deref()) {
                Ok((d, _)) => {
                    drift.full_refresh |= d.full_refresh;
                    drift.repaired.extend(
                        d.drifted
                            .into_iter()
                            .map(|c| format!("ipv{} {c}", v.number())),
                    );
                }
                Err(error) => errors.push(FamilyError { family: v, error }),
            }
        }
        if !errors.is_empty() {
            return Err(DataplaneError::Families(errors));
        }
        Ok(drift)
    }
}
