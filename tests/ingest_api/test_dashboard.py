"""The dashboard's JSON snapshot and page, in process (the browser test is test_dashboard_browser.py)."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from lakebroker.ingest_api.dashboard import ProduceRates, summarize_runs
from lakebroker.ingest_api.dashboard_history import Sample, SubscriptionHistory
from lakebroker.server import build_app
from lakebroker.tables import job_runs
from lakebroker.tables.job_runs import JobName, JobResult, Outcome, TableResult
from lakebroker.tables.layout import Layout
from lakebroker.tables.settings import Settings
from lakebroker.tables.tokens import TokenStore
from tests.receivers import Receiver
from tests.waiting import eventually


def snapshot(client: TestClient, **headers: str) -> dict[str, Any]:
    r = client.get("/v1/dashboard", headers=headers)
    assert r.status_code == 200, r.text
    body: dict[str, Any] = r.json()
    return body


def wait_for(client: TestClient, predicate: Callable[[dict[str, Any]], bool], timeout: float = 20) -> dict[str, Any]:
    def shown() -> dict[str, Any] | None:
        snap = snapshot(client)
        return snap if predicate(snap) else None

    return eventually(shown, timeout, what="the dashboard's expected state", interval=0.2)


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    # offset 2 of partition 0 fails; with max_attempts=1 it is dead-lettered at once
    r = Receiver(behaviour=lambda n, body: (500, {}, 0.0) if body["value"]["n"] == 2 else (200, {}, 0.0))
    yield r
    r.close()


def test_empty_broker(client: TestClient) -> None:
    snap = snapshot(client)
    assert snap["topics"] == [] and snap["subscriptions"] == [] and snap["dead_letters"] == []
    assert snap["lost_offsets"] == []
    assert snap["jobs"] == {"compaction": [], "retention": [], "replication": []}
    assert datetime.fromisoformat(snap["generated_at"]).tzinfo is not None


def test_topics_subscriptions_and_dead_letters(client: TestClient, orders: str, receiver: Receiver) -> None:
    r = client.post("/v1/subscriptions", json={"name": "hooks", "topic": "orders", "url": receiver.url,
                                               "start": "earliest", "max_attempts": 1})
    assert r.status_code == 201, r.text
    first = snapshot(client)
    assert [t["log_end_offset"] for t in first["topics"]] == [0]
    r = client.post("/v1/topics/orders/batch?ack=table",
                    json={"messages": [{"value": {"n": i}, "partition": 0} for i in range(6)]
                          + [{"value": {"n": 100 + i}, "partition": 1} for i in range(4)]})
    assert r.status_code == 200, r.text
    snap = wait_for(client, lambda s: s["subscriptions"][0]["pending"] == 0 and s["dead_letters"] != [])

    (topic,) = snap["topics"]
    assert topic["name"] == "orders" and topic["log_end_offset"] == 10 and topic["messages"] == 10
    assert topic["size_bytes"] > 0 and topic["files"] >= 2
    p0, p1, p2 = topic["partitions"]
    assert (p0["log_start_offset"], p0["log_end_offset"], p0["high_watermark"]) == (0, 6, 6)
    assert (p1["log_end_offset"], p2["log_end_offset"], p2["size_bytes"], p2["files"]) == (4, 0, 0, 0)
    assert topic["produce_rate"] is not None and topic["produce_rate"] > 0  # 10 messages since the first look

    (sub,) = snap["subscriptions"]
    assert (sub["produced"], sub["delivered"], sub["pending"], sub["dead_lettered"]) == (10, 9, 0, 1)
    assert sub["endpoint_state"] == "healthy" and "500" in sub["last_error"]
    assert [(p["partition"], p["committed_offset"], p["lag"]) for p in sub["partitions"]] == [(0, 6, 0), (1, 4, 0),
                                                                                              (2, 0, 0)]
    (letter,) = snap["dead_letters"]
    assert {k: letter[k] for k in ("subscription", "topic", "partition", "offset", "attempts", "last_status")} == {
        "subscription": "hooks", "topic": "orders", "partition": 0, "offset": 2, "attempts": 1, "last_status": 500}
    assert letter["replay_requested_at"] is None and letter["dead_at"]

    # The figures are the ones GET /v1/subscriptions/{name} shows: one function computes both.
    status = client.get("/v1/subscriptions/hooks").json()
    assert status["dead_letters"] == 1
    assert [p["committed_offset"] for p in status["partitions"]] == [p["committed_offset"] for p in sub["partitions"]]

    receiver.behaviour = lambda n, body: (200, {}, 0.0)
    r = client.post("/v1/subscriptions/hooks/dead-letters/replay", json={"partition": 0, "from_offset": 2,
                                                                           "to_offset": 2})
    assert r.json() == {"requested": 1}
    snap = wait_for(client, lambda s: s["dead_letters"] == [])
    assert snap["subscriptions"][0]["delivered"] == 10 and snap["subscriptions"][0]["dead_lettered"] == 0
    assert sorted(m["value"]["n"] for m in receiver.messages()) == [0, 1, 2, 3, 4, 5, 100, 101, 102, 103]


def test_disabled_endpoint_is_visible(client: TestClient, orders: str) -> None:
    gone = Receiver(behaviour=lambda n, body: (410, {}, 0.0))
    try:
        client.post("/v1/subscriptions", json={"name": "gone", "topic": "orders", "url": gone.url,
                                               "start": "earliest"})
        client.post("/v1/topics/orders/messages?ack=table", json={"value": 1, "partition": 0})
        snap = wait_for(client, lambda s: s["subscriptions"][0]["endpoint_state"] == "disabled")
    finally:
        gone.close()
    assert "410" in snap["subscriptions"][0]["last_error"]
    assert snap["subscriptions"][0]["pending"] == 1


def _result(job: JobName, started: datetime, tables: list[TableResult], error: str | None = None) -> JobResult:
    return JobResult(job=job, run_id=uuid.uuid4().hex, trigger="cli", started_at=started, duration_ms=900,
                     tables=tables, error=error)


def test_last_job_runs(client: TestClient, settings: Settings) -> None:
    layout = Layout(settings.data_dir)
    job_runs.record(layout, _result(JobName.COMPACTION, datetime(2026, 1, 1, tzinfo=UTC), [
        TableResult("orders", "orders", files_before=12, files_after=3, bytes_before=9000, bytes_after=8000,
                    duration_ms=300),
        TableResult("payments", "payments", files_before=4, files_after=1, duration_ms=200),
    ]))
    job_runs.record(layout, _result(JobName.COMPACTION, datetime(2026, 1, 2, tzinfo=UTC), [
        TableResult("orders", "orders", outcome=Outcome.FAILED, error="boom", duration_ms=50),
    ]))
    job_runs.record(layout, _result(JobName.RETENTION, datetime(2026, 1, 3, tzinfo=UTC), [], error="no spark"))
    jobs = snapshot(client)["jobs"]
    newest, older = jobs["compaction"]
    assert (newest["outcome"], newest["error"], newest["tables"]) == ("failed", "boom", 1)
    assert (older["outcome"], older["files_before"], older["files_after"], older["duration_ms"]) == ("ok", 16, 4, 500)
    assert (older["bytes_before"], older["topics"]) == (9000, ["orders", "payments"])
    (failed,) = jobs["retention"]
    assert (failed["outcome"], failed["error"], failed["duration_ms"], failed["files_before"]) == (
        "failed", "no spark", 900, None)
    assert jobs["replication"] == []


def test_summarize_keeps_the_newest_runs() -> None:
    rows = [{"run_id": f"r{i}", "job": "compaction", "target": "t", "topic": "t", "trigger": "cli",
             "started_at": datetime(2026, 1, 10 - i, tzinfo=UTC), "duration_ms": i, "outcome": "ok",
             "files_before": 2, "files_after": 1, "rows_removed": None, "bytes_before": None, "bytes_after": None,
             "error": None} for i in range(8)]
    assert [r["run_id"] for r in summarize_runs(rows, limit=3)] == ["r0", "r1", "r2"]


def test_produce_rate_ring() -> None:
    rates = ProduceRates(window_s=10)
    assert rates.observe("t", 0, now=100.0) is None
    assert rates.observe("t", 50, now=101.0) == pytest.approx(50.0)
    assert rates.observe("t", 50, now=101.1) == pytest.approx(50 / 1.1)  # too close: not stored, still answered
    for second in range(2, 30):
        rate = rates.observe("t", 50 + 10 * (second - 1), now=100.0 + second)
    assert rate == pytest.approx(10.0, rel=0.02)  # the early burst has left the window
    assert rates.observe("t", 0, now=131.0) is None  # deleted and made again: start over


def test_page_and_assets(client: TestClient) -> None:
    page = client.get("/")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert "script-src 'self'" in page.headers["content-security-policy"]
    assert '<script src="/dashboard/dashboard.js"' in page.text
    assert client.get("/dashboard/dashboard.js").headers["content-type"].startswith("text/javascript")
    assert client.get("/dashboard/dashboard.css").headers["content-type"].startswith("text/css")
    assert client.get("/dashboard/..%2Fapp.py").status_code == 404
    assert client.get("/dashboard/nope.js").status_code == 404
    assert "/v1/dashboard" in client.get("/openapi.json").json()["paths"]
    assert "/" not in client.get("/openapi.json").json()["paths"]


def test_auth_page_is_public_and_data_needs_admin(tmp_path: Path) -> None:
    data = tmp_path / "data"
    tokens = TokenStore(Layout(data))
    _, admin = tokens.create(["admin"], name="ops")
    _, producer = tokens.create(["produce"], name="svc")
    _, orders_admin = tokens.create(["admin"], topics=["orders"], name="orders-ops")
    settings = Settings(data_dir=data, auth="required", flush_interval_ms=20, deliver_in_serve=False)
    with TestClient(build_app(settings)) as client:
        assert client.get("/").status_code == 200
        assert client.get("/dashboard/dashboard.js").status_code == 200
        assert client.get("/v1/dashboard").status_code == 401
        assert client.get("/v1/dashboard", headers={"Authorization": f"Bearer {producer}"}).status_code == 403
        bearer = {"Authorization": f"Bearer {admin}"}
        for name in ("orders", "payments"):
            assert client.post("/v1/topics", json={"name": name}, headers=bearer).status_code == 201
        assert [t["name"] for t in snapshot(client, **bearer)["topics"]] == ["orders", "payments"]
        limited = snapshot(client, Authorization=f"Bearer {orders_admin}")
        assert [t["name"] for t in limited["topics"]] == ["orders"]


def test_consumer_groups_show_with_their_lag_on_the_dashboard_and_in_metrics(client: TestClient) -> None:
    """A pull consumer's (or a Spark stream's) group: its position, the partition's committed end, the
    lag; the same lag in /metrics. Subscriptions' groups are not listed here (they have their panel)."""
    assert client.post("/v1/topics", json={"name": "events", "partitions": 2}).status_code == 201
    r = client.post("/v1/topics/events/batch?ack=table", json={"messages": [
        {"value": i, "partition": i % 2} for i in range(10)]})
    assert r.status_code == 200, r.text
    assert client.post("/v1/topics/events/groups/audit/offsets", json={"offsets": {"0": 2, "1": 5}}).status_code == 200
    snap = wait_for(client, lambda s: len(s["groups"]) == 2)
    assert [(g["group"], g["topic"], g["partition"], g["committed_offset"], g["high_watermark"], g["lag"])
            for g in snap["groups"]] == [("audit", "events", 0, 2, 5, 3), ("audit", "events", 1, 5, 5, 0)]
    metrics = client.get("/metrics").text
    assert 'lakebroker_group_lag{group="audit",partition="0",topic="events"} 3.0' in metrics
    assert 'lakebroker_group_lag{group="audit",partition="1",topic="events"} 0.0' in metrics
    assert client.post("/v1/topics/events/groups/audit/offsets", json={"offsets": {"0": 5}}).status_code == 200
    wait_for(client, lambda s: [g["lag"] for g in s["groups"]] == [0, 0], timeout=10)
    assert 'lakebroker_group_lag{group="audit",partition="0",topic="events"} 0.0' in client.get("/metrics").text


def test_the_charts_sample_reads_only_the_subscriptions_totals(client: TestClient, orders: str, receiver: Receiver,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """Every serve process samples the charts' history every 15 s whether or not a page is open:
    from the subscription, offset and dead-letter tables alone (no topic's files are listed), and
    nothing more than the subscription list while there is no subscription."""
    board = client.app.state.dashboard  # type: ignore[attr-defined]
    listed: list[Any] = []
    monkeypatch.setattr("lakebroker.ingest_api.dashboard.partition_files", lambda *args: listed.append(args))
    seen: list[tuple[str, Sample]] = []
    board.history = SubscriptionHistory(min_spacing_s=0)
    monkeypatch.setattr(board.history, "observe", lambda name, sample: seen.append((name, sample)))
    client.portal.call(board._sample)  # type: ignore[union-attr]
    assert seen == [] and listed == []

    r = client.post("/v1/subscriptions", json={"name": "hooks", "topic": "orders", "url": receiver.url,
                                               "start": "earliest", "max_attempts": 1})
    assert r.status_code == 201, r.text
    r = client.post("/v1/topics/orders/batch?ack=table",
                    json={"messages": [{"value": {"n": i}, "partition": 0} for i in range(6)]})
    assert r.status_code == 200, r.text

    def sampled() -> Sample | None:
        seen.clear()
        client.portal.call(board._sample)  # type: ignore[union-attr]
        return seen[0][1] if seen and seen[0][1].lag == 0 and seen[0][1].dead_lettered == 1 else None

    sample = eventually(sampled, 20, what="the dead letter and the offset commit in the sample", interval=0.2)
    assert (seen[0][0], sample.delivered, sample.dead_lettered, sample.lag) == ("hooks", 5, 1, 0)
    assert listed == []
