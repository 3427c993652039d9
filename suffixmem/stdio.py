"""Keeping a command's stdout clean for machine-readable output.

vLLM, torch and C++ extensions write logs straight to file descriptor 1; a ``--json`` command
(the CLI's ``ask --json``, every ``suffixmem bench ... --json``) must print only its JSON there.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator


@contextlib.contextmanager
def quiet_stdout(active: bool = True) -> Iterator[None]:
    """Send everything written to stdout (Python and native code alike) to stderr while the
    block runs; ``active=False`` makes it a no-op so callers need no branch."""
    if not active:
        yield
        return
    sys.stdout.flush()
    saved = os.dup(1)
    # fd level, not sys.stdout: native code (vLLM's C++ logs) bypasses Python's stream
    os.dup2(2, 1)
    try:
        yield
    finally:
        sys.stdout.flush()
        os.dup2(saved, 1)
        os.close(saved)
