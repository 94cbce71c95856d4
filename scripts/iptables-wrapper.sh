#!/bin/sh
# The image's plain `iptables`, `iptables-save`, `iptables-restore` and their ip6tables twins
# (symlinks to this file): runs the same command of the backend the host uses, found the way the
# agent finds it (iptables/src/apply/backend.rs, after Felix's DetectBackend):
#   1. kubelet's canary chains (KUBE-IPTABLES-HINT, KUBE-KUBELET-CANARY) in nft's mangle table
#      choose nft, 2. then in legacy's mangle table choose legacy, 3. otherwise the backend with
#      more rules (both families) wins, 4. a tie goes to the image's default, nft (Debian's).
# Whole saves are read, as the agent does: a legacy save lists only the tables the kernel already
# has, so detection never creates a legacy table. FELIXRS_IPTABLES_BACKEND=legacy|nft overrides.
set -eu
name=$(basename "$0")
case "$name" in
  iptables | iptables-save | iptables-restore | ip6tables | ip6tables-save | ip6tables-restore) ;;
  *) echo "iptables-wrapper: run it as iptables, iptables-save, iptables-restore or the ip6tables ones" >&2; exit 2 ;;
esac

saves() { # backend: both families' whole saves
  iptables-"$1"-save 2>/dev/null || true
  ip6tables-"$1"-save 2>/dev/null || true
}
hint() { # backend: kubelet's canary chains in a mangle table
  saves "$1" | awk '/^\*/ {t = $0} t == "*mangle" && /KUBE-IPTABLES-HINT|KUBE-KUBELET-CANARY/ {f = 1} END {exit !f}'
}
rules() { # backend: rule lines in its saves
  saves "$1" | grep -c '^-' || true
}

mode=${FELIXRS_IPTABLES_BACKEND:-auto}
case "$mode" in
  legacy | nft) ;;
  *)
    if hint nft; then mode=nft
    elif hint legacy; then mode=legacy
    elif [ "$(rules legacy)" -gt "$(rules nft)" ]; then mode=legacy
    else mode=nft
    fi ;;
esac
family=${name%%-*}
case "$name" in
  *-save) exec "$family-$mode-save" "$@" ;;
  *-restore) exec "$family-$mode-restore" "$@" ;;
  *) exec "$family-$mode" "$@" ;;
esac
