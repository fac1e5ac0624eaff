"""F3CRec's three official-code options: next_block_from, valid_rule, memory_refresh, and their wiring.

Each option defaults to fedlib's behaviour; its other value is what the official code does
(https://github.com/Jaehyung-Lim/F3CRec-CIKM-25). The tests check each behaviour on a small
stream and that the defaults leave the recorded cells (their hashes) untouched.
"""
import dataclasses

import numpy as np
import pandas as pd
import pytest
import torch

from fedlib.baselines.continual.continual import FineTuning, fedmf_backbone, run_continual
from fedlib.data.protocols import _common as C
from fedlib.data.protocols import f3crec as protocol
from fedlib.data.splits import Pairs
from fedlib.data.synthetic import drifting_stream
from fedlib.engine import FederatedConfig
from fedlib.papers.f3crec import experiment as X
from fedlib.papers.f3crec.method import F3CRec, item_temporal_mean_mix, top_n_memory

TINY = {"rounds": 2, "patience": 2, "seed": 0}


def _config(rounds=8, patience=1):
    return FederatedConfig(rounds=rounds, seed=0, batch_size=32, num_negatives=4, local_epochs=1,
                           clients_per_round=None, eval_every=1, patience=patience, selection_metric="NDCG@20",
                           prefer_later_ties=False, dtype="float64")


def _small_stream():
    return drifting_stream(num_users=60, num_items=80, interactions_per_user=30, seed=0, split="chronological")


def _scores(model, state):
    with torch.no_grad():
        return model.score_users(state.global_state, state.private_state, torch.arange(model.num_users))


def _rows_equal(grown, old):
    """Whether the leading rows of ``grown`` (the next block's table) are exactly ``old``."""
    return torch.equal(grown[tuple(slice(0, s) for s in old.shape)], old)


# ======================================================================================
# (a) next_block_from
# ======================================================================================
@pytest.fixture(scope="module")
def best_and_last():
    """Two runs of blocks D0-D1 (FedMF, F3CRec) that differ only in ``next_block_from``."""
    out = {}
    for rule in ("best", "last"):
        starts = {}

        def capture(ctx, state, starts=starts):
            starts[ctx.index] = (ctx, state.global_state["item_emb"].clone(), state.private_state["user_emb"].clone())

        method = F3CRec(top_n=5, eps=0.01, lambda_kd=0.1, beta=0.5)
        run = run_continual(_small_stream(), fedmf_backbone(dim=8, lr=2.0), method, _config(), num_blocks=2,
                            device="cpu", on_block_start=capture, next_block_from=rule)
        out[rule] = (run, starts, method)
    return out


def test_early_stopping_fired_so_best_and_last_differ(best_and_last):
    block0 = best_and_last["best"][0].blocks[0]
    assert block0.stopped_early and block0.best_round < block0.round_index
    assert not torch.equal(block0.best_state.global_state["item_emb"], block0.state.global_state["item_emb"])


@pytest.mark.parametrize("rule", ["best", "last"])
def test_next_block_starts_from_the_chosen_state(best_and_last, rule):
    run, starts, _ = best_and_last[rule]
    block0 = run.blocks[0]
    chosen, other = (block0.best_state, block0.state) if rule == "best" else (block0.state, block0.best_state)
    _, items, users = starts[1]
    assert _rows_equal(items, chosen.global_state["item_emb"])
    assert _rows_equal(users, chosen.private_state["user_emb"])
    assert not _rows_equal(items, other.global_state["item_emb"])


def test_last_changes_only_the_start_not_the_test_nor_the_memory(best_and_last):
    best_run, best_starts, best_method = best_and_last["best"]
    last_run, last_starts, last_method = best_and_last["last"]
    b0, l0 = best_run.blocks[0], last_run.blocks[0]
    # Block 0 is tested on its best-validation state in both runs.
    assert b0.test_metrics == l0.test_metrics and b0.best_round == l0.best_round
    for metric, values in b0.artifacts["test_per_user"].items():
        assert np.array_equal(values, l0.artifacts["test_per_user"][metric])
    # What block 1's methods see of block 0 is its best state (F3CRec's anchor Q^0, Reg's target) ...
    ctx = last_starts[1][0]
    for name, value in l0.best_state.global_state.items():
        assert torch.equal(ctx.previous.global_state[name], value)
    for name, value in l0.best_state.private_state.items():
        assert torch.equal(ctx.previous.private_state[name], value)
    # ... and the KD teacher / top-N memory come from the best state too.
    scores = _scores(ctx.previous.model, l0.best_state)
    items, logits = top_n_memory(scores, 5)
    assert torch.equal(ctx.previous.memory["topn_items"], items)
    assert torch.equal(ctx.previous.memory["topn_logits"], logits)
    assert torch.equal(last_method.losses[1].teacher_logits, best_method.losses[1].teacher_logits)
    assert torch.equal(last_method.losses[1].memory_items, best_method.losses[1].memory_items)
    # The temporal mean mixes towards the best item table, not the last one.
    mix = F3CRec(top_n=5, beta=0.5).make_method(ctx).server_mix  # what block 1's method is built from ctx
    aggregated = {"item_emb": last_starts[1][1] + 0.01}
    mixed = mix(None, aggregated, 0)["item_emb"]
    towards_best = item_temporal_mean_mix({"item_emb": l0.best_state.global_state["item_emb"]}, 0.5)
    towards_last = item_temporal_mean_mix({"item_emb": l0.state.global_state["item_emb"]}, 0.5)
    assert torch.equal(mixed, towards_best(None, aggregated, 0)["item_emb"])
    assert not torch.allclose(mixed, towards_last(None, aggregated, 0)["item_emb"])
    # Block 1 itself then differs (it started elsewhere).
    assert best_run.blocks[1].history != last_run.blocks[1].history


def test_next_block_from_rejects_other_values():
    with pytest.raises(ValueError, match=r"next_block_from must be one of \('best', 'last'\).*'final'"):
        run_continual(_small_stream(), fedmf_backbone(dim=8), FineTuning(), _config(), next_block_from="final")


def test_a_shared_base_block_starts_the_next_from_its_stored_last_state(tmp_path):
    config = X.cell("synthetic", "FedMF", "FT", rounds=6, patience=1, seed=0)  # stops early: best round 3 of 4
    stream = X.load_stream(config)
    base = X.base_block(config, stream, tmp_path, "cpu")
    reloaded = X.base_block(config, stream, tmp_path, "cpu")  # from the cache file
    assert not torch.equal(base.state.global_state["item_emb"], base.best_state.global_state["item_emb"])
    starts = {}
    run_continual(stream, X.make_backbone(config), FineTuning(), X.federated_config(config), base=reloaded,
                  num_blocks=2, device="cpu", next_block_from="last",
                  on_block_start=lambda ctx, state: starts.setdefault(ctx.index, state.global_state["item_emb"]))
    assert _rows_equal(starts[1], base.state.global_state["item_emb"])


# ======================================================================================
# (b) valid_rule
# ======================================================================================
# n -> (test, valid under "tenth", valid under "code"), by hand:
#   tenth: valid = ceil(n/10); code: valid = ceil((n - ceil(n/10)) / 9); both test = ceil(n/10)
EXPECTED_SIZES = {
    2: (0, 0, 0),  # fewer than 3: everything in train
    3: (1, 1, 1), 4: (1, 1, 1), 5: (1, 1, 1), 6: (1, 1, 1), 7: (1, 1, 1), 8: (1, 1, 1), 9: (1, 1, 1),
    10: (1, 1, 1),  # code: ceil(9/9) = 1
    11: (2, 2, 1),  # code: ceil(9/9) = 1 < 2
    12: (2, 2, 2), 13: (2, 2, 2), 14: (2, 2, 2), 15: (2, 2, 2), 16: (2, 2, 2), 17: (2, 2, 2), 18: (2, 2, 2),
    19: (2, 2, 2),  # code: ceil(17/9) = 2
    20: (2, 2, 2),  # code: ceil(18/9) = 2
    21: (3, 3, 2),  # code: ceil(18/9) = 2 < 3
    22: (3, 3, 3), 23: (3, 3, 3), 24: (3, 3, 3), 25: (3, 3, 3),
    1121: (113, 113, 112),  # code: ceil(1008/9) = 112
}


def _frame_with_counts():
    """A frame whose blocks D1-D3 each hold users 0..22 with n = 3..25 interactions.

    2,415 interactions: D0 = floor(0.6 · 2415) = 1,449 (users 0..22 with 3..25, user 23 with 2,
    user 24 with 1,121, user 25 with 4), then three blocks of 322. Each interaction has its own
    item; within a block the order of the rows is shuffled (timestamps follow the row order).
    """
    rng = np.random.default_rng(5)
    ramp = np.repeat(np.arange(23), np.arange(3, 26))  # users 0..22, n = 3..25 (322 rows)
    base = np.concatenate([ramp, [23] * 2, [24] * 1121, [25] * 4])
    users = np.concatenate([rng.permutation(base)] + [rng.permutation(ramp) for _ in range(3)])
    assert users.size == 2415 and base.size == 1449
    return pd.DataFrame({"user": users, "item": np.arange(users.size), "rating": 1.0,
                         "timestamp": np.arange(users.size, dtype=np.int64)})


def _per_user_counts(block):
    def count(pairs):
        return np.bincount(pairs.users, minlength=block.num_users)
    return count(block.train) + count(block.valid) + count(block.test), count(block.valid), count(block.test)


@pytest.mark.parametrize("split", ["chronological", "random"])
@pytest.mark.parametrize("rule", ["tenth", "code"])
def test_valid_sizes_follow_the_rule_in_every_block(split, rule):
    stream = protocol.stream_from_frame(_frame_with_counts(), k_core=1, split=split, seed=3, valid_rule=rule)
    column = {"tenth": 1, "code": 2}[rule]
    checked = set()
    for t, block in enumerate(stream.blocks):
        total, valid, test = _per_user_counts(block)
        if t:
            assert sorted(total[total > 0].tolist()) == list(range(3, 26))
        for user in np.flatnonzero(total):
            n = int(total[user])
            assert (int(test[user]), int(valid[user])) == (EXPECTED_SIZES[n][0], EXPECTED_SIZES[n][column]), (t, n)
            checked.add(n)
    assert checked == set(EXPECTED_SIZES)
    assert stream.extra["valid_rule"] == rule


def _reference_positions(frame, split, seed):
    """Valid and test positions of every block as the shared helper (unchanged) holds them out."""
    users = frame["user"].to_numpy()
    n = users.size
    n_base = n * 6 // 10
    per_block = (n - n_base) // 3
    cuts = [0, n_base, n_base + per_block, n_base + 2 * per_block, n]
    out = []
    for t in range(4):
        lo, hi = cuts[t], cuts[t + 1]
        mode = "random" if (split == "random" or t == 0) else "chronological"
        roles = C.holdout_roles(users[lo:hi], mode=mode, rng=np.random.default_rng([seed, t]))
        positions = np.arange(lo, hi)
        out.append((np.sort(positions[roles == C.VALID]), np.sort(positions[roles == C.TEST])))
    return out


@pytest.mark.parametrize("split", ["chronological", "random"])
def test_default_split_is_the_unchanged_helper(split):
    frame = _frame_with_counts()  # ids are already dense in order of appearance: positions = rows
    default = protocol.stream_from_frame(frame, k_core=1, split=split, seed=3)
    for block, (valid, test) in zip(default.blocks, _reference_positions(frame, split, seed=3)):
        assert np.array_equal(np.sort(block.extra["valid_positions"]), valid)
        assert np.array_equal(np.sort(block.extra["test_positions"]), test)
        total, valid_counts, _ = _per_user_counts(block)
        holds = total >= 3
        assert np.array_equal(valid_counts[holds], (total[holds] + 9) // 10)  # ceil(n/10)
    assert default.notes == protocol.stream_from_frame(frame, k_core=1, split=split, seed=3,
                                                       valid_rule="tenth").notes


@pytest.mark.parametrize("split", ["chronological", "random"])
def test_code_rule_keeps_the_test_rows_and_returns_valid_rows_to_train(split):
    frame = _frame_with_counts()
    tenth = protocol.stream_from_frame(frame, k_core=1, split=split, seed=3)
    code = protocol.stream_from_frame(frame, k_core=1, split=split, seed=3, valid_rule="code")
    for t, (a, b) in enumerate(zip(tenth.blocks, code.blocks)):
        assert np.array_equal(a.extra["test_positions"], b.extra["test_positions"])
        assert set(b.extra["valid_positions"]) <= set(a.extra["valid_positions"])
        returned = set(a.extra["valid_positions"]) - set(b.extra["valid_positions"])
        assert returned <= set(b.extra["train_positions"])
        if split == "chronological" and t:  # valid = the latest rows before the test rows
            valid_users = b.valid.users
            for user in np.unique(valid_users):
                train_last = b.extra["train_positions"][b.train.users == user].max()
                assert b.extra["valid_positions"][valid_users == user].min() > train_last


def test_holdout_sizes_and_bad_rule():
    counts = np.array(sorted(EXPECTED_SIZES))
    for rule, column in (("tenth", 1), ("code", 2)):
        n_test, n_valid = protocol.holdout_sizes(counts, rule)
        assert n_test.tolist() == [EXPECTED_SIZES[n][0] for n in counts]
        assert n_valid.tolist() == [EXPECTED_SIZES[n][column] for n in counts]
    with pytest.raises(ValueError, match=r"valid_rule must be one of \('tenth', 'code'\).*'sklearn'"):
        protocol.stream_from_frame(_frame_with_counts(), k_core=1, valid_rule="sklearn")


# ======================================================================================
# (c) memory_refresh
# ======================================================================================
def _stream_with_idle_users(idle):
    """The small stream with users ``idle`` absent from block 1 (no train, valid or test rows)."""
    stream = _small_stream()
    block = stream.blocks[1]

    def without(pairs):
        keep = ~np.isin(pairs.users, idle)
        return Pairs.from_arrays(pairs.users[keep], pairs.items[keep], pairs.num_users)

    block = dataclasses.replace(block, train=without(block.train), valid=without(block.valid),
                                test=without(block.test))
    active = tuple(np.setdiff1d(a, idle) if t == 1 else a for t, a in enumerate(stream.active_users))
    return dataclasses.replace(stream, blocks=(stream.blocks[0], block, *stream.blocks[2:]), active_users=active)


@pytest.mark.parametrize("refresh", ["all", "trained"])
def test_memory_refresh_keeps_the_lists_of_users_absent_from_the_block(refresh):
    idle = np.arange(5)
    stream = _stream_with_idle_users(idle)
    previous = {}
    method = F3CRec(top_n=5, eps=0.01, lambda_kd=0.1, beta=0.5, memory_refresh=refresh)
    run = run_continual(stream, fedmf_backbone(dim=8, lr=2.0), method, _config(rounds=3, patience=3), num_blocks=3,
                        device="cpu", on_block_start=lambda ctx, state: previous.setdefault(ctx.index, ctx.previous))
    after0, after1 = previous[1].memory, previous[2].memory  # the lists built after D0 and after D1
    scores = _scores(previous[2].model, run.blocks[1].best_state)  # block 1's best model, every user
    fresh_items, _ = top_n_memory(scores, 5)
    trained = np.setdiff1d(np.arange(stream[1].num_users), idle)
    assert torch.equal(after1["topn_items"][trained], fresh_items[trained])  # trained users: rebuilt either way
    if refresh == "trained":  # the official code: idle users keep their list from D0
        assert torch.equal(after1["topn_items"][idle], after0["topn_items"][idle])
    else:
        assert torch.equal(after1["topn_items"][idle], fresh_items[idle])
        assert not torch.equal(fresh_items[idle], after0["topn_items"][idle])  # so the two rules differ here
    # The teacher scores always come from the newest model, at each user's listed items (scored in
    # other user batches than here, hence a rounding tolerance).
    torch.testing.assert_close(after1["topn_logits"], scores.gather(1, after1["topn_items"]), rtol=0, atol=1e-12)


# ======================================================================================
# Wiring: cells, hashes, the grid part, and what run_cell hands on
# ======================================================================================
CODE_VALUES = {"next_block_from": "last", "valid_rule": "code", "memory_refresh": "trained"}


def test_cells_at_the_defaults_leave_the_options_out():
    for method in ("FT", "F3CRec", "KD", "w/o a.r.m"):
        default = X.cell("ML-100K", "FedMF", method)
        assert not set(CODE_VALUES) & set(default)
        explicit = X.cell("ML-100K", "FedMF", method, next_block_from="best", valid_rule="tenth", memory_refresh="all")
        assert X.config_hash(explicit) == X.config_hash(default)


@pytest.mark.parametrize("key", sorted(CODE_VALUES))
def test_a_code_value_enters_the_config_and_its_hash(key):
    default = X.cell("ML-100K", "FedMF", "F3CRec")
    changed = X.cell("ML-100K", "FedMF", "F3CRec", **{key: CODE_VALUES[key]})
    assert changed[key] == CODE_VALUES[key]
    assert {k: v for k, v in changed.items() if k != key} == default
    assert X.config_hash(changed) != X.config_hash(default)


@pytest.mark.parametrize("key, allowed", [("next_block_from", r"\('best', 'last'\)"),
                                          ("valid_rule", r"\('tenth', 'code'\)"),
                                          ("memory_refresh", r"\('all', 'trained'\)")])
def test_an_invalid_option_names_the_allowed_values(key, allowed):
    with pytest.raises(ValueError, match=f"{key} must be one of {allowed}.*'bogus'"):
        X.cell("ML-100K", "FedMF", "F3CRec", **{key: "bogus"})


def test_memory_refresh_is_refused_for_a_method_without_top_n_lists():
    with pytest.raises(ValueError, match="memory_refresh='trained' changes nothing for 'FT'.*F3CRec.*KD"):
        X.cell("ML-100K", "FedMF", "FT", memory_refresh="trained")


def test_code_options_part_lists_every_variant():
    cells = X.grid_cells("code_options", ["ML-100K"])
    assert len(cells) == 3 * 9 and {c["backbone"] for c in cells} == set(X.BACKBONES)
    variants = {(c["method"], *(c.get(k, "-") for k in sorted(CODE_VALUES))) for c in cells}
    # (method, memory_refresh, next_block_from, valid_rule); "-": left out at its default
    assert ("FT", "-", "-", "-") in variants and ("F3CRec", "trained", "last", "code") in variants
    assert len(variants) == 9 and not any(m == "FT" and refresh != "-" for m, refresh, _, _ in variants)
    table2 = {X.config_hash(c) for c in X.grid_cells("table2", ["ML-100K"]) if c["method"] in ("FT", "F3CRec")}
    defaults = {X.config_hash(c) for c in cells if not set(CODE_VALUES) & set(c)}
    assert defaults == table2  # the default variant is Table 2's (already recorded) cells


def test_make_method_passes_memory_refresh_to_the_methods_with_a_memory():
    for method in ("F3CRec", "KD", "w/o s.c"):
        for refresh in ("all", "trained"):
            built = X.make_method(X.cell("ML-100K", "FedMF", method, memory_refresh=refresh), 1000)
            assert built.memory_refresh == refresh and built.name == method
    noisy = X.make_method(X.cell("ML-100K", "FedMF", "F3CRec", memory_refresh="trained", upload_noise=0.1), 1000)
    assert noisy.inner.memory_refresh == "trained"
    recorded = X.cell("ML-100K", "FedMF", "F3CRec")  # as recorded before the option: no memory_refresh key
    assert "memory_refresh" not in recorded and X.make_method(recorded, 1000).memory_refresh == "all"


def test_load_stream_passes_valid_rule(monkeypatch):
    seen = []
    monkeypatch.setattr(X, "build_split", lambda *args, **kwargs: seen.append((args, kwargs)))
    X.load_stream(X.cell("ML-100K", "FedMF", "FT"))
    X.load_stream(X.cell("ML-100K", "FedMF", "FT", valid_rule="code"))
    assert [kwargs["valid_rule"] for _, kwargs in seen] == ["tenth", "code"]
    assert seen[0] == (("f3crec", "ml-100k"), {"split": "chronological", "valid_rule": "tenth"})
    with pytest.raises(ValueError, match="synthetic stream.*'tenth' only"):
        X.load_stream(X.cell("synthetic", "FedMF", "FT", valid_rule="code"))


def test_base_block_cache_is_keyed_by_the_valid_rule(tmp_path):
    stream = X.load_stream(X.cell("synthetic", "FedMF", "FT", **TINY))
    X.base_block(X.cell("synthetic", "FedMF", "FT", **TINY), stream, tmp_path, "cpu")
    X.base_block(X.cell("synthetic", "FedMF", "F3CRec", next_block_from="last", **TINY), stream, tmp_path, "cpu")
    assert len(list((tmp_path / "base").glob("*.pt"))) == 1  # one block 0 for both starting rules
    X.base_block(X.cell("synthetic", "FedMF", "FT", valid_rule="code", **TINY), stream, tmp_path, "cpu")
    assert len(list((tmp_path / "base").glob("*.pt"))) == 2  # another split, another block 0


@pytest.mark.parametrize("rule", [None, "last"])
def test_run_cell_passes_next_block_from(monkeypatch, tmp_path, rule):
    seen = []
    real = X.run_continual

    def spy(*args, **kwargs):
        seen.append(kwargs.get("next_block_from", "best"))
        return real(*args, **kwargs)

    monkeypatch.setattr(X, "run_continual", spy)
    settings = {**TINY, "num_blocks": 2, **({"next_block_from": rule} if rule else {})}
    X.run_cell(X.cell("synthetic", "FedMF", "FT", **settings), cache_dir=tmp_path, device="cpu")
    assert seen == ["best", rule or "best"]  # block 0 (base_block), then the continual run
