#!/usr/bin/env bash
# squat-once.sh SRC DIR PORT: a fresh server from the tree SRC (4 GPU slots) on a copy of the demo
# set in DIR, then public-squat.py A,B,B,A at 30 s (docs/benchmarks/attack25.md, "Fixed (squatfix)").
# Counts, not timings. The "before" tree: git archive attack25 | tar -x -C SRC, with SRC/.loraplex-assets linked.
set -euo pipefail
SRC=$1 dir=$2 port=$3
here=$(cd "$(dirname "$0")" && pwd)  # public-squat.py beside this script (not SRC's)
PY=/work/main/.venv-test/bin/python
cd "$SRC"; export PYTHONPATH=$SRC
mkdir -p "$dir"; cp -r .loraplex-assets/test-small "$dir/demo-assets"
chrt -i 0 nice -n 19 "$PY" -m loraplex serve --data-dir "$dir" --port "$port" --max-loras 4 >"$dir/out" 2>"$dir/err" &
spid=$!
trap 'kill $spid 2>/dev/null || true' EXIT
until grep -q "initech key" "$dir/out" 2>/dev/null; do sleep 2; done
for t in acme globex; do grep -o "$t key: *[^ ]*" "$dir/out" | awk '{print $3}' >"$dir/$t"; done
# the keys come before the engine takes requests: without this wait a loaded machine answered
# the first phase's first requests 503 (engine starting)
until curl -sf "http://127.0.0.1:$port/ready" >/dev/null; do sleep 2; done
cat /proc/loadavg
"$PY" "$here/public-squat.py" --url http://127.0.0.1:$port --admin-key "$(cat $dir/admin-key)" \
  --attacker-key "$(cat $dir/acme)" --owner-key "$(cat $dir/globex)" \
  --owner-models codegen,summarize --phase-s 30 --phases A,B,B,A
cat /proc/loadavg
curl -s -H "Authorization: Bearer $(cat $dir/admin-key)" http://127.0.0.1:$port/admin/residency > "$dir/residency.json" || true
