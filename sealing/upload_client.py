"""A minimal client of the shuffler service (HTTPS, standard library only, no Ray).

For holders (each signs its own reports with its own Ed25519 key) and the operator
(fetches the released batch). Retries are idempotent: a retry re-sends the same entries,
so a report the service kept before the connection broke comes back ``duplicate``, never
twice. The server is verified against a CA file; there is no way to turn that off.
"""
from __future__ import annotations

import http.client
import json
import os
import ssl
import time
from typing import Callable, Iterator
from urllib.parse import urlsplit

from sealing.hpke_report import HEADER_LEN, SPEC_HASH_LEN
from sealing.https_exchange import Exchange
from sealing.upload_wire import (SUCCESS, BatchHeader, Entry, WireError, batch_request_message,
                                 encode_upload, read_batch, sign_entry)

RETRYABLE = (OSError, http.client.HTTPException, ssl.SSLError)


class UploadError(RuntimeError):
    """The service refused a request, or could not be reached after the retries (one line)."""


def client_context(cafile: str | os.PathLike) -> ssl.SSLContext:
    """TLS 1.2+, the server verified against ``cafile`` (certificate and host name).
    ValueError with one line naming the file if it is missing or holds no certificate (a
    key or another file given by mistake), which OpenSSL would say without the file's name."""
    if not os.path.isfile(cafile):
        raise ValueError(f"the CA file {cafile} does not exist. Fix: give the CA certificate "
                         "the service's certificate is signed with (rknn-ray shuffler cert "
                         "writes it as ca.pem)")
    try:
        ctx = ssl.create_default_context(cafile=str(cafile))
    except ssl.SSLError:
        raise ValueError(f"{cafile} holds no CA certificate (PEM). Fix: give the CA certificate "
                         "the service's certificate is signed with (ca.pem of rknn-ray "
                         "shuffler cert), not a key file") from None
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    return ctx


def reach_error(url: str, cafile: str | os.PathLike, exc: OSError, ca_flag: str,
                fix: str) -> str:
    """One line for a request to the service at ``url`` that failed in transport: a
    certificate that does not verify against ``cafile`` (given as ``ca_flag``), or a service
    not reached (``fix``: what the caller can do about it)."""
    if isinstance(exc, ssl.SSLCertVerificationError):
        why = exc.verify_message or str(exc)
        return (f"the service at {url} did not prove itself with a certificate of the CA in "
                f"{cafile} ({why}). Fix: give as {ca_flag} the CA that signed the service's "
                "certificate, and a URL whose host that certificate names")
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    return (f"the shuffler service at {url} cannot be reached ({type(exc).__name__}"
            f"{': ' + text if text else ''}). Fix: {fix}")


class Connection:
    """One keep-alive HTTPS connection to a service, reopened after any failure."""

    def __init__(self, url: str, cafile: str | os.PathLike, timeout: float = 30.0):
        parts = urlsplit(url)
        if parts.scheme != "https" or not parts.hostname:
            raise ValueError(f"the shuffler's URL must be https://HOST:PORT, got {url!r}")
        self.host, self.port, self.timeout = parts.hostname, parts.port or 443, timeout
        self.ctx = client_context(cafile)
        self._conn: http.client.HTTPSConnection | Exchange | None = None  # stream(): the former

    def request(self, method: str, path: str, body: bytes | None = None,
                headers: dict | None = None) -> tuple[int, bytes]:
        """``(status, body)``; any transport failure raises (and drops the connection)."""
        if self._conn is None or not getattr(self._conn, "open", False):
            self.close()
            self._conn = Exchange(self.host, self.port, self.ctx, self.timeout)
        try:
            return self._conn.request(method, path, body, headers)
        except BaseException:
            self.close()
            raise

    def stream(self, method: str, path: str, headers: dict) -> http.client.HTTPResponse:
        self.close()
        self._conn = http.client.HTTPSConnection(self.host, self.port, timeout=self.timeout,
                                                 context=self.ctx)
        self._conn.request(method, path, headers=headers)
        return self._conn.getresponse()

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None


def sign_reports(holder_key, reports: list[bytes]) -> list[Entry]:
    """Entries for ``reports`` signed by ``holder_key`` (an ``Ed25519PrivateKey``)."""
    raw = getattr(holder_key, "public_bytes_raw", None)     # holder.signing's key has it
    key_id = raw() if raw is not None else holder_key.public_key().public_bytes_raw()
    return [sign_entry(key_id, holder_key.sign, r) for r in reports]


def send_entries(conn: Connection, entries: list[Entry], per_request: int = 100,
                 retries: int = 8, backoff: float = 0.25,
                 on_answer: Callable[[list[Entry], list[str]], None] | None = None) -> list[str]:
    """Each entry's code, ``per_request`` entries per ``POST /reports``; a request that
    fails in transit or with a 5xx is re-sent unchanged up to ``retries`` times."""
    codes: list[str] = []
    for at in range(0, len(entries), per_request):
        chunk = entries[at:at + per_request]
        body = encode_upload(chunk)
        for attempt in range(retries + 1):
            try:
                status, answer = conn.request("POST", "/reports", body,
                                              {"Content-Type": "application/octet-stream"})
            except RETRYABLE as exc:
                failure = f"{type(exc).__name__}: {exc}"
            else:
                if status == 200:
                    got = json.loads(answer)["results"]
                    if len(got) != len(chunk):
                        raise UploadError(f"the service answered {len(got)} codes for {len(chunk)} reports")
                    if on_answer:
                        on_answer(chunk, got)
                    codes += got
                    break
                if status < 500:
                    raise UploadError(f"upload refused with HTTP {status}: "
                                      f"{answer.decode(errors='replace').strip()[:200]}")
                failure = f"HTTP {status}"
            if attempt == retries:
                raise UploadError(f"upload to {conn.host}:{conn.port} failed {retries + 1} times "
                                  f"(last: {failure}); retry later: the same reports are counted once")
            time.sleep(backoff * 2 ** min(attempt, 5))
    return codes


def upload(url: str, cafile: str | os.PathLike, holder_key, spec_hash: bytes,
           reports: list[bytes], per_request: int = 100, retries: int = 8) -> list[str]:
    """Upload one holder's sealed reports; each report's code (``accepted`` or
    ``duplicate`` mean it is kept; anything else is a refusal, see docs/wire-format.md)."""
    if len(spec_hash) != SPEC_HASH_LEN:
        raise ValueError(f"a spec hash is {SPEC_HASH_LEN} bytes, got {len(spec_hash)}")
    for r in reports:
        if len(r) < HEADER_LEN or bytes(r[2:34]) != bytes(spec_hash):
            raise ValueError("a report is not sealed for this specification (its header's spec "
                             "hash differs): seal it for the specification you fetched")
    conn = Connection(url, cafile)
    try:
        return send_entries(conn, sign_reports(holder_key, reports), per_request, retries)
    finally:
        conn.close()


def all_kept(codes: list[str]) -> bool:
    return all(c in SUCCESS for c in codes)


def fetch(url: str, cafile: str | os.PathLike, path: str) -> tuple[int, bytes]:
    """``(status, body)`` of a GET (``/spec``, ``/status``)."""
    conn = Connection(url, cafile)
    try:
        return conn.request("GET", path)
    finally:
        conn.close()


def fetch_batch(url: str, cafile: str | os.PathLike, operator_key, spec_hash: bytes,
                clock: Callable[[], float] = time.time) -> tuple[BatchHeader, Iterator[bytes]]:
    """The released batch (the operator's ``Ed25519PrivateKey`` signs the request): its
    header and an iterator over its records, read from the stream as they are used.
    UploadError with the service's one line if it is not released (HTTP 425 or 409)."""
    stamp = int(clock())
    signature = operator_key.sign(batch_request_message(spec_hash, stamp))
    conn = Connection(url, cafile)
    resp = conn.stream("GET", "/batch", {"X-Rknn-Time": str(stamp),
                                         "X-Rknn-Signature": signature.hex()})
    if resp.status != 200:
        text = resp.read().decode(errors="replace").strip()
        conn.close()
        raise UploadError(f"HTTP {resp.status}: {text}")
    header, records = read_batch(resp.read)
    if header.spec_hash != bytes(spec_hash):
        conn.close()
        raise WireError("the batch is for another specification")

    def closing() -> Iterator[bytes]:
        try:
            yield from records
        finally:
            conn.close()
    return header, closing()
