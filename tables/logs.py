"""The one place that configures logging, for `serve`, `deliver` and the Spark jobs.

`log_format=text` (default) writes `time LEVEL logger: message` lines; `log_format=json` writes
one JSON object per line (structlog's renderer over the standard `logging` records, so uvicorn's,
Spark's py4j and our own loggers all come out the same way): `timestamp` (ISO 8601, UTC),
`level`, `logger`, `message`, `exception` when there is one, and for uvicorn's access log also
`client`, `method`, `path`, `http_version` and `status`.
"""

from __future__ import annotations

import logging
import os
import re
import sys
from collections.abc import MutableMapping
from typing import Any, NoReturn

import structlog

from lakebroker.tables.settings import LogFormat, Settings

TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
ACCESS_LOGGER = "uvicorn.access"
_ACCESS_FIELDS = ("client", "method", "path", "http_version", "status")


def _access_fields(logger: Any, method: str, event: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
    """uvicorn logs each request as `'%s - "%s %s HTTP/%s" %d'` with those five args: keep them as fields."""
    args = event.pop("positional_args", ())
    record = event.get("_record")
    if record is not None and record.name == ACCESS_LOGGER and isinstance(args, tuple) \
            and len(args) == len(_ACCESS_FIELDS):
        event.update(zip(_ACCESS_FIELDS, args, strict=True))
    return event


_SECRET_PARAM = re.compile(r"([?&][^=&#]*(?:token|secret|password|signature)[^=&#]*=)[^&#]*", re.IGNORECASE)


def hide_query_secrets(path: str) -> str:
    """`path` with the values of query parameters that name a credential replaced (the dashboard's
    `/?token=lbk_...` would otherwise land in the access log)."""
    return _SECRET_PARAM.sub(r"\1REDACTED", path) if "?" in path else path


class _HideQuerySecrets(logging.Filter):
    """On uvicorn's access logger: its third argument is the request path with its query string."""

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args
        if isinstance(args, tuple) and len(args) == len(_ACCESS_FIELDS) and isinstance(args[2], str):
            record.args = (*args[:2], hide_query_secrets(args[2]), *args[3:])
        return True


def json_formatter() -> logging.Formatter:
    return structlog.stdlib.ProcessorFormatter(
        pass_foreign_args=True,  # for _access_fields
        foreign_pre_chain=[
            structlog.stdlib.add_log_level,
            structlog.stdlib.add_logger_name,
            structlog.processors.TimeStamper(fmt="iso", utc=True, key="timestamp"),
            _access_fields,
        ],
        processors=[
            structlog.stdlib.ProcessorFormatter.remove_processors_meta,
            structlog.processors.format_exc_info,
            structlog.processors.EventRenamer("message"),
            structlog.processors.JSONRenderer(default=str),
        ],
    )


def configure_logging(settings: Settings) -> None:
    """Send every log record to stderr in `log_format`, at `log_level` and above (replacing earlier
    handlers). `access_log` turns uvicorn's per-request log on; off, its logger drops everything."""
    access_log = settings.access_log
    handler = logging.StreamHandler(sys.stderr)
    json = settings.log_format is LogFormat.JSON
    handler.setFormatter(json_formatter() if json else logging.Formatter(TEXT_FORMAT))
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(settings.log_level.upper())
    logging.getLogger("py4j").setLevel(logging.WARNING)  # one line per JVM call at INFO
    for name in ("uvicorn", "uvicorn.error"):  # their records reach the root handler, nothing else
        logging.getLogger(name).handlers.clear()
        logging.getLogger(name).propagate = True
    access = logging.getLogger(ACCESS_LOGGER)
    access.handlers.clear()
    if not any(isinstance(f, _HideQuerySecrets) for f in access.filters):
        access.addFilter(_HideQuerySecrets())
    access.propagate = access_log
    access.disabled = not access_log


def exit_without_teardown(code: int) -> NoReturn:
    """End a process whose work is done: flush its logs and output, then exit without the
    interpreter's native teardown, where Arrow's C++ thread pools can abort the process ("terminate
    called without an active exception", apache/arrow#34314), as in `lakebroker compact` and serve's
    delivery process after their work is done."""
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
