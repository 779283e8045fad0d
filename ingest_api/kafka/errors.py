"""Kafka's error codes for lakebroker's errors, and Kafka's view of a token's topics: what every
API of the listener answers with when a rule of the core, the tables or the token refuses."""

from __future__ import annotations

from kio.schema.errors import ErrorCode

from lakebroker.ingest_api.auth import check_topic
from lakebroker.ingest_api.kafka import record_batches
from lakebroker.ingest_api.not_here import NoOwnerYet, NotOwner
from lakebroker.ingest_api.sequences import OutOfOrderSequence
from lakebroker.tables.errors import (
    Backpressure,
    Forbidden,
    InvalidRequest,
    NoSuchPartition,
    NotFound,
    StorageUnavailable,
    TooLarge,
    Unauthenticated,
)
from lakebroker.tables.tokens import ApiToken


def error_code(exc: BaseException) -> ErrorCode:
    if isinstance(exc, NotOwner | NoOwnerYet):
        return ErrorCode.not_leader_or_follower
    if isinstance(exc, NotFound | NoSuchPartition):
        return ErrorCode.unknown_topic_or_partition
    if isinstance(exc, Forbidden):
        return ErrorCode.topic_authorization_failed
    if isinstance(exc, Unauthenticated):
        return ErrorCode.sasl_authentication_failed
    if isinstance(exc, record_batches.UnsupportedCodec):
        return ErrorCode.unsupported_compression_type
    if isinstance(exc, record_batches.OldMagic):
        return ErrorCode.unsupported_for_message_format
    if isinstance(exc, record_batches.CorruptBatch):
        return ErrorCode.corrupt_message
    if isinstance(exc, TooLarge):
        return ErrorCode.message_too_large
    if isinstance(exc, Backpressure):
        return ErrorCode.request_timed_out  # retriable: the client backs off (throttle_time) and sends again
    if isinstance(exc, OutOfOrderSequence):
        return ErrorCode.out_of_order_sequence_number
    if isinstance(exc, InvalidRequest):
        return ErrorCode.invalid_record
    if isinstance(exc, StorageUnavailable):
        return ErrorCode.kafka_storage_error
    return ErrorCode.unknown_server_error


def may_see(principal: ApiToken, topic: str) -> bool:
    try:
        check_topic(principal, topic)
    except Forbidden:
        return False
    return True
