"""The pipeline's sequences are assembled once (rknn_ray.job.stages: prepare_stages,
nonprivate_labels; rknn_ray.student.stage: train_on_labels) and give the numbers the hand-listed steps they
replaced gave: the non-private reference and a baseline's student, with a fixed seed."""
import numpy as np
import pytest

from rknn_ray.config import load_config
from rknn_ray.job.stages import finish_labels, fit_queries, resolve_auto
from rknn_ray.data.prepared import prepare_data
from rknn_ray.student.stage import fit_student, student_inputs
from rknn_ray.labeling.stage import derive_labels, exact_answers

TINY = ["run.progress=false", "student.epochs=1", "student.augment=none",
        "student.trainer=local", "queries.s=30", "rknn.k=2", "run.seed=3",
        "queries.restarts=1"]


def _cfg(*extra):
    return load_config("jobs/configs/digits_central.yaml", [*TINY, *extra])


def _reference_as_listed_before(cfg) -> dict:
    """rknn_ray.reference before issue 19: its own list of the steps."""
    data = prepare_data(cfg)
    encoder, public_emb, qs = fit_queries(cfg, data)
    exact = exact_answers(encoder, data, qs, cfg.rknn.k).counts().astype(float)
    lab, info = finish_labels(cfg, data, exact, qs, public_emb, rounds=[], noise_std=0.0)
    inputs = student_inputs(cfg, data, encoder, lab, qs, public_emb, info, None)
    student = fit_student(cfg, data, encoder, lab, info, inputs, None)
    return {"label_accuracy": lab.label_accuracy, "query_accuracy": lab.query_accuracy,
            "student_accuracy": student.test_accuracy,
            "smoothing": info["denoise"]["neighbours"],
            "votes_per_query": exact.sum() / qs.size}


def _baseline_student_as_listed_before(cfg, counts) -> tuple[float, float]:
    """baselines.common.prepare + student_from_query_counts before issue 19."""
    from rknn_ray.student import StudentConfig
    from rknn_ray.student.train import train_student_local
    data = prepare_data(cfg)
    cfg, _ = resolve_auto(cfg, data)
    encoder, public_emb, qs = fit_queries(cfg, data)
    sp = data.splits
    lab = derive_labels(counts(sp.public_y[qs.public_index], data.num_classes), qs, sp.public_y,
                        cfg.labels.type)
    st = cfg.student
    scfg = StudentConfig(epochs=st.epochs, batch_size=st.batch_size, lr=st.lr,
                         weight_decay=st.weight_decay, num_workers=1, use_gpu=False,
                         label_type=cfg.labels.type, seed=cfg.run.seed, arch=st.arch,
                         augment=st.augment)
    if st.input == "features":
        public_x = public_emb.astype(np.float32)
        eval_x = encoder.transform(sp.eval_x).astype(np.float32)
        shape = (int(public_emb.shape[1]),)
    else:
        public_x, eval_x, shape = sp.public_x, sp.eval_x, data.image_shape
    if cfg.labels.train_on == "queries":
        train_x = public_x[qs.public_index]
        soft = scfg.label_type == "soft"
        targets = lab.query_soft if soft else lab.query_labels
        weight = lab.query_weight if soft else None
    else:
        train_x, targets, weight = public_x, lab.public_targets, lab.public_weight
    res = train_student_local(train_x, targets, eval_x, sp.eval_y, shape, data.num_classes,
                              scfg, sample_weight=weight)
    return float(res.test_accuracy), float(lab.label_accuracy)


def _noisy_truth(truth, num_classes):
    """Query counts a baseline might release: the true class ahead, every class some votes."""
    return np.eye(num_classes)[truth] * 3.0 + 0.5


def test_the_nonprivate_reference_gives_the_numbers_of_its_old_step_list():
    from rknn_ray.job.reference import nonprivate_reference
    cfg = _cfg()
    got = nonprivate_reference(cfg)
    want = _reference_as_listed_before(cfg)
    assert {k: got[k] for k in want} == pytest.approx(want, rel=0, abs=0)
    assert got["private"] is False


@pytest.mark.parametrize("extra", [[], ["student.input=features"],
                                   ["labels.train_on=queries", "labels.type=hard"]])
def test_a_baselines_student_gives_the_numbers_of_its_old_step_list(extra):
    from rknn_ray.baselines.common import student_from_query_counts
    from rknn_ray.job.baselines import prepare_baseline
    cfg = _cfg(*extra)
    setup = prepare_baseline(cfg)
    got = student_from_query_counts(setup, _noisy_truth(setup.query_truth, setup.num_classes))
    assert got[:2] == _baseline_student_as_listed_before(cfg, _noisy_truth)


def test_prepare_stages_resolves_auto_on_the_data_it_was_given():
    from rknn_ray.job.stages import prepare_stages
    cfg = _cfg("queries.s=auto", "rknn.k=auto")
    data = prepare_data(cfg)
    st = prepare_stages(cfg, data, resolve=True)
    assert st.data is data and st.auto is not None
    assert st.cfg.queries.s == st.auto["s"] == st.queries.size
    assert st.public_emb.shape[0] == len(data.splits.public_y)
