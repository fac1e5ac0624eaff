"""PriCDR, P2FCDR and P²DTR (fedlib.baselines.cross_domain.pricdr, p2fcdr, p2dtr over the shared pp_cdr base): each
defining mechanism on hand-made cases, then short training runs."""
import math

import numpy as np
import pytest
import torch

from fedlib.data.splits import Pairs
from fedlib.data.synthetic import overlapping_domains
from fedlib.engine.privacy import rdp_epsilon
from fedlib.baselines.cross_domain import p2dtr, p2fcdr, pricdr
from fedlib.baselines.cross_domain.cdr_common import audit_blocks, history_rows, selected_blocks


# ----------------------------------------------------------------------------- PriCDR, Eq. 1
def test_rating_matrix_marks_each_training_pair_once():
    pairs = Pairs.from_arrays([0, 0, 2, 2], [1, 3, 0, 0], num_users=3)
    dense = pricdr.rating_matrix(pairs, 3, 4).to_dense()
    assert torch.equal(dense, torch.tensor([[0., 1., 0., 1.], [0., 0., 0., 0.], [1., 0., 0., 0.]]))


def test_sparse_jl_rows_have_exactly_s_entries_and_unit_norm():
    matrix = pricdr.sparse_jl_matrix(500, 16, 4, torch.Generator().manual_seed(0))
    assert matrix.shape == (500, 16)
    assert torch.all((matrix != 0).sum(1) == 4)
    assert torch.allclose(matrix[matrix != 0].abs(), torch.full((2000,), 0.5))
    assert pricdr.projection_sensitivity(matrix) == pytest.approx(1.0)
    with pytest.raises(ValueError, match="nonzeros"):
        pricdr.sparse_jl_matrix(5, 4, 5, torch.Generator())


def test_gaussian_jl_preserves_norms_on_average_and_its_sensitivity_is_the_largest_row():
    matrix = pricdr.gaussian_jl_matrix(4000, 64, torch.Generator().manual_seed(1))
    assert matrix.pow(2).sum(1).mean().item() == pytest.approx(1.0, abs=0.02)  # E‖P_i‖² = 1
    assert pricdr.projection_sensitivity(matrix) == pytest.approx(matrix.norm(dim=1).max().item())
    assert pricdr.projection_sensitivity(matrix) > 1.2  # the worst row, not the typical one


def test_gaussian_noise_std_meets_the_stated_epsilon():
    std = pricdr.gaussian_noise_std(4.0, 1e-5, sensitivity=2.0)
    multiplier = std / 2.0
    certified = rdp_epsilon(multiplier, 1.0, 1, 1e-5)
    assert certified <= 4.0 and certified > 3.9  # the smallest noise that meets ε (1 % tolerance)
    # Twice the sensitivity needs twice the noise; a smaller ε needs more.
    assert pricdr.gaussian_noise_std(4.0, 1e-5, 1.0) == pytest.approx(std / 2)
    assert pricdr.gaussian_noise_std(1.0, 1e-5, 1.0) > pricdr.gaussian_noise_std(4.0, 1e-5, 1.0)
    with pytest.raises(ValueError, match="cannot certify"):
        pricdr.gaussian_noise_std(0.01, 1e-5, 1.0)


def _toy_split(**kwargs):
    defaults = dict(num_users=120, items_per_domain=80, overlap=0.5, interactions_per_user=10, num_negatives=30,
                    seed=3)
    return overlapping_domains(**{**defaults, **kwargs})


def test_published_matrix_has_user_rows_and_the_calibrated_noise():
    split = _toy_split(items_per_domain=400, num_users=400, interactions_per_user=20)
    part = split[split.domains[0]]
    release = pricdr.publish_rating_matrix(part, projection_dim=32, method="sjlt", sjlt_nonzeros=4, epsilon=2.0,
                                      delta=1e-5, generator=torch.Generator().manual_seed(0))
    assert release.values.shape == (part.num_users, 32)
    assert release.sensitivity == pytest.approx(1.0)
    assert release.noise_std == pytest.approx(pricdr.gaussian_noise_std(2.0, 1e-5, 1.0))
    signal = torch.sparse.mm(pricdr.rating_matrix(part.train, part.num_users, part.num_items), release.projection)
    residual = release.values - signal
    assert residual.mean().item() == pytest.approx(0.0, abs=0.05)
    assert residual.std().item() == pytest.approx(release.noise_std, rel=0.05)
    # The JL signal keeps each user's row norm: ‖R_u P‖² ≈ number of training items.
    counts = torch.as_tensor(part.train.counts(), dtype=torch.float32)
    assert (signal.pow(2).sum(1).mean() / counts.mean()).item() == pytest.approx(1.0, abs=0.1)
    plain = pricdr.publish_rating_matrix(part, projection_dim=32, generator=torch.Generator().manual_seed(0), dp=False)
    assert plain.noise_std == 0.0 and math.isinf(plain.epsilon)


def test_heterocdr_fuses_only_linked_users_and_aligns_them():
    config = pricdr.PriCDRConfig(dim=4, projection_dim=3, sjlt_nonzeros=2, dropout=0.0)
    published = torch.randn(6, 3, generator=torch.Generator().manual_seed(0))
    model = pricdr.HeteroCDR(5, 7, published, num_linked=2, config=config, generator=torch.Generator().manual_seed(0))
    model.eval()
    users = torch.tensor([0, 1, 2, 4])
    vectors = model.user_vectors(users)
    z = model.source_codes(torch.tensor([0, 1]))
    assert torch.allclose(vectors[:2], (model.user_emb[:2] + z) / 2)
    assert torch.equal(vectors[2:], model.user_emb[torch.tensor([2, 4])])
    expected = (z - model.user_emb[:2]).square().sum(-1).mean()
    assert torch.allclose(model.align_loss(users), expected)
    assert model.align_loss(torch.tensor([3, 4])).item() == 0.0
    with pytest.raises(ValueError, match="num_linked"):
        pricdr.HeteroCDR(5, 7, published, num_linked=0, config=config, generator=torch.Generator())


# ----------------------------------------------------------------------------- P2FCDR, Eqs. 3-7
def test_laplace_scale_matches_the_stated_epsilon_and_the_noise_has_it():
    assert p2fcdr.laplace_scale_for_epsilon(32.0, 1.0, 64) == pytest.approx(2 * 1.0 * 8 / 32)
    assert p2fcdr.P2FCDRConfig().laplace_scale == pytest.approx(0.5)
    assert p2fcdr.P2FCDRConfig(ldp=False).laplace_scale == 0.0
    zeros = torch.zeros(4000, 64, dtype=torch.float64)
    noisy = p2fcdr.ldp_message(zeros, 1.0, 0.5, torch.Generator().manual_seed(0))
    assert noisy.abs().mean().item() == pytest.approx(0.5, abs=0.01)  # E|Lap(b)| = b
    assert noisy.var().item() == pytest.approx(2 * 0.5 ** 2, rel=0.03)


def test_ldp_message_clips_before_the_noise():
    vectors = torch.tensor([[3.0, 4.0], [0.3, 0.4]])
    clipped = p2fcdr.ldp_message(vectors, 1.0, 0.0, torch.Generator())
    assert torch.allclose(clipped, torch.tensor([[0.6, 0.8], [0.3, 0.4]]))


def test_mapping_is_orthogonal_and_the_round_trip_is_the_identity():
    config = p2fcdr.P2FCDRConfig(dim=8)
    model = p2fcdr.P2FCDRDomain(10, 5, 4, config, torch.Generator().manual_seed(0))
    assert model.orthogonality_penalty().item() < 1e-10
    out = model.outgoing()  # (4, 8) p W
    assert torch.allclose(out.norm(dim=1), model.user_emb[:4].norm(dim=1), atol=1e-6)
    assert torch.allclose(out @ model.mapping.T, model.user_emb[:4], atol=1e-6)
    with torch.no_grad():
        model.mapping.mul_(2.0)
    assert model.orthogonality_penalty().item() == pytest.approx(8 * 3 ** 2, rel=1e-5)  # ‖4I − I‖²_F


def test_gate_lies_in_unit_interval_and_selects_between_the_two_views():
    config = p2fcdr.P2FCDRConfig(dim=4)
    model = p2fcdr.P2FCDRDomain(6, 3, 3, config, torch.Generator().manual_seed(0))
    own, received = torch.randn(50, 4) * 10, torch.randn(50, 4) * 10
    g = model.gate_values(own, received)
    assert torch.all((g >= 0) & (g <= 1))
    with torch.no_grad():
        model.gate.weight.zero_()
        model.gate.bias.fill_(0.0)
    assert torch.allclose(model.fuse(own, received), (own + received) / 2)  # g = 1/2
    with torch.no_grad():
        model.gate.bias.fill_(50.0)
    assert torch.allclose(model.fuse(own, received), own)  # g → 1: keep the in-domain embedding
    with torch.no_grad():
        model.gate.bias.fill_(-50.0)
    assert torch.allclose(model.fuse(own, received), received)


def test_only_linked_users_use_the_received_message():
    config = p2fcdr.P2FCDRConfig(dim=4)
    model = p2fcdr.P2FCDRDomain(6, 3, 3, config, torch.Generator().manual_seed(0))
    users = torch.tensor([0, 2, 3, 5])
    assert torch.equal(model.user_vectors(users), model.user_emb[users])  # nothing received yet
    model.receive(torch.ones(3, 4))
    vectors = model.user_vectors(users)
    incoming = torch.ones(2, 4) @ model.mapping.T
    assert torch.allclose(vectors[:2], model.fuse(model.user_emb[users[:2]], incoming))
    assert torch.equal(vectors[2:], model.user_emb[users[2:]])
    with pytest.raises(ValueError, match="message must be"):
        model.receive(torch.ones(2, 4))


# ----------------------------------------------------------------------------- P²DTR, PSI and Eqs. 8-10
def test_psi_finds_exactly_the_intersection_in_a_common_order():
    ids_a = ["ann", "bob", "cat", "dan", "eve"]
    ids_b = ["zed", "eve", "bob", "yan", "ann", "xi"]
    rows_a, rows_b = p2dtr.private_set_intersection(ids_a, ids_b, b"secret")
    assert sorted(ids_a[r] for r in rows_a) == ["ann", "bob", "eve"]
    assert [ids_a[r] for r in rows_a] == [ids_b[r] for r in rows_b]  # aligned row by row
    other_key = p2dtr.private_set_intersection(ids_a, ids_b, b"another key")
    assert sorted(other_key[0].tolist()) == sorted(rows_a.tolist())
    empty = p2dtr.private_set_intersection(["a"], ["b"], b"k")
    assert empty[0].size == empty[1].size == 0
    with pytest.raises(ValueError, match="unique"):
        p2dtr.private_set_intersection(["a", "a"], ["a"], b"k")


def test_psi_on_a_split_recovers_the_shared_users():
    split = _toy_split()
    a, b = split.domains
    rows_a, rows_b = p2dtr.private_set_intersection(p2dtr.user_identities(split, a), p2dtr.user_identities(split, b),
                                                    b"k")
    assert np.array_equal(rows_a, rows_b)
    assert np.array_equal(np.sort(rows_a), np.arange(split.num_overlap_users))


def test_clusters_are_matched_by_co_membership_and_prototypes_averaged():
    # Shared users: A puts {0,1} in 0, {2,3} in 1, {4} in 2; B calls the same groups 2, 0, 1.
    labels_a = torch.tensor([0, 0, 1, 1, 2])
    labels_b = torch.tensor([2, 2, 0, 0, 1])
    perm = p2dtr.match_clusters(labels_a, labels_b, 3)
    assert perm.tolist() == [2, 0, 1]
    protos_a = torch.tensor([[1.0, 0.0], [0.0, 1.0], [2.0, 2.0]])
    protos_b = torch.tensor([[0.0, 3.0], [4.0, 4.0], [3.0, 0.0]])
    g_a, g_b = p2dtr.average_prototypes(protos_a, protos_b, perm)
    assert torch.allclose(g_a, torch.tensor([[2.0, 0.0], [0.0, 2.0], [3.0, 3.0]]))
    assert torch.allclose(g_b[perm], g_a)  # B's cluster π(k) receives the same averaged prototype


def test_nearest_prototype_and_propagation():
    prototypes = torch.tensor([[0.0, 0.0], [10.0, 0.0]])
    assert p2dtr.nearest_prototype(torch.tensor([[1.0, 1.0], [8.0, -1.0]]), prototypes).tolist() == [0, 1]
    config = p2dtr.P2DTRConfig(dim=2, num_clusters=2, propagation_weight=0.25)
    model = p2dtr.P2DTRDomain(3, 2, config, torch.Generator().manual_seed(0))
    users = torch.tensor([0, 1, 2])
    assert torch.equal(model.user_vectors(users), model.user_emb)
    model.set_prototypes(prototypes, torch.tensor([1, 0, 1]))
    expected = 0.75 * model.user_emb + 0.25 * prototypes[torch.tensor([1, 0, 1])]
    assert torch.allclose(model.user_vectors(users), expected)


# ----------------------------------------------------------------------------- configs
def test_configs_reject_bad_values_with_the_field_name():
    with pytest.raises(ValueError, match="publish_method"):
        pricdr.PriCDRConfig(publish_method="svd")
    with pytest.raises(ValueError, match="epsilon"):
        pricdr.PriCDRConfig(epsilon=0.0)
    with pytest.raises(ValueError, match="delta"):
        pricdr.PriCDRConfig(delta=1.0)
    with pytest.raises(ValueError, match="sjlt_nonzeros"):
        pricdr.PriCDRConfig(projection_dim=4, sjlt_nonzeros=5)
    with pytest.raises(ValueError, match="P2FCDRConfig.batch_size"):
        p2fcdr.P2FCDRConfig(batch_size=0)
    with pytest.raises(ValueError, match="clip_norm"):
        p2fcdr.P2FCDRConfig(clip_norm=-1.0)
    with pytest.raises(ValueError, match="propagation_weight"):
        p2dtr.P2DTRConfig(propagation_weight=1.5)
    with pytest.raises(ValueError, match="select_on"):
        p2dtr.P2DTRConfig(select_on="train")
    with pytest.raises(ValueError, match="lr"):
        p2dtr.P2DTRConfig(lr=0.0)


def test_methods_need_two_domains_and_enough_shared_users():
    three = overlapping_domains(domains=("A", "B", "C"), num_users=60, items_per_domain=40, interactions_per_user=8,
                                num_negatives=20, seed=0)
    with pytest.raises(ValueError, match="exactly two domains"):
        p2fcdr.train_p2fcdr(three, p2fcdr.P2FCDRConfig(dim=4, epochs=1))
    with pytest.raises(ValueError, match="num_clusters"):
        p2dtr.train_p2dtr(_toy_split(), p2dtr.P2DTRConfig(dim=4, epochs=1, num_clusters=10_000))


# ----------------------------------------------------------------------------- training runs
SHORT = dict(dim=16, lr=0.01, batch_size=128, epochs=4, patience=4)
RUNS = {
    "PriCDR": (pricdr.train_pricdr, pricdr.PriCDRConfig(projection_dim=16, **SHORT)),
    "P2FCDR": (p2fcdr.train_p2fcdr, p2fcdr.P2FCDRConfig(**SHORT)),
    "P2DTR": (p2dtr.train_p2dtr, p2dtr.P2DTRConfig(num_clusters=4, **SHORT)),
}


@pytest.fixture(scope="module")
def short_split():
    torch.set_num_threads(1)
    return overlapping_domains(num_users=300, items_per_domain=150, overlap=0.5, num_negatives=99, seed=0)


@pytest.mark.parametrize("method", list(RUNS))
def test_short_run_beats_random_ranking_and_is_reproducible(short_split, method):
    train, config = RUNS[method]
    first = train(short_split, config)
    second = train(short_split, config)
    history, scalars = history_rows(first), first.artifacts["scalars"]
    assert first.method == method
    assert [row["round"] for row in history] == list(range(1, 5))
    best = max(row["valid/HR@10"] for row in history)
    assert best > 0.3  # random ranking of 1 + 99 candidates: HR@10 = 0.1
    assert set(selected_blocks(first)) == set(short_split.domains)
    assert history == [{**row, "seconds": a["seconds"]} for row, a in zip(history_rows(second), history)]
    assert selected_blocks(first) == selected_blocks(second)
    if method == "PriCDR":
        assert scalars["epsilon"] == 4.0 and scalars["delta"] == 1e-5
        for d in short_split.domains:
            assert scalars[f"{d}/epsilon_certified"] <= 4.0
            assert first.artifacts["published"][d].values.shape == (short_split[d].num_users, 16)
    else:
        n_o = short_split.num_overlap_users
        for d in short_split.domains:
            pair = first.artifacts["transmitted"][d]
            assert pair["sent"].shape == pair["private"].shape == (n_o, 16)
            assert torch.equal(pair["sent"], second.artifacts["transmitted"][d]["sent"])
    if method == "P2FCDR":
        assert scalars["epsilon_per_round"] == pytest.approx(32.0)
        assert scalars["epsilon_total"] == pytest.approx(32.0 * 4)
        d = short_split.domains[0]
        pair = first.artifacts["transmitted"][d]
        model = first.artifacts["models"][d]
        # What was sent is the clipped mapped private embedding plus Laplace noise of scale
        # b = 2C√d/ε = 2·1·4/32 (E|Lap(b)| = b; the map moved a little since it was sent).
        assert scalars["laplace_scale"] == pytest.approx(0.25)
        clean = p2fcdr.ldp_message(pair["private"] @ model.mapping.detach(), 1.0, 0.0, torch.Generator())
        assert (pair["sent"] - clean).abs().mean().item() == pytest.approx(0.25, rel=0.1)
    if method == "P2DTR":
        assert scalars["psi_matches_split"] == 1.0
        d = short_split.domains[0]
        pair = first.artifacts["transmitted"][d]
        # Every sent row is one of the K prototypes, and it is the mean of the users it summarises.
        prototypes = first.artifacts["prototypes"][d]
        assert torch.unique(pair["sent"], dim=0).shape[0] <= 4
        row = pair["sent"][0]
        members = (pair["sent"] == row).all(1)
        assert torch.allclose(pair["private"][members].mean(0), row, atol=1e-4)
        assert any(torch.allclose(row, p) for p in prototypes)


class _Killed(RuntimeError):
    pass


@pytest.mark.parametrize("method", list(RUNS))
def test_a_run_killed_after_a_checkpoint_resumes_to_the_uninterrupted_run(method, tmp_path):
    """The checkpoint holds the models (with P2FCDR's received message and P²DTR's prototypes),
    the optimisers, the epoch generator, the global torch generator (PriCDR's dropout), the LDP
    noise generator and the last messages: killed in round 3 and resumed = uninterrupted."""
    from fedlib.engine import Checkpointer

    torch.set_num_threads(1)
    split = overlapping_domains(num_users=120, items_per_domain=80, overlap=0.5, num_negatives=49, seed=2)
    train, config = RUNS[method]
    full = train(split, config)

    def kill_in_round_3(run, record):
        if run.round_index == 3:
            raise _Killed

    with pytest.raises(_Killed):
        train(split, config, checkpointer=Checkpointer(tmp_path, name=method, every=1), on_round_end=kill_in_round_3)
    checkpointer = Checkpointer(tmp_path, name=method, every=1)
    resumed = train(split, config, checkpointer=checkpointer)
    assert checkpointer.resumed_at == [2]
    strip = lambda run: [{k: v for k, v in row.items() if k != "seconds"} for row in history_rows(run)]
    assert strip(resumed) == strip(full)
    assert (selected_blocks(resumed), audit_blocks(resumed), resumed.artifacts["scalars"]) == \
        (selected_blocks(full), audit_blocks(full), full.artifacts["scalars"])
    for d in split.domains:
        for key, value in full.artifacts["models"][d].state_dict().items():
            assert torch.equal(value, resumed.artifacts["models"][d].state_dict()[key]), (d, key)
        if method != "PriCDR":
            assert torch.equal(full.artifacts["transmitted"][d]["sent"], resumed.artifacts["transmitted"][d]["sent"])
