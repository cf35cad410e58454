#!/bin/sh
# Runs every Check suite of a build and closes with one line:
#   LABEL: N passed, N failed, N skipped
# A suite reports a case it cannot run here (no GPU, no hugepages) by printing a line
# "SKIP: suite: case: reason" and not registering that case; skips are counted, never passed.
# Usage: run-checks.sh BUILD_DIR LABEL
set -u
b=$1
label=$2
pass=0 fail=0 skip=0 broken=""
log=$(mktemp)
export CK_DEFAULT_TIMEOUT=${CK_DEFAULT_TIMEOUT:-120}
for t in "$b"/tests/check_*; do
    [ -x "$t" ] || continue
    name=$(basename "$t")
    start=$(date +%s)
    timeout 900 "$t" >"$log" 2>&1
    rc=$?
    cat "$log"
    line=$(grep -E '^[0-9]+%: Checks: [0-9]+' "$log" | tail -n 1)
    n=$(echo "$line" | sed -E 's/.*Checks: ([0-9]+).*/\1/')
    f=$(echo "$line" | sed -E 's/.*Failures: ([0-9]+).*/\1/')
    e=$(echo "$line" | sed -E 's/.*Errors: ([0-9]+).*/\1/')
    s=$(grep -c '^SKIP:' "$log")
    [ -n "$n" ] || { n=0; f=0; e=1; }
    pass=$((pass + n - f - e))
    fail=$((fail + f + e))
    skip=$((skip + s))
    if [ "$rc" -ne 0 ] || [ $((f + e)) -ne 0 ]; then
        broken="$broken $name"
        [ $((f + e)) -eq 0 ] && fail=$((fail + 1))
    fi
    echo "== $label $name: rc=$rc, $(( $(date +%s) - start ))s"
done
rm -f "$log"
[ -n "$broken" ] && echo "$label: failing suites:$broken"
echo "$label: $pass passed, $fail failed, $skip skipped"
[ "$fail" -eq 0 ]
