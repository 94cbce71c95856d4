//! Errors of the applier. Every variant names what failed: the table, chain, set or payload line.

use super::runner::RunError;
use crate::desired::{DesiredError, TableName};

/// Why an apply (or a read of the kernel state) failed.
#[derive(Debug, thiserror::Error)]
pub enum ApplyError {
    /// The desired state itself is refused (nothing was written).
    #[error(transparent)]
    Invalid(#[from] DesiredError),
    #[error("desired state is for IPv{desired} but this applier writes IPv{applier}")]
    FamilyMismatch { applier: u8, desired: u8 },
    #[error(transparent)]
    Run(#[from] RunError),
    #[error("reading {what} with {program} failed: {detail}")]
    Read {
        /// `table filter` or `all tables`.
        what: String,
        program: String,
        detail: String,
    },
    #[error("reading ip sets failed: {detail}")]
    ReadIpSets { detail: String },
    #[error(
        "writing table {table} failed after {attempts} attempts{}: {stderr}",
        line_suffix(*line, line_text.as_deref())
    )]
    Restore {
        table: TableName,
        attempts: u32,
        /// 1-based line of the payload iptables-restore blamed, if it said.
        line: Option<usize>,
        line_text: Option<String>,
        stderr: String,
    },
    #[error(
        "writing ip sets ({phase}) failed after {attempts} attempts{}: {stderr}",
        line_suffix(*line, line_text.as_deref())
    )]
    IpSetRestore {
        phase: &'static str,
        attempts: u32,
        line: Option<usize>,
        line_text: Option<String>,
        stderr: String,
    },
    #[error(
        "ip set {set} must change type from {from} to {to} while the kernel still references it; \
         the kernel cannot swap sets of different types"
    )]
    IpSetTypeInUse {
        set: String,
        from: String,
        to: String,
    },
}

fn line_suffix(line: Option<usize>, text: Option<&str>) -> String {
    match (line, text) {
        (Some(n), Some(t)) => format!(" at payload line {n} `{t}`"),
        (Some(n), None) => format!(" at payload line {n}"),
        _ => String::new(),
    }
}

/// Finds the payload line a restore tool blamed: iptables-restore says `line N failed` or
/// `Error occurred at line: N`; ipset says `Error in line N:`.
pub fn failed_line(stderr: &str) -> Option<usize> {
    for marker in ["Error occurred at line: ", "line ", "Error in line "] {
        for (i, _) in stderr.match_indices(marker) {
            let rest = &stderr[i + marker.len()..];
            let digits: String = rest.chars().take_while(|c| c.is_ascii_digit()).collect();
            if let Ok(n) = digits.parse::<usize>() {
                return Some(n);
            }
        }
    }
    None
}

/// The payload line to blame for a failed restore: the line the tool named, except that
/// iptables-nft reports errors found at commit time against `COMMIT`; then the first line that
/// mentions the chain or set the message quotes (`Chain 'X' does not exist`, `Set X doesn't
/// exist`) is more useful.
pub fn blame(payload: &str, stderr: &str) -> (Option<usize>, Option<String>) {
    let line = failed_line(stderr);
    let text = line.and_then(|n| payload_line(payload, n));
    if text.as_deref() == Some("COMMIT") {
        let named = stderr.split('\'').nth(1).or_else(|| {
            stderr
                .split("Set ")
                .nth(1)
                .and_then(|r| r.split(' ').next())
        });
        if let Some(name) = named.filter(|n| !n.is_empty())
            && let Some((i, l)) = payload
                .lines()
                .enumerate()
                .find(|(_, l)| l.split(' ').any(|tok| tok == name))
        {
            return (Some(i + 1), Some(l.to_string()));
        }
    }
    (line, text)
}

/// The tool's message without its usage hint.
pub fn clean_stderr(stderr: &str) -> String {
    stderr
        .lines()
        .filter(|l| !l.starts_with("Try `") && !l.trim().is_empty())
        .collect::<Vec<_>>()
        .join("; ")
}

/// The text of 1-based `line` of `payload`.
pub fn payload_line(payload: &str, line: usize) -> Option<String> {
    line.checked_sub(1)
        .and_then(|i| payload.lines().nth(i))
        .map(str::to_string)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn failed_line_reads_all_tool_formats() {
        assert_eq!(failed_line("iptables-restore: line 2 failed\n"), Some(2));
        assert_eq!(
            failed_line(
                "iptables-restore v1.8.9 (legacy): Set nope doesn't exist.\n\nError occurred at line: 7\nTry"
            ),
            Some(7)
        );
        assert_eq!(
            failed_line("iptables-nft-restore: line 12 failed: Index of deletion too big."),
            Some(12)
        );
        assert_eq!(
            failed_line("ipset v7.17: Error in line 3: Syntax error"),
            Some(3)
        );
        assert_eq!(failed_line("something else"), None);
    }

    #[test]
    fn nft_commit_errors_blame_the_line_naming_the_chain() {
        let payload = "*filter\n:cali-a - [0:0]\n-A cali-a -j NOPE\nCOMMIT\n";
        let stderr = "iptables-nft-restore v1.8.9 (nf_tables): Chain 'NOPE' does not exist\n\
                      Error occurred at line: 4\nTry `iptables-nft-restore -h' for more information.";
        assert_eq!(
            blame(payload, stderr),
            (Some(3), Some("-A cali-a -j NOPE".to_string()))
        );
        assert_eq!(
            clean_stderr(stderr),
            "iptables-nft-restore v1.8.9 (nf_tables): Chain 'NOPE' does not exist; Error occurred at line: 4"
        );
    }

    #[test]
    fn restore_error_names_table_and_line() {
        let payload = "*filter\n-A cali-x -j FOO\nCOMMIT\n";
        let e = ApplyError::Restore {
            table: TableName::Filter,
            attempts: 5,
            line: Some(2),
            line_text: payload_line(payload, 2),
            stderr: "Couldn't load target `FOO'".into(),
        };
        let s = e.to_string();
        assert!(
            s.contains("table filter") && s.contains("line 2 `-A cali-x -j FOO`"),
            "{s}"
        );
    }
}
