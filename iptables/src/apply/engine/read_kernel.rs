//! The [`Applier`]'s reads of the kernel: the tables (this backend's, seeded or saved, and the
//! other backend's for the sweep) and our IP sets, concurrently, and a set's reference count.
//! A full read keeps its save text in the view until the next apply has checked the bodies of
//! our rules against its desired state ([`super::super::drift::verify_bodies`]).

use super::*;

impl<R: Runner> Applier<R> {
    /// The tables and our sets, and the `other` backend's tables when asked, read concurrently
    /// (programs whose time is most of a restart's). A failed read of the other backend is
    /// returned as such, for the sweep to log.
    #[allow(clippy::type_complexity)]
    pub(super) fn read_all(
        &self,
        mode: Mode,
        seed: Option<String>,
        other: Option<Mode>,
    ) -> Result<
        (
            KernelView,
            Option<Result<BTreeMap<TableName, ActualTable>, ApplyError>>,
        ),
        ApplyError,
    > {
        let (tables, sets, other_tables) = std::thread::scope(|s| {
            let sets = s.spawn(|| self.read_sets());
            let other = other.map(|m| s.spawn(move || self.read_iptables(m, None)));
            let save = match seed {
                Some(text) if !text.contains(INCOMPATIBLE) => Ok(text),
                _ => self.save_text(mode, None),
            };
            (save, join(sets), other.map(join))
        });
        let save = tables?;
        Ok((
            KernelView {
                tables: read_tables(&save),
                sets: sets?,
                unverified: Some(save),
            },
            other_tables,
        ))
    }

    /// Tables from a whole save detection read; a save that would fail [`Self::read_iptables`]'s
    /// checks is not trusted: the kernel is read again, and that read reports the error.
    pub(super) fn seeded_tables(
        &self,
        mode: Mode,
        text: String,
    ) -> Result<BTreeMap<TableName, ActualTable>, ApplyError> {
        if text.contains(INCOMPATIBLE) {
            return self.read_iptables(mode, None);
        }
        Ok(read_tables(&text))
    }

    /// Runs a `*-save` program, counting it.
    pub(super) fn run_save(
        &self,
        program: &str,
        args: &[&str],
    ) -> Result<std::process::Output, ApplyError> {
        self.saves.fetch_add(1, Ordering::Relaxed);
        Ok(self.runner.run(program, args, None)?)
    }

    pub(super) fn read_iptables(
        &self,
        mode: Mode,
        table: Option<TableName>,
    ) -> Result<BTreeMap<TableName, ActualTable>, ApplyError> {
        Ok(read_tables(&self.save_text(mode, table)?))
    }

    /// This backend's save of `table` (all tables: `None`), checked as every read is.
    pub(super) fn save_text(
        &self,
        mode: Mode,
        table: Option<TableName>,
    ) -> Result<String, ApplyError> {
        let program = mode.save_program(self.config.family);
        let args: Vec<&str> = match table {
            Some(t) => vec!["-t", t.as_str()],
            None => vec![],
        };
        let out = self.run_save(&program, &args)?;
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        let stderr = String::from_utf8_lossy(&out.stderr);
        // iptables-nft-save exits 0 for tables it cannot represent (felix-reference §6.2).
        if !out.status.success() || text.contains(INCOMPATIBLE) {
            return Err(ApplyError::Read {
                what: table.map_or("all tables".to_string(), |t| format!("table {t}")),
                program,
                detail: format!("{} {}", out.status, stderr.trim()),
            });
        }
        Ok(text)
    }

    pub(super) fn read_sets(&self) -> Result<BTreeMap<String, ActualSet>, ApplyError> {
        let family = self.config.family;
        let out = self.run_save("ipset", &["save"])?;
        if out.status.success() {
            return Ok(parse_ipset_save(
                family,
                &String::from_utf8_lossy(&out.stdout),
            ));
        }
        // A foreign set the tool cannot list must not stop us: list ours one by one.
        let names = self.runner.run("ipset", &["list", "-n"], None)?;
        if !names.status.success() {
            return Err(ApplyError::ReadIpSets {
                detail: String::from_utf8_lossy(&names.stderr).trim().to_string(),
            });
        }
        let mut sets = BTreeMap::new();
        for name in String::from_utf8_lossy(&names.stdout).lines() {
            if !crate::desired::is_our_set(family, name) {
                continue;
            }
            let one = self.run_save("ipset", &["save", name])?;
            if !one.status.success() {
                return Err(ApplyError::ReadIpSets {
                    detail: format!(
                        "ipset save {name}: {}",
                        String::from_utf8_lossy(&one.stderr).trim()
                    ),
                });
            }
            sets.extend(parse_ipset_save(
                family,
                &String::from_utf8_lossy(&one.stdout),
            ));
        }
        Ok(sets)
    }

    /// `References: N` of a set (0 if the set is gone).
    pub(super) fn set_references(&self, name: &str) -> Result<u64, ApplyError> {
        let out = self.runner.run("ipset", &["list", "-t", name], None)?;
        Ok(String::from_utf8_lossy(&out.stdout)
            .lines()
            .find_map(|l| l.strip_prefix("References: "))
            .and_then(|n| n.trim().parse().ok())
            .unwrap_or(0))
    }
}
