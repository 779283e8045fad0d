from __future__ import annotations

import asyncio
import random
import re
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime

import pytest

from lakebroker.delivery_worker.flow import AdaptiveWindow, TokenBucket
from lakebroker.delivery_worker.retry import RetryPolicy, parse_retry_after
from lakebroker.tables.errors import InvalidRequest
from lakebroker.tables.leases import assign
from lakebroker.tables.webhook_urls import check_webhook_url, private_address


def test_retry_schedule_with_jitter_and_last_delay_repeating() -> None:
    policy = RetryPolicy((1000, 5000), max_attempts=5)
    rng = random.Random(1)
    first = [policy.delay_s(1, rng=rng) for _ in range(200)]
    assert min(first) >= 0.8 and max(first) <= 1.2 and max(first) - min(first) > 0.2  # ±20 % jitter
    assert all(4.0 <= policy.delay_s(n, rng=rng) <= 6.0 for n in (2, 3, 4))  # the last delay repeats
    assert policy.delay_s(1, retry_after_s=30, rng=rng) == 30  # Retry-After wins when longer
    assert not policy.exhausted(4) and policy.exhausted(5)


def test_retry_after_parsing() -> None:
    now = datetime(2026, 1, 1, tzinfo=UTC)
    assert parse_retry_after("7") == 7
    assert parse_retry_after(format_datetime(now + timedelta(seconds=90), usegmt=True), now) == 90
    assert parse_retry_after("999999") == 3600  # capped
    assert parse_retry_after("soon") is None and parse_retry_after(None) is None


class FakeClock:
    """The bucket's clock and sleep: a sleep moves the clock, so the schedule is exact (rates whose
    waits are binary fractions keep the arithmetic exact too)."""

    def __init__(self) -> None:
        self.now = 0.0
        self.sleeps: list[float] = []

    def __call__(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds


async def test_token_bucket_rate() -> None:
    clock = FakeClock()
    bucket = TokenBucket(rate=64, burst=1, clock=clock, sleep=clock.sleep)
    for _ in range(26):
        await asyncio.wait_for(bucket.take(), 5)
    assert clock.sleeps == [1 / 64] * 25  # the first goes at once, then one each 1/64 s
    assert clock.now == 25 / 64


async def test_token_bucket_refills_while_idle_up_to_its_burst() -> None:
    clock = FakeClock()
    bucket = TokenBucket(rate=8, burst=3, clock=clock, sleep=clock.sleep)
    for _ in range(3):
        await asyncio.wait_for(bucket.take(), 5)  # the burst: no wait
    assert clock.sleeps == []
    clock.now += 60  # idle for a minute: the bucket holds its burst, not 480 tokens
    for _ in range(4):
        await asyncio.wait_for(bucket.take(), 5)
    assert clock.sleeps == [1 / 8]
    await asyncio.wait_for(bucket.take(5), 5)  # more than the burst: waits for a full bucket, then goes
    assert clock.sleeps == [1 / 8, 3 / 8]


async def test_adaptive_window_grows_and_halves() -> None:
    window = AdaptiveWindow(maximum=8)
    assert window.size == 1
    for _ in range(10):
        await window.acquire()
        await window.release(True)
    assert window.size == 8
    await window.acquire()
    await window.release(False)
    assert window.size == 4
    for _ in range(4):
        await window.acquire()
    blocked = asyncio.create_task(window.acquire())
    await asyncio.sleep(0.05)
    assert not blocked.done()  # a full window makes the fifth wait
    await window.release(True)
    await asyncio.wait_for(blocked, 1)


def test_assignment_is_deterministic_and_balanced() -> None:
    pairs = [("g", p) for p in range(6)] + [("h", p) for p in range(3)]
    plan = assign(pairs, ["w2", "w1", "w3"])
    assert plan == assign(list(reversed(pairs)), ["w3", "w1", "w2"])
    counts = {w: sum(1 for o in plan.values() if o == w) for w in ("w1", "w2", "w3")}
    assert counts == {"w1": 3, "w2": 3, "w3": 3}


@pytest.mark.parametrize("url", ["http://127.0.0.1/x", "http://10.1.2.3/", "http://169.254.169.254/latest",
                                 "http://[::1]:8080/", "http://192.168.0.1/", "http://localhost:9/"])
def test_ssrf_guard_refuses_internal_addresses(url: str) -> None:
    with pytest.raises(InvalidRequest, match="allow_private_webhooks"):
        check_webhook_url(url, allow_private=False)
    assert check_webhook_url(url, allow_private=True) == url


def test_ssrf_guard_allows_public_addresses() -> None:
    assert check_webhook_url("https://93.184.215.14/hook", allow_private=False)


# Each wraps an internal IPv4 address that the network delivers to; Python's is_global is true of
# the first four, so only unwrapping refuses them.
WRAPPED = {
    "64:ff9b::a9fe:a9fe": "NAT64 (well-known prefix) of 169.254.169.254",
    "64:ff9b:1:a9fe:a9:fe00::": "NAT64 (local-use prefix, RFC 6052 /48 layout) of 169.254.169.254",
    "2002:7f00:1::": "6to4 of 127.0.0.1",
    "::7f00:1": "IPv4-compatible 127.0.0.1",
    "::ffff:10.0.0.1": "IPv4-mapped 10.0.0.1",
    "2001:0:4136:e378:8000:63bf:80ff:fffe": "Teredo whose client is 127.0.0.1",
}


@pytest.mark.parametrize("address", sorted(WRAPPED))
def test_ssrf_guard_unwraps_ipv4_inside_ipv6(address: str) -> None:
    assert private_address("h", address) is not None, WRAPPED[address]  # at dial time (http1.py)
    with pytest.raises(InvalidRequest, match="allow_private_webhooks"):  # and when a subscription is made
        check_webhook_url(f"http://[{address}]/hook", allow_private=False)


@pytest.mark.parametrize("address", ["64:ff9b::808:808", "2002:808:808::", "2606:4700::1111", "::ffff:8.8.8.8"])
def test_ssrf_guard_allows_public_ipv4_inside_ipv6(address: str) -> None:
    assert private_address("h", address) is None


@pytest.mark.parametrize(("url", "why"), [
    ("http://[::1/", "Invalid IPv6 URL"),
    ("http://" + "a" * 64 + ".example.com/", "label is empty or longer than 63"),
    ("http://a..example.com/", "label is empty"),
    ("http://-a.example.com/", "not a valid DNS name"),
    ("http://exa$mple.com/", "not a valid DNS name"),
    ("http://" + "a." * 127 + "com/", "at most 253 characters"),
    ("http://example.com:99999/", "Port out of range"),
    ("http://example.com:http/", "malformed"),
])
@pytest.mark.parametrize("allow_private", [False, True])
def test_malformed_webhook_urls_are_refused_by_name(url: str, why: str, allow_private: bool) -> None:
    with pytest.raises(InvalidRequest, match=re.escape(why)):
        check_webhook_url(url, allow_private=allow_private)


@pytest.mark.parametrize("value", ["²", "٣", "\uff10", "1e309", "NaN", "inf", "-1", "1.5", "9" * 400, "1,2",
                                   "x" * 10_000, "Thu, 01 Jan 0000 00:00:00 GMT", "Mon, 99 Xyz 2020 99:99:99 GMT"])
def test_retry_after_parsing_survives_hostile_values(value: str) -> None:
    """A Retry-After is whatever the endpoint sends: a value that is not ASCII delta-seconds or a
    valid HTTP date is ignored (None), never an exception that kills the delivery."""
    parsed = parse_retry_after(value)
    assert parsed is None or 0 <= parsed <= 3600
    if not value.isascii():
        assert parsed is None  # Unicode digits are not delta-seconds
