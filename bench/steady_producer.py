"""Produces at a steady rate for a bounded time, from its own process (an open-loop load).

`python -m bench.steady_producer --url URL --topic T --rate 2000 --seconds 10`
Sends a batch every 10 ms with ack=wal; prints {"sent": n, "seconds": s} as JSON.
"""

from __future__ import annotations

import argparse
import time

import httpx
import orjson


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--url", required=True)
    parser.add_argument("--topic", required=True)
    parser.add_argument("--rate", type=float, required=True)
    parser.add_argument("--seconds", type=float, required=True)
    args = parser.parse_args()
    tick = 0.01
    per_tick = args.rate * tick
    owed = 0.0
    sent = 0
    started = time.monotonic()
    with httpx.Client(base_url=args.url, timeout=10) as client:
        next_at = started
        while time.monotonic() - started < args.seconds:
            owed += per_tick
            n = int(owed)
            owed -= n
            if n:
                body = orjson.dumps({"messages": [{"value": "x" * 90} for _ in range(n)]})
                client.post(f"/v1/topics/{args.topic}/batch", content=body,
                            headers={"content-type": "application/json"}).raise_for_status()
                sent += n
            next_at += tick
            time.sleep(max(0.0, next_at - time.monotonic()))
    print(orjson.dumps({"sent": sent, "seconds": time.monotonic() - started}).decode())


if __name__ == "__main__":
    main()
