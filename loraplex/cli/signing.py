"""``loraplex tenants trust add|remove|list|policy``, ``loraplex adapters verify|sign``.

Trust commands are registry-direct like the other registry commands (same location options).
``adapters sign`` needs no registry: it wraps ``model-signing`` for users without a pipeline.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from loraplex.artifacts.signature import AnchorKind, sign_dir
from loraplex.cli.enum_choice import choice_of
from loraplex.cli.registry_access import (
    Actor,
    acting,
    command_group,
    failures,
    opened,
    provenance_line,
    utc_time,
)
from loraplex.cli.registry_location import Location, located
from loraplex.registry import PolicyKind
from loraplex.registry.trust import DEFAULT_MAX_TRUST_ANCHORS


def _pem_option(help_text: str) -> Any:
    return typer.Option(exists=True, dir_okay=False, help=help_text)


def register(app: typer.Typer) -> None:
    tenants = command_group(app, "tenants", "Tenants and their limits.")
    trust = typer.Typer(help="Who may sign a tenant's adapters.", no_args_is_help=True)
    tenants.add_typer(trust, name="trust")
    trust.command("add")(located(add_anchor))
    trust.command("remove")(located(remove_anchor))
    trust.command("list")(located(list_trust))
    trust.command("policy")(located(set_policy))
    adapters = command_group(app, "adapters", "Adapter artifacts and revisions.")
    adapters.command("verify")(located(verify_revision))
    adapters.command("sign")(sign_adapter)
    command_group(app, "bench", "Benchmarks.").command("signing")(bench_signing)


def add_anchor(
    location: Location,
    tenant: Annotated[str, typer.Argument()],
    name: Annotated[str, typer.Argument(help="Label; a key signs as key:<label>")],
    *,
    key: Annotated[Path | None, _pem_option("Elliptic-curve public key (PEM)")] = None,
    certificate: Annotated[Path | None, _pem_option("Certificate root (PEM)")] = None,
    max_trust_anchors: Annotated[
        int,
        typer.Option(
            help="Refuse the anchor when the tenant holds this many already (1-1000); each "
            "registration reads only the anchors its signature names",
        ),
    ] = DEFAULT_MAX_TRUST_ANCHORS,
    actor: Actor = None,
) -> None:
    """Trust a public key or a certificate root for the tenant's signatures."""
    with failures():
        path = key or certificate
        if path is None or (key is not None and certificate is not None):
            raise ValueError("--key and --certificate are invalid together; expected exactly one")
        kind = AnchorKind.KEY if key is not None else AnchorKind.CERTIFICATE
        pem = path.read_text(encoding="ascii", errors="replace")
        with opened(location.config(max_trust_anchors=max_trust_anchors)) as registry:
            anchor = registry.add_trust_anchor(tenant, name, kind, pem, acting(actor))
        typer.echo(f"trusted {anchor.kind.value} {anchor.name} sha256={anchor.fingerprint}")


def remove_anchor(
    location: Location,
    tenant: Annotated[str, typer.Argument()],
    name: Annotated[str, typer.Argument()],
    actor: Actor = None,
) -> None:
    """Stop trusting an anchor; revisions it verified keep their provenance."""
    with failures(), opened(location.config()) as registry:
        anchor = registry.remove_trust_anchor(tenant, name, acting(actor))
    typer.echo(f"removed {anchor.kind.value} {anchor.name} of tenant {tenant}")


def list_trust(location: Location, tenant: Annotated[str, typer.Argument()]) -> None:
    """The tenant's trust policy and anchors."""
    with failures(), opened(location.config()) as registry:
        policy = registry.trust_policy(tenant)
        anchors = registry.trust_anchors(tenant)
    identities = ",".join(policy.identities) or "-"
    typer.echo(f"policy\t{policy.kind.value}\tidentities={identities}")
    for anchor in anchors:
        typer.echo(
            f"{anchor.kind.value}\t{anchor.name}\tsha256={anchor.fingerprint}"
            f"\tadded={utc_time(anchor.added_at)}"
        )


def set_policy(
    location: Location,
    tenant: Annotated[str, typer.Argument()],
    policy: Annotated[PolicyKind, typer.Argument(parser=choice_of(PolicyKind))],
    *,
    identity: Annotated[
        list[str] | None, typer.Option(help="A signer the policy accepts (repeatable)")
    ] = None,
    actor: Actor = None,
) -> None:
    """Set what the tenant's next registrations must carry (none, signed, identities)."""
    with failures(), opened(location.config()) as registry:
        stored = registry.set_trust_policy(tenant, policy, identity or [], acting(actor))
    typer.echo(f"policy {stored.kind.value} for {tenant}; identities={list(stored.identities)}")


def verify_revision(
    location: Location,
    ref: Annotated[str, typer.Argument(help="tenant/name@revision")],
    actor: Actor = None,
) -> None:
    """Re-check a stored revision against the tenant's policy and anchors of today."""
    with failures(), opened(location.config()) as registry:
        report = registry.verify_revision(ref, acting(actor))
        revision = registry.get_revision(ref)
    verdict = "passes" if report.passed else f"FAILS ({report.reason})"
    typer.echo(f"{report.ref} {verdict} policy {report.policy}: {report.message}")
    if revision.provenance is not None:
        typer.echo(provenance_line(revision.provenance))
    if not report.passed:
        raise typer.Exit(1)


def sign_adapter(
    adapter_dir: Annotated[Path, typer.Argument(help="PEFT adapter directory", file_okay=False)],
    *,
    key: Annotated[Path, _pem_option("Elliptic-curve private key (PEM)")],
    certificate: Annotated[Path | None, _pem_option("Signing certificate (PEM)")] = None,
    chain: Annotated[
        list[Path] | None, typer.Option(help="Intermediate/root certificates (repeatable)")
    ] = None,
) -> None:
    """Sign every file of the directory into DIR/model.sig with model-signing."""
    with failures():
        if chain and certificate is None:
            raise ValueError("--chain is invalid without --certificate")
        target = sign_dir(adapter_dir, key, certificate, chain or [])
    typer.echo(f"signed {adapter_dir} -> {target}")


def bench_signing(
    *,
    preset: Annotated[str, typer.Option(help="Demo preset whose adapters are loaded")] = "small",
    reps: Annotated[int, typer.Option(help="Repetitions over every adapter")] = 7,
    max_adapters: Annotated[int, typer.Option(help="Adapters measured")] = 4,
    asset_dir: Annotated[
        Path | None,
        typer.Option(help="The demo set's directory (default: .loraplex-assets/bench-PRESET)"),
    ] = None,
    synthetic: Annotated[
        bool, typer.Option(help="The preset's shapes with random weights (no demo set needed)")
    ] = False,
) -> None:
    """Cold-load (L3 -> L0) cost of the fetch-time signature check: one JSON line."""
    import json
    import tempfile

    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    from loraplex.bench.signing.bench import SigningBenchConfig, run_signing_bench

    with failures(), tempfile.TemporaryDirectory() as tmp:
        folder = asset_dir or Path(".loraplex-assets") / f"bench-{preset}"
        if synthetic and asset_dir is not None:
            raise ValueError("--asset-dir is invalid with --synthetic (nothing is read from it)")
        config = SigningBenchConfig(preset, reps, max_adapters, folder, synthetic)
        key = ec.generate_private_key(ec.SECP256R1())
        key_pem = Path(tmp) / "bench.key.pem"
        key_pem.write_bytes(
            key.private_bytes(
                serialization.Encoding.PEM,
                serialization.PrivateFormat.PKCS8,
                serialization.NoEncryption(),
            )
        )
        result = run_signing_bench(config, key_pem)
    typer.echo(json.dumps(result))
