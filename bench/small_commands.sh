#!/bin/bash
# Wall and CPU time of small tokcap commands on the temporary Prefect server (issue 57).
# usage: bench/small_commands.sh BEFORE_TOKCAP AFTER_TOKCAP WORKDIR
# Both binaries run alternately on one warm PREFECT_HOME (a first finalize migrates its
# database); each line gives wall, user+sys CPU (the server's included) and the load before.
set -eu
B=$1 A=$2 W=$3
mkdir -p "$W"; cd "$W"; export PREFECT_HOME=$W/home; unset PREFECT_API_URL
"$A" make-inputs --store "$W/store" --out "$W/in" --rollouts 56 --files 2 --id-prefix b >/dev/null
"$A" finalize --rollouts "$W/in/b-01.jsonl" --store "$W/store" --dest "$W/warm" --run-id w >/dev/null
m() {
  local label=$1; shift
  /usr/bin/time -f "$label %e s wall, %U+%S s cpu (load $(cut -d' ' -f1 /proc/loadavg))" "$@" \
    >/dev/null 2>"$W/err-$label.txt" || true
  tail -1 "$W/err-$label.txt"
}
for v in before after; do T=$B; [ $v = after ] && T=$A
  m finalize-$v "$T" finalize --rollouts "$W/in/b-02.jsonl" --store "$W/store" \
    --dest "$W/dest-$v" --run-id r --rows parquet --retire-after-consumer x
done
for v in before after; do T=$B; [ $v = after ] && T=$A
  m retire-$v "$T" retire --dest "$W/dest-$v" --run-id r --store "$W/store"; done
for v in before after; do T=$B; [ $v = after ] && T=$A
  m demo-$v "$T" demo --workdir "$W/demo-$v"; done
