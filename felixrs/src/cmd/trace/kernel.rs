//! `felixrs trace --kernel`: the packet through the kernel's own filter table, as parsed from
//! `iptables-save` (foreign rules included) with our IP sets from `ipset save`, from the top of
//! the kernel chain (`FORWARD`, `INPUT`, `OUTPUT`), with the evaluator of the rendered trace
//! ([`iptables::render::trace`], rules prepared by [`iptables::render::trace_kernel`]); then
//! where it differs from the rendered path: the verdict, the rule that decided, and the first of
//! our chains where the kernel took another way.

use std::fmt::Write as _;

use anyhow::{Context, bail};
use calc_graph::proto::IpVersion;
use iptables::apply::backend::{self, Backend, Mode};
use iptables::apply::{ExecRunner, Runner};
use iptables::desired::{DesiredTable, TableName, ipset};
use iptables::model::{Policy, Rule, Ruleset};
use iptables::parse::parse_save_lenient;
use iptables::render::static_chains::VERDICT_DROP;
use iptables::render::trace::{self, Effect, Outcome, Step};
use iptables::render::trace_kernel::KernelRules;

use super::traced::{Traced, Verdict};

/// What the kernel read for a kernel trace.
pub struct KernelState {
    /// The save program, for the report.
    pub program: String,
    pub ruleset: Ruleset,
    /// `ipset save` text.
    pub ipsets: String,
    /// Lines the parser kept verbatim.
    pub warnings: Vec<String>,
    /// The raw and mangle tables (`-t raw`, `-t mangle`), for packets that meet host endpoint
    /// policy there ([`Traced::pre`]).
    pub pre_tables: Vec<(TableName, Ruleset)>,
}

/// Reads this host's filter table of family `v` (backend detected as the agent does) and IP sets.
pub fn read_kernel_state(v: IpVersion) -> anyhow::Result<KernelState> {
    let runner = ExecRunner::new();
    let mode = backend::resolve(&runner, Backend::Auto)
        .map_err(|e| anyhow::anyhow!("detecting the iptables backend: {e}"))?;
    read_kernel_state_with(&runner, mode, v)
}

/// [`read_kernel_state`] through `runner` (e.g. inside a network namespace), backend `mode`.
pub fn read_kernel_state_with(
    runner: &dyn Runner,
    mode: Mode,
    v: IpVersion,
) -> anyhow::Result<KernelState> {
    let run = |program: &str, args: &[&str]| output_of(runner, program, args);
    let program = mode.save_program(v);
    let text = run(&program, &["-t", "filter"])?;
    let (ruleset, warnings) =
        parse_save_lenient(&text).map_err(|e| anyhow::anyhow!("{program} -t filter: {e}"))?;
    let mut pre_tables = Vec::new();
    for table in [TableName::Raw, TableName::Mangle] {
        let name = table.as_str();
        let text = run(&program, &["-t", name])?;
        let (r, _) =
            parse_save_lenient(&text).map_err(|e| anyhow::anyhow!("{program} -t {name}: {e}"))?;
        pre_tables.push((table, r));
    }
    Ok(KernelState {
        program,
        ruleset,
        ipsets: run("ipset", &["save"])?,
        warnings: warnings.iter().map(ToString::to_string).collect(),
        pre_tables,
    })
}

/// The standard output of `program args` run through `runner`; an error names the command and
/// its stderr when it fails.
pub(super) fn output_of(
    runner: &dyn Runner,
    program: &str,
    args: &[&str],
) -> anyhow::Result<String> {
    let out = runner
        .run(program, args, None)
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    if !out.status.success() {
        bail!(
            "{program} {} failed: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// The kernel's verdict.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KernelVerdict {
    Accept,
    Drop,
}

/// A trace through the kernel's rules, reported; `agrees` says whether it reaches the rendered
/// trace's verdict.
pub struct KernelTrace {
    pub text: String,
    pub verdict: KernelVerdict,
    pub agrees: bool,
    /// The foreign rule that decided the packet, when one did (`filter CHAIN rule N is not ours
    /// and decides (DROP): -A CHAIN …`).
    pub foreign_decider: Option<String>,
    /// Foreign rules inside our chains the packet entered, or ahead of our rules in the kernel
    /// chain (`filter CHAIN rule N (where): -A CHAIN …`).
    pub foreign: Vec<String>,
}

/// What a step did, as both reports print it.
pub(super) fn effect_text(e: &Effect) -> String {
    match e {
        Effect::Accept => "ACCEPT".into(),
        Effect::Drop => "DROP".into(),
        Effect::Return => "RETURN".into(),
        Effect::Jump(c) => format!("jump to {c}"),
        Effect::Goto(c) => format!("goto {c}"),
        Effect::Mark(m) => format!("mark now {m:#x}"),
        Effect::Continue => "continue".into(),
    }
}

fn is_our_chain(chain: &str) -> bool {
    chain.starts_with("cali-")
}

/// Whose a kernel rule is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Owner {
    /// It carries a `cali:` id the rendered rules have in its chain (or, without rendered rules
    /// to compare with, any `cali:` id): in one of our chains, or in a kernel chain (our hooks,
    /// FORWARD's appended accept rule).
    Ours,
    /// It carries a `cali:` id the rendered rules do not have there (a leftover of ours).
    OursNotRendered,
    /// Anything else, wherever it sits (inside one of our chains too).
    Foreign,
}

/// Decides ownership by a rule's `cali:` id, wherever the rule sits (not by its chain's name).
#[derive(Clone, Copy)]
pub struct Ownership<'a> {
    pub desired: Option<&'a DesiredTable>,
}

impl Ownership<'_> {
    /// The owner of `rule`, which sits in `chain`.
    pub fn of(&self, chain: &str, rule: &Rule) -> Owner {
        let Some(id) = rule.cali_comment().and_then(|c| c.strip_prefix("cali:")) else {
            return Owner::Foreign;
        };
        self.of_id(chain, id)
    }

    /// The owner of a rule with our id `id` in `chain`.
    pub fn of_id(&self, chain: &str, id: &str) -> Owner {
        let Some(d) = self.desired else {
            return Owner::Ours;
        };
        let in_chain = d
            .chains
            .get(chain)
            .is_some_and(|rules| rules.iter().any(|r| r.hash == id));
        let hook = (d.hooks.iter()).any(|h| h.kernel_chain == chain && h.rule.hash == id);
        if in_chain || hook {
            Owner::Ours
        } else {
            Owner::OursNotRendered
        }
    }
}

/// Traces `traced`'s packet through `state` and compares with the rendered trace; a rule is ours
/// when it carries a `cali:` id ([`trace_kernel_against`] compares the ids with the rendered rules).
pub fn trace_kernel(traced: &Traced, state: &KernelState) -> anyhow::Result<KernelTrace> {
    trace_kernel_against(traced, state, None)
}

/// [`trace_kernel`], with a rule ours only when `desired` (the rendered filter table) has its id
/// in its chain, and the paths compared rule by rule by id.
pub fn trace_kernel_against(
    traced: &Traced,
    state: &KernelState,
    desired: Option<&DesiredTable>,
) -> anyhow::Result<KernelTrace> {
    let sets = ipset::parse_save(traced.packet.version(), &state.ipsets);
    let mut s = String::new();
    // The raw and mangle tables first, when the rendered trace met them: the filter table sees
    // the mark and conntrack state they leave.
    let mut seen = traced.packet.clone();
    let mut pre_foreign = Vec::new();
    for pre in &traced.pre {
        let Some(table) = (state.pre_tables.iter())
            .find(|(t, _)| *t == pre.table)
            .and_then(|(t, r)| r.table(*t))
        else {
            let _ = writeln!(s, "kernel: no {} table", pre.table.as_str());
            continue;
        };
        let rules = KernelRules::new(table, &sets, &seen);
        let start = pre.kernel_chain();
        let t = trace::trace(&rules, start, &seen).map_err(|e| {
            anyhow::anyhow!("cannot trace the kernel's {}: {e}", pre.table.as_str())
        })?;
        let _ = writeln!(
            s,
            "kernel ({} -t {}), from {start}:",
            state.program,
            pre.table.as_str()
        );
        let owners = Ownership {
            desired: pre.desired.as_ref(),
        };
        write_steps(&mut s, &rules, owners, &t.steps);
        let entered = entered_chains(&t.steps);
        for f in foreign_rules(
            &rules,
            owners,
            pre.table.as_str(),
            start,
            &entered,
            &t.steps,
        ) {
            let _ = writeln!(s, "  not ours: {f}");
            pre_foreign.push(f);
        }
        seen.mark = t.mark;
        if t.untracked {
            seen.conntrack = trace::ConntrackState::Untracked;
        }
        if t.outcome == Outcome::Drop {
            let d = t.steps.last();
            let text = d
                .and_then(|d| rules.text(&d.chain, d.rule))
                .unwrap_or_default();
            let (chain, n) = d.map_or(("", 0), |d| (d.chain.as_str(), d.rule));
            let _ = writeln!(
                s,
                "kernel verdict: DROP by {} {chain} rule {n}: -A {chain} {text}",
                pre.table.as_str()
            );
            let agrees = traced.verdict != Verdict::Accept;
            let _ = writeln!(
                s,
                "{}",
                if agrees {
                    "the kernel agrees with the rendered rules"
                } else {
                    "differs: the rendered rules say ACCEPT, the kernel DROP"
                }
            );
            return Ok(KernelTrace {
                text: s,
                verdict: KernelVerdict::Drop,
                agrees,
                foreign_decider: None,
                foreign: pre_foreign,
            });
        }
    }
    let pkt = &seen;
    let table = state
        .ruleset
        .table(TableName::Filter)
        .context("the kernel's save has no filter table")?;
    let rules = KernelRules::new(table, &sets, pkt);
    let owners = Ownership { desired };
    let owner = |chain: &str, n: usize| {
        (rules.rule(chain, n)).map_or(Owner::Foreign, |r| owners.of(chain, r))
    };
    let start = traced.path.kernel_chain();
    let t = trace::trace(&rules, start, pkt)
        .map_err(|e| anyhow::anyhow!("cannot trace the kernel: {e}"))?;
    let _ = writeln!(
        s,
        "kernel ({} -t filter, ipset save), from {start}:",
        state.program
    );
    for w in &state.warnings {
        let _ = writeln!(s, "  note: {w}");
    }
    write_steps(&mut s, &rules, owners, &t.steps);
    let (verdict, decider) = match t.outcome {
        Outcome::Accept => (KernelVerdict::Accept, t.steps.last()),
        Outcome::Drop => {
            // A drop in the shared layout's verdict chain was decided by the rule that went there.
            let last = t.steps.last();
            let decider = match last {
                Some(l) if l.chain == VERDICT_DROP => (t.steps.iter().rev())
                    .find(|st| st.effect == Effect::Goto(l.chain.clone()))
                    .or(last),
                _ => last,
            };
            (KernelVerdict::Drop, decider)
        }
        // No rule ended it: the kernel chain's policy (ACCEPT when unknown).
        Outcome::Return if rules.policies.get(start) == Some(&Policy::Drop) => {
            (KernelVerdict::Drop, None)
        }
        Outcome::Return => (KernelVerdict::Accept, None),
    };
    let word = |v: KernelVerdict| match v {
        KernelVerdict::Accept => "ACCEPT",
        KernelVerdict::Drop => "DROP",
    };
    let mut foreign_decider = None;
    match decider {
        Some(d) => {
            let text = rules.text(&d.chain, d.rule).unwrap_or_default();
            let _ = writeln!(
                s,
                "kernel verdict: {} by {} rule {}: -A {} {text}",
                word(verdict),
                d.chain,
                d.rule,
                d.chain
            );
            if owner(&d.chain, d.rule) == Owner::Foreign {
                foreign_decider = Some(format!(
                    "filter {} rule {} is not ours and decides ({}): -A {} {text}",
                    d.chain,
                    d.rule,
                    word(verdict),
                    d.chain
                ));
            }
        }
        None => {
            let _ = writeln!(
                s,
                "kernel verdict: {} ({start}'s policy: no rule ended the packet)",
                word(verdict)
            );
        }
    }
    let entered = entered_chains(&t.steps);
    for a in &rules.assumptions {
        if entered.contains(&a.chain.as_str()) {
            let _ = writeln!(s, "  assumed: {} rule {}: {}", a.chain, a.rule, a.what);
        }
    }
    let foreign = foreign_rules(&rules, owners, "filter", start, &entered, &t.steps);
    for f in &foreign {
        let _ = writeln!(s, "  not ours: {f}");
    }
    let foreign: Vec<String> = pre_foreign.into_iter().chain(foreign).collect();
    let agrees = match traced.verdict {
        Verdict::Accept => verdict == KernelVerdict::Accept,
        Verdict::Drop => verdict == KernelVerdict::Drop,
        Verdict::NotOurs => true,
    };
    // The steps in our chains, each named by its rule's id when it has one of ours (a foreign
    // rule inside our chain is not the rendered rule at its position).
    let rendered_id = |chain: &str, n: usize| {
        let rule = desired?.chains.get(chain)?.get(n.checked_sub(1)?)?;
        Some(rule.hash.clone())
    };
    let rendered_path: Vec<PathStep> = (traced.trace.steps.iter())
        .filter(|st| is_our_chain(&st.chain))
        .map(|st| PathStep {
            chain: st.chain.clone(),
            rule: st.rule,
            id: rendered_id(&st.chain, st.rule),
            foreign: false,
        })
        .collect();
    let kernel_path: Vec<PathStep> = (t.steps.iter())
        .filter(|st| is_our_chain(&st.chain))
        .map(|st| {
            let r = rules.rule(&st.chain, st.rule);
            let id = r.and_then(|r| r.cali_comment()?.strip_prefix("cali:").map(String::from));
            PathStep {
                chain: st.chain.clone(),
                rule: st.rule,
                foreign: owner(&st.chain, st.rule) == Owner::Foreign,
                id: if desired.is_some() { id } else { None },
            }
        })
        .collect();
    if !agrees {
        let rendered = match traced.verdict {
            Verdict::Accept => "ACCEPT",
            Verdict::Drop => "DROP",
            Verdict::NotOurs => "not ours",
        };
        let why = match decider {
            Some(d)
                if owner(&d.chain, d.rule) == Owner::Foreign
                    && !is_our_chain(&d.chain)
                    && !kernel_path.iter().any(|p| !p.foreign) =>
            {
                format!(
                    "{} rule {} is not ours and decides before our hook",
                    d.chain, d.rule
                )
            }
            Some(d) if owner(&d.chain, d.rule) == Owner::Foreign && is_our_chain(&d.chain) => {
                format!(
                    "{} rule {} is not ours (inside our chain {}) and decides",
                    d.chain, d.rule, d.chain
                )
            }
            Some(d) if owner(&d.chain, d.rule) == Owner::Foreign => {
                format!("{} rule {} is not ours and decides", d.chain, d.rule)
            }
            Some(d) => format!("{} rule {} decides", d.chain, d.rule),
            None => format!("{start}'s policy decides"),
        };
        let _ = writeln!(
            s,
            "differs: the rendered rules say {rendered}, the kernel {}: {why}",
            word(verdict)
        );
    }
    if let Some(i) = (0..rendered_path.len().max(kernel_path.len()))
        .find(|&i| !same_step(rendered_path.get(i), kernel_path.get(i)))
        && !kernel_path.is_empty()
    {
        let at = |p: &[PathStep]| {
            p.get(i).map_or("nothing".to_string(), |st| {
                let whose = if st.foreign { " (not ours)" } else { "" };
                format!("{} rule {}{whose}", st.chain, st.rule)
            })
        };
        let _ = writeln!(
            s,
            "differs: in our chains, step {} is {} in the kernel and {} in the rendered rules",
            i + 1,
            at(&kernel_path),
            at(&rendered_path)
        );
    } else if agrees && let Some(f) = &foreign_decider {
        let _ = writeln!(s, "the kernel reaches the rendered verdict, but {f}");
    } else if agrees {
        let _ = writeln!(s, "the kernel agrees with the rendered rules");
    }
    Ok(KernelTrace {
        text: s,
        verdict,
        agrees,
        foreign_decider,
        foreign,
    })
}

/// The report's lines for the steps of a kernel trace, each tagged with whose rule it is.
fn write_steps(s: &mut String, rules: &KernelRules, owners: Ownership<'_>, steps: &[Step]) {
    for step in steps {
        let text = rules.text(&step.chain, step.rule).unwrap_or_default();
        let owner = (rules.rule(&step.chain, step.rule))
            .map_or(Owner::Foreign, |r| owners.of(&step.chain, r));
        let tag = match owner {
            Owner::Ours => "",
            Owner::OursNotRendered => " [ours, not in the rendered rules]",
            Owner::Foreign => " [not ours]",
        };
        let indent = "  ".repeat(step.depth + 1);
        let _ = writeln!(
            s,
            "{indent}{}{tag} rule {}: -A {} {text}\n{indent}  => {}",
            step.chain,
            step.rule,
            step.chain,
            effect_text(&step.effect)
        );
    }
}

/// A step of a path through our chains.
struct PathStep {
    chain: String,
    rule: usize,
    /// Its rule's `cali:` id (when compared by id).
    id: Option<String>,
    foreign: bool,
}

fn same_step(a: Option<&PathStep>, b: Option<&PathStep>) -> bool {
    match (a, b) {
        (Some(a), Some(b)) => {
            a.chain == b.chain
                && !a.foreign
                && !b.foreign
                && match (&a.id, &b.id) {
                    (Some(x), Some(y)) => x == y,
                    _ => a.rule == b.rule,
                }
        }
        (None, None) => true,
        _ => false,
    }
}

/// Every chain a trace entered: those with a matched rule, and those jumped to.
fn entered_chains(steps: &[Step]) -> Vec<&str> {
    let mut chains: Vec<&str> = Vec::new();
    for step in steps {
        let target = match &step.effect {
            Effect::Jump(c) | Effect::Goto(c) => Some(c.as_str()),
            _ => None,
        };
        for c in std::iter::once(step.chain.as_str()).chain(target) {
            if !chains.contains(&c) {
                chains.push(c);
            }
        }
    }
    chains
}

/// The foreign rules that can change what our rules decide for packets on this path, each as
/// `filter CHAIN rule N (where): -A CHAIN text`: every foreign rule inside one of our chains the
/// packet entered, and in the kernel chain every one ahead of our last rule there (our hook, and
/// FORWARD's appended accept rule).
fn foreign_rules(
    rules: &KernelRules,
    owners: Ownership<'_>,
    table: &str,
    start: &str,
    entered: &[&str],
    steps: &[Step],
) -> Vec<String> {
    let mut out = Vec::new();
    let matched = |chain: &str, n: usize| steps.iter().any(|s| s.chain == chain && s.rule == n);
    let foreign = |chain: &str, n: usize| {
        (rules.rule(chain, n)).is_some_and(|r| owners.of(chain, r) == Owner::Foreign)
    };
    let mut line = |chain: &str, n: usize, place: &str| {
        let text = rules.text(chain, n).unwrap_or_default();
        let hit = if matched(chain, n) {
            "; the packet matched it"
        } else {
            ""
        };
        out.push(format!(
            "{table} {chain} rule {n} ({place}{hit}): -A {chain} {text}"
        ));
    };
    let last_ours = (1..=rules.chain_len(start))
        .rev()
        .find(|&n| !foreign(start, n) && rules.rule(start, n).is_some());
    if let Some(last) = last_ours {
        for n in (1..last).filter(|&n| foreign(start, n)) {
            line(start, n, &format!("ahead of our rules in {start}"));
        }
    }
    for chain in entered.iter().filter(|c| is_our_chain(c)) {
        for n in (1..=rules.chain_len(chain)).filter(|&n| foreign(chain, n)) {
            line(chain, n, "inside our chain");
        }
    }
    out
}
