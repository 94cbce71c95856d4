//! The operator tools agree with the live agent (issue 27): the node of `node_support`
//! (namespaces, two wired pods) programmed by the real `felixrs agent` from a real etcd, both in
//! the node's namespace. Right after `/status` reports a revision applied, `felixrs trace
//! --state-dir` answers from what the agent applied (it asks the agent over `agent.sock`): the
//! new pod is known and the kernel agrees, 30 changes in a row; a `felixrs flows` run started
//! before a pod is in the datastore names it once it is; `felixrs preview --state-dir` previews
//! against what the agent applied, and its "before" is what the kernel does. Root.

mod node_support;
mod support;

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use felixrs::cmd::shared::dataplane_args::DataplaneArgs;
use felixrs_test_support::etcd::Etcd;
use felixrs_test_support::netns::Netns;
use felixrs_test_support::node::{Dataplane, NodeWorld};
use iptables::render::Renderer;
use node_support::{ALLOWED_PORT, DENIED_PORT, NODE, connects, render_with};
use serde_json::json;
use support::{Agent, put_default_tier, put_json};

/// The manifests' objects, to be written to etcd by the test (the client's endpoint only when
/// the test says so).
struct ViaAgent {
    renderer: Renderer,
    /// etcd key -> value, without the client's workload endpoint.
    objects: Vec<(String, String)>,
    client: (String, String),
    agent_args: Vec<String>,
}

/// The node once the agent programmed it.
struct Live {
    // Dropped in this order: the agent, then etcd, then the state directory.
    agent: Agent,
    etcd: Etcd,
    _state: tempfile::TempDir,
    state_dir: PathBuf,
    /// The client's workload endpoint: etcd key, value.
    client_wep: (String, String),
}

impl Live {
    /// Writes the client's workload endpoint; returns the revision.
    fn put_client(&self) -> i64 {
        self.etcd.put(&self.client_wep.0, &self.client_wep.1)
    }
}

impl Dataplane for ViaAgent {
    type Programmed = Live;

    fn interface_of(&self, pod: &str) -> String {
        (self.renderer.local_endpoints())
            .find(|e| e.id.name.contains(pod))
            .map(|e| e.interface_name.clone())
            .unwrap_or_else(|| panic!("no endpoint for {pod}"))
    }

    fn program(self, node: &Netns) -> Live {
        let etcd = Etcd::start_in(node.name());
        put_default_tier(&etcd);
        let mut rev = 0;
        for (k, v) in &self.objects {
            rev = etcd.put(k, v);
        }
        let (state, state_dir) = support::state_dir();
        let agent = Agent::start_with(
            node.name(),
            &etcd.client_url(),
            &state_dir,
            &self.agent_args,
        );
        agent.wait_applied(rev);
        Live {
            agent,
            etcd,
            _state: state,
            state_dir,
            client_wep: self.client,
        }
    }
}

/// The node of `node_support`, programmed by the agent (with `agent_args`), the client's endpoint
/// in etcd only if `with_client`.
fn live_node(agent_args: &[&str], with_client: bool) -> NodeWorld<Live> {
    let w = NodeWorld::build(|dir| {
        let set = k8s_convert::load_manifests(
            &[dir.to_path_buf()],
            &k8s_convert::ConvertOptions::default(),
        )
        .unwrap();
        let mut objects: Vec<(String, String)> = (set.resources.into_iter())
            .map(|(k, r)| (k.as_str().to_string(), r.to_json()))
            .collect();
        let at = (objects.iter())
            .position(|(k, _)| k.contains("workloadendpoints/") && k.contains("client"))
            .expect("the client's endpoint");
        let client = objects.remove(at);
        ViaAgent {
            renderer: render_with(dir, &DataplaneArgs::default()),
            objects,
            client,
            agent_args: agent_args.iter().map(|s| s.to_string()).collect(),
        }
    });
    if with_client {
        let rev = w.programmed.put_client();
        w.agent.wait_applied(rev);
    }
    w
}

/// `felixrs ARGS` in the node's namespace: (exit code, stdout, stderr).
fn felixrs(w: &NodeWorld<Live>, args: &[&str]) -> (Option<i32>, String, String) {
    let out = Command::new("ip")
        .args([
            "netns",
            "exec",
            w.node.name(),
            env!("CARGO_BIN_EXE_felixrs"),
        ])
        .args(args)
        .output()
        .unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// A workload endpoint of pod `stats/<name>` on this node (no namespace behind it: its rules are
/// what the trace checks).
fn put_extra_pod(etcd: &Etcd, i: u32) -> i64 {
    let name = format!("extra-{i}");
    put_json(
        etcd,
        &format!("workloadendpoints/stats/node--1-k8s-{name}-eth0"),
        json!({"apiVersion":"projectcalico.org/v3","kind":"WorkloadEndpoint",
               "metadata":{"name":format!("node--1-k8s-{name}-eth0"),"namespace":"stats",
                           "labels":{"app":"client","projectcalico.org/namespace":"stats",
                                     "projectcalico.org/orchestrator":"k8s"}},
               "spec":{"orchestrator":"k8s","node":NODE,"pod":name,"endpoint":"eth0",
                       "interfaceName":format!("calix{i:09}"),
                       "ipNetworks":[format!("10.79.1.{}/32", i + 1)],
                       "profiles":["kns.stats"]}}),
    )
}

/// A policy on the server that changes with `i` (its port), so a view older than the kernel
/// would not have its rules.
fn put_moving_policy(etcd: &Etcd, i: u32) -> i64 {
    put_json(
        etcd,
        "networkpolicies/stats/moving",
        json!({"apiVersion":"projectcalico.org/v3","kind":"NetworkPolicy",
               "metadata":{"name":"moving","namespace":"stats"},
               "spec":{"tier":"default","order":500,"selector":"app == 'server'",
                       "types":["Ingress"],
                       "ingress":[{"action":"Allow","protocol":"TCP",
                                   "destination":{"ports":[10000 + i]}}]}}),
    )
}

/// 30 changes (a new pod and a changed policy each): as soon as `/status` reports the change
/// applied, `trace --state-dir --check-kernel --kernel` knows the new pod and finds the kernel
/// holding what it renders (exit 0), every time.
#[test]
fn trace_state_dir_agrees_with_the_kernel_right_after_status() {
    let w = live_node(&[], true);
    let dir = w.state_dir.to_str().unwrap().to_string();
    for i in 0..30u32 {
        put_moving_policy(&w.etcd, i);
        let rev = put_extra_pod(&w.etcd, i);
        // Polled, not long-polled: the trace starts the moment `/status` says so.
        let s = w.agent.poll_status(Duration::from_secs(30), |s| {
            s["applied_revision"].as_i64().unwrap_or(0) >= rev
        });
        assert!(s["applied_revision"].as_i64().unwrap() >= rev, "{s}");
        let from = format!("stats/extra-{i}");
        let port = (10000 + i).to_string();
        let (code, out, err) = felixrs(
            &w,
            &[
                "trace",
                "--state-dir",
                &dir,
                "--node-name",
                NODE,
                "--from",
                &from,
                "--to",
                "stats/server",
                "--port",
                &port,
                "--check-kernel",
                "--kernel",
            ],
        );
        assert_eq!(code, Some(0), "change {i} (revision {rev}):\n{out}\n{err}");
        assert!(
            out.contains(&format!("from 10.79.1.{}: {from} (on this node", i + 1)),
            "change {i}:\n{out}"
        );
        assert!(
            out.contains("(asked the running agent: what it has applied)"),
            "change {i}:\n{out}"
        );
        assert!(out.contains("verdict: ACCEPT"), "change {i}:\n{out}");
        assert!(
            out.contains("the kernel agrees with the rendered rules"),
            "change {i}:\n{out}"
        );
    }
    // The snapshot file catches up within its interval; `render --state-dir` says where it read.
    let (code, out, err) = felixrs(&w, &["render", "--state-dir", &dir, "--node-name", NODE]);
    assert_eq!(code, Some(0), "{err}");
    assert!(
        out.starts_with("# from the agent's snapshot at datastore revision ")
            && out
                .lines()
                .next()
                .unwrap()
                .ends_with("(asked the running agent: what it has applied)"),
        "{}",
        out.lines().next().unwrap_or_default()
    );
}

/// `felixrs flows --state-dir` started while the client is not in the datastore: once the agent
/// has applied the client's endpoint, the packet the tier's end drops names the client's pod.
#[test]
fn flows_follows_the_agent_to_a_pod_that_appears() {
    let w = live_node(&["--log-denied"], false);
    let dir = w.state_dir.to_str().unwrap().to_string();
    let mut child = Command::new("ip")
        .args([
            "netns",
            "exec",
            w.node.name(),
            env!("CARGO_BIN_EXE_felixrs"),
        ])
        .args(["flows", "--state-dir", &dir, "--node-name", NODE, "--json"])
        .args(["--count", "1", "--timeout", "90", "--log-denied"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("felixrs flows");
    let stderr = child.stderr.take().unwrap();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    let first = rx
        .recv_timeout(Duration::from_secs(30))
        .expect("felixrs flows said nothing");
    assert!(first.contains("listening"), "{first}");

    let rev = w.programmed.put_client();
    w.agent.wait_applied(rev);
    assert!(
        (0..5).any(|_| connects(&w.client.ns, w.server.v4, ALLOWED_PORT)),
        "the client's allowed port"
    );
    assert!(
        !connects(&w.client.ns, w.server.v4, DENIED_PORT),
        "9090 not dropped"
    );
    let out = child.wait_with_output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    let notes: Vec<String> = rx.try_iter().collect();
    assert!(out.status.success(), "{text}\n{notes:?}");
    let flow: serde_json::Value = serde_json::from_str(text.trim()).expect("one flow");
    assert_eq!(flow["dst_port"], DENIED_PORT, "{text}");
    assert_eq!(flow["decided_by"], "end of tier default", "{text}");
    assert_eq!(flow["src_pod"], "stats/client", "{text}\n{notes:?}");
    assert_eq!(flow["dst_pod"], "stats/server", "{text}");
    assert!(
        notes
            .iter()
            .any(|n| n.contains("names from the agent's snapshot at datastore revision")),
        "{notes:?}"
    );
}

/// `felixrs preview --state-dir` on the live node: the node's objects are the running agent's
/// applied view; the "before" verdicts of the matrix are what real connections get from the
/// kernel; the agent's `flows.jsonl` is replayed: the allowed flow a deny on its port would block
/// is listed, the denied one is not.
#[test]
fn preview_state_dir_previews_against_the_live_agent() {
    let w = live_node(&[], true);
    let dir = w.state_dir.to_str().unwrap().to_string();
    let proposal = w.work.path().join("deny-8080.yaml");
    std::fs::write(
        &proposal,
        "apiVersion: projectcalico.org/v3\nkind: GlobalNetworkPolicy\nmetadata: {name: deny-8080}\n\
         spec: {order: 1, selector: all(), types: [Ingress], ingress: [{action: Deny, protocol: TCP, \
         destination: {ports: [8080]}}]}\n",
    )
    .unwrap();
    let proposal = proposal.to_str().unwrap();
    let base = [
        "preview",
        "--state-dir",
        &dir,
        "--node-name",
        NODE,
        "--manifests",
        proposal,
        "--json",
    ];
    let (code, out, err) = felixrs(&w, &[&base[..], &["--static"]].concat());
    assert_eq!(code, Some(1), "{out}\n{err}");
    let r: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert!(
        (r["source"].as_str().unwrap()).contains("(asked the running agent: what it has applied)"),
        "{r:#}"
    );
    let m = &r["matrix"];
    let col = |name: &str| {
        (m["columns"].as_array().unwrap().iter())
            .position(|c| c["name"] == name)
            .unwrap_or_else(|| panic!("no column {name}: {m:#}"))
    };
    let row = (m["rows"].as_array().unwrap().iter())
        .find(|r| {
            r["local"] == "stats/server"
                && r["direction"] == "ingress"
                && r["peer"] == "stats/client"
        })
        .unwrap_or_else(|| panic!("no client -> server row: {m:#}"));
    for (name, port) in [("tcp/8080", ALLOWED_PORT), ("tcp/other", 0)] {
        let c = col(name);
        let port = if port == 0 {
            m["columns"][c]["port"].as_u64().unwrap() as u16
        } else {
            port
        };
        let kernel = connects(&w.client.ns, w.server.v4, port);
        assert_eq!(
            row["before"][c] == "allow",
            kernel,
            "{name} (port {port}): {row}"
        );
    }
    assert_eq!(
        (
            row["before"][col("tcp/8080")].as_str(),
            row["after"][col("tcp/8080")].as_str()
        ),
        (Some("allow"), Some("deny"))
    );
    assert!(!connects(&w.client.ns, w.server.v4, DENIED_PORT));
    // The agent's flow log: one allowed flow to 8080 and one denied one to 9090.
    let record = |port: u16, action: &str| {
        json!({"start_time": 1, "end_time": 2, "host": NODE, "reporter": "dst", "proto": "tcp",
               "source": {"ip": w.client.v4, "port": 40001, "type": "wep", "namespace": "stats", "name": "client"},
               "dest": {"ip": w.server.v4, "port": port, "type": "wep", "namespace": "stats", "name": "server"},
               "action": action, "policies": {"enforced": []}, "num_connections_started": 1,
               "num_connections_completed": 1, "num_connections_live": 0,
               "packets_in": 3, "packets_out": 3, "bytes_in": 100, "bytes_out": 50})
        .to_string()
    };
    let flows = format!(
        "{}\n{}\n",
        record(ALLOWED_PORT, "allow"),
        record(DENIED_PORT, "deny")
    );
    std::fs::write(w.state_dir.join("flows.jsonl"), flows).unwrap();
    let (code, out, err) = felixrs(&w, &base);
    assert_eq!(code, Some(1), "{out}\n{err}");
    let r: serde_json::Value = serde_json::from_str(&out).unwrap();
    let groups = r["replay"]["groups"].as_array().unwrap();
    assert_eq!(groups.len(), 1, "{r:#}");
    assert_eq!(
        (
            groups[0]["before"]["verdict"].as_str(),
            groups[0]["after"]["verdict"].as_str()
        ),
        (Some("allow"), Some("deny"))
    );
    assert_eq!(groups[0]["flows"][0]["port"], ALLOWED_PORT);
    let after = groups[0]["after"]["decided_by"].as_array().unwrap();
    assert!(
        after
            .iter()
            .any(|d| d == "dropped by ingress of GlobalNetworkPolicy deny-8080 (tier default)"),
        "{after:?}"
    );
    assert_eq!(r["replay"]["evaluated"], 2);
}
