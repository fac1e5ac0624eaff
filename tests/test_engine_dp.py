"""Gradient clipping plus Gaussian noise in local steps (GradientNoise) and its accounting.

Every test runs a round (or a short run) in float64 on a toy split whose clients have 1 to
6+ local batches, and checks one property of the mechanism: the clip bounds each client's
step, the noise has the stated scale and support, it is a function of (round key, client,
step) only, and the ε comes from Opacus' RDP accountant.
"""
from __future__ import annotations

import dataclasses
import math
import warnings

import numpy as np
import pytest
import torch

from fedlib.data.sampling import NegativeSampler
from fedlib.engine import (BatchedExecutor, FederatedConfig, FederatedMethod, GradientNoise, SequentialExecutor,
                           UploadNoise, bce_client_loss, client_gradient_noise, client_noise_generator, dp_epsilon,
                           fedmf_method, gradient_noise_shapes, ParameterAveraging, make_round_plan, pfedrec_method,
                           personal_table_method, round_generator, run_federated)
from fedlib.engine.privacy import rdp_epsilon
from fedlib.models import FedMF, PersonalItemTableModel, PFedRec

from engine_toys import BATCH, DIM, NUM_ITEMS, NUM_USERS, toy_train  # noqa: F401
EXECUTORS = {"sequential": SequentialExecutor(), "batched": BatchedExecutor(chunk_size=5)}



def _plan(train, batch_size=BATCH, round_index=0):
    return make_round_plan(train, NegativeSampler(train, NUM_ITEMS), round_generator(7, round_index),
                           batch_size=batch_size, round_index=round_index)


def _round(method, executor, plan, **kwargs):
    """One round from the float64 initial state: ``(result, state_before, state_after)``."""
    state = ParameterAveraging(method, None, FederatedConfig(rounds=1, dtype="float64")).init(7)
    before = {k: v.clone() for k, v in state.private_state.items()}
    weights = method.aggregation.client_weights(plan.num_examples)
    result = executor.local_updates(method, state.global_state, state.private_state, plan, weights, **kwargs)
    return result, before, state


def _zero_loss(model, params, batch):
    """A loss whose gradient is exactly zero: the parameters move by the noise alone."""
    return 0.0 * bce_client_loss(model, params, batch)


def _mf(lr=1.0, init_std=0.1, **kwargs):
    """FedMF with one learning rate for both tables (so a step's change is ``lr × gradient``)."""
    model = FedMF(NUM_USERS, NUM_ITEMS, DIM, init_std=init_std)
    return FederatedMethod(model, {"user_emb": lr, "item_emb": lr}, **kwargs)


def _client_change_norms(result, before, after, plan):
    """Per client of the plan: L2 norm of its whole change (user vector and uploaded item rows)."""
    uploads = result.client_updates["item_emb"]
    norms = []
    for user in plan.clients.tolist():
        user_change = after.private_state["user_emb"][user] - before["user_emb"][user]
        rows_change = uploads.of_client(user)[1]
        norms.append(math.sqrt(float(user_change.pow(2).sum() + rows_change.pow(2).sum())))
    return np.array(norms)


# -- clipping ------------------------------------------------------------------------------------
@pytest.mark.parametrize("executor", list(EXECUTORS))
def test_clip_bounds_every_step_of_every_client(executor):
    """A huge gradient (item/user vectors of norm ~100) with zero noise: each step moves a client by
    at most lr × C. One-step clients move by exactly that; a k-step client by at most k × lr × C,
    and clients with several steps do move further than one step (the clip is per step, not per round)."""
    lr, clip = 0.1, 0.5
    train = toy_train()
    clipped = _mf(lr, init_std=30.0, gradient_noise=GradientNoise(clip, 0.0))
    free = _mf(lr, init_std=30.0)

    one_step = _plan(train, batch_size=4096)
    assert (one_step.num_steps == 1).all()
    result, before, after = _round(clipped, EXECUTORS[executor], one_step, return_client_updates=True)
    moved = _client_change_norms(result, before, after, one_step)
    assert (moved <= lr * clip * (1 + 1e-9)).all()
    np.testing.assert_allclose(moved, lr * clip, rtol=1e-9)  # every gradient was far outside the ball
    result, before, after = _round(free, EXECUTORS[executor], one_step, return_client_updates=True)
    assert (_client_change_norms(result, before, after, one_step) > 20 * lr * clip).all()

    several = _plan(train)
    result, before, after = _round(clipped, EXECUTORS[executor], several, return_client_updates=True)
    moved = _client_change_norms(result, before, after, several)
    assert (moved <= several.num_steps * lr * clip * (1 + 1e-9)).all()
    assert (moved[several.num_steps >= 3] > 1.5 * lr * clip).any()


def test_subset_clip_covers_only_the_noised_table_and_follows_grad_clip_norm():
    """FedRKG-style: only P's gradient is clipped to C (and noised). With zero noise and one step:

    * without grad_clip_norm, every client's table moves by exactly lr_P × C, its head unclipped;
    * with grad_clip_norm=1.0 (clip_grad_norm_ over all parameters first), the head moves by at most
      lr_head × 1.0 and the table still by at most lr_P × C.
    """
    train = toy_train()
    plan = _plan(train, batch_size=4096)
    users = torch.as_tensor(plan.clients)
    model = PersonalItemTableModel(NUM_USERS, NUM_ITEMS, DIM, init_std=30.0)  # huge head gradients
    noise = GradientNoise(0.01, 0.0, params=("personal_item_emb",))

    def moved(method, executor):
        _, before, after = _round(method, executor, plan)
        table = (after.private_state["personal_item_emb"] - before["personal_item_emb"])[users].flatten(1).norm(dim=1)
        head = torch.cat([(after.private_state[n] - before[n])[users].reshape(len(users), -1)
                          for n in ("head_w", "head_b")], dim=1).norm(dim=1)
        return table, head

    for executor in EXECUTORS.values():
        method = personal_table_method(model, lr=0.1, lr_eta=1.0, grad_clip_norm=None, gradient_noise=noise)
        lr_table, lr_head = method.lr("personal_item_emb", 0), method.lr("head_w", 0)
        table, head = moved(method, executor)
        torch.testing.assert_close(table, torch.full_like(table, lr_table * 0.01), rtol=1e-9, atol=0)
        assert (head > 5 * lr_head).all()  # unclipped: gradients of norm 8 to 27

        table, head = moved(dataclasses.replace(method, grad_clip_norm=1.0), executor)
        assert (table <= lr_table * 0.01 * (1 + 1e-9)).all()
        assert (head <= lr_head * (1 + 1e-9)).all() and (head > 0.9 * lr_head).all()


# -- noise statistics and support ----------------------------------------------------------------
def test_noise_std_on_a_zero_gradient_and_every_step_adds_its_own_draw():
    """Zero gradient, lr 1: a client with k steps moves by -(sum of k draws), std sqrt(k)·σ·C on every
    coordinate of its user vector and of every row of its item table (full support)."""
    clip, multiplier = 0.05, 2.0
    train = toy_train()
    plan = _plan(train)
    method = _mf(1.0, client_loss=_zero_loss, gradient_noise=GradientNoise(clip, multiplier))
    result, before, after = _round(method, BatchedExecutor(), plan, return_client_updates=True)
    uploads = result.client_updates["item_emb"]
    assert len(uploads) == plan.num_clients * NUM_ITEMS  # every client sends every row
    per_client = []
    for c, user in enumerate(plan.clients.tolist()):
        change = torch.cat([uploads.of_client(user)[1].reshape(-1),
                            after.private_state["user_emb"][user] - before["user_emb"][user]])
        per_client.append(change / math.sqrt(plan.num_steps[c]))
    normalised = torch.cat(per_client)  # 14 × (60 + 1) × 8 = 6,832 values
    assert normalised.numel() == plan.num_clients * (NUM_ITEMS + 1) * DIM
    assert float(normalised.std()) == pytest.approx(multiplier * clip, rel=0.05)
    assert abs(float(normalised.mean())) < 4 * multiplier * clip / math.sqrt(normalised.numel())


def test_touched_support_spares_untouched_rows_and_full_support_reaches_private_tables():
    train = toy_train()
    plan = _plan(train).subset(np.array([0, 1, 2]))  # three small clients: most rows untouched
    never_touched = np.setdiff1d(np.arange(NUM_ITEMS), plan.items)
    assert never_touched.size > 20
    for support, untouched_moves in (("touched", False), ("full", True)):
        method = _mf(1.0, client_loss=_zero_loss, gradient_noise=GradientNoise(0.1, 1.0, support=support))
        update = _round(method, SequentialExecutor(), plan)[0].update["item_emb"]
        assert bool((update[never_touched] != 0).all()) is untouched_moves
        assert bool((update[never_touched] != 0).any()) is untouched_moves
        assert bool((update[np.unique(plan.items)] != 0).all())

    # FedRKG's personal table: the whole table of each participant moves; non-participants keep theirs.
    model = PersonalItemTableModel(NUM_USERS, NUM_ITEMS, DIM)
    method = personal_table_method(model, lr=0.1, lr_eta=1.0, client_loss=_zero_loss,
                                   gradient_noise=GradientNoise(0.1, 1.0, params=("personal_item_emb",)))
    _, before, after = _round(method, BatchedExecutor(), plan)
    moved = (after.private_state["personal_item_emb"] != before["personal_item_emb"]).flatten(1).all(dim=1)
    assert moved.tolist() == [u in set(plan.clients.tolist()) for u in range(NUM_USERS)]
    # The head is not covered: with a zero gradient it does not move.
    assert torch.equal(after.private_state["head_w"], before["head_w"])


# -- randomness ------------------------------------------------------------------------------------
def test_noise_is_the_clients_own_draw_of_its_round_key_and_step():
    """Zero gradient, one step, lr 1: the change is exactly minus client_gradient_noise(key, u, step 0)."""
    train = toy_train()
    plan = _plan(train, batch_size=4096)
    method = _mf(1.0, client_loss=_zero_loss, gradient_noise=GradientNoise(0.1, 1.0))
    for executor in EXECUTORS.values():
        result, before, after = _round(method, executor, plan, return_client_updates=True)
        for user in plan.clients[[0, 5, 13]].tolist():
            shapes = gradient_noise_shapes(method, ("user_emb", "item_emb"), after.global_state, after.private_state, 0)
            noise = client_gradient_noise(method, shapes, user, plan.noise_key, 0, before["user_emb"])
            torch.testing.assert_close(after.private_state["user_emb"][user] - before["user_emb"][user],
                                       -noise["user_emb"], atol=1e-15, rtol=0)
            torch.testing.assert_close(result.client_updates["item_emb"].of_client(user)[1], -noise["item_emb"],
                                       atol=1e-15, rtol=0)


def test_each_update_step_of_a_batch_draws_its_own_noise():
    """PFedRec steps its head, then its items, on every batch: local steps k = 0 and k = 1 of a
    one-batch client, two independent draws (a shared stream would reuse the same normals)."""
    train = toy_train()
    plan = _plan(train, batch_size=4096)
    method = pfedrec_method(PFedRec(NUM_USERS, NUM_ITEMS, DIM), lr=1.0, lr_eta=1.0 / NUM_ITEMS,  # lr 1 everywhere
                            client_loss=_zero_loss, gradient_noise=GradientNoise(0.1, 1.0))
    for executor in EXECUTORS.values():
        result, before, after = _round(method, executor, plan, return_client_updates=True)
        user = int(plan.clients[3])
        head = gradient_noise_shapes(method, ("head_w", "head_b"), after.global_state, after.private_state, 0)
        items = gradient_noise_shapes(method, ("item_emb",), after.global_state, after.private_state, 0)
        head_noise = client_gradient_noise(method, head, user, plan.noise_key, 0, before["head_w"])
        item_noise = client_gradient_noise(method, items, user, plan.noise_key, 1, before["head_w"])
        torch.testing.assert_close(after.private_state["head_w"][user] - before["head_w"][user], -head_noise["head_w"],
                                   atol=1e-15, rtol=0)
        torch.testing.assert_close(result.client_updates["item_emb"].of_client(user)[1], -item_noise["item_emb"],
                                   atol=1e-15, rtol=0)
        assert not torch.equal(head_noise["head_w"], item_noise["item_emb"].reshape(-1)[:DIM])


def test_streams_separate_upload_noise_steps_and_clients():
    key = 12345
    upload = torch.randn(5, generator=client_noise_generator(key, 3))
    assert torch.equal(upload, torch.randn(5, generator=client_noise_generator(key, 3, stream=0)))
    draws = [torch.randn(5, generator=client_noise_generator(key, 3, stream=s)) for s in (1, 2)]
    draws.append(torch.randn(5, generator=client_noise_generator(key, 4, stream=1)))
    for i, a in enumerate([upload, *draws]):
        for b in draws[i:]:
            assert a is b or not torch.equal(a, b)
    with pytest.raises(ValueError, match="stream"):
        client_noise_generator(key, 3, stream=-1)


@pytest.mark.parametrize("executor", list(EXECUTORS))
def test_noise_is_deterministic_and_independent_of_the_other_participants(executor):
    train = toy_train()
    plan = _plan(train)
    method = fedmf_method(FedMF(NUM_USERS, NUM_ITEMS, DIM, init_std=0.1), lr=0.5,
                          gradient_noise=GradientNoise(0.5, 0.5))
    everyone, _, state = _round(method, EXECUTORS[executor], plan, return_client_updates=True)
    again, _, state_again = _round(method, EXECUTORS[executor], plan, return_client_updates=True)
    assert torch.equal(everyone.update["item_emb"], again.update["item_emb"])
    assert torch.equal(state.private_state["user_emb"], state_again.private_state["user_emb"])

    chosen = np.array([2, 9])  # a one-batch and a many-batch client, simulated without the others
    few, _, few_state = _round(method, EXECUTORS[executor], plan.subset(chosen), return_client_updates=True)
    for user in plan.clients[chosen].tolist():
        torch.testing.assert_close(few.client_updates["item_emb"].of_client(user)[1],
                                   everyone.client_updates["item_emb"].of_client(user)[1], atol=1e-12, rtol=0)
        torch.testing.assert_close(few_state.private_state["user_emb"][user], state.private_state["user_emb"][user],
                                   atol=1e-12, rtol=0)

    # Another round key (noise_seed) gives other noise.
    other, _, _ = _round(method, EXECUTORS[executor], plan, noise_seed=123)
    assert float((other.update["item_emb"] - everyone.update["item_emb"]).abs().max()) > 1e-3


def test_run_federated_draws_gradient_noise_from_the_config_seed():
    """The loop passes noise_seed=config.seed: one round redone by hand with it lands on the same state."""
    train = toy_train()
    method = fedmf_method(FedMF(NUM_USERS, NUM_ITEMS, DIM, init_std=0.1), lr=0.5,
                          gradient_noise=GradientNoise(0.5, 0.5))
    config = FederatedConfig(rounds=1, seed=7, batch_size=BATCH, dtype="float64")
    looped = run_federated(method, train, config, executor=BatchedExecutor())
    result, _, state = _round(method, SequentialExecutor(), _plan(train), noise_seed=7)
    torch.testing.assert_close(state.global_state["item_emb"] + result.update["item_emb"],
                               looped.state.global_state["item_emb"], atol=1e-12, rtol=0)
    torch.testing.assert_close(state.private_state["user_emb"], looped.state.private_state["user_emb"], atol=1e-12,
                               rtol=0)


def test_shortcuts_are_off_with_gradient_noise():
    train = toy_train()
    plan = _plan(train)
    executor = BatchedExecutor(analytic_fedmf=True)
    plain = fedmf_method(FedMF(NUM_USERS, NUM_ITEMS, DIM))
    noisy = dataclasses.replace(plain, gradient_noise=GradientNoise(1.0, 0.1))
    assert executor._use_fedmf_kernel(plain, plan) and executor._fast_path_allowed(plain)
    assert not executor._use_fedmf_kernel(noisy, plan) and not executor._fast_path_allowed(noisy)
    assert not noisy.is_plain and plain.is_plain


# -- accounting -----------------------------------------------------------------------------------
def test_dp_epsilon_is_opacus_rdp_of_the_per_round_mechanism():
    from opacus.accountants import RDPAccountant

    noise = GradientNoise(1.0, 1.5)
    steps, rounds, q, delta = 4, 30, 0.2, 1e-5
    # A round = 4 Gaussian steps of multiplier 1.5 = one Gaussian of multiplier 1.5 / 2, sampled with q.
    accountant = RDPAccountant()
    for _ in range(rounds):
        accountant.step(noise_multiplier=1.5 / math.sqrt(steps), sample_rate=q)
    direct = accountant.get_epsilon(delta=delta)
    eps = dp_epsilon(noise, steps_per_round=steps, rounds=rounds, sample_rate=q, delta=delta)
    assert eps == pytest.approx(direct, rel=1e-12)
    # Sampling each local step independently would understate ε (a client runs all its steps).
    assert eps > rdp_epsilon(1.5, q, steps * rounds, delta)
    # Every client every round: the same as composing all steps one by one.
    full = dp_epsilon(noise, steps_per_round=steps, rounds=rounds, sample_rate=1.0, delta=delta)
    assert full == pytest.approx(rdp_epsilon(1.5, 1.0, steps * rounds, delta), rel=1e-9)
    assert full > eps  # no amplification without client sampling
    # Replace adjacency doubles the sensitivity: the accountant sees σ / 2.
    replace = dp_epsilon(noise, steps_per_round=steps, rounds=rounds, sample_rate=1.0, delta=delta,
                         adjacency="replace")
    assert replace == pytest.approx(rdp_epsilon(0.75, 1.0, steps * rounds, delta), rel=1e-9)
    assert replace > full


def test_dp_epsilon_decreases_with_noise_and_grows_with_steps():
    kwargs = dict(sample_rate=0.1, delta=1e-5)
    eps = [dp_epsilon(GradientNoise(0.1, s), steps_per_round=2, rounds=100, **kwargs) for s in (0.8, 1.0, 2.0, 4.0)]
    assert all(a > b for a, b in zip(eps, eps[1:]))
    noise = GradientNoise(0.1, 1.0)
    assert dp_epsilon(noise, steps_per_round=4, rounds=100, **kwargs) > dp_epsilon(noise, steps_per_round=2, rounds=100, **kwargs)
    assert dp_epsilon(noise, steps_per_round=2, rounds=200, **kwargs) > dp_epsilon(noise, steps_per_round=2, rounds=100, **kwargs)
    assert dp_epsilon(noise, steps_per_round=0, rounds=100, **kwargs) == 0.0
    assert dp_epsilon(GradientNoise(0.1, 0.0), steps_per_round=1, rounds=1, **kwargs) == math.inf
    # The clip norm does not enter ε (only σ = std / C does).
    assert dp_epsilon(GradientNoise(5.0, 1.0), steps_per_round=2, rounds=100, **kwargs) == \
        dp_epsilon(noise, steps_per_round=2, rounds=100, **kwargs)


def test_fedrkg_stated_setting_gives_no_meaningful_epsilon():
    """FedRKG Table 5: "sensitivity 0.1 and σ = 0.001" (clip 0.1, noise std 0.001: multiplier 0.01),
    every client every round for 1000 rounds, one noisy step on P_u per round, δ = 1e-5."""
    noise = GradientNoise.from_std(0.1, 0.001, params=("personal_item_emb",))
    assert noise.noise_multiplier == pytest.approx(0.01) and noise.noise_std == pytest.approx(0.001)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # opacus: the best RDP order is the smallest of its grid
        eps = dp_epsilon(noise, steps_per_round=1, rounds=1000, sample_rate=1.0, delta=1e-5)
        eps_replace = dp_epsilon(noise, steps_per_round=1, rounds=1000, sample_rate=1.0, delta=1e-5,
                                 adjacency="replace")
    print(f"FedRKG stated setting: epsilon = {eps:.4g} (add/remove), {eps_replace:.4g} (replace), delta = 1e-5")
    assert eps == pytest.approx(5.5e6, rel=0.01)
    assert eps_replace == pytest.approx(2.2e7, rel=0.01)
    method = personal_table_method(PersonalItemTableModel(NUM_USERS, NUM_ITEMS, DIM), gradient_noise=noise)
    assert method.noised_steps_per_batch == 1


def test_noised_steps_per_batch_counts_update_steps_with_covered_parameters():
    model = PFedRec(NUM_USERS, NUM_ITEMS, DIM)
    assert pfedrec_method(model, gradient_noise=GradientNoise(1.0, 1.0)).noised_steps_per_batch == 2
    assert pfedrec_method(model, gradient_noise=GradientNoise(1.0, 1.0, params=("item_emb",))).noised_steps_per_batch == 1
    assert pfedrec_method(model).noised_steps_per_batch == 0


# -- argument checks -------------------------------------------------------------------------------
@pytest.mark.parametrize("kwargs, error, match", [
    (dict(clip_norm=0.0, noise_multiplier=1.0), ValueError, "clip_norm"),
    (dict(clip_norm=-1.0, noise_multiplier=1.0), ValueError, "clip_norm"),
    (dict(clip_norm=float("inf"), noise_multiplier=1.0), ValueError, "clip_norm"),
    (dict(clip_norm=1.0, noise_multiplier=-0.1), ValueError, "noise_multiplier"),
    (dict(clip_norm=1.0, noise_multiplier=float("nan")), ValueError, "noise_multiplier"),
    (dict(clip_norm=1.0, noise_multiplier=1.0, params="item_emb"), TypeError, "tuple of names"),
    (dict(clip_norm=1.0, noise_multiplier=1.0, params=()), ValueError, "non-empty"),
    (dict(clip_norm=1.0, noise_multiplier=1.0, support="rows"), ValueError, "support"),
])
def test_gradient_noise_rejects_bad_arguments(kwargs, error, match):
    with pytest.raises(error, match=match):
        GradientNoise(**kwargs)


def test_method_rejects_inconsistent_gradient_noise():
    mf = FedMF(NUM_USERS, NUM_ITEMS, DIM)
    with pytest.raises(ValueError, match="unknown parameters"):
        fedmf_method(mf, gradient_noise=GradientNoise(1.0, 1.0, params=("item_table",)))
    with pytest.raises(TypeError, match="GradientNoise"):
        fedmf_method(mf, gradient_noise=(1.0, 1.0))
    with pytest.raises(ValueError, match="grad_clip_norm"):
        fedmf_method(mf, grad_clip_norm=1.0, gradient_noise=GradientNoise(0.5, 1.0))
    with pytest.raises(ValueError, match="support='touched'"):
        fedmf_method(mf, upload_mode="rows", gradient_noise=GradientNoise(0.5, 1.0))
    head_only = dataclasses.replace(pfedrec_method(PFedRec(NUM_USERS, NUM_ITEMS, DIM)), update_steps=(("head_w", "head_b"),))
    with pytest.raises(ValueError, match="no update step"):
        dataclasses.replace(head_only, gradient_noise=GradientNoise(1.0, 1.0, params=["item_emb"]))
    # Allowed: equal norms; a subset with its own norm; touched support with row uploads; clip-only.
    assert fedmf_method(mf, grad_clip_norm=0.5, gradient_noise=GradientNoise(0.5, 1.0)).step_clip_norm is None
    personal = personal_table_method(PersonalItemTableModel(NUM_USERS, NUM_ITEMS, DIM), grad_clip_norm=1.0,
                                     gradient_noise=GradientNoise(0.1, 1.0, params=["personal_item_emb"]))
    assert personal.step_clip_norm == 1.0 and personal.gradient_noise.params == ("personal_item_emb",)
    assert fedmf_method(mf, upload_mode="rows", gradient_noise=GradientNoise(0.5, 1.0, support="touched")).adds_gradient_noise
    assert not fedmf_method(mf, upload_mode="rows", gradient_noise=GradientNoise(0.5, 0.0)).adds_gradient_noise


@pytest.mark.parametrize("kwargs, error, match", [
    (dict(gradient_noise=1.0), TypeError, "GradientNoise"),
    (dict(steps_per_round=-1), ValueError, "steps_per_round"),
    (dict(steps_per_round=1.5), ValueError, "steps_per_round"),
    (dict(rounds=-2), ValueError, "rounds"),
    (dict(sample_rate=0.0), ValueError, "sample_rate"),
    (dict(sample_rate=1.2), ValueError, "sample_rate"),
    (dict(delta=0.0), ValueError, "delta"),
    (dict(adjacency="example"), ValueError, "adjacency"),
    (dict(adjacency="replace", sample_rate=0.5), ValueError, "sample_rate=1.0"),
])
def test_dp_epsilon_rejects_bad_arguments(kwargs, error, match):
    arguments = dict(gradient_noise=GradientNoise(1.0, 1.0), steps_per_round=2, rounds=10, sample_rate=1.0, delta=1e-5)
    arguments.update(kwargs)
    noise = arguments.pop("gradient_noise")
    with pytest.raises(error, match=match):
        dp_epsilon(noise, **arguments)


def test_client_update_guard_counts_full_support_gradient_noise():
    train = toy_train()
    plan = _plan(train)
    method = fedmf_method(FedMF(NUM_USERS, NUM_ITEMS, DIM), gradient_noise=GradientNoise(1.0, 0.1),
                          upload_noise=UploadNoise(0.1, "touched"))
    limit = plan.num_clients * NUM_ITEMS * DIM - 1  # every client sends all rows
    for executor in EXECUTORS.values():
        with pytest.raises(ValueError, match="max_client_update_values"):
            _round(method, executor, plan, return_client_updates=True, max_client_update_values=limit)
