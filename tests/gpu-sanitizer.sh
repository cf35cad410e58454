#!/bin/sh
# compute-sanitizer over the GPU suites (make check-gpu, etc/device-check.sh):
#   memcheck   check_pack, check_tier_gpu, check_e2e_gpu, check_kernels' CUDA cases
#   racecheck  the cases that launch kernels: check_pack cuda, check_kernels cuda
#   synccheck  the same
# Every case of a suite in one process (CK_FORK=no): the sanitizer follows the processes the
# cases fork (--target-processes all), and one process per suite keeps its start-up cost
# once. The waits of the tests are scaled by KVC_TEST_SLOW (default 10 here): a sanitized
# process runs several times slower, a client child in it too. check_e2e_gpu's no-fork
# regression case (which runs the suite again inside itself) is left out.
# Usage: gpu-sanitizer.sh BUILD_DIR [COMPUTE_SANITIZER]. Exit status: 0 when every run is
# clean (or compute-sanitizer is not installed: one SKIP line), 1 otherwise, with a line
# "FAIL: sanitizer TOOL SUITE" per failed run.
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
fail=0
run() {
    tool=$1 suite=$2 case=$3
    echo "== sanitizer $tool $suite${case:+ ($case)}"
    start=$(date +%s)
    if ! env CK_FORK=no KVC_TEST_SLOW="$slow" CK_EXCLUDE_TAGS=regression \
        ${case:+CK_RUN_CASE=$case} "$san" --tool "$tool" --error-exitcode 1 \
        --target-processes all "$b/tests/$suite"; then
        echo "FAIL: sanitizer $tool $suite${case:+ ($case)}"
        fail=1
    fi
    echo "== sanitizer $tool $suite: $(( $(date +%s) - start ))s"
}
run memcheck check_pack ""
run memcheck check_tier_gpu ""
run memcheck check_e2e_gpu ""
run memcheck check_kernels cuda
for tool in racecheck synccheck; do
    run "$tool" check_pack cuda
    run "$tool" check_kernels cuda
done
[ "$fail" -eq 0 ] && echo "sanitizer: every run clean"
exit "$fail"
