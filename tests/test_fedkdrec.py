"""FedKDRec / PTF-FedRec: backbones, local data, sample-mix-swap, agents, executors, learning."""
from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from fedlib.data.sampling import NegativeSampler
from fedlib.data.splits import Pairs
from fedlib.data.synthetic import clustered_interactions
from fedlib.engine import CommunicationLedger
from fedlib.metrics.ranking import candidate_set_metrics
from fedlib.models.lightgcn import lightgcn_propagate, normalized_adjacency
from fedlib.models.stacked import Backbone, paper_hidden
from fedlib.papers.fedkdrec import agents as A
from fedlib.papers.fedkdrec.clients import (
    VARIANTS, FedKDRecConfig, epoch_orders, gather_local, local_examples, local_predictions, mixed_label_bce,
    prepare_uploads, train_clients_batched, train_clients_sequential, variant_config,
)
from fedlib.papers.fedkdrec.method import _Server, train_fedkdrec


@pytest.fixture(scope="module")
def split():
    return clustered_interactions(num_users=60, num_items=80, interactions_per_user=12, seed=3)


def small(**overrides):
    base = dict(backbone="neumf", hidden=(16, 8), dim=8, rounds=2, client_fraction=0.5, client_batch=16,
                server_batch=64, mu=6, eval_every=1, seed=1, device_hint=None)
    base.pop("device_hint")
    base.update(overrides)
    return base


# ---------------------------------------------------------------------------- backbones
def test_star_graph_closed_form_equals_sparse_propagation():
    g = torch.Generator().manual_seed(0)
    backbone = Backbone("lightgcn", 1, 7, dim=4)
    params = backbone.init_server(g)
    own_items = np.array([1, 4, 5])
    pairs = Pairs.from_arrays(np.zeros(3, np.int64), own_items, num_users=1)
    users, items = lightgcn_propagate(normalized_adjacency(pairs, 1, 7), params["user_emb"], params["item_emb"], 3)
    client = backbone.client_copies(params, torch.tensor([0]))
    own = torch.zeros(1, 7)
    own[0, own_items] = 1
    logits = backbone.client_logits(client, torch.arange(7)[None], own)
    assert torch.allclose(logits[0], items @ users[0], atol=1e-6)
    with pytest.raises(ValueError, match="at least one training item"):
        backbone.client_logits(client, torch.arange(7)[None], torch.zeros(1, 7))


@pytest.mark.parametrize("kind", ["neumf", "ncf", "lightgcn"])
def test_a_client_copy_predicts_what_the_server_predicts_for_its_user(kind):
    backbone = Backbone(kind, 5, 9, dim=4, hidden=(6, 3) if kind != "lightgcn" else ())
    params = backbone.init_server(torch.Generator().manual_seed(1))
    users = torch.tensor([3, 0])
    clients = backbone.client_copies(params, users)
    items = torch.tensor([[1, 2, 8], [0, 5, 5]])
    if kind == "lightgcn":  # without a graph both sides use layer-0 embeddings; a star changes them
        server = backbone.server_logits(params, users[:, None].expand(-1, 3).reshape(-1), items.reshape(-1))
        assert torch.allclose(server.view(2, 3), (params["user_emb"][users][:, None] * params["item_emb"][items]).sum(-1))
        return
    client = backbone.client_logits(clients, items)
    server = backbone.server_logits(params, users[:, None].expand(-1, 3).reshape(-1), items.reshape(-1)).view(2, 3)
    assert torch.allclose(client, server, atol=1e-6)
    full = backbone.server_scores(params, users)
    assert torch.allclose(backbone.server_pair_scores(params, users, items), full.gather(1, items), atol=1e-6)


@pytest.mark.parametrize("kind,hidden", [("neumf", (8, 6, 3)), ("ncf", (7, 5)), ("ncf", (6,))])
def test_server_scores_equal_pairwise_logits(kind, hidden):
    """The split first layer and the GMF matrix product give every pair's logit (chunked too)."""
    backbone = Backbone(kind, 11, 13, dim=4, hidden=hidden)
    g = torch.Generator().manual_seed(2)
    params = {n: v + 0.3 * torch.randn(v.shape, generator=g)  # a trained-looking model: no tiny weights
              for n, v in backbone.init_server(torch.Generator().manual_seed(1)).items()}
    users = torch.tensor([10, 0, 4, 4, 7])
    pairwise = backbone.server_pair_scores(params, users, torch.arange(13).expand(5, -1))
    for chunk in (256, 2):
        torch.testing.assert_close(backbone.server_scores(params, users, chunk=chunk), pairwise, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("kind,hidden", [("neumf", (64, 32, 16)), ("ncf", (7, 5))])
def test_server_scores_do_not_depend_on_the_chunk(kind, hidden):
    """Users are scored ``chunk`` at a time, each alone: every chunk size gives the same logits
    (float64; a chunk of a few users may take another GEMM kernel, so not always bit for bit)."""
    backbone = Backbone(kind, 150, 90, dim=32 if kind == "neumf" else 4, hidden=hidden)
    g = torch.Generator().manual_seed(5)
    params = {n: v + 0.3 * torch.randn(v.shape, generator=g, dtype=torch.float64)
              for n, v in backbone.init_server(torch.Generator().manual_seed(4), dtype=torch.float64).items()}
    users = torch.randperm(150, generator=g)[:130]
    whole = backbone.server_scores(params, users, chunk=1000)  # one chunk
    assert whole.dtype == torch.float64 and whole.shape == (130, 90)
    for chunk in (1, 7, 64):
        torch.testing.assert_close(backbone.server_scores(params, users, chunk=chunk), whole, rtol=0, atol=1e-10,
                                   msg=f"chunk {chunk}")


def test_backbone_arguments_are_checked():
    with pytest.raises(ValueError, match="backbone kind"):
        Backbone("gru", 2, 3)
    with pytest.raises(ValueError, match="MLP tower"):
        Backbone("ncf", 2, 3)
    with pytest.raises(ValueError, match="item_init"):
        Backbone("ncf", 2, 3, dim=4, hidden=(4,)).init_server(torch.Generator(), item_init=torch.zeros(3, 5))
    assert paper_hidden("ncf", "ml-100k") == (128, 64) and paper_hidden("ncf", "ml-1m") == (64, 128, 64)


# ---------------------------------------------------------------------------- local data
def test_local_examples_layout(split):
    clients = np.array([2, 5, 9])
    sampler = NegativeSampler(split.train, split.num_items)
    aux = np.array([[split.train.items_of(2)[0], 7, -1], [-1, -1, -1], [11, 11, 12]])
    aux_labels = np.full(aux.shape, 0.3, dtype=np.float32)
    data = local_examples(split.train, clients, split.num_items, sampler, 4, np.random.default_rng(0), aux, aux_labels)
    assert list(data.counts) == sorted(data.counts, reverse=True)
    for row, user in enumerate(data.clients):
        real = data.mask[row] > 0
        items, labels = data.items[row][real].numpy(), data.labels[row][real].numpy()
        private = data.private[row][real].numpy()
        positives = set(split.train.items_of(user).tolist())
        assert set(items[(labels == 1) & private].tolist()) == positives
        negatives = items[(labels == 0) & private]
        assert negatives.size == 4 * len(positives) and not set(negatives.tolist()) & positives
        aux_items = items[~private]
        assert not set(aux_items.tolist()) & set(items[private].tolist())  # D̃ ranges over Ṽ \ V
        # local rows point at the same items
        assert np.array_equal(data.row_items[row][data.rows[row][real]].numpy(), items)
        own_rows = data.own[row].nonzero().view(-1)
        assert set(data.row_items[row][own_rows].tolist()) == positives
    user2 = list(data.clients).index(2)
    assert (data.private[user2] == 0).logical_and(data.mask[user2] > 0).sum() == 1  # only item 7 survives


@pytest.mark.parametrize("kind", ["neumf", "ncf", "lightgcn"])
def test_local_predictions_equal_the_padded_computation(kind):
    # heavy-tailed client sizes, so the groups really are narrower than the round's widest client
    rng = np.random.default_rng(1)
    sizes = np.r_[40, 35, 30, np.full(67, 5)]  # (70,) ratings per user
    users = np.repeat(np.arange(70), sizes)
    items = np.concatenate([rng.choice(90, n, replace=False) for n in sizes])
    train = Pairs.from_arrays(users, items, 70)
    backbone = Backbone(kind, 70, 90, dim=6, hidden=(8, 4) if kind != "lightgcn" else ())
    state = backbone.client_copies(backbone.init_server(torch.Generator().manual_seed(3)), torch.arange(70))
    for name in state:  # clients that have trained: no two alike
        state[name] = state[name] + 0.1 * torch.randn(state[name].shape, generator=torch.Generator().manual_seed(4))
    data = local_examples(train, np.arange(50), 90, NegativeSampler(train, 90), 4, rng)
    local = gather_local(backbone, state, data)
    assert data.counts[0] > 3 * data.counts[10]
    padded = torch.sigmoid(backbone.client_logits(local, data.rows, data.own)) * data.mask
    grouped = local_predictions(backbone, local, data, group_size=8)
    assert (grouped[data.mask == 0] == 0).all()
    # a narrower batch may take another GEMM kernel: equal up to about one float32 ulp at 0.5
    torch.testing.assert_close(grouped, padded, rtol=0, atol=2e-7)


def test_sample_mix_swap():
    c, length = 2, 40
    labels = torch.zeros(c, length)
    labels[:, :20] = 1.0
    private = torch.ones(c, length, dtype=torch.bool)
    private[:, 36:] = False  # auxiliary items
    mask = torch.ones(c, length)
    mask[1, 30:] = 0
    from fedlib.papers.fedkdrec.clients import LocalData
    data = LocalData(clients=np.array([0, 1]), items=torch.arange(length).expand(c, -1), rows=torch.arange(length).expand(c, -1),
                     row_items=torch.arange(length).expand(c, -1), row_mask=mask, labels=labels, private=private,
                     mask=mask, counts=np.array([40, 30]), own=labels)
    predictions = torch.rand(c, length, generator=torch.Generator().manual_seed(0))
    config = FedKDRecConfig(beta_range=(0.5, 0.5), swap_ratio=0.2)
    uploads = prepare_uploads(data, predictions, config, np.random.default_rng(0))
    assert uploads.keep.sum(1).tolist() == [20, 15]
    assert not bool((uploads.keep & (mask == 0)).any())
    mixed = torch.where(private, 0.5 * labels + 0.5 * predictions, predictions)
    unchanged = uploads.keep & ~uploads.swapped
    assert torch.allclose(uploads.labels[unchanged], mixed[unchanged])
    for row in range(c):
        kept_pos = (uploads.keep[row] & private[row] & (labels[row] == 1)).sum()
        kept_neg = (uploads.keep[row] & private[row] & (labels[row] == 0)).sum()
        k = min(int(math.floor(0.2 * kept_pos)), int(kept_neg))
        swapped = uploads.swapped[row]
        assert int((swapped & (labels[row] == 1)).sum()) == k == int((swapped & (labels[row] == 0)).sum())
        # the swapped values are the same multiset: positives now carry negatives' labels
        assert torch.allclose(uploads.labels[row][swapped].sort().values, mixed[row][swapped].sort().values)
        if k:
            top_pos = mixed[row].masked_fill(~(uploads.keep[row] & private[row] & (labels[row] == 1)), -1).topk(k).indices
            assert bool(swapped[top_pos].all())
            assert float(uploads.labels[row][top_pos].max()) <= 0.5  # they now look negative
    plain = prepare_uploads(data, predictions, dataclasses.replace(config, mix=False, swap_ratio=0.0),
                            np.random.default_rng(0))
    assert torch.allclose(plain.labels[plain.keep], predictions[plain.keep])


def test_mixed_label_bce_equals_the_split_kd_loss_with_equal_gradients():
    logits = torch.randn(50, requires_grad=True)
    hard = (torch.rand(50) > 0.5).float()
    teacher = torch.rand(50)
    mixed, split_loss = mixed_label_bce(logits, hard, teacher, 0.3)
    assert torch.allclose(mixed, split_loss, atol=1e-6)
    g1, = torch.autograd.grad(mixed, logits, retain_graph=True)
    g2, = torch.autograd.grad(split_loss, logits)
    assert torch.allclose(g1, g2, atol=1e-7)


# ---------------------------------------------------------------------------- agents
def test_zscore_and_shaped_rewards_by_hand():
    assert torch.allclose(A.zscore(torch.tensor([1.0, 3.0])), torch.tensor([-1.0, 1.0]), atol=1e-6)
    assert A.zscore(torch.tensor([5.0])).tolist() == [0.0]
    reward = torch.tensor([2.0])
    actions = torch.tensor([[1.0, 0.0, 1.0, 0.0]])
    valid = torch.tensor([[1.0, 1.0, 1.0, 0.0]])
    shaped = A.shaped_rewards(reward, actions, valid, rho=4.0)
    # |S| = 3: positions 1, 2, 3 -> factors 1/12, 2/12, 3/12 of |R| = 2
    assert torch.allclose(shaped, torch.tensor([[2 - 2 / 12, 2 + 4 / 12, 2 - 6 / 12, 0.0]]))


def test_td_losses_by_hand():
    values = torch.tensor([[0.5, 0.2, 0.9]])
    rewards = torch.tensor([[1.0, 0.0, 2.0]])
    log_probs = torch.log(torch.tensor([[0.5, 0.25, 0.9]]))
    valid = torch.tensor([[1.0, 1.0, 0.0]])
    critic, actor = A.td_losses(values, rewards, log_probs, valid, gamma=0.5)
    delta = torch.tensor([1.0 + 0.5 * 0.2 - 0.5, 0.0 + 0.0 - 0.2])  # V after the last valid state is 0
    assert torch.allclose(critic, delta.pow(2).mean())
    assert torch.allclose(actor, -(log_probs[0, :2] * delta).mean())


def test_teacher_agent_learns_to_weigh_rewarded_clients_up():
    agent = A.TeacherWeightAgent(lr=0.05, generator=torch.Generator().manual_seed(0))
    states = agent.states(torch.tensor([10.0, 50.0, 30.0]), torch.tensor([0.2, 0.5, 0.4]),
                          torch.tensor([0.1, 0.2, 0.1]), torch.tensor([0.7, 0.3, 0.5]))
    rewards = A.zscore(torch.tensor([-0.7, -0.3, -0.5]))
    before = agent.weights(states)
    for _ in range(50):
        agent.update(states, rewards)
    after = agent.weights(states)
    assert after[1] > before[1] and after[1] > 0.5 and torch.isclose(after.sum(), torch.tensor(1.0))
    with pytest.raises(ValueError, match="subset"):
        A.TeacherWeightAgent(features=("volume", "age"))
    assert A.TeacherWeightAgent(features=("volume",)).net[0].in_features == 1


def test_transfer_agent_never_selects_invalid_states_and_counts():
    agent = A.TransferAgent(state_dim=5, mu=4, generator=torch.Generator().manual_seed(0))
    base = torch.randn(3, 4, 4)
    valid = torch.tensor([[1.0, 1, 1, 1], [1, 1, 0, 0], [0, 0, 0, 0]])
    states, actions = agent.act(base, valid, torch.Generator().manual_seed(0))
    assert bool((actions * (1 - valid) == 0).all())
    counts_seen = states[..., -1] * agent.mu
    assert torch.allclose(counts_seen[:, 1:], torch.cumsum(actions, 1)[:, :-1])
    losses = agent.update(states, actions, valid, torch.tensor([1.0, -1.0, 0.0]))
    assert math.isfinite(losses["critic_loss"]) and math.isfinite(losses["actor_loss"])
    with pytest.raises(ValueError, match="mu >= 1"):
        A.TransferAgent(5, mu=0)


def test_reward_terms():
    a = torch.tensor([[1.0, 0.0, 2.0]])
    assert torch.allclose(A.diversity_reward(a, a, torch.tensor([True])), torch.zeros(1), atol=1e-7)
    assert A.diversity_reward(a, -a, torch.tensor([True])) > 0
    assert A.diversity_reward(a, -a, torch.tensor([False])) == 0
    labels = torch.tensor([[0.9, 0.1, 0.5]])
    assert torch.allclose(A.divergence_reward(labels, labels, torch.ones(1, 3)), torch.zeros(1), atol=1e-6)
    assert A.divergence_reward(labels, torch.tensor([[0.1, 0.9, 0.0]]), torch.ones(1, 3)) > 0.5


# ---------------------------------------------------------------------------- server-side selection
def test_confidence_selection_follows_ptf_fedrec(split):
    config = FedKDRecConfig(**small(transfer="confidence", mu=6))
    backbone = Backbone("neumf", split.num_users, split.num_items, 8, (16, 8))
    server = _Server(backbone, backbone.init_server(torch.Generator().manual_seed(0)), config, "cpu")
    server.last_items = torch.tensor([3, 4, 5, 6, 7])
    server.last_frequency = torch.zeros(split.num_items)
    server.last_frequency[torch.tensor([3, 4, 5, 6, 7])] = torch.tensor([1.0, 9.0, 5.0, 7.0, 2.0])
    clients = torch.tensor([0, 1])
    sent, labels, episode = server.select(clients, torch.tensor([10, 3]), torch.Generator())
    assert episode is None
    assert sent[0, :3].tolist() == [4, 6, 5]  # the 3 most uploaded items first
    assert int((sent[0] >= 0).sum()) == 6 and int((sent[1] >= 0).sum()) == 3  # capped by μ and |train|
    assert sent[1, 0].item() == 4
    for row in sent:
        real = row[row >= 0].tolist()
        assert len(real) == len(set(real))
    assert bool(((labels > 0) == (sent >= 0)).all())


@pytest.mark.parametrize("kind", ["neumf", "lightgcn"])
def test_batched_local_training_equals_one_adam_per_client_in_float64(kind):
    # the batched executor (groups of clients, one flat Adam block per group) against the plain
    # reference (one torch.optim.Adam per client), in float64, with weight decay, heavy-tailed
    # client sizes and groups narrower than the round (so prefixes and widths really vary)
    rng = np.random.default_rng(5)
    sizes = np.r_[30, 24, 17, 11, np.full(16, 4)]  # (20,) ratings per user
    users = np.repeat(np.arange(20), sizes)
    items = np.concatenate([rng.choice(60, n, replace=False) for n in sizes])
    train = Pairs.from_arrays(users, items, 20)
    backbone = Backbone(kind, 20, 60, dim=5, hidden=(6, 3) if kind != "lightgcn" else ())
    server = backbone.init_server(torch.Generator().manual_seed(6), dtype=torch.float64)
    state = backbone.client_copies(server, torch.arange(20))
    data = local_examples(train, np.arange(20), 60, NegativeSampler(train, 60), 3, rng)
    data = dataclasses.replace(data, **{f: getattr(data, f).double() for f in ("labels", "mask", "own", "row_mask")})
    orders = epoch_orders(data, 2, np.random.default_rng(7))
    trained = {}
    for name, run in (("batched", lambda *a: train_clients_batched(*a, group_size=6)),
                      ("sequential", train_clients_sequential)):
        local = gather_local(backbone, state, data)
        loss = run(backbone, local, data, orders, 8, 0.01, 1e-3)
        trained[name] = (loss, local)
    # the executors average the loss over different units (client-batches vs clients' batches)
    assert math.isfinite(trained["batched"][0]) and math.isfinite(trained["sequential"][0])
    rows = data.row_mask > 0
    for name, value in trained["sequential"][1].items():
        batched = trained["batched"][1][name]
        moved = (value - gather_local(backbone, state, data)[name]).abs().max()
        assert moved > 1e-3, name  # the comparison is not between two untrained models
        if name in backbone.embedding_names[1]:
            value, batched = value[rows], batched[rows]  # padding rows alias item 0: not trained
        torch.testing.assert_close(batched, value, rtol=0, atol=1e-6, msg=name)


def test_server_adam_equals_the_per_tensor_adam():
    # the server's fused Adam against the per-tensor torch.optim.Adam the recorded runs used, in
    # float64 (NeuMF: 12 tensors of many shapes, weight decay on), over steps whose moments matter
    config = FedKDRecConfig(**small(weight_decay=1e-2, server_lr=0.05))
    backbone = Backbone("neumf", 30, 40, config.dim, config.hidden)
    init = backbone.init_server(torch.Generator().manual_seed(2), dtype=torch.float64)
    server = _Server(backbone, init, config, "cpu")
    reference = {n: v.clone().requires_grad_() for n, v in init.items()}
    per_tensor = torch.optim.Adam(list(reference.values()), lr=config.server_lr, weight_decay=config.weight_decay,
                                  foreach=False)
    generator = torch.Generator().manual_seed(3)
    for _ in range(6):
        for name, value in server.params.items():
            value.grad = torch.randn(value.shape, generator=generator, dtype=torch.float64)
            reference[name].grad = value.grad.clone()
        server.optimizer.step()
        per_tensor.step()
    for name, value in server.params.items():
        assert (value - init[name]).abs().max() > 0.1, name  # moved well beyond the tolerance
        torch.testing.assert_close(value.detach(), reference[name].detach(), rtol=0, atol=1e-12, msg=name)


# ---------------------------------------------------------------------------- whole runs
@pytest.mark.parametrize("kind", ["neumf", "ncf", "lightgcn"])
def test_batched_and_sequential_executors_agree(split, kind):
    config = FedKDRecConfig(**small(backbone=kind, hidden=(16, 8) if kind != "lightgcn" else ()))
    runs = [train_fedkdrec(split, config, executor=e, device="cpu") for e in ("batched", "sequential")]
    states = [run.state for run in runs]
    for name in states[0].clients:
        assert torch.allclose(states[0].clients[name], states[1].clients[name], atol=2e-5), name
    for name in states[0].server.params:
        assert torch.allclose(states[0].server.params[name], states[1].server.params[name], atol=2e-5), name
    assert [h["sent_per_client"] for h in runs[0].history] == [h["sent_per_client"] for h in runs[1].history]


def test_fedkdrec_learns_on_planted_data_and_beats_random(split):
    users, candidates = split.valid.users, split.extra["valid_candidates"]

    def evaluate(round_index, scorer):
        metrics = candidate_set_metrics(scorer, users, candidates, ks=(10,), pair_fn=scorer.pairs)
        return float(metrics["HR@10"].mean())

    ledger = CommunicationLedger()
    config = FedKDRecConfig(**small(rounds=12, client_fraction=0.5, client_batch=32, client_lr=0.01, server_lr=0.01,
                                    eval_every=4))
    run = train_fedkdrec(split, config, evaluate=evaluate, ledger=ledger, device="cpu")
    assert run.selected_evaluation["valid/valid"] > 0.25  # random ranking of 1 + 99 gets HR@10 = 0.10
    assert run.method == "FedKDRec" and run.best_round in (4, 8, 12)
    assert run.history[0]["sent_per_client"] == 0  # nothing to send before the first uploads
    assert any(h["sent_per_client"] > 0 for h in run.history[1:])
    assert all(h["label_revealed"] > 0.8 for h in run.history)  # α = 0.5 gives the hard label away
    per_round_clients = round(0.5 * split.num_users)
    total_up = sum(h["uploaded_per_client"] for h in run.history) * per_round_clients * 8  # int32 id + float32 label
    total_down = sum(h["sent_per_client"] for h in run.history) * per_round_clients * 8
    assert ledger.total("upload") == pytest.approx(total_up, rel=1e-6)
    assert ledger.total("download") == pytest.approx(total_down, rel=1e-6)
    assert len(ledger.per_round()) == 2 * config.rounds  # one download and one upload row per round


def test_config_and_variants():
    with pytest.raises(ValueError, match="transfer must be one of"):
        FedKDRecConfig(transfer="random")
    with pytest.raises(ValueError, match="beta_range"):
        FedKDRecConfig(beta_range=(0.8, 0.2))
    with pytest.raises(ValueError, match="unknown FedKDRec variant"):
        variant_config("-x")
    assert variant_config("-m-c~s") == variant_config("PTF-FedRec")
    ptf = variant_config("PTF-FedRec")
    assert (ptf.mix, ptf.teacher_weights, ptf.transfer) == (False, "uniform", "confidence")
    assert variant_config("w/o BCE loss").teacher_features == ("volume", "statistics")
    assert set(VARIANTS) >= {"-m", "-c", "-s", "~s", "w/o R_i", "w/o R_i^s", "w/o R_i^l"}
    with pytest.raises(ValueError, match="executor"):
        train_fedkdrec(clustered_interactions(num_users=10, num_items=40), FedKDRecConfig(), executor="gpu")
