"""One worker thread that runs a run's file writes in order, off the training's path.

The jobs are I/O (file creation, renames, removals, hashing of bytes already in memory), which
release the GIL, so they overlap the next round's training even with one core. A job's failure is
raised in the submitting thread at the next :meth:`BackgroundWriter.submit` or at
:meth:`~BackgroundWriter.close`, and no later job runs; at most ``depth`` jobs wait, so a slow disk
slows the run down instead of filling the memory.

    >>> with BackgroundWriter() as writer:
    ...     writer.submit(print, "written")
    written
"""
from __future__ import annotations

import functools
import queue
import threading
from typing import Any, Callable


class BackgroundWriter:
    """Runs submitted callables one after another in a worker thread; ``close`` waits for them."""

    def __init__(self, depth: int = 2) -> None:
        self._jobs: queue.Queue[Callable[[], Any] | None] = queue.Queue(maxsize=depth)
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._work, name="fedlatent-writer", daemon=True)
        self._thread.start()

    def _work(self) -> None:
        while (job := self._jobs.get()) is not None:
            if self._error is None:
                try:
                    job()
                except BaseException as err:  # noqa: BLE001 - handed to the submitting thread
                    self._error = err

    def submit(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> None:
        """Queue ``fn(*args, **kwargs)``; first raise the failure of an earlier job, if any."""
        self._raise()
        if not self._thread.is_alive():
            raise RuntimeError("BackgroundWriter.submit after close")
        self._jobs.put(functools.partial(fn, *args, **kwargs))

    def close(self) -> None:
        """Wait until every queued job has run; raise the failure of one that failed."""
        self._join()
        self._raise()

    def _join(self) -> None:
        if self._thread.is_alive():
            self._jobs.put(None)
            self._thread.join()

    def _raise(self) -> None:
        if self._error is not None:
            error, self._error = self._error, None
            raise error

    def __enter__(self) -> BackgroundWriter:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, *_: Any) -> None:
        if exc_type is None:
            self.close()
        else:  # the exception on its way out is the one to report; the queued writes still finish
            self._join()
