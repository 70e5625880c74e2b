"""The shuffler service: HTTPS (aiohttp over TLS 1.2+), no Ray and no server code.

Endpoints (docs/wire-format.md, "Upload protocol"): ``GET /spec`` (the signed round
specification, for holders to fetch and verify), ``POST /reports`` (sealed reports,
each answered with its own code after the request is committed to the store),
``GET /status`` (counts per code, distinct holders, whether released; nothing per
holder) and ``GET /batch`` (the operator only, by an Ed25519 signature over the spec hash
and the time: the peeled inner records in random order, streamed from disk).
Every request is handled start to finish without an ``await`` between its checks and its
commit, so two requests never interleave their checks (one event loop, one writer).
"""
from __future__ import annotations

import json
import socket
import ssl
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from aiohttp import web
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from sealing.round_spec import RoundSpec
from sealing.upload_wire import (BATCH_HEAD, BATCH_SKEW_S, MAX_BODY, SIGNATURE_LEN, WireError,
                                 batch_header, batch_request_message, decode_upload)
from shuffler.intake import Intake

TIME_HEADER = "X-Rknn-Time"
SIGNATURE_HEADER = "X-Rknn-Signature"
CHUNK = 1024                 # records per write of a released batch


@dataclass
class Service:
    """What a running service holds: the signed document it serves, the intake rules, and
    the operator's key that authenticates batch fetches."""
    document: bytes
    spec: RoundSpec
    intake: Intake
    operator: Ed25519PublicKey


def _line(status: int, text: str) -> web.Response:
    return web.Response(status=status, text=text + "\n", content_type="text/plain")


def make_app(service: Service) -> web.Application:
    """The aiohttp application of one service (routes only; TLS is the server's)."""
    app = web.Application(client_max_size=MAX_BODY)
    spec_hash = service.intake.spec_hash

    async def get_spec(_request):
        return web.Response(body=service.document, content_type="application/octet-stream")

    async def post_reports(request):
        body = await request.read()
        try:
            entries = decode_upload(body)
        except WireError as exc:
            return _line(400, f"upload refused: {exc}")
        codes = service.intake.submit(entries)       # committed before this answer
        return web.json_response({"results": codes})

    async def get_status(_request):
        store = service.intake.store
        released, why = service.intake.released()
        return web.json_response({
            "spec_hash": spec_hash.hex(), "opens_at": service.spec.opens_at,
            "deadline": service.spec.deadline, "now": time.time(),
            "accepted": store.accepted(), "distinct_holders": store.distinct_holders(),
            "min_senders": service.spec.min_senders, "released": released, "why_not": why,
            "answers": store.answers()})

    async def get_batch(request):
        refused = _operator_refusal(request, service.operator, spec_hash)
        if refused:
            return _line(401, refused)
        released, why = service.intake.released()
        if not released:
            early = time.time() < service.spec.deadline
            return _line(425 if early else 409, why)
        store = service.intake.store
        count, n = store.accepted(), service.intake.inner_len
        resp = web.StreamResponse(headers={"Content-Type": "application/octet-stream"})
        resp.content_length = BATCH_HEAD + count * (4 + n)
        await resp.prepare(request)
        await resp.write(batch_header(spec_hash, service.intake.peeler.inner_layer, n, count))
        prefix = n.to_bytes(4, "little")
        for records in store.records(CHUNK):
            await resp.write(b"".join(prefix + r for r in records))
        await resp.write_eof()
        return resp

    app.add_routes([web.get("/spec", get_spec), web.post("/reports", post_reports),
                    web.get("/status", get_status), web.get("/batch", get_batch)])
    return app


def _operator_refusal(request, operator: Ed25519PublicKey, spec_hash: bytes) -> str:
    """"" if the request carries the operator's signature over the spec hash and a time
    within :data:`BATCH_SKEW_S` of ours, else one line why not."""
    try:
        stamp = int(request.headers[TIME_HEADER])
        signature = bytes.fromhex(request.headers[SIGNATURE_HEADER])
    except (KeyError, ValueError):
        return (f"batch refused: send {TIME_HEADER} (unix seconds) and {SIGNATURE_HEADER} (hex "
                "Ed25519 signature by the operator's key, docs/wire-format.md)")
    if len(signature) != SIGNATURE_LEN or abs(time.time() - stamp) > BATCH_SKEW_S:
        return f"batch refused: the request's time is more than {BATCH_SKEW_S} s off or its signature is not 64 bytes"
    try:
        operator.verify(signature, batch_request_message(spec_hash, stamp))
    except InvalidSignature:
        return "batch refused: the signature is not the operator's (the key that signed the specification)"
    return ""


def tls_context(cert: str | Path, key: str | Path) -> ssl.SSLContext:
    """A server context: TLS 1.2 or later, the given certificate chain and key."""
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.load_cert_chain(str(cert), str(key))
    return ctx


def bind(host: str, port: int) -> socket.socket:
    """A listening socket (port 0: an ephemeral one; SO_REUSEADDR so a restart gets it back)."""
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise OSError(f"cannot listen on {host}:{port} ({exc.strerror}); choose another --port "
                      "or --host, or stop what holds it") from None
    sock.listen(128)
    return sock


def serve(service: Service, ctx: ssl.SSLContext, sock: socket.socket) -> None:
    """Serve until SIGINT or SIGTERM; prints one line with the URL first (tests read it)."""
    host, port = sock.getsockname()[:2]
    print(f"rknn-ray shuffler: serving https://{host}:{port} for specification "
          f"{service.intake.spec_hash.hex()[:16]}... ({service.spec.job_id} round "
          f"{service.spec.round}), store {service.intake.store.path}", flush=True)
    web.run_app(make_app(service), sock=sock, ssl_context=ctx, print=None,
                access_log=None, handle_signals=True)
    sys.stdout.flush()
