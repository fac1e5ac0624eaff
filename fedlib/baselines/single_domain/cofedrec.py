r"""CoFedRec: co-clustering of items (K-Means) and users (per item category) plus supervised contrast.

Reference:
    He, Liu, Keung, He. "Co-clustering for Federated Recommender System" (CoFedRec).
    The ACM Web Conference (WWW) 2024. arXiv:2411.01690. No official code; the only public
    code is an unofficial fork (``tyanfarm/CoFedRec``) that mixes in GPFedRec's graph step, so
    this module follows the paper. FedRKG (Lim et al., arXiv:2511.12959, Table 1,
    Appendix C.2) runs it as a single-knowledge baseline "with
    the original paper's configuration"; on Amazon-Video with ``τ = 0.5``, regularisation
    ``10⁻²`` and 30 item clusters.

Notation: ``U`` users, ``I`` items, ``d`` dimensions; ``V_u (I, d)`` the item table of client
``u`` (the backbone's ``personal_item_emb``); ``(w_u, b_u)`` a private ``Linear(d → 1)`` score
head (θ_u); ``P`` the participants of a round; ``K`` item clusters. The backbone is PFedRec
(paper §4: "dual personalization", post-tuned item table + private score function)::

    r̂_ui   = σ(w_u · V_u[i] + b_u)                                          score (PFedRec)
    L_u    = −Σ_{(u,i)∈D_u} log r̂_ui − Σ_{(u,i')∈D_u⁻} log(1 − r̂_ui') + λ L_sup       Eq. 9
    L_sup  = −Σ_i log{ 1/|Z(i)| Σ_{z∈Z(i)} exp(v_i·v_z/τ) / Σ_{a≠i} exp(v_i·v_a/τ) }  supervised contrast
             Z(i) = {z ≠ i : M[z] = M[i]},  v_i = V_u[i] (normalised, see Assumptions)

Server, after the local training of round ``t − 1`` (Algorithm 1)::

    V_g    = 1/|P| Σ_{u∈P} V_u                                      global aggregation
    M      = KMeans_K({V_g[i]}_{i∈I})  ∈ {0..K−1}^I                  item membership
    c ~ U(P),  k ~ U(categories),  M_k = {i : M[i] = k}              core client, item category
    s_u    = Σ_{i∈M_k} cos(V_c[i], V_u[i])                          u ∈ P   (per-category similarity)
    sort s descending → s_(0) ≥ … ≥ s_(|P|−1); elbow e = argmax_j dist((j, s_(j)), chord (0,s_(0))–(|P|−1, s_(|P|−1)))
    D_s    = first e + 1 clients (similar group),  D_dis = the rest
    V_s    = 1/|D_s| Σ_{u∈D_s} V_u                                  group model
    send V_s and M to D_s (V_u ← V_s);  send M only to D_dis (they keep V_u)

The paper's equation numbers were not all recoverable from the sources available here (only
the local objective is known as Eq. 9); the server step is Algorithm 1 written out.

Dimensions and units: tables ``(U, I, d)`` float, membership ``(I,) int64`` in ``[0, K)``,
similarities ``(|P|,)`` in ``[−|M_k|, |M_k|]`` (sums of cosines), ``τ > 0`` (dimensionless).

Assumptions (where the paper is ambiguous; the choices that plausibly matter are options):

* **Where the tables live.** Similar-group clients download the group model, dissimilar ones
  keep their own table, so every client's ``V_u`` persists between rounds: it is a
  ``private_rows`` table (as in GPFedRec, :mod:`fedlib.baselines.single_domain.gpfedrec`) that the server step
  reads and writes in ``before_round`` (:class:`CoClusteringServer`). Participants of round
  ``t − 1`` are re-derived from ``(seed, t − 1)``
  (:func:`fedlib.engine.plan.guidance_participants`), exactly the engine's. The
  communication ledger sees no public tensor and counts nothing for CoFedRec.
* **Round 0** has no membership yet: the loss is plain BCE (as the fork: its placeholder
  labels switch the contrastive term off).
* **K-Means**: Lloyd's algorithm in torch (:func:`kmeans`), one k-means++ initialisation from
  the server's seeded draws, at most ``max_iter`` (100) iterations or until no assignment
  changes; an empty cluster keeps its centre. (The fork uses scikit-learn's ``KMeans``, with
  several initialisations depending on the version.)
* **Category draw**: uniform over the *non-empty* clusters; the core client uniform over ``P``.
* **Elbow and groups**: the similar group is the sorted prefix up to and including the elbow
  (ties sorted by user id); the core client is always in it. The orthogonal distance to a
  fixed chord is the vertical gap times a constant, so the elbow does not depend on how the
  two axes are scaled (no option needed).
* **Contrastive term** (options of :class:`CoFedRecLoss`):

  - ``variant="in"`` (default): the paper's form, log of the mean over positives;
    ``"out"``: mean of the logs (Khosla et al. 2020's ``L_out``, the SupCon reference code
    used by the fork);
  - ``normalize=True`` (default): ``v_i`` L2-normalised, as SupCon and the fork do (the
    paper writes raw dot products);
  - mean over anchors that have at least one positive (the paper writes a sum: the sum is
    ``I ×`` the mean, so rescale ``λ``; the fork also takes the mean, and its λ = 0.005);
  - ``contrastive_rows="table"`` (default): over every item of the client's table in every
    local step, as the paper's ``Σ_{i∈I}``: every item is added as a context row by
    :class:`~fedlib.baselines.continual.continual.PlanAugmentingExecutor` (run with it).
    ``"batch"``: over the batch's distinct items only (cheaper, an approximation).
* **Local update**: PFedRec's two steps per batch (head, then the item table; ``two_step``),
  learning rates ``lr`` (head) and ``lr × I × lr_eta`` (table). The fork steps both after one
  backward pass (``two_step=False``).
* **Evaluation** scores with each client's own table (similar-group clients: the group model
  after their local training).

CUDA: everything runs on the device of the training state (CUDA when present, see
:func:`fedlib.default_device`); the server's random draws come from a NumPy generator
seeded by ``(seed, round)``, so runs are reproducible and device-independent.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Mapping, Optional, Tuple

import numpy as np
import torch
import torch.nn.functional as F

from fedlib.data.splits import Pairs
from fedlib.engine.knowledge import global_knowledge
from fedlib.engine.method import FederatedMethod, LocalBatch, chain_hooks
from fedlib.engine.plan import RoundPlan, guidance_participants, round_generator
from fedlib.baselines.single_domain.gpfedrec import add_table_context, first_occurrence
from fedlib.models.base import FederatedModel
from fedlib.models.personal import PersonalItemTableModel
from fedlib.baselines.single_domain.seeded_kmeans import _check_positive_int, kmeans, kmeans_reference, pick, server_uniforms

__all__ = [
    "SUPCON_VARIANTS", "CONTRASTIVE_ROWS", "SERVER_STREAM", "MEMBERSHIP_KEY", "STATS_KEY",
    "server_uniforms", "kmeans", "kmeans_reference", "category_similarity", "elbow_split",
    "CoClusterResult", "co_cluster_step", "co_cluster_step_reference",
    "supcon_loss", "supcon_loss_dense", "supcon_loss_reference", "SUPCON_WIDTH_GROUPS", "supcon_chunk",
    "CoFedRecModel", "CoFedRecLoss", "CoClusteringServer", "cofedrec_method",
]

#: ``"in"``: the paper's ``−log(mean_z p_iz)``; ``"out"``: ``−mean_z log p_iz`` (SupCon's L_out).
SUPCON_VARIANTS = ("in", "out")
#: Rows the contrastive term covers: the client's whole table (paper) or the batch's items.
CONTRASTIVE_ROWS = ("table", "batch")
#: ``round_generator`` stream of the server's draws (0 = the round plan, 1 = noise keys).
SERVER_STREAM = 0xC0FE
#: ``AveragingState.extra`` keys: the last item membership ``(I,)``, a summary of the last server step.
MEMBERSHIP_KEY = "cofedrec_membership"
STATS_KEY = "cofedrec_server"

_KMEANS_BLOCK = 1 << 22  # values of one (items, K, d) block of squared differences


# ======================================================================================
# Input checks
# ======================================================================================
def _check_choice(name: str, value, choices) -> None:
    if value not in choices:
        raise ValueError(f"unknown {name} {value!r}: use one of {choices}")


def _check_nonnegative(name: str, value, what: str) -> float:
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a number >= 0 ({what}), got {value!r}") from None
    if not math.isfinite(number) or number < 0:
        raise ValueError(f"{name} must be a finite number >= 0 ({what}), got {value!r}")
    return number


def _check_temperature(temperature) -> float:
    value = _check_nonnegative("temperature", temperature, "the contrastive temperature τ; the paper uses 0.1-0.5")
    if value == 0:
        raise ValueError("temperature must be > 0 (it divides the similarities; the paper uses 0.1-0.5), got 0")
    return value


def _check_tables_and_participants(tables: torch.Tensor, participants) -> torch.Tensor:
    if tables.dim() != 3:
        raise ValueError(f"tables must be (U, I, d): one item table per user, got shape {tuple(tables.shape)}")
    if isinstance(participants, torch.Tensor):
        ids = participants.detach().to(device="cpu", dtype=torch.int64).flatten()
    else:
        ids = torch.as_tensor(np.asarray(participants, dtype=np.int64)).flatten()
    if ids.numel() == 0:
        raise ValueError("participants is empty: the server step needs at least one uploaded table")
    if int(ids.min()) < 0 or int(ids.max()) >= tables.shape[0]:
        raise ValueError(f"participants must be user ids in [0, {tables.shape[0]}), got ids from {int(ids.min())} "
                         f"to {int(ids.max())}")
    if torch.unique(ids).numel() != ids.numel():
        raise ValueError("participants contains duplicate user ids: each participant uploads its table once")
    return ids.to(tables.device)


# ======================================================================================
# Server: users grouped on one item category
# ======================================================================================
def category_similarity(tables: torch.Tensor, participants, core: int, members: torch.Tensor) -> torch.Tensor:
    """``s_u = Σ_{i∈M_k} cos(V_c[i], V_u[i])`` for every participant ``u``: ``(|P|,)``.

    Args:
        tables: ``(U, I, d)`` every user's item table.
        participants: ``(|P|,)`` user ids.
        core: user id of the core client ``c``.
        members: ``(m,)`` item ids of the category ``M_k``.

    A zero row has cosine 0 with everything.
    """
    ids = _check_tables_and_participants(tables, participants)
    members = torch.as_tensor(members, dtype=torch.int64, device=tables.device)
    rows = tables[ids[:, None], members[None, :]]  # (P, m, d)
    core_rows = tables[int(core)][members]  # (m, d)
    dots = torch.einsum("pmd,md->pm", rows, core_rows)  # (P, m)
    norms = rows.norm(dim=-1) * core_rows.norm(dim=-1)[None, :]  # (P, m)
    cos = torch.where(norms > 0, dots / torch.where(norms > 0, norms, torch.ones_like(norms)), torch.zeros_like(dots))
    return cos.sum(1)


def elbow_split(similarity: torch.Tensor) -> Tuple[torch.Tensor, int, torch.Tensor]:
    """Sort the similarities (descending, stable) and find the elbow of the sorted curve.

    The elbow is the point with the largest orthogonal distance to the chord through the
    first and last sorted points ``(0, s_(0))`` and ``(n − 1, s_(n−1))`` (the first one on ties).

    Args:
        similarity: ``(n,)`` ``s_u``.

    Returns:
        ``(order (n,), elbow e, distances (n,))``: ``order[:e + 1]`` are the positions of the
        similar group; ``distances[j]`` is the distance of the ``j``-th sorted point.
    """
    if similarity.dim() != 1 or similarity.numel() == 0:
        raise ValueError(f"similarity must be a non-empty 1-D tensor (one value per participant), "
                         f"got shape {tuple(similarity.shape)}")
    values, order = torch.sort(similarity, descending=True, stable=True)
    n = values.numel()
    if n < 3:
        return order, 0, torch.zeros_like(values)
    slope = (values[-1] - values[0]) / (n - 1)
    x = torch.arange(n, dtype=values.dtype, device=values.device)
    gap = values - (values[0] + slope * x)  # vertical gap to the chord
    distances = gap.abs() / torch.sqrt(1 + slope * slope)
    return order, int(distances.argmax()), distances


@dataclass
class CoClusterResult:
    """One CoFedRec server step (Algorithm 1).

    Attributes:
        global_table: ``(I, d)`` ``V_g``, the mean of the participants' tables.
        membership: ``(I,) int64`` item cluster ``M``.
        centers: ``(K, d)`` K-Means centres.
        kmeans_iterations: Lloyd iterations run.
        core: user id of the core client.
        category: the item category ``k``.
        similarity: ``(|P|,)`` ``s_u`` in participant order.
        order: ``(|P|,)`` participant positions sorted by decreasing ``s_u``.
        elbow: ``e``; the similar group is ``order[:e + 1]``.
        similar: ``(|D_s|,)`` user ids of the similar group (sorted).
        group_table: ``(I, d)`` ``V_s``, the mean of the similar group's tables.
    """

    global_table: torch.Tensor
    membership: torch.Tensor
    centers: torch.Tensor
    kmeans_iterations: int
    core: int
    category: int
    similarity: torch.Tensor
    order: torch.Tensor
    elbow: int
    similar: torch.Tensor
    group_table: torch.Tensor


def _core_and_category(ids: torch.Tensor, membership: torch.Tensor, uniforms: np.ndarray, k: int) -> Tuple[int, int]:
    core = int(ids[pick(uniforms[k], ids.numel())])
    categories = torch.unique(membership).tolist()  # non-empty clusters, sorted
    return core, int(categories[pick(uniforms[k + 1], len(categories))])


def _check_uniforms(uniforms, num_clusters) -> np.ndarray:
    k = _check_positive_int("num_clusters", num_clusters, "item clusters K")
    uniforms = np.asarray(uniforms, dtype=np.float64).ravel()
    if uniforms.size != k + 2 or (uniforms.size and (uniforms.min() < 0 or uniforms.max() >= 1)):
        raise ValueError(f"uniforms must be K + 2 = {k + 2} numbers in [0, 1): use server_uniforms(rng, {k}), "
                         f"got {uniforms.size} numbers")
    return uniforms


def _mean_table(tables: torch.Tensor, users: torch.Tensor, chunk_size: int) -> torch.Tensor:
    """``(I, d)`` mean of ``tables[users]`` (``users`` distinct).

    When at least half the users are averaged (every round of the paper profile, where all
    users take part), one matrix-vector product with 0 / ``1/|users|`` weights reads each table
    once, about twice as fast as summing chunks; otherwise the chunked sum of
    :func:`~fedlib.engine.knowledge.global_knowledge` reads only the users averaged.
    """
    num_users = tables.shape[0]
    if 2 * users.numel() < num_users or not tables.is_contiguous():
        return global_knowledge(tables, users, chunk_size)
    weights = torch.zeros(1, num_users, dtype=tables.dtype, device=tables.device)
    weights[0, users.to(tables.device)] = 1.0 / users.numel()
    return (weights @ tables.view(num_users, -1)).view(tables.shape[1:])


def co_cluster_step(tables: torch.Tensor, participants, num_clusters: int, uniforms, max_iter: int = 100,
                    chunk_size: int = 256) -> CoClusterResult:
    """The server step, batched: ``V_g``, K-Means membership, core/category, similarity, elbow, ``V_s``.

    Args:
        tables: ``(U, I, d)`` every user's item table (read only; no ``(|P|, I, d)`` copy is made).
        participants: ``(|P|,)`` distinct user ids whose tables were uploaded.
        num_clusters: ``K``.
        uniforms: ``server_uniforms(rng, K)``.
        max_iter: K-Means iterations.
        chunk_size: users summed at a time for the two means.

    Returns:
        :class:`CoClusterResult` (the caller writes ``group_table`` into the similar group's tables).
    """
    ids = _check_tables_and_participants(tables, participants)
    uniforms = _check_uniforms(uniforms, num_clusters)
    k = int(num_clusters)
    with torch.no_grad():
        global_table = _mean_table(tables, ids, chunk_size)  # (I, d)
        membership, centers, iterations = kmeans(global_table, k, uniforms[:k], max_iter)
        core, category = _core_and_category(ids, membership, uniforms, k)
        members = torch.nonzero(membership == category).flatten()
        similarity = category_similarity(tables, ids, core, members)  # (P,)
        order, elbow, _ = elbow_split(similarity)
        similar = torch.sort(ids[order[:elbow + 1]]).values
        group_table = _mean_table(tables, similar, chunk_size)  # (I, d)
    return CoClusterResult(global_table, membership, centers, iterations, core, category, similarity, order, elbow,
                           similar, group_table)


def co_cluster_step_reference(tables: torch.Tensor, participants, num_clusters: int, uniforms,
                              max_iter: int = 100) -> CoClusterResult:
    """The same server step as per-user, per-item loops (the readable reference)."""
    ids = _check_tables_and_participants(tables, participants).tolist()
    uniforms = _check_uniforms(uniforms, num_clusters)
    k = int(num_clusters)
    global_table = sum(tables[u] for u in ids) / len(ids)
    membership, centers, iterations = kmeans_reference(global_table, k, uniforms[:k], max_iter)
    core, category = _core_and_category(torch.as_tensor(ids), membership, uniforms, k)
    members = [i for i in range(tables.shape[1]) if int(membership[i]) == category]
    similarity = []
    for u in ids:
        total = 0.0
        for i in members:
            a, b = tables[core][i], tables[u][i]
            norm = float(a.norm()) * float(b.norm())
            total += float(a @ b) / norm if norm > 0 else 0.0
        similarity.append(total)
    order = sorted(range(len(ids)), key=lambda p: -similarity[p])  # stable: ties keep participant order
    values = [similarity[p] for p in order]
    n = len(values)
    elbow = 0
    if n >= 3:
        slope = (values[-1] - values[0]) / (n - 1)
        gaps = [abs(values[j] - (values[0] + slope * j)) / math.sqrt(1 + slope * slope) for j in range(n)]
        elbow = int(np.argmax(gaps))
    similar = sorted(ids[p] for p in order[:elbow + 1])
    group_table = sum(tables[u] for u in similar) / len(similar)
    as_tensor = lambda values, dtype: torch.as_tensor(values, dtype=dtype, device=tables.device)  # noqa: E731
    return CoClusterResult(global_table, membership, centers, iterations, core, category,
                           as_tensor(similarity, tables.dtype), as_tensor(order, torch.int64), elbow,
                           as_tensor(similar, torch.int64), group_table)


# ======================================================================================
# Client: supervised contrastive term on the item table
# ======================================================================================
def _check_supcon_inputs(features, labels, present, variant):
    _check_choice("variant", variant, SUPCON_VARIANTS)
    if features.dim() != 3:
        raise ValueError(f"features must be (C, B, d): each client's item rows, got shape {tuple(features.shape)}")
    if labels.shape != features.shape[:2] or present.shape != features.shape[:2]:
        raise ValueError(f"labels {tuple(labels.shape)} and present {tuple(present.shape)} must both be (C, B) = "
                         f"{tuple(features.shape[:2])}: one cluster label and one 0/1 flag per row")


#: Width groups of :func:`supcon_loss`: clients sorted by their last present row, cut into this
#: many equal-count groups, each padded only to its own widest client.
SUPCON_WIDTH_GROUPS = 8


def supcon_loss(features: torch.Tensor, labels: torch.Tensor, present: torch.Tensor, temperature: float,
                variant: str = "in", normalize: bool = True, width_groups: int = SUPCON_WIDTH_GROUPS) -> torch.Tensor:
    r"""``L_sup`` of each client, batched: ``(C,)`` (see :func:`supcon_loss_dense`).

    A padded ``(C, B)`` batch costs ``C·B²`` similarities, though most clients use far fewer
    than ``B`` rows. Clients are sorted by the column of their last present row and cut into
    ``width_groups`` groups; each group is trimmed to its widest client, so the cost falls to
    ``Σ_g C_g·B_g²``. Trimmed columns are absent rows: every client's value is unchanged.
    """
    _check_supcon_inputs(features, labels, present, variant)
    num_clients, width = present.shape
    if int(width_groups) < 1:
        raise ValueError(f"width_groups must be >= 1, got {width_groups!r}")
    columns = torch.arange(1, width + 1, device=present.device)
    used = ((present.bool() * columns).amax(1) if width
            else torch.zeros(num_clients, dtype=torch.int64, device=present.device))  # (C,) last present column
    if int(width_groups) == 1 or num_clients < 2 * int(width_groups):
        return supcon_loss_dense(features, labels, present, temperature, variant, normalize)
    order = torch.argsort(used, stable=True)
    parts = []
    for group in torch.tensor_split(order, int(width_groups)):
        group_width = max(1, int(used[group].max()))
        parts.append(supcon_loss_dense(features[group, :group_width], labels[group, :group_width],
                                       present[group, :group_width], temperature, variant, normalize))
    return torch.cat(parts)[torch.argsort(order)]  # back to the batch's client order


def supcon_loss_dense(features: torch.Tensor, labels: torch.Tensor, present: torch.Tensor, temperature: float,
                      variant: str = "in", normalize: bool = True, fused: bool = True) -> torch.Tensor:
    r"""``L_sup`` of each client, batched: ``(C,)`` (module docstring; mean over anchors).

    For client ``c`` and anchor row ``i`` (``present``), with ``s_ia = v_i·v_a/τ`` and
    ``A(i)`` the other present rows, ``Z(i)`` those with the same label::

        "in":  ℓ_i = −log( 1/|Z(i)| Σ_{z∈Z(i)} e^{s_iz} / Σ_{a∈A(i)} e^{s_ia} )
        "out": ℓ_i = −1/|Z(i)| Σ_{z∈Z(i)} log( e^{s_iz} / Σ_{a∈A(i)} e^{s_ia} )

    and the client's loss is the mean of ``ℓ_i`` over anchors with ``|Z(i)| ≥ 1`` (0 if none).

    Args:
        features: ``(C, B, d)`` item rows ``V_u[i_b]``.
        labels: ``(C, B)`` int cluster of each row (``M[i_b]``).
        present: ``(C, B)`` 1 for rows that take part (each item once, no padding).
        temperature: ``τ > 0``.
        variant: ``"in"`` or ``"out"``.
        normalize: L2-normalise the rows first.
        fused: with ``variant="in"``, ``normalize`` and ``τ >= 0.05`` (the defaults), compute the
            value and its gradient by hand (:class:`_SupConInFused`, ~4× faster); ``False``
            keeps the plain autograd form, the reference the tests compare it with.
    """
    _check_supcon_inputs(features, labels, present, variant)
    tau = _check_temperature(temperature)
    v = F.normalize(features, dim=-1) if normalize else features
    if fused and variant == "in" and normalize and tau >= 0.05:
        return _SupConInFused.apply(v, labels.long(), present.to(v.dtype), tau)
    sim = torch.einsum("cid,cjd->cij", v, v) / tau  # (C, B, B)
    present = present.bool()
    eye = torch.eye(sim.shape[1], dtype=torch.bool, device=sim.device)[None]
    valid = present[:, :, None] & present[:, None, :] & ~eye  # (C, B, B) pairs (i, a), a ≠ i
    positive = valid & (labels[:, :, None] == labels[:, None, :])
    num_pos = positive.sum(-1)  # (C, B)
    anchors = present & (num_pos > 0)  # (C, B)
    very_negative = torch.finfo(sim.dtype).min / 4  # finite: masked anchors get finite values and zero gradient
    if normalize and tau >= 0.05:
        # unit rows: |s_ia| <= 1/τ <= 20, so exp cannot overflow and one exp serves both sums
        # (two logsumexps with masked copies cost twice as much); empty sums are clamped, and
        # only non-anchors (weight 0) have them.
        tiny = torch.finfo(sim.dtype).tiny
        exp = torch.exp(sim)  # (C, B, B)
        log_denominator = torch.log((exp * valid.to(sim.dtype)).sum(-1).clamp(min=tiny))  # (C, B)
        log_numerator = (torch.log((exp * positive.to(sim.dtype)).sum(-1).clamp(min=tiny)) if variant == "in"
                         else None)
    else:
        log_denominator = torch.logsumexp(sim.masked_fill(~valid, very_negative), dim=-1)  # (C, B)
        log_numerator = (torch.logsumexp(sim.masked_fill(~positive, very_negative), dim=-1) if variant == "in"
                         else None)
    if variant == "in":
        per_anchor = -(log_numerator - torch.log(num_pos.clamp(min=1).to(sim.dtype)) - log_denominator)
    else:
        log_prob = sim - log_denominator[:, :, None]  # (C, B, B)
        per_anchor = -(log_prob * positive.to(sim.dtype)).sum(-1) / num_pos.clamp(min=1).to(sim.dtype)
    weight = anchors.to(sim.dtype)
    return (per_anchor * weight).sum(1) / weight.sum(1).clamp(min=1)


class _SupConInFused(torch.autograd.Function):
    r"""``L_sup`` (variant ``"in"``) of unit rows with a hand-written backward: ``(C,)``.

    The autograd form keeps about a dozen ``(C, B, B)`` tensors (masks, masked copies and
    their gradients). Here the masks never exist as ``(C, B, B)`` tensors in the forward pass:
    with ``E = exp(v vᵀ/τ)`` (diagonal zeroed, so ``a ≠ i``) and ``Y (C, B, K+1)`` holding the
    presence flag ``p_a`` in column 0 and ``p_a·[l_a = k]`` in column ``k + 1``, one product
    ``E Y`` gives every denominator ``Σ_a E_ia p_a`` and every same-label numerator at once.
    The gradient of ``ℓ = Σ_i w_i ℓ_i`` (``w_i`` the anchor weights, summing to 1) w.r.t. the
    similarities is ``G_ia = E_ia p_a (w_i/den_i − w_i [l_a = l_i]/num_i)`` (zero diagonal),
    and ``s = v vᵀ/τ`` gives ``∂ℓ/∂v = (G + Gᵀ) v / τ``.

    Only called with unit (or zero) rows and ``τ >= 0.05``: ``|s_ia| <= 20``, no overflow.
    """

    @staticmethod
    def forward(ctx, v, labels, present, tau):  # v (C, B, d), labels (C, B) int64, present (C, B) 0/1 float
        num_clients, width, _ = v.shape
        labels = labels - labels.min() if labels.numel() else labels  # any integer labels; equality is kept
        exp = torch.bmm(v, v.transpose(1, 2)).mul_(1.0 / tau).exp_()  # (C, B, B)
        exp.diagonal(dim1=1, dim2=2).zero_()  # a ≠ i
        num_labels = int(labels.max()) + 1 if labels.numel() else 1
        column = (labels + 1).unsqueeze(-1)  # (C, B, 1): column 0 is "every present row"
        indicator = torch.zeros(num_clients, width, num_labels + 1, dtype=v.dtype, device=v.device)
        indicator[..., 0] = present
        indicator.scatter_(2, column, present.unsqueeze(-1))  # (C, B, K+1)
        sums = torch.bmm(exp, indicator)  # (C, B, K+1)
        denominator = sums[..., 0]  # (C, B) Σ_{a≠i} E_ia p_a
        numerator = sums.gather(2, column).squeeze(-1)  # (C, B) Σ_{a≠i, l_a=l_i} E_ia p_a
        num_pos = indicator.sum(1).gather(1, labels + 1) - present  # (C, B) |Z(i)|
        anchors = present * (num_pos > 0).to(v.dtype)
        weight = anchors / anchors.sum(1, keepdim=True).clamp(min=1)  # (C, B) mean over anchors
        tiny = torch.finfo(v.dtype).tiny
        per_anchor = -(numerator.clamp(min=tiny).log() - num_pos.clamp(min=1).log()
                       - denominator.clamp(min=tiny).log())
        ctx.save_for_backward(v, exp, labels, present, weight, denominator, numerator)
        ctx.tau = tau
        return (per_anchor * weight).sum(1)

    @staticmethod
    def backward(ctx, grad):  # grad (C,)
        v, exp, labels, present, weight, denominator, numerator = ctx.saved_tensors
        tiny = torch.finfo(v.dtype).tiny
        scale = grad[:, None] * weight  # (C, B); zero for non-anchors
        to_all = (scale / denominator.clamp(min=tiny))[:, :, None]
        to_same = to_all - (scale / numerator.clamp(min=tiny))[:, :, None]
        same = labels[:, :, None] == labels[:, None, :]  # (C, B, B)
        g = torch.where(same, to_same, to_all).mul_(exp).mul_(present[:, None, :])  # (C, B, B) ∂ℓ/∂s
        grad_v = torch.bmm(g, v).add_(torch.bmm(g.transpose(1, 2), v)).mul_(1.0 / ctx.tau)
        return grad_v, None, None, None


def supcon_loss_reference(features: torch.Tensor, labels: torch.Tensor, present: torch.Tensor, temperature: float,
                          variant: str = "in", normalize: bool = True) -> torch.Tensor:
    """:func:`supcon_loss` as explicit per-client, per-anchor sums (the readable reference)."""
    _check_supcon_inputs(features, labels, present, variant)
    tau = _check_temperature(temperature)
    out = []
    for c in range(features.shape[0]):
        rows = [b for b in range(features.shape[1]) if bool(present[c, b])]
        vec = {b: (features[c, b] / features[c, b].norm().clamp(min=1e-12) if normalize else features[c, b])
               for b in rows}
        terms = []
        for i in rows:
            others = [a for a in rows if a != i]
            positives = [z for z in others if int(labels[c, z]) == int(labels[c, i])]
            if not positives:
                continue
            denominator = sum(math.exp(float(vec[i] @ vec[a]) / tau) for a in others)
            if variant == "in":
                terms.append(-math.log(sum(math.exp(float(vec[i] @ vec[z]) / tau) for z in positives)
                                       / len(positives) / denominator))
            else:
                terms.append(-sum(float(vec[i] @ vec[z]) / tau - math.log(denominator) for z in positives)
                             / len(positives))
        out.append(sum(terms) / len(terms) if terms else 0.0)
    return torch.tensor(out, dtype=features.dtype, device=features.device)


# ======================================================================================
# Backbone, loss, server hook, method
# ======================================================================================
class CoFedRecModel(PersonalItemTableModel):
    """CoFedRec's client model: PFedRec's score head on a per-client item table.

    ``r̂_ui = σ(w_u · V_u[i] + b_u)``. Parameters and roles (``param_kinds``):

    ==========================  =================  ==================================================
    ``personal_item_emb``       ``private_rows``   ``V_u``, ``(U, I, d)``: uploaded to / replaced by the
                                                   server through :class:`CoClusteringServer`
    ``head_w``, ``head_b``      ``private_dense``  ``θ_u``: ``w_u (U, d)``, ``b_u (U,)``, never uploaded
    ==========================  =================  ==================================================

    Every client starts from one shared draw (items ``N(0, init_std²)``, head ``U(±1/√d)``).
    """

    table = "personal_item_emb"
    #: PFedRec's two steps per batch: the score function, then the item table
    update_steps = (("head_w", "head_b"), ("personal_item_emb",))

    def __init__(self, num_users: int, num_items: int, dim: int = 32, init_std: float = 1.0):
        super().__init__(num_users, num_items, dim, shared_table=False, init_std=init_std)


class CoFedRecLoss:
    """CoFedRec's client loss ``BCE + λ L_sup`` (Eq. 9), a ``ClientLossFn``.

    The item membership ``M`` comes from the server (:meth:`set_membership`, called by
    :class:`CoClusteringServer`); without one (round 0) the loss is plain BCE.

    Args:
        lam: ``λ >= 0`` (paper: 0.005 on ML-100K/ML-1M; FedRKG on Amazon-Video: 1e-2).
        temperature: ``τ > 0`` (paper: 0.1 ML-100K, 0.5 ML-1M; FedRKG: 0.5).
        variant, normalize: see :func:`supcon_loss`.
        contrastive_rows: ``"table"`` (needs ``PlanAugmentingExecutor``, which calls
            :meth:`prepare_round`) or ``"batch"``.
    """

    def __init__(self, lam: float = 0.005, temperature: float = 0.5, variant: str = "in", normalize: bool = True,
                 contrastive_rows: str = "table"):
        self.lam = _check_nonnegative("lam", lam, "weight λ of the contrastive term; use 0 to switch it off")
        self.temperature = _check_temperature(temperature)
        _check_choice("variant", variant, SUPCON_VARIANTS)
        _check_choice("contrastive_rows", contrastive_rows, CONTRASTIVE_ROWS)
        self.variant, self.normalize, self.contrastive_rows = variant, bool(normalize), contrastive_rows
        self.membership: Optional[torch.Tensor] = None

    def set_membership(self, membership: Optional[torch.Tensor]) -> None:
        """Use item clusters ``membership (I,) int64`` from now on (``None``: no contrastive term)."""
        if membership is not None:
            membership = torch.as_tensor(membership)
            if membership.dim() != 1 or membership.dtype not in (torch.int32, torch.int64):
                raise ValueError(f"membership must be a 1-D integer tensor (one cluster id per item), got "
                                 f"{membership.dtype} of shape {tuple(membership.shape)}")
            membership = membership.to(torch.int64)
        self.membership = membership

    @property
    def active(self) -> bool:
        """Whether the contrastive term is on (a membership is known and ``λ > 0``)."""
        return self.membership is not None and self.lam > 0

    # -- PlanAugmentingExecutor protocol ------------------------------------------------
    def prepare_round(self, plan: RoundPlan, global_state, private_state) -> RoundPlan:
        """With ``contrastive_rows="table"`` and an active term: every item added to every step."""
        if self.contrastive_rows != "table" or not self.active:
            return plan
        table = private_state.get(CoFedRecModel.table)
        if table is None:
            raise ValueError(f"CoFedRecLoss expects the private table {CoFedRecModel.table!r}, got {sorted(private_state)}")
        return add_table_context(plan, int(table.shape[1]))

    def finish_round(self) -> None:
        """Nothing is kept between rounds."""

    def __call__(self, model: FederatedModel, params: Mapping[str, torch.Tensor], batch: LocalBatch) -> torch.Tensor:
        table = getattr(model, "table", CoFedRecModel.table)
        real = batch.mask * (batch.labels >= 0).to(batch.mask.dtype)  # (C, B) context rows excluded
        logits = model.logits(params, batch.rows)  # (C, B)
        losses = F.binary_cross_entropy_with_logits(logits, batch.labels.clamp(min=0.0), reduction="none")
        bce = (losses * real).sum(1) / real.sum(1).clamp(min=1)  # (C,)
        if not self.active:
            return bce
        membership = self.membership.to(batch.items.device)
        if membership.numel() != model.num_items:
            raise ValueError(f"membership has {membership.numel()} entries but the model has {model.num_items} items: "
                             "set it from a server step on this model's tables")
        present = first_occurrence(batch.items, batch.mask)  # (C, B) each item once
        if self.contrastive_rows == "table":
            distinct = present.sum(1)
            if bool((distinct != model.num_items).any()):
                raise ValueError(
                    f"contrastive_rows='table' needs every item in every local batch (got {int(distinct.min())} of "
                    f"{model.num_items}): run with fedlib.baselines.continual.continual.PlanAugmentingExecutor(BatchedExecutor()), "
                    "which adds them as context rows, or use contrastive_rows='batch'")
        rows = params[table][batch.rows]  # (C, B, d)
        contrast = supcon_loss(rows, membership[batch.items], present, self.temperature, self.variant, self.normalize)
        return bce + self.lam * contrast

    def __repr__(self) -> str:
        return (f"CoFedRecLoss(lam={self.lam}, temperature={self.temperature}, variant={self.variant!r}, "
                f"normalize={self.normalize}, contrastive_rows={self.contrastive_rows!r})")


class CoClusteringServer:
    """CoFedRec's server as a ``before_round(run, t, plan)`` hook.

    Round 0: nothing. Round ``t >= 1``: the participants of round ``t − 1`` upload their
    tables; :func:`co_cluster_step` (draws from ``round_generator(seed, t, SERVER_STREAM)``)
    gives ``M`` (sent to the loss and kept in ``run.state.extra[MEMBERSHIP_KEY]``) and ``V_s``
    (written into the similar group's tables). A summary goes to ``run.state.extra[STATS_KEY]``.

    Args:
        loss: the method's :class:`CoFedRecLoss` (receives ``M``).
        train, config: the ``run_federated`` training pairs and config (participants, seed).
        num_clusters, max_iter: see :func:`co_cluster_step`.
        table: name of the item table.
    """

    def __init__(self, loss: CoFedRecLoss, train: Pairs, config, num_clusters: int = 30, max_iter: int = 100,
                 table: str = CoFedRecModel.table):
        self.loss, self.train, self.config, self.table = loss, train, config, table
        self.num_clusters = _check_positive_int("num_clusters", num_clusters, "item clusters K")
        self.max_iter = _check_positive_int("max_iter", max_iter, "K-Means iterations")

    def __call__(self, run, round_index: int, plan) -> None:
        if round_index == 0:
            self.loss.set_membership(None)
            return
        participants = guidance_participants(self.train, self.config, int(round_index) - 1)
        if participants.size == 0:
            return
        state = run.state  # the trainer's live run: its AveragingState is changed in place
        tables = state.private_state[self.table]  # (U, I, d)
        uniforms = server_uniforms(round_generator(self.config.seed, int(round_index), SERVER_STREAM),
                                   self.num_clusters)
        result = co_cluster_step(tables, participants, self.num_clusters, uniforms, self.max_iter)
        with torch.no_grad():
            tables[result.similar] = result.group_table.to(tables.dtype)  # download of the similar group
        self.loss.set_membership(result.membership)
        state.extra[MEMBERSHIP_KEY] = result.membership.detach().clone()
        state.extra[STATS_KEY] = {
            "round": int(round_index), "participants": int(participants.size), "core": result.core,
            "category": result.category, "category_size": int((result.membership == result.category).sum()),
            "similar": int(result.similar.numel()), "kmeans_iterations": result.kmeans_iterations,
        }


#: floats the clients of one CoFedRec chunk may hold in their L_sup similarity matrices (1 GiB)
SUPCON_BUDGET_FLOATS = 1 << 28
#: (B, B) tensors alive per client in L_sup's forward and backward, counted with margin from
#: :func:`supcon_loss` (similarities, masks, masked copies, exponentials
#: of the log-sum-exps, their gradients)
SUPCON_COPIES = 12


def supcon_chunk(rows: int) -> int:
    """Clients per batched chunk for CoFedRec, whose L_sup compares every row of a step with every other.

    ``rows`` per client and step: the batch, plus every item with ``contrastive_rows="table"``
    (FilmTrust: 2,327 rows, ``(B, B)`` matrices of 5.4 M floats; the executor's default chunk of
    up to 1,024 clients would need ~100 GB). The chunk size bounds memory only; clients are
    independent, so it does not change what they learn.
    """
    rows = int(rows)
    if rows < 1:
        raise ValueError(f"rows must be >= 1 (rows per client and local step), got {rows}")
    return max(1, SUPCON_BUDGET_FLOATS // (SUPCON_COPIES * rows * rows))


def cofedrec_method(model: CoFedRecModel, train: Pairs, config, lr: float = 0.05, lr_eta: float = 80.0,
                    lam: float = 0.005, temperature: float = 0.5, num_clusters: int = 30, variant: str = "in",
                    normalize: bool = True, contrastive_rows: str = "table", two_step: bool = True,
                    max_iter: int = 100, **kwargs) -> FederatedMethod:
    """CoFedRec as an engine method: PFedRec learning rates, :class:`CoFedRecLoss`, :class:`CoClusteringServer`.

    Args:
        model: a :class:`CoFedRecModel`.
        train, config: the training pairs and :class:`~fedlib.engine.FederatedConfig` the run will use
            (the server re-derives each round's participants and its random draws from them).
        lr: head learning rate (paper: 0.05); item table ``lr × I × lr_eta`` (PFedRec's recipe, 80).
        lam, temperature, variant, normalize, contrastive_rows: see :class:`CoFedRecLoss`. With
            ``contrastive_rows="table"`` run with ``PlanAugmentingExecutor(BatchedExecutor(...))``.
        num_clusters: ``K`` (paper: 30 ML-100K/FilmTrust, 45 ML-1M, 500 LastFM; FedRKG: 30).
        two_step: PFedRec's two steps per batch (head, then items); ``False``: one step on both.
        max_iter: K-Means iterations.
        **kwargs: other :class:`~fedlib.engine.FederatedMethod` fields; a ``before_round`` given
            here runs after the server step.

    Returns:
        The method; ``method.client_loss`` is the :class:`CoFedRecLoss`.
    """
    if not isinstance(model, PersonalItemTableModel) or model.shared_table:
        raise ValueError(f"cofedrec_method needs a CoFedRecModel (one private item table per user and a private "
                         f"head), got {type(model).__name__}")
    if not isinstance(train, Pairs):
        raise ValueError(f"train must be the training Pairs given to run_federated, got {type(train).__name__}")
    if not hasattr(config, "seed") or not hasattr(config, "clients_per_round"):
        raise ValueError("config must be the run's FederatedConfig (its seed and clients_per_round define the "
                         f"server's draws and each round's participants), got {type(config).__name__}")
    if train.num_users > model.num_users:
        raise ValueError(f"train has {train.num_users} users but the model only {model.num_users}: build the model "
                         "with num_users >= train.num_users")
    k = _check_positive_int("num_clusters", num_clusters, "item clusters K")
    if k > model.num_items:
        raise ValueError(f"num_clusters={k} exceeds the model's {model.num_items} items: use K <= num_items")
    lr = _check_nonnegative("lr", lr, "head learning rate")
    lr_eta = _check_nonnegative("lr_eta", lr_eta, "item-table multiplier")
    if "client_loss" in kwargs:
        raise ValueError("cofedrec_method builds its own client_loss (CoFedRecLoss); pass lam/temperature/... instead")
    loss = CoFedRecLoss(lam, temperature, variant, normalize, contrastive_rows)
    server = CoClusteringServer(loss, train, config, k, max_iter, model.names("private_rows")[0])
    hook = chain_hooks(server, kwargs.pop("before_round", None))
    rates = {name: (lr * model.num_items * lr_eta if kind.endswith("rows") else lr)
             for name, kind in model.param_kinds.items()}
    steps = CoFedRecModel.update_steps if two_step else None
    kwargs.setdefault("name", "CoFedRec")
    return FederatedMethod(model, rates, update_steps=steps, client_loss=loss, before_round=hook, **kwargs)
