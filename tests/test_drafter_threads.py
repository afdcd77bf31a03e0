"""Threads sharing one Drafter (a server's thread pool): every call runs whole (both implementations).

The threads switch as often as CPython allows (``sys.setswitchinterval``), so calls that were not
guarded interleaved inside the Drafter's shared state: before ``RequestHost.lock`` the
reference's hybrid policy raised IndexError and "call begin_request()" errors here, counters
lost updates, and a save could forget a request ended while it wrote.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import cache
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import DEMO_DATA
from tests.impls import FastImpl, ImplTests, ReferenceImpl

THREADS = 4
PER_THREAD = 3
LENGTH = 240


@cache
def text() -> list[int]:
    from lookupdec.tokens import read_tokens

    tokens: list[int] = read_tokens(DEMO_DATA / "wiki.test.demo.llama3.bin").tolist()[:20_000]
    return tokens


def segments(worker: int) -> list[list[int]]:
    """The requests of one worker: slices of the demo text that repeat one another in part."""
    tokens = text()
    return [tokens[(worker * 7 + i * 3) * 211 :][:LENGTH] for i in range(PER_THREAD)]


@contextmanager
def switching_often() -> Iterator[None]:
    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        yield
    finally:
        sys.setswitchinterval(old)


def teacher_forced(drafter: Any, seg: list[int], counts: dict[str, int]) -> None:
    """One request over ``seg`` (the first 40 tokens its prompt), the model committing ``seg``."""
    with drafter.request(seg[:40]) as req:
        pos = 40
        while pos < len(seg):
            proposal = req.propose()
            n = 0
            while n < len(proposal) and pos + n < len(seg) and proposal[n] == seg[pos + n]:
                n += 1
            new = seg[pos : pos + n + 1]
            req.extend(new)
            pos += len(new)
            counts["proposals"] += 1
    counts["drafted"] += req.n_drafted
    counts["accepted"] += req.n_accept


def in_threads(work: Callable[[int], None], n: int) -> list[BaseException]:
    errors: list[BaseException] = []

    def run(w: int) -> None:
        try:
            work(w)
        except BaseException as e:  # reported by the test, not lost in the thread
            errors.append(e)

    threads = [threading.Thread(target=run, args=(w,)) for w in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    return errors


def assert_counts_add_up(drafter: Any, totals: list[dict[str, int]]) -> None:
    """The drafter's counters hold every thread's requests, none lost, none open."""
    stats = drafter.stats
    assert stats.requests == THREADS * PER_THREAD and drafter.open_requests == 0
    assert stats.proposals == sum(t["proposals"] for t in totals)
    assert stats.n_drafted == sum(t["drafted"] for t in totals)
    assert stats.n_accept == sum(t["accepted"] for t in totals)


class ThreadTests(ImplTests):
    @pytest.mark.parametrize("policy", ["llama", "hybrid"])
    def test_threads_share_a_drafter(self, policy: str) -> None:
        drafter = self.impl.Drafter(n_draft=8, policy=policy)
        totals = [{"proposals": 0, "drafted": 0, "accepted": 0} for _ in range(THREADS)]

        def work(w: int) -> None:
            for seg in segments(w):
                teacher_forced(drafter, seg, totals[w])

        with switching_often():
            errors = in_threads(work, THREADS)
        assert errors == []
        assert_counts_add_up(drafter, totals)
        # The same requests one after another: the dynamic cache counts the same tokens whatever
        # the order (the committed tokens are the text's), and the history holds as many.
        alone = self.impl.Drafter(n_draft=8, policy=policy)
        for w in range(THREADS):
            for seg in segments(w):
                teacher_forced(alone, seg, {"proposals": 0, "drafted": 0, "accepted": 0})
        assert drafter.dynamic.contents() == alone.dynamic.contents()
        if policy == "hybrid":
            assert len(drafter.policy_state.history) == len(alone.policy_state.history)

    def test_saves_lose_no_request_ended_meanwhile(self, tmp_path: Path) -> None:
        path = tmp_path / "dynamic.bin"
        drafter = self.impl.Drafter(n_draft=8, dynamic=str(path))
        done = threading.Event()

        def work(w: int) -> None:
            if w == 0:  # ends requests while the other thread saves
                try:
                    for v in range(THREADS):
                        for seg in segments(v):
                            drafter.request(seg).end()
                finally:
                    done.set()
            else:
                while not done.is_set():
                    drafter.save()

        with switching_often():
            errors = in_threads(work, 2)
        assert errors == []
        drafter.save()
        expected = self.impl.NgramCache()
        for v in range(THREADS):
            for seg in segments(v):
                expected.update(seg, len(seg))
        assert self.impl.NgramCache.load(str(path)).contents() == expected.contents()

    def test_isolated_drafter_counts_every_thread(self) -> None:
        from lookupdec.adapters import IsolatedDrafter

        iso = IsolatedDrafter(n_draft=8, policy="hybrid", drafter_class=self.impl.Drafter)
        totals = [{"proposals": 0, "drafted": 0, "accepted": 0} for _ in range(THREADS)]
        running = threading.Semaphore(0)

        def work(w: int) -> None:
            if w == THREADS:  # reads the counts while the others start, draft and end requests
                finished = 0
                while finished < THREADS:
                    assert iso.stats.requests >= 0 and iso.open_requests >= 0
                    finished += running.acquire(blocking=False)
                return
            try:
                for seg in segments(w):
                    teacher_forced(iso, seg, totals[w])
            finally:
                running.release()

        with switching_often():
            errors = in_threads(work, THREADS + 1)
        assert errors == []
        assert_counts_add_up(iso, totals)


class TestThreadsReference(ReferenceImpl, ThreadTests):
    pass


class TestThreadsFast(FastImpl, ThreadTests):
    pass
