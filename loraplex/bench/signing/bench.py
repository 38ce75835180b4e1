"""``loraplex bench signing``: what the fetch-time signature check adds to a cold load.

One real cache (``bench/cache/bench.py``'s rig: local store, disk tier, CPU slot pool) holds every
demo adapter twice, once unsigned and once signed (a model-signing bundle in the store, the ref
naming it), with identical bytes. Each repetition loads every adapter from L3 into L0 both
ways, in alternating order, timed by one clock (``perf_counter``) from acquire to lease; the
check alone (``check_stored_bundle``: read the bundle object, parse its statement, compare two
digests) is timed on its own too. Ratios come as p50 over p50 and as mean over mean (the
adapters differ in size, so a p50 over all loads falls between them and moves with noise); a
load that fails counts in ``failures``; a ratio whose denominator is not positive is ``None``.
"""

from __future__ import annotations

import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from loraplex.artifacts.base_model import BaseModelSpec
from loraplex.artifacts.identity import AdapterKey
from loraplex.artifacts.manifest import CONFIG_FILE
from loraplex.artifacts.signature import (
    SIGNATURE_FILE,
    bundle_digest,
    check_stored_bundle,
    sign_dir,
)
from loraplex.artifacts.validate import WEIGHTS_FILE, validate_adapter_dir
from loraplex.bench.cache.bench import _quantiles, _Rig
from loraplex.residency.ledger import Tier


@dataclass(frozen=True)
class SigningBenchConfig:
    """What one run measures."""

    preset: str = "small"  # demo preset whose adapters are loaded
    reps: int = 7  # repetitions over every adapter, alternating which variant goes first
    max_adapters: int = 4  # adapters measured
    asset_dir: Path = Path(".loraplex-assets/bench-small")  # the demo set (made if absent)
    synthetic: bool = False  # the preset's shapes with random weights instead of its demo set

    def __post_init__(self) -> None:
        for name in ("reps", "max_adapters"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} {getattr(self, name)} is invalid; expected >= 1")


def run_signing_bench(config: SigningBenchConfig, key_pem: Path) -> dict[str, Any]:
    """``key_pem``: an EC private key (PEM) the bench signs its copies with."""
    with tempfile.TemporaryDirectory() as tmp:
        base, dirs = _adapters(config, Path(tmp) / "adapters")
        max_rank = max(validate_adapter_dir(d, base, 1 << 16).max_rank for d in dirs)
        rig = _Rig(Path(tmp), base, max_rank)
        pairs = [_register_pair(rig, d, i, Path(tmp), key_pem) for i, d in enumerate(dirs)]
        samples, failures = _measure(rig, pairs, config.reps)
    return _result(config, samples, failures)


def _adapters(config: SigningBenchConfig, scratch: Path) -> tuple[BaseModelSpec, list[Path]]:
    if config.synthetic:
        from loraplex.bench.signing.shaped_adapters import write_shaped_set

        base_dir, dirs = write_shaped_set(scratch, config.preset, config.max_adapters)
        return BaseModelSpec.from_dir(base_dir), dirs
    from loraplex.demo.assets import generate_demo_assets

    assets = generate_demo_assets(config.asset_dir, preset=config.preset, seed=0)
    dirs = [a.path for a in assets.adapters[: config.max_adapters]]
    return BaseModelSpec.from_dir(assets.base_model_dir), dirs


def _register_pair(
    rig: _Rig, source: Path, index: int, tmp: Path, key_pem: Path
) -> tuple[AdapterKey, AdapterKey, str]:
    """(unsigned key, signed key, bundle digest) over the same bytes."""
    copy = tmp / f"signed-{index}"
    shutil.copytree(source, copy)
    sign_dir(copy, key_pem)
    bundle = copy / SIGNATURE_FILE
    digest = bundle_digest(bundle.read_bytes())
    rig.store.put_file(bundle, digest)
    plain = rig.register(source, 2 * index)
    signed = rig.register(copy, 2 * index + 1)
    ref = rig.refs[signed]
    rig.refs[signed] = type(ref)(
        ref.config_digest, ref.weights_digest, ref.disk_bytes, ref.memory_bytes, digest
    )
    return plain, signed, digest


def _measure(
    rig: _Rig, pairs: list[tuple[AdapterKey, AdapterKey, str]], reps: int
) -> tuple[dict[str, list[float]], int]:
    samples: dict[str, list[float]] = {"unsigned": [], "signed": [], "check": []}
    failures = 0
    for rep in range(reps):
        for plain, signed, digest in pairs:
            order = [("unsigned", plain), ("signed", signed)]
            for variant, key in order if rep % 2 == 0 else order[::-1]:
                try:
                    samples[variant].append(rig.load_from(key, Tier.L3))
                except Exception:
                    failures += 1
            ref = rig.refs[signed]
            expected = {CONFIG_FILE: ref.config_digest, WEIGHTS_FILE: ref.weights_digest}
            start = time.perf_counter()
            check_stored_bundle(rig.store, digest, expected, "bench")
            samples["check"].append(time.perf_counter() - start)
    return samples, failures


def _result(
    config: SigningBenchConfig, samples: dict[str, list[float]], failures: int
) -> dict[str, Any]:
    quantiles = {name: _quantiles(values) for name, values in samples.items() if values}

    def p50(name: str) -> float | None:  # the p50 reported below, so ratios match the figures
        return quantiles[name]["p50_ms"] if name in quantiles else None

    def mean(name: str) -> float | None:  # every adapter weighs by its loads, whatever its size
        return sum(samples[name]) / len(samples[name]) if samples[name] else None

    def ratio(top: float | None, bottom: float | None) -> float | None:
        return None if top is None or bottom is None or bottom <= 0 else top / bottom

    return {
        "name": "signing_fetch_check",
        "config": {
            "preset": config.preset,
            "reps": config.reps,
            "adapters": config.max_adapters,
            "synthetic": config.synthetic,
        },
        "metrics": {
            "l3_to_l0_unsigned": quantiles.get("unsigned"),
            "l3_to_l0_signed": quantiles.get("signed"),
            "check_alone": quantiles.get("check"),
            "signed_over_unsigned_p50": ratio(p50("signed"), p50("unsigned")),
            "signed_over_unsigned_mean": ratio(mean("signed"), mean("unsigned")),
            "check_over_unsigned_load_p50": ratio(p50("check"), p50("unsigned")),
            "check_over_unsigned_load_mean": ratio(mean("check"), mean("unsigned")),
            "failures": failures,
        },
    }
