"""The demo of docker-compose.yml: topic `demo`, a subscription pushing it to the demo receiver,
and a few messages sent with the Python client. Idempotent: what exists is kept.

    BROKER_URL=http://broker:8080 TOKEN_FILE=/secrets/admin.token WEBHOOK_URL=http://receiver:8000/hook \
    WEBHOOK_SECRETS=whsec_... python -m examples.compose_setup
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import httpx

from lakebroker_client import Producer


def wait_ready(client: httpx.Client, timeout_s: float = 120) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            if client.get("/readyz").status_code == 200:
                return
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline:
            raise SystemExit(f"the broker at {client.base_url} was not ready within {timeout_s:g} s")
        time.sleep(1)


def create(client: httpx.Client, path: str, body: dict[str, object]) -> None:
    r = client.post(path, json=body)
    if r.status_code == 409:
        print(f"{path} {body['name']}: exists", flush=True)
    elif r.status_code == 201:
        print(f"{path} {body['name']}: created", flush=True)
    else:
        raise SystemExit(f"{path}: HTTP {r.status_code} {r.text}")


def main() -> None:
    url = os.environ.get("BROKER_URL", "http://broker:8080")
    token = Path(os.environ.get("TOKEN_FILE", "/secrets/admin.token")).read_text().strip()
    hook = os.environ.get("WEBHOOK_URL", "http://receiver:8000/hook")
    secret = os.environ["WEBHOOK_SECRETS"].split(",")[0].strip()
    with httpx.Client(base_url=url, headers={"authorization": f"Bearer {token}"}, timeout=30) as client:
        wait_ready(client)
        create(client, "/v1/topics", {"name": "demo", "partitions": 3})
        create(client, "/v1/subscriptions", {"name": "demo-receiver", "topic": "demo", "url": hook,
                                             "start": "earliest", "secret": secret})
    with Producer(url, token) as producer:
        futures = [producer.send("demo", {"hello": i}, key=f"user-{i}") for i in range(3)]
        for future in futures:
            result = future.result(timeout=60)
            print(f"sent to partition {result.partition} offset {result.offset}", flush=True)


if __name__ == "__main__":
    main()
