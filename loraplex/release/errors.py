"""Errors of the release flow. They subclass the registry's, so the HTTP mapping that knows
``RegistryError`` (400) and ``RecordNotFoundError`` (404) already answers them."""

from __future__ import annotations

from loraplex.errors import RecordNotFoundError, RegistryError


class ReleaseError(RegistryError):
    """A release operation was refused; nothing changed."""


class ReleaseNotFoundError(RecordNotFoundError):
    """No release with that id, or no release on that alias."""


class InvalidTransitionError(ReleaseError):
    """The transition is not an edge of the release graph (``machine.py``) from the state the
    release is in."""


class ReleaseConflictError(ReleaseError):
    """Someone else moved the release first (compare-and-set on state and version failed); the
    caller re-reads and decides again."""


class ReleaseStartError(ReleaseError):
    """``release start`` was refused: the revision cannot be released onto that alias now."""
