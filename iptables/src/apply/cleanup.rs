//! Removing everything of ours from a node (`felixrs cleanup`): our chains and hook rules from
//! every table of both backends (legacy and nft) and both families, then our IP sets.
//!
//! Ownership is decided exactly as an apply decides it, by planning every table against an empty
//! desired state ([`plan_removal`](crate::desired::cleanup::plan_removal), the same plan that sweeps the other backend): chains
//! named `cali-*`, rules in built-in chains whose first comment is `cali:<hash>`, sets named
//! `cali4*`/`cali6*`. Foreign rules, chains and sets are never written; a chain of ours that a
//! foreign rule still jumps to is flushed but kept (deleting it would fail the transaction), and
//! reported. Tables are never flushed and never instantiated: only tables a save lists are planned.
//!
//! [`plan`] reads the kernel and plans; [`CleanupPlan::describe`] is the dry run (the exact
//! payloads); [`execute`] writes the plan: one `iptables-restore --noflush` transaction per table
//! with something of ours, then `ipset destroy` of our sets (after every rule that used them is
//! gone). A failure is reported per table or set and does not stop the others.

use std::fmt::Write as _;

use super::backend::Mode;
use super::engine::INCOMPATIBLE;
use super::error::{ApplyError, clean_stderr};
use super::runner::{RunError, Runner};
use crate::desired::cleanup::plan_removal;
use crate::desired::diff::Op;
use crate::desired::ipset::{parse_save as parse_ipset_save, render_deletions};
use crate::desired::{IpVersion, TableName};
use crate::parse::read_tables;

/// One table of one backend and family with something of ours in it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TableCleanup {
    pub mode: Mode,
    pub family: IpVersion,
    pub table: TableName,
    /// Our chains that will be deleted.
    pub chains: Vec<String>,
    /// Our chains a foreign rule jumps to: flushed, not deleted.
    pub kept: Vec<String>,
    /// How many hook rules of ours (in built-in chains) will be deleted.
    pub hook_rules: usize,
    /// The planned operations, and their `iptables-restore --noflush` payload.
    pub ops: Vec<Op>,
    pub payload: String,
}

impl TableCleanup {
    /// `iptables-legacy-restore`, `ip6tables-nft-restore`, ….
    pub fn program(&self) -> String {
        self.mode.restore_program(self.family)
    }
}

/// Everything of ours found on the node, and what could not be read.
#[derive(Debug, Clone, Default)]
pub struct CleanupPlan {
    pub tables: Vec<TableCleanup>,
    /// Our IP sets, v4 then v6, in name order.
    pub sets: Vec<String>,
    /// Save programs that are not installed (nothing of ours can be in that backend through
    /// them), one line each.
    pub missing: Vec<String>,
    /// Backends/families/tables that could not be read or planned, one line each naming it.
    pub unreadable: Vec<String>,
}

impl CleanupPlan {
    /// Nothing of ours was found.
    pub fn is_empty(&self) -> bool {
        self.tables.is_empty() && self.sets.is_empty()
    }

    /// The dry run: each payload [`execute`] would write, under a `# program (IPv4, table)`
    /// header listing what it removes.
    pub fn describe(&self) -> String {
        let mut out = String::new();
        for t in &self.tables {
            let _ = write!(
                out,
                "# {} --noflush (IPv{}, {}): delete {} chain(s), {} hook rule(s)",
                t.program(),
                t.family.number(),
                t.table,
                t.chains.len(),
                t.hook_rules
            );
            if !t.kept.is_empty() {
                let _ = write!(
                    out,
                    "; flush but keep {} (a foreign rule jumps to it)",
                    t.kept.join(", ")
                );
            }
            out.push('\n');
            out.push_str(&t.payload);
        }
        if !self.sets.is_empty() {
            let _ = writeln!(out, "# ipset restore: destroy {} set(s)", self.sets.len());
            out.push_str(&render_deletions(&self.sets));
        }
        out
    }
}

/// What [`execute`] did and what failed.
#[derive(Debug, Clone, Default)]
pub struct CleanupReport {
    /// Tables written, as `program (IPv4, table)`.
    pub written: Vec<String>,
    pub destroyed_sets: Vec<String>,
    /// One line per table or set that could not be cleaned, naming it and why.
    pub failures: Vec<String>,
}

/// Reads every table of both backends and families and our sets, and plans their removal.
/// A backend whose tools are missing or unreadable is listed in [`CleanupPlan::missing`] or
/// [`CleanupPlan::unreadable`];
/// failing to list IP sets is an error (the sets could not be cleaned).
pub fn plan<R: Runner>(runner: &R) -> Result<CleanupPlan, ApplyError> {
    let mut plan = CleanupPlan::default();
    for mode in [Mode::Legacy, Mode::Nft] {
        for family in [IpVersion::V4, IpVersion::V6] {
            let program = mode.save_program(family);
            let out = match runner.run(&program, &[], None) {
                Ok(out) => out,
                Err(e @ RunError::Spawn { .. }) => {
                    plan.missing.push(e.to_string());
                    continue;
                }
                Err(e) => return Err(e.into()),
            };
            let text = String::from_utf8_lossy(&out.stdout);
            if !out.status.success() || text.contains(INCOMPATIBLE) {
                plan.unreadable.push(format!(
                    "{program}: {} {}",
                    out.status,
                    clean_stderr(&String::from_utf8_lossy(&out.stderr)).trim()
                ));
                continue;
            }
            for (table, actual) in read_tables(&text) {
                match plan_removal(table, &actual) {
                    Ok(Some(r)) => plan.tables.push(TableCleanup {
                        mode,
                        family,
                        table,
                        chains: r.chains,
                        kept: r.kept,
                        hook_rules: r.hook_rules,
                        ops: r.ops,
                        payload: r.payload,
                    }),
                    Ok(None) => {}
                    Err(e) => plan
                        .unreadable
                        .push(format!("{program} table {table}: {e}")),
                }
            }
        }
    }
    let out = runner.run("ipset", &["save"], None)?;
    if !out.status.success() {
        return Err(ApplyError::ReadIpSets {
            detail: clean_stderr(&String::from_utf8_lossy(&out.stderr)),
        });
    }
    let text = String::from_utf8_lossy(&out.stdout);
    for family in [IpVersion::V4, IpVersion::V6] {
        plan.sets
            .extend(parse_ipset_save(family, &text).into_keys());
    }
    Ok(plan)
}

/// Writes `plan`: every table transaction, then the set deletions. Keeps going past failures.
pub fn execute<R: Runner>(runner: &R, plan: &CleanupPlan) -> CleanupReport {
    let mut report = CleanupReport::default();
    for t in &plan.tables {
        let what = format!("{} (IPv{}, {})", t.program(), t.family.number(), t.table);
        match runner.run(
            &t.program(),
            t.mode.restore_args(),
            Some(t.payload.as_bytes()),
        ) {
            Ok(out) if out.status.success() => report.written.push(what),
            Ok(out) => report.failures.push(format!(
                "{what}: {}",
                clean_stderr(&String::from_utf8_lossy(&out.stderr)).trim()
            )),
            Err(e) => report.failures.push(format!("{what}: {e}")),
        }
    }
    if plan.sets.is_empty() {
        return report;
    }
    // One transaction for all sets; if one cannot go (a foreign rule still uses it), destroy them
    // one by one so every other set still goes and each failure names its set.
    let all = render_deletions(&plan.sets);
    if let Ok(out) = runner.run("ipset", &["-exist", "restore"], Some(all.as_bytes()))
        && out.status.success()
    {
        report.destroyed_sets = plan.sets.clone();
        return report;
    }
    for name in &plan.sets {
        match runner.run("ipset", &["destroy", name], None) {
            Ok(out) if out.status.success() => report.destroyed_sets.push(name.clone()),
            Ok(out) => {
                let stderr = clean_stderr(&String::from_utf8_lossy(&out.stderr));
                // Already gone (destroyed by the batch before it failed) is fine.
                if stderr.contains("does not exist") {
                    report.destroyed_sets.push(name.clone());
                } else {
                    report
                        .failures
                        .push(format!("ip set {name}: {}", stderr.trim()));
                }
            }
            Err(e) => report.failures.push(format!("ip set {name}: {e}")),
        }
    }
    report
}

#[cfg(test)]
mod tests {
    use std::os::unix::process::ExitStatusExt;
    use std::process::{ExitStatus, Output};
    use std::sync::Mutex;

    use super::*;
    use crate::desired::diff::simulate;
    use crate::model::is_our_chain;
    use crate::parse::ActualTable;

    /// Felix's own save (every table holds cali- chains and hooks) plus foreign rules.
    const SAVE: &str = include_str!(
        "../../../fuzz/seeds/iptables_save/002-calico-felix-cali-raw-nat-mangle-filter.kernel.txt"
    );
    const IPSETS: &str = "create cali40s:abc hash:ip family inet hashsize 1024 maxelem 1048576\n\
        add cali40s:abc 10.0.0.1\n\
        create cali60s:def hash:net family inet6 hashsize 1024 maxelem 1048576\n\
        create calico-hosts hash:ip family inet hashsize 1024 maxelem 65536\n\
        create KUBE-X hash:ip family inet hashsize 1024 maxelem 65536\n";

    /// Answers saves from fixed text (the legacy IPv4 save is [`SAVE`], the others are empty),
    /// records every write.
    #[derive(Default)]
    struct Fake {
        writes: Mutex<Vec<(String, String)>>,
    }

    impl Runner for Fake {
        fn run(
            &self,
            program: &str,
            args: &[&str],
            stdin: Option<&[u8]>,
        ) -> Result<Output, RunError> {
            let ok = |stdout: &str| Output {
                status: ExitStatus::from_raw(0),
                stdout: stdout.as_bytes().to_vec(),
                stderr: Vec::new(),
            };
            Ok(match (program, args) {
                ("iptables-legacy-save", []) => ok(SAVE),
                (p, []) if p.ends_with("-save") => ok(""),
                ("ipset", ["save"]) => ok(IPSETS),
                _ => {
                    let input = String::from_utf8_lossy(stdin.unwrap_or_default()).into_owned();
                    self.writes
                        .lock()
                        .unwrap()
                        .push((program.to_string(), input));
                    ok("")
                }
            })
        }
    }

    #[test]
    fn plans_away_exactly_what_is_ours_and_writes_tables_before_sets() {
        let fake = Fake::default();
        let plan = plan(&fake).unwrap();
        assert!(plan.unreadable.is_empty() && plan.missing.is_empty());
        assert_eq!(plan.sets, ["cali40s:abc", "cali60s:def"]);
        let kernel = read_tables(SAVE);
        let mut tables: Vec<TableName> = plan.tables.iter().map(|t| t.table).collect();
        tables.sort_by_key(|t| t.as_str());
        assert_eq!(
            tables,
            [
                TableName::Filter,
                TableName::Mangle,
                TableName::Nat,
                TableName::Raw
            ]
        );
        for t in &plan.tables {
            assert_eq!((t.mode, t.family), (Mode::Legacy, IpVersion::V4));
            let before = &kernel[&t.table];
            let mut after = before.clone();
            simulate(t.table, &mut after, &t.ops).unwrap_or_else(|e| panic!("{}: {e}", t.table));
            // Nothing of ours is left, and everything foreign is as it was, in order.
            assert_eq!(after.our_chains().count(), 0, "{}", t.table);
            let foreign = |v: &ActualTable| -> Vec<(String, Vec<String>)> {
                v.chains
                    .iter()
                    .filter(|(c, _)| !is_our_chain(c))
                    .map(|(c, rules)| {
                        let specs = rules
                            .iter()
                            .filter(|r| r.hash.is_none())
                            .map(|r| r.spec.clone())
                            .collect();
                        (c.clone(), specs)
                    })
                    .collect()
            };
            assert_eq!(foreign(&after), foreign(before), "{}", t.table);
            assert!(
                after.chains.values().flatten().all(|r| r.hash.is_none()),
                "{}",
                t.table
            );
            assert_eq!(t.chains.len(), before.our_chains().count());
            assert!(t.kept.is_empty());
        }
        let dry = plan.describe();
        assert!(
            dry.contains("# iptables-legacy-restore --noflush (IPv4, filter): delete "),
            "{dry}"
        );
        assert!(
            dry.ends_with("destroy cali40s:abc\ndestroy cali60s:def\n"),
            "{dry}"
        );

        let report = execute(&fake, &plan);
        assert!(report.failures.is_empty(), "{:?}", report.failures);
        let writes = fake.writes.lock().unwrap();
        assert_eq!(writes.len(), plan.tables.len() + 1);
        assert!(
            writes[..plan.tables.len()]
                .iter()
                .all(|(p, _)| p == "iptables-legacy-restore")
        );
        assert_eq!(
            writes.last().unwrap(),
            &("ipset".to_string(), render_deletions(&plan.sets))
        );
        assert_eq!(report.destroyed_sets, plan.sets);
    }
}
