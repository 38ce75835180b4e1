"""``GET /v1/models``: the whole list without paging parameters up to ``MAX_UNPAGED_CARDS``
(OpenAI's and vLLM's list is not paged; the openai client reads one answer), and pages of it with
``limit`` / ``after`` (the ``id`` of the last card seen), bounded as the admin listings;
``has_more`` says when more cards follow."""

from __future__ import annotations

from typing import Any

import pytest
from conftest import BASE_NAME, Rig
from openai import OpenAI

from loraplex.registry import RevisionState, Visibility
from loraplex.registry.sql.paging import MAX_CURSOR_CHARS, MAX_PAGE
from loraplex.server import routes_models


def _listed(rig: Rig, **params: Any) -> tuple[list[str], bool]:
    """The cards' ids and ``has_more``."""
    reply = rig.client.get("/v1/models", params=params, headers=rig.headers("acme"))
    assert reply.status_code == 200, reply.text
    return [card["id"] for card in reply.json()["data"]], reply.json()["has_more"]


def _ids(rig: Rig, **params: Any) -> list[str]:
    return _listed(rig, **params)[0]


def test_without_paging_parameters_the_whole_list_as_before(rig: Rig) -> None:
    everything, more = _listed(rig)  # the demo's four, and any that tests before added to acme
    assert not more
    assert everything[0] == BASE_NAME and everything[1:] == sorted(everything[1:])
    assert {"billing", "legal", "support", "triage"} <= set(everything)
    api = OpenAI(
        base_url="http://testserver/v1", api_key=rig.served.keys["acme"],
        http_client=rig.client, max_retries=0,
    )  # fmt: skip
    assert [model.id for model in api.models.list()] == everything


def test_the_unpaged_list_is_capped_and_says_more_follow(
    rig: Rig, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every public adapter was read (and the caller's signing rows) by each unpaged call: its
    cost grew with the registry. Now at most ``MAX_UNPAGED_CARDS`` cards, read as one page, and
    ``has_more`` with the next page at ``?after=`` the last id (the openai client keeps the
    field)."""
    everything = _ids(rig)
    registry, reads = rig.served.registry, []
    real_usable, real_signed = registry.usable_adapters, registry.signed_adapters

    def usable(caller: str, page: Any = None) -> Any:
        reads.append(("usable", None if page is None else page.limit))
        return real_usable(caller, page)

    def signed(caller: str, names: Any = None) -> Any:
        reads.append(("signed", None if names is None else len(names)))
        return real_signed(caller, names)

    monkeypatch.setattr(registry, "usable_adapters", usable)
    monkeypatch.setattr(registry, "signed_adapters", signed)
    monkeypatch.setattr(routes_models, "MAX_UNPAGED_CARDS", 3)
    first, more = _listed(rig)
    assert first == everything[:3] and more
    assert reads == [("usable", 3), ("signed", 3)]  # whole reads (None) before
    rest, more = _listed(rig, after=first[-1], limit=MAX_PAGE)
    assert first + rest == everything and not more
    api = OpenAI(
        base_url="http://testserver/v1", api_key=rig.served.keys["acme"],
        http_client=rig.client, max_retries=0,
    )  # fmt: skip
    page = api.models.list()
    assert [model.id for model in page] == everything[:3]
    assert (page.model_extra or {}).get("has_more") is True


def test_has_more_is_false_on_a_last_page_that_is_full(rig: Rig) -> None:
    everything = _ids(rig)
    assert _listed(rig, after=everything[-3], limit=2) == (everything[-2:], False)
    assert _listed(rig, after=everything[-4], limit=2) == (everything[-3:-1], True)
    assert _listed(rig, limit=len(everything)) == (everything, False)
    assert _listed(rig, limit=len(everything) - 1) == (everything[:-1], True)


def test_pages_follow_the_last_id(rig: Rig) -> None:
    everything = _ids(rig)
    pages = [_ids(rig, limit=2)]
    while len(pages[-1]) == 2:
        pages.append(_ids(rig, limit=2, after=pages[-1][-1]))
    assert pages == [everything[i : i + 2] for i in range(0, len(everything) + 1, 2)]
    assert pages[0][0] == BASE_NAME
    assert _ids(rig, after=BASE_NAME) == everything[1:]  # the base model's card: the start
    after_legal = everything[everything.index("legal") + 1 :]
    assert _ids(rig, after="acme/legal", limit=MAX_PAGE) == after_legal  # the card's root too
    assert _ids(rig, after="zzzz/zzzz") == []  # a position after every name
    assert _ids(rig, limit=1) == [BASE_NAME]


@pytest.mark.parametrize(
    ("params", "param"),
    [
        ({"limit": 0}, "limit"),
        ({"limit": MAX_PAGE + 1}, "limit"),
        ({"limit": "x"}, "limit"),
        ({"after": ""}, "after"),
        ({"after": "a" * (MAX_CURSOR_CHARS + 1)}, "after"),
        ({"after": "a" * 129}, "after"),  # no name of the caller's is that long
        ({"after": "\ufffd"}, "after"),  # no name holds it: a page past every name before
        ({"after": "acme/\ufffd"}, "after"),
        ({"after": "acme/bot/x"}, "after"),
        ({"after": "acme/"}, "after"),
    ],
)
def test_a_page_is_bounded(rig: Rig, params: dict[str, Any], param: str) -> None:
    reply = rig.client.get("/v1/models", params=params, headers=rig.headers("acme"))
    assert reply.status_code == 400, reply.text
    assert reply.json()["error"]["param"] == param


@pytest.mark.parametrize(
    ("method", "path", "param"),
    [
        ("GET", "/v1/models?offset=2", "offset"),  # the admin residency's paging: the first page
        ("GET", "/v1/models?afterr=support&limit=1", "afterr"),  # a typo: the first page again
        ("GET", "/v1/models?limit=1&limit=1000", "limit"),  # the last one used to win
        ("GET", "/v1/models?after=acme/%00", "after"),  # PostgreSQL: a 500 (psycopg DataError)
        ("GET", "/v1/models/sup%00port", "model"),
        ("POST", "/v1/completions?stream=true", "stream"),  # dropped in silence: not streamed
        ("POST", "/v1/chat/completions?n=2", "n"),
        ("POST", "/tokenize?model=support", "model"),
        ("POST", "/v1/feedback?rating=good", "rating"),
    ],
)
def test_a_tenant_query_parameter_not_taken_twice_or_with_nul_is_a_400(
    rig: Rig, method: str, path: str, param: str
) -> None:
    """As on the admin routes (``server/admin_query.py``): nothing is silently ignored, and a
    NUL cursor never reaches the database (PostgreSQL's text cannot hold it)."""
    body = {"model": "support", "prompt": "x", "max_tokens": 1}
    reply = rig.client.request(
        method, path, headers=rig.headers("acme"), json=body if method == "POST" else None
    )
    assert reply.status_code == 400, reply.text
    assert reply.json()["error"]["param"] == param


def test_the_tenant_query_check_leaves_the_routes_own_parameters_alone(rig: Rig) -> None:
    assert _ids(rig, limit=1, after=BASE_NAME) == _ids(rig)[1:2]
    reply = rig.client.get("/v1/models?", headers=rig.headers("acme"))  # an empty query string
    assert reply.status_code == 200, reply.text


@pytest.mark.parametrize("query", ["after=%FF", "after=acme/%FF", "after=%FF%FE&limit=5"])
def test_a_cursor_that_is_not_utf_8_is_a_400_naming_after(rig: Rig, query: str) -> None:
    """The query string is decoded with U+FFFD for bytes that are not UTF-8, a position after
    every name: the answer was an empty last page (``has_more`` false), as if the list ended."""
    reply = rig.client.get(f"/v1/models?{query}", headers=rig.headers("acme"))
    assert reply.status_code == 400, reply.text
    assert reply.json()["error"]["param"] == "after"


def test_an_adapter_whose_alias_serves_no_revision_is_not_listed(rig: Rig) -> None:
    """Every revision its alias routes to deprecated: ``/v1/models`` listed the adapter (to its
    owner and, public, to every tenant), though every call by that name was refused (the owner
    told it serves no revision, anyone else the unknown model's 404). Now it is not listed, its
    card is that same 404, and a page of ``limit`` cards pages on past it."""
    registry = rig.served.registry
    alias = registry.get_alias("acme", "legal")
    assert alias is not None
    states = {
        t.revision: registry.get_revision(f"acme/legal@{t.revision}").state for t in alias.targets
    }
    before_acme, before_globex = _ids(rig), _listed_by(rig, "globex")
    registry.set_visibility("acme", "legal", Visibility.PUBLIC, "test")
    try:
        assert "acme/legal" in _listed_by(rig, "globex")
        for revision in states:
            registry.set_release(f"acme/legal@{revision}", "test", state=RevisionState.DEPRECATED)
        assert _ids(rig) == [card for card in before_acme if card != "legal"]
        assert _listed_by(rig, "globex") == before_globex
        at = before_acme.index("legal")
        assert _listed(rig, after=before_acme[at - 1], limit=1) == ([before_acme[at + 1]], True)
        for tenant, model in (("acme", "legal"), ("globex", "acme/legal")):
            card = rig.client.get(f"/v1/models/{model}", headers=rig.headers(tenant))
            call = rig.client.post(
                "/v1/completions",
                json={"model": model, "prompt": "x", "max_tokens": 1},
                headers=rig.headers(tenant),
            )
            assert card.status_code == call.status_code == 404, (card.text, call.text)
            assert card.json()["error"]["message"] == call.json()["error"]["message"]
        unknown = rig.client.get("/v1/models/acme/nothing", headers=rig.headers("globex"))
        hidden = rig.client.get("/v1/models/acme/legal", headers=rig.headers("globex"))
        assert hidden.json()["error"]["message"] == unknown.json()["error"]["message"].replace(
            "acme/nothing", "acme/legal"
        )  # the one 404: another tenant learns nothing of the owner's revisions
    finally:
        for revision, state in states.items():
            registry.set_release(f"acme/legal@{revision}", "test", state=state)
        registry.set_visibility("acme", "legal", Visibility.PRIVATE, "test")
    assert _ids(rig) == before_acme and _listed_by(rig, "globex") == before_globex


def _listed_by(rig: Rig, tenant: str) -> list[str]:
    reply = rig.client.get("/v1/models", headers=rig.headers(tenant))
    assert reply.status_code == 200, reply.text
    return [card["id"] for card in reply.json()["data"]]
