//! What the operator commands share; each piece imports only the ones below it, never a command.
//!
//! * [`node_view`]: `--manifests`/`--state-dir` ([`node_view::SourceArgs`]) and the node's objects
//!   rendered as the agent would ([`node_view::NodeView`]): `render`, `trace`, `stats`, `flows`.
//! * [`pods`]: which pod is this address, for `trace` and `flows`.
//! * [`dataplane_args`]: the dataplane flags (mark mask, interface prefixes, ...) the agent and
//!   the commands share, so a command shows what the agent with the same flags programs.
//! * [`Answer`] and [`finish`]: how a command prints its answer or error and exits.

pub mod dataplane_args;
pub mod node_view;
pub mod pods;

use std::process::ExitCode;

/// What a command prints: one stderr line per object it skipped or rendered fail-closed, then its
/// text on stdout; and its exit status.
#[derive(Debug, Default)]
pub struct Answer {
    pub text: String,
    pub problems: Vec<String>,
    /// 0, or 2 when `trace` found the kernel different.
    pub status: u8,
}

/// Prints `felixrs <command>`'s answer, or its error on stderr (exit status 1).
pub fn finish(command: &str, answer: anyhow::Result<Answer>) -> ExitCode {
    finish_with(command, answer, 1)
}

/// [`finish`] with the exit status of an error (`preview`'s is 2: its 1 means "changes found").
pub fn finish_with(command: &str, answer: anyhow::Result<Answer>, error_status: u8) -> ExitCode {
    match answer {
        Ok(a) => {
            for p in &a.problems {
                eprintln!("felixrs {command}: {p}");
            }
            print!("{}", a.text);
            ExitCode::from(a.status)
        }
        Err(e) => {
            eprintln!("felixrs {command}: {e:#}");
            ExitCode::from(error_status)
        }
    }
}
