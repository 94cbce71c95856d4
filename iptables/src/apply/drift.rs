//! Fast drift detection: a few chains listed on a short interval instead of the whole table.
//!
//! The periodic full refresh (re-read everything, repair) stays the backstop; between two, the
//! chains through which every packet enters our rules are checked: the kernel chains holding
//! our hooks (`INPUT`, `FORWARD`, `OUTPUT` of filter; mangle `POSTROUTING` with the DNS hold) and
//! our root chains (`cali-INPUT`, `cali-FORWARD`, `cali-OUTPUT`; mangle `cali-POSTROUTING`). Each is listed with `iptables -S CHAIN` (one chain printed, not
//! the table) and compared, by `cali:` ids and jump targets, with the applier's kernel view.
//! A chain that differs is put into the view as the kernel has it, and the next apply rewrites
//! exactly that chain (a displaced hook is deleted and re-inserted, a flushed or edited chain is
//! rewritten by position). A root chain of ours found empty or missing means someone flushed
//! or replaced the table wholesale: then everything is re-read (a full refresh). Our IP sets are
//! checked by their member counts (`ipset list -t`, headers only); a set whose count differs is
//! re-read and rewritten.

use super::backend::Mode;
use super::error::ApplyError;
use super::runner::Runner;
use crate::desired::{IpVersion, TableName, is_our_set};
use crate::parse::{ActualRule, read_tables};

/// The chains the fast check lists, per table.
/// mangle's are checked only when desired (the DNS hold of FQDN policy).
pub const CHECKED: [(TableName, &str); 8] = [
    (TableName::Filter, "FORWARD"),
    (TableName::Filter, "INPUT"),
    (TableName::Filter, "OUTPUT"),
    (TableName::Filter, "cali-FORWARD"),
    (TableName::Filter, "cali-INPUT"),
    (TableName::Filter, "cali-OUTPUT"),
    (TableName::Mangle, "POSTROUTING"),
    (TableName::Mangle, "cali-POSTROUTING"),
];

/// One chain as the kernel has it now; `None` when the chain does not exist.
pub fn list_chain(
    runner: &dyn Runner,
    mode: Mode,
    family: IpVersion,
    table: TableName,
    chain: &str,
) -> Result<Option<Vec<ActualRule>>, ApplyError> {
    let program = mode.list_program(family);
    let out = runner.run(
        &program,
        &["-w", "5", "-t", table.as_str(), "-S", chain],
        None,
    )?;
    if !out.status.success() {
        let stderr = String::from_utf8_lossy(&out.stderr);
        if stderr.contains("No chain") || stderr.contains("does not exist") {
            return Ok(None);
        }
        return Err(ApplyError::Read {
            what: format!("chain {chain} of table {table}"),
            program,
            detail: format!("{} {}", out.status, stderr.trim()),
        });
    }
    // `-S` prints `-P CHAIN POLICY` or `-N CHAIN`, then the rules as `-A CHAIN …` lines, quoted
    // as a save is: read them as a one-chain save.
    let mut save = format!("*{}\n:{chain} - [0:0]\n", table.as_str());
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        if line.starts_with("-A ") {
            save.push_str(line);
            save.push('\n');
        }
    }
    save.push_str("COMMIT\n");
    let mut tables = read_tables(&save);
    Ok(Some(
        tables
            .remove(&table)
            .and_then(|mut t| t.chains.remove(chain))
            .unwrap_or_default(),
    ))
}

/// Members per IP set of ours in family `family`, from the headers `ipset list -t` prints (one
/// process, no members listed): a flushed set, or members added or deleted, change the count.
pub fn set_sizes(
    runner: &dyn Runner,
    family: IpVersion,
) -> Result<std::collections::BTreeMap<String, usize>, ApplyError> {
    let out = runner.run("ipset", &["list", "-t"], None)?;
    if !out.status.success() {
        return Err(ApplyError::ReadIpSets {
            detail: String::from_utf8_lossy(&out.stderr).trim().to_string(),
        });
    }
    let mut sizes = std::collections::BTreeMap::new();
    let mut name: Option<String> = None;
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        if let Some(n) = line.strip_prefix("Name: ") {
            name = is_our_set(family, n.trim()).then(|| n.trim().to_string());
        } else if let (Some(n), Some(count)) = (&name, line.strip_prefix("Number of entries: "))
            && let Ok(c) = count.trim().parse()
        {
            sizes.insert(n.clone(), c);
        }
    }
    Ok(sizes)
}

/// What a rule is for the comparison: its id and jump target (foreign rules have no id).
pub fn same_rules(a: &[ActualRule], b: &[ActualRule]) -> bool {
    a.len() == b.len()
        && a.iter()
            .zip(b)
            .all(|(x, y)| x.hash == y.hash && x.target == y.target)
}

/// What one drift check found and did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DriftReport {
    /// Chains that differed from what we last wrote, `table/chain`.
    pub drifted: Vec<String>,
    /// A root chain of ours was gone or empty: everything was re-read and repaired.
    pub full_refresh: bool,
    /// `iptables -S` runs of the check.
    pub listings: u32,
    /// Our IP sets whose member count differed (re-read and repaired).
    pub sets: Vec<String>,
}
