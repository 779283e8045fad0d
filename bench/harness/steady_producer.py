"""Produces at a steady rate for a bounded time, from its own process (an open-loop load).

`python -m bench.steady_producer --url URL --topic T --rate 2000 --seconds 10 [--keys 50]`
Sends a batch every 10 ms (ack=wal, the default), each message's value carrying its send time
(`{"sent": <unix time>, "pad": ...}`) so a receiver can measure produce→webhook from the
producer's clock; with --keys, message i gets the key `user-<i % keys>`. Stops after --seconds or
--max-messages, whichever comes first; prints {"sent": n, "seconds": s, "late_ticks": k} as JSON
(late_ticks: batches sent more than one tick behind schedule, i.e. the load fell short).
"""

from __future__ import annotations

import argparse
import time

import httpx
import orjson

TICK_S = 0.01
PAD = "x" * 60  # ~100-byte values, as in the scenario


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--url", required=True)
    parser.add_argument("--topic", required=True)
    parser.add_argument("--rate", type=float, required=True)
    parser.add_argument("--seconds", type=float, required=True)
    parser.add_argument("--keys", type=int, default=0, help="spread messages over this many keys (0: keyless)")
    parser.add_argument("--max-messages", type=int, default=10_000_000)
    args = parser.parse_args()
    per_tick = args.rate * TICK_S
    owed = 0.0
    sent = late = 0
    started = time.monotonic()
    with httpx.Client(base_url=args.url, timeout=10) as client:
        next_at = started
        while time.monotonic() - started < args.seconds and sent < args.max_messages:
            owed += per_tick
            n = min(int(owed), args.max_messages - sent)
            owed -= n
            if n:
                now = time.time()
                messages: list[dict[str, object]] = [{"value": {"sent": now, "pad": PAD}} for _ in range(n)]
                if args.keys:
                    for i, m in enumerate(messages):
                        m["key"] = f"user-{(sent + i) % args.keys}"
                client.post(f"/v1/topics/{args.topic}/batch", content=orjson.dumps({"messages": messages}),
                            headers={"content-type": "application/json"}).raise_for_status()
                sent += n
            next_at += TICK_S
            pause = next_at - time.monotonic()
            if pause < -TICK_S:
                late += 1
            time.sleep(max(0.0, pause))
    print(orjson.dumps({"sent": sent, "seconds": time.monotonic() - started, "late_ticks": late}).decode())


if __name__ == "__main__":
    main()
