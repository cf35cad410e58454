#!/bin/sh
# smoke.sh BUILD_DIR — runs every benchmark of a build once with KVC_BENCH_SMOKE=1 (a tiny
# configuration each honours), so that make check finds a benchmark that no longer builds,
# runs or checks what it measures. The figures of such a run mean nothing; the exit status
# of each does (a refused row, a failed request, a missing peer is a failure). A benchmark
# passes when it exits 0 with rows; what it cannot run here it says with SKIP lines, which
# are counted (bench_gpu without a device: its calls-per-hit rows on the fake device and one
# SKIP for the throughput rows). Closes with
#   bench-smoke: N passed, N failed, N skipped
set -u
b=$1
here=$(cd "$(dirname "$0")/../.." && pwd)
out=$(mktemp -d /tmp/kvcd-bench-smoke.XXXXXX)
trap 'rm -rf "$out"' EXIT
export KVC_BENCH_SMOKE=1
# bench_sim reads the production trace beside the tree; elsewhere a synthetic one
trace="$here/../shared/traces/conversation_trace.jsonl"
if [ ! -r "$trace" ] && [ -z "${KVC_TRACE:-}" ]; then
    if command -v python3 >/dev/null 2>&1; then
        python3 "$here/tests/bench/kvcsim_gen.py" mixed -n 2000 >"$out/trace.jsonl" &&
            export KVC_TRACE="$out/trace.jsonl"
    fi
fi
pass=0 fail=0 skip=0 broken=""
for t in "$b"/bench/bench_*; do
    [ -x "$t" ] || continue
    name=$(basename "$t")
    start=$(date +%s)
    if [ "$name" = bench_sim ] && [ ! -r "$trace" ] && [ -z "${KVC_TRACE:-}" ]; then
        echo "SKIP: bench-smoke: $name: no trace here and no python3 to make one"
        skip=$((skip + 1))
        continue
    fi
    timeout 600 "$t" "$out/$name.json" >"$out/log" 2>&1
    rc=$?
    s=$(grep -c '^SKIP:' "$out/log")
    grep '^SKIP:' "$out/log"
    skip=$((skip + s))
    if [ "$rc" -ne 0 ]; then
        cat "$out/log"
        fail=$((fail + 1))
        broken="$broken $name"
    elif grep -q '"case"' "$out/$name.json" 2>/dev/null; then
        pass=$((pass + 1)) # it measured something (its SKIP lines, if any, are parts)
    elif [ "$s" -eq 0 ]; then
        echo "bench-smoke: $name: exit 0 without a row or a SKIP line"
        fail=$((fail + 1))
        broken="$broken $name"
    fi
    echo "== bench-smoke $name: rc=$rc, $(($(date +%s) - start))s"
done
[ -n "$broken" ] && echo "bench-smoke: failing benchmarks:$broken"
echo "bench-smoke: $pass passed, $fail failed, $skip skipped"
[ "$fail" -eq 0 ]
