#!/usr/bin/env bash
# attack24 end to end (docs/benchmarks/attack24.md): one `loraplex serve --mode auto --max-loras 4`
# for the logprobs, look-alike and cancellation probes, then four servers (tracing off, to a
# working sink, to a black hole, to a dead port; ratio 1) for the trace probes. Timed parts run
# under the bench lock. Usage: scripts/attacks/attack24/run.sh [WORK_DIR]  (from the repo root)
set -euo pipefail
W=${1:-/tmp/a24}
PY=${PY:-/work/main/.venv-test/bin/python}
HERE=scripts/attacks/attack24
export PYTHONPATH=$PWD
mkdir -p "$W"
pids=()
trap 'kill "${pids[@]}" 2>/dev/null || true' EXIT

serve() {  # DIR PORT [ARGS...]: start a server on a copy of the demo set; its keys in DIR/keys
  local dir=$1 port=$2
  shift 2
  mkdir -p "$dir"
  [ -d "$dir/demo-assets" ] || cp -r .loraplex-assets/test-small "$dir/demo-assets"
  chrt -i 0 nice -n 19 "$PY" -m loraplex serve --data-dir "$dir" --port "$port" "$@" \
    >"$dir/out" 2>"$dir/err" &
  pids+=($!)
  until grep -q "initech key" "$dir/out" 2>/dev/null; do sleep 2; done
  grep -o 'lpx[a-z_]*_[A-Za-z0-9_-]*' "$dir/out" | head -3 >"$dir/keys"
}
key() { sed -n "$2p" "$1/keys"; }  # 1: admin, 2: acme (hostile), 3: globex (victim)

serve "$W/main" 18241 --mode auto --max-loras 4
M=$W/main
"$PY" $HERE/logprobs-load.py --url http://127.0.0.1:18241 --hostile-key "$(key $M 2)" \
  --victim-key "$(key $M 3)" --seconds 90 --workers 12 --cancel 0.6 --seed 7
"$PY" $HERE/model-lookalike.py --url http://127.0.0.1:18241 --key "$(key $M 2)"
cat /proc/loadavg
flock /work/bench.lock nice -n -5 timeout 600 "$PY" $HERE/model-lookalike.py \
  --url http://127.0.0.1:18241 --key "$(key $M 2)" --timing-rounds 200 --skip-probe
cat /proc/loadavg
"$PY" $HERE/cancel-storm.py --url http://127.0.0.1:18241 --admin-key "$(key $M 1)" \
  --hostile-key "$(key $M 2)" --victim-key "$(key $M 3)" --seconds 100

PYTHONPATH=tests nice -n 19 "$PY" $HERE/trace-receivers.py --sink-port 18258 --hole-port 18259 \
  --spans "$W/spans.jsonl" &
pids+=($!)
servers=()
port=18251
for v in off sink hole dead; do
  mkdir -p "$W/t-$v"
  case $v in
    off) printf '[serve]\n' ;;
    sink) printf '[serve]\ntrace_endpoint = "http://127.0.0.1:18258/v1/traces"\n' ;;
    hole) printf '[serve]\ntrace_endpoint = "http://127.0.0.1:18259/v1/traces"\n' ;;
    dead) printf '[serve]\ntrace_endpoint = "http://127.0.0.1:18257/v1/traces"\n' ;;
  esac >"$W/t-$v/serve.toml"
  [ $v = off ] || printf 'trace_sample_ratio = 1.0\n' >>"$W/t-$v/serve.toml"
  serve "$W/t-$v" $port --config "$W/t-$v/serve.toml"
  servers+=("$v=http://127.0.0.1:$port=$(key "$W/t-$v" 3)=$(key "$W/t-$v" 2)")
  port=$((port + 1))
done
"$PY" $HERE/trace-probe.py --headers --url http://127.0.0.1:18252 --hostile-key "$(key "$W/t-sink" 2)" \
  --victim-key "$(key "$W/t-sink" 3)" --spans "$W/spans.jsonl"
"$PY" $HERE/trace-probe.py --timing --servers "${servers[@]}" --rounds 1 --per-round 4  # warm-up
for flood in 0 4; do
  cat /proc/loadavg
  flock /work/bench.lock nice -n -5 timeout 600 "$PY" $HERE/trace-probe.py --timing \
    --servers "${servers[@]}" --rounds 8 --per-round 8 --flood $flood
  cat /proc/loadavg
done
