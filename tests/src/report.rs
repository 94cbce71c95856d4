//! PASS/FAIL bookkeeping of the end-to-end runs: a line per case as it finishes (with the failures
//! indented under it), and the counts for the closing `N passed, M failed` line.

use anyhow::Result;

/// Counts of the cases recorded so far.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Tally {
    pub passed: usize,
    pub failed: usize,
}

impl Tally {
    /// Prints `PASS name` or `FAIL name` with each failure (or the error) and counts the case.
    pub fn record(&mut self, name: &str, result: Result<Vec<String>>) {
        match result {
            Ok(f) if f.is_empty() => {
                self.passed += 1;
                println!("PASS {name}");
            }
            Ok(f) => {
                self.failed += 1;
                println!("FAIL {name}");
                for line in f {
                    println!("    {line}");
                }
            }
            Err(e) => {
                self.failed += 1;
                println!("FAIL {name}: {e:#}");
            }
        }
    }
}

/// Asserts that a comparison over every case found no mismatch (else it lists them all, with their
/// count) and checked more than `min` cells.
#[track_caller]
pub fn assert_no_mismatches((bad, checked): (Vec<String>, usize), min: usize) {
    assert!(
        bad.is_empty(),
        "{} of {checked}:\n{}",
        bad.len(),
        bad.join("\n")
    );
    assert!(checked > min, "only {checked} cells checked");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn failures_and_errors_count_as_failed() {
        let mut t = Tally::default();
        t.record("a", Ok(vec![]));
        t.record("b", Ok(vec!["x -> y: expected deny, got allow".into()]));
        t.record("c", Err(anyhow::anyhow!("agent did not start")));
        assert_eq!(
            t,
            Tally {
                passed: 1,
                failed: 2
            }
        );
    }
}
