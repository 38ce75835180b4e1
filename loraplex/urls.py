"""``http_url``: whether a configured base URL (a deployment, an S3-compatible endpoint) is one a
client can be pointed at: ``http`` or ``https``, a host, a valid port, and (where the URL ends up
in manifests or logs) no credentials. One rule for every place that takes such a URL: each had
its own, and ``qualify --url ftp://x``, ``preflight --url http://`` and ``s3_endpoint ftp://x``
were each accepted by one of them."""

from __future__ import annotations

from urllib.parse import urlsplit


def http_url(value: str, *, credentials: bool = True) -> bool:
    """Whether ``value`` is an ``http(s)://HOST[:PORT]...`` URL; ``credentials`` False: also
    without a user name or password in it."""
    try:
        parts = urlsplit(value)
        port_ok = parts.port is None or parts.port > 0  # .port raises for one out of range
    except ValueError:
        return False
    if parts.scheme not in ("http", "https") or not parts.hostname or not port_ok:
        return False
    return credentials or (parts.username is None and parts.password is None)
