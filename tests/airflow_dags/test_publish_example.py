"""The reverse-ETL example DAG (examples/airflow) run with `airflow dags test` against a real broker
process: a Spark task sums a day's orders per customer and publishes the totals to a topic, whose
subscription delivers them to a real receiver as signed webhooks; running the day again stores
nothing twice."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import httpx
import pytest
from deltalake import DeltaTable
from standardwebhooks import Webhook

from lakebroker.tables.layout import Layout
from lakebroker.tables.topics import TopicStore
from tests.receivers import Receiver
from tests.servers import ServerProcess

pytestmark = [pytest.mark.spark, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "examples" / "airflow"
DAG_ID = "lakebroker_publish_daily_totals"


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[ServerProcess]:
    server = ServerProcess(tmp_path / "data", env={"LAKEBROKER_ALLOW_PRIVATE_WEBHOOKS": "true",
                                                   "LAKEBROKER_DELIVERY_POLL_MS": "20",
                                                   "LAKEBROKER_FLUSH_INTERVAL_MS": "50"})
    server.start()
    try:
        yield server
    finally:
        server.stop()


def _readme_command() -> list[str]:
    """The README recipe's `airflow dags test` command, as words."""
    block = (REPO / "README.md").read_text().split("<!-- recipe-airflow -->")[1].split("<!-- /recipe-airflow -->")[0]
    line = block[block.index("AIRFLOW__CORE__DAGS_FOLDER="):].split("```")[0].replace("\\\n", " ")
    return shlex.split(line)


def _dags_test(broker: ServerProcess, day: str) -> subprocess.CompletedProcess[str]:
    words = _readme_command()
    folder = words.pop(0).split("=", 1)[1]
    assert words[:4] == ["airflow", "dags", "test", DAG_ID] and (REPO / folder).resolve() == EXAMPLES, words
    words[0], words[4] = str(Path(sys.executable).parent / "airflow"), day
    conf = words.index("--conf") + 1
    words[conf] = words[conf].replace("http://127.0.0.1:8080", broker.url)
    env = {**os.environ, "AIRFLOW__CORE__DAGS_FOLDER": folder, "LAKEBROKER_DATA_DIR": str(broker.data_dir),
           "LAKEBROKER_SPARK_MASTER": "local[1]"}
    return subprocess.run(words, capture_output=True, text=True, timeout=600, env=env, cwd=REPO)


@pytest.mark.timeout(900)
def test_the_example_dag_publishes_a_days_totals_as_signed_webhooks_once(airflow_db: Path, broker: ServerProcess,
                                                                       tmp_path: Path) -> None:
    url = broker.url
    for name, partitions in (("orders", 3), ("daily-totals", 3)):
        assert httpx.post(f"{url}/v1/topics", json={"name": name, "partitions": partitions}).status_code == 201
    receiver = Receiver()
    try:
        created = httpx.post(f"{url}/v1/subscriptions", json={"name": "finance", "topic": "daily-totals",
                                                               "url": receiver.url, "start": "earliest"})
        assert created.status_code == 201, created.text
        orders = [("alice", 10), ("bob", 5), ("alice", 2.5), ("carol", 1), ("bob", 5)]
        r = httpx.post(f"{url}/v1/topics/orders/batch?ack=table",
                       json={"messages": [{"key": c, "value": {"amount": a}} for c, a in orders]})
        assert r.status_code == 200, r.text
        day = datetime.now(UTC).date().isoformat()

        done = _dags_test(broker, day)
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        expected = {"alice": 12.5, "bob": 10.0, "carol": 1.0}
        receiver.wait_for(lambda: len(receiver.received) >= 3, timeout=60)
        verifier = Webhook(created.json()["secret"])
        delivered = [verifier.verify(m.body, m.headers) for m in receiver.received]  # raises unless signed
        totals = {e["key"]: json.loads(e["value"]) if isinstance(e["value"], str) else e["value"]
                  for e in delivered}
        assert {k: float(v["total"]) for k, v in totals.items()} == expected
        assert {k: (v["day"], v["orders"]) for k, v in totals.items()} == {
            "alice": (day, 2), "bob": (day, 2), "carol": (day, 1)}

        again = _dags_test(broker, day)  # the same day again: its write id makes every row a duplicate
        assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
        layout = Layout(broker.data_dir)
        stored = DeltaTable(layout.topic_table(TopicStore(layout).get("daily-totals"))).to_pyarrow_table()
        assert stored.num_rows == 3
    finally:
        receiver.close()
