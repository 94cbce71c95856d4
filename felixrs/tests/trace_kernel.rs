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

/// `felixrs trace --manifests … FLAGS` in the node's namespace, client to server unless `flags`
/// say otherwise: (exit code, stdout, stderr).
fn trace_with(w: &NodeWorld, from: &str, to: &str, flags: &[&str]) -> (i32, String, String) {
    let dir = w.work.path().to_str().unwrap();
    let mut args = vec![
        "trace",
        "--manifests",
        dir,
        "--node-name",
        NODE,
        "--from",
        from,
        "--to",
        to,
    ];
    args.extend_from_slice(flags);
    let out = w.node.run(env!("CARGO_BIN_EXE_felixrs"), &args);
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Foreign rules are named wherever they sit, and our rules are ours wherever they sit: a foreign
/// rule inside our `cali-tw-` chain and one ahead of our FORWARD accept rule are named by `trace
/// --kernel` (table, chain, position, text) and make `--check-kernel` exit 2; the appended
/// FORWARD accept rule (our `cali:` id) is ours even when it decides against the rendered rules.
fn foreign_rules_are_named_wherever_they_sit(backend: Backend, ipt: &str) {
    let w = NodeWorld::new(backend);
    let tw = format!(
        "cali-tw-{}",
        (w.renderer.local_endpoints())
            .find(|e| e.id.name.contains("server"))
            .map(|e| e.interface_name.clone())
            .expect("the server's endpoint")
    );
    let denied = DENIED_PORT.to_string();
    let allowed = ALLOWED_PORT.to_string();
    let (client, server) = ("stats/client", "stats/server");
    let (code, out, err) = trace_with(&w, client, server, &["--port", &allowed, "--kernel"]);
    assert_eq!(code, 0, "{out}\n{err}");
    assert!(!out.contains("not ours"), "{out}");

    // Inside our chain: a foreign rule accepts (marks and returns) what policy denies; the
    // appended accept rule, ours, then accepts it in the kernel.
    let port = ["-p", "tcp", "--dport", denied.as_str()];
    let mark = [&port[..], &["-j", "MARK", "--set-xmark", "0x10000/0x10000"]].concat();
    let ret = [&port[..], &["-j", "RETURN"]].concat();
    w.node.ok(ipt, &[&["-I", &tw, "1"][..], &mark].concat());
    w.node.ok(ipt, &[&["-I", &tw, "2"][..], &ret].concat());
    assert!(
        (0..5).any(|_| connects(&w.client.ns, w.server.v4, DENIED_PORT)),
        "the foreign rules let 9090 through"
    );
    let (code, out, err) = trace_with(&w, client, server, &["--port", &denied, "--kernel"]);
    assert_eq!(code, 2, "{out}\n{err}");
    assert!(
        out.contains(&format!(
            "not ours: filter {tw} rule 1 (inside our chain; the packet matched it): -A {tw} -p tcp"
        )) && out.contains(&format!(
            "not ours: filter {tw} rule 2 (inside our chain; the packet matched it): -A {tw} -p tcp"
        )),
        "{out}"
    );
    assert!(out.contains(&format!("{tw} [not ours] rule 1")), "{out}");
    let verdict = kernel_verdict(&out);
    assert!(
        verdict.starts_with("ACCEPT by FORWARD rule 2: -A FORWARD -m comment --comment \"cali:")
            || verdict
                .starts_with("ACCEPT by FORWARD rule 2: -A FORWARD -m comment --comment cali:"),
        "{out}"
    );
    assert!(
        out.contains(
            "differs: the rendered rules say DROP, the kernel ACCEPT: FORWARD rule 2 decides\n"
        ),
        "our appended rule is ours:\n{out}"
    );
    assert!(!out.contains("FORWARD [not ours] rule 2"), "{out}");
    let (code, out, err) = trace_with(&w, client, server, &["--port", &denied, "--check-kernel"]);
    assert_eq!(code, 2, "{out}\n{err}");
    assert!(
        out.contains(&format!(
            "differs: {tw} rule 1: the kernel has a rule that is not ours (no cali: id) where the rendered rules have cali:"
        )) && out.contains(&format!(
            "differs: not ours: filter {tw} rule 1 (inside our chain; the packet matched it): -A {tw} -p tcp"
        )),
        "{out}"
    );
    w.node.ok(ipt, &[&["-D", &tw][..], &mark].concat());
    w.node.ok(ipt, &[&["-D", &tw][..], &ret].concat());
    let (code, out, err) = trace_with(&w, client, server, &["--port", &denied, "--check-kernel"]);
    assert_eq!(code, 0, "{out}\n{err}");

    // Ahead of our FORWARD accept rule (behind our hook): a foreign DROP of the client's traffic.
    let forward = w.node.ok(ipt, &["-S", "FORWARD"]);
    let at = (forward.lines().filter(|l| l.starts_with("-A FORWARD")))
        .position(|l| l.contains("Policy explicitly accepted packet."))
        .expect("our accept rule")
        + 1;
    assert!(at >= 2, "{forward}");
    let at = at.to_string();
    w.node.ok(
        ipt,
        &["-I", "FORWARD", &at, "-s", "10.79.0.1/32", "-j", "DROP"],
    );
    let (code, out, err) = trace_with(&w, client, server, &["--port", &allowed, "--kernel"]);
    assert_eq!(code, 2, "{out}\n{err}");
    assert!(
        out.contains(&format!(
            "not ours: filter FORWARD rule {at} (ahead of our rules in FORWARD; the packet matched it): -A FORWARD -s 10.79.0.1/32 -j DROP"
        )),
        "{out}"
    );
    assert!(
        out.contains(&format!(
            "differs: the rendered rules say ACCEPT, the kernel DROP: FORWARD rule {at} is not ours and decides"
        )),
        "{out}"
    );
    assert!(!connects(&w.client.ns, w.server.v4, ALLOWED_PORT));
    // --check-kernel: for the packet it drops, and for one it does not match (positional: it
    // would drop whatever our chains accepted from the client), exit 2 naming it.
    for (from, to) in [(client, server), (server, client)] {
        let (code, out, err) = trace_with(&w, from, to, &["--port", &allowed, "--check-kernel"]);
        assert_eq!(code, 2, "{from} -> {to}:\n{out}\n{err}");
        assert!(
            out.contains(&format!(
                "differs: FORWARD rule {at} is not ours and ends packets (DROP) before our rule cali:"
            )) && out.contains("-A FORWARD -s 10.79.0.1/32 -j DROP"),
            "{from} -> {to}:\n{out}"
        );
    }
}

#[test]
fn foreign_rules_are_named_wherever_they_sit_nft() {
    foreign_rules_are_named_wherever_they_sit(Backend::Nft, "iptables-nft");
}

#[test]
fn foreign_rules_are_named_wherever_they_sit_legacy() {
    foreign_rules_are_named_wherever_they_sit(Backend::Legacy, "iptables-legacy");
}
