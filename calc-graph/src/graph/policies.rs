//! Policies and IP set references: a policy's rules take their IP sets (and domain sets) while
//! the policy selects a local endpoint, and give them back when it stops.

use super::convert::PolicyDraft;
use super::rules::ScannedRules;
use super::*;

impl CalcGraph {
    /// Takes references to `new`'s IP sets, then drops `old`'s (so shared sets never churn).
    pub(super) fn swap_set_refs(&mut self, new: Option<&ScannedRules>, old: Option<&ScannedRules>) {
        for spec in new.map(|r| r.sets.as_slice()).unwrap_or(&[]) {
            self.ipsets.activate(
                spec,
                &mut self.global,
                &mut self.interner,
                &self.store,
                &mut self.seq,
            );
        }
        for spec in new.map(|r| r.domain_sets.as_slice()).unwrap_or(&[]) {
            self.ipsets.activate_domain(spec, &mut self.seq);
        }
        for spec in old.map(|r| r.domain_sets.as_slice()).unwrap_or(&[]) {
            self.ipsets.deactivate_domain(&spec.id, &mut self.seq);
        }
        for spec in old.map(|r| r.sets.as_slice()).unwrap_or(&[]) {
            self.ipsets.deactivate(
                &spec.id,
                &mut self.global,
                &mut self.interner,
                &mut self.seq,
            );
        }
    }

    // --- policies ------------------------------------------------------------------------

    pub(super) fn apply_policy(&mut self, key: &ResourceKey, draft: Option<PolicyDraft>) {
        let new = draft.map(|d| {
            let (sel, _) =
                self.local
                    .add_selector(&mut self.interner, &d.selector, Some(&self.global));
            self.policies_by_sel
                .entry(sel)
                .or_default()
                .push(key.clone());
            PolicyState {
                id: d.id,
                sel,
                order: d.order,
                ingress: d.ingress,
                egress: d.egress,
                untracked: d.untracked,
                pre_dnat: d.pre_dnat,
                apply_on_forward: d.apply_on_forward,
                rules: d.rules,
            }
        });
        let old = self.policies.remove(key);
        let was_active = self.active_policies.remove(key);
        let now_active = new
            .as_ref()
            .is_some_and(|p| !self.local.matches(p.sel).is_empty());

        // Endpoints whose policy lists may change.
        let mut touched: Vec<ItemId> = Vec::new();
        for p in old.iter().chain(new.iter()) {
            touched.extend(self.local.matches(p.sel).iter().copied());
        }
        for item in touched {
            if let Some(ep) = self.local_eps.get(&item) {
                self.seq.endpoint_dirty(&ep.id);
            }
        }

        let new_rules = new.as_ref().filter(|_| now_active).map(|p| p.rules.clone());
        let old_rules = old.as_ref().filter(|_| was_active).map(|p| p.rules.clone());
        self.swap_set_refs(new_rules.as_deref(), old_rules.as_deref());

        if let Some(o) = old {
            self.seq.policy_dirty(&o.id);
            self.policy_keys.remove(&o.id);
            if let Some(v) = self.policies_by_sel.get_mut(&o.sel) {
                if let Some(pos) = v.iter().position(|k| k == key) {
                    v.swap_remove(pos);
                }
                if v.is_empty() {
                    self.policies_by_sel.remove(&o.sel);
                }
            }
            self.local.remove_selector(&mut self.interner, o.sel);
        }
        if let Some(n) = new {
            self.seq.policy_dirty(&n.id);
            self.policy_keys.insert(n.id.clone(), key.clone());
            if now_active {
                self.active_policies.insert(key.clone());
            }
            self.policies.insert(key.clone(), n);
        }
    }

    pub(super) fn sync_policy_activity(&mut self, key: &ResourceKey) {
        let Some(p) = self.policies.get(key) else {
            return;
        };
        let want = !self.local.matches(p.sel).is_empty();
        let is = self.active_policies.contains(key);
        if want == is {
            return;
        }
        let rules = p.rules.clone();
        let id = p.id.clone();
        if want {
            self.swap_set_refs(Some(&rules), None);
            self.active_policies.insert(key.clone());
        } else {
            self.swap_set_refs(None, Some(&rules));
            self.active_policies.remove(key);
        }
        self.seq.policy_dirty(&id);
    }
}
