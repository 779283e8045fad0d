from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Path, Request

from lakebroker.ingest_api.broker import Broker
from lakebroker.tables.layout import NAME_PATTERN


async def get_broker(request: Request) -> Broker:
    # async: a plain def would be run through the thread pool on every request
    # (docs/decisions/0002-single-produce-answered-below-asgi.md).
    broker: Broker = request.app.state.broker
    return broker


BrokerDep = Annotated[Broker, Depends(get_broker)]

# A `{topic}` path parameter. The pattern is documentation for clients and fuzzers: a name that
# breaks it still reaches the route, which answers 400 invalid_name (tables/layout.validate_name).
TopicPath = Annotated[str, Path(
    description="Topic name: 1-128 letters, digits, '.', '_' or '-', starting with a letter or digit.",
    json_schema_extra={"pattern": NAME_PATTERN, "maxLength": 128},
)]
