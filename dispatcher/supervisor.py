"""One owner for every task of a listener.

A task that dies unseen is the worst failure a daemon has: the claimer stops and nothing says
so, while the watchdog keeps pinging. Every task of a listener is spawned here; one that raises,
returns while it should run until the listener stops, or ends cancelled while the listener is
not stopping and nobody here cancelled it (a CancelledError that leaked from somewhere), is
logged with its traceback (`task_failed`, naming it), marks the supervisor unhealthy (so the
systemd watchdog stops pinging) and calls `on_failure`, which stops the listener: it exits 1
and systemd restarts it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine, Iterable
from typing import Any

__all__ = ["Supervisor", "TaskCancelled", "TaskFailed"]

logger = logging.getLogger(__name__)


class TaskFailed(Exception):
    """A task of the listener failed; the listener stopped."""

    def __init__(self, task: str, error: BaseException) -> None:
        super().__init__(f"{task} failed: {error!r}")
        self.task = task
        self.error = error


class TaskCancelled(Exception):
    """A task ended cancelled although nobody asked it to stop."""


class Supervisor:
    def __init__(self, on_failure: Callable[[TaskFailed], None]) -> None:
        self._on_failure = on_failure
        self._tasks: dict[asyncio.Task[Any], bool] = {}  # task -> must run until the listener stops
        self._stopping = False
        self._cancelled: set[asyncio.Task[Any]] = set()  # cancelled by cancel(): an expected end
        self.failure: TaskFailed | None = None

    @property
    def healthy(self) -> bool:
        return self.failure is None

    def spawn(self, coro: Coroutine[Any, Any, Any], name: str, *,
              until_stopped: bool = True) -> asyncio.Task[Any]:
        task = asyncio.create_task(coro, name=name)
        self._tasks[task] = until_stopped
        task.add_done_callback(self._done)
        return task

    def stopping(self) -> None:
        """From now on a task may return: the listener is stopping."""
        self._stopping = True

    def _done(self, task: asyncio.Task[Any]) -> None:
        until_stopped = self._tasks.pop(task, False)
        asked = task in self._cancelled
        self._cancelled.discard(task)
        error: BaseException | None
        if task.cancelled():
            if asked or self._stopping:
                return
            error = TaskCancelled(f"{task.get_name()} ended cancelled while the listener was running")
        else:
            error = task.exception()
        if error is None and (not until_stopped or self._stopping):
            return
        if error is None:
            error = RuntimeError(f"{task.get_name()} returned while the listener was running")
        logger.error("%s failed: %r", task.get_name(), error, exc_info=error,
                     extra={"event": "task_failed", "task": task.get_name()})
        if self.failure is None:
            self.failure = TaskFailed(task.get_name(), error)
            self._on_failure(self.failure)

    def running(self, prefix: str = "") -> list[asyncio.Task[Any]]:
        return [task for task in self._tasks if task.get_name().startswith(prefix) and not task.done()]

    async def cancel(self, tasks: Iterable[asyncio.Task[Any]] | None = None) -> int:
        """Cancel `tasks` (default: all still running) and wait for them; how many were running."""
        chosen = [task for task in (list(self._tasks) if tasks is None else tasks) if not task.done()]
        for task in chosen:
            self._cancelled.add(task)
            task.cancel()
        await asyncio.gather(*chosen, return_exceptions=True)
        return len(chosen)
