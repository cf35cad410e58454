#!/bin/sh
# Installs what kvcd needs on Debian 12, by set; safe to run again: it installs only what is
# missing. As non-root it prints the command to run.
#
#   install-deps.sh [build] [test] [bench]     no argument: all three
#
#   build  compile kvcd, libkvc, kvcctl, kvcreplay, kvcsim and the C demo (make, make demo)
#   test   the suites of make check: Check, the sanitizers' runtimes, the Python package's
#          headers and pytest suite (numpy, PyTorch), redis-server for the remote tier's
#          cluster, promtool (Debian's prometheus) for the metrics lint
#   bench  the peers and tools the benchmarks measure against (make bench, and make check's
#          smoke run of every benchmark): fio, memcached and libmemcached, redis-server, and
#          gnuplot for the policy plots
set -eu
build="build-essential pkg-config liburing-dev libinih-dev libzstd-dev libxxhash-dev \
libsystemd-dev libsodium-dev libhiredis-dev libjansson-dev"
test="check libasan8 libubsan1 libtsan2 python3-dev python3-numpy python3-pytest python3-torch \
redis-server prometheus"
bench="fio memcached libmemcached-dev redis-server gnuplot-nox"
[ $# -gt 0 ] || set -- build test bench
pkgs=""
for set in "$@"; do
    case "$set" in
    build) pkgs="$pkgs $build" ;;
    test) pkgs="$pkgs $test" ;;
    bench) pkgs="$pkgs $bench" ;;
    *)
        echo "install-deps.sh: unknown set '$set' (build, test or bench)" >&2
        exit 2
        ;;
    esac
done
missing=""
for p in $pkgs; do
    case " $missing " in *" $p "*) continue ;; esac
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing="$missing $p"
done
[ -z "$missing" ] && exit 0
if [ "$(id -u)" -ne 0 ]; then
    echo "kvcd: missing packages:$missing" >&2
    echo "run: sudo apt-get update && sudo apt-get install -y$missing" >&2
    exit 1
fi
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends $missing
