"""Signals in long commands: cleaning up on ``kill``, and pool workers that leave Ctrl-C to the parent.

A terminal's Ctrl-C sends SIGINT to every process of the foreground group, a pool's workers
too: each would print its own ``KeyboardInterrupt`` traceback while the parent stops the pool.
:func:`worker_signals` (a pool's initializer calls it) makes the workers ignore it, so the
parent alone handles it and stops them.

``kill`` (SIGTERM) ends a Python program without running ``finally`` blocks or ``with``
exits, which left a create's temporary spill folder behind. :func:`terminate_raises` turns it
into :class:`Terminated`, an exception, while a command with temporary folders runs (the CLI's
``CLEAN_UP_ON_KILL``). Only there: a Python handler runs when the interpreter next gets control,
which a long compiled call (a fast replay) may not give back for a minute.
"""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised in the main thread so that temporary files and folders are removed.

    A subclass of ``KeyboardInterrupt``: code that cleans up on Ctrl-C cleans up on it too,
    and ``except Exception`` does not swallow it.
    """


def worker_signals() -> None:
    """In a pool's worker: ignore SIGINT (the parent handles Ctrl-C) and die on SIGTERM at once.

    SIGTERM is reset because a forked worker inherits the parent's handler, which would raise
    :class:`Terminated` inside the worker when the pool is terminated.
    """
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)


@contextmanager
def terminate_raises() -> Iterator[None]:
    """Within the block, SIGTERM raises :class:`Terminated` in this process's main thread.

    Does nothing outside the main thread (``signal.signal`` works only there) or where a
    handler other than the default is already installed (an embedding program's own).
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    if signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
        yield
        return
    pid = os.getpid()

    def handler(signum: int, frame: FrameType | None) -> None:
        # Once only: should the clean-up itself get stuck, a second kill ends the process.
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        if os.getpid() != pid:  # a child forked without worker_signals: die as SIGTERM would
            os.kill(os.getpid(), signal.SIGTERM)
            return
        raise Terminated

    signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
