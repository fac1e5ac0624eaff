"""Single-domain baselines of FedPCL-CDR's Table 2: NeuMF fusion, LightGCN layer mean + BPR,
FedNCF's per-client training and sample-weighted FedAvg, and short training runs."""
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from fedlib.data.splits import InteractionSplit, Pairs
from fedlib.data.synthetic import overlapping_domains
from fedlib.engine import Checkpointer
from fedlib.engine.plan import make_round_plan, round_generator
from fedlib.baselines.cross_domain import cdr_single_domain as S
from fedlib.baselines.cross_domain.cdr_common import audit_blocks, history_rows, selected_blocks
from fedlib.models.ncf import FedNCF, NeuMF


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """One intra-op thread: the runs are tiny, and extra threads only contend on a busy machine."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def split():
    return overlapping_domains(num_users=300, items_per_domain=150, overlap=0.5, seed=0)


@pytest.fixture(scope="module")
def small_split():
    return overlapping_domains(num_users=60, items_per_domain=150, overlap=0.5, seed=1)


def _toy_split(users, items, num_users, num_items) -> InteractionSplit:
    train = Pairs.from_arrays(users, items, num_users)
    empty = Pairs.from_arrays(np.zeros(0, np.int64), np.zeros(0, np.int64), num_users)
    return InteractionSplit(num_users, num_items, train, empty, empty, name="toy")


# ----------------------------------------------------------------------------- NeuMF fusion
def test_neumf_logit_is_the_output_layer_over_gmf_and_mlp_features():
    params = {
        "user_emb_gmf": torch.tensor([[1.0, 2.0]]), "item_emb_gmf": torch.tensor([[0.0, 0.0], [3.0, -1.0]]),
        "user_emb": torch.tensor([[1.0, 0.0]]), "item_emb": torch.tensor([[0.0, 0.0], [0.0, 1.0]]),
        "mlp0_w": torch.tensor([[1.0, 1.0, 1.0, 1.0], [1.0, -1.0, 0.0, 0.0]]), "mlp0_b": torch.tensor([0.0, -2.0]),
        "head_w": torch.tensor([1.0, 1.0, 0.5, 3.0]), "head_b": torch.tensor(0.25),
    }
    # GMF: (1·3, 2·−1) = (3, −2); MLP: relu(W [1, 0, 0, 1] + b) = relu(2, −1) = (2, 0);
    # logit = 3 − 2 + 0.5·2 + 3·0 + 0.25 = 2.25. Item 0 (zero embeddings): GMF 0, MLP input
    # [1, 0, 0, 0] → relu(1, −1) = (1, 0), logit = 0.5·1 + 0.25 = 0.75.
    out = S.ncf_candidate_logits(params, 1, torch.tensor([0]), torch.tensor([[1, 0]]))
    assert torch.allclose(out, torch.tensor([[2.25, 0.75]]))


def test_candidate_logits_agree_with_the_library_neumf_and_fedncf():
    model = NeuMF(7, 11, dim=4, hidden=(6, 3), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():  # move away from the tiny init so every branch matters
        for p in model.params.values():
            p.add_(torch.randn(p.shape, generator=torch.Generator().manual_seed(p.numel())))
    users = torch.tensor([0, 3, 6])
    items = torch.tensor([[1, 2, 10], [0, 0, 5], [9, 4, 3]])
    ours = S.ncf_candidate_logits(model.params, 2, users, items)
    central = model(users.repeat_interleave(3), items.reshape(-1)).view(3, 3)
    assert torch.allclose(ours, central, atol=1e-5)
    spec = FedNCF(7, 11, 4, variant="neumf", hidden=(6, 3))
    public = {k: v.detach() for k, v in model.params.items() if k in spec.public_names}
    private = {k: v.detach() for k, v in model.params.items() if k in spec.private_names}
    full = spec.score_users(public, private, users)  # (3, 11)
    assert torch.allclose(ours, full.gather(1, items), atol=1e-5)


# ----------------------------------------------------------------------------- LightGCN
def test_lightgcn_scores_average_the_layers_on_a_path_graph():
    # u0 — i0 — u1: Â[u, i0] = 1/√2. Scalars x(u0) = 1, x(u1) = 0, y(i0) = 2.
    toy = _toy_split([0, 1], [0, 0], 2, 1)
    domain = S._LightGCNDomain(toy, S.LightGCNConfig(dim=1), 0, torch.device("cpu"))
    live = domain.init()
    with torch.no_grad():
        live.model.user_emb.copy_(torch.tensor([[1.0], [0.0]]))
        live.model.item_emb.copy_(torch.tensor([[2.0]]))
    r2 = math.sqrt(2.0)
    # Layers of u0: 1, √2, 1/2, √2; of i0: 2, 1/√2, 2, 1/√2 (the mean, not the sum).
    e_u0 = (1 + r2 + 0.5 + r2) / 4
    e_i0 = (2 + 1 / r2 + 2 + 1 / r2) / 4
    score = domain.scorer(live)(torch.tensor([0]), torch.tensor([[0]]))
    assert score.item() == pytest.approx(e_u0 * e_i0, rel=1e-6)


def test_lightgcn_epoch_loss_is_bpr_against_the_only_possible_negative():
    # Users 0 and 1 both like item 0; item 1 is the only negative either can draw.
    toy = _toy_split([0, 1], [0, 0], 2, 2)
    config = S.LightGCNConfig(dim=2, num_layers=2, batch_size=8, l2=0.0, lr=1e-3)
    domain = S._LightGCNDomain(toy, config, 0, torch.device("cpu"))
    live = domain.init()
    e0 = torch.tensor([[1.0, 0.5], [-0.5, 1.0], [0.3, 0.2], [1.0, -1.0]], dtype=torch.float64)  # u0, u1, i0, i1
    with torch.no_grad():
        live.model.user_emb.copy_(e0[:2])
        live.model.item_emb.copy_(e0[2:])
    a = torch.zeros(4, 4, dtype=torch.float64)
    a[0, 2] = a[2, 0] = a[1, 2] = a[2, 1] = 1 / math.sqrt(2)  # degrees 1, 1, 2, 0
    layers = [e0, a @ e0, a @ a @ e0]
    e = sum(layers) / 3
    diff = (e[:2] * e[2]).sum(1) - (e[:2] * e[3]).sum(1)
    expected = -F.logsigmoid(diff).mean().item()
    assert domain.train_epoch(live)[1]["loss"] == pytest.approx(expected, rel=1e-5)


# ----------------------------------------------------------------------------- FedNCF
def test_clients_per_round_is_the_fraction_of_active_users():
    assert S.clients_per_round(100, 0.1) == 10
    assert S.clients_per_round(5, 0.1) == 1  # at least one
    assert S.clients_per_round(10, 1.0) is None  # everyone
    with pytest.raises(ValueError, match="no user with training data"):
        S.clients_per_round(0, 0.5)


def _reference_round(domain, before_global, before_private, lr):
    """One FedNCF round written out client by client: private user rows, fresh Adam, FedAvg by n_c."""
    config = domain.engine_config
    plan = make_round_plan(domain.split.train, domain.averaging.sampler, round_generator(config.seed, 0),
                           num_negatives=config.num_negatives, batch_size=config.batch_size,
                           local_epochs=config.local_epochs, clients_per_round=config.clients_per_round)
    weights = plan.num_examples / plan.num_examples.sum()
    new_global = {k: torch.zeros_like(v) for k, v in before_global.items()}
    new_private = {k: v.clone() for k, v in before_private.items()}
    num_hidden = len(domain.config.hidden)
    for c, user in enumerate(plan.clients):
        public = {k: v.clone().requires_grad_(True) for k, v in before_global.items()}
        mine = {k: v[user:user + 1].clone().requires_grad_(True) for k, v in before_private.items()}
        optimizer = torch.optim.Adam(list(public.values()) + list(mine.values()), lr=lr)
        sl = plan.client_examples(c)
        items, labels, steps = plan.items[sl], plan.labels[sl], plan.steps[sl]
        for step in range(int(plan.num_steps[c])):
            take = steps == step
            params = {**public, **mine}
            logits = S.ncf_candidate_logits(params, num_hidden, torch.tensor([0]),
                                            torch.as_tensor(items[take])[None, :])[0]
            loss = F.binary_cross_entropy_with_logits(logits, torch.as_tensor(labels[take], dtype=logits.dtype))
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        for k in new_global:
            new_global[k] += float(weights[c]) * public[k].detach()
        for k in new_private:
            new_private[k][user] = mine[k].detach()[0]
    return plan, new_global, new_private


def test_fedncf_round_is_per_client_adam_then_sample_weighted_fedavg():
    # 6 users with 1-5 positives (one to three local batches of 4), 3 of them sampled.
    users = [0, 0, 0, 0, 0, 1, 2, 2, 3, 3, 3, 4, 4, 5, 5, 5, 5]
    items = [0, 1, 2, 3, 4, 5, 1, 6, 2, 7, 8, 0, 9, 3, 4, 5, 6]
    toy = _toy_split(users, items, 6, 12)
    config = S.FedNCFConfig(dim=3, hidden=(4, 2), lr=0.05, batch_size=4, local_epochs=2, num_negatives=1,
                            client_fraction=0.5, dtype="float64")
    domain = S._FedNCFDomain(toy, config, 0, torch.device("cpu"))
    live = domain.init()
    before_global = {k: v.clone() for k, v in live.averaging.global_state.items()}
    before_private = {k: v.clone() for k, v in live.averaging.private_state.items()}
    plan, ref_global, ref_private = _reference_round(domain, before_global, before_private, config.lr)
    assert plan.num_clients == 3 and len(set(plan.num_examples.tolist())) > 1  # unequal weights
    live, _ = domain.train_epoch(live, 0)
    assert live.bytes_up > 0 and live.bytes_down > 0
    for k, v in ref_global.items():
        assert torch.allclose(live.averaging.global_state[k], v, atol=1e-10), k
    for k, v in ref_private.items():
        assert torch.allclose(live.averaging.private_state[k], v, atol=1e-10), k
    # Users not sampled keep their private vectors; rows nobody touched keep their value.
    others = np.setdiff1d(np.arange(6), plan.clients)
    assert torch.equal(live.averaging.private_state["user_emb"][others], before_private["user_emb"][others])
    touched = np.unique(plan.items)
    untouched = np.setdiff1d(np.arange(12), touched)
    assert untouched.size > 0
    assert torch.equal(live.averaging.global_state["item_emb"][untouched], before_global["item_emb"][untouched])
    assert not torch.allclose(live.averaging.global_state["item_emb"][touched], before_global["item_emb"][touched])


def test_fedncf_batched_and_sequential_executors_give_the_same_run(small_split):
    base = dict(rounds=2, eval_every=1, client_fraction=0.5, lr=0.02, dtype="float64", patience=5)
    batched = S.train_fedncf(small_split, S.FedNCFConfig(executor="batched", **base))
    sequential = S.train_fedncf(small_split, S.FedNCFConfig(executor="sequential", **base))
    assert len(history_rows(batched)) == len(history_rows(sequential)) == 2
    for row_b, row_s in zip(history_rows(batched), history_rows(sequential)):
        for key, value in row_b.items():
            if key != "seconds":
                assert value == pytest.approx(row_s[key], abs=1e-9), key
    for name in small_split.domains:
        for part in ("global_state", "private_state"):
            for k, v in getattr(batched.artifacts["states"][name], part).items():
                assert torch.allclose(v, getattr(sequential.artifacts["states"][name], part)[k], atol=1e-9), k


# ----------------------------------------------------------------------------- configs
@pytest.mark.parametrize("make, message", [
    (lambda: S.NeuMFConfig(num_negatives=0), "num_negatives"),
    (lambda: S.NeuMFConfig(hidden=()), "hidden"),
    (lambda: S.LightGCNConfig(loss="hinge"), "loss"),
    (lambda: S.LightGCNConfig(l2=-1.0), "l2"),
    (lambda: S.FedNCFConfig(client_fraction=0.0), "client_fraction"),
    (lambda: S.FedNCFConfig(client_fraction=1.5), "client_fraction"),
    (lambda: S.FedNCFConfig(executor="threads"), "executor"),
    (lambda: S.FedNCFConfig(lr=0.0), "lr"),
    (lambda: S.NeuMFConfig(select_on="train"), "select_on"),
    (lambda: S.LightGCNConfig(patience=0), "patience"),
])
def test_bad_configs_are_refused(make, message):
    with pytest.raises(ValueError, match=message):
        make()


def test_dispatch_by_config_type(small_split):
    assert [c().model for c in (S.NeuMFConfig, S.LightGCNConfig, S.FedNCFConfig)] == list(S.MODELS)
    with pytest.raises(ValueError, match="NeuMFConfig, LightGCNConfig, FedNCFConfig"):
        S.train_single_domain(small_split, object())
    with pytest.raises(ValueError, match="expected a NeuMFConfig"):
        S.train_neumf(small_split, S.LightGCNConfig())


# ----------------------------------------------------------------------------- training runs
@pytest.mark.parametrize("config", [
    S.NeuMFConfig(epochs=3),
    S.LightGCNConfig(epochs=3, batch_size=256),
    # Few rounds: a larger step and half of the users per round.
    S.FedNCFConfig(rounds=6, eval_every=3, client_fraction=0.5, lr=0.03),
], ids=lambda c: c.model)
def test_short_run_beats_random_ranking(split, config):
    rows = []
    result = S.train_single_domain(split, config, progress=lambda epoch, row: rows.append(epoch))
    history, selected = history_rows(result), selected_blocks(result)
    assert result.method == config.model and result.artifacts["config"] == config
    assert set(selected) == set(split.domains) == set(result.artifacts["models"])
    best = max(row["valid/HR@10"] for row in history)
    assert best > 0.2, history  # random ranking of 1 + 99 candidates: 0.1
    assert rows == [row["round"] for row in history]
    for name in split.domains:
        assert 0.0 <= selected[name]["test/NDCG@10"] <= selected[name]["test/HR@10"] <= 1.0


@pytest.mark.parametrize("config", [
    S.NeuMFConfig(epochs=2, seed=4),
    S.LightGCNConfig(epochs=2, batch_size=128, seed=4),
    S.FedNCFConfig(rounds=2, eval_every=1, client_fraction=0.3, seed=4),
], ids=lambda c: c.model)
def test_same_seed_same_numbers(small_split, config):
    first = S.train_single_domain(small_split, config)
    second = S.train_single_domain(small_split, config)
    strip = lambda run: [{k: v for k, v in row.items() if k != "seconds"} for row in history_rows(run)]
    assert strip(first) == strip(second)
    other = S.train_single_domain(small_split, type(config)(**{**config.__dict__, "seed": 5}))
    assert strip(other) != strip(first)


class _Killed(RuntimeError):
    pass


@pytest.mark.parametrize("config", [
    S.NeuMFConfig(epochs=4, dim=8, seed=2),
    S.LightGCNConfig(epochs=4, dim=8, batch_size=128, seed=2),
    S.FedNCFConfig(rounds=4, dim=8, eval_every=1, client_fraction=0.3, seed=2),
], ids=lambda c: c.model)
def test_a_run_killed_after_a_checkpoint_resumes_to_the_uninterrupted_run(small_split, config, tmp_path):
    """Models, optimisers, generators (and FedNCF's byte counts) are in the checkpoint: a run killed
    in round 2 and resumed gives the uninterrupted run's history, selection and final parameters."""
    full = S.train_single_domain(small_split, config)

    def kill_after_round_2(run, record):
        if run.round_index == 2:
            raise _Killed

    with pytest.raises(_Killed):
        S.train_single_domain(small_split, config, checkpointer=Checkpointer(tmp_path, name="run", every=1),
                              on_round_end=kill_after_round_2)
    checkpointer = Checkpointer(tmp_path, name="run", every=1)
    resumed = S.train_single_domain(small_split, config, checkpointer=checkpointer)
    assert checkpointer.resumed_at == [1]  # killed during round 2: its checkpoint was not yet written
    strip = lambda run: [{k: v for k, v in row.items() if k != "seconds"} for row in history_rows(run)]
    assert strip(resumed) == strip(full)
    assert (selected_blocks(resumed), resumed.best_round, audit_blocks(resumed)) == \
        (selected_blocks(full), full.best_round, audit_blocks(full))
    assert resumed.artifacts["scalars"] == full.artifacts["scalars"]
    for name in small_split.domains:
        if isinstance(config, S.FedNCFConfig):
            final_full, final_resumed = full.artifacts["states"][name].global_state, \
                resumed.artifacts["states"][name].global_state
        else:
            final_full = full.artifacts["models"][name].state_dict()
            final_resumed = resumed.artifacts["models"][name].state_dict()
        for key, value in final_full.items():
            assert torch.equal(value, final_resumed[key]), (name, key)
