"""Delivery learns of a new commit as it lands (delivery_worker/commit_watch.py): real Delta
tables written as the flusher writes them, a real worker, a real receiver on loopback."""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import time
import types
from pathlib import Path

import pytest

import lakebroker.delivery_worker.pipeline
from lakebroker.delivery_worker.commit_watch import CommitWatch, local_log_dir
from lakebroker.tables.layout import Layout
from tests.delivery_worker.inproc import subscribe, until, worker, worker_settings
from tests.receivers import Receiver
from tests.spark_pipeline.topics import create_topic, produce


def test_only_local_tables_are_watched() -> None:
    assert local_log_dir("/data/topics/t") == Path("/data/topics/t/_delta_log")
    assert local_log_dir("file:///data/topics/t") == Path("/data/topics/t/_delta_log")
    assert local_log_dir("s3://bucket/topics/t") is None


async def test_each_commit_calls_back_and_a_deleted_table_ends_the_watch(tmp_path: Path) -> None:
    settings = worker_settings(tmp_path / "data")
    create_topic(settings, "t", partitions=1)
    uri = Layout(settings.data_dir).topic_table("t")
    watch = CommitWatch()
    seen: list[int] = []
    try:
        following = watch.follow(uri, lambda: seen.append(1))
        assert following is not None and following.active
        for n in range(1, 4):
            await asyncio.to_thread(produce, settings, "t", 0, 2)  # one delta-rs commit each
            await until(lambda n=n: len(seen) >= n, f"commit {n} is reported")  # type: ignore[misc]
        shutil.rmtree(Path(uri))  # the topic is deleted
        await until(lambda: not following.active, "the watch ends with the table")
        assert watch.follow(uri, lambda: None) is None  # nothing to watch until it is made again
    finally:
        await watch.aclose()


async def test_a_commit_is_delivered_without_waiting_for_a_poll(tmp_path: Path, receiver: Receiver,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    # The pipeline's clock reads as on a machine booted a second ago (time.monotonic() counts from
    # boot): the first read must not wait for a poll interval that has "not yet passed" since 0.
    booted = time.monotonic() - 1.0
    monkeypatch.setattr(lakebroker.delivery_worker.pipeline, "time",
                        types.SimpleNamespace(monotonic=lambda: time.monotonic() - booted, time=time.time))
    data = tmp_path / "data"
    # Polls an hour apart: only the commit watch can bring the second batch before the wait ends.
    settings = worker_settings(data).model_copy(update={"delivery_poll_ms": 3_600_000})
    create_topic(settings, "t", partitions=1)
    subscribe(data, "t", receiver.url)
    produce(settings, "t", 0, 3)
    running = worker(settings, "w")
    task = asyncio.create_task(running.run())
    try:
        await until(lambda: len(receiver.messages()) >= 3, "the first batch, read at start")
        await asyncio.to_thread(produce, settings, "t", 0, 3)
        await until(lambda: len(receiver.messages()) >= 6, "the second batch, on its commit", timeout=120)
        assert [m["offset"] for m in receiver.messages()] == list(range(6))
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
