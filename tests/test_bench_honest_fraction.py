"""benchmarks.honest_fraction: the multi-message settings' label cost, in process (digits)."""
from benchmarks.honest_fraction import measure
from rknn_ray.mechanisms.shuffle_multi import AUTO_DLAP_SHARES


def test_rows_per_fraction_and_share_with_the_auto_share_giving_the_most_queries():
    rows = measure("jobs/configs/digits_shuffle.yaml", [0.5, 1.0], 1, ("auto", 0.85))
    assert [(r["honest_fraction"], r["dlap_share_set"]) for r in rows] == [
        (0.5, "auto"), (0.5, 0.85), (1.0, "auto"), (1.0, 0.85)]
    for auto, fixed in (rows[0:2], rows[2:4]):
        assert auto["dlap_share"] in AUTO_DLAP_SHARES and fixed["dlap_share"] == 0.85
        assert auto["s"] >= fixed["s"]          # the share that allows the most queries
        assert auto["messages_per_client_expected"] <= 64 + 1e-9
        for r in (auto, fixed):
            assert 0 < r["label_accuracy_median"] <= 1 and 0 < r["label_accuracy_exact_counts"] <= 1
            assert r["eps"] <= 2.0 * (1 + 1e-9) and r["noise_std_per_count"] > 0
    # every client carrying twice the noise shares (fraction 0.5) leaves fewer queries
    assert rows[0]["noise_senders"] < rows[2]["noise_senders"] and rows[1]["s"] <= rows[3]["s"]


def test_student_column_trains_the_jobs_student_on_each_draw():
    (row,) = measure("jobs/configs/digits_shuffle.yaml", [1.0], 2, (0.85,), student=True)
    assert len(row["student_accuracy"]) == 2 == len(row["label_accuracy"])
    # a student trained on labels ~0.9 accurate generalises well past chance (10 classes)
    assert all(0.5 < a <= 1 for a in row["student_accuracy"])
    assert min(row["student_accuracy"]) <= row["student_accuracy_median"] <= max(row["student_accuracy"])
    # and once on the exact counts' labels: the ceiling the queries set, no noise at all
    assert 0.5 < row["student_accuracy_exact_counts"] <= 1
    # without --student no student; --set overrides reach the config (an s the cap would refuse)
    (plain,) = measure("jobs/configs/digits_shuffle.yaml", [1.0], 1, (0.85,),
                       overrides=("queries.s=30",))
    assert plain["student_accuracy_exact_counts"] is None and plain["student_accuracy"] == []
    assert plain["s"] == 30
