"""Where a Consumer keeps its positions: the broker (a consumer group) or a store of the caller's.

A position is the *next* offset to read, per partition, as in Kafka and as the broker's
consumer_offsets table keeps it. Stores keep them per topic.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Protocol, runtime_checkable
from urllib.parse import quote

import httpx

from lakebroker_client._exceptions import RequestRefused
from lakebroker_client._http import Http, refused


@runtime_checkable
class OffsetStore(Protocol):
    """Loads and saves a consumer's positions (next offset to read) per partition of a topic."""

    def load(self, topic: str) -> dict[int, int]: ...

    def save(self, topic: str, positions: Mapping[int, int]) -> None: ...


class FileOffsetStore:
    """Positions in a local JSON file, `{"topic": {"partition": offset}}`, replaced atomically
    (temporary file, fsync, rename) on every save. One consumer process per file."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)

    def _read(self) -> dict[str, dict[str, int]]:
        try:
            data = json.loads(self.path.read_text())
        except FileNotFoundError:
            return {}
        if not isinstance(data, dict):
            raise ValueError(f"{self.path} is not an offsets file")
        return data

    def load(self, topic: str) -> dict[int, int]:
        return {int(p): int(o) for p, o in self._read().get(topic, {}).items()}

    def save(self, topic: str, positions: Mapping[int, int]) -> None:
        data = self._read()
        data[topic] = {**data.get(topic, {}), **{str(p): int(o) for p, o in positions.items()}}
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=self.path.parent, prefix=f".{self.path.name}.")
        try:
            with os.fdopen(fd, "w") as f:
                json.dump(data, f, sort_keys=True)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self.path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise


class GroupOffsetStore:
    """A consumer group's positions on the broker: `GET|POST /v1/topics/{topic}/groups/{group}/offsets`."""

    def __init__(self, http: Http, group: str) -> None:
        self.http = http
        self.group = group

    def _path(self, topic: str) -> str:
        return f"/v1/topics/{quote(topic, safe='')}/groups/{quote(self.group, safe='')}/offsets"

    def load(self, topic: str) -> dict[int, int]:
        response = self.http.request("GET", self._path(topic))
        if not response.is_success:
            raise self._refused(response, "read the offsets of group")
        return {int(p): int(o) for p, o in response.json()["offsets"].items()}

    def save(self, topic: str, positions: Mapping[int, int]) -> None:
        if not positions:
            return
        response = self.http.request("POST", self._path(topic),
                                     json={"offsets": {str(p): o for p, o in positions.items()}})
        if not response.is_success:
            raise self._refused(response, "commit the offsets of group")

    def _refused(self, response: httpx.Response, what: str) -> RequestRefused:
        error = refused(response, f"{what} {self.group!r}")
        if response.status_code == 404 and error.code == "not_found" and "does not exist" not in error.message:
            error = RequestRefused(error.message + " (this broker serves no consumer-group offsets API: "
                                   "give the Consumer an offset_store instead of a group_id)", 404, error.code)
        return error
