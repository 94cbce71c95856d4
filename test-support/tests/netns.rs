//! The namespace guard really creates and deletes namespaces (also on panic) and moves only one thread.

use std::process::Command;

use felixrs_test_support::netns::{self, Netns, VethPair, in_netns};

fn exists(name: &str) -> bool {
    let out = Command::new("ip").args(["netns", "list"]).output().unwrap();
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .any(|l| l.split_whitespace().next() == Some(name))
}

#[test]
fn namespace_lives_exactly_as_long_as_the_guard() {
    let ns = Netns::with_tag("life");
    let name = ns.name().to_string();
    assert!(
        name.starts_with(&format!("fxt-{}-life", std::process::id())),
        "{name}"
    );
    assert!(exists(&name));
    assert!(ns.ok("ip", &["link", "show", "lo"]).contains("UP"));
    drop(ns);
    assert!(!exists(&name), "{name} left behind");
}

#[test]
fn namespace_is_deleted_when_the_test_panics() {
    let name = std::thread::spawn(|| {
        let ns = Netns::new();
        let name = ns.name().to_string();
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(move || {
            let _ns = ns;
            panic!("test failure inside the namespace");
        }))
        .expect_err("the closure panics");
        name
    })
    .join()
    .unwrap();
    assert!(!exists(&name), "{name} survived a panic");
}

#[test]
fn processes_inside_are_killed_with_the_namespace() {
    let ns = Netns::new();
    let mut child = ns.command("sleep").arg("30").spawn().unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while ns.ok("ip", &["netns", "pids", ns.name()]).trim().is_empty() {
        assert!(std::time::Instant::now() < deadline, "sleep never ran");
    }
    drop(ns);
    let status = child.wait().unwrap();
    assert!(!status.success(), "sleep finished instead of being killed");
}

/// A guard whose name ends up bound to the host's namespace must not kill the host's processes
/// (`ip netns pids` then lists all of them; it once killed the shell running the tests).
#[test]
fn a_guard_bound_to_the_host_namespace_kills_nothing() {
    let ns = Netns::with_tag("host");
    let file = netns::path(ns.name());
    let file = file.to_str().unwrap();
    assert!(!netns::shares_a_host_namespace(ns.name()));
    let ok = |args: &[&str]| {
        let out = Command::new(args[0]).args(&args[1..]).output().unwrap();
        assert!(out.status.success(), "{args:?}: {out:?}");
    };
    ok(&["umount", file]);
    ok(&["mount", "--bind", "/proc/self/ns/net", file]);
    if !netns::shares_a_host_namespace(ns.name()) {
        // Dropping the guard now would kill every process on the host: leak it instead.
        std::mem::forget(ns);
        panic!("{file} is bound to this process's namespace but not recognised as such");
    }
    let mut bystander = Command::new("sleep").arg("30").spawn().unwrap();
    drop(ns);
    let alive = bystander.try_wait().unwrap().is_none();
    let _ = bystander.kill();
    let _ = bystander.wait();
    assert!(alive, "the guard killed a process of the host's namespace");
    assert!(!std::path::Path::new(file).exists(), "{file} left behind");
}

#[test]
fn in_netns_moves_only_the_helper_thread() {
    let pair = VethPair::new();
    let here = std::fs::read_link("/proc/thread-self/ns/net").unwrap();
    let there = in_netns(pair.a.name(), || {
        std::fs::read_link("/proc/thread-self/ns/net").unwrap()
    });
    assert_ne!(here, there);
    assert_eq!(
        std::fs::read_link("/proc/thread-self/ns/net").unwrap(),
        here
    );
    // The veth link carries traffic between the two namespaces only.
    let listener = pair
        .b
        .in_thread(|| std::net::TcpListener::bind((VethPair::ADDR_B, 0)).expect("bind in b"));
    let addr = listener.local_addr().unwrap();
    assert!(
        std::net::TcpStream::connect_timeout(&addr, std::time::Duration::from_millis(300)).is_err(),
        "{addr} reachable from the host namespace"
    );
    let connected = pair.a.in_thread(move || {
        std::net::TcpStream::connect_timeout(&addr, std::time::Duration::from_secs(2)).is_ok()
    });
    assert!(connected, "a cannot reach {addr} over the veth pair");
}

#[test]
fn exec_reports_the_failing_command() {
    let ns = Netns::new();
    let err = ns
        .exec(&["ip", "link", "set", "nosuchdev", "up"])
        .unwrap_err();
    assert!(err.to_string().contains("nosuchdev"), "{err}");
    assert!(netns::enter("fxt-no-such-namespace").is_err());
}
