"""The dashboard in a real headless Chromium, against a real `lakebroker serve` on loopback.

The server delivers to real webhook receivers on loopback: `billing` takes every message but
two (dead-lettered at once, max_attempts=1), and `audit` answers 503 so its endpoint's circuit
opens. The test watches the page's numbers move as messages are produced over HTTP,
clicks Replay on a dead letter and waits until the receiver has it, runs a real compaction
job (Spark, in its own process) and sees its run appear, then saves a screenshot to
test-artifacts/dashboard.png.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from playwright.sync_api import Browser, Page, expect, sync_playwright

from lakebroker.tables.dead_letters import DeadLetter, DeadLetterTable
from lakebroker.tables.layout import Layout
from lakebroker.tables.tokens import TokenStore
from tests.receivers import Receiver
from tests.servers import REPO, ServerProcess
from tests.waiting import eventually

CHROMIUM = Path("/usr/bin/chromium")
ARTIFACTS = REPO / "test-artifacts"
# How long an expectation waits for the page to get there (Playwright's default is 5 s): beside the
# whole suite on two cores, a fetch and the server's token read can take longer than that.
expect.set_options(timeout=20_000)
FAILING = {42, 137}  # message numbers billing's receiver refuses until told otherwise
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]

pytestmark = pytest.mark.skipif(not CHROMIUM.exists(), reason="needs Debian's chromium (apt-get install chromium)")


@pytest.fixture
def server(tmp_path: Path) -> Iterator[ServerProcess]:
    proc = ServerProcess(tmp_path / "data", env={
        "LAKEBROKER_ALLOW_PRIVATE_WEBHOOKS": "1", "LAKEBROKER_HEARTBEAT_S": "0.5",
        "LAKEBROKER_FLUSH_INTERVAL_MS": "50", "LAKEBROKER_OFFSET_COMMIT_INTERVAL_MS": "200",
        "LAKEBROKER_WAL_FSYNC": "false", "LAKEBROKER_LOG_LEVEL": "warning",
        **{f"LAKEBROKER_{job}_INTERVAL_S": "0" for job in ("COMPACTION", "RETENTION", "KEY_COMPACTION",
                                                           "OFFSETS_COMPACTION", "REPLICATION")},
    })
    proc.start()
    yield proc
    proc.stop()


@pytest.fixture
def browser() -> Iterator[Browser]:
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        yield b
        b.close()


@pytest.fixture
def billing() -> Iterator[Receiver]:
    failing = {"on": True}

    def behaviour(n: int, body: Any) -> tuple[int, dict[str, str], float]:
        return (500, {}, 0.0) if failing["on"] and body["value"]["n"] in FAILING else (200, {}, 0.0)

    r = Receiver(behaviour=behaviour)
    r.failing = failing  # type: ignore[attr-defined]
    yield r
    r.close()


@pytest.fixture
def audit() -> Iterator[Receiver]:
    r = Receiver(behaviour=lambda n, body: (503, {}, 0.0))
    yield r
    r.close()


class Trickle:
    """Produces to one topic at a steady rate in the background, so the page shows a live rate."""

    def __init__(self, url: str, topic: str, per_s: float) -> None:
        self.url, self.topic, self.interval = url, topic, 1 / per_s
        self.sent = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        with httpx.Client(base_url=self.url, timeout=10) as client:
            while not self._stop.wait(self.interval):
                client.post(f"/v1/topics/{self.topic}/messages", json={"value": {"amount": self.sent}})
                self.sent += 1

    def __enter__(self) -> Trickle:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=10)


def text_of(page: Page, testid: str) -> str:
    return page.get_by_test_id(testid).inner_text().strip()


def number(page: Page, testid: str) -> int:
    return int(text_of(page, testid).replace(",", "") or -1)


def rate_of(page: Page, topic: str) -> float:
    """The produce rate the page shows ("12.5 msg/s"); 0 while it shows none."""
    text = text_of(page, f"topic-{topic}-rate")
    return float(text.split()[0].replace(",", "")) if text.endswith(" msg/s") else 0.0


def wait_until(predicate: Callable[[], bool], what: str, timeout: float = 30) -> None:
    eventually(predicate, timeout, what=f"the page showing {what}", interval=0.1)


def produce(api: httpx.Client, topic: str, numbers: range) -> list[dict[str, Any]]:
    r = api.post(f"/v1/topics/{topic}/batch", json={"messages": [{"value": {"n": i}} for i in numbers]})
    assert r.status_code == 200, r.text
    results: list[dict[str, Any]] = r.json()["results"]
    return results


def start_compaction(data_dir: Path, out: Path) -> subprocess.Popen[bytes]:
    """The real compaction job, as the scheduler or `spark-submit` runs it: its own process and JVM.
    It prints its run as JSON (stdout to `out`, the log to `out`.log)."""
    with out.open("wb") as stdout, out.with_suffix(".log").open("wb") as stderr:
        return subprocess.Popen([sys.executable, "-m", "lakebroker.spark_pipeline.jobs.compaction",
                                 "--data-dir", str(data_dir), "--master", "local[1]", "--trigger", "cli"],
                                cwd=REPO, stdout=stdout, stderr=stderr)


def recorded_run(proc: subprocess.Popen[bytes], out: Path) -> dict[str, Any]:
    """The run the job recorded in _system/job_runs, as it printed it. Whether compaction itself
    succeeded is tests/spark_pipeline's business; here the page must show what was recorded."""
    code = proc.wait(timeout=480)
    lines = out.read_text().strip().splitlines()
    assert code in (0, 1) and lines, f"the job crashed ({code}): {out.with_suffix('.log').read_text()[-3000:]}"
    run: dict[str, Any] = json.loads(lines[-1])
    return run


def test_dashboard_live_in_chromium(server: ServerProcess, browser: Browser, billing: Receiver,
                                    audit: Receiver) -> None:
    ARTIFACTS.mkdir(exist_ok=True)
    screenshot = ARTIFACTS / "dashboard.png"
    screenshot.unlink(missing_ok=True)
    api = httpx.Client(base_url=server.url, timeout=30)
    page = browser.new_page(viewport={"width": 1440, "height": 1000})
    console_errors: list[str] = []
    page.on("console", lambda m: console_errors.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda e: console_errors.append(str(e)))
    compaction_out = server.data_dir.parent / "compaction.json"
    compaction: subprocess.Popen[bytes] | None = None
    try:
        for name, partitions in (("orders", 3), ("payments", 2)):
            assert api.post("/v1/topics", json={"name": name, "partitions": partitions}).status_code == 201
        for body in ({"name": "billing", "topic": "orders", "url": billing.url, "start": "earliest",
                      "max_attempts": 1},
                     {"name": "audit", "topic": "payments", "url": audit.url, "start": "earliest",
                      "max_attempts": 100, "retry_schedule_s": [1.0], "timeout_s": 2}):
            r = api.post("/v1/subscriptions", json=body)
            assert r.status_code == 201, r.text

        page.goto(server.url + "/")
        expect(page.get_by_test_id("live")).to_have_attribute("data-state", "live", timeout=15_000)
        expect(page.get_by_test_id("topic-orders-log-end")).to_have_text("0")
        expect(page.get_by_test_id("sub-billing-state")).to_be_visible()

        # Produce over HTTP in bursts and watch the page's log end climb.
        seen: list[int] = [number(page, "topic-orders-log-end")]
        results: list[dict[str, Any]] = []
        for burst in range(5):
            results += produce(api, "orders", range(burst * 40, (burst + 1) * 40))
            wait_until(lambda b=burst: number(page, "topic-orders-log-end") == (b + 1) * 40,  # type: ignore[misc]
                       f"log end {(burst + 1) * 40}")
            seen.append(number(page, "topic-orders-log-end"))
            time.sleep(0.4)
        assert seen == [0, 40, 80, 120, 160, 200]
        # While the bursts are within the rate's window (dashboard.RATE_WINDOW_S): the waits below can outlast it.
        wait_until(lambda: rate_of(page, "orders") > 0, "a produce rate")
        # A pull consumer's group, with its lag on the partition it is behind on.
        def partition_0() -> dict[str, Any]:
            return dict(api.get("/v1/topics/orders").json()["partition_offsets"][0])

        wait_until(lambda: partition_0()["high_watermark"] == partition_0()["log_end_offset"], "p0 all in Delta")
        committed = partition_0()["high_watermark"]
        assert api.post("/v1/topics/orders/groups/audit/offsets", json={"offsets": {"0": 1}}).status_code == 200
        expect(page.get_by_test_id("group-audit-orders-0-lag")).to_have_text(f"{committed - 1:,}", timeout=10_000)
        files_before = number(page, "topic-orders-files")
        assert files_before > 3  # one file per partition and flush
        compaction = start_compaction(server.data_dir, compaction_out)

        # Delivery: 198 delivered, 2 dead-lettered, the bar at 99 %.
        wait_until(lambda: number(page, "sub-billing-delivered") == 198, "198 delivered")
        expect(page.get_by_test_id("sub-billing-dead")).to_have_text("2")
        expect(page.get_by_test_id("sub-billing-pending")).to_have_text("0")
        progress = page.get_by_test_id("sub-billing-progress")
        assert float(progress.get_attribute("aria-valuenow") or 0) == pytest.approx(99.0)
        assert "500" in text_of(page, "sub-billing-error")
        expect(page.get_by_test_id("kpi-dead")).to_have_text("2")

        # Replay one dead letter from the page.
        first, second = (results[n] for n in sorted(FAILING))
        row = page.get_by_test_id(f"dead-letter-billing-{first['partition']}-{first['offset']}")
        expect(row).to_be_visible()
        expect(page.get_by_test_id(f"dead-letter-billing-{second['partition']}-{second['offset']}")).to_be_visible()
        billing.failing["on"] = False  # type: ignore[attr-defined]
        received_before = len(billing.messages())
        page.get_by_test_id(f"replay-billing-{first['partition']}-{first['offset']}").click()
        expect(row).to_have_count(0, timeout=20_000)
        billing.wait_for(lambda: len(billing.messages()) > received_before)
        assert [m["value"]["n"] for m in billing.messages()[received_before:]] == [42]
        expect(page.get_by_test_id("sub-billing-delivered")).to_have_text("199", timeout=10_000)
        expect(page.get_by_test_id("sub-billing-dead")).to_have_text("1")
        expect(page.get_by_test_id("dead-count")).to_have_text("1")

        # The compaction run (started above, Spark in its own process) appears on the page.
        if compaction is not None:
            run = recorded_run(compaction, compaction_out)
            expect(page.get_by_test_id("job-compaction-outcome")).to_have_text(run["outcome"], timeout=15_000)
            files = text_of(page, "job-compaction-files")
            before, after = (int(x.replace(",", "")) for x in files.split(" → "))
            orders = next(t for t in run["tables"] if t["target"] == "orders")
            assert before == files_before == orders["files_before"]
            if run["outcome"] == "ok":
                assert after == orders["files_after"] < before
                wait_until(lambda: number(page, "topic-orders-files") < files_before, "fewer files after compaction")
            else:
                assert text_of(page, "job-compaction-error") != "none"

        # A steady trickle into payments, whose endpoint answers 503: a live rate, an endpoint whose circuit opens.
        with Trickle(server.url, "payments", per_s=8):
            wait_until(lambda: number(page, "topic-payments-log-end") >= 40, "the trickle into payments")
            wait_until(lambda: rate_of(page, "payments") > 0, "a payments rate")
            # 503 after 503: backing off, then, after 20 in a row, its circuit open (delivery_worker/breaker.py)
            expect(page.get_by_test_id("sub-audit-state")).to_have_text("circuit open", timeout=15_000)
            assert "503" in text_of(page, "sub-audit-error")
            wait_until(lambda: number(page, "sub-audit-pending") > 0, "audit's messages pending")
            page.evaluate("window.scrollTo(0, 0)")  # the sticky header belongs at the top of a full-page shot
            page.screenshot(path=str(screenshot), full_page=True)

        # Each card charts its last 15 minutes from the server's samples: billing's deliveries, and
        # audit's lag while its endpoint answers 503.
        def chart_max(sub: str, chart: str) -> float:
            return float(page.get_by_test_id(f"sub-{sub}-chart-{chart}").get_attribute("data-max") or 0)

        wait_until(lambda: chart_max("billing", "delivered") > 0, "billing's deliveries charted", timeout=60)
        wait_until(lambda: chart_max("audit", "lag") > 0, "audit's lag charted", timeout=60)
        assert chart_max("billing", "lag") == 0 and chart_max("audit", "delivered") == 0

        # A subscription's filter is shown on its card.
        flt = 'headers.region = "eu" AND value.n > 10'
        assert api.patch("/v1/subscriptions/audit", json={"filter": flt}).status_code == 200
        expect(page.get_by_test_id("sub-audit-filter")).to_have_text(f"filter: {flt}", timeout=10_000)

        # More dead letters than the table lists: the header and the badge give the true total, and
        # the subscription's card replays them all at once, after a confirmation.
        offsets_per_partition = 20
        DeadLetterTable(Layout(server.data_dir)).add(
            [DeadLetter.from_exhausted_retries("billing", "orders", p, o, 1, 500, "injected")
             for p in range(3) for o in range(offsets_per_partition)])
        total = 3 * offsets_per_partition + 1  # and the one left from the failing receiver
        expect(page.get_by_test_id("kpi-dead")).to_have_text(str(total), timeout=10_000)
        expect(page.get_by_test_id("dead-count")).to_have_text(f"50 of {total}")
        expect(page.get_by_test_id("sub-billing-dead")).to_have_text(str(total))
        replay_all = page.get_by_test_id("sub-billing-replay-all")
        expect(replay_all).to_have_text(f"Replay {total} dead letters")
        asked: list[str] = []
        page.once("dialog", lambda d: (asked.append(d.message), d.dismiss()))
        replay_all.click()
        assert asked == [f"Replay all {total} dead letters of billing? Each is delivered again."]
        time.sleep(1.5)  # three snapshots: a dismissed confirmation replays nothing
        expect(page.get_by_test_id("kpi-dead")).to_have_text(str(total))
        received_before = len(billing.messages())
        page.once("dialog", lambda d: d.accept())
        replay_all.click()
        expect(page.get_by_test_id("kpi-dead")).to_have_text("0", timeout=60_000)
        expect(page.get_by_test_id("dead-count")).to_have_text("0")
        expect(replay_all).to_be_hidden()
        billing.wait_for(lambda: len(billing.messages()) >= received_before + total)

        # Replays by predicate on the cards: billing's runs to its end; audit's, against an endpoint
        # that answers 503, waits on its open circuit until it is cancelled from the page.
        done = api.post("/v1/subscriptions/billing/replays", json={"where": "(value->>'n')::INT < 5"}).json()
        expect(page.get_by_test_id(f"replay-{done['id']}-state")).to_have_text("replay done", timeout=30_000)
        expect(page.get_by_test_id(f"replay-{done['id']}-progress")).to_have_text(
            "5 of 5 matched delivered, 100.0 % scanned")
        expect(page.get_by_test_id(f"replay-{done['id']}-cancel")).to_be_hidden()
        assert api.patch("/v1/subscriptions/audit", json={"filter": None}).status_code == 200
        stuck = api.post("/v1/subscriptions/audit/replays", json={}).json()
        assert stuck["to_scan"] > 0
        expect(page.get_by_test_id(f"replay-{stuck['id']}-state")).to_have_text("replay running", timeout=10_000)
        page.once("dialog", lambda d: d.accept())
        page.get_by_test_id(f"replay-{stuck['id']}-cancel").click()
        expect(page.get_by_test_id(f"replay-{stuck['id']}-state")).to_have_text("replay cancelled", timeout=10_000)
        expect(page.get_by_test_id(f"replay-{stuck['id']}-cancel")).to_be_hidden()
        assert api.get(f"/v1/subscriptions/audit/replays/{stuck['id']}").json()["state"] == "cancelled"
        assert not console_errors, console_errors
    except BaseException:
        page.screenshot(path=str(ARTIFACTS / "dashboard-failure.png"), full_page=True)
        raise
    finally:
        api.close()
        if compaction is not None and compaction.poll() is None:
            compaction.kill()
            compaction.wait()
    assert screenshot.stat().st_size > 50_000  # a rendered page of tables and cards, not a blank one


def test_dashboard_asks_for_a_token_when_auth_is_on(tmp_path: Path, browser: Browser) -> None:
    data = tmp_path / "data"
    _, admin = TokenStore(Layout(data)).create(["admin"], name="ops")
    _, producer = TokenStore(Layout(data)).create(["produce"], name="svc")
    server = ServerProcess(data, env={"LAKEBROKER_AUTH": "required", "LAKEBROKER_LOG_LEVEL": "warning"})
    server.start()
    try:
        bearer = {"Authorization": f"Bearer {admin}"}
        assert httpx.post(server.url + "/v1/topics", json={"name": "orders"}, headers=bearer).status_code == 201
        page = browser.new_page(viewport={"width": 1440, "height": 900}, color_scheme="dark")
        page.goto(server.url + "/")  # the page itself is public: it holds no data
        expect(page.get_by_test_id("live")).to_have_attribute("data-state", "auth")
        expect(page.locator("#auth")).to_be_visible()
        expect(page.get_by_test_id("kpi-topics")).to_have_text("\u2013")  # no data: a dash

        page.fill("#token-input", producer)  # a token without the admin scope is refused, and says why
        page.click("#token-form button")
        expect(page.locator("#auth-text")).to_contain_text("admin")

        page.fill("#token-input", admin)
        page.click("#token-form button")
        expect(page.get_by_test_id("live")).to_have_attribute("data-state", "live")
        expect(page.get_by_test_id("kpi-topics")).to_have_text("1")
        expect(page.locator("#auth")).to_be_hidden()

        fresh = browser.new_page()  # ?token= is taken once, kept for the tab, and removed from the address bar
        fresh.goto(f"{server.url}/?token={admin}")
        expect(fresh.get_by_test_id("topic-orders")).to_be_visible()
        assert "token" not in fresh.url
        assert fresh.evaluate("sessionStorage.getItem('lakebroker.token')") == admin
        ARTIFACTS.mkdir(exist_ok=True)
        page.screenshot(path=str(ARTIFACTS / "dashboard-dark.png"), full_page=True)
    finally:
        server.stop()
