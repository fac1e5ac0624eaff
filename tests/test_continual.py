"""The continual block loop (F3CRec's protocol) on a small drifting synthetic stream."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from fedlib.data.synthetic import drifting_stream
from fedlib.engine import FederatedConfig, union_pairs
from fedlib.metrics import full_ranking_metrics_from_score_fn, mean_over_users
from fedlib.baselines.continual.continual import (BLOCK_ARTIFACTS, BlockContext, FineTuning, PreviousBlock,
                                                  block_artifacts, block_from_payload, block_payload, block_row,
                                                  block_seed, fedmf_backbone, fedncf_backbone, grow_state,
                                                  initial_block_state, pfedrec_backbone, run_continual)
from fedlib.engine import RunResult
from fedlib.papers.f3crec.method import F3CRec, ParameterRegularisation, kd_baseline

CONFIG = FederatedConfig(rounds=6, seed=0, batch_size=64, patience=3)
BACKBONE = fedmf_backbone(dim=8, lr=4.0)


@pytest.fixture(scope="module")
def stream():
    return drifting_stream(num_users=60, num_items=80, interactions_per_user=30, seed=0)


@pytest.fixture(scope="module")
def runs(stream):
    starts = {"FT": {}, "F3CRec": {}}

    def recorder(name):
        def on_block_start(ctx, state):
            starts[name][ctx.index] = ({k: v.clone() for k, v in state.global_state.items()},
                                       {k: v.clone() for k, v in state.private_state.items()})
        return on_block_start

    ft = run_continual(stream, BACKBONE, FineTuning(), CONFIG, device="cpu", on_block_start=recorder("FT"))
    f3 = run_continual(stream, BACKBONE, F3CRec(eps=0.01), CONFIG, device="cpu", on_block_start=recorder("F3CRec"))
    return {"FT": ft, "F3CRec": f3, "starts": starts}


def test_grow_state_appends_rows_and_keeps_the_old_ones():
    old = {"item_emb": torch.ones(3, 2), "user_emb": torch.full((2, 2), 2.0), "head_b": torch.tensor([5.0, 6.0]),
           "mlp": torch.full((4,), 7.0), "personal": torch.ones(2, 3, 2)}
    fresh = {"item_emb": torch.zeros(5, 2), "user_emb": torch.zeros(4, 2), "head_b": torch.zeros(4),
             "mlp": torch.zeros(4), "personal": torch.zeros(4, 5, 2)}
    grown = grow_state(old, fresh)
    assert grown["item_emb"].shape == (5, 2) and torch.equal(grown["item_emb"][:3], old["item_emb"])
    assert torch.equal(grown["item_emb"][3:], torch.zeros(2, 2))
    assert torch.equal(grown["head_b"], torch.tensor([5.0, 6.0, 0.0, 0.0]))
    assert torch.equal(grown["mlp"], old["mlp"])
    assert torch.equal(grown["personal"][:2, :3], old["personal"]) and grown["personal"][2:].abs().sum() == 0
    with pytest.raises(ValueError):
        grow_state({"item_emb": torch.ones(6, 2)}, {"item_emb": torch.zeros(5, 2)})


@pytest.mark.parametrize("backbone, new_row_std", [(fedmf_backbone(dim=8), 0.01), (pfedrec_backbone(dim=8), 1.0),
                                                   (fedncf_backbone(dim=8), 1.0)], ids=["fedmf", "pfedrec", "fedncf"])
def test_new_rows_follow_the_backbone_init(stream, backbone, new_row_std):
    config = FederatedConfig(rounds=1, seed=4)
    model0 = backbone.make_model(stream[0].num_users, stream[0].num_items)
    gen = torch.Generator().manual_seed(0)
    state0 = {"global": {k: v + torch.randn(v.shape, generator=gen) for k, v in
                         model0.init_global(gen).items()},
              "private": model0.init_private(gen)}
    previous = PreviousBlock(0, stream[0], model0, state0["global"], state0["private"])
    model1 = backbone.make_model(stream[1].num_users, stream[1].num_items)
    ctx = BlockContext(1, stream[1], model1, backbone.make_method(model1), config, previous)
    state = initial_block_state(ctx, seed=4, device="cpu")
    old_items = stream[0].num_items
    assert state.global_state["item_emb"].shape == (stream[1].num_items, 8)
    assert torch.equal(state.global_state["item_emb"][:old_items], state0["global"]["item_emb"])
    for name, table in state.private_state.items():
        assert table.shape[0] == stream[1].num_users
        assert torch.equal(table[:stream[0].num_users], state0["private"][name])
    new_rows = state.global_state["item_emb"][old_items:]
    assert new_rows.numel() > 0
    assert 0.3 * new_row_std < float(new_rows.std()) < 3 * new_row_std
    # seeded: the same (seed, block) draws the same new rows
    again = initial_block_state(ctx, seed=4, device="cpu")
    assert torch.equal(again.global_state["item_emb"], state.global_state["item_emb"])


def test_block_seeds_differ_between_blocks_and_are_reproducible():
    assert block_seed(0, 1) == block_seed(0, 1)
    assert len({block_seed(0, t) for t in range(4)} | {block_seed(1, 0)}) == 5


@pytest.mark.parametrize("name", ["FT", "F3CRec"])
def test_loop_returns_per_block_metrics_and_grows_tables(stream, runs, name):
    result = runs[name]
    assert all(isinstance(b, RunResult) and b.method == name for b in result.blocks)  # one trainer run per block
    assert [block_artifacts(b)["block"] for b in result.blocks] == [0, 1, 2, 3]
    for t, block in enumerate(result.blocks):
        split, info, selected = stream[t], block_artifacts(block), block.selected_state
        assert info["name"] == split.name and info["seconds"] > 0
        assert (info["num_users"], info["num_items"]) == (split.num_users, split.num_items)
        assert selected.global_state["item_emb"].shape == (split.num_items, 8)
        assert selected.private_state["user_emb"].shape == (split.num_users, 8)
        assert set(block.test_metrics) == {"Recall@20", "NDCG@20"}
        assert 0.0 < block.test_metrics["NDCG@20"] < 1.0
        assert block.best_round is not None and 1 <= block.best_round <= block.round_index <= CONFIG.rounds
        assert block.best_metrics["NDCG@20"] == block.history[block.best_round - 1]["valid/NDCG@20"]
        # per-user vectors: the evaluated users, and their mean is the block's metric
        assert np.array_equal(info["test_users"], split.test.active_users())
        for metric, values in info["test_per_user"].items():
            assert values.shape == info["test_users"].shape
            assert np.nanmean(values) == pytest.approx(block.test_metrics[metric], abs=1e-12)
    assert np.array_equal(result.per_block("NDCG@20"), [b.test_metrics["NDCG@20"] for b in result.blocks])
    summary = result.summary()
    assert summary["block"].tolist() == ["D0", "D1", "D2", "D3"]
    assert summary["rounds"].tolist() == [b.round_index for b in result.blocks]
    assert summary["test/NDCG@20"].tolist() == result.per_block("NDCG@20").tolist()


@pytest.mark.parametrize("name", ["FT", "F3CRec"])
def test_old_rows_survive_into_the_next_block_unchanged(runs, name):
    result, starts = runs[name], runs["starts"][name]
    for t in range(1, 4):
        start_global, start_private = starts[t]
        before, info = result.blocks[t - 1].selected_state, block_artifacts(result.blocks[t - 1])
        old_items, old_users = info["num_items"], info["num_users"]
        # the starting point of block t is the best-validation state of block t-1, plus new rows
        assert torch.equal(start_global["item_emb"][:old_items], before.global_state["item_emb"])
        assert torch.equal(start_private["user_emb"][:old_users], before.private_state["user_emb"])
        assert start_global["item_emb"].shape[0] == block_artifacts(result.blocks[t])["num_items"]


def test_accuracy_matrix(stream, runs):
    result = runs["F3CRec"]
    matrix = result.accuracy["NDCG@20"]
    assert matrix.shape == (4, 4)
    assert np.all(np.isnan(matrix[np.triu_indices(4, 1)]))
    assert np.all(np.isfinite(matrix[np.tril_indices(4)]))
    assert np.array_equal(np.diag(matrix), result.per_block("NDCG@20"))
    # A[3][0] by hand: the block-3 model over all its items, block 0's test users, block 0's train+valid
    # masked (and nothing from other blocks).
    final, block0 = result.blocks[3].selected_state, stream[0]
    users = block0.test.active_users()
    scores = BACKBONE.make_model(stream[3].num_users, stream[3].num_items).score_users(
        final.global_state, final.private_state, torch.as_tensor(users))
    known = union_pairs(block0.train, block0.valid)
    per_user = full_ranking_metrics_from_score_fn(
        lambda u: scores[torch.searchsorted(torch.as_tensor(users), u)], user_ids=users,
        target_indptr=block0.test.indptr, target_items=block0.test.items,
        mask_indptr=known.indptr, mask_items=known.items, ks=(20,))
    assert mean_over_users(per_user)["NDCG@20"] == pytest.approx(matrix[3, 0], abs=1e-12)


def test_f3crec_starts_as_fine_tuning_then_departs(runs):
    ft, f3 = runs["FT"], runs["F3CRec"]
    assert ft.blocks[0].test_metrics == f3.blocks[0].test_metrics  # block 0 is plain FedMF for both
    assert torch.equal(ft.blocks[0].selected_state.global_state["item_emb"],
                       f3.blocks[0].selected_state.global_state["item_emb"])
    assert not torch.equal(ft.blocks[1].selected_state.global_state["item_emb"],
                           f3.blocks[1].selected_state.global_state["item_emb"])
    test = f3.paired_ttest(ft, block=1)
    assert test.n == block_artifacts(f3.blocks[1])["test_users"].size


def test_shared_base_block_gives_the_same_run(stream, runs):
    again = run_continual(stream, BACKBONE, F3CRec(eps=0.01), CONFIG, device="cpu", base=runs["FT"].blocks[0],
                          num_blocks=2)
    assert len(again.blocks) == 2 and again.blocks[0] is runs["FT"].blocks[0]
    assert again.blocks[1].test_metrics == runs["F3CRec"].blocks[1].test_metrics
    assert torch.equal(again.blocks[1].selected_state.global_state["item_emb"],
                       runs["F3CRec"].blocks[1].selected_state.global_state["item_emb"])


@pytest.mark.parametrize("method", [kd_baseline(), ParameterRegularisation(lambda_reg=1e-3),
                                    F3CRec(client_cl=False), F3CRec(server_cl=False, memory_refresh="trained"),
                                    F3CRec(itemwise=False)], ids=["KD", "Reg", "wo_cc", "wo_sc", "wo_itm"])
def test_baselines_and_ablations_run(stream, runs, method):
    result = run_continual(stream, BACKBONE, method, CONFIG, device="cpu", base=runs["FT"].blocks[0],
                           num_blocks=3, accuracy_matrix=False)
    assert len(result.blocks) == 3 and result.method == method.name
    assert all(np.isfinite(result.per_block("NDCG@20")))
    assert np.isnan(result.accuracy["NDCG@20"][2, 0])  # matrix not requested: diagonal only
    assert not torch.equal(result.blocks[1].selected_state.global_state["item_emb"],
                           runs["FT"].blocks[1].selected_state.global_state["item_emb"])


def test_a_base_of_another_stream_is_refused(stream, runs):
    other = drifting_stream(num_users=30, num_items=50, interactions_per_user=30, seed=1)
    with pytest.raises(ValueError, match=f"base was trained on a block 0 of {stream[0].num_users} users"):
        run_continual(other, BACKBONE, FineTuning(), CONFIG, device="cpu", base=runs["FT"].blocks[0], num_blocks=1)


def test_block_layouts_refuse_a_run_that_is_not_a_block(runs):
    plain = RunResult(state=None, selection=runs["FT"].blocks[0].selection)
    with pytest.raises(ValueError, match="lacks .*'block'.*run_continual"):
        block_row(plain)


def test_block_payload_round_trips_through_a_weights_only_file(tmp_path, runs):
    block = runs["F3CRec"].blocks[1]
    torch.save(block_payload(block), tmp_path / "block.pt")
    again = block_from_payload(torch.load(tmp_path / "block.pt", weights_only=True), "cpu")
    assert (again.method, again.round_index, again.best_round, again.stopped_early) == \
        (block.method, block.round_index, block.best_round, block.stopped_early)
    assert again.history == block.history and again.test_metrics == block.test_metrics
    assert again.selection == block.selection and again.best_metrics == block.best_metrics
    for name, value in block.selected_state.global_state.items():
        assert torch.equal(again.selected_state.global_state[name], value)
    for name, value in block.state.private_state.items():
        assert torch.equal(again.state.private_state[name], value)
    assert block_row(again) == block_row(block)
    for key in BLOCK_ARTIFACTS:
        if key == "test_per_user":
            assert all(np.array_equal(again.artifacts[key][m], v) for m, v in block.artifacts[key].items())
        else:
            assert np.array_equal(again.artifacts[key], block.artifacts[key])
    with pytest.raises(ValueError, match="not a block run of layout"):
        block_from_payload({**block_payload(block), "format": "fedlib.continual.block-run/0"})
