"""The vLLM user's migration, against a running loraplex serve (args: base URL, admin key,
import dir). Prints each step's outcome as JSON lines."""

import json
import sys

import httpx
import openai

URL, ADMIN, IMPORT = sys.argv[1], sys.argv[2], sys.argv[3]
A = {"Authorization": f"Bearer {ADMIN}"}


def show(step, value):
    print(json.dumps({"step": step, "value": value}, default=str)[:1500], flush=True)


with httpx.Client(base_url=URL, timeout=60) as h:
    # a single-tenant vLLM setup: one tenant
    r = h.post("/admin/tenants", headers=A, json={"name": "prod"})
    show("create tenant prod", [r.status_code, r.json()])
    r = h.post("/admin/tenants/prod/keys", headers=A)
    key = r.json()["token"]
    show("tenant key", r.status_code)
    # vLLM's load with a plain lora_name
    r = h.post("/v1/load_lora_adapter", headers=A,
               json={"lora_name": "sql-lora", "lora_path": f"{IMPORT}/support-r1"})
    show("load plain lora_name", [r.status_code, r.json()])
    r = h.post("/v1/load_lora_adapter", headers=A,
               json={"lora_name": "prod/sql-lora", "lora_path": f"{IMPORT}/support-r1"})
    show("load prod/sql-lora", [r.status_code, r.text])
    r = h.post("/v1/load_lora_adapter", headers=A,
               json={"lora_name": "prod/sql-lora", "lora_path": f"{IMPORT}/support-r1",
                     "load_inplace": True})
    show("load load_inplace", [r.status_code, r.text])
    r = h.post("/v1/load_lora_adapter",
               json={"lora_name": "prod/x", "lora_path": f"{IMPORT}/support-r1"})
    show("load without key (vLLM: no auth)", [r.status_code, r.text])
    r = h.post("/v1/load_lora_adapter", headers={"Authorization": f"Bearer {key}"},
               json={"lora_name": "prod/x", "lora_path": f"{IMPORT}/support-r1"})
    show("load with tenant key", [r.status_code, r.text])

    c = openai.OpenAI(base_url=f"{URL}/v1", api_key=key)
    show("models", [m.id for m in c.models.list().data])
    out = c.completions.create(model="sql-lora", prompt="The acme support team", max_tokens=6,
                               temperature=0, n=2, logprobs=2)
    show("completion n=2 logprobs=2", out.model_dump())
    chunks = list(c.completions.create(model="sql-lora", prompt="The acme support team",
                                       max_tokens=4, temperature=0, stream=True,
                                       stream_options={"include_usage": True}))
    show("completion stream", [ch.model_dump() for ch in chunks[:2]] + [chunks[-1].model_dump()])
    ch = c.chat.completions.create(model="sql-lora", messages=[{"role": "user", "content": "hi"}],
                                   max_tokens=4, temperature=0, logprobs=True, top_logprobs=2)
    show("chat logprobs", ch.model_dump())
    st = list(c.chat.completions.create(model="sql-lora",
                                        messages=[{"role": "user", "content": "hi"}],
                                        max_tokens=3, stream=True))
    show("chat stream", [x.model_dump() for x in st[:2]])
    base = c.models.list().data[0].id
    b = c.completions.create(model=base, prompt="The", max_tokens=3, temperature=0)
    show("base by its name", [b.model, b.choices[0].text, b.model_extra])
    for model in ("/models/loraplex-demo-small", "nope"):
        try:
            c.completions.create(model=model, prompt="x", max_tokens=1)
        except openai.APIStatusError as exc:
            show(f"error model={model}", [exc.status_code, type(exc).__name__, exc.body])
    try:
        c.completions.create(model="sql-lora", prompt="x", max_tokens=1, extra_body={"zz": 1})
    except openai.APIStatusError as exc:
        show("error unknown field", [exc.status_code, exc.body])
    r = h.post("/v1/unload_lora_adapter", headers=A, json={"lora_name": "prod/sql-lora"})
    show("unload", [r.status_code, r.text])
    out = c.completions.create(model="sql-lora", prompt="The acme support team", max_tokens=2)
    show("after unload still served", out.choices[0].text)
    r = h.post("/v1/unload_lora_adapter", headers=A, json={"lora_name": "sql-lora"})
    show("unload plain name", [r.status_code, r.text])
    r = h.get("/metrics", headers=A)
    names = sorted({line.split("{")[0].split(" ")[0] for line in r.text.splitlines()
                    if line and not line.startswith("#")})
    show("metric names", names)
    show("vllm metrics", [ln for ln in r.text.splitlines() if ln.startswith("vllm:")])
