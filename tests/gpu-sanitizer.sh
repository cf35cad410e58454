#!/bin/sh
# compute-sanitizer over the GPU suites (make check-gpu, etc/device-check.sh):
#   memcheck   check_e2e_gpu, check_e2e_gpu_fake, check_tier_gpu, and the CUDA cases of
#              check_pack and check_kernels
#   racecheck  the cases that launch kernels: check_pack cuda, check_kernels cuda,
#              check_codecs cuda (the encoder's transform units' shared memory, last)
#   synccheck  the same
# check_e2e_gpu_fake's own process never initialises CUDA (its device is the fake one; the
# daemons it starts may): --require-cuda-init no, or the sanitizer fails the run for that.
# Every case of a suite in one process (CK_FORK=no): the sanitizer follows the processes the
# cases fork (--target-processes all), and one process per suite keeps its start-up cost
# once. The waits of the tests are scaled by KVC_TEST_SLOW (default 10 here): a sanitized
# process runs several times slower, a client child in it too. check_e2e_gpu's no-fork
# regression case (which runs the suite again inside itself) is left out.
# Runs go in order of what they guard (the suite that failed under the sanitizer before,
# then the kernels); with KVC_SAN_DEADLINE (seconds since the epoch) a run that cannot start
# 10 s before it, or does not end by it, is reported "INCOMPLETE: sanitizer TOOL SUITE" and
# is not a failure (etc/device-check.sh gives this stage what its 6 minutes leave).
# Usage: gpu-sanitizer.sh BUILD_DIR [COMPUTE_SANITIZER]. Exit status: 0 when every run that
# ran is clean (or compute-sanitizer is not installed: one SKIP line), 1 otherwise, with a
# line "FAIL: sanitizer TOOL SUITE" per failed run.
set -u
b=$1
san=${2:-}
[ -n "$san" ] || san=$(command -v compute-sanitizer 2>/dev/null || true)
[ -n "$san" ] || san=/usr/local/cuda/bin/compute-sanitizer
if [ ! -x "$san" ]; then
    echo "SKIP: check-gpu: compute-sanitizer: not installed"
    exit 0
fi
slow=${KVC_TEST_SLOW:-10}
deadline=${KVC_SAN_DEADLINE:-0}
fail=0
incomplete=0
run() {
    tool=$1 suite=$2 case=$3
    what="$tool $suite${case:+ ($case)}"
    limit=
    if [ "$deadline" -gt 0 ]; then
        left=$((deadline - $(date +%s)))
        if [ "$left" -le 10 ]; then
            echo "INCOMPLETE: sanitizer $what: no time left"
            incomplete=$((incomplete + 1))
            return
        fi
        limit="timeout -k 5 $left"
    fi
    echo "== sanitizer $what"
    start=$(date +%s)
    $limit env CK_FORK=no KVC_TEST_SLOW="$slow" CK_EXCLUDE_TAGS=regression \
        ${case:+CK_RUN_CASE=$case} "$san" --tool "$tool" --error-exitcode 1 \
        --require-cuda-init no --target-processes all "$b/tests/$suite"
    rc=$?
    if [ -n "$limit" ] && [ "$rc" -eq 124 -o "$rc" -eq 137 ]; then
        echo "INCOMPLETE: sanitizer $what: did not finish in the time left"
        incomplete=$((incomplete + 1))
    elif [ "$rc" -ne 0 ]; then
        echo "FAIL: sanitizer $what (rc $rc)"
        fail=1
    fi
    echo "== sanitizer $what: rc $rc, $(($(date +%s) - start))s"
}
run memcheck check_e2e_gpu ""
run memcheck check_e2e_gpu_fake ""
run memcheck check_pack cuda
run racecheck check_pack cuda
run synccheck check_pack cuda
run memcheck check_kernels cuda
run memcheck check_tier_gpu ""
run racecheck check_kernels cuda
run synccheck check_kernels cuda
run racecheck check_codecs cuda
run synccheck check_codecs cuda
if [ "$fail" -ne 0 ]; then
    echo "sanitizer: errors found"
elif [ "$incomplete" -ne 0 ]; then
    echo "sanitizer: clean, $incomplete run(s) incomplete (out of time)"
else
    echo "sanitizer: every run clean"
fi
exit "$fail"
