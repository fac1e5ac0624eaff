"""FedRAP: curriculum, the hand-computed local loss, parameter roles, a short federated run."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from engine_toys import BATCH, NUM_ITEMS, NUM_USERS, toy_train
from fedlib.engine import (BatchedExecutor, FederatedConfig, LocalBatch, SequentialExecutor, ParameterAveraging,
                           run_federated)
from fedlib.baselines.single_domain.fedrap import (FEDRAP_CODE_CONFIG, FedRAP, FedRAPLoss, curriculum_weight, fedrap_method,
                                   fedrap_objective, independence_term, sparsity_term)
from fedlib.models import PFedRec

torch.set_num_threads(1)


def softplus(x):
    return math.log1p(math.exp(x))


# ---------------------------------------------------------------------------------------------
# Toy case: 2 users, 3 items, d = 2 (numbers chosen so every logit is a short decimal)
# ---------------------------------------------------------------------------------------------
C_TABLE = [[0.5, -0.5], [1.0, 0.0], [0.0, 2.0]]  # commonality C (3, 2)
D_TABLES = [[[0.5, 0.5], [0.0, 0.0], [1.0, -1.0]],  # personality D_0 (3, 2)
            [[0.0, 1.0], [1.0, 1.0], [-1.0, 0.0]]]  # personality D_1
HEAD_W, HEAD_B = [[1.0, 2.0], [0.5, -1.0]], [0.5, 0.0]
BATCH_ITEMS = [[0, 2], [1, 0, 2]]  # user 0: item 0 (pos), item 2 (neg); user 1: item 1 (pos), 0 and 2 (neg)
BATCH_LABELS = [[1.0, 0.0], [1.0, 0.0, 0.0]]


def toy_batch():
    """The toy batch in the batched executor's layout: ragged local rows, (C, B) index, padding."""
    slots_user = [0, 0, 1, 1, 1]
    slots_item = [0, 2, 1, 0, 2]
    d = torch.tensor(D_TABLES, dtype=torch.float64)
    c = torch.tensor(C_TABLE, dtype=torch.float64)
    params = {
        "personal_item_emb": d[slots_user, slots_item],  # (5, 2)
        "item_emb": c[slots_item],  # (5, 2)
        "head_w": torch.tensor(HEAD_W, dtype=torch.float64),
        "head_b": torch.tensor(HEAD_B, dtype=torch.float64),
    }
    batch = LocalBatch(
        clients=torch.tensor([0, 1]),
        rows=torch.tensor([[0, 1, 0], [2, 3, 4]]),
        items=torch.tensor([[0, 2, 0], [1, 0, 2]]),
        labels=torch.tensor([[1.0, 0.0, 0.0], [1.0, 0.0, 0.0]], dtype=torch.float64),
        mask=torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]], dtype=torch.float64),
    )
    return params, batch


# By hand (s = w·(D + C) + b):
# user 0: item 0: D+C = (1, 0)   -> s = 1.5 (y=1);   item 2: D+C = (1, 1)    -> s = 3.5 (y=0)
#         ‖D−C‖²: (0, 1) -> 1, (1, −3) -> 10: independence 11 / (2·2);  ‖C‖₁: 1 + 2: sparsity 3 / (2·2)
# user 1: item 1: D+C = (2, 1)   -> s = 0 (y=1);     item 0: D+C = (.5, .5)  -> s = −.25 (y=0)
#         item 2: D+C = (−1, 2)  -> s = −2.5 (y=0)
#         ‖D−C‖²: 1, 2.5, 5: independence 8.5 / (3·2);  ‖C‖₁: 1, 1, 2: sparsity 4 / (3·2)
BCE = [(softplus(-1.5) + softplus(3.5)) / 2, (softplus(0.0) + softplus(-0.25) + softplus(-2.5)) / 3]
INDEPENDENCE = [11 / 4, 8.5 / 6]
SPARSITY = [3 / 4, 4 / 6]


def test_curriculum_is_tanh_of_round_over_ten():
    assert curriculum_weight(0) == 0.0
    assert curriculum_weight(5) == pytest.approx(math.tanh(0.5))
    assert curriculum_weight(10) == pytest.approx(0.7615941559557649)
    assert curriculum_weight(30) > 0.995
    assert curriculum_weight(7, scale=7.0) == pytest.approx(math.tanh(1.0))
    assert curriculum_weight(0, "constant") == curriculum_weight(50, "constant") == 1.0


def test_regularisers_by_hand():
    params, batch = toy_batch()
    d_rows, c_rows = params["personal_item_emb"][batch.rows], params["item_emb"][batch.rows]
    torch.testing.assert_close(independence_term(d_rows, c_rows, batch.mask),
                               torch.tensor(INDEPENDENCE, dtype=torch.float64))
    torch.testing.assert_close(sparsity_term(c_rows, batch.mask), torch.tensor(SPARSITY, dtype=torch.float64))


@pytest.mark.parametrize("round_index", [0, 5, 23])
def test_hand_computed_loss_with_curriculum(round_index):
    params, batch = toy_batch()
    model = FedRAP(2, 3, dim=2)
    loss = FedRAPLoss(lam=0.1, mu=0.2)
    loss.set_round(round_index)
    ramp = math.tanh(round_index / 10)
    expected = [BCE[u] - 0.1 * ramp * INDEPENDENCE[u] + 0.2 * ramp * SPARSITY[u] for u in range(2)]
    torch.testing.assert_close(loss(model, params, batch), torch.tensor(expected, dtype=torch.float64))
    assert loss.weights() == pytest.approx((0.1 * ramp, 0.2 * ramp))
    if round_index == 0:  # the curriculum starts with plain BCE
        torch.testing.assert_close(loss(model, params, batch), torch.tensor(BCE, dtype=torch.float64))


def test_before_round_hook_sets_the_round_and_constant_curriculum_ignores_it():
    params, batch = toy_batch()
    model = FedRAP(2, 3, dim=2)
    method = fedrap_method(model, lam=0.1, mu=0.2)
    method.before_round(None, 5, None)  # FedRAP reads only the round index
    assert method.client_loss.round_index == 5
    constant = FedRAPLoss(lam=0.1, mu=0.2, curriculum="constant")
    constant.before_round(None, 5, None)
    expected = [BCE[u] - 0.1 * INDEPENDENCE[u] + 0.2 * SPARSITY[u] for u in range(2)]
    torch.testing.assert_close(constant(model, params, batch), torch.tensor(expected, dtype=torch.float64))


def test_independence_gradient_pushes_personality_away_from_commonality():
    params, batch = toy_batch()
    d_rows = params["personal_item_emb"].clone().requires_grad_(True)
    c_rows = params["item_emb"]
    lam = 0.3
    objective = fedrap_objective(torch.zeros(2, 3, dtype=torch.float64), batch.labels, batch.mask,
                                 d_rows[batch.rows], c_rows[batch.rows], lam=lam, mu=0.0).sum()
    objective.backward()
    # d/dD of −λ Σ‖D − C‖² / (n d) = −2λ (D − C) / (n d): descent moves D away from C.
    n = torch.tensor([2, 2, 3, 3, 3], dtype=torch.float64)[:, None]
    torch.testing.assert_close(d_rows.grad, -2 * lam * (d_rows.detach() - c_rows) / (n * 2))
    stepped = d_rows.detach() - 0.1 * d_rows.grad
    assert ((stepped - c_rows).norm(dim=1) > (d_rows.detach() - c_rows).norm(dim=1) - 1e-12).all()


def test_param_kinds_and_learning_rates():
    model = FedRAP(NUM_USERS, NUM_ITEMS, dim=8)
    assert model.param_kinds == {"personal_item_emb": "private_rows", "item_emb": "public_rows",
                                 "head_w": "private_dense", "head_b": "private_dense"}
    assert model.public_names == ("item_emb",)
    assert set(model.private_names) == {"personal_item_emb", "head_w", "head_b"}
    method = fedrap_method(model)
    assert method.learning_rates == {"personal_item_emb": 200.0, "item_emb": 200.0, "head_w": 0.5, "head_b": 0.5}
    assert method.lr("head_w", 2) == pytest.approx(0.5 * 0.97 ** 2)
    assert method.name == "FedRAP" and isinstance(method.client_loss, FedRAPLoss)
    assert FEDRAP_CODE_CONFIG["batch_size"] == 2048
    # every client starts from one shared personality draw; the commonality is a separate draw
    state = ParameterAveraging(method, None, FederatedConfig(rounds=1), device="cpu").init(3)
    personal = state.private_state["personal_item_emb"]
    assert torch.equal(personal[0], personal[-1]) and not torch.equal(personal[0], state.global_state["item_emb"])


def _balanced_bce(model, state, train):
    """Class-balanced BCE of every (user, item) pair: train positives vs all other items."""
    with torch.no_grad():
        logits = model.score_users(state.global_state, state.private_state, torch.arange(train.num_users))
    labels = torch.zeros_like(logits)
    labels[torch.as_tensor(train.users), torch.as_tensor(train.items)] = 1.0
    losses = torch.nn.functional.binary_cross_entropy_with_logits(logits, labels, reduction="none")
    return float((losses * labels).sum() / labels.sum() + (losses * (1 - labels)).sum() / (1 - labels).sum())


def test_federated_run_reduces_training_loss():
    train = toy_train()
    model = FedRAP(NUM_USERS, NUM_ITEMS, dim=8, init_std=0.1)
    method = fedrap_method(model, lr=0.5, lr_items=2.0, lr_decay=1.0)
    config = FederatedConfig(rounds=12, seed=0, batch_size=BATCH)
    before = _balanced_bce(model, ParameterAveraging(method, None, config, device="cpu").init(config.seed), train)
    run = run_federated(method, train, config, device="cpu")
    after = _balanced_bce(model, run.state, train)
    assert after < 0.8 * before, (before, after)
    losses = [record["train_loss"] for record in run.history]
    assert losses[-1] < losses[0]
    assert method.client_loss.round_index == config.rounds - 1
    # C is public: the server's table moved; D_u stays per user and differs between users
    personal = run.state.private_state["personal_item_emb"]
    assert not torch.equal(personal[0], personal[3])


def test_executors_agree_on_fedrap():
    train = toy_train()
    runs = []
    for executor in (SequentialExecutor(), BatchedExecutor()):
        model = FedRAP(NUM_USERS, NUM_ITEMS, dim=4, init_std=0.1)
        method = fedrap_method(model, lr=0.3, lr_items=1.0, lam=0.5, mu=0.5)
        config = FederatedConfig(rounds=3, seed=2, batch_size=BATCH, dtype="float64")
        runs.append(run_federated(method, train, config, executor=executor, device="cpu"))
    a, b = runs
    for name in a.state.global_state:
        torch.testing.assert_close(a.state.global_state[name], b.state.global_state[name], atol=1e-9, rtol=0)
    for name in a.state.private_state:
        torch.testing.assert_close(a.state.private_state[name], b.state.private_state[name], atol=1e-9, rtol=0)
    np.testing.assert_allclose([r["train_loss"] for r in a.history], [r["train_loss"] for r in b.history], atol=1e-9)


# ---------------------------------------------------------------------------------------------
# Bad inputs
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("kwargs, words", [
    ({"lam": -0.1}, ["lam", ">= 0"]),
    ({"mu": -1.0}, ["mu", ">= 0"]),
    ({"lam": float("nan")}, ["lam", "finite"]),
    ({"curriculum": "cosine"}, ["curriculum", "'tanh'", "'constant'"]),
    ({"scale": 0.0}, ["scale", "> 0"]),
])
def test_bad_loss_settings_raise(kwargs, words):
    with pytest.raises(ValueError) as info:
        FedRAPLoss(**kwargs)
    for word in words:
        assert word in str(info.value)


def test_bad_inputs_raise_with_a_fix():
    params, batch = toy_batch()
    d_rows, c_rows = params["personal_item_emb"][batch.rows], params["item_emb"][batch.rows]
    with pytest.raises(ValueError, match="same .C, B. row index"):
        independence_term(d_rows, c_rows[:, :2], batch.mask)
    with pytest.raises(ValueError, match=r"\(C, B, d\)"):
        sparsity_term(c_rows[0], batch.mask)
    with pytest.raises(ValueError, match="must all be"):
        fedrap_objective(torch.zeros(2, 2), batch.labels, batch.mask, d_rows, c_rows, 0.1, 0.1)
    with pytest.raises(ValueError, match="lam"):
        fedrap_objective(torch.zeros(2, 3), batch.labels, batch.mask, d_rows, c_rows, -0.1, 0.1)
    with pytest.raises(ValueError, match="round_index"):
        curriculum_weight(-1)
    with pytest.raises(ValueError, match="FedRAP"):
        fedrap_method(PFedRec(3, 4, 2))
    with pytest.raises(ValueError, match="lr_items"):
        fedrap_method(FedRAP(3, 4, 2), lr_items=-1.0)
    with pytest.raises(ValueError, match="client_loss"):
        fedrap_method(FedRAP(3, 4, 2), client_loss=lambda *a: None)


# ---------------------------------------------------------------------------------------------
# The public code's optimiser: weight decay, per-batch learning-rate decay, early-stopped epochs
# ---------------------------------------------------------------------------------------------
def _code_run(executor, rounds=3, local_epochs=3, lam=0.5, lr_decay=0.97):
    from fedlib.baselines.single_domain.fedrap import FedRAPCodeExecutor  # noqa: F401 (imported for the executor argument)

    model = FedRAP(NUM_USERS, NUM_ITEMS, dim=4, init_std=0.1)
    method = fedrap_method(model, lr=0.3, lr_items=1.0, lam=lam, mu=0.5, curriculum="constant", lr_decay=lr_decay)
    config = FederatedConfig(rounds=rounds, seed=2, batch_size=BATCH, local_epochs=local_epochs, dtype="float64")
    return run_federated(method, toy_train(), config, executor=executor, device="cpu")


def _assert_same_state(a, b, atol=1e-10):
    """Two runs agree: final states and every round's training loss."""
    for name in a.state.global_state:
        torch.testing.assert_close(a.state.global_state[name], b.state.global_state[name], atol=atol, rtol=0, msg=name)
    for name in a.state.private_state:
        torch.testing.assert_close(a.state.private_state[name], b.state.private_state[name], atol=atol, rtol=0,
                                   msg=name)
    np.testing.assert_allclose([r["train_loss"] for r in a.history], [r["train_loss"] for r in b.history], atol=atol)


@pytest.mark.parametrize("tol", [0.0, 0.035])  # 0.035: 6 of the 14 clients stop early in round 0
def test_code_executor_batched_path_equals_the_torch_optim_reference(tol):
    from fedlib.baselines.single_domain.fedrap import FedRAPCodeExecutor

    settings = dict(weight_decay=0.05, batch_lr_decay=0.9, tol=tol)
    reference = _code_run(FedRAPCodeExecutor(reference=True, **settings))
    batched = _code_run(FedRAPCodeExecutor(chunk_size=4, **settings))  # several chunks
    _assert_same_state(reference, batched)


def test_code_executor_settings_each_change_the_run():
    from fedlib.baselines.single_domain.fedrap import FedRAPCodeExecutor

    base = dict(weight_decay=0.05, batch_lr_decay=0.9, tol=0.0)
    runs = {name: _code_run(FedRAPCodeExecutor(**{**base, **change})) for name, change in
            (("base", {}), ("no decay", {"weight_decay": 0.0}), ("no batch decay", {"batch_lr_decay": 1.0}),
             ("early stop", {"tol": 0.05}))}
    table = runs["base"].state.private_state["personal_item_emb"]
    for name in ("no decay", "no batch decay", "early stop"):
        assert float((runs[name].state.private_state["personal_item_emb"] - table).abs().max()) > 1e-4, name
    # tol 0.035 stops some clients early in round 0 and not others (the equivalence test's mix)
    full = _code_run(FedRAPCodeExecutor(**base), rounds=1).state.private_state["head_w"]
    stopped = _code_run(FedRAPCodeExecutor(**{**base, "tol": 0.035}), rounds=1).state.private_state["head_w"]
    changed = int(((full - stopped).abs().max(1).values > 1e-12).sum())
    assert 0 < changed < NUM_USERS
    # weight decay shrinks the rows a user never trains on: user 0 has 1 positive (5 examples)
    untouched_share = float(runs["base"].state.private_state["personal_item_emb"][0].norm()
                            / runs["no decay"].state.private_state["personal_item_emb"][0].norm())
    assert untouched_share < 0.9


def test_code_executor_without_its_extras_is_the_engines_plain_sgd():
    """wd = 0, γ = 1, tol = 0: the code's optimiser is the engine's SGD step; both executors agree."""
    from fedlib.baselines.single_domain.fedrap import FedRAPCodeExecutor

    plain = _code_run(BatchedExecutor())
    code = _code_run(FedRAPCodeExecutor(weight_decay=0.0, batch_lr_decay=1.0, tol=0.0))
    reference = _code_run(FedRAPCodeExecutor(weight_decay=0.0, batch_lr_decay=1.0, tol=0.0, reference=True))
    for run in (code, reference):
        for name in plain.state.global_state:
            torch.testing.assert_close(plain.state.global_state[name], run.state.global_state[name], atol=1e-10, rtol=0)
        for name in plain.state.private_state:
            torch.testing.assert_close(plain.state.private_state[name], run.state.private_state[name], atol=1e-10,
                                       rtol=0)


def test_code_executor_refuses_what_it_does_not_run():
    from fedlib.baselines.single_domain.fedrap import FedRAPCodeExecutor

    for kwargs, words in (({"weight_decay": -1.0}, "weight_decay"), ({"batch_lr_decay": 0.0}, "batch_lr_decay"),
                          ({"batch_lr_decay": 1.5}, "batch_lr_decay"), ({"tol": float("nan")}, "tol"),
                          ({"chunk_size": 0}, "chunk_size")):
        with pytest.raises(ValueError, match=words):
            FedRAPCodeExecutor(**kwargs)
    model = FedRAP(NUM_USERS, NUM_ITEMS, dim=4)
    clipped = fedrap_method(model, grad_clip_norm=1.0)
    with pytest.raises(ValueError, match="clips gradients.*BatchedExecutor"):
        run_federated(clipped, toy_train(), FederatedConfig(rounds=1, batch_size=BATCH), executor=FedRAPCodeExecutor(),
                      device="cpu")
