"""``SharedTurnLock`` on a SQLite file: with ``processes=True`` (the manager's
``durability="sync"``) one session's turns are serialised across processes by a byte-range lock
beside the file (an outside test had two processes generate 9 of 40 turns from a history that
lacked the other's last turn); other sessions never wait, and a killed holder frees it."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import pytest

from suffixmem.conversation.cluster import SharedTurnLock
from suffixmem.conversation.locks import SessionBusyError
from suffixmem.conversation.store import Store

HOLDER = r"""
import sys
from suffixmem.conversation.cluster import SharedTurnLock
from suffixmem.conversation.store import Store
lock = SharedTurnLock(Store(sys.argv[1]), processes=True)
with lock.hold("s1", timeout_s=5):
    print("held", flush=True)
    sys.stdin.readline()
"""


def _holder(url: str) -> subprocess.Popen[str]:
    proc = subprocess.Popen([sys.executable, "-c", HOLDER, url], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline() == "held\n"
    return proc


def test_one_session_is_serialised_across_processes(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'turns.db'}"
    store = Store(url)
    assert SharedTurnLock(store).shared is False  # one process ("async"): in-process locks
    lock = SharedTurnLock(store, processes=True)
    assert lock.shared is True
    memory = Store("sqlite://")
    assert SharedTurnLock(memory, processes=True).shared is False  # no file to share
    proc = _holder(url)
    try:
        with pytest.raises(SessionBusyError, match="another suffixmem process"), \
                lock.hold("s1", timeout_s=0.3):
            pass
        with lock.hold("s2", timeout_s=1):  # another session never waits
            pass
        proc.communicate("\n", timeout=30)  # the holder's turn ends
        with lock.hold("s1", timeout_s=5):
            pass
        proc = _holder(url)
        proc.send_signal(signal.SIGKILL)  # a process killed mid-turn frees its lock
        proc.wait(30)
        with lock.hold("s1", timeout_s=5):
            pass
    finally:
        if proc.poll() is None:
            proc.kill()
        store.close()
        memory.close()
    assert (tmp_path / "turns.db-turns.lock").exists()
