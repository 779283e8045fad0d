"""The public API of lakebroker.client is exactly this; a change here is a change for every user."""

from __future__ import annotations

import pytest

import lakebroker.client as client
from tables.errors import LakebrokerError

EXPORTED = [
    "AckMode",
    "Batching",
    "BrokerUnavailable",
    "BufferFull",
    "ClientClosed",
    "ClientError",
    "Consumer",
    "Delivery",
    "FileOffsetStore",
    "InvalidDelivery",
    "Message",
    "OffsetStore",
    "Producer",
    "ProducerStats",
    "RequestRefused",
    "Retry",
    "SendResult",
    "SignatureInvalid",
    "WebhookVerifier",
]


def test_exported_names_are_pinned() -> None:
    assert sorted(client.__all__) == EXPORTED
    public = sorted(n for n in vars(client) if not n.startswith("_") and n not in ("annotations",))
    assert public == EXPORTED, "import new names from the private modules and list them in __all__"
    assert all(getattr(client, name).__module__.startswith("lakebroker.client._") for name in EXPORTED)


def test_every_client_error_folds_into_the_root_error() -> None:
    errors = [client.BrokerUnavailable, client.BufferFull, client.ClientClosed, client.InvalidDelivery,
              client.RequestRefused, client.SignatureInvalid]
    assert all(issubclass(e, client.ClientError) and issubclass(e, LakebrokerError) for e in errors)


def test_importing_the_client_loads_no_broker_internals() -> None:
    import subprocess
    import sys

    code = ("import sys, lakebroker.client; heavy = [m for m in sys.modules if m.split('.')[0] in "
            "('pyarrow', 'deltalake', 'pyspark', 'ingest_api')]; print(heavy)")
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout == "[]\n"


@pytest.mark.parametrize("bad", [dict(timeout_s=-1), dict(initial_backoff_s=0), dict(initial_backoff_s=10),
                                 dict(jitter=1.5)])
def test_retry_validates_itself(bad: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        client.Retry(**bad)


@pytest.mark.parametrize("bad", [dict(linger_ms=-1), dict(max_messages=0), dict(max_messages=200_000),
                                 dict(max_bytes=0), dict(buffer_messages=10), dict(block_s=-1)])
def test_batching_validates_itself(bad: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        client.Batching(**bad)  # type: ignore[arg-type]


def test_retry_backoff_grows_to_its_cap_and_honours_retry_after() -> None:
    retry = client.Retry(initial_backoff_s=0.1, max_backoff_s=1.0, jitter=0)
    assert [retry.backoff_s(n) for n in (1, 2, 3, 4, 5, 6)] == [0.1, 0.2, 0.4, 0.8, 1.0, 1.0]
    assert retry.backoff_s(1, retry_after_s=3) == 3
