"""Keys and certificates for signing tests, made with ``cryptography`` (no network, no files
from elsewhere): an elliptic-curve key pair, and a certificate root with a signing leaf."""

from __future__ import annotations

import datetime
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

# A P-256 public key and a certificate root over it, fixed: the fingerprints and key ids the
# registry stored for them must never change with the code that computes them.
PINNED_KEY_PEM = """-----BEGIN PUBLIC KEY-----
MFkwEwYHKoZIzj0CAQYIKoZIzj0DAQcDQgAE0BbNDzIb/d4DSr1ROM8lJc/xaNCP
dlT4XAwPC78BM1eCMqtCjOw3evN9FJpjeHIL/hlMj+x8SpW8gUg9I5SIHQ==
-----END PUBLIC KEY-----
"""
PINNED_ROOT_PEM = """-----BEGIN CERTIFICATE-----
MIIBLDCB1KADAgECAgEBMAoGCCqGSM49BAMCMBYxFDASBgNVBAMMC3Bpbm5lZCBy
b290MB4XDTI2MDEwMTAwMDAwMFoXDTI2MDEwMjAwMDAwMFowFjEUMBIGA1UEAwwL
cGlubmVkIHJvb3QwWTATBgcqhkjOPQIBBggqhkjOPQMBBwNCAATQFs0PMhv93gNK
vVE4zyUlz/Fo0I92VPhcDA8LvwEzV4Iyq0KM7Dd6830UmmN4cgv+GUyP7HxKlbyB
SD0jlIgdoxMwETAPBgNVHRMBAf8EBTADAQH/MAoGCCqGSM49BAMCA0cAMEQCICHW
+amwoy1kcX6WFKl/iGvSkxU/os9h05jO/X86eAvtAiBKNQwmShQyY1RZi7ygWnwc
aw6hk66N1g70HBMqDqjE/A==
-----END CERTIFICATE-----
"""
PINNED_KEY_FINGERPRINT = "10d9c03ceda3a350cb1f4f19a72208023ee744f784ab406b58b16ad88cb25df2"
PINNED_KEY_ID = "630ba38e629f5c33e931cb1edee3530037b3b48f65dc27baf1f8858f40328ba8"
PINNED_ROOT_FINGERPRINT = "87d438c5f157148a7d9ca8ef93abaa8662f2ca7c106d1557aca89dd0f93da95f"
PINNED_ROOT_KEY_ID = "def09691d2cd8bae719b2d9bd75977b87ba95244b417dc0ec14aeba06b16cebe"


@dataclass(frozen=True)
class KeyPair:
    private_path: Path  # PEM private key, what `adapters sign --key` takes
    public_pem: str  # PEM public key, what `tenants trust add --key` takes
    public_path: Path  # the same, as a file


@dataclass(frozen=True)
class CertificateSigner:
    root_pem: str  # the certificate root a tenant trusts
    root_path: Path  # the same, as a file
    key_path: Path  # the leaf's private key
    leaf_path: Path  # the signing certificate
    subject: str  # the leaf's subject (RFC 4514): the signer identity


def key_pair(directory: Path, label: str) -> KeyPair:
    directory.mkdir(parents=True, exist_ok=True)
    key = ec.generate_private_key(ec.SECP256R1())
    private_path = directory / f"{label}.key.pem"
    private_path.write_bytes(_private_pem(key))
    public_pem = key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    public_path = directory / f"{label}.pub.pem"
    public_path.write_bytes(public_pem)
    return KeyPair(private_path, public_pem.decode(), public_path)


def certificate_signer(directory: Path, label: str, common_name: str) -> CertificateSigner:
    """A self-signed root and a leaf it issued for code signing, valid for a day around now."""
    directory.mkdir(parents=True, exist_ok=True)
    root_key = ec.generate_private_key(ec.SECP256R1())
    root_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"{label} root")])
    root = (
        _builder(root_name, root_name, root_key.public_key())
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(_key_usage(sign_certs=True), critical=True)
        .sign(root_key, hashes.SHA256())
    )
    leaf_key = ec.generate_private_key(ec.SECP256R1())
    leaf_name = x509.Name(
        [
            x509.NameAttribute(NameOID.COMMON_NAME, common_name),
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, label),
        ]
    )
    leaf = (
        _builder(leaf_name, root_name, leaf_key.public_key())
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(_key_usage(sign_certs=False), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CODE_SIGNING]), critical=False)
        .sign(root_key, hashes.SHA256())
    )
    root_pem = root.public_bytes(serialization.Encoding.PEM)
    paths = {name: directory / f"{label}.{name}.pem" for name in ("root", "key", "leaf")}
    paths["root"].write_bytes(root_pem)
    paths["key"].write_bytes(_private_pem(leaf_key))
    paths["leaf"].write_bytes(leaf.public_bytes(serialization.Encoding.PEM))
    subject = leaf.subject.rfc4514_string()
    return CertificateSigner(root_pem.decode(), paths["root"], paths["key"], paths["leaf"], subject)


def _builder(
    subject: x509.Name, issuer: x509.Name, key: ec.EllipticCurvePublicKey
) -> x509.CertificateBuilder:
    now = datetime.datetime.now(datetime.UTC)
    return (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer)
        .public_key(key)
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(hours=1))
        .not_valid_after(now + datetime.timedelta(days=1))
    )


def _key_usage(*, sign_certs: bool) -> x509.KeyUsage:
    return x509.KeyUsage(
        digital_signature=True,
        content_commitment=False,
        key_encipherment=False,
        data_encipherment=False,
        key_agreement=False,
        key_cert_sign=sign_certs,
        crl_sign=sign_certs,
        encipher_only=False,
        decipher_only=False,
    )


def _private_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
