"""`Producer`: batched, retried, idempotent sends over the /batch endpoint.

Sync by design, with one background sender thread: most HTTP producers are plain scripts,
web handlers and workers, and `send()` only queues, so it never blocks an event loop either
(`await asyncio.wrap_future(producer.send(...))` from async code). One thread sends one
request at a time and retries a batch before the next, so messages of one topic (and ack mode)
reach the broker in the order they were sent; linger-based batching supplies the throughput.
"""

from __future__ import annotations

import concurrent.futures
import itertools
import json
import logging
import threading
import uuid
from collections.abc import Mapping
from concurrent.futures import Future
from dataclasses import dataclass, replace
from datetime import datetime
from types import TracebackType
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

import httpx

from lakebroker_client._arrow import (
    ARROW_STREAM,
    as_table,
    concat_results,
    ipc_body,
    read_results,
    slices,
    with_ids,
)
from lakebroker_client._batching import Accumulator, Batch, Batching, Pending
from lakebroker_client._exceptions import ClientClosed, ClientError
from lakebroker_client._http import Http, refused
from lakebroker_client._models import AckLike, AckMode, SendResult
from lakebroker_client._retry import Retry
from lakebroker_client._routing import Router
from lakebroker_client._serde import Headers, Serializer, headers_field, key_field, value_fields

if TYPE_CHECKING:
    from lakebroker_client._arrow import ArrowTable

log = logging.getLogger("lakebroker_client")
FORWARDED_TO = "lakebroker-forwarded-to"  # on an answer the node forwarded (some of) to other nodes

# Refusals that may come from one bad message: the batch is re-sent one message at a time, so
# only that message fails. Re-sending is safe: every message carries its id.
_SPLIT_ON = frozenset({400, 413, 422})


@dataclass(frozen=True)
class ProducerStats:
    messages: int = 0  # answered by the broker (duplicates included)
    duplicates: int = 0  # answered from the broker's dedup index
    failed: int = 0  # futures that ended with an error
    requests: int = 0  # /batch requests that got an answer
    retries: int = 0  # attempts repeated after no answer, a 429 or a 5xx
    throttled: int = 0  # of those, 429 answers (the broker's WAL backlog was over its bound)
    routed: int = 0  # requests sent straight to the partitions' owner (a cluster of several nodes)


class Producer:
    """Sends messages to a lakebroker, in batches, with retries that never write a message twice.

    Every message carries an id, so a retry after a lost answer is recognised by the broker's
    dedup index (for `dedup_window_s`, an hour by default) and answered `duplicate=True` with the
    original offset. The id is, in order of preference: the `id` given to send(); else
    `producer_id` + a sequence number, when the producer has a producer_id; else a random uuid4.

    A producer_id + sequence is only unique while the sequence is: give each producer process
    its own producer_id, or persist the sequence and pass `first_sequence` when restarting.

    `key_serializer` / `value_serializer` turn what send() is given into bytes or str, as in
    Kafka clients (e.g. `value_serializer=lambda v: json.dumps(v).encode()`).

    Against a cluster, each message goes straight to its partition's owner (`routing`; the
    owners come from /v1/cluster, see `_routing.py`); `url` may be any node, and takes what
    cannot be routed (it forwards). `routing=False` sends everything to `url`.
    """

    def __init__(
        self,
        url: str,
        token: str | None = None,
        *,
        producer_id: str | None = None,
        first_sequence: int = 0,
        key_serializer: Serializer | None = None,
        value_serializer: Serializer | None = None,
        batching: Batching | None = None,
        retry: Retry | None = None,
        timeout_s: float = 30.0,
        transport: httpx.BaseTransport | None = None,
        routing: bool = True,
    ) -> None:
        if producer_id is not None and not 0 < len(producer_id) <= 256:
            raise ValueError("producer_id must be 1 to 256 characters")
        self._http = Http(url, token, timeout_s=timeout_s, retry=retry or Retry(), transport=transport)
        self._acc = Accumulator(batching or Batching())
        self._producer_id = producer_id
        self._key_serializer = key_serializer
        self._value_serializer = value_serializer
        self._sequence = itertools.count(first_sequence)
        self._outstanding: set[Future[SendResult]] = set()
        self._lock = threading.Lock()
        self._stats = ProducerStats()
        self._closed = False
        self._router = Router(self._cluster) if routing else None
        self._thread = threading.Thread(target=self._run, name="lakebroker-producer", daemon=True)
        self._thread.start()

    # -- the public API -----------------------------------------------------------------
    def send(
        self,
        topic: str,
        value: Any = None,
        key: Any = None,
        headers: Headers | None = None,
        partition: int | None = None,
        id: str | None = None,
        ack: AckLike = AckMode.WAL,
    ) -> Future[SendResult]:
        """Queue one message; the future resolves to its SendResult, or to a ClientError.

        value: bytes are sent as raw bytes (format binary); a str as text; anything else
            JSON-serialisable as JSON; None is a tombstone. A value_serializer runs first.
        key: str, or UTF-8 bytes (after the key_serializer); picks the partition as Kafka's
            default partitioner does; partition overrides it.
        headers: a str → str mapping, or Kafka-style (name, str or UTF-8 bytes) pairs.
        ack: "wal" (default) resolves after the broker's WAL fsync, "table" after the Delta
            commit, "none" as soon as the broker queued it (offset None).
        Raises TypeError/ValueError for a message that cannot be sent, BufferFull, ClientClosed.
        """
        if self._closed:
            raise ClientClosed("the producer is closed")
        mode = AckMode(ack)
        if not isinstance(topic, str) or not topic:
            raise ValueError("topic must be a non-empty str")
        message = self._message(value, key, headers, partition, id)
        fragment = json.dumps(message, separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode()
        future: Future[SendResult] = Future()
        future.set_running_or_notify_cancel()  # queued messages are sent: cancel() cannot stop them
        with self._lock:
            self._outstanding.add(future)
        future.add_done_callback(self._finished)
        try:
            self._acc.append(topic, mode, Pending(fragment, future, message.get("partition"), _route(message)))
        except BaseException as exc:
            future.set_exception(exc)
            raise
        return future

    def send_arrow(
        self,
        topic: str,
        data: Any,
        *,
        columns: Mapping[str, str] | None = None,
        ack: AckLike = AckMode.WAL,
        max_rows: int = 5000,
        max_bytes: int = 8 * 1024 * 1024,
    ) -> ArrowTable:
        """Send every row of `data` as one message, as Arrow, and wait for the answers.

        data: a pyarrow Table or RecordBatch, or a pandas or Polars DataFrame, whose columns are
            the wire's: value (binary or string; null is a tombstone, with a key), and optionally
            key (string), headers (map of string to string), partition (integer) and id (string).
            `columns` maps those names to other columns of `data` ({"value": "payload"}).
        Rows go in requests of at most `max_rows` rows and about `max_bytes`, one after another,
        each retried as send()'s batches are. Rows without an id get one (a random prefix and
        the row's number), so a retry is answered from the dedup index, never stored twice.
        Returns one row per message, in order: partition, offset, duplicate, timestamp (offset and
        timestamp null with ack="none"). Not ordered with messages queued by send(): flush() first.
        Needs pyarrow (the `arrow` extra). Raises RequestRefused for a request the broker refused
        (its message names the bad column or row), BrokerUnavailable when retries run out.
        """
        if self._closed:
            raise ClientClosed("the producer is closed")
        mode = AckMode(ack)
        if not isinstance(topic, str) or not topic:
            raise ValueError("topic must be a non-empty str")
        if max_rows < 1 or max_bytes < 1:
            raise ValueError("max_rows and max_bytes must be positive")
        table = with_ids(as_table(data, columns))
        path = f"/v1/topics/{quote(topic, safe='')}/batch"
        answers = []
        for part in slices(table, max_rows, max_bytes):
            response = self._http.request("POST", path, params={"ack": mode.value}, content=ipc_body(part),
                                          headers={"content-type": ARROW_STREAM, "accept": ARROW_STREAM},
                                          on_retry=self._retried)
            self._count(requests=1)
            if not response.is_success:
                raise refused(response, f"produce to topic {topic!r}")
            results = read_results(response.content)
            if results.num_rows != part.num_rows:
                raise ClientError(f"the broker answered {results.num_rows} results for {part.num_rows} messages")
            self._count(messages=results.num_rows, duplicates=int(results.column("duplicate").to_numpy().sum()))
            answers.append(results)
        return concat_results(answers)

    def flush(self, timeout_s: float | None = None) -> int:
        """Send everything queued before this call and wait until each is answered or failed.

        Returns how many of those are still unfinished: 0, unless `timeout_s` ran out first.
        """
        with self._lock:
            waiting = list(self._outstanding)
        self._acc.seal_all()
        _, not_done = concurrent.futures.wait(waiting, timeout=timeout_s)
        return len(not_done)

    def close(self, timeout_s: float | None = None) -> None:
        """Send what is queued (waiting at most `timeout_s`), then stop. Messages still unsent
        when the time is up fail with ClientClosed."""
        if self._closed:
            return
        self._closed = True
        self._acc.close()
        self._thread.join(timeout_s)
        if self._thread.is_alive():
            self._http.closing.set()  # retries stop; what is left fails with ClientClosed
            self._thread.join()
        self._http.close()

    def stats(self) -> ProducerStats:
        with self._lock:
            return self._stats

    def __enter__(self) -> Producer:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    # -- building a message -------------------------------------------------------------
    def _message(self, value: Any, key: Any, headers: Headers | None, partition: int | None,
                 message_id: str | None) -> dict[str, Any]:
        out = value_fields(value, self._value_serializer)
        if (key_text := key_field(key, self._key_serializer)) is not None:
            out["key"] = key_text
        if (header_map := headers_field(headers)) is not None:
            out["headers"] = header_map
        if partition is not None:
            if isinstance(partition, bool) or not isinstance(partition, int) or partition < 0:
                raise ValueError(f"partition must be a non-negative int, not {partition!r}")
            out["partition"] = partition
        if message_id is not None:
            if not 0 < len(message_id) <= 256:
                raise ValueError("id must be 1 to 256 characters")
            out["id"] = message_id
        elif self._producer_id is not None:
            out["producer_id"] = self._producer_id
            out["sequence"] = next(self._sequence)
        else:
            out["id"] = uuid.uuid4().hex
        return out

    # -- the sender thread --------------------------------------------------------------
    def _run(self) -> None:
        while (batch := self._acc.next_ready()) is not None:
            try:
                self._deliver(batch)
            except Exception as exc:  # never leave a future unresolved
                log.exception("lakebroker producer: unexpected failure sending to %r", batch.topic)
                self._fail(batch, exc)
            finally:
                self._acc.done(len(batch.items))

    def _cluster(self) -> Any:
        response = self._http.client.get("/v1/cluster", timeout=5.0)
        response.raise_for_status()
        return response.json()

    def _deliver(self, batch: Batch) -> None:
        """Each owner's share of the batch to that owner (in the batch's order, one owner after
        another: a partition's messages all go to one owner, so their order holds), the rest, and
        any share its owner did not take, to the producer's URL."""
        router = self._router
        if router is None:
            self._send(batch)
            return
        shares: dict[str | None, list[Pending]] = {}
        for item in batch.items:
            shares.setdefault(router.owner(batch.topic, item.partition, item.route), []).append(item)
        for url, items in shares.items():
            share = batch if len(shares) == 1 else Batch(batch.topic, batch.ack, batch.created, items,
                                                         sum(len(i.fragment) for i in items))
            if url is None or not self._send_to_owner(share, url):
                self._send(share)

    def _send_to_owner(self, batch: Batch, url: str) -> bool:
        """One attempt at the owner; False (and the map read again) if it did not take the batch."""
        assert self._router is not None
        path = f"{url}/v1/topics/{quote(batch.topic, safe='')}/batch"
        try:
            response = self._http.client.post(path, params={"ack": batch.ack.value}, content=batch.body(),
                                              headers={"content-type": "application/json"})
        except httpx.TransportError:
            self._router.avoid(url)
            self._router.refresh()
            return False
        if not response.is_success:
            self._router.refresh()
            return False
        self._count(requests=1, routed=1)
        self._resolve(batch, response)
        if FORWARDED_TO in response.headers:  # the partition moved: the node forwarded it to its owner
            self._router.refresh()
        return True

    def _send(self, batch: Batch) -> None:
        path = f"/v1/topics/{quote(batch.topic, safe='')}/batch"
        try:
            response = self._http.request("POST", path, params={"ack": batch.ack.value}, content=batch.body(),
                                          headers={"content-type": "application/json"}, on_retry=self._retried)
        except ClientError as exc:
            self._fail(batch, exc)
            return
        self._count(requests=1)
        if response.is_success:
            self._resolve(batch, response)
            if self._router is not None and FORWARDED_TO in response.headers:  # the map has news to learn
                self._router.refresh()
        elif response.status_code in _SPLIT_ON and len(batch.items) > 1:
            for item in batch.items:  # in order, so the topic's order is kept
                self._send(Batch(batch.topic, batch.ack, batch.created, [item], len(item.fragment)))
        else:
            self._fail(batch, refused(response, f"produce to topic {batch.topic!r}"))

    def _resolve(self, batch: Batch, response: httpx.Response) -> None:
        results = response.json()["results"]
        if len(results) != len(batch.items):
            self._fail(batch, ClientError(f"the broker answered {len(results)} results for "
                                          f"{len(batch.items)} messages"))
            return
        self._count(messages=len(results), duplicates=sum(bool(r["duplicate"]) for r in results))
        for item, r in zip(batch.items, results, strict=True):
            stamp = r.get("timestamp")
            item.future.set_result(SendResult(batch.topic, r["partition"], r["offset"],
                                              None if stamp is None else datetime.fromisoformat(stamp),
                                              bool(r["duplicate"])))

    def _fail(self, batch: Batch, error: BaseException) -> None:
        for item in batch.items:
            if not item.future.done():
                item.future.set_exception(error)

    def _retried(self, status: int | None) -> None:
        self._count(retries=1, throttled=int(status == 429))

    def _count(self, **increments: int) -> None:
        with self._lock:
            self._stats = replace(self._stats, **{k: getattr(self._stats, k) + v for k, v in increments.items()})

    def _finished(self, future: Future[SendResult]) -> None:
        with self._lock:
            self._outstanding.discard(future)
            if future.exception() is not None:
                self._stats = replace(self._stats, failed=self._stats.failed + 1)




def _route(message: dict[str, Any]) -> str | None:
    """What the broker hashes to pick the message's partition when it names none (its key, else its
    id as the broker's dedup index spells it)."""
    if "key" in message:
        return str(message["key"])
    if "id" in message:
        return f"m:{message['id']}"
    if "producer_id" in message:
        return f"p:{message['producer_id']}:{message['sequence']}"
    return None
