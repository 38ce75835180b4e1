"""The simulator's lease desk holds back new leases on borrowed GPU copies while another
tenant's load waits for their room, as the engine's does (``TieredAdapterCache.reclaiming``,
asked in ``sim/lease_desk.py``'s request phase; ``scripts/attacks/borrowed-slot-squat`` against a
server)."""

from __future__ import annotations

import pytest
from sim_inputs import cost

from loraplex.residency.cache import TieredAdapterCache
from loraplex.sim.config import SimConfig
from loraplex.sim.outcome import Outcome
from loraplex.sim.run import simulate
from loraplex.sim.trace import TraceRecord

# 4 slots, a tenant's share 2; no automatic pins (a pin is never reclaimed)
_CONFIG = SimConfig(max_loras=4, auto_warm=False, queue_deadline_s=5.0)


def _squat() -> tuple[Outcome, list[Outcome]]:
    """acme starts a 200-token stream every 0.25 s on each of its 4 revisions (each stream
    outlasts the next one's start, so every copy always has a request running: all 4 slots,
    2 borrowed); globex asks its one revision at 3 s. globex's outcome and acme's."""
    trace = [
        TraceRecord(i * 0.25 + a * 0.01, "acme", f"a{a}", 16, 200)
        for i in range(24)
        for a in range(4)
    ]
    trace.append(TraceRecord(3.0, "globex", "g", 16, 4))
    trace.sort(key=lambda r: r.t_s)
    kept: list[Outcome] = []
    simulate(trace, _CONFIG, cost(), keep_outcomes=kept)
    globex = [o for o in kept if o.tenant == "globex"]
    return globex[0], [o for o in kept if o.tenant == "acme"]


def test_a_tenant_under_its_share_gets_borrowed_gpu_room_back_from_overlapping_leases() -> None:
    victim, acme = _squat()
    assert victim.ok and victim.tier == "L3"  # loaded into a slot acme had borrowed
    assert victim.first_token_s is not None
    assert victim.first_token_s - victim.t_s < _CONFIG.queue_deadline_s
    assert any(o.ok for o in acme)


def test_without_the_hold_back_the_overlapping_leases_keep_the_room_until_the_deadline(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The simulator before it asked ``reclaiming``: every acme request got its lease at once,
    no copy was ever free to evict, and globex's load waited out its queue deadline."""
    monkeypatch.setattr(TieredAdapterCache, "reclaiming", lambda self, key: False)
    victim, acme = _squat()
    assert victim.error == "QueueTimeoutError" and victim.first_token_s is None
    assert all(o.ok for o in acme)
