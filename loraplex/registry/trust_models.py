"""Records of a tenant's trust: which signatures its registrations must carry, and whose."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from loraplex.artifacts.identity import check_name
from loraplex.artifacts.signature import AnchorKind
from loraplex.errors import quoted

MAX_ANCHOR_PEM_BYTES = 64 << 10  # a key or a certificate root is a few KiB
MAX_IDENTITIES = 64  # identities one policy may require
MAX_IDENTITY_CHARS = 1024  # one identity (a certificate subject)


class PolicyKind(StrEnum):
    """What a tenant's registrations must carry."""

    NONE = "none"  # no signature needed (the default); an offered one is still verified
    SIGNED = "signed"  # a bundle any trust anchor of the tenant verifies
    IDENTITIES = "identities"  # ... whose signer is one of the policy's identities


@dataclass(frozen=True)
class TrustPolicy:
    """A tenant's trust policy (``none`` until set)."""

    tenant: str  # the tenant it governs
    kind: PolicyKind  # none, signed or identities
    identities: tuple[str, ...]  # signers accepted under ``identities``; empty otherwise
    updated_at: float | None  # when it was last set; None when never set

    def __post_init__(self) -> None:
        check_name("tenant", self.tenant)
        if (self.kind is PolicyKind.IDENTITIES) != bool(self.identities):
            raise ValueError(
                f"identities {quoted(list(self.identities))} is invalid; expected at least one "
                "identity with policy 'identities' and none with the other policies"
            )
        if len(self.identities) > MAX_IDENTITIES:
            raise ValueError(
                f"identities has {len(self.identities)} entries; expected at most {MAX_IDENTITIES}"
            )
        for identity in self.identities:
            if not 0 < len(identity) <= MAX_IDENTITY_CHARS:
                raise ValueError(
                    f"identity {quoted(identity)} is invalid; expected 1-{MAX_IDENTITY_CHARS} "
                    "characters"
                )


@dataclass(frozen=True)
class TrustAnchor:
    """A public key or certificate root a tenant trusts to sign its adapters."""

    tenant: str  # owning tenant
    name: str  # label, unique within the tenant (keys sign as "key:<name>")
    kind: AnchorKind  # key or certificate root
    pem: str  # the public key or certificate, PEM
    fingerprint: str  # sha256 of the DER encoding, hex
    added_at: float  # wall-clock seconds since the epoch

    def __post_init__(self) -> None:
        check_name("tenant", self.tenant)
        check_name("name", self.name)
        if len(self.pem.encode()) > MAX_ANCHOR_PEM_BYTES:
            raise ValueError(
                f"pem of {len(self.pem.encode())} bytes is invalid; expected at most "
                f"{MAX_ANCHOR_PEM_BYTES}"
            )
