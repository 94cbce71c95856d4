//! Every resource goes through the shared model before it is written.
//!
//! [`canonical`] decodes the produced JSON with `calc_graph::model::Resource::from_json`, runs
//! `Resource::validate` (names, labels, selectors, ports, protocols, nets) and re-encodes with
//! `Resource::to_json`, the canonical form the agent reads back. So nothing reaches etcd that the
//! agent's model would reject, and what is stored is byte-identical however it was produced.

use calc_graph::model::{ModelError, Resource};

use crate::convert::{CalicoResource, Converted, ObjectRef, SkipReport};

/// `(field, message)`.
pub type FieldError = (String, String);

/// Decodes, validates and canonicalises one resource.
pub fn canonical(r: &CalicoResource) -> Result<CalicoResource, FieldError> {
    let res = Resource::from_json(r.json.as_bytes()).map_err(|e| match e {
        ModelError::Decode { path, message, .. } => (path, message),
        other => (String::new(), other.to_string()),
    })?;
    if let Err(errs) = res.validate() {
        let field = errs.first().map(|e| e.path.clone()).unwrap_or_default();
        let message = errs
            .iter()
            .map(|e| format!("{}: {}", e.path, e.message))
            .collect::<Vec<_>>()
            .join("; ");
        return Err((field, message));
    }
    Ok(CalicoResource {
        json: res.to_json(),
        ..r.clone()
    })
}

/// Runs [`canonical`] on a conversion's output; a failure becomes a skip that retains the key.
pub fn checked(mut c: Converted) -> Converted {
    if let Some(r) = c.resource.take() {
        match canonical(&r) {
            Ok(r) => c.resource = Some(r),
            Err((field, msg)) => {
                let obj = ObjectRef::new(&r.kind, r.namespace.as_deref(), &r.name);
                c.skips.push(SkipReport::new(&obj, field, msg));
                c.retain_key = r.etcd_key().ok();
            }
        }
    }
    c
}
