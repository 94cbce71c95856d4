//! Which iptables backend holds the host's rules (legacy or nf_tables), and the binaries and lock
//! options for it.
//!
//! Detection follows Felix's `DetectBackend` (felix-reference §6.8), reading through the
//! [`Runner`] so it sees the same network namespace the applier writes to:
//! 1. kubelet's canary chains (`KUBE-IPTABLES-HINT`, `KUBE-KUBELET-CANARY`) in an nft mangle
//!    table (v6, then v4) choose nft;
//! 2. then the same chains in a legacy mangle table choose legacy;
//! 3. otherwise the backend with more rule lines in whole saves (both families) wins;
//! 4. a tie (typically: no rules at all) goes to what plain `iptables -V` is, so a fresh host uses
//!    its distribution default. Felix picks legacy there (calico#5760), which on an nft-default
//!    host puts our rules in the backend kube-proxy and the distribution's tools do not use.
//!
//! Felix runs `ip*tables-<mode>-save -t mangle` for steps 1–2 and whole saves for step 3. We
//! run the four whole saves (both backends, both families; v4 and v6 concurrently) up front and
//! read steps 1–2 from their `*mangle` sections, which is what `-t mangle` prints: the first apply
//! needs all four anyway (ours for its kernel view, the other backend's for the sweep), and with
//! iptables-nft a `-t mangle` save costs nearly as much as a whole one (it fetches the ruleset).
//! A whole legacy save lists only the tables `/proc/net/ip{,6}_tables_names` names (Felix's
//! step-2 guard), so detection never instantiates a legacy table. The saves are kept in the
//! [`Detection`] so the first apply seeds its view and sweep from them
//! ([`super::Applier::use_detection`]) instead of saving the same backend and family again.

use super::error::ApplyError;
use super::runner::Runner;
use crate::desired::IpVersion;

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
    /// The other backend (whose leftovers of ours get swept, felix-reference §6.8 "cleanup across backends").
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

    /// `iptables-legacy`, `ip6tables-nft`, … (listing one chain with `-S`).
    pub fn list_program(self, family: IpVersion) -> String {
        format!("{}-{}", Self::base(family), self.infix())
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
    // Every save detection could need is also needed by the first apply (ours for its view, the
    // other backend's for the sweep), so the whole saves are read once, one thread per family
    // (the big nft saves are the restart's main cost), and the hint steps look at their mangle
    // sections: what `ip*tables-<mode>-save -t mangle` would print.
    let saves: Vec<(Mode, IpVersion, String)> = std::thread::scope(|s| {
        let v6 = s.spawn(|| full_saves(runner, IpVersion::V6));
        let mut all = full_saves(runner, IpVersion::V4);
        all.extend(v6.join().unwrap_or_default());
        all
    });
    let hint_in = |mode| {
        [IpVersion::V6, IpVersion::V4].iter().any(|&f| {
            saves
                .iter()
                .any(|(m, sf, t)| *m == mode && *sf == f && mangle_has_hint(t))
        })
    };
    for (mode, reason) in [
        (Mode::Nft, Reason::NftHint),
        (Mode::Legacy, Reason::LegacyHint),
    ] {
        if hint_in(mode) {
            return Ok(Detection {
                mode,
                reason,
                saves,
            });
        }
    }
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

/// A kubelet hint chain in the `*mangle` section of a whole save.
fn mangle_has_hint(save: &str) -> bool {
    let mut in_mangle = false;
    save.lines().any(|l| {
        if let Some(table) = l.strip_prefix('*') {
            in_mangle = table.trim() == "mangle";
        }
        in_mangle && KUBELET_HINTS.iter().any(|h| l.contains(h))
    })
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
    fn hints_count_only_in_the_mangle_section() {
        let hint = ":KUBE-IPTABLES-HINT - [0:0]\n";
        assert!(mangle_has_hint(&format!(
            "*filter\nCOMMIT\n*mangle\n{hint}COMMIT\n"
        )));
        assert!(!mangle_has_hint(&format!(
            "*filter\n{hint}COMMIT\n*mangle\nCOMMIT\n"
        )));
        assert!(mangle_has_hint(
            "*mangle\n:KUBE-KUBELET-CANARY - [0:0]\nCOMMIT\n"
        ));
        assert!(!mangle_has_hint(""));
    }

    #[test]
    fn counts_rule_lines_only() {
        assert_eq!(
            count_rules("*filter\n:INPUT ACCEPT [0:0]\n-A INPUT -j ACCEPT\nCOMMIT\n"),
            1
        );
    }
}

/// Felix's `MASQFullyRandom` feature (`felix/environment/feature_detect_linux.go`): `MASQUERADE
/// --random-fully` needs iptables >= 1.6.2 and a kernel >= 3.14. `iptables_version` is what
/// `iptables -V` prints (`iptables v1.8.9 (nf_tables)`), `kernel_release` the kernel's
/// `osrelease` (`6.1.0-18-amd64`); anything unparsable counts as unsupported.
pub fn masquerade_fully_random(iptables_version: &str, kernel_release: &str) -> bool {
    fn version(s: &str) -> Option<(u32, u32, u32)> {
        let mut it = s
            .split(|c: char| !c.is_ascii_digit())
            .filter(|p| !p.is_empty());
        let major = it.next()?.parse().ok()?;
        let minor = it.next()?.parse().ok()?;
        Some((
            major,
            minor,
            it.next().and_then(|p| p.parse().ok()).unwrap_or(0),
        ))
    }
    let ipt = iptables_version
        .split_whitespace()
        .find_map(|w| w.strip_prefix('v'))
        .and_then(version);
    let kernel = version(kernel_release.trim());
    matches!((ipt, kernel), (Some(i), Some(k)) if i >= (1, 6, 2) && k >= (3, 14, 0))
}

/// [`masquerade_fully_random`] for the host the runner runs on (`iptables -V`,
/// `/proc/sys/kernel/osrelease`).
pub fn detect_masquerade_fully_random(runner: &dyn Runner) -> bool {
    let Ok(out) = runner.run("iptables", &["-V"], None) else {
        return false;
    };
    let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    masquerade_fully_random(&String::from_utf8_lossy(&out.stdout), &release)
}

#[cfg(test)]
mod fully_random_tests {
    use super::masquerade_fully_random as f;

    #[test]
    fn felix_version_thresholds() {
        assert!(f("iptables v1.8.9 (nf_tables)", "6.1.0-18-amd64"));
        assert!(f("iptables v1.6.2", "3.14.0"));
        assert!(!f("iptables v1.6.1", "5.10.0"));
        assert!(!f("iptables v1.8.7 (legacy)", "3.13.11"));
        assert!(!f("", "6.1.0"));
        assert!(!f("iptables v1.8.9", "garbage"));
    }
}
