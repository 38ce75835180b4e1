#!/usr/bin/env bash
# attack27 (docs/benchmarks/attack27.md, "Not fixed"): do a tenant's `--gpu` releases hold GPU
# slots beyond its `default_tenant_tier_share`? Against one `loraplex serve --max-loras 4` on the
# demo set (share 0.5: two slots per tenant), with the admin key: registers a second revision
# (`x1`, another demo adapter's files) of acme's billing, legal and triage, starts a release of
# each with `gpu: true` and a 600 s dwell (canary for at least that long), then sends globex's
# `search` and `codegen` alternately, 20 requests, 1 token each, counting the tier each was
# leased from (`x-loraplex-tier`); rolls the three releases back and counts again. Counts, not
# timings (not under the bench lock). Usage: gpu-prewarm-share.sh URL DATA_DIR (DATA_DIR holds
# `admin-key`, `globex` (its key) and `demo-assets`).
set -euo pipefail
U=$1 D=$2
A=$(cat "$D/admin-key") GX=$(cat "$D/globex")
declare -A SRC=([billing]=globex/codegen [legal]=globex/summarize [triage]=initech/chat)
for n in billing legal triage; do
  d=$D/demo-assets/adapters/${SRC[$n]}/r1
  curl -s -o /dev/null -w "register acme/$n@x1 %{http_code}\n" "$U/admin/adapters/upload" \
    -H "Authorization: Bearer $A" -F config=@"$d/adapter_config.json" \
    -F weights=@"$d/adapter_model.safetensors" -F tenant=acme -F name=$n -F revision=x1
  curl -s -o /dev/null -w "release acme/$n@x1 %{http_code}\n" "$U/admin/releases" \
    -H "Authorization: Bearer $A" -H 'Content-Type: application/json' \
    -d "{\"tenant\":\"acme\",\"name\":\"$n\",\"revision\":\"x1\",\"gpu\":true,\"dwell_s\":600.0}"
done
sleep 20  # prewarm and probe (the uploads have no probe of their own)
l0() {
  curl -s "$U/admin/residency" -H "Authorization: Bearer $A" | python3 -c \
    'import json,sys; print("L0:", [(e["model"], e["pinned"]) for e in json.load(sys.stdin)["entries"] if e["tier"] == "L0"])'
}
tiers() {
  for _ in $(seq 1 10); do for m in search codegen; do
    curl -s -D - -o /dev/null "$U/v1/completions" -H "Authorization: Bearer $GX" \
      -H 'Content-Type: application/json' -d "{\"model\":\"$m\",\"prompt\":\"x\",\"max_tokens\":1}" |
      tr -d '\r' | awk 'tolower($1) == "x-loraplex-tier:" {print $2}'
  done; done | sort | uniq -c | tr '\n' ' '; echo
}
l0; echo -n "globex with acme's releases in canary: "; tiers
for n in billing legal triage; do
  curl -s -o /dev/null -w "rollback acme/$n %{http_code}\n" -X POST "$U/admin/releases/acme/$n/rollback" \
    -H "Authorization: Bearer $A"
done
sleep 3; l0; echo -n "globex after the rollbacks: "; tiers
