//! `felixrs cleanup`: removes everything the agent owns from this node's kernel — every `cali-`
//! chain, every hook rule of ours in the built-in chains (all tables, both iptables backends, both
//! families) and every `cali4*`/`cali6*` IP set — and nothing else. Run it as root in the node's
//! network namespace after the agent is stopped (a running agent would program its rules again).
//!
//! Ownership is decided by the applier's own planning ([`iptables::apply::cleanup`]), so cleanup
//! removes exactly what an apply would consider ours. `--dry-run` prints the payloads it would
//! write and changes nothing.

use std::process::ExitCode;

use iptables::apply::{ExecRunner, cleanup};

/// `felixrs cleanup`.
#[derive(Debug, Clone, clap::Args)]
pub struct Args {
    /// Print what would be removed (the exact iptables-restore and ipset payloads), change nothing.
    #[arg(long)]
    pub dry_run: bool,
}

impl Args {
    pub fn run(self) -> ExitCode {
        if effective_uid() != Some(0) {
            eprintln!(
                "felixrs cleanup: must run as root in the node's network namespace (it reads and writes the kernel's iptables and ipset state)"
            );
            return ExitCode::FAILURE;
        }
        let runner = ExecRunner::new();
        let plan = match cleanup::plan(&runner) {
            Ok(p) => p,
            Err(e) => {
                eprintln!("felixrs cleanup: reading the kernel: {e}");
                return ExitCode::FAILURE;
            }
        };
        for m in &plan.missing {
            eprintln!("felixrs cleanup: skipping a backend: {m}");
        }
        for u in &plan.unreadable {
            eprintln!("felixrs cleanup: cannot read {u}");
        }
        let mut ok = plan.unreadable.is_empty();
        if self.dry_run {
            if plan.is_empty() {
                println!("# nothing of ours to remove");
            } else {
                print!("{}", plan.describe());
            }
            return exit(ok);
        }
        if plan.is_empty() {
            println!("nothing of ours to remove");
            return exit(ok);
        }
        let report = cleanup::execute(&runner, &plan);
        for t in &plan.tables {
            let what = format!("{} (IPv{}, {})", t.program(), t.family.number(), t.table);
            if report.written.contains(&what) {
                println!(
                    "removed {} chain(s) and {} hook rule(s): {what}",
                    t.chains.len(),
                    t.hook_rules
                );
                for kept in &t.kept {
                    eprintln!(
                        "felixrs cleanup: {what}: chain {kept} flushed but kept: a foreign rule jumps to it"
                    );
                    ok = false;
                }
            }
        }
        if !report.destroyed_sets.is_empty() {
            println!("destroyed {} ip set(s)", report.destroyed_sets.len());
        }
        for f in &report.failures {
            eprintln!("felixrs cleanup: {f}");
            ok = false;
        }
        exit(ok)
    }
}

/// The effective uid, from `/proc/self/status` (`Uid: real effective saved fs`).
fn effective_uid() -> Option<u32> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("Uid:"))?;
    line.split_whitespace().nth(2)?.parse().ok()
}

fn exit(ok: bool) -> ExitCode {
    if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}
