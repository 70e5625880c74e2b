"""sealing.https_exchange through sealing.upload_client.Connection against a real aiohttp
server over TLS (in a thread): keep-alive reuse, the three ways an answer is framed
(Content-Length, chunked, Connection: close), and a server the CA did not sign refused."""
import asyncio
import ssl
import threading

import pytest
from aiohttp import web

from sealing.upload_client import Connection
from shuffler.certs import make_certs
from shuffler.service import tls_context


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    certs = make_certs(tmp_path_factory.mktemp("tls"))

    async def echo(request):
        body = await request.read()
        port = request.transport.get_extra_info("peername")[1]
        return web.Response(body=b"%d|%s|" % (port, request.headers.get("X-Tag", "").encode())
                            + body)

    async def chunked(request):
        resp = web.StreamResponse()
        resp.enable_chunked_encoding()
        await resp.prepare(request)
        for part in (b"abc", b"", b"d" * 5000, b"end"):
            if part:
                await resp.write(part)
        await resp.write_eof()
        return resp

    async def closing(request):
        port = request.transport.get_extra_info("peername")[1]
        return web.Response(text=str(port), headers={"Connection": "close"})

    app = web.Application()
    app.add_routes([web.post("/echo", echo), web.get("/chunked", chunked),
                    web.get("/close", closing)])
    loop = asyncio.new_event_loop()
    runner = web.AppRunner(app, access_log=None)
    loop.run_until_complete(runner.setup())
    site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=tls_context(certs.cert, certs.key))
    loop.run_until_complete(site.start())
    port = site._server.sockets[0].getsockname()[1]
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    yield f"https://127.0.0.1:{port}", certs
    loop.call_soon_threadsafe(loop.stop)
    thread.join(5)


def test_requests_share_one_connection_and_bodies_arrive_whole(server):
    url, certs = server
    conn = Connection(url, certs.ca)
    try:
        body = bytes(range(256)) * 300            # more than one TLS record
        s1, a1 = conn.request("POST", "/echo", body, {"X-Tag": "one"})
        s2, a2 = conn.request("POST", "/echo", b"", {"X-Tag": "two"})
    finally:
        conn.close()
    port1, tag1, echoed = a1.split(b"|", 2)
    port2, tag2, empty = a2.split(b"|", 2)
    assert (s1, s2, tag1, tag2) == (200, 200, b"one", b"two")
    assert echoed == body and empty == b""
    assert port1 == port2                          # keep-alive: the same client socket


def test_a_chunked_answer_is_read_whole(server):
    url, certs = server
    conn = Connection(url, certs.ca)
    try:
        assert conn.request("GET", "/chunked") == (200, b"abc" + b"d" * 5000 + b"end")
        assert conn.request("GET", "/chunked")[1].endswith(b"end")   # still usable after it
    finally:
        conn.close()


def test_connection_close_is_honoured_and_the_next_request_reconnects(server):
    url, certs = server
    conn = Connection(url, certs.ca)
    try:
        first = conn.request("GET", "/close")
        second = conn.request("GET", "/close")
    finally:
        conn.close()
    assert first[0] == second[0] == 200
    assert first[1] != second[1]                   # a new client socket for the second


def test_a_server_the_ca_did_not_sign_is_refused(server, tmp_path):
    url, _ = server
    other = make_certs(tmp_path / "other")
    conn = Connection(url, other.ca)
    with pytest.raises(ssl.SSLCertVerificationError):
        conn.request("GET", "/chunked")


@pytest.mark.parametrize("reply,said", [
    (b"HTTP/1.1 100 Continue\r\n\r\n" * 20, "more than 10 interim"),
    (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n-5\r\nabc", "negative size"),
])
def test_a_server_that_never_answers_or_frames_a_negative_chunk_is_refused(tmp_path, reply, said):
    """A hostile server (a raw TLS socket here): endless 1xx answers, or a chunk of size -5
    (read(-5) would read to the end), end the exchange with HttpError, not a recursion or a
    read without bound."""
    import socket

    from sealing.https_exchange import Exchange, HttpError
    from sealing.upload_client import client_context
    certs = make_certs(tmp_path)
    srv = socket.create_server(("127.0.0.1", 0))
    ctx = tls_context(certs.cert, certs.key)

    def answer():
        conn, _ = srv.accept()
        with ctx.wrap_socket(conn, server_side=True) as tls:
            tls.recv(65536)
            tls.sendall(reply)
    thread = threading.Thread(target=answer, daemon=True)
    thread.start()
    try:
        with pytest.raises(HttpError, match=said):
            Exchange("127.0.0.1", srv.getsockname()[1], client_context(certs.ca), 10).request(
                "GET", "/")
    finally:
        thread.join(10)
        srv.close()
