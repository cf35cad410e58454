#!/bin/sh
# make demo: start kvcd with built-in defaults on a private socket, run engine processes
# whose prompts share a 4096-token system prefix (tests/demo/kvc-demo.c), print a line per
# engine run and a three-line summary, then stop the daemon.
#
#   demo.sh [--stats] [BUILD_DIR]    (make demo DEMO_STATS=1 passes --stats)
#
# --stats adds `kvcctl status`, `kvcctl stats` and the daemon's log. The summary's time
# saved counts the hit tokens at the rate engine A computed its prompt; the daemon is given
# that same rate (cache.recompute_tokens_per_s), so `kvcctl status` estimates alike.
set -eu
stats=0
if [ "${1:-}" = --stats ]; then
    stats=1
    shift
fi
B=${1:-build}
dir=$(mktemp -d /tmp/kvcd-demo.XXXXXX)
sock="$dir/kvcd.sock"
rec="$dir/runs"
"$B/bin/kvcd" -o server.socket="$sock" -o host.size=256m 2>"$dir/kvcd.log" &
pid=$!
trap 'kill $pid 2>/dev/null; wait $pid 2>/dev/null; rm -rf "$dir"' EXIT
i=0
until [ -S "$sock" ]; do
    i=$((i + 1))
    if [ $i -gt 100 ] || ! kill -0 $pid 2>/dev/null; then
        echo "demo: kvcd did not start:" >&2
        cat "$dir/kvcd.log" >&2
        exit 1
    fi
    sleep 0.1
done
echo "== kvcd (pid $pid) serves $sock; each engine's KV cache is one buffer allocated once"
echo "== with malloc (16 bytes past a page) and zeroed at start, as an engine's pool is"
echo "== engine A runs first: nothing is cached, it computes and stores its prompt"
"$B/bin/kvc-demo" -s "$sock" --name A --seed 1 --record "$rec"
# The daemon estimates recompute time at the rate A just measured, as the summary does.
rate=$(awk '$1 == "name=A" { split($3, c, "="); split($7, t, "=");
    printf "%d", (t[2] > 0 ? c[2] / t[2] : 8000) + 0.5 }' "$rec")
"$B/bin/kvcctl" -s "$sock" config set cache.recompute_tokens_per_s "$rate" >/dev/null
echo "== engines B and C run side by side: they load the shared prefix instead of computing it"
"$B/bin/kvc-demo" -s "$sock" --name B --seed 2 --record "$rec" &
b=$!
"$B/bin/kvc-demo" -s "$sock" --name C --seed 3 --record "$rec" &
c=$!
wait $b
wait $c
echo "== engine A again: its whole prompt is cached"
"$B/bin/kvc-demo" -s "$sock" --name A2 --seed 1 --record "$rec"
echo "== summary"
awk -v rate="$rate" '
    { for (i = 1; i <= NF; i++) { split($i, kv, "="); v[kv[1]] = kv[2] }
      hit += v["hit_tokens"]; comp += v["computed_tokens"]; bytes += v["load_bytes"]
      load += v["load_s"]; mc += v["memcpy_s"]; runs++ }
    END {
        printf "tokens: %d loaded from kvcd, %d computed (%d engine runs, %d prompt tokens)\n",
            hit, comp, runs, hit + comp
        printf "load:   %.1f MiB in %.1f ms through kvc_get_prefix, %.2f GB/s; memcpy of the same bytes into the same buffers: %.2f GB/s (%.2fx)\n",
            bytes / 1048576, load * 1e3, bytes / load / 1e9, bytes / mc / 1e9, mc / load
        printf "saved:  %.0f ms: recomputing the %d loaded tokens at engine A'"'"'s %d tokens/s would take %.0f ms, loading them took %.1f ms\n",
            hit / rate * 1e3 - load * 1e3, hit, rate, hit / rate * 1e3, load * 1e3
    }' "$rec"
if [ $stats = 1 ]; then
    echo "== kvcctl status"
    "$B/bin/kvcctl" -s "$sock" status
    echo "== kvcctl stats"
    "$B/bin/kvcctl" -s "$sock" stats
fi
kill -TERM $pid
wait $pid
trap 'rm -rf "$dir"' EXIT
if [ $stats = 1 ]; then
    echo "== kvcd stopped; its log:"
    cat "$dir/kvcd.log"
fi
