"""The admin key file's changes, counted by outcome (``admin_key.py``):
``loraplex_admin_key_reloads_total{outcome="reloaded|invalid|unreadable"}``. Each outcome is
exposed from 0, for a fixed key too (which never changes). A failed rotation (``invalid`` or
``unreadable``) leaves the previous key in force: the operator who rotated believes the old key
revoked; ``LoraplexAdminKeyRotationFailed`` (deploy/prometheus) says otherwise."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, Metric
from prometheus_client.registry import Collector

from loraplex.server.admin_key import RELOAD_OUTCOMES, AdminKey


class AdminKeyCollector(Collector):
    """``admin``'s reload counts at scrape time."""

    def __init__(self, admin: AdminKey) -> None:
        self._admin = admin

    def collect(self) -> Iterator[Metric]:
        family = CounterMetricFamily(
            "loraplex_admin_key_reloads",
            "Changes of the admin key file seen, by outcome: reloaded (the new key is in force), "
            "invalid or unreadable (the previous key stays in force).",
            labels=("outcome",),
        )
        counts = self._admin.reloads()
        for outcome in RELOAD_OUTCOMES:
            family.add_metric((outcome,), counts[outcome])
        yield family
