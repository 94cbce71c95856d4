//! The dry run: what an apply would write to a kernel with nothing of ours in it.

use std::collections::BTreeMap;

use super::diff::{plan_table, render};
use super::ipset::plan_updates;
use super::{DesiredError, DesiredState, IpVersion, TableName};
use crate::parse::ActualTable;

/// The payloads an apply of one family would write to a kernel with nothing of ours in it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Preview {
    pub family: IpVersion,
    /// The phase-1 `ipset restore` payload ("" when there are no sets).
    pub ip_sets: String,
    /// One `iptables-restore --noflush` payload per table that gets anything, in table order.
    pub tables: Vec<(TableName, String)>,
}

impl Preview {
    /// Plans every set and table of `desired` against an empty kernel; validates exactly as an
    /// apply does.
    pub fn plan(desired: &DesiredState) -> Result<Self, DesiredError> {
        let sets = plan_updates(desired.family, &desired.ip_sets, &BTreeMap::new())?;
        let empty = ActualTable::default();
        let mut tables = Vec::new();
        for table in TableName::ALL {
            let ops = plan_table(table, desired.tables.get(&table), &empty)?;
            if !ops.is_empty() {
                tables.push((table, render(table, &ops)));
            }
        }
        Ok(Preview {
            family: desired.family,
            ip_sets: sets.payload,
            tables,
        })
    }

    /// The `# ipset restore (IPv4)` header line.
    pub fn ip_sets_header(&self) -> String {
        format!("# ipset restore (IPv{})\n", self.family.number())
    }

    /// The `# iptables-restore --noflush (IPv4, filter)` header line of `table`.
    pub fn table_header(&self, table: TableName) -> String {
        format!(
            "# iptables-restore --noflush (IPv{}, {table})\n",
            self.family.number()
        )
    }

    /// Every table's payload under its header line.
    pub fn tables_text(&self) -> String {
        let mut out = String::new();
        for (table, payload) in &self.tables {
            out.push_str(&self.table_header(*table));
            out.push_str(payload);
        }
        out
    }
}

/// What an apply would write to a kernel with nothing of ours in it: the phase-1 `ipset restore`
/// payload (if any), then one `iptables-restore --noflush` transaction per table, each preceded by
/// a `# …` header line naming the tool (for `felixrs render`-style dry runs). Validates exactly as
/// an apply does.
pub fn preview(desired: &DesiredState) -> Result<String, DesiredError> {
    let p = Preview::plan(desired)?;
    let mut out = String::new();
    if !p.ip_sets.is_empty() {
        out.push_str(&p.ip_sets_header());
        out.push_str(&p.ip_sets);
    }
    out.push_str(&p.tables_text());
    Ok(out)
}
