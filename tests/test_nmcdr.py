"""NMCDR: the matching attention, each matching layer on hand-made cases, and a short training run."""
import math

import numpy as np
import pytest
import torch
from torch import nn

from fedlib.data.splits import DomainSplit, InteractionSplit, Pairs
from fedlib.data.synthetic import overlapping_domains
from fedlib.baselines.cross_domain import nmcdr as N
from fedlib.baselines.cross_domain.cdr_common import history_rows, selected_blocks
from engine_toys import assert_steps_like_per_tensor_adam


def _set_linear(layer: nn.Linear, weight) -> None:
    with torch.no_grad():
        layer.weight.copy_(torch.as_tensor(weight, dtype=torch.float32))
        layer.bias.zero_()


def _zero_gate(gate: N.GateFusion) -> None:
    """σ(0) = ½: the gate averages its two inputs."""
    for layer in (gate.first, gate.second):
        _set_linear(layer, torch.zeros_like(layer.weight))


# ----------------------------------------------------------------------------- attention
def test_matching_attention_sums_to_one_and_prefers_the_more_similar_candidate():
    query = torch.tensor([[1.0, 0.0]])
    keys = torch.tensor([[1.0, 0.0], [0.0, 1.0], [-1.0, 0.0]])
    weights = N.matching_attention(query, keys)
    expected = torch.softmax(torch.tensor([1.0, 0.0, -1.0]) / math.sqrt(2), dim=0)
    assert torch.allclose(weights[0], expected)
    assert weights.sum().item() == pytest.approx(1.0)
    assert weights[0, 0] > weights[0, 1] > weights[0, 2]


def test_matching_attention_excludes_candidates_and_empty_rows_get_no_message():
    queries = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
    keys = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
    exclude = torch.tensor([[True, False], [True, True]])
    weights = N.matching_attention(queries, keys, exclude)
    assert torch.equal(weights[0], torch.tensor([0.0, 1.0]))  # the only allowed candidate takes everything
    assert torch.equal(weights[1], torch.zeros(2))  # nothing to match: zeros, not NaN


# ----------------------------------------------------------------------------- layers
def test_intra_matching_reads_candidates_but_never_the_node_itself():
    layer = N.IntraMatchingLayer(2)
    _set_linear(layer.head_proj, torch.eye(2))
    _set_linear(layer.tail_proj, torch.eye(2))
    _zero_gate(layer.gate)
    nodes = torch.tensor([[1.0, 0.0], [0.0, 2.0], [1.0, 1.0]])
    keys = torch.tensor([0, 1])  # nodes 0 and 1 are the candidates
    out = layer(nodes, keys, torch.tensor([True, False]))
    # Node 0 can only read node 1 (itself excluded); with W = I and g = ½ the message is ½ h_1.
    assert torch.allclose(out[0], torch.relu(nodes[0] + 0.5 * nodes[1]))
    assert torch.allclose(out[1], torch.relu(nodes[1] + 0.5 * nodes[0]))
    # Node 2 (not a candidate) reads both, weighted by the softmax of its scaled dot products.
    alpha = torch.softmax(torch.tensor([1.0, 2.0]) / math.sqrt(2), dim=0)
    assert torch.allclose(out[2], torch.relu(nodes[2] + 0.5 * (alpha[0] * nodes[0] + alpha[1] * nodes[1])))


def test_intra_matching_keeps_head_and_tail_channels_apart():
    layer = N.IntraMatchingLayer(2)
    _set_linear(layer.head_proj, torch.eye(2))
    _set_linear(layer.tail_proj, torch.zeros(2, 2))  # tail messages are dropped
    _zero_gate(layer.gate)
    nodes = torch.tensor([[0.0, 0.0], [3.0, 0.0], [0.0, 3.0]])
    out_head = layer(nodes, torch.tensor([1, 2]), torch.tensor([True, False]))
    # Node 0 weighs nodes 1 and 2 equally (both dot products are 0): head part = ½ h_1, halved by the gate.
    assert torch.allclose(out_head[0], torch.tensor([0.75, 0.0]))
    out_swapped = layer(nodes, torch.tensor([1, 2]), torch.tensor([False, True]))
    assert torch.allclose(out_swapped[0], torch.tensor([0.0, 0.75]))


def test_inter_matching_reads_the_counterpart_row_and_matches_only_other_users():
    layer = N.InterMatchingLayer(2)
    _zero_gate(layer.gate)
    own = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]])
    other = torch.tensor([[2.0, 0.0], [0.0, 4.0], [0.0, 0.0]])
    # Counterpart path only: out_i = relu(own_i + ½ W_s other_i).
    _set_linear(layer.match_proj, torch.zeros(2, 2))
    _set_linear(layer.self_proj, torch.eye(2))
    out = layer(own, other, torch.tensor([0, 1, 2]))
    assert torch.allclose(out, torch.relu(own + 0.5 * other))
    # Matching path only, with node 0's counterpart as the only candidate: node 0 must not read it.
    _set_linear(layer.match_proj, torch.eye(2))
    _set_linear(layer.self_proj, torch.zeros(2, 2))
    out = layer(own, other, torch.tensor([0]))
    assert torch.allclose(out[0], own[0])
    assert torch.allclose(out[1], torch.relu(own[1] + 0.5 * other[0]))


def test_complement_layer_attends_over_items():
    layer = N.ComplementLayer(2)
    _set_linear(layer.proj, torch.eye(2))
    users = torch.tensor([[2.0, 0.0]])
    items = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
    alpha = torch.softmax(torch.tensor([2.0, 0.0]) / math.sqrt(2), dim=0)
    assert torch.allclose(layer(users, items)[0], users[0] + alpha[0] * items[0] + alpha[1] * items[1])


# ----------------------------------------------------------------------------- model
def _toy_split():
    # Domain X: users 0, 1 (shared) and 2 (own); domain Y: users 0, 1 (shared) and 2, 3 (own).
    def part(users, items, num_users, num_items):
        train = Pairs.from_arrays(users, items, num_users)
        empty = Pairs.from_arrays(np.zeros(0, np.int64), np.zeros(0, np.int64), num_users)
        return InteractionSplit(num_users, num_items, train, empty, empty)

    x = part([0, 0, 1, 2, 2, 2], [0, 1, 1, 2, 3, 0], 3, 4)
    y = part([0, 1, 2, 3], [0, 1, 2, 2], 4, 3)
    return DomainSplit(("X", "Y"), {"X": x, "Y": y}, num_overlap_users=2)


def test_global_user_ids_share_the_overlap_and_separate_the_rest():
    ids, total = N.global_user_ids(_toy_split())
    assert ids[0].tolist() == [0, 1, 2]
    assert ids[1].tolist() == [0, 1, 3, 4]  # local user 2 of Y is a different person from X's user 2
    assert total == 5


def test_model_starts_as_the_mean_of_both_domains_and_scores_independently_of_chunking():
    split = _toy_split()
    config = N.NMCDRConfig(dim=8, hidden=4, head_min_interactions=2, num_user_candidates=3, num_item_candidates=2)
    model = N.NMCDRModel(split, config, torch.Generator().manual_seed(0))
    assert model.members[0].tolist() == [0, 1, 2] and model.members[1].tolist() == [0, 1, 3, 4]
    assert getattr(model, "is_head_0").tolist() == [True, False, True, False, False]
    nodes = torch.arange(model.num_global_users)
    user_keys = [torch.tensor([0, 1, 2]), torch.tensor([0, 3, 4])]
    item_keys = [torch.tensor([0, 3]), torch.tensor([1, 2])]
    with torch.no_grad():
        reps = model.represent(nodes, user_keys, item_keys)
    assert torch.allclose(reps["z"][0], 0.5 * (reps["h4"][0] + reps["h4"][1]), atol=1e-6)
    # The user-item mean of the graph encoder: X's user 2 has items 2, 3, 0.
    mean = torch.sparse.mm(getattr(model, "mean_items_0"), model.item_emb[0])
    assert torch.allclose(mean[2], model.item_emb[0][[2, 3, 0]].mean(0), atol=1e-6)
    scorers = N._scorers(model, [k.numpy() for k in user_keys], [t.numpy() for t in item_keys], "cpu")
    users, candidates = torch.tensor([0, 1, 2]), torch.tensor([[0, 1], [1, 3], [2, 0]])
    together = scorers[0](users, candidates)
    apart = torch.cat([scorers[0](users[:1], candidates[:1]), scorers[0](users[1:], candidates[1:])])
    assert torch.allclose(together, apart)


def test_config_rejects_bad_values():
    with pytest.raises(ValueError, match="num_user_candidates"):
        N.NMCDRConfig(num_user_candidates=0)
    with pytest.raises(ValueError, match="intra_layers"):
        N.NMCDRConfig(intra_layers=-1)
    with pytest.raises(ValueError, match="select_on"):
        N.NMCDRConfig(select_on="train")
    three = overlapping_domains(domains=("A", "B", "C"), num_users=60, items_per_domain=100, num_negatives=30)
    with pytest.raises(ValueError, match="exactly 2 domains"):
        N.NMCDRModel(three, N.NMCDRConfig(), torch.Generator().manual_seed(0))


# ----------------------------------------------------------------------------- training
FAST = dict(dim=32, encoder_layers=1, intra_layers=1, inter_layers=1, complement_layers=1,
            num_user_candidates=64, num_item_candidates=64, lr=5e-3)


def test_training_beats_random_ranking_and_is_deterministic():
    torch.set_num_threads(1)
    split = overlapping_domains(num_users=300, items_per_domain=150, overlap=0.5, seed=0)
    config = N.NMCDRConfig(**FAST, epochs=4, patience=4)
    rows = []
    result = N.train_nmcdr(split, config, progress=lambda epoch, row: rows.append(row))
    history = history_rows(result)
    assert rows == history and len(history) == 4
    best_valid = max(row["valid/HR@10"] for row in history)
    assert best_valid > 0.2, best_valid  # random ranking of 1 + 99 candidates: 0.1
    assert set(selected_blocks(result)) == {"A", "B"}
    assert result.best_round == max(history, key=lambda r: r["valid/HR@10"])["round"]
    short = N.NMCDRConfig(**FAST, epochs=1)
    first, second = N.train_nmcdr(split, short), N.train_nmcdr(split, short)
    assert history_rows(first)[0]["loss"] == history_rows(second)[0]["loss"]
    assert selected_blocks(first) == selected_blocks(second)


# ----------------------------------------------------------------------------- fast paths
def test_history_of_the_node_rows_equals_every_users_history_then_indexed_in_float64():
    """The step's history mean over the node rows only (NMCDRModel.history_of) against the plain
    full product then indexing (history_reference): values and the item table's gradient."""
    split = overlapping_domains(num_users=120, items_per_domain=80, overlap=0.5, num_negatives=20, seed=3)
    model = N.NMCDRModel(split, N.NMCDRConfig(dim=6), torch.Generator().manual_seed(1)).double()
    rng = np.random.default_rng(0)
    for domain in range(2):
        # a sorted unique node set with users with and without data in this domain, and every user (evaluation)
        for nodes in (np.sort(rng.choice(model.num_global_users, size=37, replace=False)),
                      np.arange(model.num_global_users)):
            nodes = torch.as_tensor(nodes)
            weights = torch.randn(len(nodes), 6, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
            grads, values = [], []
            for history in (model.history_of, model.history_reference):
                model.zero_grad(set_to_none=True)
                out = history(domain, nodes)
                (out * weights).sum().backward()
                values.append(out.detach())
                grads.append(model.item_emb[domain].grad.clone())
            assert values[0].shape == (len(nodes), 6)
            assert torch.allclose(values[0], values[1], rtol=0, atol=1e-6)
            assert torch.allclose(grads[0], grads[1], rtol=0, atol=1e-6)
            assert grads[0].abs().sum() > 0  # the gradient reached the item table


def test_the_optimiser_steps_like_the_per_tensor_adam_in_float64():
    """NMCDR's Adam (fused) against the default per-tensor loop on copies of the same parameters."""
    split = overlapping_domains(num_users=80, items_per_domain=60, overlap=0.5, num_negatives=20, seed=0)
    config = N.NMCDRConfig(**{**FAST, "dim": 8})
    state = N.NMCDRAlgorithm(split, config, "cpu", ks=(5,)).init(0)
    params = list(state.model.double().parameters())
    assert_steps_like_per_tensor_adam(state.optimizer.step, params, config.lr, config.weight_decay)
