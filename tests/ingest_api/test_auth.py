"""Access control: API tokens, scopes, topic allow-lists, on every route the app has.

The route tests enumerate `app.routes`, so a route added later is covered without anyone
remembering to: it must refuse a request without a token, and its access must be listed in
ACCESS below (a new route fails the suite until someone decides who may call it).
"""

from __future__ import annotations

import hashlib
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
import pyarrow.dataset as pads
import pytest
from fastapi import APIRouter, FastAPI
from fastapi.routing import APIRoute
from fastapi.testclient import TestClient
from starlette.routing import Route

from lakebroker.access import RemoteAccess, broker_access
from lakebroker.ingest_api.auth import check_every_route_decided, is_loopback, require
from lakebroker.server import build_app
from lakebroker.tables.errors import Unauthenticated
from lakebroker.tables.layout import Layout
from lakebroker.tables.lock import DataDirLock
from lakebroker.tables.settings import Settings
from lakebroker.tables.tokens import Scope, TokenStore, split_token

# Who may call each route: "public", "authenticated" (any valid token) or the scope it needs.
# `topic_aware`: a route without {topic} that applies a token's topic allow-list itself.
ACCESS: dict[tuple[str, str], str] = {
    ("GET", "/healthz"): "public",
    ("GET", "/readyz"): "public",
    ("GET", "/metrics"): "metrics",
    ("GET", "/v1/topics"): "authenticated",
    ("POST", "/v1/topics"): "admin",
    ("GET", "/v1/cluster"): "authenticated",
    ("GET", "/v1/topics/{topic}"): "authenticated",
    ("PATCH", "/v1/topics/{topic}"): "admin",
    ("DELETE", "/v1/topics/{topic}"): "admin",
    ("POST", "/v1/topics/{topic}/messages"): "produce",
    ("POST", "/v1/topics/{topic}/batch"): "produce",
    ("POST", "/topics/{topic}"): "produce",
    ("POST", "/topics/{topic}/partitions/{partition}"): "produce",
    ("GET", "/topics"): "authenticated",
    ("GET", "/topics/{topic}"): "authenticated",
    ("POST", "/v3/clusters/{cluster_id}/topics/{topic}/records"): "produce",
    ("GET", "/v3/clusters"): "authenticated",
    ("GET", "/v3/clusters/{cluster_id}"): "authenticated",
    ("GET", "/v1/topics/{topic}/partitions/{partition}/messages"): "consume",
    ("GET", "/v1/topics/{topic}/groups/{group}/offsets"): "consume",
    ("POST", "/v1/topics/{topic}/groups/{group}/offsets"): "consume",
    ("GET", "/v1/subscriptions"): "consume",
    ("POST", "/v1/subscriptions"): "admin",
    ("GET", "/v1/subscriptions/{name}"): "consume",
    ("PATCH", "/v1/subscriptions/{name}"): "admin",
    ("DELETE", "/v1/subscriptions/{name}"): "admin",
    ("POST", "/v1/subscriptions/{name}/pause"): "admin",
    ("POST", "/v1/subscriptions/{name}/resume"): "admin",
    ("POST", "/v1/subscriptions/{name}/seek"): "admin",
    ("GET", "/v1/subscriptions/{name}/dead-letters"): "admin",
    ("POST", "/v1/subscriptions/{name}/dead-letters/replay"): "admin",
    ("POST", "/v1/subscriptions/{name}/replays"): "admin",
    ("GET", "/v1/subscriptions/{name}/replays"): "consume",
    ("GET", "/v1/subscriptions/{name}/replays/{replay_id}"): "consume",
    ("DELETE", "/v1/subscriptions/{name}/replays/{replay_id}"): "admin",
    ("GET", "/v1/dashboard"): "admin",
    # WAL damage: which partitions are held, the skip that records a loss, and the losses recorded.
    ("GET", "/v1/wal/damage"): "admin",
    ("POST", "/v1/wal/damage/skip"): "admin",
    ("GET", "/v1/wal/lost"): "admin",
    # The dashboard page and its static files hold no data (the JSON at /v1/dashboard does).
    ("GET", "/"): "public",
    ("GET", "/dashboard/{asset}"): "public",
    # FastAPI's docs: the schema holds no data; setting docs_public removes them.
    ("GET", "/openapi.json"): "public",
    ("GET", "/docs"): "public",
    ("GET", "/docs/oauth2-redirect"): "public",
    ("GET", "/redoc"): "public",
}
TOPIC_AWARE = {("GET", "/v1/topics"), ("GET", "/v1/cluster"), ("POST", "/v1/topics"), ("GET", "/v1/dashboard"),
               ("GET", "/topics")}
SAMPLES = {"topic": "orders", "partition": "0", "name": "hooks", "group": "g1", "asset": "dashboard.js",
           "cluster_id": "lakebroker"}
NON_ADMIN = [Scope.PRODUCE, Scope.CONSUME, Scope.METRICS]


def settings_for(data: Path, **overrides: object) -> Settings:
    return Settings(**{"data_dir": data, "auth": "required", "auth_cache_ms": 0, "flush_interval_ms": 20,
                       "deliver_in_serve": False, "allow_private_webhooks": True, **overrides})


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def routes(app: FastAPI) -> list[tuple[str, str]]:
    """Every (method, path) the app answers, HEAD aside (Starlette derives it from GET)."""
    found = []
    for route in app.routes:
        if isinstance(route, Route):
            found += [(m, route.path) for m in sorted(route.methods or ()) if m != "HEAD"]
    assert len(found) >= 20, found
    return found


def url(path: str) -> str:
    return re.sub(r"{(\w+)(:\w+)?}", lambda m: SAMPLES.get(m.group(1), "x"), path)


@pytest.fixture
def data(tmp_path: Path) -> Path:
    return tmp_path / "data"


@pytest.fixture
def store(data: Path) -> TokenStore:
    return TokenStore(Layout(data))


@pytest.fixture
def admin(store: TokenStore) -> str:
    return store.create(["admin"], name="test admin")[1]


@pytest.fixture
def app(data: Path, admin: str) -> FastAPI:
    return build_app(settings_for(data))


@pytest.fixture
def client(app: FastAPI, admin: str) -> Iterator[TestClient]:
    with TestClient(app) as c:
        r = c.post("/v1/topics", json={"name": "orders", "partitions": 3}, headers=bearer(admin))
        assert r.status_code == 201, r.text
        r = c.post("/v1/topics", json={"name": "other", "partitions": 1}, headers=bearer(admin))
        assert r.status_code == 201, r.text
        yield c


def is_rest_proxy(r: httpx.Response) -> bool:
    """Routes under /topics and /v3 are Confluent's REST Proxy v2 and v3: errors in their shape."""
    return is_v2(r) or r.request.url.path.startswith("/v3/")


def is_v2(r: httpx.Response) -> bool:
    return r.request.url.path == "/topics" or r.request.url.path.startswith("/topics/")


def error_message(r: httpx.Response) -> str:
    return str(r.json()["message"] if is_rest_proxy(r) else r.json()["error"]["message"])


def assert_401(r: httpx.Response, invalid_token: bool = False) -> None:
    assert r.status_code == 401, (r.request.method, r.request.url, r.status_code, r.text)
    assert r.headers["www-authenticate"].startswith("Bearer")
    assert ('error="invalid_token"' in r.headers["www-authenticate"]) == invalid_token
    if is_v2(r):
        assert r.headers["content-type"] == "application/vnd.kafka.v2+json"
        assert r.json()["error_code"] == 40101 and r.json()["message"]
    elif is_rest_proxy(r):
        assert r.headers["content-type"] == "application/json"
        assert r.json()["error_code"] == 401 and r.json()["message"]
    else:
        assert r.json()["error"]["code"] == "unauthenticated"


def assert_403(r: httpx.Response) -> None:
    assert r.status_code == 403, (r.request.method, r.request.url, r.status_code, r.text)
    if is_v2(r):
        assert r.headers["content-type"] == "application/vnd.kafka.v2+json"
        assert r.json()["error_code"] == 40301 and r.json()["message"]
    elif is_rest_proxy(r):
        assert r.headers["content-type"] == "application/json"
        assert r.json()["error_code"] == 403 and r.json()["message"]
    else:
        assert r.json()["error"]["code"] == "forbidden"


def assert_admitted(r: httpx.Response) -> None:
    assert r.status_code not in (401, 403), (r.request.method, r.request.url, r.status_code, r.text)


# -- every route ----------------------------------------------------------------------------------
def test_every_route_has_a_listed_access_decision(app: FastAPI) -> None:
    unlisted = [r for r in routes(app) if r not in ACCESS]
    assert not unlisted, f"new routes: add them to ACCESS in this file with who may call them: {unlisted}"


def test_every_non_public_route_refuses_a_request_without_a_valid_token(
    client: TestClient, app: FastAPI, store: TokenStore
) -> None:
    _, revoked = store.create(["admin"], name="to revoke")
    store.revoke(revoked)
    _, expired = store.create(["admin"], expires_at=datetime.now(UTC) + timedelta(hours=1))
    assert client.get("/v1/topics", headers=bearer(expired)).status_code == 200  # until it expires
    app.state.auth.now = lambda: datetime.now(UTC) + timedelta(hours=2)  # the server's clock, two hours on
    forged = revoked[:-5] + "AAAAA"  # a real id with the wrong secret
    checked = 0
    for method, path in routes(app):
        if ACCESS.get((method, path)) == "public":
            continue
        body = {"content": b"{}", "headers": {"content-type": "application/json"}}
        assert_401(client.request(method, url(path), **body))  # type: ignore[arg-type]
        for token in ("garbage", "lbk_000000000000_" + "A" * 43, forged, revoked, expired):
            r = client.request(method, url(path), content=b"{}", headers={**body["headers"], **bearer(token)})
            assert_401(r, invalid_token=True)
        r = client.request(method, url(path), headers={"Authorization": f"Basic {admin_basic()}"})
        assert_401(r)
        checked += 1
    assert checked >= 15


def admin_basic() -> str:
    import base64

    return base64.b64encode(b"admin:secret").decode()


def test_every_route_refuses_a_token_without_its_scope_and_admits_one_with_it(
    client: TestClient, app: FastAPI, store: TokenStore
) -> None:
    for method, path in routes(app):
        need = ACCESS[(method, path)]
        if need in ("public", "authenticated"):
            continue
        lacking = [s for s in NON_ADMIN if s != need]
        _, without = store.create(lacking)
        r = client.request(method, url(path), headers=bearer(without))
        assert_403(r)
        assert f'scope="{need}"' in r.headers["www-authenticate"]
        _, with_it = store.create([need])
        assert_admitted(client.request(method, url(path), headers=bearer(with_it)))


def test_any_valid_token_may_read_topic_metadata(client: TestClient, store: TokenStore) -> None:
    for scope in Scope:
        _, token = store.create([scope])
        assert client.get("/v1/topics", headers=bearer(token)).status_code == 200
        assert client.get("/v1/topics/orders", headers=bearer(token)).status_code == 200


def test_topic_allow_list_is_checked_on_every_topic_route(client: TestClient, app: FastAPI, store: TokenStore) -> None:
    for method, path in routes(app):
        need = ACCESS[(method, path)]
        if need == "public":
            continue
        scopes = [Scope.ADMIN] if need == "admin" else NON_ADMIN
        _, elsewhere = store.create(scopes, topics=["other", "logs.*"])
        _, here = store.create(scopes, topics=["ord*"])
        r = client.request(method, url(path), headers=bearer(elsewhere))
        if "{topic}" in path:
            assert_403(r)
            assert_admitted(client.request(method, url(path), headers=bearer(here)))
        elif (method, path) not in TOPIC_AWARE:
            assert_403(r)  # not about one topic: a topic-limited token may not call it at all
            assert "limited to topics" in error_message(r)


def test_topic_limited_tokens_see_and_create_only_their_topics(client: TestClient, store: TokenStore) -> None:
    _, token = store.create(["admin"], topics=["other", "new-*"])
    assert [t["name"] for t in client.get("/v1/topics", headers=bearer(token)).json()] == ["other"]
    assert_403(client.post("/v1/topics", json={"name": "elsewhere"}, headers=bearer(token)))
    assert client.post("/v1/topics", json={"name": "new-one"}, headers=bearer(token)).status_code == 201
    r = client.post("/v1/topics/orders/messages", json={"value": 1}, headers=bearer(token))
    assert_403(r)
    assert "may not use topic 'orders'" in r.json()["error"]["message"]


def test_produce_and_consume_with_scoped_tokens(client: TestClient, store: TokenStore) -> None:
    _, producer = store.create(["produce"], topics=["orders"])
    _, consumer = store.create(["consume"], topics=["orders"])
    r = client.post("/v1/topics/orders/messages", params={"ack": "table"}, json={"value": {"n": 1}},
                    headers=bearer(producer))
    assert r.status_code == 200, r.text
    r = client.get("/v1/topics/orders/partitions/{}/messages".format(r.json()["partition"]),
                   headers=bearer(consumer))
    assert r.status_code == 200 and r.json()["messages"][0]["value"] == {"n": 1}
    assert_403(client.get("/v1/topics/orders/partitions/0/messages", headers=bearer(producer)))
    assert_403(client.post("/v1/topics/orders/messages", json={"value": 1}, headers=bearer(consumer)))
    r = client.post("/topics/orders", content=b'{"records": [{"value": 1}]}', headers={
        "content-type": "application/vnd.kafka.json.v2+json", **bearer(producer)})
    assert r.status_code == 200, r.text


def test_webhook_urls_are_whole_only_for_admin_tokens(client: TestClient, store: TokenStore, admin: str) -> None:
    """A webhook URL often carries a secret of its own (a path token, a query key): a consume token
    sees the subscription and its origin, never the rest."""
    hook = "http://user:pw@127.0.0.1:9/hooks/T0/B0/s3cr3t?key=abc#frag"
    r = client.post("/v1/subscriptions", json={"name": "h", "topic": "orders", "url": hook}, headers=bearer(admin))
    assert r.status_code == 422, r.text  # credentials in a URL are refused outright
    hook = hook.replace("user:pw@", "")
    r = client.post("/v1/subscriptions", json={"name": "h", "topic": "orders", "url": hook}, headers=bearer(admin))
    assert r.status_code == 201 and r.json()["url"] == hook, r.text
    _, consumer = store.create(["consume"])
    for path in ("/v1/subscriptions", "/v1/subscriptions/h"):
        as_admin = client.get(path, headers=bearer(admin)).json()
        as_consumer = client.get(path, headers=bearer(consumer)).json()
        [whole] = [s["url"] for s in as_admin] if isinstance(as_admin, list) else [as_admin["url"]]
        [shown] = [s["url"] for s in as_consumer] if isinstance(as_consumer, list) else [as_consumer["url"]]
        assert whole == hook, path
        assert shown == "http://127.0.0.1:9/…", path
        assert "s3cr3t" not in str(as_consumer) and "abc" not in str(as_consumer)


# -- tokens ---------------------------------------------------------------------------------------
def test_tokens_are_stored_hashed(data: Path, store: TokenStore) -> None:
    token, text = store.create(["produce", "consume"], topics=["orders"], name="ci")
    token_id, secret = split_token(text) or ("", "")
    assert token_id == token.token_id and len(secret) == 43  # 256 random bits
    files = [p for p in Path(Layout(data).tokens_table).rglob("*") if p.is_file()]
    assert files
    for path in files:
        raw = path.read_bytes()
        assert secret.encode() not in raw and text.encode() not in raw, path
    rows = pads.dataset(list(map(str, Path(Layout(data).tokens_table).glob("*.parquet")))).to_table().to_pylist()
    assert [r["secret_hash"] for r in rows] == [f"sha256:{hashlib.sha256(secret.encode()).hexdigest()}"]
    assert all(secret not in str(v) for row in rows for v in row.values())
    assert store.load().authenticate(text).token_id == token.token_id


def test_token_validation_refuses_bad_input(store: TokenStore) -> None:
    with pytest.raises(Exception, match="unknown scope"):
        store.create(["write"])
    with pytest.raises(Exception, match="at least one scope"):
        store.create([])
    with pytest.raises(Exception, match="invalid topic name"):
        store.create(["produce"], topics=["../x"])
    with pytest.raises(Exception, match="every topic"):
        store.create(["produce"], topics=["*"])
    with pytest.raises(Exception, match="past"):
        store.create(["produce"], expires_at=datetime.now(UTC) - timedelta(seconds=1))
    _, text = store.create(["produce"])
    tokens = store.load()
    for bad in ("", text + "x", text[:-1], text.upper(), text.replace("lbk_", "lbx_")):
        with pytest.raises(Unauthenticated):
            tokens.authenticate(bad)


def test_revoked_token_stops_working_within_the_cache_period(data: Path, store: TokenStore) -> None:
    _, admin = store.create(["admin"])
    _, token = store.create(["produce"])
    with TestClient(build_app(settings_for(data, auth_cache_ms=300))) as client:
        client.post("/v1/topics", json={"name": "orders", "partitions": 1}, headers=bearer(admin))
        assert client.post("/v1/topics/orders/messages", json={"value": 1}, headers=bearer(token)).status_code == 200
        store.revoke(token)  # as `lakebroker tokens revoke` does, from another process
        deadline = time.monotonic() + 5
        while (r := client.post("/v1/topics/orders/messages", json={"value": 1}, headers=bearer(token))
               ).status_code == 200:
            assert time.monotonic() < deadline, "revoked token still accepted"
            time.sleep(0.05)
        assert_401(r, invalid_token=True)
        assert "revoked" in r.json()["error"]["message"]
        assert store.revoke(token).revoked_at is not None  # idempotent
        listed = {t.token_id: t.status(datetime.now(UTC)) for t in store.list()}
        assert listed[(split_token(token) or ("",))[0]] == "revoked"


def test_cli_tokens_create_prints_a_working_token(data: Path, store: TokenStore) -> None:
    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "lakebroker", "--data-dir", str(data), "tokens", *args],
                              capture_output=True, text=True, timeout=120)

    created = cli("create", "--scope", "produce", "--topic", "orders", "--name", "ci")
    assert created.returncode == 0, created.stderr
    token = created.stdout.strip()
    parts = split_token(token)
    assert parts is not None, created.stdout  # stdout is the token alone, for TOKEN=$(lakebroker tokens create ...)
    assert "shown only" in created.stderr or "cannot be shown again" in created.stderr
    listed = cli("list")
    assert listed.returncode == 0 and parts[0] in listed.stdout and "ci" in listed.stdout
    assert parts[1] not in listed.stdout and "lbk_" not in listed.stdout
    assert cli("create").returncode == 2  # no --scope
    bad = cli("create", "--scope", "write")
    assert bad.returncode == 2 and "'write' is not one of" in bad.stderr and "'produce'" in bad.stderr

    _, admin = store.create(["admin"])
    with TestClient(build_app(settings_for(data))) as client:
        for name in ("orders", "other"):
            client.post("/v1/topics", json={"name": name, "partitions": 1}, headers=bearer(admin))
        assert client.post("/v1/topics/orders/messages", json={"value": 1}, headers=bearer(token)).status_code == 200
        assert_403(client.post("/v1/topics/other/messages", json={"value": 1}, headers=bearer(token)))
        assert_403(client.get("/v1/topics/orders/partitions/0/messages", headers=bearer(token)))
        assert_403(client.delete("/v1/topics/orders", headers=bearer(token)))
        revoked = cli("revoke", parts[0])
        assert revoked.returncode == 0 and parts[0] in revoked.stdout
        assert_401(client.post("/v1/topics/orders/messages", json={"value": 1}, headers=bearer(token)), True)
    assert cli("revoke", "000000000000").returncode == 1


# -- settings -------------------------------------------------------------------------------------
def test_auth_auto_is_required_unless_bound_to_loopback(tmp_path: Path) -> None:
    for host in ("127.0.0.1", "127.0.0.2", "::1", "[::1]", "localhost"):
        assert is_loopback(host), host
    for host in ("0.0.0.0", "::", "10.0.0.5", "broker.example.com", "192.168.1.1"):
        assert not is_loopback(host), host
    with TestClient(build_app(Settings(data_dir=tmp_path / "a", deliver_in_serve=False))) as open_client:
        assert open_client.get("/v1/topics").status_code == 200  # auto on loopback: open
    with TestClient(build_app(Settings(data_dir=tmp_path / "b", host="0.0.0.0", deliver_in_serve=False))) as c:
        assert_401(c.get("/v1/topics"))  # auto on every interface: required
        assert c.get("/healthz").status_code == 200
    with TestClient(build_app(Settings(data_dir=tmp_path / "c", auth="off", host="0.0.0.0",
                                        deliver_in_serve=False))) as c:
        assert c.get("/v1/topics").status_code == 200


def test_metrics_public_setting(data: Path, store: TokenStore) -> None:
    _, scraper = store.create(["metrics"], name="prometheus")
    _, producer = store.create(["produce"])
    with TestClient(build_app(settings_for(data))) as client:
        assert_401(client.get("/metrics"))
        assert_403(client.get("/metrics", headers=bearer(producer)))
        r = client.get("/metrics", headers=bearer(scraper))
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    with TestClient(build_app(settings_for(data, metrics_public=True))) as client:
        assert client.get("/metrics").status_code == 200
        assert_401(client.get("/v1/topics"))


def test_docs_are_public_and_describe_the_auth_and_can_be_turned_off(data: Path) -> None:
    with TestClient(build_app(settings_for(data))) as client:
        schema = client.get("/openapi.json").json()
        assert client.get("/docs").status_code == 200
        assert schema["components"]["securitySchemes"]["token"] == {
            "type": "http", "scheme": "bearer", "description": schema["components"]["securitySchemes"]["token"][
                "description"]}
        for path, operations in schema["paths"].items():
            for method, operation in operations.items():
                if ACCESS.get((method.upper(), path)) == "public":
                    assert "security" not in operation, (method, path)
                else:
                    assert operation["security"] == [{"token": []}], (method, path)
                    assert {"401", "403"} <= set(operation["responses"]), (method, path)
    with TestClient(build_app(settings_for(data, docs_public=False))) as client:
        assert_401(client.get("/openapi.json"))  # gone, and unknown paths need a token too
    with TestClient(build_app(settings_for(data, docs_public=False, auth="off"))) as client:
        assert client.get("/openapi.json").status_code == 404
        assert client.get("/docs").status_code == 404


def test_an_app_with_an_undecided_router_is_refused() -> None:
    router = APIRouter()

    @router.get("/v1/new-thing")
    async def new_thing() -> dict[str, str]:
        return {}

    app = FastAPI()
    app.include_router(router)
    with pytest.raises(RuntimeError, match=r"routes without an access decision: \['GET'\] /v1/new-thing"):
        check_every_route_decided(app)
    decided = FastAPI()
    decided.include_router(router, dependencies=[require(Scope.ADMIN)])
    check_every_route_decided(decided)
    assert all(isinstance(r, APIRoute) or r.path in ("/openapi.json", "/docs", "/docs/oauth2-redirect", "/redoc")
               for r in decided.routes)


def test_unauthenticated_requests_are_refused_before_the_body_is_read(client: TestClient) -> None:
    # Malformed JSON and an unknown path get the 401, not a 422 or 404 that would tell what exists.
    r = client.post("/v1/topics", content=b"{not json", headers={"content-type": "application/json"})
    assert_401(r)
    assert_401(client.get("/v1/no-such-route"))
    assert client.get("/no-such-route", headers=bearer("garbage")).status_code == 401


# -- the CLI's remote access --------------------------------------------------------------------
def test_remote_access_sends_the_token_and_explains_a_401() -> None:
    seen: list[str | None] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request.headers.get("authorization"))
        if request.headers.get("authorization") != "Bearer lbk_0123456789ab_" + "x" * 43:
            return httpx.Response(401, json={"error": {"code": "unauthenticated", "message": "needs a token"}})
        return httpx.Response(201, json={"name": "t", "partitions": 1})

    good = RemoteAccess("http://broker", "lbk_0123456789ab_" + "x" * 43, transport=httpx.MockTransport(handler))
    assert good.create_topic("t", 1, {})["name"] == "t"
    anonymous = RemoteAccess("http://broker", transport=httpx.MockTransport(handler))
    with pytest.raises(Unauthenticated, match="set LAKEBROKER_TOKEN"):
        anonymous.create_topic("t", 1, {})
    assert seen == ["Bearer lbk_0123456789ab_" + "x" * 43, None]


def test_cli_takes_the_token_from_lakebroker_token(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    data = tmp_path / "data"
    layout = Layout(data)
    held = DataDirLock(layout.lock_file)
    assert held.try_acquire()  # as a running server would
    layout.server_file.write_text('{"url": "http://127.0.0.1:9", "pid": 1}')
    monkeypatch.setenv("LAKEBROKER_TOKEN", "lbk_0123456789ab_" + "y" * 43)
    settings = Settings(data_dir=data)
    assert "lbk_" not in repr(settings)  # a SecretStr: never printed or logged
    try:
        with broker_access(settings) as access:
            assert isinstance(access, RemoteAccess)
            assert access.client.headers["authorization"] == "Bearer lbk_0123456789ab_" + "y" * 43
    finally:
        held.release()
