"""The subscriptions state table across schema versions."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
from deltalake import DeltaTable, write_deltalake

from lakebroker.tables import delta
from lakebroker.tables.layout import Layout
from lakebroker.tables.schemas import SCHEMA_VERSION_PROPERTY, SUBSCRIPTIONS_SCHEMA, SUBSCRIPTIONS_SCHEMA_VERSION
from lakebroker.tables.subscriptions import Subscription, SubscriptionStore, _to_row, new_secret


def test_a_version_1_table_gains_the_new_columns_and_keeps_its_subscriptions(tmp_path: Path) -> None:
    layout = Layout(tmp_path)
    added = ("filter", "breaker_failures", "breaker_cooldown_ms", "disable_after_ms", "failing_since",
             "breaker_failure_ratio", "breaker_window_ms", "breaker_min_requests")
    v1 = pa.schema([f for f in SUBSCRIPTIONS_SCHEMA if f.name not in added])
    legacy = delta.ensure_table(layout.subscriptions_table, v1, partition_by=None, version=1)
    old = Subscription(name="old", topic="t", url="http://127.0.0.1:9/", secrets=(new_secret(),))
    row = {k: v for k, v in _to_row(old).items() if k not in added}
    write_deltalake(legacy, pa.Table.from_pylist([row], schema=v1), mode="append")

    store = SubscriptionStore(layout)
    assert store.get("old") == old and old.filter is None  # the breaker's settings at their defaults
    store.create(Subscription(name="new", topic="t", url="http://127.0.0.1:9/", secrets=(new_secret(),),
                              filter='headers:region'))
    assert store.update("old", filter='key = "a"').filter == 'key = "a"'
    assert {n: s.filter for n, s in SubscriptionStore(layout).load().items()} == {
        "old": 'key = "a"', "new": "headers:region"}
    table = DeltaTable(layout.subscriptions_table)
    assert table.metadata().configuration[SCHEMA_VERSION_PROPERTY] == str(SUBSCRIPTIONS_SCHEMA_VERSION) == "5"
    assert set(added) <= {f.name for f in table.schema().fields}
