"""`lakebroker tokens create|list|revoke`: API tokens, managed on the data dir itself.

These commands need the data dir, not a token: whoever can write the data dir owns the broker
anyway. A running server sees a change within `auth_cache_ms`.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Annotated

import typer

from lakebroker.console import err, out, print_rows
from lakebroker.tables.layout import Layout
from lakebroker.tables.settings import Settings
from lakebroker.tables.tokens import Scope, TokenStore


def register(app: typer.Typer, settings: Callable[[], Settings], fail: Callable[[str, int], typer.Exit]) -> None:
    tokens_app = typer.Typer(no_args_is_help=True, help="Create, list and revoke API tokens.")
    app.add_typer(tokens_app, name="tokens")

    def store() -> TokenStore:
        return TokenStore(Layout.of(settings()))

    @tokens_app.command("create")
    def create(
        scope: Annotated[list[Scope] | None, typer.Option(
            "--scope", "-s", help="Repeatable (admin implies the others).")] = None,
        topic: Annotated[list[str] | None, typer.Option(
            "--topic", "-t", help="Repeatable: limit the token to these topics; 'name*' is a prefix. "
            "Default: every topic.")] = None,
        name: Annotated[str | None, typer.Option("--name", "-n", help="What the token is for.")] = None,
        expires_in_days: Annotated[float | None, typer.Option(min=0.001, help="Expire after this many days.")] = None,
    ) -> None:
        """Create a token and print it on stdout. It is shown only this once; the table keeps a hash."""
        if not scope:
            raise fail("give at least one --scope (produce, consume, metrics or admin)", 2)
        expires = datetime.now(UTC) + timedelta(days=expires_in_days) if expires_in_days else None
        token, text = store().create(scope, topic or (), name=name, expires_at=expires)
        print(text)
        where = f"topics {', '.join(token.topics)}" if token.topics else "every topic"
        until = f", expires {token.expires_at:%Y-%m-%d %H:%M} UTC" if token.expires_at else ""
        err.print(f"created {token.label()}: {', '.join(sorted(token.scopes))} on {where}{until}. "
                  "Store it now: it cannot be shown again.", highlight=False, markup=False, soft_wrap=True)

    @tokens_app.command("list")
    def list_tokens() -> None:
        """List tokens (never their secrets)."""
        now = datetime.now(UTC)
        print_rows(
            ["id", "name", "scopes", "topics", "created_at", "expires_at", "status"],
            [[t.token_id, t.name, ",".join(sorted(t.scopes)), ",".join(t.topics) if t.topics else "*",
              f"{t.created_at:%Y-%m-%d %H:%M:%S}", f"{t.expires_at:%Y-%m-%d %H:%M:%S}" if t.expires_at else None,
              t.status(now)] for t in store().list()],
        )

    @tokens_app.command("revoke")
    def revoke(token_id: Annotated[str, typer.Argument(help="The token id (or the whole token).")]) -> None:
        """Revoke a token; servers refuse it within auth_cache_ms."""
        token = store().revoke(token_id)
        out.print(f"revoked {token.label()}", highlight=False, markup=False)
