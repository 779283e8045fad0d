"""Kafka's consumer-group requests: FindCoordinator, the group protocol (JoinGroup, SyncGroup,
Heartbeat, LeaveGroup, ListGroups, DescribeGroups) answered from the coordinator (groups.py), and
OffsetCommit / OffsetFetch on the offsets table, where every group's positions live."""

from __future__ import annotations

import asyncio
import dataclasses
from datetime import timedelta
from typing import Any

from kio.schema.errors import ErrorCode

from lakebroker.ingest_api.auth import check_scope, check_topic
from lakebroker.ingest_api.kafka import wire
from lakebroker.ingest_api.kafka.brokers import Brokers
from lakebroker.ingest_api.kafka.errors import error_code, may_see
from lakebroker.ingest_api.kafka.groups import GroupCoordinator
from lakebroker.ingest_api.produce_core import ProduceCore
from lakebroker.tables.errors import Forbidden, InvalidRequest, LakebrokerError
from lakebroker.tables.offsets import PULL_GROUP_PREFIX, OffsetReason, OffsetsTable, pull_group
from lakebroker.tables.tokens import ApiToken, Scope

OFFSET_COMMIT, OFFSET_FETCH, FIND_COORDINATOR, JOIN_GROUP, HEARTBEAT, LEAVE_GROUP, SYNC_GROUP = 8, 9, 10, 11, 12, 13, 14
DESCRIBE_GROUPS, LIST_GROUPS = 15, 16
GROUP_APIS = frozenset({OFFSET_COMMIT, OFFSET_FETCH, FIND_COORDINATOR, JOIN_GROUP, HEARTBEAT, LEAVE_GROUP, SYNC_GROUP,
                        DESCRIBE_GROUPS, LIST_GROUPS})
_ZERO = timedelta(0)


class GroupRequests:
    def __init__(self, core: ProduceCore, brokers: Brokers) -> None:
        """`brokers`: the cluster's brokers, which name each group's coordinator."""
        self.core = core
        self.brokers = brokers
        self.groups = GroupCoordinator()
        self.offsets = OffsetsTable(core.broker.layout)

    def start(self) -> None:
        self.groups.start()

    async def stop(self) -> None:
        await self.groups.stop()

    async def answer(self, principal: ApiToken, client_host: str, request: wire.Request) -> bytes:
        """FindCoordinator, the group protocol and committed offsets. A group needs the `consume`
        scope; committing or reading a topic's offsets, that topic too."""
        schema = wire.response_schema(request.api_key, request.version)
        body = request.body
        try:
            check_scope(principal, Scope.CONSUME)
        except Forbidden:
            return wire.frame_of(request, _refused_group(schema, request, ErrorCode.group_authorization_failed))
        if request.api_key == FIND_COORDINATOR:
            return wire.frame_of(request, self._find_coordinator(schema, body))
        if request.api_key == LIST_GROUPS:  # a client asks every broker: each lists the groups it coordinates
            entry = wire.nested(schema, "ListedGroup")
            committed = await self._committed_groups()
            mine = self.brokers.coordinated(self.groups.groups.keys() | committed)
            live = {name: g for name, g in self.groups.groups.items() if name in mine}
            groups = tuple(wire.build(entry, group_id=g.name, protocol_type=g.protocol_type or "", group_state=g.state)
                           for g in live.values())
            groups += tuple(wire.build(entry, group_id=name, protocol_type="consumer", group_state="Empty")
                            for name in sorted(committed) if name not in live and name in mine)
            return wire.frame_of(request, wire.build(schema, throttle_time=_ZERO, error_code=ErrorCode.none,
                                                     groups=groups))
        if request.api_key == DESCRIBE_GROUPS:
            return wire.frame_of(request, self._describe_groups(schema, body, await self._committed_groups()))
        try:
            pull_group(body.group_id)
        except InvalidRequest:
            return wire.frame_of(request, _refused_group(schema, request, ErrorCode.invalid_group_id))
        if not self.brokers.coordinates(body.group_id):  # the client finds the coordinator again
            if request.api_key in (OFFSET_COMMIT, OFFSET_FETCH):
                return wire.frame_of(request, _per_partition(schema, request, ErrorCode.not_coordinator))
            return wire.frame_of(request, _refused_group(schema, request, ErrorCode.not_coordinator))
        if request.api_key == JOIN_GROUP:
            rebalance = getattr(body, "rebalance_timeout", body.session_timeout)
            joined = await self.groups.join(body.group_id, body.member_id, request.client_id or "",
                                            client_host, body.session_timeout.total_seconds(),
                                            rebalance.total_seconds(), body.protocol_type,
                                            [(p.name, bytes(p.metadata)) for p in body.protocols])
            member = wire.nested(schema, "JoinGroupResponseMember")
            return wire.frame_of(request, wire.build(
                schema, throttle_time=_ZERO, error_code=joined.error, generation_id=joined.generation,
                protocol_type=joined.protocol_type, protocol_name=joined.protocol, leader=joined.leader,
                skip_assignment=False, member_id=joined.member_id or body.member_id,
                members=tuple(wire.build(member, member_id=m, group_instance_id=None, metadata=meta)
                              for m, meta in joined.members)))
        if request.api_key == SYNC_GROUP:
            error, assignment = await self.groups.sync(body.group_id, body.generation_id, body.member_id,
                                                       {a.member_id: bytes(a.assignment) for a in body.assignments})
            group = self.groups.groups.get(body.group_id)
            return wire.frame_of(request, wire.build(
                schema, throttle_time=_ZERO, error_code=error, assignment=assignment,
                protocol_type=group.protocol_type if group else None, protocol_name=group.protocol if group else None))
        if request.api_key == HEARTBEAT:
            error = self.groups.heartbeat(body.group_id, body.generation_id, body.member_id)
            return wire.frame_of(request, wire.build(schema, throttle_time=_ZERO, error_code=error))
        if request.api_key == LEAVE_GROUP:
            leaving = [m.member_id for m in body.members] if hasattr(body, "members") else [body.member_id]
            errors = self.groups.leave(body.group_id, leaving)
            entry = wire.nested(schema, "MemberResponse") if hasattr(body, "members") else None
            members = () if entry is None else tuple(
                wire.build(entry, member_id=m, group_instance_id=None, error_code=e)
                for m, e in zip(leaving, errors, strict=True))
            top = errors[0] if entry is None else ErrorCode.none
            return wire.frame_of(request, wire.build(schema, throttle_time=_ZERO, error_code=top, members=members))
        if request.api_key == OFFSET_COMMIT:
            return wire.frame_of(request, await self._offset_commit(principal, schema, body))
        return wire.frame_of(request, await self._offset_fetch(principal, schema, body))

    def _find_coordinator(self, schema: Any, body: Any) -> Any:
        """Each group's coordinator (brokers.py): one node per group across the cluster."""
        keys = tuple(body.coordinator_keys) if hasattr(body, "coordinator_keys") else (body.key,)
        error = ErrorCode.none if getattr(body, "key_type", 0) == 0 else ErrorCode.invalid_request

        def at(key: str) -> dict[str, Any]:
            broker = self.brokers.coordinator(key)
            return {"node_id": broker.id, "host": broker.host, "port": broker.port}

        if "coordinators" in {f.name for f in dataclasses.fields(schema)}:
            entry = wire.nested(schema, "Coordinator")
            return wire.build(schema, throttle_time=_ZERO, coordinators=tuple(
                wire.build(entry, key=k, error_code=error, error_message=None, **at(k)) for k in keys))
        return wire.build(schema, throttle_time=_ZERO, error_code=error, error_message=None, **at(keys[0]))

    async def _committed_groups(self) -> set[str]:
        """The groups (by their Kafka name) with offsets in the offsets table: a group whose members
        all left is Kafka's `Empty` group, not a dead one, while its offsets are kept."""
        latest = await asyncio.to_thread(self.offsets.latest)
        return {group.removeprefix(PULL_GROUP_PREFIX) for group, _, _ in latest if group.startswith(PULL_GROUP_PREFIX)}

    def _describe_groups(self, schema: Any, body: Any, committed: set[str]) -> Any:
        group_entry, member_entry = wire.nested(schema, "DescribedGroup"), wire.nested(schema, "DescribedGroupMember")
        out = []
        mine = self.brokers.coordinated(body.groups)
        for name in body.groups:
            if name not in mine:
                out.append(wire.build(group_entry, error_code=ErrorCode.not_coordinator, group_id=name, group_state="",
                                      protocol_type="", protocol_data="", members=(),
                                      authorized_operations=-2147483648))
                continue
            group = self.groups.groups.get(name)
            members = () if group is None else tuple(wire.build(
                member_entry, member_id=m.member_id, group_instance_id=None, client_id=m.client_id,
                client_host=m.client_host, member_metadata=dict(m.protocols).get(group.protocol or "", b""),
                member_assignment=m.assignment) for m in group.members.values())
            state = group.state if group is not None else "Empty" if name in committed else "Dead"
            out.append(wire.build(group_entry, error_code=ErrorCode.none, group_id=name, group_state=state,
                                  protocol_type="consumer" if group is None and state == "Empty" else
                                  "" if group is None else group.protocol_type or "",
                                  protocol_data="" if group is None else group.protocol or "",
                                  members=members, authorized_operations=-2147483648))
        return wire.build(schema, throttle_time=_ZERO, groups=tuple(out))

    async def _offset_commit(self, principal: ApiToken, schema: Any, body: Any) -> Any:
        topic_entry, partition_entry = wire.nested(schema, "OffsetCommitResponseTopic"), wire.nested(
            schema, "OffsetCommitResponsePartition")
        generation = getattr(body, "generation_id_or_member_epoch", getattr(body, "generation_id", -1))
        group_error = self.groups.check_commit(body.group_id, generation, body.member_id)
        answers = []
        for t in body.topics:
            parts = []
            offsets: dict[int, int] = {}
            known = self.core.broker.topics.get(t.name)
            if known is not None and group_error is ErrorCode.none:
                await self.core.broker.follow_ends(known)  # the ends of partitions other nodes own
            for p in t.partitions:
                error = group_error
                if error is ErrorCode.none:
                    try:
                        check_topic(principal, t.name)
                        topic = self.core.broker.topic(t.name)
                        topic.check_partition(p.partition_index)
                        if not 0 <= p.committed_offset <= self.core.broker.assigned_end(topic, p.partition_index):
                            error = ErrorCode.offset_out_of_range
                        else:
                            offsets[p.partition_index] = p.committed_offset
                    except LakebrokerError as exc:
                        error = error_code(exc)
                parts.append((p.partition_index, error))
            if offsets:
                try:
                    await asyncio.to_thread(self.offsets.commit, pull_group(body.group_id), t.name, offsets,
                                            OffsetReason.ACK)
                except LakebrokerError as exc:
                    parts = [(i, error_code(exc) if i in offsets else e) for i, e in parts]
            answers.append(wire.build(topic_entry, name=t.name, partitions=tuple(
                wire.build(partition_entry, partition_index=i, error_code=e) for i, e in parts)))
        return wire.build(schema, throttle_time=_ZERO, topics=tuple(answers))

    async def _offset_fetch(self, principal: ApiToken, schema: Any, body: Any) -> Any:
        topic_entry, partition_entry = wire.nested(schema, "OffsetFetchResponseTopic"), wire.nested(
            schema, "OffsetFetchResponsePartition")
        committed = await asyncio.to_thread(self.offsets.latest, pull_group(body.group_id))
        by_topic: dict[str, dict[int, int]] = {}
        for (_, topic_name, partition), (offset, _) in committed.items():
            by_topic.setdefault(topic_name, {})[partition] = offset
        if body.topics is None:  # every topic the group has committed in, that the token may see
            asked = [(name, sorted(parts)) for name, parts in by_topic.items() if may_see(principal, name)]
        else:
            asked = [(t.name, list(t.partition_indexes)) for t in body.topics]
        answers = []
        for name, partitions in asked:
            allowed = may_see(principal, name)
            known = by_topic.get(name, {}) if allowed else {}
            answers.append(wire.build(topic_entry, name=name, partitions=tuple(wire.build(
                partition_entry, partition_index=p, committed_offset=known.get(p, -1), committed_leader_epoch=-1,
                metadata="",
                error_code=ErrorCode.none if allowed else ErrorCode.topic_authorization_failed) for p in partitions)))
        return wire.build(schema, throttle_time=_ZERO, error_code=ErrorCode.none, topics=tuple(answers))


def _per_partition(schema: Any, request: wire.Request, error: ErrorCode) -> Any:
    """An OffsetCommit's or OffsetFetch's answer with `error` for every partition it names (and at
    the top, where the version has a field for it)."""
    body = request.body
    if request.api_key == OFFSET_COMMIT:
        topic_entry, entry = wire.nested(schema, "OffsetCommitResponseTopic"), wire.nested(
            schema, "OffsetCommitResponsePartition")
        asked = [(t.name, [p.partition_index for p in t.partitions]) for t in body.topics]
        extra: dict[str, Any] = {}
    else:
        topic_entry, entry = wire.nested(schema, "OffsetFetchResponseTopic"), wire.nested(
            schema, "OffsetFetchResponsePartition")
        asked = [(t.name, list(t.partition_indexes)) for t in body.topics or ()]
        extra = {"committed_offset": -1, "committed_leader_epoch": -1, "metadata": ""}
    topics = tuple(wire.build(topic_entry, name=name, partitions=tuple(
        wire.build(entry, partition_index=p, error_code=error, **extra) for p in parts)) for name, parts in asked)
    return wire.build(schema, throttle_time=_ZERO, error_code=error, topics=topics)


def _refused_group(schema: Any, request: wire.Request, error: ErrorCode) -> Any:
    """A group request's answer that is only an error code (the fields of its version, empty)."""
    names = {f.name for f in dataclasses.fields(schema)}
    empty: dict[str, Any] = {"throttle_time": _ZERO, "error_code": error, "generation_id": -1, "leader": "",
                             "member_id": getattr(request.body, "member_id", ""), "members": (), "assignment": b"",
                             "groups": (), "topics": (), "coordinators": (), "node_id": -1, "host": "", "port": -1,
                             "protocol_name": None, "protocol_type": None, "skip_assignment": False,
                             "error_message": None}
    return schema(**{k: v for k, v in empty.items() if k in names})
