"""HTTP access to a running deployment, as an operator reaches it: the public API with tenant
keys, the admin API and ``/metrics`` with the admin key. Nothing here imports the server.

Every call answers an ``Answer`` (status and body, never an exception for an HTTP status), so a
check can cite exactly what it saw. A transport failure is a ``PreflightError``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from loraplex.errors import LoraplexError

MAX_LISTED = 1000  # most adapters / tenants one preflight reads (a bound on its own work)
ADMIN_PAGE = 1000  # rows the admin API's paged listings return at most per call


class PreflightError(LoraplexError):
    """The deployment could not be reached or answered something unreadable; ``status``: the
    HTTP status of the refused admin call, when one was."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


class KeyIssueError(PreflightError):
    """The admin API issued no throwaway tenant key."""


@dataclass(frozen=True)
class Answer:
    """One HTTP exchange."""

    method: str  # GET / POST / PUT / DELETE
    path: str  # the path asked
    status: int  # HTTP status
    body: Any  # parsed JSON, or the text when not JSON

    def ok(self) -> bool:
        return 200 <= self.status < 300

    def cite(self) -> str:
        return f"{self.method} {self.path} -> {self.status}"


@dataclass(frozen=True)
class Sample:
    """One sample of the ``/metrics`` exposition."""

    name: str  # sample name (``adapter_cache_hits_total``)
    labels: dict[str, str]  # its labels
    value: float  # its value


class Metrics:
    """A parsed scrape of ``/metrics``."""

    def __init__(self, samples: list[Sample]) -> None:
        self.samples = samples

    @classmethod
    def parse(cls, text: str) -> Metrics:
        samples = [
            Sample(s.name, dict(s.labels), float(s.value))
            for family in text_string_to_metric_families(text)
            for s in family.samples
        ]
        return cls(samples)

    def named(self, name: str) -> list[Sample]:
        return [s for s in self.samples if s.name == name]

    def label_values(self, name: str, label: str) -> set[str]:
        return {s.labels[label] for s in self.named(name) if label in s.labels}

    def total(self, name: str, **labels: str) -> float | None:
        """Sum of ``name``'s samples matching ``labels``; None when there is none."""
        matched = [
            s.value
            for s in self.named(name)
            if all(s.labels.get(k) == v for k, v in labels.items())
        ]
        return sum(matched) if matched else None


class Deployment:
    """A running loraplex server or fleet ingress at ``url``."""

    def __init__(self, url: str, admin_key: str, timeout_s: float) -> None:
        self.url = url.rstrip("/")
        self._admin_key = admin_key
        self.timeout_s = timeout_s  # per request
        self._http = httpx.Client(base_url=self.url, timeout=timeout_s)

    def close(self) -> None:
        self._http.close()

    def call(
        self, method: str, path: str, key: str | None, body: Any = None, params: Any = None
    ) -> Answer:
        """``method path`` with ``key`` as the bearer token (None: no credential)."""
        headers = {} if key is None else {"Authorization": f"Bearer {key}"}
        try:
            reply = self._http.request(method, path, headers=headers, json=body, params=params)
        except httpx.HTTPError as exc:
            raise PreflightError(f"{method} {self.url}{path} failed: {exc}") from None
        try:
            parsed: Any = reply.json()
        except ValueError:
            parsed = reply.text
        return Answer(method, path, reply.status_code, parsed)

    def admin(self, method: str, path: str, body: Any = None, params: Any = None) -> Answer:
        return self.call(method, path, self._admin_key, body, params)

    def admin_listing(self, path: str, cursor: Callable[[Any], str], most: int) -> list[Any]:
        """At most ``most`` rows of a paged admin listing (``after``/``limit``), page by page;
        ``cursor`` gives a row's ``after``. A server that answers more rows than asked for does
        not page: its one answer is the whole listing."""
        rows: list[Any] = []
        params: dict[str, Any] = {}
        while len(rows) < most:
            params["limit"] = min(ADMIN_PAGE, most - len(rows))
            page = list(self.admin_json(path, params))
            rows += page
            if len(page) != params["limit"]:
                break
            params = {"after": cursor(page[-1])}
        return rows[:most]

    def admin_adapter(self, tenant: str, name: str) -> dict[str, Any]:
        """``GET /admin/adapters/{tenant}/{name}`` with every revision: an answer's
        ``revisions`` are one page (oldest first), so the rest are read page by page."""
        path = f"/admin/adapters/{tenant}/{name}"
        shown = dict(self.admin_json(path, {"limit": ADMIN_PAGE}))
        page = shown["revisions"]
        while len(page) == ADMIN_PAGE:
            after = page[-1]["revision"]
            page = self.admin_json(path, {"limit": ADMIN_PAGE, "after": after})["revisions"]
            if page and page[-1]["revision"] == after:  # the same page again: no paging
                raise PreflightError(
                    f"GET {path} answered the revisions after {after!r} with that revision "
                    "again; the server does not page them by after (an older loraplex?)"
                )
            shown["revisions"] = [*shown["revisions"], *page]
        return shown

    def admin_json(self, path: str, params: Any = None) -> Any:
        """The body of an admin GET that must succeed (the checks cannot start without it)."""
        answer = self.admin("GET", path, params=params)
        if not answer.ok():
            raise PreflightError(
                f"{answer.cite()}: {answer.body}; is the admin key right?", answer.status
            )
        return answer.body

    def metrics(self) -> Metrics:
        try:
            reply = self._http.get(
                "/metrics", headers={"Authorization": f"Bearer {self._admin_key}"}
            )
        except httpx.HTTPError as exc:
            raise PreflightError(f"GET {self.url}/metrics failed: {exc}") from None
        if reply.status_code != 200:
            raise PreflightError(f"GET /metrics -> {reply.status_code}: {reply.text[:200]}")
        return Metrics.parse(reply.text)

    @contextmanager
    def throwaway_keys(self, tenants: list[str]) -> Iterator[dict[str, str]]:
        """A fresh API key per tenant (admin API), revoked when the block ends; the keys
        issued before a failure are revoked too."""
        issued: dict[str, str] = {}
        key_ids: list[str] = []
        try:
            for tenant in tenants:
                answer = self.admin("POST", f"/admin/tenants/{tenant}/keys")
                if not answer.ok():
                    raise KeyIssueError(f"{answer.cite()}: cannot issue a throwaway key")
                issued[tenant] = answer.body["token"]
                key_ids.append(answer.body["key_id"])
            yield issued
        finally:
            for key_id in key_ids:
                self.admin("DELETE", f"/admin/keys/{key_id}")

    def tenant_of(self, key: str) -> str | None:
        """The tenant owning ``key``, read from the adapters ``GET /v1/models`` lists for it
        (``root`` is ``tenant/name``); None when it lists none."""
        answer = self.call("GET", "/v1/models", key)
        if not answer.ok():
            raise PreflightError(f"{answer.cite()}: the tenant key is refused")
        roots = [m.get("root", "") for m in answer.body.get("data", []) if m.get("parent")]
        owners = sorted({root.partition("/")[0] for root in roots if "/" in root})
        return owners[0] if owners else None
