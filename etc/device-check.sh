#!/bin/sh
# device-check.sh OUTDIR — kvcd's GPU check on a GPU host, in one command, from the folder
# `make device-bundle` made (build/device-bundle beside this tree, or $KVC_BUNDLE). The host
# needs the NVIDIA driver (and compute-sanitizer for that stage: CUDA's own, on PATH or in
# /usr/local/cuda/bin), a POSIX shell and coreutils; none of Debian's libraries (the bundle
# carries them).
#
# Stages, each under a deadline, the whole within 6 minutes (KVC_DEVICE_CHECK_SECONDS, 350):
#   suites     the GPU suites (tests/run-checks.sh over the bundle); where a GPU is present,
#              a GPU case that skips is a failure
#   benches    bench_gpu, bench_kernels, bench_host
#   sanitizer  tests/gpu-sanitizer.sh (memcheck, racecheck, synccheck) in the time left: a
#              run that does not fit is listed INCOMPLETE in summary.txt, not failed
# OUTDIR gets at most 8 files: summary.txt (device, driver, CUDA, each stage's result and
# time), suites.log, sanitizer.log, bench.txt (the benchmarks' tables), gpu.json,
# kernels.json, host.json. Exit status 0 when every stage passed; otherwise 1, with one
# "device-check: FAIL: ..." line per failure on stderr and in summary.txt. Without a GPU the
# GPU cases report SKIP and the CPU parts run (the sanitizer stage then skips).
set -u
out=${1:-}
if [ -z "$out" ]; then
    echo "usage: sh etc/device-check.sh OUTDIR" >&2
    exit 2
fi
root=$(cd "$(dirname "$0")/.." && pwd)
bundle=${KVC_BUNDLE:-$root/build/device-bundle}
mkdir -p "$out" || exit 2
out=$(cd "$out" && pwd)
sum="$out/summary.txt"
start=$(date +%s)
budget=${KVC_DEVICE_CHECK_SECONDS:-350}
failed=0
: >"$sum"
say() { echo "$*" | tee -a "$sum"; }
fail() {
    failed=1
    echo "device-check: FAIL: $*" >&2
    echo "device-check: FAIL: $*" >>"$sum"
}
left() { echo $((budget - ($(date +%s) - start))); }
# Runs a stage's command with what is left of the budget, at most $1 seconds.
stage() {
    cap=$1
    shift
    l=$(left)
    [ "$l" -lt "$cap" ] && cap=$l
    if [ "$cap" -le 5 ]; then
        echo "no time left"
        return 124
    fi
    timeout -k 10 "$cap" "$@"
}

if [ ! -x "$bundle/bin/kvcd" ]; then
    fail "no bundle at $bundle (run make device-bundle where the tree was built)"
    exit 1
fi
export LD_LIBRARY_PATH="$bundle/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export KVC_TEST_BIN_DIR="$bundle/bin"
cd "$root" || exit 2

say "device-check: $(date -u +%Y-%m-%dT%H:%M:%SZ), bundle $bundle"
sed -n '2,4p' "$bundle/MANIFEST" 2>/dev/null | sed 's/^/  /' | tee -a "$sum"
gpu=0
if command -v nvidia-smi >/dev/null 2>&1 &&
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader \
        >"$out/.gpu" 2>/dev/null && [ -s "$out/.gpu" ]; then
    gpu=1
    say "device: $(head -n 1 "$out/.gpu")"
    cuda=$(nvidia-smi 2>/dev/null | sed -n 's/.*CUDA Version: *\([0-9.]*\).*/\1/p' | head -n 1)
    say "driver's CUDA: ${cuda:-unknown}; cores: $(nproc)"
else
    say "device: none found (nvidia-smi absent or no GPU): GPU cases will SKIP"
fi
rm -f "$out/.gpu"
# Every binary must resolve into the bundle or the host's glibc and driver.
for f in "$bundle"/bin/* "$bundle"/tests/* "$bundle"/bench/*; do
    if ldd "$f" 2>&1 | grep -q "not found"; then
        fail "$(basename "$f"): $(ldd "$f" 2>&1 | grep "not found" | head -n 1)"
    fi
done

# ---- suites -----------------------------------------------------------------------------
t0=$(date +%s)
stage 150 sh "$root/tests/run-checks.sh" "$bundle" gpu >"$out/suites.log" 2>&1
rc=$?
line=$(grep -E '^gpu: [0-9]+ passed' "$out/suites.log" | tail -n 1)
say "suites: ${line:-no summary} (rc $rc, $(($(date +%s) - t0)) s)"
[ "$rc" -eq 0 ] || fail "suites: rc $rc ($(grep 'failing suites' "$out/suites.log" | tail -n 1))"
if [ "$gpu" -eq 1 ]; then
    skips=$(grep -E '^SKIP: .*(no CUDA device|no device|CUDA probe died|without CUDA)' \
        "$out/suites.log" | head -n 3)
    [ -z "$skips" ] || fail "a GPU is here but GPU cases skipped: $skips"
fi

# ---- benchmarks -----------------------------------------------------------------------------
: >"$out/bench.txt"
for b in gpu:60 kernels:60 host:120; do
    name=${b%%:*}
    cap=${b#*:}
    t0=$(date +%s)
    echo "==== bench_$name" >>"$out/bench.txt"
    stage "$cap" "$bundle/bench/bench_$name" "$out/$name.json" >>"$out/bench.txt" 2>&1
    rc=$?
    say "bench_$name: rc $rc, $(($(date +%s) - t0)) s"
    [ "$rc" -eq 0 ] || fail "bench_$name: rc $rc ($(tail -n 2 "$out/bench.txt" | tr '\n' ' '))"
done

if [ "$gpu" -eq 1 ] && grep -qE '^SKIP: bench_(gpu|kernels).*(no CUDA device|no device)' \
    "$out/bench.txt"; then
    fail "a GPU is here but the benchmarks' GPU rows skipped"
fi

# ---- compute-sanitizer: what the 6 minutes leave ---------------------------------------------
t0=$(date +%s)
if [ "$gpu" -eq 1 ]; then
    KVC_SAN_DEADLINE=$((start + budget)) \
        sh "$root/tests/gpu-sanitizer.sh" "$bundle" >"$out/sanitizer.log" 2>&1
    rc=$?
    say "sanitizer: $(tail -n 1 "$out/sanitizer.log") (rc $rc, $(($(date +%s) - t0)) s)"
    grep '^INCOMPLETE:' "$out/sanitizer.log" | sed 's/^/  /' | tee -a "$sum"
    [ "$rc" -eq 0 ] || fail "sanitizer: rc $rc: $(grep '^FAIL: sanitizer' "$out/sanitizer.log" |
        tr '\n' ' ')"
else
    echo "SKIP: sanitizer: no GPU" >"$out/sanitizer.log"
    say "sanitizer: SKIP (no GPU)"
fi

say "device-check: $(($(date +%s) - start)) s"
if [ "$failed" -ne 0 ]; then
    echo "device-check: FAILED (see $sum)" >&2
    exit 1
fi
say "device-check: OK"
exit 0
