"""Backbones: logits against hand-written formulas, parameter roles, inits, centralised forms."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from fedlib.data.sampling import NegativeSampler
from fedlib.data.splits import Pairs
from fedlib.engine import FederatedConfig, SequentialExecutor, ParameterAveraging, pfedrec_method
from fedlib.engine.centralised import train_centralised
from fedlib.engine.plan import make_round_plan, round_generator
from fedlib.models import (GMF, MF, MLP, FedMF, FedNCF, LightGCN, NeuMF, PersonalItemTableModel, PFedRec,
                           lightgcn_propagate, normalized_adjacency)
from fedlib.models.stacked import Backbone


def _gen(seed=0):
    return torch.Generator().manual_seed(seed)


def _client_params(model, global_state, private_state, users):
    """Dense tensors with a leading client axis, row tables as they are."""
    out = {}
    for name, kind in model.param_kinds.items():
        if kind == "private_dense":
            out[name] = private_state[name][users]
        elif kind == "public_dense":
            out[name] = global_state[name].unsqueeze(0).expand(len(users), *global_state[name].shape)
        else:
            out[name] = global_state[name]
    return out


def test_fedmf_logits_and_init():
    model = FedMF(5, 7, dim=4, init_std=0.01)
    g, p = model.init_global(_gen()), model.init_private(_gen(1))
    assert g["item_emb"].shape == (7, 4) and p["user_emb"].shape == (5, 4)
    assert 0.003 < float(g["item_emb"].std()) < 0.03
    rows = torch.tensor([[0, 3], [6, 6]])
    users = torch.tensor([1, 4])
    logits = model.logits({"user_emb": p["user_emb"][users], "item_emb": g["item_emb"]}, rows)
    expected = torch.stack([g["item_emb"][rows[c]] @ p["user_emb"][users[c]] for c in range(2)])
    torch.testing.assert_close(logits, expected)
    torch.testing.assert_close(model.score_users(g, p, users), p["user_emb"][users] @ g["item_emb"].T)
    assert model.public_names == ("item_emb",) and model.private_names == ("user_emb",)


def test_fedncf_f3crec_variant_is_a_private_linear_head_on_concat():
    model = FedNCF.f3crec_variant(4, 6, dim=3)
    assert model.param_kinds == {"user_emb": "private_dense", "item_emb": "public_rows",
                                 "head_w": "private_dense", "head_b": "private_dense"}
    g, p = model.init_global(_gen()), model.init_private(_gen(1))
    assert p["head_w"].shape == (4, 6) and torch.equal(p["head_w"][0], p["head_w"][3])  # one shared draw
    assert float(p["user_emb"].std()) > 0.5  # nn.Embedding's N(0, 1)
    users = torch.tensor([2])
    rows = torch.tensor([[1, 5]])
    logits = model.logits(_client_params(model, g, p, users), rows)
    x = torch.cat([p["user_emb"][2].expand(2, 3), g["item_emb"][rows[0]]], dim=1)  # (2, 2d)
    torch.testing.assert_close(logits[0], x @ p["head_w"][2] + p["head_b"][2])
    torch.testing.assert_close(model.score_users(g, p, users)[0, [1, 5]], logits[0])


def test_neumf_matches_a_hand_written_forward():
    model = FedNCF(3, 5, dim=4, variant="neumf", hidden=(6, 2))
    g, p = model.init_global(_gen()), model.init_private(_gen(1))
    u, i = 1, 3
    gmf = p["user_emb_gmf"][u] * g["item_emb_gmf"][i]
    h = torch.cat([p["user_emb"][u], g["item_emb"][i]])
    h = torch.relu(g["mlp0_w"] @ h + g["mlp0_b"])
    h = torch.relu(g["mlp1_w"] @ h + g["mlp1_b"])
    expected = torch.cat([gmf, h]) @ g["head_w"] + g["head_b"]
    got = model.logits(_client_params(model, g, p, torch.tensor([u])), torch.tensor([[i]]))
    torch.testing.assert_close(got[0, 0], expected)
    central = NeuMF(3, 5, dim=4, hidden=(6, 2))
    assert central(torch.tensor([0, 2]), torch.tensor([4, 1])).shape == (2,)
    assert central.score_users(torch.tensor([0, 1])).shape == (2, 5)


@pytest.mark.parametrize("make", [lambda: NeuMF(6, 9, dim=4, hidden=(6, 2), generator=_gen(3)),
                                  lambda: MLP(6, 9, dim=4, hidden=(5,), generator=_gen(3)),
                                  lambda: MLP(6, 9, dim=4, hidden=(), generator=_gen(3)),
                                  lambda: GMF(6, 9, dim=4, generator=_gen(3))])
def test_central_ncf_forward_equals_the_per_client_form(make):
    """The shared-tower forward gives FedNCF.logits' values and gradients (repeated users and items)."""
    model = make()
    with torch.no_grad():  # a trained-looking model: no near-zero weights hiding a wrong term
        for value in model.parameters():
            value.add_(0.3 * torch.randn(value.shape, generator=_gen(4)))
    users, items = torch.tensor([0, 5, 5, 2, 0, 3]), torch.tensor([8, 1, 1, 0, 4, 8])
    grads = []
    for forward in (model.forward, model.per_client_forward):
        logits = forward(users, items)
        grads.append((logits, torch.autograd.grad(logits.sin().sum(), list(model.parameters()))))
    torch.testing.assert_close(grads[0][0], grads[1][0], rtol=1e-5, atol=1e-6)
    for fast, reference in zip(grads[0][1], grads[1][1]):
        torch.testing.assert_close(fast, reference, rtol=1e-5, atol=1e-6)


def test_pfedrec_two_step_update_by_hand():
    """Step the head with the item table fixed, recompute, then step the items."""
    train = Pairs.from_arrays([0, 0], [1, 2], 1)
    model = PFedRec(1, 5, dim=3)
    method = pfedrec_method(model, lr=0.3, lr_eta=0.5)
    state = ParameterAveraging(method, None, FederatedConfig(rounds=1, dtype="float64")).init(0)
    plan = make_round_plan(train, NegativeSampler(train, 5), round_generator(0, 0), num_negatives=1, batch_size=64)
    items = torch.as_tensor(plan.items)
    labels = torch.as_tensor(plan.labels, dtype=torch.float64)
    q = state.global_state["item_emb"].clone().requires_grad_(True)
    w = state.private_state["head_w"][0].clone().requires_grad_(True)
    b = state.private_state["head_b"][0].clone().requires_grad_(True)
    loss = torch.nn.functional.binary_cross_entropy_with_logits(q[items] @ w + b, labels)
    gw, gb = torch.autograd.grad(loss, [w, b])
    w2, b2 = (w - 0.3 * gw).detach(), (b - 0.3 * gb).detach()
    loss2 = torch.nn.functional.binary_cross_entropy_with_logits(q[items] @ w2 + b2, labels)
    (gq,) = torch.autograd.grad(loss2, [q])
    q2 = q.detach() - 0.3 * 5 * 0.5 * gq

    result = SequentialExecutor().local_updates(method, state.global_state, state.private_state, plan, np.ones(1))
    torch.testing.assert_close(state.global_state["item_emb"] + result.update["item_emb"], q2)
    torch.testing.assert_close(state.private_state["head_w"][0], w2)
    torch.testing.assert_close(state.private_state["head_b"][0], b2)


def test_personal_item_table_logits_and_shared_init():
    model = PersonalItemTableModel(3, 4, dim=2, shared_table=True)
    g, p = model.init_global(_gen()), model.init_private(_gen(1))
    assert p["personal_item_emb"].shape == (3, 4, 2)
    assert torch.equal(p["personal_item_emb"][0], p["personal_item_emb"][2])  # one shared initial copy
    scores = model.score_users(g, p, torch.tensor([1]))
    expected = (p["personal_item_emb"][1] + g["item_emb"]) @ p["head_w"][1] + p["head_b"][1]
    torch.testing.assert_close(scores[0], expected)
    fedrkg = PersonalItemTableModel(3, 4, dim=2)
    assert fedrkg.public_names == () and fedrkg.init_global(_gen()) == {}


def test_lightgcn_adjacency_and_propagation():
    # users 0,1; items 0,1; edges u0-i0, u0-i1, u1-i1
    pairs = Pairs.from_arrays([0, 0, 1, 1], [0, 1, 1, 1], 2)  # duplicate edge counts once
    adj = normalized_adjacency(pairs, 2, 2).to_dense()
    deg = torch.tensor([2.0, 1.0, 1.0, 2.0])
    expected = torch.zeros(4, 4)
    for u, i in [(0, 0), (0, 1), (1, 1)]:
        expected[u, 2 + i] = expected[2 + i, u] = 1 / torch.sqrt(deg[u] * deg[2 + i])
    torch.testing.assert_close(adj, expected)
    model = LightGCN(pairs, 2, 2, dim=3, num_layers=2)
    users, items = model.propagate()
    e0 = torch.cat([model.user_emb, model.item_emb])
    mean = (e0 + expected @ e0 + expected @ expected @ e0) / 3
    torch.testing.assert_close(torch.cat([users, items]), mean)


def test_symmetric_spmm_matches_sparse_mm_in_values_and_gradients():
    rng = np.random.default_rng(4)
    pairs = Pairs.from_arrays(rng.integers(0, 30, 400), rng.integers(0, 50, 400), 30)
    coo = normalized_adjacency(pairs, 30, 50)
    csr = normalized_adjacency(pairs, 30, 50, layout="csr")
    assert csr.layout == torch.sparse_csr
    torch.testing.assert_close(csr.to_dense(), coo.to_dense(), rtol=0, atol=0)
    torch.testing.assert_close(csr.to_dense(), csr.to_dense().T, rtol=0, atol=0)  # exactly symmetric
    g = torch.Generator().manual_seed(0)
    user_emb = torch.randn(30, 6, generator=g, dtype=torch.float64).requires_grad_()
    item_emb = torch.randn(50, 6, generator=g, dtype=torch.float64).requires_grad_()
    weights = torch.randn(80, 6, generator=g, dtype=torch.float64)  # a loss that weighs every output
    outputs = {}
    for name, adjacency, symmetric in (("coo", coo.double(), False), ("csr", csr.to(torch.float64), True)):
        users, items = lightgcn_propagate(adjacency, user_emb, item_emb, 3, symmetric=symmetric)
        (torch.cat([users, items]) * weights).sum().backward()
        outputs[name] = (torch.cat([users, items]).detach(), user_emb.grad.clone(), item_emb.grad.clone())
        user_emb.grad, item_emb.grad = None, None
    for reference, fast in zip(outputs["coo"], outputs["csr"]):
        torch.testing.assert_close(fast, reference, rtol=1e-12, atol=1e-12)
    with pytest.raises(ValueError, match="sparse CSR"):
        lightgcn_propagate(coo, user_emb, item_emb, 3, symmetric=True)
    with pytest.raises(ValueError, match="layout must be"):
        normalized_adjacency(pairs, 30, 50, layout="dense")


def test_stacked_lightgcn_server_graph_is_csr_and_trains_like_the_coo_graph():
    rng = np.random.default_rng(5)
    pairs = Pairs.from_arrays(rng.integers(0, 12, 90), rng.integers(0, 20, 90), 12)
    backbone = Backbone("lightgcn", 12, 20, dim=4)
    graph = backbone.server_graph(pairs)
    assert graph.layout == torch.sparse_csr
    params = {n: v.requires_grad_() for n, v in backbone.init_server(torch.Generator().manual_seed(2)).items()}
    users, items = torch.as_tensor(pairs.users[:30]), torch.as_tensor(pairs.items[:30])
    fast = backbone.server_logits(params, users, items, graph)
    fast_grads = torch.autograd.grad(fast.square().sum(), [params["user_emb"], params["item_emb"]])
    all_users, all_items = lightgcn_propagate(normalized_adjacency(pairs, 12, 20), params["user_emb"],
                                              params["item_emb"], 3)
    slow = (all_users[users] * all_items[items]).sum(-1)
    slow_grads = torch.autograd.grad(slow.square().sum(), [params["user_emb"], params["item_emb"]])
    torch.testing.assert_close(fast, slow, rtol=1e-5, atol=1e-6)
    for a, b in zip(fast_grads, slow_grads):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_lightgcn_bpr_training_reduces_loss():
    rng = np.random.default_rng(0)
    users = np.repeat(np.arange(20), 5)
    items = (users % 4) * 5 + rng.integers(0, 5, users.size)  # four taste groups
    train = Pairs.from_arrays(users, items, 20)
    model = LightGCN(train, 20, 20, dim=8, num_layers=2)
    opt = torch.optim.Adam(model.parameters(), lr=0.05)
    negs = torch.as_tensor(NegativeSampler(train, 20).sample(train.users, 1, np.random.default_rng(1))[:, 0])
    u, i = torch.as_tensor(train.users), torch.as_tensor(train.items)
    first = float(model.bpr_loss(u, i, negs).detach())
    for _ in range(30):
        opt.zero_grad()
        loss = model.bpr_loss(u, i, negs)
        loss.backward()
        opt.step()
    assert float(loss.detach()) < 0.5 * first


def test_centralised_mf_trains_on_pooled_data():
    rng = np.random.default_rng(0)
    users = np.repeat(np.arange(30), 6)
    items = (users % 3) * 10 + rng.integers(0, 10, users.size)
    train = Pairs.from_arrays(users, items, 30)
    model = MF(30, 30, dim=8, init_std=0.1)
    losses = train_centralised(model, train, 30, epochs=15, lr={"user_emb": 2.0, "item_emb": 2.0}, batch_size=32)
    assert losses[-1] < 0.8 * losses[0]
    assert model.score_users(torch.tensor([0, 1])).shape == (2, 30)
