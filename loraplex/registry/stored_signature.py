"""Signed revisions after registration: the fetch-time check and ``adapters verify``."""

from __future__ import annotations

import tempfile
from dataclasses import dataclass
from pathlib import Path

from loraplex.artifacts.manifest import CONFIG_FILE
from loraplex.artifacts.signature import SIGNATURE_FILE, anchor_lookup, check_stored_bundle
from loraplex.artifacts.store import ArtifactStore, fetch_to_file
from loraplex.artifacts.validate import WEIGHTS_FILE
from loraplex.errors import SignatureError
from loraplex.registry import trust
from loraplex.registry.models import Revision
from loraplex.registry.sql import audit
from loraplex.registry.sql import trust as trust_rows
from loraplex.registry.sql.db import Database


@dataclass(frozen=True)
class VerifyReport:
    """A stored revision re-checked against its tenant's policy and anchors of today."""

    ref: str  # tenant/name@revision
    policy: str  # the tenant's policy now
    passed: bool  # whether the revision would register today
    signer: str | None  # who signed it (None when unsigned)
    reason: str | None  # SignatureProblem value when it fails
    message: str  # what was found, in words


STORED_FILES = frozenset((CONFIG_FILE, WEIGHTS_FILE))  # all a registration keeps of a folder


def check(store: ArtifactStore, revision: Revision) -> None:
    """Refuse a signed revision whose stored bundle does not sign exactly its two objects."""
    if revision.provenance is None:
        return
    expected = {CONFIG_FILE: revision.config_digest, WEIGHTS_FILE: revision.adapter_digest}
    check_stored_bundle(store, revision.provenance.signature_digest, expected, revision.ref)


def reverify(
    db: Database, store: ArtifactStore, revision: Revision, *, actor: str, now: float
) -> VerifyReport:
    """Re-run registration's signature check on the stored objects; records the outcome in the
    audit log and changes nothing else (the revision's provenance stays as verified then)."""
    with db.transaction(write=False) as tx:
        policy = trust_rows.get_policy(tx, revision.tenant)
    with tempfile.TemporaryDirectory(prefix="loraplex-verify-") as scratch:
        folder = Path(scratch)
        bundle = None
        try:
            check(store, revision)
            fetch_to_file(store, revision.config_digest, folder / CONFIG_FILE)
            fetch_to_file(store, revision.adapter_digest, folder / WEIGHTS_FILE)
            if revision.provenance is not None:
                fetch_to_file(store, revision.provenance.signature_digest, folder / SIGNATURE_FILE)
                bundle = (folder / SIGNATURE_FILE).read_bytes()
            lookup = None if bundle is None else anchor_lookup(bundle)
            with db.transaction(write=False) as tx:  # the anchors the bundle names
                trusted = trust.find_trusted(tx, revision.tenant, lookup)
            verified = trust.check_offered(policy, trusted, folder, bundle, STORED_FILES)
        except SignatureError as exc:
            report = VerifyReport(
                revision.ref, policy.kind.value, False, None, exc.reason, str(exc)
            )
        else:
            signer = None if verified is None else verified.signer
            message = "unsigned; allowed by policy none" if signer is None else "signature valid"
            unstored = [] if verified is None else sorted(set(verified.files) - STORED_FILES)
            if unstored:  # a model card signed with the PEFT files: checked at registration
                message += (
                    f"; signed file(s) {', '.join(unstored)} were checked at registration and "
                    "are not stored, so not re-checked"
                )
            report = VerifyReport(revision.ref, policy.kind.value, True, signer, None, message)
    with db.transaction() as tx:
        details: dict[str, object] = {"policy": report.policy, "passed": report.passed}
        details.update(signer=report.signer, reason=report.reason)
        audit.append(tx, "revision.verify", revision.ref, details, at=now, actor=actor)
    return report
