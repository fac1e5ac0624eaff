"""Server Adam (fedlib.engine.server_optim): torch.optim.Adam's update on the negated mean change,
applied by the round loop after aggregation, its moments kept and checkpointed by the trainer, and
FedDAE's server step (the code's mean client gradient)."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from engine_toys import BATCH, NUM_ITEMS, NUM_USERS, toy_train
from fedlib.baselines.continual.continual import PlanAugmentingExecutor
from fedlib.baselines.single_domain.feddae import FedDAEModel, feddae_method
from fedlib.baselines.single_domain.feddae_executor import FedDAEExecutor
from fedlib.engine import BatchedExecutor, Checkpointer, FederatedConfig, ParameterAveraging, fedmf_method, run_federated
from fedlib.engine.algorithm import RoundContext
from fedlib.engine.loop import SERVER_OPTIMIZER_KEY, AveragingState
from fedlib.engine.plan import round_generator
from fedlib.engine.server_optim import ServerAdam
from fedlib.models import FedMF


def _tensors(seed, shapes=(("a", (3, 4)), ("b", (5,)))):
    g = torch.Generator().manual_seed(seed)
    return {name: torch.randn(shape, dtype=torch.float64, generator=g) for name, shape in shapes}


@pytest.mark.parametrize("weight_decay", [0.0, 0.01])
@pytest.mark.parametrize("pseudo_gradient", ["change", "mean_gradient"])
def test_server_adam_steps_as_torch_adam_on_the_pseudo_gradient(weight_decay, pseudo_gradient):
    optimiser = ServerAdam(lr=0.05, betas=(0.8, 0.99), eps=1e-6, weight_decay=weight_decay,
                           pseudo_gradient=pseudo_gradient)
    theta = _tensors(0)
    reference = {k: torch.nn.Parameter(v.clone()) for k, v in theta.items()}
    torch_adam = torch.optim.Adam(list(reference.values()), lr=0.05, betas=(0.8, 0.99), eps=1e-6,
                                  weight_decay=weight_decay, foreach=False)
    rates = {"a": 0.5, "b": 2.0}
    state = None
    for t in range(5):
        change = _tensors(100 + t)                       # the clients' mean change Δ̄ of this round
        aggregated = {k: theta[k] + change[k] for k in theta}
        theta, state = optimiser.step(theta, aggregated, state, rates)
        for k, p in reference.items():                   # the gradient the pseudo-gradient should be
            scale = rates[k] if pseudo_gradient == "mean_gradient" else 1.0
            p.grad = -change[k] / scale
        torch_adam.step()
        assert state["step"] == t + 1
        for k in theta:
            torch.testing.assert_close(theta[k], reference[k].detach(), atol=1e-12, rtol=0)


def test_server_adam_leaves_its_inputs_alone():
    optimiser = ServerAdam(lr=0.1)
    previous, aggregated = _tensors(1), _tensors(2)
    saved = {k: v.clone() for k, v in previous.items()}
    new, state = optimiser.step(previous, aggregated, None)
    new2, state2 = optimiser.step(new, aggregated, state)
    assert state["step"] == 1 and state2["step"] == 2
    assert all(torch.equal(previous[k], saved[k]) for k in previous)
    assert not torch.equal(state["exp_avg"]["a"], state2["exp_avg"]["a"])   # a new state, not the old one updated
    # the first Adam step moves every coordinate by about lr (m̂ / √v̂ = ±1 when |g| ≫ eps)
    torch.testing.assert_close((new["a"] - previous["a"]).abs(), torch.full((3, 4), 0.1, dtype=torch.float64))


@pytest.mark.parametrize("kwargs, message", [
    (dict(lr=0.0), "lr must be a positive"), (dict(lr=float("nan")), "lr must be a positive"),
    (dict(lr=0.1, betas=(0.9, 1.0)), "betas"), (dict(lr=0.1, eps=0.0), "eps"),
    (dict(lr=0.1, weight_decay=-1.0), "weight_decay"), (dict(lr=0.1, pseudo_gradient="delta"), "pseudo_gradient"),
])
def test_bad_server_adam_settings_raise(kwargs, message):
    with pytest.raises(ValueError, match=message):
        ServerAdam(**kwargs)


def test_mean_gradient_needs_positive_client_rates():
    optimiser = ServerAdam(lr=0.1, pseudo_gradient="mean_gradient")
    with pytest.raises(ValueError, match="positive learning rate or use pseudo_gradient='change'"):
        optimiser.step(_tensors(1), _tensors(2), None, {"a": 0.5, "b": 0.0})
    with pytest.raises(ValueError, match="SGD rate"):
        optimiser.step(_tensors(1), _tensors(2), None, None)


def _toy_fedmf(server=None, **method_kwargs):
    method = fedmf_method(FedMF(NUM_USERS, NUM_ITEMS, 4), lr=0.4, **method_kwargs)
    return dataclasses.replace(method, server_optimizer=server) if server is not None else method


def test_federated_method_refuses_what_server_adam_cannot_do():
    with pytest.raises(TypeError, match="ServerAdam or None"):
        _toy_fedmf(server=torch.optim.Adam)
    with pytest.raises(ValueError, match="local Adam"):
        dataclasses.replace(_toy_fedmf(), optimizer="adam", server_optimizer=ServerAdam(0.1, pseudo_gradient="mean_gradient"))
    dataclasses.replace(_toy_fedmf(), optimizer="adam", server_optimizer=ServerAdam(0.1))   # FedAdam-style is fine


def test_the_round_loop_applies_server_adam_after_aggregation_and_before_server_mix():
    """Three rounds of the engine with server Adam equal FedAvg's rounds followed by a hand-made
    ServerAdam step (then a server_mix that halves the table), the moments carried in state.extra."""
    train = toy_train()
    config = FederatedConfig(rounds=3, seed=2, batch_size=BATCH, dtype="float64")
    halve = lambda previous, aggregated, t: {k: 0.5 * v for k, v in aggregated.items()}   # noqa: E731
    optimiser = ServerAdam(lr=0.03, pseudo_gradient="mean_gradient")
    plain = ParameterAveraging(_toy_fedmf(lr_decay=0.9), train, config, device="cpu")
    with_adam = ParameterAveraging(dataclasses.replace(plain.method, server_optimizer=optimiser, server_mix=halve),
                                   train, config, device="cpu")
    by_hand = plain.init(config.seed)
    engine = plain.copy_state(by_hand)          # the executors update private tables in place
    moments = None
    for t in range(3):
        context = RoundContext(index=t, seed=config.seed, rng=round_generator(config.seed, t))
        plan = plain.plan_round(by_hand, context)
        averaged, _ = plain.run_round(plain.copy_state(by_hand), plan, context)
        rates = {name: plain.method.learning_rates[name] * 0.9 ** t for name in averaged.global_state}
        stepped, moments = optimiser.step(by_hand.global_state, averaged.global_state, moments, rates)
        by_hand = AveragingState(halve(None, stepped, t), averaged.private_state)
        engine, _ = with_adam.run_round(engine, plan, context)
        assert engine.extra[SERVER_OPTIMIZER_KEY]["step"] == t + 1
        for part in ("global_state", "private_state"):
            for name, value in getattr(by_hand, part).items():
                torch.testing.assert_close(getattr(engine, part)[name], value, atol=1e-12, rtol=0)
    assert not torch.allclose(engine.global_state["item_emb"], plain.run_round(by_hand, plan, context)[0].global_state["item_emb"])


def test_a_resumed_run_continues_the_server_moments(tmp_path):
    train = toy_train()
    config = FederatedConfig(rounds=6, seed=4, batch_size=BATCH, dtype="float64")
    method = _toy_fedmf(server=ServerAdam(lr=0.02))
    full = run_federated(method, train, config, device="cpu")

    class Stop(Exception):
        pass

    def stop_after_three(run, record):
        if record["round"] == 3:
            raise Stop
    checkpointer = Checkpointer(tmp_path, name="adam", every=1)
    with pytest.raises(Stop):
        run_federated(method, train, config, device="cpu", checkpointer=checkpointer, on_round_end=stop_after_three)
    resumed = run_federated(method, train, config, device="cpu", checkpointer=checkpointer)
    assert resumed.state.extra[SERVER_OPTIMIZER_KEY]["step"] == 6
    for name, value in full.state.global_state.items():
        assert torch.equal(resumed.state.global_state[name], value), name
    # without the saved moments the continuation would differ: restart the optimiser after round 3
    cut = run_federated(method, train, dataclasses.replace(config, rounds=3), device="cpu")
    cut.state.extra.pop(SERVER_OPTIMIZER_KEY)
    restarted = run_federated(method, train, config, device="cpu", state=cut)
    assert not torch.equal(restarted.state.global_state["item_emb"], full.state.global_state["item_emb"])


def _feddae(server_lr=None, roles="code", lr=0.3):
    train = toy_train()
    model = FedDAEModel(NUM_USERS, NUM_ITEMS, train=train, latent_dim=4, hidden=(8,), roles=roles)
    return train, model, feddae_method(model, lr=lr, server_lr=server_lr)


def test_feddae_server_adam_steps_on_the_mean_client_gradient():
    """The code's server: the clients' gradients at the global parameters, averaged, one Adam step.
    With one local SGD step, the gradient is recovered exactly from the change; it does not depend on
    the clients' rate (two rates give the same server step)."""
    train, model, slow = _feddae(server_lr=1e-2, lr=0.05)
    _, _, fast = _feddae(server_lr=1e-2, lr=0.5)
    assert slow.server_optimizer == ServerAdam(1e-2, pseudo_gradient="mean_gradient")
    config = FederatedConfig(rounds=1, seed=1, batch_size=BATCH, local_epochs=1, dtype="float64")
    runs = [run_federated(method, train, config, executor=FedDAEExecutor(chunk_size=4), device="cpu")
            for method in (slow, fast)]
    init = ParameterAveraging(slow, None, config, device="cpu").init(config.seed)
    for name in model.public_names:
        torch.testing.assert_close(runs[0].state.global_state[name], runs[1].state.global_state[name],
                                   atol=1e-9, rtol=0, msg=name)
        moved = (runs[0].state.global_state[name] - init.global_state[name]).abs()
        assert float(moved.max()) <= 1e-2 * (1 + 1e-9) and float(moved.max()) > 0.5e-2, name   # Adam's first step
    # and FedAvg with the same clients moves them by the rate times the gradient instead
    _, _, averaged = _feddae(server_lr=None, lr=0.05)
    plain = run_federated(averaged, train, config, executor=FedDAEExecutor(chunk_size=4), device="cpu")
    assert not torch.allclose(plain.state.global_state["dec0_w"], runs[0].state.global_state["dec0_w"])


def test_feddae_server_adam_agrees_across_executors():
    train, _, method = _feddae(server_lr=3e-3, roles="paper")
    config = FederatedConfig(rounds=3, seed=1, batch_size=BATCH, local_epochs=1, dtype="float64")
    a = run_federated(method, train, config, executor=FedDAEExecutor(chunk_size=4), device="cpu")
    b = run_federated(method, train, config, executor=PlanAugmentingExecutor(BatchedExecutor(chunk_size=5)),
                      device="cpu")
    for part in ("global_state", "private_state"):
        for name, value in getattr(a.state, part).items():
            torch.testing.assert_close(getattr(b.state, part)[name], value, atol=1e-10, rtol=0, msg=name)


def test_feddae_server_settings_are_checked():
    _, model, _ = _feddae()
    with pytest.raises(ValueError, match="needs a server Adam"):
        feddae_method(model, lr=0.1, server_weight_decay=1e-8)
    with pytest.raises(ValueError, match="not both"):
        feddae_method(model, lr=0.1, server_lr=1e-3, server_optimizer=ServerAdam(1e-3))
