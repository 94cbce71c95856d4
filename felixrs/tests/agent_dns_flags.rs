//! `felixrs agent` and the DNS flags, through the binary in a throwaway namespace (root): without
//! `--dns-trusted-servers` it says at start that DNS names in policy match nothing; with them it
//! starts the learner and exports the `felixrs_dns_*` metrics, but does not bind the hold queue
//! before its first apply (with no etcd and no snapshot there is none): until then the kernel
//! drops held responses rather than the agent releasing them unlearned. No etcd is needed: the
//! agent starts, waits for one and never writes the kernel before it is in sync.

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::process::{Child, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use felixrs_test_support::netns::Netns;

/// The log line without its terminal colours.
fn strip_ansi(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut it = s.chars();
    while let Some(c) = it.next() {
        if c == '\u{1b}' {
            for c in it.by_ref() {
                if c.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

struct Agent {
    child: Child,
    lines: mpsc::Receiver<String>,
    seen: Vec<String>,
}

impl Agent {
    fn start(ns: &Netns, state: &std::path::Path, health: SocketAddr, extra: &[&str]) -> Agent {
        let mut child = ns
            .command(env!("CARGO_BIN_EXE_felixrs"))
            .args(["agent", "--etcd-endpoints", "http://127.0.0.1:1"])
            .args(["--node-name", "node-1", "--state-dir"])
            .arg(state)
            .args(["--health-listen", &health.to_string()])
            .args(["--etcd-timeout", "60"])
            .args(extra)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start felixrs agent");
        let stderr = child.stderr.take().unwrap();
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for l in BufReader::new(stderr).lines().map_while(Result::ok) {
                let _ = tx.send(strip_ansi(&l));
            }
        });
        Agent {
            child,
            lines,
            seen: Vec::new(),
        }
    }

    /// Waits (up to 60 s) for a log line containing `want`.
    fn wait_for(&mut self, want: &str) -> String {
        let deadline = Instant::now() + Duration::from_secs(60);
        while Instant::now() < deadline {
            if let Ok(l) = self.lines.recv_timeout(Duration::from_millis(200)) {
                self.seen.push(l.clone());
                if l.contains(want) {
                    return l;
                }
            }
        }
        panic!("no log line with {want:?}; saw:\n{}", self.seen.join("\n"));
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn without_trusted_servers_the_agent_says_names_match_nothing() {
    let ns = Netns::with_tag("dnsflag");
    let dir = tempfile::tempdir().unwrap();
    let health: SocketAddr = "127.0.0.1:9099".parse().unwrap();
    let mut a = Agent::start(&ns, dir.path(), health, &[]);
    a.wait_for("no --dns-trusted-servers: DNS names in policy will match nothing");
}

#[test]
fn with_trusted_servers_the_learner_starts_and_the_queue_waits_for_the_first_apply() {
    let ns = Netns::with_tag("dnsflag");
    let dir = tempfile::tempdir().unwrap();
    let health: SocketAddr = "127.0.0.1:9099".parse().unwrap();
    let mut a = Agent::start(
        &ns,
        dir.path(),
        health,
        &[
            "--dns-trusted-servers",
            "10.96.0.10,[fd00::10]:5353",
            "--dns-queue-num",
            "77",
            "--dns-min-ttl",
            "30",
            "--dns-max-learned",
            "500",
        ],
    );
    let l = a.wait_for("learning DNS names from the trusted servers' responses");
    assert!(
        l.contains("10.96.0.10:53") && l.contains("[fd00::10]:5353"),
        "{l}"
    );
    assert!(
        l.contains("min_ttl=30") && l.contains("max_learned=500"),
        "{l}"
    );
    assert!(
        !a.seen
            .iter()
            .any(|l| l.contains("no --dns-trusted-servers"))
    );
    let body = ns.in_thread(move || {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Ok((200, body)) = felixrs_test_support::http::get(health, "/metrics") {
                return body;
            }
            assert!(Instant::now() < deadline, "no /metrics");
            std::thread::sleep(Duration::from_millis(100));
        }
    });
    for m in [
        "felixrs_dns_learned_names ",
        "felixrs_dns_learned_addresses ",
        "felixrs_dns_responses_held_total ",
        "felixrs_dns_hold_seconds_bucket",
        "felixrs_dns_learned_evictions_total ",
        "felixrs_dns_queue_bound 0",
    ] {
        assert!(body.contains(m), "{m} missing from /metrics:\n{body}");
    }
    // Not in sync, nothing applied: the queue is not bound (the kernel lists no queue 77).
    let queues = ns.ok("cat", &["/proc/net/netfilter/nfnetlink_queue"]);
    assert!(
        !queues
            .lines()
            .any(|l| l.split_whitespace().next() == Some("77")),
        "queue 77 bound before the first apply: {queues:?}"
    );
    assert!(!a.seen.iter().any(|l| l.contains("holding DNS responses")));
}
