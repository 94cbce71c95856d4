//! The renderer's policy and profile chains: one chain's rules per (id, direction), in the shared
//! layout (filter) or Felix's own form (the mangle and raw copies of host endpoint policy). A
//! rule that cannot be rendered fails its chain closed and is reported.

use calc_graph::proto::{IpVersion, PolicyId};

use super::super::build::Rule;
use super::super::rule::{RuleCtx, render_profile_rules, render_rules};
use super::super::{RenderError, names};
use super::{Renderer, fail_closed};

impl Renderer {
    /// The rule context, with the shared layout's verdict chains and net sets on or off (`shared`):
    /// off for the mangle and raw policy chains, which have no verdict chains to go to.
    fn ctx_in<'a>(
        &'a self,
        v: IpVersion,
        owner: char,
        ingress: bool,
        owner_id: &'a str,
        set_name: &'a dyn Fn(&str) -> Option<String>,
        shared: bool,
    ) -> RuleCtx<'a> {
        RuleCtx {
            version: v,
            marks: &self.marks,
            log_action: &self.cfg.log_action,
            log_prefix: &self.log_prefix,
            set_name,
            owner,
            ingress,
            owner_id,
            deny_log: self.cfg.verdict_log(),
            verdict_chains: shared,
            net_sets: shared,
        }
    }

    /// A policy's chain rules; `shared`: the shared layout's verdict chains and net sets (off for
    /// the mangle and raw copies, which are in Felix's form).
    pub(super) fn render_policy(
        &mut self,
        id: &PolicyId,
        ingress: bool,
        v: IpVersion,
        errors: &mut Vec<RenderError>,
        shared: bool,
    ) -> Vec<Rule> {
        let direction = if ingress { "ingress" } else { "egress" };
        let comment = format!("{id} {direction}");
        let Some(p) = self.policies.get(id) else {
            return fail_closed(&comment, "Unknown policy: dropping all traffic");
        };
        let sets = &self.ip_sets;
        let set_name = |sid: &str| sets.contains_key(sid).then(|| names::ipset_name(v, sid));
        let owner_id = names::policy_chain_id(id);
        let ctx = self.ctx_in(v, 'P', ingress, &owner_id, &set_name, shared);
        let rules = if ingress {
            &p.inbound_rules
        } else {
            &p.outbound_rules
        };
        match render_rules(rules, &comment, &ctx) {
            Ok(r) => r,
            Err(reason) => {
                if matches!(reason, super::super::RuleError::UnknownIpSet { .. }) {
                    self.waiting_policies.insert(id.clone());
                }
                errors.push(RenderError::Policy {
                    policy: Box::new(id.clone()),
                    direction,
                    reason: Box::new(reason),
                });
                fail_closed(&comment, "Failed to render: dropping all traffic")
            }
        }
    }

    /// A profile's chain rules; `shared` as for [`Self::render_policy`].
    pub(super) fn render_profile(
        &mut self,
        id: &str,
        ingress: bool,
        v: IpVersion,
        errors: &mut Vec<RenderError>,
        shared: bool,
    ) -> Vec<Rule> {
        let direction = if ingress { "ingress" } else { "egress" };
        let comment = format!("Profile {id} {direction}");
        let Some(p) = self.profiles.get(id) else {
            return fail_closed(&comment, "Unknown profile: dropping all traffic");
        };
        let sets = &self.ip_sets;
        let set_name = |sid: &str| sets.contains_key(sid).then(|| names::ipset_name(v, sid));
        let ctx = self.ctx_in(v, 'R', ingress, id, &set_name, shared);
        let rules = if ingress {
            &p.inbound_rules
        } else {
            &p.outbound_rules
        };
        match render_profile_rules(rules, &comment, &ctx) {
            Ok(r) => r,
            Err(reason) => {
                if matches!(reason, super::super::RuleError::UnknownIpSet { .. }) {
                    self.waiting_profiles.insert(id.to_string());
                }
                errors.push(RenderError::Profile {
                    profile: id.to_string(),
                    direction,
                    reason: Box::new(reason),
                });
                fail_closed(&comment, "Failed to render: dropping all traffic")
            }
        }
    }
}
