"""FedRKG's knowledge guidance (fedlib.papers.fedrkg): Eq. 3, Proposition 1, the gate, nested training."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from engine_toys import NUM_ITEMS, NUM_USERS, toy_train
from fedlib.data.sampling import NegativeSampler
from fedlib.engine import (Checkpointer, FederatedConfig, SequentialExecutor, ParameterAveraging, make_round_plan,
                           personal_table_method, round_generator, run_federated)
from fedlib.engine.algorithm import RoundContext
from fedlib.engine.knowledge import global_knowledge
from fedlib.engine.plan import guidance_participants
from fedlib.engine.loop import config_dict
from fedlib.engine.trainer import start_run
from fedlib.models import PersonalItemTableModel
from fedlib.papers.fedrkg.gates import fused_logits, train_gates, train_gates_sequential
from fedlib.papers.fedrkg.guidance import (adaptive_guidance, adaptive_guidance_sequential, apply_guidance,
                                           fused_embedding, gate_values, guidance_vector, knowledge_guidance,
                                           proposition1_step)
from fedlib.papers.fedrkg.method import (GATE_BIAS_KEY, GATE_WEIGHT_KEY, LOG_KEY, KnowledgeGuidance,
                                         client_parameter_counts, gate_examples_from_plan, guidance_examples,
                                         round_gate_examples)

torch.set_num_threads(1)  # other experiments share this machine


# -- toy data -------------------------------------------------------------------------------
def _random_state(num_users=5, num_items=7, dim=3, seed=0, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    tables = torch.randn(num_users, num_items, dim, generator=g, dtype=dtype)
    p_g = torch.randn(num_items, dim, generator=g, dtype=dtype)
    head_w = torch.randn(num_users, dim, generator=g, dtype=dtype)
    head_b = torch.randn(num_users, generator=g, dtype=dtype)
    gate_w = 0.5 * torch.randn(num_users, 3 * dim, generator=g, dtype=dtype)
    gate_b = 0.5 * torch.randn(num_users, generator=g, dtype=dtype)
    return tables, p_g, head_w, head_b, gate_w, gate_b


def _random_examples(users, num_items, width=9, batch=4, seed=1, dtype=torch.float64):
    """Clients with 0..width examples (one without any), split into batches of ``batch``."""
    g = torch.Generator().manual_seed(seed)
    num_clients = len(users)
    counts = torch.tensor([width, 0, 3, width - 2, 1][:num_clients])
    items = torch.randint(0, num_items, (num_clients, width), generator=g)
    labels = (torch.rand(num_clients, width, generator=g) < 0.3).to(dtype)
    mask = (torch.arange(width)[None, :] < counts[:, None]).to(dtype)
    steps = torch.arange(width).expand(num_clients, width) // batch
    items, labels = items * mask.long(), labels * mask
    return torch.tensor(users), items, labels, mask, steps.clone()


# -- Eq. 3 and the global mean ---------------------------------------------------------------
def test_knowledge_guidance_eq3_hand_computed():
    personal = torch.tensor([[[1.0, 2.0], [0.0, -4.0], [8.0, 0.0]],
                             [[-2.0, 6.0], [4.0, 4.0], [0.0, 1.0]]])  # (2, 3, 2)
    p_g = torch.tensor([[4.0, 0.0], [-4.0, 8.0], [0.0, 4.0]])  # (3, 2)
    # β = 0.75: 0.75·P_u + 0.25·P_g, by hand
    expected = torch.tensor([[[1.75, 1.5], [-1.0, -1.0], [6.0, 1.0]],
                             [[-0.5, 4.5], [2.0, 5.0], [0.0, 1.75]]])
    assert torch.equal(knowledge_guidance(personal, p_g, 0.75), expected)
    assert torch.equal(knowledge_guidance(personal, p_g, 1.0), personal)
    assert torch.equal(knowledge_guidance(personal, p_g, 0.0), p_g.expand(2, 3, 2))


def test_global_knowledge_is_unweighted_mean_of_participants():
    tables = torch.tensor([[[1.0]], [[3.0]], [[8.0]]])  # (3, 1, 1)
    assert global_knowledge(tables).item() == 4.0
    assert global_knowledge(tables, [0, 2]).item() == 4.5
    assert global_knowledge(tables, np.array([1]), chunk_size=1).item() == 3.0
    with pytest.raises(ValueError, match="duplicate"):
        global_knowledge(tables, [0, 0])
    with pytest.raises(ValueError, match="empty"):
        global_knowledge(tables, [])
    with pytest.raises(ValueError, match=r"user ids in \[0, 3\)"):
        global_knowledge(tables, [3])


def test_global_knowledge_reads_consecutive_users_as_a_view_with_the_same_bits():
    g = torch.Generator().manual_seed(5)
    tables = torch.randn(40, 17, 3, generator=g) * torch.rand(40, 1, 1, generator=g) * 100  # mixed scales
    everyone = torch.arange(40)
    cases = [everyone, everyone[3:37], torch.tensor([0, 2, 1, 3]), torch.tensor([5, 6, 7, 9, 10, 11])]
    for participants in cases:
        for chunk_size in (1, 4, 7, 256):
            reference = torch.zeros(17, 3)
            for start in range(0, participants.numel(), chunk_size):
                reference += tables[participants[start:start + chunk_size]].sum(0)
            assert torch.equal(global_knowledge(tables, participants, chunk_size), reference / participants.numel())


def test_proposition1_gradient_step_equals_eq3():
    tables, p_g, *_ = _random_state()
    beta, lam = 0.99, 4.0
    lr = (1.0 - beta) / lam  # η λ = 1 − β
    step = proposition1_step(tables, p_g, lam, lr)
    assert torch.allclose(step, knowledge_guidance(tables, p_g, beta), rtol=0, atol=1e-12)
    # Guard: another step size is a different β, not Eq. 3 with this one.
    assert not torch.allclose(proposition1_step(tables, p_g, lam, 2 * lr), knowledge_guidance(tables, p_g, beta))
    assert torch.allclose(proposition1_step(tables, p_g, lam, 2 * lr), knowledge_guidance(tables, p_g, 0.98),
                          rtol=0, atol=1e-12)


# -- the gate ---------------------------------------------------------------------------------
def test_zero_gate_gives_one_half_and_eq9_equals_eq3_exactly():
    tables, p_g, *_ = _random_state(dtype=torch.float32)
    zeros_w, zeros_b = torch.zeros(5, 9), torch.zeros(5)
    assert torch.equal(gate_values(tables, p_g, zeros_w, zeros_b), torch.full((5, 7), 0.5))
    for beta in (0.99, 0.5, 0.123):
        eq9 = adaptive_guidance(tables, p_g, zeros_w, zeros_b, beta)
        assert torch.equal(eq9, knowledge_guidance(tables, p_g, beta))
    assert torch.equal(apply_guidance(tables, p_g, 0.99, "adaptive"), knowledge_guidance(tables, p_g, 0.99))


def test_gate_values_hand_computed():
    personal = torch.tensor([[[1.0, 2.0], [0.0, -1.0]],
                             [[1.0, 2.0], [0.0, -1.0]]], dtype=torch.float64)  # (2, 2, 2)
    p_g = torch.tensor([[0.5, 0.5], [1.0, 0.0]], dtype=torch.float64)
    gate_w = torch.tensor([[0.1, 0.2, -0.3, 0.4, 0.5, -0.6],
                           [0.0, 0.0, 0.0, 0.0, 0.0, 0.0]], dtype=torch.float64)
    gate_b = torch.tensor([0.05, 1.0], dtype=torch.float64)
    # user 0, item 0: [1, 2 ; .5, .5 ; .5, 1.5]·w = 0.5 + 0.05 − 0.65 = −0.1, + b → −0.05
    # user 0, item 1: [0, −1 ; 1, 0 ; −1, −1]·w = −0.2 − 0.3 + 0.1 = −0.4, + b → −0.35
    # user 1: zero weights, bias 1 → σ(1) for both items
    sig = lambda x: 1.0 / (1.0 + math.exp(-x))  # noqa: E731
    expected = torch.tensor([[sig(-0.05), sig(-0.35)], [sig(1.0), sig(1.0)]], dtype=torch.float64)
    got = gate_values(personal, p_g, gate_w, gate_b)
    assert torch.allclose(got, expected, rtol=0, atol=1e-15)
    # G = 2(1 − β) g P_g and P̃ = β P + G (Eqs. 4, 6) for the same case
    beta = 0.9
    guidance = guidance_vector(got, p_g, beta)
    assert torch.allclose(guidance[0, 1], 0.2 * sig(-0.35) * p_g[1], rtol=0, atol=1e-15)
    fused = fused_embedding(personal, guidance, beta)
    assert torch.allclose(fused[1, 0], 0.9 * personal[1, 0] + 0.2 * sig(1.0) * p_g[0], rtol=0, atol=1e-15)
    assert torch.allclose(adaptive_guidance(personal, p_g, gate_w, gate_b, beta), fused, rtol=0, atol=1e-15)


# -- nested gate training (Eqs. 6–8) ------------------------------------------------------------
def _frozen_loss(tables, p_g, head_w, head_b, gate_w, gate_b, users, items, labels, mask, beta):
    """Mean BCE of each client on its fused rows, written independently of train_gates."""
    rows, g_rows = tables[users[:, None], items], p_g[items]
    logits = fused_logits(rows, g_rows, head_w[users], head_b[users], gate_w, gate_b, beta)
    per = F.binary_cross_entropy_with_logits(logits, labels, reduction="none")
    return (per * mask).sum(1) / mask.sum(1).clamp(min=1)


def test_train_gates_steps_downhill_and_leaves_the_model_frozen():
    tables, p_g, head_w, head_b, gate_w, gate_b = _random_state()
    users, items, labels, mask, _ = _random_examples([0, 1, 2, 3, 4], 7)
    frozen = [t.clone() for t in (tables, p_g, head_w, head_b, gate_w, gate_b)]
    beta, lr = 0.6, 0.5
    result = train_gates(tables, p_g, head_w, head_b, gate_w, gate_b, users, items, labels, mask,
                         beta=beta, lr=lr, epochs=1)
    for before, after in zip(frozen, (tables, p_g, head_w, head_b, gate_w, gate_b)):
        assert torch.equal(before, after)  # inputs untouched: P_u, P_g, head and the old gate
    # One full-batch epoch = one SGD step: exactly −lr ∇ of the frozen-model loss.
    w0 = gate_w[users].clone().requires_grad_(True)
    b0 = gate_b[users].clone().requires_grad_(True)
    loss0 = _frozen_loss(tables, p_g, head_w, head_b, w0, b0, users, items, labels, mask, beta)
    grad_w, grad_b = torch.autograd.grad(loss0.sum(), [w0, b0])
    assert torch.allclose(result.weight, gate_w[users] - lr * grad_w, rtol=0, atol=1e-12)
    assert torch.allclose(result.bias, gate_b[users] - lr * grad_b, rtol=0, atol=1e-12)
    # ... and it lowers every client's loss (the one without data keeps its gate).
    loss1 = _frozen_loss(tables, p_g, head_w, head_b, result.weight, result.bias, users, items, labels, mask, beta)
    has_data = mask.sum(1) > 0
    assert bool((loss1[has_data] < loss0.detach()[has_data]).all())
    assert torch.equal(result.weight[1], gate_w[1]) and result.epochs_run.tolist() == [1, 0, 1, 1, 1]


@pytest.mark.parametrize("clip_norm, tol", [(None, None), (0.3, None), (1.0, 1e-3)])
def test_train_gates_batched_equals_sequential(clip_norm, tol):
    tables, p_g, head_w, head_b, gate_w, gate_b = _random_state(num_users=6)
    users, items, labels, mask, steps = _random_examples([5, 1, 3, 0, 2], 7)
    kwargs = dict(beta=0.7, lr=0.3, epochs=4, steps=steps, clip_norm=clip_norm, tol=tol)
    args = (tables, p_g, head_w, head_b, gate_w, gate_b, users, items, labels, mask)
    batched, sequential = train_gates(*args, **kwargs), train_gates_sequential(*args, **kwargs)
    assert torch.allclose(batched.weight, sequential.weight, rtol=0, atol=1e-6)
    assert torch.allclose(batched.bias, sequential.bias, rtol=0, atol=1e-6)
    assert torch.allclose(batched.losses, sequential.losses, rtol=0, atol=1e-6, equal_nan=True)
    assert torch.equal(batched.epochs_run, sequential.epochs_run)
    assert not torch.allclose(batched.weight, gate_w[users])  # the test would see a no-op
    if clip_norm is not None:  # the clip changed the steps, so it was compared too
        plain = train_gates(*args, **{**kwargs, "clip_norm": None, "tol": None})
        assert not torch.allclose(plain.weight, batched.weight, rtol=0, atol=1e-6)
    if tol is not None:  # the early exit stopped someone, so it was compared too
        assert int(batched.epochs_run.max()) > int(batched.epochs_run[batched.epochs_run > 0].min())


def test_adaptive_guidance_batched_equals_sequential():
    tables, p_g, _, _, gate_w, gate_b = _random_state(num_users=6)
    batched = adaptive_guidance(tables, p_g, gate_w, gate_b, 0.8)
    assert torch.allclose(batched, adaptive_guidance_sequential(tables, p_g, gate_w, gate_b, 0.8), rtol=0, atol=1e-6)
    assert not torch.allclose(batched, knowledge_guidance(tables, p_g, 0.8))  # non-zero gate: not Eq. 3


# -- modes -------------------------------------------------------------------------------------
def test_modes():
    tables, p_g, _, _, gate_w, gate_b = _random_state()
    before = tables.clone()
    assert torch.equal(apply_guidance(tables, p_g, 0.9, "personal_only"), before)
    assert torch.equal(apply_guidance(tables, p_g, 0.9, "global_only"), p_g.expand(5, 7, 3))
    assert torch.equal(apply_guidance(tables, p_g, 0.9, "fixed"), knowledge_guidance(tables, p_g, 0.9))
    assert torch.equal(apply_guidance(tables, p_g, 0.9, "adaptive", gate_w, gate_b),
                       adaptive_guidance(tables, p_g, gate_w, gate_b, 0.9))
    assert torch.equal(tables, before)


@pytest.mark.parametrize("mode", ["personal_only", "global_only", "fixed", "adaptive"])
def test_guide_in_place_on_the_private_state(mode):
    tables, _, head_w, head_b, *_ = _random_state()
    private = {"personal_item_emb": tables.clone(), "head_w": head_w.clone(), "head_b": head_b.clone()}
    extra = {}
    KnowledgeGuidance(beta=0.9, interval=1, mode=mode).guide(private, extra, participants=[0, 1, 3], round_index=2)
    p_g = tables[[0, 1, 3]].mean(0)
    got = private["personal_item_emb"]
    expected = {"personal_only": tables, "global_only": p_g.expand_as(tables),
                "fixed": knowledge_guidance(tables, p_g, 0.9), "adaptive": knowledge_guidance(tables, p_g, 0.9)}[mode]
    assert torch.allclose(got, expected, rtol=0, atol=1e-12)  # every user, participant or not
    assert torch.equal(private["head_w"], head_w)
    assert (GATE_WEIGHT_KEY in extra) == (mode == "adaptive")  # zero gate, no examples: Eq. 3
    assert extra[LOG_KEY][-1]["mode"] == mode
    if mode == "adaptive":
        assert extra[LOG_KEY][-1]["gate_mean"] == 0.5


# -- engine plumbing ------------------------------------------------------------------------------
def test_guidance_schedule_matches_the_code():
    kg = KnowledgeGuidance(interval=100)
    rounds = [t for t in range(1000) if kg.is_guidance_round(t)]
    assert rounds == [101, 201, 301, 401, 501, 601, 701, 801, 901]  # code: round_id − 1 ∈ range(100, 1000, 100)
    assert [t for t in range(6) if KnowledgeGuidance(interval=1).is_guidance_round(t)] == [2, 3, 4, 5]


def test_guidance_examples_are_the_rounds_examples():
    train = toy_train()
    sampler = NegativeSampler(train, NUM_ITEMS)
    config = FederatedConfig(rounds=5, seed=3, batch_size=16)
    t = 4
    plan = make_round_plan(train, sampler, round_generator(config.seed, t), round_index=t, num_negatives=4,
                           batch_size=16, local_epochs=1, clients_per_round=None)
    ours = guidance_examples(train, sampler, config, t)
    ref = gate_examples_from_plan(plan)
    for a, b in zip(ours, ref):
        assert torch.equal(a, b)
    for c, user in enumerate(plan.clients):
        real = ours.mask[c] > 0
        ex = plan.client_examples(c)
        assert ours.users[c] == user
        assert ours.items[c][real].tolist() == plan.items[ex].tolist()
        assert ours.steps[c][real].tolist() == plan.steps[ex].tolist()
    assert np.array_equal(guidance_participants(train, config, t), plan.clients)
    # The hook's examples: the round's own plan when every user trains in it ...
    for a, b in zip(round_gate_examples(plan, train, sampler, config, t), ref):
        assert torch.equal(a, b)
    # ... else fresh examples for every user (the code trains every gate), not the sampled plan's.
    sampled = make_round_plan(train, sampler, round_generator(config.seed, t), round_index=t, num_negatives=4,
                              batch_size=16, local_epochs=1, clients_per_round=3)
    assert len(sampled.clients) == 3
    for a, b in zip(round_gate_examples(sampled, train, sampler, config, t), ours):
        assert torch.equal(a, b)


def test_hook_and_run_federated(tmp_path):
    train = toy_train()
    model = PersonalItemTableModel(NUM_USERS, NUM_ITEMS, dim=4)
    config = FederatedConfig(rounds=4, seed=0, batch_size=16, test_at_end=False)
    base = personal_table_method(model, lr=0.1, lr_eta=0.05)
    kg = KnowledgeGuidance(beta=0.9, interval=1, gate_lr=0.5, gate_epochs=2)
    method = kg.attach(base, train, config)
    assert method.name.endswith("FedRKG") and base.before_round is None

    # The hook on its own: a guidance round trains gates on the round's examples, then Eq. 9.
    run = start_run(ParameterAveraging(method, None, config, device="cpu"), config.schedule(), config.seed)
    state = run.state  # the hook changes the run's state in place
    state.private_state["personal_item_emb"] += 0.1 * torch.randn(state.private_state["personal_item_emb"].shape,
                                                                  generator=torch.Generator().manual_seed(0))
    tables = state.private_state["personal_item_emb"].clone()
    algorithm = ParameterAveraging(method, train, config, device="cpu")
    plans = [algorithm.plan_round(state, RoundContext(t, config.seed, round_generator(config.seed, t)))
             for t in range(3)]
    method.before_round(run, 1, plans[1])  # not a guidance round
    assert torch.equal(state.private_state["personal_item_emb"], tables) and not state.extra
    method.before_round(run, 2, plans[2])
    weight, bias = state.extra[GATE_WEIGHT_KEY], state.extra[GATE_BIAS_KEY]
    assert weight.abs().sum() > 0  # the gates moved
    p_g = tables[train.active_users()].mean(0)
    expected = adaptive_guidance(tables, p_g, weight, bias, 0.9)
    assert torch.allclose(state.private_state["personal_item_emb"], expected, rtol=0, atol=1e-6)

    # Inside the engine (sequential executor: the readable path), guidance before rounds 2 and 3.
    checkpointer = Checkpointer(tmp_path, every=2)
    final = run_federated(method, train, config, executor=SequentialExecutor(), device="cpu",
                          checkpointer=checkpointer).state
    assert [r["round"] for r in final.extra[LOG_KEY]] == [2, 3]
    assert final.extra[GATE_WEIGHT_KEY].shape == (NUM_USERS, 12)
    saved = Checkpointer(tmp_path, every=2).load_snapshot(config_dict(config))  # the private gates travel with the state
    restored = ParameterAveraging(method, train, config, device="cpu").load_state(saved["state"])
    assert torch.equal(restored.extra[GATE_WEIGHT_KEY], final.extra[GATE_WEIGHT_KEY])
    assert restored.extra[LOG_KEY] == final.extra[LOG_KEY]


def test_attach_refuses_other_backbones():
    train = toy_train()
    shared = PersonalItemTableModel(NUM_USERS, NUM_ITEMS, dim=4, shared_table=True)
    with pytest.raises(ValueError, match="shared_table=False"):
        KnowledgeGuidance().attach(personal_table_method(shared), train, FederatedConfig(rounds=1))


# -- §5.1 memory ------------------------------------------------------------------------------------
def test_client_parameter_counts_memory_argument():
    m, d = 3706, 32
    ours = client_parameter_counts(PersonalItemTableModel(10, m, d), "adaptive")
    assert ours["stored"] == m * d + 4 * d + 2  # paper: md + 4d + 1 (its e_u head has no bias)
    assert ours["peak"] == 2 * m * d + 4 * d + 2  # P_g downloaded during guidance
    assert client_parameter_counts(PersonalItemTableModel(10, m, d), "fixed")["stored"] == m * d + d + 1
    pie = client_parameter_counts(PersonalItemTableModel(10, m, d), "personal_only")
    assert pie["peak"] == pie["stored"] == m * d + d + 1
    fedrap = client_parameter_counts(PersonalItemTableModel(10, m, d, shared_table=True), "personal_only")
    assert fedrap["stored"] == fedrap["peak"] == 2 * m * d + d + 1  # dual knowledge: always two tables


# -- bad input --------------------------------------------------------------------------------------
def test_bad_input_raises_clear_errors():
    tables, p_g, head_w, head_b, gate_w, gate_b = _random_state()
    with pytest.raises(ValueError, match=r"P_g must be \(I, d\) = \(7, 3\)"):
        knowledge_guidance(tables, p_g[:5], 0.9)
    with pytest.raises(ValueError, match=r"must be \(U, I, d\).*unsqueeze"):
        knowledge_guidance(tables[0], p_g, 0.9)
    for beta in (1.5, -0.1, float("nan")):
        with pytest.raises(ValueError, match=r"beta must be a number in \[0, 1\]"):
            knowledge_guidance(tables, p_g, beta)
        with pytest.raises(ValueError, match=r"beta must be a number in \[0, 1\]"):
            KnowledgeGuidance(beta=beta)
    with pytest.raises(ValueError, match="mode must be one of .*'adaptive'.*got 'dual'"):
        apply_guidance(tables, p_g, 0.9, "dual")
    with pytest.raises(ValueError, match="mode must be one of"):
        KnowledgeGuidance(mode="GIE")
    with pytest.raises(ValueError, match=r"gate_weight must be \(U, 3d\) = \(5, 9\)"):
        gate_values(tables, p_g, gate_w[:, :6], gate_b)
    with pytest.raises(ValueError, match=r"gate_bias must be \(U,\)"):
        adaptive_guidance(tables, p_g, gate_w, gate_b[:2], 0.9)
    with pytest.raises(ValueError, match="interval must be an integer >= 1"):
        KnowledgeGuidance(interval=0)
    users, items, labels, mask, steps = _random_examples([0, 1, 2], 7)
    with pytest.raises(ValueError, match=r"labels must have the shape of items"):
        train_gates(tables, p_g, head_w, head_b, gate_w, gate_b, users, items, labels[:, :3], mask, beta=0.9)
    with pytest.raises(ValueError, match=r"items must be \(C, B\) with C = 2"):
        train_gates(tables, p_g, head_w, head_b, gate_w, gate_b, users[:2], items, labels, mask, beta=0.9)
    with pytest.raises(ValueError, match=r"item ids must be in \[0, 7\)"):
        train_gates(tables, p_g, head_w, head_b, gate_w, gate_b, users, items + 7, labels, mask, beta=0.9)
    with pytest.raises(ValueError, match=r"head_w must be \(U, d\)"):
        train_gates(tables, p_g, head_w[:, :2], head_b, gate_w, gate_b, users, items, labels, mask, beta=0.9)
