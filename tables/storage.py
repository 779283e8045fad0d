"""Where the tables live: a local directory or an S3 bucket prefix, and how each engine reaches it.

A table root is a local path or `s3://bucket/prefix` (`s3a://` is the same place, spelled as
Hadoop's S3A filesystem wants it). Everything that opens a table asks this module for the options
of its URI, so delta-rs, pyarrow and Spark all agree on endpoint, region and credentials.

Endpoint, region and credentials come from the usual AWS variables (AWS_ENDPOINT_URL,
AWS_REGION, AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN). They are read when a
table is opened and never stored in Settings, so nothing that shows the settings can show them.

Commits on S3 are put-if-absent on both sides: delta-rs with object_store's conditional put
(`If-None-Match: *`, storage option `conditional_put=etag`), Spark with
spark_pipeline/java/.../S3ConditionalLogStore.java (S3A's conditional create). No lock service
is needed, and no writer can overwrite another's commit.
"""

from __future__ import annotations

import contextlib
import functools
import os
import shutil
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import unquote, urlsplit
from urllib.request import url2pathname

from lakebroker.tables.errors import InvalidRequest

S3_SCHEMES = ("s3", "s3a")
DEFAULT_REGION = "us-east-1"


def is_s3(uri: str) -> bool:
    return urlsplit(uri).scheme in S3_SCHEMES


def delta_rs_reads(uri: str) -> bool:
    """A local path, file: or S3 URI: delta-rs opens it here (with `delta_options`). Spark may also
    reach other schemes (hdfs:, gs:, abfss:) through its Hadoop filesystems."""
    return urlsplit(uri).scheme in ("", "file", *S3_SCHEMES)


def join(root: str, *parts: str) -> str:
    """A child location of a root: a URI keeps its scheme, a local path stays a plain path."""
    if is_s3(root):
        return "/".join([root.rstrip("/"), *parts])
    return str(Path(root).joinpath(*parts))


def parse_root(value: str) -> str:
    """Validate a table root: a local path (made absolute) or s3://bucket[/prefix] (no trailing
    slash). Credentials in the URI are refused: they would end up in logs and job arguments."""
    text = value.strip()
    parts = urlsplit(text)
    if parts.scheme in ("", "file"):
        path = parts.path if parts.scheme == "file" else text
        return str(Path(path).expanduser().resolve())
    if parts.scheme not in S3_SCHEMES:
        raise InvalidRequest(f"bad table root {value!r}: use a local path or s3://bucket/prefix")
    if parts.username or parts.password:
        raise InvalidRequest("bad table root: put credentials in AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY, "
                             "not in the URI")
    if not parts.hostname or parts.query or parts.fragment:
        raise InvalidRequest(f"bad table root {value!r}: expected s3://bucket/prefix")
    prefix = parts.path.strip("/")
    return f"{parts.scheme}://{parts.netloc}" + (f"/{prefix}" if prefix else "")


def spark_uri(uri: str) -> str:
    """The same location as Hadoop reaches it: s3:// is served by the S3A filesystem."""
    return "s3a://" + uri[len("s3://"):] if uri.startswith("s3://") else uri


def bucket_and_key(uri: str) -> tuple[str, str]:
    parts = urlsplit(uri)
    return parts.netloc, parts.path.strip("/")


@dataclass(frozen=True)
class S3Endpoint:
    """The S3 service and credentials, from the environment. Deliberately no __repr__ of secrets."""

    endpoint: str | None
    region: str
    access_key: str | None
    secret_key: str | None
    session_token: str | None

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> S3Endpoint:
        e = os.environ if env is None else env
        endpoint = e.get("AWS_ENDPOINT_URL_S3") or e.get("AWS_ENDPOINT_URL") or None
        return cls(endpoint=endpoint.rstrip("/") if endpoint else None,
                   region=e.get("AWS_REGION") or e.get("AWS_DEFAULT_REGION") or DEFAULT_REGION,
                   access_key=e.get("AWS_ACCESS_KEY_ID") or None, secret_key=e.get("AWS_SECRET_ACCESS_KEY") or None,
                   session_token=e.get("AWS_SESSION_TOKEN") or None)

    def __repr__(self) -> str:
        return f"S3Endpoint(endpoint={self.endpoint!r}, region={self.region!r})"

    @property
    def plain_http(self) -> bool:
        return bool(self.endpoint and self.endpoint.startswith("http://"))


def delta_options(uri: str) -> dict[str, str] | None:
    """delta-rs storage options for a table URI (None for a local path)."""
    if not is_s3(uri):
        return None
    s3 = S3Endpoint.from_env()
    options = {
        "AWS_REGION": s3.region,
        # Commits are PUT with If-None-Match: * (put-if-absent), which S3 and MinIO enforce.
        "conditional_put": "etag",
    }
    if s3.endpoint:
        options["AWS_ENDPOINT_URL"] = s3.endpoint
        options["AWS_ALLOW_HTTP"] = "true" if s3.plain_http else "false"
    for key, value in (("AWS_ACCESS_KEY_ID", s3.access_key), ("AWS_SECRET_ACCESS_KEY", s3.secret_key),
                       ("AWS_SESSION_TOKEN", s3.session_token)):
        if value:
            options[key] = value
    return options


def filesystem(uri: str) -> tuple[object, str]:
    """A pyarrow filesystem and the path of `uri` inside it (bucket/key for S3). `uri` may also be
    a file: URI, as delta-rs gives a local table's."""
    import pyarrow.fs as pafs

    if not is_s3(uri):
        parts = urlsplit(uri)
        return pafs.LocalFileSystem(), url2pathname(parts.path) if parts.scheme == "file" else str(Path(uri))
    bucket, key = bucket_and_key(uri)
    return _s3_filesystem(S3Endpoint.from_env()), f"{bucket}/{key}".rstrip("/")


@functools.lru_cache(maxsize=8)
def _s3_filesystem(s3: S3Endpoint) -> object:
    """One client per endpoint and credentials: building one costs milliseconds, and log tails
    open a table per partition."""
    import pyarrow.fs as pafs

    kwargs: dict[str, object] = {"region": s3.region}
    if s3.endpoint:
        parts = urlsplit(s3.endpoint)
        kwargs.update(endpoint_override=parts.netloc + parts.path, scheme=parts.scheme or "https")
    if s3.access_key and s3.secret_key:
        kwargs.update(access_key=s3.access_key, secret_key=s3.secret_key, session_token=s3.session_token)
    return pafs.S3FileSystem(**kwargs)


def remove_tree(uri: str) -> None:
    """Delete a table (or any directory) and everything under it; a missing one is fine."""
    import pyarrow.fs as pafs

    if not is_s3(uri):
        shutil.rmtree(uri, ignore_errors=True)
        return
    fs, path = filesystem(uri)
    assert isinstance(fs, pafs.FileSystem)
    with contextlib.suppress(FileNotFoundError):
        fs.delete_dir(path)


def existing(uri: str, paths: list[str]) -> list[str]:
    """Those of `paths` (relative to `uri`, as a Delta log names them) that exist: a stat each
    locally, a HEAD each on S3."""
    import pyarrow.fs as pafs

    if not paths:
        return []
    fs, root = filesystem(uri)
    assert isinstance(fs, pafs.FileSystem)
    infos = fs.get_file_info([f"{root}/{unquote(path)}" for path in paths])
    return [path for path, info in zip(paths, infos, strict=True) if info.type != pafs.FileType.NotFound]


def child_names(uri: str) -> list[str]:
    """Names of the directories directly under `uri` (none if it does not exist)."""
    import pyarrow.fs as pafs

    fs, path = filesystem(uri)
    assert isinstance(fs, pafs.FileSystem)
    infos = fs.get_file_info(pafs.FileSelector(path, allow_not_found=True))
    return sorted(i.base_name for i in infos if i.type == pafs.FileType.Directory)


def read_small(uri: str) -> bytes | None:
    """A small file's bytes, or None if it does not exist."""
    import pyarrow.fs as pafs

    fs, path = filesystem(uri)
    assert isinstance(fs, pafs.FileSystem)
    try:
        with fs.open_input_stream(path) as f:
            return bytes(f.read())
    except FileNotFoundError:
        return None


def write_small(uri: str, data: bytes) -> None:
    """Replace a small file whole: a reader sees the old bytes or the new, never a torn file (a
    rename locally; an S3 object appears only once its upload completes)."""
    import pyarrow.fs as pafs

    fs, path = filesystem(uri)
    assert isinstance(fs, pafs.FileSystem)
    if is_s3(uri):
        with fs.open_output_stream(path) as f:
            f.write(data)
        return
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    temp = target.with_name(f".{target.name}.tmp")
    temp.write_bytes(data)
    temp.replace(target)
