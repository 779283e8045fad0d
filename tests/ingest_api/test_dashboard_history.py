"""The dashboard's per-subscription history (ingest_api/dashboard_history.py): rates from the
change of totals between samples, never negative, a quarter hour kept."""

from __future__ import annotations

from lakebroker.ingest_api.dashboard_history import HISTORY_S, Sample, SubscriptionHistory


def test_rates_are_the_change_of_the_totals_over_the_time_between_samples() -> None:
    h = SubscriptionHistory(min_spacing_s=5)
    h.observe("s", Sample(1000.0, delivered=0, dead_lettered=0, lag=50))
    h.observe("s", Sample(1010.0, delivered=200, dead_lettered=10, lag=30))
    h.observe("s", Sample(1012.0, delivered=900, dead_lettered=90, lag=0))  # too soon: a page's poll, no sample
    h.observe("s", Sample(1020.0, delivered=250, dead_lettered=4, lag=20))  # dead letters replayed: 0/s, not less
    assert h.series("s") == {"at": [1010.0, 1020.0], "delivered_per_s": [20.0, 5.0],
                             "dead_lettered_per_s": [1.0, 0.0], "lag": [30, 20]}
    assert h.series("unknown") == {"at": [], "delivered_per_s": [], "dead_lettered_per_s": [], "lag": []}


def test_a_quarter_hour_is_kept_and_a_deleted_subscription_forgotten() -> None:
    h = SubscriptionHistory(min_spacing_s=1)
    for i in range(200):
        h.observe("s", Sample(15.0 * i, delivered=i, dead_lettered=0, lag=0))
        h.observe("gone", Sample(15.0 * i, delivered=0, dead_lettered=0, lag=i))
    series = h.series("s")
    assert len(series["at"]) == HISTORY_S / 15 and series["at"][-1] == 15.0 * 199
    assert set(series["delivered_per_s"]) == {round(1 / 15, 2)}
    h.forget_except({"s"})
    assert h.series("gone")["lag"] == [] and h.series("s") == series
