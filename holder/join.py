"""``rknn-ray holder join``: one holder answers the round a service publishes.

Order matters: verify the specification (the operator's signature) before reading
anything it says; fetch the encoder files by digest and check them; cost the round with
this holder's own accountant and charge its own ledger; only then randomize, seal and
upload. The sealed reports are kept in the key folder (``sent/<spec hash>``) before the
first upload, so a retry re-sends the same bytes and is never re-randomized.
"""
from __future__ import annotations

import hashlib
import tempfile
import os
import time
from dataclasses import dataclass
from pathlib import Path

from holder import answer
from holder.accountant import SpecRefused, mechanism_of, own_cost
from holder.identity import Identity
from holder.ledger import HolderLedger, Policy
from rknn_ray.published_encoder import ENCODER_ARRAYS, PREDICTOR_FILE, PublishedEncoder
from rknn_ray.runio import write_private
from sealing.round_spec import RoundSpec, verify
from sealing.upload_client import (Connection, UploadError, fetch, reach_error, send_entries,
                                   sign_reports)
from sealing.upload_wire import ENTRY_HEAD, MAX_BODY, MAX_ENTRIES, UPLOAD_HEAD

SENT = "sent"
#: what a holder can do when the service is not reached (reach_error)
REACH_FIX = ("check the URL the operator gave; if the service is not up yet, join with --wait "
             "SECONDS")


@dataclass(frozen=True)
class Joined:
    spec: RoundSpec
    codes: list
    charged: bool               # False: a retry (charged when first answered)
    eps: float


def fetch_spec(url: str, cafile, operator_key: bytes, wait_s: float = 0.0) -> RoundSpec:
    """The service's specification, verified with the operator's key (SpecError if not).
    ``wait_s``: while none is published yet (HTTP 404) or the service refuses connections
    (not started yet), ask again for up to this long."""
    until = time.monotonic() + float(wait_s)
    while True:
        try:
            status, body = fetch(url, cafile, "/spec")
        except ConnectionError as exc:      # not up yet: waited for like an unpublished round
            if time.monotonic() >= until:
                fix = (f"check the URL the operator gave (waited {wait_s:g} s for it)"
                       if wait_s > 0 else REACH_FIX)
                raise UploadError(reach_error(url, cafile, exc, "--cafile", fix)) from None
            status, body = 0, b""
        except OSError as exc:              # a certificate that does not verify, a bad host
            raise UploadError(reach_error(url, cafile, exc, "--cafile", REACH_FIX)) from None
        if status not in (0, 404) or time.monotonic() >= until:
            break
        time.sleep(min(1.0, max(0.05, until - time.monotonic())))
    if status != 200:
        raise UploadError(f"GET /spec answered HTTP {status}: {body.decode(errors='replace').strip()[:200]}")
    return verify(body, operator_key)


def fetch_encoder(url: str, cafile, spec: RoundSpec, folder: Path) -> PublishedEncoder:
    """The encoder files the specification names, fetched by digest and checked, then loaded."""
    conn = Connection(url, cafile)
    try:
        for f in spec.encoder:
            status, body = conn.request("GET", f"/files/{f.sha256}")
            if status != 200:
                raise UploadError(f"GET /files/{f.sha256[:16]}... ({f.name}) answered HTTP {status}")
            if hashlib.sha256(body).hexdigest() != f.sha256 or len(body) != f.size:
                raise SpecRefused(f"the encoder file {f.name} served is not the one the "
                                  "specification names (its SHA-256 or size differs): not answered")
            (folder / f.name).write_bytes(body)
    finally:
        conn.close()
    names = {f.name for f in spec.encoder}
    if PREDICTOR_FILE not in names:
        raise SpecRefused(f"the specification's encoder has no {PREDICTOR_FILE}: not answered")
    npz = folder / ENCODER_ARRAYS
    return PublishedEncoder.from_files(str(folder / PREDICTOR_FILE),
                                       str(npz) if ENCODER_ARRAYS in names else None)


def _check_window(spec: RoundSpec, now: float) -> None:
    """Nothing is charged for a round whose upload window is not open (one line: when it is)."""
    def at(t: int) -> str:
        return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(t))
    if now < spec.opens_at:
        raise SpecRefused(f"the round's upload window opens at {at(spec.opens_at)}; run join "
                          "again then (nothing charged)")
    if now >= spec.deadline:
        raise SpecRefused(f"the round's upload window closed at {at(spec.deadline)}: too late "
                          "to answer it (nothing charged, nothing uploaded)")


def one_request(reports: list[bytes]) -> int:
    """Entries per request so that a holder's reports go in one request when they fit the
    protocol's limits: the service commits a request whole, so it never counts a holder as
    reported while part of its messages are still on the way (the operator closes the window
    once every registered holder has reported)."""
    size = max(1, len(reports[0]) if reports else 1) + ENTRY_HEAD
    return max(1, min(MAX_ENTRIES, (MAX_BODY - UPLOAD_HEAD) // size))


def _sent_path(key_dir: Path, spec: RoundSpec) -> Path:
    return key_dir / SENT / spec.content_hash().hex()


def _keep(path: Path, reports: list[bytes]) -> None:
    """The sealed reports, written whole (atomic) before the first upload."""
    path.parent.mkdir(mode=0o700, exist_ok=True)
    write_private(path, len(reports[0]).to_bytes(4, "little") + b"".join(reports))


def _kept(path: Path) -> list[bytes]:
    data = path.read_bytes()
    n = int.from_bytes(data[:4], "little")
    return [data[i:i + n] for i in range(4, len(data), n)]


def join(url: str, cafile, identity: Identity, key_dir: str | os.PathLike, data: str,
         ledger: str, operator_key: bytes, policy: Policy, label: str | None = None,
         assume_collusion: bool = False, wait_s: float = 0.0) -> Joined:
    """Answer the service's round (module docstring); SpecRefused, SpecError, UploadError,
    DataFileError with one line otherwise. ``wait_s``: how long to wait for the operator to
    publish a specification."""
    spec, encoder = published(url, cafile, operator_key, wait_s)
    return answer_round(url, cafile, spec, encoder, identity, key_dir, data, ledger, policy,
                        label, assume_collusion)


def published(url: str, cafile, operator_key: bytes,
              wait_s: float = 0.0) -> tuple[RoundSpec, PublishedEncoder]:
    """The verified specification and its checked encoder (fetched once for many holders)."""
    spec = fetch_spec(url, cafile, operator_key, wait_s)
    with tempfile.TemporaryDirectory(prefix="rknn-holder-") as tmp:
        return spec, fetch_encoder(url, cafile, spec, Path(tmp))


def answer_round(url: str, cafile, spec: RoundSpec, encoder: PublishedEncoder,
                 identity: Identity, key_dir: str | os.PathLike, data: str, ledger: str,
                 policy: Policy, label: str | None = None, assume_collusion: bool = False,
                 conn: Connection | None = None) -> Joined:
    """One holder's answer to a verified specification: charge its ledger, seal, upload
    (over ``conn`` when given, else a connection of its own)."""
    turn = prepare(spec, encoder, identity, key_dir, data, ledger, policy, label,
                   assume_collusion)
    if turn.reports is None:
        try:
            messages = answer.payloads(spec, turn.mech, identity, encoder, None, turn.labels,
                                       turn.inputs)
        except SpecRefused as exc:
            raise turn.book.refuse(spec, str(exc)) from None
        turn.sealed(answer.seal(spec, identity, messages))
    return turn.send(url, cafile, conn)


@dataclass
class Turn:
    """One holder's answer between its checks and its upload (join-many answers many
    holders' messages at once between the two)."""
    spec: RoundSpec
    identity: Identity
    book: HolderLedger
    sent: Path
    retry: bool
    inputs: object
    labels: object
    mech: object = None
    cost: object = None
    reports: list | None = None       # None until sealed (a retry: the kept ones)
    eps: float | None = None

    def sealed(self, reports: list[bytes]) -> None:
        """Charge the ledger (a first answer), keep the reports before the first upload."""
        if not self.retry:
            self.book.charge(self.spec, self.cost)
        _keep(self.sent, reports)
        self.reports, self.eps = reports, self.cost.eps

    def send(self, url: str, cafile, conn: Connection | None = None) -> Joined:
        own = conn is None
        conn = Connection(url, cafile) if own else conn
        try:
            codes = send_entries(conn, sign_reports(self.identity.key, self.reports),
                                 one_request(self.reports))
        finally:
            if own:
                conn.close()
        return Joined(self.spec, codes, not self.retry, self.eps)


def prepare(spec: RoundSpec, encoder: PublishedEncoder, identity: Identity,
            key_dir: str | os.PathLike, data: str, ledger: str, policy: Policy,
            label: str | None = None, assume_collusion: bool = False) -> Turn:
    """A holder's checks before its messages: the window, its rows, its ledger (a retry
    takes the kept reports), the mechanism and this holder's own cost of the round."""
    key_dir = Path(key_dir)
    _check_window(spec, time.time())
    rows, labels = answer.read_rows(data, label, encoder)
    inputs = encoder.inputs(rows)
    book = HolderLedger(ledger, Path(data).name, inputs, policy)
    sent = _sent_path(key_dir, spec)
    retry = book.answered(spec)
    turn = Turn(spec, identity, book, sent, retry, inputs, labels)
    if retry and sent.is_file():
        turn.reports = _kept(sent)
        return turn
    try:
        turn.mech = mechanism_of(spec)
        turn.cost = own_cost(spec, turn.mech, assume_collusion)
    except SpecRefused as exc:
        raise book.refuse(spec, str(exc)) from None
    return turn
