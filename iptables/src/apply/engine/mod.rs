//! [`Applier`]: one IP family's transactional writer. An apply runs three phases:
//! 1. `ipset restore`: create and fill the desired sets (so rules can reference them);
//! 2. per table, one `iptables-restore --noflush` transaction with only the differences;
//! 3. `ipset restore`: destroy our sets nothing desires any more (now unreferenced).
//!
//! The kernel view is read once (`iptables-save`, `ipset save`) and then kept current from what
//! was written, so an apply costs one restore per changed table and nothing when nothing changed.
//! [`Applier::refresh`] re-reads and repairs drift (flushed chains, deleted or displaced hooks,
//! rogue rules in our chains, missing sets) and sweeps leftovers of ours from the other iptables
//! backend; call it periodically. A failed write re-reads the
//! affected state and is retried with exponential backoff; each table is one transaction, so a
//! failure never leaves a table half-written.
//!
//! The first full read may be seeded with save text that backend detection has just read
//! ([`Applier::use_detection`]; an `Auto` applier seeds itself when it detects during an apply),
//! so one apply never runs the same backend's save for its family twice. A seed is used by the
//! next apply only, and dropped after it whatever happens.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use super::backend::{self, Backend, Detection, Mode};
use super::drift::{DriftReport, ROOTS, touched, verify_bodies};
use super::error::{ApplyError, blame, clean_stderr, failed_line, payload_line};
use super::runner::Runner;
use super::signal::{NftGeneration, legacy_contents, legacy_info, save_hash};
use super::xt_info::XtInfo;
use crate::desired::diff::{Op, plan_chains, plan_table, render, simulate};
use crate::desired::ipset::{
    ActualSet, SetUpdatePlan, after_updates, parse_save as parse_ipset_save, plan_deletions,
    plan_updates, render_deletions,
};
use crate::desired::{Changes, DesiredState, IpSetSpec, IpVersion, TableName};
use crate::parse::{ActualTable, read_tables};

mod read_kernel;
mod write;

/// How an [`Applier`] behaves.
#[derive(Debug, Clone)]
pub struct ApplierConfig {
    pub family: IpVersion,
    pub backend: Backend,
    /// Tries per write before giving up (Felix: 11; we fail earlier and let the caller retry).
    pub max_attempts: u32,
    /// First backoff between tries; doubles each time.
    pub initial_backoff: Duration,
    /// Re-read the kernel before every apply (Felix's defensive default) instead of only on
    /// [`Applier::refresh`], on the first apply and after failures.
    pub reread_every_apply: bool,
    /// Legacy's second drift signal, the tables' contents hash
    /// ([`super::signal::legacy_contents`], what sees an edit in place that keeps a table's
    /// size), is taken again only once this many times its last duration has passed: 250 = at
    /// most 0.4% of one core per family, what the agent's 2% drift budget leaves after the idle
    /// checks (about 1.1% at 2,000 policies, mostly the one `ipset save`): on every check on a
    /// small node, about every 15 s at 2,000 policies (about 60 ms per family, nearly all of it
    /// the kernel's copy of the table). 0: on every check.
    pub contents_hash_factor: u32,
}

impl Default for ApplierConfig {
    fn default() -> Self {
        ApplierConfig {
            family: IpVersion::V4,
            backend: Backend::Auto,
            max_attempts: 5,
            initial_backoff: Duration::from_millis(10),
            reread_every_apply: false,
            contents_hash_factor: 250,
        }
    }
}

/// What one apply wrote. Empty payloads mean nothing was written in that phase.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ApplyReport {
    /// Phase 1 `ipset restore` payload.
    pub ipset_updates: String,
    /// Phase 2 `iptables-restore` payloads, per table written.
    pub iptables: BTreeMap<TableName, String>,
    /// Phase 3 `ipset restore` payload.
    pub ipset_deletions: String,
    /// Payloads that removed our leftovers from the *other* backend (swept after each full read,
    /// e.g. after switching from iptables-legacy to iptables-nft).
    pub other_backend: BTreeMap<TableName, String>,
    /// Sets of ours that could not be destroyed (something still references them).
    pub undeletable_sets: Vec<String>,
    /// Full reads of the kernel state (`iptables-save` + `ipset save`) done by this apply,
    /// seeded or not.
    pub kernel_reads: u32,
    /// `*-save` programs (either backend's `iptables-save`, `ipset save`) this apply ran; saves
    /// taken from a detection seed are not counted.
    pub saves: u32,
    /// Failed writes that were retried.
    pub retries: u32,
}

impl ApplyReport {
    /// Nothing was written.
    pub fn is_empty(&self) -> bool {
        self.ipset_updates.is_empty()
            && self.iptables.is_empty()
            && self.ipset_deletions.is_empty()
            && self.other_backend.is_empty()
    }

    /// Payload lines written (`felix_iptables_lines_executed` + `felix_ipset_lines_executed`).
    pub fn lines_written(&self) -> usize {
        self.ipset_updates.lines().count()
            + self
                .iptables
                .values()
                .map(|p| p.lines().count())
                .sum::<usize>()
            + self.ipset_deletions.lines().count()
            + self
                .other_backend
                .values()
                .map(|p| p.lines().count())
                .sum::<usize>()
    }
}

/// What `iptables-nft-save` prints (exiting 0) for a table it cannot represent (felix-reference §6.2).
pub(super) const INCOMPATIBLE: &str = "is incompatible, use 'nft' tool";

static EMPTY_TABLE: ActualTable = ActualTable {
    chains: BTreeMap::new(),
};

static NO_NAMES: BTreeSet<String> = BTreeSet::new();

/// Save text read by backend detection, for the next full read.
#[derive(Debug, Default)]
struct Seed {
    own: Option<String>,
    other: Option<String>,
}

#[derive(Debug, Clone, Default)]
struct KernelView {
    tables: BTreeMap<TableName, ActualTable>,
    sets: BTreeMap<String, ActualSet>,
    /// The save `tables` were read from, until the next apply has checked the bodies of our
    /// rules in it ([`verify_bodies`]): a full read can come before the desired state is known
    /// ([`Applier::read_kernel`]).
    unverified: Option<String>,
}

/// Writes [`DesiredState`]s of one family to the kernel through a [`Runner`].
pub struct Applier<R: Runner> {
    runner: R,
    config: ApplierConfig,
    mode: Option<Mode>,
    view: Option<KernelView>,
    seed: Option<Seed>,
    saves: AtomicU32,
    /// The view was read and the other backend has not been swept since.
    sweep_due: bool,
    /// Reads and saves [`Self::read_kernel`] did ahead of the next apply, for its report.
    primed: Option<(u32, u32)>,
    /// The other backend's tables, read with the view when no detection seed holds them, for
    /// the sweep that follows.
    other_read: Option<Result<BTreeMap<TableName, ActualTable>, ApplyError>>,
    /// The drift check's netlink socket (nft backend), opened on first use.
    nft_gen: Option<NftGeneration>,
    /// Restores written by this applier and those sharing the count
    /// ([`Self::share_restore_count`]): each moved the nft generation by one.
    own_restores: Arc<AtomicU64>,
    /// The drift check's raw socket (legacy backend), opened on first use.
    xt_info: Option<XtInfo>,
    /// The change signals' values when the tables last matched our view.
    seen: Seen,
    /// When legacy's contents hash was last taken, and how long that took.
    last_contents: Option<(Instant, Duration)>,
}

/// The change signals' values ([`super::signal`]) when the tables last matched our view.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Seen {
    /// nft: the generation; legacy: the tables' summaries; the save's hash where neither can be
    /// asked.
    fast: Option<u64>,
    /// legacy, beside the summaries: the tables' contents hash, taken on a slower cadence;
    /// `None` after a write of ours (the next one taken differs, and the tables are re-read).
    contents: Option<u64>,
}

impl<R: Runner> Applier<R> {
    pub fn new(runner: R, config: ApplierConfig) -> Self {
        let mode = match config.backend {
            Backend::Legacy => Some(Mode::Legacy),
            Backend::Nft => Some(Mode::Nft),
            Backend::Auto => None,
        };
        Applier {
            runner,
            config,
            mode,
            view: None,
            seed: None,
            saves: AtomicU32::new(0),
            sweep_due: false,
            primed: None,
            other_read: None,
            nft_gen: None,
            own_restores: Arc::default(),
            xt_info: None,
            seen: Seen::default(),
            last_contents: None,
        }
    }

    pub fn runner(&self) -> &R {
        &self.runner
    }

    pub fn config(&self) -> &ApplierConfig {
        &self.config
    }

    /// The backend in use, detecting it on first use.
    pub fn mode(&mut self) -> Result<Mode, ApplyError> {
        if let Some(m) = self.mode {
            return Ok(m);
        }
        let m = backend::resolve(&self.runner, self.config.backend)?;
        tracing::info!(backend = ?m, "iptables backend selected");
        self.mode = Some(m);
        Ok(m)
    }

    /// Uses `detection`'s backend and seeds the next full read with its saves of this family
    /// (ours and the other backend's). Call it right before an apply: the seed stands for the
    /// kernel as it was when detection read it, and only the next apply uses it.
    pub fn use_detection(&mut self, detection: &Detection) {
        let family = self.config.family;
        self.mode = Some(detection.mode);
        self.seed = Some(Seed {
            own: detection.save(detection.mode, family).map(str::to_string),
            other: detection
                .save(detection.mode.other(), family)
                .map(str::to_string),
        });
    }

    /// Counts `other`'s restores and this applier's together, so that neither takes the other's
    /// writes for someone else's (the agent's two families, one process, one nft generation).
    pub fn share_restore_count<Q: Runner>(&mut self, other: &Applier<Q>) {
        self.own_restores = other.own_restores.clone();
    }

    /// Forgets the kernel view; the next apply reads the kernel again.
    pub fn invalidate(&mut self) {
        self.view = None;
        self.other_read = None;
        self.primed = None;
    }

    /// Whether the next apply plans against a view it already holds (no kernel read).
    pub fn has_view(&self) -> bool {
        self.view.is_some() && !self.config.reread_every_apply
    }

    /// Reads the kernel now when the next apply would (no view yet, or after a failure or
    /// [`Self::invalidate`]), detecting the backend first if needed, and writes nothing: a caller
    /// can overlap the read with rendering (the agent does on its first apply after a restart,
    /// whose time is mostly these saves). The next apply plans against this view; its report
    /// counts these reads and saves.
    pub fn read_kernel(&mut self) -> Result<(), ApplyError> {
        if self.has_view() || self.primed.is_some() {
            return Ok(());
        }
        self.saves.store(0, Ordering::Relaxed);
        let result = self.ensure_mode().and_then(|mode| self.load_view(mode));
        let saves = self.saves.load(Ordering::Relaxed);
        match result {
            Ok(()) => {
                let (r, s) = self.primed.unwrap_or_default();
                self.primed = Some((r + 1, s + saves));
                Ok(())
            }
            Err(e) => {
                self.seed = None;
                self.invalidate();
                Err(e)
            }
        }
    }

    /// The backend, detecting it (and seeding the next full read with detection's saves) on
    /// first use.
    fn ensure_mode(&mut self) -> Result<Mode, ApplyError> {
        if self.mode.is_none() {
            // Detecting now, the saves it reads are fresh: seed this apply with them.
            let detection = backend::detect(&self.runner, self.config.backend)?;
            tracing::info!(backend = ?detection.mode, reason = ?detection.reason, "iptables backend selected");
            self.use_detection(&detection);
        }
        self.mode()
    }

    /// Reads the whole view (from detection's save of our backend when there is one) and,
    /// unless detection's save of it is at hand, the other backend's tables for the sweep.
    fn load_view(&mut self, mode: Mode) -> Result<(), ApplyError> {
        let own = self.seed.as_mut().and_then(|s| s.own.take());
        let other = self
            .seed
            .as_ref()
            .is_none_or(|s| s.other.is_none())
            .then(|| mode.other());
        let (view, other_read) = self.read_all(mode, own, other)?;
        self.view = Some(view);
        self.other_read = other_read;
        self.sweep_due = true;
        Ok(())
    }

    /// The fast drift check ([`super::drift`]): when the tables' change signal moved since we
    /// last looked, re-reads them and repairs what of ours differs from `desired` (only those
    /// chains, one transaction per table); compares our sets' members every time, from
    /// `ipset_save` when the caller read it for both families (one read instead of two), else
    /// read here. Does nothing before the first apply.
    pub fn check_drift(
        &mut self,
        desired: &DesiredState,
        ipset_save: Option<&str>,
    ) -> Result<(DriftReport, Option<ApplyReport>), ApplyError> {
        let mut drift = DriftReport::default();
        let (Some(mode), Some(_)) = (self.mode, self.view.as_ref()) else {
            return Ok((drift, None));
        };
        if let (Some(save), seen) = self.tables_if_changed(mode)? {
            drift.listings = 1;
            let mut tables = read_tables(&save);
            drift.edited = verify_bodies(&save, desired, &mut tables);
            for table in TableName::ALL {
                let actual = tables.get(&table).unwrap_or(&EMPTY_TABLE);
                let d = desired.tables.get(&table);
                for chain in touched(&plan_table(table, d, actual)?) {
                    // A root chain flushed or gone: likely the whole table was.
                    drift.full_refresh |= ROOTS.contains(&chain)
                        && actual.chains.get(chain).is_none_or(Vec::is_empty);
                    drift.drifted.push(format!("{table}/{chain}"));
                }
            }
            self.view().tables = tables;
            // Planned whole: the next check re-reads only after a later change.
            self.seen = seen;
        }
        // Our sets, by members. A domain set's members come and go without us (learner, kernel
        // timeouts): only its absence is drift.
        let sets = match ipset_save {
            Some(text) => parse_ipset_save(self.config.family, text),
            None => self.read_sets()?,
        };
        drift.sets = (self.view().sets.iter())
            .filter(|(name, set)| match sets.get(*name) {
                None => true,
                Some(now) => !set.is_timed() && now.members != set.members,
            })
            .map(|(name, _)| name.clone())
            .collect();
        if !drift.sets.is_empty() {
            self.view().sets = sets;
        }
        drift
            .drifted
            .extend(drift.sets.iter().map(|s| format!("ipset/{s}")));
        if drift.drifted.is_empty() {
            return Ok((drift, None));
        }
        let report = self.apply(desired)?;
        Ok((drift, Some(report)))
    }

    /// This backend's save as the kernel has it now, or `None` when the change signals say
    /// nothing changed since the last look or our last write ([`super::signal`]); and the
    /// signals' values, taken before the tables were read (a change in between is seen again).
    fn tables_if_changed(&mut self, mode: Mode) -> Result<(Option<String>, Seen), ApplyError> {
        if let Some(fast) = self.nft_generation(mode).or_else(|| self.legacy_info(mode)) {
            let mut seen = Seen {
                fast: Some(fast),
                contents: self.seen.contents,
            };
            let contents_due = mode == Mode::Legacy
                && self.last_contents.is_none_or(|(at, took)| {
                    at.elapsed() >= took.saturating_mul(self.config.contents_hash_factor)
                });
            if contents_due {
                let started = Instant::now();
                seen.contents = self.legacy_contents(mode);
                self.last_contents = Some((started, started.elapsed()));
            }
            if self.seen == seen {
                return Ok((None, seen));
            }
            return Ok((Some(self.save_text(mode, None)?), seen));
        }
        // No signal can be asked (the programs run in another namespace): the save, hashed.
        let text = self.save_text(mode, None)?;
        let seen = Seen {
            fast: Some(save_hash(&text)),
            contents: None,
        };
        if self.seen == seen {
            return Ok((None, seen));
        }
        Ok((Some(text), seen))
    }

    /// Legacy's fast signal, the tables' summaries ([`legacy_info`]), when this backend is
    /// legacy and the applier's programs run in our own network namespace; `None` otherwise
    /// (the save is then hashed on every check). Read on the thread that writes.
    pub(super) fn legacy_info(&mut self, mode: Mode) -> Option<u64> {
        if mode != Mode::Legacy || self.runner.netns().is_some() {
            return None;
        }
        ask_signal(
            &mut self.xt_info,
            || XtInfo::open(self.config.family),
            |s| legacy_info(s),
            "the legacy tables' summaries",
            "hashes the save",
        )
    }

    /// Legacy's slower signal, the tables' contents ([`legacy_contents`]), under the same
    /// conditions as [`Self::legacy_info`].
    fn legacy_contents(&mut self, mode: Mode) -> Option<u64> {
        if mode != Mode::Legacy || self.runner.netns().is_some() {
            return None;
        }
        ask_signal(
            &mut self.xt_info,
            || XtInfo::open(self.config.family),
            legacy_contents,
            "the legacy tables' contents",
            "hashes the save",
        )
    }

    /// The nft ruleset generation less our own restores (each one transaction), when this
    /// backend is nft and the applier's programs run in our own network namespace; `None`
    /// otherwise (the tables are then hashed). Read on the thread that writes, between writes.
    fn nft_generation(&mut self, mode: Mode) -> Option<u64> {
        if mode != Mode::Nft || self.runner.netns().is_some() {
            return None;
        }
        let own = self.own_restores.load(Ordering::Relaxed) as u32;
        ask_signal(
            &mut self.nft_gen,
            NftGeneration::open,
            // Our own transactions taken out: only someone else's move the value.
            |s| s.get().map(|g| g.wrapping_sub(own).into()),
            "nftables' generation",
            "reads the tables",
        )
    }

    /// Re-reads the kernel and applies `desired`, repairing any drift.
    pub fn refresh(&mut self, desired: &DesiredState) -> Result<ApplyReport, ApplyError> {
        self.invalidate();
        self.apply(desired)
    }

    /// Makes the kernel match `desired`, writing only differences.
    pub fn apply(&mut self, desired: &DesiredState) -> Result<ApplyReport, ApplyError> {
        self.apply_scoped(desired, None)
    }

    /// [`Self::apply`] for a `desired` state of which only what `changes` names differs from the
    /// state this applier last applied (successfully, or it would have no view): plans only
    /// those chains and sets, in time proportional to the change (the renderer's
    /// [`take_changes`](crate::render::Renderer::take_changes) gives them). Whenever the view is
    /// new (first apply, after a failure, [`Self::invalidate`], [`Self::read_kernel`],
    /// `reread_every_apply`), the whole state is planned, as [`Self::apply`] does. Changes left
    /// out of `changes` are not written until the next whole plan ([`Self::refresh`]).
    pub fn apply_changes(
        &mut self,
        desired: &DesiredState,
        changes: &Changes,
    ) -> Result<ApplyReport, ApplyError> {
        if desired.family != self.config.family {
            // Changes meant for another state: do not trust the view with them.
            self.invalidate();
        }
        self.apply_scoped(desired, Some(changes))
    }

    fn apply_scoped(
        &mut self,
        desired: &DesiredState,
        changes: Option<&Changes>,
    ) -> Result<ApplyReport, ApplyError> {
        if desired.family != self.config.family {
            self.seed = None; // a seed is for the next apply only, used or not
            return Err(ApplyError::FamilyMismatch {
                applier: self.config.family.number(),
                desired: desired.family.number(),
            });
        }
        let (primed_reads, primed_saves) = self.primed.take().unwrap_or_default();
        self.saves.store(primed_saves, Ordering::Relaxed);
        let mode = match self.ensure_mode() {
            Ok(m) => m,
            Err(e) => {
                self.seed = None;
                return Err(e);
            }
        };
        let mut report = ApplyReport {
            kernel_reads: primed_reads,
            ..ApplyReport::default()
        };
        let mut result = Ok(());
        if self.view.is_none() || (self.config.reread_every_apply && primed_reads == 0) {
            match self.load_view(mode) {
                Ok(()) => report.kernel_reads += 1,
                Err(e) => result = Err(e),
            }
        }
        let other_seed = self.seed.take().and_then(|s| s.other);
        // A view just read may differ anywhere: plan everything.
        let scope = changes.filter(|_| report.kernel_reads == 0);
        if result.is_ok() {
            result = self.apply_phases(mode, desired, scope, other_seed, &mut report);
        }
        report.saves = self.saves.load(Ordering::Relaxed);
        if result.is_err() {
            self.invalidate();
        }
        result.map(|()| report)
    }

    fn apply_phases(
        &mut self,
        mode: Mode,
        desired: &DesiredState,
        scope: Option<&Changes>,
        other_seed: Option<String>,
        report: &mut ApplyReport,
    ) -> Result<(), ApplyError> {
        // A view just read: our rules whose bodies are not what their ids stand for are
        // rewritten with the rest of the drift.
        let view = self.view();
        if let Some(save) = view.unverified.take() {
            verify_bodies(&save, desired, &mut view.tables);
        }
        // Plan (and so validate) every table before anything is written: bad input fails the
        // apply with nothing changed in the kernel.
        let mut planned = Vec::new();
        for table in TableName::ALL {
            let d = desired.tables.get(&table);
            let view = self.view();
            if d.is_none() && !view.tables.contains_key(&table) {
                continue;
            }
            let actual = view.tables.get(&table).unwrap_or(&EMPTY_TABLE);
            let ops = match scope {
                // A table no longer desired at all is planned whole.
                Some(c) if d.is_some() => {
                    let names = c.chains.get(&table).unwrap_or(&NO_NAMES);
                    plan_chains(table, d, actual, names)?
                }
                _ => plan_table(table, d, actual)?,
            };
            if !ops.is_empty() {
                planned.push((table, ops));
            }
        }
        let set_scope = scope.map(|c| &c.sets);
        let set_plan = plan_updates(
            desired.family,
            sets_in(desired, set_scope),
            &self.view().sets,
        )?;
        self.update_sets(desired, set_scope, set_plan, report)?;
        for (table, ops) in planned {
            self.write_table(mode, table, desired, ops, report)?;
        }
        if std::mem::take(&mut self.sweep_due) {
            self.sweep_other_backend(mode, other_seed, report)?;
        }
        self.delete_sets(desired, report)
    }

    fn view(&mut self) -> &mut KernelView {
        self.view.get_or_insert_with(KernelView::default)
    }

    fn backoff(&self, attempt: u32) {
        std::thread::sleep(self.config.initial_backoff * 2u32.saturating_pow(attempt));
    }

    /// Removes our chains and hook rules from the backend we do not use (before phase 3, so the
    /// sets those rules reference can go). Failing to read or write the other backend is logged,
    /// not fatal: our policy is in place in the backend that holds the host's rules.
    fn sweep_other_backend(
        &mut self,
        mode: Mode,
        seed: Option<String>,
        report: &mut ApplyReport,
    ) -> Result<(), ApplyError> {
        let other = mode.other();
        let read = match (seed, self.other_read.take()) {
            (Some(text), _) => self.seeded_tables(other, text),
            (None, Some(read)) => read,
            (None, None) => self.read_iptables(other, None),
        };
        let tables = match read {
            Ok(t) => t,
            Err(e) => {
                tracing::warn!(error = %e, "cannot read the other iptables backend, not sweeping it");
                return Ok(());
            }
        };
        for (table, actual) in &tables {
            let ops = plan_table(*table, None, actual)?;
            if ops.is_empty() {
                continue;
            }
            let payload = render(*table, &ops);
            let program = other.restore_program(self.config.family);
            let out = self
                .runner
                .run(&program, other.restore_args(), Some(payload.as_bytes()))?;
            if out.status.success() {
                tracing::info!(%table, backend = ?other, "removed our leftovers from the other backend");
                report.other_backend.insert(*table, payload);
            } else {
                tracing::warn!(%table, backend = ?other, stderr = %clean_stderr(&String::from_utf8_lossy(&out.stderr)), "cannot sweep the other backend");
            }
        }
        Ok(())
    }
}

/// The desired sets an apply plans: all, or those `scope` names.
fn sets_in<'a>(
    desired: &'a DesiredState,
    scope: Option<&'a BTreeSet<String>>,
) -> Box<dyn Iterator<Item = (&'a String, &'a IpSetSpec)> + 'a> {
    match scope {
        None => Box::new(desired.ip_sets.iter()),
        Some(names) => Box::new(
            names
                .iter()
                .filter_map(|n| desired.ip_sets.get_key_value(n)),
        ),
    }
}

/// A scoped thread's result; its panic goes on in the caller.
fn join<T>(h: std::thread::ScopedJoinHandle<'_, T>) -> T {
    h.join().unwrap_or_else(|p| std::panic::resume_unwind(p))
}

/// Asks a change signal through its socket, opened on first use and again after an error;
/// `None` (the check falls back as `fallback` says) when it cannot be opened or does not answer.
fn ask_signal<S>(
    slot: &mut Option<S>,
    open: impl FnOnce() -> std::io::Result<S>,
    ask: impl FnOnce(&mut S) -> std::io::Result<u64>,
    what: &str,
    fallback: &str,
) -> Option<u64> {
    let socket = match slot {
        Some(s) => s,
        None => match open() {
            Ok(s) => slot.insert(s),
            Err(error) => {
                tracing::warn!(%error, "cannot ask for {what}; the drift check {fallback}");
                return None;
            }
        },
    };
    match ask(socket) {
        Ok(v) => Some(v),
        Err(error) => {
            tracing::warn!(%error, "{what}");
            *slot = None;
            None
        }
    }
}
