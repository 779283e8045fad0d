"""`lakebroker deliver --metrics-port`: a standalone delivery worker serves its own Prometheus /metrics
(docs/operations.md, "Scaling the delivery workers")."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from fastapi.testclient import TestClient

from lakebroker.server import build_app
from lakebroker.tables.settings import Settings
from tests.receivers import Receiver
from tests.servers import REPO, free_port
from tests.waiting import eventually


def test_a_standalone_worker_serves_the_delivery_metrics(tmp_path: Path) -> None:
    data = tmp_path / "data"
    receiver = Receiver()
    settings = Settings(data_dir=data, deliver_in_serve=False, allow_private_webhooks=True, flush_interval_ms=20)
    with TestClient(build_app(settings)) as client:  # the broker, without a worker of its own
        assert client.post("/v1/topics", json={"name": "orders", "partitions": 2}).status_code == 201
        assert client.post("/v1/subscriptions", json={"name": "hooks", "topic": "orders", "url": receiver.url,
                                                      "start": "earliest"}).status_code == 201
        assert client.post("/v1/topics/orders/batch?ack=table",
                           json={"messages": [{"value": i} for i in range(3)]}).status_code == 200
    port = free_port()
    env = {**os.environ, "LAKEBROKER_ALLOW_PRIVATE_WEBHOOKS": "1", "LAKEBROKER_HEARTBEAT_S": "0.5"}
    log = (tmp_path / "deliver.log").open("wb")
    worker = subprocess.Popen([sys.executable, "-m", "lakebroker", "--data-dir", str(data), "deliver",
                               "--worker-id", "standalone", "--metrics-port", str(port)],
                              stdout=log, stderr=subprocess.STDOUT, env=env, cwd=REPO)
    try:
        receiver.wait_for(lambda: len(receiver.messages()) == 3, timeout=60)
        wanted = 'lakebroker_delivered_messages_total{subscription="hooks"} 3.0'
        def scraped() -> str:
            if worker.poll() is not None:
                pytest.fail((tmp_path / "deliver.log").read_text()[-2000:])
            with contextlib.suppress(httpx.TransportError):  # not listening yet
                text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
                return text if wanted in text else ""
            return ""

        text = eventually(scraped, 30, what=wanted)
        assert "lakebroker_delivery_latency_seconds_bucket" in text and "lakebroker_consumer_lag" in text
    finally:
        worker.terminate()
        worker.wait(timeout=30)
        log.close()
        receiver.close()
