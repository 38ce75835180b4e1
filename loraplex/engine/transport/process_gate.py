"""Whether requests may reach the engine child now (torch-free): the current child's link, its
up/down/hung state, what is held back from it, and the one lock over all of it.

The base layer of ``process.EngineProcess`` (``process_supervisor.ChildSupervisor`` changes the
state as children start, hang and die; ``EngineProcess`` reads it for every request and call).
The fields live here together so the locking rule can be checked in one place: ``_lock``
guards the link, ``_down``, ``_hung`` and what is held back while hung, ``_max_loras``,
``_num_restarts`` and ``_tenants_unsent``, and is taken before the in-flight table's own lock.
"""

from __future__ import annotations

import contextlib
import logging
import threading

from loraplex.engine.standing import StandingSettings
from loraplex.engine.tenant_shares import TenantSettings
from loraplex.engine.transport.messages import AbortRequest, PauseRequest, UpdateTenants
from loraplex.engine.transport.process_inflight import InFlight
from loraplex.engine.transport.process_link import ChildLink
from loraplex.engine.transport.process_replay import send_unawaited
from loraplex.engine.transport.process_state import PublishedState
from loraplex.errors import EngineUnavailableError

_log = logging.getLogger(__name__)


class ChildGate:
    """The parent's view of the current child, and whether it takes requests (under ``_lock``)."""

    _link: ChildLink  # the current child (the dead one's while a restart is pending)

    def __init__(self) -> None:
        self._lock = threading.Lock()  # the link, up/down; taken before the in-flight's
        self._inflight = InFlight()
        self._state = PublishedState()  # what the child published (read without asking it)
        self._max_loras = 0
        # why requests are refused; None: up
        self._down: EngineUnavailableError | None = EngineUnavailableError(
            "the engine process is starting; retry shortly"
        )
        # why requests are refused while the child lives but makes no progress; None: it does
        self._hung: EngineUnavailableError | None = None
        self._hung_aborts: list[str] = []  # aborts held back while hung (sent on recovery)
        self._hung_pauses: dict[str, bool] = {}  # pauses and resumes held back likewise
        self._num_restarts = 0
        # tenant settings not yet known to be applied by the child (see update_tenant_settings)
        self._tenants_unsent: dict[str, TenantSettings] | None = None
        # pins, warm policies, merge holds the child accepted: replayed into every restarted child
        self._standing = StandingSettings()

    @property
    def pid(self) -> int | None:
        """The current child's process id (the dead one's while a restart is pending)."""
        return self._link.pid

    @property
    def num_in_flight(self) -> int:
        """Streams and calls the current child owes an answer (sent, or queued to be)."""
        return self._inflight.num_pending

    @property
    def num_state_updates(self) -> int:
        """State publishes received so far (an idle child sends none: it publishes changes)."""
        return self._state.num_updates

    @staticmethod
    def _send(link: ChildLink, message: object) -> None:
        try:
            link.send(message)
        except (OSError, ValueError) as exc:
            raise EngineUnavailableError("the engine process is not running") from exc

    def _check_up(self) -> None:
        why = self._down or self._hung
        if why is not None:
            raise EngineUnavailableError(str(why))

    def _send_unsent_tenants(self, link: ChildLink) -> None:
        """Tenant settings the child may not have, sent (under the lock) and not awaited."""
        if self._tenants_unsent is not None:
            command = UpdateTenants(self._tenants_unsent)
            send_unawaited(link, self._inflight, command, "tenant settings")

    def _recover(self, link: ChildLink) -> None:
        """The hung child gave what it lacked again, a sign of life or progress (called under the
        lock): it takes requests, and what was held back from it while hung reaches it now."""
        self._hung = None
        aborts, self._hung_aborts = self._hung_aborts, []
        _log.warning("engine process %s moves again; no longer hung", link.pid)
        for request_id in aborts:
            with contextlib.suppress(EngineUnavailableError):
                self._send(link, AbortRequest(request_id))
        pauses, self._hung_pauses = self._hung_pauses, {}
        for request_id, paused in pauses.items():
            with contextlib.suppress(EngineUnavailableError):
                self._send(link, PauseRequest(request_id, paused))
        self._send_unsent_tenants(link)

    def _fail_all(self, error: EngineUnavailableError) -> None:
        """The child is gone: the engine is down and everything it had in flight fails."""
        with self._lock:
            self._down = error
            self._state.clear()
        self._inflight.fail_all(error)
