"""A LISTEN connection in a thread of its own, calling back on every NOTIFY.

The worker and the consumers wait for "something may be ready" on a
condition; this thread turns the server's notifications (``pgque_jobs_<queue>``
at a job enqueue's commit, ``pgque_<queue>`` at every tick) into wake-ups of
that condition. It never runs queries besides LISTEN, so a slow handler or a
long dispatch never delays a wake-up, and a notification that arrives while
the waiter is busy is not lost (the waiter compares a generation counter taken
before its query).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from typing import Any

import psycopg
from psycopg import sql

log = logging.getLogger("pgque_client")


class Listener:
    """LISTENs on ``channels`` (from a thread started by :meth:`start`) and
    calls ``on_notify()`` for each notification, and once after each
    (re)connect, since notifications sent while disconnected are gone."""

    def __init__(
        self,
        dsn: str,
        channels: Sequence[str],
        on_notify: Callable[[], None],
        connect_kwargs: dict[str, Any] | None = None,
    ):
        self.dsn = dsn
        self.channels = list(channels)
        self.on_notify = on_notify
        self.connect_kwargs = connect_kwargs or {}
        self._closed = threading.Event()
        self._ready = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="pgque-listen", daemon=True)
        self._thread.start()
        # Subscriptions are in place before the owner's first poll, so nothing
        # committed after that poll goes unnoticed.
        self._ready.wait(10)

    def close(self) -> None:
        self._closed.set()
        if self._thread is not None:
            self._thread.join(5)

    def _loop(self) -> None:
        while not self._closed.is_set():
            try:
                with psycopg.connect(self.dsn, autocommit=True, **self.connect_kwargs) as conn:
                    for ch in self.channels:
                        conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(ch)))
                    self._ready.set()
                    self.on_notify()
                    while not self._closed.is_set():
                        for _ in conn.notifies(timeout=0.25):
                            self.on_notify()
            except psycopg.Error as e:
                if self._closed.is_set():
                    return
                log.warning("pgque listener: %s; reconnecting in 1 s", e)
                self._ready.set()
                self._closed.wait(1.0)
