//! Unit tests of [`super`]: precedence, Felix's value syntax, invalid values.
use super::*;
use clap::Parser;

#[derive(Parser)]
struct Cli {
    #[command(flatten)]
    agent: Args,
}

fn layers(argv: &[&str], env: &[(&str, &str)]) -> Layers {
    let base = ["x", "--etcd-endpoints", "http://e", "--node-name", "n1"];
    let argv: Vec<&str> = base.iter().chain(argv).copied().collect();
    let m = <Cli as clap::CommandFactory>::command().get_matches_from(&argv);
    let flags = <Cli as clap::FromArgMatches>::from_arg_matches(&m)
        .unwrap()
        .agent;
    Layers {
        flags,
        explicit: super::super::explicit_flags(&m),
        env: env
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
        node: "n1".into(),
    }
}

fn conf(name: &str, spec: Value) -> FelixConfiguration {
    FelixConfiguration {
        name: name.into(),
        spec: spec.as_object().unwrap().clone().into_iter().collect(),
    }
}

#[test]
fn precedence_flag_env_node_global_default() {
    let g = conf(
        "default",
        serde_json::json!({"defaultEndpointToHostAction": "Drop", "interfacePrefix": "tap",
                           "iptablesRefreshInterval": "30s", "logSeverityScreen": "Warning",
                           "bpfEnabled": false}),
    );
    let n = conf(
        "node.n1",
        serde_json::json!({"defaultEndpointToHostAction": "Return",
                           "iptablesMarkMask": 4294901760u32, "natPortRange": "x"}),
    );
    let l = layers(
        &["--interface-prefix", "veth"],
        &[("FELIX_IPTABLESREFRESHINTERVAL", "1m")],
    );
    let r = l.resolve(Some(&g), Some(&n), &l.flags);
    let a = &r.args;
    assert_eq!(a.dataplane.interface_prefix, ["veth"]);
    assert_eq!(a.refresh_interval, Duration::from_secs(60));
    assert_eq!(
        a.dataplane.default_endpoint_to_host_action,
        EndpointToHost::Return
    );
    assert_eq!(a.log, "warn");
    assert_eq!(a.dataplane.mark_mask, 0xffff_0000);
    let s = &r.status;
    assert_eq!(s.sources["interfacePrefix"], Origin::Flag);
    assert_eq!(s.sources["iptablesRefreshInterval"], Origin::Environment);
    assert_eq!(s.sources["defaultEndpointToHostAction"], Origin::Node);
    assert_eq!(s.sources["logSeverityScreen"], Origin::Global);
    assert_eq!(s.sources["workloadSourceSpoofing"], Origin::Default);
    assert_eq!(s.unsupported_fields, ["bpfEnabled", "natPortRange"]);
    assert!(s.errors.is_empty(), "{:?}", s.errors);
    assert_eq!(restart_needed(&l.flags, a), ["defaultEndpointToHostAction"]);
}

#[test]
fn an_invalid_value_names_resource_and_field_and_keeps_the_last_good_one() {
    let l = layers(
        &[],
        &[
            ("FELIX_IPTABLESMARKMASK", "0x3"),
            ("FELIX_FAILSAFEINBOUNDHOSTPORTS", "tcp:22,ssh"),
        ],
    );
    let mut previous = l.flags.clone();
    previous.dataplane.default_endpoint_to_host_action = EndpointToHost::Drop;
    let n = conf(
        "node.n1",
        serde_json::json!({"defaultEndpointToHostAction": "Reject",
                           "dnsTrustedServers": ["k8s-service:kube-dns"],
                           "dnsPolicyMode": "NoDelay"}),
    );
    let r = l.resolve(None, Some(&n), &previous);
    assert_eq!(
        r.args.dataplane.default_endpoint_to_host_action,
        EndpointToHost::Drop
    );
    let e = r.status.errors.join("\n");
    assert!(
        e.contains(
            r#"felixconfigurations/node.n1: defaultEndpointToHostAction: "Reject" is not one of Drop, Accept, Return"#
        ),
        "{e}"
    );
    assert!(
        e.contains("environment FELIX_IPTABLESMARKMASK: mask 0x3"),
        "{e}"
    );
    assert!(
        e.contains("felixconfigurations/node.n1: dnsTrustedServers"),
        "{e}"
    );
    assert!(
        e.contains("felixconfigurations/node.n1: dnsPolicyMode"),
        "{e}"
    );
    assert!(r.status.unsupported_fields.is_empty());
}

#[test]
fn felix_value_syntax() {
    let l = layers(&["--health-listen", "127.0.0.1:9099"], &[]);
    let g = conf(
        "default",
        serde_json::json!({"iptablesMarkMask": "0xff000000", "iptablesBackend": "NFT",
                           "iptablesRefreshInterval": "0", "interfacePrefix": "cali,tap",
                           "dnsTrustedServers": ["10.96.0.10", "[fd00::10]:5353"],
                           "dnsPolicyNfqueueID": 7, "healthPort": 9199,
                           "workloadSourceSpoofing": "Any", "dnsPolicyMode": "DelayDNSResponse",
                           "failsafeInboundHostPorts": [{"protocol": "TCP", "port": 22},
                               {"protocol": "UDP", "port": 68, "net": "fd00::/8"}],
                           "failsafeOutboundHostPorts": []}),
    );
    let r = l.resolve(Some(&g), None, &l.flags);
    assert!(r.status.errors.is_empty(), "{:?}", r.status.errors);
    let a = &r.args;
    assert_eq!(a.dataplane.mark_mask, 0xff00_0000);
    assert_eq!(a.iptables_backend, IptablesBackend::Nft);
    assert_eq!(a.refresh_interval, REFRESH_DISABLED);
    assert_eq!(a.dataplane.interface_prefix, ["cali", "tap"]);
    assert_eq!(a.dataplane.dns_trusted_servers.len(), 2);
    assert_eq!(a.dataplane.dns_queue_num, 7);
    assert_eq!(
        a.dataplane.workload_source_spoofing,
        WorkloadSourceSpoofing::Any
    );
    // The flag was given: healthPort does not override it.
    assert_eq!(a.health_listen.to_string(), "127.0.0.1:9099");
    let l = layers(&[], &[]);
    let r = l.resolve(Some(&g), None, &l.flags);
    assert_eq!(r.args.health_listen.to_string(), "127.0.0.1:9199");
    for f in FIELDS {
        assert!(f.env().starts_with("FELIX_") && !f.env().contains(char::is_lowercase));
    }
}
