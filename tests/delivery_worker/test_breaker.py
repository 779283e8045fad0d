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


def test_a_share_of_failures_over_the_window_opens_it_once_there_were_enough_attempts() -> None:
    clock, changes = Clock(), []
    b = CircuitBreaker(20, 10, ratio=0.5, window_s=30, min_requests=10, clock=clock, on_change=changes.append)
    for i in range(9):  # every other attempt fails: never a run, and too few attempts to judge the share
        b.record(Turn.SEND, 503 if i % 2 else 200, i % 2 == 0)
        clock.now += 1
    assert b.state is State.CLOSED and b.run <= 1
    assert b.record(Turn.SEND, 503, False) is False  # the tenth: 5 of 10 failed, at the ratio
    assert b.state is State.OPEN and changes == [State.OPEN]
    assert b.window.counts() == (0, 0)  # the share counts afresh once it closes


def test_failures_older_than_the_window_no_longer_count() -> None:
    clock = Clock()
    b = CircuitBreaker(0, 10, ratio=0.5, window_s=30, min_requests=4, clock=clock)
    for _ in range(3):
        assert b.record(Turn.SEND, 500, False) is True
    clock.now += 31  # those three have left the window
    for _ in range(3):
        assert b.record(Turn.SEND, 200, True) is True
    assert b.record(Turn.SEND, 500, False) is True  # 1 of 4 in the window
    assert b.state is State.CLOSED and b.window.counts() == (4, 1)
    assert b.record(Turn.SEND, 500, False) is True  # 2 of 5: under half
    assert b.record(Turn.SEND, 500, False) is False  # 3 of 6: half
    assert b.state is State.OPEN


def test_without_a_ratio_only_runs_open_it() -> None:
    b = CircuitBreaker(5, 10, clock=Clock())
    for i in range(200):
        b.record(Turn.SEND, 503 if i % 3 else 200, i % 3 == 0)
    assert b.state is State.CLOSED and b.window.counts() == (0, 0)
