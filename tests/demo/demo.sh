#!/bin/sh
# make demo: start kvcd with built-in defaults on a private socket, run three engine
# processes whose prompts share a 4096-token system prefix, print their figures and
# `kvcctl stats`, then stop the daemon.
set -eu
B=${1:-build}
dir=$(mktemp -d /tmp/kvcd-demo.XXXXXX)
sock="$dir/kvcd.sock"
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
echo "== kvcd (pid $pid) is serving $sock"
echo "== engine A runs first: nothing is cached, it computes and stores its prompt"
"$B/bin/kvc-demo" -s "$sock" --name A --seed 1
echo "== engines B and C run side by side: they load the shared prefix instead of computing it"
"$B/bin/kvc-demo" -s "$sock" --name B --seed 2 &
b=$!
"$B/bin/kvc-demo" -s "$sock" --name C --seed 3 &
c=$!
wait $b
wait $c
echo "== engine A again: its whole prompt is cached"
"$B/bin/kvc-demo" -s "$sock" --name A2 --seed 1
echo "== kvcctl stats"
"$B/bin/kvcctl" -s "$sock" status
"$B/bin/kvcctl" -s "$sock" stats
kill -TERM $pid
wait $pid
trap 'rm -rf "$dir"' EXIT
echo "== kvcd stopped; its log:"
cat "$dir/kvcd.log"
