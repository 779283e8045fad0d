"""API tokens: `lbk_<id>_<secret>`, kept hashed in the `_system/tokens` Delta table.

A token is a 12-hex-digit id (public: listings and logs show it) and a 256-bit random
secret. Only SHA-256 of the secret is stored. A slow password hash (scrypt, argon2) exists
to make guessing a *low-entropy* password expensive; a 256-bit random secret cannot be
guessed at any hash speed, so a slow hash would only add tens of milliseconds of CPU to
every request and hand an attacker a cheap way to burn it. The stored hash carries its
algorithm (`sha256:<hex>`) so it can change later without a migration of the tokens.

Verification looks the row up by id and compares hashes with `hmac.compare_digest`, so the
time taken does not depend on how much of the secret was right. Revoked rows stay in the
table (with `revoked_at`) as the audit trail; the table's Delta history records every change.
Changes go through StateTable, so `tokens create` and `tokens revoke` are safe while a
server runs: it re-reads the table within `auth_cache_ms`.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
from collections.abc import Iterable
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any

from lakebroker.tables import delta
from lakebroker.tables.errors import InvalidRequest, NotFound, Unauthenticated
from lakebroker.tables.layout import Layout, validate_name
from lakebroker.tables.schemas import TOKENS_SCHEMA, TOKENS_SCHEMA_VERSION
from lakebroker.tables.state_table import Rows, StateTable

PREFIX = "lbk_"
_TOKEN = re.compile(r"^lbk_([0-9a-f]{12})_([A-Za-z0-9_-]{43})$")
_HASH_ALGORITHM = "sha256"


class Scope(StrEnum):
    PRODUCE = "produce"  # write messages to a topic
    CONSUME = "consume"  # read messages; see subscriptions
    METRICS = "metrics"  # scrape /metrics
    ADMIN = "admin"  # everything: topics, subscriptions, dead letters, and the other scopes


@dataclass(frozen=True)
class ApiToken:
    token_id: str
    scopes: frozenset[Scope]
    topics: tuple[str, ...] | None = None  # None: every topic. "orders.*" is a prefix, as Kafka's PREFIXED.
    name: str | None = None
    created_at: datetime = datetime(1970, 1, 1, tzinfo=UTC)
    expires_at: datetime | None = None
    revoked_at: datetime | None = None

    def has(self, scope: Scope) -> bool:
        return scope in self.scopes or Scope.ADMIN in self.scopes

    def allows_topic(self, topic: str) -> bool:
        if self.topics is None:
            return True
        return any(topic.startswith(t[:-1]) if t.endswith("*") else topic == t for t in self.topics)

    def status(self, now: datetime) -> str:
        if self.revoked_at is not None:
            return "revoked"
        if self.expires_at is not None and self.expires_at <= now:
            return "expired"
        return "active"

    def label(self) -> str:
        return f"token {self.token_id}" + (f" ({self.name})" if self.name else "")


def parse_scopes(values: Iterable[str]) -> frozenset[Scope]:
    scopes = set()
    for v in values:
        try:
            scopes.add(Scope(v.strip().lower()))
        except ValueError:
            raise InvalidRequest(f"unknown scope {v!r}: use {', '.join(s.value for s in Scope)}") from None
    if not scopes:
        raise InvalidRequest("a token needs at least one scope")
    return frozenset(scopes)


def parse_topics(values: Iterable[str]) -> tuple[str, ...] | None:
    """Topic names, or prefixes ending in `*`; none means every topic."""
    topics = []
    for v in values:
        if v == "*":
            raise InvalidRequest("'*' alone is every topic: leave out the topic list instead")
        validate_name(v[:-1] if v.endswith("*") else v)
        topics.append(v)
    return tuple(sorted(set(topics))) or None


def hash_secret(secret: str) -> str:
    return f"{_HASH_ALGORITHM}:{hashlib.sha256(secret.encode()).hexdigest()}"


_DUMMY_HASH = hash_secret("x" * 43)


def split_token(raw: str) -> tuple[str, str] | None:
    """(id, secret) of a well-formed token, else None."""
    match = _TOKEN.fullmatch(raw)
    return (match.group(1), match.group(2)) if match else None


@dataclass(frozen=True)
class TokenSet:
    """One read of the token table: what a server checks requests against."""

    tokens: dict[str, tuple[ApiToken, str]]  # id -> (token, stored hash)
    version: int | None = None

    def authenticate(self, raw: str, now: datetime | None = None) -> ApiToken:
        parts = split_token(raw)
        found = self.tokens.get(parts[0]) if parts else None
        presented = hash_secret(parts[1] if parts else raw[:64])
        # Compare even when the id is unknown, so a miss and a wrong secret take the same path.
        matches = hmac.compare_digest(presented, found[1] if found else _DUMMY_HASH)
        if found is None or not matches:
            raise Unauthenticated("the API token is not valid", invalid_token=True)
        token = found[0]
        state = token.status(now or datetime.now(UTC))
        if state != "active":
            raise Unauthenticated(f"the API token {token.token_id} is {state}", invalid_token=True)
        return token


class TokenStore:
    def __init__(self, layout: Layout) -> None:
        self.layout = layout
        self._table = StateTable(layout.tokens_table, TOKENS_SCHEMA, TOKENS_SCHEMA_VERSION)

    def load(self) -> TokenSet:
        table = delta.open_table(self._table.uri)
        if table is None:
            return TokenSet({}, None)
        rows = table.to_pyarrow_table().to_pylist()
        return TokenSet({r["token_id"]: (_from_row(r), r["secret_hash"]) for r in rows}, table.version())

    def version(self) -> int | None:
        """The table version, to tell whether a cached TokenSet is current (cheaper than a read)."""
        table = delta.open_table(self._table.uri)
        return None if table is None else table.version()

    def list(self) -> list[ApiToken]:
        return sorted((t for t, _ in self.load().tokens.values()), key=lambda t: t.created_at)

    def create(
        self,
        scopes: Iterable[str],
        topics: Iterable[str] = (),
        name: str | None = None,
        expires_at: datetime | None = None,
    ) -> tuple[ApiToken, str]:
        """A new token and its full text, which is shown only this once."""
        if name is not None and not 1 <= len(name) <= 200:
            raise InvalidRequest("a token name is 1 to 200 characters")
        if expires_at is not None and expires_at <= datetime.now(UTC):
            raise InvalidRequest("expires_at is in the past")
        secret = secrets.token_urlsafe(32)  # 256 bits, 43 characters
        token = ApiToken(token_id=secrets.token_hex(6), scopes=parse_scopes(scopes), topics=parse_topics(topics),
                         name=name, created_at=datetime.now(UTC), expires_at=expires_at)

        def change(rows: Rows) -> tuple[Rows, ApiToken]:
            if any(r["token_id"] == token.token_id for r in rows):  # 48-bit ids: a clash is all but impossible
                raise InvalidRequest("token id collision; run the command again")
            return [*rows, _to_row(token, hash_secret(secret))], token

        created = self._table.mutate(change)
        return created, f"{PREFIX}{created.token_id}_{secret}"

    def revoke(self, token_id: str) -> ApiToken:
        """Revoke by id (or by the full token text, e.g. one found in a leak). Idempotent."""
        parts = split_token(token_id)
        token_id = parts[0] if parts else token_id

        def change(rows: Rows) -> tuple[Rows, ApiToken]:
            for i, r in enumerate(rows):
                if r["token_id"] == token_id:
                    token = _from_row(r)
                    if token.revoked_at is None:
                        token = replace(token, revoked_at=datetime.now(UTC))
                    return [*rows[:i], _to_row(token, r["secret_hash"]), *rows[i + 1:]], token
            raise NotFound(f"no token with id {token_id!r}")

        return self._table.mutate(change)


def _to_row(token: ApiToken, secret_hash: str) -> dict[str, Any]:
    return {
        "token_id": token.token_id, "name": token.name, "scopes": sorted(s.value for s in token.scopes),
        "topics": list(token.topics) if token.topics is not None else None, "secret_hash": secret_hash,
        "created_at": token.created_at, "expires_at": token.expires_at, "revoked_at": token.revoked_at,
    }


def _from_row(row: dict[str, Any]) -> ApiToken:
    return ApiToken(
        token_id=row["token_id"], name=row["name"], scopes=frozenset(Scope(s) for s in row["scopes"]),
        topics=tuple(row["topics"]) if row["topics"] is not None else None, created_at=row["created_at"],
        expires_at=row["expires_at"], revoked_at=row["revoked_at"],
    )
