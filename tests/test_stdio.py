"""``stdio``: what native code writes to file descriptors 1 and 2 is redirected, not only
Python's streams (checked in a child process, whose descriptors the test owns)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

CHILD = r"""
import os, sys
from pathlib import Path
from suffixmem.stdio import quiet_start, quiet_stdout
log = Path(sys.argv[1])
with quiet_stdout():
    os.write(1, b"native stdout\n")
print("json")
with quiet_start(log) as terminal:
    os.write(1, b"engine says 1\n")
    os.write(2, b"engine says 2\n")
    print("python warning", file=sys.stderr)
    terminal.write("spinner\n")
print("after start:", log.read_text().replace("\n", "|"))
try:
    with quiet_start(log):
        os.write(2, b"cannot start: out of memory\n")
        raise RuntimeError("boom")
except RuntimeError:
    print("error: boom", file=sys.stderr)
"""


def test_quiet_start_keeps_start_up_output_in_its_log_and_shows_it_on_failure(
        tmp_path: Path) -> None:
    log = tmp_path / "logs" / "engine-start.log"
    r = subprocess.run([sys.executable, "-c", CHILD, str(log)], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout == "json\nafter start: engine says 1|engine says 2|python warning|\n"
    # the successful start wrote nothing but the spinner's stream to the terminal; the failed
    # one showed its log, then the error line
    assert r.stderr == ("native stdout\nspinner\ncannot start: out of memory\nerror: boom\n")
    assert log.read_text() == "cannot start: out of memory\n"  # the newest start's log
