"""What every worker process of the tool's pools runs first (the sweep's and solve --jobs's)."""

from __future__ import annotations

import multiprocessing
import os
from contextlib import contextmanager


def die_with_parent() -> None:
    """Worker initializer: the worker ends when the process that started it does, whatever
    ended it. A kill -9 of the sweep driver (or of a solve with --jobs) had left its workers
    (and the forkserver and resource tracker they hold open) running a task and then waiting
    on their queue forever: nothing tells them the parent is gone. multiprocessing gives each
    child a sentinel, a pipe end that reads EOF when the parent is gone
    (`parent_process().join()` waits on it), for fork, forkserver and spawn alike; a daemon
    thread waits on it and exits the process (a worker inside a C call that holds the GIL,
    e.g. one HiGHS solve, ends when that call returns)."""
    import threading

    parent = multiprocessing.parent_process()
    if parent is None:
        return

    def watch():
        parent.join()
        os._exit(1)

    threading.Thread(target=watch, name="die-with-parent", daemon=True).start()


def quiet_worker() -> None:
    """Initializer of solve's bounding and screening workers: die_with_parent, and Ctrl-C
    left to the driver (a terminal's SIGINT reaches the whole process group; a worker that
    raised KeyboardInterrupt mid-task left pool.join() waiting for ever)."""
    import signal

    signal.signal(signal.SIGINT, signal.SIG_IGN)
    die_with_parent()


@contextmanager
def stop_on_sigint(say=None):
    """Inside the block, the first Ctrl-C (SIGINT) asks the search to stop (model.work.
    request_stop: every deadline passes, so it returns its best plan and a valid bound as at
    its time limit); a second one interrupts at once (KeyboardInterrupt). `say(text)` tells
    the user. Outside the main thread, or where signals cannot be set, it does nothing."""
    import signal
    import threading

    from model import work

    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum, frame):
        if work.stop_offset():
            raise KeyboardInterrupt
        work.request_stop()
        if say is not None:
            say("interrupted: finishing with the best plan found so far (Ctrl-C again to "
                "abort)")

    old = signal.signal(signal.SIGINT, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, old)
        work.clear_stop()
