"""What each adapter a cell sends to must answer: the revisions its alias names at send time
(read from the admin API), its quality probe, and where its files are on this machine (for the
offline reference; None when they are not here)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from loraplex.qualify.client import Admin, QualifyError
from loraplex.qualify.population import GeneratedAdapter
from loraplex.server.admin_models import shown_with_every_revision

GENERATED_PROBE_TOKENS = 8  # a generated adapter's probe: its greedy continuation this long


@dataclass(frozen=True)
class Target:
    """One adapter alias traffic names, and how its answers are judged."""

    tenant: str  # the tenant sending (the alias's owner)
    alias: str  # tenant/name
    revisions: dict[str, Path | None]  # refs the alias names now -> local PEFT dir (None: absent)
    probe_prompt: str  # the quality probe's prompt
    # revision ref -> its registered expected text; None: the offline reference (generated ones)
    probe_expected: dict[str, str] | None
    probe_max_tokens: int  # tokens the probe may generate
    private: bool = True  # only private adapters are foreign to the hostile tenant


def generated_target(adapter: GeneratedAdapter) -> Target:
    """A generated adapter: its probe's expectation is its own offline reference."""
    return Target(
        adapter.tenant, adapter.alias, {adapter.ref: adapter.path},
        f"Qualification probe of {adapter.name}:", None, GENERATED_PROBE_TOKENS,
    )  # fmt: skip


def deployed_target(admin: Admin, alias: str, local: dict[str, Path]) -> Target:
    """An alias already on the deployment: its targets and registered probe (admin API)."""
    tenant, _, name = alias.partition("/")
    shown = shown_with_every_revision(
        lambda path, params: admin.must("GET", path, params=params), tenant, name
    )
    if shown.get("alias") is None:
        raise QualifyError(f"deployment adapter {alias} has no alias")
    rows = {row["revision"]: row for row in shown["revisions"]}
    targets = [rows[t["revision"]] for t in shown["alias"]["targets"]]
    prompts = {row["probe_prompt"] for row in targets}
    unprobed = [r["revision"] for r in targets if r["expected_continuation"] is None]
    if len(prompts) != 1 or None in prompts or unprobed:
        raise QualifyError(
            f"deployment adapter {alias}: every alias target must carry a registered probe "
            f"with one prompt; prompts {sorted(map(str, prompts))}, unprobed {unprobed}"
        )
    expected = {f"{alias}@{r['revision']}": str(r["expected_continuation"]) for r in targets}
    revisions = {f"{alias}@{r['revision']}": local.get(r["adapter_digest"]) for r in targets}
    longest = max(len(text.split()) for text in expected.values())
    max_tokens = longest * 4 + 4  # words to tokens, with room for the EOS that ends it
    private = shown["adapter"]["visibility"] == "private"
    return Target(tenant, alias, revisions, prompts.pop(), expected, max_tokens, private)


def local_adapter_dirs(assets_dir: Path | None) -> dict[str, Path]:
    """Adapter digest -> PEFT directory, from a demo assets manifest (empty without one)."""
    if assets_dir is None or not (assets_dir / "manifest.json").is_file():
        return {}
    manifest = json.loads((assets_dir / "manifest.json").read_text(encoding="utf-8"))
    return {row["digest"]: assets_dir / row["path"] for row in manifest.get("adapters", [])}
