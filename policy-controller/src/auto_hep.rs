//! Whether to create Calico's automatic host endpoints for Nodes ("when asked").
//!
//! Precedence, highest first:
//! 1. `--auto-host-endpoints enabled|disabled` (env `AUTO_HOST_ENDPOINTS`, kube-controllers' own
//!    variable), when given;
//! 2. the `KubeControllersConfiguration` named `default` in etcd:
//!    `spec.controllers.node.hostEndpoint.autoCreate: Enabled` (with `spec.controllers.node` absent the
//!    node controller, and so auto host endpoints, are off; `createDefaultHostEndpoint: Disabled`
//!    turns the `<node>-auto-hep` endpoint off too, as in kube-controllers). `templates` are not
//!    implemented and are reported;
//! 3. off (kube-controllers' default).
//!
//! The resource is read at every reconcile pass (one key) and watched, so a change applies within
//! moments. A resource that does not decode, or a read that fails, keeps the last setting: a
//! glitch never deletes the host endpoints (which would drop the host policies on them).

use std::sync::Arc;
use std::time::Duration;

use calc_graph::model::EtcdPrefix;
use etcd_client::Client;
use serde_json::Value;
use tokio::sync::Notify;

/// The canonical etcd key of the `default` KubeControllersConfiguration.
pub const KCC_DEFAULT_KEY: &str =
    "/calico/resources/v3/projectcalico.org/kubecontrollersconfigurations/default";

/// `enabled` / `disabled`, as kube-controllers spells `AUTO_HOST_ENDPOINTS`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Toggle {
    Enabled,
    Disabled,
}

/// A `default` KubeControllersConfiguration whose auto host endpoint fields cannot be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KccError {
    #[error("kubecontrollersconfigurations/default: not JSON: {0}")]
    Json(String),
    #[error(
        "kubecontrollersconfigurations/default: spec.controllers.node.hostEndpoint.{field}: {value} is neither Enabled nor Disabled"
    )]
    Value { field: &'static str, value: String },
}

/// What the stored resource asks for: `Ok(true)` when auto host endpoints are on.
pub fn from_kcc_json(json: &[u8]) -> Result<bool, KccError> {
    let v: Value = serde_json::from_slice(json).map_err(|e| KccError::Json(e.to_string()))?;
    let Some(hep) = v
        .pointer("/spec/controllers/node")
        .filter(|n| !n.is_null())
        .map(|n| n.get("hostEndpoint").cloned().unwrap_or(Value::Null))
    else {
        return Ok(false);
    };
    let field = |field: &'static str, default: bool| -> Result<bool, KccError> {
        match hep.get(field) {
            None | Some(Value::Null) => Ok(default),
            Some(Value::String(s)) if s == "Enabled" => Ok(true),
            Some(Value::String(s)) if s == "Disabled" => Ok(false),
            Some(other) => Err(KccError::Value {
                field,
                value: other.to_string(),
            }),
        }
    };
    let auto_create = field("autoCreate", false)?;
    let default_hep = field("createDefaultHostEndpoint", true)?;
    if hep
        .get("templates")
        .and_then(Value::as_array)
        .is_some_and(|t| !t.is_empty())
    {
        tracing::warn!(
            "kubecontrollersconfigurations/default: spec.controllers.node.hostEndpoint.templates is not implemented: only <node>-auto-hep endpoints are created"
        );
    }
    Ok(auto_create && default_hep)
}

/// Resolves the setting for one pass: the flag if given, else the stored resource, else off. On a
/// read or decode error `last` is kept.
pub async fn resolve(
    flag: Option<Toggle>,
    etcd: &mut Client,
    prefix: &EtcdPrefix,
    last: bool,
) -> bool {
    if let Some(t) = flag {
        return t == Toggle::Enabled;
    }
    let key = prefix.from_canonical(KCC_DEFAULT_KEY);
    match etcd.get(key.as_str(), None).await {
        Ok(r) => match r.kvs().first() {
            None => false,
            Some(kv) => from_kcc_json(kv.value()).unwrap_or_else(|e| {
                tracing::warn!("{e}; keeping automatic host endpoints {}", on_off(last));
                last
            }),
        },
        Err(e) => {
            tracing::warn!(
                "cannot read kubecontrollersconfigurations/default ({e}); keeping automatic host endpoints {}",
                on_off(last)
            );
            last
        }
    }
}

fn on_off(b: bool) -> &'static str {
    if b { "on" } else { "off" }
}

/// Watches the stored resource and notifies `changed` on every change of it, re-watching after an
/// error. Only needed when the flag is not given.
pub fn spawn_watch(
    mut etcd: Client,
    prefix: EtcdPrefix,
    changed: Arc<Notify>,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let key = prefix.from_canonical(KCC_DEFAULT_KEY);
        loop {
            match etcd.watch(key.as_str(), None).await {
                Ok(mut stream) => loop {
                    match stream.message().await {
                        Ok(Some(r)) if !r.events().is_empty() => changed.notify_one(),
                        Ok(Some(_)) => {}
                        Ok(None) | Err(_) => break,
                    }
                },
                Err(e) => {
                    tracing::debug!("cannot watch kubecontrollersconfigurations/default: {e}")
                }
            }
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kube_controllers_configuration_fields() {
        let kcc = |node: &str| {
            from_kcc_json(format!(r#"{{"spec":{{"controllers":{{{node}}}}}}}"#).as_bytes())
        };
        assert_eq!(kcc(""), Ok(false), "no node controller");
        assert_eq!(kcc(r#""node":{}"#), Ok(false), "autoCreate defaults off");
        assert_eq!(
            kcc(r#""node":{"hostEndpoint":{"autoCreate":"Enabled"}}"#),
            Ok(true)
        );
        assert_eq!(
            kcc(r#""node":{"hostEndpoint":{"autoCreate":"Disabled"}}"#),
            Ok(false)
        );
        assert_eq!(
            kcc(
                r#""node":{"hostEndpoint":{"autoCreate":"Enabled","createDefaultHostEndpoint":"Disabled"}}"#
            ),
            Ok(false)
        );
        assert_eq!(
            kcc(r#""node":{"hostEndpoint":{"autoCreate":"yes"}}"#)
                .unwrap_err()
                .to_string(),
            "kubecontrollersconfigurations/default: spec.controllers.node.hostEndpoint.autoCreate: \"yes\" is neither Enabled nor Disabled"
        );
        assert!(from_kcc_json(b"{").is_err());
    }
}
