//! `felixrs trace`: which of a node's rules decide a packet between two pods (or addresses).
//!
//! The objects are rendered for the node exactly as `felixrs render` does; the packet then runs
//! through the filter table with [`iptables::render::trace`], the evaluator the renderer's property
//! tests check against the policy semantics: from `cali-FORWARD` between pods and addresses, from
//! `cali-INPUT` to the host itself (`--to host:ADDR`), from `cali-OUTPUT` from it (`--from
//! host:ADDR`). The packet arrives on the source pod's interface if that pod is on the node (else
//! on `eth0`) and leaves by the destination pod's interface likewise; it is a new connection
//! (conntrack NEW).

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::net::IpAddr;

use anyhow::{Context, bail};
use calc_graph::proto::{Action, Output};
use iptables::desired::TableName;
use iptables::render::Renderer;
use iptables::render::names;
use iptables::render::static_chains::verdict_of_chain;
use iptables::render::trace::{self, Effect, Outcome, Packet, RendererRules};

mod check;
mod decision;
mod hosts;
pub mod kernel;
mod traced;

use check::read_kernel;
pub use check::{check_kernel, check_sets};
use decision::Deciders;
pub use decision::{Decision, Explainer};
pub use hosts::PreTable;
use traced::End;
pub use traced::{Path, Traced, Verdict};

use crate::cmd::shared::dataplane_args::DataplaneArgs;
use crate::cmd::shared::node_view::{NodeView, SourceArgs, origin_note, render_node_learned};
use crate::cmd::shared::pods::Pods;
use crate::cmd::shared::{Answer, finish};
use crate::dns::persist::FILE_NAME;
use crate::dns::trace::{LearnedFile, explain as explain_domain};
use crate::flowlog::FlowAction;
use crate::staged::StagedView;

/// `felixrs trace`.
#[derive(Debug, Clone, clap::Args)]
pub struct Args {
    #[command(flatten)]
    pub source: SourceArgs,
    /// The node whose rules to trace.
    #[arg(long)]
    pub node_name: String,
    #[command(flatten)]
    pub packet: PacketArgs,
    /// Also read this host's kernel (`iptables-save` and `ipset save`, as root, in the node's network
    /// namespace) and check that every chain the packet entered holds the rendered rules, that the
    /// sets they use hold the right members, and that nothing foreign runs before our hook. Exits 2
    /// if the kernel differs. A foreign rule (one without a `cali:` id the rendered rules have
    /// there) fails the check: for any packet when it sits ahead of our hook, or, in FORWARD,
    /// behind our hook but ahead of our appended accept rule and ends packets (ACCEPT, DROP,
    /// REJECT); for the traced packet when it sits inside one of our chains the packet entered or
    /// when it decides the packet in the kernel's own rules (wherever it sits). Each is named with
    /// its table, chain, position and text.
    #[arg(long)]
    pub check_kernel: bool,
    /// Also trace the packet through this host's kernel rules as they are (`iptables-save` and
    /// `ipset save`, as root, in the node's network namespace), foreign rules included, from the top
    /// of the kernel chain, and show where that path differs from the rendered one. Exits 2 if
    /// the verdicts differ. A rule is ours when it carries a `cali:` id the rendered rules have
    /// in its chain, wherever it sits (our hooks and FORWARD's appended accept rule included);
    /// foreign rules inside our chains the packet entered, or ahead of our rules in the kernel
    /// chain, are listed (`not ours: filter CHAIN rule N (where): -A CHAIN …`).
    #[arg(long)]
    pub kernel: bool,
    /// The agent's learned DNS map (`dns-learned.json`) to fill domain sets from; with
    /// `--state-dir` its `dns-learned.json` is read when present.
    #[arg(long)]
    pub dns_learned: Option<std::path::PathBuf>,
    #[command(flatten)]
    pub dataplane: DataplaneArgs,
}

/// The packet to trace.
#[derive(Debug, Clone, clap::Args)]
pub struct PacketArgs {
    /// The source: a pod as `namespace/name`, an address, or this node as `host:ADDR`.
    #[arg(long)]
    pub from: String,
    /// The destination: a pod as `namespace/name`, an address, or this node as `host:ADDR`.
    #[arg(long)]
    pub to: String,
    /// tcp, udp, sctp, icmp (ICMPv6 over IPv6), or a protocol number.
    #[arg(long, default_value = "tcp")]
    pub protocol: String,
    /// Destination port (TCP, UDP, SCTP).
    #[arg(long, default_value_t = 80)]
    pub port: u16,
    /// Source port (TCP, UDP, SCTP).
    #[arg(long, default_value_t = 40000)]
    pub source_port: u16,
    /// ICMP type (default: echo request, 8 or ICMPv6 128).
    #[arg(long)]
    pub icmp_type: Option<u8>,
    /// ICMP code.
    #[arg(long, default_value_t = 0)]
    pub icmp_code: u8,
    /// Use the pods' IPv6 addresses (with addresses, their family decides).
    #[arg(long)]
    pub ipv6: bool,
}

impl Args {
    pub fn run(self) -> std::process::ExitCode {
        finish("trace", self.trace())
    }

    /// The report and the objects that were skipped or rendered fail-closed; status 2 if the
    /// kernel differs (the report then ends with the first check that found it).
    fn trace(&self) -> anyhow::Result<Answer> {
        let in_state_dir = (self.source.state_dir.as_ref()).map(|d| d.join(FILE_NAME));
        let learned_path =
            (self.dns_learned.clone()).or_else(|| in_state_dir.filter(|p| p.exists()));
        let learned =
            (learned_path.map(|p| LearnedFile::load(&p).map(std::sync::Arc::new))).transpose()?;
        let view = render_node_learned(&self.source, &self.node_name, &self.dataplane, learned)?;
        let traced = trace_packet(&view, &self.node_name, &self.packet)?;
        let mut text = report(&view, &traced, &self.node_name);
        text.push_str(&staged_report(&view, &traced, &self.dataplane)?);
        let mut answer = Answer {
            text,
            problems: view.problems.clone(),
            status: 0,
        };
        let text = &mut answer.text;
        if !view.failed_safe.is_empty() {
            let _ = writeln!(
                text,
                "rules not rendered as written (a field the agent does not enforce or know; never widens a rule):"
            );
            for f in &view.failed_safe {
                let _ = writeln!(text, "  {}", f.trim_start_matches("failed safe: "));
            }
        }
        if self.check_kernel {
            let v = traced.packet.version();
            let (program, actual, actual_sets) = read_kernel(v)?;
            let desired = view
                .renderer
                .desired_ref(v)
                .tables
                .get(&TableName::Filter)
                .cloned()
                .unwrap_or_default();
            let mut findings = check_kernel(&traced, &desired, &actual);
            findings.extend(check::check_pre_tables(&view, &traced)?);
            findings.extend(check_sets(&view, &traced, &actual_sets));
            // The packet through the kernel's own rules: a foreign rule inside our chains, or one
            // that decides it (wherever it sits), is named.
            let state = kernel::read_kernel_state(v)?;
            let kt = kernel::trace_kernel_against(&traced, &state, Some(&desired))?;
            findings.extend(kt.foreign_decider.clone());
            findings.extend(
                (kt.foreign.iter())
                    .filter(|f| f.contains("(inside our chain"))
                    .map(|f| format!("not ours: {f}")),
            );
            let _ = writeln!(text, "kernel ({program} -t filter, ipset save):");
            if findings.is_empty() {
                let _ = writeln!(
                    text,
                    "  every chain the packet entered holds the rendered rules, and our hook is first in {}",
                    traced.path.kernel_chain()
                );
                let _ = writeln!(text, "  the IP sets those chains use hold what they should");
            } else {
                for f in &findings {
                    let _ = writeln!(text, "  differs: {f}");
                }
                answer.status = 2;
                return Ok(answer);
            }
        }
        if self.kernel {
            let v = traced.packet.version();
            let desired = (view.renderer.desired_ref(v).tables.get(&TableName::Filter)).cloned();
            let state = kernel::read_kernel_state(v)?;
            let kt = kernel::trace_kernel_against(&traced, &state, desired.as_ref())?;
            text.push_str(&kt.text);
            if !kt.agrees {
                answer.status = 2;
            }
        }
        Ok(answer)
    }
}

/// The packet through the staged view (every staged policy enforced in its tier and order),
/// beside the enforced verdict: a `staged:` section, or nothing when no staged policy changes
/// how the packet's endpoints are evaluated.
fn staged_report(
    view: &NodeView,
    traced: &Traced,
    dataplane: &DataplaneArgs,
) -> anyhow::Result<String> {
    let mut s = String::new();
    let staged = StagedView::from_outputs(dataplane.render_config(), &view.outputs)
        .map_err(|e| anyhow::anyhow!("staged view renderer: {e}"))?;
    let pkt = &traced.packet;
    if staged.is_empty() || !staged.applies_to(pkt.src, pkt.dst) {
        return Ok(s);
    }
    let Some((_, v)) = staged.trace(pkt, traced.path.our_chain()) else {
        let _ = writeln!(s, "staged: cannot trace the staged view");
        return Ok(s);
    };
    let word = |a: FlowAction| match a {
        FlowAction::Allow => "ACCEPT",
        FlowAction::Deny => "DROP",
        FlowAction::Pass => "PASS",
    };
    let enforced = match traced.verdict {
        Verdict::Drop => FlowAction::Deny,
        Verdict::Accept | Verdict::NotOurs => FlowAction::Allow,
    };
    if v.action == enforced {
        let _ = writeln!(s, "staged: same as enforced ({})", word(v.action));
    } else {
        let _ = writeln!(
            s,
            "staged: {} (enforced: {}), with every staged policy enforced in its tier and order",
            word(v.action),
            word(enforced)
        );
    }
    for h in &v.hits {
        let verb = match h.action {
            FlowAction::Allow => "allowed",
            FlowAction::Deny => "dropped",
            FlowAction::Pass => "passed",
        };
        let _ = match h.kind.as_str() {
            "EndOfTier" => writeln!(s, "  {verb} at the end of tier {}", h.name),
            "NoProfile" => writeln!(s, "  {verb}: no profile allowed the packet"),
            "Profile" => writeln!(s, "  {verb} by profile {}", h.name),
            kind => {
                let ns = h
                    .namespace
                    .as_ref()
                    .map(|n| format!("{n}/"))
                    .unwrap_or_default();
                let tier = h.tier.as_deref().unwrap_or("default");
                writeln!(s, "  {verb} by {kind} {ns}{} (tier {tier})", h.name)
            }
        };
    }
    Ok(s)
}

/// Traces one packet through `view`'s rules for `node` (the view must be rendered for it).
pub fn trace_packet(view: &NodeView, node: &str, p: &PacketArgs) -> anyhow::Result<Traced> {
    trace_packet_with(view, &Pods::of(view), node, p)
}

/// [`trace_packet`] with the view's pods looked up once, for many packets.
pub fn trace_packet_with(
    view: &NodeView,
    pods: &Pods,
    node: &str,
    p: &PacketArgs,
) -> anyhow::Result<Traced> {
    let from = end(view, pods, node, p.ipv6, &p.from, "--from")?;
    let to = end(view, pods, node, p.ipv6, &p.to, "--to")?;
    if from.addr.is_ipv6() != to.addr.is_ipv6() {
        bail!(
            "--from {} and --to {} are of different families",
            from.addr,
            to.addr
        );
    }
    let path = match (from.host, to.host) {
        (true, true) => bail!("--from and --to are both this host: no policy applies"),
        (false, true) => Path::Input,
        (true, false) => Path::Output,
        (false, false) => Path::Forward,
    };
    let v6 = from.addr.is_ipv6();
    let proto = protocol_number(&p.protocol, v6)?;
    let mut pkt = Packet::new(from.addr, to.addr, proto, p.source_port, p.port);
    pkt.icmp_type = p.icmp_type.unwrap_or(if v6 { 128 } else { 8 });
    pkt.icmp_code = p.icmp_code;
    // A locally generated packet has no input interface, one for the host no output interface;
    // between the host and elsewhere, the packet takes the interface of the host endpoint whose
    // expectedIPs hold the host's address (else eth0).
    let iface = |e: &End, other: &End| match (&e.local_iface, e.host) {
        (Some(i), _) => i.clone(),
        (None, true) => String::new(),
        (None, false) => (other.host_endpoint.as_ref())
            .map(|(_, i)| i.clone())
            .filter(|i| i != calc_graph::proto::ALL_INTERFACES)
            .unwrap_or_else(|| "eth0".into()),
    };
    pkt.in_iface = iface(&from, &to);
    pkt.out_iface = iface(&to, &from);
    // raw and mangle first (host endpoints' doNotTrack and preDNAT policy): the filter table
    // sees the mark and conntrack state they leave.
    let mut seen = pkt.clone();
    let pre = hosts::pre_tables(view, path, &mut seen)?;
    let t = if pre.last().is_some_and(|p| p.trace.outcome == Outcome::Drop) {
        trace::Trace {
            steps: Vec::new(),
            outcome: Outcome::Drop,
            mark: seen.mark,
            domain_hits: Vec::new(),
            untracked: seen.conntrack == trace::ConntrackState::Untracked,
        }
    } else {
        let rules = RendererRules {
            renderer: &view.renderer,
            version: pkt.version(),
            table: TableName::Filter,
        };
        trace::trace(&rules, path.our_chain(), &seen)
            .map_err(|e| anyhow::anyhow!("cannot trace: {e}"))?
    };
    let accept = view.renderer.marks().accept;
    let verdict = match t.outcome {
        Outcome::Accept => Verdict::Accept,
        Outcome::Drop => Verdict::Drop,
        // FORWARD's appended hook accepts what policy accepted.
        Outcome::Return if path == Path::Forward && t.mark & accept != 0 => Verdict::Accept,
        Outcome::Return => Verdict::NotOurs,
    };
    Ok(Traced {
        path,
        packet: pkt,
        pre,
        trace: t,
        verdict,
        from,
        to,
    })
}

fn end(
    view: &NodeView,
    pods: &Pods,
    node: &str,
    want_v6: bool,
    spec: &str,
    flag: &str,
) -> anyhow::Result<End> {
    let host_endpoint = |addr| {
        hosts::endpoint_of(&view.outputs, addr).map(|h| (h.name.clone(), h.interface_name.clone()))
    };
    if let Some(a) = spec.strip_prefix("host:") {
        let addr = a.parse::<IpAddr>().map_err(|_| {
            anyhow::anyhow!("{flag} {spec:?}: want host:ADDR with one of this node's addresses")
        })?;
        return Ok(End {
            host: true,
            addr,
            pod: None,
            local_iface: None,
            host_endpoint: host_endpoint(addr),
        });
    }
    let (addr, pod) = if let Ok(addr) = spec.parse::<IpAddr>() {
        (addr, pods.by_addr(addr))
    } else {
        if !spec.contains('/') {
            bail!("{flag} {spec:?}: want namespace/pod, an IP address or host:ADDR");
        }
        let pod = pods.by_id(spec).with_context(|| {
            format!("{flag} {spec:?}: no such pod with an address in the manifests")
        })?;
        let addr = pod.addrs.iter().find(|a| a.is_ipv6() == want_v6);
        let addr = *addr.with_context(|| {
            let family = if want_v6 { "IPv6" } else { "IPv4" };
            format!("{flag} {spec:?}: the pod has no {family} address")
        })?;
        (addr, Some(pod))
    };
    // An address of one of the node's host endpoints (its expectedIPs) is the node itself.
    let hep = host_endpoint(addr).filter(|_| pod.is_none());
    Ok(End {
        host: hep.is_some(),
        addr,
        pod: pod.map(|p| p.id.clone()),
        local_iface: pod.filter(|p| p.node == node).map(|p| p.iface.clone()),
        host_endpoint: hep,
    })
}

fn protocol_number(p: &str, v6: bool) -> anyhow::Result<u8> {
    Ok(match p.to_ascii_lowercase().as_str() {
        "tcp" => 6,
        "udp" => 17,
        "sctp" => 132,
        "icmp" if v6 => 58,
        "icmp" => 1,
        "icmpv6" => 58,
        other => other.parse().map_err(|_| {
            anyhow::anyhow!("--protocol {p:?}: want tcp, udp, sctp, icmp or a number")
        })?,
    })
}

/// What one of our chains belongs to.
pub(super) struct Owner {
    /// A policy's or profile's chain (where verdicts come from), not an endpoint's.
    pub(super) verdicts: bool,
    pub(super) what: String,
    /// The tier of a policy's chain.
    pub(super) tier: Option<String>,
}

/// The owner of each policy, profile, endpoint and shared policy chain, with its direction.
fn chain_owners(outputs: &[Output], renderer: &Renderer) -> BTreeMap<String, Owner> {
    let mut owners = BTreeMap::new();
    for o in outputs {
        for ingress in [true, false] {
            let dir = if ingress { "ingress" } else { "egress" };
            // The endpoint's shared chain: the policies of every endpoint with the same ones.
            if let Output::EndpointUpdated(e) = o
                && let Some(shared) = renderer.shared_chain(&e.id, ingress)
            {
                let others = renderer.shared_chain_users(shared).saturating_sub(1);
                owners.entry(shared.to_string()).or_insert_with(|| Owner {
                    verdicts: false,
                    what: format!(
                        "{dir} of endpoint {} (shared policy chain; {others} other endpoint(s) use it)",
                        e.id
                    ),
                    tier: None,
                });
            }
            let (chain, verdicts, what, tier) = match o {
                Output::PolicyUpdated(p) => (
                    names::policy_chain_name(&p.id, ingress),
                    true,
                    format!("{dir} of {}", p.id),
                    Some(p.id.tier.clone()),
                ),
                Output::ProfileUpdated(p) => (
                    names::profile_chain_name(&p.id, ingress),
                    true,
                    format!("{dir} of profile {}", p.id),
                    None,
                ),
                Output::EndpointUpdated(e) => (
                    names::endpoint_chain_name(&e.interface_name, ingress),
                    false,
                    format!("{dir} of endpoint {}", e.id),
                    None,
                ),
                _ => continue,
            };
            owners.insert(
                chain,
                Owner {
                    verdicts,
                    what,
                    tier,
                },
            );
        }
    }
    owners.extend(hosts::chain_owners(outputs));
    owners
}

fn describe_packet(p: &Packet) -> String {
    let name = match p.proto {
        6 => "tcp",
        17 => "udp",
        132 => "sctp",
        1 => "icmp",
        58 => "icmpv6",
        _ => "",
    };
    match p.proto {
        6 | 17 | 132 => format!(
            "{name} {} port {} -> {} port {}",
            p.src, p.sport, p.dst, p.dport
        ),
        1 | 58 => format!(
            "{name} type {} code {} {} -> {}",
            p.icmp_type, p.icmp_code, p.src, p.dst
        ),
        n => format!("protocol {n} {} -> {}", p.src, p.dst),
    }
}

/// Why a policy, profile or endpoint rule decided: the action and the tier of a policy's rule,
/// or the tier whose end dropped the packet (read from the rule's comment, as `render` prints it).
fn decision(verb: &str, tier: Option<&str>, verdicts: bool, rule_text: &str) -> String {
    if rule_text.contains("dropping all traffic") {
        return ": its chain drops everything (unknown, or could not be rendered: fail closed)"
            .to_string();
    }
    if let Some(tier) = tier {
        return match verb {
            "allowed" => format!(": an Allow rule of tier {tier}"),
            "passed" => format!(": a Pass rule of tier {tier}, on to the next tier"),
            _ => format!(": a Deny rule of tier {tier}"),
        };
    }
    if verdicts {
        return match verb {
            "allowed" => ": an Allow rule of the profile".to_string(),
            "passed" => ": a Pass rule of the profile".to_string(),
            _ => ": a Deny rule of the profile".to_string(),
        };
    }
    if let Some(rest) = rule_text.split("End of tier ").nth(1) {
        let tier = rest.split(". Drop").next().unwrap_or(rest);
        return format!(
            ": the end of tier {tier}, whose policies select the endpoint but none allowed, denied or passed the packet"
        );
    }
    if rule_text.contains("Drop if no profiles matched") {
        return ": no tier decided and no profile allowed the packet".to_string();
    }
    String::new()
}

/// What a rule going to a verdict chain decided.
fn verdict_goto(effect: &Effect) -> Option<&'static str> {
    let Effect::Goto(c) = effect else { return None };
    verdict_of_chain(c).map(|a| match a {
        Action::Allow => "allowed",
        Action::Pass => "passed",
        Action::Deny | Action::Log => "dropped",
    })
}

fn describe_end(e: &End) -> String {
    if let (true, Some((name, iface))) = (e.host, &e.host_endpoint) {
        return format!("this node (host endpoint {name}, {iface})");
    }
    if e.host {
        return "this node".to_string();
    }
    match (&e.pod, &e.local_iface) {
        (Some(p), Some(i)) => format!("{p} (on this node, {i})"),
        (Some(p), None) => format!("{p} (another node)"),
        (None, _) => "no pod of the manifests".to_string(),
    }
}

fn report(view: &NodeView, traced: &Traced, node: &str) -> String {
    let (pkt, from, to, t) = (&traced.packet, &traced.from, &traced.to, &traced.trace);
    let owners = chain_owners(&view.outputs, &view.renderer);
    let mut s = String::new();
    let _ = writeln!(
        s,
        "packet: {} (IPv{}, new connection), on node {node}",
        describe_packet(pkt),
        pkt.version().number()
    );
    if let Some(rev) = view.revision {
        let _ = writeln!(
            s,
            "  rules as the agent's snapshot at datastore revision {rev} renders them{}",
            origin_note(view.stamp.as_ref())
        );
    }
    let _ = writeln!(s, "  from {}: {}", pkt.src, describe_end(from));
    let _ = writeln!(s, "  to   {}: {}", pkt.dst, describe_end(to));
    let path = match traced.path {
        Path::Forward => "routed through the node: FORWARD, from cali-FORWARD",
        Path::Input => "to the node itself: INPUT, from cali-INPUT",
        Path::Output => "from the node itself: OUTPUT, from cali-OUTPUT",
    };
    let _ = writeln!(s, "  {path}");
    let iface = |i: &str| (if i.is_empty() { "-" } else { i }).to_string();
    let _ = writeln!(
        s,
        "  in on {}, out on {}",
        iface(&pkt.in_iface),
        iface(&pkt.out_iface)
    );
    let mut deciders = Deciders::default();
    let mut mark = pkt.mark;
    for pre in &traced.pre {
        let _ = writeln!(s, "{}", pre.heading());
        report_steps(
            &mut s,
            view,
            &owners,
            pre.table,
            pkt,
            &pre.trace,
            &mut mark,
            &mut deciders,
        );
        if let Some(last) = pre.trace.steps.last()
            && let Some(hit) = hosts::failsafe_hit(view, pre.table, pkt, last)
            && pre.trace.outcome == Outcome::Accept
        {
            deciders.push(format!(
                "{hit} ({} {} rule {}, before any policy)",
                pre.table.as_str(),
                last.chain,
                last.rule
            ));
        }
        if pre.trace.untracked {
            deciders.push(format!(
                "untracked: the {} table's NOTRACK gave it no conntrack entry (doNotTrack policy: replies need their own allow)",
                pre.table.as_str()
            ));
        }
    }
    let _ = writeln!(s, "rules the packet matched, in order:");
    if t.steps.is_empty() && !traced.pre.is_empty() {
        let _ = writeln!(
            s,
            "  (none: the packet was dropped before the filter table)"
        );
    }
    report_steps(
        &mut s,
        view,
        &owners,
        TableName::Filter,
        pkt,
        t,
        &mut mark,
        &mut deciders,
    );
    // An ACCEPT ends the packet too (established flows, the configured action to the host).
    if let (Outcome::Accept, Some(last)) = (t.outcome, t.steps.last()) {
        let what = owners
            .get(&last.chain)
            .map_or(last.chain.as_str(), |o| o.what.as_str());
        deciders.push(format!(
            "accepted by {what} ({} rule {})",
            last.chain, last.rule
        ));
        if let Some(hit) = hosts::failsafe_hit(view, TableName::Filter, pkt, last) {
            deciders.push(format!("{hit} (before any host endpoint policy)"));
        }
    }
    let verdict = match traced.verdict {
        Verdict::Accept if t.outcome == Outcome::Return => {
            "ACCEPT (policy accepted it; FORWARD's appended felixrs rule accepts it)"
        }
        Verdict::Accept => "ACCEPT",
        Verdict::Drop => "DROP",
        Verdict::NotOurs => match traced.path {
            Path::Forward => {
                "NOT OURS (cali-FORWARD returned without a verdict: FORWARD's other rules and policy decide)"
            }
            Path::Input => {
                "NOT OURS (cali-INPUT returned without a verdict: INPUT's other rules and policy decide)"
            }
            Path::Output => {
                "NOT OURS (cali-OUTPUT returned: felixrs does not police the host's own traffic to workloads; OUTPUT's other rules decide)"
            }
        },
    };
    let _ = writeln!(s, "verdict: {verdict}");
    for d in deciders.lines {
        let _ = writeln!(s, "  {d}");
    }
    s
}

/// The report's lines for the steps of one table's trace, with what decided the packet pushed to
/// `deciders`; `mark` is the mark before the first step, and after the last when done.
#[allow(clippy::too_many_arguments)]
fn report_steps(
    s: &mut String,
    view: &NodeView,
    owners: &BTreeMap<String, Owner>,
    table: TableName,
    pkt: &Packet,
    t: &trace::Trace,
    mark: &mut u32,
    deciders: &mut Deciders,
) {
    let marks = *view.renderer.marks();
    for step in &t.steps {
        // As iptables-save prints it, with the `cali:` id to find it in the kernel's rules.
        let rule = view
            .renderer
            .desired_ref(pkt.version())
            .tables
            .get(&table)
            .and_then(|t| t.chains.get(&step.chain))
            .and_then(|c| c.get(step.rule - 1));
        let text = rule
            .map(|r| format!("(cali:{}) {}", r.hash, r.body()))
            .unwrap_or_default();
        let owner = owners.get(&step.chain);
        let label = owner.map(|o| format!(" [{}]", o.what)).unwrap_or_default();
        let indent = "  ".repeat(step.depth + 1);
        let _ = writeln!(
            s,
            "{indent}{}{label} rule {}: {text}\n{indent}  => {}",
            step.chain,
            step.rule,
            kernel::effect_text(&step.effect)
        );
        // A net set's name hides its CIDRs (shared layout): list them, the set holds exactly these.
        let built = (view.renderer.chain(pkt.version(), table, &step.chain))
            .and_then(|c| c.get(step.rule - 1));
        for (name, nets) in built.map_or(&[][..], |r| r.net_sets()) {
            let list: Vec<String> = nets.iter().map(ToString::to_string).collect();
            let _ = writeln!(s, "{indent}  set {name} holds {}", list.join(", "));
        }
        // A policy or profile rule that sets the accept bit allowed the packet, one that sets the
        // pass bit sent it on to the next tier; any DROP ends it.
        let verdicts = owner.is_some_and(|o| o.verdicts);
        let newly =
            |bit: u32| matches!(step.effect, Effect::Mark(m) if m & bit != 0 && *mark & bit == 0);
        // Shared layout: the policy's rule goes to a verdict chain (whose own steps decide
        // nothing of their own: the rule that went there did).
        let verb = if verdict_of_chain(&step.chain).is_some() {
            None
        } else if let (true, Some(verb)) = (verdicts, verdict_goto(&step.effect)) {
            Some(verb)
        } else if step.effect == Effect::Drop {
            Some("dropped")
        } else if verdicts && newly(marks.accept) {
            Some("allowed")
        } else if verdicts && newly(marks.pass) {
            Some("passed")
        } else {
            None
        };
        if let Some(verb) = verb {
            let what = owner.map_or(step.chain.as_str(), |o| o.what.as_str());
            let tier = owner.and_then(|o| o.tier.as_deref());
            let why = decision(verb, tier, verdicts, &text);
            (deciders.decisions).push(Decision::of(verb, what, tier, &why));
            deciders.push(format!(
                "{verb} by {what} ({} rule {}){why}",
                step.chain, step.rule
            ));
            if verb == "allowed"
                && let Some(hit) = t.domain_hit_at(&step.chain, step.rule)
            {
                deciders.push(format!(
                    "allowed by {}",
                    explain_domain(view.learned.as_deref(), hit)
                ));
            }
        }
        if let Effect::Mark(m) = step.effect {
            *mark = m;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::decision;

    #[test]
    fn decisions_name_action_tier_and_tier_ends() {
        assert_eq!(
            decision("passed", Some("adminnetworkpolicy"), true, ""),
            ": a Pass rule of tier adminnetworkpolicy, on to the next tier"
        );
        assert_eq!(
            decision(
                "dropped",
                Some("t"),
                true,
                "-m mark --mark 0x40000/0x40000 -j DROP"
            ),
            ": a Deny rule of tier t"
        );
        let end = r#"-m comment --comment "End of tier kube-baseline. Drop if no policies passed packet" -m mark --mark 0x0/0x20000 -j DROP"#;
        assert!(
            decision("dropped", None, false, end).starts_with(": the end of tier kube-baseline,")
        );
        let failed = r#"-m comment --comment "Policy x" -m comment --comment "Failed to render: dropping all traffic" -j DROP"#;
        assert!(decision("dropped", Some("t"), true, failed).contains("fail closed"));
        assert_eq!(decision("dropped", None, false, "-j DROP"), "");
    }
}
