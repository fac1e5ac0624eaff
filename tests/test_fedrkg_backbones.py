"""FedRKG on other backbones (Table 3): guided FedMF / FedNCF / PFedRec and generic gate training."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from engine_toys import NUM_ITEMS, NUM_USERS
from fedlib.data.splits import Pairs
from fedlib.engine import (BatchedExecutor, FederatedConfig, RankingEvaluator, SequentialExecutor, fedncf_method,
                           ParameterAveraging, personal_table_method, pfedrec_method, run_federated)
from fedlib.engine.loop import AveragingState
from fedlib.models import FedMF, FedNCF, PersonalItemTableModel, PFedRec
from fedlib.papers.fedrkg.gates import (GateExamples, fused_logits, fused_model_logits, train_gates,
                                        train_gates_on_model, train_gates_on_model_sequential)
from fedlib.papers.fedrkg.guidance import (GUIDED_BACKBONES, PERSONAL_TABLE, GuidedFedNCF, GuidedPFedRec,
                                           adaptive_guidance, backbone_name, guided_backbone)
from fedlib.papers.fedrkg.method import (GATE_BIAS_KEY, GATE_WEIGHT_KEY, LOG_KEY, KnowledgeGuidance,
                                         client_parameter_counts, guided_method)

torch.set_num_threads(1)  # other experiments share this machine

F64 = torch.float64


def _gen(seed=0):
    return torch.Generator().manual_seed(seed)


# -- toy data ---------------------------------------------------------------------------------
def _toy_split(seed=0):
    """Users with 1..18 training positives (one-batch and many-batch clients), 1 valid + 1 test each."""
    rng = np.random.default_rng(seed)
    users, items, valid, test = [], [], [], []
    for u, n in enumerate([1, 2, 3, 18, 5, 9, 14, 2, 7, 16, 1, 11, 4, 6]):
        chosen = rng.choice(NUM_ITEMS, size=n + 2, replace=False)
        users += [u] * n
        items += chosen[:n].tolist()
        valid.append((u, chosen[n]))
        test.append((u, chosen[n + 1]))
    as_pairs = lambda pairs: Pairs.from_arrays([u for u, _ in pairs], [i for _, i in pairs], NUM_USERS)  # noqa: E731
    return Pairs.from_arrays(users, items, NUM_USERS), as_pairs(valid), as_pairs(test)


def _random_examples(users, num_items, width=9, batch=4, seed=1, dtype=F64):
    """Clients with 0..width examples (one without any), split into mini-batches of ``batch``."""
    g = _gen(seed)
    num_clients = len(users)
    counts = torch.tensor([width, 0, 3, width - 2, 1][:num_clients])
    items = torch.randint(0, num_items, (num_clients, width), generator=g)
    labels = (torch.rand(num_clients, width, generator=g) < 0.4).to(dtype)
    mask = (torch.arange(width)[None, :] < counts[:, None]).to(dtype)
    steps = torch.arange(width).expand(num_clients, width) // batch
    return torch.tensor(users), items * mask.long(), labels * mask, mask, steps.clone()


def _perturbed_state(model, seed=0, scale=0.3):
    """The model's float64 init with every user's table and private parameters made different."""
    g = _gen(seed + 100)
    global_state = model.init_global(_gen(seed), dtype=F64)
    private = model.init_private(_gen(seed), dtype=F64)
    for name, tensor in private.items():
        private[name] = tensor + scale * torch.randn(tensor.shape, generator=g, dtype=F64)
    for name, tensor in global_state.items():
        global_state[name] = tensor + scale * torch.randn(tensor.shape, generator=g, dtype=F64)
    return global_state, private


def _client_params(model, global_state, private_state, users):
    """Dense tensors with a leading client axis (public ones copied per client), row tables as they are."""
    out = {}
    for name, kind in model.param_kinds.items():
        if kind == "private_dense":
            out[name] = private_state[name][users]
        elif kind == "public_dense":
            out[name] = global_state[name].unsqueeze(0).expand(len(users), *global_state[name].shape)
        elif kind == "public_rows":
            out[name] = global_state[name]
    return out


# -- construction -------------------------------------------------------------------------------
def test_guided_backbone_builds_each_backbone_with_a_personal_table():
    fedmf = guided_backbone("FedMF", 5, 7, 4)
    assert type(fedmf) is PersonalItemTableModel and not fedmf.shared_table  # the FedRKG code's backbone
    fedncf = guided_backbone("fedncf", 5, 7, 4)  # case-insensitive
    assert isinstance(fedncf, GuidedFedNCF) and fedncf.hidden == (32,) and fedncf.variant == "mlp"  # 2d → 32 → 1
    assert fedncf.param_kinds == {"user_emb": "private_dense", PERSONAL_TABLE: "private_rows",
                                  "mlp0_w": "public_dense", "mlp0_b": "public_dense",
                                  "head_w": "public_dense", "head_b": "public_dense"}
    pfedrec = guided_backbone("PFedRec", 5, 7, 4, hidden=(3,))
    assert pfedrec.param_kinds == {PERSONAL_TABLE: "private_rows", "mlp0_w": "private_dense",
                                   "mlp0_b": "private_dense", "head_w": "private_dense", "head_b": "private_dense"}
    assert pfedrec.update_steps == (("mlp0_w", "mlp0_b", "head_w", "head_b"), (PERSONAL_TABLE,))
    assert [backbone_name(m) for m in (fedmf, fedncf, pfedrec)] == list(GUIDED_BACKBONES)


@pytest.mark.parametrize("name, options, std", [("FedMF", {}, 1.0), ("FedNCF", {}, 0.01),
                                                ("FedNCF", {"init": "torch_default"}, 1.0), ("PFedRec", {}, 1.0)])
def test_every_user_starts_from_one_shared_table_with_the_backbones_std(name, options, std):
    model = guided_backbone(name, 6, 50, 8, **options)
    tables = model.init_private(_gen())[PERSONAL_TABLE]  # (U, I, d)
    assert tables.shape == (6, 50, 8)
    assert torch.equal(tables, tables[:1].expand_as(tables))  # copies of one draw
    assert 0.8 * std < float(tables[0].std()) < 1.2 * std


def test_guided_pfedrec_draws_pfedrecs_initial_model():
    """Same generator, same numbers: the table is PFedRec's initial item table, the head its head."""
    unguided, guided = PFedRec(4, 9, 3), GuidedPFedRec(4, 9, 3)
    g = _gen(5)
    ref = {**unguided.init_global(g), **unguided.init_private(g)}
    g = _gen(5)
    ours = {**guided.init_global(g), **guided.init_private(g)}
    assert torch.equal(ours[PERSONAL_TABLE], ref["item_emb"].expand(4, 9, 3))
    assert torch.equal(ours["head_w"], ref["head_w"]) and torch.equal(ours["head_b"], ref["head_b"])


# -- logits: the unguided formula with the personal rows ----------------------------------------------
def _guided_twin_state(unguided, guided, seed=0):
    """An unguided state (float64) and the guided state in which every user's table is ``Q``."""
    g_state, p_state = _perturbed_state(unguided, seed)
    q = g_state["item_emb"]  # (I, d)
    guided_global = {k: v for k, v in g_state.items() if k != "item_emb"}
    guided_private = {k: v.clone() for k, v in p_state.items()}
    guided_private[PERSONAL_TABLE] = q.unsqueeze(0).repeat(unguided.num_users, 1, 1)
    assert set(guided_global) | set(guided_private) == set(guided.param_kinds)
    return (g_state, p_state), (guided_global, guided_private)


@pytest.mark.parametrize("case", ["fedmf_vs_pfedrec_formula", "fedncf_mlp", "fedncf_gmf", "fedncf_private_head",
                                  "pfedrec"])
def test_guided_logits_equal_the_unguided_backbone_when_every_table_is_the_shared_one(case):
    users_n, items_n, d = 5, 7, 3
    unguided, guided = {
        # FedRKG's code calls its backbone FedMF, but scores with PFedRec's formula w_u · Q[i] + b_u.
        "fedmf_vs_pfedrec_formula": (PFedRec(users_n, items_n, d), guided_backbone("FedMF", users_n, items_n, d)),
        "fedncf_mlp": (FedNCF(users_n, items_n, d, variant="mlp", hidden=(4, 2)),
                       guided_backbone("FedNCF", users_n, items_n, d, hidden=(4, 2))),
        "fedncf_gmf": (FedNCF(users_n, items_n, d, variant="gmf"),
                       guided_backbone("FedNCF", users_n, items_n, d, variant="gmf")),
        "fedncf_private_head": (FedNCF.f3crec_variant(users_n, items_n, d),
                                guided_backbone("FedNCF", users_n, items_n, d, hidden=(), private_head=True,
                                                init="torch_default")),
        "pfedrec": (PFedRec(users_n, items_n, d), guided_backbone("PFedRec", users_n, items_n, d)),
    }[case]
    (g_ref, p_ref), (g_ours, p_ours) = _guided_twin_state(unguided, guided)
    users = torch.tensor([3, 0, 4])
    rows = torch.tensor([[0, 6, 2, 2], [5, 1, 0, 3], [4, 4, 6, 1]])
    expected = unguided.logits(_client_params(unguided, g_ref, p_ref, users), rows)  # (C, B)
    # Sequential layout: the client's whole table, rows = item ids (one client at a time).
    for c, user in enumerate(users.tolist()):
        params = _client_params(guided, g_ours, p_ours, torch.tensor([user]))
        params[PERSONAL_TABLE] = p_ours[PERSONAL_TABLE][user]  # (I, d)
        torch.testing.assert_close(guided.logits(params, rows[c:c + 1])[0], expected[c], rtol=0, atol=1e-12)
    # Batched layout: gathered rows of C clients, rows = local slots.
    params = _client_params(guided, g_ours, p_ours, users)
    params[PERSONAL_TABLE] = p_ours[PERSONAL_TABLE][users[:, None], rows].reshape(-1, d)  # (C·B, d)
    local = torch.arange(rows.numel()).view(rows.shape)
    torch.testing.assert_close(guided.logits(params, local), expected, rtol=0, atol=1e-12)
    # Whole-catalogue scores for evaluation.
    all_users = torch.arange(users_n)
    torch.testing.assert_close(guided.score_users(g_ours, p_ours, all_users),
                               unguided.score_users(g_ref, p_ref, all_users), rtol=0, atol=1e-12)
    # Guard: the guided model really reads each user's own table.
    p_ours[PERSONAL_TABLE][4, 6] += 1.0
    # A tolerance, not `!=`: the two models may sum in different orders (rounding-level differences).
    gap = (guided.score_users(g_ours, p_ours, all_users) - unguided.score_users(g_ref, p_ref, all_users)).abs()
    assert (gap > 1e-9).nonzero().tolist() == [[4, 6]]


def test_guided_fedmf_is_fedmfs_score_on_personal_rows():
    """FedRKG's FedMF head ``w_u · P_u[i] + b_u`` with ``w_u = p_u``, ``b_u = 0``, ``P_u = Q``: FedMF's ``p_u · q_i``."""
    unguided, guided = FedMF(4, 6, 3), guided_backbone("FedMF", 4, 6, 3)
    q, p_u = unguided.init_global(_gen(1), dtype=F64)["item_emb"], unguided.init_private(_gen(2), dtype=F64)["user_emb"]
    private = {PERSONAL_TABLE: q.expand(4, 6, 3).clone(), "head_w": p_u, "head_b": torch.zeros(4, dtype=F64)}
    users = torch.arange(4)
    expected = unguided.score_users({"item_emb": q}, {"user_emb": p_u}, users)
    torch.testing.assert_close(guided.score_users({}, private, users), expected, rtol=0, atol=1e-12)


def test_guided_fedncf_logit_by_hand():
    """d = 1, tower 2 → 1: s = h · relu(W [p_u ; P_u[i]] + b) + c, numbers chosen by hand."""
    model = GuidedFedNCF(2, 2, dim=1, hidden=(1,))
    params = {"user_emb": torch.tensor([[2.0]]), "mlp0_w": torch.tensor([[[1.0, -3.0]]]),
              "mlp0_b": torch.tensor([[0.5]]), "head_w": torch.tensor([[4.0]]), "head_b": torch.tensor([-1.0]),
              PERSONAL_TABLE: torch.tensor([[0.25], [2.0]])}
    # item 0: relu(2 − 0.75 + 0.5) = 1.75 → 4 · 1.75 − 1 = 6;  item 1: relu(2 − 6 + 0.5) = 0 → −1
    assert model.logits(params, torch.tensor([[0, 1]])).tolist() == [[6.0, -1.0]]


def test_guided_pfedrec_score_mlp_by_hand():
    """hidden=(2,): s = w · relu(W P_u[i] + b) + c (the appendix's personalised score MLP)."""
    model = GuidedPFedRec(1, 1, dim=2, hidden=(2,))
    params = {PERSONAL_TABLE: torch.tensor([[1.0, -2.0]]), "mlp0_w": torch.tensor([[[1.0, 1.0], [0.0, -1.0]]]),
              "mlp0_b": torch.tensor([[0.5, 0.0]]), "head_w": torch.tensor([[3.0, 0.5]]),
              "head_b": torch.tensor([0.25])}
    # W P + b = [1 − 2 + 0.5, 2] = [−0.5, 2] → relu [0, 2] → 3·0 + 0.5·2 + 0.25 = 1.25
    assert model.logits(params, torch.tensor([[0]])).tolist() == [[1.25]]


# -- methods -------------------------------------------------------------------------------------------
def test_guided_method_learning_rates_and_steps():
    fedncf = guided_backbone("FedNCF", 5, 7, 4, hidden=(3,))
    method = guided_method(fedncf, lr=0.1, lr_eta=80.0, user_lr_scale=2.0)
    assert method.learning_rates == pytest.approx({"user_emb": 0.2, PERSONAL_TABLE: 0.1 * 7 * 80, "mlp0_w": 0.1,
                                                   "mlp0_b": 0.1, "head_w": 0.1, "head_b": 0.1})
    assert method.grad_clip_norm == 1.0 and method.update_steps is None and method.name == "FedNCF"
    pfedrec = guided_method(guided_backbone("PFedRec", 5, 7, 4))
    assert pfedrec.steps == (("head_w", "head_b"), (PERSONAL_TABLE,))  # PFedRec's two steps
    assert pfedrec.learning_rates == pytest.approx({"head_w": 0.1, "head_b": 0.1, PERSONAL_TABLE: 0.1 * 7 * 80})
    fedmf = guided_backbone("FedMF", 5, 7, 4)
    assert guided_method(fedmf).learning_rates == personal_table_method(fedmf).learning_rates


@pytest.mark.parametrize("name", ["FedNCF", "PFedRec"])
def test_one_round_from_a_shared_start_is_the_unguided_round(name):
    """Round 0 starts every table at ``Q``: the tables' mean after it is the unguided ``Q`` after it.

    Every other parameter matches too (FedNCF's tower is aggregated the same way, the user
    vectors and heads are the same private updates), so the roles and the learning rates
    (including PFedRec's two steps) are the unguided method's.
    """
    train, _, _ = _toy_split()
    config = FederatedConfig(rounds=1, seed=2, batch_size=16, dtype="float64", test_at_end=False)
    if name == "FedNCF":
        unguided = fedncf_method(FedNCF(NUM_USERS, NUM_ITEMS, 4, variant="mlp", hidden=(5,), init="torch_default"),
                                 lr=0.05, lr_eta=2.0)
        guided = guided_method(guided_backbone("FedNCF", NUM_USERS, NUM_ITEMS, 4, hidden=(5,), init="torch_default"),
                               lr=0.05, lr_eta=2.0, user_lr_scale=2.0, grad_clip_norm=None)
    else:
        unguided = pfedrec_method(PFedRec(NUM_USERS, NUM_ITEMS, 4), lr=0.1, lr_eta=0.05)
        guided = guided_method(guided_backbone("PFedRec", NUM_USERS, NUM_ITEMS, 4), lr=0.1, lr_eta=0.05,
                               grad_clip_norm=None)
    start = ParameterAveraging(unguided, None, config, device="cpu").init(config.seed)
    g_ours = {k: v.clone() for k, v in start.global_state.items() if k != "item_emb"}
    p_ours = {k: v.clone() for k, v in start.private_state.items()}
    p_ours[PERSONAL_TABLE] = start.global_state["item_emb"].unsqueeze(0).repeat(NUM_USERS, 1, 1)
    ref = run_federated(unguided, train, config, executor=SequentialExecutor(), device="cpu").state
    ours = run_federated(guided, train, config, executor=SequentialExecutor(), device="cpu",
                         state=AveragingState(global_state=g_ours, private_state=p_ours)).state
    assert len(train.active_users()) == NUM_USERS  # every user trained: uniform mean over all tables
    torch.testing.assert_close(ours.private_state[PERSONAL_TABLE].mean(0), ref.global_state["item_emb"],
                               rtol=0, atol=1e-12)
    for key in g_ours:
        torch.testing.assert_close(ours.global_state[key], ref.global_state[key], rtol=0, atol=1e-12)
    for key in start.private_state:
        torch.testing.assert_close(ours.private_state[key], ref.private_state[key], rtol=0, atol=1e-12)
    # Guard: the tables are personal now (users trained different rows).
    assert float((ours.private_state[PERSONAL_TABLE] - ref.global_state["item_emb"]).abs().max()) > 1e-3


# -- nested gate training on any backbone ------------------------------------------------------------------
def _gate_case(model, seed=0):
    global_state, private = _perturbed_state(model, seed)
    p_g = private[PERSONAL_TABLE].mean(0)  # (I, d)
    g = _gen(seed + 7)
    gate_w = 0.5 * torch.randn(model.num_users, 3 * model.dim, generator=g, dtype=F64)
    gate_b = 0.5 * torch.randn(model.num_users, generator=g, dtype=F64)
    return global_state, private, p_g, gate_w, gate_b


def test_generic_path_equals_the_fast_path_on_fedrkgs_backbone():
    model = guided_backbone("FedMF", 6, 7, 3)
    global_state, private, p_g, gate_w, gate_b = _gate_case(model)
    users, items, labels, mask, steps = _random_examples([5, 1, 3, 0, 2], 7)
    rows, g_rows = private[PERSONAL_TABLE][users[:, None], items], p_g[items]
    torch.testing.assert_close(
        fused_model_logits(model, {"head_w": private["head_w"][users], "head_b": private["head_b"][users]},
                           rows, g_rows, gate_w[users], gate_b[users], 0.7),
        fused_logits(rows, g_rows, private["head_w"][users], private["head_b"][users], gate_w[users],
                     gate_b[users], 0.7), rtol=0, atol=1e-14)
    kwargs = dict(beta=0.7, lr=0.3, epochs=3, steps=steps, clip_norm=0.5, tol=1e-3)
    fast = train_gates(private[PERSONAL_TABLE], p_g, private["head_w"], private["head_b"], gate_w, gate_b, users,
                       items, labels, mask, **kwargs)
    generic = train_gates_on_model(model, global_state, private, p_g, gate_w, gate_b, users, items, labels, mask,
                                   **kwargs)
    torch.testing.assert_close(generic.weight, fast.weight, rtol=0, atol=1e-12)
    torch.testing.assert_close(generic.bias, fast.bias, rtol=0, atol=1e-12)
    assert torch.equal(generic.epochs_run, fast.epochs_run)


def _ncf_frozen_loss(private, global_state, p_g, gate_w, gate_b, users, items, labels, mask, beta):
    """Each client's mean BCE on fused rows through FedNCF's ReLU tower, written out by hand."""
    rows, g_rows = private[PERSONAL_TABLE][users[:, None], items], p_g[items]  # (C, B, d)
    d = rows.shape[-1]
    gate_in = torch.cat([rows, g_rows, rows - g_rows], dim=-1)  # (C, B, 3d)
    gate = torch.sigmoid(torch.einsum("cbk,ck->cb", gate_in, gate_w) + gate_b[:, None])  # Eq. 5
    fused = beta * rows + 2 * (1 - beta) * gate[..., None] * g_rows  # Eq. 6
    user = private["user_emb"][users][:, None, :].expand(-1, items.shape[1], d)
    hidden = torch.relu(torch.cat([user, fused], -1) @ global_state["mlp0_w"].T + global_state["mlp0_b"])
    logits = hidden @ global_state["head_w"] + global_state["head_b"]  # (C, B)
    per = F.binary_cross_entropy_with_logits(logits, labels, reduction="none")
    return (per * mask).sum(1) / mask.sum(1).clamp(min=1)


def test_gate_training_on_fedncf_changes_only_the_gate():
    model = guided_backbone("FedNCF", 6, 7, 3, hidden=(4,), init="torch_default")
    global_state, private, p_g, gate_w, gate_b = _gate_case(model)
    users, items, labels, mask, _ = _random_examples([0, 1, 2, 3, 4], 7)
    before = {k: v.clone() for k, v in {**global_state, **private, "p_g": p_g, "w": gate_w, "b": gate_b}.items()}
    beta, lr = 0.6, 0.5
    result = train_gates_on_model(model, global_state, private, p_g, gate_w, gate_b, users, items, labels, mask,
                                  beta=beta, lr=lr, epochs=1)
    after = {**global_state, **private, "p_g": p_g, "w": gate_w, "b": gate_b}
    assert all(torch.equal(before[k], after[k]) for k in before)  # tower, head, user vectors, tables: untouched
    # One full-batch epoch = one SGD step on the gate: −lr ∇ of the hand-written frozen-model loss.
    w0 = gate_w[users].clone().requires_grad_(True)
    b0 = gate_b[users].clone().requires_grad_(True)
    loss0 = _ncf_frozen_loss(private, global_state, p_g, w0, b0, users, items, labels, mask, beta)
    grad_w, grad_b = torch.autograd.grad(loss0.sum(), [w0, b0])
    torch.testing.assert_close(result.weight, gate_w[users] - lr * grad_w, rtol=0, atol=1e-12)
    torch.testing.assert_close(result.bias, gate_b[users] - lr * grad_b, rtol=0, atol=1e-12)
    loss1 = _ncf_frozen_loss(private, global_state, p_g, result.weight, result.bias, users, items, labels, mask, beta)
    has_data = mask.sum(1) > 0
    assert bool((loss1[has_data] < loss0.detach()[has_data]).all())  # downhill for every client with data
    assert torch.equal(result.weight[1], gate_w[1]) and result.epochs_run.tolist() == [1, 0, 1, 1, 1]


@pytest.mark.parametrize("name, options", [("FedNCF", {"hidden": (4,), "init": "torch_default"}),
                                           ("PFedRec", {"hidden": (3,)})])
@pytest.mark.parametrize("clip_norm, tol", [(None, None), (0.3, None), (1.0, 1e-3)])
def test_generic_gate_training_batched_equals_sequential(name, options, clip_norm, tol):
    model = guided_backbone(name, 6, 7, 3, **options)
    global_state, private, p_g, gate_w, gate_b = _gate_case(model)
    users, items, labels, mask, steps = _random_examples([5, 1, 3, 0, 2], 7)
    args = (model, global_state, private, p_g, gate_w, gate_b, users, items, labels, mask)
    kwargs = dict(beta=0.7, lr=0.3, epochs=4, steps=steps, clip_norm=clip_norm, tol=tol)
    batched, sequential = train_gates_on_model(*args, **kwargs), train_gates_on_model_sequential(*args, **kwargs)
    torch.testing.assert_close(batched.weight, sequential.weight, rtol=0, atol=1e-6)
    torch.testing.assert_close(batched.bias, sequential.bias, rtol=0, atol=1e-6)
    torch.testing.assert_close(batched.losses, sequential.losses, rtol=0, atol=1e-6, equal_nan=True)
    assert torch.equal(batched.epochs_run, sequential.epochs_run)
    assert not torch.allclose(batched.weight, gate_w[users])  # the comparison would see a no-op
    if clip_norm is not None:  # the clip changed the steps, so it was compared too
        plain = train_gates_on_model(*args, **{**kwargs, "clip_norm": None, "tol": None})
        assert not torch.allclose(plain.weight, batched.weight, rtol=0, atol=1e-6)


def test_guide_on_fedncf_trains_gates_then_commits_eq9_on_the_tables_only():
    model = guided_backbone("FedNCF", 5, 7, 3, hidden=(4,), init="torch_default")
    global_state, private = _perturbed_state(model)
    before = {k: v.clone() for k, v in {**global_state, **private}.items()}
    users, items, labels, mask, steps = _random_examples([0, 1, 2, 3, 4], 7)
    examples = GateExamples(users, items, labels, mask, steps)
    kg = KnowledgeGuidance(beta=0.9, interval=1, gate_lr=0.5, gate_epochs=2, gate_clip_norm=1.0, gate_tol=None)
    extra = {}
    record = kg.guide(private, extra, participants=[0, 2, 3], examples=examples, round_index=2, model=model,
                      global_state=global_state)
    tables = before[PERSONAL_TABLE]
    p_g = tables[[0, 2, 3]].mean(0)
    zero_w, zero_b = torch.zeros(5, 9, dtype=F64), torch.zeros(5, dtype=F64)
    trained = train_gates_on_model(model, global_state, before, p_g, zero_w, zero_b, users, items, labels, mask,
                                   beta=0.9, lr=0.5, epochs=2, steps=steps, clip_norm=1.0)
    torch.testing.assert_close(extra[GATE_WEIGHT_KEY], trained.weight, rtol=0, atol=1e-12)
    assert extra[GATE_WEIGHT_KEY].abs().sum() > 0  # the gates moved away from the zero init
    expected = adaptive_guidance(tables, p_g, extra[GATE_WEIGHT_KEY], extra[GATE_BIAS_KEY], 0.9)
    torch.testing.assert_close(private[PERSONAL_TABLE], expected, rtol=0, atol=1e-12)
    for name in before:
        if name != PERSONAL_TABLE:
            assert torch.equal({**global_state, **private}[name], before[name]), name
    assert record["mode"] == "adaptive" and math.isfinite(record["gate_loss_last_epoch"])


def test_generic_gate_training_evaluates_one_mini_batch_per_step(monkeypatch):
    """A step evaluates the model on the columns of its mini-batch only, not the padded epoch.

    The busiest client sets the padded width B (13k examples on LastFM-2K); evaluating all B
    columns at each of its B / batch steps made a guidance round quadratic in B.
    """
    model = guided_backbone("FedNCF", 6, 7, 3, hidden=(4,), init="torch_default")
    global_state, private, p_g, gate_w, gate_b = _gate_case(model)
    users, items, labels, mask, steps = _random_examples([5, 1, 3, 0, 2], 7, width=13, batch=4)
    widths = []
    logits = type(model).logits

    def recording_logits(self, params, example_rows):
        widths.append(example_rows.shape[1])
        return logits(self, params, example_rows)

    monkeypatch.setattr(type(model), "logits", recording_logits)
    kwargs = dict(beta=0.7, lr=0.3, epochs=2, steps=steps, clip_norm=0.5)
    result = train_gates_on_model(model, global_state, private, p_g, gate_w, gate_b, users, items, labels, mask,
                                  **kwargs)
    assert widths and max(widths) == 4 < items.shape[1]  # batch_size columns, never the padded 13
    monkeypatch.undo()
    sequential = train_gates_on_model_sequential(model, global_state, private, p_g, gate_w, gate_b, users, items,
                                                 labels, mask, **kwargs)
    torch.testing.assert_close(result.weight, sequential.weight, rtol=0, atol=1e-10)


def test_guide_groups_generic_clients_by_example_count():
    """``guide`` trains the generic path in chunks of similar counts: same gates as one chunk."""
    model = guided_backbone("PFedRec", 5, 7, 3, hidden=(3,))
    global_state, private = _perturbed_state(model)
    users, items, labels, mask, steps = _random_examples([0, 1, 2, 3, 4], 7, width=11, batch=3)
    examples = GateExamples(users, items, labels, mask, steps)
    gates = []
    for chunk in (2, 64):
        kg = KnowledgeGuidance(beta=0.9, interval=1, gate_lr=0.5, gate_epochs=3, gate_clip_norm=1.0, gate_tol=None,
                               chunk_size=chunk)
        extra, state = {}, {k: v.clone() for k, v in private.items()}
        kg.guide(state, extra, participants=[0, 1, 2, 3, 4], examples=examples, round_index=1, model=model,
                 global_state=global_state)
        gates.append((extra[GATE_WEIGHT_KEY], extra[GATE_BIAS_KEY], state[PERSONAL_TABLE]))
    for small, whole in zip(*gates):
        torch.testing.assert_close(small, whole, rtol=0, atol=1e-12)
    assert gates[0][0].abs().sum() > 0  # the gates trained


# -- inside the engine -------------------------------------------------------------------------------------
def _guided_run(name, executor):
    train, valid, test = _toy_split()
    options = {"FedMF": {}, "FedNCF": {"hidden": (5,), "init": "torch_default"}, "PFedRec": {"hidden": (3,)}}[name]
    model = guided_backbone(name, NUM_USERS, NUM_ITEMS, 4, **options)
    config = FederatedConfig(rounds=4, seed=3, batch_size=16, dtype="float64", selection_metric="NDCG@10")
    kg = KnowledgeGuidance(beta=0.9, interval=2, gate_lr=0.5, gate_epochs=2)
    method = kg.attach(guided_method(model, lr=0.1, lr_eta=0.05), train, config)
    evaluator = RankingEvaluator(train, valid, test, ks=(10,))
    return method, run_federated(method, train, config, executor=executor, evaluator=evaluator, device="cpu")


@pytest.mark.parametrize("name", GUIDED_BACKBONES)
def test_run_federated_with_guidance_batched_equals_sequential(name):
    method, seq = _guided_run(name, SequentialExecutor())
    _, bat = _guided_run(name, BatchedExecutor(chunk_size=5))
    assert method.name == f"{name}+FedRKG"
    assert [r["round"] for r in seq.state.extra[LOG_KEY]] == [3]  # interval 2: aggregate after round 2, guide before 3
    assert seq.state.extra[GATE_WEIGHT_KEY].abs().sum() > 0  # the gates were trained
    for key in (GATE_WEIGHT_KEY, GATE_BIAS_KEY):
        torch.testing.assert_close(bat.state.extra[key], seq.state.extra[key], rtol=0, atol=1e-6)
    for states in ("global_state", "private_state"):
        for key, value in getattr(seq.state, states).items():
            torch.testing.assert_close(getattr(bat.state, states)[key], value, rtol=0, atol=1e-6, msg=key)
    for a, b in zip(seq.history, bat.history):
        assert a.keys() == b.keys() and all(abs(a[k] - b[k]) <= 1e-6 for k in a)
    assert seq.test_metrics.keys() == bat.test_metrics.keys()
    assert all(abs(seq.test_metrics[k] - bat.test_metrics[k]) <= 1e-6 for k in seq.test_metrics)
    if name == "FedNCF":  # the public tower is trained and aggregated
        init = ParameterAveraging(method, None, FederatedConfig(rounds=1, dtype="float64"), device="cpu").init(3)
        assert float((seq.state.global_state["mlp0_w"] - init.global_state["mlp0_w"]).abs().max()) > 1e-4


# -- §5.1 memory ---------------------------------------------------------------------------------------------
def test_client_parameter_counts_of_the_guided_backbones():
    m, d = 3706, 32
    fedncf = client_parameter_counts(guided_backbone("FedNCF", 10, m, d), "adaptive")
    tower = 2 * d * 32 + 32 + 32 + 1  # 64 → 32 → 1, the client's downloaded copy
    assert fedncf["stored"] == m * d + d + tower + 3 * d + 1  # table, user vector, tower, gate
    assert fedncf["peak"] == fedncf["stored"] + m * d
    pfedrec = client_parameter_counts(guided_backbone("PFedRec", 10, m, d, hidden=(16,)), "fixed")
    assert pfedrec["gate"] == 0 and pfedrec["stored"] == m * d + (d * 16 + 16) + 16 + 1  # 32 → 16 → 1
    fedmf = client_parameter_counts(guided_backbone("FedMF", 10, m, d))
    assert fedmf["stored"] == m * d + 4 * d + 2  # paper: md + 4d + 1 (its head has no bias)


# -- bad input -------------------------------------------------------------------------------------------------
def test_bad_input_raises_clear_errors():
    with pytest.raises(ValueError, match=r"unknown backbone 'NeuMF'.*\('FedMF', 'FedNCF', 'PFedRec'\)"):
        guided_backbone("NeuMF", 5, 7, 4)
    with pytest.raises(ValueError, match=r"PFedRec takes the options \('hidden', 'item_init_std'\).*\['init'\]"):
        guided_backbone("PFedRec", 5, 7, 4, init="ncf")
    with pytest.raises(ValueError, match="NeuMF has two item tables"):
        guided_backbone("FedNCF", 5, 7, 4, variant="neumf")
    train, _, _ = _toy_split()
    config = FederatedConfig(rounds=1)
    unguided = fedncf_method(FedNCF(NUM_USERS, NUM_ITEMS, 4, variant="mlp", hidden=(3,)))
    with pytest.raises(ValueError, match=r"shared item table \['item_emb'\].*guided_backbone\('FedNCF'"):
        KnowledgeGuidance().attach(unguided, train, config)
    with pytest.raises(ValueError, match=r"shared item table.*guided_backbone\('PFedRec'"):
        KnowledgeGuidance().attach(pfedrec_method(PFedRec(NUM_USERS, NUM_ITEMS, 4)), train, config)
    dual = PersonalItemTableModel(NUM_USERS, NUM_ITEMS, 4, shared_table=True)
    with pytest.raises(ValueError, match="shared_table=False"):
        KnowledgeGuidance().attach(personal_table_method(dual), train, config)
    with pytest.raises(ValueError, match="shared item table"):
        guided_method(PFedRec(5, 7, 4))
    with pytest.raises(ValueError, match="shared item table"):
        client_parameter_counts(FedNCF(5, 7, 4))
    model = guided_backbone("FedNCF", 6, 7, 3, hidden=(4,))
    global_state, private, p_g, gate_w, gate_b = _gate_case(model)
    users, items, labels, mask, _ = _random_examples([0, 1, 2], 7)
    with pytest.raises(ValueError, match=r"global_state misses 'mlp0_w' \(public_dense\)"):
        train_gates_on_model(model, {}, private, p_g, gate_w, gate_b, users, items, labels, mask, beta=0.9)
    with pytest.raises(ValueError, match=r"gate_weight must be \(U, 3d\) = \(6, 9\)"):
        train_gates_on_model(model, global_state, private, p_g, gate_w[:, :3], gate_b, users, items, labels, mask,
                             beta=0.9)
    with pytest.raises(ValueError, match=r"item ids must be in \[0, 7\)"):
        train_gates_on_model(model, global_state, private, p_g, gate_w, gate_b, users, items + 7, labels, mask,
                             beta=0.9)
