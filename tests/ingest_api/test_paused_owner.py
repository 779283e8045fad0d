"""One owner that stops answering (SIGSTOP: the kernel still accepts its TCP connections) must not
slow forwards to the other owners, and its own partitions answer 503 only until their leases move.

Three real nodes on one table root; keyed producers go through node a."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import time
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast
from urllib.parse import urlsplit

import httpx
import pytest

from lakebroker.ingest_api import router as router_module
from lakebroker.ingest_api.broker import Broker
from lakebroker.ingest_api.forwarding import OWNER_CONNECTIONS
from lakebroker.ingest_api.records import Record
from lakebroker.ingest_api.router import Router
from tests.ingest_api.test_cluster import keys_by_partition
from tests.servers import ServerProcess, until

pytestmark = [pytest.mark.timeout(300)]

TTL_S = 4.0
PARTITIONS = 6
TO_PAUSED = 100  # concurrent forwards to the paused owner: more than its pool holds
CLIENT_TIMEOUT_S = 20.0  # well above TTL_S, well below the old 120 s forward timeout


KEYS = keys_by_partition(PARTITIONS)


@dataclass
class Answer:
    status: int | None  # None: no answer within CLIENT_TIMEOUT_S
    code: str | None
    retry_after: str | None
    seconds: float


def _post(client: httpx.Client, url: str, key: str, n: int, batch: bool = False) -> Answer:
    """One message; `batch`: as a batch of one, which a node forwards in a request of its own (single
    messages for one owner share requests, forwarding.py)."""
    started = time.monotonic()
    message = {"key": key, "value": {"n": n}, "id": f"{key}-{n}"}
    try:
        if batch:
            r = client.post(f"{url}/v1/topics/orders/batch", params={"ack": "wal"}, json={"messages": [message]})
        else:
            r = client.post(f"{url}/v1/topics/orders/messages", params={"ack": "wal"}, json=message)
    except httpx.TimeoutException:
        return Answer(None, None, None, time.monotonic() - started)
    code = r.json()["error"]["code"] if r.status_code >= 400 else None
    return Answer(r.status_code, code, r.headers.get("retry-after"), time.monotonic() - started)


def _post_once_open(client: httpx.Client, url: str, key: str, n: int) -> Answer:
    """`_post`, following 503 + Retry-After as a producer does while the partition opens: an owner is
    listed in /v1/cluster once it has claimed, and opens the partition just after (it learns the
    ids stored there first)."""
    deadline = time.monotonic() + 10
    while (answer := _post(client, url, key, n)).status == 503 and time.monotonic() < deadline:
        assert answer.code == "partition_unavailable" and answer.retry_after == "1", answer
        time.sleep(0.2)
    return answer


def _owners(url: str) -> dict[int, str | None]:
    r = httpx.get(f"{url}/v1/cluster", timeout=10)
    assert r.status_code == 200, r.text
    return {p["partition"]: p["url"] for p in r.json()["partitions"] if p["topic"] == "orders"}


def _connections_to(url: str) -> int:
    """Established loopback TCP connections to `url`'s port (only node a forwards to it here)."""
    port = f"{urlsplit(url).port:04X}"
    lines = Path("/proc/net/tcp").read_text().splitlines()[1:]
    return sum(1 for line in lines if line.split()[2].endswith(":" + port) and line.split()[3] == "01")


@pytest.fixture
def nodes(tmp_path: Path) -> Iterator[tuple[ServerProcess, ServerProcess, ServerProcess]]:
    env = {"LAKEBROKER_TABLES_URI": str(tmp_path / "tables"), "LAKEBROKER_INGEST_LEASE_TTL_S": str(TTL_S),
           "LAKEBROKER_INGEST_HEARTBEAT_S": "0.3"}
    servers = tuple(ServerProcess(tmp_path / name, env) for name in "abc")
    try:
        for s in servers:
            s.start()
        yield servers  # type: ignore[misc]
    finally:
        for s in servers:
            if s.proc is not None and s.proc.poll() is None:
                os.kill(s.proc.pid, signal.SIGCONT)
        for s in servers:
            s.stop()


def test_a_paused_owner_delays_only_its_own_partitions_and_only_until_they_move(
        nodes: tuple[ServerProcess, ServerProcess, ServerProcess]) -> None:
    a, b, c = nodes
    assert TO_PAUSED > OWNER_CONNECTIONS
    assert httpx.post(f"{a.url}/v1/topics", json={"name": "orders", "partitions": PARTITIONS}).status_code == 201

    def spread() -> bool:
        return Counter(_owners(a.url).values()) == {a.url: 2, b.url: 2, c.url: 2}

    until(spread, "two partitions on each node", timeout=30)
    owners = _owners(a.url)
    others = [p for p, url in owners.items() if url != c.url]
    of_c = [p for p, url in owners.items() if url == c.url]
    # One client for every thread: a client each costs this process seconds of CPU for 100 of them.
    with httpx.Client(timeout=CLIENT_TIMEOUT_S, limits=httpx.Limits(max_connections=TO_PAUSED + 20)) as client:
        for key in KEYS.values():  # every owner answers through a, which keeps connections to b and c
            assert _post_once_open(client, a.url, key, 0).status == 200

        assert c.proc is not None
        os.kill(c.proc.pid, signal.SIGSTOP)
        paused = time.monotonic()
        with ThreadPoolExecutor(max_workers=TO_PAUSED + 10) as pool:
            # Batches of one (a request each) and single messages (which share requests) to c's partitions.
            to_c = [pool.submit(_post, client, a.url, KEYS[of_c[i % 2]], 1 + i, i % 4 != 0) for i in range(TO_PAUSED)]
            # a's forwards to c hang on connections c's kernel accepted: a full pool of them (before each
            # owner had a pool of its own, that was every connection a had, and b's forwards waited 120 s).
            until(lambda: _connections_to(c.url) >= OWNER_CONNECTIONS, "a's forwards to c in flight", timeout=TTL_S)
            in_flight = _connections_to(c.url)
            # Meanwhile a's and b's partitions answer through a as if c were fine.
            to_others = [pool.submit(_post, client, a.url, KEYS[others[i % 4]], 1 + i) for i in range(12)]
            answers = [f.result() for f in to_others]
            answers_c = [f.result() for f in to_c]
        assert all(x.status == 200 and x.seconds < 3 for x in answers), (in_flight, answers)
        # c's partitions: 503 partition_unavailable with Retry-After within about a TTL, never a hang
        # (one that reached a after the lease moved may have gone to the new owner).
        assert all(x.status == 200 or (x.status == 503 and x.code == "partition_unavailable"
                                       and x.retry_after == "1") for x in answers_c), \
            Counter((x.status, x.code, x.retry_after) for x in answers_c)
        assert sum(x.status == 503 for x in answers_c) >= OWNER_CONNECTIONS
        # The single messages too, though most waited for a shared request to return before theirs was sent.
        assert all(x.status is not None for x in answers_c[::4]), answers_c[::4]
        assert max(x.seconds for x in answers_c) < TTL_S + 3, max(x.seconds for x in answers_c)

        # c's partitions move to a and b within the lease's TTL, and then they answer through a.
        until(lambda: not {url for p, url in _owners(a.url).items() if p in of_c} & {c.url, None},
              "c's partitions have live owners", timeout=TTL_S + 10)
        for p in of_c:
            answer = _post_once_open(client, a.url, KEYS[p], 1000)
            assert answer.status == 200 and answer.seconds < 3, answer
        assert time.monotonic() - paused < TTL_S + 15


class _ParkedBroker:
    """What Router.stop needs of a broker and its ownership part: one partition's parked message,
    owned by `owner_url`."""

    def __init__(self, owner_url: str) -> None:
        # a forward may wait longer than stop()
        self.settings = SimpleNamespace(ingest_lease_ttl_s=60.0, max_request_bytes=1 << 20)
        self.cluster = SimpleNamespace(node="n1", heartbeat_s=0.1, drain=lambda: None)
        self.topic = SimpleNamespace(name="orders", topic_id="00" * 16)
        self.owner_url = owner_url
        self.parked = [Record("orders", bytes(16), 0, 0, 0, None, b"1", "json", None, "m-0", None, None)]
        self.sending: list[Record] = []
        self.ownership = self

    def parked_unowned(self) -> list[tuple[bytes, int]]:
        return [(bytes(16), 0)] if self.parked or self.sending else []

    def parked_elsewhere(self) -> list[tuple[Any, int, str]]:
        return [(self.topic, 0, self.owner_url)] if self.parked else []

    def take_parked(self, topic: Any, partition: int) -> list[Record]:
        self.sending, self.parked = self.parked, []
        return self.sending

    def parked_unsent(self, topic: Any, partition: int) -> None:
        self.parked, self.sending = self.parked + self.sending, []

    async def parked_sent(self, topic: Any, partition: int) -> None:
        self.sending = []


async def test_stop_gives_up_on_a_silent_owner_at_its_deadline_even_inside_a_round(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """The shutdown resend's deadline holds while a forward is under way, not only between rounds:
    an owner that accepts connections and never answers (a listening socket nobody accepts from,
    as a paused process is) keeps stop() no longer than STOP_RESEND_S, and the WAL keeps the message."""
    monkeypatch.setattr(router_module, "STOP_RESEND_S", 1.0)
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(16)
        broker = _ParkedBroker(f"http://127.0.0.1:{silent.getsockname()[1]}")
        router = Router(cast(Broker, broker))
        router.start()
        started = time.monotonic()
        async with asyncio.timeout(30):
            await router.stop()
        assert time.monotonic() - started < 3
    assert [r.message_id for r in broker.ownership.parked] == ["m-0"], "kept for the next start"
    assert "stay in this node's WAL" in caplog.text
