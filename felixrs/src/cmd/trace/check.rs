//! `felixrs trace --check-kernel`: does the kernel hold the rules and IP set members the packet's
//! traced path went through?

use std::collections::{BTreeMap, BTreeSet};

use calc_graph::proto::IpVersion;
use iptables::apply::ExecRunner;
use iptables::apply::backend::{self, Backend};
use iptables::desired::ipset::{self, ActualSet};
use iptables::desired::{DesiredTable, HookPosition, TableName};
use iptables::parse::{ActualRule, ActualTable, scan_save};
use iptables::render::trace::{Effect, Step};

use super::kernel::output_of;
use super::traced::{Path, Traced};
use crate::cmd::shared::node_view::NodeView;

/// Every chain the packet entered, in order: those with a matched rule, and those jumped to
/// (whose rules may all have missed, e.g. because a rule was gone or a set lacked a member).
fn entered_chains(traced: &Traced) -> Vec<&str> {
    entered(&traced.trace.steps)
}

fn entered(steps: &[Step]) -> Vec<&str> {
    let mut chains: Vec<&str> = Vec::new();
    for step in steps {
        let targets = match &step.effect {
            Effect::Jump(c) | Effect::Goto(c) => Some(c.as_str()),
            _ => None,
        };
        for c in std::iter::once(step.chain.as_str()).chain(targets) {
            if !chains.contains(&c) {
                chains.push(c);
            }
        }
    }
    chains
}

/// How the kernel's filter table differs from the chains a trace went through: the first rule of
/// each entered chain that is missing, extra or replaced (compared by `cali:` ids, position by
/// position), and rules of other owners ahead of our hook in the kernel chain. Empty when the
/// kernel holds what was traced.
pub fn check_kernel(traced: &Traced, desired: &DesiredTable, actual: &ActualTable) -> Vec<String> {
    let mut out = Vec::new();
    let hook_chain = traced.path.kernel_chain();
    let ours = traced.path.our_chain();
    let kernel_rules = actual.chains.get(hook_chain).map_or(&[][..], Vec::as_slice);
    match kernel_rules
        .iter()
        .position(|r| r.hash.is_some() && r.target.as_deref() == Some(ours))
    {
        None => out.push(format!(
            "{hook_chain} has no hook to {ours}: none of our rules run"
        )),
        Some(i) => {
            for (n, r) in kernel_rules[..i].iter().enumerate() {
                out.push(format!(
                    "{hook_chain} rule {} is not ours and runs before {ours}: -A {hook_chain} {}",
                    n + 1,
                    r.spec
                ));
            }
        }
    }
    if traced.path == Path::Forward {
        out.extend(check_forward_accept(desired, kernel_rules));
    }
    out.extend(compare_chains(&entered_chains(traced), desired, actual, ""));
    out
}

/// The first rule of each of `chains` where the kernel (`actual`) differs from `desired`
/// (compared by `cali:` id, position by position), or the chain missing; `table` prefixes the
/// chain names (`"raw "`; empty for the filter table, as the check always wrote them).
fn compare_chains(
    chains: &[&str],
    desired: &DesiredTable,
    actual: &ActualTable,
    table: &str,
) -> Vec<String> {
    let mut out = Vec::new();
    for &chain in chains {
        let want: Vec<&str> = desired
            .chains
            .get(chain)
            .map(|c| c.iter().map(|r| r.hash.as_str()).collect())
            .unwrap_or_default();
        let Some(rules) = actual.chains.get(chain) else {
            out.push(format!("{table}{chain} is missing"));
            continue;
        };
        let got: Vec<Option<&str>> = rules.iter().map(|r| r.hash.as_deref()).collect();
        let len = want.len().max(got.len());
        if let Some(i) = (0..len).find(|&i| got.get(i).copied().flatten() != want.get(i).copied()) {
            let got = match got.get(i) {
                None => "nothing".to_string(),
                Some(None) => "a rule that is not ours (no cali: id)".to_string(),
                Some(Some(h)) => format!("cali:{h}"),
            };
            let want = want
                .get(i)
                .map_or("nothing".to_string(), |h| format!("cali:{h}"));
            out.push(format!(
                "{table}{chain} rule {}: the kernel has {got} where the rendered rules have {want}",
                i + 1
            ));
        }
    }
    out
}

/// How the kernel's raw and mangle tables differ from the ones the packet met first
/// ([`Traced::pre`]): our hook first in the kernel chain (`PREROUTING`/`OUTPUT`), and the chains
/// entered as rendered. Empty when they agree (or the packet met none).
pub fn check_pre_tables(view: &NodeView, traced: &Traced) -> anyhow::Result<Vec<String>> {
    let mut out = Vec::new();
    if traced.pre.is_empty() {
        return Ok(out);
    }
    let v = traced.packet.version();
    let runner = ExecRunner::new();
    let mode = backend::resolve(&runner, Backend::Auto)
        .map_err(|e| anyhow::anyhow!("detecting the iptables backend: {e}"))?;
    let program = mode.save_program(v);
    for pre in &traced.pre {
        let name = pre.table.as_str();
        let actual = scan_save(&output_of(&runner, &program, &["-t", name])?)
            .remove(&pre.table)
            .unwrap_or_default();
        let desired = (view.renderer.desired_ref(v).tables.get(&pre.table))
            .cloned()
            .unwrap_or_default();
        let hook_chain = pre.kernel_chain();
        let kernel_rules = actual.chains.get(hook_chain).map_or(&[][..], Vec::as_slice);
        match (kernel_rules.iter())
            .position(|r| r.hash.is_some() && r.target.as_deref() == Some(pre.start))
        {
            None => out.push(format!(
                "{name} {hook_chain} has no hook to {}: none of our rules run",
                pre.start
            )),
            Some(i) => {
                for (n, r) in kernel_rules[..i].iter().enumerate() {
                    out.push(format!(
                        "{name} {hook_chain} rule {} is not ours and runs before {}: -A {hook_chain} {}",
                        n + 1,
                        pre.start,
                        r.spec
                    ));
                }
            }
        }
        out.extend(compare_chains(
            &entered(&pre.trace.steps),
            &desired,
            &actual,
            &format!("{name} "),
        ));
    }
    Ok(out)
}

/// FORWARD's appended accept rule (`cali:` id of the rendered Append hook) accepts what policy
/// accepted: a foreign rule between our hook and it that ends packets (ACCEPT, DROP, REJECT)
/// decides for every packet our chains accepted, so it is reported whatever the traced packet
/// (a foreign jump there is reported by the kernel trace when it decides the traced packet).
fn check_forward_accept(desired: &DesiredTable, forward: &[ActualRule]) -> Vec<String> {
    let ours: Vec<&str> = (desired.hooks.iter())
        .filter(|h| h.kernel_chain == "FORWARD")
        .map(|h| h.rule.hash.as_str())
        .collect();
    let accepts: Vec<&str> = (desired.hooks.iter())
        .filter(|h| h.kernel_chain == "FORWARD" && h.position == HookPosition::Append)
        .filter(|h| ends_packets(h.rule.body()) == Some("ACCEPT"))
        .map(|h| h.rule.hash.as_str())
        .collect();
    let Some(&accept) = accepts.first() else {
        return Vec::new();
    };
    let Some(at) = (forward.iter()).position(|r| r.hash.as_deref() == Some(accept)) else {
        return vec![format!(
            "FORWARD has no rule cali:{accept} accepting what policy accepted"
        )];
    };
    let hook = (forward.iter())
        .position(|r| r.hash.as_deref().is_some_and(|h| ours.contains(&h)))
        .unwrap_or(0);
    (forward.iter().enumerate())
        .take(at)
        .skip(hook)
        .filter(|(_, r)| !r.hash.as_deref().is_some_and(|h| ours.contains(&h)))
        .filter_map(|(n, r)| {
            let target = ends_packets(&r.spec)?;
            Some(format!(
                "FORWARD rule {} is not ours and ends packets ({target}) before our rule cali:{accept} accepts what policy accepted: -A FORWARD {}",
                n + 1,
                r.spec
            ))
        })
        .collect()
}

/// The target of a rule's text when it ends packets: `ACCEPT`, `DROP` or `REJECT`.
fn ends_packets(spec: &str) -> Option<&'static str> {
    let target = spec.rsplit_once("-j ").map(|(_, t)| t)?;
    let target = target.split_whitespace().next()?;
    ["ACCEPT", "DROP", "REJECT"]
        .into_iter()
        .find(|t| *t == target)
}

/// This host's filter table (backend detected as the agent does) and our IP sets, for family `v`.
pub(super) fn read_kernel(
    v: IpVersion,
) -> anyhow::Result<(String, ActualTable, BTreeMap<String, ActualSet>)> {
    let runner = ExecRunner::new();
    let run = |program: &str, args: &[&str]| output_of(&runner, program, args);
    let mode = backend::resolve(&runner, Backend::Auto)
        .map_err(|e| anyhow::anyhow!("detecting the iptables backend: {e}"))?;
    let program = mode.save_program(v);
    let actual = scan_save(&run(&program, &["-t", "filter"])?)
        .remove(&TableName::Filter)
        .unwrap_or_default();
    let sets = ipset::parse_save(v, &run("ipset", &["save"])?);
    Ok((program, actual, sets))
}

/// How our IP sets in the kernel differ from what the rules of the traversed chains expect: sets
/// missing, members missing or extra (a few of each named). Empty when they agree.
pub fn check_sets(
    view: &NodeView,
    traced: &Traced,
    actual: &BTreeMap<String, ActualSet>,
) -> Vec<String> {
    let v = traced.packet.version();
    let mut names = BTreeSet::new();
    for chain in entered_chains(traced) {
        let rules = view
            .renderer
            .chain(v, TableName::Filter, chain)
            .unwrap_or_default();
        let matches = rules.iter().flat_map(|r| &r.matches);
        names.extend(matches.filter_map(|m| m.set_name()).map(String::from));
    }
    for pre in &traced.pre {
        for chain in entered(&pre.trace.steps) {
            let rules = (view.renderer.chain(v, pre.table, chain)).unwrap_or_default();
            let matches = rules.iter().flat_map(|r| &r.matches);
            names.extend(matches.filter_map(|m| m.set_name()).map(String::from));
        }
    }
    let desired = &view.renderer.desired_ref(v).ip_sets;
    let sample = |s: &BTreeSet<&String>| {
        let first: Vec<&str> = s.iter().take(3).map(|m| m.as_str()).collect();
        let more = s.len().saturating_sub(3);
        if more > 0 {
            format!("{} and {more} more", first.join(", "))
        } else {
            first.join(", ")
        }
    };
    let mut out = Vec::new();
    for name in names {
        let want: BTreeSet<String> = desired
            .get(&name)
            .map(|spec| spec.members.iter().flat_map(ipset::member_texts).collect())
            .unwrap_or_default();
        let Some(got) = actual.get(&name) else {
            out.push(format!("ip set {name} is missing"));
            continue;
        };
        let missing: BTreeSet<&String> = want.difference(&got.members).collect();
        let extra: BTreeSet<&String> = got.members.difference(&want).collect();
        if !missing.is_empty() {
            out.push(format!("ip set {name} lacks {}", sample(&missing)));
        }
        if !extra.is_empty() {
            out.push(format!("ip set {name} also holds {}", sample(&extra)));
        }
    }
    out
}
