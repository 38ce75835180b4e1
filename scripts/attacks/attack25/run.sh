#!/usr/bin/env bash
# attack25 end to end (docs/benchmarks/attack25.md): servers A (auto), M (merged:acme/support@r1),
# and a fresh one per public-squat run, each on a copy of the test demo set with 4 GPU slots.
# Nothing here is timed (counts of statuses, tiers and answers). Usage, from the repo root:
#   scripts/attacks/attack25/run.sh [WORK_DIR]
set -euo pipefail
W=${1:-/tmp/a25}
PY=${PY:-/work/main/.venv-test/bin/python}
HERE=scripts/attacks/attack25
export PYTHONPATH=$PWD
mkdir -p "$W"
pids=()
trap 'kill "${pids[@]}" 2>/dev/null || true' EXIT

serve() {  # DIR PORT [ARGS...]: a server on a copy of the demo set; keys in DIR/{admin,acme,globex}
  local dir=$1 port=$2
  shift 2
  mkdir -p "$dir"
  [ -d "$dir/demo-assets" ] || cp -r .loraplex-assets/test-small "$dir/demo-assets"
  chrt -i 0 nice -n 19 "$PY" -m loraplex serve --data-dir "$dir" --port "$port" "$@" \
    >"$dir/out" 2>"$dir/err" &
  pids+=($!)
  until grep -q "initech key" "$dir/out" 2>/dev/null; do sleep 2; done
  cp "$dir/admin-key" "$dir/admin"
  for t in acme globex; do grep -o "$t key: *[^ ]*" "$dir/out" | awk '{print $3}' >"$dir/$t"; done
}
keys() { echo "$(cat "$1/admin"),$(cat "$1/acme"),$(cat "$1/globex")"; }

serve "$W/a" 18251 --mode auto --max-loras 4
serve "$W/m" 18252 --mode merged:acme/support@r1 --max-loras 4
A=$W/a M=$W/m
"$PY" $HERE/field-matrix.py --url http://127.0.0.1:18251 --key "$(cat $A/acme)"
"$PY" $HERE/field-matrix.py --url http://127.0.0.1:18252 --key "$(cat $M/acme)" --model support@r1
cat /proc/loadavg
"$PY" $HERE/seed-merge.py --reference http://127.0.0.1:18251 --merged http://127.0.0.1:18252 \
  --ref-keys "$(keys $A)" --merged-keys "$(keys $M)" --seeds 12
cat /proc/loadavg
"$PY" $HERE/fanout-cancel.py --url http://127.0.0.1:18251 --admin-key "$(cat $A/admin)" \
  --hostile-key "$(cat $A/acme)" --victim-key "$(cat $A/globex)" --seconds 90
cat /proc/loadavg
"$PY" $HERE/admin-reach.py --url http://127.0.0.1:18251 --admin-key "$(cat $A/admin)" \
  --key "$(cat $A/acme)"

serve "$W/c" 18253 --max-loras 4
"$PY" $HERE/public-squat.py --url http://127.0.0.1:18253 --admin-key "$(cat $W/c/admin)" \
  --attacker-key "$(cat $W/c/acme)" --owner-key "$(cat $W/c/globex)" \
  --owner-models codegen,summarize --phase-s 60 --phases A,B,B,A
serve "$W/d" 18254 --max-loras 4
"$PY" $HERE/public-squat.py --url http://127.0.0.1:18254 --admin-key "$(cat $W/d/admin)" \
  --attacker-key "$(cat $W/d/acme)" --owner-key "$(cat $W/d/globex)" \
  --owner-models codegen,summarize --phase-s 60 --settle-s 0 --phases A,B,O,O,O,O,O,O
