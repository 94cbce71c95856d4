//! Node-side faults (issue 23), on the real kernel with a real etcd, in sequence on one etcd and
//! one node namespace ([`faults_support::World`]): a server pod whose policy admits only the client
//! pod, probed from an intruder pod (v4 and v6, four threads back to back) for the whole of every
//! scenario. Each asserts that no denied connection is delivered and that the node converges
//! afterwards (the admitted peer reaches the server, and for the kernel-state scenarios our
//! objects equal a fresh namespace programmed from the agent's snapshot):
//!
//! 1. the state directory (a small tmpfs) full, then read-only, when the snapshot is written:
//!    enforcement goes on, `/status` `snapshot_stale` and `felixrs_snapshot_stale` say so, a
//!    restart after the failure starts from the last good snapshot (etcd away), the next good
//!    write clears it;
//! 2. `kill -9` of an `ipset restore` and of an `iptables-restore` (thousands of set members and
//!    rules) under the agent, and of the agent while each runs (then restarted): nothing opens, it
//!    converges, no leftover temp sets or chains;
//! 3. the xtables lock (the test's own `XTABLES_LOCKFILE`) held for 10 s during an apply (legacy):
//!    the change lands after the release, nothing opens meanwhile;
//! 4. a kube-proxy-like writer rewriting its `KUBE-` chains 20 times a second during policy churn
//!    (every fifth change a large one),
//!    on legacy and nft: at the end its last state and ours are both exactly in the kernel.
//!
//! The measured figures are printed as a table at the end (RELIABILITY.md quotes them).

mod faults_support;
mod support;

use std::path::Path;
use std::time::{Duration, Instant};

use faults_support::{
    ForeignWriter, HeldLock, Killer, Prober, Restore, Tmpfs, World, backend_name, is_foreign,
    is_ours, metric, objects, reference,
};
use felixrs::agent::snapshot::SnapshotStore;
use iptables::apply::Backend;
use serde_json::json;
use support::Agent;

/// Set members and policy rules of the large payloads.
const MEMBERS: u32 = 5000;
const RULES: u32 = 1500;

/// One line of the results table.
struct Row {
    scenario: String,
    attempts: u64,
    delivered: u64,
    converged: Duration,
    note: String,
}

fn start_agent(w: &World, b: Backend, state: &Path) -> Agent {
    let lock = w.lock_file.to_string_lossy().into_owned();
    let a = Agent::spawn(
        w.node().name(),
        &w.etcd.client_url(),
        state,
        &["--iptables-backend", backend_name(b)],
        &[("XTABLES_LOCKFILE", &lock)],
    );
    let deadline = Instant::now() + Duration::from_secs(20);
    while a.get("/liveness").is_err() {
        assert!(Instant::now() < deadline, "agent did not start serving");
        std::thread::sleep(Duration::from_millis(20));
    }
    a
}

fn i(v: &serde_json::Value) -> i64 {
    v.as_i64().unwrap_or(-1)
}

/// Waits until the snapshot holds revision `rev` (and so the kernel's view can be re-rendered).
fn await_snapshot(agent: &Agent, rev: i64) {
    let s = agent.poll_status(Duration::from_secs(30), |s| {
        i(&s["snapshot_revision"]) >= rev && s["snapshot_stale"] == false
    });
    assert!(
        i(&s["snapshot_revision"]) >= rev,
        "snapshot never reached {rev}: {s}"
    );
}

/// Polls until our objects in the node equal the reference rendered from the snapshot (and, with
/// `foreign`, the foreign writer's equal that payload's); panics with both after 15 s. Returns how
/// long after the reference was built they were equal (zero: at the first look), and what
/// differed at the first look if anything did.
fn await_exact(
    w: &World,
    agent: &Agent,
    b: Backend,
    state: &Path,
    foreign: Option<&str>,
) -> (Duration, Option<String>) {
    let rev = i(&agent.status()["applied_revision"]);
    await_snapshot(agent, rev);
    let (want_ours, want_foreign) = reference(state, b, foreign);
    assert!(want_ours.contains("cali-tw-"), "{want_ours}");
    let started = Instant::now();
    let mut first_diff = None;
    loop {
        let ours = objects(w.node(), b, &is_ours, true);
        let theirs = objects(w.node(), b, &is_foreign, false);
        let foreign_ok = foreign.is_none() || theirs == want_foreign;
        if ours == want_ours && foreign_ok {
            return (started.elapsed(), first_diff);
        }
        if first_diff.is_none() {
            let diff = |got: &str, want: &str| {
                let (g, w): (Vec<_>, Vec<_>) = (got.lines().collect(), want.lines().collect());
                let extra = g.iter().filter(|l| !w.contains(l)).count();
                let missing = w.iter().filter(|l| !g.contains(l)).count();
                format!("{extra} extra, {missing} missing")
            };
            let d = format!(
                "ours: {}; foreign: {}",
                diff(&ours, &want_ours),
                diff(&theirs, &want_foreign)
            );
            eprintln!("not exact yet ({b:?}): {d}");
            first_diff = Some(d);
        }
        if started.elapsed() > Duration::from_secs(15) {
            pretty_assertions::assert_eq!(ours, want_ours, "our objects ({b:?})");
            pretty_assertions::assert_eq!(theirs, want_foreign, "the foreign writer's ({b:?})");
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

#[test]
fn node_faults_open_nothing_and_converge() {
    let started = Instant::now();
    let mut w = World::new();
    let state = Tmpfs::mount(&w.work.path().join("state"), "8m");
    let mut agent = start_agent(&w, Backend::Legacy, &state.dir);
    agent.wait_applied(w.etcd.revision());
    w.await_client(Duration::from_secs(30));
    let mut rows = Vec::new();

    rows.extend(snapshot_faults(&mut w, &state, &mut agent));
    rows.extend(restore_kills(&w, &state, &mut agent));
    rows.push(lock_held(&w, &agent));
    for b in [Backend::Legacy, Backend::Nft] {
        if b == Backend::Nft {
            agent.signal(libc::SIGTERM);
            assert!(agent.wait().success());
            agent = start_agent(&w, b, &state.dir);
            agent.wait_applied(w.etcd.revision());
        }
        rows.push(foreign_writer(&w, &state, &agent, b));
    }

    eprintln!("| scenario | denied delivered / attempts | converged after | notes |");
    eprintln!("|---|---|---|---|");
    for r in &rows {
        eprintln!(
            "| {} | {} / {} | {:.1} s | {} |",
            r.scenario,
            r.delivered,
            r.attempts,
            r.converged.as_secs_f64(),
            r.note
        );
    }
    eprintln!("total {:.0} s", started.elapsed().as_secs_f64());
    for r in &rows {
        assert_eq!(
            r.delivered, 0,
            "{}: denied connections delivered",
            r.scenario
        );
        assert!(
            r.attempts > 20,
            "{}: too few probes ({})",
            r.scenario,
            r.attempts
        );
    }
}

/// Scenario 1: the state directory full, then read-only.
fn snapshot_faults(w: &mut World, state: &Tmpfs, agent: &mut Agent) -> Vec<Row> {
    let store = SnapshotStore::new(&state.dir);
    let good = w.etcd.revision();
    await_snapshot(agent, good);
    assert_eq!(metric(agent, "felixrs_snapshot_stale"), 0.0);

    // Full: enforcement goes on, the snapshot is stale, the file stays the last good one.
    let probe = Prober::start(w);
    state.fill();
    let allow_port = |port: u16| {
        json!([{"action":"Allow","protocol":"TCP",
                "source":{"selector":"app == 'client'"},"destination":{"ports":[port]}}])
    };
    let r1 = w.put_policy("snap-a", allow_port(7001));
    agent.wait_applied(r1);
    let s = agent.poll_status(Duration::from_secs(15), |s| s["snapshot_stale"] == true);
    assert_eq!(s["snapshot_stale"], true, "{s}");
    let err = s["snapshot_error"].as_str().unwrap_or_default();
    assert!(err.contains("No space left"), "{s}");
    assert!(i(&s["snapshot_revision"]) < r1, "{s}");
    let last_good = i(&s["snapshot_revision"]);
    assert_eq!(metric(agent, "felixrs_snapshot_stale"), 1.0);
    assert!(
        w.node()
            .ok("iptables-legacy-save", &["-t", "filter"])
            .contains("7001"),
        "the change was not enforced while the disk was full"
    );
    // A restart after the failure, etcd away: from the last good snapshot, whole.
    agent.signal(libc::SIGKILL);
    agent
        .wait_exit(Duration::from_secs(5))
        .expect("agent killed");
    let on_disk = store
        .load()
        .expect("the snapshot is whole")
        .expect("a snapshot");
    assert_eq!(on_disk.revision, last_good);
    assert!(!state.dir.join("datastore.snapshot.tmp").exists());
    w.etcd.restart_admin_only();
    let restarted = Instant::now();
    *agent = start_agent(w, Backend::Legacy, &state.dir);
    let s = agent.poll_status(Duration::from_secs(20), |s| {
        s["source"] == "snapshot" && s["programmed"] == true
    });
    assert_eq!(
        (&s["source"], &s["programmed"]),
        (&json!("snapshot"), &json!(true)),
        "{s}"
    );
    assert_eq!(i(&s["snapshot_revision"]), last_good, "{s}");
    let from_snapshot = restarted.elapsed();
    w.etcd.restart();
    agent.wait_applied(r1);
    let s = agent.poll_status(Duration::from_secs(15), |s| s["snapshot_stale"] == true);
    assert_eq!(
        s["snapshot_stale"], true,
        "still full after the restart: {s}"
    );
    // The next good write clears it.
    state.unfill();
    let freed = Instant::now();
    let r2 = w.put_policy("snap-a", allow_port(7002));
    await_snapshot(agent, r2);
    let full_cleared = freed.elapsed();
    assert_eq!(metric(agent, "felixrs_snapshot_stale"), 0.0);
    let full = probe.stop();

    // Read-only: the same, and the writer's retry clears it with no further change.
    let probe = Prober::start(w);
    state.read_only(true);
    let r3 = w.put_policy("snap-a", allow_port(7003));
    agent.wait_applied(r3);
    let s = agent.poll_status(Duration::from_secs(15), |s| s["snapshot_stale"] == true);
    assert_eq!(s["snapshot_stale"], true, "{s}");
    assert!(
        s["snapshot_error"]
            .as_str()
            .unwrap_or_default()
            .contains("Read-only"),
        "{s}"
    );
    assert_eq!(metric(agent, "felixrs_snapshot_stale"), 1.0);
    std::thread::sleep(Duration::from_secs(2));
    state.read_only(false);
    let writable = Instant::now();
    await_snapshot(agent, r3);
    let ro_cleared = writable.elapsed();
    let ro = probe.stop();
    w.await_client(Duration::from_secs(10));
    vec![
        Row {
            scenario: "state dir full during snapshot write; kill -9, restart with etcd away"
                .into(),
            attempts: full.attempts,
            delivered: full.delivered,
            converged: full_cleared,
            note: format!(
                "change enforced while full; restart programmed from the last good snapshot \
                 (rev {last_good}) in {:.1} s; stale cleared {:.1} s after space was freed \
                 (next write)",
                from_snapshot.as_secs_f64(),
                full_cleared.as_secs_f64()
            ),
        },
        Row {
            scenario: "state dir read-only during snapshot write".into(),
            attempts: ro.attempts,
            delivered: ro.delivered,
            converged: ro_cleared,
            note: format!(
                "stale cleared {:.1} s after the remount rw, by the writer's retry (no new change)",
                ro_cleared.as_secs_f64()
            ),
        },
    ]
}

/// Writes large payloads (generation after generation) until `killer` fires; the last revision.
fn churn_until_killed(w: &World, killer: &Killer, generation: &mut u32) -> i64 {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        *generation += 1;
        let rev = w.put_bulk(*generation, MEMBERS, RULES);
        let wait = Instant::now() + Duration::from_secs(10);
        while !killer.fired() && Instant::now() < wait {
            std::thread::sleep(Duration::from_millis(20));
        }
        if killer.fired() {
            return rev;
        }
        assert!(Instant::now() < deadline, "no restore was caught to kill");
    }
}

/// Scenario 2: `kill -9` of each restore under the agent, and of the agent during each.
fn restore_kills(w: &World, state: &Tmpfs, agent: &mut Agent) -> Vec<Row> {
    let mut generation = 0;
    let loaded = Instant::now();
    let rev = w.put_bulk(generation, MEMBERS, RULES);
    agent.wait_applied(rev);
    eprintln!("bulk payload applied in {:?}", loaded.elapsed());
    let mut rows = Vec::new();
    for kind in [Restore::Ipset, Restore::Iptables] {
        // (a) The restore killed under the agent: it sees the failure and retries.
        let probe = Prober::start(w);
        let failures = |a: &Agent| {
            metric(a, "felixrs_iptables_restore_errors_total")
                + metric(a, "felixrs_apply_errors_total")
        };
        let before = failures(agent);
        let killer = Killer::arm(w.node(), kind, false);
        let rev = churn_until_killed(w, &killer, &mut generation);
        let killed = Instant::now();
        let read = killer.disarm();
        agent.wait_applied(rev);
        w.await_client(Duration::from_secs(20));
        let converged = killed.elapsed();
        assert!(
            failures(agent) > before,
            "the agent did not see the killed {kind:?} restore"
        );
        exact(w, agent, &state.dir);
        let p = probe.stop();
        rows.push(Row {
            scenario: format!("kill -9 of the {kind:?} restore under the agent (legacy)"),
            attempts: p.attempts,
            delivered: p.delivered,
            converged,
            note: format!(
                "killed after {} KiB of its payload; retried, exact state after",
                kib(read)
            ),
        });

        // (b) The agent killed while its restore runs, then restarted.
        let probe = Prober::start(w);
        let killer = Killer::arm(w.node(), kind, true);
        let rev = churn_until_killed(w, &killer, &mut generation);
        let killed = Instant::now();
        let read = killer.disarm();
        agent
            .wait_exit(Duration::from_secs(10))
            .expect("agent killed");
        *agent = start_agent(w, Backend::Legacy, &state.dir);
        agent.wait_applied(rev);
        w.await_client(Duration::from_secs(20));
        let converged = killed.elapsed();
        exact(w, agent, &state.dir);
        let sets = w.node().ok("ipset", &["list", "-n"]);
        assert!(
            !sets
                .lines()
                .any(|s| s.starts_with("cali4t") || s.starts_with("cali6t")),
            "leftover temp sets: {sets}"
        );
        let p = probe.stop();
        rows.push(Row {
            scenario: format!("kill -9 of the agent during its {kind:?} restore, restart (legacy)"),
            attempts: p.attempts,
            delivered: p.delivered,
            converged,
            note: format!(
                "killed after {} KiB of the payload; restarted, exact state, no temp sets/chains",
                kib(read)
            ),
        });
    }
    rows
}

/// After a kill: our objects exactly as rendered, at the first look.
fn exact(w: &World, agent: &Agent, state: &Path) {
    let (after, diff) = await_exact(w, agent, Backend::Legacy, state, None);
    assert!(
        diff.is_none(),
        "converged yet not exact at once ({after:?}): {diff:?}"
    );
}

fn kib(read: Option<u64>) -> u64 {
    read.expect("the killer fired") / 1024
}

/// Scenario 3: the xtables lock held for 10 s during an apply (legacy).
fn lock_held(w: &World, agent: &Agent) -> Row {
    let probe = Prober::start(w);
    let hold = HeldLock::take(&w.lock_file);
    let locked = Instant::now();
    std::thread::sleep(Duration::from_millis(500));
    let rev = w.put_policy(
        "lock-probe",
        json!([{"action":"Allow","protocol":"TCP","source":{"selector":"app == 'client'"},
                "destination":{"ports":[7777]}}]),
    );
    let mut error_seen = None;
    while locked.elapsed() < Duration::from_secs(10) {
        let s = agent.status();
        assert!(
            i(&s["applied_revision"]) < rev,
            "the change landed while the xtables lock was held: {s}"
        );
        if let Some(e) = s["last_apply_error"].as_str() {
            error_seen.get_or_insert(e.to_string());
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    drop(hold);
    let released = Instant::now();
    agent.wait_applied(rev);
    let landed = released.elapsed();
    assert!(
        w.node()
            .ok("iptables-legacy-save", &["-t", "filter"])
            .contains("7777"),
        "the change is not in the kernel"
    );
    assert_eq!(agent.get("/liveness").unwrap().0, 200);
    let s = agent.status();
    assert!(s["last_apply_error"].is_null(), "{s}");
    let p = probe.stop();
    Row {
        scenario: "xtables lock held 10 s by another process during an apply (legacy)".into(),
        attempts: p.attempts,
        delivered: p.delivered,
        converged: landed,
        note: format!(
            "the restore waited on the lock; landed {:.2} s after the release; /status \
             last_apply_error during the hold: {}",
            landed.as_secs_f64(),
            error_seen
                .as_deref()
                .unwrap_or("none (the apply was waiting, not failing)")
        ),
    }
}

/// Scenario 4: a kube-proxy-like writer during policy churn.
fn foreign_writer(w: &World, state: &Tmpfs, agent: &Agent, b: Backend) -> Row {
    let probe = Prober::start(w);
    let writer = ForeignWriter::start(w.node(), b, &w.lock_file);
    let mut rev = 0;
    for n in 0..20u16 {
        rev = if n % 5 == 4 {
            // Every fifth change a large one: the set replaced and the 1,500-rule chain rewritten.
            w.put_bulk(1000 + u32::from(n), MEMBERS, RULES)
        } else {
            w.put_policy(
                "churn",
                json!([{"action":"Allow","protocol":"TCP","source":{"selector":"app == 'client'"},
                        "destination":{"ports":[20000 + n]}}]),
            )
        };
        std::thread::sleep(Duration::from_millis(250));
    }
    agent.wait_applied(rev);
    std::thread::sleep(Duration::from_secs(1));
    let (last, writes) = writer.stop();
    let (converged, diff) = await_exact(w, agent, b, &state.dir, Some(&last));
    w.await_client(Duration::from_secs(10));
    let p = probe.stop();
    ForeignWriter::remove(w.node(), b);
    assert!(writes >= 60, "the foreign writer wrote only {writes} times");
    Row {
        scenario: format!(
            "foreign writer (KUBE- chains, 20 restores/s) during policy churn ({b:?})"
        ),
        attempts: p.attempts,
        delivered: p.delivered,
        converged,
        note: format!(
            "{writes} foreign rewrites, 20 policy changes (4 large); at the end both states exact{}",
            diff.map_or(String::new(), |d| format!(" (first look: {d})"))
        ),
    }
}
