"""The public API of lakebroker_client is exactly this; a change here is a change for every user."""

from __future__ import annotations

import ast
import subprocess
import sys
import types
from pathlib import Path

import httpx
import pytest
from tenacity import RetryCallState, Retrying

import lakebroker_client as client

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
    "TopicPartition",
    "WebhookVerifier",
]
PACKAGE = Path(client.__file__).parent
SERVER_PACKAGES = {"tables", "ingest_api", "delivery_worker", "spark_pipeline", "lakebroker", "airflow_dags"}


def test_exported_names_are_pinned() -> None:
    assert sorted(client.__all__) == EXPORTED
    public = sorted(n for n, v in vars(client).items()
                    if not n.startswith("_") and not isinstance(v, types.ModuleType))  # `fastapi`, once imported
    assert public == EXPORTED, "import new names from the private modules and list them in __all__"
    assert all(getattr(client, name).__module__.startswith("lakebroker_client._") for name in EXPORTED)


def test_every_client_error_folds_into_its_own_root_error() -> None:
    errors = [client.BrokerUnavailable, client.BufferFull, client.ClientClosed, client.InvalidDelivery,
              client.RequestRefused, client.SignatureInvalid]
    assert all(issubclass(e, client.ClientError) for e in errors)
    assert client.ClientError.__mro__[1:] == (Exception, BaseException, object), "no server error in its tree"


EXTRAS = {("fastapi.py", "fastapi"), ("_arrow.py", "pyarrow")}


def test_the_package_imports_nothing_of_the_server() -> None:
    """Statically, every module (fastapi.py included): only the stdlib, its three dependencies, itself
    and its extras' packages in their modules alone: fastapi in lakebroker_client.fastapi, pyarrow in
    lakebroker_client._arrow (imported inside its functions: importing the client loads no pyarrow)."""
    allowed = {"httpx", "standardwebhooks", "tenacity", "lakebroker_client", "__future__"}
    modules = sorted(PACKAGE.glob("*.py"))
    assert len(modules) >= 10
    for path in modules:
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            for name in names:
                top = name.split(".")[0]
                assert top not in SERVER_PACKAGES, f"{path.name} imports {name}"
                assert top in allowed or top in sys.stdlib_module_names or (path.name, top) in EXTRAS, \
                    f"{path.name} imports {name}, which is not a dependency of lakebroker-client"


def test_importing_the_client_loads_no_broker_internals() -> None:
    code = ("import sys, lakebroker_client; heavy = [m for m in sys.modules if m.split('.')[0] in "
            "('pyarrow', 'deltalake', 'pyspark', 'fastapi', 'pydantic', 'orjson', 'tables', 'ingest_api', "
            "'delivery_worker', 'spark_pipeline', 'lakebroker')]; print(heavy)")
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


def _after(failures: int, response: httpx.Response | None = None) -> RetryCallState:
    state = RetryCallState(Retrying(), None, (), {})
    state.attempt_number = failures
    if response is None:
        state.set_exception((httpx.ConnectError, httpx.ConnectError("refused"), None))
    else:
        state.set_result(response)
    return state


def test_retry_backoff_grows_to_its_cap_and_honours_retry_after() -> None:
    wait = client.Retry(initial_backoff_s=0.1, max_backoff_s=1.0, jitter=0).wait()
    assert [wait(_after(n)) for n in (1, 2, 3, 4, 5, 6)] == [0.1, 0.2, 0.4, 0.8, 1.0, 1.0]
    assert wait(_after(1, httpx.Response(429, headers={"retry-after": "3"}))) == 3
    assert wait(_after(1, httpx.Response(503, headers={"retry-after": "x"}))) == 0.1, "unreadable: ignored"
    assert wait(_after(1, httpx.Response(500, headers={"retry-after": "3"}))) == 0.1, "only on 429 and 503"
    deadline = client.Retry(timeout_s=2, initial_backoff_s=0.1, max_backoff_s=1.0, jitter=0).wait()
    assert deadline(_after(1, httpx.Response(429, headers={"retry-after": "60"}))) <= 2, "never past the deadline"


def test_retry_jitter_stays_within_its_bounds() -> None:
    wait = client.Retry(initial_backoff_s=1.0, max_backoff_s=1.0, jitter=0.2).wait()
    delays = {wait(_after(1)) for _ in range(200)}
    assert all(0.8 <= d <= 1.2 for d in delays) and len(delays) > 100


def test_the_client_needs_only_its_three_dependencies_each_explained_in_the_readme() -> None:
    import re
    import tomllib

    project = tomllib.loads((PACKAGE.parent / "pyproject.toml").read_text())["project"]
    names = {re.split(r"[\[<>=!~ ]", spec, maxsplit=1)[0].lower() for spec in project["dependencies"]}
    assert names == {"httpx", "standardwebhooks", "tenacity"}
    readme = (PACKAGE.parents[2] / "README.md").read_text()
    table = readme.split("## Dependencies", 1)[1].split("\n## ", 1)[0]
    assert all(f"`{name}`" in table for name in names)
