#!/usr/bin/env bash
# Runs every fuzz target (fuzz/targets/: selector, iptables_save, resource, manifest,
# dns_response) on stable Rust for a bounded time: FELIXRS_FUZZ_SECS per target (default 48, so
# the five share the 4 x 60 s that four targets had), two targets at a time.
# A panic fails the run and prints FELIXRS_FUZZ_SEED and the input (saved under
# target/fuzz-stable/). Coverage-guided runs: `cargo +nightly fuzz run <target>` (see README).
set -euo pipefail
cd "$(dirname "$0")/.."
export FELIXRS_FUZZ_SECS=${FELIXRS_FUZZ_SECS:-48}
exec cargo test -p felixrs-e2e --test fuzz_stable --locked -- --test-threads=2 --nocapture
