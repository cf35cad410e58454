#!/bin/sh
# Installs what kvcd needs to build and test on Debian 12. Safe to run again:
# it installs only what is missing. As non-root it prints the command to run.
set -eu
pkgs="build-essential pkg-config liburing-dev libinih-dev libzstd-dev libxxhash-dev \
libsystemd-dev libsodium-dev libjansson-dev check gnuplot-nox fio redis-server memcached python3-dev python3-numpy \
python3-pytest python3-torch libhiredis-dev libmemcached-dev libasan8 libubsan1 libtsan2"
missing=""
for p in $pkgs; do
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
