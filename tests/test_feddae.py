"""FedDAE: the objective and the combined posterior by hand, the forward pass against a per-user
reference, the plan rewrite and the step noise, parameter roles, short federated runs, bad inputs."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from engine_toys import BATCH, NUM_ITEMS, NUM_USERS, toy_train
from fedlib.data.sampling import NegativeSampler
from fedlib.engine import (BatchedExecutor, FederatedConfig, LocalBatch, SequentialExecutor, ParameterAveraging,
                           make_round_plan, round_generator, run_federated)
from fedlib.baselines.continual.continual import PlanAugmentingExecutor
from fedlib.baselines.single_domain.feddae import (FedDAELoss, FedDAEModel, VAENoise, combine_posteriors, draw_noise, feddae_forward,
                                   feddae_forward_reference, feddae_method, feddae_objective, gaussian_kl, kl_weight,
                                   marker_plan, multinomial_nll)
from fedlib.baselines.single_domain.feddae_executor import FedDAEExecutor

torch.set_num_threads(1)
F64 = torch.float64
LN2 = math.log(2.0)


# ---------------------------------------------------------------------------------------------
# The objective by hand
# ---------------------------------------------------------------------------------------------
def test_combined_posterior_by_hand():
    # w = (.25, .75): μ = .25·2 + .75·(−1) = −.25; σ² = .0625·1 + .5625·4 = 2.3125 (Eq. 4)
    mu, logvar = combine_posteriors(torch.tensor([[0.25, 0.75]], dtype=F64), torch.tensor([[2.0]], dtype=F64),
                                    torch.tensor([[0.0]], dtype=F64), torch.tensor([[-1.0]], dtype=F64),
                                    torch.tensor([[math.log(4.0)]], dtype=F64))
    assert float(mu) == pytest.approx(-0.25)
    assert float(logvar) == pytest.approx(math.log(2.3125))


def test_objective_by_hand():
    # logits (0, ln 2, 0): π = (1/4, 1/2, 1/4); x = (1, 1, 0): −log π₀ − log π₁ = 3 ln 2.
    logits = torch.tensor([[0.0, LN2, 0.0]], dtype=F64)
    x = torch.tensor([[1.0, 1.0, 0.0]], dtype=F64)
    assert float(multinomial_nll(logits, x)) == pytest.approx(3 * LN2)
    # μ = (1, 0), σ² = (1, 2): ½[(1 + 1 − 0 − 1) + (0 + 2 − ln 2 − 1)] = 1 − ln 2 / 2
    mu, logvar = torch.tensor([[1.0, 0.0]], dtype=F64), torch.tensor([[0.0, LN2]], dtype=F64)
    assert float(gaussian_kl(mu, logvar)) == pytest.approx(1 - LN2 / 2)
    assert float(feddae_objective(logits, x, mu, logvar, beta=0.5)) == pytest.approx(3 * LN2 + 0.5 * (1 - LN2 / 2))
    # the standard normal has zero KL; shifting logits by a constant changes nothing
    assert float(gaussian_kl(torch.zeros(1, 3), torch.zeros(1, 3))) == 0.0
    assert float(multinomial_nll(logits + 7.0, x)) == pytest.approx(3 * LN2)


def test_kl_schedules():
    assert kl_weight(0, 0.8, "tanh") == 0.0
    assert kl_weight(10, 0.8, "tanh") == pytest.approx(0.8 * math.tanh(1.0))
    assert kl_weight(5, 0.8, "constant") == 0.8
    # the code's `beta = tanh(t/10) * beta` after round 0 makes every later β zero
    assert kl_weight(0, 1.0, "code") == 1.0 and kl_weight(1, 1.0, "code") == kl_weight(50, 1.0, "code") == 0.0


# ---------------------------------------------------------------------------------------------
# Forward pass
# ---------------------------------------------------------------------------------------------
def tiny_params():
    """I = 2, k = 1, no hidden layer, gate width 1; one client (leading axis 1)."""
    t = lambda values: torch.tensor(values, dtype=F64).unsqueeze(0)  # noqa: E731
    return {
        "genc0_w": t([[1.0, 1.0], [0.0, 0.0]]), "genc0_b": t([0.0, 0.0]),      # μ_g = x̂₀ + x̂₁, log σ_g² = 0
        "lenc0_w": t([[1.0, -1.0], [0.0, 0.0]]), "lenc0_b": t([0.5, 0.0]),     # μ_l = x̂₀ − x̂₁ + .5
        "gate0_w": t([[1.0, 1.0]]), "gate0_b": t([0.0]),                      # h = relu(x₀ + x₁)
        "gate1_w": t([[1.0], [0.0]]), "gate1_b": t([0.0, 0.0]),               # gate logits (h, 0)
        "dec0_w": t([[1.0], [-1.0]]), "dec0_b": t([0.0, 1.0]),                # logits (z, 1 − z)
    }


def test_forward_by_hand():
    model = FedDAEModel(1, 2, latent_dim=1, hidden=(), gate_hidden=1)
    params, x = tiny_params(), torch.tensor([[1.0, 1.0]], dtype=F64)
    # evaluation: x̂ = (1, 1)/√2 -> μ_g = √2, μ_l = .5; gate logits (2, 0); z = μ = w_l .5 + w_g √2
    out = feddae_forward(model, params, x)
    w_l = math.exp(2) / (math.exp(2) + 1)
    z = w_l * 0.5 + (1 - w_l) * math.sqrt(2)
    torch.testing.assert_close(out.weights, torch.tensor([[w_l, 1 - w_l]], dtype=F64))
    torch.testing.assert_close(out.z, torch.tensor([[z]], dtype=F64))
    torch.testing.assert_close(out.mu, out.z)
    torch.testing.assert_close(out.logits, torch.tensor([[z, 1 - z]], dtype=F64))
    # training: masks (2, 0) global, (0, 2) local, gate hidden dropped, ε_l = 1, ε_g = −1 (σ = 1):
    # μ_g = √2, μ_l = .5 − √2, w = (½, ½); z = ½(μ_l + 1) + ½(μ_g − 1) = .25; σ² = ¼ + ¼
    noise = VAENoise(mask_global=torch.tensor([[2.0, 0.0]], dtype=F64), mask_local=torch.tensor([[0.0, 2.0]], dtype=F64),
                     mask_gate=torch.zeros(1, 1, dtype=F64), eps_local=torch.ones(1, 1, dtype=F64),
                     eps_global=-torch.ones(1, 1, dtype=F64))
    out = feddae_forward(model, params, x, noise)
    torch.testing.assert_close(out.weights, torch.tensor([[0.5, 0.5]], dtype=F64))
    torch.testing.assert_close(out.mu_local, torch.tensor([[0.5 - math.sqrt(2)]], dtype=F64))
    torch.testing.assert_close(out.z, torch.tensor([[0.25]], dtype=F64))
    torch.testing.assert_close(out.mu, torch.tensor([[0.25]], dtype=F64))
    torch.testing.assert_close(out.logvar, torch.tensor([[math.log(0.5)]], dtype=F64))
    torch.testing.assert_close(out.logits, torch.tensor([[0.25, 0.75]], dtype=F64))


@pytest.mark.parametrize("with_noise", [False, True])
@pytest.mark.parametrize("hidden", [(), (5,), (6, 4)])
def test_forward_batched_equals_per_user_reference(with_noise, hidden):
    model = FedDAEModel(4, 9, latent_dim=3, hidden=hidden, gate_hidden=4)
    gen = torch.Generator().manual_seed(len(hidden))
    state = {**model.init_global(gen, dtype=F64), **model.init_private(gen, dtype=F64)}
    params = {}
    for name, kind in model.param_kinds.items():
        tensor = state[name] if kind.startswith("private") else state[name].unsqueeze(0).expand(4, *state[name].shape)
        params[name] = tensor + 0.3 * torch.randn(tensor.shape, generator=gen, dtype=F64)  # clients differ
    x = (torch.rand(4, 9, generator=gen) < 0.4).to(F64)
    x[0, 0] = 1.0
    x[3] = 0.0  # an empty row is normalised to zeros, not NaN
    noise = draw_noise([0, 1, 2, 3], [0, 1, 0, 2], 1234, 9, 4, 3, dtype=F64) if with_noise else None
    fast = feddae_forward(model, params, x, noise)
    slow = feddae_forward_reference(model, params, x, noise)
    for field in ("logits", "mu", "logvar", "z", "weights", "mu_local", "logvar_local", "mu_global", "logvar_global"):
        torch.testing.assert_close(getattr(fast, field), getattr(slow, field), atol=1e-6, rtol=0, msg=field)
    assert torch.isfinite(fast.logits).all()
    torch.testing.assert_close(fast.weights.sum(1), torch.ones(4, dtype=F64))


def test_step_noise_is_a_function_of_key_user_and_step():
    a = draw_noise([3, 5], [0, 1], 42, 20, 4, 3, dropout=0.5)
    b = draw_noise([5], [1], 42, 20, 4, 3, dropout=0.5)
    torch.testing.assert_close(a.mask_local[1:], b.mask_local)  # independent of the other clients
    torch.testing.assert_close(a.eps_global[1:], b.eps_global)
    c = draw_noise([5], [2], 42, 20, 4, 3)
    assert not torch.equal(b.eps_local, c.eps_local)  # another step, other numbers
    values = torch.cat([a.mask_global, a.mask_local, a.mask_gate], 1).unique().tolist()
    assert set(values) <= {0.0, 2.0} and len(values) == 2  # inverted dropout 1/(1 − p)
    none = draw_noise([3], [0], 42, 20, 4, 3, dropout=0.0, gate_dropout=0.0)
    assert torch.equal(none.mask_global, torch.ones(1, 20)) and torch.equal(none.mask_gate, torch.ones(1, 4))


# ---------------------------------------------------------------------------------------------
# The plan rewrite and the loss
# ---------------------------------------------------------------------------------------------
def _plan(train, local_epochs=2, seed=0, round_index=3):
    return make_round_plan(train, NegativeSampler(train, NUM_ITEMS), round_generator(seed, round_index),
                           round_index=round_index, batch_size=BATCH, local_epochs=local_epochs)


def test_marker_plan_and_round_inputs():
    train = toy_train()
    plan = _plan(train)
    markers = marker_plan(plan)
    assert markers.num_clients == plan.num_clients and (markers.num_steps == 2).all()
    for c in range(plan.num_clients):
        part = markers.client_examples(c)
        assert markers.steps[part].tolist() == [0, 1] and markers.labels[part].tolist() == [-1.0, -2.0]
    np.testing.assert_array_equal(markers.num_examples, plan.num_examples)
    model = FedDAEModel(NUM_USERS, NUM_ITEMS, train=train, latent_dim=2, hidden=(3,))
    method = feddae_method(model)
    state = ParameterAveraging(method, None, FederatedConfig(rounds=1, dtype="float64"), device="cpu").init(0)
    loss = method.client_loss
    assert loss.round_inputs is None
    loss.prepare_round(plan, state.global_state, state.private_state)
    clients, x = loss.round_inputs
    assert clients.tolist() == plan.clients.tolist() and loss.round_index == 3
    torch.testing.assert_close(x, model.interaction_rows(clients, dtype=F64))  # x_u = the user's training row
    loss.finish_round()
    assert loss.round_inputs is None


def test_loss_draws_the_noise_of_its_step():
    train = toy_train()
    model = FedDAEModel(NUM_USERS, NUM_ITEMS, train=train, latent_dim=2, hidden=(3,))
    loss = FedDAELoss(beta=0.7, kl_schedule="constant")
    state = ParameterAveraging(feddae_method(model), None, FederatedConfig(rounds=1, dtype="float64"),
                               device="cpu").init(0)
    plan = _plan(train)
    loss.prepare_round(plan, state.global_state, state.private_state)
    users = torch.tensor([2, 9])
    params = {name: (state.private_state[name][users] if kind.startswith("private")
                     else state.global_state[name].unsqueeze(0).expand(2, *state.global_state[name].shape))
              for name, kind in model.param_kinds.items()}
    x = model.interaction_rows(users, dtype=F64)
    values = []
    for step in (0, 1):
        batch = LocalBatch(clients=users, rows=torch.zeros(2, 1, dtype=torch.int64),
                           items=torch.zeros(2, 1, dtype=torch.int64),
                           labels=torch.full((2, 1), -1.0 - step, dtype=F64), mask=torch.ones(2, 1, dtype=F64))
        noise = draw_noise(users, [step, step], plan.noise_key, NUM_ITEMS, model.gate_hidden, 2, dtype=F64)
        out = feddae_forward(model, params, x, noise)
        expected = feddae_objective(out.logits, x, out.mu, out.logvar, 0.7)
        values.append(loss(model, params, batch))
        torch.testing.assert_close(values[-1], expected)
    assert not torch.allclose(values[0], values[1])  # each step has its own dropout and ε


# ---------------------------------------------------------------------------------------------
# Roles and runs
# ---------------------------------------------------------------------------------------------
def test_param_roles_paper_and_code():
    model = FedDAEModel(NUM_USERS, NUM_ITEMS, latent_dim=2, hidden=(3,))
    assert model.public_names == ("genc0_w", "genc0_b", "genc1_w", "genc1_b", "dec0_w", "dec0_b", "dec1_w", "dec1_b")
    assert model.private_names == ("lenc0_w", "lenc0_b", "lenc1_w", "lenc1_b", "gate0_w", "gate0_b", "gate1_w",
                                   "gate1_b")
    method = feddae_method(model, lr=0.2)
    assert set(method.learning_rates.values()) == {0.2} and method.update_steps is None
    state = ParameterAveraging(method, None, FederatedConfig(rounds=1), device="cpu").init(1)
    assert state.global_state["genc0_w"].shape == (3, NUM_ITEMS) and state.global_state["dec1_w"].shape == (NUM_ITEMS, 3)
    assert state.private_state["lenc0_w"].shape == (NUM_USERS, 3, NUM_ITEMS)
    assert state.private_state["gate0_w"].shape == (NUM_USERS, 2, NUM_ITEMS)  # gate width = k
    assert torch.equal(state.private_state["gate0_w"][0], state.private_state["gate0_w"][-1])  # one shared init
    assert not torch.equal(state.global_state["genc0_w"], state.private_state["lenc0_w"][0])  # two encoders
    code = FedDAEModel(NUM_USERS, NUM_ITEMS, latent_dim=2, hidden=(3,), roles="code")
    assert "lenc0_w" in code.public_names and code.private_names == ("gate0_w", "gate0_b", "gate1_w", "gate1_b")
    code_method = feddae_method(code, lr=0.2)
    assert code_method.learning_rates["gate0_w"] == 0.0 and "gate0_w" not in code_method.steps[0]


def _run(executor, rounds=3, roles="paper", lr=0.3, dtype="float64"):
    train = toy_train()
    model = FedDAEModel(NUM_USERS, NUM_ITEMS, train=train, latent_dim=4, hidden=(8,), roles=roles)
    method = feddae_method(model, lr=lr)
    config = FederatedConfig(rounds=rounds, seed=1, batch_size=BATCH, local_epochs=2, dtype=dtype)
    return model, method, config, run_federated(method, train, config, executor=PlanAugmentingExecutor(executor),
                                                device="cpu")


def test_executors_agree_on_feddae():
    _, _, _, a = _run(SequentialExecutor())
    _, _, _, b = _run(BatchedExecutor(chunk_size=5))
    for name in a.state.global_state:
        torch.testing.assert_close(a.state.global_state[name], b.state.global_state[name], atol=1e-9, rtol=0,
                                   msg=name)
    for name in a.state.private_state:
        torch.testing.assert_close(a.state.private_state[name], b.state.private_state[name], atol=1e-9, rtol=0,
                                   msg=name)
    np.testing.assert_allclose([r["train_loss"] for r in a.history], [r["train_loss"] for r in b.history], atol=1e-9)


def _run_with(executor, rounds=3, roles="paper", local_epochs=1, lr=0.3, **method_kwargs):
    train = toy_train()
    model = FedDAEModel(NUM_USERS, NUM_ITEMS, train=train, latent_dim=4, hidden=(8,), roles=roles)
    method = feddae_method(model, lr=lr, **method_kwargs)
    config = FederatedConfig(rounds=rounds, seed=1, batch_size=BATCH, local_epochs=local_epochs, dtype="float64")
    return method, run_federated(method, train, config, executor=executor, device="cpu")


@pytest.mark.parametrize("roles", ["paper", "code"])
def test_shared_parameter_executor_equals_the_reference_path(roles):
    _, reference = _run_with(PlanAugmentingExecutor(BatchedExecutor(chunk_size=5)), roles=roles, lr_decay=0.9)
    executor = FedDAEExecutor(chunk_size=4)
    method, fast = _run_with(executor, roles=roles, lr_decay=0.9)
    plan = _plan(toy_train(), local_epochs=1)
    assert executor.applies(method, plan, np.ones(plan.num_clients))
    assert not executor.applies(method, plan, np.zeros(plan.num_clients))  # a zero weight: reference path
    for name in reference.state.global_state:
        torch.testing.assert_close(fast.state.global_state[name], reference.state.global_state[name], atol=1e-10,
                                   rtol=0, msg=name)
    for name in reference.state.private_state:
        torch.testing.assert_close(fast.state.private_state[name], reference.state.private_state[name], atol=1e-10,
                                   rtol=0, msg=name)
    np.testing.assert_allclose([r["train_loss"] for r in fast.history],
                               [r["train_loss"] for r in reference.history], atol=1e-10)
    initial = ParameterAveraging(method, None, FederatedConfig(rounds=1, dtype="float64"), device="cpu").init(1)
    changed = fast.state.private_state["gate0_w"] != initial.private_state["gate0_w"]
    assert bool(changed.any()) == (roles == "paper")  # the code's roles freeze the gate


def test_shared_parameter_executor_falls_back_when_it_does_not_apply():
    # two local steps: the second starts from each client's own step, so the reference path runs
    _, reference = _run_with(PlanAugmentingExecutor(BatchedExecutor()), local_epochs=2)
    executor = FedDAEExecutor()
    method, fast = _run_with(executor, local_epochs=2)
    plan = _plan(toy_train(), local_epochs=2)
    assert not executor.applies(method, plan, np.ones(plan.num_clients))
    for name in reference.state.global_state:
        assert torch.equal(fast.state.global_state[name], reference.state.global_state[name]), name
    with pytest.raises(ValueError, match="chunk_size"):
        FedDAEExecutor(chunk_size=0)


def _eval_nll(model, state):
    with torch.no_grad():
        logits = model.score_users(state.global_state, state.private_state, torch.arange(NUM_USERS))
    return float(multinomial_nll(logits, model.interaction_rows(torch.arange(NUM_USERS), dtype=logits.dtype)).mean())


def test_federated_run_reduces_training_loss():
    model, method, config, run = _run(BatchedExecutor(), rounds=10, dtype="float32")
    before = _eval_nll(model, ParameterAveraging(method, None, config, device="cpu").init(config.seed))
    state = run.state
    after = _eval_nll(model, state)
    assert after < 0.95 * before, (before, after)
    losses = [record["train_loss"] for record in run.history]
    assert losses[-1] < losses[0]
    # local parts stay personal, global parts are one copy
    assert not torch.equal(state.private_state["lenc0_w"][0], state.private_state["lenc0_w"][3])
    assert not torch.equal(state.private_state["gate0_w"][0], state.private_state["gate0_w"][3])


def test_code_roles_share_the_local_encoder_and_keep_the_initial_gate():
    model, method, config, run = _run(BatchedExecutor(), rounds=2, roles="code")
    state = run.state
    init = ParameterAveraging(method, None, config, device="cpu").init(config.seed)
    for name in ("gate0_w", "gate0_b", "gate1_w", "gate1_b"):
        assert torch.equal(state.private_state[name], init.private_state[name])
    assert "lenc0_w" in state.global_state and not torch.equal(state.global_state["lenc0_w"],
                                                               init.global_state["lenc0_w"])


# ---------------------------------------------------------------------------------------------
# Bad inputs
# ---------------------------------------------------------------------------------------------
def test_loss_refuses_ordinary_batches_and_says_how_to_fix():
    train = toy_train()
    model = FedDAEModel(NUM_USERS, NUM_ITEMS, train=train, latent_dim=2, hidden=(3,))
    with pytest.raises(ValueError, match="PlanAugmentingExecutor"):
        run_federated(feddae_method(model), train, FederatedConfig(rounds=1, batch_size=BATCH),
                      executor=BatchedExecutor(), device="cpu")
    with pytest.raises(ValueError, match="score_users"):
        model.logits({}, torch.zeros(1, 1, dtype=torch.int64))


def test_bad_inputs_raise_with_a_fix():
    with pytest.raises(ValueError, match=r"dropout rate in \[0, 1\)"):
        FedDAELoss(dropout=1.0)
    with pytest.raises(ValueError, match="beta must be a finite number >= 0"):
        FedDAELoss(beta=-1.0)
    with pytest.raises(ValueError, match="unknown kl_schedule 'linear'"):
        FedDAELoss(kl_schedule="linear")
    with pytest.raises(ValueError, match="unknown roles"):
        FedDAEModel(3, 4, roles="shared")
    with pytest.raises(ValueError, match="hidden layer sizes must be >= 1"):
        FedDAEModel(3, 4, hidden=(0,))
    with pytest.raises(ValueError, match="latent_dim must be >= 1"):
        FedDAEModel(3, 4, latent_dim=0)
    with pytest.raises(ValueError, match="no interaction data.*train=split.train"):
        model = FedDAEModel(3, 4, latent_dim=1, hidden=())
        state = ParameterAveraging(feddae_method(model), None, FederatedConfig(rounds=1), device="cpu").init(0)
        model.score_users(state.global_state, state.private_state, torch.tensor([0]))
    with pytest.raises(ValueError, match="build the model with the split's sizes"):
        FedDAEModel(3, 4, train=toy_train())
    with pytest.raises(ValueError, match=r"weights must be \(C, 2\)"):
        combine_posteriors(torch.ones(1, 3), *(torch.zeros(1, 2),) * 4)
    with pytest.raises(ValueError, match="shape of logits"):
        multinomial_nll(torch.zeros(2, 3), torch.zeros(2, 4))
    with pytest.raises(ValueError, match="shape of mu"):
        gaussian_kl(torch.zeros(2, 3), torch.zeros(2, 2))
    model = FedDAEModel(2, 5, latent_dim=1, hidden=(), gate_hidden=1)
    params = {name: torch.zeros(1) for name in model.param_kinds}
    with pytest.raises(ValueError, match=r"x must be \(C, 5\)"):
        feddae_forward(model, params, torch.zeros(1, 4))
    bad_noise = draw_noise([0], [0], 1, 5, 2, 1)  # gate width 2, the model's is 1
    with pytest.raises(ValueError, match=r"noise.mask_gate must be \(1, 1\).*draw_noise"):
        feddae_forward(model, params, torch.zeros(1, 5), bad_noise)
    with pytest.raises(ValueError, match="one entry per client"):
        draw_noise([0, 1], [0], 1, 5, 1, 1)
    with pytest.raises(ValueError, match="FedDAEModel"):
        feddae_method(object())
    with pytest.raises(ValueError, match="client_loss"):
        feddae_method(model, client_loss=lambda *a: None)
    with pytest.raises(ValueError, match="round_index must be >= 0"):
        kl_weight(-1)
