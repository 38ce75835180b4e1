"""Adapter signatures: OpenSSF ``model-signing`` bundles, signed, verified and read.

A bundle (``model.sig``) is a Sigstore bundle over an in-toto statement whose predicate lists
every file of the signed folder with its sha256. Verification is ``model-signing``'s: its
verifier checks the signature against a trusted public key or certificate root and returns the
signed manifest, and its hasher hashes the folder; this module only compares the two and names
the difference (extra file, missing file, changed bytes, a bundle made for other content).

``covered_files`` reads the signed manifest without checking the signature: the fetch path uses
it on a bundle whose digest is pinned in the revision record (the store verifies those bytes),
so no key is needed there and nothing is re-hashed.

NOTE: ``model-signing`` is an optional dependency (``pip install loraplex[signing]``); it is
imported inside the functions, and its absence is a ``SignatureError`` naming the extra.
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
import tempfile
from collections.abc import Collection, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any

from loraplex.artifacts.store import ArtifactStore
from loraplex.errors import DigestMismatchError, SignatureError, quoted

SIGNATURE_FILE = "model.sig"  # the bundle's name beside the files (model-signing's default)
MAX_SIGNATURE_BYTES = 1 << 20  # a bundle over a PEFT folder is a few KiB
MAX_CHAIN_CERTIFICATES = 16  # a signing certificate and its intermediates (and root)
_SHA256_HEX = re.compile("[0-9a-f]{64}")  # a key hint as model-signing writes it
_HASH_TYPE = "sha256"  # the store's digest: a manifest hashed otherwise cannot be compared


class SignatureProblem(StrEnum):
    """Why a signature was refused (``SignatureError.reason``)."""

    UNSIGNED = "unsigned"  # the policy needs a bundle and none was offered
    MALFORMED = "malformed"  # not a model-signing bundle, or over the size bound
    UNAVAILABLE = "unavailable"  # model-signing is not installed
    KEYLESS = "keyless"  # a Sigstore keyless bundle: needs the network, refused
    NO_TRUST = "no_trust"  # the tenant has no trust anchor to verify with
    WRONG_SIGNER = "wrong_signer"  # no trust anchor of the tenant verifies the signature
    IDENTITY = "identity"  # verified, but the signer is not among the required identities
    UNSUPPORTED = "unsupported"  # signed with another hash or sharded serialization
    NOT_COVERED = "not_covered"  # a file the signature does not list
    MISSING_FILE = "missing_file"  # a signed file that is not there
    DIGEST_MISMATCH = "digest_mismatch"  # a signed file whose bytes changed
    SWAPPED_BUNDLE = "swapped_bundle"  # the bundle signs other content than these files
    UNHASHABLE = "unhashable"  # the folder holds what model-signing will not hash (a link)


class AnchorKind(StrEnum):
    """What a trust anchor is."""

    KEY = "key"  # an elliptic-curve public key (PEM)
    CERTIFICATE = "certificate"  # a certificate root (PEM); signers present a chain to it


_EXPECTED = {  # what ``anchor_ids`` accepts, as its error names it
    AnchorKind.KEY: "elliptic-curve public key (P-256, P-384 or P-521)",
    AnchorKind.CERTIFICATE: "X.509 certificate",
}


@dataclass(frozen=True)
class Anchor:
    """One trusted key or certificate root, as the verifier needs it."""

    name: str  # the label it was added under
    kind: AnchorKind  # key or certificate root
    pem: str  # the public key or certificate, PEM


@dataclass(frozen=True)
class AnchorIds:
    """What one trust anchor is known by (``anchor_ids``)."""

    fingerprint: str  # sha256 of the DER form (the key's SubjectPublicKeyInfo, or the certificate)
    key_id: str  # what a bundle names it by: sha256 of the key's PEM SubjectPublicKeyInfo
    # (model-signing's hint), or of the certificate's subject name (DER)


@dataclass(frozen=True)
class VerifiedSignature:
    """What a verified bundle says."""

    anchor: str  # name of the trust anchor that verified it
    signer: str  # "key:<anchor name>", or the signing certificate's subject (RFC 4514)
    manifest_digest: str  # the statement's subject digest (sha256 over the signed digests)
    files: Mapping[str, str]  # signed path -> sha256
    bundle_digest: str  # sha256 of the bundle bytes that were verified


@dataclass(frozen=True)
class AnchorLookup:
    """Which of a tenant's anchors may verify a bundle: those of ``kind`` with a key id in
    ``key_ids`` (``anchor_ids``); every one of ``kind`` when ``key_ids`` is None (a key
    bundle of model-signing's older format names no key)."""

    kind: AnchorKind  # key or certificate root
    key_ids: frozenset[str] | None  # ids the bundle names; None: it names none


def anchor_ids(kind: AnchorKind, pem: str) -> AnchorIds:
    """``pem``'s fingerprint and key id, from one parse; ``ValueError`` naming ``pem`` when it is
    not a usable anchor (an elliptic-curve public key, or an X.509 certificate)."""
    from cryptography import x509  # with model-signing: the signing extra
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    data, spki = pem.encode("ascii", "replace"), serialization.PublicFormat.SubjectPublicKeyInfo
    try:
        if kind is AnchorKind.CERTIFICATE:
            certificate = x509.load_pem_x509_certificate(data)
            der = certificate.public_bytes(serialization.Encoding.DER)
            named = certificate.subject.public_bytes()
        else:
            key = serialization.load_pem_public_key(data)
            if not isinstance(key, ec.EllipticCurvePublicKey):
                raise ValueError("not an elliptic-curve key")
            der = key.public_bytes(serialization.Encoding.DER, spki)
            named = key.public_bytes(serialization.Encoding.PEM, spki)
    except ValueError as exc:
        raise ValueError(f"pem is invalid; expected a PEM {_EXPECTED[kind]} ({exc})") from None
    return AnchorIds(hashlib.sha256(der).hexdigest(), hashlib.sha256(named).hexdigest())


def anchor_lookup(bundle: bytes) -> AnchorLookup:
    """The anchors that may verify ``bundle`` (read, not verified): the key its hint names, or
    the certificates that issued (or are) one of its chain's first ``MAX_CHAIN_CERTIFICATES``."""
    signature = _read(bundle)
    material, kind = signature.bundle.verification_material, _kind_of(signature)
    if kind is AnchorKind.KEY:
        hint = str(material.public_key.hint or "")
        if not hint:
            return AnchorLookup(kind, None)
        # NOTE: the bundle's text: a hint that is no sha256 names no anchor (model-signing's
        # verifier refuses a key whose hash differs from the hint anyway)
        return AnchorLookup(kind, frozenset({hint} if _SHA256_HEX.fullmatch(hint) else ()))
    from cryptography import x509

    certificates = material.x509_certificate_chain.certificates
    if len(certificates) > MAX_CHAIN_CERTIFICATES:
        raise _malformed(
            f"a chain of {len(certificates)} certificates; expected at most "
            f"{MAX_CHAIN_CERTIFICATES}"
        )
    names: set[str] = set()
    for certificate in certificates:
        try:
            parsed = x509.load_der_x509_certificate(certificate.raw_bytes)
        except ValueError as exc:
            raise _malformed(f"unreadable certificate: {exc}") from None
        for name in (parsed.issuer, parsed.subject):
            names.add(hashlib.sha256(name.public_bytes()).hexdigest())
    return AnchorLookup(kind, frozenset(names))


def bundle_digest(bundle: bytes) -> str:
    return hashlib.sha256(bundle).hexdigest()


def verify_dir(
    adapter_dir: Path,
    bundle: bytes,
    anchors: Sequence[Anchor],
    num_trusted: int | None = None,
    stored: Collection[str] | None = None,
) -> VerifiedSignature:
    """Check ``bundle`` against ``anchors`` and ``adapter_dir``'s files (bundle file excluded).
    ``anchors`` may be only those ``anchor_lookup`` names of the ``num_trusted`` the tenant has
    (None: ``anchors`` are all of them). ``stored``: the only files kept of a registered folder
    (``adapters verify``); a signed file outside them (a model card) was checked at registration
    and is not compared, nor reported missing."""
    signature = _read(bundle)
    kind = _kind_of(signature)
    candidates = [anchor for anchor in anchors if anchor.kind is kind]
    num_trusted = len(anchors) if num_trusted is None else num_trusted
    if not num_trusted:
        raise SignatureError(SignatureProblem.NO_TRUST, "the tenant has no trust anchor")
    signed, anchor = _verified_manifest(signature, candidates, kind, num_trusted)
    files = _signed_files(signed)
    actual = _hash_dir(adapter_dir)
    _compare(actual, files if stored is None else {p: d for p, d in files.items() if p in stored})
    signer = f"key:{anchor.name}" if kind is AnchorKind.KEY else _certificate_subject(signature)
    digest = bundle_digest(bundle)
    return VerifiedSignature(anchor.name, signer, _subject_digest(signature), files, digest)


def covered_files(bundle: bytes) -> dict[str, str]:
    """The signed manifest (path -> sha256), read without checking the signature.

    NOTE: the fetch path calls this on every cold load, so it reads the bundle's JSON directly
    (no protobuf, no temporary file) and hands the statement to model-signing's own reader.
    """
    if len(bundle) > MAX_SIGNATURE_BYTES:
        raise _malformed(f"it exceeds {MAX_SIGNATURE_BYTES} bytes")
    (signing,) = _modules("_signing.signing")
    try:
        envelope = json.loads(bundle)["dsseEnvelope"]
        statement = json.loads(base64.b64decode(envelope["payload"], validate=True))
        manifest = signing.dsse_payload_to_manifest(statement)
    except Exception as exc:  # json, base64, key and model-signing's ValueError alike
        raise _malformed(f"unreadable statement: {type(exc).__name__}") from exc
    return _signed_files(manifest)


def check_covers(bundle: bytes, expected: Mapping[str, str], what: str) -> None:
    """Refuse ``bundle`` unless its manifest signs exactly ``expected`` (path -> sha256)."""
    files = covered_files(bundle)
    wrong = sorted(path for path, digest in expected.items() if files.get(path) != digest)
    if wrong:
        raise SignatureError(
            SignatureProblem.SWAPPED_BUNDLE,
            f"{what}: the stored signature does not cover the stored {', '.join(wrong)} "
            "(a swapped or foreign bundle); refusing the object",
        )


def check_stored_bundle(
    store: ArtifactStore, signature_digest: str, expected: Mapping[str, str], what: str
) -> None:
    """The fetch-time check: the bundle object pinned by ``signature_digest`` must read back
    whole (the store hashes it) and sign exactly ``expected``. Re-hashes nothing else."""
    chunks: list[bytes] = []
    try:
        for chunk in store.read(signature_digest):
            chunks.append(chunk)
            if sum(map(len, chunks)) > MAX_SIGNATURE_BYTES:
                raise DigestMismatchError(what, signature_digest, "(over the bundle size bound)")
    except DigestMismatchError as exc:
        raise SignatureError(
            SignatureProblem.SWAPPED_BUNDLE,
            f"{what}: the stored signature object {signature_digest} was replaced "
            f"(its bytes hash to {exc.actual}); refusing the revision",
        ) from exc
    check_covers(b"".join(chunks), expected, what)


def sign_dir(
    adapter_dir: Path,
    private_key: Path,
    certificate: Path | None = None,
    chain: Sequence[Path] = (),
) -> Path:
    """Sign every file of ``adapter_dir`` into ``adapter_dir/model.sig`` (replaced if present)."""
    signing, hashing = _modules("signing", "hashing")
    config = signing.Config().set_hashing_config(_hashing_config(hashing))
    if certificate is None:
        config.use_elliptic_key_signer(private_key=private_key)
    else:
        config.use_certificate_signer(
            private_key=private_key, signing_certificate=certificate, certificate_chain=chain
        )
    target = adapter_dir / SIGNATURE_FILE
    config.sign(adapter_dir, target)
    return target


# --- model-signing, wrapped -----------------------------------------------------------------


def _modules(*names: str) -> list[Any]:
    import importlib

    try:
        return [importlib.import_module(f"model_signing.{name}") for name in names]
    except ImportError as exc:
        raise SignatureError(
            SignatureProblem.UNAVAILABLE,
            "signature checks need the model-signing package: pip install 'loraplex[signing]'",
        ) from exc


def _hashing_config(hashing: Any) -> Any:
    """File-level sha256 (the store's digests), the bundle itself left out."""
    config = hashing.Config().use_file_serialization(hashing_algorithm=_HASH_TYPE)
    return config.set_ignored_paths(paths=[SIGNATURE_FILE])  # git metadata: ignored too


def _read(bundle: bytes) -> Any:
    (pb,) = _modules("_signing.sign_sigstore_pb")
    if len(bundle) > MAX_SIGNATURE_BYTES:
        raise _malformed(f"it exceeds {MAX_SIGNATURE_BYTES} bytes")
    with tempfile.TemporaryDirectory(prefix="loraplex-sig-") as scratch:
        path = Path(scratch) / SIGNATURE_FILE
        path.write_bytes(bundle)
        try:
            return pb.Signature.read(path)
        except Exception as exc:  # json, protobuf and key errors all mean "not a bundle"
            raise _malformed(type(exc).__name__) from exc


def _malformed(why: str) -> SignatureError:
    return SignatureError(
        SignatureProblem.MALFORMED, f"the signature is not a model-signing bundle ({why})"
    )


def _kind_of(signature: Any) -> AnchorKind:
    material = signature.bundle.verification_material
    if material.public_key is not None and material.public_key.hint is not None:
        return AnchorKind.KEY
    if material.x509_certificate_chain is not None:
        return AnchorKind.CERTIFICATE
    raise SignatureError(
        SignatureProblem.KEYLESS,
        "the signature is a Sigstore keyless bundle; verifying it needs the public Sigstore "
        "instance (network), which loraplex does not reach: sign with a key or certificate",
    )


def _verified_manifest(
    signature: Any, candidates: Sequence[Anchor], kind: AnchorKind, num_trusted: int
) -> tuple[Any, Anchor]:
    (ec_key, certificate) = _modules("_signing.sign_ec_key", "_signing.sign_certificate")
    for anchor in candidates:
        with _pem_file(anchor.pem) as path:
            try:
                if kind is AnchorKind.KEY:
                    verifier = ec_key.Verifier(path)
                else:
                    verifier = certificate.Verifier([path])
                return verifier.verify(signature), anchor
            except Exception:
                continue
    names = ", ".join(sorted(anchor.name for anchor in candidates)) or "none"
    raise SignatureError(
        SignatureProblem.WRONG_SIGNER,
        f"the signature is by a {kind.value} no trust anchor of the tenant verifies "
        f"({num_trusted} trusted; tried, by the {kind.value} the signature names: {names})",
    )


@contextmanager
def _pem_file(pem: str) -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="loraplex-anchor-") as scratch:
        path = Path(scratch) / "anchor.pem"
        path.write_text(pem, encoding="ascii")
        yield path


def _signed_files(manifest: Any) -> dict[str, str]:
    params = manifest.serialization_type
    if params.get("method") != "files" or params.get("hash_type") != _HASH_TYPE:
        raise SignatureError(
            SignatureProblem.UNSUPPORTED,
            f"the signature hashes files with {quoted(params.get('method'))}/"
            f"{quoted(params.get('hash_type'))}; expected per-file sha256 (the default of "
            "model-signing and of `loraplex adapters sign`)",
        )
    return {rd.identifier: rd.digest.digest_hex for rd in manifest.resource_descriptors()}


def _hash_dir(adapter_dir: Path) -> dict[str, str]:
    (hashing,) = _modules("hashing")
    try:
        manifest = _hashing_config(hashing).hash(adapter_dir)
    except (ValueError, OSError) as exc:  # model-signing refuses symbolic links, for one
        raise SignatureError(
            SignatureProblem.UNHASHABLE,
            f"the folder cannot be hashed for its signature check ({type(exc).__name__}); "
            "expected regular files only",
        ) from exc
    return {rd.identifier: rd.digest.digest_hex for rd in manifest.resource_descriptors()}


def _compare(actual: Mapping[str, str], signed: Mapping[str, str]) -> None:
    extra = sorted(actual.keys() - signed.keys())
    if extra:
        raise SignatureError(
            SignatureProblem.NOT_COVERED,
            f"file(s) {', '.join(extra)} not covered by the signature",
        )
    missing = sorted(signed.keys() - actual.keys())
    if missing:
        raise SignatureError(
            SignatureProblem.MISSING_FILE,
            f"signed file(s) {', '.join(missing)} missing from the folder",
        )
    changed = sorted(path for path in signed if signed[path] != actual[path])
    if changed and len(changed) == len(signed):
        raise SignatureError(
            SignatureProblem.SWAPPED_BUNDLE,
            "the signature is for other content: none of its signed files match the folder "
            "(a bundle swapped in from another model?)",
        )
    if changed:
        raise SignatureError(
            SignatureProblem.DIGEST_MISMATCH,
            f"the sha256 of {', '.join(changed)} differs from the signed digest",
        )


def _subject_digest(signature: Any) -> str:
    statement = json.loads(signature.bundle.dsse_envelope.payload)
    return str(statement["subject"][0]["digest"][_HASH_TYPE])


def _certificate_subject(signature: Any) -> str:
    from cryptography import x509

    chain = signature.bundle.verification_material.x509_certificate_chain
    leaf = x509.load_der_x509_certificate(chain.certificates[0].raw_bytes)
    return leaf.subject.rfc4514_string()
