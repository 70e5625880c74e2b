"""Seeded digits shuffle rounds on real actors, shared by the protocol, cover, shard-secret
and distributed-shuffle tests and conftest's clean reference round."""
from rknn_ray.accounting import PrivacyLedger
from rknn_ray.config import load_config


def digits_cfg(*overrides):
    """A seeded digits shuffle job of two shards; its Server opens a round of this size itself
    (cluster.openers: null), except where a test asks for opener processes."""
    return load_config("jobs/configs/digits_shuffle.yaml",
                       ["run.rng=seeded", "queries.s=10", "cluster.shards=2",
                        "cluster.batch_clients=200", *overrides])


def session_round(cfg, job_id="job-fixed", rounds=1, parties=None, ledger=None, progress=None):
    from rknn_ray.job.progress import Progress
    from rknn_ray.job.session import ProtocolSession
    from rknn_ray.job.stages import fit_queries
    from rknn_ray.data.prepared import prepare_data
    from rknn_ray.data.sources import dataset_sources
    from rknn_ray.mechanisms.stage import mechanism_for
    data = prepare_data(cfg)
    enc, _, qs = fit_queries(cfg, data)
    ledger = ledger or PrivacyLedger()
    progress = progress or Progress(False)
    mech = mechanism_for(cfg, data)
    results = []
    with ProtocolSession(cfg, dataset_sources(cfg, data), job_id, progress=progress,
                         parties=parties) as session:
        for t in range(rounds):
            with progress.stage(f"round_{t}"):         # as jobs.distill times a round
                results.append(session.run_round(t, mech, enc, qs.features, ledger))
    return data, enc, qs, ledger, results
