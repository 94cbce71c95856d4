//! What decided a traced packet, as data: [`Decision`] (the verb and the policy, profile or tier
//! end, as `trace` names them under its verdict) and [`Explainer`], which computes them for many
//! packets of one node view (`preview` groups packets by them).

use std::collections::BTreeMap;

use iptables::desired::TableName;
use iptables::render::trace::Outcome;

use super::{Owner, Traced, chain_owners, report_steps};
use crate::cmd::shared::node_view::NodeView;

/// What decided a traced packet, for a command that groups packets by it (`preview`): the verb
/// and the policy, profile or tier end, as `trace` names them under its verdict.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Decision {
    /// `allowed`, `passed`, `dropped` or `accepted`.
    pub verb: &'static str,
    /// `ingress`, `egress`, or empty when the chain has no direction.
    pub direction: String,
    /// What decided: `GlobalNetworkPolicy default.deny-all`, `profile kns.x`, `end of tier
    /// default`, `no profile`, or the chain's owner as `trace` names it.
    pub subject: String,
    pub tier: Option<String>,
}

impl Decision {
    pub(super) fn of(verb: &'static str, what: &str, tier: Option<&str>, why: &str) -> Decision {
        let (direction, owner) = match what.split_once(" of ") {
            Some((d @ ("ingress" | "egress"), rest)) => (d.to_string(), rest),
            _ => (String::new(), what),
        };
        let subject = if let Some(rest) = why.split("the end of tier ").nth(1) {
            let tier = rest.split(',').next().unwrap_or(rest);
            format!("end of tier {tier}")
        } else if why.contains("no profile allowed") {
            "no profile".to_string()
        } else {
            owner.to_string()
        };
        Decision {
            verb,
            direction,
            subject,
            tier: tier.map(str::to_string),
        }
    }
}

impl std::fmt::Display for Decision {
    /// `dropped by ingress of GlobalNetworkPolicy deny-all (tier default)`, `dropped at the end
    /// of tier default (ingress)`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let ends = self.subject.starts_with("end of tier ") || self.subject == "no profile";
        match (ends, self.direction.is_empty()) {
            (true, true) => write!(f, "{} at the {}", self.verb, self.subject)?,
            (true, false) => write!(
                f,
                "{} at the {} ({})",
                self.verb, self.subject, self.direction
            )?,
            (false, true) => write!(f, "{} by {}", self.verb, self.subject)?,
            (false, false) => write!(f, "{} by {} of {}", self.verb, self.direction, self.subject)?,
        }
        match &self.tier {
            Some(t) => write!(f, " (tier {t})"),
            None => Ok(()),
        }
    }
}

/// What `trace` says about packets of one node view: the owners of its chains, computed once
/// for many packets.
pub struct Explainer {
    owners: BTreeMap<String, Owner>,
}

impl Explainer {
    pub fn new(view: &NodeView) -> Explainer {
        Explainer {
            owners: chain_owners(&view.outputs, &view.renderer),
        }
    }

    /// The policies, profiles and tier ends that decided `traced` (passes first, in order).
    pub fn decisions(&self, view: &NodeView, traced: &Traced) -> Vec<Decision> {
        let mut deciders = Deciders::default();
        let mut mark = traced.packet.mark;
        let mut sink = String::new();
        for pre in &traced.pre {
            let t = &pre.trace;
            let tbl = pre.table;
            report_steps(
                &mut sink,
                view,
                &self.owners,
                tbl,
                &traced.packet,
                t,
                &mut mark,
                &mut deciders,
            );
        }
        let t = &traced.trace;
        let pkt = &traced.packet;
        report_steps(
            &mut sink,
            view,
            &self.owners,
            TableName::Filter,
            pkt,
            t,
            &mut mark,
            &mut deciders,
        );
        if let (Outcome::Accept, Some(last)) = (t.outcome, t.steps.last()) {
            let what =
                (self.owners.get(&last.chain)).map_or(last.chain.as_str(), |o| o.what.as_str());
            deciders
                .decisions
                .push(Decision::of("accepted", what, None, ""));
        }
        deciders.decisions
    }
}

/// What decided a packet: the lines `trace` prints under its verdict, and the same as
/// [`Decision`]s.
#[derive(Default)]
pub(super) struct Deciders {
    pub(super) lines: Vec<String>,
    pub(super) decisions: Vec<Decision>,
}

impl Deciders {
    pub(super) fn push(&mut self, line: String) {
        self.lines.push(line);
    }
}
