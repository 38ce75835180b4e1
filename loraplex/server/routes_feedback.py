"""``POST /v1/feedback``: a tenant rates one of its own recent responses good or bad.

The rating counts in the answering revision's release window (``release/traffic.py``)
when that revision is under release; the response tells the revision's owner whether it was
counted. A caller of another tenant's public adapter gets ``counted`` null whether or not it
counted: true would tell it the owner has a release in flight (the revision it was served, which
it is told truthfully, cannot say whether that revision is a candidate or the stable one). Its
rating still counts; a release is judged without the caller pushing a figure most
(``release/callers.py``), so one caller's ratings cannot steer it. Only the tenant
that made the request may rate it: ids are looked up per tenant (two tenants may send the same
``X-Request-Id``; each rates its own), so another tenant's id gets the very 404 of an unknown or
expired one (same status, same body, built from the id alone) and nothing about other tenants'
traffic leaks. A request is rated at most once: a second rating is a 409 (changing a rating
after the release judged it would rewrite history). A tenant re-using one of its ids replaces
the entry with the newer request, which may then be rated.

Recent requests are kept in a bounded map (``recent_requests.RecentRequests``: 10,000 ids per
tenant, 100,000 in all, one hour).
"""

from __future__ import annotations

from enum import StrEnum

from fastapi import APIRouter
from pydantic import BaseModel, Field

from loraplex.errors import quoted
from loraplex.server.auth import DepsDep, TenantDep
from loraplex.server.errors import ApiError
from loraplex.server.json_route import StrictJsonRoute
from loraplex.server.protocol.fields import TenantBody

router = APIRouter(prefix="/v1", route_class=StrictJsonRoute)  # a repeated JSON key: 400
MAX_REQUEST_ID_CHARS = 128


class Rating(StrEnum):
    GOOD = "good"
    BAD = "bad"


class FeedbackBody(TenantBody):
    request_id: str = Field(min_length=1, max_length=MAX_REQUEST_ID_CHARS)  # a response's ``id``
    rating: Rating


class FeedbackResult(BaseModel):
    request_id: str  # the rated response
    rating: Rating  # as given
    revision: str | None  # tenant/name@revision that answered it; None: the base model
    # False: that revision is not under release, so no window counts it; None: not told (the
    # revision is another tenant's)
    counted: bool | None


def _unknown(request_id: str) -> ApiError:
    message = f"request_id {quoted(request_id)} names no recent request of yours"
    return ApiError(404, message, "invalid_request_error", "request_not_found", "request_id")


@router.post("/feedback")
def feedback(body: FeedbackBody, tenant: TenantDep, deps: DepsDep) -> FeedbackResult:
    served = deps.metrics.recent.claim(tenant.name, body.request_id)
    if served is None:
        raise _unknown(body.request_id)
    if served.rated:
        message = f"request_id {quoted(body.request_id)} was already rated"
        raise ApiError(409, message, "invalid_request_error", "already_rated", "request_id")
    counted = served.revision is not None and deps.releases.record_feedback(
        served.revision, served.at_s, body.rating is Rating.GOOD, served.caller
    )
    owned = served.revision is None or served.revision.partition("/")[0] == tenant.name
    return FeedbackResult(
        request_id=body.request_id,
        rating=body.rating,
        revision=served.revision,
        counted=counted if owned else None,
    )
