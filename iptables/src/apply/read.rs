//! Turning `iptables-save` output into the applier's kernel view.
//!
//! Uses the tolerant line scan of [`super::kernel::scan_save`]: the applier needs only chain
//! names, first comments and jump targets, and must not be stopped by a foreign rule it cannot
//! fully understand.

use std::collections::BTreeMap;

use super::desired::TableName;
use super::kernel::{ActualTable, scan_save};

/// Every table in a save, as the applier sees it.
pub fn read_tables(text: &str) -> BTreeMap<TableName, ActualTable> {
    scan_save(text)
}
