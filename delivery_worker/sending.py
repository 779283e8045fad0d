"""A partition's sends: takes units from the dispatch queue in the subscription's order, sends each
within the endpoint's window and rate limit and only while the partition's lease holds, retries by
the retry policy, and hands what ends (acknowledged or dead-lettered) to the pipeline.

A send is cut off when the lease ends (as renewed meanwhile), so no send overlaps the next owner's;
the receiver may have got a cut-off request, and the next owner sends it again with the same
webhook-id. A 410 Gone ends the pipeline (`Gone`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from lakebroker.delivery_worker.breaker import CircuitBreaker, Turn
from lakebroker.delivery_worker.breaker import State as BreakerState
from lakebroker.delivery_worker.flow import AdaptiveWindow, TokenBucket
from lakebroker.delivery_worker.metrics import DeliveryMetrics
from lakebroker.delivery_worker.ordering import DispatchQueue, Unit
from lakebroker.delivery_worker.retry import RetryPolicy
from lakebroker.delivery_worker.sender import Outcome, Sender
from lakebroker.delivery_worker.signer import Signer
from lakebroker.tables.dead_letters import DeadLetter
from lakebroker.tables.subscriptions import Subscription

if TYPE_CHECKING:
    from lakebroker.delivery_worker.pipeline import PipelineStatus

log = logging.getLogger(__name__)


class Gone(Exception):
    """The endpoint answered 410: stop delivering to it."""


@dataclass
class Endpoint:
    """Flow control shared by every partition of a subscription that this worker delivers."""

    bucket: TokenBucket
    window: AdaptiveWindow
    breaker: CircuitBreaker
    backing_off_until: float = 0.0
    answered_at: float = 0.0  # time.time() of its last success here: an endpoint that answers is not failing

    @classmethod
    def for_subscription(cls, sub: Subscription,
                         on_breaker: Callable[[BreakerState], None] = lambda state: None) -> Endpoint:
        breaker = CircuitBreaker(sub.breaker_failures, sub.breaker_cooldown_ms / 1000,
                                 ratio=sub.breaker_failure_ratio, window_s=sub.breaker_window_ms / 1000,
                                 min_requests=sub.breaker_min_requests, on_change=on_breaker)
        return cls(TokenBucket(sub.rate_limit_per_s), AdaptiveWindow(sub.max_in_flight), breaker)


Finished = Callable[[Unit, bool], None]  # (unit, delivered): acknowledged, or dead-lettered


class Dispatcher:
    def __init__(self, sub: Subscription, partition: int, *, queue: DispatchQueue, sender: Sender,
                 endpoint: Endpoint, status: PipelineStatus, metrics: DeliveryMetrics, poll_s: float,
                 lease_left: Callable[[], float], finished: Finished, wake: Callable[[], None]) -> None:
        self.sub, self.partition = sub, partition
        self.queue = queue
        self.sender = sender
        self.endpoint = endpoint
        self.status = status
        self.poll_s = poll_s
        self.lease_left = lease_left  # seconds this worker may still act on the partition (<= 0: none)
        self._finished_unit = finished
        self._wake = wake
        self.policy = RetryPolicy(sub.retry_schedule_ms, sub.max_attempts)
        self.signer = Signer(sub.secrets)
        self.dead: list[DeadLetter] = []  # written by the worker before the offset commit that passes them
        self.gone: Gone | None = None
        self.crashed: BaseException | None = None
        self.stopping = False
        self._send_deadlines: set[asyncio.Timeout] = set()  # of the sends in progress: moved when the lease is
        self._tasks: set[asyncio.Task[None]] = set()
        self._running_sends: set[asyncio.Task[None]] = set()  # sends whose body has started
        self._give_backs: set[asyncio.Task[None]] = set()  # window slots of sends that never started
        # Children bound once: a labels() lookup per message is measurable at thousands a second.
        # Binding also starts each series at zero, so dashboards and alerts see it before any event.
        name = sub.name
        self._attempts = {o: metrics.attempts.labels(name, o)
                          for o in ("ok", "retry", "rate_limited", "timeout", "error", "gone")}
        self._in_flight = metrics.in_flight.labels(name)

    def fenced(self) -> bool:
        """True while the lease is in doubt: a send now could overlap the next owner's."""
        if self.lease_left() > 0:
            if self.status.state == "fenced":
                self.status.state = "healthy"
            return False
        self.status.state = "fenced"
        return True

    def dispatch(self) -> None:
        window = self.endpoint.window
        if time.monotonic() < self.endpoint.backing_off_until or self.fenced():
            return
        if not self.endpoint.breaker.admits_new():
            if self.queue:
                self.status.state = "circuit_open"
            return
        while window.has_room():
            unit = self.queue.take()  # the ordering rule: delivery_worker/ordering.py
            if unit is None:
                return
            window.in_flight += 1  # taken synchronously, so the loop never oversubscribes
            self.status.in_flight += 1
            self._in_flight.inc()
            task = asyncio.create_task(self._deliver(unit))
            self._tasks.add(task)
            task.add_done_callback(self._finished)

    async def stop(self) -> None:
        """Cancel outstanding sends (they will be redelivered)."""
        self.stopping = True
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    def lease_renewed(self) -> None:
        """The worker renewed the lease: sends in progress may run until its new end."""
        if self._send_deadlines:
            when = asyncio.get_running_loop().time() + self.lease_left()
            for deadline in self._send_deadlines:
                if not deadline.expired():  # one that fired is cutting its send off already
                    deadline.reschedule(when)

    async def attempt_within_lease(self, rows: list[dict[str, Any]], id_suffix: str = "") -> Outcome | None:
        """One attempt, started only while the lease holds and cut off when it ends (as renewed
        meanwhile: `lease_renewed`); None if cut off or not begun."""
        left = self.lease_left()  # checked after the rate limiter's wait, right before the send
        if left <= 0:
            return None
        try:
            async with asyncio.timeout(left) as deadline:
                self._send_deadlines.add(deadline)
                try:
                    return await self._attempt(rows, id_suffix)
                finally:
                    self._send_deadlines.discard(deadline)
        except TimeoutError:
            self.status.last_error = "a send was cut off: the partition's lease ended while it ran"
            return None

    def record(self, outcome: Outcome) -> None:
        if outcome.ok:
            label = "ok"
        elif outcome.gone:
            label = "gone"
        elif outcome.status is None:
            label = "timeout" if outcome.error and "timed out" in outcome.error else "error"
        elif outcome.status == 429:
            label = "rate_limited"
        else:
            label = "retry"
        self._attempts[label].inc()
        if outcome.ok:
            self.endpoint.answered_at = time.time()
        self.status.last_status = outcome.status
        if not outcome.ok:
            self.status.last_error = outcome.error

    def _finished(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        if task not in self._running_sends:
            # Cancelled before its first step (a stop right after a dispatch): its body and its
            # `finally` never ran, so the slot and the count taken in dispatch come back here, or
            # the endpoint's shared window would stay short of a slot for good.
            self.status.in_flight -= 1
            self._in_flight.dec()
            self._give_backs.add(asyncio.get_running_loop().create_task(self.endpoint.window.give_back()))
            self._give_backs = {t for t in self._give_backs if not t.done()}
        self._running_sends.discard(task)
        if not task.cancelled() and task.exception() is not None and self.crashed is None:
            self.crashed = task.exception()  # its key would stay busy forever: let run() fail loudly
        if not self.stopping and self.gone is None:
            self.dispatch()  # the next message goes now, not after a turn of the pipeline's loop
        self._wake()

    async def _deliver(self, unit: Unit) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._running_sends.add(task)  # from here on, the `finally` below gives back what dispatch took
        window = self.endpoint.window
        attempts = 0
        holding = True
        try:
            while True:
                if not holding:
                    await window.acquire()
                    holding = True
                while self.fenced():  # retries too: never send once the lease may have passed on
                    await asyncio.sleep(self.poll_s)
                turn = await self._turn()
                if turn is None:  # waited out an open circuit: the lease is looked at again first
                    continue
                outcome, counts = await self._attempt_in_turn(unit.rows, turn)
                if outcome is None:  # the lease ended before or during the send: not an attempt of ours
                    holding = False
                    await window.release(False)
                    continue
                attempts += counts
                holding = False
                await window.release(outcome.ok)
                if outcome.ok:
                    self._finished_unit(unit, True)
                    return
                if outcome.gone:
                    raise Gone(f"endpoint answered 410 Gone at offset {unit.rows[0]['offset']}")
                if self.policy.exhausted(attempts):
                    self.dead.extend(
                        DeadLetter.from_exhausted_retries(self.sub.name, self.sub.topic, self.partition,
                                                          r["offset"], attempts, outcome.status, outcome.error)
                        for r in unit.rows
                    )
                    self._finished_unit(unit, False)
                    return
                await self._back_off(attempts, outcome)
        except Gone as exc:
            self.gone = exc
            self._wake()
        finally:
            if holding:
                await window.release(False)
            self.status.in_flight -= 1
            self._in_flight.dec()

    async def send_settled(self, rows: list[dict[str, Any]], id_suffix: str) -> Outcome | None:
        """Send `rows` (one request, its webhook-id ending in `id_suffix`) until the endpoint takes
        them, refuses them for good (410, or the retry policy exhausted), or the lease ends (None):
        under the rate limit and the endpoint's Retry-After pause, waiting out an open circuit
        without spending attempts; the partition's state says what its sends see, as a live
        delivery's do. Outside the dispatch queue and its window: replays."""
        attempts = 0
        while True:
            if self.fenced():
                return None
            if (pause := self.endpoint.backing_off_until - time.monotonic()) > 0:
                await asyncio.sleep(min(pause, self.poll_s))
                continue
            turn = await self._turn()
            if turn is None:  # waited out an open circuit: the lease and the pause are looked at again
                continue
            outcome, counts = await self._attempt_in_turn(rows, turn, id_suffix)
            if outcome is None:
                return None
            attempts += counts
            if outcome.ok:
                self._state("healthy")  # the endpoint answers, as a live delivery's success says
            if outcome.ok or outcome.gone or self.policy.exhausted(attempts):
                return outcome
            await self._back_off(attempts, outcome)

    def _state(self, state: str) -> None:
        if self.status.state != "disabled":  # the endpoint answered 410 Gone: that stays
            self.status.state = state

    async def _turn(self) -> Turn | None:
        """The breaker's turn for one attempt; None once an open circuit has been waited out,
        spending nothing (the caller looks at its lease, and the endpoint's pause, before it asks again)."""
        breaker = self.endpoint.breaker
        turn = breaker.turn()
        if turn is None:
            self._state("circuit_open")
            await asyncio.sleep(breaker.wait_s())
        return turn

    async def _back_off(self, attempts: int, failed: Outcome) -> None:
        """Wait before the next attempt, as the retry policy and the endpoint's Retry-After say."""
        self._state("backing_off")
        if failed.retry_after_s is not None:  # the endpoint asked everyone to wait
            self.endpoint.backing_off_until = time.monotonic() + failed.retry_after_s
        await asyncio.sleep(self.policy.delay_s(attempts, failed.retry_after_s))

    async def _attempt_in_turn(self, rows: list[dict[str, Any]], turn: Turn,
                               id_suffix: str = "") -> tuple[Outcome | None, int]:
        """One attempt that the breaker gave `turn`, under the rate limit and within the lease, and
        whether it counts as an attempt of its message (breaker.py); None if the lease cut it off."""
        breaker = self.endpoint.breaker
        try:
            await self.endpoint.bucket.take(len(rows))
            outcome = await self.attempt_within_lease(rows, id_suffix)
        except BaseException:  # cancelled (a stop): a probe it held goes back
            breaker.abandoned(turn)
            raise
        if outcome is None:
            breaker.abandoned(turn)
            return None, 0
        counts = breaker.record(turn, outcome.status, outcome.ok)
        self.record(outcome)
        return outcome, int(counts)

    async def _attempt(self, rows: list[dict[str, Any]], id_suffix: str = "") -> Outcome:
        """One POST. Whatever goes wrong ends the attempt as a failure, retried by the policy: an
        exception escaping here would kill the task, keep its key busy and stall the partition."""
        try:
            return await self.sender.send(self.sub.url, self.sub.topic, rows, self.signer,
                                          self.sub.timeout_ms / 1000, batch=self.sub.batch_size > 1,
                                          id_suffix=id_suffix)
        except Exception as exc:
            log.exception("subscription %s partition %d: delivery attempt failed", self.sub.name, self.partition)
            return Outcome(None, f"internal error: {type(exc).__name__}: {exc}"[:500])
