"""One local Ray cluster for the test modules that deploy a fleet on it (fixture ``ray_cluster``).

Starting a cluster (``ray.init(address="local")``: GCS, raylet, agents) takes 10 s and more on
a loaded 2-core machine, and three modules (four fleets: ``test_fleet_e2e`` runs twice) each
started their own. They share one, started by the first of them; each fleet still ends with
``serve.shutdown()`` (its apps, replicas, proxy and controller gone), so no deployment, replica
or router state crosses from one fleet to the next. The cluster is shut down after the last
test that uses it, not at the end of the session: an idle cluster costs CPU that the tests
after it would feel.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest

FIXTURE = "ray_cluster"
# What replicas need in their environment, set before the cluster starts (its workers inherit
# the environment of the process that started it, never a later change): usage stats off, and
# credentials for the S3 server of moto that test_fleet_e2e's shared registry uses.
CLUSTER_ENV = {
    "RAY_USAGE_STATS_ENABLED": "0",
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
}


@pytest.fixture(scope="session")
def ray_cluster() -> Iterator[None]:
    """A local Ray cluster of this process (never one already running on the machine)."""
    ray = pytest.importorskip("ray")
    for key, value in CLUSTER_ENV.items():
        os.environ.setdefault(key, value)
    ray.init(
        address="local", num_cpus=2, include_dashboard=False, namespace="loraplex",
        log_to_driver=False,
    )  # fmt: skip
    try:
        yield
    finally:
        ray.shutdown()  # a no-op when it was shut down after its last test


@pytest.hookimpl(trylast=True)  # after the item's own teardown: its fleet has ended
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> None:
    """Shuts the cluster down after the last test that uses it."""
    if FIXTURE not in getattr(item, "fixturenames", ()):
        return
    items = item.session.items
    later = items[items.index(item) + 1 :] if nextitem is not None else []
    if not any(FIXTURE in getattr(other, "fixturenames", ()) for other in later):
        import ray

        ray.shutdown()


def deploy_fleet(config: Any, engine_replicas: int, wait_s: float) -> tuple[str, Any]:
    """Prepares ``config``'s data dir (a ``ServeConfig``), deploys a fleet of
    ``engine_replicas`` on the cluster and waits for its ingress: (its URL, the ``Prepared``)."""
    from loraplex.fleet import control
    from loraplex.fleet.settings import FleetSettings

    prepared = control.prepare(config)
    settings = FleetSettings(
        serve=config, model_dir=prepared.model_dir, engine_replicas=engine_replicas
    )
    control.deploy(settings)
    url = control.base_url(config)
    control.wait_ready(url, wait_s)
    return url, prepared
