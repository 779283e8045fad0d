"""The Kafka door: a listener that speaks Kafka's protocol and hands each topic's records of a
Produce request to the produce core (produce_core.py) as one columnar batch (produce_requests.py).
It parses Kafka's frames and renders Kafka's answers and error codes; the rules (authorization,
admission, partitions, dedup, acks) are the core's.

A partition this node does not own is refused with NOT_LEADER_OR_FOLLOWER, never forwarded
(the request is marked forwarded for the core): the client reads the metadata again and goes to
the owner itself, as Kafka clients do.

APIs: ApiVersions, Metadata (metadata_requests.py), Produce (produce_requests.py), Fetch and
ListOffsets (fetch_requests.py), InitProducerId, the consumer group APIs (group_requests.py, over
groups.py and the offsets table), the admin APIs (admin_requests.py: topics, their configs, the
cluster), and SASL/PLAIN
(SaslHandshake, SaslAuthenticate) with an API token as the password. With auth enforced, a
connection must authenticate before any other API; its token is checked again at each request
that reads or writes (a revoked or expired token stops working on an open connection too).
Requests on one connection are answered in order, as Kafka requires; Produce and Fetch requests
are pipelined (`_connection`)."""

from __future__ import annotations

import asyncio
import logging
import random
import ssl
from dataclasses import dataclass
from datetime import timedelta

from kio.schema.errors import ErrorCode

from lakebroker.ingest_api.auth import OPEN_ACCESS, Authenticator
from lakebroker.ingest_api.kafka import record_batches, wire
from lakebroker.ingest_api.kafka.admin_requests import ADMIN_NAMES, ADMIN_VERSIONS, AdminRequests
from lakebroker.ingest_api.kafka.brokers import Brokers
from lakebroker.ingest_api.kafka.fetch_requests import FETCH, LIST_OFFSETS, FetchRequests
from lakebroker.ingest_api.kafka.group_requests import (
    DESCRIBE_GROUPS,
    FIND_COORDINATOR,
    GROUP_APIS,
    HEARTBEAT,
    JOIN_GROUP,
    LEAVE_GROUP,
    LIST_GROUPS,
    OFFSET_COMMIT,
    OFFSET_FETCH,
    SYNC_GROUP,
    GroupRequests,
)
from lakebroker.ingest_api.kafka.metadata_requests import METADATA, MetadataRequests
from lakebroker.ingest_api.kafka.produce_requests import PRODUCE, ProduceRequests, queued_or_done
from lakebroker.ingest_api.messages import AckMode
from lakebroker.ingest_api.metrics import Children
from lakebroker.ingest_api.produce_core import ProduceCore
from lakebroker.tables.errors import (
    LakebrokerError,
    Unauthenticated,
)
from lakebroker.tables.tokens import ApiToken

log = logging.getLogger(__name__)

SASL_HANDSHAKE, API_VERSIONS, INIT_PRODUCER_ID, SASL_AUTHENTICATE = 17, 18, 22, 36
# Each API from its lowest version in kio (librdkafka enables features by the low end of a range:
# record batches need Produce 3 and Fetch 4), up to the one every current client then picks.
# Fetch stops at 12, the last that names topics (13 names them by id); ListOffsets at 6 (7 adds
# the max-timestamp lookup).
VERSIONS = {PRODUCE: (3, 9), FETCH: (4, 12), LIST_OFFSETS: (1, 6), METADATA: (0, 12), OFFSET_COMMIT: (2, 8),
            OFFSET_FETCH: (1, 7), FIND_COORDINATOR: (0, 4), JOIN_GROUP: (0, 9), HEARTBEAT: (0, 4),
            LEAVE_GROUP: (0, 5), SYNC_GROUP: (0, 5), DESCRIBE_GROUPS: (0, 5), LIST_GROUPS: (0, 4),
            SASL_HANDSHAKE: (0, 1), API_VERSIONS: (0, 4), INIT_PRODUCER_ID: (0, 4), SASL_AUTHENTICATE: (0, 2),
            **ADMIN_VERSIONS}
MAX_CONNECTIONS = 4096  # as the HTTP server's limit_concurrency
MAX_IN_FLIGHT = 16  # requests read ahead of their answers on one connection (Java's producer sends 5)
IDLE_S = 600.0  # an idle connection is closed after this long (Kafka's connections.max.idle.ms)
API_NAMES = {PRODUCE: "Produce", FETCH: "Fetch", LIST_OFFSETS: "ListOffsets", METADATA: "Metadata",
             OFFSET_COMMIT: "OffsetCommit", OFFSET_FETCH: "OffsetFetch", FIND_COORDINATOR: "FindCoordinator",
             JOIN_GROUP: "JoinGroup", HEARTBEAT: "Heartbeat", LEAVE_GROUP: "LeaveGroup", SYNC_GROUP: "SyncGroup",
             DESCRIBE_GROUPS: "DescribeGroups", LIST_GROUPS: "ListGroups", SASL_HANDSHAKE: "SaslHandshake",
             API_VERSIONS: "ApiVersions", INIT_PRODUCER_ID: "InitProducerId", SASL_AUTHENTICATE: "SaslAuthenticate",
             **ADMIN_NAMES}
BEFORE_AUTH = frozenset({API_VERSIONS, SASL_HANDSHAKE, SASL_AUTHENTICATE})
MECHANISMS = ("PLAIN",)
_ZERO = timedelta(0)


@dataclass(slots=True)
class Session:
    """One connection's state: its SASL step and, once authenticated, its token."""

    token: str | None = None  # the password it authenticated with, checked again at each produce
    mechanism: str | None = None  # chosen by SaslHandshake
    authenticated: bool = False
    host: str = ""  # the client's address, as DescribeGroups shows it


class KafkaListener:
    def __init__(self, core: ProduceCore, auth: Authenticator, host: str, port: int, advertised_host: str,
                 acks_all: AckMode = AckMode.WAL, *, reuse_port: bool = False, tls: ssl.SSLContext | None = None,
                 ) -> None:
        """`tls`: the listener speaks TLS only, with this context (settings kafka_tls_cert and _key)."""
        self.core = core
        self.auth = auth
        self.host, self.port = host, port
        self.advertised_host = advertised_host
        self.acks_all = acks_all  # what acks=all (-1) waits for
        self.reuse_port = reuse_port
        self.tls = tls
        self.advertised_port = port
        self.max_request_bytes = core.broker.settings.max_request_bytes
        self.body_timeout_s = core.broker.settings.body_read_timeout_s
        self.brokers = Brokers(core.broker, self.address)
        self.metadata_requests = MetadataRequests(core, self.brokers)
        self.group_requests = GroupRequests(core, self.brokers)
        self.admin_requests = AdminRequests(core, self.brokers)
        self._servers: list[asyncio.Server] = []
        self._connections: set[asyncio.Task[None]] = set()
        metrics = core.broker.metrics
        metrics.kafka_connections.set_function(lambda: len(self._connections))
        self._requests = Children(metrics.kafka_requests)
        self._partition_errors = Children(metrics.kafka_partition_errors)
        self._closed = Children(metrics.kafka_closed)
        self.produce_requests = ProduceRequests(core, acks_all, self._partition_errors)
        self.fetch_requests = FetchRequests(core, self._partition_errors)

    def address(self) -> tuple[str, int]:
        """The host and port clients reach this listener at (known once it is bound)."""
        return self.advertised_host, self.advertised_port

    async def start(self) -> None:
        """Listen on HOST:PORT. As one of `serve --workers`' processes (`reuse_port`), which share that
        port, also on a port of its own, which Metadata advertises: a client that bootstrapped through
        the shared port then reaches this very process."""
        binds = [(self.port, self.reuse_port)] + ([(0, False)] if self.reuse_port else [])
        for port, shared in binds:
            try:
                self._servers.append(await asyncio.start_server(self._connection, self.host, port, ssl=self.tls,
                                                                reuse_port=shared or None, backlog=1024))
            except OSError as exc:
                await self.stop()
                raise OSError(exc.errno, f"the Kafka listener cannot bind {self.host}:{port}: {exc.strerror} "
                              "(setting kafka_port; kafka_listener=false turns it off)") from None
        self.port = self._servers[0].sockets[0].getsockname()[1]
        self.advertised_port = self._servers[-1].sockets[0].getsockname()[1]
        host = f"[{self.advertised_host}]" if ":" in self.advertised_host else self.advertised_host
        self.core.broker.cluster.advertise_kafka(f"{host}:{self.advertised_port}")  # for every node's Metadata
        await asyncio.to_thread(record_batches.warm_up)  # off the loop: leases are renewed on it
        self.group_requests.start()
        log.info("Kafka listener on %s:%d (%s), advertised as %s:%d; acks=all waits for ack=%s%s", self.host,
                 self.port, "TLS" if self.tls else "plaintext", self.advertised_host, self.advertised_port,
                 self.acks_all.value,
                 "; clients authenticate with SASL/PLAIN (an API token as the password)" if self.auth.enforced else "")

    async def stop(self) -> None:
        # The node row keeps the address until the node leaves, a few seconds on: no commit more in
        # a shutdown; a client meanwhile finds the port closed and reads the metadata again.
        await self.group_requests.stop()
        for server in self._servers:
            server.close()
        for task in list(self._connections):
            task.cancel()
        await asyncio.gather(*self._connections, return_exceptions=True)
        for server in self._servers:
            await server.wait_closed()
        self._servers = []

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """Read requests and answer them, in order. Produce and Fetch requests are pipelined: the next
        request is read once a Produce's records are queued for the WAL (so a connection's records
        keep their order) or at once after a Fetch, while the answers are written in request order
        as they are ready. Other requests (SASL among them) are answered before the next is read."""
        task = asyncio.current_task()
        assert task is not None
        self._connections.add(task)
        peer = writer.get_extra_info("peername")
        session = Session(authenticated=not self.auth.enforced, host=str(peer[0]) if peer else "")
        answers: asyncio.Queue[asyncio.Task[bytes | None] | None] = asyncio.Queue(MAX_IN_FLIGHT)
        sender = asyncio.create_task(self._send_in_order(answers, writer))
        reading: asyncio.Task[None] | None = None
        try:
            if len(self._connections) > MAX_CONNECTIONS:
                log.warning("Kafka client %s refused: %d connections are open (the most the listener keeps)", peer,
                            MAX_CONNECTIONS)
                self._closed("limit").inc()
                return
            reading = asyncio.create_task(self._read_requests(session, reader, answers))
            await asyncio.wait((reading, sender), return_when=asyncio.FIRST_COMPLETED)
            if sender.done():
                sender.result()  # raises what ended the connection (a refused SASL exchange, say)
            reading.result()  # raises a malformed frame
            await sender  # the answers still to write
        except _CloseAfter as exc:
            writer.write(exc.answer)
            self._closed("auth").inc()
            log.info("Kafka client %s: SASL authentication failed; closing its connection", peer)
        except wire.Malformed as exc:
            self._closed("malformed").inc()
            log.warning("Kafka client %s: %s; closing its connection", peer, exc)
        except LakebrokerError as exc:  # its token no longer holds, or the token table cannot be read
            self._closed("auth").inc()
            log.info("Kafka client %s: %s; closing its connection", peer, exc.message)
        except (ConnectionError, asyncio.CancelledError):
            pass
        except Exception:  # a bug here costs this connection, never the listener
            log.exception("Kafka client %s: unexpected error; closing its connection", peer)
        finally:
            if reading is not None:
                reading.cancel()
            sender.cancel()
            while not answers.empty():
                if (left := answers.get_nowait()) is not None:
                    left.cancel()
            self._connections.discard(task)
            writer.close()

    async def _read_requests(self, session: Session, reader: asyncio.StreamReader,
                             answers: asyncio.Queue[asyncio.Task[bytes | None] | None]) -> None:
        """Each request as a task of its own, queued for `_send_in_order`, until the client closes."""
        while (frame := await wire.read_frame(reader, self.max_request_bytes, IDLE_S,
                                              self.body_timeout_s)) is not None:
            request = wire.parse(frame)
            self._requests(API_NAMES.get(request.api_key, str(request.api_key))).inc()
            queued = asyncio.Event()
            answer = asyncio.create_task(self._answer(session, request, queued))
            await answers.put(answer)  # waits while MAX_IN_FLIGHT answers are outstanding
            if request.api_key == PRODUCE:
                await queued_or_done(queued, answer)
            elif request.api_key != FETCH:
                await asyncio.wait((answer,))
        await answers.put(None)

    @staticmethod
    async def _send_in_order(answers: asyncio.Queue[asyncio.Task[bytes | None] | None],
                             writer: asyncio.StreamWriter) -> None:
        """Write each answer once it is ready, in request order. A request that failed ends the
        connection: its error is raised where the connection awaits this."""
        while (answer := await answers.get()) is not None:
            frame = await answer
            if frame is not None:
                writer.write(frame)
                await writer.drain()

    async def _answer(self, session: Session, request: wire.Request, queued: asyncio.Event) -> bytes | None:
        low, high = VERSIONS.get(request.api_key, (0, -1))
        if request.api_key == API_VERSIONS and (request.body is None or request.version > high):
            return self._api_versions(request, ErrorCode.unsupported_version)
        if request.body is None or not low <= request.version <= high:
            raise wire.Malformed(f"api {request.api_key} v{request.version} is not supported "
                                 "(the client sends only what ApiVersions lists)")
        if not session.authenticated and request.api_key not in BEFORE_AUTH:
            raise wire.Malformed(f"api {request.api_key} before SASL authentication: this listener requires "
                                 "SASL/PLAIN (security.protocol=SASL_PLAINTEXT, an API token as the password)")
        if request.api_key == API_VERSIONS:
            return self._api_versions(request, ErrorCode.none)
        if request.api_key == SASL_HANDSHAKE:
            return self._sasl_handshake(session, request)
        if request.api_key == SASL_AUTHENTICATE:
            return await self._sasl_authenticate(session, request)
        if request.api_key == METADATA:
            return self.metadata_requests.answer(await self._principal(session), request)
        if request.api_key == INIT_PRODUCER_ID:
            return self._init_producer_id(request)
        if request.api_key in (FETCH, LIST_OFFSETS):
            return await self.fetch_requests.answer(await self._principal(session), request)
        if request.api_key in ADMIN_VERSIONS:
            return await self.admin_requests.answer(await self._principal(session), request)
        if request.api_key in GROUP_APIS:
            return await self.group_requests.answer(await self._principal(session), session.host, request)
        principal = None if request.body.transactional_id is not None else await self._principal(session)
        return await self.produce_requests.answer(principal, request, queued)

    def _api_versions(self, request: wire.Request, error: ErrorCode) -> bytes:
        # An unknown version is answered in v0, which every client reads (KIP-511).
        version = 0 if error is ErrorCode.unsupported_version else request.version
        schema = wire.response_schema(API_VERSIONS, version)
        entry = wire.nested(schema, "ApiVersion")
        keys = tuple(entry(api_key=k, min_version=lo, max_version=hi) for k, (lo, hi) in sorted(VERSIONS.items()))
        return wire.frame_of(request, wire.build(schema, error_code=error, api_keys=keys, throttle_time=_ZERO))

    # -- SASL/PLAIN ----------------------------------------------------------------------
    def _sasl_handshake(self, session: Session, request: wire.Request) -> bytes:
        schema = wire.response_schema(SASL_HANDSHAKE, request.version)
        mechanism = request.body.mechanism
        if request.version == 0 or mechanism not in MECHANISMS:
            # v0 would send the SASL bytes unframed next: only v1's framed exchange is spoken here
            error = ErrorCode.unsupported_sasl_mechanism
        else:
            error, session.mechanism = ErrorCode.none, mechanism
        return wire.frame_of(request, wire.build(schema, error_code=error, mechanisms=MECHANISMS))

    async def _sasl_authenticate(self, session: Session, request: wire.Request) -> bytes:
        schema = wire.response_schema(SASL_AUTHENTICATE, request.version)
        if session.mechanism != "PLAIN":
            raise wire.Malformed("SaslAuthenticate before a SaslHandshake that chose PLAIN")
        # PLAIN (RFC 4616): authorization id, user name and password, each ended by a NUL but the last
        parts = bytes(request.body.auth_bytes).split(b"\0")
        try:
            if len(parts) != 3:
                raise Unauthenticated("SASL/PLAIN expects [authzid] NUL username NUL password")
            token = parts[2].decode()
            await self.auth.authenticate(token)
        except (Unauthenticated, UnicodeDecodeError) as exc:
            text = exc.message if isinstance(exc, Unauthenticated) else "the password is not UTF-8 text"
            answer = wire.build(schema, error_code=ErrorCode.sasl_authentication_failed,
                                error_message=f"{text}: the password is an API token (lbk_...)", auth_bytes=b"",
                                session_lifetime=_ZERO)
            raise _CloseAfter(wire.frame_of(request, answer)) from None
        session.token, session.authenticated = token, True
        return wire.frame_of(request, wire.build(schema, error_code=ErrorCode.none, error_message=None,
                                                 auth_bytes=b"", session_lifetime=_ZERO))

    async def _principal(self, session: Session) -> ApiToken:
        """The connection's token, checked again now (it may have been revoked or expired since)."""
        return await self.auth.authenticate(session.token) if self.auth.enforced else OPEN_ACCESS

    def _init_producer_id(self, request: wire.Request) -> bytes:
        schema = wire.response_schema(INIT_PRODUCER_ID, request.version)
        if request.body.transactional_id is not None:
            return wire.frame_of(request, wire.build(
                schema, throttle_time=_ZERO, error_code=ErrorCode.transactional_id_authorization_failed,
                producer_id=-1, producer_epoch=-1))
        # A random id: unique across nodes and restarts without coordination (2^-62 a collision).
        return wire.frame_of(request, wire.build(schema, throttle_time=_ZERO, error_code=ErrorCode.none,
                                                 producer_id=random.getrandbits(62), producer_epoch=0))


class _CloseAfter(wire.Malformed):
    """An answer to send, after which the connection closes (a failed SASL authentication)."""

    def __init__(self, answer: bytes) -> None:
        super().__init__("SASL authentication failed")
        self.answer = answer
