"""`LAKEBROKER_LOG_FORMAT=json` and `LAKEBROKER_ACCESS_LOG`, on a real `lakebroker serve`."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import httpx
import orjson

from tests.servers import ServerProcess


def serve_and_log(data: Path, access_log: bool) -> list[dict[str, Any]]:
    """Start serve with JSON logs, make a few requests, stop it; every line it wrote, parsed as JSON."""
    server = ServerProcess(data, env={"LAKEBROKER_LOG_FORMAT": "json", "LAKEBROKER_LOG_LEVEL": "info",
                                      "LAKEBROKER_ACCESS_LOG": "true" if access_log else "false"})
    url = server.start()
    try:
        assert httpx.post(url + "/v1/topics", json={"name": "logged", "partitions": 1}).status_code == 201
        assert httpx.get(url + "/v1/topics/nope").status_code == 404
        assert httpx.get(url + "/?token=lbk_secretvalue&x=1").status_code == 200  # the dashboard's link
        deadline = time.monotonic() + 60  # serve's delivery process writes to the same log, in the same format
        while "lakebroker.delivery_worker.child" not in server.log.read_text():
            assert time.monotonic() < deadline, "the delivery process logged nothing"
            time.sleep(0.05)
    finally:
        code = server.stop()
    # A clean stop: serve ran its cleanup, and neither it nor its delivery process died in teardown
    # (Arrow's thread pools once aborted the child there, writing a line outside the JSON log).
    assert code == 0, f"serve exited {code} on SIGTERM: {server.log.read_text()[-2000:]}"
    assert not (data / "server.json").exists(), "serve left its server.json behind"
    assert "stopped (code 0)" in server.log.read_text(), server.log.read_text()[-2000:]
    lines = server.log.read_text().splitlines()
    assert lines, "serve logged nothing"
    records = []
    for line in lines:
        try:
            records.append(orjson.loads(line))
        except orjson.JSONDecodeError:
            raise AssertionError(f"serve wrote a line that is not one JSON object: {line!r}") from None
    return records


def test_json_logs_with_the_access_log_on_and_off(tmp_path: Path) -> None:
    records = serve_and_log(tmp_path / "on", access_log=True)
    for r in records:
        assert {"timestamp", "level", "logger", "message"} <= r.keys(), r
    loggers = {r["logger"] for r in records}
    ours_and_uvicorns = {"lakebroker.server", "uvicorn.error", "lakebroker.delivery_worker.child"}
    assert ours_and_uvicorns <= loggers, loggers
    assert any("Application startup complete" in r["message"] for r in records)
    access = [r for r in records if r["logger"] == "uvicorn.access"]
    assert {(r["method"], r["path"], r["status"]) for r in access} >= {
        ("POST", "/v1/topics", 201), ("GET", "/v1/topics/nope", 404)}, access
    assert all(r["client"].startswith("127.0.0.1:") and r["level"] == "info" for r in access)
    assert ("GET", "/?token=REDACTED&x=1", 200) in {(r["method"], r["path"], r["status"]) for r in access}, access
    assert not [r for r in records if b"lbk_secretvalue" in orjson.dumps(r)], "a token reached the log"

    quiet = serve_and_log(tmp_path / "off", access_log=False)
    assert not [r for r in quiet if r["logger"] == "uvicorn.access"]
    assert any(r["logger"] == "uvicorn.error" for r in quiet)  # the rest of uvicorn's log is still there
