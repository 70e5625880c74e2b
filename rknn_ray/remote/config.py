"""The ``remote`` config section: where the operator's job finds the shuffler service, the
key it signs with and the holder registry, and how long the upload window stays open.

Read only with ``cluster.holders: remote``; :func:`check_remote` ties it to the rest of the
config (what the holder program implements today: one round, a user's table, one shuffler hop
in the shuffle model; a relay that does not anonymize in the local and central
models).
"""
from __future__ import annotations

from dataclasses import dataclass

from rknn_ray.errors import ConfigError
from rknn_ray.keyspec import key, path_or_null


@dataclass(frozen=True)
class RemoteConfig:
    shuffler: str | None = key(None, "cluster.holders=remote: the shuffler service, "
                               "https://HOST:PORT (rknn-ray shuffler serve)", str, nullable=True,
                               accepts_text="an https:// URL, or null")
    ca: str | None = key(None, "cluster.holders=remote: the CA certificate the service's TLS is "
                         "checked with", str, nullable=True, accepts_text="a file path, or null",
                         check=path_or_null("set remote.ca to the CA certificate file"))
    operator_key: str | None = key(None, "cluster.holders=remote: the operator's Ed25519 key "
                                   "file (rknn-ray operator keygen); signs the round "
                                   "specification and the batch fetch", str, nullable=True,
                                   accepts_text="a file path, or null",
                                   check=path_or_null("set remote.operator_key to the key file"))
    registry: str | None = key(None, "cluster.holders=remote: the holder registry (one hex "
                               "Ed25519 key and record count per line; the shuffler's --holders "
                               "file): which holders take part and how many records each holds "
                               "are public", str, nullable=True,
                               accepts_text="a file path, or null",
                               check=path_or_null("set remote.registry to the registry file"))
    window_s: float = key(600.0, "cluster.holders=remote: seconds the upload window stays open",
                          float, low=1, high=7 * 86400)
    close_when_all: bool = key(True, "cluster.holders=remote: close the window as soon as every "
                               "registered holder has reported (else at its deadline)", bool)


REQUIRED = ("shuffler", "ca", "operator_key", "registry")


def check_remote(cfg: dict) -> None:
    """``cluster.holders: remote`` with what the holder program answers (one line each)."""
    if cfg["cluster"].get("holders", "in_cluster") != "remote":
        return
    r, p, d = cfg["remote"], cfg["privacy"], cfg["data"]
    for name in REQUIRED:
        if not r.get(name):
            raise ConfigError(f"remote.{name}", "is not set, and cluster.holders=remote needs it",
                              "give the shuffler's URL, its CA, the operator's key and the holder "
                              "registry (rknn-ray trial writes all four)")
    if not str(r["shuffler"]).startswith("https://"):
        raise ConfigError("remote.shuffler", f"{r['shuffler']!r} is not an https:// URL",
                          "write https://HOST:PORT of rknn-ray shuffler serve")
    if p["multi_record"] == "each":
        raise ConfigError("privacy.multi_record", "'each' with cluster.holders=remote: a holder "
                          "sends one report for its records (sample)", "set privacy.multi_record=sample")
    if d["dataset"] != "table":
        raise ConfigError("data.dataset", f"{d['dataset']!r} with cluster.holders=remote: "
                          "holders bring their own table rows", "set data.dataset=table")
    private = d.get("private") or {}
    if private.get("path") or private.get("sites"):
        raise ConfigError("data.private.path", "is set with cluster.holders=remote: the "
                          "operator's job never reads the holders' rows (each holder reads its "
                          "own)", "unset data.private.path and data.private.sites; keep "
                          "data.private.label")
    if int(cfg["rounds"]["count"]) != 1:
        raise ConfigError("rounds.count", f"{cfg['rounds']['count']} with cluster.holders=remote: "
                          "a holder answers one signed specification per round, one round so far",
                          "set rounds.count=1")
    if int(cfg["shuffle"]["onion_layers"] or 0) > 0 or cfg["shuffle"].get("dropout"):
        raise ConfigError("shuffle.onion_layers", "with cluster.holders=remote there is one "
                          "shuffler, the service; dropout is real, not simulated",
                          "set shuffle.onion_layers=0 and shuffle.dropout=0")
    if cfg["run"]["diagnostics"]:
        raise ConfigError("run.diagnostics", "needs the private rows, which the operator never "
                          "has with cluster.holders=remote", "set run.diagnostics=false")
