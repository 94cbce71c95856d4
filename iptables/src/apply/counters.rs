//! Reading the kernel's rule counters (`iptables-save -c -t filter`) for [`crate::stats`]
//! (scanned by [`crate::parse::scan_counters`]).
//!
//! A plain save through the [`Runner`]: it takes no lock and never waits for the applier, so a
//! counter read never blocks an apply (and an apply never waits for it).

use super::backend::Mode;
use super::error::ApplyError;
use super::runner::Runner;
use crate::desired::IpVersion;

/// The filter table of `family` in backend `mode`, with counters.
pub fn read_filter_counters(
    runner: &dyn Runner,
    mode: Mode,
    family: IpVersion,
) -> Result<String, ApplyError> {
    let program = mode.save_program(family);
    let out = runner.run(&program, &["-c", "-t", "filter"], None)?;
    if !out.status.success() {
        return Err(ApplyError::Read {
            what: "table filter with counters".into(),
            program,
            detail: format!(
                "{} {}",
                out.status,
                String::from_utf8_lossy(&out.stderr).trim()
            ),
        });
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}
