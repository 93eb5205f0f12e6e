#!/usr/bin/env bash
# Replays the real traces in ../shared/traces (and the bundled one) under the shim on the fake
# driver: every allocation and free must go through, and the cache must serve most of them.
set -euo pipefail
player=$1 shim=$2 fakedir=$3 traces=$4
here=$(cd "$(dirname "$0")" && pwd)
files=("$here/data/cupy.trace.gz")
for t in "$traces"/*.trace.gz; do [ -f "$t" ] && files+=("$t"); done
status=0
for t in "${files[@]}"; do
  out=$(LD_LIBRARY_PATH=$fakedir LD_PRELOAD=$shim ASAN_OPTIONS=verify_asan_link_order=0 "$player" "$t")
  echo "$out"
  rate=$(sed -n 's/.* hit_rate=\([0-9.]*\).*/\1/p' <<<"$out")
  if [ -z "$rate" ]; then echo "FAIL $t: no statistics from the shim"; status=1; continue; fi
  if ! awk -v r="$rate" 'BEGIN { exit !(r >= 0.90) }'; then echo "FAIL $t: hit rate $rate < 0.90"; status=1; fi
done
exit $status
