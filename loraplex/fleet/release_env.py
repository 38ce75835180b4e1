"""``FleetReleaseEnv``: the release controller's environment in a fleet.

Prewarm and hold go through ``FleetCache`` (every healthy replica; a prewarm completes once all
of them hold the candidate). A probe runs on every healthy replica, each its own request routed
to that replica only, and passes only when every replica answered and all answers are equal: a
revision that would answer differently depending on the replica never reaches the alias.
"""

from __future__ import annotations

import asyncio
import secrets
from concurrent.futures import Future

from loraplex.artifacts.identity import AdapterKey
from loraplex.engine.protocol import EngineRequest
from loraplex.errors import EngineUnavailableError, LoraplexError
from loraplex.fleet.engine_client import FleetEngineClient
from loraplex.fleet.link import FleetLink
from loraplex.release.traffic import ReleaseTraffic
from loraplex.sampling import SamplingParams
from loraplex.serve.release_env import PROBE_PREFIX, ServeReleaseEnv
from loraplex.server.pin_owners import OwnedPins


class ReplicasDisagreeError(LoraplexError):
    """A release probe answered differently on different replicas."""


class FleetReleaseEnv(ServeReleaseEnv):
    """``ReleaseEnv`` over the fleet (see the module docstring)."""

    def __init__(
        self,
        cache: OwnedPins,
        engine: FleetEngineClient,
        traffic: ReleaseTraffic,
        link: FleetLink,
    ) -> None:
        super().__init__(cache, engine, traffic)
        self._fleet_engine = engine
        self._link = link

    def probe(self, key: AdapterKey, tenant: str, prompt: str, max_tokens: int) -> Future[str]:
        prompt_ids = tuple(self._fleet_engine.tokenizer.encode(prompt))
        params = SamplingParams(max_tokens=max_tokens, temperature=0.0)
        return asyncio.run_coroutine_threadsafe(
            self._probe_all(key, tenant, prompt_ids, params), self._loop
        )

    async def _probe_all(
        self,
        key: AdapterKey,
        tenant: str,
        prompt_ids: tuple[int, ...],
        params: SamplingParams,
    ) -> str:
        replica_ids = self._link.healthy_ids()
        if not replica_ids:
            raise EngineUnavailableError("no engine replica is in rotation to probe")
        answers = await asyncio.gather(
            *(self._probe_one(rid, key, tenant, prompt_ids, params) for rid in replica_ids)
        )
        if len(set(answers)) > 1:
            by_replica = dict(zip(replica_ids, answers, strict=True))
            raise ReplicasDisagreeError(
                f"revision {key.ref} answered the probe differently on the replicas: {by_replica}"
            )
        return answers[0]

    async def _probe_one(
        self,
        replica_id: str,
        key: AdapterKey,
        tenant: str,
        prompt_ids: tuple[int, ...],
        params: SamplingParams,
    ) -> str:
        request = EngineRequest(
            request_id=f"{PROBE_PREFIX}-{secrets.token_hex(12)}",
            tenant=tenant,
            adapter_key=key,
            prompt_token_ids=prompt_ids,
            params=params,
            probe=True,  # not traffic: ``auto`` does not count it (EngineRequest.probe)
        )
        parts = [d.text async for d in self._fleet_engine.generate_on(replica_id, request)]
        return "".join(parts)
