"""Adam as the clients' local optimiser.

* the functional, masked Adam of the batched executor is ``torch.optim.Adam`` client by client;
* batched and sequential executors (the latter steps a real ``torch.optim.Adam`` per client)
  agree for FedMF and FedNCF on data where clients have 1 to 6+ local batches, with and
  without weight decay, and composed with update steps, clipping and gradient noise;
* Adam's state is fresh every round; it trains; the SGD default is untouched.

Runs are float64: a semantic difference (a client stepping on an exhausted batch, moments of
unused rows not decaying, a shared step count) shows far above the tolerance, rounding does not.
"""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from fedlib.data.sampling import NegativeSampler
from fedlib.engine import (BatchedExecutor, FederatedConfig, GradientNoise, SequentialExecutor, UploadNoise,
                           fedmf_method, fedncf_method, ParameterAveraging, make_round_plan, pfedrec_method,
                           personal_table_method, round_generator, run_federated)
from fedlib.engine.method import LocalOptimizer, masked_adam_step
from fedlib.models import FedMF, FedNCF, PersonalItemTableModel, PFedRec

from engine_toys import BATCH, DIM, NUM_ITEMS, NUM_USERS, toy_train

TOL = 1e-10


def _adam_methods():
    adam = LocalOptimizer("adam")
    decay = LocalOptimizer("adam", weight_decay=0.05, betas=(0.8, 0.99))
    return {
        "fedmf": fedmf_method(FedMF(NUM_USERS, NUM_ITEMS, DIM, init_std=0.1), lr=0.02, optimizer=adam),
        "fedmf_decay": fedmf_method(FedMF(NUM_USERS, NUM_ITEMS, DIM, init_std=0.1), lr=0.02, optimizer=decay),
        "fedncf_f3crec": fedncf_method(FedNCF.f3crec_variant(NUM_USERS, NUM_ITEMS, DIM), lr=0.02, optimizer=adam),
        "fedncf_neumf_decay": fedncf_method(FedNCF(NUM_USERS, NUM_ITEMS, DIM, variant="neumf", hidden=(12, 6)),
                                            lr=0.02, optimizer=decay),
    }


def _run(method, executor, rounds=2, train=None, state=None, **config):
    options = dict(rounds=rounds, seed=7, batch_size=BATCH, dtype="float64")
    options.update(config)
    return run_federated(method, toy_train() if train is None else train, FederatedConfig(**options),
                         executor=executor, state=state)


def _max_diff(a, b) -> float:
    a, b = a.state, b.state
    diffs = [float((a.global_state[k] - b.global_state[k]).abs().max()) for k in a.global_state]
    diffs += [float((a.private_state[k] - b.private_state[k]).abs().max()) for k in a.private_state]
    return max(diffs)


def _assert_same(a, b, tol=TOL):
    """Two runs agree: final states and every round's training loss."""
    for name in a.state.global_state:
        torch.testing.assert_close(a.state.global_state[name], b.state.global_state[name], atol=tol, rtol=0, msg=name)
    for name in a.state.private_state:
        torch.testing.assert_close(a.state.private_state[name], b.state.private_state[name], atol=tol, rtol=0,
                                   msg=name)
    for ra, rb in zip(a.history, b.history):
        assert abs(ra["train_loss"] - rb["train_loss"]) <= tol


# -- the functional masked Adam ----------------------------------------------------------------
def _torch_adams(params, lr, betas, eps, weight_decay):
    """One real ``torch.optim.Adam`` per client, over a copy of its tensor."""
    copies = [p.clone() for p in params]
    return copies, [torch.optim.Adam([p], lr=lr, betas=betas, eps=eps, weight_decay=weight_decay) for p in copies]


@pytest.mark.parametrize("weight_decay, betas", [(0.0, (0.9, 0.999)), (0.1, (0.8, 0.95))])
@pytest.mark.parametrize("ragged", [False, True])
def test_masked_adam_equals_torch_adam(weight_decay, betas, ragged):
    """Every client's rows follow its own torch.optim.Adam, over steps where some rows get a
    zero gradient (their moments decay, they keep moving)."""
    gen = torch.Generator().manual_seed(0)
    num_clients, lr, eps = 3, 0.05, 1e-8
    # Stacked (C, 4, 2), or ragged rows (R, 2) with a client per row (clients own 2, 1 and 3 rows).
    owner = torch.tensor([0, 0, 1, 2, 2, 2]) if ragged else None
    stacked = torch.randn(6 if ragged else num_clients, *(() if ragged else (4,)), 2, generator=gen,
                          dtype=torch.float64)
    per_client = ([stacked[owner == c] for c in range(num_clients)] if ragged
                  else [stacked[c] for c in range(num_clients)])
    copies, optimisers = _torch_adams(per_client, lr, betas, eps, weight_decay)
    param, m, v = stacked.clone(), torch.zeros_like(stacked), torch.zeros_like(stacked)
    step = torch.zeros(num_clients, dtype=torch.int64)
    mask = torch.ones(num_clients, dtype=torch.bool)
    for k in range(6):
        grad = torch.randn(stacked.shape, generator=gen, dtype=torch.float64)
        grad[k % grad.shape[0]] = 0.0  # a row unused in this step
        masked_adam_step(param, grad, m, v, step, mask, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay,
                         owner=owner)
        for c, (copy, optimiser) in enumerate(zip(copies, optimisers)):
            copy.grad = grad[owner == c] if ragged else grad[c]
            optimiser.step()
    assert step.tolist() == [6] * num_clients
    for c, copy in enumerate(copies):
        ours = param[owner == c] if ragged else param[c]
        torch.testing.assert_close(ours, copy, atol=1e-14, rtol=0)
        state = optimisers[c].state[copy]
        torch.testing.assert_close(m[owner == c] if ragged else m[c], state["exp_avg"], atol=1e-14, rtol=0)
        torch.testing.assert_close(v[owner == c] if ragged else v[c], state["exp_avg_sq"], atol=1e-14, rtol=0)
    assert float((param - stacked).abs().min()) > 0  # every row moved, also the zero-gradient ones


def test_masked_client_does_not_move_and_keeps_its_step_count():
    """Client 1 has no batch at steps 2..4: it stays put (parameters, moments, count), then
    resumes with its own bias correction, as a torch.optim.Adam that skipped those steps."""
    gen = torch.Generator().manual_seed(1)
    lr, betas, eps, decay = 0.05, (0.9, 0.999), 1e-8, 0.01
    start = torch.randn(3, 5, generator=gen, dtype=torch.float64)
    copies, optimisers = _torch_adams(list(start), lr, betas, eps, decay)
    param, m, v = start.clone(), torch.zeros_like(start), torch.zeros_like(start)
    step = torch.zeros(3, dtype=torch.int64)
    for k in range(7):
        grad = torch.randn(start.shape, generator=gen, dtype=torch.float64)
        mask = torch.tensor([True, not 2 <= k <= 4, True])
        before = (param[1].clone(), m[1].clone(), v[1].clone(), int(step[1]))
        masked_adam_step(param, grad, m, v, step, mask, lr=lr, betas=betas, eps=eps, weight_decay=decay)
        if not mask[1]:
            assert torch.equal(param[1], before[0]) and torch.equal(m[1], before[1]) and torch.equal(v[1], before[2])
            assert int(step[1]) == before[3]
        for c in range(3):
            if mask[c]:
                copies[c].grad = grad[c]
                optimisers[c].step()
    assert step.tolist() == [7, 4, 7]
    for c in range(3):
        torch.testing.assert_close(param[c], copies[c], atol=1e-14, rtol=0)
    # Stepping client 1 on its exhausted steps (zero gradient) would have moved it on its momentum.
    resumed = start.clone()[1:2]
    moments = (torch.zeros_like(resumed), torch.zeros_like(resumed))
    count = torch.zeros(1, dtype=torch.int64)
    gen = torch.Generator().manual_seed(1)
    torch.randn(3, 5, generator=gen, dtype=torch.float64)
    for k in range(7):
        grad = torch.randn(start.shape, generator=gen, dtype=torch.float64)[1:2] * (0.0 if 2 <= k <= 4 else 1.0)
        masked_adam_step(resumed, grad, *moments, count, torch.ones(1, dtype=torch.bool), lr=lr, betas=betas,
                         eps=eps, weight_decay=decay)
    assert float((resumed[0] - param[1]).abs().max()) > 1e-3


# -- executors ---------------------------------------------------------------------------------
def test_toy_clients_have_different_numbers_of_batches():
    train = toy_train()
    plan = make_round_plan(train, NegativeSampler(train, NUM_ITEMS), round_generator(7, 0), batch_size=BATCH)
    assert plan.num_steps.min() == 1 and plan.num_steps.max() >= 6 and len(set(plan.num_steps.tolist())) >= 4


@pytest.mark.parametrize("name", list(_adam_methods()))
def test_batched_adam_equals_sequential_torch_adam(name):
    method = _adam_methods()[name]
    seq = _run(method, SequentialExecutor())
    bat = _run(method, BatchedExecutor(chunk_size=5))  # several chunks, one-batch clients included
    _assert_same(seq, bat)
    if name.startswith("fedmf"):  # the analytic SGD kernel must step aside, also when asked for
        _assert_same(seq, _run(method, BatchedExecutor(analytic_fedmf=True)))
    # Adam really ran: plain SGD with the same rates ends far away.
    sgd = dataclasses.replace(method, optimizer="sgd")
    assert _max_diff(seq, _run(sgd, BatchedExecutor(chunk_size=5))) > 1e-3


def test_paper_setting_two_epochs_sampled_clients_agree():
    """FedKDRec's baselines: Adam, 2 local epochs, a fraction of the clients per round."""
    method = _adam_methods()["fedncf_neumf_decay"]
    options = dict(rounds=3, local_epochs=2, clients_per_round=5)
    _assert_same(_run(method, SequentialExecutor(), **options), _run(method, BatchedExecutor(chunk_size=3), **options))


COMPOSED = {
    # update_steps (head, then items: per-parameter step counts), clipping, gradient noise on
    # every parameter or on a subset, with full or touched support, with and without decay.
    "pfedrec_steps": lambda opt: pfedrec_method(PFedRec(NUM_USERS, NUM_ITEMS, DIM), optimizer=opt,
                                                lr=0.02, lr_eta=1.0 / NUM_ITEMS),
    "personal_clip": lambda opt: personal_table_method(PersonalItemTableModel(NUM_USERS, NUM_ITEMS, DIM),
                                                       optimizer=opt, lr=0.02, lr_eta=1.0 / NUM_ITEMS),
    "fedmf_noise_full": lambda opt: fedmf_method(FedMF(NUM_USERS, NUM_ITEMS, DIM, init_std=0.1), lr=0.02,
                                                 optimizer=opt, gradient_noise=GradientNoise(0.5, 0.3)),
    "fedmf_noise_touched": lambda opt: fedmf_method(
        FedMF(NUM_USERS, NUM_ITEMS, DIM, init_std=0.1), lr=0.02, optimizer=opt,
        gradient_noise=GradientNoise(0.5, 0.3, support="touched"), upload_noise=UploadNoise(0.01, "touched")),
    "pfedrec_noise_items": lambda opt: pfedrec_method(
        PFedRec(NUM_USERS, NUM_ITEMS, DIM), optimizer=opt, lr=0.02, lr_eta=1.0 / NUM_ITEMS,
        gradient_noise=GradientNoise(0.5, 0.3, params=("item_emb",), support="touched")),
}


@pytest.mark.parametrize("weight_decay", [0.0, 0.05])
@pytest.mark.parametrize("name", list(COMPOSED))
def test_adam_composes_with_steps_clipping_and_noise(name, weight_decay):
    method = COMPOSED[name](LocalOptimizer("adam", weight_decay=weight_decay))
    _assert_same(_run(method, SequentialExecutor()), _run(method, BatchedExecutor(chunk_size=5)))


@pytest.mark.parametrize("weight_decay", [0.0, 0.05])
def test_client_uploads_agree_and_decay_moves_every_row(weight_decay):
    """Without decay a client changes only the rows it trains on; with decay every row."""
    train = toy_train()
    plan = make_round_plan(train, NegativeSampler(train, NUM_ITEMS), round_generator(7, 0), batch_size=BATCH)
    method = _adam_methods()["fedmf"]
    method = dataclasses.replace(method, optimizer=LocalOptimizer("adam", weight_decay=weight_decay))
    weights = method.aggregation.client_weights(plan.num_examples)
    results = {}
    for executor in (SequentialExecutor(), BatchedExecutor(chunk_size=4)):
        state = ParameterAveraging(method, None, FederatedConfig(rounds=1, dtype="float64")).init(7)
        results[executor.name] = executor.local_updates(method, state.global_state, state.private_state, plan,
                                                        weights, return_client_updates=True)
    seq, bat = (results[k].client_updates["item_emb"] for k in ("sequential", "batched"))
    assert torch.equal(seq.clients, bat.clients) and torch.equal(seq.rows, bat.rows)
    torch.testing.assert_close(seq.delta, bat.delta, atol=TOL, rtol=0)
    touched = int(plan.touched_row_counts(NUM_ITEMS).sum())
    assert len(seq) == (plan.num_clients * NUM_ITEMS if weight_decay else touched)
    assert float(seq.delta.abs().amax(1).min()) > 0  # every row sent really moved


# -- rounds ------------------------------------------------------------------------------------
def test_adam_state_is_fresh_every_round():
    """Two rounds in one run equal round 1, then round 2 from the stored intermediate state with
    new executors and a new method object: nothing of Adam carries over between rounds."""
    method = _adam_methods()["fedncf_neumf_decay"]
    for executor in (SequentialExecutor(), BatchedExecutor(chunk_size=5)):
        both = _run(method, executor, rounds=2)
        first = _run(method, executor, rounds=1)
        fresh = type(executor)(chunk_size=5) if isinstance(executor, BatchedExecutor) else SequentialExecutor()
        second = _run(dataclasses.replace(method), fresh, rounds=2, state=first)
        _assert_same(both, second, tol=1e-13)


def test_adam_trains():
    train = toy_train()
    for method in (fedmf_method(FedMF(NUM_USERS, NUM_ITEMS, DIM, init_std=0.1), lr=0.05, optimizer="adam"),
                   fedncf_method(FedNCF.f3crec_variant(NUM_USERS, NUM_ITEMS, DIM), lr=0.05, optimizer="adam")):
        run = _run(method, BatchedExecutor(), rounds=8, train=train)
        losses = [record["train_loss"] for record in run.history]
        assert losses[-1] < losses[0] - 0.1, losses
        assert losses[-1] < min(losses[:-2]), losses


# -- options -----------------------------------------------------------------------------------
def test_sgd_stays_the_default():
    method = fedmf_method(FedMF(NUM_USERS, NUM_ITEMS, DIM), lr=0.5)
    assert method.optimizer == LocalOptimizer("sgd") and method.is_plain
    assert method.learning_rates["item_emb"] == 0.5 * NUM_ITEMS
    explicit = fedmf_method(FedMF(NUM_USERS, NUM_ITEMS, DIM, init_std=0.1), lr=0.5, optimizer="sgd")
    default = fedmf_method(FedMF(NUM_USERS, NUM_ITEMS, DIM, init_std=0.1), lr=0.5)
    a, b = _run(explicit, BatchedExecutor(), rounds=1), _run(default, BatchedExecutor(), rounds=1)
    assert all(torch.equal(a.state.global_state[k], b.state.global_state[k]) for k in a.state.global_state)


def test_factories_pass_adam_through_with_one_step_size():
    mf = fedmf_method(FedMF(NUM_USERS, NUM_ITEMS, DIM), lr=1e-3, optimizer="adam")
    assert mf.optimizer.is_adam and not mf.is_plain
    assert mf.learning_rates == {"user_emb": 1e-3, "item_emb": 1e-3}
    ncf = fedncf_method(FedNCF(NUM_USERS, NUM_ITEMS, DIM, variant="neumf"), lr=1e-3,
                        optimizer=LocalOptimizer("adam", weight_decay=1e-4))
    assert ncf.optimizer.weight_decay == 1e-4 and set(ncf.learning_rates.values()) == {1e-3}


def test_optimizer_options_are_validated():
    model = FedMF(NUM_USERS, NUM_ITEMS, DIM)
    with pytest.raises(ValueError, match="unknown local optimizer 'adamw'"):
        fedmf_method(model, optimizer="adamw")
    with pytest.raises(TypeError, match="optimizer must be"):
        fedmf_method(model, optimizer=torch.optim.Adam)
    with pytest.raises(ValueError, match="weight_decay"):
        LocalOptimizer("adam", weight_decay=-1e-4)
    with pytest.raises(ValueError, match="only supported with the 'adam'"):
        LocalOptimizer("sgd", weight_decay=1e-4)
    for betas in [(0.9, 1.0), (-0.1, 0.999), (0.9,), "ab"]:
        with pytest.raises(ValueError, match="betas"):
            LocalOptimizer("adam", betas=betas)
    for eps in [0.0, -1e-8, float("nan")]:
        with pytest.raises(ValueError, match="eps"):
            LocalOptimizer("adam", eps=eps)
    assert LocalOptimizer("adam", betas=[0.5, 0.9]).betas == (0.5, 0.9)
    with pytest.raises(ValueError, match="Adam step sizes must be >= 0.*item_emb"):
        fedmf_method(model, lr=-1e-3, optimizer="adam")
    # Weight decay moves every row: a rows-only upload cannot carry it.
    with pytest.raises(ValueError, match="upload_mode='rows'.*weight_decay"):
        fedmf_method(model, optimizer=LocalOptimizer("adam", weight_decay=1e-4), upload_mode="rows")
    rows = fedmf_method(model, optimizer="adam", upload_mode="rows")
    assert not rows.uploads_every_row("item_emb")
    assert fedmf_method(model, optimizer=LocalOptimizer("adam", weight_decay=1e-4)).uploads_every_row("item_emb")
