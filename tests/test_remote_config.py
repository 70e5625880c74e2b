"""``cluster.holders: remote`` as the user writes it: what the holder program answers today
is accepted, everything else is one ConfigError naming the key and the fix; the registry
and the operator's key are read with one-line errors (no Ray, no service here: the trial in
tests/test_remote_trial.py runs the parties)."""
from __future__ import annotations

import os

import pytest

from rknn_ray.config import load_config
from rknn_ray.errors import ConfigError, DataError
from rknn_ray.remote.operator_key import load_operator_key, public_file, save_operator_key
from rknn_ray.remote.registry import read_registry

KEY = "ab" * 32


def remote_cfg(tmp_path, **sections):
    base = {"data": {"dataset": "table", "classes": ["a", "b"], "max_records_per_client": 4,
                     "private": {"label": "label"}, "public": {"path": str(tmp_path / "p.csv")}},
            "privacy": {"model": "shuffle", "mechanism": "collision", "eps": 4.0, "delta": 1e-6},
            "cluster": {"holders": "remote"},
            "remote": {"shuffler": "https://127.0.0.1:8443", "ca": "ca.pem",
                       "operator_key": "op.key", "registry": "reg.txt"}}
    for name, values in sections.items():
        base[name] = {**base.get(name, {}), **values}
    return base


def test_what_the_holder_program_answers_is_accepted(tmp_path):
    cfg = load_config(remote_cfg(tmp_path))
    assert cfg.cluster.holders == "remote" and cfg.remote.window_s == 600.0
    assert cfg.remote.close_when_all is True


@pytest.mark.parametrize("change, key, words", [
    ({"remote": {"shuffler": None}}, "remote.shuffler", "is not set"),
    ({"remote": {"registry": None}}, "remote.registry", "is not set"),
    ({"remote": {"shuffler": "http://127.0.0.1:8443"}}, "remote.shuffler", "https://"),
    ({"privacy": {"multi_record": "each"}}, "privacy.multi_record", "one report"),
    ({"rounds": {"count": 2}}, "rounds.count", "one round so far"),
    ({"data": {"private": {"label": "label", "path": "private.csv"}}}, "data.private.path",
     "never reads the holders' rows"),
    ({"shuffle": {"onion_layers": 2}}, "shuffle.onion_layers", "one shuffler"),
])
def test_what_it_does_not_answer_is_one_line_naming_the_key(tmp_path, change, key, words):
    with pytest.raises(ConfigError) as err:
        load_config(remote_cfg(tmp_path, **change))
    text = str(err.value)
    assert key in text and words in text and "\n" not in text.strip()


def test_the_registry_is_read_with_one_line_errors(tmp_path):
    reg = tmp_path / "reg.txt"
    reg.write_text(f"# holders\n{KEY} 3\n{'cd' * 32} 1  # a comment\n")
    got = read_registry(str(reg))
    assert got.records == (3, 1) and len(got.keys) == 2 and len(got.digest) == 64
    for body, words in ((f"{KEY}\n", "line 1"), (f"{KEY} 0\n", "line 1"),
                        (f"{KEY[:-2]} 2\n", "line 1"), (f"{KEY} 2\n{KEY} 1\n", "twice"),
                        ("# nobody\n", "lists no holder")):
        reg.write_text(body)
        with pytest.raises(DataError, match=words):
            read_registry(str(reg))
    with pytest.raises(DataError, match="no file"):
        read_registry(str(tmp_path / "missing.txt"))


def test_the_operator_key_is_private_and_never_overwritten(tmp_path):
    path = tmp_path / "operator.key"
    key = save_operator_key(path)
    assert oct(os.stat(path).st_mode & 0o777) == "0o600"
    assert public_file(path).read_text().strip() == key.public_key().public_bytes_raw().hex()
    assert load_operator_key(path).private_bytes_raw() == key.private_bytes_raw()
    with pytest.raises(DataError, match="never overwritten"):
        save_operator_key(path)
    os.chmod(path, 0o644)
    with pytest.raises(DataError, match="readable by other users"):
        load_operator_key(path)
    bad = tmp_path / "bad.key"
    bad.write_text("not a key")
    os.chmod(bad, 0o600)
    with pytest.raises(DataError, match="not an Ed25519 private key"):
        load_operator_key(bad)
