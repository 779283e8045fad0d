"""The delivery transport against real loopback sockets that misbehave on purpose."""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path

import httpx
import pytest

from lakebroker.delivery_worker.http1 import MAX_RESPONSE_BODY, LeanTransport

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]
OK = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok"


@asynccontextmanager
async def serving(handler: Handler) -> AsyncIterator[tuple[str, list[int]]]:
    """A TCP server on 127.0.0.1; yields its URL and a list that counts accepted connections."""
    accepted: list[int] = []

    async def on_connect(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        accepted.append(1)
        try:
            await handler(reader, writer)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(on_connect, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    async with server:
        yield f"http://127.0.0.1:{port}/hook", accepted


async def read_request(reader: asyncio.StreamReader) -> tuple[bytes, bytes]:
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.lower().split(b"\r\n")
    length = next(int(line.split(b":")[1]) for line in lines if line.startswith(b"content-length"))
    return head, await reader.readexactly(length)


def post(url: str, body: bytes = b'{"a":1}', timeout: float = 2.0, **headers: str) -> httpx.Request:
    t = {"connect": timeout, "read": timeout, "write": timeout, "pool": timeout}
    return httpx.Request("POST", url, content=body, headers=headers, extensions={"timeout": t})


async def test_keep_alive_reuses_one_connection_and_sends_the_exact_request() -> None:
    seen: list[tuple[bytes, bytes]] = []

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            seen.append(await read_request(reader))
            writer.write(OK)

    async with serving(handler) as (url, accepted):
        transport = LeanTransport(allow_private=True)
        for i in range(5):
            response = await transport.handle_async_request(post(url, body=b'{"n":%d}' % i, **{"x-n": str(i)}))
            assert response.status_code == 200
            assert await response.aread() == b"ok"
        await transport.aclose()
    assert len(accepted) == 1
    assert [body for _, body in seen] == [b'{"n":%d}' % i for i in range(5)]
    head = seen[3][0].decode()
    assert head.startswith("POST /hook HTTP/1.1\r\n")
    assert "x-n: 3\r\n" in head and "content-length: 7\r\n" in head.lower()


async def test_a_reused_connection_closed_without_an_answer_is_redialled_once() -> None:
    seen: list[bytes] = []

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        seen.append((await read_request(reader))[1])
        writer.write(OK)  # keep-alive promised...
        await writer.drain()
        seen.append((await read_request(reader))[1])  # ...but the next request gets a hang-up

    async with serving(handler) as (url, accepted):
        transport = LeanTransport(allow_private=True)
        assert (await transport.handle_async_request(post(url, body=b"1"))).status_code == 200
        assert (await transport.handle_async_request(post(url, body=b"2"))).status_code == 200
        await transport.aclose()
    assert len(accepted) == 2
    assert seen[:3] == [b"1", b"2", b"2"]  # at-least-once: the receiver may see a redial's repeat


async def test_a_fresh_connection_closed_without_an_answer_is_an_error() -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)

    async with serving(handler) as (url, accepted):
        transport = LeanTransport(allow_private=True)
        with pytest.raises(httpx.RemoteProtocolError, match="without answering"):
            await transport.handle_async_request(post(url))
        await transport.aclose()
    assert len(accepted) == 1


async def test_close_delimited_and_chunked_bodies_and_big_answers_are_capped() -> None:
    answers = [
        b"HTTP/1.1 500 Internal Server Error\r\nconnection: close\r\n\r\nbroken",
        b"HTTP/1.1 503 Busy\r\ntransfer-encoding: chunked\r\nretry-after: 7\r\n\r\n4\r\nbusy\r\n0\r\n\r\n",
        b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n" % (MAX_RESPONSE_BODY * 2) + b"z" * (MAX_RESPONSE_BODY * 2),
    ]

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while answers:
            await read_request(reader)
            answer = answers.pop(0)
            writer.write(answer)
            await writer.drain()
            if b"connection: close" in answer:
                return

    async with serving(handler) as (url, _):
        transport = LeanTransport(allow_private=True)
        first = await transport.handle_async_request(post(url))
        assert (first.status_code, await first.aread()) == (500, b"broken")
        second = await transport.handle_async_request(post(url))
        assert (second.status_code, second.headers["retry-after"], await second.aread()) == (503, "7", b"busy")
        third = await transport.handle_async_request(post(url))
        assert third.status_code == 200 and len(await third.aread()) == MAX_RESPONSE_BODY
        await transport.aclose()


async def test_a_silent_server_is_a_read_timeout_and_the_connection_is_not_reused() -> None:
    calls: list[int] = []

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        calls.append(1)
        if len(calls) == 1:
            await asyncio.sleep(5)  # never answers in time
        writer.write(OK)
        await read_request(reader)

    async with serving(handler) as (url, accepted):
        transport = LeanTransport(allow_private=True)
        with pytest.raises(httpx.ReadTimeout):
            await transport.handle_async_request(post(url, timeout=0.2))
        assert (await transport.handle_async_request(post(url))).status_code == 200
        await transport.aclose()
    assert len(accepted) == 2


async def test_garbage_and_a_mid_response_hangup_are_protocol_errors() -> None:
    async def garbage(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"SMTP ready\r\n\r\n")
        await writer.drain()
        await asyncio.sleep(1)

    async def hangup(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-le")
        await writer.drain()

    for handler, message in ((garbage, "malformed HTTP response"), (hangup, "mid-response")):
        async with serving(handler) as (url, _):
            transport = LeanTransport(allow_private=True)
            with pytest.raises(httpx.RemoteProtocolError, match=message):
                await transport.handle_async_request(post(url))
            await transport.aclose()


async def test_refused_connections_and_header_injection_are_clear_errors() -> None:
    server = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    server.close()
    await server.wait_closed()
    transport = LeanTransport(allow_private=True)
    with pytest.raises(httpx.ConnectError, match="could not connect"):
        await transport.handle_async_request(post(f"http://127.0.0.1:{port}/"))
    with pytest.raises(httpx.LocalProtocolError, match="line break"):
        await transport.handle_async_request(post("http://127.0.0.1:1/", **{"x-evil": "a\r\nx-injected: 1"}))
    with pytest.raises(httpx.UnsupportedProtocol):
        await transport.handle_async_request(post("ftp://127.0.0.1/"))


async def test_the_ssrf_rule_is_checked_again_on_the_address_actually_dialled() -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(OK)

    async with serving(handler) as (url, accepted):
        strict = LeanTransport(allow_private=False)
        with pytest.raises(httpx.ConnectError, match="private, loopback or link-local"):
            await strict.handle_async_request(post(url.replace("127.0.0.1", "localhost")))
        assert accepted == []


async def test_connections_per_origin_are_capped_and_a_full_pool_times_out() -> None:
    release = asyncio.Event()
    concurrent: list[int] = []

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        concurrent.append(1)
        await release.wait()
        writer.write(OK)
        await writer.drain()

    async with serving(handler) as (url, _):
        transport = LeanTransport(allow_private=True, max_per_origin=2)
        busy = [asyncio.create_task(transport.handle_async_request(post(url))) for _ in range(2)]
        await asyncio.sleep(0.2)
        with pytest.raises(httpx.PoolTimeout):
            await transport.handle_async_request(post(url, timeout=0.2))
        assert len(concurrent) == 2
        release.set()
        assert [r.status_code for r in await asyncio.gather(*busy)] == [200, 200]
        await transport.aclose()


def _self_signed(tmp: Path) -> tuple[Path, Path]:
    """A certificate for localhost and 127.0.0.1, and its key."""
    import datetime
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
        .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=1))
        .not_valid_after(now + datetime.timedelta(hours=1))
        .add_extension(x509.SubjectAlternativeName([x509.DNSName("localhost"),
                                                    x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), True)
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = tmp / "cert.pem", tmp / "key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return cert_path, key_path


async def test_https_verifies_the_certificate_against_the_url_host(tmp_path: Path) -> None:
    cert, key = _self_signed(tmp_path)
    server_tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_tls.load_cert_chain(cert, key)
    seen: list[bytes] = []

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            seen.append((await read_request(reader))[1])
            writer.write(OK)

    async def on_connect(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            await handler(reader, writer)
        except (ConnectionError, asyncio.IncompleteReadError, ssl.SSLError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(on_connect, "127.0.0.1", 0, ssl=server_tls)
    port = server.sockets[0].getsockname()[1]
    async with server:
        trusting = LeanTransport(allow_private=True, ssl_context=ssl.create_default_context(cafile=str(cert)))
        for body in (b"1", b"2"):
            response = await trusting.handle_async_request(post(f"https://localhost:{port}/hook", body=body))
            assert (response.status_code, await response.aread()) == (200, b"ok")
        await trusting.aclose()
        default = LeanTransport(allow_private=True)  # the system's CAs: a self-signed certificate fails
        with pytest.raises(httpx.ConnectError, match=r"CERTIFICATE_VERIFY_FAILED|certificate verify failed"):
            await default.handle_async_request(post(f"https://localhost:{port}/hook"))
        await default.aclose()
    assert seen == [b"1", b"2"]
