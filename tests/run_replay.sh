#!/usr/bin/env bash
# Replays the real traces in ../shared/traces (and the bundled one) under the shim on the fake
# driver: every allocation and free must go through, and the cache must serve most of them.
#
#   run_replay.sh TRACE_PLAYER LIBCACHESHIM FAKE_DIR TRACES_DIR [CACHESHIM_REPLAY]
#
# Each trace runs with each backend:
#   - pooled (the default): at least 95 % of the allocations served without new memory from
#     the driver, at most 1.10 x the program's peak held (resnet: 1.098), and at least 90 %
#     hits (a cached block, or one carved out of the pool's free memory: no driver call);
#   - classic (CACHESHIM_BACKEND=classic): at least 90 % hits.
# With CACHESHIM_REPLAY, the classic run and a pooled run with CACHESHIM_HEADROOM=1000 (no
# moves) must give exactly the hits, misses, peak reserved and driver allocations that
# cacheshim-replay computes for the same trace on its simulated device.
set -euo pipefail
player=$1 shim=$2 fakedir=$3 traces=$4 replay=${5:-}
here=$(cd "$(dirname "$0")" && pwd)
files=("$here/data/cupy.trace.gz")
for t in "$traces"/*.trace.gz; do [ -f "$t" ] && files+=("$t"); done
status=0

field() { sed -n "s/.* $1=\([0-9.]*\).*/\1/p" <<<"$2"; }
at_least() { awk -v a="$1" -v b="$2" 'BEGIN { exit !(a >= b) }'; }

# The simulated numbers of a run, as the player prints them: hits misses peak_reserved allocs.
simulated() {
  "$replay" --json "$@" | python3 -c '
import json, sys
r = json.load(sys.stdin)["runs"][0]
print(r["hits"], r["misses"], r["peak_reserved"], r["driver_allocs"])'
}

for t in "${files[@]}"; do
  for backend in pooled classic roomy; do
    env=(CACHESHIM_BACKEND=pooled) sim=()
    case $backend in
      classic) env=(CACHESHIM_BACKEND=classic) sim=(--backend classic) ;;
      roomy) env=(CACHESHIM_BACKEND=pooled CACHESHIM_HEADROOM=1000) sim=(--headroom 1000) ;;
    esac
    out=$(env "${env[@]}" LD_LIBRARY_PATH=$fakedir LD_PRELOAD=$shim ASAN_OPTIONS=verify_asan_link_order=0 "$player" "$t")
    echo "$backend: $out"
    rate=$(field hit_rate "$out") allocs=$(field allocs "$out") dallocs=$(field driver_allocs "$out")
    ratio=$(field reserved_over_live "$out")
    if [ -z "$rate" ]; then echo "FAIL $t ($backend): no statistics from the shim"; status=1; continue; fi
    case $backend in
      pooled)
        if ! at_least "$rate" 0.90; then echo "FAIL $t (pooled): hit rate $rate < 0.90"; status=1; fi
        if ! at_least "$(awk -v a="$allocs" -v d="$dallocs" 'BEGIN { print 1 - d / a }')" 0.95; then
          echo "FAIL $t (pooled): $dallocs of $allocs allocations took new memory (> 5 %)"; status=1
        fi
        if ! at_least 1.10 "$ratio"; then echo "FAIL $t (pooled): reserved/live $ratio > 1.10"; status=1; fi
        ;;
      classic)
        if ! at_least "$rate" 0.90; then echo "FAIL $t (classic): hit rate $rate < 0.90"; status=1; fi
        ;;
    esac
    if [ -n "$replay" ] && [ "$backend" != pooled ]; then
      want=$(simulated "${sim[@]}" "$t")
      got="$(field hits "$out") $(field misses "$out") $(field peak_reserved "$out") $dallocs"
      if [ "$got" != "$want" ]; then
        echo "FAIL $t ($backend): the shim gave hits, misses, peak reserved, driver allocs $got; cacheshim-replay $want"
        status=1
      fi
    fi
  done
done
exit $status
