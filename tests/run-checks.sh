#!/bin/sh
# Runs every Check suite of a build and closes with one line:
#   LABEL: N passed, N failed, N skipped
# A suite reports a case it cannot run here (no GPU, no hugepages) by printing a line
# "SKIP: suite: case: reason" and not registering that case; skips are counted, never passed.
# A suite that cannot run at all prints "SKIP: suite: all: reason" and exits 0 without
# Check's summary: that is one skip. Any other suite without a summary, or with a non-zero
# exit status, counts as a failure.
# As root, check_tier_host (and check_e2e_adversary) run with 2 MiB huge pages reserved for
# them (and given back), so the hugetlb arena the README recommends is tested on every run;
# not root, the suite says SKIP. Usage: run-checks.sh BUILD_DIR LABEL
set -u
b=$1
label=$2
here=$(cd "$(dirname "$0")" && pwd)
pass=0 fail=0 skip=0 broken=""
log=$(mktemp)
export CK_DEFAULT_TIMEOUT=${CK_DEFAULT_TIMEOUT:-120}

# Huge pages for check_tier_host: HUGE_PAGES more than are free now, under a lock (other
# runs on this host reserve and give back too), given back when the suite ends.
HUGE_PAGES=2
# check_e2e_adversary's hugetlb hole punching: its arenas (48 MiB), and as many free huge
# pages again for the attacker to take and give back (mapping an arena with holes reserves
# huge pages for them: after the attack the suite maps it again).
HUGE_PAGES_ADVERSARY=48
run_suite() {
    t=$1
    case "$(basename "$t")" in
    check_tier_host) sh "$here/lib/hugepages.sh" $HUGE_PAGES timeout 900 "$t" ;;
    check_e2e_adversary) sh "$here/lib/hugepages.sh" $HUGE_PAGES_ADVERSARY timeout 900 "$t" ;;
    *) timeout 900 "$t" ;;
    esac
}

# The normal build runs these suites a second time with the fast path off in the client and
# the daemon (KVC_NO_FASTPATH=1, tests/lib/daemon.c): the suites that move block bytes
# between processes. check_e2e_fast asserts fast hits and runs once.
NOFAST_SUITES="check_e2e_adversary check_e2e_adversary_fast check_e2e_adversary_pool \
check_e2e_concurrent check_e2e_disk check_e2e_kvcctl \
check_e2e_lifecycle check_e2e_put check_e2e_quant check_python"
suites=""
for t in "$b"/tests/check_*; do
    suites="$suites $t"
done
if [ "$label" = normal ]; then
    for n in $NOFAST_SUITES; do
        [ -x "$b/tests/$n" ] && suites="$suites nofast:$b/tests/$n"
    done
fi
for t in $suites; do
    nofast=""
    case "$t" in
    nofast:*) t=${t#nofast:}; nofast=1 ;;
    esac
    [ -x "$t" ] || continue
    name=$(basename "$t")${nofast:+ (KVC_NO_FASTPATH=1)}
    start=$(date +%s)
    if [ -n "$nofast" ]; then
        (export KVC_NO_FASTPATH=1; run_suite "$t") >"$log" 2>&1
    else
        run_suite "$t" >"$log" 2>&1
    fi
    rc=$?
    cat "$log"
    line=$(grep -E '^[0-9]+%: Checks: [0-9]+' "$log" | tail -n 1)
    s=$(grep -c '^SKIP:' "$log")
    if [ -n "$line" ]; then
        n=$(echo "$line" | sed -E 's/.*Checks: ([0-9]+).*/\1/')
        f=$(echo "$line" | sed -E 's/.*Failures: ([0-9]+).*/\1/')
        e=$(echo "$line" | sed -E 's/.*Errors: ([0-9]+).*/\1/')
        pass=$((pass + n - f - e))
        fail=$((fail + f + e))
        if [ "$rc" -ne 0 ] && [ $((f + e)) -eq 0 ]; then
            fail=$((fail + 1)) # passed its cases but exited non-zero (a leak, a crash)
        fi
    elif [ "$rc" -eq 0 ] && grep -q '^SKIP: [^:]*: all:' "$log"; then
        f=0 e=0 # the whole suite skipped, as it said
    else
        f=0 e=1
        fail=$((fail + 1)) # no summary: it crashed, hung or never ran its cases
    fi
    skip=$((skip + s))
    if [ "$rc" -ne 0 ] || [ $((f + e)) -ne 0 ]; then
        broken="$broken $(echo "$name" | tr -d ' ')"
    fi
    echo "== $label $name: rc=$rc, $(( $(date +%s) - start ))s"
done
rm -f "$log"
[ -n "$broken" ] && echo "$label: failing suites:$broken"
echo "$label: $pass passed, $fail failed, $skip skipped"
[ "$fail" -eq 0 ]
