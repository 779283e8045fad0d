"""How long a partition stays unavailable after its owner dies: a produce to it, retried until answered.

`Probes.start(partitions, urls, at)` starts one thread per partition that sends a small message to
that partition (explicit partition, ack=wal, an id and a key of its own) through the given nodes in
turn, every `STEP_S`, until one is acknowledged; the partition's outage is the time from `at` (the
signal to its owner) to that answer. A request that gets no answer (the node it went to is the one
stopped) goes to the next node. Every acknowledged probe is one JSON line in the soak's format
(bench/soak/producer.py, kind "probe"), so the checks account for it like any other message.
"""

from __future__ import annotations

import itertools
import threading
import time
from pathlib import Path

import httpx
import orjson

STEP_S = 0.1  # between two attempts at one partition
GIVE_UP_S = 90.0  # a partition not back this long after the signal is reported as never back


class Probes:
    def __init__(self, out: Path) -> None:
        self.out = out
        self._lock = threading.Lock()
        self._seq = itertools.count()
        self._threads: list[threading.Thread] = []
        self._outages: dict[tuple[str, int], float | None] = {}
        self.refused: dict[tuple[str, int], str] = {}  # the last refusal each probed partition got, for a post-mortem

    def start(self, partitions: list[tuple[str, int]], urls: list[str], at: float) -> None:
        self._outages, self.refused = {}, {}
        self._threads = [threading.Thread(target=self._probe, args=(topic, p, urls, at), daemon=True)
                         for topic, p in partitions]
        for thread in self._threads:
            thread.start()

    def wait(self, deadline: float) -> dict[tuple[str, int], float | None]:
        """Each probed partition's outage in seconds (None: not back by the deadline)."""
        for thread in self._threads:
            thread.join(timeout=max(0.0, deadline - time.monotonic()))
        with self._lock:
            return dict(self._outages)

    def _probe(self, topic: str, partition: int, urls: list[str], at: float) -> None:
        with self._lock:
            self._outages[(topic, partition)] = None
        with httpx.Client(timeout=httpx.Timeout(15.0, connect=2.0)) as client:
            for turn in itertools.count():
                if time.monotonic() - at > GIVE_UP_S:
                    return
                ident = f"probe-{next(self._seq)}"
                url = urls[turn % len(urls)]
                sent = time.time()
                try:
                    r = client.post(f"{url}/v1/topics/{topic}/messages", params={"ack": "wal"},
                                    json={"id": ident, "key": ident, "partition": partition, "value": {"id": ident}})
                    refusal = None if r.status_code == 200 else f"{r.status_code} {r.text}"
                except httpx.HTTPError as exc:
                    refusal = repr(exc)
                if refusal is None:
                    answered = time.monotonic()
                    body = r.json()
                    line = {"topic": topic, "partition": body["partition"], "offset": body["offset"], "id": ident,
                            "key": ident, "sent": sent, "acked": time.time(), "kind": "probe", "ack": "wal",
                            "node": url.removeprefix("http://")}
                    with self._lock:
                        self._outages[(topic, partition)] = answered - at
                        with self.out.open("ab") as f:
                            f.write(orjson.dumps(line) + b"\n")
                    return
                with self._lock:
                    self.refused[(topic, partition)] = f"{time.monotonic() - at:.1f} s: {url}: {refusal}"[:300]
                time.sleep(STEP_S)
