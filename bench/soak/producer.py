"""The soak's producers, run as their own process: single, batch and Kafka REST v2 produce.

Every acknowledged message becomes one JSON line in --out: {"topic", "partition", "offset", "id",
"key", "sent", "acked", "kind", "ack", "node"} ("sent" is time.time() when the first attempt began,
"acked" when the answer came, "node" the host:port that answered), since acknowledgements are what
the soak checks. Each message carries its id in its value as well ({"id": ...}), so a REST v2
record, which has no message id, is still found in the table. Singles and batches are retried with
the same ids until answered (the server may be down: it is SIGKILLed on purpose), so dedup must
turn a retry into the original offset; REST v2 records are sent once (no id, so a retry would be a
new message).

Given several --url (the nodes of a cluster), each request goes to the next node in turn, and a
retry to the node after the one that failed it, as a client of a cluster does when a node dies.

The load is bounded: it stops after --seconds or --max-messages, and goes to the --url given only.

    python -m bench.soak.producer --url http://127.0.0.1:PORT --seconds 60 --max-messages 20000 --out acks.jsonl
"""

from __future__ import annotations

import argparse
import asyncio
import random
import time
from pathlib import Path
from typing import IO, Any

import httpx
import orjson

# (topic, kind, requests per second, messages per request, keys, padding bytes per value): the
# soak's topics are made to match (bench/soak/__init__.py). Keys on the compacted topic come from a small
# set, so keys repeat. `big`'s values are just under the default 1 MiB message limit.
STREAMS: tuple[tuple[str, str, float, int, int, int], ...] = (
    ("orders", "single", 12.0, 1, 0, 0),
    ("orders", "batch", 1.5, 20, 0, 0),
    ("orders", "v2", 1.0, 10, 0, 0),
    ("events", "single", 8.0, 1, 0, 0),
    ("events", "batch", 1.0, 10, 0, 0),
    ("profiles", "single", 8.0, 1, 40, 0),
    ("profiles", "v2", 0.5, 5, 40, 0),
    ("churn", "single", 5.0, 1, 0, 0),
    ("big", "single", 0.25, 1, 0, 1_000_000),
)
RETRY_PAUSE_S = 0.2
V2_JSON = "application/vnd.kafka.json.v2+json"


class Producers:
    def __init__(self, urls: list[str], out: IO[bytes], seconds: float, max_messages: int, seed: int) -> None:
        self.urls, self.out = urls, out
        self._turn = 0
        self.end = time.monotonic() + seconds
        self.budget = max_messages
        self.rng = random.Random(seed)
        self.counts = {"acked": 0, "unanswered": 0, "refused": 0, "requests": 0}
        self._seq = 0

    def _ids(self, stream: str, n: int) -> list[str]:
        self._seq += n
        return [f"{stream}-{self._seq - n + i}" for i in range(n)]

    def _take(self, n: int) -> int:
        n = min(n, self.budget)
        self.budget -= n
        return n

    def _record(self, topic: str, kind: str, ids: list[str], keys: list[str | None], offsets: list[dict[str, Any]],
                sent: float, ack: str, answer: httpx.Response) -> None:
        acked = time.time()
        node = answer.request.url.netloc.decode()
        for i, k, r in zip(ids, keys, offsets, strict=True):
            if r.get("offset") is None:
                continue
            self.out.write(orjson.dumps({"topic": topic, "partition": r["partition"], "offset": r["offset"], "id": i,
                                         "key": k, "sent": sent, "acked": acked, "kind": kind, "ack": ack,
                                         "node": node}) + b"\n")
            self.counts["acked"] += 1
        self.out.flush()

    async def _until_answered(self, clients: list[httpx.AsyncClient], path: str, body: Any, content_type: str,
                              retry: bool) -> httpx.Response | None:
        """POST until a node answers (retrying with the same ids, at the next node) or the run ends."""
        content = orjson.dumps(body)
        while True:
            self.counts["requests"] += 1
            self._turn += 1
            client = clients[self._turn % len(clients)]
            try:
                r = await client.post(path, content=content, headers={"content-type": content_type})
            except httpx.HTTPError:
                r = None
            if r is not None and r.status_code not in (429, 500, 502, 503, 507):
                return r
            if not retry or time.monotonic() > self.end + 30:  # a retry may outlive the run a little
                self.counts["unanswered"] += 1
                return None
            await asyncio.sleep(RETRY_PAUSE_S)

    async def stream(self, clients: list[httpx.AsyncClient], topic: str, kind: str, rate: float, size: int,
                     keys: int, pad: int) -> None:
        name = f"{topic}-{kind}"
        next_at = time.monotonic()
        while time.monotonic() < self.end and (n := self._take(size)) > 0:
            ids = self._ids(name, n)
            key_of = [f"k{self.rng.randrange(keys)}" if keys else None for _ in ids]
            ack = "table" if self.rng.random() < 0.25 else "wal"
            sent = time.time()
            if kind == "v2":
                body = {"records": [{"key": k, "value": {"id": i}} for i, k in zip(ids, key_of, strict=True)]}
                r = await self._until_answered(clients, f"/topics/{topic}", body, V2_JSON, retry=False)
                if r is not None and r.status_code == 200:
                    self._record(topic, kind, ids, key_of, r.json()["offsets"], sent, "wal", r)
                elif r is not None:
                    self.counts["refused"] += 1
            else:
                # A batch's values are strings, so it takes the columnar path and the WAL holds
                # batch chunks beside single records (a message's id still names it in the table).
                messages = [{"id": i, "key": k, "value": orjson.dumps({"id": i}).decode() if kind == "batch"
                             else {"id": i, **({"pad": "x" * pad} if pad else {})}}
                            for i, k in zip(ids, key_of, strict=True)]
                payload: Any = messages[0]
                if kind == "single":
                    path = f"/v1/topics/{topic}/messages?ack={ack}"
                else:
                    path, payload = f"/v1/topics/{topic}/batch?ack={ack}", {"messages": messages}
                r = await self._until_answered(clients, path, payload, "application/json", retry=True)
                if r is not None and r.status_code == 200:
                    answer = r.json()
                    self._record(topic, kind, ids, key_of, answer["results"] if kind == "batch" else [answer], sent,
                                 ack, r)
                elif r is not None:
                    self.counts["refused"] += 1  # e.g. 404 while the churn topic is deleted
            next_at += 1 / rate
            await asyncio.sleep(max(0.0, next_at - time.monotonic()))

    async def run(self) -> None:
        clients = [httpx.AsyncClient(base_url=url, timeout=httpx.Timeout(10.0, connect=2.0)) for url in self.urls]
        try:
            await asyncio.gather(*(self.stream(clients, *s) for s in STREAMS))
        finally:
            for client in clients:
                await client.aclose()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", required=True, action="append", help="a node; several: each in turn")
    parser.add_argument("--seconds", type=float, required=True)
    parser.add_argument("--max-messages", type=int, required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--seed", type=int, default=12)
    args = parser.parse_args(argv)
    with args.out.open("ab") as out:
        producers = Producers(args.url, out, args.seconds, args.max_messages, args.seed)
        asyncio.run(producers.run())
    print(orjson.dumps(producers.counts).decode(), flush=True)


if __name__ == "__main__":
    main()
