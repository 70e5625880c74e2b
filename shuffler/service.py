"""The shuffler service: HTTPS (aiohttp over TLS 1.2+), no Ray and no server code.

Endpoints (docs/wire-format.md, "Upload protocol"): ``GET /spec`` (the signed round
specification, for holders to fetch and verify), ``POST /spec`` (the operator publishes
one: the document is its own authentication, signed by the operator's key the service was
started with), ``POST /files`` (a file the published specification names by digest, e.g.
the encoder), ``GET /files/<sha256>`` (that file, for holders to fetch and check),
``GET /key`` (this shuffler's HPKE public key, for the operator's specification),
``POST /reports`` (sealed reports, each answered with its own code after the request is
committed to the store), ``GET /status`` (counts per code, distinct and registered
holders, whether released; nothing per holder), ``POST /close`` (the operator only, by an
Ed25519 signature: close the upload window now) and ``GET /batch`` (the operator only, by
an Ed25519 signature over the spec hash and the time: the peeled inner records in random
order, streamed from disk).
Uploads are judged and committed by one writer thread, one group of requests at a time, so
two requests never interleave their checks (one writer); uploads that arrive during one
commit are committed together in the next (group commit, :class:`GroupCommit`), each is
answered only once it is on disk, and the event loop (uvloop where it loads) keeps reading
requests during the fsync.

A published specification and its files are kept under the store folder
(``<store>/<first 16 hex digits of its hash>/``, and ``<store>/current.spec``), so a
service killed and restarted serves the same round from the same store.
"""
from __future__ import annotations

import hashlib
import json
import socket
import ssl
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from aiohttp import web
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from rknn_ray.runio import write_private
from sealing.round_spec import RoundSpec, SpecError, verify
from sealing.upload_wire import (BATCH_HEAD, BATCH_SKEW_S, MAX_BODY, SIGNATURE_LEN, WireError,
                                 batch_header, batch_request_message, close_request_message,
                                 decode_upload)
from shuffler.intake import Intake
from shuffler.store import ReportStore

TIME_HEADER = "X-Rknn-Time"
SIGNATURE_HEADER = "X-Rknn-Signature"
CHUNK = 1024                 # records per write of a released batch
CURRENT = "current.spec"     # the store folder's pointer to the published specification
FILES = "files"


class PublishRefused(ValueError):
    """A specification the service does not take (one line: why, and what would do)."""


@dataclass
class Service:
    """What a running service holds for one specification: the signed document it serves,
    the intake rules, and the operator's key that authenticates batch fetches."""
    document: bytes
    spec: RoundSpec
    intake: Intake
    operator: Ed25519PublicKey
    files: dict = field(default_factory=dict)     # lowercase hex SHA-256 -> the file's bytes
    folder: Path | None = None                    # where published files are kept


@dataclass
class Host:
    """The service's fixed parts (operator key, holder registry, layer key, store folder)
    and the specification it serves now (None until the operator publishes one)."""
    operator: Ed25519PublicKey
    holders: dict
    keypair: object
    store_root: Path
    current: Service | None = None

    def publish(self, document: bytes, store: Path | None = None,
                files: dict | None = None) -> Service:
        """Serve the signed ``document`` (PublishRefused / SpecError with one line if not):
        the same one again is a no-op; another only once the current window has closed."""
        spec = verify(document, self.operator)
        if self.keypair is None and spec.shuffler_keys:
            raise PublishRefused(f"the {spec.model}-model specification names a shuffler and "
                                 "this service is a relay (--relay): serve it with the "
                                 "shuffler's key")
        if self.keypair is not None and not spec.shuffler_keys:
            raise PublishRefused(f"the {spec.model}-model specification names no shuffler key; "
                                 "a service without one is a relay (rknn-ray shuffler serve "
                                 "--relay)")
        if self.keypair is not None and self.keypair.public_bytes() != spec.shuffler_keys[0]:
            raise PublishRefused("this service's key is not the specification's first shuffler "
                                 "key (shuffler_keys[0]; GET /key gives this one): start with "
                                 "the key the operator published, or publish one that names it")
        cur = self.current
        if cur is not None and cur.document == bytes(document):
            return cur
        if cur is not None and time.time() < cur.intake.deadline:
            raise PublishRefused(f"the current specification ({cur.spec.job_id} round "
                                 f"{cur.spec.round}) takes uploads until unix time "
                                 f"{cur.intake.deadline:.0f}: close it (POST /close) or wait")
        spec_hash = spec.content_hash()
        kept = store is None
        folder = Path(store) if store is not None else self.store_root / spec_hash.hex()[:16]
        store_ = ReportStore(folder, spec_hash)
        if kept:
            write_private(folder / "round.spec", bytes(document))
            write_private(self.store_root / CURRENT, bytes(document))
            (folder / FILES).mkdir(mode=0o700, exist_ok=True)
            files = {**(files or {}), **_kept_files(spec, folder / FILES)}
        if cur is not None:
            cur.intake.store.close()
        self.current = Service(bytes(document), spec, Intake(spec, self.holders, self.keypair,
                                                             store_),
                               self.operator, dict(files or {}), folder / FILES if kept else None)
        return self.current

    def add_file(self, body: bytes) -> str:
        """Keep a file the current specification names by digest; its name (PublishRefused if
        it names none)."""
        cur = self.current
        digest = hashlib.sha256(body).hexdigest()
        named = {e.sha256: e.name for e in cur.spec.encoder}
        if digest not in named:
            raise PublishRefused("the file is not one the specification names (its SHA-256 "
                                 "matches none of its encoder files)")
        if digest not in cur.files:
            if cur.folder is not None:
                write_private(cur.folder / digest, body)
            cur.files[digest] = body
        return named[digest]

    def resume(self) -> Service | None:
        """After a restart: the specification last published here, served again."""
        path = self.store_root / CURRENT
        return self.publish(path.read_bytes()) if path.is_file() else None


def _kept_files(spec: RoundSpec, folder: Path) -> dict:
    named = {e.sha256 for e in spec.encoder}
    out = {}
    for path in folder.iterdir() if folder.is_dir() else ():
        body = path.read_bytes()
        if path.name in named and hashlib.sha256(body).hexdigest() == path.name:
            out[path.name] = body
    return out


def _line(status: int, text: str) -> web.Response:
    return web.Response(status=status, text=text + "\n", content_type="text/plain")


_ANSWERS: dict = {}     # a request's codes -> its encoded answer (most requests: one code)


def _results(codes: list[str]) -> web.Response:
    """``{"results": codes}``, the common answers encoded once (json_response per request
    was a tenth of the service's CPU)."""
    key = tuple(codes)
    body = _ANSWERS.get(key) if len(key) <= 4 else None
    if body is None:
        body = json.dumps({"results": codes}).encode()
        if len(key) <= 4 and len(_ANSWERS) < 4096:
            _ANSWERS[key] = body
    return web.Response(body=body, content_type="application/json")


def make_app(host: Host | Service) -> web.Application:
    """The aiohttp application of one service (routes only; TLS is the server's). A bare
    :class:`Service` is served as a host whose specification is fixed."""
    if isinstance(host, Service):
        host = Host(host.operator, host.intake.holders, host.intake.keypair,
                    host.intake.store.path.parent, host)
    app = web.Application(client_max_size=MAX_BODY)
    commits = GroupCommit()
    none_yet = ("no round specification is published here yet: the operator publishes one "
                "(its job with cluster.holders: remote); try again later")

    async def get_spec(_request):
        if host.current is None:
            return _line(404, none_yet)
        return web.Response(body=host.current.document, content_type="application/octet-stream")

    async def post_spec(request):
        body = await request.read()
        try:
            service = await commits.write(host.publish, body)    # between groups, not during one
        except (SpecError, PublishRefused) as exc:
            return _line(409 if isinstance(exc, PublishRefused) else 400,
                         f"specification refused: {exc}")
        return web.json_response({"spec_hash": service.intake.spec_hash.hex(),
                                  "store": str(service.intake.store.path)})

    async def post_file(request):
        if host.current is None:
            return _line(409, none_yet)
        try:
            name = host.add_file(await request.read())
        except PublishRefused as exc:
            return _line(400, f"file refused: {exc}")
        return web.json_response({"name": name})

    async def get_file(request):
        body = host.current.files.get(request.match_info["digest"]) if host.current else None
        if body is None:
            return _line(404, "no file with that SHA-256 here (the specification names its files)")
        return web.Response(body=body, content_type="application/octet-stream")

    async def get_key(_request):
        if host.keypair is None:
            return _line(404, "this service is a relay (local and central models): it has no "
                              "shuffler key and does not anonymize")
        return _line(200, host.keypair.public_bytes().hex())

    async def post_reports(request):
        body = await request.read()
        if host.current is None:
            return _line(409, none_yet)
        try:
            entries = decode_upload(body)
        except WireError as exc:
            return _line(400, f"upload refused: {exc}")
        codes = await commits.submit(host.current.intake, entries)   # committed before this answer
        return _results(codes)

    async def get_status(_request):
        if host.current is None:
            return web.json_response({"published": False, "registered": len(host.holders)})
        service = host.current
        store = service.intake.store
        released, why = service.intake.released()
        return web.json_response({
            "published": True, "spec_hash": service.intake.spec_hash.hex(),
            "opens_at": service.spec.opens_at, "deadline": service.spec.deadline,
            "closes_at": service.intake.deadline, "now": time.time(),
            "accepted": store.accepted(), "distinct_holders": store.distinct_holders(),
            "registered": len(host.holders),
            "min_senders": service.spec.min_senders, "released": released, "why_not": why,
            "answers": store.answers()})

    async def post_close(request):
        if host.current is None:
            return _line(409, none_yet)
        service = host.current
        refused = _operator_refusal(request, service.operator,
                                    close_request_message(service.intake.spec_hash,
                                                          _stamp(request)))
        if refused:
            return _line(401, refused.replace("batch", "close"))
        return web.json_response({"closes_at": await commits.write(service.intake.close_early)})

    async def get_batch(request):
        if host.current is None:
            return _line(409, none_yet)
        service = host.current
        spec_hash = service.intake.spec_hash
        refused = _operator_refusal(request, service.operator,
                                    batch_request_message(spec_hash, _stamp(request)))
        if refused:
            return _line(401, refused)
        released, why = service.intake.released()
        if not released:
            early = time.time() < service.intake.deadline
            return _line(425 if early else 409, why)
        store = service.intake.store
        count, n = store.accepted(), service.intake.inner_len
        resp = web.StreamResponse(headers={"Content-Type": "application/octet-stream"})
        resp.content_length = BATCH_HEAD + count * (4 + n)
        await resp.prepare(request)
        await resp.write(batch_header(spec_hash, service.intake.inner_layer, n, count))
        prefix = n.to_bytes(4, "little")
        for records in store.records(CHUNK):
            await resp.write(b"".join(prefix + r for r in records))
        await resp.write_eof()
        return resp

    app.add_routes([web.get("/spec", get_spec), web.post("/spec", post_spec),
                    web.post("/files", post_file), web.get("/files/{digest}", get_file),
                    web.get("/key", get_key), web.post("/reports", post_reports),
                    web.get("/status", get_status), web.post("/close", post_close),
                    web.get("/batch", get_batch)])
    return app


class GroupCommit:
    """Uploads that arrive while a group is being judged and committed are judged and
    committed together next, in arrival order, in one transaction (one fsync instead of one
    per request). One writer thread does every store write, one group (or one early close)
    at a time, so two requests never interleave their checks; the event loop meanwhile
    reads and parses the next requests (sqlite3 lets go of the GIL during the fsync).
    Each request is answered only after its transaction is on disk."""

    def __init__(self):
        from concurrent.futures import ThreadPoolExecutor  # defers the pool to the first app
        self.pending: list = []
        self.flushing = False
        self.writer = ThreadPoolExecutor(1, thread_name_prefix="shuffler-writer")

    async def submit(self, intake: Intake, entries: list) -> list[str]:
        import asyncio  # defers asyncio to the running service
        loop = asyncio.get_running_loop()
        done = loop.create_future()
        self.pending.append((intake, entries, done))
        if not self.flushing:
            self.flushing = True
            loop.call_soon(self._flush, loop)     # after the handlers already woken queue theirs
        return await done

    async def write(self, fn, *args):
        """``fn(*args)`` on the writer thread, between groups (e.g. the operator's close)."""
        import asyncio  # defers asyncio to the running service
        return await asyncio.get_running_loop().run_in_executor(self.writer, fn, *args)

    def _flush(self, loop) -> None:
        batch, self.pending = self.pending, []
        if not batch:
            self.flushing = False
            return
        job = loop.run_in_executor(self.writer, _judge, batch)
        job.add_done_callback(lambda _: self._flush(loop))   # the next group after this one


def _judge(batch: list) -> None:
    """On the writer thread: each intake's requests judged and committed, then answered."""
    while batch:                  # one intake per group (a new specification starts anew)
        intake = batch[0][0]
        same = [b for b in batch if b[0] is intake]
        batch = [b for b in batch if b[0] is not intake]
        dones = [done for _, _, done in same]
        try:
            results = intake.submit_many([entries for _, entries, _ in same])
        except BaseException as exc:  # noqa: BLE001 - each waiting request answers 500
            results, error = [None] * len(same), exc
        else:
            error = None
        # one wake-up of the event loop answers the whole group (not one per request)
        dones[0].get_loop().call_soon_threadsafe(_settle, dones, results, error)


def _settle(dones: list, results: list, exc) -> None:
    for done, codes in zip(dones, results):
        if not done.done():
            if exc is None:
                done.set_result(codes)
            else:
                done.set_exception(exc)


def _stamp(request) -> int:
    try:
        return int(request.headers[TIME_HEADER])
    except (KeyError, ValueError):
        return -1


def _operator_refusal(request, operator: Ed25519PublicKey, message: bytes) -> str:
    """"" if the request carries the operator's signature over ``message`` (which binds the
    spec hash and the request's time) and a time within :data:`BATCH_SKEW_S` of ours, else
    one line why not."""
    try:
        stamp = int(request.headers[TIME_HEADER])
        signature = bytes.fromhex(request.headers[SIGNATURE_HEADER])
    except (KeyError, ValueError):
        return (f"batch refused: send {TIME_HEADER} (unix seconds) and {SIGNATURE_HEADER} (hex "
                "Ed25519 signature by the operator's key, docs/wire-format.md)")
    if len(signature) != SIGNATURE_LEN or abs(time.time() - stamp) > BATCH_SKEW_S:
        return f"batch refused: the request's time is more than {BATCH_SKEW_S} s off or its signature is not 64 bytes"
    try:
        operator.verify(signature, message)
    except InvalidSignature:
        return "batch refused: the signature is not the operator's (the key that signed the specification)"
    return ""


def tls_context(cert: str | Path, key: str | Path) -> ssl.SSLContext:
    """A server context: TLS 1.2 or later, the given certificate chain and key."""
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    for flag, path in (("--cert", cert), ("--cert-key", key)):
        if not Path(path).is_file():
            raise ValueError(f"{flag}: no file at {path}; give the service's certificate and "
                             "its key (rknn-ray shuffler cert writes server.pem and server.key)")
    try:
        ctx.load_cert_chain(str(cert), str(key))
    except ssl.SSLError as exc:     # OpenSSL's words name neither file
        raise ValueError(f"--cert {cert} and --cert-key {key} are not a certificate (PEM) and "
                         f"its own private key ({exc.reason or exc}); give the pair rknn-ray "
                         "shuffler cert wrote (server.pem, server.key) or your CA's") from None
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


def event_loop():
    """uvloop's event loop where it loads (its TLS and transports are compiled: about a fifth
    less CPU per upload than asyncio's pure-Python SSL protocol), else asyncio's own."""
    import asyncio  # defers asyncio to the one call that starts a loop
    try:
        import uvloop  # defers uvloop (a dependency; a platform without it serves on asyncio)
    except ImportError:
        return asyncio.new_event_loop()
    return uvloop.new_event_loop()


def serve(host: Host | Service, ctx: ssl.SSLContext, sock: socket.socket) -> None:
    """Serve until SIGINT or SIGTERM; prints one line with the URL first (tests read it)."""
    addr, port = sock.getsockname()[:2]
    cur = host.current if isinstance(host, Host) else host
    what = (f"for specification {cur.intake.spec_hash.hex()[:16]}... ({cur.spec.job_id} round "
            f"{cur.spec.round}), store {cur.intake.store.path}" if cur is not None else
            f"waiting for the operator's specification (POST /spec), store {host.store_root}")
    print(f"rknn-ray shuffler: serving https://{addr}:{port} {what}", flush=True)
    web.run_app(make_app(host), sock=sock, ssl_context=ctx, print=None,
                access_log=None, handle_signals=True, loop=event_loop())
    sys.stdout.flush()
