"""Registering an adapter revision: validate, store the objects, then record the row.

Order is what makes a crash at any point harmless:

1. validate the directory against the served base model, then check its signature bundle
   (``model.sig``) against the tenant's trust policy (nothing written yet);
2. write both files (and a verified bundle) to the artifact store (atomic, content-addressed,
   verified);
3. in ONE transaction: adapter row (if new), revision row, alias (if new), audit row.

A crash before 3 commits leaves at most unreferenced objects (garbage, never visible); a
revision row therefore never points at an object the store lacks. Concurrent registrations of
the same revision serialise on the write transaction: the first records it, the others find it
and become no-ops (identical bytes) or ``RevisionConflictError`` (different bytes).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, replace
from pathlib import Path

from loraplex.artifacts.base_model import TARGET_MODULES, BaseModelSpec
from loraplex.artifacts.identity import RUNTIME_COMPAT_VERSION, sha256_file
from loraplex.artifacts.manifest import CONFIG_FILE
from loraplex.artifacts.signature import (
    MAX_SIGNATURE_BYTES,
    SIGNATURE_FILE,
    SignatureProblem,
    VerifiedSignature,
    anchor_lookup,
)
from loraplex.artifacts.store import ArtifactStore
from loraplex.artifacts.validate import ValidatedAdapter, validate_adapter_dir
from loraplex.errors import RegistryError, RevisionConflictError, SignatureError, quoted
from loraplex.registry import trust
from loraplex.registry.models import (
    Adapter,
    Alias,
    AliasTarget,
    Provenance,
    RegistrationRequest,
    RegistrationResult,
    Revision,
)
from loraplex.registry.sql import adapters as rows
from loraplex.registry.sql import audit
from loraplex.registry.sql import tenants as tenant_rows
from loraplex.registry.sql import trust as trust_rows
from loraplex.registry.sql.db import Database, Tx

# Called with a stage name ("objects_stored", "rows_written") as registration passes it; the
# crash tests kill the process there. "rows_written" runs inside the open transaction.
StageHook = Callable[[str], None]


def register_adapter(
    db: Database,
    store: ArtifactStore,
    validated: ValidatedAdapter,
    request: RegistrationRequest,
    *,
    actor: str,
    now: float,
    hook: StageHook | None = None,
    signed: VerifiedSignature | None = None,
) -> RegistrationResult:
    """Record ``validated`` (and ``signed``, its verified signature) as ``request``'s revision
    (steps 2 and 3 above); the bundle is stored as an object beside the two files."""
    config_path = request.adapter_dir / CONFIG_FILE
    revision = _revision_record(request, validated, sha256_file(config_path), store.url, now)
    if signed is not None:
        revision = replace(revision, provenance=_provenance(signed, now))
    with db.transaction(write=False) as tx:
        existing = rows.get_revision(tx, request.tenant, request.name, request.revision)
    if existing is not None:
        return _same_or_conflict(existing, revision)
    store.put_file(config_path, revision.config_digest)
    store.put_file(validated.weights_path, revision.adapter_digest)
    if revision.provenance is not None:
        signature_path = request.adapter_dir / SIGNATURE_FILE
        store.put_file(signature_path, revision.provenance.signature_digest)
    if hook is not None:
        hook("objects_stored")
    try:
        with db.transaction() as tx:
            existing = rows.get_revision(tx, request.tenant, request.name, request.revision)
            if existing is None:
                _record(tx, request, revision, actor)
                if hook is not None:
                    hook("rows_written")
    except Exception as exc:
        if not db.is_unique_violation(exc):
            raise
        with db.transaction(write=False) as tx:
            existing = rows.get_revision(tx, request.tenant, request.name, request.revision)
    if existing is not None:
        return _same_or_conflict(existing, revision)
    return RegistrationResult(revision=revision, created=True)


def validate_request(
    db: Database, base: BaseModelSpec, max_lora_rank: int, request: RegistrationRequest
) -> ValidatedAdapter:
    """Step 1: the tenant must exist and the directory must pass every adapter check."""
    with db.transaction(write=False) as tx:
        if tenant_rows.get_tenant(tx, request.tenant) is None:
            raise RegistryError(f"tenant {quoted(request.tenant)} does not exist; create it first")
    return validate_adapter_dir(request.adapter_dir, base, max_lora_rank)


def check_signature(db: Database, request: RegistrationRequest) -> VerifiedSignature | None:
    """Step 1b: the offered bundle (``model.sig``) against the tenant's trust policy."""
    bundle = read_bundle(request.adapter_dir)
    lookup = None if bundle is None else anchor_lookup(bundle)  # read outside the transaction
    with db.transaction(write=False) as tx:
        policy = trust_rows.get_policy(tx, request.tenant)
        trusted = trust.find_trusted(tx, request.tenant, lookup)
    return trust.check_offered(policy, trusted, request.adapter_dir, bundle)


def read_bundle(adapter_dir: Path) -> bytes | None:
    """``adapter_dir/model.sig``'s bytes (bounded); None when there is none."""
    path = adapter_dir / SIGNATURE_FILE
    try:
        with path.open("rb") as handle:
            bundle = handle.read(MAX_SIGNATURE_BYTES + 1)
    except FileNotFoundError:
        return None
    if len(bundle) > MAX_SIGNATURE_BYTES:
        raise SignatureError(
            SignatureProblem.MALFORMED,
            f"{SIGNATURE_FILE} exceeds {MAX_SIGNATURE_BYTES} bytes; expected a signature bundle",
        )
    return bundle


def _provenance(signed: VerifiedSignature, now: float) -> Provenance:
    return Provenance(
        signature_digest=signed.bundle_digest,
        signer=signed.signer,
        trust_anchor=signed.anchor,
        manifest_digest=signed.manifest_digest,
        verified_at=now,
    )


def _record(tx: Tx, request: RegistrationRequest, revision: Revision, actor: str) -> None:
    now = revision.created_at
    adapter = Adapter(request.tenant, request.name, request.visibility, now)
    created_adapter = rows.insert_adapter_if_absent(tx, adapter)
    rows.insert_revision(tx, revision)
    created_alias = rows.get_alias(tx, request.tenant, request.name) is None
    if created_alias:
        # The first revision of an adapter becomes what its name resolves to; later ones
        # reach traffic only through an explicit alias change (the release flow).
        alias = Alias(request.tenant, request.name, (AliasTarget(request.revision, 1),), (), now)
        rows.put_alias(tx, alias)
    details: dict[str, object] = {
        "adapter_digest": revision.adapter_digest,
        "config_digest": revision.config_digest,
        "base_digest": revision.base_digest,
        "store_url": revision.store_url,
        "state": revision.state.value,
        "created_adapter": created_adapter,
        "created_alias": created_alias,
    }
    if revision.provenance is not None:
        details["provenance"] = asdict(revision.provenance)
    audit.append(tx, "revision.register", revision.ref, details, at=now, actor=actor)


def _revision_record(
    request: RegistrationRequest,
    validated: ValidatedAdapter,
    config_digest: str,
    store_url: str,
    now: float,
) -> Revision:
    injected = {module.module for module in validated.modules}
    return Revision(
        tenant=request.tenant,
        name=request.name,
        revision=request.revision,
        adapter_digest=validated.digest,
        config_digest=config_digest,
        base_digest=validated.base_digest,
        compat_version=RUNTIME_COMPAT_VERSION,
        max_rank=validated.max_rank,
        lora_alpha=float(validated.spec.lora_alpha),
        use_rslora=validated.spec.use_rslora,
        target_modules=tuple(m for m in TARGET_MODULES if m in injected),
        dtype=validated.dtype,
        tensor_bytes=validated.tensor_bytes,
        estimated_bytes=validated.estimated_bytes,
        store_url=store_url,
        created_at=now,
        state=request.state,
        warm_policy=request.warm_policy,
        probe_prompt=request.probe_prompt,
        expected_continuation=request.expected_continuation,
    )


def _same_or_conflict(existing: Revision, offered: Revision) -> RegistrationResult:
    """Identical bytes for the same base: a no-op. Anything else: refused."""
    same = (
        existing.adapter_digest == offered.adapter_digest
        and existing.config_digest == offered.config_digest
        and existing.base_digest == offered.base_digest
    )
    if not same:
        raise RevisionConflictError(
            f"{existing.ref} is already registered with adapter sha256 "
            f"{existing.adapter_digest}, config sha256 {existing.config_digest} and base "
            f"{existing.base_digest}; offered {offered.adapter_digest}, "
            f"{offered.config_digest} and {offered.base_digest}. Revisions are immutable: "
            "register a new revision"
        )
    return RegistrationResult(revision=existing, created=False)
