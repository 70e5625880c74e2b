"""One round with the holders off the cluster (``cluster.holders: remote``), seen from the
operator's job: what :class:`rknn_ray.job.session.ProtocolSession` is for simulated holders.

The round: the server actor makes its HPKE key (inside Ray, as always); the driver writes
the round specification (sealing.round_spec: the published encoder's files by digest, the
round's query features, k, the mechanism and its public parameters, eps0, the eps claimed
and the floor of senders it assumes, the server's and the shuffler's keys, the window),
checks that a holder's own accountant (holder.accountant) agrees with the eps it claims,
signs it with the operator's key and publishes it to the shuffler service over HTTPS
(``POST /spec``, ``POST /files``). Holders fetch, verify, answer and upload on their own.
The driver polls the service's public counts, closes the window early once every
registered holder has reported (``remote.close_when_all``) or waits for its deadline, then
fetches the released batch (signed request; the cluster needs no inbound port) and hands
it to the server actor, which opens it in its own processes, exactly as a simulated round's
reports. The guarantee is computed from the distinct holders the shuffler admitted and the
reports the server actually opened, as in the simulation; report.json names the remote
holders and the n opened.
"""
from __future__ import annotations

import hashlib
import json
import math
import os
import time
from pathlib import Path

import numpy as np
import ray

from rknn_ray.accounting.guarantee import guarantee_of
from rknn_ray.errors import RknnError, first_line
from holder.accountant import SpecRefused, mechanism_of, own_cost
from rknn_ray.predictor import predictor_spec
from rknn_ray.job.progress import bar_for
from rknn_ray.job.session import (PartyFailure, Parties, RoundResult, opened_cost,
                                  opener_processes)
from rknn_ray.published_encoder import ENCODER_ARRAYS, PREDICTOR_FILE, encoder_state
from rknn_ray.remote.operator_key import load_operator_key
from rknn_ray.remote.preflight import REACH_FIX
from rknn_ray.remote.registry import read_registry
from rknn_ray.runio import write_json
from sealing.envelope import RoundContext
from sealing.round_spec import EncoderFile, RoundSpec, sign
from sealing.upload_client import Connection, UploadError, fetch_batch, reach_error
from sealing.upload_wire import close_request_message

PUBLISHED = "published"      # the run folder's copy of what holders were given
CHUNK = 4096                 # records per hand-over to the server actor
POLL_S = 0.25                # between /status reads while holders upload: the last holder's
                             # report waits for the next read (1 s cost 0.5 s a round on average)


def _eps0(mechanism) -> float | None:
    """The eps of one holder's own report: the shuffle model's eps0, the local model's eps;
    None in the central model (a holder's vote is sealed for the server, not randomized)."""
    if mechanism.model == "central":
        return None
    local = getattr(mechanism, "local_eps", None)
    return float(local if local is not None else mechanism.params.eps)


class RemoteRoundError(RknnError):
    """The remote round could not be run or released (one line: what, and the fix)."""


class RemoteSession:
    """The server actor of a job whose holders run off the cluster, and its rounds."""

    def __init__(self, cfg, data, job_id: str, out_dir: str, key_file: str | None = None,
                 progress=None, parties=None):
        self.cfg, self.data, self.job_id, self.out_dir = cfg, data, job_id, out_dir
        self.progress = progress
        self.reached_server = False
        r = cfg.remote
        self.url, self.ca = str(r.shuffler), str(r.ca)
        self.key = load_operator_key(r.operator_key)
        self.registry = read_registry(r.registry)
        self.num_clients = self.held_clients = len(self.registry.keys)
        # the shuffle model's shuffler; a relay (local and central models) has no key
        self.shuffler_key = self._shuffler_key() if cfg.privacy.model == "shuffle" else None
        self.server = (parties or Parties()).server_actor().options(
            num_cpus=cfg.cluster.server_cpus).remote(job_id, key_file, cfg.cluster.openers,
                                                     cfg.cluster.window)
        try:
            self.server_public_key = ray.get(self.server.public_key.remote())
        except ray.exceptions.RayActorError as exc:
            raise PartyFailure(f"the server failed to start; nothing was released ({first_line(exc)})",
                               "startup") from None

    # ------------------------------------------------------------------ lifecycle
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def close(self) -> None:
        server, self.server = getattr(self, "server", None), None
        if server is not None:
            try:
                ray.get(server.shutdown.remote(), timeout=30)
            except Exception:  # noqa: BLE001 - the job's own error is the one to show
                pass
            ray.kill(server)

    def prepare_next_round(self, *_a, **_k):
        return None

    def _say(self, text: str) -> None:
        if self.progress is not None:
            self.progress.say(text)

    # ------------------------------------------------------------------ the service
    def _conn(self) -> Connection:
        return Connection(self.url, self.ca, timeout=60.0)

    def _get(self, path: str) -> tuple[int, bytes]:
        conn = self._conn()
        try:
            return conn.request("GET", path)
        except OSError as exc:
            raise RemoteRoundError(reach_error(self.url, self.ca, exc, "remote.ca",
                                               REACH_FIX)) from None
        finally:
            conn.close()

    def _post(self, path: str, body: bytes, headers: dict | None = None) -> bytes:
        conn = self._conn()
        try:
            status, answer = conn.request("POST", path, body, {
                "Content-Type": "application/octet-stream", **(headers or {})})
        except OSError as exc:
            raise RemoteRoundError(reach_error(self.url, self.ca, exc, "remote.ca",
                                               REACH_FIX)) from None
        finally:
            conn.close()
        if status != 200:
            raise RemoteRoundError(f"the shuffler service refused POST {path} (HTTP {status}): "
                                   f"{answer.decode(errors='replace').strip()[:300]}")
        return answer

    def _shuffler_key(self) -> bytes:
        status, body = self._get("/key")
        try:
            key = bytes.fromhex(body.decode().strip()) if status == 200 else b""
        except ValueError:
            key = b""
        if len(key) != 32:
            raise RemoteRoundError(f"GET {self.url}/key did not answer a shuffler key (HTTP "
                                   f"{status}). Fix: point remote.shuffler at rknn-ray shuffler serve")
        return key

    def status(self) -> dict:
        status, body = self._get("/status")
        if status != 200:
            raise RemoteRoundError(f"GET /status answered HTTP {status}")
        return json.loads(body)

    # ------------------------------------------------------------------ a round
    def _published_files(self, encoder) -> list[Path]:
        """predictor.json and encoder.npz for holders (no pickle), in ``<run>/published/``."""
        folder = Path(self.out_dir) / PUBLISHED
        folder.mkdir(exist_ok=True)
        state = encoder_state(encoder)
        if state is None:
            raise RemoteRoundError(f"the {self.cfg.represent.encoder} encoder has no "
                                   "pickle-free form for holders (raw, pca and hog do). Fix: set "
                                   "represent.encoder to one of them")
        meta, arrays = state
        with open(folder / ENCODER_ARRAYS, "wb") as fh:
            np.savez(fh, **arrays)
        write_json(str(folder / PREDICTOR_FILE),
                   predictor_spec(self.cfg, self.data, {"input": "features"}, meta))
        return [folder / PREDICTOR_FILE, folder / ENCODER_ARRAYS]

    def spec_for(self, round_id: int, mechanism, encoder, query_features: np.ndarray,
                 floor: int, connection=None) -> tuple[RoundSpec, list[Path]]:
        """The round's specification (unsigned) and the encoder files it names;
        ``connection``: the round's public connection plan (its rule and prices go in it)."""
        balanced = connection is not None and connection.prices is not None
        p = mechanism.params
        files = self._published_files(encoder)
        now = time.time()
        params = {"num_classes": int(p.num_classes), "r": int(p.r),
                  "max_records_per_client": int(p.max_records_per_client),
                  **json.loads(json.dumps(dict(p.options)))}
        spec = RoundSpec(
            job_id=self.job_id, round=int(round_id), opens_at=int(now) - 1,
            deadline=int(math.ceil(now + float(self.cfg.remote.window_s))),
            model=mechanism.model, mechanism=self.cfg.privacy.mechanism, mechanism_params=params,
            eps0=_eps0(mechanism),
            eps=float(p.eps), delta=float(p.delta), min_senders=int(floor), k=int(p.k),
            connection_rule=connection.rule if balanced else "rknn",
            connection_prices=np.asarray(connection.prices, np.float64) if balanced else None,
            queries=np.ascontiguousarray(query_features, np.float32).reshape(len(query_features), -1),
            encoder=tuple(EncoderFile(f.name, hashlib.sha256(f.read_bytes()).hexdigest(),
                                      f.stat().st_size) for f in files),
            server_key=self.server_public_key,
            shuffler_keys=(self.shuffler_key,) if self.shuffler_key else (),
            payload_len=int(mechanism.message_size),
            allowance=int(mechanism.messages_per_sender()))
        return spec, files

    def _holders_agree(self, spec: RoundSpec) -> None:
        """A holder's own accountant on this specification: refused here, it would be refused
        by every holder (the eps claimed below what they compute, or a mechanism they cannot
        build), so nothing is published."""
        try:
            own_cost(spec, mechanism_of(spec))
        except SpecRefused as exc:
            raise RemoteRoundError(f"holders would refuse this round's specification: {exc}") from None

    def run_round(self, round_id: int, mechanism, encoder, query_features: np.ndarray, ledger,
                  record_release: bool = True, connection=None) -> RoundResult:
        cfg = self.cfg
        ledger.check(guarantee_of(mechanism))        # refuse before anything is published
        self.reached_server = False
        floor = mechanism.min_senders() if mechanism.model == "shuffle" else 1
        if cfg.shuffle.min_senders is not None:
            floor = max(floor, int(cfg.shuffle.min_senders))
        if floor > self.num_clients:
            raise RemoteRoundError(f"the round needs {floor} distinct holders for eps="
                                   f"{mechanism.params.eps:g}, and {self.num_clients} are "
                                   "registered. Fix: register more holders, or raise privacy.eps")
        timings: dict = {}
        spec, files = self.spec_for(round_id, mechanism, encoder, query_features, floor,
                                    connection)
        self._holders_agree(spec)
        document = sign(spec, self.key.sign)
        spec_hash = spec.content_hash()
        (Path(self.out_dir) / PUBLISHED / "round.spec").write_bytes(document)
        self._post("/spec", document)
        for f in files:
            self._post("/files", f.read_bytes())
        eps0 = (f"eps0={spec.eps0:.4g}, " if getattr(mechanism, "local_eps", None) is not None
                or mechanism.model == "local" else "")    # multi-message: no local guarantee
        self._say(f"round {round_id + 1}: specification {spec_hash.hex()[:16]}... published at "
                  f"{self.url} for {self.num_clients} registered holders (floor {floor}, "
                  f"{eps0}eps={spec.eps:.4g}); window closes at "
                  f"{time.strftime('%H:%M:%S UTC', time.gmtime(spec.deadline))}")
        t0 = time.perf_counter()
        st = self._wait_for_holders(spec)
        timings["holders"] = time.perf_counter() - t0
        if st["distinct_holders"] < floor:
            raise RemoteRoundError(f"round {round_id + 1}: {st['distinct_holders']} of "
                                   f"{self.num_clients} registered holders reported, below the "
                                   f"floor of {floor} the guarantee assumes: the shuffler "
                                   "released no batch and nothing was opened. Fix: run the "
                                   "round again when more holders can take part")
        t1 = time.perf_counter()
        ctx = RoundContext(self.job_id, round_id)
        expected = self.num_clients * float(mechanism.describe().get(
            "messages_per_client_expected", 1.0))
        ray.get(self.server.begin_round.remote(ctx, mechanism, None,
                                               opener_processes(cfg.cluster.openers, expected),
                                               spec_hash))
        try:
            header, records = fetch_batch(self.url, self.ca, self.key, spec_hash)
        except (UploadError, OSError, ValueError) as exc:
            raise RemoteRoundError(f"round {round_id + 1}: the batch was not released "
                                   f"({first_line(exc)})") from None
        batch, handed = [], 0
        self.reached_server = True
        for rec in records:
            batch.append(rec)
            if len(batch) == CHUNK:
                handed += self._hand(batch, header.record_len)
                batch = []
        if batch:
            handed += self._hand(batch, header.record_len)
        timings["batch"] = time.perf_counter() - t1
        senders = int(self.status()["distinct_holders"])
        tally = ray.get(self.server.tally.remote())
        counted = tally["messages"]
        guarantee, event = opened_cost(round_id, mechanism, senders, tally, ledger,
                                       self.num_clients)
        seed = cfg.run.seed + 1_000_003 * (round_id + 1)
        out = ray.get(self.server.finish.remote(cfg.run.rng, seed))
        if record_release:
            ledger.record_spent(guarantee, round_id=round_id, messages=out["messages"],
                                clients=self.num_clients)
        timings["server_open"] = out["timings"].get("open_wall", 0.0)
        self._say(f"  remote holders: {senders} of {self.num_clients} reported; {counted} "
                  f"reports opened of {handed} released; eps={guarantee.eps:.4g}")
        shuffler = {"service": self.url, "spec_hash": spec_hash.hex(), "senders": senders,
                    "registered": self.num_clients, "released": handed,
                    "answers": st.get("answers", {}), "closes_at": st.get("closes_at")}
        missing = (max(0, self.num_clients - out["messages"])
                   if mechanism.messages_per_sender() == 1 else None)
        return RoundResult(out["counts"], guarantee, event, mechanism.describe(), out["messages"],
                           out["received"], self.num_clients, dict(out["rejected"]), timings,
                           shuffler, senders, missing, {}, None, None)

    def _hand(self, batch: list, width: int) -> int:
        rows = np.frombuffer(b"".join(batch), np.uint8).reshape(len(batch), width)
        return int(ray.get(self.server.submit_records.remote(rows)))

    def _wait_for_holders(self, spec: RoundSpec) -> dict:
        """The service's counts once the window has closed: early (``remote.close_when_all``)
        when every registered holder has reported, else at the deadline."""
        bar = bar_for(self.progress, "holders reported", self.num_clients, "holders")
        closed = False
        try:
            while True:
                st = self.status()
                bar.set(int(st.get("distinct_holders", 0)))
                if time.time() >= float(st.get("closes_at", spec.deadline)):
                    return st
                if (not closed and self.cfg.remote.close_when_all
                        and int(st.get("distinct_holders", 0)) >= self.num_clients):
                    stamp = int(time.time())
                    sig = self.key.sign(close_request_message(spec.content_hash(), stamp))
                    self._post("/close", b"", {"X-Rknn-Time": str(stamp),
                                               "X-Rknn-Signature": sig.hex()})
                    closed = True
                    continue
                time.sleep(POLL_S)
        finally:
            bar.close()
