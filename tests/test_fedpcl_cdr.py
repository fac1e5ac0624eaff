"""FedPCL-CDR (fedlib.papers.fedpcl_cdr.method, its prototype math in .prototypes): each equation on
hand-made cases, the two aggregation paths, what leaves a domain, and short runs."""
import math

import numpy as np
import pytest
import torch

from fedlib.data.synthetic import overlapping_domains
from fedlib.baselines.cross_domain.cdr_common import audit_blocks, history_rows, selected_blocks
from fedlib.baselines.cross_domain.user_clusters import cluster_users
from fedlib.papers.fedpcl_cdr import method as P
from fedlib.papers.fedpcl_cdr import prototypes as M
from engine_toys import assert_steps_like_per_tensor_adam


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """One intra-op thread: the models here are tiny, and a second thread only contends with
    other work for the CPU (a 2-round run takes about 1 s with one thread, a minute with two on a busy machine)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def _upload(prototypes, overlap_cluster):
    """The representative upload of all ``(K, D)`` prototypes of a domain."""
    prototypes = torch.as_tensor(prototypes, dtype=torch.float64)
    labels = torch.as_tensor(overlap_cluster, dtype=torch.int64)
    return M.DomainUpload.representative(prototypes, labels, torch.bincount(labels, minlength=prototypes.shape[0]))


def _server_and_domains(full_prototypes, labels):
    """Representative uploads -> server -> each domain completes with its own prototypes."""
    uploads = [_upload(p, l) for p, l in zip(full_prototypes, labels)]
    sent = M.aggregate_prototypes(uploads)
    return uploads, sent, [M.complete_prototypes(s, torch.as_tensor(p, dtype=torch.float64), i)
                           for i, (s, p) in enumerate(zip(sent, full_prototypes))]


# ----------------------------------------------------------------------------- Eq. 5
def test_clip_bounds_every_row_and_keeps_short_rows():
    vectors = torch.tensor([[3.0, 4.0], [0.06, 0.08], [0.0, 0.0], [-1.0, 0.0]])
    clipped = M.clip_to_norm(vectors, 0.2)
    assert torch.all(clipped.norm(dim=1) <= 0.2 + 1e-7)
    assert torch.allclose(clipped[0], torch.tensor([0.12, 0.16]))  # direction kept, norm = β
    assert torch.equal(clipped[1], vectors[1])  # already inside the ball: unchanged
    assert torch.equal(clipped[2], vectors[2])


def test_laplace_noise_has_the_stated_scale_and_budget():
    centroids = torch.zeros(2000, 64, dtype=torch.float64)
    noisy = M.differential_prototypes(centroids, 0.2, 0.1, torch.Generator().manual_seed(0))
    # Laplace(0, b): E|x| = b and Var x = 2 b².
    assert abs(noisy.abs().mean().item() - 0.1) < 0.002
    assert abs(noisy.var().item() - 2 * 0.1 ** 2) < 0.001
    budget = M.privacy_budget(0.2, 0.1, 64)
    assert budget["paper_epsilon"] == pytest.approx(4.0)
    assert budget["mechanism_epsilon"] == pytest.approx(2 * 0.2 * 8 / 0.1)
    assert M.privacy_budget(0.2, 0.0, 64)["paper_epsilon"] == math.inf


def test_without_ldp_the_upload_is_the_clipped_centroid():
    centroids = torch.tensor([[1.0, 0.0], [0.01, 0.0]])
    out = M.differential_prototypes(centroids, 0.2, 0.1, torch.Generator().manual_seed(0), ldp=False)
    assert torch.allclose(out, torch.tensor([[0.2, 0.0], [0.01, 0.0]]))


# ----------------------------------------------------------------------------- Eqs. 12-14
def test_global_prototype_is_the_mean_of_linked_clusters_and_local_the_most_similar():
    # Two domains, K = 3, four overlapping users.
    # Domain A: users 0, 1 in cluster 0; users 2, 3 in cluster 1; cluster 2 has no overlapping user.
    # Domain B: user 0 in cluster 0, user 1 in cluster 2, users 2, 3 in cluster 1.
    a_all = torch.tensor([[1.0, 0.0], [0.0, 1.0], [5.0, 5.0]], dtype=torch.float64)
    b_all = torch.tensor([[0.0, 2.0], [1.0, 1.0], [3.0, 0.1]], dtype=torch.float64)
    (a, b), (sent_a, sent_b), (server_a, server_b) = _server_and_domains([a_all, b_all], [[0, 0, 1, 1], [0, 2, 1, 1]])
    # A's cluster 0 links to A0 and to B0, B2: g = mean(A0, B0, B2).
    expected = (a_all[0] + b_all[0] + b_all[2]) / 3
    assert torch.allclose(server_a.global_prototypes[0], expected)
    # A's cluster 1 links to A1 and B1.
    assert torch.allclose(server_a.global_prototypes[1], (a_all[1] + b_all[1]) / 2)
    # No overlapping user: never sent, so A fills it in itself: own prototype, one local slot (own domain).
    assert a.cluster_ids.tolist() == [0, 1] and sent_a.cluster_ids.tolist() == [0, 1]
    assert torch.allclose(server_a.global_prototypes[2], a_all[2])
    assert server_a.local_mask[2].tolist() == [True, False]
    # Local prototypes of A0: own slot A0; in B the candidate closer in cosine to (1, 0) is B2 = (3, 0.1).
    assert torch.allclose(server_a.local_prototypes[0, 0], a_all[0])
    assert torch.allclose(server_a.local_prototypes[0, 1], b_all[2])
    # B's cluster 0 (user 0) links to A0 only: g = mean(B0, A0).
    assert torch.allclose(server_b.global_prototypes[0], (b_all[0] + a_all[0]) / 2)


def test_representative_uploads_give_what_the_code_computes_from_all_prototypes():
    """The code's server reads all K prototypes; ours gets only the representative ones, yet
    every domain ends with the same global and local prototypes (so training is unchanged)."""
    gen = torch.Generator().manual_seed(3)
    for num_domains in (2, 3):
        full = [torch.randn(6, 5, generator=gen, dtype=torch.float64) for _ in range(num_domains)]
        labels = [torch.randint(0, 6, (40,), generator=gen) for _ in range(num_domains)]
        # Leave clusters of domains 0 and 1 without overlapping users.
        labels[0] = torch.where(labels[0] == 5, 0, labels[0])
        labels[1] = torch.where(labels[1] >= 4, 1, labels[1])
        _, _, ours = _server_and_domains(full, labels)
        for mine, code in zip(ours, M.aggregate_prototypes_reference(full, labels)):
            assert torch.equal(mine.local_mask, code.local_mask)
            assert torch.allclose(mine.global_prototypes, code.global_prototypes)
            assert torch.allclose(mine.local_prototypes, code.local_prototypes)


def test_non_representative_prototypes_never_leave_a_domain():
    full = [torch.randn(5, 4, dtype=torch.float64), torch.randn(5, 4, dtype=torch.float64)]
    labels = [torch.tensor([0, 0, 3, 3]), torch.tensor([1, 4, 4, 1])]  # A: clusters 1, 2, 4 hold no overlapping user
    uploads, sent, _ = _server_and_domains(full, labels)
    a = uploads[0]
    assert a.cluster_ids.tolist() == [0, 3] and a.prototypes.shape == (2, 4) and a.cluster_sizes.tolist() == [2, 2]
    sent_rows = {tuple(row.tolist()) for u in uploads for row in u.prototypes}
    for k in (1, 2, 4):
        assert tuple(full[0][k].tolist()) not in sent_rows
    # The server's reply covers the representative clusters only, and its bytes count nothing else.
    assert sent[0].cluster_ids.tolist() == [0, 3] and sent[0].global_prototypes.shape == (2, 4)
    assert a.nbytes() == 2 * 4 * 8 + 4 * 8 + 2 * 8
    # Changing a prototype that stays home changes nothing the server computes.
    moved = [full[0].clone(), full[1]]
    moved[0][[1, 2, 4]] += 100.0
    _, sent_moved, _ = _server_and_domains(moved, labels)
    for before, after in zip(sent, sent_moved):
        assert torch.equal(before.global_prototypes, after.global_prototypes)
        assert torch.equal(before.local_prototypes, after.local_prototypes)
    with pytest.raises(ValueError, match="one prototype and one size per representative cluster"):
        M.DomainUpload(full[0], labels[0], torch.ones(5, dtype=torch.int64), 5)


def test_training_never_sends_a_cluster_without_overlapping_users():
    # Few overlapping users and many clusters: some clusters of each domain hold none.
    split = overlapping_domains(num_users=240, items_per_domain=150, overlap=0.04, num_negatives=30, seed=0)
    config = P.FedPCLConfig(dim=16, num_clusters=8, batch_size=128, rounds=2, patience=2)
    result = P.train_fedpcl_cdr(split, config)
    n_o = split.num_overlap_users
    kept_home = 0
    for index, (name, upload) in enumerate(zip(split.domains, result.artifacts["uploads"])):
        assignment = result.artifacts["assignments"][name]
        holding = set(assignment[:n_o].tolist())
        assert upload.cluster_ids.tolist() == sorted(holding)
        kept_home += config.num_clusters - len(holding)
        # The attack only sees users whose cluster was sent.
        pairs = result.artifacts["transmitted"][name]
        assert set(assignment[pairs["users"]].tolist()) == holding
        assert pairs["sent"].shape[0] == int(np.isin(assignment.numpy(), sorted(holding)).sum())
        # The domain still trains with a prototype for every cluster: its own for the unsent ones.
        used = result.artifacts["domain_prototypes"][name]
        assert used.global_prototypes.shape[0] == config.num_clusters and used.local_mask.any(1).all()
        assert result.artifacts["prototypes"][index].global_prototypes.shape[0] == len(holding)
    assert kept_home > 0  # the case this test is about did occur


def test_aggregation_rejects_mismatched_uploads():
    with pytest.raises(ValueError, match="at least two domains"):
        M.aggregate_prototypes([_upload(torch.zeros(2, 2), [0])])
    with pytest.raises(ValueError, match="same"):
        M.aggregate_prototypes([_upload(torch.zeros(2, 2), [0]), _upload(torch.zeros(3, 2), [0])])


# ----------------------------------------------------------------------------- Eqs. 7-9
def test_global_infonce_is_lower_for_the_correct_cluster_and_matches_the_formula():
    prototypes = torch.tensor([[1.0, 0.0], [0.0, 1.0], [-1.0, 0.0]], dtype=torch.float64)
    user = torch.tensor([[0.9, 0.1]], dtype=torch.float64)
    right = M.global_prototype_loss(user, torch.tensor([0]), prototypes, 0.2)
    wrong = M.global_prototype_loss(user, torch.tensor([1]), prototypes, 0.2)
    assert right < wrong
    cos = torch.nn.functional.cosine_similarity(user, prototypes) / 0.2
    assert right.item() == pytest.approx(-(cos[0] - torch.logsumexp(cos, 0)).item(), rel=1e-6)


def test_local_infonce_is_lower_for_the_correct_cluster_and_matches_the_reference():
    local = torch.tensor([[[1.0, 0.0], [0.9, 0.2]], [[0.0, 1.0], [0.1, 1.0]], [[-1.0, 0.0], [0.0, 0.0]]])
    mask = torch.tensor([[True, True], [True, True], [True, False]])
    user = torch.tensor([[1.0, 0.05]])
    right = M.local_prototype_loss(user, torch.tensor([0]), local, mask, 0.2)
    wrong = M.local_prototype_loss(user, torch.tensor([1]), local, mask, 0.2)
    assert right < wrong
    gen = torch.Generator().manual_seed(1)
    users = torch.randn(7, 4, generator=gen, dtype=torch.float64)
    clusters = torch.randint(0, 3, (7,), generator=gen)
    protos = torch.randn(3, 2, 4, generator=gen, dtype=torch.float64)
    mask = torch.tensor([[True, True], [True, False], [False, True]])
    fast = M.local_prototype_loss(users, clusters, protos, mask, 0.2)
    slow = M.local_prototype_loss_reference(users, clusters, protos, mask, 0.2)
    assert fast.item() == pytest.approx(slow.item(), rel=1e-10)


def test_cl_losses_pull_the_user_towards_its_prototype():
    prototypes = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
    user = torch.tensor([[0.5, 0.5]], requires_grad=True)
    M.global_prototype_loss(user, torch.tensor([0]), prototypes, 0.2).backward()
    step = user.detach() - 0.1 * user.grad
    cos = torch.nn.functional.cosine_similarity(step, prototypes)
    assert cos[0] > cos[1]


# ----------------------------------------------------------------------------- model and k-means
def _toy_split(seed=0):
    return overlapping_domains(num_users=120, items_per_domain=80, overlap=0.5, interactions_per_user=10,
                               num_negatives=30, seed=seed)


def test_domain_model_shapes_for_both_layer_combinations_and_reviews():
    split = _toy_split()
    part = split[split.domains[0]]
    for combine, width in (("sum", 8), ("concat", 4 * 8)):
        model = P.DomainModel(part, P.FedPCLConfig(dim=8, layer_combine=combine)).eval()
        users, items = model.propagate()
        assert users.shape == (part.num_users, width) and items.shape == (part.num_items, width)
        scores = model.score_candidates(torch.tensor([0, 1]), torch.tensor([[0, 1, 2], [3, 4, 5]]))
        assert scores.shape == (2, 3)
    reviews = (torch.randn(part.num_users, 6), torch.randn(part.num_items, 6))
    model = P.DomainModel(part, P.FedPCLConfig(dim=8), review_users=reviews[0], review_items=reviews[1])
    users, _ = model.propagate()
    assert users.shape == (part.num_users, 8)
    assert not model.review_users.requires_grad  # frozen, as the paper's Doc2Vec vectors
    with pytest.raises(ValueError, match="rows"):
        P.DomainModel(part, P.FedPCLConfig(dim=8), review_users=reviews[0][:-1], review_items=reviews[1])


def test_kmeans_clusters_every_user_and_rejects_too_few_points():
    vectors = torch.cat([torch.randn(30, 3) * 0.01 + c for c in (0.0, 5.0, -5.0)])
    centroids, assignment = cluster_users(vectors, 3, seed=0)
    assert centroids.shape == (3, 3) and assignment.shape == (90,)
    assert len(set(assignment[:30].tolist())) == 1 and len(set(assignment.tolist())) == 3
    with pytest.raises(ValueError, match="distinct"):
        cluster_users(torch.zeros(20, 2), 3)


def test_config_and_variant_errors_are_explicit():
    with pytest.raises(ValueError, match="layer_combine"):
        P.FedPCLConfig(layer_combine="mean")
    with pytest.raises(ValueError, match="selection"):
        P.FedPCLConfig(selection="train")
    with pytest.raises(ValueError, match="unknown FedPCL-CDR variant"):
        P.variant_config("w/o everything")
    assert P.variant_config("w/o LDP").ldp is False
    assert P.variant_config("w/o loc-proto").use_local is False and P.variant_config("w/o loc-proto").use_global


# ----------------------------------------------------------------------------- the round loop
@pytest.fixture(scope="module")
def short_run():
    split = overlapping_domains(num_users=240, items_per_domain=150, overlap=0.5, seed=0)
    config = P.FedPCLConfig(dim=16, num_clusters=4, batch_size=128, rounds=6, patience=6)
    return split, P.train_fedpcl_cdr(split, config)


def test_training_learns_and_records_every_round(short_run):
    split, result = short_run
    history = history_rows(result)
    rounds = [row["round"] for row in history]
    assert rounds == list(range(1, 7))
    first, best = history[0]["valid/HR@10"], max(row["valid/HR@10"] for row in history)
    assert best > first + 0.1 and best > 0.3  # random ranking of 1 + 99 gives HR@10 = 0.1
    # No prototypes before the first aggregation (Algorithm 1, line 13), CL terms afterwards.
    name = split.domains[0]
    assert history[0][f"{name}/loss_global"] == 0.0
    assert history[1][f"{name}/loss_global"] > 0.0 and history[1][f"{name}/loss_local"] > 0.0
    # Selection by validation: the reported round has the best mean validation HR@10.
    selected = max(history, key=lambda row: row["valid/HR@10"])
    assert result.best_round == selected["round"]
    # Bytes: K' x D float32 prototypes + one int64 label per overlapping user + K' sizes, per domain
    # (K' = representative clusters; cluster ids are the distinct labels, no bytes of their own).
    d, n_o = 16, split.num_overlap_users
    last = sum(len(u.cluster_ids) * (d * 4 + 8) + n_o * 8 for u in result.artifacts["uploads"])
    assert history[-1]["bytes_up"] == last
    assert result.artifacts["scalars"]["bytes_up"] == sum(row["bytes_up"] for row in history)
    assert result.artifacts["scalars"]["paper_epsilon"] == pytest.approx(4.0)
    # The reconstruction attack's pairs: each sent row is the noisy prototype of the user's cluster.
    pairs = result.artifacts["transmitted"][name]
    upload = result.artifacts["uploads"][0]
    assignment = result.artifacts["assignments"][name]
    assert pairs["sent"].shape == pairs["private"].shape == (len(pairs["users"]), d)
    first = int(upload.cluster_ids[0])
    row = int(torch.nonzero(assignment[pairs["users"]] == first)[0])
    assert torch.equal(pairs["sent"][row], upload.prototypes[0])


def test_selection_on_test_picks_the_best_test_round():
    split = _toy_split()
    config = P.FedPCLConfig(dim=8, num_clusters=3, batch_size=64, rounds=4, patience=4, selection="test")
    result = P.train_fedpcl_cdr(split, config)
    history = history_rows(result)
    assert len(history) == 4  # patience covers every round: all trained
    test_scores = [row["test/HR@10"] for row in history]
    best = history[int(np.argmax(test_scores))]["round"]  # first round with the best mean test HR@10
    assert result.best_round == result.audit_round == best
    assert selected_blocks(result) == audit_blocks(result)
    # the validation rule on the same training picks by validation instead
    valid = P.train_fedpcl_cdr(split, P.FedPCLConfig(dim=8, num_clusters=3, batch_size=64, rounds=4, patience=4))
    valid_history = history_rows(valid)
    assert [row["test/HR@10"] for row in valid_history] == test_scores  # selection does not change training
    assert valid.best_round == valid_history[int(np.argmax([r["valid/HR@10"] for r in valid_history]))]["round"]


def test_review_branch_learns_from_doc2vec_embeddings():
    """The review branch with real Doc2Vec vectors (of synthetic reviews): its projection gets
    a gradient and moves, and the frozen review vectors do not."""
    from fedlib.models.review_text import review_embeddings, synthetic_reviews

    split = _toy_split()
    reviews = {d: review_embeddings(split[d], synthetic_reviews(split[d], seed=1), dim=8, epochs=5)
               for d in split.domains}
    config = P.FedPCLConfig(dim=8, num_clusters=3, batch_size=64, rounds=1, patience=1, batches_per_round=2)
    before = P.DomainModel(split[split.domains[0]], config, review_users=reviews[split.domains[0]][0],
                           review_items=reviews[split.domains[0]][1],
                           generator=torch.Generator().manual_seed(config.seed * 1000))
    result = P.train_fedpcl_cdr(split, config, reviews=reviews)
    for index, name in enumerate(split.domains):
        model = result.artifacts["models"][name]
        assert model.has_reviews and model.review_proj is not None
        assert torch.equal(model.review_users, reviews[name][0].float())  # frozen
        assert model.review_proj.weight.grad is not None and model.review_proj.weight.grad.abs().sum() > 0
    start = before.review_proj.weight.detach()
    trained = result.artifacts["models"][split.domains[0]].review_proj.weight.detach()
    assert start.shape == trained.shape and not torch.allclose(start, trained)
    # the review part enters the representation: zeroing the projection changes the users' vectors
    model = result.artifacts["models"][split.domains[0]].eval()
    with torch.no_grad():
        users, _ = model.propagate()
        model.review_proj.weight.zero_()
        model.review_proj.bias.zero_()
        without, _ = model.propagate()
    assert not torch.allclose(users, without)


def test_test_selection_is_never_below_validation_selection(short_run):
    _, result = short_run
    mean_test = lambda metrics: np.mean([m["test/HR@10"] for m in metrics.values()])
    assert mean_test(audit_blocks(result)) >= mean_test(selected_blocks(result))


def test_a_run_is_reproducible_from_its_seed():
    split = _toy_split()
    config = P.FedPCLConfig(dim=8, num_clusters=3, batch_size=64, rounds=2)
    a = P.train_fedpcl_cdr(split, config)
    b = P.train_fedpcl_cdr(split, config)
    assert history_rows(a)[-1]["valid/HR@10"] == history_rows(b)[-1]["valid/HR@10"]
    assert torch.equal(a.artifacts["uploads"][0].prototypes, b.artifacts["uploads"][0].prototypes)


def test_csr_propagation_equals_lightgcn_sum_of_layers_with_gradients():
    from fedlib.models.lightgcn import lightgcn_propagate, normalized_adjacency

    part = _toy_split()[_toy_split().domains[0]]
    model = P.DomainModel(part, P.FedPCLConfig(dim=8))
    users, items = model.propagate()
    coo = normalized_adjacency(part.train, part.num_users, part.num_items)
    ref_u, ref_i = lightgcn_propagate(coo, model.user_emb, model.item_emb, 3, combine="sum")
    assert torch.allclose(users, ref_u, atol=1e-6) and torch.allclose(items, ref_i, atol=1e-6)
    grad = torch.autograd.grad(users.square().sum(), model.user_emb)[0]
    ref_grad = torch.autograd.grad(ref_u.square().sum(), model.user_emb)[0]
    assert torch.allclose(grad, ref_grad, atol=1e-5)


def test_summed_layers_have_the_bits_of_stack_and_sum():
    g = torch.Generator().manual_seed(3)
    layers = [torch.randn(50, 8, generator=g) * 10.0 ** k for k in range(4)]  # very different scales
    assert torch.equal(P._combine_layers(layers, "sum"), torch.stack(layers, 0).sum(0))
    assert torch.equal(P._combine_layers(layers, "concat"), torch.cat(layers, dim=-1))


class _Killed(RuntimeError):
    pass


def test_a_run_killed_after_a_checkpoint_resumes_to_the_uninterrupted_run(tmp_path):
    """Models, Adam, the batch and LDP-noise generators, the cluster labels, each domain's own
    and received prototypes, the last uploads and server messages, and the byte totals are in
    the checkpoint: killed in round 3 and resumed = uninterrupted. Loading rebuilds the
    messages as DomainPrototypes (round 3 trains with them), DomainUpload and ServerPrototypes
    (a finished run reloaded from its last checkpoint returns them as artifacts)."""
    from fedlib.engine import Checkpointer

    split = _toy_split()
    config = P.FedPCLConfig(dim=8, num_clusters=3, batch_size=64, rounds=4, patience=4)
    full = P.train_fedpcl_cdr(split, config)

    def kill_in_round_3(run, record):
        if run.round_index == 3:
            raise _Killed

    with pytest.raises(_Killed):
        P.train_fedpcl_cdr(split, config, checkpointer=Checkpointer(tmp_path, every=1), on_round_end=kill_in_round_3)
    checkpointer = Checkpointer(tmp_path, every=1)
    resumed = P.train_fedpcl_cdr(split, config, checkpointer=checkpointer)
    assert checkpointer.resumed_at == [2]
    reloaded = P.train_fedpcl_cdr(split, config, checkpointer=Checkpointer(tmp_path, every=1))  # nothing left to run
    strip = lambda run: [{k: v for k, v in row.items() if k != "seconds"} for row in history_rows(run)]
    assert history_rows(full)[1][f"{split.domains[0]}/loss_global"] > 0.0  # later rounds train with prototypes
    for run in (resumed, reloaded):
        assert strip(run) == strip(full)
        assert (selected_blocks(run), audit_blocks(run), run.best_round) == \
            (selected_blocks(full), audit_blocks(full), full.best_round)
        assert run.artifacts["scalars"] == full.artifacts["scalars"]
        for name in split.domains:
            for key, value in full.artifacts["models"][name].state_dict().items():
                assert torch.equal(value, run.artifacts["models"][name].state_dict()[key]), (name, key)
            assert torch.equal(full.artifacts["assignments"][name], run.artifacts["assignments"][name])
            assert isinstance(run.artifacts["domain_prototypes"][name], M.DomainPrototypes)
            assert torch.equal(full.artifacts["domain_prototypes"][name].local_prototypes,
                               run.artifacts["domain_prototypes"][name].local_prototypes)
        for ours, theirs in zip(run.artifacts["uploads"], full.artifacts["uploads"]):
            assert isinstance(ours, M.DomainUpload) and torch.equal(ours.prototypes, theirs.prototypes)
        for ours, theirs in zip(run.artifacts["prototypes"], full.artifacts["prototypes"]):
            assert isinstance(ours, M.ServerPrototypes) and torch.equal(ours.global_prototypes,
                                                                        theirs.global_prototypes)
        for name in split.domains:
            assert torch.equal(full.artifacts["transmitted"][name]["sent"], run.artifacts["transmitted"][name]["sent"])


def test_the_domain_optimiser_steps_like_the_per_tensor_adam_in_float64():
    """The domains' Adam (foreach) against the default per-tensor loop on copies of the same parameters."""
    split = overlapping_domains(num_users=60, items_per_domain=40, overlap=0.5, num_negatives=10, seed=0)
    config = P.FedPCLConfig(dim=4, num_layers=1)
    state = P.FedPCLAlgorithm(split, config, "cpu", ks=(5,)).init(0)
    params = list(state.models[0].double().parameters())
    assert_steps_like_per_tensor_adam(state.optimizers[0].step, params, config.lr, config.weight_decay)


def test_step_rows_from_the_node_table_equal_propagate_then_index_in_float64():
    """DomainModel.propagate_rows (one gather from the (U + I, D) table) against propagate() then
    indexing (propagate_rows_reference): the pairs' and anchors' vectors and both tables' gradients."""
    split = overlapping_domains(num_users=120, items_per_domain=90, overlap=0.5, num_negatives=20, seed=1)
    part = split[split.domains[0]]
    model = P.DomainModel(part, P.FedPCLConfig(dim=6)).double()
    g = torch.Generator().manual_seed(0)
    users = torch.randint(0, part.num_users, (40,), generator=g)  # repeats, as a batch's users
    items = torch.randint(0, part.num_items, (40,), generator=g)
    for anchors in (None, users[:25]):
        outputs = []
        for rows in (model.propagate_rows, model.propagate_rows_reference):
            model.zero_grad(set_to_none=True)
            user_vectors, item_vectors, anchor_vectors = rows(users, items, anchors)
            loss = (user_vectors * item_vectors).sum() + user_vectors.square().sum()
            if anchors is not None:
                loss = loss + anchor_vectors.pow(3).sum()
            else:
                assert anchor_vectors is None
            loss.backward()
            outputs.append([user_vectors.detach(), item_vectors.detach(), model.user_emb.grad, model.item_emb.grad]
                           + ([] if anchors is None else [anchor_vectors.detach()]))
        assert outputs[0][0].shape == (40, 6)
        for fast, reference in zip(*outputs):
            assert torch.allclose(fast, reference, rtol=0, atol=1e-6)
