#!/bin/sh
# device-bundle.sh BUILD_DIR BUNDLE_DIR "SUITES" "BENCHES" — what `make device-bundle` runs:
# one self-contained folder for a GPU host that has the NVIDIA driver and CUDA but none of
# Debian's libraries (liburing, inih, xxhash, zstd, libsystemd, hiredis, check):
#   bin/     kvcd, kvcctl (stripped)
#   tests/   the GPU suites (stripped)
#   bench/   the GPU benchmarks, bench_host and bench_scale (stripped)
#   lib/     every shared library they load that is not glibc's own (libc, libm, libdl,
#            librt, libpthread, the loader) nor the driver's (libcuda, loaded by the CUDA
#            runtime linked into the binaries), copied under its soname; etc/device-check.sh
#            puts it first on LD_LIBRARY_PATH, which the processes the tests start inherit
#   pylib/   libkvc.a and CUDA's libcudart_static.a, which device-check.sh links the Python
#            package's extension against on the host, for the host's own Python (its version
#            and PyTorch are the host's: the extension cannot be built here)
#   MANIFEST the commit, the toolchain, and each file's size
# bin/, tests/, bench/, lib/ and pylib/ travel as one archive, programs.tar.xz, which
# device-check.sh unpacks in place before its first stage (with xz and tar, or Python's
# tarfile where the host has no xz): each program carries the same CUDA kernels for every
# target, ~10 MB, and one stream with xz's 64 MiB window stores them once (178 MB of
# programs in ~6 MB, where each gzip'd alone took ~3 MB: 57 MiB in all at the last count).
# The tests find kvcd and kvcctl through $KVC_TEST_BIN_DIR (tests/lib/daemon.c), which the
# check script points at bin/, so the folder works wherever it lands. Fails (non-zero, one
# line) when a binary is missing, a library cannot be resolved here, or the folder is 60 MiB
# or more.
set -eu
b=$1
out=$2
suites=$3
benches=$4
max=$((60 * 1024 * 1024))
die() {
    echo "device-bundle: $*" >&2
    exit 1
}
rm -rf "$out"
mkdir -p "$out/bin" "$out/tests" "$out/bench" "$out/lib" "$out/pylib"
copy() { # src dst-dir
    [ -x "$1" ] || die "$1 is missing (build it first)"
    cp "$1" "$2/"
    strip --strip-unneeded "$2/$(basename "$1")" || die "strip $1 failed"
}
copy "$b/bin/kvcd" "$out/bin"
copy "$b/bin/kvcctl" "$out/bin"
for s in $suites; do copy "$b/tests/$s" "$out/tests"; done
for s in $benches; do copy "$b/bench/$s" "$out/bench"; done
# The libraries: what ldd resolves here, glibc and the driver left to the host.
for f in "$out"/bin/* "$out"/tests/* "$out"/bench/*; do
    ldd "$f" | while read -r name arrow path rest; do
        case "$name" in
        linux-vdso.so.* | ld-linux*.so.* | /lib*/ld-linux*) continue ;;
        libc.so.* | libm.so.* | libdl.so.* | librt.so.* | libpthread.so.* | libresolv.so.*) continue ;;
        libcuda.so.*) continue ;;
        esac
        [ "$arrow" = "=>" ] || continue
        [ "$path" != "not" ] || die "$(basename "$f"): $name not found here"
        [ -e "$out/lib/$name" ] || cp -L "$path" "$out/lib/$name"
    done
done
chmod 0644 "$out"/lib/*
# The Python extension's static parts (linked on the host by etc/device-check.sh).
[ -f "$b/lib/libkvc.a" ] || die "$b/lib/libkvc.a is missing (build it first)"
cp "$b/lib/libkvc.a" "$out/pylib/"
# bench_python.py's C baseline calls libkvc.so through ctypes.
[ -f "$b/lib/libkvc.so.1" ] || die "$b/lib/libkvc.so.1 is missing (build it first)"
cp "$b/lib/libkvc.so.1" "$out/pylib/libkvc.so"
strip --strip-unneeded "$out/pylib/libkvc.so" || die "strip libkvc.so failed"
cudart=$(dirname "$(dirname "${NVCC:-/usr/local/cuda/bin/nvcc}")")/lib64/libcudart_static.a
[ -f "$cudart" ] || die "$cudart is missing (a CUDA build is needed for the device)"
cp "$cudart" "$out/pylib/"
# Every binary must resolve into the bundle with the host's libraries hidden.
for f in "$out"/bin/* "$out"/tests/* "$out"/bench/*; do
    if LD_LIBRARY_PATH="$out/lib" ldd "$f" | grep -q "not found"; then
        die "$(basename "$f") does not resolve from $out/lib"
    fi
done
{
    echo "kvcd device bundle"
    echo "commit: $(git -C "$(dirname "$0")/.." rev-parse HEAD 2>/dev/null || echo unknown)"
    echo "built: $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(uname -n)"
    echo "nvcc: $(${NVCC:-nvcc} --version 2>/dev/null | tail -n 1 || echo unknown)"
    echo "glibc: $(ldd --version | head -n 1)"
    (cd "$out" && find bin tests bench lib pylib -type f | sort | xargs ls -l |
        awk '{print $5, $9}')
} >"$out/MANIFEST"
# One archive of it all (see the top): xz -9's window reaches across the programs.
command -v xz >/dev/null 2>&1 || die "xz is missing (apt-get install xz-utils)"
(cd "$out" && tar -cf - bin tests bench lib pylib) | xz -9 -T1 >"$out/programs.tar.xz" ||
    die "packing $out/programs.tar.xz failed"
rm -rf "$out/bin" "$out/tests" "$out/bench" "$out/lib" "$out/pylib"
size=$(du -sb "$out" | cut -f1)
[ "$size" -lt "$max" ] || die "$out is $size bytes, above the 60 MiB a device host takes"
echo "device-bundle: $out, $((size / 1024 / 1024)) MiB ($(grep -c '^[0-9]* lib/' "$out/MANIFEST") libraries)"
