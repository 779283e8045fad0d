"""Table roots as URIs (tables/storage.py, tables/layout.py): parsing, engine spellings, options."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from lakebroker.tables import storage
from lakebroker.tables.errors import InvalidRequest
from lakebroker.tables.layout import Layout
from lakebroker.tables.settings import Settings


def test_parse_root_normalises_and_refuses_credentials(tmp_path: Path) -> None:
    assert storage.parse_root("s3://bucket/a/b/") == "s3://bucket/a/b"
    assert storage.parse_root(" s3a://bucket ") == "s3a://bucket"
    assert storage.parse_root(f"file://{tmp_path}/x") == str(tmp_path / "x")
    for bad in ("s3://key:secret@bucket/p", "s3://", "gs://bucket/p", "s3://bucket/p?x=1"):
        with pytest.raises(InvalidRequest):
            storage.parse_root(bad)
    with pytest.raises(ValidationError):
        Settings(tables_uri="s3://AKIA:hunter2@bucket/p")


def test_layout_puts_tables_on_the_root_and_local_state_under_the_data_dir(tmp_path: Path) -> None:
    settings = Settings(data_dir=tmp_path / "data", tables_uri="s3://bucket/lake/")
    layout = Layout.of(settings)
    assert layout.topic_table("orders") == "s3://bucket/lake/topics/orders"
    assert layout.offsets_table == "s3://bucket/lake/_system/consumer_offsets"
    assert layout.wal_dir == tmp_path / "data" / "wal" and layout.lock_file.parent == tmp_path / "data"
    assert Layout.of(settings, for_spark=True).topic_table("orders") == "s3a://bucket/lake/topics/orders"
    local = Layout.of(Settings(data_dir=tmp_path / "data"))
    assert local.topic_table("orders") == str((tmp_path / "data" / "topics" / "orders").resolve())
    assert Layout.of(Settings(data_dir=tmp_path / "data"), for_spark=True) == local


def test_delta_options_come_from_the_environment_and_hide_secrets(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9000/")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIAEXAMPLE")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "s3cr3t-value")
    monkeypatch.delenv("AWS_REGION", raising=False)
    monkeypatch.delenv("AWS_DEFAULT_REGION", raising=False)
    options = storage.delta_options("s3://bucket/t")
    assert options is not None
    assert options["conditional_put"] == "etag"  # commits are put-if-absent
    assert options["AWS_ENDPOINT_URL"] == "http://127.0.0.1:9000" and options["AWS_ALLOW_HTTP"] == "true"
    assert options["AWS_REGION"] == storage.DEFAULT_REGION
    assert storage.delta_options("/local/table") is None
    assert "s3cr3t" not in repr(storage.S3Endpoint.from_env())
    assert "s3cr3t" not in repr(Settings(tables_uri="s3://bucket/t"))
