#!/usr/bin/env bash
# Installs what a fresh Debian machine lacks, then runs every check and test felixrs has:
# rustfmt, clippy (-D warnings), cargo-deny (deny.toml), and the whole workspace's tests, including the root-only ones
# that drive the real kernel's iptables/ipset in throw-away network namespaces and a real etcd.
#
# Usage: scripts/test.sh            (as root; CI runs it through .ci/run)
set -euo pipefail
cd "$(dirname "$0")/.."

# The Debian packages the build and the tests use, one per line (also read by .ci/run).
mapfile -t pkgs < scripts/debian-packages.txt
need_pkgs=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || need_pkgs+=("$p")
done
if [ "${#need_pkgs[@]}" -gt 0 ]; then
  if [ "$(id -u)" -ne 0 ]; then
    echo "missing packages ${need_pkgs[*]} and not root: install them or run as root" >&2
    exit 1
  fi
  echo "==> installing ${need_pkgs[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need_pkgs[@]}" >/dev/null
fi
if [ "$(id -u)" -ne 0 ]; then
  echo "the kernel datapath tests need root (network namespaces, iptables, ipset): run as root" >&2
  exit 1
fi

# cargo-deny (licenses, bans, sources of the dependency tree; policy and why no advisories in deny.toml).
# Not packaged by Debian: built from crates.io once, kept in ~/.cargo/bin (cache it in CI). The version
# is pinned so that a new cargo-deny release cannot change the verdict.
CARGO_DENY_VERSION=0.20.2
export PATH="$HOME/.cargo/bin:$PATH"
if ! cargo deny --version 2>/dev/null | grep -qx "cargo-deny $CARGO_DENY_VERSION"; then
  echo "==> installing cargo-deny $CARGO_DENY_VERSION (once, into ~/.cargo/bin)"
  cargo install --locked --version "$CARGO_DENY_VERSION" cargo-deny
fi

echo "==> cargo fmt --check"
cargo fmt --all --check
echo "==> cargo clippy"
cargo clippy --workspace --all-targets --locked -- -D warnings
echo "==> cargo deny check licenses bans sources"
cargo deny --locked check licenses bans sources
echo "==> shipping checks (Containerfile lint, deploy/ rendered and schema-validated offline)"
log=$(mktemp)
trap 'rm -f "$log"' EXIT
set +e
scripts/check-ship.sh 2>&1 | tee "$log"
ship_status=${PIPESTATUS[0]}
set -e
echo "==> the image (scripts/build-image.sh), and the -next one the upgrade test moves to"
# tests/tests/e2e_image.rs runs both (under CI it fails when they are missing).
scripts/build-image.sh
FELIXRS_VERSION_EXTRA=next scripts/build-image.sh
echo "==> cargo build (binaries the end-to-end tests run)"
cargo build --workspace --bins --locked
echo "==> cargo test"
# The kernel tests are I/O bound and isolated by network namespace, so a few threads per binary is fine.
# --no-fail-fast: one failing test binary must not hide the results of the others.
set +e
cargo test --workspace --locked --no-fail-fast -- --test-threads=4 2>&1 | tee -a "$log"
status=${PIPESTATUS[0]}
set -e
echo "==> fuzz targets, bounded (stable)"
set +e
scripts/fuzz-stable.sh 2>&1 | tee -a "$log"
fuzz_status=${PIPESTATUS[0]}
set -e
# One closing line for the whole suite (cargo prints one per test binary, the last often a doc-test
# "0 passed"; the shipping checks print "checks: N passed, M failed").
awk '/^test result:/ {p += $4; f += $6} /^checks: / {p += $2; f += $4}
     END {printf "tests: %d passed, %d failed\n", p, f}' "$log"
[ "$ship_status" -eq 0 ] && [ "$fuzz_status" -eq 0 ] || exit 1
exit "$status"
