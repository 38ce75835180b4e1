"""Hardware profiles: cost-model files for hardware that cannot be measured here.

Each ``<name>.json`` is a ``cost_model`` file with ``validated: false`` whose ``sources`` cite,
for every number (``step.<term>``, ``links.<link>.<field>``, ``front_s``, ``ipc_s``,
``network_s``), where it comes from: a public specification or a published measurement, and the
arithmetic that turns it into the model's term. A calibration on that hardware
(``loraplex sim calibrate``) replaces the file. ``prices.json`` holds what one machine of each
profile costs per hour, with its source (the planner prices configurations with it).
"""

from __future__ import annotations

import json
from pathlib import Path

from loraplex.sim.cost_model import LINKS, CostModel, load

PROFILE_DIR = Path(__file__).parent
_PRICES = "prices.json"
OVERHEADS = ("front_s", "ipc_s", "network_s")
STEP_FIELDS = (
    "step_fixed_s",
    "per_token_s",
    "per_prefill_token_s",
    "per_revision_s",
    "per_rank_token_s",
)
# Optional terms: cited where a profile sets them.
OPTIONAL_FIELDS = ("per_byte_token_s", "per_revision_width_s", "per_prefill_step_s")


def profile_names() -> tuple[str, ...]:
    return tuple(sorted(p.stem for p in PROFILE_DIR.glob("*.json") if p.name != _PRICES))


def profile_path(name_or_path: str) -> Path:
    """A profile name (``profile_names()``) or a path to a cost-model file."""
    if name_or_path in profile_names():
        return PROFILE_DIR / f"{name_or_path}.json"
    path = Path(name_or_path)
    if path.suffix == ".json" and path.is_file():
        return path
    raise ValueError(
        f"hardware {name_or_path!r} is neither a profile {list(profile_names())} "
        "nor a cost-model file"
    )


def load_profile(name_or_path: str) -> CostModel:
    return load(profile_path(name_or_path))


def cited_fields() -> tuple[str, ...]:
    """The ``sources`` keys an unvalidated profile must carry: one per number."""
    links = [f"links.{link}.{f}" for link in LINKS for f in ("fixed_s", "bytes_per_s")]
    return (*(f"step.{f}" for f in STEP_FIELDS), *links, *OVERHEADS)


def uncited(model: CostModel) -> list[str]:
    """The numbers of ``model`` whose source is missing or empty (an optional term
    counts only where the profile sets it)."""
    terms = [f"step.{name}" for name in OPTIONAL_FIELDS if getattr(model.step, name) is not None]
    return [key for key in (*cited_fields(), *terms) if not model.sources.get(key, "").strip()]


def price_of(hardware: str) -> tuple[float, str] | None:
    """(USD per machine-hour, its source) of a profile; None when no price is recorded."""
    body = json.loads((PROFILE_DIR / _PRICES).read_text(encoding="utf-8"))
    entry = body.get(hardware)
    if entry is None:
        return None
    return float(entry["usd_per_hour"]), str(entry["source"])
