"""JSON responses rendered by orjson: hand-built bodies on the hot path skip pydantic."""

from __future__ import annotations

from typing import Any

import orjson
from starlette.responses import JSONResponse


class JSONBytes(JSONResponse):
    def render(self, content: Any) -> bytes:
        return orjson.dumps(content)
