//! Which iptables backend holds the host's rules (legacy or nf_tables), and the binaries and lock
//! options for it.
//!
//! Detection follows Felix's `DetectBackend` (§6.8 of the reference), reading through the
//! [`Runner`] so it sees the same network namespace the applier writes to:
//! 1. kubelet's canary chains (`KUBE-IPTABLES-HINT`, `KUBE-KUBELET-CANARY`) in the nft save, then in
//!    the legacy save, decide;
//! 2. otherwise the backend with more rule lines wins;
//! 3. a tie (typically: no rules at all) goes to what plain `iptables -V` is, so a fresh host uses
//!    its distribution default (Felix picks legacy here, see calico#5760).
//!
//! Only whole saves (no `-t`) are read, so detection never instantiates a legacy table.

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

/// Resolves `backend` for the namespace `runner` works in.
pub fn resolve(runner: &dyn Runner, backend: Backend) -> Result<Mode, ApplyError> {
    match backend {
        Backend::Legacy => return Ok(Mode::Legacy),
        Backend::Nft => return Ok(Mode::Nft),
        Backend::Auto => {}
    }
    let nft = saves(runner, Mode::Nft)?;
    let legacy = saves(runner, Mode::Legacy)?;
    let has_hint = |text: &str| KUBELET_HINTS.iter().any(|h| text.contains(h));
    if has_hint(&nft) {
        return Ok(Mode::Nft);
    }
    if has_hint(&legacy) {
        return Ok(Mode::Legacy);
    }
    let (n, l) = (count_rules(&nft), count_rules(&legacy));
    if n != l {
        return Ok(if n > l { Mode::Nft } else { Mode::Legacy });
    }
    let version = runner.run("iptables", &["-V"], None)?;
    Ok(
        if String::from_utf8_lossy(&version.stdout).contains("nf_tables") {
            Mode::Nft
        } else {
            Mode::Legacy
        },
    )
}

/// v4 + v6 saves of one backend, concatenated. A missing binary counts as no rules.
fn saves(runner: &dyn Runner, mode: Mode) -> Result<String, ApplyError> {
    let mut all = String::new();
    for family in [IpVersion::V4, IpVersion::V6] {
        let program = mode.save_program(family);
        match runner.run(&program, &[], None) {
            Ok(out) if out.status.success() => all.push_str(&String::from_utf8_lossy(&out.stdout)),
            Ok(_) | Err(_) => {}
        }
    }
    Ok(all)
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
