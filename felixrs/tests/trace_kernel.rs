//! `felixrs trace --kernel` on the real kernel: the node of `node_support` (two pods, the rules
//! applied with legacy and with nft), the packet traced through the kernel's own rules agrees with
//! the rendered trace and with what the datapath does (connections tried for real), over IPv4 and
//! IPv6; a foreign DROP an admin inserts ahead of our hook is reported as the rule that decides,
//! and the verdicts differ (exit status 2), as the datapath then drops. Root.

mod node_support;

use std::net::IpAddr;

use iptables::apply::Backend;
use node_support::{ALLOWED_PORT, DENIED_PORT, FelixrsNode, NODE, NodeWorld, connects};

/// Runs `felixrs trace --kernel` in the node's namespace: (exit code, stdout, stderr).
fn trace(w: &NodeWorld, extra: &[&str]) -> (i32, String, String) {
    let dir = w.work.path().to_str().unwrap();
    let mut args = vec![
        "trace",
        "--manifests",
        dir,
        "--node-name",
        NODE,
        "--kernel",
        "--from",
        "stats/client",
        "--to",
        "stats/server",
    ];
    args.extend_from_slice(extra);
    let out = w.node.run(env!("CARGO_BIN_EXE_felixrs"), &args);
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn kernel_verdict(text: &str) -> &str {
    text.lines()
        .find_map(|l| l.strip_prefix("kernel verdict: "))
        .unwrap_or_else(|| panic!("no kernel verdict in:\n{text}"))
}

fn kernel_trace_agrees_with_the_datapath(backend: Backend, save: &str) {
    let w = NodeWorld::new(backend);
    for (v6, dst) in [(false, w.server.v4), (true, w.server.v6)] {
        let fam: &[&str] = if v6 { &["--ipv6"] } else { &[] };
        for (port, open) in [(ALLOWED_PORT, true), (DENIED_PORT, false)] {
            let p = port.to_string();
            let mut extra = vec!["--port", p.as_str()];
            extra.extend_from_slice(fam);
            let (code, out, err) = trace(&w, &extra);
            assert_eq!(code, 0, "{out}\n{err}");
            let program = if v6 {
                save.replacen("iptables", "ip6tables", 1)
            } else {
                save.to_string()
            };
            assert!(
                out.contains(&format!("kernel ({program} -t filter")),
                "{out}"
            );
            assert!(
                out.contains("the kernel agrees with the rendered rules"),
                "{out}"
            );
            let want = if open { "ACCEPT" } else { "DROP" };
            assert!(
                kernel_verdict(&out).starts_with(want),
                "{dst} port {port}:\n{out}"
            );
            let reached = if open {
                (0..5).any(|_| connects(&w.client.ns, dst, port))
            } else {
                connects(&w.client.ns, dst, port)
            };
            assert_eq!(reached, open, "datapath for {dst} port {port} vs\n{out}");
        }
    }

    // An admin drops the client's traffic ahead of our hook.
    let ipt = save.trim_end_matches("-save");
    let client: IpAddr = w.client.v4;
    w.node.ok(
        ipt,
        &[
            "-I",
            "FORWARD",
            "1",
            "-s",
            &format!("{client}/32"),
            "-j",
            "DROP",
        ],
    );
    let p = ALLOWED_PORT.to_string();
    let (code, out, err) = trace(&w, &["--port", &p]);
    assert_eq!(code, 2, "verdicts differ: exit 2\n{out}\n{err}");
    assert!(
        kernel_verdict(&out)
            .starts_with("DROP by FORWARD rule 1: -A FORWARD -s 10.79.0.1/32 -j DROP"),
        "{out}"
    );
    assert!(
        out.contains("differs: the rendered rules say ACCEPT, the kernel DROP: FORWARD rule 1 is not ours and decides before our hook"),
        "{out}"
    );
    assert!(out.contains("FORWARD [not ours] rule 1"), "{out}");
    assert!(
        !connects(&w.client.ns, w.server.v4, ALLOWED_PORT),
        "the datapath must drop it too"
    );
    // IPv6 is untouched by the IPv4 rule and still agrees.
    let (code, out, _) = trace(&w, &["--port", &p, "--ipv6"]);
    assert_eq!(code, 0, "{out}");
    assert!(kernel_verdict(&out).starts_with("ACCEPT"), "{out}");
}

#[test]
fn kernel_trace_agrees_with_the_datapath_legacy() {
    kernel_trace_agrees_with_the_datapath(Backend::Legacy, "iptables-legacy-save");
}

#[test]
fn kernel_trace_agrees_with_the_datapath_nft() {
    kernel_trace_agrees_with_the_datapath(Backend::Nft, "iptables-nft-save");
}
