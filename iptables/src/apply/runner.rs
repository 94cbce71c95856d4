//! The applier's only door to the outside world: running a program with optional stdin.
//!
//! [`ExecRunner`] is the real implementation (std::process, no shell). It can run every command
//! inside a named network namespace (`ip netns exec <ns> …`), which is how the root tests isolate
//! themselves from the host.

use std::io::Write;
use std::process::{Command, Output, Stdio};

/// A program could not be run at all (as opposed to running and exiting non-zero).
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error("cannot run {program}: {source}")]
    Spawn {
        program: String,
        source: std::io::Error,
    },
    #[error("cannot feed stdin of {program}: {source}")]
    Stdin {
        program: String,
        source: std::io::Error,
    },
    #[error("invalid network namespace name {0:?}")]
    BadNetns(String),
}

/// Runs programs. Implementations must not go through a shell.
pub trait Runner: Send + Sync {
    /// Runs `program args…`, feeding `stdin` if given, and waits for it to exit.
    fn run(&self, program: &str, args: &[&str], stdin: Option<&[u8]>) -> Result<Output, RunError>;

    /// The network namespace the programs run in when it is not the caller's own (sockets the
    /// applier opens itself would not see its tables).
    fn netns(&self) -> Option<&str> {
        None
    }
}

/// Runs programs with std::process, optionally inside `ip netns exec <netns>`.
#[derive(Debug, Clone, Default)]
pub struct ExecRunner {
    netns: Option<String>,
}

impl ExecRunner {
    /// Runs commands in the caller's own network namespace.
    pub fn new() -> Self {
        ExecRunner { netns: None }
    }

    /// Runs every command as `ip netns exec <netns> <program> …`.
    pub fn in_netns(netns: &str) -> Result<Self, RunError> {
        let ok = !netns.is_empty()
            && netns.len() <= 64
            && netns
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
            && !netns.starts_with('.');
        if !ok {
            return Err(RunError::BadNetns(netns.to_string()));
        }
        Ok(ExecRunner {
            netns: Some(netns.to_string()),
        })
    }
}

impl Runner for ExecRunner {
    fn netns(&self) -> Option<&str> {
        self.netns.as_deref()
    }

    fn run(&self, program: &str, args: &[&str], stdin: Option<&[u8]>) -> Result<Output, RunError> {
        let started = std::time::Instant::now();
        let res = self.run_untimed(program, args, stdin);
        // The program's share of an apply (profiles of one change line it up with the stages).
        tracing::debug!(
            program,
            stdin_bytes = stdin.map_or(0, <[u8]>::len),
            took_us = started.elapsed().as_micros() as u64,
            "ran"
        );
        res
    }
}

impl ExecRunner {
    fn run_untimed(
        &self,
        program: &str,
        args: &[&str],
        stdin: Option<&[u8]>,
    ) -> Result<Output, RunError> {
        let mut cmd = match &self.netns {
            Some(ns) => {
                let mut c = Command::new("ip");
                c.args(["netns", "exec", ns, program]);
                c
            }
            None => Command::new(program),
        };
        cmd.args(args)
            .stdin(if stdin.is_some() {
                Stdio::piped()
            } else {
                Stdio::null()
            })
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let spawn_err = |source| RunError::Spawn {
            program: program.to_string(),
            source,
        };
        let mut child = cmd.spawn().map_err(spawn_err)?;
        if let Some(input) = stdin {
            let mut pipe = child.stdin.take().expect("stdin was piped");
            // Feed stdin from a thread so a child that fills its stdout pipe before reading all
            // of its input cannot deadlock us.
            let input = input.to_vec();
            let writer = std::thread::spawn(move || pipe.write_all(&input));
            let out = child.wait_with_output().map_err(spawn_err)?;
            match writer.join() {
                Ok(Ok(())) => {}
                // A child that exits early (bad line) closes its stdin: report its own error.
                Ok(Err(e)) if e.kind() == std::io::ErrorKind::BrokenPipe => {}
                Ok(Err(source)) => {
                    return Err(RunError::Stdin {
                        program: program.to_string(),
                        source,
                    });
                }
                Err(_) => {
                    return Err(RunError::Stdin {
                        program: program.to_string(),
                        source: std::io::Error::other("stdin writer panicked"),
                    });
                }
            }
            Ok(out)
        } else {
            child.wait_with_output().map_err(spawn_err)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn netns_names_are_validated() {
        assert!(ExecRunner::in_netns("fxt-1-2").is_ok());
        for bad in ["", "a b", "../x", "x;rm", ".hidden"] {
            assert!(ExecRunner::in_netns(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn exec_runner_feeds_stdin_and_captures_output() {
        let out = ExecRunner::new().run("cat", &[], Some(b"hello\n")).unwrap();
        assert!(out.status.success());
        assert_eq!(out.stdout, b"hello\n");
        let err = ExecRunner::new().run("/nonexistent-felixrs-binary", &[], None);
        assert!(matches!(err, Err(RunError::Spawn { .. })));
    }
}
