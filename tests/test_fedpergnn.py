"""FedPerGNN: graph expansion, graph attention, LDP, pseudo items, executors, learning, traffic."""
from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
import torch

from fedlib.data.protocols import fedkdrec
from fedlib.data.splits import Pairs
from fedlib.engine.communication import CommunicationLedger
from fedlib.engine.plan import round_generator, select_clients
from fedlib.baselines.single_domain.fedpergnn import (GNN_NAMES, FedPerGNNConfig, ThirdParty, client_noise,
                                                     client_upload, clip_rows, curve_rows, gat_layer, score_users,
                                                     selected_tensors, train_fedpergnn)
from fedlib.metrics.ranking import candidate_set_metrics
from conftest import missing_data

torch.set_num_threads(1)  # other experiments share this machine


def planted_split(seed: int = 0, groups: int = 4, users_per_group: int = 20, items_per_group: int = 50):
    """Users of group g interact only with items of group g (Zipf-like popularity inside the group).

    Users have 8 to 24 interactions, so clients take different numbers of local steps.
    """
    rng = np.random.default_rng(seed)
    popularity = 1.0 / np.arange(1, items_per_group + 1) ** 0.7
    popularity /= popularity.sum()
    rows = []
    for g in range(groups):
        for k in range(users_per_group):
            count = int(rng.integers(8, 25))
            items = rng.choice(items_per_group, count, replace=False, p=popularity) + g * items_per_group
            rows += [(g * users_per_group + k, int(i), 5.0, t) for t, i in enumerate(items)]
    return fedkdrec.split_from_frame(pd.DataFrame(rows, columns=["user", "item", "rating", "timestamp"]))


@pytest.fixture(scope="module")
def planted():
    return planted_split()


def assert_close(actual, expected, what="", rtol=1e-4, atol=1e-5):
    assert actual.shape == expected.shape, (what, actual.shape, expected.shape)
    gap = float((actual - expected).abs().max()) if actual.numel() else 0.0
    assert torch.allclose(actual, expected, rtol=rtol, atol=atol), f"{what}: max difference {gap}"


def hit_rate(score_fn, split, role="test") -> float:
    users = getattr(split, role).users
    return float(candidate_set_metrics(score_fn, users, split.extra[f"{role}_candidates"], ks=(10,))["HR@10"].mean())


# ------------------------------------------------------------------------------ configuration
@pytest.mark.parametrize("field, value, message", [
    ("dim", 0, "dim must be an integer >= 1"),
    ("rounds", 2.5, "rounds must be an integer"),
    ("client_fraction", 0.0, "client_fraction must be in"),
    ("client_fraction", 1.5, "client_fraction must be in"),
    ("lr", 0.0, "lr must be"),
    ("weight_decay", -1e-5, "weight_decay must be"),
    ("num_negatives", -1, "num_negatives must be an integer >= 0"),
    ("neighbors_per_item", -2, "neighbors_per_item"),
    ("gat_heads", 0, "gat_heads"),
    ("clip", 0.0, "clip"),
    ("clip", float("nan"), "clip"),
    ("laplace_scale", -0.1, "laplace_scale"),
    ("laplace_scale", float("inf"), "laplace_scale"),
    ("pseudo_items", -1, "pseudo_items"),
    ("eval_every", 0, "eval_every"),
    ("batch_size", True, "batch_size"),
])
def test_config_rejects_bad_values(field, value, message):
    with pytest.raises(ValueError, match=message):
        FedPerGNNConfig(**{field: value})


def test_config_accepts_no_clipping_and_rejects_unknown_executor(planted):
    assert FedPerGNNConfig(clip=float("inf"), laplace_scale=0.0).clip == math.inf
    with pytest.raises(ValueError, match="executor must be one of"):
        train_fedpergnn(planted, FedPerGNNConfig(rounds=1), executor="parallel")


# ------------------------------------------------------------------------------ graph expansion
def test_graph_expansion_matches_users_sharing_an_item():
    # item 0: users 0, 1, 2, 3; item 1: users 0, 4; item 2: user 0 only; item 3: users 1, 2.
    train = Pairs.from_arrays([0, 1, 2, 3, 0, 4, 0, 1, 2], [0, 0, 0, 0, 1, 1, 2, 3, 3], num_users=5)
    third = ThirdParty(train, num_items=4)
    users, items = np.array([0, 0, 0, 1]), np.array([0, 1, 2, 3])
    full = third.neighbours(users, items, cap=10, rng=np.random.default_rng(0))
    assert [set(row[row >= 0].tolist()) for row in full] == [{1, 2, 3}, {4}, set(), {2}]
    seen = set()
    for seed in range(30):
        capped = third.neighbours(users, items, cap=2, rng=np.random.default_rng(seed))
        assert capped.shape == (4, 2)
        row = capped[0]
        assert (row >= 0).all() and len(set(row.tolist())) == 2 and set(row.tolist()) <= {1, 2, 3}
        assert 0 not in capped[:3] and 1 not in capped[3]  # never the client itself
        assert capped[1].tolist() == [4, -1] and capped[2].tolist() == [-1, -1]
        seen |= set(row.tolist())
    assert seen == {1, 2, 3}  # sampling reaches every neighbour
    assert third.neighbours(users, items, cap=0, rng=np.random.default_rng(0)).shape == (4, 0)


# ------------------------------------------------------------------------------ graph attention
def test_gat_layer_attention_and_isolated_node():
    gen = torch.Generator().manual_seed(0)
    d, heads = 4, 2
    centre = torch.randn(1, 2, d, generator=gen)
    nbrs = torch.randn(1, 2, 3, d, generator=gen)
    mask = torch.tensor([[[True, True, False], [False, False, False]]])
    weight = torch.randn(1, heads, d, d, generator=gen)
    att_src, att_dst = torch.randn(1, heads, d, generator=gen), torch.randn(1, heads, d, generator=gen)
    out, alpha = gat_layer(centre, nbrs, mask, weight, att_src, att_dst)
    assert out.shape == (1, 2, d) and alpha.shape == (1, 2, heads, 4)
    assert_close(alpha.sum(-1), torch.ones(1, 2, heads))
    assert (alpha[0, 0, :, 3] == 0).all() and (alpha[0, 0, :, :3] > 0).all()  # masked neighbour gets nothing
    assert (alpha[0, 1, :, 0] == 1).all()
    assert_close(out[0, 1], centre[0, 1] + (weight[0] @ centre[0, 1]).mean(0))  # isolated: its own transform
    # Node 0 by the textbook formula: transform first, then attend.
    nodes = torch.stack([centre[0, 0], nbrs[0, 0, 0], nbrs[0, 0, 1]])  # (3, d)
    expected = []
    for h in range(heads):
        z = nodes @ weight[0, h].T  # (3, d)
        e = torch.nn.functional.leaky_relu(att_dst[0, h] @ z[0] + z @ att_src[0, h], 0.2)
        expected.append(e.softmax(0) @ z)
    assert_close(out[0, 0], centre[0, 0] + torch.stack(expected).mean(0))  # plus the residual


# ------------------------------------------------------------------------------ LDP and pseudo items
def test_clipping_bounds_norms_and_inf_is_identity():
    x = torch.randn(200, 8, generator=torch.Generator().manual_seed(1)) * torch.linspace(0.01, 3, 200)[:, None]
    clipped = clip_rows(x, 0.5)
    assert (clipped.norm(dim=1) <= 0.5 + 1e-6).all()
    small = x.norm(dim=1) <= 0.5
    assert small.any() and torch.equal(clipped[small], x[small])
    assert torch.equal(clip_rows(x, math.inf), x)


def test_laplace_noise_has_the_configured_scale():
    noise = client_noise(7, 3, num_items=30_000, num_real=20_000, pseudo_items=0, dim=10, gnn_size=50_000, scale=0.2)
    for draws in (noise.rows, noise.gnn):
        assert abs(float(draws.abs().mean()) - 0.2) < 0.006  # E|Laplace(0, b)| = b
        assert abs(float(draws.mean())) < 0.005
    again = client_noise(7, 3, num_items=30_000, num_real=20_000, pseudo_items=0, dim=10, gnn_size=50_000, scale=0.2)
    assert torch.equal(noise.rows, again.rows)  # a function of (key, client) only
    silent = client_noise(7, 3, num_items=10, num_real=5, pseudo_items=0, dim=4, gnn_size=6, scale=0.0)
    assert not silent.rows.any() and not silent.gnn.any()


def test_no_clipping_no_noise_leaves_the_upload_untouched():
    items, deltas, gnn = torch.tensor([1, 4, 6]), torch.randn(3, 4), torch.randn(6)
    noise = client_noise(1, 2, num_items=10, num_real=3, pseudo_items=0, dim=4, gnn_size=6, scale=0.0)
    sent_items, rows, sent_gnn = client_upload(items, deltas, gnn, noise, num_items=10, pseudo_items=0, clip=math.inf)
    assert torch.equal(sent_items, items) and torch.equal(rows, deltas) and torch.equal(sent_gnn, gnn)


def test_pseudo_items_are_uploaded_and_look_like_real_rows():
    gen = torch.Generator().manual_seed(2)
    real = torch.tensor([0, 3, 5, 8, 9, 12, 20, 21])
    interacted = {0, 3, 5}  # the rest of `real` are this round's sampled negatives
    deltas = torch.randn(real.numel(), 6, generator=gen) * 0.05 + 0.02
    m = 10
    noise = client_noise(11, 4, num_items=40, num_real=real.numel(), pseudo_items=m, dim=6, gnn_size=3, scale=0.0)
    items, rows, _ = client_upload(real, deltas, torch.zeros(3), noise, num_items=40, pseudo_items=m, clip=math.inf)
    assert items.numel() == real.numel() + m and torch.equal(items, torch.sort(items).values)
    pseudo = sorted(set(items.tolist()) - set(real.tolist()))
    assert len(pseudo) == m and not set(pseudo) & interacted
    assert (rows.abs().sum(1) > 0).all()  # no all-zero row gives the pseudo items away
    is_pseudo = torch.isin(items, torch.tensor(pseudo))
    ratio = float(rows[is_pseudo].norm(dim=1).mean() / rows[~is_pseudo].norm(dim=1).mean())
    assert 0.5 < ratio < 2.0
    # Fewer items than M left: all of them, and never a duplicate.
    few = client_noise(11, 4, num_items=12, num_real=real.numel() - 3, pseudo_items=m, dim=6, gnn_size=3, scale=0.0)
    items, _, _ = client_upload(real[:-3], deltas[:-3], torch.zeros(3), few, num_items=12, pseudo_items=m, clip=0.1)
    assert sorted(items.tolist()) == list(range(12))


# ------------------------------------------------------------------------------ executors
@pytest.mark.parametrize("privacy", [dict(clip=math.inf, laplace_scale=0.0, pseudo_items=0),
                                     dict(clip=0.1, laplace_scale=0.01, pseudo_items=7)])
def test_batched_matches_sequential(planted, privacy):
    config = FedPerGNNConfig(dim=8, rounds=2, client_fraction=0.2, batch_size=32, lr=0.01, weight_decay=1e-4,
                             neighbors_per_item=3, gat_heads=2, seed=5, **privacy)
    batched = train_fedpergnn(planted, config, executor="batched")
    sequential = train_fedpergnn(planted, config, executor="sequential")
    assert batched.best_state is None and selected_tensors(batched) is batched.state.tensors  # no evaluate: the last
    assert set(batched.state.tensors) == {"item", "user", *GNN_NAMES}
    for name, value in batched.state.tensors.items():
        assert_close(value, sequential.state.tensors[name], name)
    one_round = train_fedpergnn(planted, FedPerGNNConfig(dim=8, rounds=1, seed=5))
    moved = batched.state.tensors["item"] - one_round.state.tensors["item"]
    assert moved.abs().max() > 0  # the runs trained at all
    curves = curve_rows(batched), curve_rows(sequential)
    assert [c["round"] for c in curves[0]] == [2] and math.isnan(curves[0][-1]["valid"])  # scheduled, not evaluated
    assert abs(curves[0][-1]["loss"] - curves[1][-1]["loss"]) < 1e-5


# ------------------------------------------------------------------------------ learning
def test_learns_planted_groups(planted):
    config = FedPerGNNConfig(dim=16, rounds=40, client_fraction=0.5, lr=0.05, clip=1.0, laplace_scale=0.001,
                             pseudo_items=20, eval_every=10, seed=0)
    values = []

    def evaluate(round_index, score_fn):
        values.append(hit_rate(score_fn, planted, "valid"))
        return values[-1]

    run = train_fedpergnn(planted, config, evaluate=evaluate)
    curve = curve_rows(run)
    assert [c["round"] for c in curve] == [10, 20, 30, 40] and run.best_round in (10, 20, 30, 40)
    assert curve[[c["round"] for c in curve].index(run.best_round)]["valid"] == max(values)
    assert run.method == "FedPerGNN" and selected_tensors(run) is run.best_state.tensors

    def scores(users):
        return score_users(run, users)

    test_hr = hit_rate(scores, planted)
    random_hr = hit_rate(lambda users: torch.rand(len(users), planted.num_items,
                                                  generator=torch.Generator().manual_seed(0)), planted)
    assert test_hr > 0.3 and test_hr > random_hr + 0.15, (test_hr, random_hr)
    assert torch.equal(scores(torch.arange(5)), scores(torch.arange(5)))  # fixed neighbours


# ------------------------------------------------------------------------------ communication
def test_ledger_records_only_selected_clients(planted):
    config = FedPerGNNConfig(dim=8, rounds=3, client_fraction=0.25, seed=3, pseudo_items=4)
    ledger = CommunicationLedger()
    rounds_seen = []
    train_fedpergnn(planted, config, ledger=ledger, progress=rounds_seen.append)
    assert rounds_seen == [1, 2, 3]
    frame = ledger.to_frame(by_client=True)
    active = planted.train.active_users()
    for r in (1, 2, 3):
        chosen = set(select_clients(active, round(0.25 * active.size), round_generator(3, r - 1)).tolist())
        part = frame[frame["round"] == r]
        for direction in ("download", "upload"):
            totals = part[part["direction"] == direction].groupby("client")["bytes"].sum()
            assert set(totals.index) == chosen and (totals > 0).all()
        table = part[part["name"] == "item_table"]
        assert (table["bytes"] == planted.num_items * 8 * 4).all()
        rows = part[part["name"] == "item_rows"]["bytes"]
        assert (rows % (8 * 4 + 8) == 0).all() and (rows // (8 * 4 + 8) > 4).all()  # real rows + 4 pseudo rows
    assert len(chosen) < planted.num_users


# ------------------------------------------------------------------------------ real data
def test_ml100k_two_rounds(shared_data):
    if not (shared_data / "ml-100k" / "u.data").exists():
        missing_data("ml-100k not in the data root")
    split = fedkdrec.build("ml-100k", root=shared_data)
    calls = []
    run = train_fedpergnn(split, FedPerGNNConfig(rounds=2, eval_every=1),
                          evaluate=lambda r, fn: calls.append(r) or hit_rate(fn, split, "valid"))
    assert calls == [1, 2] and len(curve_rows(run)) == 2
    scores = score_users(run, torch.arange(50))
    assert scores.shape == (50, 1682) and torch.isfinite(scores).all()


# ------------------------------------------------------------------------------ the trainer: checkpoint and resume
class _Killed(Exception):
    pass


def test_fedpergnn_is_an_algorithm_and_a_killed_run_resumes_to_the_uninterrupted_result(planted, tmp_path):
    from fedlib.engine import Checkpointer
    from fedlib.engine.algorithm import Algorithm
    from fedlib.engine.trainer import Schedule, train
    from fedlib.baselines.single_domain.fedpergnn import FedPerGNN

    config = FedPerGNNConfig(dim=8, rounds=5, eval_every=2, client_fraction=0.25, seed=4, pseudo_items=3,
                             laplace_scale=0.01)

    def evaluate(round_index, score_fn):  # a deterministic validation value of the current state
        return hit_rate(score_fn, planted, "valid")

    full_ledger = CommunicationLedger()
    full = train_fedpergnn(planted, config, evaluate=evaluate, ledger=full_ledger)
    assert isinstance(FedPerGNN(planted, config), Algorithm)

    def kill_at_four(round_index):
        if round_index == 4:
            raise _Killed

    with pytest.raises(_Killed):
        train_fedpergnn(planted, config, evaluate=evaluate, progress=kill_at_four,
                        checkpointer=Checkpointer(tmp_path, name="pergnn", every=3))
    second = Checkpointer(tmp_path, name="pergnn", every=3)
    resumed_ledger = CommunicationLedger()
    resumed = train_fedpergnn(planted, config, evaluate=evaluate, checkpointer=second, ledger=resumed_ledger)
    assert second.resumed_at == [3]
    assert curve_rows(resumed) == curve_rows(full) and resumed.best_round == full.best_round
    for name, value in full.state.tensors.items():
        assert torch.equal(resumed.state.tensors[name], value), name
        assert torch.equal(selected_tensors(resumed)[name], selected_tensors(full)[name]), name
    # only the rounds run after the resume are charged, and they are charged as in the full run
    frame, resumed_frame = full_ledger.per_round(), resumed_ledger.per_round()
    assert sorted(resumed_frame["round"].unique()) == [4, 5]
    assert frame[frame["round"] >= 4].reset_index(drop=True).equals(resumed_frame.reset_index(drop=True))
    # the trainer's schedule: evaluations after rounds 2, 4 and the last
    assert [c["round"] for c in curve_rows(full)] == [2, 4, 5]
    run = train(FedPerGNN(planted, config), Schedule(rounds=2), seed=4, evaluate=False)
    assert run.state.round_index == 2 and len(run.history) == 2
    with pytest.raises(ValueError, match="train_fedpergnn"):  # the trainer's bare run lacks the artifacts
        curve_rows(run)
