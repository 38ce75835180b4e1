"""What ``loraplex sim calibrate`` measures: a running server reached over HTTP (``--url`` with
the admin key) or one it starts itself on the demo model (``--self``).

A remote server's adapters are discovered through the admin API (each alias that names one
revision, with that revision's rank); one API key per tenant used is created for the run and
revoked when it ends, so a calibration leaves no credential behind. With ``--self`` the
adapters are written and registered first (``bench serve``'s registry), one per rank and
target set asked for, and the server runs with the demo preset's small model.
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from loraplex.bench.workloads import ALL_TARGETS, ATTENTION_TARGETS, TraceAdapter
from loraplex.errors import LoraplexError
from loraplex.registry.sql.paging import MAX_PAGE, every_row
from loraplex.server.admin_models import shown_with_every_revision

SELF_TENANT = "calibration"
REMOTE_VOCAB = 256  # prompt token ids stay below this on a server of unknown vocabulary


class TargetError(LoraplexError):
    """The URL names nothing to calibrate: not an http(s) URL, nothing answering there, an
    answer that is not loraplex's admin API, or no adapter to request. (A refused admin call
    stays ``httpx.HTTPStatusError``: its status says more.)"""


@dataclass(frozen=True)
class ServedAdapter:
    """One adapter the calibration may request."""

    tenant: str  # owning tenant
    name: str  # the alias requests name
    revision: str  # the one revision the alias names
    rank: int  # that revision's (largest) rank
    size_bytes: int = 0  # its A+B weights' bytes as served; 0: not known yet (measure() asks)

    @property
    def ref(self) -> str:
        """``tenant/name@revision``, as the admin API names a revision."""
        return f"{self.tenant}/{self.name}@{self.revision}"


@dataclass(frozen=True)
class Target:
    """A server to measure."""

    url: str  # base URL
    admin_key: str  # the admin credential
    adapters: tuple[ServedAdapter, ...]  # what may be requested
    keys: dict[str, str]  # tenant -> API key
    vocab_size: int  # prompt token ids are drawn below this
    # The server's artifact store when it is on this machine (--self): its cached pages are
    # dropped before each cold load, as bench sim's real runs drop them; None: remote.
    store: Path | None = None
    # The server's request log when it is on this machine (--self): each request's engine
    # timeline (``server/request_log.ENGINE_FIELDS``); None: remote, not read.
    request_log: Path | None = None
    # Its loader and engine share one CPU (a CPU-only server; the cost model's
    # ``load_cpu_shared``): always for --self (the demo server, torch_threads 1), as given
    # (``--load-cpu-shared``) for --url.
    load_cpu_shared: bool = False


def _admin(url: str, admin_key: str) -> httpx.Client:
    try:
        parsed = httpx.URL(url)
    except httpx.InvalidURL as exc:
        raise TargetError(f"not a URL ({exc})") from None
    if parsed.scheme not in ("http", "https") or not parsed.host:
        raise TargetError("expected http://HOST[:PORT] or https://HOST[:PORT]")
    return httpx.Client(
        base_url=url, headers={"Authorization": f"Bearer {admin_key}"}, timeout=60.0
    )


def _single_revision_adapters(client: httpx.Client, limit: int) -> list[ServedAdapter]:
    """Adapters whose alias names one revision, with that revision's rank (at most ``limit``)."""
    found: list[ServedAdapter] = []
    for adapter in _listed_adapters(client):
        if len(found) >= limit:
            break
        tenant, name = str(adapter["tenant"]), str(adapter["name"])
        body = shown_with_every_revision(
            lambda path, params: _json(client, path, params), tenant, name
        )
        alias = body.get("alias") or {}
        targets = alias.get("targets") or []
        if len(targets) != 1:
            continue
        revision = str(targets[0]["revision"])
        ranks = [r["max_rank"] for r in body["revisions"] if r["revision"] == revision]
        if ranks:
            found.append(ServedAdapter(tenant, name, revision, int(ranks[0])))
    return found


def _discovered(client: httpx.Client, limit: int) -> list[ServedAdapter]:
    """``_single_revision_adapters``, at least one; what the URL's answers (or their absence)
    say about it is ``TargetError``. NOTE: a bad URL or a server without such an adapter ended
    in a traceback (httpx's error, or a bare ``ValueError``)."""
    try:
        adapters = _single_revision_adapters(client, limit)
    except (httpx.TransportError, httpx.InvalidURL) as exc:
        raise TargetError(f"nothing answered ({type(exc).__name__}: {exc})") from exc
    except (ValueError, KeyError, TypeError) as exc:  # not JSON, or not the listing's shape
        raise TargetError(
            f"its answers are not loraplex's admin API ({type(exc).__name__}: {exc})"
        ) from exc
    if not adapters:
        raise TargetError("it serves no adapter whose alias names one revision")
    return adapters


def _listed_adapters(client: httpx.Client) -> Iterator[dict[str, Any]]:
    """Every adapter of ``GET /admin/adapters``, one page at a time (read as they are used)."""
    return every_row(
        lambda page: _json(client, "/admin/adapters", page.params()),
        lambda adapter: f"{adapter['tenant']}/{adapter['name']}",
        MAX_PAGE,
    )


def _json(client: httpx.Client, path: str, params: dict[str, Any]) -> Any:
    """The parsed answer of an admin GET that must succeed."""
    reply = client.get(path, params=params)
    reply.raise_for_status()
    return reply.json()


@contextmanager
def remote_target(
    url: str, admin_key: str, max_adapters: int, load_cpu_shared: bool = False
) -> Iterator[Target]:
    """The server at ``url``; keys created for the run are revoked when it ends.
    ``load_cpu_shared``: the caller's word that its loader and engine share one CPU."""
    with _admin(url, admin_key) as client:
        adapters = _discovered(client, max_adapters)
        issued: list[str] = []
        keys: dict[str, str] = {}
        try:
            for tenant in dict.fromkeys(a.tenant for a in adapters):
                reply = client.post(f"/admin/tenants/{tenant}/keys")
                reply.raise_for_status()
                issued.append(str(reply.json()["key_id"]))
                keys[tenant] = str(reply.json()["token"])
            yield Target(
                url.rstrip("/"),
                admin_key,
                tuple(adapters),
                keys,
                REMOTE_VOCAB,
                load_cpu_shared=load_cpu_shared,
            )
        finally:
            for key_id in issued:
                client.delete(f"/admin/keys/{key_id}")


# --self's target sets: attention-only and every linear layer, so the LoRA work term
# (cost_model.StepCost.per_byte_token_s) is measured apart from the rank.
SELF_TARGET_SETS = {"attn": ATTENTION_TARGETS, "all": ALL_TARGETS}
SELF_BYTES_PER_PARAM = 4  # the demo server serves float32


@contextmanager
def self_target(
    asset_dir: Path,
    ranks: tuple[int, ...],
    copies: int,
    max_loras: int,
    seed: int,
    *,
    target_sets: tuple[str, ...] = ("attn",),
) -> Iterator[Target]:
    """A fresh ``loraplex serve`` of the demo model with ``copies`` adapters of each rank and
    each of ``target_sets`` (``SELF_TARGET_SETS`` names), ``max_loras`` slots, cost_aware."""
    from loraplex.artifacts.base_model import BaseModelSpec, lora_bytes
    from loraplex.bench.serve.driver import REVISION
    from loraplex.bench.serve.fleet import ServerOptions, prepare_fleet, serving
    from loraplex.demo.assets import generate_demo_assets

    unknown = sorted(set(target_sets) - set(SELF_TARGET_SETS))
    if not target_sets or unknown:
        raise ValueError(
            f"target_sets {list(target_sets)} is invalid; expected from {list(SELF_TARGET_SETS)}"
        )
    assets = generate_demo_assets(asset_dir / "test-small", preset="small", seed=0)
    spec = BaseModelSpec.from_dir(assets.base_model_dir)
    vocab = spec.vocab_size
    wanted = [
        TraceAdapter(SELF_TENANT, f"{kind}-r{rank}-{i}", rank, SELF_TARGET_SETS[kind])
        for kind in target_sets
        for rank in ranks
        for i in range(copies)
    ]
    with tempfile.TemporaryDirectory(prefix="loraplex-calibrate-") as tmp:
        root = Path(tmp)
        fleet = prepare_fleet(root / "fleet", assets.base_model_dir, wanted, max(ranks), seed)
        log = root / "run" / "requests.jsonl"
        options = ServerOptions("cost_aware", max_loras, 256 << 20, request_log_path=log)
        with serving(fleet, root / "run", options) as url:
            served = tuple(
                ServedAdapter(
                    a.tenant,
                    a.name,
                    REVISION,
                    a.rank,
                    lora_bytes(spec, a.rank, SELF_BYTES_PER_PARAM, a.targets),
                )
                for a in wanted
            )
            # The demo server is CPU-only: its loader and engine always share the CPU.
            yield Target(
                url, fleet.admin_key, served, dict(fleet.keys), vocab, fleet.store, log, True
            )
