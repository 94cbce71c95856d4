//! The [`Applier`]'s writes: `ipset restore` (phase 1, create/fill; phase 3, destroy) and one
//! `iptables-restore --noflush` transaction per table (phase 2), each retried after re-reading
//! what it wrote against.

use super::*;

impl<R: Runner> Applier<R> {
    pub(super) fn ipset_restore(
        &self,
        payload: &str,
    ) -> Result<Result<(), (Option<usize>, String)>, ApplyError> {
        let out = self
            .runner
            .run("ipset", &["-exist", "restore"], Some(payload.as_bytes()))?;
        if out.status.success() {
            return Ok(Ok(()));
        }
        let stderr = clean_stderr(&String::from_utf8_lossy(&out.stderr));
        Ok(Err((failed_line(&stderr), stderr)))
    }

    /// Phase 1: writes `plan` (made against the current view); after a failure, re-reads the
    /// sets, plans again and retries.
    pub(super) fn update_sets(
        &mut self,
        desired: &DesiredState,
        scope: Option<&BTreeSet<String>>,
        plan: SetUpdatePlan,
        report: &mut ApplyReport,
    ) -> Result<(), ApplyError> {
        let mut attempt = 0;
        let mut plan = plan;
        let mut scope = scope;
        loop {
            if attempt > 0 {
                // The sets were read again: any of them may differ.
                scope = None;
                plan = plan_updates(desired.family, &desired.ip_sets, &self.view().sets)?;
            }
            if plan.payload.is_empty() {
                // Every planned set is as desired: remember so, to skip them next time.
                after_updates(sets_in(desired, scope), &mut self.view().sets);
                return Ok(());
            }
            for name in &plan.retyped {
                if self.set_references(name)? > 0 {
                    let from = self.view().sets[name].type_name.clone();
                    return Err(ApplyError::IpSetTypeInUse {
                        set: name.clone(),
                        from,
                        to: crate::desired::ipset::type_name(desired.ip_sets[name].kind)
                            .to_string(),
                    });
                }
            }
            match self.ipset_restore(&plan.payload)? {
                Ok(()) => {
                    after_updates(sets_in(desired, scope), &mut self.view().sets);
                    report.ipset_updates = plan.payload;
                    return Ok(());
                }
                Err((line, stderr)) => {
                    attempt += 1;
                    if attempt >= self.config.max_attempts {
                        return Err(ApplyError::IpSetRestore {
                            phase: "create/update",
                            attempts: attempt,
                            line,
                            line_text: line.and_then(|n| payload_line(&plan.payload, n)),
                            stderr,
                        });
                    }
                    tracing::warn!(attempt, %stderr, "ipset update failed, re-reading sets");
                    report.retries += 1;
                    self.backoff(attempt - 1);
                    self.view().sets = self.read_sets()?;
                }
            }
        }
    }

    /// Writes `ops` (planned against the current view) as one transaction; after a failure,
    /// re-reads the table, plans again and retries.
    pub(super) fn write_table(
        &mut self,
        mode: Mode,
        table: TableName,
        desired: &DesiredState,
        ops: Vec<Op>,
        report: &mut ApplyReport,
    ) -> Result<(), ApplyError> {
        let d = desired.tables.get(&table);
        let mut attempt = 0;
        let mut ops = ops;
        loop {
            if attempt > 0 {
                let actual = self.view().tables.entry(table).or_default();
                ops = plan_table(table, d, actual)?;
            }
            if ops.is_empty() {
                return Ok(());
            }
            let payload = render(table, &ops);
            let program = mode.restore_program(self.config.family);
            // legacy: the tables' summaries as the drift check last saw them, before our write?
            let unmoved = self.seen.fast.is_some() && self.legacy_info(mode) == self.seen.fast;
            let out = self
                .runner
                .run(&program, mode.restore_args(), Some(payload.as_bytes()))?;
            if out.status.success() {
                // One nft transaction: the generation moved by one, ours.
                self.own_restores.fetch_add(1, Ordering::Relaxed);
                if unmoved {
                    // Only our write moved them (or someone else's in the microseconds around
                    // it, which the re-read below finds): the next check need not re-read.
                    self.seen.fast = self.legacy_info(mode);
                }
                // Not their contents (too costly to take around every write): the next time
                // the contents hash is taken, the tables are re-read and checked whole.
                self.seen.contents = None;
                let actual = self.view().tables.entry(table).or_default();
                if let Err(e) = simulate(table, actual, &ops) {
                    // The kernel took it, so our model is what is wrong: read again next time.
                    tracing::warn!(%table, error = %e, "kernel view diverged, will re-read");
                    self.invalidate();
                }
                report.iptables.insert(table, payload);
                return Ok(());
            }
            let stderr = clean_stderr(&String::from_utf8_lossy(&out.stderr));
            attempt += 1;
            if attempt >= self.config.max_attempts {
                let (line, line_text) = blame(&payload, &stderr);
                return Err(ApplyError::Restore {
                    table,
                    attempts: attempt,
                    line,
                    line_text,
                    stderr,
                });
            }
            tracing::warn!(%table, attempt, %stderr, "iptables-restore failed, re-reading table");
            report.retries += 1;
            self.backoff(attempt - 1);
            let save = self.save_text(mode, Some(table))?;
            let mut fresh = read_tables(&save);
            verify_bodies(&save, desired, &mut fresh);
            let view = self.view();
            view.tables.remove(&table);
            view.tables.extend(fresh);
            report.kernel_reads += 1;
        }
    }

    pub(super) fn delete_sets(
        &mut self,
        desired: &DesiredState,
        report: &mut ApplyReport,
    ) -> Result<(), ApplyError> {
        let mut names = plan_deletions(&desired.ip_sets, &self.view().sets);
        let mut written = String::new();
        while !names.is_empty() {
            let payload = render_deletions(&names);
            match self.ipset_restore(&payload)? {
                Ok(()) => {
                    for n in &names {
                        self.view().sets.remove(n);
                    }
                    written.push_str(&payload);
                    break;
                }
                Err((line, stderr)) => {
                    // Lines before the failing one were executed; the failing set is in use.
                    let Some(bad) = line
                        .and_then(|n| n.checked_sub(1))
                        .filter(|&i| i < names.len())
                    else {
                        return Err(ApplyError::IpSetRestore {
                            phase: "destroy",
                            attempts: 1,
                            line,
                            line_text: None,
                            stderr,
                        });
                    };
                    tracing::warn!(set = %names[bad], %stderr, "cannot destroy ip set, leaving it");
                    for n in &names[..bad] {
                        self.view().sets.remove(n);
                    }
                    written.push_str(&render_deletions(&names[..bad]));
                    report.undeletable_sets.push(names[bad].clone());
                    names.drain(..=bad);
                }
            }
        }
        report.ipset_deletions = written;
        Ok(())
    }
}
