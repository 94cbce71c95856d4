//! Runs the built `felixrs iptables roundtrip` on corpus files and on broken input.

use std::io::Write;
use std::path::PathBuf;
use std::process::{Command, Stdio};

fn corpus(name: &str) -> PathBuf {
    let dir = felixrs_test_support::iptables_corpus_dir();
    assert!(
        dir.join("SOURCES.md").is_file(),
        "iptables corpus missing at {}",
        dir.display()
    );
    dir.join(name)
}

fn felixrs() -> Command {
    Command::new(env!("CARGO_BIN_EXE_felixrs"))
}

fn run_stdin(input: &[u8]) -> std::process::Output {
    let mut child = felixrs()
        .args(["iptables", "roundtrip"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn felixrs");
    child.stdin.take().unwrap().write_all(input).unwrap();
    child.wait_with_output().expect("wait felixrs")
}

#[test]
fn roundtrip_of_a_kernel_dump_file_is_identical() {
    let path = corpus("002-calico-felix-cali-raw-nat-mangle-filter.kernel.txt");
    let want = std::fs::read(&path).unwrap();
    let out = felixrs()
        .args(["iptables", "roundtrip"])
        .arg(&path)
        .output()
        .expect("run felixrs");
    assert!(
        out.status.success(),
        "stderr: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&want)
    );
    assert!(out.stderr.is_empty());
}

#[test]
fn roundtrip_from_stdin() {
    let want = std::fs::read(corpus("022-netnet-tum-i8-large-v6.kernel.txt")).unwrap();
    let out = run_stdin(&want);
    assert!(
        out.status.success(),
        "stderr: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.stdout == want, "stdin round trip differs");
}

#[test]
fn broken_input_exits_1_with_line_and_column() {
    let out =
        run_stdin(b"*filter\n:INPUT ACCEPT [0:0]\n-A INPUT -d ! 10.0.0.0/8 -j DROP\nCOMMIT\n");
    assert_eq!(out.status.code(), Some(1));
    assert!(out.stdout.is_empty());
    let err = String::from_utf8(out.stderr).unwrap();
    assert!(err.starts_with("3:13: old negation syntax"), "{err}");

    // Lines are rendered as they are parsed; an error in a later table still prints nothing.
    let out = run_stdin(b"*raw\n:PREROUTING ACCEPT [0:0]\nCOMMIT\n*filter\n:INPUT ACCEPT [0:0]\n-A INPUT -j ACCEPT\n");
    assert_eq!(out.status.code(), Some(1));
    assert!(
        out.stdout.is_empty(),
        "{:?}",
        String::from_utf8_lossy(&out.stdout)
    );
    let err = String::from_utf8(out.stderr).unwrap();
    assert!(
        err.starts_with("6:19: COMMIT expected for table filter started at line 4"),
        "{err}"
    );

    let out = felixrs()
        .args(["iptables", "roundtrip"])
        .arg(corpus("006-netnet-vsrv-ufw-fail2ban.txt"))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).starts_with("1:65: carriage return"));
}

#[test]
fn missing_file_is_a_clear_error() {
    let out = felixrs()
        .args(["iptables", "roundtrip", "/nonexistent/fxr-dump.txt"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("reading /nonexistent/fxr-dump.txt"), "{err}");
}

#[test]
fn lenient_roundtrip_keeps_a_rule_printed_across_lines_verbatim() {
    let input = b"*filter\n:X - [0:0]\n-A X -m comment --comment \"a\nb\" -j ACCEPT\n-A X -j DROP\nCOMMIT\n";
    let strict = run_stdin(input);
    assert!(!strict.status.success());
    let mut child = felixrs()
        .args(["iptables", "roundtrip", "--lenient"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn felixrs");
    child.stdin.take().unwrap().write_all(input).unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success());
    assert_eq!(out.stdout, input);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.starts_with("warning: 3:") && stderr.contains("kept verbatim"),
        "{stderr}"
    );
}

/// A dump large enough for the parallel path (chunks on threads): the output is still the input
/// byte for byte, and a bad line deep in it gives the sequential path's error (its line number)
/// and no output.
#[test]
fn large_dump_roundtrips_in_parallel_with_the_same_error() {
    let one = std::fs::read_to_string(corpus("022-netnet-tum-i8-large-v6.kernel.txt")).unwrap();
    let copies = iptables::parse::PARALLEL_MIN_BYTES / one.len() + 2;
    let big = one.repeat(copies);
    assert!(big.len() >= iptables::parse::PARALLEL_MIN_BYTES);
    let out = run_stdin(big.as_bytes());
    assert!(
        out.status.success(),
        "stderr: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.stdout == big.as_bytes(), "parallel round trip differs");

    // A foreign option on a line three quarters in: the error names that line.
    let mut lines: Vec<&str> = big.split('\n').collect();
    let at = lines.len() * 3 / 4;
    let at = at
        + lines[at..]
            .iter()
            .position(|l| l.starts_with("-A "))
            .unwrap();
    lines.insert(at, "-A INPUT -m tcp --bogus 1 -j ACCEPT");
    let broken = lines.join("\n");
    let want = iptables::parse::roundtrip_save_parts(&broken, 1).unwrap_err();
    assert_eq!(want.line, at + 1);
    let out = run_stdin(broken.as_bytes());
    assert_eq!(out.status.code(), Some(1));
    assert!(out.stdout.is_empty());
    assert_eq!(String::from_utf8(out.stderr).unwrap(), format!("{want}\n"));
}
