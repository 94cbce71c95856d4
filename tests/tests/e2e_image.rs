//! The image, not the host binaries: etcd in the infra namespace, the controller image syncing each
//! step's manifests (non-root, read-only root filesystem, no capabilities), the agent image in each
//! node namespace (`--network ns:PATH`; root with only NET_ADMIN and NET_RAW, read-only root
//! filesystem, state on a volume), and the conformance probes through them. Then an upgrade: the
//! agent container replaced by the `-next` image (another version string) under continuous
//! probing, on the same volume: no denied packet delivered, the old rules adopted, `/status` in
//! sync after.
//!
//! Needs root and podman, and the images `scripts/build-image.sh` builds (scripts/test.sh builds
//! both). Without them it says so and passes, except under CI (CI=true), where it fails.
//!
//! The cases are a subset of `cases::all` (one of each kind of rule the agent renders: ingress and
//! egress, pod, namespace and port selectors, named ports, UDP, SCTP, ICMP, ipBlock, a Calico tier;
//! one IPv6 case): the whole matrix runs against the same binaries in `tests/e2e.rs`; what this
//! test adds is the packaging, which any case exercises, and it keeps CI's image step short.

use std::time::Duration;

use anyhow::{Context, Result};
use felixrs_e2e::cases::{self, T80};
use felixrs_e2e::cases_v6;
use felixrs_e2e::container::{APPLY_TIMEOUT, ImagePhase, Images, image_version, podman_ok};
use felixrs_e2e::report::Tally;
use felixrs_e2e::ship;
use felixrs_e2e::spoof::protect_step;
use felixrs_e2e::traffic::probe_while;
use felixrs_e2e::world::Family;
use felixrs_test_support::require_root;

const V4_CASES: [&str; 10] = [
    "default-deny-all",
    "allow from a namespace by namespaceSelector",
    "podSelector AND namespaceSelector",
    "ingress on a specific port from a namespace",
    "named port egress",
    "UDP port",
    "SCTP is not TCP",
    "egress to ipBlock with except",
    "default-deny-ingress also drops ping",
    "calico: tier with Deny before Allow, then Pass to k8s policy",
];
const V6_CASES: [&str; 1] = ["egress to an IPv6 ipBlock with except"];

/// Both binaries print the version and commit; the next image's version string differs.
fn versions(images: &Images) -> Result<Vec<String>> {
    let mut failures = Vec::new();
    let felixrs = image_version(&images.current, "felixrs")?;
    let controller = image_version(&images.current, "policy-controller")?;
    let next = image_version(&images.next, "felixrs")?;
    println!("image versions: {felixrs:?}, {controller:?}; next: {next:?}");
    let version = env!("CARGO_PKG_VERSION");
    for (binary, v) in [("felixrs", &felixrs), ("policy-controller", &controller)] {
        if !v.starts_with(&format!("{binary} {version}")) || !v.contains("commit ") {
            failures.push(format!("{binary} --version says {v:?}"));
        }
    }
    if next == felixrs {
        failures.push(format!(
            "the next image has the same version string {next:?}"
        ));
    }
    let user = podman_ok(&[
        "image",
        "inspect",
        "--format",
        "{{.Config.User}}",
        &images.current,
    ])?;
    if user.is_empty() || user.starts_with("0") || user.starts_with("root") {
        failures.push(format!(
            "the image's default user is {user:?}, not a non-root one"
        ));
    }
    Ok(failures)
}

/// The image's plain `iptables` runs the backend the agent chose: the one holding its chains.
fn iptables_backend_agrees(phase: &ImagePhase) -> Result<Vec<String>> {
    let mut failures = Vec::new();
    for (agent, node) in phase.agents.iter().zip(&phase.cluster.nodes) {
        let holds = |program: &str| {
            node.ns
                .exec_unchecked(&[program, "-w", "-S", "cali-FORWARD"])
                .is_ok_and(|o| o.status.success())
        };
        let agent_nft = holds("iptables-nft");
        if agent_nft == holds("iptables-legacy") {
            failures.push(format!(
                "{}: the agent's cali-FORWARD is in both backends or in neither",
                node.name
            ));
            continue;
        }
        let container = agent.container().context("agent container")?;
        let v = container.exec(&["iptables", "-V"])?;
        if v.contains("nf_tables") != agent_nft {
            failures.push(format!(
                "{}: the image's iptables says {v:?}, the agent's rules are in {}",
                node.name,
                if agent_nft { "nft" } else { "legacy" }
            ));
        }
    }
    Ok(failures)
}

/// The agent enforcing x/b's ingress is replaced by the next image (SIGTERM, then the new
/// container on the same volume) while x/a probes x/b, which the policy denies, continuously.
fn upgrade_under_probe(phase: &mut ImagePhase) -> Result<Vec<String>> {
    let step = protect_step();
    phase.apply_step(&step)?;
    let node = phase.cluster.pod("x/b").node;
    let before = ship::rule_counters(&phase.cluster.nodes[node].ns)?;
    let from = phase.cluster.pod("x/a").ns.name().to_string();
    let to = phase.cluster.pod("x/b").ip.into();
    let next = phase.images.next.clone();
    let (result, attempts, successes) = probe_while(&from, to, || {
        let result = phase.agents[node]
            .upgrade(&next)
            .and_then(|()| phase.agents[node].wait_applied(0, APPLY_TIMEOUT));
        std::thread::sleep(Duration::from_millis(500));
        result
    })?;
    result?;
    println!(
        "image upgrade under probe: {attempts} denied-connection attempts, {successes} succeeded"
    );
    let mut failures = Vec::new();
    if successes > 0 {
        failures.push(format!(
            "{successes} of {attempts} connections x/a -> x/b succeeded across the upgrade"
        ));
    }
    if attempts < 10 {
        failures.push(format!("only {attempts} probe attempts were made"));
    }
    let after = ship::rule_counters(&phase.cluster.nodes[node].ns)?;
    failures.extend(ship::adopted(&before, &after));
    let agent = &phase.agents[node];
    let status = agent.status().context("the upgraded agent's /status")?;
    if status["in_sync"] != true {
        failures.push(format!("the upgraded agent is not in sync: {status}"));
    }
    let running = agent
        .container()
        .context("agent container")?
        .exec(&["felixrs", "--version"])?;
    if running != image_version(&next, "felixrs")? {
        failures.push(format!("the upgraded agent runs {running:?}"));
    }
    failures.extend(phase.check(&phase.expect_of(&step), Family::V4)?);
    // A change after the upgrade still applies.
    let open = cases::Step::new(vec![], vec![T80], |_| {});
    phase.apply_step(&open)?;
    failures.extend(phase.check(&phase.expect_of(&open), Family::V4)?);
    Ok(failures)
}

#[test]
fn image_conformance_and_upgrade() {
    require_root();
    let images = Images::wanted();
    if let Some(missing) = images.missing() {
        assert!(
            std::env::var_os("CI").is_none(),
            "CI must run the image end-to-end test: {missing}"
        );
        println!("skipping the image end-to-end test: {missing}");
        return;
    }
    let mut tally = Tally::default();
    tally.record("image: versions and default user", versions(&images));
    let mut phase = ImagePhase::start(images).expect("cluster, etcd and agent containers start");
    let all = cases::all();
    for name in V4_CASES {
        let case = all
            .iter()
            .find(|c| c.name == name)
            .unwrap_or_else(|| panic!("no case {name:?}"));
        let r = phase.run_case(case, Family::V4);
        tally.record(&format!("image: {name}"), r);
    }
    let v6 = cases_v6::all();
    for name in V6_CASES {
        let case = v6
            .iter()
            .find(|c| c.name == name)
            .unwrap_or_else(|| panic!("no IPv6 case {name:?}"));
        let r = phase.run_case(case, Family::V6);
        tally.record(&format!("image: ipv6: {name}"), r);
    }
    let r = iptables_backend_agrees(&phase);
    tally.record("image: plain iptables picks the agent's backend", r);
    let r = upgrade_under_probe(&mut phase);
    tally.record(
        "image: upgrade to the next image under probe, snapshot on the volume",
        r,
    );
    let Tally { passed, failed } = tally;
    println!("{passed} passed, {failed} failed");
    if failed > 0 {
        for a in &phase.agents {
            println!(
                "--- agent container {} ({}) log tail ---\n{}",
                a.node_name,
                a.image,
                a.log_tail(40)
            );
        }
    }
    assert_eq!(failed, 0, "{failed} image end-to-end cases failed");
}
