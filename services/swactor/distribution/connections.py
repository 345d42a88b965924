"""A FetchPool's kept-alive connections (issue 22: weights over a high-RTT link).

Every request of a stage's fetch goes to one of two origins (the model server, or the model's own URL), and each
fresh connection costs a TCP handshake, a TLS handshake (one round trip each) and TCP slow start, which over a
100 ms round trip is most of a second before a lane carries the link's rate. So a fetch's connections outlive
the request they were made for: a client whose response was read to its end goes back here (`give`) and the next
request to the same origin takes it (`take`), its congestion window grown. The manifest, the header's spans and the
stage's spans of one acquire then travel over the same `lanes` connections, and `warm` opens them while the
manifest is still on its way.

A connection idle for more than `keep_s` is closed rather than reused (a server's keep-alive ends after a while,
the model server's after server.IDLE_TIMEOUT_S); one the server closed sooner costs one fresh try
(fetcher.RangeClient._send). Clients are blocking: everything here runs on fetch threads, `prune` on any thread.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from swactor.distribution import fetcher

KEEP_S = 15.0  # an idle connection older than this is closed, not reused


class Connections:
    def __init__(self, factory: Callable[[fetcher.Target], fetcher.RangeClient], keep_s: float = KEEP_S) -> None:
        self.factory = factory
        self.keep_s = keep_s
        self._cond = threading.Condition()
        self._idle: dict[tuple[object, ...], list[tuple[float, fetcher.RangeClient]]] = {}
        self._opening: dict[tuple[object, ...], int] = {}  # warm connections under way, per origin
        self._failed: dict[tuple[object, ...], tuple[int, fetcher.FetchError]] = {}  # per origin: (count, last)
        self.reused = 0  # takes answered with a kept connection

    def take(self, target: fetcher.Target, give_up: Callable[[], bool] = lambda: False) -> fetcher.RangeClient:
        """A client for `target`: a kept connection to its origin (the most recently used: its window is the
        widest), else one `warm` is opening (waited for; its failure is raised here, as the client's own would
        be), else a new client (it connects at its first request)."""
        key = fetcher.origin_key(target)
        with self._cond:
            seen = self._failed.get(key, (0, None))[0]
            while True:
                self._prune_locked(time.monotonic())
                idle = self._idle.get(key)
                if idle:
                    _, client = idle.pop()
                    client.retarget(target)
                    self.reused += 1
                    return client
                count, error = self._failed.get(key, (0, None))
                if not self._opening.get(key) or give_up():
                    if count > seen and error is not None:
                        raise error  # the connection we waited for failed: so would ours
                    break
                self._cond.wait(0.1)
        return self.factory(target)

    def give(self, client: fetcher.RangeClient) -> None:
        """A client done with its request: kept when its connection can take the next one, else closed."""
        if not client.reusable:
            client.close()
            return
        with self._cond:
            self._idle.setdefault(fetcher.origin_key(client.target), []).append((time.monotonic(), client))
            self._cond.notify_all()

    def warm(self, target: fetcher.Target, n: int) -> None:
        """Open connections to `target`'s origin until `n` are kept or under way, each on a thread of its own."""
        key = fetcher.origin_key(target)
        with self._cond:
            self._prune_locked(time.monotonic())
            n -= len(self._idle.get(key, ())) + self._opening.get(key, 0)
            if n <= 0:
                return
            self._opening[key] = self._opening.get(key, 0) + n
        for _ in range(n):
            threading.Thread(target=self._open, args=(key, target), name="fetch-warm", daemon=True).start()

    def _open(self, key: tuple[object, ...], target: fetcher.Target) -> None:
        client = self.factory(target)
        error: fetcher.FetchError | None = None
        try:
            client.connect()
        except fetcher.FetchError as e:
            error = e
            client.close()
        except Exception as e:  # a bug must still end the wait
            error = fetcher.FetchError(fetcher.UNREACHABLE, f"{target.url}: {type(e).__name__}: {e}")
            client.close()
        with self._cond:
            self._opening[key] -= 1
            if error is None:
                self._idle.setdefault(key, []).append((time.monotonic(), client))
            else:
                self._failed[key] = (self._failed.get(key, (0, None))[0] + 1, error)
            self._cond.notify_all()

    def prune(self) -> None:
        """Close the connections idle for longer than keep_s."""
        with self._cond:
            self._prune_locked(time.monotonic())

    def _prune_locked(self, now: float) -> None:
        for key, idle in list(self._idle.items()):
            keep = [(t, c) for t, c in idle if now - t <= self.keep_s]
            for t, c in idle:
                if now - t > self.keep_s:
                    c.close()
            if keep:
                self._idle[key] = keep
            else:
                del self._idle[key]

    def idle_count(self, target: fetcher.Target | None = None) -> int:
        with self._cond:
            if target is None:
                return sum(len(v) for v in self._idle.values())
            return len(self._idle.get(fetcher.origin_key(target), ()))
