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
#
# Suites run KVC_CHECK_JOBS at a time (default: the CPUs, at most 4; the gpu label one at a
# time, as the device check's figures want a quiet device): each suite is its own processes,
# daemons and temporary directories, the longest start first, and a suite's output is printed
# whole when it ends, with its "== LABEL suite: rc=N, Ns" line. The closing counts are the
# same whatever the number of jobs. The suites that reserve huge pages run last, alone.
set -u
b=$1
label=$2
here=$(cd "$(dirname "$0")" && pwd)
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
# The TSan build runs these suites a second time with the daemon's sockets on two I/O threads
# (KVC_IO_THREADS=2, tests/lib/daemon.c, which also keeps every socket there with
# server.io_threads_min_active = 1; server_io.c), leaving out the cases tagged "long"
# (CK_EXCLUDE_TAGS): ThreadSanitizer watches the I/O threads' hand-over under the fast path's
# traffic. check_e2e_garbage and check_e2e_concurrent run their I/O-thread pass themselves.
IO_SUITES="check_e2e_fast"
# The suites that take longest (a minute or more under ASan), started first so that the
# jobs end together.
LONG_SUITES="check_python nofast:check_python check_e2e_install check_kernels check_e2e_put \
check_index check_e2e_remote check_e2e_disk nofast:check_e2e_disk check_e2e_lifecycle \
nofast:check_e2e_lifecycle check_e2e_fast io:check_e2e_fast check_pack check_ladder"

all=""
for t in "$b"/tests/check_*; do
    [ -x "$t" ] && all="$all $(basename "$t")"
done
if [ "$label" = normal ]; then
    for n in $NOFAST_SUITES; do
        [ -x "$b/tests/$n" ] && all="$all nofast:$n"
    done
fi
if [ "$label" = tsan ]; then
    for n in $IO_SUITES; do
        [ -x "$b/tests/$n" ] && all="$all io:$n"
    done
fi
# The suites that reserve huge pages (tests/lib/hugepages.sh) run last, one at a time with
# nothing beside them: a kvcd of another suite started meanwhile with host.hugepages=auto
# (the default) would take the pages reserved for them.
ALONE_SUITES="check_tier_host check_e2e_adversary nofast:check_e2e_adversary"
suites=""
for s in $LONG_SUITES; do
    case " $all " in *" $s "*) suites="$suites $s" ;; esac
done
for s in $all; do
    case " $LONG_SUITES $ALONE_SUITES " in *" $s "*) ;; *) suites="$suites $s" ;; esac
done
alone=""
for s in $ALONE_SUITES; do
    case " $all " in *" $s "*) alone="$alone $s" ;; esac
done

if [ "$label" = gpu ]; then
    jobs=${KVC_CHECK_JOBS:-1}
else
    jobs=${KVC_CHECK_JOBS:-$(nproc 2>/dev/null || echo 1)}
    [ "$jobs" -gt 4 ] && [ -z "${KVC_CHECK_JOBS:-}" ] && jobs=4
fi
command -v flock >/dev/null 2>&1 || jobs=1
[ "$jobs" -ge 1 ] 2>/dev/null || jobs=1

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
trap 'exit 1' INT TERM
count=0
for s in $suites $alone; do
    count=$((count + 1))
    eval "suite_$count=\$s"
done
echo 1 >"$tmp/next"
: >"$tmp/lock"

# Prints the number of the next suite to run (up to $last), or nothing when none is left.
next_suite() {
    flock -x 8
    n=$(cat "$tmp/next")
    [ "$n" -le "$last" ] && echo $((n + 1)) >"$tmp/next" && echo "$n"
} 8>>"$tmp/lock"

# One job: takes suites off the list until none is left; each one's output, exit status and
# seconds go to $tmp/N.log, N.rc and N.name; the output is printed whole when the suite ends.
job() {
    while n=$(next_suite) && [ -n "$n" ]; do
        eval "s=\$suite_$n"
        t=${s#*:}
        start=$(date +%s)
        case "$s" in
        nofast:*)
            name="$t (KVC_NO_FASTPATH=1)"
            (export KVC_NO_FASTPATH=1; run_suite "$b/tests/$t") >"$tmp/$n.log" 2>&1
            ;;
        io:*)
            name="$t (KVC_IO_THREADS=2)"
            (export KVC_IO_THREADS=2 CK_EXCLUDE_TAGS=long; run_suite "$b/tests/$t") \
                >"$tmp/$n.log" 2>&1
            ;;
        *)
            name=$t
            run_suite "$b/tests/$t" >"$tmp/$n.log" 2>&1
            ;;
        esac
        rc=$?
        echo "$name" >"$tmp/$n.name"
        echo "$rc" >"$tmp/$n.rc"
        {
            flock -x 9
            cat "$tmp/$n.log"
            echo "== $label $name: rc=$rc, $(($(date +%s) - start))s"
        } 9>>"$tmp/lock"
    done
}

last=$((count - $(echo $alone | wc -w)))
i=0
while [ "$i" -lt "$jobs" ]; do
    job &
    i=$((i + 1))
done
wait
last=$count
job

pass=0 fail=0 skip=0 broken=""
n=1
while [ "$n" -le "$count" ]; do
    eval "s=\$suite_$n"
    if [ ! -f "$tmp/$n.rc" ]; then
        fail=$((fail + 1)) # never ran: its job was killed
        broken="$broken ${s}"
        n=$((n + 1))
        continue
    fi
    log=$tmp/$n.log
    rc=$(cat "$tmp/$n.rc")
    name=$(cat "$tmp/$n.name")
    line=$(grep -E '^[0-9]+%: Checks: [0-9]+' "$log" | tail -n 1)
    s=$(grep -c '^SKIP:' "$log")
    if [ -n "$line" ]; then
        c=$(echo "$line" | sed -E 's/.*Checks: ([0-9]+).*/\1/')
        f=$(echo "$line" | sed -E 's/.*Failures: ([0-9]+).*/\1/')
        e=$(echo "$line" | sed -E 's/.*Errors: ([0-9]+).*/\1/')
        pass=$((pass + c - f - e))
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
    n=$((n + 1))
done
[ -n "$broken" ] && echo "$label: failing suites:$broken"
echo "$label: $pass passed, $fail failed, $skip skipped"
[ "$fail" -eq 0 ]
