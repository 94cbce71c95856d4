//! Which iptables backend holds the host's rules (legacy or nf_tables), and the binaries and lock
//! options for it.
//!
//! Detection follows Felix's `DetectBackend` (§6.8 of the reference), reading through the
//! [`Runner`] so it sees the same network namespace the applier writes to:
//! 1. kubelet's canary chains (`KUBE-IPTABLES-HINT`, `KUBE-KUBELET-CANARY`) in the nft mangle
//!    tables (`ip6tables-nft-save -t mangle`, then `iptables-nft-save -t mangle`) choose nft;
//! 2. then the same chains in the legacy mangle tables choose legacy. Felix reads them when
//!    `/proc/net/ip{,6}_tables_names` exists; we read them only when that file *lists* `mangle`,
//!    because `ip*tables-legacy-save -t mangle` on a namespace without a legacy mangle table would
//!    create one (a table without one cannot hold a hint chain, so the answer is the same);
//! 3. otherwise the backend with more rule lines in full saves (both families) wins;
//! 4. a tie (typically: no rules at all) goes to what plain `iptables -V` is, so a fresh host uses
//!    its distribution default. Felix picks legacy there (calico#5760), which on an nft-default
//!    host puts our rules in the backend kube-proxy and the distribution's tools do not use.
//!
//! Only nft saves, legacy saves of tables the kernel already lists, and whole legacy saves are
//! read, so detection never instantiates a legacy table. When step 3 runs, the full saves it read
//! are kept in the [`Detection`] so the first apply can seed its kernel view from them
//! ([`super::Applier::use_detection`]) instead of saving the same backend and family again.

use super::desired::IpVersion;
use super::error::ApplyError;
use super::runner::Runner;

/// The user's choice.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Backend {
    #[default]
    Auto,
    Legacy,
    Nft,
}

/// A resolved backend.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    Legacy,
    Nft,
}

/// Seconds iptables-restore waits for the xtables lock.
pub const LOCK_WAIT_SECS: &str = "10";

impl Mode {
    /// The other backend (whose leftovers of ours get swept, §6.8 "cleanup across backends").
    pub fn other(self) -> Mode {
        match self {
            Mode::Legacy => Mode::Nft,
            Mode::Nft => Mode::Legacy,
        }
    }

    fn infix(self) -> &'static str {
        match self {
            Mode::Legacy => "legacy",
            Mode::Nft => "nft",
        }
    }

    fn base(family: IpVersion) -> &'static str {
        match family {
            IpVersion::V4 => "iptables",
            IpVersion::V6 => "ip6tables",
        }
    }

    /// `iptables-legacy-save`, `ip6tables-nft-save`, ….
    pub fn save_program(self, family: IpVersion) -> String {
        format!("{}-{}-save", Self::base(family), self.infix())
    }

    /// `iptables-legacy-restore`, `ip6tables-nft-restore`, ….
    pub fn restore_program(self, family: IpVersion) -> String {
        format!("{}-{}-restore", Self::base(family), self.infix())
    }

    /// Arguments for a `--noflush` write holding the xtables lock. Since iptables 1.8.? the wait
    /// is a blocking `flock` and both backends print "Ignoring deprecated --wait-interval option"
    /// for `-W`, so only `-w <secs>` is passed (iptables-nft accepts it and needs no lock).
    pub fn restore_args(self) -> &'static [&'static str] {
        &["--noflush", "-w", LOCK_WAIT_SECS]
    }
}

/// Canary chains kubelet creates in the backend it uses.
const KUBELET_HINTS: [&str; 2] = ["KUBE-IPTABLES-HINT", "KUBE-KUBELET-CANARY"];

/// How auto-detection decided.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reason {
    /// The user chose the backend.
    Configured,
    /// A kubelet hint chain in an nft mangle table.
    NftHint,
    /// A kubelet hint chain in a legacy mangle table.
    LegacyHint,
    /// More rule lines in that backend's full saves.
    RuleCount,
    /// Equal rule counts: `iptables -V` decided.
    Default,
}

/// The outcome of [`detect`]: the backend, why, and the full saves read on the way (only when
/// the rule-count fallback ran), keyed by backend and family.
#[derive(Debug, Clone)]
pub struct Detection {
    pub mode: Mode,
    pub reason: Reason,
    saves: Vec<(Mode, IpVersion, String)>,
}

impl Detection {
    /// A resolved backend without any save text.
    pub fn configured(mode: Mode) -> Self {
        Detection {
            mode,
            reason: Reason::Configured,
            saves: Vec::new(),
        }
    }

    /// The full save of `mode` for `family` that detection read (only successful saves kept).
    pub fn save(&self, mode: Mode, family: IpVersion) -> Option<&str> {
        self.saves
            .iter()
            .find(|(m, f, _)| *m == mode && *f == family)
            .map(|(_, _, t)| t.as_str())
    }

    /// `*-save` programs detection ran.
    pub fn saves_run(&self) -> usize {
        self.saves.len()
    }
}

/// Resolves `backend` for the namespace `runner` works in.
pub fn resolve(runner: &dyn Runner, backend: Backend) -> Result<Mode, ApplyError> {
    detect(runner, backend).map(|d| d.mode)
}

/// Resolves `backend`, keeping the full saves the fallback read (see the module docs).
pub fn detect(runner: &dyn Runner, backend: Backend) -> Result<Detection, ApplyError> {
    match backend {
        Backend::Legacy => return Ok(Detection::configured(Mode::Legacy)),
        Backend::Nft => return Ok(Detection::configured(Mode::Nft)),
        Backend::Auto => {}
    }
    let found = |reason, mode| {
        Ok(Detection {
            mode,
            reason,
            saves: Vec::new(),
        })
    };
    let families = [IpVersion::V6, IpVersion::V4];
    if families.iter().any(|&f| {
        has_hint(&output(
            runner,
            &Mode::Nft.save_program(f),
            &["-t", "mangle"],
        ))
    }) {
        return found(Reason::NftHint, Mode::Nft);
    }
    if families.iter().any(|&f| {
        legacy_has_mangle(runner, f)
            && has_hint(&output(
                runner,
                &Mode::Legacy.save_program(f),
                &["-t", "mangle"],
            ))
    }) {
        return found(Reason::LegacyHint, Mode::Legacy);
    }
    // The full saves, one thread per family (the big nft saves are the restart's main cost).
    let saves: Vec<(Mode, IpVersion, String)> = std::thread::scope(|s| {
        let v6 = s.spawn(|| full_saves(runner, IpVersion::V6));
        let mut all = full_saves(runner, IpVersion::V4);
        all.extend(v6.join().unwrap_or_default());
        all
    });
    let count = |mode| {
        saves
            .iter()
            .filter(|(m, _, _)| *m == mode)
            .map(|(_, _, t)| count_rules(t))
            .sum::<usize>()
    };
    let (n, l) = (count(Mode::Nft), count(Mode::Legacy));
    if n != l {
        let mode = if n > l { Mode::Nft } else { Mode::Legacy };
        return Ok(Detection {
            mode,
            reason: Reason::RuleCount,
            saves,
        });
    }
    let version = runner.run("iptables", &["-V"], None)?;
    let mode = if String::from_utf8_lossy(&version.stdout).contains("nf_tables") {
        Mode::Nft
    } else {
        Mode::Legacy
    };
    Ok(Detection {
        mode,
        reason: Reason::Default,
        saves,
    })
}

/// Whole saves of both backends for `family`; a missing binary or a failed save counts as no
/// rules (and is not kept).
fn full_saves(runner: &dyn Runner, family: IpVersion) -> Vec<(Mode, IpVersion, String)> {
    let mut out = Vec::new();
    for mode in [Mode::Nft, Mode::Legacy] {
        if let Ok(o) = runner.run(&mode.save_program(family), &[], None)
            && o.status.success()
        {
            out.push((
                mode,
                family,
                String::from_utf8_lossy(&o.stdout).into_owned(),
            ));
        }
    }
    out
}

fn has_hint(text: &str) -> bool {
    KUBELET_HINTS.iter().any(|h| text.contains(h))
}

/// Standard output of a successful run; empty if the program is missing or failed (a missing
/// table or binary holds no hint).
fn output(runner: &dyn Runner, program: &str, args: &[&str]) -> String {
    match runner.run(program, args, None) {
        Ok(out) if out.status.success() => String::from_utf8_lossy(&out.stdout).into_owned(),
        _ => String::new(),
    }
}

/// The kernel lists a legacy mangle table for `family` in this namespace.
fn legacy_has_mangle(runner: &dyn Runner, family: IpVersion) -> bool {
    let file = match family {
        IpVersion::V4 => "/proc/net/ip_tables_names",
        IpVersion::V6 => "/proc/net/ip6_tables_names",
    };
    output(runner, "cat", &[file])
        .lines()
        .any(|l| l.trim() == "mangle")
}

/// Rule lines (`-A …`) in a save.
pub fn count_rules(save: &str) -> usize {
    save.lines().filter(|l| l.starts_with('-')).count()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn program_names_and_lock_args() {
        assert_eq!(
            Mode::Legacy.save_program(IpVersion::V4),
            "iptables-legacy-save"
        );
        assert_eq!(
            Mode::Nft.restore_program(IpVersion::V6),
            "ip6tables-nft-restore"
        );
        assert!(!Mode::Legacy.restore_args().contains(&"-W"));
        assert!(Mode::Nft.restore_args().contains(&"-w"));
    }

    #[test]
    fn counts_rule_lines_only() {
        assert_eq!(
            count_rules("*filter\n:INPUT ACCEPT [0:0]\n-A INPUT -j ACCEPT\nCOMMIT\n"),
            1
        );
    }
}
