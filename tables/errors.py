"""The error tree shared by every lakebroker package.

    LakebrokerError
     ├── InvalidRequest          bad input a person can fix (400)
     │    ├── InvalidName        a topic or group name that is not allowed
     │    ├── NoSuchPartition    a partition number the topic does not have
     │    ├── InvalidWebhookUrl  a webhook URL that is malformed or points inside the network (422)
     │    └── InvalidFilter      a subscription filter that means nothing (422, tables/filters.py)
     ├── Unauthenticated         no token, or an unknown, revoked or expired one (401)
     ├── Forbidden               a valid token without the scope or the topic (403)
     ├── NotFound                an unknown topic, partition or subscription (404)
     ├── AlreadyExists           a create that names something that exists (409)
     ├── OutOfRange              an offset outside [log start, log end] (416)
     ├── RequestTimeout          a request head or body that did not arrive in time (408)
     ├── TooLarge                a message or body over its limit (413)
     │    └── MessageTooLarge    one message over its topic's max_message_bytes
     ├── HeadersTooLarge         a request head over the server's bound (431)
     ├── Backpressure            the WAL backlog is over its bound (429)
     ├── StorageUnavailable      the disk is full or failing (507)
     ├── TableUnreadable         a topic whose table's log cannot be read: that topic only (503)
     └── OffsetGap               offsets missing inside a partition that is not key-compacted (500)

Each class carries the HTTP status it maps to, so the API maps errors in one place
and the CLI prints the same one-line message.
"""

from __future__ import annotations


class LakebrokerError(Exception):
    status: int = 500
    code: str = "internal"

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class InvalidRequest(LakebrokerError):
    status = 400
    code = "invalid_request"


class NoSuchPartition(InvalidRequest):
    def __init__(self, message: str, partition: int, partitions: int) -> None:
        super().__init__(message)
        self.partition = partition
        self.partitions = partitions  # the topic's count


class InvalidName(InvalidRequest):
    code = "invalid_name"


class InvalidWebhookUrl(InvalidRequest):
    status = 422  # a field that fails validation, as the request model's own checks answer
    code = "invalid_webhook_url"


class Unauthenticated(LakebrokerError):
    status = 401
    code = "unauthenticated"

    def __init__(self, message: str, invalid_token: bool = False) -> None:
        super().__init__(message)
        self.invalid_token = invalid_token  # a token was sent but is unknown, revoked or expired


class Forbidden(LakebrokerError):
    status = 403
    code = "forbidden"

    def __init__(self, message: str, scope: str | None = None) -> None:
        super().__init__(message)
        self.scope = scope  # the scope that was missing, for WWW-Authenticate


class NotFound(LakebrokerError):
    status = 404
    code = "not_found"


class AlreadyExists(LakebrokerError):
    status = 409
    code = "already_exists"


class OutOfRange(LakebrokerError):
    status = 416
    code = "offset_out_of_range"


class RequestTimeout(LakebrokerError):
    status = 408
    code = "request_timeout"


class TooLarge(LakebrokerError):
    status = 413
    code = "too_large"


class MessageTooLarge(TooLarge):
    def __init__(self, message: str, size: int, limit: int) -> None:
        super().__init__(message)
        self.size = size  # key, value and headers
        self.limit = limit


class HeadersTooLarge(LakebrokerError):
    status = 431
    code = "headers_too_large"


class Backpressure(LakebrokerError):
    status = 429
    code = "backpressure"

    def __init__(self, message: str, retry_after_s: float) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class StorageUnavailable(LakebrokerError):
    status = 507
    code = "storage_unavailable"


class TableUnreadable(LakebrokerError):
    """A topic's table whose log cannot be read (damaged): that topic is unavailable, others are not."""

    status = 503
    code = "topic_unavailable"


class OffsetGap(LakebrokerError):
    """Offsets are dense: a hole is only legitimate where key compaction removed rows.

    Anywhere else it means damage (or a bug), so it is refused or reported, never skipped."""

    status = 500
    code = "offset_gap"
