"""Keeping a command's stdout clean for machine-readable output, and its terminal clean of
an engine's start-up chatter.

vLLM, torch and C++ extensions write logs straight to file descriptor 1; a ``--json`` command
(the CLI's ``ask --json``, every ``suffixmem bench ... --json``) must print only its JSON there.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import TextIO

from suffixmem.errors import ConfigError


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


@contextlib.contextmanager
def quiet_start(log_path: Path | None = None) -> Iterator[TextIO]:
    """Keep what an engine writes while it starts (vLLM's and torch's warnings, C++ lines,
    progress bars: a dozen lines a user cannot act on) in ``log_path`` (default:
    ``$SUFFIXMEM_HOME/logs/engine-start.log``) instead of the terminal; yields a stream on the
    real stderr for a spinner. If the block raises, the log is copied to stderr before the
    error goes on, so a failed start still shows what the engine said."""
    if log_path is None:
        from suffixmem.config import suffixmem_home

        log_path = suffixmem_home() / "logs" / "engine-start.log"
    try:
        log_path.parent.mkdir(parents=True, exist_ok=True)
        log = open(log_path, "w+b")  # noqa: SIM115  (closed by the with below)
    except OSError as e:  # a file where the folder belongs, a folder not writable
        raise ConfigError(f"cannot write the engine's start log {log_path}: {e.strerror} "
                          "(set SUFFIXMEM_HOME to a folder you can write)") from None
    sys.stdout.flush()
    sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    terminal = os.fdopen(os.dup(saved[1]), "w", buffering=1)
    with log:
        # fd level, not sys.stdout/sys.stderr: native code bypasses Python's streams
        os.dup2(log.fileno(), 1)
        os.dup2(log.fileno(), 2)
        failed = False
        try:
            yield terminal
        except BaseException:
            failed = True
            raise
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
            for fd in saved:
                os.close(fd)
            terminal.close()
            if failed:
                log.seek(0)
                sys.stderr.write(log.read().decode("utf-8", "replace"))
                sys.stderr.flush()
