//! [`RestoreWriter`]: builds `iptables-restore` payloads (full or `--noflush`) line by line.
//!
//! Every line is made from validated model values, so names and comments cannot inject options or
//! extra commands. Rule positions are 1-based as in iptables.

use std::num::NonZeroU32;

use super::{Chain, ChainName, Rule, Table, TableName};

/// Accumulates restore text; [`RestoreWriter::finish`] returns it.
#[derive(Clone, Debug, Default)]
pub struct RestoreWriter {
    out: String,
}

impl RestoreWriter {
    pub fn new() -> Self {
        Self::default()
    }

    fn line(&mut self, parts: &[&str]) -> &mut Self {
        for (i, p) in parts.iter().enumerate() {
            if i > 0 {
                self.out.push(' ');
            }
            self.out.push_str(p);
        }
        self.out.push('\n');
        self
    }

    /// `*table`.
    pub fn begin_table(&mut self, table: TableName) -> &mut Self {
        self.out.push('*');
        self.line(&[table.as_str()])
    }

    /// `COMMIT`.
    pub fn commit(&mut self) -> &mut Self {
        self.line(&["COMMIT"])
    }

    /// A whole table section (`*t`, chains, rules, `COMMIT`).
    pub fn table(&mut self, table: &Table) -> &mut Self {
        table.render_into(&mut self.out);
        self
    }

    /// `:NAME POLICY [p:b]` (in `--noflush` mode this creates the chain if needed and flushes it).
    pub fn declare_chain(&mut self, chain: &Chain) -> &mut Self {
        chain.render_into(&mut self.out);
        self.out.push('\n');
        self
    }

    /// `-N NAME`.
    pub fn new_chain(&mut self, name: &ChainName) -> &mut Self {
        self.line(&["-N", name.as_str()])
    }

    /// `-F NAME`.
    pub fn flush_chain(&mut self, name: &ChainName) -> &mut Self {
        self.line(&["-F", name.as_str()])
    }

    /// `-X NAME`.
    pub fn delete_chain(&mut self, name: &ChainName) -> &mut Self {
        self.line(&["-X", name.as_str()])
    }

    /// `-A CHAIN spec` (counters, if any, are not written).
    pub fn append(&mut self, rule: &Rule) -> &mut Self {
        self.out.push_str("-A ");
        self.out.push_str(rule.chain.as_str());
        rule.render_spec_into(&mut self.out);
        self.out.push('\n');
        self
    }

    /// `-I CHAIN pos spec`.
    pub fn insert(&mut self, position: NonZeroU32, rule: &Rule) -> &mut Self {
        self.positioned("-I", position, rule)
    }

    /// `-R CHAIN pos spec`.
    pub fn replace(&mut self, position: NonZeroU32, rule: &Rule) -> &mut Self {
        self.positioned("-R", position, rule)
    }

    /// `-D CHAIN pos`.
    pub fn delete_at(&mut self, chain: &ChainName, position: NonZeroU32) -> &mut Self {
        self.line(&["-D", chain.as_str(), &position.to_string()])
    }

    /// `-D CHAIN spec` (delete the first rule with exactly this spec).
    pub fn delete_rule(&mut self, rule: &Rule) -> &mut Self {
        self.out.push_str("-D ");
        self.out.push_str(rule.chain.as_str());
        rule.render_spec_into(&mut self.out);
        self.out.push('\n');
        self
    }

    fn positioned(&mut self, cmd: &str, position: NonZeroU32, rule: &Rule) -> &mut Self {
        self.out.push_str(cmd);
        self.out.push(' ');
        self.out.push_str(rule.chain.as_str());
        self.out.push(' ');
        self.out.push_str(&position.to_string());
        rule.render_spec_into(&mut self.out);
        self.out.push('\n');
        self
    }

    /// The text so far.
    pub fn as_str(&self) -> &str {
        &self.out
    }

    pub fn finish(self) -> String {
        self.out
    }
}
