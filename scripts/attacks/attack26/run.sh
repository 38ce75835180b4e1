#!/usr/bin/env bash
# attack26 merge-charge (docs/benchmarks/attack26.md): a fresh `--mode auto --max-loras 4` server
# from the tree SRC on a copy of the test demo set in DIR, then merge-charge.py. Counts, not
# timings (not under the bench lock). Usage, from the repo root:
#   scripts/attacks/attack26/run.sh SRC DIR PORT [merge-charge.py args...]
# The "before" tree: git archive main | tar -x -C SRC, with SRC/.loraplex-assets linked.
set -euo pipefail
SRC=$1 dir=$2 port=$3
shift 3
PY=${PY:-/work/main/.venv-test/bin/python}
HERE=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$dir"
[ -d "$dir/demo-assets" ] || cp -r "$SRC/.loraplex-assets/test-small" "$dir/demo-assets"
(cd "$SRC" && PYTHONPATH=$SRC exec chrt -i 0 nice -n 19 "$PY" -m loraplex serve --data-dir "$dir" \
  --port "$port" --mode auto --max-loras 4 >"$dir/out" 2>"$dir/err") &
spid=$!
trap 'kill $spid 2>/dev/null || true; wait $spid 2>/dev/null || true' EXIT
until grep -q "initech key" "$dir/out" 2>/dev/null; do sleep 2; done
for t in acme globex; do grep -o "$t key: *[^ ]*" "$dir/out" | awk '{print $3}' >"$dir/$t"; done
until curl -sf -o /dev/null -H "Authorization: Bearer $(cat "$dir/admin-key")" \
  "http://127.0.0.1:$port/admin/residency"; do sleep 2; done  # the engine process is up
cat /proc/loadavg
"$PY" "$HERE/merge-charge.py" --url "http://127.0.0.1:$port" --admin-key "$(cat "$dir/admin-key")" \
  --attacker-key "$(cat "$dir/acme")" --owner-key "$(cat "$dir/globex")" "$@"
cat /proc/loadavg
grep -i "mode transition" "$dir/err" || true
