"""The OpenAPI documents: ``/openapi.json`` (public, no key) describes the tenant API, the routes
served on the public listener; ``/admin/openapi.json`` (the admin credential, on the admin
listener when there is one) describes every route, admin ones included. Tenants never see the
admin surface described, and operators get one document for everything.

The documents are generated from the routes, so request bodies are the pydantic models the
server validates with. Corrections make them true to what the server sends: every error is the
OpenAI error body (the ``default`` response), never FastAPI's 422 validation body (a bad request
is a 400 here); each operation names the credential it needs; the generation routes may answer
server-sent events; the tenant's document holds no schema only admin routes use.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from pydantic import BaseModel

from loraplex.server.auth import Credential, required_credential
from loraplex.server.listeners import is_admin_path

PUBLIC_PATH = "/openapi.json"
ADMIN_PATH = "/admin/openapi.json"
_SCHEMES = {
    Credential.TENANT: {"type": "http", "scheme": "bearer", "description": "a tenant API key"},
    Credential.ADMIN: {"type": "http", "scheme": "bearer", "description": "the admin credential"},
}
_UNUSED = ("HTTPValidationError", "ValidationError")  # FastAPI's 422 body, never sent here
_REF_PREFIX = "#/components/schemas/"
# Routes that answer server-sent events when the body asks ``stream``.
_STREAMING_PATHS = ("/v1/completions", "/v1/chat/completions")


class ErrorDetail(BaseModel):
    message: str  # safe to show the caller
    type: str  # OpenAI error type, e.g. "invalid_request_error"
    param: str | None  # the request field at fault
    code: str | None  # machine-readable code, e.g. "model_not_found"


class ErrorResponse(BaseModel):
    """The body of every error (``server/errors.py``)."""

    error: ErrorDetail


def document(app: FastAPI, admin: bool) -> dict[str, Any]:
    """The OpenAPI document of ``app``'s routes (tenant routes only unless ``admin``), generated
    once per kind and kept on ``app.state``."""
    cached: dict[bool, dict[str, Any]] = app.state.openapi_documents
    if admin not in cached:
        # NOTE: FastAPI keeps included routers as lazy entries only ``get_openapi`` expands, so
        # the document is built from every route and admin paths are dropped afterwards.
        raw = get_openapi(title=app.title, version=app.version, routes=app.routes)
        if not admin:
            raw["paths"] = {p: ops for p, ops in raw["paths"].items() if not is_admin_path(p)}
        cached[admin] = _pruned(_corrected(raw))
    return cached[admin]


def _pruned(doc: dict[str, Any]) -> dict[str, Any]:
    """``doc`` without the schemas no operation reaches (the admin bodies, in the tenant's)."""
    schemas: dict[str, Any] = doc["components"]["schemas"]
    reached: set[str] = set()
    pending = _refs(doc["paths"])
    while pending:
        name = pending.pop()
        if name not in reached and name in schemas:
            reached.add(name)
            pending |= _refs(schemas[name])
    doc["components"]["schemas"] = {n: s for n, s in schemas.items() if n in reached}
    return doc


def _refs(value: object) -> set[str]:
    """The component schemas ``value`` names, at any depth."""
    if isinstance(value, dict):
        found: set[str] = set()
        ref = value.get("$ref")
        if isinstance(ref, str) and ref.startswith(_REF_PREFIX):
            found.add(ref.removeprefix(_REF_PREFIX))
        for item in value.values():
            found |= _refs(item)
        return found
    if isinstance(value, list):
        return set().union(*(_refs(item) for item in value))
    return set()


def _corrected(doc: dict[str, Any]) -> dict[str, Any]:
    components = doc.setdefault("components", {})
    schemas = components.setdefault("schemas", {})
    for name in _UNUSED:
        schemas.pop(name, None)
    schemas.update(_error_schemas())
    components["securitySchemes"] = {f"{kind.value}Key": s for kind, s in _SCHEMES.items()}
    error = {"$ref": "#/components/schemas/ErrorResponse"}
    for path, operations in doc.get("paths", {}).items():
        credential = required_credential(path)
        for operation in operations.values():
            responses = operation.setdefault("responses", {})
            responses.pop("422", None)
            responses["default"] = {
                "description": "An error",
                "content": {"application/json": {"schema": error}},
            }
            if credential is not None:
                operation["security"] = [{f"{credential.value}Key": []}]
            if path in _STREAMING_PATHS and "200" in responses:
                content = responses["200"].setdefault("content", {})
                content["text/event-stream"] = {"schema": _SSE_EVENT}
    return doc


# One server-sent event (before OpenAPI 3.2, an event stream's ``schema`` describes each event):
# ``data`` holds a chunk's JSON, an error's JSON, or ``[DONE]``.
_SSE_EVENT = {
    "type": "object",
    "properties": {"event": {"type": "string"}, "data": {"type": "string"}},
    "required": ["data"],
}


def _error_schemas() -> dict[str, Any]:
    schema = ErrorResponse.model_json_schema(ref_template="#/components/schemas/{model}")
    definitions: dict[str, Any] = schema.pop("$defs", {})
    return {**definitions, "ErrorResponse": schema}
