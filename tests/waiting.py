"""Waiting in tests: for a condition, with a deadline that fails the test, never for a fixed time."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

T = TypeVar("T")


def eventually(check: Callable[[], T], timeout: float = 30.0, *, what: str | None = None,
               interval: float = 0.05) -> T:
    """Call `check` until it returns something truthy, and return that. An AssertionError from
    `check` means "not yet"; at the deadline the last one is raised, or one naming `what` and the
    last value. Any other exception ends the wait at once (a server that died, say)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            value = check()
        except AssertionError:
            if time.monotonic() >= deadline:
                raise
        else:
            if value:
                return value
            if time.monotonic() >= deadline:
                raise AssertionError(f"{what or _name(check)} did not hold within {timeout:g} s; "
                                     f"last: {_short(value)}")
        time.sleep(interval)


async def eventually_async(check: Callable[[], T | Awaitable[T]], timeout: float = 30.0, *, what: str | None = None,
                           interval: float = 0.02) -> T:
    """`eventually` on an event loop: `check` may be a coroutine function; the loop runs between tries."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            value = check()
            if isinstance(value, Awaitable):
                value = await value
        except AssertionError:
            if time.monotonic() >= deadline:
                raise
        else:
            if value:
                return value  # type: ignore[return-value]
            if time.monotonic() >= deadline:
                raise AssertionError(f"{what or _name(check)} did not hold within {timeout:g} s; "
                                     f"last: {_short(value)}")
        await asyncio.sleep(interval)


def _name(check: Callable[..., object]) -> str:
    return getattr(check, "__qualname__", repr(check))


def _short(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 500 else text[:500] + "…"
