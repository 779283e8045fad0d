"""Kafka's admin requests over the broker's topics: CreateTopics, DeleteTopics, CreatePartitions,
DescribeConfigs and IncrementalAlterConfigs (a topic's `retention.ms`, `retention.bytes`,
`cleanup.policy`, `max.message.bytes` and `delete.retention.ms`), and DescribeCluster.

They go through the broker's own topic calls and the HTTP API's topic models (their bounds and
defaults), under the HTTP API's rule: changing a topic takes the `admin` scope and the topic among
the token's; describing one, a token that may see it."""

from __future__ import annotations

import uuid
from datetime import timedelta
from typing import Any

from kio.schema.errors import ErrorCode
from pydantic import ValidationError

from lakebroker.ingest_api.auth import check_scope, check_topic
from lakebroker.ingest_api.kafka import wire
from lakebroker.ingest_api.kafka.brokers import Brokers
from lakebroker.ingest_api.kafka.errors import error_code, may_see
from lakebroker.ingest_api.node_identity import CLUSTER_ID
from lakebroker.ingest_api.produce_core import ProduceCore
from lakebroker.ingest_api.schemas import TopicCreate, TopicUpdate
from lakebroker.tables.errors import AlreadyExists, Forbidden, InvalidName, InvalidRequest, LakebrokerError
from lakebroker.tables.tokens import ApiToken, Scope
from lakebroker.tables.topics import TopicConfig

CREATE_TOPICS, DELETE_TOPICS, DESCRIBE_CONFIGS, CREATE_PARTITIONS = 19, 20, 32, 37
INCREMENTAL_ALTER_CONFIGS, DESCRIBE_CLUSTER = 44, 60
ADMIN_VERSIONS = {CREATE_TOPICS: (2, 7), DELETE_TOPICS: (1, 6), DESCRIBE_CONFIGS: (1, 4), CREATE_PARTITIONS: (0, 3),
                  INCREMENTAL_ALTER_CONFIGS: (0, 1), DESCRIBE_CLUSTER: (0, 1)}
ADMIN_NAMES = {CREATE_TOPICS: "CreateTopics", DELETE_TOPICS: "DeleteTopics", DESCRIBE_CONFIGS: "DescribeConfigs",
               CREATE_PARTITIONS: "CreatePartitions", INCREMENTAL_ALTER_CONFIGS: "IncrementalAlterConfigs",
               DESCRIBE_CLUSTER: "DescribeCluster"}
TOPIC_RESOURCE, BROKER_RESOURCE = 2, 4
SET, DELETE, APPEND, SUBTRACT = 0, 1, 2, 3  # IncrementalAlterConfigs' operations
DYNAMIC_TOPIC_CONFIG = 1  # a config's source, as DescribeConfigs names it
# Kafka's topic configs and the topic fields they are; -1 is Kafka's "no limit" for the two limits.
CONFIGS = {"retention.ms": "retention_ms", "retention.bytes": "retention_bytes", "cleanup.policy": "cleanup_policy",
           "max.message.bytes": "max_message_bytes", "delete.retention.ms": "tombstone_retention_ms"}
CONFIGS_BY_FIELD = {field: name for name, field in CONFIGS.items()}
UNLIMITED = frozenset({"retention_ms", "retention_bytes"})
# Configs that tools set when they create topics and that mean nothing here (segments, replicas,
# the log's flushes and compaction lags): accepted and not kept.
IGNORED = frozenset({
    "min.insync.replicas", "unclean.leader.election.enable", "segment.bytes", "segment.ms", "segment.jitter.ms",
    "segment.index.bytes", "index.interval.bytes", "flush.messages", "flush.ms", "file.delete.delay.ms",
    "preallocate", "compression.type", "min.compaction.lag.ms", "max.compaction.lag.ms",
    "min.cleanable.dirty.ratio", "message.downconversion.enable"})
_ZERO = timedelta(0)


class InvalidConfig(InvalidRequest):
    """Kafka's INVALID_CONFIG."""


class InvalidPartitions(InvalidRequest):
    """Kafka's INVALID_PARTITIONS."""


class AdminRequests:
    def __init__(self, core: ProduceCore, brokers: Brokers) -> None:
        """`brokers`: the cluster's brokers, as DescribeCluster lists them."""
        self.core = core
        self.brokers = brokers

    async def answer(self, principal: ApiToken, request: wire.Request) -> bytes:
        schema = wire.response_schema(request.api_key, request.version)
        body = request.body
        if request.api_key == CREATE_TOPICS:
            out = wire.build(schema, throttle_time=_ZERO, topics=tuple(
                [await self._create(schema, principal, t, body.validate_only) for t in body.topics]))
        elif request.api_key == DELETE_TOPICS:
            out = wire.build(schema, throttle_time=_ZERO, responses=tuple(
                [await self._delete(schema, principal, t) for t in _deleted(body, request.version)]))
        elif request.api_key == CREATE_PARTITIONS:
            out = wire.build(schema, throttle_time=_ZERO, results=tuple(
                [await self._grow(schema, principal, t, body.validate_only) for t in body.topics]))
        elif request.api_key == DESCRIBE_CONFIGS:
            out = wire.build(schema, throttle_time=_ZERO, results=tuple(
                self._describe(schema, principal, r) for r in body.resources))
        elif request.api_key == INCREMENTAL_ALTER_CONFIGS:
            out = wire.build(schema, throttle_time=_ZERO, responses=tuple(
                [await self._alter(schema, principal, r, body.validate_only) for r in body.resources]))
        else:
            out = self._cluster(schema)
        return wire.frame_of(request, out)

    # -- topics -------------------------------------------------------------------------------
    async def _create(self, schema: Any, principal: ApiToken, asked: Any, validate_only: bool) -> Any:
        entry = wire.nested(schema, "CreatableTopicResult")
        try:
            check_scope(principal, Scope.ADMIN)
            check_topic(principal, asked.name)
            partitions = len(asked.assignments) if asked.assignments else asked.num_partitions
            if partitions != -1 and partitions < 1:
                raise InvalidPartitions(f"a topic has at least one partition, not {partitions}")
            if asked.replication_factor not in (-1,) and asked.replication_factor < 1:
                raise InvalidRequest(f"replication factor {asked.replication_factor}: give -1 or at least 1 (a "
                                     "topic's durability is its table's storage)")
            fields = _fields({c.name: c.value for c in asked.configs})
            spec = _model(TopicCreate, name=asked.name, partitions=None if partitions == -1 else partitions, **fields)
            settings = self.core.broker.settings
            topic = spec.topic(settings.default_partitions, settings.default_max_message_bytes)
            if asked.name in self.core.broker.topics:
                raise AlreadyExists(f"topic {asked.name!r} already exists")
            if not validate_only:
                topic = await self.core.broker.create_topic(topic)
        except LakebrokerError as exc:
            return wire.build(entry, name=asked.name, topic_id=uuid.UUID(int=0), error_code=_code(exc),
                              error_message=exc.message, num_partitions=-1, replication_factor=-1, configs=None,
                              topic_config_error_code=0)
        configs = None
        if wire.has_nested(schema, "CreatableTopicConfigs"):  # v5 and later answer with the topic's configs
            config = wire.nested(schema, "CreatableTopicConfigs")
            configs = tuple(wire.build(config, name=name, value=value, read_only=False,
                                       config_source=DYNAMIC_TOPIC_CONFIG, is_sensitive=False)
                            for name, value in _configs(topic))
        return wire.build(entry, name=topic.name, topic_id=_topic_uuid(topic), error_code=ErrorCode.none,
                          error_message=None, num_partitions=topic.partitions, replication_factor=1,
                          topic_config_error_code=0, configs=configs)

    async def _delete(self, schema: Any, principal: ApiToken, asked: tuple[str | None, uuid.UUID | None]) -> Any:
        entry = wire.nested(schema, "DeletableTopicResult")
        name, topic_id = asked
        try:
            check_scope(principal, Scope.ADMIN)
            if name is None:  # named by its id (v6)
                name = next((t.name for t in self.core.broker.topics.values() if _topic_uuid(t) == topic_id), None)
                if name is None:
                    return wire.build(entry, name=None, topic_id=topic_id, error_code=ErrorCode.unknown_topic_id,
                                      error_message=f"no topic has the id {topic_id}")
            check_topic(principal, name)
            topic = self.core.broker.topic(name)
            await self.core.broker.delete_topic(name)
        except LakebrokerError as exc:
            return wire.build(entry, name=name, topic_id=topic_id or uuid.UUID(int=0), error_code=_code(exc),
                              error_message=exc.message)
        return wire.build(entry, name=name, topic_id=_topic_uuid(topic), error_code=ErrorCode.none, error_message=None)

    async def _grow(self, schema: Any, principal: ApiToken, asked: Any, validate_only: bool) -> Any:
        entry = wire.nested(schema, "CreatePartitionsTopicResult")
        try:
            check_scope(principal, Scope.ADMIN)
            check_topic(principal, asked.name)
            topic = self.core.broker.topic(asked.name)
            if asked.count <= topic.partitions:
                raise InvalidPartitions(f"topic {asked.name!r} has {topic.partitions} partitions: a topic's "
                                        f"partitions can only grow, and {asked.count} is not more")
            _model(TopicUpdate, partitions=asked.count)
            if not validate_only:
                await self.core.broker.update_topic(asked.name, partitions=asked.count)
        except LakebrokerError as exc:
            return wire.build(entry, name=asked.name, error_code=_code(exc), error_message=exc.message)
        return wire.build(entry, name=asked.name, error_code=ErrorCode.none, error_message=None)

    # -- configs ------------------------------------------------------------------------------
    def _describe(self, schema: Any, principal: ApiToken, resource: Any) -> Any:
        entry = wire.nested(schema, "DescribeConfigsResult")
        config = wire.nested(schema, "DescribeConfigsResourceResult")

        def result(error: ErrorCode, message: str | None, configs: tuple[Any, ...] = ()) -> Any:
            return wire.build(entry, error_code=error, error_message=message, resource_type=resource.resource_type,
                              resource_name=resource.resource_name, configs=configs)

        if resource.resource_type == BROKER_RESOURCE:
            return result(ErrorCode.none, None)  # a broker's settings are lakebroker's own, not Kafka's
        if resource.resource_type != TOPIC_RESOURCE:
            return result(ErrorCode.invalid_request, "only topic and broker resources are described")
        name = resource.resource_name
        topic = self.core.broker.topics.get(name)
        if topic is None or not may_see(principal, name):
            return result(ErrorCode.unknown_topic_or_partition if topic is None else
                          ErrorCode.topic_authorization_failed, f"topic {name!r}")
        keys = resource.configuration_keys
        return result(ErrorCode.none, None, tuple(
            wire.build(config, name=key, value=value, read_only=False, config_source=DYNAMIC_TOPIC_CONFIG,
                       is_sensitive=False, synonyms=(), config_type=0, documentation=None)
            for key, value in _configs(topic) if keys is None or key in keys))

    async def _alter(self, schema: Any, principal: ApiToken, resource: Any, validate_only: bool) -> Any:
        entry = wire.nested(schema, "AlterConfigsResourceResponse")
        name = resource.resource_name
        try:
            if resource.resource_type != TOPIC_RESOURCE:
                raise InvalidRequest("only a topic's configs can be altered here")
            check_scope(principal, Scope.ADMIN)
            check_topic(principal, name)
            topic = self.core.broker.topic(name)
            changes = _altered(topic, resource.configs)
            _model(TopicUpdate, **changes)
            if changes and not validate_only:
                await self.core.broker.update_topic(name, **changes)
        except LakebrokerError as exc:
            return wire.build(entry, error_code=_code(exc), error_message=exc.message,
                              resource_type=resource.resource_type, resource_name=name)
        return wire.build(entry, error_code=ErrorCode.none, error_message=None, resource_type=resource.resource_type,
                          resource_name=name)

    def _cluster(self, schema: Any) -> Any:
        entry = wire.nested(schema, "DescribeClusterBroker")
        brokers = tuple(wire.build(entry, broker_id=b.id, host=b.host, port=b.port, rack=None)
                        for b in self.brokers.live())
        # Any node changes topics (they live in the shared topic store): the one asked is the controller.
        return wire.build(schema, throttle_time=_ZERO, error_code=ErrorCode.none, error_message=None,
                          cluster_id=CLUSTER_ID, controller_id=self.brokers.own_id, brokers=brokers,
                          cluster_authorized_operations=-2147483648)


def _deleted(body: Any, version: int) -> list[tuple[str | None, uuid.UUID | None]]:
    """The topics a DeleteTopics names: by name (v1-5), or by name or id (v6)."""
    if version < 6:
        return [(name, None) for name in body.topic_names]
    return [(t.name, None if t.topic_id is None or t.topic_id.int == 0 else t.topic_id) for t in body.topics]


def _topic_uuid(topic: TopicConfig) -> uuid.UUID:
    return uuid.UUID(hex=topic.topic_id[:32].ljust(32, "0"))


def _configs(topic: TopicConfig) -> list[tuple[str, str]]:
    """The topic's configs under Kafka's names, as Kafka writes their values."""
    out = []
    for name, field in CONFIGS.items():
        value = getattr(topic, field)
        out.append((name, "-1" if value is None else str(getattr(value, "value", value))))
    return out


def _fields(configs: dict[str, str | None]) -> dict[str, object]:
    """Kafka's topic configs as topic fields; a config lakebroker does not know is INVALID_CONFIG."""
    fields: dict[str, object] = {}
    for name, value in configs.items():
        if name in IGNORED:
            continue
        if name not in CONFIGS:
            raise InvalidConfig(f"unknown topic config {name!r}: lakebroker keeps {', '.join(CONFIGS)}")
        fields[CONFIGS[name]] = _value(name, value)
    return fields


def _value(name: str, value: str | None) -> object:
    field = CONFIGS[name]
    if value is None:
        raise InvalidConfig(f"{name} needs a value")
    if field == "cleanup_policy":
        if value not in ("delete", "compact"):
            raise InvalidConfig(f"cleanup.policy {value!r}: lakebroker keeps 'delete' or 'compact' (not both)")
        return value
    try:
        number = int(value)
    except ValueError:
        raise InvalidConfig(f"{name} {value!r} is not a whole number") from None
    if number == -1 and field in UNLIMITED:
        return None
    return number


def _altered(topic: TopicConfig, configs: Any) -> dict[str, object]:
    """IncrementalAlterConfigs' operations as topic changes: SET a value, DELETE back to the default,
    APPEND and SUBTRACT on cleanup.policy, a list of one policy here."""
    defaults = TopicCreate.model_fields
    changes: dict[str, object] = {}
    for c in configs:
        if c.name in IGNORED:
            continue
        if c.name not in CONFIGS:
            raise InvalidConfig(f"unknown topic config {c.name!r}: lakebroker keeps {', '.join(CONFIGS)}")
        field = CONFIGS[c.name]
        if c.config_operation == SET:
            changes[field] = _value(c.name, c.value)
        elif c.config_operation == DELETE:
            default = defaults[field].default
            if field == "max_message_bytes":
                raise InvalidConfig("max.message.bytes has no default to go back to here: SET it")
            changes[field] = default
        elif c.config_operation in (APPEND, SUBTRACT) and field == "cleanup_policy":
            now = {topic.cleanup_policy.value}
            given = {v.strip() for v in (c.value or "").split(",") if v.strip()}
            after = now | given if c.config_operation == APPEND else now - given
            if len(after) != 1:
                raise InvalidConfig(f"cleanup.policy would be {sorted(after)}: lakebroker keeps exactly one of "
                                    "'delete' or 'compact'")
            changes[field] = after.pop()
        else:
            raise InvalidConfig(f"operation {c.config_operation} on {c.name}: APPEND and SUBTRACT apply to list "
                                "configs (cleanup.policy)")
    return changes


def _model(model: type[TopicCreate] | type[TopicUpdate], **fields: Any) -> Any:
    """The HTTP API's topic model of `fields`: its bounds hold for Kafka's requests too."""
    try:
        return model(**fields)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = CONFIGS_BY_FIELD.get(str(first["loc"][0]), str(first["loc"][0])) if first["loc"] else "config"
        if where == "partitions":
            raise InvalidPartitions(f"partitions: {first['msg']}") from None
        raise InvalidConfig(f"{where}: {first['msg']}") from None


def _code(exc: LakebrokerError) -> ErrorCode:
    if isinstance(exc, InvalidConfig):
        return ErrorCode.invalid_config
    if isinstance(exc, InvalidPartitions):
        return ErrorCode.invalid_partitions
    if isinstance(exc, AlreadyExists):
        return ErrorCode.topic_already_exists
    if isinstance(exc, InvalidName):
        return ErrorCode.invalid_topic_exception
    if isinstance(exc, Forbidden):
        return ErrorCode.topic_authorization_failed
    if type(exc) is InvalidRequest:
        return ErrorCode.invalid_request
    return error_code(exc)
