"""Shard secrets (issue 21.2): made inside the shard, kept in a node-local owner-only store,
re-read by a restarted shard, never re-drawn, deleted when the job's session closes."""
import os
import time

import numpy as np
import pytest

from rknn_ray.config import load_config
from rknn_ray.errors import ConfigError
from rknn_ray.rng import derived_key
from rknn_ray.shard_secrets import SeededShardSecrets, ShardKeyStore, ShardSecretError


def test_store_creates_an_owner_only_secret_once_and_reads_it_back(tmp_path):
    store = ShardKeyStore("job-a", str(tmp_path / "keys"))
    first = store.secret(0)
    assert len(first) == 32 and store.secret(0) == first == store.secret(0, restarted=True)
    assert store.secret(1) != first                                     # one secret per shard
    assert ShardKeyStore("job-b", str(tmp_path / "keys")).secret(0) != first   # and per job
    assert open(store.path(0), "rb").read() == first
    assert os.stat(store.path(0)).st_mode & 0o777 == 0o600
    assert os.stat(store.folder()).st_mode & 0o777 == 0o700
    assert os.stat(tmp_path / "keys").st_mode & 0o777 == 0o700
    assert not [f for f in os.listdir(store.folder()) if f.startswith(".tmp")]   # no temp left


def test_a_restarted_shard_without_its_secret_refuses_instead_of_drawing_new_coins(tmp_path):
    store = ShardKeyStore("job-a", str(tmp_path / "keys"))
    with pytest.raises(ShardSecretError, match="restarted.*gone.*a second time.*Fix"):
        store.secret(0, restarted=True)
    assert not os.path.exists(store.path(0))          # and it wrote no secret either


def test_forget_deletes_the_secret_and_the_empty_job_folder(tmp_path):
    store = ShardKeyStore("job-a", str(tmp_path / "keys"))
    store.secret(0), store.secret(1)
    assert store.forget(0) and os.path.isdir(store.folder())          # shard 1's is still there
    assert store.forget(1) and not os.path.exists(store.folder())
    assert not store.forget(1)


def test_a_store_others_can_read_or_a_bad_key_file_is_refused_with_the_fix(tmp_path):
    open_root = tmp_path / "open"
    open_root.mkdir(mode=0o755)
    os.chmod(open_root, 0o755)
    with pytest.raises(ShardSecretError, match="mode 755.*Fix: chmod 700"):
        ShardKeyStore("job-a", str(open_root)).secret(0)
    link = tmp_path / "link"
    link.symlink_to(tmp_path)
    with pytest.raises(ShardSecretError, match="not a folder.*Fix"):
        ShardKeyStore("job-a", str(link)).secret(0)
    store = ShardKeyStore("job-a", str(tmp_path / "keys"))
    store.secret(0)
    with open(store.path(1), "wb") as fh:                             # a truncated secret
        fh.write(b"short")
    os.chmod(store.path(1), 0o600)
    with pytest.raises(ShardSecretError, match="not a 32-byte file.*5 bytes.*Fix: delete"):
        store.secret(1)


def test_seeded_secrets_follow_the_seed_inside_the_shard():
    """run.rng=seeded keeps its reproducibility (the same secrets as before issue 21)."""
    s = SeededShardSecrets(7)
    assert s.secret(3) == s.secret(3, restarted=True) == derived_key(b"7", "shard", 3)
    assert s.secret(3) != SeededShardSecrets(8).secret(3) and not s.forget(3)


def test_key_store_must_be_an_absolute_path():
    with pytest.raises(ConfigError, match="cluster.key_store.*absolute"):
        load_config("jobs/configs/digits_local.yaml", ["cluster.key_store=keys"])
    cfg = load_config("jobs/configs/digits_local.yaml", ["cluster.key_store=/var/tmp/k"])
    assert cfg.cluster.key_store == "/var/tmp/k"


def test_a_restarted_shard_actor_resends_the_same_reports_from_its_stored_secret(ray_session,
                                                                                  tmp_path):
    """A real ClientShard actor, killed and restarted by Ray: the same plaintexts and ids,
    secure mode (the secret was never in this process). With its key file gone, the
    restarted actor refuses to start, naming the problem and the fix. The records ride with
    each call as the session hands them ([ObjectRef]), so the new incarnation reopens them."""
    from actors.client_shard import ClientShard
    from rknn_ray.job.session import _actor_death, _wait_alive
    from server.keys import ServerKeyPair
    from tests.test_client_shard import SOURCE, _open, _spec

    store = ShardKeyStore("job-actor", str(tmp_path / "keys"))
    keys = ServerKeyPair.generate()
    spec = _spec(keys)
    records = [ray_session.put(SOURCE)]

    def stream(actor):
        return ray_session.get(list(actor.stream_reports.options(
            num_returns="streaming").remote(spec, 128, records)))

    def pid(actor):
        return ray_session.get(actor.__ray_call__.remote(lambda self: os.getpid()))

    def kill_and_wait(actor) -> bool:
        """Kill (Ray restarts it); True once a new incarnation answers, False if it died."""
        old = pid(actor)
        ray_session.kill(actor, no_restart=False)
        for _ in range(300):
            try:
                if pid(actor) != old:
                    return True
            except ray_session.exceptions.ActorDiedError:
                return False
            except ray_session.exceptions.RayActorError:      # restarting
                pass
            time.sleep(0.2)
        raise AssertionError("the shard neither restarted nor died within 60 s")

    shard = ClientShard.remote(0, None, store)
    first = _open(stream(shard), keys, spec)
    assert kill_and_wait(shard)
    again = _open(stream(shard), keys, spec)
    np.testing.assert_array_equal(again[0], first[0])     # the same randomized reports
    np.testing.assert_array_equal(again[1], first[1])     # and the same report ids
    os.unlink(store.path(0))                              # as if restarted on another node
    assert not kill_and_wait(shard)
    alive, why = _wait_alive(shard, records, timeout=60)          # what the driver's pump sees
    assert not alive
    text = _actor_death("client shard 0 did not come back", why)
    assert "ShardSecretError" in text and "a second time" in text and "Fix:" in text
    assert not os.path.exists(store.path(0))              # no fresh secret was drawn
    fresh = ClientShard.remote(0, SOURCE, store)        # a first start makes a secret ...
    assert ray_session.get(fresh.forget_secret.remote())   # ... that forget_secret deletes
    assert not os.path.exists(store.folder())
    ray_session.kill(fresh)


def test_a_round_whose_shard_lost_its_secret_fails_clearly_and_releases_nothing(ray_session,
                                                                               tmp_path):
    """Secure mode on real actors: shard 0 loses its secret and dies mid-round; its restart
    refuses to start, so the round fails naming the cause, and the ledger records nothing."""
    from rknn_ray.job.session import PartyFailure
    from rknn_ray.accounting import PrivacyLedger
    from tests.digits_rounds import digits_cfg, session_round

    cfg = digits_cfg("run.rng=secure", f"cluster.key_store={tmp_path / 'keys'}")
    from rknn_ray.job.session import Parties
    from tests.faulty_parties import crashing_shard
    parties = Parties(shards={0: crashing_shard(tmp_path / "died", after=1, lose_secret=True)})
    ledger = PrivacyLedger()
    with pytest.raises(PartyFailure, match="client shard 0 died and did not come back; no counts "
                       "were released: .*ShardSecretError.*restarted.*Fix") as err:
        session_round(cfg, job_id="job-lost", parties=parties, ledger=ledger)
    assert err.value.party == "client shard 0" and not err.value.released
    assert (tmp_path / "died").exists() and not ledger.to_dict()["entries"]
    assert not (tmp_path / "keys" / "job-lost").exists()   # closing deleted shard 1's secret


def test_a_key_store_others_can_open_stops_the_job_at_startup_with_the_fix(ray_session,
                                                                          tmp_path):
    """The shard checks its store on its own node; the driver reports its error and fix."""
    from rknn_ray.job.progress import Progress
    from rknn_ray.job.session import PartyFailure, ProtocolSession
    from rknn_ray.data.prepared import prepare_data
    from rknn_ray.data.sources import dataset_sources
    from tests.digits_rounds import digits_cfg

    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o777)
    cfg = digits_cfg("run.rng=secure", f"cluster.key_store={shared}")
    with pytest.raises(PartyFailure, match="failed to start; nothing was released: .*"
                       "ShardSecretError.*mode 777.*Fix: chmod 700"):
        ProtocolSession(cfg, dataset_sources(cfg, prepare_data(cfg)), "job-open",
                        progress=Progress(False))
    assert os.listdir(shared) == []                      # no secret was written there
