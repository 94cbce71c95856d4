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
use iptables::desired::{TableName, ipset};
use iptables::model::{Policy, Ruleset};
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
    Ok(KernelState {
        program,
        ruleset,
        ipsets: run("ipset", &["save"])?,
        warnings: warnings.iter().map(ToString::to_string).collect(),
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

fn is_ours(chain: &str) -> bool {
    chain.starts_with("cali-")
}

/// Traces `traced`'s packet through `state` and compares with the rendered trace.
pub fn trace_kernel(traced: &Traced, state: &KernelState) -> anyhow::Result<KernelTrace> {
    let pkt = &traced.packet;
    let table = state
        .ruleset
        .table(TableName::Filter)
        .context("the kernel's save has no filter table")?;
    let sets = ipset::parse_save(pkt.version(), &state.ipsets);
    let rules = KernelRules::new(table, &sets, pkt);
    let start = traced.path.kernel_chain();
    let t = trace::trace(&rules, start, pkt)
        .map_err(|e| anyhow::anyhow!("cannot trace the kernel: {e}"))?;
    let mut s = String::new();
    let _ = writeln!(
        s,
        "kernel ({} -t filter, ipset save), from {start}:",
        state.program
    );
    for w in &state.warnings {
        let _ = writeln!(s, "  note: {w}");
    }
    for step in &t.steps {
        let text = rules.text(&step.chain, step.rule).unwrap_or_default();
        let owner = if is_ours(&step.chain) || text.contains("\"cali:") || text.contains(" cali:") {
            ""
        } else {
            " [not ours]"
        };
        let indent = "  ".repeat(step.depth + 1);
        let _ = writeln!(
            s,
            "{indent}{}{owner} rule {}: -A {} {text}\n{indent}  => {}",
            step.chain,
            step.rule,
            step.chain,
            effect_text(&step.effect)
        );
    }
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
        }
        None => {
            let _ = writeln!(
                s,
                "kernel verdict: {} ({start}'s policy: no rule ended the packet)",
                word(verdict)
            );
        }
    }
    let entered: Vec<&str> = t.steps.iter().map(|st| st.chain.as_str()).collect();
    for a in &rules.assumptions {
        if entered.contains(&a.chain.as_str()) {
            let _ = writeln!(s, "  assumed: {} rule {}: {}", a.chain, a.rule, a.what);
        }
    }
    let agrees = match traced.verdict {
        Verdict::Accept => verdict == KernelVerdict::Accept,
        Verdict::Drop => verdict == KernelVerdict::Drop,
        Verdict::NotOurs => true,
    };
    let ours = |steps: &[Step]| -> Vec<(String, usize)> {
        steps
            .iter()
            .filter(|st| is_ours(&st.chain))
            .map(|st| (st.chain.clone(), st.rule))
            .collect()
    };
    let (rendered_path, kernel_path) = (ours(&traced.trace.steps), ours(&t.steps));
    if !agrees {
        let rendered = match traced.verdict {
            Verdict::Accept => "ACCEPT",
            Verdict::Drop => "DROP",
            Verdict::NotOurs => "not ours",
        };
        let why = match decider {
            Some(d) if !is_ours(&d.chain) && kernel_path.is_empty() => format!(
                "{} rule {} is not ours and decides before our hook",
                d.chain, d.rule
            ),
            Some(d) if !is_ours(&d.chain) => {
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
        .find(|&i| rendered_path.get(i) != kernel_path.get(i))
        && !kernel_path.is_empty()
    {
        let at = |p: &[(String, usize)]| {
            p.get(i)
                .map_or("nothing".to_string(), |(c, r)| format!("{c} rule {r}"))
        };
        let _ = writeln!(
            s,
            "differs: in our chains, step {} is {} in the kernel and {} in the rendered rules",
            i + 1,
            at(&kernel_path),
            at(&rendered_path)
        );
    } else if agrees {
        let _ = writeln!(s, "the kernel agrees with the rendered rules");
    }
    Ok(KernelTrace {
        text: s,
        verdict,
        agrees,
    })
}
