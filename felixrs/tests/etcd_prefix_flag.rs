//! `felixrs agent --etcd-prefix`: a bad prefix is refused at start, naming the flag, the value and
//! what is wrong (before anything touches etcd or the kernel).

use std::process::Command;

#[test]
fn a_bad_etcd_prefix_is_refused_naming_it() {
    for (prefix, why) in [
        ("calico", "must start with '/'"),
        ("/a/", "must not end with '/'"),
        (
            "/calico/resources/v3/projectcalico.org/b",
            "inside the default cluster's keys",
        ),
    ] {
        let out = Command::new(env!("CARGO_BIN_EXE_felixrs"))
            .args([
                "agent",
                "--etcd-endpoints",
                "http://127.0.0.1:1",
                "--node-name",
                "n",
            ])
            .args([
                "--state-dir",
                "/nonexistent/felixrs-test",
                "--etcd-prefix",
                prefix,
            ])
            .output()
            .expect("run felixrs");
        assert!(!out.status.success(), "{prefix} accepted");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains("--etcd-prefix")
                && err.contains(&format!("{prefix:?}"))
                && err.contains(why),
            "{prefix}: {err}"
        );
    }
}
