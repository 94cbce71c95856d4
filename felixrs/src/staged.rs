//! The staged view evaluator (Calico's pending policies): what the staged policies would decide
//! for a connection, were every one of them enforced in its tier and order.
//!
//! The calculation graph gives each local endpoint its staged view
//! ([`LocalEndpoint::staged_tiers`](calc_graph::proto::LocalEndpoint::staged_tiers)) and emits the
//! staged policies as policies of their own staged kinds. A [`StagedView`] feeds the same outputs
//! to a second [`Renderer`], made with [`Renderer::new_staged_view`] (it renders each endpoint
//! with its staged tiers and the staged policies' chains; it is never applied to a kernel), and
//! traces a packet through it with [`iptables::render::trace`], the evaluator `felixrs trace`
//! uses. Nothing is rendered while no endpoint has a staged view, so a node without staged
//! policies pays only for keeping the outputs.
//!
//! Building it: from the graph's outputs, in order ([`StagedView::new`] then
//! [`StagedView::apply`] for each flushed batch; the operator tools pass a node view's
//! `outputs` once). It implements [`PendingPolicies`] for the flow collector.

use std::collections::{BTreeMap, HashMap};
use std::net::IpAddr;

use calc_graph::proto::{Action, EndpointId, LocalEndpoint, Output, PolicyId, TierInfo};
use iptables::desired::TableName;
use iptables::render::names;
use iptables::render::static_chains::{self, verdict_of_chain};
use iptables::render::trace::{self, Effect, Outcome, Packet, RendererRules};
use iptables::render::{RenderConfig, RenderError, Renderer};

use crate::flowlog::{Connection, FlowAction, PendingPolicies, PolicyHit, Reporter};

/// Which directions of an endpoint the staged view changes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
struct Differs {
    ingress: bool,
    egress: bool,
}

/// A local endpoint whose staged view differs from its enforced tiers.
#[derive(Debug, Clone)]
struct StagedEndpoint {
    iface: String,
    differs: Differs,
}

/// What the staged policies would decide for one packet.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StagedVerdict {
    pub action: FlowAction,
    /// The policies, profiles and tier ends that acted, in evaluation order.
    pub hits: Vec<PolicyHit>,
}

/// The staged view of a node's endpoints; see the module docs.
pub struct StagedView {
    renderer: Renderer,
    /// Endpoints by id, and which of them the staged view changes.
    endpoints: HashMap<EndpointId, LocalEndpoint>,
    staged: HashMap<EndpointId, StagedEndpoint>,
    /// Local endpoint addresses → endpoint.
    by_addr: HashMap<IpAddr, EndpointId>,
    /// The renderer has outputs not yet rendered.
    stale: bool,
}

/// The `--nflog-prefix` of a rule's text, unquoted (`iptables-save` quotes it when it holds
/// a space or a quote; ours never do, but the text is read as the kernel would print it).
fn nflog_prefix(body: &str) -> Option<String> {
    let rest = body.split_once("--nflog-prefix ")?.1;
    match rest.strip_prefix('"') {
        Some(quoted) => {
            let mut out = String::new();
            let mut chars = quoted.chars();
            while let Some(c) = chars.next() {
                match c {
                    '\\' => out.push(chars.next()?),
                    '"' => return Some(out),
                    c => out.push(c),
                }
            }
            None
        }
        None => rest.split_whitespace().next().map(str::to_string),
    }
}

fn policy_lists(tiers: &[TierInfo], ingress: bool) -> Vec<(&str, &[PolicyId])> {
    tiers
        .iter()
        .map(|t| {
            let list = if ingress {
                &t.ingress_policies
            } else {
                &t.egress_policies
            };
            (t.name.as_str(), list.as_slice())
        })
        .filter(|(_, l)| !l.is_empty())
        .collect()
}

impl StagedView {
    /// An empty view rendering with the node's renderer configuration.
    pub fn new(cfg: RenderConfig) -> Result<Self, RenderError> {
        Ok(StagedView {
            renderer: Renderer::new_staged_view(cfg)?,
            endpoints: HashMap::new(),
            staged: HashMap::new(),
            by_addr: HashMap::new(),
            stale: false,
        })
    }

    /// A view of `outputs` (a node view's, in order).
    pub fn from_outputs(cfg: RenderConfig, outputs: &[Output]) -> Result<Self, RenderError> {
        let mut v = StagedView::new(cfg)?;
        v.apply(outputs.iter().cloned());
        Ok(v)
    }

    /// Takes one flushed batch of graph outputs; renders only while some endpoint has a staged
    /// view. Render errors are the enforced renderer's too (it already reports them).
    pub fn apply(&mut self, outputs: impl IntoIterator<Item = Output>) {
        for o in outputs {
            match &o {
                Output::EndpointUpdated(ep) => self.track(ep),
                Output::EndpointRemoved(id) => {
                    self.untrack(id);
                }
                _ => {}
            }
            let _ = self.renderer.apply(o);
            self.stale = true;
        }
        if !self.staged.is_empty() && self.stale {
            let _ = self.renderer.flush();
            self.stale = false;
        }
    }

    fn untrack(&mut self, id: &EndpointId) {
        if let Some(old) = self.endpoints.remove(id) {
            for n in old.ipv4_nets.iter().chain(&old.ipv6_nets) {
                if self.by_addr.get(&n.addr()) == Some(id) {
                    self.by_addr.remove(&n.addr());
                }
            }
        }
        self.staged.remove(id);
    }

    fn track(&mut self, ep: &LocalEndpoint) {
        self.untrack(&ep.id);
        for n in ep.ipv4_nets.iter().chain(&ep.ipv6_nets) {
            self.by_addr.insert(n.addr(), ep.id.clone());
        }
        if let Some(st) = &ep.staged_tiers {
            let differs = Differs {
                ingress: policy_lists(st, true) != policy_lists(&ep.tiers, true),
                egress: policy_lists(st, false) != policy_lists(&ep.tiers, false),
            };
            if differs.ingress || differs.egress {
                self.staged.insert(
                    ep.id.clone(),
                    StagedEndpoint {
                        iface: ep.interface_name.clone(),
                        differs,
                    },
                );
            }
        }
        let mut ep = ep.clone();
        ep.staged_tiers = None;
        self.endpoints.insert(ep.id.clone(), ep);
    }

    /// Whether any local endpoint has a staged view that differs from its enforced one.
    pub fn is_empty(&self) -> bool {
        self.staged.is_empty()
    }

    /// The staged-view renderer (for reports: its chains, marks and rules).
    pub fn renderer(&self) -> &Renderer {
        &self.renderer
    }

    /// The endpoint `addr` belongs to, if the staged view changes its traffic in that direction
    /// (`ingress`: traffic to it).
    fn staged_endpoint(&self, addr: IpAddr, ingress: bool) -> Option<&StagedEndpoint> {
        let id = self.by_addr.get(&addr)?;
        let st = self.staged.get(id)?;
        let d = st.differs;
        (if ingress { d.ingress } else { d.egress }).then_some(st)
    }

    /// Whether the staged view changes how `pkt` is evaluated on this node: its source's egress
    /// or its destination's ingress.
    pub fn applies_to(&self, src: IpAddr, dst: IpAddr) -> bool {
        self.staged_endpoint(src, false).is_some() || self.staged_endpoint(dst, true).is_some()
    }

    /// Traces `pkt` through the staged view from `chain` (`cali-FORWARD`, `cali-INPUT`,
    /// `cali-OUTPUT`); `None` if it cannot be traced.
    pub fn trace(&self, pkt: &Packet, chain: &str) -> Option<(trace::Trace, StagedVerdict)> {
        let rules = RendererRules {
            renderer: &self.renderer,
            version: pkt.version(),
            table: TableName::Filter,
        };
        let t = trace::trace(&rules, chain, pkt).ok()?;
        let accept = self.renderer.marks().accept;
        let action = match t.outcome {
            Outcome::Drop => FlowAction::Deny,
            Outcome::Accept => FlowAction::Allow,
            // FORWARD's appended hook accepts what policy accepted; what our chains return
            // unmarked is not ours to decide (the kernel's other rules do): not denied by policy.
            Outcome::Return if t.mark & accept != 0 => FlowAction::Allow,
            Outcome::Return => FlowAction::Allow,
        };
        let hits = self.hits(pkt, &t);
        Some((t, StagedVerdict { action, hits }))
    }

    /// The policies, profiles and tier ends that decided, from the trace's steps.
    fn hits(&self, pkt: &Packet, t: &trace::Trace) -> Vec<PolicyHit> {
        let owners = self.owners();
        let marks = *self.renderer.marks();
        let mut mark = pkt.mark;
        let mut hits = Vec::new();
        // The rule index the last flow-log NFLOG rule passed named, with its chain: the policy
        // rule a verdict that follows in the same chain belongs to (as the enforced hits carry
        // it). Only a renderer with flow logs on writes these rules.
        let mut logged: Option<(&str, Option<u32>)> = None;
        for step in &t.steps {
            if step.effect == Effect::Continue {
                let body = self.rule_body(pkt, &step.chain, step.rule);
                if let Some(prefix) = nflog_prefix(&body) {
                    let rule = crate::flowlog::nflog::parse_prefix(&prefix).and_then(|p| p.rule);
                    logged = Some((&step.chain, rule));
                }
            }
            let rule_index = logged
                .filter(|(chain, _)| *chain == step.chain)
                .and_then(|(_, rule)| rule);
            let owner = owners.get(&step.chain);
            let newly = |bit: u32| matches!(step.effect, Effect::Mark(m) if m & bit != 0 && mark & bit == 0);
            let verdict = if verdict_of_chain(&step.chain).is_some() {
                None
            } else if let Effect::Goto(c) = &step.effect
                && let Some(a) = verdict_of_chain(c)
            {
                Some(match a {
                    Action::Allow => FlowAction::Allow,
                    Action::Pass => FlowAction::Pass,
                    Action::Deny | Action::Log => FlowAction::Deny,
                })
            } else if step.effect == Effect::Drop {
                Some(FlowAction::Deny)
            } else if owner.is_some() && newly(marks.accept) {
                Some(FlowAction::Allow)
            } else if owner.is_some() && newly(marks.pass) {
                Some(FlowAction::Pass)
            } else {
                None
            };
            if let Some(action) = verdict {
                hits.push(match owner {
                    Some(Owner::Policy(id)) => PolicyHit {
                        kind: id.kind.as_str().to_string(),
                        tier: Some(id.tier.clone()),
                        namespace: id.namespace.clone(),
                        name: id.name.clone(),
                        action,
                        rule_index,
                    },
                    Some(Owner::Profile(p)) => PolicyHit {
                        kind: "Profile".into(),
                        tier: None,
                        namespace: None,
                        name: p.clone(),
                        action,
                        rule_index,
                    },
                    // An endpoint chain's own DROP: the end of a tier, or no profile allowed
                    // (told apart by the rule's comment, as Felix writes it).
                    None => {
                        let body = self.rule_body(pkt, &step.chain, step.rule);
                        let tier = body
                            .split_once("End of tier ")
                            .and_then(|(_, rest)| rest.split_once(". Drop"))
                            .map(|(t, _)| t.trim_matches('"').to_string());
                        match tier {
                            Some(t) => PolicyHit {
                                kind: "EndOfTier".into(),
                                tier: Some(t.clone()),
                                namespace: None,
                                name: t,
                                action,
                                rule_index: None,
                            },
                            None => PolicyHit {
                                kind: "NoProfile".into(),
                                tier: None,
                                namespace: None,
                                name: String::new(),
                                action,
                                rule_index: None,
                            },
                        }
                    }
                });
            }
            if let Effect::Mark(m) = step.effect {
                mark = m;
            }
        }
        hits
    }

    /// A rule's text as `iptables-save` prints it (empty if there is no such rule).
    fn rule_body(&self, pkt: &Packet, chain: &str, rule: usize) -> String {
        (self
            .renderer
            .desired_ref(pkt.version())
            .tables
            .get(&TableName::Filter))
        .and_then(|t| t.chains.get(chain))
        .and_then(|c| c.get(rule.wrapping_sub(1)))
        .map(|r| r.body().to_string())
        .unwrap_or_default()
    }

    fn owners(&self) -> BTreeMap<String, Owner> {
        let mut owners = BTreeMap::new();
        for id in self.renderer.policy_ids() {
            for ingress in [true, false] {
                owners.insert(
                    names::policy_chain_name(id, ingress),
                    Owner::Policy(id.clone()),
                );
            }
        }
        for p in self.renderer.profile_ids() {
            for ingress in [true, false] {
                owners.insert(
                    names::profile_chain_name(p, ingress),
                    Owner::Profile(p.to_string()),
                );
            }
        }
        owners
    }
}

/// Whose chain a chain is.
enum Owner {
    Policy(PolicyId),
    Profile(String),
}

impl PendingPolicies for StagedView {
    fn pending(
        &self,
        conn: &Connection,
        reporter: Reporter,
    ) -> Option<(FlowAction, Vec<PolicyHit>)> {
        // The reporter's side only: its endpoint's egress (src) or ingress (dst); the other end
        // is taken to be off the node, so the other side's policy does not enter the verdict.
        let (local, ingress) = match reporter {
            Reporter::Src => (conn.src, false),
            Reporter::Dst => (conn.dst, true),
        };
        let ep = self.staged_endpoint(local, ingress)?;
        let mut pkt = Packet::new(
            conn.src,
            conn.dst,
            conn.proto,
            conn.src_port.unwrap_or(0),
            conn.dst_port.unwrap_or(0),
        );
        if let Some((t, c)) = conn.icmp {
            pkt.icmp_type = t;
            pkt.icmp_code = c;
        }
        let (in_iface, out_iface) = if ingress {
            ("eth0".to_string(), ep.iface.clone())
        } else {
            (ep.iface.clone(), "eth0".to_string())
        };
        pkt.in_iface = in_iface;
        pkt.out_iface = out_iface;
        let (_, v) = self.trace(&pkt, static_chains::FORWARD)?;
        Some((v.action, v.hits))
    }
}

/// A [`StagedView`] the agent updates while the flow collector reads it: the apply loop calls
/// [`SharedStagedView::apply`] with each batch it flushed from the graph (the same batch the
/// enforced renderer gets), the collector holds it as `Arc<dyn PendingPolicies>`.
pub struct SharedStagedView(std::sync::RwLock<StagedView>);

impl SharedStagedView {
    pub fn new(view: StagedView) -> Self {
        SharedStagedView(std::sync::RwLock::new(view))
    }

    /// Takes one flushed batch of graph outputs (see [`StagedView::apply`]).
    pub fn apply(&self, outputs: impl IntoIterator<Item = Output>) {
        self.0
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .apply(outputs);
    }
}

impl PendingPolicies for SharedStagedView {
    fn pending(
        &self,
        conn: &Connection,
        reporter: Reporter,
    ) -> Option<(FlowAction, Vec<PolicyHit>)> {
        let view = self
            .0
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if view.is_empty() {
            return None;
        }
        view.pending(conn, reporter)
    }
}

#[cfg(test)]
mod tests {
    use super::nflog_prefix;

    #[test]
    fn the_nflog_prefix_is_read_quoted_or_bare() {
        assert_eq!(
            nflog_prefix(
                "-m mark --mark 0x0/0x20000 -j NFLOG --nflog-prefix DPI2|gnp/x --nflog-group 1"
            )
            .as_deref(),
            Some("DPI2|gnp/x")
        );
        assert_eq!(
            nflog_prefix(r#"-j NFLOG --nflog-prefix "API0|np/a b\"c" --nflog-group 1"#).as_deref(),
            Some("API0|np/a b\"c")
        );
        assert_eq!(
            nflog_prefix(r#"-j NFLOG --nflog-prefix "unterminated"#),
            None
        );
        assert_eq!(nflog_prefix("-j MARK --set-xmark 0x10000/0x10000"), None);
    }
}
