"""The endpoint's circuit breaker (delivery_worker/breaker.py), on a clock of the test's own."""

from __future__ import annotations

from lakebroker.delivery_worker.breaker import MAX_COOLDOWN_S, CircuitBreaker, State, Turn


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_run_of_failures_opens_it_and_those_failures_spend_no_attempt_from_then_on() -> None:
    clock, changes = Clock(), []
    b = CircuitBreaker(3, 10, clock=clock, on_change=changes.append)
    assert [b.record(Turn.SEND, 503, False) for _ in range(2)] == [True, True]  # ordinary retries
    assert b.record(Turn.SEND, None, False) is False  # the third opens it: not the message's fault
    assert b.state is State.OPEN and changes == [State.OPEN]
    assert b.record(Turn.SEND, 500, False) is False  # sent before it opened
    assert b.turn() is None and not b.admits_new() and b.wait_s() == 10


def test_after_the_cool_down_one_probe_goes_and_its_answer_closes_the_circuit() -> None:
    clock = Clock()
    b = CircuitBreaker(2, 10, clock=clock)
    b.record(Turn.SEND, 503, False)
    b.record(Turn.SEND, 503, False)
    clock.now += 10
    assert b.admits_new()
    assert b.turn() is Turn.PROBE and b.state is State.HALF_OPEN
    assert b.turn() is None and not b.admits_new()  # one probe at a time
    assert b.record(Turn.PROBE, 200, True) is True
    assert b.state is State.CLOSED and b.turn() is Turn.SEND and b.run == 0


def test_a_failed_probe_opens_it_again_for_twice_as_long_up_to_a_bound() -> None:
    clock = Clock()
    b = CircuitBreaker(1, 100, clock=clock)
    b.record(Turn.SEND, 429, False)
    waits = []
    for _ in range(5):
        clock.now = b.retry_at
        assert b.turn() is Turn.PROBE
        assert b.record(Turn.PROBE, None, False) is False
        waits.append(b.retry_at - clock.now)
    assert waits == [200, 400, MAX_COOLDOWN_S, MAX_COOLDOWN_S, MAX_COOLDOWN_S]
    clock.now = b.retry_at
    assert b.turn() is Turn.PROBE and b.record(Turn.PROBE, 200, True)
    b.record(Turn.SEND, 503, False)
    assert b.retry_at - clock.now == 100  # a success brings the cool-down back to the subscription's


def test_an_answer_that_refuses_a_message_shows_the_endpoint_up() -> None:
    b = CircuitBreaker(3, 10, clock=Clock())
    for status in (503, 503, 400, 503, 503, 422, 500, 500):
        assert b.record(Turn.SEND, status, False) is True
    assert b.state is State.CLOSED
    assert CircuitBreaker(0, 10).record(Turn.SEND, None, False) is True  # 0: never opens


def test_a_probe_that_never_reached_the_endpoint_is_given_back() -> None:
    clock = Clock()
    b = CircuitBreaker(1, 5, clock=clock)
    b.record(Turn.SEND, 503, False)
    clock.now += 5
    assert b.turn() is Turn.PROBE
    b.abandoned(Turn.PROBE)
    assert b.turn() is Turn.PROBE
