//! Removing the conntrack flows of an address that left a local endpoint (Felix's
//! `RemoveConntrackFlows`).
//!
//! Every endpoint chain starts with `--ctstate RELATED,ESTABLISHED -j ACCEPT`, so a flow the
//! kernel already tracks is never checked against policy again. When an endpoint goes away (or
//! loses an address), flows of its address would otherwise outlive it: a pod that later gets the
//! same address would inherit them, and their packets would pass whatever policy the new pod has.
//! After the endpoint's rules are gone from the kernel, the agent deletes every flow whose
//! original source or reply source is that address: a local endpoint either started the flow
//! (original source) or answered it (reply source), NAT included.
//!
//! `conntrack --delete` exits 1 with "0 flow entries have been deleted" when nothing matched;
//! that is success. Other failures are retried (the tool fails at random under load, as Felix
//! notes) and then reported with the address and the tool's message.

use std::net::IpAddr;

use super::runner::{RunError, Runner};

/// Which tuple of a flow holds a local endpoint's address.
const DIRECTIONS: [&str; 2] = ["--orig-src", "--reply-src"];

/// Tries per direction.
const ATTEMPTS: u32 = 3;

/// Deleting the flows of an address failed.
#[derive(Debug, thiserror::Error)]
pub enum ConntrackError {
    #[error(transparent)]
    Run(#[from] RunError),
    #[error(
        "deleting conntrack flows with {direction} {addr} failed after {attempts} attempts: {stderr}"
    )]
    Delete {
        addr: IpAddr,
        direction: &'static str,
        attempts: u32,
        stderr: String,
    },
}

/// Deletes every conntrack flow whose original or reply source is `addr` (in the runner's
/// network namespace). Returns the number of flows deleted.
pub fn remove_flows<R: Runner + ?Sized>(runner: &R, addr: IpAddr) -> Result<u64, ConntrackError> {
    let family = match addr {
        IpAddr::V4(_) => "ipv4",
        IpAddr::V6(_) => "ipv6",
    };
    // Formatted from the parsed address: nothing else reaches the command line.
    let text = addr.to_string();
    let mut deleted = 0;
    for direction in DIRECTIONS {
        let mut attempt = 0;
        loop {
            attempt += 1;
            let out = runner.run(
                "conntrack",
                &["--family", family, "--delete", direction, &text],
                None,
            )?;
            let stderr = String::from_utf8_lossy(&out.stderr);
            let count = deleted_count(&stderr);
            // Exit status 1 with "0 flow entries have been deleted" means nothing matched.
            if out.status.success() || count == Some(0) {
                deleted += count.unwrap_or(0);
                break;
            }
            if attempt >= ATTEMPTS {
                return Err(ConntrackError::Delete {
                    addr,
                    direction,
                    attempts: attempt,
                    stderr: stderr.trim().to_string(),
                });
            }
        }
    }
    Ok(deleted)
}

/// The count in conntrack's summary line: `conntrack v1.4.7 (conntrack-tools): 3 flow entries
/// have been deleted.`
fn deleted_count(stderr: &str) -> Option<u64> {
    stderr.lines().find_map(|l| {
        let (_, rest) = l.split_once("): ")?;
        let n = rest.strip_suffix(" flow entries have been deleted.")?;
        n.trim().parse().ok()
    })
}

#[cfg(test)]
mod tests {
    use std::os::unix::process::ExitStatusExt;
    use std::process::{ExitStatus, Output};
    use std::sync::Mutex;

    use super::*;

    /// Answers each call with the next canned (exit code, stderr) and records the arguments.
    struct Canned {
        answers: Mutex<Vec<(i32, &'static str)>>,
        calls: Mutex<Vec<Vec<String>>>,
    }

    impl Canned {
        fn new(mut answers: Vec<(i32, &'static str)>) -> Self {
            answers.reverse();
            Canned {
                answers: Mutex::new(answers),
                calls: Mutex::new(Vec::new()),
            }
        }
    }

    impl Runner for Canned {
        fn run(&self, program: &str, args: &[&str], _: Option<&[u8]>) -> Result<Output, RunError> {
            let mut call = vec![program.to_string()];
            call.extend(args.iter().map(|a| a.to_string()));
            self.calls.lock().unwrap().push(call);
            let (code, stderr) = self.answers.lock().unwrap().pop().expect("an answer");
            Ok(Output {
                status: ExitStatus::from_raw(code << 8),
                stdout: Vec::new(),
                stderr: stderr.as_bytes().to_vec(),
            })
        }
    }

    const DELETED_2: &str =
        "conntrack v1.4.7 (conntrack-tools): 2 flow entries have been deleted.\n";
    const DELETED_0: &str =
        "conntrack v1.4.7 (conntrack-tools): 0 flow entries have been deleted.\n";

    #[test]
    fn both_directions_are_deleted_and_nothing_matched_is_success() {
        let r = Canned::new(vec![(0, DELETED_2), (1, DELETED_0)]);
        let n = remove_flows(&r, "10.0.0.1".parse().unwrap()).unwrap();
        assert_eq!(n, 2);
        let calls = r.calls.lock().unwrap();
        assert_eq!(
            calls[0],
            [
                "conntrack",
                "--family",
                "ipv4",
                "--delete",
                "--orig-src",
                "10.0.0.1"
            ]
        );
        assert_eq!(calls[1][4..], ["--reply-src", "10.0.0.1"]);
    }

    #[test]
    fn failures_are_retried_then_reported_with_the_address() {
        let r = Canned::new(vec![
            (
                1,
                "conntrack v1.4.7 (conntrack-tools): Operation failed: Device or resource busy\n",
            ),
            (0, DELETED_0),
            (0, DELETED_0),
        ]);
        assert_eq!(remove_flows(&r, "fd00::1".parse().unwrap()).unwrap(), 0);
        assert_eq!(r.calls.lock().unwrap()[0][2], "ipv6");

        let busy =
            "conntrack v1.4.7 (conntrack-tools): Operation failed: Device or resource busy\n";
        let r = Canned::new(vec![(1, busy), (1, busy), (1, busy)]);
        let err = remove_flows(&r, "10.0.0.1".parse().unwrap())
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("--orig-src 10.0.0.1")
                && err.contains("3 attempts")
                && err.contains("busy"),
            "{err}"
        );
    }
}
