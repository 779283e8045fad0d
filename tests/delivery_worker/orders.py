"""Orders for the filter and replay tests: keys eu-/us- in turn, region headers eu/us/none in turn,
amounts 0, 60, 120, 180 in turn; `eu_over_100` picks one in twelve."""

from __future__ import annotations

from typing import Any


def order_messages(first: int, n: int) -> list[dict[str, Any]]:
    out = []
    for i in range(first, first + n):
        headers = [{"region": "eu"}, {"region": "us"}, {}][i % 3]
        out.append({"key": f"{'eu' if i % 2 == 0 else 'us'}-{i}", "headers": headers,
                    "value": {"n": i, "amount": (i % 4) * 60}})
    return out


def eu_over_100(m: dict[str, Any]) -> bool:
    return (m["key"].startswith("eu-") and (m.get("headers") or {}).get("region") == "eu"
            and m["value"]["amount"] > 100)
