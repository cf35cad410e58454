#!/bin/sh
# device-bundle-test.sh OUTDIR — runs etc/device-check.sh from build/device-bundle (make
# device-bundle) the way a bare GPU host would, on this machine: in a chroot that holds a
# copy of the tree and the bundle, glibc, libstdc++, a shell and the tools the scripts call,
# and none of the libraries the bundle carries (liburing, inih, xxhash, zstd, libsystemd,
# hiredis, check's subunit and what they pull in). The chroot lives in its own mount
# namespace (unshare -m), with /proc, /dev and a fresh /tmp; it is removed at the end.
# Needs root (chroot, mounts). Writes device-check's files into OUTDIR; exits with its status.
# KVC_DEVICE_CHECK_SECONDS (default 350) passes through: a slower machine than a GPU host
# (bench_host alone can take minutes on two shared cores) gives the check more time.
set -eu
out=$1
root=$(cd "$(dirname "$0")/.." && pwd)
bundle=$root/build/device-bundle
[ -f "$bundle/programs.tar.xz" ] || [ -x "$bundle/bin/kvcd" ] || {
    echo "device-bundle-test: no bundle (make device-bundle)" >&2
    exit 1
}
mkdir -p "$out"
out=$(cd "$out" && pwd)
jail=$(mktemp -d /tmp/kvc-jail.XXXXXX)
trap 'rm -rf "$jail"' EXIT
mkdir -p "$jail/repo" "$jail/tmp" "$jail/var/tmp" "$jail/proc" "$jail/dev" "$jail/out" \
    "$jail/bin" "$jail/usr/bin" "$jail/lib64" "$jail/lib/x86_64-linux-gnu"
chmod 1777 "$jail/tmp" "$jail/var/tmp"
# the tree as a device host gets it: the tracked files and the bundle
(cd "$root" && git ls-files -z --cached --others --exclude-standard | xargs -0 cp --parents -t "$jail/repo")
mkdir -p "$jail/repo/build"
cp -a "$bundle" "$jail/repo/build/device-bundle"
# what the bundle must not find outside itself
carried=$(sed -n 's|^[0-9]* lib/||p' "$bundle/MANIFEST")
tools="sh bash env cat grep sed tail head date timeout basename dirname mkdir mktemp rm tee tr
cut wc ls nproc sleep readlink uname ldd true false echo gzip chmod cp mv tar xz"
for t in $tools; do
    p=
    for d in /usr/bin /bin /usr/sbin /sbin; do
        [ -z "$p" ] && [ -x "$d/$t" ] && p=$d/$t
    done
    [ -n "$p" ] || {
        echo "device-bundle-test: no $t here" >&2
        exit 1
    }
    [ -e "$jail/bin/$t" ] || ln -s "/usr/bin/$t" "$jail/bin/$t"
    libs=$(ldd "$p" 2>/dev/null | awk '/=>/ {print $3} /^\t\/lib64/ {print $1}')
    # A tool that needs a library the bundle carries (xz: liblzma) would hide a missing copy
    # in the system's folders: it gets its libraries in a folder of its own, which only its
    # wrapper puts on the loader's path.
    private=
    for lib in $libs; do
        if echo "$carried" | grep -qx "$(basename "$lib")"; then
            private=1
        fi
    done
    if [ -n "$private" ]; then
        mkdir -p "$jail/opt/$t/lib"
        cp -L "$p" "$jail/opt/$t/$t"
        for lib in $libs; do
            case "$lib" in */ld-linux*) continue ;; esac
            cp -Ln "$lib" "$jail/opt/$t/lib/"
        done
        printf '#!/bin/sh\nLD_LIBRARY_PATH=/opt/%s/lib exec /opt/%s/%s "$@"\n' "$t" "$t" "$t" \
            >"$jail/usr/bin/$t"
        chmod +x "$jail/usr/bin/$t"
        continue
    fi
    cp -L "$p" "$jail/usr/bin/$t"
    for lib in $libs; do
        cp -Ln "$lib" "$jail/lib/x86_64-linux-gnu/$(basename "$lib")"
    done
done
cp -L /lib64/ld-linux-x86-64.so.2 "$jail/lib64/"
for l in libc.so.6 libm.so.6 libdl.so.2 librt.so.1 libpthread.so.0 libresolv.so.2; do
    cp -Ln "/lib/x86_64-linux-gnu/$l" "$jail/lib/x86_64-linux-gnu/" 2>/dev/null || true
done
rc=0
unshare -m sh -c "
    mount -t proc proc '$jail/proc' &&
    mount --rbind /dev '$jail/dev' &&
    mount --bind '$out' '$jail/out' &&
    chroot '$jail' /usr/bin/env -i PATH=/usr/bin:/bin HOME=/tmp \
        KVC_DEVICE_CHECK_SECONDS=${KVC_DEVICE_CHECK_SECONDS:-350} \
        sh -c 'cd /repo && sh etc/device-check.sh /out'
" || rc=$?
echo "device-bundle-test: device-check.sh in the chroot: exit $rc"
exit $rc
