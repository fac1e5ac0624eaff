"""SPP (CCD's stability/plasticity proxies) in the federated block loop: pieces on toys, then the loop."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from fedlib.data.synthetic import drifting_stream
from fedlib.engine import FederatedConfig, LocalBatch, SequentialExecutor
from fedlib.engine.plan import RoundPlan
from fedlib.baselines.continual.continual import FineTuning, fedmf_backbone, run_continual, student_ranks
from fedlib.baselines.continual.spp import (SPP, SPPReplayLoss, _proxy_tables, append_to_every_step, decode_replay_target,
                                encode_replay_target, merge_replay_sets, proxy_candidates, proxy_mixture_mix,
                                rank_discrepancy_log_weights, replay_probabilities, sample_replay)
from fedlib.models import FedMF

CONFIG = FederatedConfig(rounds=4, seed=0, batch_size=64, patience=3)
BACKBONE = fedmf_backbone(dim=8, lr=4.0)


def _bce(x: float, y: float) -> float:
    p = 1.0 / (1.0 + math.exp(-x))
    return -(y * math.log(p) + (1.0 - y) * math.log(1.0 - p))


@pytest.fixture(scope="module")
def stream():
    return drifting_stream(num_users=40, num_items=60, interactions_per_user=24, seed=1)


@pytest.fixture(scope="module")
def ft(stream):
    return run_continual(stream, BACKBONE, FineTuning(), CONFIG, device="cpu", num_blocks=3, accuracy_matrix=False)


# ----------------------------------------------------------------------------------------------
# Ranks and the sampling distribution
# ----------------------------------------------------------------------------------------------
def test_ranks_and_sampling_distribution_on_a_toy():
    current = torch.tensor([[0.5, 2.0, -1.0, 1.0, 0.0]])  # current ranks: item1 1, item3 2, item0 3, item4 4, item2 5
    proxy = torch.tensor([[3.0, 1.0, 2.0, -1.0, 0.0]])  # proxy order: 0, 2, 1, 4, 3
    items, logits = proxy_candidates(proxy, absolute=3)
    assert items.tolist() == [[0, 2, 1]] and logits.tolist() == [[3.0, 2.0, 1.0]]  # proxy ranks 1, 2, 3
    ranks = student_ranks(current, current.gather(1, items))
    assert ranks.tolist() == [[3, 5, 1]]
    eps = 0.5
    logw = rank_discrepancy_log_weights(ranks, torch.ones_like(ranks, dtype=torch.bool), eps)
    # gaps r_current − r_proxy = 3−1, 5−2, 1−3
    assert logw.tolist() == [[1.0, 1.5, -1.0]]
    z = math.exp(1.0) + math.exp(1.5) + math.exp(-1.0)
    expected = [math.exp(1.0) / z, math.exp(1.5) / z, math.exp(-1.0) / z]
    probs = replay_probabilities(logw)
    assert probs[0].tolist() == pytest.approx(expected, abs=1e-12)

    # One draw per row: its distribution is exactly P (Gumbel-max); items 3 and 4 are outside
    # the proxy's top-3 and can never be drawn.
    n = 200_000
    gumbel = torch.as_tensor(np.random.default_rng(0).gumbel(size=(n, 3)))
    pos, drawn = sample_replay(logw.expand(n, 3), gumbel, 1)
    assert bool(drawn.all())
    freq = np.bincount(items[0][pos[:, 0]].numpy(), minlength=5) / n
    assert freq[[0, 2, 1]] == pytest.approx(expected, abs=5e-3)
    assert freq[3] == 0 and freq[4] == 0

    # Without replacement: never the same candidate twice; invalid candidates never drawn.
    valid = torch.tensor([[True, False, True]])
    logw = rank_discrepancy_log_weights(ranks, valid, eps)
    assert replay_probabilities(logw)[0, 1] == 0
    pos, drawn = sample_replay(logw.expand(1000, 3), gumbel[:1000], 3)
    assert drawn[:, :2].all() and not drawn[:, 2].any()  # only two valid candidates
    assert set(map(tuple, pos[:, :2].sort(1).values.tolist())) == {(0, 2)}


def test_larger_eps_concentrates_the_draws():
    gaps = torch.tensor([[0, 10, 40, 100]])
    flat = replay_probabilities(rank_discrepancy_log_weights(gaps + torch.arange(1, 5), gaps >= 0, 0.0))
    sharp = replay_probabilities(rank_discrepancy_log_weights(gaps + torch.arange(1, 5), gaps >= 0, 0.1))
    assert flat[0].tolist() == pytest.approx([0.25] * 4)
    assert float(sharp[0, 3]) > 0.99


def test_proxy_candidates_skip_the_users_current_train_items():
    model = FedMF(2, 6, dim=1)
    global_state = {"item_emb": torch.arange(6, dtype=torch.float32)[:, None]}  # scores increase with the id
    private_state = {"user_emb": torch.ones(2, 1)}
    indptr, train_items = np.array([0, 2, 2]), np.array([5, 3])  # user 0 trained on items 5 and 3
    items, logits = _proxy_tables(model, global_state, private_state, torch.arange(2), 6, indptr, train_items, 3)
    assert items.tolist() == [[4, 2, 1], [5, 4, 3]]
    # the stability proxy only knows the old items (here the first 4)
    items, _ = _proxy_tables(model, {"item_emb": global_state["item_emb"][:4]}, private_state, torch.arange(2), 4,
                             indptr, train_items, 3)
    assert items.tolist() == [[2, 1, 0], [3, 2, 1]]


# ----------------------------------------------------------------------------------------------
# Merge, label codes, plan
# ----------------------------------------------------------------------------------------------
def test_merge_keeps_the_max_label():
    items = torch.tensor([[5, 7, 5, 9], [1, 2, 3, 1], [4, 4, 4, 4]])
    targets = torch.tensor([[0.2, 0.6, 0.8, 0.1], [0.9, 0.5, 0.4, 0.3], [0.1, 0.7, 0.7, 0.9]])
    valid = torch.tensor([[True, True, True, False], [True, True, True, True], [True, True, True, False]])
    keep = merge_replay_sets(items, targets, valid)
    assert keep.tolist() == [[False, True, True, False], [True, True, True, False], [False, True, False, False]]
    # one entry per distinct valid (row, item), carrying the largest label
    for r in range(3):
        merged = {int(i): float(t) for i, t in zip(items[r][keep[r]], targets[r][keep[r]])}
        best = {}
        for i, t, v in zip(items[r].tolist(), targets[r].tolist(), valid[r].tolist()):
            if v:
                best[i] = max(best.get(i, 0.0), t)
        assert merged == pytest.approx(best)


def test_label_codes_and_plan_augmentation():
    y = np.array([0.0, 0.25, 1.0])
    codes = encode_replay_target(y)
    assert codes.tolist() == [-1.0, -1.25, -2.0]
    assert decode_replay_target(torch.as_tensor(codes, dtype=torch.float32)).tolist() == [0.0, 0.25, 1.0]
    plan = RoundPlan(round_index=2, clients=np.array([3, 8]), example_indptr=np.array([0, 3, 5]),
                     items=np.array([10, 11, 12, 20, 21]), labels=np.array([1, 0, 1, 1, 0], dtype=np.float32),
                     steps=np.array([0, 0, 1, 0, 0]), num_steps=np.array([2, 1]), num_examples=np.array([3, 2]),
                     batch_size=2, local_epochs=1)
    out = append_to_every_step(plan, np.array([0, 1, 1]), np.array([30, 40, 41]), np.array([-1.5, -1.0, -2.0]))
    assert out.example_indptr.tolist() == [0, 5, 9]
    assert out.items.tolist() == [10, 11, 30, 12, 30, 20, 21, 40, 41]
    assert out.steps.tolist() == [0, 0, 0, 1, 1, 0, 0, 0, 0]
    assert out.labels.tolist() == [1, 0, -1.5, 1, -1.5, 1, 0, -1.0, -2.0]
    assert out.num_examples.tolist() == [3, 2]


# ----------------------------------------------------------------------------------------------
# The replay loss
# ----------------------------------------------------------------------------------------------
def _toy_plan(round_index):
    return RoundPlan(round_index=round_index, clients=np.array([0, 1]), example_indptr=np.array([0, 1, 2]),
                     items=np.array([0, 1]), labels=np.ones(2, dtype=np.float32), steps=np.zeros(2, dtype=np.int64),
                     num_steps=np.array([1, 1]), num_examples=np.array([1, 1]), batch_size=8, local_epochs=1)


@pytest.mark.parametrize("reduction", ["example", "mean", "sum"])
def test_replay_loss_equals_a_hand_computation(reduction):
    model = FedMF(2, 4, dim=2)
    params = {"user_emb": torch.tensor([[1.0, 0.5], [-0.5, 2.0]]),
              "item_emb": torch.tensor([[0.2, 0.1], [-0.3, 0.4], [1.0, -1.0], [0.5, 0.5]])}
    y1, y2 = 0.8, 0.3
    labels = torch.tensor([[1.0, 0.0, 0.0, -(1 + y1), -(1 + y2)], [1.0, 0.0, 0.0, 0.0, 0.0]])
    rows = torch.tensor([[0, 1, 3, 2, 3], [1, 2, 0, 0, 0]])
    mask = torch.tensor([[1.0, 1.0, 1.0, 1.0, 1.0], [1.0, 1.0, 0.0, 0.0, 0.0]])
    batch = LocalBatch(clients=torch.tensor([0, 1]), rows=rows, items=rows, labels=labels, mask=mask)
    loss = SPPReplayLoss(model, stability_items=None, stability_logits=None, plasticity_items=None,
                         plasticity_logits=None, train_indptr=np.zeros(3, dtype=np.int64),
                         train_items=np.zeros(0, dtype=np.int64), eps=0.01, num_replay=2, lambda_replay=0.5,
                         a_t=10.0, reduction=reduction)
    loss.prepare_round(_toy_plan(3), {"item_emb": params["item_emb"]}, {"user_emb": params["user_emb"]})

    def logit(u, i):
        return float(params["user_emb"][u] @ params["item_emb"][i])

    rec0 = (_bce(logit(0, 0), 1.0) + _bce(logit(0, 1), 0.0) + _bce(logit(0, 3), 0.0)) / 3
    replay0 = _bce(logit(0, 2), y1) + _bce(logit(0, 3), y2)  # item 3 both a negative and a replay row
    # client 0: 3 recommendation examples, 2 replay rows
    replay0 = {"example": replay0 / 3, "mean": replay0 / 2, "sum": replay0}[reduction]
    rec1 = (_bce(logit(1, 1), 1.0) + _bce(logit(1, 2), 0.0)) / 2  # padding ignored, no replay rows
    expected = [rec0 + 0.5 * math.exp(-3 / 10) * replay0, rec1]
    assert loss(model, params, batch).tolist() == pytest.approx(expected, rel=1e-5)
    # the decay: the same batch in round 0 and round 20
    loss.prepare_round(_toy_plan(0), {"item_emb": params["item_emb"]}, {"user_emb": params["user_emb"]})
    assert float(loss(model, params, batch)[0]) == pytest.approx(rec0 + 0.5 * replay0, rel=1e-5)
    loss.prepare_round(_toy_plan(20), {"item_emb": params["item_emb"]}, {"user_emb": params["user_emb"]})
    assert float(loss(model, params, batch)[0]) == pytest.approx(rec0 + 0.5 * math.exp(-2) * replay0, rel=1e-5)


# ----------------------------------------------------------------------------------------------
# Server mix
# ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("mix_new_items", [True, False])
def test_server_mix_on_a_toy_table(mix_new_items):
    stable = {"item_emb": torch.tensor([[1.0], [2.0]])}  # I_old = 2
    plastic = {"item_emb": torch.tensor([[3.0], [4.0], [5.0]])}  # I = 3
    mix = proxy_mixture_mix(stable, plastic, 0.1, mix_new_items)
    aggregated = {"item_emb": torch.tensor([[10.0], [20.0], [30.0]]), "dense": torch.ones(2)}
    out = mix({"item_emb": torch.zeros(3, 1)}, aggregated, 7)
    new_row = 0.9 * 30 + 0.1 * 5 if mix_new_items else 30.0
    assert out["item_emb"][:, 0].tolist() == pytest.approx([0.9 * 10 + 0.1 * 2.0, 0.9 * 20 + 0.1 * 3.0, new_row])
    assert out["dense"] is aggregated["dense"]
    with pytest.raises(ValueError):
        proxy_mixture_mix(stable, plastic, 1.5)


# ----------------------------------------------------------------------------------------------
# New users
# ----------------------------------------------------------------------------------------------
def test_new_users_get_no_stability_replay():
    model = FedMF(3, 8, dim=2)
    gen = torch.Generator().manual_seed(0)
    global_state = {"item_emb": torch.randn(8, 2, generator=gen)}
    private_state = {"user_emb": torch.randn(3, 2, generator=gen)}
    # disjoint candidate sets: stability {0, 1, 2, 3} for the 2 old users, plasticity {4, .., 7} for all 3
    stab_items = torch.tensor([[0, 1, 2, 3], [3, 2, 1, 0]])
    plast_items = torch.tensor([[4, 5, 6, 7], [7, 6, 5, 4], [5, 4, 7, 6]])
    loss = SPPReplayLoss(model, stability_items=stab_items, stability_logits=torch.zeros(2, 4),
                         plasticity_items=plast_items, plasticity_logits=torch.full((3, 4), 2.0),
                         train_indptr=np.zeros(4, dtype=np.int64), train_items=np.zeros(0, dtype=np.int64),
                         eps=0.01, num_replay=2, lambda_replay=0.5, a_t=10.0)
    items, targets, keep = loss.replay_sets(torch.arange(3), global_state, private_state,
                                            np.random.default_rng(0))
    for u in (0, 1):
        drawn = items[u][keep[u]].tolist()
        assert len(drawn) == 4 and len([i for i in drawn if i < 4]) == 2
    drawn = items[2][keep[2]].tolist()
    assert len(drawn) == 2 and all(i >= 4 for i in drawn)
    assert sorted(targets[0][keep[0]].tolist()) == pytest.approx([0.5, 0.5] + [1 / (1 + math.exp(-2.0))] * 2)
    assert sorted(targets[2][keep[2]].tolist()) == pytest.approx([1 / (1 + math.exp(-2.0))] * 2)

    # through a round plan: user 2's steps carry 2 replay rows, the old users' 4
    plan = RoundPlan(round_index=0, clients=np.array([0, 1, 2]), example_indptr=np.array([0, 1, 2, 3]),
                     items=np.array([0, 1, 2]), labels=np.ones(3, dtype=np.float32), steps=np.zeros(3, dtype=np.int64),
                     num_steps=np.array([1, 1, 1]), num_examples=np.array([1, 1, 1]), batch_size=8, local_epochs=1)
    out = loss.prepare_round(plan, global_state, private_state)
    per_client = np.bincount(out.example_positions()[out.labels <= -1], minlength=3)
    assert per_client.tolist() == [4, 4, 2]


# ----------------------------------------------------------------------------------------------
# The block loop
# ----------------------------------------------------------------------------------------------
def test_spp_runs_end_to_end(stream, ft):
    method = SPP(plasticity_rounds=2, record=True)
    result = run_continual(stream, BACKBONE, method, CONFIG, device="cpu", base=ft.blocks[0], num_blocks=3,
                           accuracy_matrix=False)
    assert result.method == "SPP" and len(result.blocks) == 3
    assert all(np.isfinite(result.per_block("NDCG@20")))
    assert set(method.proxy_runs) == {1, 2} and method.proxy_runs[1]["rounds_run"] <= 2
    assert not torch.equal(result.blocks[1].selected_state.global_state["item_emb"],
                           ft.blocks[1].selected_state.global_state["item_emb"])
    records = method.losses[1].records
    assert len(records) == result.blocks[1].round_index
    old_users = stream[0].num_users
    first = records[0]
    # every participant replays; old users up to 2 n items, new users up to n
    assert (first["replayed"] > 0).all()
    assert (first["replayed"][first["clients"] < old_users] <= 20).all()
    assert (first["replayed"][first["clients"] >= old_users] <= 10).all()


def test_plasticity_proxy_is_the_fine_tuned_block_model(stream, ft):
    # With the run's seed for new rows and the block's rounds, the proxy run is FT's block run.
    method = SPP(growth_seed=CONFIG.seed)
    run_continual(stream, BACKBONE, method, CONFIG, device="cpu", base=ft.blocks[0], num_blocks=2,
                  accuracy_matrix=False)
    proxy_global, proxy_private = method.plasticity_states[1]
    assert torch.equal(proxy_global["item_emb"], ft.blocks[1].selected_state.global_state["item_emb"])
    assert torch.equal(proxy_private["user_emb"], ft.blocks[1].selected_state.private_state["user_emb"])


def test_batched_and_sequential_executors_agree():
    small = drifting_stream(num_users=20, num_items=40, interactions_per_user=30, seed=2)
    config = FederatedConfig(rounds=2, seed=0, batch_size=32, patience=3)
    base = run_continual(small, BACKBONE, FineTuning(), config, device="cpu", num_blocks=1).blocks[0]
    batched = run_continual(small, BACKBONE, SPP(plasticity_rounds=1, absolute=8, num_replay=3), config,
                            device="cpu", base=base, num_blocks=2, accuracy_matrix=False)
    sequential = run_continual(small, BACKBONE, SPP(plasticity_rounds=1, absolute=8, num_replay=3,
                                                    executor=SequentialExecutor()), config,
                               device="cpu", base=base, num_blocks=2, accuracy_matrix=False,
                               executor=SequentialExecutor())
    for metric, value in batched.blocks[1].test_metrics.items():
        assert sequential.blocks[1].test_metrics[metric] == pytest.approx(value, abs=1e-6)
    torch.testing.assert_close(sequential.blocks[1].selected_state.global_state["item_emb"],
                               batched.blocks[1].selected_state.global_state["item_emb"], atol=1e-5, rtol=1e-5)
