"""Kafka consumer groups: the classic group protocol's coordinator (JoinGroup, SyncGroup, Heartbeat,
LeaveGroup), its membership kept in memory on the node the clients found as coordinator.

A group moves Empty -> PreparingRebalance (members join) -> CompletingRebalance (the leader
assigns, client-side, with the assignor the members agreed on) -> Stable; a join, a leave or a
member whose session ran out starts the next rebalance. Members that do not join a rebalance
within its timeout are dropped from it. Committed offsets are not kept here: they go to the
offsets table (tables/offsets.py) like every group's.

Error codes are Kafka's: UNKNOWN_MEMBER_ID, ILLEGAL_GENERATION, REBALANCE_IN_PROGRESS,
INCONSISTENT_GROUP_PROTOCOL."""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field

from kio.schema.errors import ErrorCode

EMPTY, PREPARING, COMPLETING, STABLE = "Empty", "PreparingRebalance", "CompletingRebalance", "Stable"
# A new group waits this long for more members before its first generation, so consumers started
# together share one rebalance (Kafka's group.initial.rebalance.delay.ms, shorter here).
INITIAL_DELAY_S = 0.5
SWEEP_S = 0.5  # how often expired sessions are looked for
# The session timeouts a member may ask for (Kafka's group.min/max.session.timeout.ms): a member
# that vanishes holds its partitions for at most the longest.
MIN_SESSION_S, MAX_SESSION_S = 6.0, 1800.0


@dataclass
class Member:
    member_id: str
    client_id: str
    client_host: str
    session_timeout_s: float
    rebalance_timeout_s: float
    protocols: list[tuple[str, bytes]]
    last_seen: float
    assignment: bytes = b""
    joined: asyncio.Future[Joined] | None = None  # its JoinGroup's answer, while the join phase runs
    synced: asyncio.Future[tuple[ErrorCode, bytes]] | None = None  # its SyncGroup's, until the leader assigns


@dataclass(frozen=True)
class Joined:
    error: ErrorCode
    generation: int = -1
    protocol_type: str | None = None
    protocol: str | None = None
    leader: str = ""
    member_id: str = ""
    members: tuple[tuple[str, bytes], ...] = ()  # the leader's answer only: every member and its metadata


@dataclass
class Group:
    name: str
    state: str = EMPTY
    generation: int = 0
    protocol_type: str | None = None
    protocol: str | None = None
    leader: str | None = None
    members: dict[str, Member] = field(default_factory=dict)
    join_deadline: asyncio.TimerHandle | None = None
    initial: bool = False  # this rebalance waits out INITIAL_DELAY_S for more members


class GroupCoordinator:
    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.groups: dict[str, Group] = {}
        self._clock = clock
        self._sweeper: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._sweeper = asyncio.get_running_loop().create_task(self._sweep())

    async def stop(self) -> None:
        if self._sweeper is not None:
            self._sweeper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._sweeper
        for group in self.groups.values():
            for member in group.members.values():
                for future in (member.joined, member.synced):
                    if future is not None and not future.done():
                        future.cancel()

    # -- JoinGroup ----------------------------------------------------------------------
    async def join(self, name: str, member_id: str, client_id: str, client_host: str, session_timeout_s: float,
                   rebalance_timeout_s: float, protocol_type: str, protocols: list[tuple[str, bytes]]) -> Joined:
        if not MIN_SESSION_S <= session_timeout_s <= MAX_SESSION_S:
            return Joined(ErrorCode.invalid_session_timeout)
        group = self.groups.setdefault(name, Group(name))
        if group.protocol_type is not None and group.members and protocol_type != group.protocol_type:
            return Joined(ErrorCode.inconsistent_group_protocol)
        if group.members and not _common_protocol(list(group.members.values()), protocols):
            return Joined(ErrorCode.inconsistent_group_protocol)
        if member_id and member_id not in group.members:
            return Joined(ErrorCode.unknown_member_id)
        now = self._clock()
        if not member_id:
            member_id = f"{client_id or 'consumer'}-{uuid.uuid4()}"
            group.members[member_id] = Member(member_id, client_id, client_host, session_timeout_s,
                                              rebalance_timeout_s, protocols, now)
        member = group.members[member_id]
        member.protocols, member.last_seen = protocols, now
        member.session_timeout_s, member.rebalance_timeout_s = session_timeout_s, rebalance_timeout_s
        group.protocol_type = protocol_type
        if member.joined is not None and not member.joined.done():
            member.joined.cancel()  # a second join from the same member replaces the first
        member.joined = asyncio.get_running_loop().create_future()
        self._prepare_rebalance(group)
        self._maybe_complete_join(group)
        return await member.joined

    def _prepare_rebalance(self, group: Group) -> None:
        if group.state == PREPARING:
            return
        for member in group.members.values():  # a sync in wait is over: its generation is
            if member.synced is not None and not member.synced.done():
                member.synced.set_result((ErrorCode.rebalance_in_progress, b""))
        group.initial = group.state == EMPTY
        group.state = PREPARING
        timeout = INITIAL_DELAY_S if group.initial else max(
            (m.rebalance_timeout_s for m in group.members.values()), default=1.0)
        loop = asyncio.get_running_loop()
        group.join_deadline = loop.call_later(timeout, self._complete_join, group, True)

    def _maybe_complete_join(self, group: Group) -> None:
        if group.state != PREPARING or group.initial:
            return  # a new group waits out its initial delay for more members
        if all(m.joined is not None and not m.joined.done() for m in group.members.values()):
            self._complete_join(group, False)

    def _complete_join(self, group: Group, deadline: bool) -> None:
        if group.state != PREPARING:
            return
        if group.join_deadline is not None:
            group.join_deadline.cancel()
            group.join_deadline = None
        if deadline:  # who did not join in time is out of the group
            for member_id in [m for m, member in group.members.items()
                              if member.joined is None or member.joined.done()]:
                del group.members[member_id]
        if not group.members:
            self._empty(group)
            return
        group.generation += 1
        group.protocol = _common_protocol(list(group.members.values()), None)
        if group.leader not in group.members:
            group.leader = next(iter(group.members))
        group.state = COMPLETING
        everyone = tuple((m.member_id, dict(m.protocols).get(group.protocol or "", b""))
                         for m in group.members.values())
        for member in group.members.values():
            member.assignment = b""
            assert member.joined is not None
            member.joined.set_result(Joined(
                ErrorCode.none, group.generation, group.protocol_type, group.protocol, group.leader or "",
                member.member_id, everyone if member.member_id == group.leader else ()))

    def _empty(self, group: Group) -> None:
        """No member left: the group is forgotten here (its committed offsets stay in the table)."""
        group.state, group.leader, group.protocol = EMPTY, None, None
        group.generation += 1
        if self.groups.get(group.name) is group:
            del self.groups[group.name]

    # -- SyncGroup, Heartbeat, LeaveGroup -----------------------------------------------
    async def sync(self, name: str, generation: int, member_id: str,
                   assignments: dict[str, bytes]) -> tuple[ErrorCode, bytes]:
        group, error = self._member_of(name, generation, member_id)
        if group is None:
            return error, b""
        member = group.members[member_id]
        member.last_seen = self._clock()
        if group.state == PREPARING:
            return ErrorCode.rebalance_in_progress, b""
        if group.state == STABLE:
            return ErrorCode.none, member.assignment
        if member_id == group.leader:
            for other in group.members.values():
                other.assignment = assignments.get(other.member_id, b"")
                if other.synced is not None and not other.synced.done():
                    other.synced.set_result((ErrorCode.none, other.assignment))
            group.state = STABLE
            return ErrorCode.none, member.assignment
        member.synced = asyncio.get_running_loop().create_future()
        return await member.synced

    def heartbeat(self, name: str, generation: int, member_id: str) -> ErrorCode:
        group, error = self._member_of(name, generation, member_id)
        if group is None:
            return error
        group.members[member_id].last_seen = self._clock()
        return ErrorCode.rebalance_in_progress if group.state == PREPARING else ErrorCode.none

    def leave(self, name: str, member_ids: list[str]) -> list[ErrorCode]:
        group = self.groups.get(name)
        out = []
        for member_id in member_ids:
            if group is None or member_id not in group.members:
                out.append(ErrorCode.unknown_member_id)
                continue
            self._remove(group, member_id)
            out.append(ErrorCode.none)
        return out

    def check_commit(self, name: str, generation: int, member_id: str) -> ErrorCode:
        """Whether an offset commit may land: a commit outside the group protocol (generation -1)
        always may, a member's only in its current generation."""
        if generation < 0:
            return ErrorCode.none
        group, error = self._member_of(name, generation, member_id)
        if group is None:
            return error
        return ErrorCode.rebalance_in_progress if group.state == PREPARING else ErrorCode.none

    def _member_of(self, name: str, generation: int, member_id: str) -> tuple[Group | None, ErrorCode]:
        group = self.groups.get(name)
        if group is None or member_id not in group.members:
            return None, ErrorCode.unknown_member_id
        if generation != group.generation:
            return None, ErrorCode.illegal_generation
        return group, ErrorCode.none

    def _remove(self, group: Group, member_id: str) -> None:
        member = group.members.pop(member_id)
        if member.joined is not None and not member.joined.done():
            member.joined.set_result(Joined(ErrorCode.unknown_member_id))
        if member.synced is not None and not member.synced.done():
            member.synced.set_result((ErrorCode.unknown_member_id, b""))
        if group.members:
            self._prepare_rebalance(group)
            self._maybe_complete_join(group)
        elif group.state != EMPTY:
            if group.join_deadline is not None:
                group.join_deadline.cancel()
                group.join_deadline = None
            self._empty(group)

    async def _sweep(self) -> None:
        """Drop the members whose session ran out (no heartbeat, no request within it)."""
        while True:
            await asyncio.sleep(SWEEP_S)
            now = self._clock()
            for group in list(self.groups.values()):
                for member_id, member in list(group.members.items()):
                    waiting = member.joined is not None and not member.joined.done()
                    if not waiting and now - member.last_seen > member.session_timeout_s:
                        self._remove(group, member_id)


def _common_protocol(members: list[Member], joining: list[tuple[str, bytes]] | None) -> str | None:
    """The first protocol (assignor), in the first member's order of preference, that every member
    (and `joining`, if given) supports."""
    lists = [[name for name, _ in m.protocols] for m in members]
    if joining is not None:
        lists.append([name for name, _ in joining])
    if not lists:
        return None
    return next((name for name in lists[0] if all(name in other for other in lists[1:])), None)
