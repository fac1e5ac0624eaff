"""FedCSR round loop: sampled metrics, FedAvg, per-platform graphs, determinism, audit flags."""
import math

import numpy as np
import pytest
import torch

from fedlib.data.synthetic import cross_domain_sequences
from fedlib.baselines.sequential import sequence_training as ST
from fedlib.papers.fedcsr import training as T
from fedlib.papers.fedcsr.model import FedCSRConfig, FedCSRModel

torch.set_num_threads(1)

CFG = FedCSRConfig(dim=16, maxlen=8, dropout=0.0)
TC = T.FedCSRTrainConfig(rounds=2, local_epochs=1, batch_size=32, seed=3)


@pytest.fixture(scope="module")
def split():
    return cross_domain_sequences(num_users=120, items_a=30, items_b=30, topics=4, num_negatives=20,
                                  num_platforms=3, seed=0)


# ----------------------------------------------------------------------------- metrics
def test_ranks_and_tie_rules_on_a_hand_made_score_matrix():
    scores = torch.tensor([[5.0, 1.0, 2.0, 3.0],      # GT best → rank 1
                           [2.0, 3.0, 2.0, 1.0],      # one above, one tie
                           [0.0, 1.0, 2.0, 3.0],      # worst → rank 4
                           [1.0, 1.0 + 1e-6, 0.0, 0.0]])  # within the code's 1e-5 margin
    assert ST.ranks_from_scores(scores, "optimistic").tolist() == [1, 2, 4, 2]
    assert ST.ranks_from_scores(scores, "pessimistic").tolist() == [1, 3, 4, 2]
    assert ST.ranks_from_scores(scores, "code").tolist() == [1, 2, 4, 1]
    with pytest.raises(ValueError, match="tie_rule"):
        ST.ranks_from_scores(scores, "random")


def test_metric_values_on_hand_made_ranks():
    m = ST.rank_metrics([1, 3, 7, 20])
    assert m["MRR"] == pytest.approx((1 + 1 / 3 + 1 / 7 + 1 / 20) / 4)
    assert m["HR@1"] == pytest.approx(0.25) and m["HR@5"] == pytest.approx(0.5) and m["HR@10"] == pytest.approx(0.75)
    assert m["NDCG@5"] == pytest.approx((1 + 1 / math.log2(4)) / 4)
    assert m["NDCG@10"] == pytest.approx((1 + 1 / math.log2(4) + 1 / math.log2(8)) / 4)
    assert m["count"] == 4
    assert math.isnan(ST.rank_metrics([])["MRR"])


def test_candidate_scores_use_the_gt_domain_head_and_its_index_space(split):
    """Heads that score item index → GT rank = 1 + #candidates with a larger id (same domain)."""
    torch.manual_seed(0)
    model = FedCSRModel(split.num_items_a, split.num_items_b, CFG)
    with torch.no_grad():
        for head in (model.head_a, model.head_b):
            head.weight.zero_()
            head.bias.copy_(torch.arange(head.bias.numel(), dtype=torch.float32))
    graphs = ST.platform_graphs(split)
    out = ST.evaluate_sequences(model, split, "test", graphs, return_ranks=True)
    rows = np.concatenate(split.extra["test_platforms"])
    cand = split.test_candidates[rows]
    expected = 1 + (cand[:, 1:] > cand[:, :1]).sum(1)
    assert out["ranks"].tolist() == expected.tolist()
    dom = (cand[:, 0] >= split.num_items_a)
    assert out["B"]["count"] == int(dom.sum()) and out["A"]["count"] == int((~dom).sum())
    assert out["A"]["MRR"] == pytest.approx(np.mean(1.0 / expected[~dom]))


def _every_item_candidates(split, role):
    """Each row's candidates = its GT, then every other item of the GT's domain (equal domain sizes)."""
    na, nb = split.num_items_a, split.num_items_b
    assert na == nb
    gt = getattr(split, role).last_items()
    out = []
    for g in gt:
        lo = na if g >= na else 0
        out.append([g] + [i for i in range(lo, lo + na) if i != g])
    return np.asarray(out, dtype=np.int64)


@pytest.mark.parametrize("baseline", [False, True])
def test_full_ranking_equals_ranking_every_item_as_a_candidate(split, baseline):
    import dataclasses
    from fedlib.baselines.sequential.tisasrec import TiSASRec, TiSASRecConfig

    torch.manual_seed(0)
    model = (TiSASRec(split.num_items_a, split.num_items_b, TiSASRecConfig(dim=8, maxlen=8)) if baseline
             else FedCSRModel(split.num_items_a, split.num_items_b, CFG, ST.platform_graphs(split)[0]))
    full = ST.sequence_ranks(model, split, "test", full_ranking=True, batch_size=8)
    every = dataclasses.replace(split, test_candidates=_every_item_candidates(split, "test"))
    assert full.tolist() == ST.sequence_ranks(model, every, "test").tolist()
    sampled = ST.sequence_ranks(model, split, "test")
    assert (full >= sampled).all() and (full > sampled).any()     # 20 negatives vs 29 competitors


# ----------------------------------------------------------------------------- federated pieces
def test_fedavg_is_the_weighted_mean_of_the_state_dicts():
    a = {"w": torch.tensor([[1.0, 2.0], [3.0, 4.0]]), "b": torch.tensor([0.0])}
    b = {"w": torch.tensor([[5.0, 6.0], [7.0, 8.0]]), "b": torch.tensor([4.0])}
    out = ST.fedavg([a, b], [1, 3])             # (1·a + 3·b) / 4
    assert torch.allclose(out["w"], torch.tensor([[4.0, 5.0], [6.0, 7.0]]))
    assert torch.allclose(out["b"], torch.tensor([3.0]))
    with pytest.raises(ValueError):
        ST.fedavg([a, b], [0, 0])


def test_fedavg_in_float32_equals_a_float64_running_sum_rounded_once():
    """Eq. 19 through the engine's FedAvg moves no float32 number: each entry is the float64
    weighted mean rounded once (the loop's FedAvg before the trainer summed in float64 platform by
    platform); averaging in float32 would round every product and sum."""
    g = torch.Generator().manual_seed(0)
    base = 0.05 * torch.randn(20_000, generator=g)
    states = [{"w": base + 1e-3 * torch.randn(20_000, generator=g)} for _ in range(10)]
    counts = np.array([37, 12, 55, 8, 91, 23, 40, 17, 66, 29])
    running = torch.zeros(20_000, dtype=torch.float64)
    for c, s in zip(counts / counts.sum(), states):
        running += float(c) * s["w"].double()
    out = ST.fedavg(states, counts)["w"]
    assert out.dtype == torch.float32 and torch.equal(out, running.float())
    in_float32 = sum(float(c) * s["w"] for c, s in zip(counts / counts.sum(), states))
    assert not torch.equal(in_float32, running.float())       # the check can tell the two apart


def _edges(sparse):
    idx = sparse.coalesce().indices()
    return set(zip(idx[0].tolist(), idx[1].tolist()))


def test_each_platform_graph_holds_only_its_own_transitions(split):
    graphs = ST.platform_graphs(split)
    pairs = []
    for rows in split.platforms:
        own = set()
        for r in rows:
            s = split.train.sequence(int(r))
            own |= set(zip(s[:-1].tolist(), s[1:].tolist()))
        pairs.append(own)
    only_1 = pairs[1] - pairs[0]
    assert only_1, "the synthetic split should have a transition seen only on platform 1"
    for k, g in enumerate(graphs):
        assert _edges(g.cross) == pairs[k]
    assert not (_edges(graphs[0].cross) & only_1)
    central = ST.platform_graphs(split, central=True)
    assert only_1 <= _edges(central[0].cross) and central[0] is central[2]


# ----------------------------------------------------------------------------- round loop
def _strip(history):
    return [{k: v for k, v in row.items() if k != "seconds"} for row in history]


def _curve(run):
    """The run's history rows without their wall times (which differ between equal runs)."""
    return _strip(ST.history_rows(run))


def test_two_rounds_are_finite_deterministic_and_report_bytes(split):
    r1 = T.train_fedcsr(split, CFG, TC)
    r2 = T.train_fedcsr(split, CFG, TC)
    rows = ST.history_rows(r1)
    assert len(rows) == 2 and r1.method == "FedCSR"
    assert all(math.isfinite(row["loss"]) and math.isfinite(row["valid/MRR"]) for row in rows)
    assert _curve(r1) == _curve(r2)
    n_params = sum(p.numel() for p in r1.artifacts["models"][0].parameters())
    assert rows[0]["bytes_up"] == rows[0]["bytes_down"] == 4 * n_params * len(split.platforms)
    selected = ST.selected_blocks(r1)
    assert set(selected) == {"A", "B"} and "test/MRR" in selected["A"]
    best = max(rows, key=lambda row: row["valid/MRR"])                  # the first best on ties
    assert r1.best_round == best["round"] and selected["B"]["test/MRR"] == best["B/test/MRR"]
    audited = max(rows, key=lambda row: row["test/MRR"])
    assert r1.audit_round == audited["round"] and ST.audit_blocks(r1)["A"]["test/MRR"] == audited["A/test/MRR"]
    per_platform = ST.platform_blocks(r1)
    assert len(per_platform) == len(split.platforms)
    counts = [block["A"]["test/count"] for block in per_platform]       # platforms' rows pool into the domain
    assert sum(counts) == selected["A"]["test/count"]
    pooled = sum(b["A"]["test/MRR"] * c for b, c in zip(per_platform, counts) if c) / sum(counts)
    assert pooled == pytest.approx(selected["A"]["test/MRR"], abs=1e-12)
    r3 = T.train_fedcsr(split, CFG, T.FedCSRTrainConfig(rounds=2, local_epochs=1, batch_size=32, seed=4))
    assert _curve(r3) != _curve(r1)
    r1.artifacts.pop("domains")
    with pytest.raises(ValueError, match="domains"):
        ST.selected_blocks(r1)


def test_training_beats_a_random_model_on_validation(split):
    torch.manual_seed(0)
    random_model = FedCSRModel(split.num_items_a, split.num_items_b, CFG)
    graphs = ST.platform_graphs(split)
    base = ST.evaluate_sequences(random_model, split, "valid", graphs)
    base_mrr = np.mean([base[d]["MRR"] for d in ("A", "B")])
    res = T.train_fedcsr(split, FedCSRConfig(dim=16, maxlen=8, dropout=0.0, use_scl=False),
                         T.FedCSRTrainConfig(rounds=6, local_epochs=3, batch_size=32, lr=5e-3, seed=0))
    best = max(row["valid/MRR"] for row in ST.history_rows(res))
    assert best > base_mrr


def test_individual_training_runs_without_communication(split):
    res = T.train_individual(split, CFG, TC)
    models = res.artifacts["models"]
    assert res.method == "FedCSR-individual" and len(models) == len(split.platforms)
    assert all(row["bytes_up"] == 0 == row["bytes_down"] for row in ST.history_rows(res))
    assert all(math.isfinite(row["loss"]) for row in ST.history_rows(res))
    w0, w1 = (m.head_a.weight for m in models[:2])
    assert not torch.equal(w0, w1)           # same init, different local data → different models
    with pytest.raises(ValueError, match="individual"):
        T.train_individual(split, CFG, T.FedCSRTrainConfig(rounds=1, shared_optimizer=True))


def test_shared_optimizer_keeps_one_adam_state_across_platforms_and_rounds(split):
    res = T.train_fedcsr(split, CFG, T.FedCSRTrainConfig(rounds=2, local_epochs=1, batch_size=32,
                                                         shared_optimizer=True))
    opt = res.artifacts["shared_optimizer"]
    steps = sum(row["local_steps"] for row in res.history)
    assert steps > len(split.platforms)
    state_steps = {int(s["step"]) for s in opt.state.values()}
    assert state_steps == {steps}             # every platform's step advanced the same moments
    fresh = T.train_fedcsr(split, CFG, TC)
    assert fresh.artifacts["shared_optimizer"] is None
    assert _curve(fresh) != _curve(res)


def test_central_graph_flag_uses_one_graph(split):
    res = T.train_fedcsr(split, CFG, T.FedCSRTrainConfig(rounds=1, local_epochs=1, batch_size=32, central_graph=True))
    graphs = res.artifacts["graphs"]
    assert res.method == "FedCSR-central-graph" and all(g is graphs[0] for g in graphs)


@pytest.mark.parametrize("individual, shared", [(False, True), (True, False)])
def test_a_round_never_writes_into_its_input_state(split, individual, shared):
    """copy_state shares tensors (the kept best state costs no copy), which is only right because
    run_round leaves the state it is given untouched: models and Adam moments included."""
    from fedlib.engine.algorithm import RoundContext
    from fedlib.engine.plan import round_generator

    tc = T.FedCSRTrainConfig(rounds=2, local_epochs=1, batch_size=32, seed=3, shared_optimizer=shared)
    algorithm = T.FedCSRAlgorithm(split, FedCSRConfig(dim=8, maxlen=6, dropout=0.2), tc, individual=individual)
    state = algorithm.init(3)
    for t in range(2):                      # the second round starts from stepped Adam moments
        before = ST.deep_clone(algorithm.state_dict(state))
        context = RoundContext(index=t, seed=3, rng=round_generator(3, t))
        new_state, _ = algorithm.run_round(state, algorithm.plan_round(state, context), context)
        after = algorithm.state_dict(state)
        for k, (x, y) in enumerate(zip(before["models"], after["models"])):
            assert all(torch.equal(x[n], y[n]) for n in x), k
        moments = lambda saved: [v for o in saved["optimizers"] for per in o["state"].values() for v in per.values()]
        assert all(torch.equal(x, y) for x, y in zip(moments(before), moments(after)))
        state = new_state
    assert moments(algorithm.state_dict(state))    # Adam state outlives the round in both modes


@pytest.mark.parametrize("kwargs, hint", [
    ({"rounds": 0}, "rounds"), ({"lr": -1.0}, "lr"), ({"weight_by": "items"}, "weight_by"),
    ({"tie_rule": "x"}, "tie_rule"), ({"device": "tpu"}, "device"), ({"betas": (0.9,)}, "betas"),
])
def test_bad_settings_raise_clear_errors(kwargs, hint):
    with pytest.raises(ValueError, match=hint):
        T.FedCSRTrainConfig(**kwargs)


def test_cuda_request_without_cuda_is_a_value_error(split):
    if torch.cuda.is_available():
        pytest.skip("CUDA present")
    with pytest.raises(ValueError, match="CUDA"):
        T.train_fedcsr(split, CFG, T.FedCSRTrainConfig(rounds=1, device="cuda"))


# ----------------------------------------------------------------------------- checkpoints
class _Killed(RuntimeError):
    pass


@pytest.mark.parametrize("mode", ["federated", "shared_optimizer", "individual"])
def test_a_run_killed_after_a_snapshot_resumes_to_the_uninterrupted_numbers(split, tmp_path, mode):
    """Kill at round 3 (snapshot at round 2), resume: the same history, selection and weights as one run."""
    from fedlib.engine import Checkpointer

    cfg = FedCSRConfig(dim=16, maxlen=8, dropout=0.2)            # dropout: the torch generator matters too
    tc = T.FedCSRTrainConfig(rounds=4, local_epochs=1, batch_size=32, seed=5, patience=10,
                             shared_optimizer=mode == "shared_optimizer")
    individual = mode == "individual"
    whole = T.train_fedcsr(split, cfg, tc, individual=individual)

    def kill_at_round_3(row):
        if row["round"] == 3:
            raise _Killed

    first = Checkpointer(tmp_path, name="cell", every=2)
    with pytest.raises(_Killed):
        T.train_fedcsr(split, cfg, tc, individual=individual, progress=kill_at_round_3, checkpointer=first)
    second = Checkpointer(tmp_path, name="cell", every=2)
    resumed = T.train_fedcsr(split, cfg, tc, individual=individual, checkpointer=second)
    assert second.resumed_at == [2] and second.earlier_seconds > 0
    assert [row["round"] for row in resumed.history] == [1, 2, 3, 4]
    assert _curve(resumed) == _curve(whole)
    assert ST.selected_blocks(resumed) == ST.selected_blocks(whole) and resumed.best_round == whole.best_round
    assert ST.audit_blocks(resumed) == ST.audit_blocks(whole) and resumed.audit_round == whole.audit_round
    assert ST.platform_blocks(resumed) == ST.platform_blocks(whole)
    for a, b in zip(resumed.artifacts["models"], whole.artifacts["models"]):
        for (name, x), y in zip(a.state_dict().items(), b.state_dict().values()):
            assert torch.equal(x, y), name


def test_a_finished_snapshot_is_not_trained_again_and_a_changed_setting_is_refused(split, tmp_path):
    from fedlib.engine import Checkpointer

    done = T.train_fedcsr(split, CFG, TC, checkpointer=Checkpointer(tmp_path, name="cell", every=None,
                                                                    every_seconds=3600.0))
    again = T.train_fedcsr(split, CFG, TC, checkpointer=Checkpointer(tmp_path, name="cell", every=1))
    assert _curve(again) == _curve(done) and ST.selected_blocks(again) == ST.selected_blocks(done)
    with pytest.raises(ValueError, match="different configuration.*lr"):
        T.train_fedcsr(split, CFG, T.FedCSRTrainConfig(rounds=2, local_epochs=1, batch_size=32, seed=3, lr=5e-3),
                       checkpointer=Checkpointer(tmp_path, name="cell", every=1))
    with pytest.raises(ValueError, match="different configuration"):
        T.train_individual(split, CFG, TC, checkpointer=Checkpointer(tmp_path, name="cell", every=1))
