"""The round specification: the public, signed document a holder answers (docs/wire-format.md).

Everything a holder needs to take part in one round without trusting or running anything
of the operator's: the round's identity and window, the mechanism and the guarantee it
claims (so the holder can recompute it), the queries and the connection rule, the encoder
files by digest, the recipients' HPKE keys, the message size and allowance.

Serialized without pickle: ``b"RKNNSPEC" | u32 little-endian JSON length | canonical JSON |
raw little-endian arrays``; the SHA-256 of those bytes is the spec hash every sealed report
binds (:mod:`sealing.hpke_report`). The operator signs the hash with Ed25519; a signed
document is the spec bytes followed by the 64-byte signature. Reading refuses any other
encoding of the same content (the bytes must be exactly what :meth:`RoundSpec.to_bytes`
writes), so one specification has one hash. Lives in :mod:`sealing` because every party
(holder, shuffler, server, operator) reads it and it needs nothing of the library; signing
takes the operator's ``sign`` function, so no key lives here.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import struct
from dataclasses import dataclass, field
from typing import Callable

import numpy as np
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

MAGIC = b"RKNNSPEC"
VERSION = 1
FORMAT = "rknn-ray round specification"
SIGNATURE_LEN = 64
SIGNED_LABEL = b"rknn-ray round specification\x00"      # what is signed: label | SHA-256(spec)
MODELS = ("central", "local", "shuffle")
ARRAY_DTYPES = {np.dtype(t).newbyteorder("<").str for t in ("f4", "f8", "i4", "i8", "u1")}
MAX_JSON = 1 << 24


class SpecError(ValueError):
    """A specification that is not well formed, not canonical, or not signed by the operator."""


@dataclass(frozen=True)
class EncoderFile:
    """One file of the published encoder (the run's predictor files): name, SHA-256, size."""
    name: str
    sha256: str
    size: int

    def __post_init__(self):
        if not isinstance(self.name, str) or not self.name or "/" in self.name:
            raise SpecError(f"encoder file name must be a plain non-empty file name, got {self.name!r}")
        if not (isinstance(self.sha256, str) and len(self.sha256) == 64
                and all(c in "0123456789abcdef" for c in self.sha256)):
            raise SpecError(f"encoder file {self.name}: sha256 must be 64 lowercase hex digits")
        _check_int(self.size, f"encoder file {self.name}: size", 0)


@dataclass(frozen=True, eq=False)
class RoundSpec:
    """What one round asks of a holder; see the module docstring and docs/wire-format.md."""
    job_id: str
    round: int
    opens_at: int                 # unix seconds (UTC): the upload window opens
    deadline: int                 # unix seconds (UTC): the window closes
    model: str                    # central | local | shuffle
    mechanism: str
    mechanism_params: dict
    eps0: float | None            # local eps per report (None: central model)
    eps: float                    # the guarantee claimed for the round
    delta: float
    min_senders: int              # floor of distinct senders the guarantee assumes
    k: int                        # queries each record votes for
    connection_rule: str          # "rknn", or a balanced rule with its prices
    queries: np.ndarray           # (m, d) the round's query features
    encoder: tuple[EncoderFile, ...]
    server_key: bytes             # 32 raw X25519 bytes (HPKE recipient, layer 0)
    shuffler_keys: tuple[bytes, ...]   # first hop first (layer 1, 2, ...)
    payload_len: int              # bytes of one message (the server layer's plaintext)
    allowance: int                # messages each holder may send in the round
    connection_prices: np.ndarray | None = None   # (m,) float64 per-query prices, or None
    version: int = field(default=VERSION)

    def __post_init__(self):
        if self.version != VERSION:
            raise SpecError(f"unknown round specification version {self.version} "
                            f"(this program reads version {VERSION})")
        if not isinstance(self.job_id, str) or not self.job_id:
            raise SpecError("job_id must be a non-empty string")
        _check_int(self.round, "round", 0, 2 ** 32 - 1)
        _check_int(self.opens_at, "opens_at", 0)
        _check_int(self.deadline, "deadline", self.opens_at + 1)
        if self.model not in MODELS:
            raise SpecError(f"model must be one of {', '.join(MODELS)}, got {self.model!r}")
        for name in ("mechanism", "connection_rule"):
            if not isinstance(getattr(self, name), str) or not getattr(self, name):
                raise SpecError(f"{name} must be a non-empty string")
        _check_params(self.mechanism_params)   # then a private copy: the caller's dict may change
        object.__setattr__(self, "mechanism_params", json.loads(json.dumps(self.mechanism_params)))
        if self.eps0 is not None:
            _check_float(self.eps0, "eps0", positive=True)
            object.__setattr__(self, "eps0", float(self.eps0))
        elif self.model != "central":
            raise SpecError(f"eps0 is required in the {self.model} model")
        _check_float(self.eps, "eps", positive=True)
        _check_float(self.delta, "delta")
        if not 0 <= self.delta < 1:
            raise SpecError(f"delta must be in [0, 1), got {self.delta}")
        object.__setattr__(self, "eps", float(self.eps))      # 1 and 1.0: one encoding, one hash
        object.__setattr__(self, "delta", float(self.delta))
        _check_int(self.min_senders, "min_senders", 1)
        _check_int(self.k, "k", 1)
        _check_int(self.payload_len, "payload_len", 0, 2 ** 16 - 1)
        _check_int(self.allowance, "allowance", 1)
        object.__setattr__(self, "queries", _frozen_array(self.queries, "queries", ndim=2))
        if self.connection_prices is not None:
            prices = _frozen_array(self.connection_prices, "connection_prices", ndim=1)
            if prices.shape != (self.queries.shape[0],) or prices.dtype != np.dtype("<f8"):
                raise SpecError(f"connection_prices must be float64 with one price per query "
                                f"({self.queries.shape[0]}), got {prices.dtype} {prices.shape}")
            object.__setattr__(self, "connection_prices", prices)
        object.__setattr__(self, "encoder", tuple(self.encoder))
        if not self.encoder or not all(isinstance(e, EncoderFile) for e in self.encoder):
            raise SpecError("encoder must list at least one EncoderFile")
        object.__setattr__(self, "server_key", _key(self.server_key, "server_key"))
        object.__setattr__(self, "shuffler_keys",
                           tuple(_key(k, f"shuffler_keys[{i}]") for i, k in enumerate(self.shuffler_keys)))
        if self.model == "shuffle" and not self.shuffler_keys:
            raise SpecError("the shuffle model needs at least one shuffler key")

    # ------------------------------------------------------------------ bytes

    def _arrays(self) -> list[tuple[str, np.ndarray]]:
        arrays = [("queries", self.queries)]
        if self.connection_prices is not None:
            arrays.append(("connection_prices", self.connection_prices))
        return arrays

    def to_json(self) -> dict:
        """The JSON part (arrays described by name, dtype and shape; their bytes follow it)."""
        return {
            "format": FORMAT, "version": self.version,
            "job_id": self.job_id, "round": self.round,
            "opens_at": self.opens_at, "deadline": self.deadline,
            "model": self.model, "mechanism": self.mechanism,
            "mechanism_params": self.mechanism_params,
            "eps0": self.eps0, "eps": self.eps, "delta": self.delta,
            "min_senders": self.min_senders, "k": self.k,
            "connection_rule": self.connection_rule,
            "encoder": [{"name": e.name, "sha256": e.sha256, "size": e.size} for e in self.encoder],
            "server_key": self.server_key.hex(),
            "shuffler_keys": [k.hex() for k in self.shuffler_keys],
            "payload_len": self.payload_len, "allowance": self.allowance,
            "arrays": [{"name": n, "dtype": a.dtype.str, "shape": list(a.shape)}
                       for n, a in self._arrays()],
        }

    def to_bytes(self) -> bytes:
        """The canonical bytes: magic, u32 LE JSON length, JSON, arrays (C order, little-endian)."""
        text = json.dumps(self.to_json(), sort_keys=True, separators=(",", ":"),
                          ensure_ascii=True, allow_nan=False).encode("ascii")
        return (MAGIC + struct.pack("<I", len(text)) + text
                + b"".join(a.tobytes(order="C") for _, a in self._arrays()))

    def content_hash(self) -> bytes:
        """SHA-256 of :meth:`to_bytes`: the spec hash every sealed report of the round binds
        (computed once: the specification is immutable)."""
        cached = self.__dict__.get("_content_hash")
        if cached is None:
            cached = hashlib.sha256(self.to_bytes()).digest()
            object.__setattr__(self, "_content_hash", cached)
        return cached

    def __eq__(self, other) -> bool:
        return isinstance(other, RoundSpec) and self.to_bytes() == other.to_bytes()

    __hash__ = None

    def replace(self, **changes) -> "RoundSpec":
        """A copy with some fields changed (validated again)."""
        return dataclasses.replace(self, **changes)

    @classmethod
    def from_bytes(cls, data: bytes) -> "RoundSpec":
        """Parse spec bytes; SpecError unless they are exactly what :meth:`to_bytes` writes."""
        data = bytes(data)
        if len(data) < len(MAGIC) + 4 or data[:len(MAGIC)] != MAGIC:
            raise SpecError("not a round specification (magic bytes RKNNSPEC missing)")
        (jlen,) = struct.unpack_from("<I", data, len(MAGIC))
        start = len(MAGIC) + 4
        if jlen > MAX_JSON or start + jlen > len(data):
            raise SpecError(f"round specification truncated or oversized (JSON length {jlen})")
        try:
            doc = json.loads(data[start:start + jlen].decode("ascii"))
        except (UnicodeDecodeError, json.JSONDecodeError):
            raise SpecError("round specification JSON does not parse (ASCII JSON expected)") from None
        if not isinstance(doc, dict) or doc.get("format") != FORMAT:
            raise SpecError(f"not a round specification (format is not {FORMAT!r})")
        if doc.get("version") != VERSION:
            raise SpecError(f"unknown round specification version {doc.get('version')!r} "
                            f"(this program reads version {VERSION})")
        spec = cls._from_json(doc, memoryview(data)[start + jlen:])
        if spec.to_bytes() != data:
            raise SpecError("round specification is not in canonical form (its bytes differ "
                            "from what its content writes)")
        return spec

    @classmethod
    def _from_json(cls, doc: dict, blob: memoryview) -> "RoundSpec":
        names = {f.name for f in dataclasses.fields(cls)} - {"queries", "connection_prices"}
        known = names | {"format", "arrays"}
        unknown = sorted(set(doc) - known)
        missing = sorted(known - set(doc))
        if unknown or missing:
            raise SpecError(f"round specification fields: unknown {unknown}, missing {missing}")
        descs = doc["arrays"] if isinstance(doc["arrays"], list) else [doc["arrays"]]
        arrays, offset = {}, 0
        for desc in descs:
            if (not isinstance(desc, dict) or set(desc) != {"name", "dtype", "shape"}
                    or desc["name"] not in ("queries", "connection_prices") or desc["name"] in arrays
                    or desc["dtype"] not in ARRAY_DTYPES or not isinstance(desc["shape"], list)
                    or not all(isinstance(s, int) and not isinstance(s, bool) and s >= 0
                               for s in desc["shape"])):
                raise SpecError(f"bad array description {desc!r}")
            dtype = np.dtype(desc["dtype"])
            nbytes = math.prod(desc["shape"]) * dtype.itemsize
            if offset + nbytes > len(blob):
                raise SpecError(f"array {desc['name']} runs past the end of the specification")
            arrays[desc["name"]] = np.frombuffer(blob[offset:offset + nbytes], dtype).reshape(desc["shape"])
            offset += nbytes
        if "queries" not in arrays:
            raise SpecError("round specification has no queries array")
        fields = {n: doc[n] for n in names}
        try:
            fields["encoder"] = tuple(EncoderFile(**e) for e in doc["encoder"])
            fields["server_key"] = bytes.fromhex(doc["server_key"])
            fields["shuffler_keys"] = tuple(bytes.fromhex(k) for k in doc["shuffler_keys"])
        except (TypeError, ValueError, AttributeError) as exc:
            raise SpecError(f"bad encoder or key field: {exc}") from None
        return cls(**fields, queries=arrays["queries"],
                   connection_prices=arrays.get("connection_prices"))


# ---------------------------------------------------------------------- signing

def signed_message(content_hash: bytes) -> bytes:
    """What the operator's Ed25519 key signs: a label, then the spec's SHA-256."""
    return SIGNED_LABEL + bytes(content_hash)


def sign(spec: RoundSpec, sign_fn: Callable[[bytes], bytes]) -> bytes:
    """The signed document: spec bytes, then ``sign_fn(label | SHA-256(spec bytes))``.

    ``sign_fn`` is the operator's key's ``sign`` (e.g. ``Ed25519PrivateKey.sign``): the key
    stays with its holder.
    """
    body = spec.to_bytes()
    signature = sign_fn(signed_message(hashlib.sha256(body).digest()))
    if len(signature) != SIGNATURE_LEN:
        raise SpecError(f"an Ed25519 signature is {SIGNATURE_LEN} bytes, got {len(signature)}")
    return body + signature


def verify(document: bytes, operator_key: bytes | Ed25519PublicKey) -> RoundSpec:
    """The specification in a signed document, or SpecError (bad signature, any modified
    byte, unknown version, not canonical). The signature is checked before anything is parsed."""
    document = bytes(document)
    if isinstance(operator_key, (bytes, bytearray)):
        if len(operator_key) != 32:
            raise SpecError(f"the operator's key is 32 raw Ed25519 bytes, got {len(operator_key)}")
        operator_key = Ed25519PublicKey.from_public_bytes(bytes(operator_key))
    if len(document) <= SIGNATURE_LEN:
        raise SpecError("signed round specification too short")
    body, signature = document[:-SIGNATURE_LEN], document[-SIGNATURE_LEN:]
    try:
        operator_key.verify(signature, signed_message(hashlib.sha256(body).digest()))
    except InvalidSignature:
        raise SpecError("round specification signature does not verify with the operator's "
                        "key (modified, or signed by another key)") from None
    return RoundSpec.from_bytes(body)


# ---------------------------------------------------------------------- checks

def _check_int(value, name: str, lo: int | None = None, hi: int | None = None) -> None:
    if not isinstance(value, int) or isinstance(value, bool):
        raise SpecError(f"{name} must be an integer, got {value!r}")
    if (lo is not None and value < lo) or (hi is not None and value > hi):
        raise SpecError(f"{name} must be in [{lo}, {hi if hi is not None else 'inf'}], got {value}")


def _check_float(value, name: str, positive: bool = False) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise SpecError(f"{name} must be a finite number, got {value!r}")
    if positive and value <= 0:
        raise SpecError(f"{name} must be > 0, got {value}")


def _check_params(params) -> None:
    """Mechanism parameters: a JSON object of finite numbers, strings, booleans, null, lists."""
    if not isinstance(params, dict) or not all(isinstance(k, str) for k in params):
        raise SpecError("mechanism_params must be a JSON object with string keys")

    def ok(v) -> bool:
        if v is None or isinstance(v, (bool, str, int)):
            return True
        if isinstance(v, float):
            return math.isfinite(v)
        return isinstance(v, list) and all(ok(x) for x in v)

    bad = sorted(k for k, v in params.items() if not ok(v))
    if bad:
        raise SpecError(f"mechanism_params {bad}: only finite numbers, strings, booleans, null "
                        "and lists of them")


def _frozen_array(a, name: str, ndim: int) -> np.ndarray:
    """A read-only little-endian C-order copy of a numeric array of an allowed dtype."""
    a = np.asarray(a)
    if a.ndim != ndim:
        raise SpecError(f"{name} must be {ndim}-D, got shape {a.shape}")
    little = a.dtype.newbyteorder("<") if a.dtype.byteorder in "<>=" else a.dtype
    if little.str not in ARRAY_DTYPES:
        raise SpecError(f"{name} dtype {a.dtype} is not one of float32/float64/int32/int64/uint8")
    if a.dtype.kind == "f" and not np.isfinite(a).all():
        raise SpecError(f"{name} holds NaN or infinity")
    out = np.ascontiguousarray(a, dtype=little).copy()
    out.flags.writeable = False
    return out


def _key(key, name: str) -> bytes:
    if isinstance(key, str):
        raise SpecError(f"{name} must be 32 raw bytes, not a string")
    key = bytes(key)
    if len(key) != 32:
        raise SpecError(f"{name} must be 32 raw X25519 bytes, got {len(key)}")
    return key
