#!/bin/sh
# hugepages.sh N CMD [ARGS...] — runs CMD with at least N free 2 MiB hugetlb pages, reserving
# what is missing (as root) and giving exactly that back when CMD ends. Runs on one host are
# serialised with a lock, so two of them never undo each other's reservation. Not root, or
# a kernel without 2 MiB huge pages: CMD runs as it is (the suite then prints its SKIP
# line). Exit status: CMD's.
set -u
want=$1
shift
sysfs=/proc/sys/vm/nr_hugepages
meminfo() { sed -n "s/^$1: *\([0-9]*\).*/\1/p" /proc/meminfo; }
if [ "$(id -u)" -ne 0 ] || [ ! -w "$sysfs" ] || [ "$(meminfo Hugepagesize)" != 2048 ] ||
    ! command -v flock >/dev/null 2>&1; then
    exec "$@"
fi
lock=/run/lock/kvcd-test-hugepages.lock
[ -d /run/lock ] || lock=/tmp/kvcd-test-hugepages.lock
(
    flock -x 9
    before=$(cat "$sysfs")
    missing=$((want - $(meminfo HugePages_Free)))
    added=0
    if [ "$missing" -gt 0 ]; then
        echo 1 >/proc/sys/vm/compact_memory 2>/dev/null
        echo $((before + missing)) >"$sysfs"
        added=$(($(cat "$sysfs") - before))
        [ "$added" -lt "$missing" ] &&
            echo "hugepages: asked the kernel for $missing huge pages, got $added" >&2
    fi
    trap 'echo $(($(cat "$sysfs") - added)) >"$sysfs"' EXIT
    trap 'exit 1' INT TERM
    "$@"
) 9>"$lock"
