//! Checks the Kubernetes manifests in `deploy/`: they decode as the real API types, the controller's
//! arguments parse with the controller's own CLI, RBAC grants what the watchers need, and the agent
//! DaemonSet has the host access and flags the agent expects.

use std::collections::BTreeMap;
use std::path::PathBuf;

use clap::Parser;
use k8s_openapi::api::apps::v1::{DaemonSet, Deployment};
use k8s_openapi::api::core::v1::Container;
use k8s_openapi::api::rbac::v1::ClusterRole;
use policy_controller::cli::Cli;
use serde_json::Value;

fn docs(file: &str) -> Vec<Value> {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../deploy")
        .join(file);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_yaml::Deserializer::from_str(&text)
        .map(|d| serde_json::to_value(serde_yaml::Value::deserialize(d).unwrap()).unwrap())
        .filter(|v| !v.is_null())
        .collect()
}

use serde::Deserialize;

fn find<T: serde::de::DeserializeOwned>(docs: &[Value], kind: &str) -> T {
    let v = docs
        .iter()
        .find(|d| d["kind"] == kind)
        .unwrap_or_else(|| panic!("no {kind}"));
    serde_json::from_value(v.clone()).unwrap_or_else(|e| panic!("{kind} does not decode: {e}"))
}

/// Expands `$(VAR)` from the container's literal env values.
fn expanded_args(c: &Container) -> Vec<String> {
    let env: BTreeMap<String, String> = c
        .env
        .iter()
        .flatten()
        .map(|e| {
            (
                e.name.clone(),
                e.value.clone().unwrap_or_else(|| format!("<{}>", e.name)),
            )
        })
        .collect();
    c.args
        .iter()
        .flatten()
        .map(|a| {
            let mut a = a.clone();
            for (k, v) in &env {
                a = a.replace(&format!("$({k})"), v);
            }
            a
        })
        .collect()
}

#[test]
fn controller_deployment_and_rbac() {
    let d = docs("policy-controller.yaml");
    let dep: Deployment = find(&d, "Deployment");
    let spec = dep.spec;
    assert_eq!(spec.replicas, Some(2));
    let pod = spec.template.spec.unwrap();
    assert_eq!(
        pod.service_account_name.as_deref(),
        Some("policy-controller")
    );
    let c = &pod.containers[0];
    let mut argv = vec!["policy-controller".to_string()];
    argv.extend(expanded_args(c));
    let cli = Cli::try_parse_from(&argv).unwrap_or_else(|e| panic!("{argv:?}: {e}"));
    let policy_controller::cli::Command::Sync(args) = cli.command;
    assert_eq!(args.election_ttl, 15);
    assert!(!args.once);
    assert_eq!(args.identity.as_deref(), Some("<POD_NAME>"));

    let role: ClusterRole = find(&d, "ClusterRole");
    let rules = role.rules.unwrap();
    for (group, res) in [
        ("networking.k8s.io", "networkpolicies"),
        ("", "namespaces"),
        ("", "pods"),
        ("", "serviceaccounts"),
    ] {
        let rule = rules
            .iter()
            .find(|r| {
                r.api_groups.iter().flatten().any(|g| g == group)
                    && r.resources.iter().flatten().any(|x| x == res)
            })
            .unwrap_or_else(|| panic!("no rule for {res}"));
        for verb in ["list", "watch"] {
            assert!(rule.verbs.iter().any(|v| v == verb), "{res} lacks {verb}");
        }
        assert!(
            !rule
                .verbs
                .iter()
                .any(|v| v == "create" || v == "update" || v == "delete")
        );
    }
}

#[test]
fn agent_daemonset() {
    let d = docs("agent-daemonset.yaml");
    let ds: DaemonSet = find(&d, "DaemonSet");
    let pod = ds.spec.template.spec.unwrap();
    assert_eq!(pod.host_network, Some(true));
    let c = &pod.containers[0];
    assert_eq!(c.security_context.as_ref().unwrap().privileged, Some(true));
    let node = c
        .env
        .iter()
        .flatten()
        .find(|e| e.name == "NODE_NAME")
        .unwrap();
    let field = node
        .value_from
        .as_ref()
        .unwrap()
        .field_ref
        .as_ref()
        .unwrap();
    assert_eq!(field.field_path, "spec.nodeName");
    let args = c.args.clone().unwrap();
    assert_eq!(args[0], "agent");
    for want in [
        "--node-name=$(NODE_NAME)",
        "--state-dir=/var/lib/felixrs",
        "--health-listen=0.0.0.0:9099",
    ] {
        assert!(args.iter().any(|a| a == want), "missing {want} in {args:?}");
    }
    assert!(args.iter().any(|a| a.starts_with("--etcd-endpoints=")));
    let live = c
        .liveness_probe
        .as_ref()
        .unwrap()
        .http_get
        .as_ref()
        .unwrap();
    assert_eq!(live.path.as_deref(), Some("/liveness"));
    let ready = c
        .readiness_probe
        .as_ref()
        .unwrap()
        .http_get
        .as_ref()
        .unwrap();
    assert_eq!(ready.path.as_deref(), Some("/readiness"));
}

#[test]
fn kustomization_lists_every_manifest() {
    let d = docs("kustomization.yaml");
    let listed: Vec<&str> = d[0]["resources"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap())
        .collect();
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../deploy");
    let mut files: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|f| f.ends_with(".yaml") && f != "kustomization.yaml")
        .collect();
    files.sort();
    let mut listed_sorted: Vec<String> = listed.iter().map(|s| s.to_string()).collect();
    listed_sorted.sort();
    assert_eq!(listed_sorted, files);
}

/// The grpc-proxy Deployment (fan-out, issue 14): decodes, every flag is one the installed
/// `etcd grpc-proxy start` knows, and its Service reaches the pods' listen port.
#[test]
fn etcd_grpc_proxy_deployment_and_service() {
    use k8s_openapi::api::core::v1::Service;
    use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
    let d = docs("etcd-grpc-proxy.yaml");
    let dep: Deployment = find(&d, "Deployment");
    let spec = dep.spec;
    assert!(
        spec.replicas.unwrap_or(1) >= 2,
        "one proxy is a single point of failure"
    );
    let pod_labels = spec.template.metadata.unwrap().labels.unwrap();
    let pod = spec.template.spec.unwrap();
    let c = &pod.containers[0];
    assert_eq!(c.command.as_deref(), Some(&["etcd".to_string()][..]));
    let args = c.args.clone().unwrap();
    assert_eq!(&args[..2], ["grpc-proxy", "start"]);
    let help = std::process::Command::new("etcd")
        .args(["grpc-proxy", "start", "--help"])
        .output()
        .expect("etcd (Debian etcd-server) is installed");
    let help = String::from_utf8_lossy(&help.stdout) + String::from_utf8_lossy(&help.stderr);
    for a in &args[2..] {
        let flag = a.split('=').next().unwrap();
        assert!(
            help.contains(&format!("{flag} ")),
            "etcd grpc-proxy start has no flag {flag}"
        );
    }
    let listen = args
        .iter()
        .find_map(|a| a.strip_prefix("--listen-addr="))
        .expect("--listen-addr");
    let port: i32 = listen.rsplit(':').next().unwrap().parse().unwrap();
    let grpc = c
        .ports
        .iter()
        .flatten()
        .find(|p| p.name.as_deref() == Some("grpc"))
        .expect("grpc port");
    assert_eq!(grpc.container_port, port);
    let svc: Service = find(&d, "Service");
    let s = svc.spec.unwrap();
    for (k, v) in s.selector.unwrap() {
        assert_eq!(pod_labels.get(&k), Some(&v), "service selector {k}={v}");
    }
    let sp = &s.ports.unwrap()[0];
    assert_eq!(sp.target_port, Some(IntOrString::String("grpc".into())));
}
