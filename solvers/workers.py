"""What every worker process of the tool's pools runs first (the sweep's and solve --jobs's)."""

from __future__ import annotations

import multiprocessing
import os


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
