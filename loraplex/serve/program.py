"""``program``: the ``loraplex`` the operator ran, as the hints of ``serve`` and ``fleet`` name it.

Here, below both ``cli`` and ``fleet`` (``fleet`` may not import ``cli``), so the two commands'
hints say the same thing: ``serve``'s said a bare ``loraplex`` after ``fleet up``'s learnt the
path the operator typed.
"""

from __future__ import annotations

import os
import shlex
import shutil
import sys
from pathlib import Path


def program(argv0: str | None = None) -> str:
    """How the operator ran ``loraplex``: ``loraplex`` when that is what ``PATH`` finds, else the
    path they typed (``.venv-fleet/bin/loraplex``, as the README runs it: a bare ``loraplex``
    hint was "command not found" in a shell without that venv activated), shell-quoted."""
    argv0 = sys.argv[0] if argv0 is None else argv0
    if Path(argv0).name != "loraplex" or os.sep not in argv0:
        return "loraplex"  # typed bare (found on PATH), or not the script (``python -m``, tests)
    found = shutil.which("loraplex")
    if found is not None and os.path.realpath(found) == os.path.realpath(argv0):
        return "loraplex"
    return shlex.quote(argv0)
