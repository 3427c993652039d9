"""The background worker of the turn path: a job runs once, by whoever needs it first; queued
work waits for a kick that comes after it (an engine busy generating) or for the delay."""

from __future__ import annotations

import threading
import time

import pytest

from suffixmem.conversation.background import Background, Job


def test_a_job_runs_once_whoever_gets_to_it_first() -> None:
    calls: list[str] = []
    job = Job(lambda: calls.append(threading.current_thread().name) or len(calls))
    assert not job.done
    assert job.run() == 1 and job.run() == 1
    assert calls == [threading.current_thread().name] and job.done
    failing = Job(lambda: 1 / 0)
    for _ in range(2):  # the error is kept and raised to every caller; the job never reruns
        with pytest.raises(ZeroDivisionError):
            failing.run()


def test_a_second_caller_waits_for_the_running_job() -> None:
    started, gate = threading.Event(), threading.Event()
    runs: list[int] = []

    def slow() -> str:
        runs.append(1)
        started.set()
        gate.wait(10)
        return "x"

    job = Job(slow)
    first = threading.Thread(target=job.run)
    first.start()
    assert started.wait(10)
    out: list[str] = []
    second = threading.Thread(target=lambda: out.append(job.run()))
    second.start()
    time.sleep(0.1)
    assert out == []  # waiting for the first run, not running it again
    gate.set()
    first.join(10)
    second.join(10)
    assert out == ["x"] and runs == [1]


def _kick_until_done(bg: Background, job: Job) -> bool:
    for _ in range(100):  # a kick sent before the worker picked the job up does not count
        bg.kick()
        if job.wait(0.05):
            return True
    return False


def test_work_waits_for_a_kick_after_it_or_for_the_delay() -> None:
    bg = Background(delay_s=60)
    job = bg.submit(lambda: threading.current_thread().name)
    assert not job.wait(0.3)  # queued, not run: nobody kicked
    assert _kick_until_done(bg, job)
    assert job.run() == "suffixmem-background"
    bg.kick()  # a kick while nothing is queued is stale for what comes next
    time.sleep(0.1)
    later = bg.submit(lambda: 2)
    assert not later.wait(0.3)
    bg.flush()  # runs it now
    assert later.done and later.run() == 2
    # a caller that needs a queued job's value runs it itself; the worker then skips it
    urgent = bg.submit(lambda: threading.current_thread().name)
    assert urgent.run() == threading.current_thread().name
    bg.close()
    assert bg.submit(lambda: 3).done  # after close a job runs inline: nothing is dropped
    quick = Background(delay_s=0.05)  # an idle server: the delay runs it without a kick
    assert quick.submit(lambda: 4).wait(10)
    quick.close()


def test_a_failing_job_does_not_stop_the_worker() -> None:
    bg = Background(delay_s=0.01)
    bad = bg.submit(lambda: 1 / 0, "bad")
    good = bg.submit(lambda: "ok")
    assert good.wait(10) and good.run() == "ok" and bad.done
    with pytest.raises(ZeroDivisionError):
        bad.run()
    bg.close()
