"""A daemon thread running one asyncio event loop (uvloop when installed), with a wake-up
event for its main coroutine, thread-safe submission of other coroutines, and the tasks spawned
on it (cancelled together at shutdown)."""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import threading
from collections.abc import Callable, Coroutine

logger = logging.getLogger("arealite.rollout.loop_thread")


def new_event_loop() -> asyncio.AbstractEventLoop:
    try:
        import uvloop  # optional: a faster loop where installed

        return uvloop.new_event_loop()
    except ImportError:
        return asyncio.new_event_loop()


class LoopThread:
    """``start(step)`` runs ``step()`` on the loop every time ``wake()`` is called, until
    ``stop()``. ``run(coro)`` schedules any coroutine on the loop from any thread; ``spawn``
    starts a task from the loop itself and keeps it until it ends or ``cancel_spawned``."""

    def __init__(self, name: str, on_exit: Callable[[], None] | None = None):
        self.name = name
        self.on_exit = on_exit  # called on the thread when the loop ends (crash or stop)
        self.crash: BaseException | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._wake: asyncio.Event | None = None
        self._stopping = False
        self._spawned: set[asyncio.Task] = set()

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        if self._loop is None:
            raise RuntimeError(f"{self.name}: the event loop is not running")
        return self._loop

    @property
    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    @property
    def stopping(self) -> bool:
        return self._stopping

    def start(self, step: Callable[[], None], timeout: float = 30.0) -> None:
        ready = threading.Event()
        self._loop = new_event_loop()
        self._thread = threading.Thread(
            target=self._main, args=(step, ready), name=self.name, daemon=True
        )
        self._thread.start()
        if not ready.wait(timeout):
            raise RuntimeError(f"{self.name}: the event loop did not start in {timeout:.0f} s")

    def _main(self, step: Callable[[], None], ready: threading.Event) -> None:
        loop = self._loop
        asyncio.set_event_loop(loop)

        async def main() -> None:
            self._wake = asyncio.Event()
            ready.set()
            while not self._stopping:
                step()
                await self._wake.wait()
                self._wake.clear()

        try:
            loop.run_until_complete(main())
        except BaseException as e:  # noqa: BLE001 - recorded; callers see it through `crash`
            self.crash = e
            logger.exception("%s: the event loop crashed", self.name)
        finally:
            if self.on_exit is not None:
                self.on_exit()
            loop.close()

    def check_alive(self, what: str) -> None:
        """Raise ``RuntimeError`` (naming ``what``) if the loop crashed or is not running."""
        if self.crash is not None:
            raise RuntimeError(f"the {what} loop crashed: {self.crash!r}")
        if not self.alive:
            raise RuntimeError(f"the {what} is not running (initialize() it first)")

    def spawn(self, coro: Coroutine) -> asyncio.Task:
        """Start ``coro`` as a task (from the loop's own thread), kept until it ends."""
        task = self.loop.create_task(coro)
        self._spawned.add(task)
        task.add_done_callback(self._spawned.discard)
        return task

    async def cancel_spawned(self, timeout: float) -> None:
        """On the loop: cancel every spawned task still running, waiting up to ``timeout``."""
        tasks = list(self._spawned)
        for t in tasks:
            t.cancel()
        if tasks:
            await asyncio.wait(tasks, timeout=timeout)

    def run(self, coro: Coroutine) -> concurrent.futures.Future:
        """Run ``coro`` on the loop; returns a thread-safe future."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    def wake(self) -> None:
        """Make the loop call ``step()`` again (from any thread)."""
        loop, wake = self._loop, self._wake
        if loop is not None and wake is not None and not loop.is_closed():
            try:
                loop.call_soon_threadsafe(wake.set)
            except RuntimeError:  # the loop is closing
                pass

    def wake_here(self) -> None:
        """``wake`` from a coroutine or callback already on the loop."""
        if self._wake is not None:
            self._wake.set()

    def stop(self, last: Coroutine | None = None, timeout: float = 10.0) -> None:
        """Run ``last`` (cleanup) on the loop, then end the loop and join the thread."""
        if self._thread is None:
            return
        if self._thread.is_alive():
            if last is not None:
                try:
                    self.run(last).result(timeout)
                except (concurrent.futures.TimeoutError, Exception) as e:  # noqa: BLE001
                    logger.warning("%s: shutdown: %r", self.name, e)
            # Only now: the loop must outlive `last`'s future.
            self._stopping = True
            self.wake()
            self._thread.join(timeout)
        elif last is not None:
            last.close()
        self._loop = None
