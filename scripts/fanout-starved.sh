#!/bin/sh
# The fan-out bench with its process starved of CPU: runs BENCH (a fanout bench binary, e.g. from
# `cargo bench --profile dev -p felixrs --bench fanout --no-run`) with the syncers' logs on, and
# stops the whole process (SIGSTOP) for STOP_S seconds after every RUN_S seconds it runs, as a node
# starved of CPU would be; etcd and the proxies keep running. Prints the bench's table and the
# syncers' disconnect reasons counted from their log, so two binaries (before/after) can be
# compared under the same starvation.
#
#   scripts/fanout-starved.sh BENCH OUT_PREFIX [bench args, default: --bench 1000]
#   environment: RUN_S (default 1), STOP_S (default 5), FOR_S (default 300: then the bench, its
#   etcd members and proxies are ended, so both binaries are compared over the same time), plus
#   the bench's FANOUT_* knobs (FANOUT_MODES=proxy by default: behind etcd 3.4's grpc-proxy the
#   liveness check is a read).
set -eu
bench=$1
out=$2
shift 2
[ $# -gt 0 ] || set -- --bench 1000
run_s=${RUN_S:-1}
stop_s=${STOP_S:-5}
for_s=${FOR_S:-300}
export FANOUT_LOG=1 FANOUT_MODES="${FANOUT_MODES:-proxy}"
"$bench" "$@" >"$out.out" 2>"$out.log" &
pid=$!
# Continue the bench whatever happens to this script, so it never stays stopped.
trap 'kill -CONT $pid 2>/dev/null || true' EXIT INT TERM
start=$(date +%s)
while kill -0 "$pid" 2>/dev/null; do
    if [ $(($(date +%s) - start)) -ge "$for_s" ]; then
        children=$(ps -o pid= --ppid "$pid" || true)
        kill -CONT "$pid"
        kill "$pid" $children 2>/dev/null || true
        break
    fi
    sleep "$run_s"
    kill -STOP "$pid" 2>/dev/null || break
    sleep "$stop_s"
    kill -CONT "$pid" 2>/dev/null || break
done
wait "$pid" && rc=0 || rc=$?
end=$(date +%s)
cat "$out.out"
echo "bench exit $rc after $((end - start)) s (run ${run_s} s / stopped ${stop_s} s), load $(cut -d' ' -f1-3 /proc/loadavg)"
echo "bench log: $(grep -c 'listed datastore' "$out.log" || true) listings"
lost=$(grep -c 'datastore connection lost' "$out.log" || true)
silent=$(grep 'datastore connection lost' "$out.log" | grep -c 'watch silent' || true)
timedout=$(grep 'datastore connection lost' "$out.log" | grep -c 'timed out' || true)
echo "disconnects: $lost (silent $silent, timed out $timedout, other $((lost - silent - timedout)))"
