//! Checks the Kubernetes manifests in `deploy/` (base and overlays): they decode as the real API
//! types, the controller's and the agent's arguments and environment parse with their own CLIs,
//! RBAC grants what the watchers need and nothing more, the agent DaemonSet has the host access,
//! capabilities, probes and mounts the agent needs, the etcd connection is TLS from one ConfigMap
//! and one Secret, and the image is the one the Containerfile builds. `scripts/check-ship.sh`
//! renders the same files with kustomize and validates them against the Kubernetes schemas.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use clap::{CommandFactory, FromArgMatches, Parser};
use k8s_openapi::api::apps::v1::{DaemonSet, Deployment, StatefulSet};
use k8s_openapi::api::core::v1::{ConfigMap, Container, PodSpec, Service};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::api::rbac::v1::ClusterRole;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use policy_controller::cli::Cli;
use serde::Deserialize;
use serde_json::Value;

/// The image every workload runs: what `scripts/build-image.sh` tags by default.
const IMAGE: &str = concat!("felixrs/felixrs:", env!("CARGO_PKG_VERSION"));
/// Where the etcd client Secret is mounted, and its keys.
const TLS_DIR: &str = "/etc/felixrs/etcd";
const TLS_KEYS: [&str; 3] = ["ca.crt", "tls.crt", "tls.key"];

fn deploy_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../deploy")
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn docs_at(path: &Path) -> Vec<Value> {
    serde_yaml::Deserializer::from_str(&read(path))
        .map(|d| serde_json::to_value(serde_yaml::Value::deserialize(d).unwrap()).unwrap())
        .filter(|v| !v.is_null())
        .collect()
}

fn docs(file: &str) -> Vec<Value> {
    docs_at(&deploy_dir().join("base").join(file))
}

fn find<T: serde::de::DeserializeOwned>(docs: &[Value], kind: &str) -> T {
    let v = docs
        .iter()
        .find(|d| d["kind"] == kind)
        .unwrap_or_else(|| panic!("no {kind}"));
    serde_json::from_value(v.clone()).unwrap_or_else(|e| panic!("{kind} does not decode: {e}"))
}

/// Expands `$(VAR)` from the container's literal env values (`<VAR>` for values from elsewhere).
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

/// The container's environment as the CLI reads it: every variable must be one of `cmd`'s
/// (or in `extra`, read elsewhere); those with literal values become `--flag=value`, so parsing
/// checks the names and the values.
fn env_as_flags(c: &Container, cmd: &clap::Command, extra: &[&str]) -> Vec<String> {
    let by_env: BTreeMap<String, String> = cmd
        .get_arguments()
        .filter_map(|a| {
            Some((
                a.get_env()?.to_str()?.to_string(),
                a.get_long()?.to_string(),
            ))
        })
        .collect();
    let mut flags = Vec::new();
    for e in c.env.iter().flatten() {
        if extra.contains(&e.name.as_str()) {
            continue;
        }
        let long = by_env
            .get(&e.name)
            .unwrap_or_else(|| panic!("{}: env {} is not a flag of the CLI", c.name, e.name));
        if let Some(v) = &e.value {
            flags.push(format!("--{long}={v}"));
        }
    }
    flags
}

fn pod_of(spec: Option<PodSpec>) -> PodSpec {
    spec.expect("pod spec")
}

/// The mount path of the volume that holds Secret `secret` in `pod`'s container `c`.
fn secret_mount(pod: &PodSpec, c: &Container, secret: &str) -> String {
    let vol = pod
        .volumes
        .iter()
        .flatten()
        .find(|v| v.secret.as_ref().and_then(|s| s.secret_name.as_deref()) == Some(secret))
        .unwrap_or_else(|| panic!("no volume of secret {secret}"));
    assert_ne!(
        vol.secret.as_ref().unwrap().optional,
        Some(true),
        "secret {secret} must not be optional (no TLS, no start)"
    );
    c.volume_mounts
        .iter()
        .flatten()
        .find(|m| m.name == vol.name)
        .unwrap_or_else(|| panic!("{} does not mount {secret}", c.name))
        .mount_path
        .clone()
}

fn env_value<'a>(c: &'a Container, name: &str) -> Option<&'a str> {
    c.env
        .iter()
        .flatten()
        .find(|e| e.name == name)
        .and_then(|e| e.value.as_deref())
}

fn env_config_map_key(c: &Container, name: &str) -> (String, String) {
    let e = c
        .env
        .iter()
        .flatten()
        .find(|e| e.name == name)
        .unwrap_or_else(|| panic!("{}: no env {name}", c.name));
    let r = e
        .value_from
        .as_ref()
        .and_then(|v| v.config_map_key_ref.as_ref())
        .unwrap_or_else(|| panic!("{}: env {name} is not from a ConfigMap", c.name));
    (r.name.clone(), r.key.clone())
}

#[test]
fn controller_deployment_and_rbac() {
    let d = docs("policy-controller.yaml");
    let dep: Deployment = find(&d, "Deployment");
    let spec = dep.spec;
    assert_eq!(spec.replicas, Some(2));
    let pod = pod_of(spec.template.spec);
    assert_eq!(
        pod.service_account_name.as_deref(),
        Some("policy-controller")
    );
    let c = &pod.containers[0];
    assert_eq!(c.image.as_deref(), Some(IMAGE));
    assert_eq!(
        c.command.as_deref(),
        Some(&["/usr/local/bin/policy-controller".to_string()][..])
    );
    let sync = Cli::command()
        .find_subcommand("sync")
        .expect("sync subcommand")
        .clone();
    let mut argv = vec!["policy-controller".to_string()];
    argv.extend(expanded_args(c));
    argv.extend(env_as_flags(
        c,
        &sync,
        &["POD_NAME", "POLICY_CONTROLLER_LOG"],
    ));
    let cli = Cli::try_parse_from(&argv).unwrap_or_else(|e| panic!("{argv:?}: {e}"));
    let policy_controller::cli::Command::Sync(args) = cli.command;
    assert_eq!(args.election_ttl, 15);
    assert!(!args.once);
    assert_eq!(args.identity.as_deref(), Some("<POD_NAME>"));
    assert!(args.metrics_listen.is_some());
    // etcd over TLS with the client Secret's files.
    let dir = secret_mount(&pod, c, "felixrs-etcd-client");
    assert_eq!(dir, TLS_DIR);
    for (got, key) in [
        (&args.etcd_ca, "ca.crt"),
        (&args.etcd_cert, "tls.crt"),
        (&args.etcd_key, "tls.key"),
    ] {
        assert_eq!(got.as_deref(), Some(Path::new(TLS_DIR).join(key).as_path()));
    }
    assert_eq!(
        env_config_map_key(c, "POLICY_CONTROLLER_ETCD_ENDPOINTS"),
        ("felixrs-etcd".to_string(), "endpoints".to_string())
    );
    let sc = c.security_context.as_ref().unwrap();
    assert_eq!(sc.allow_privilege_escalation, Some(false));
    assert_eq!(sc.read_only_root_filesystem, Some(true));
    let psc = pod.security_context.as_ref().unwrap();
    assert_eq!(psc.run_as_non_root, Some(true));
    // A non-root process reads the 0440 Secret files through its fsGroup.
    let mode = pod
        .volumes
        .iter()
        .flatten()
        .find_map(|v| v.secret.as_ref()?.default_mode)
        .unwrap();
    assert_eq!(mode & 0o040, 0o040, "secret files not group-readable");
    assert_eq!(psc.fs_group, psc.run_as_group);

    let role: ClusterRole = find(&d, "ClusterRole");
    let rules = role.rules.unwrap();
    for (group, res) in [
        ("networking.k8s.io", "networkpolicies"),
        ("", "namespaces"),
        ("", "pods"),
        ("", "serviceaccounts"),
        ("", "nodes"),
        ("policy.networking.k8s.io", "adminnetworkpolicies"),
        ("policy.networking.k8s.io", "baselineadminnetworkpolicies"),
        ("policy.networking.k8s.io", "clusternetworkpolicies"),
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
    }
    // Read-only: the controller writes only to etcd.
    for r in &rules {
        for v in &r.verbs {
            assert!(
                ["get", "list", "watch"].contains(&v.as_str()),
                "verb {v} granted"
            );
        }
        assert!(
            !r.resources
                .iter()
                .flatten()
                .any(|x| x == "*" || x == "secrets")
        );
    }
}

#[test]
fn controller_pod_disruption_budget_keeps_one_replica() {
    let dep: Deployment = find(&docs("policy-controller.yaml"), "Deployment");
    let pdb: PodDisruptionBudget = find(&docs("policy-controller-pdb.yaml"), "PodDisruptionBudget");
    let spec = pdb.spec.unwrap();
    assert_eq!(spec.min_available, Some(IntOrString::Int(1)));
    assert!(dep.spec.replicas.unwrap() > 1);
    let labels = dep.spec.template.metadata.unwrap().labels.unwrap();
    let want = spec.selector.unwrap().match_labels.unwrap();
    assert!(!want.is_empty());
    for (k, v) in &want {
        assert_eq!(labels.get(k), Some(v), "PDB selector {k}={v}");
    }
    assert_eq!(pdb.metadata.namespace, dep.metadata.namespace);
}

#[derive(Parser)]
struct AgentCli {
    #[command(flatten)]
    args: felixrs::agent::Args,
}

#[test]
fn agent_daemonset() {
    let d = docs("agent-daemonset.yaml");
    let ds: DaemonSet = find(&d, "DaemonSet");
    let pod = pod_of(ds.spec.template.spec);
    assert_eq!(pod.host_network, Some(true));
    assert_eq!(pod.dns_policy.as_deref(), Some("ClusterFirstWithHostNet"));
    let c = &pod.containers[0];
    assert_eq!(c.image.as_deref(), Some(IMAGE));
    assert_eq!(
        c.command.as_deref(),
        Some(&["/usr/local/bin/felixrs".to_string()][..])
    );

    // Minimal capabilities instead of privileged.
    let sc = c.security_context.as_ref().unwrap();
    assert_ne!(sc.privileged, Some(true));
    assert_eq!(sc.allow_privilege_escalation, Some(false));
    let caps = sc.capabilities.as_ref().unwrap();
    assert_eq!(caps.drop.as_deref(), Some(&["ALL".to_string()][..]));
    let added: BTreeSet<&str> = caps.add.iter().flatten().map(String::as_str).collect();
    assert_eq!(added, BTreeSet::from(["NET_ADMIN", "NET_RAW"]));

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

    // The arguments and environment parse with the agent's own CLI.
    let cmd = AgentCli::command();
    let mut argv = vec!["felixrs-agent".to_string()];
    argv.extend(expanded_args(c).into_iter().skip(1));
    argv.extend(env_as_flags(c, &cmd, &["NODE_NAME"]));
    let matches = cmd
        .try_get_matches_from(&argv)
        .unwrap_or_else(|e| panic!("{argv:?}: {e}"));
    let agent = AgentCli::from_arg_matches(&matches).unwrap().args;
    assert_eq!(agent.node_name, "<NODE_NAME>");
    assert_eq!(
        env_config_map_key(c, "FELIXRS_ETCD_ENDPOINTS"),
        ("felixrs-etcd".to_string(), "endpoints".to_string())
    );
    let dir = secret_mount(&pod, c, "felixrs-etcd-client");
    assert_eq!(dir, TLS_DIR);
    for (got, key) in [
        (&agent.etcd_ca, "ca.crt"),
        (&agent.etcd_cert, "tls.crt"),
        (&agent.etcd_key, "tls.key"),
    ] {
        assert_eq!(got.as_deref(), Some(format!("{TLS_DIR}/{key}").as_str()));
    }

    // Probes on the agent's health server.
    let port = i32::from(agent.health_listen.port());
    for (probe, path) in [
        (c.liveness_probe.as_ref(), "/liveness"),
        (c.readiness_probe.as_ref(), "/readiness"),
    ] {
        let get = probe.unwrap().http_get.as_ref().unwrap();
        assert_eq!(get.path.as_deref(), Some(path));
        assert_eq!(get.port, IntOrString::Int(port));
    }
    let requests = c.resources.as_ref().unwrap().requests.as_ref().unwrap();
    assert!(requests.contains_key("cpu") && requests.contains_key("memory"));

    // Host paths: the state dir (the snapshot survives restarts and upgrades) and the xtables lock
    // shared with kube-proxy.
    let host_mount = |mount: &str| -> (String, Option<String>) {
        let m = c
            .volume_mounts
            .iter()
            .flatten()
            .find(|m| m.mount_path == mount)
            .unwrap_or_else(|| panic!("nothing mounted at {mount}"));
        let v = pod
            .volumes
            .iter()
            .flatten()
            .find(|v| v.name == m.name)
            .unwrap();
        let hp = v.host_path.as_ref().expect("a hostPath volume");
        (hp.path.clone(), hp.type_.clone())
    };
    let state = agent.state_dir.to_str().unwrap().to_string();
    assert_eq!(
        host_mount(&state),
        (state.clone(), Some("DirectoryOrCreate".into()))
    );
    assert_eq!(
        host_mount("/run/xtables.lock"),
        ("/run/xtables.lock".into(), Some("FileOrCreate".into()))
    );
}

#[test]
fn interface_prefix_and_image_agree_across_workloads() {
    let dep: Deployment = find(&docs("policy-controller.yaml"), "Deployment");
    let ds: DaemonSet = find(&docs("agent-daemonset.yaml"), "DaemonSet");
    let controller = &pod_of(dep.spec.template.spec).containers[0];
    let agent = &pod_of(ds.spec.template.spec).containers[0];
    let first_agent_prefix = env_value(agent, "FELIXRS_INTERFACE_PREFIX")
        .unwrap()
        .split(',')
        .next()
        .unwrap()
        .to_string();
    assert_eq!(
        env_value(controller, "POLICY_CONTROLLER_INTERFACE_PREFIX"),
        Some(first_agent_prefix.as_str())
    );

    // The image builds both binaries into /usr/local/bin and carries the agent's kernel tools.
    let containerfile = read(&deploy_dir().join("../Containerfile"));
    let copy = containerfile
        .lines()
        .find(|l| l.starts_with("COPY --from=build"))
        .expect("runtime stage copies the binaries");
    for bin in ["felixrs", "policy-controller"] {
        assert!(copy.contains(&format!("/out/{bin}")), "{copy}");
    }
    assert!(copy.ends_with(" /usr/local/bin/"), "{copy}");
    let runtime = containerfile
        .split("AS runtime")
        .nth(1)
        .expect("a runtime stage");
    for tool in [
        "iptables ",
        "ipset ",
        "conntrack ",
        "iptables-legacy-save",
        "iptables-nft-save",
    ] {
        assert!(runtime.contains(tool), "runtime stage lacks {tool}");
    }
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
    let dir = deploy_dir().join("base");
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

/// The secretGenerator entry `name` of an overlay's kustomization: `key -> file`.
fn generated_secret(kustomization: &Value, name: &str) -> BTreeMap<String, String> {
    let g = kustomization["secretGenerator"]
        .as_array()
        .unwrap()
        .iter()
        .find(|g| g["name"] == name)
        .unwrap_or_else(|| panic!("no secretGenerator {name}"));
    assert_eq!(g["namespace"], "felixrs-system");
    g["files"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| {
            let (k, v) = f.as_str().unwrap().split_once('=').unwrap();
            (k.to_string(), v.to_string())
        })
        .collect()
}

fn overlay(name: &str) -> (PathBuf, Value) {
    let dir = deploy_dir().join("overlays").join(name);
    let k = docs_at(&dir.join("kustomization.yaml")).remove(0);
    let resources: Vec<&str> = k["resources"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap())
        .collect();
    assert!(resources.contains(&"../../base"), "{name}: {resources:?}");
    // Private keys are never committed: the certs/ dir ignores everything but its .gitignore.
    let ignore = read(&dir.join("certs/.gitignore"));
    assert!(ignore.lines().any(|l| l == "*"), "{name}/certs/.gitignore");
    (dir, k)
}

#[test]
fn etcd_tls_overlay_generates_the_client_secret_and_sets_https_endpoints() {
    let (dir, k) = overlay("etcd-tls");
    let files = generated_secret(&k, "felixrs-etcd-client");
    assert_eq!(
        files.keys().map(String::as_str).collect::<Vec<_>>(),
        TLS_KEYS
    );
    let patch = k["patches"][0]["path"].as_str().unwrap();
    let cm: ConfigMap = find(&docs_at(&dir.join(patch)), "ConfigMap");
    assert_eq!(cm.metadata.name.as_deref(), Some("felixrs-etcd"));
    let endpoints = &cm.data.unwrap()["endpoints"];
    for e in endpoints.split(',') {
        assert!(e.starts_with("https://"), "{e}");
    }
}

#[test]
fn calico_free_overlay_runs_a_tls_etcd_where_the_endpoints_point() {
    let (dir, k) = overlay("calico-free");
    let client = generated_secret(&k, "felixrs-etcd-client");
    assert_eq!(
        client.keys().map(String::as_str).collect::<Vec<_>>(),
        TLS_KEYS
    );
    let server = generated_secret(&k, "felixrs-etcd-server");
    assert_eq!(
        server.keys().map(String::as_str).collect::<Vec<_>>(),
        TLS_KEYS
    );
    assert_eq!(client["ca.crt"], server["ca.crt"], "one CA for both sides");

    let etcd_docs = docs_at(&dir.join("etcd-statefulset.yaml"));
    let svc: Service = find(&etcd_docs, "Service");
    let sts: StatefulSet = find(&etcd_docs, "StatefulSet");
    // The base's endpoints name this Service.
    let cm: ConfigMap = find(&docs("etcd-connection.yaml"), "ConfigMap");
    let endpoints = cm.data.unwrap()["endpoints"].clone();
    let svc_name = svc.metadata.name.clone().unwrap();
    let ns = svc.metadata.namespace.clone().unwrap();
    let port = svc.spec.as_ref().unwrap().ports.as_ref().unwrap()[0].port;
    assert_eq!(endpoints, format!("https://{svc_name}.{ns}.svc:{port}"));

    let pod = pod_of(sts.spec.template.spec);
    let c = &pod.containers[0];
    let tls_dir = secret_mount(&pod, c, "felixrs-etcd-server");
    let cmd = c.command.clone().unwrap();
    for want in [
        format!("--cert-file={tls_dir}/tls.crt"),
        format!("--key-file={tls_dir}/tls.key"),
        format!("--trusted-ca-file={tls_dir}/ca.crt"),
        "--client-cert-auth=true".to_string(),
        format!("--listen-client-urls=https://0.0.0.0:{port}"),
    ] {
        assert!(cmd.contains(&want), "etcd lacks {want}: {cmd:?}");
    }
    let image = c.image.as_deref().unwrap();
    let tag = image.rsplit_once(':').map(|(_, t)| t).unwrap_or("");
    assert!(
        tag.chars().next().is_some_and(|ch| ch.is_ascii_digit()),
        "etcd image pinned by version: {image}"
    );
}

/// The grpc-proxy Deployment (fan-out, issue 14): decodes, every flag is one the installed
/// `etcd grpc-proxy start` knows, and its Service reaches the pods' listen port.
#[test]
fn etcd_grpc_proxy_deployment_and_service() {
    use k8s_openapi::api::core::v1::Service;
    use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
    let d = docs_at(&deploy_dir().join("extras/etcd-grpc-proxy.yaml"));
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
