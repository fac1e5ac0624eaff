r"""F3CRec: adaptive replay memory on the clients, item-wise temporal mean on the server.

Reference:
    Lim, Kweon, Kim, Kim, Choi, Kim, Yu. "Federated Continual Recommendation." CIKM 2025.
    https://arxiv.org/abs/2508.04792. Equations (1)–(13) below are the paper's; behaviour
    the paper leaves open follows the authors' public code,
    https://github.com/Jaehyung-Lim/F3CRec-CIKM-25 (``fcrec/main.py``,
    ``fcrec/baseline/{fedmf,fedmlp,pfedrec}/``, ``fcrec/utils/``).

Client side (§4.2), for a user ``u`` that existed in block ``t−1``, in every local step::

    S_u      = top-N items of the teacher (block t−1 best model) scores      Eq. 1  (N,)
    Δ_u      = Σ_k |rank_student(i_k) − k|                                    Eq. 2  ()
    δ_u      = exp(−ε Δ_u)                                                    Eq. 3  ()
    M_u      = ⌊δ_u N⌋ items of S_u sampled without replacement               Eq. 4
    L_KD(u)  = mean_{i ∈ M_u} BCE(σ(s_ui), σ(s^{t−1}_ui))                      Eq. 5
    L(u)     = L_rec(u) + λ_KD L_KD(u)                                        Eq. 6

Server side (§4.3), every round of block ``t ≥ 1``::

    Q'       = mean of the uploaded item tables (the engine's uniform FedAvg)  Eq. 7  (I^t, d)
    φ_i      = ‖Q^{t−1}_i − Q'_i‖² / √d          for old items i < |I^{t−1}|   Eq. 8
    γ_i      = β / (1 + φ_i);  γ_i = 0 for new items                         Eqs. 9, 11
    Q_i      = (1 − γ_i) Q'_i + γ_i Q^{t−1}_i    (Q^{t−1} zero-padded)         Eqs. 10, 12, 13

``Q^{t−1}`` is the previous block's **best-validation** item table, fixed during block ``t``.

Flags reproduce the paper's ablations and its KD baseline on the same code path:

================  =====================================================================
``client_cl``     False = "w/o c.c" (server side only)
``adaptive_replay`` False = "w/o a.r.m": distil every top-N item every step (= the KD baseline
                  when ``server_cl`` is also False, see :func:`kd_baseline`)
``server_cl``     False = "w/o s.c" (plain FedAvg)
``itemwise``      False = "w/o i.t.m": one global γ = β for every old item
================  =====================================================================

Baselines of §5.1 rebuilt from the paper's descriptions (the authors released none):
FT (:class:`~fedlib.baselines.continual.continual.FineTuning`), Reg (:class:`ParameterRegularisation`)
and KD (:func:`kd_baseline`).

How the replay items reach the engine. The engine gives a client loss only the item rows of
the current local batch. The replay items of ``S_u`` are generally not among them, yet Eq. 5
must read their current local rows and move them (the public code distils through the full
local model, so the KD gradient updates those item rows, which are then uploaded). The loss
object therefore adds, through :class:`~fedlib.baselines.continual.continual.PlanAugmentingExecutor`, the
``N`` items of ``S_u`` to every local step of the round plan as extra examples, plus (for
Eq. 2) the rows the client already changed in earlier steps of the round. Their labels are
negative codes that only this loss reads; see :func:`augment_plan_with_replay`.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Dict, List, Mapping, Optional, Tuple

import numpy as np
import torch
import torch.nn.functional as F

from fedlib.engine import FederatedMethod, LocalBatch, bce_client_loss
from fedlib.engine.aggregation import ServerMixFn
from fedlib.engine.plan import RoundPlan, round_generator
from fedlib.baselines.registry import register
from fedlib.baselines.continual.continual import BlockContext, ContinualMethod, student_ranks
from fedlib.models.base import FederatedModel

__all__ = [
    # client side, one function per equation
    "top_n_memory", "preference_shift", "consistency_sampling_rate",
    "replay_memory_size", "replay_priorities", "adaptive_replay_memory", "kd_loss", "total_client_loss",
    # server side
    "pre_aggregation", "item_knowledge_shift", "temporal_mean_weights", "temporal_mean", "item_temporal_mean_mix",
    # plumbing and methods
    "augment_plan_with_replay", "ReplayDistillationLoss", "ParameterRegularisationLoss",
    "MEMORY_REFRESH", "F3CRec", "kd_baseline", "ParameterRegularisation",
]

#: ``round_generator`` stream of the replay-memory draws (0 = round plan, 1 = upload noise).
REPLAY_STREAM = 0x5EED
#: Label of a "context" example: a row the client changed earlier in the round, added so the
#: loss can score every item at its current local value (Eq. 2). Carries no loss.
CONTEXT_LABEL = -0.5
#: Largest exact integer of float32 (plan labels are float32): bounds the replay label codes.
_FLOAT32_EXACT = 1 << 24
#: :class:`F3CRec`'s ``memory_refresh``: every user's top-N list (default) or the trained users' (public code).
MEMORY_REFRESH = ("all", "trained")


# ======================================================================================
# Client side: Eqs. 1–6
# ======================================================================================
def top_n_memory(teacher_scores: torch.Tensor, n: int) -> Tuple[torch.Tensor, torch.Tensor]:
    """Eq. 1: each user's previous knowledge ``S_u^{t−1}`` = the teacher's top-``n`` items.

    As in the public code, the top-N list is taken over **all** items, without masking the
    user's already consumed items (the code's ``get_rank_discrepancy_kd_loss``).

    Args:
        teacher_scores: ``(U, I)`` logits of the block ``t−1`` model.
        n: memory size ``N``.

    Returns:
        ``(items (U, N) int64, logits (U, N))``, best first: ``items[u, k−1] = i_{t_k}``.
    """
    if n > teacher_scores.shape[1]:
        raise ValueError(f"top-N memory of {n} items from only {teacher_scores.shape[1]} items")
    logits, items = torch.topk(teacher_scores, n, dim=1, largest=True, sorted=True)
    return items, logits


def preference_shift(ranks: torch.Tensor) -> torch.Tensor:
    """Eq. 2: ``Δ_u = Σ_{k=1..N} |r_u^{t,r}(i_{t_k}) − k|``.

    Args:
        ranks: ``(C, N)`` the student's 1-based rank (:func:`~fedlib.baselines.continual.continual.student_ranks`)
            of the teacher's ``k``-th item in column ``k − 1`` (the teacher's own rank of that
            item is ``k`` by construction of ``S_u``).

    Returns:
        ``(C,)`` float64 (sums of integers; float so Eq. 3 can follow directly).
    """
    teacher_rank = torch.arange(1, ranks.shape[1] + 1, device=ranks.device)
    return (ranks - teacher_rank).abs().sum(1).to(torch.float64)


def consistency_sampling_rate(shift: torch.Tensor, eps: float) -> torch.Tensor:
    """Eq. 3: ``δ_u = exp(−ε Δ_u)`` in ``(0, 1]``: ``(C,)``."""
    return torch.exp(-float(eps) * shift.to(torch.float64))


def replay_memory_size(rate: torch.Tensor, n: int) -> torch.Tensor:
    """Eq. 4's sample size ``⌊δ_u · |S_u|⌋``: ``(C,) int64`` in ``[0, n]`` (0 = no KD this step)."""
    return torch.floor(rate.to(torch.float64) * int(n)).to(torch.int64).clamp_(0, int(n))


def replay_priorities(rng: np.random.Generator, num_rows: int, n: int) -> np.ndarray:
    """Uniform random permutation ranks for sampling without replacement: ``(num_rows, n) int64``.

    Row ``r`` is a uniformly random permutation of ``0..n−1``. Keeping the items whose
    priority is below ``m`` is a uniform sample of ``m`` items without replacement, for any
    ``m`` (the first ``m`` of a random order). Drawing the priorities before ``m`` is known lets
    the randomness be fixed once per round, outside the loss (so every executor uses it).
    """
    keys = rng.random((int(num_rows), int(n)))
    return np.argsort(np.argsort(keys, axis=1, kind="stable"), axis=1, kind="stable").astype(np.int64)


def adaptive_replay_memory(priorities: torch.Tensor, sizes: torch.Tensor) -> torch.Tensor:
    """Eq. 4: ``M_u = SWOR(S_u, ⌊δ_u N⌋)`` as a selection mask over ``S_u``.

    Args:
        priorities: ``(C, N)`` each row a random permutation of ``0..N−1`` (:func:`replay_priorities`).
        sizes: ``(C,)`` sample sizes ``⌊δ_u N⌋`` (:func:`replay_memory_size`).

    Returns:
        ``(C, N) bool``: ``True`` for the items of ``S_u`` in ``M_u`` (exactly ``sizes[c]`` per row).
    """
    return priorities < sizes[:, None]


def kd_loss(student_logits: torch.Tensor, teacher_logits: torch.Tensor, selected: torch.Tensor,
            reduction: str = "mean") -> torch.Tensor:
    r"""Eq. 5: binary cross-entropy between the student's and the teacher's probabilities.

    ``L_KD(u) = −agg_{i ∈ M_u} [ŷ^{t−1}_ui log ŷ_ui + (1 − ŷ^{t−1}_ui) log(1 − ŷ_ui)]`` with
    ``ŷ = σ(logit)``. The paper writes a sum (and drops the minus sign); the public code uses a
    mean-reduced BCE, the default here (``reduction="sum"`` gives the paper's form). Computed
    from the student's logits (``binary_cross_entropy_with_logits`` with soft targets), which
    equals BCE on ``σ(logit)`` without its ``log 0`` clamping.

    Args:
        student_logits: ``(C, N)`` current logits of the memory items (differentiable).
        teacher_logits: ``(C, N)`` logits of the block ``t−1`` model for the same items.
        selected: ``(C, N) bool`` the replay memory ``M_u`` (Eq. 4).

    Returns:
        ``(C,)``; 0 for a client with an empty ``M_u``.
    """
    targets = torch.sigmoid(teacher_logits).to(student_logits.dtype)
    per_item = F.binary_cross_entropy_with_logits(student_logits, targets, reduction="none")  # (C, N)
    weight = selected.to(student_logits.dtype)
    total = (per_item * weight).sum(1)
    if reduction == "sum":
        return total
    if reduction != "mean":
        raise ValueError(f"reduction must be 'mean' or 'sum', got {reduction!r}")
    return total / weight.sum(1).clamp(min=1.0)


def total_client_loss(rec_loss: torch.Tensor, distillation: torch.Tensor, lambda_kd: float) -> torch.Tensor:
    """Eq. 6: ``L_total(u) = L_Rec(u) + λ_KD · L_KD(u)``: ``(C,)``."""
    return rec_loss + float(lambda_kd) * distillation


# ======================================================================================
# Server side: Eqs. 7–13
# ======================================================================================
def pre_aggregation(client_tables: torch.Tensor) -> torch.Tensor:
    """Eq. 7: ``Q'_g = (1/|U^{t,r}|) Σ_u Q_u``, the uniform mean of the uploaded tables.

    ``(C, I, d) -> (I, d)``. The engine computes the same quantity without materialising the
    uploads (``Aggregation("uniform")``: ``Q + Σ_c Δ_c / C``); this function states it.
    """
    return client_tables.mean(0)


def item_knowledge_shift(previous: torch.Tensor, pre_aggregated: torch.Tensor) -> torch.Tensor:
    """Eq. 8: ``φ_i = ‖Q^{t−1}_i − Q'_i‖² / √d`` for the old items ``i < |I^{t−1}|``.

    Args:
        previous: ``(I_old, d)`` the previous block's item table ``Q^{t−1}``.
        pre_aggregated: ``(I, d)`` with ``I ≥ I_old`` (new items are appended, excluded here).

    Returns:
        ``(I_old,)``.
    """
    num_old, dim = previous.shape
    diff = previous - pre_aggregated[:num_old]
    return diff.pow(2).sum(1) / math.sqrt(dim)


def temporal_mean_weights(phi: torch.Tensor, beta: float, num_items: int, itemwise: bool = True) -> torch.Tensor:
    """Eqs. 9 and 11: ``γ = [β/(1+φ_1), …, β/(1+φ_{|I^{t−1}|}), 0, …, 0] ∈ R^{|I^t|}``.

    Args:
        phi: ``(I_old,)`` knowledge shifts (Eq. 8).
        beta: ``β`` in ``[0, 1)``.
        num_items: ``|I^t|``; the ``|I^t| − |I^{t−1}|`` new items get ``γ = 0``.
        itemwise: False = the "w/o i.t.m" ablation: ``γ_i = β`` for every old item.

    Returns:
        ``(I,)`` mixing weights.
    """
    old = beta / (1.0 + phi) if itemwise else torch.full_like(phi, float(beta))
    gamma = phi.new_zeros(int(num_items))
    gamma[:phi.shape[0]] = old
    return gamma


def temporal_mean(pre_aggregated: torch.Tensor, previous: torch.Tensor, gamma: torch.Tensor) -> torch.Tensor:
    """Eqs. 10, 12, 13: ``Q = (1 − γ) ⊙ Q' + γ ⊙ ZeroPad(Q^{t−1})``.

    Args:
        pre_aggregated: ``(I, d)`` ``Q'``.
        previous: ``(I_old, d)`` ``Q^{t−1}``, zero-padded to ``I`` rows (Eq. 12).
        gamma: ``(I,)`` weights (Eq. 11; zero on the padded rows, so new items keep ``Q'``).

    Returns:
        ``(I, d)`` the new global table.
    """
    padded = pre_aggregated.new_zeros(pre_aggregated.shape)
    padded[:previous.shape[0]] = previous
    g = gamma[:, None].to(pre_aggregated.dtype)
    return (1.0 - g) * pre_aggregated + g * padded


def item_temporal_mean_mix(previous_tables: Mapping[str, torch.Tensor], beta: float,
                           itemwise: bool = True) -> ServerMixFn:
    """The server side of F3CRec as an engine ``server_mix`` hook.

    Args:
        previous_tables: ``name -> (I_old, d)`` the previous block's best-validation tables of
            the public row parameters (F3CRec's item embeddings; NeuMF's second item table
            would be mixed the same way). Public dense tensors are left as aggregated.
        beta, itemwise: see :func:`temporal_mean_weights`.

    Returns:
        ``mix(previous_global, aggregated, round) -> new_global`` applying Eqs. 8–13 to the
        aggregated (pre-aggregated, Eq. 7) tables every round.
    """
    anchors = {name: table.detach().clone() for name, table in previous_tables.items()}

    def mix(previous_global, aggregated, round_index):
        out = dict(aggregated)
        for name, anchor in anchors.items():
            q_pre = aggregated[name]  # Q' (I, d)
            phi = item_knowledge_shift(anchor, q_pre)  # (I_old,)
            gamma = temporal_mean_weights(phi, beta, q_pre.shape[0], itemwise)  # (I,)
            out[name] = temporal_mean(q_pre, anchor, gamma)
        return out

    return mix


# ======================================================================================
# Plumbing: replay items as extra examples of the round plan
# ======================================================================================
def _ranges(starts: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """Concatenation of ``arange(starts[j], starts[j] + counts[j])``."""
    offsets = np.cumsum(counts) - counts
    return np.arange(int(counts.sum()), dtype=np.int64) + np.repeat(starts - offsets, counts)


def replay_label(k: np.ndarray, priority: np.ndarray, n: int) -> np.ndarray:
    """Label code of a replay example: ``−(1 + k + N·priority)`` (≤ −1, exact in float32)."""
    return -(1.0 + k + n * priority)


def decode_replay_label(labels: torch.Tensor, n: int) -> Tuple[torch.Tensor, torch.Tensor]:
    """Inverse of :func:`replay_label`: ``(k, priority)`` int64 tensors."""
    code = (-labels - 1.0).round().to(torch.int64)
    return code % n, code // n


def augment_plan_with_replay(plan: RoundPlan, memory_items: np.ndarray, rng: np.random.Generator,
                             with_context: bool = True) -> RoundPlan:
    """Add each client's replay items (and, optionally, context rows) to every local step.

    For every client ``c`` with a memory row (``plan.clients[c] < len(memory_items)``) and
    every step ``s`` of ``c``, the ``N`` items of ``S_u`` are appended to step ``s``'s examples
    with labels ``−(1 + k + N·p)``: ``k`` = position in ``S_u`` (0-based), ``p`` = a fresh random
    priority (a permutation of ``0..N−1`` per client and step, :func:`replay_priorities`).

    With ``with_context`` (needed by Eq. 2), for the same clients, every row the client trained
    on in an earlier step of the round and that is absent from step ``s`` is appended to step ``s`` with label
    :data:`CONTEXT_LABEL`: it carries no loss, but lets the loss read the client's *current*
    local value of that row, so the student's scores of all items are exactly those of its
    local model (rows never touched this round still equal the download).

    Extra cost: ``N`` rows per client and step, plus for multi-step clients the rows of their
    earlier steps. ``num_examples`` (aggregation weights) is unchanged. The engine's
    communication ledger is charged from the original plan: with F3CRec's full-table uploads
    the bytes are the same; with ``upload_mode="rows"`` the replay rows a client changes would
    be missing from the count, and with ``UploadNoise(support="touched")`` the added rows also
    receive noise (they are touched rows for the executors).

    Args:
        plan: the engine's round plan.
        memory_items: ``(U_old, N) int64`` top-N lists of the users of block ``t−1``.
        rng: the round's replay generator.

    Returns:
        The augmented :class:`RoundPlan` (examples sorted by client, then step; original
        examples first within a step, in their planned order).
    """
    memory_items = np.asarray(memory_items, dtype=np.int64)
    num_memory_users, n = memory_items.shape
    if n * n >= _FLOAT32_EXACT:
        raise ValueError(f"top-N memory of {n} items is too large for exact float32 label codes")
    num_clients = plan.num_clients
    ex_pos = plan.example_positions()  # (E,)
    parts_pos, parts_step, parts_kind, parts_item, parts_label = [ex_pos], [plan.steps], [np.zeros_like(ex_pos)], \
        [plan.items], [plan.labels.astype(np.float32)]

    # Replay entries: N per (client with memory, step).
    with_memory = np.flatnonzero(plan.clients < num_memory_users)
    steps_of = plan.num_steps[with_memory]
    pair_pos = np.repeat(with_memory, steps_of)  # (P,) one per (client, step)
    pair_step = _ranges(np.zeros_like(steps_of), steps_of)
    priorities = replay_priorities(rng, pair_pos.size, n)  # (P, N)
    k = np.tile(np.arange(n, dtype=np.int64), pair_pos.size)
    parts_pos.append(np.repeat(pair_pos, n))
    parts_step.append(np.repeat(pair_step, n))
    parts_kind.append(np.ones(pair_pos.size * n, dtype=np.int64))
    parts_item.append(memory_items[plan.clients[np.repeat(pair_pos, n)], k])
    parts_label.append(replay_label(k, priorities.ravel(), n).astype(np.float32))

    # Context entries: rows touched in an earlier step of the round, missing from this step
    # (only clients that distil need them: the others never score all items).
    if with_context and plan.items.size:
        multi = (plan.num_steps[ex_pos] > 1) & (plan.clients[ex_pos] < num_memory_users)
        if multi.any():
            num_items = int(plan.items.max()) + 1
            max_steps = int(plan.num_steps.max())
            keys = ex_pos[multi] * num_items + plan.items[multi]
            unique_keys, inverse = np.unique(keys, return_inverse=True)
            first_step = np.full(unique_keys.size, max_steps, dtype=np.int64)
            np.minimum.at(first_step, inverse, plan.steps[multi])
            owner = unique_keys // num_items
            later = plan.num_steps[owner] - 1 - first_step  # steps after the first visit
            ctx_pair = np.repeat(np.arange(unique_keys.size), later)
            ctx_step = _ranges(first_step + 1, later)
            present = np.unique(inverse * max_steps + plan.steps[multi])
            keep = ~np.isin(ctx_pair * max_steps + ctx_step, present)
            ctx_pair, ctx_step = ctx_pair[keep], ctx_step[keep]
            parts_pos.append(owner[ctx_pair])
            parts_step.append(ctx_step)
            parts_kind.append(np.full(ctx_pair.size, 2, dtype=np.int64))
            parts_item.append(unique_keys[ctx_pair] % num_items)
            parts_label.append(np.full(ctx_pair.size, CONTEXT_LABEL, dtype=np.float32))

    pos, step, kind = np.concatenate(parts_pos), np.concatenate(parts_step), np.concatenate(parts_kind)
    items, labels = np.concatenate(parts_item), np.concatenate(parts_label)
    order = np.lexsort((np.arange(pos.size), kind, step, pos))  # client, step, kind, original order
    indptr = np.zeros(num_clients + 1, dtype=np.int64)
    np.cumsum(np.bincount(pos, minlength=num_clients), out=indptr[1:])
    return RoundPlan(
        round_index=plan.round_index, clients=plan.clients, example_indptr=indptr, items=items[order],
        labels=labels[order], steps=step[order], num_steps=plan.num_steps, num_examples=plan.num_examples,
        batch_size=plan.batch_size, local_epochs=plan.local_epochs, noise_key=plan.noise_key,
    )


def _scores_of_local_models(model: FederatedModel, params: Mapping[str, torch.Tensor], batch: LocalBatch,
                            logits: torch.Tensor, download: Mapping[str, torch.Tensor]) -> torch.Tensor:
    """``(C, I)`` every item's score under each client's current local model (no gradient).

    Untouched rows equal the download; every row the client changed this round is in the
    batch (the plan's replay and context examples), and its live logit overrides the score
    computed from the download.
    """
    num_clients = logits.shape[0]
    if model.names("private_rows"):
        raise NotImplementedError("F3CRec's client side is defined for backbones without personal item tables")
    if model.names("public_dense"):
        # Shared layers are trained locally too: score with the clients' own copies.
        rows = torch.arange(model.num_items, device=logits.device).expand(num_clients, -1)  # (C, I)
        full = {name: (download[name] if kind == "public_rows" else params[name].detach())
                for name, kind in model.param_kinds.items()}
        scores = model.logits(full, rows)
    else:
        private = {name: params[name].detach() for name in model.names("private_dense")}
        scores = model.score_users(download, private, torch.arange(num_clients, device=logits.device))
    scores = scores.clone()
    c, b = (batch.mask > 0).nonzero(as_tuple=True)
    scores[c, batch.items[c, b]] = logits[c, b]
    return scores


class ReplayDistillationLoss:
    """F3CRec's client loss (Eqs. 1–6) as an engine ``client_loss``.

    ``L = base_loss(rec examples) + λ_KD · L_KD`` for clients with a memory row (users of
    block ``t−1``); the plain base loss for the others. Must run under
    :class:`~fedlib.baselines.continual.continual.PlanAugmentingExecutor` (it adds the replay rows).

    Args:
        memory_items: ``(U_old, N) int64`` ``S_u^{t−1}`` of every user of block ``t−1`` (Eq. 1).
        teacher_logits: ``(U_old, N)`` the block ``t−1`` model's logits of those items.
        lambda_kd: ``λ_KD`` (Eq. 6).
        eps: ``ε`` (Eq. 3).
        adaptive: True = Eqs. 2–4 (adaptive replay memory); False = distil all ``N`` items
            every step (the "w/o a.r.m" ablation, the KD baseline).
        seed: seeds the replay sampling (per round: ``round_generator(seed, round, REPLAY_STREAM)``).
        base_loss: the backbone's loss on its own examples (default BCE with logits, mean).
        kd_reduction: ``"mean"`` (public code) or ``"sum"`` (paper's Eq. 5).
        rank_strategy: see :func:`~fedlib.baselines.continual.continual.count_higher_scores`.
        record: keep ``(round, users, Δ, δ, |M|)`` of every call in :attr:`records`
            (to find static and dynamic users, paper Tables 4–5).
    """

    def __init__(self, memory_items: torch.Tensor, teacher_logits: torch.Tensor, *, lambda_kd: float, eps: float,
                 adaptive: bool = True, seed: int = 0, base_loss=None, kd_reduction: str = "mean",
                 rank_strategy: str = "compare", record: bool = False):
        self.memory_items = memory_items
        self.teacher_logits = teacher_logits
        self.memory_items_np = memory_items.detach().cpu().numpy().astype(np.int64)
        self.top_n = int(memory_items.shape[1])
        self.lambda_kd, self.eps, self.adaptive, self.seed = float(lambda_kd), float(eps), bool(adaptive), int(seed)
        self.base_loss = base_loss if base_loss is not None else bce_client_loss
        self.kd_reduction, self.rank_strategy, self.record = kd_reduction, rank_strategy, bool(record)
        self.records: List[dict] = []
        self._download: Optional[Mapping[str, torch.Tensor]] = None
        self._round: Optional[int] = None

    # -- called by PlanAugmentingExecutor ----------------------------------------------------
    def prepare_round(self, plan: RoundPlan, global_state, private_state=None) -> RoundPlan:
        """Keep the downloaded state (for Eq. 2) and add replay/context rows to the plan."""
        self._download, self._round = global_state, plan.round_index
        rng = round_generator(self.seed, plan.round_index, REPLAY_STREAM)
        return augment_plan_with_replay(plan, self.memory_items_np, rng, with_context=self.adaptive)

    def finish_round(self) -> None:
        self._download = None

    # -- the loss ------------------------------------------------------------------------------
    def __call__(self, model: FederatedModel, params: Mapping[str, torch.Tensor], batch: LocalBatch) -> torch.Tensor:
        valid = batch.mask > 0
        is_rec = valid & (batch.labels >= 0)
        rec_batch = LocalBatch(clients=batch.clients, rows=batch.rows, items=batch.items,
                               labels=batch.labels.clamp(min=0.0), mask=is_rec.to(batch.mask.dtype))
        rec = self.base_loss(model, params, rec_batch)  # (C,) the backbone's own loss, kept as a black box
        is_replay = valid & (batch.labels <= -1.0)
        if not bool(is_replay.any()):
            return rec
        if self._download is None:
            raise RuntimeError("ReplayDistillationLoss needs its round prepared: run it under PlanAugmentingExecutor")

        n = self.top_n
        num_clients = batch.clients.shape[0]
        logits = model.logits(params, batch.rows)  # (C, B)
        c_idx, b_idx = is_replay.nonzero(as_tuple=True)
        k, priority = decode_replay_label(batch.labels[c_idx, b_idx], n)
        student = logits.new_zeros((num_clients, n)).index_put((c_idx, k), logits[c_idx, b_idx])  # (C, N)
        priorities = torch.full((num_clients, n), n, dtype=torch.int64, device=logits.device)
        priorities[c_idx, k] = priority
        has_memory = torch.zeros(num_clients, dtype=torch.bool, device=logits.device)
        has_memory[c_idx] = True
        users = batch.clients.clamp(max=self.teacher_logits.shape[0] - 1)
        teacher = self.teacher_logits[users]  # (C, N)

        if self.adaptive:
            with torch.no_grad():
                scores = _scores_of_local_models(model, params, batch, logits.detach(), self._download)  # (C, I)
                ranks = student_ranks(scores, student.detach(), self.rank_strategy)  # (C, N)
                shift = preference_shift(ranks)  # Eq. 2
                rate = consistency_sampling_rate(shift, self.eps)  # Eq. 3
                sizes = replay_memory_size(rate, n)  # Eq. 4
            if self.record:
                self.records.append({"round": self._round, "users": batch.clients[has_memory].cpu().numpy(),
                                     "shift": shift[has_memory].cpu().numpy(), "rate": rate[has_memory].cpu().numpy(),
                                     "size": sizes[has_memory].cpu().numpy()})
        else:
            sizes = torch.full((num_clients,), n, dtype=torch.int64, device=logits.device)
        selected = adaptive_replay_memory(priorities, sizes) & has_memory[:, None]  # Eq. 4
        distillation = kd_loss(student, teacher, selected, self.kd_reduction)  # Eq. 5
        return total_client_loss(rec, distillation, self.lambda_kd)  # Eq. 6


    # -- closed-form gradients (fedlib.engine.linear_head) -----------------------------------
    def closed_form_applies(self, model: FederatedModel) -> bool:
        """Whether :meth:`logit_gradients` gives this loss for ``model``: the default base loss
        and no shared dense layers or personal tables (every score is then linear in the item row)."""
        return (self.base_loss is bce_client_loss and not model.names("public_dense")
                and not model.names("private_rows"))

    def logit_gradients(self, step) -> Tuple[torch.Tensor, torch.Tensor]:
        """This loss and its gradient with respect to each example's logit, on unpadded examples.

        The same Eqs. 1-6 as :meth:`__call__` (its reference, ``tests/test_f3crec_components.py``
        compares the two in float64) for a backbone whose logits are linear in the item rows
        (FedMF, PFedRec): with ``n_c`` client ``c``'s recommendation examples, ``t_e`` the
        teacher's probability of replay example ``e`` and ``m_c = max(1, |M_c|)``::

            ∂L_c/∂s_e = (σ(s_e) − y_e) / n_c                 recommendation example
                      = λ_KD (σ(s_e) − t_e) / m_c · [e ∈ M_c]   replay example ("sum": without / m_c)
                      = 0                                      context example

        Args:
            step: a :class:`~fedlib.engine.linear_head.StepLogits` of ``C`` clients and ``E``
                examples (labels as coded by :func:`augment_plan_with_replay`).

        Returns:
            ``(loss (C,), g (E,))``.
        """
        logits, client, labels = step.logits, step.client, step.labels
        num_clients = step.users.shape[0]
        dtype, device = logits.dtype, logits.device
        is_rec = (labels >= 0).to(dtype)
        targets = labels.clamp(min=0.0)
        rec_count = torch.zeros(num_clients, dtype=dtype, device=device).index_add_(0, client, is_rec)
        bce = F.binary_cross_entropy_with_logits(logits, targets, reduction="none") * is_rec  # (E,)
        rec = torch.zeros(num_clients, dtype=dtype, device=device).index_add_(0, client, bce) / rec_count
        g = (torch.sigmoid(logits) - targets) * is_rec / rec_count.index_select(0, client)  # (E,)
        replay = torch.nonzero(labels <= -1.0).squeeze(1)  # (R,)
        if replay.numel() == 0:
            return rec, g
        if self._download is None:
            raise RuntimeError("ReplayDistillationLoss needs its round prepared: run it under PlanAugmentingExecutor")

        n = self.top_n
        replay_client = client.index_select(0, replay)  # (R,)
        k, priority = decode_replay_label(labels.index_select(0, replay), n)
        student_e = logits.index_select(0, replay)  # (R,)
        users = step.users.clamp(max=self.teacher_logits.shape[0] - 1)
        teacher = torch.sigmoid(self.teacher_logits[users[replay_client], k]).to(dtype)  # (R,)
        if self.adaptive:
            with torch.no_grad():
                # Every item's score under each client's local model: the download, overridden by
                # the live logits of every row the client changed this round (all in the step).
                scores = step.model.score_users(self._download, step.head,
                                                torch.arange(num_clients, device=device)).clone()  # (C, I)
                scores[client, step.items] = logits
                student = logits.new_zeros((num_clients, n)).index_put((replay_client, k), student_e)  # (C, N)
                ranks = student_ranks(scores, student, self.rank_strategy)  # (C, N)
                shift = preference_shift(ranks)  # Eq. 2
                rate = consistency_sampling_rate(shift, self.eps)  # Eq. 3
                sizes = replay_memory_size(rate, n)  # Eq. 4
            if self.record:
                has_memory = torch.zeros(num_clients, dtype=torch.bool, device=device)
                has_memory[replay_client] = True
                self.records.append({"round": self._round, "users": step.users[has_memory].cpu().numpy(),
                                     "shift": shift[has_memory].cpu().numpy(), "rate": rate[has_memory].cpu().numpy(),
                                     "size": sizes[has_memory].cpu().numpy()})
        else:
            sizes = torch.full((num_clients,), n, dtype=torch.int64, device=device)
        selected = (priority < sizes.index_select(0, replay_client)).to(dtype)  # (R,) e ∈ M_c, Eq. 4
        per_item = F.binary_cross_entropy_with_logits(student_e, teacher, reduction="none") * selected
        distillation = torch.zeros(num_clients, dtype=dtype, device=device).index_add_(0, replay_client, per_item)
        g_replay = self.lambda_kd * (torch.sigmoid(student_e) - teacher) * selected
        if self.kd_reduction == "mean":
            count = torch.zeros(num_clients, dtype=dtype, device=device).index_add_(0, replay_client, selected)
            count = count.clamp(min=1.0)
            distillation = distillation / count  # Eq. 5
            g_replay = g_replay / count.index_select(0, replay_client)
        elif self.kd_reduction != "sum":
            raise ValueError(f"reduction must be 'mean' or 'sum', got {self.kd_reduction!r}")
        g = g.index_add(0, replay, g_replay)
        return total_client_loss(rec, distillation, self.lambda_kd), g  # Eq. 6


def _first_occurrences(items: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """``(C, B) bool``: True at the first valid occurrence of each item in each client's row."""
    marked = torch.where(valid, items, torch.full_like(items, -1))
    sorted_items, order = torch.sort(marked, dim=1, stable=True)
    first_sorted = torch.ones_like(sorted_items, dtype=torch.bool)
    first_sorted[:, 1:] = sorted_items[:, 1:] != sorted_items[:, :-1]
    first = torch.zeros_like(first_sorted).scatter(1, order, first_sorted)
    return first & valid


class ParameterRegularisationLoss:
    """The Reg baseline's client loss: ``L_rec + λ Σ (θ − θ^{t−1})²``.

    The squared distance (an MSE with ``reduction="sum"``) to the previous block's
    best-validation parameters covers what a client holds of the model in a step: its private
    parameters (user vector, private head) if it existed in block ``t−1``, its copies of the
    public dense tensors, and the item rows of its current batch that existed in block ``t−1``
    (each distinct row once).

    Stability: F3CRec's item learning rate is ``lr × num_items`` (× ``lr_eta``), so one step
    pulls an old row by ``2 λ lr_item (q − q^{t−1})``; with plain SGD this is stable only for
    ``λ < 1 / lr_item`` (FedMF, lr 1, 1,152 items: ``λ < 8.7e-4``). Larger values of the
    paper's grid (up to 1) make the item rows oscillate and diverge.

    Args:
        previous_global, previous_private: block ``t−1``'s best-validation state.
        lambda_reg: ``λ`` (F3CRec searched Reg's λ on the same grid as λ_KD).
        base_loss: the backbone's loss (default BCE with logits, mean).
    """

    def __init__(self, previous_global: Mapping[str, torch.Tensor], previous_private: Mapping[str, torch.Tensor],
                 lambda_reg: float, base_loss=None):
        self.previous_global = {k: v.detach() for k, v in previous_global.items()}
        self.previous_private = {k: v.detach() for k, v in previous_private.items()}
        self.lambda_reg = float(lambda_reg)
        self.base_loss = base_loss if base_loss is not None else bce_client_loss

    def __call__(self, model: FederatedModel, params: Mapping[str, torch.Tensor], batch: LocalBatch) -> torch.Tensor:
        loss = self.base_loss(model, params, batch)  # (C,)
        num_clients = batch.clients.shape[0]
        penalty = loss.new_zeros(num_clients)
        for name in model.names("private_dense"):
            old = self.previous_private[name]
            existed = (batch.clients < old.shape[0]).to(loss.dtype)  # (C,)
            diff = (params[name] - old[batch.clients.clamp(max=old.shape[0] - 1)]).reshape(num_clients, -1)
            penalty = penalty + diff.pow(2).sum(1) * existed
        for name in model.names("public_dense"):
            diff = (params[name] - self.previous_global[name].unsqueeze(0)).reshape(num_clients, -1)
            penalty = penalty + diff.pow(2).sum(1)
        first = _first_occurrences(batch.items, batch.mask > 0)
        for name in model.names("public_rows"):
            old = self.previous_global[name]
            counted = (first & (batch.items < old.shape[0])).to(loss.dtype)  # (C, B)
            rows = params[name][batch.rows]  # (C, B, d) local rows of the batch
            diff = rows - old[batch.items.clamp(max=old.shape[0] - 1)]
            penalty = penalty + (diff.pow(2).sum(-1) * counted).sum(1)
        return loss + self.lambda_reg * penalty


# ======================================================================================
# The methods
# ======================================================================================
@dataclass
class F3CRec(ContinualMethod):
    """F3CRec and its ablations (see the module docstring for the flags).

    Defaults are the authors' README example for FedMF on ML-100K (λ_KD 0.1, ε 0.006, N 30,
    β 0.9); the paper tunes them per dataset (§5.1: ε's scale differs by dataset).

    Attributes:
        lambda_kd, eps, top_n, beta: ``λ_KD`` (Eq. 6), ``ε`` (Eq. 3), ``N`` (Eq. 1), ``β`` (Eq. 9).
        client_cl, adaptive_replay, server_cl, itemwise: the ablation flags.
        memory_refresh: which users' top-N lists are rebuilt after a block (:data:`MEMORY_REFRESH`).
            ``"all"``: every user's list and teacher logits from the newest best model.
            ``"trained"``: the public code's behaviour: only users who trained in the block get
            a new list; the others keep their older list, with teacher logits recomputed from
            the newest model (users new in a block always train in it, so they get a list).
        kd_reduction: ``"mean"`` (code) or ``"sum"`` (paper's Eq. 5).
        rank_strategy: see :func:`~fedlib.baselines.continual.continual.count_higher_scores`.
        record_shifts: keep Δ/δ/|M| per call (``self.losses[block].records``).
        name: label in results.
    """

    lambda_kd: float = 0.1
    eps: float = 0.006
    top_n: int = 30
    beta: float = 0.9
    client_cl: bool = True
    adaptive_replay: bool = True
    server_cl: bool = True
    itemwise: bool = True
    memory_refresh: str = "all"
    kd_reduction: str = "mean"
    rank_strategy: str = "compare"
    record_shifts: bool = False
    name: str = "F3CRec"

    def __post_init__(self):
        if self.memory_refresh not in MEMORY_REFRESH:
            raise ValueError(f"memory_refresh must be one of {MEMORY_REFRESH} (rebuild every user's top-N list, or "
                             f"only those of users who trained in the block), got {self.memory_refresh!r}")
        if not 0.0 <= self.beta < 1.0:
            raise ValueError("beta must lie in [0, 1)")
        self.losses: Dict[int, ReplayDistillationLoss] = {}

    def make_method(self, ctx: BlockContext) -> FederatedMethod:
        base = ctx.base_method
        previous = ctx.previous
        if previous is None:  # block 0: the plain backbone (F3CRec starts at t = 1)
            return base
        changes = {}
        if self.client_cl:
            loss = ReplayDistillationLoss(
                previous.memory["topn_items"], previous.memory["topn_logits"], lambda_kd=self.lambda_kd,
                eps=self.eps, adaptive=self.adaptive_replay, seed=ctx.config.seed, base_loss=base.client_loss,
                kd_reduction=self.kd_reduction, rank_strategy=self.rank_strategy, record=self.record_shifts)
            self.losses[ctx.index] = loss
            changes["client_loss"] = loss
        if self.server_cl:
            tables = {name: previous.global_state[name] for name in ctx.model.names("public_rows")}
            changes["server_mix"] = item_temporal_mean_mix(tables, self.beta, self.itemwise)
        return dataclasses.replace(base, name=f"{base.name}+{self.name}", **changes) if changes else base

    def after_block(self, ctx: BlockContext, global_state, private_state) -> Dict[str, object]:
        """Top-N lists and teacher logits of every user of this block (Eq. 1 for block ``t+1``)."""
        if not self.client_cl:
            return {}
        model = ctx.model
        device = next(iter(global_state.values())).device
        items_parts, logits_parts = [], []
        with torch.no_grad():
            for start in range(0, model.num_users, 512):
                users = torch.arange(start, min(start + 512, model.num_users), device=device)
                scores = model.score_users(global_state, private_state, users)  # (n, I)
                items, logits = top_n_memory(scores, self.top_n)
                items_parts.append(items)
                logits_parts.append(logits)
            items, logits = torch.cat(items_parts), torch.cat(logits_parts)  # (U, N)
            previous = ctx.previous.memory if ctx.previous is not None else {}
            if self.memory_refresh == "trained" and "topn_items" in previous:
                # Users who did not train in this block keep their older list (public code);
                # their teacher logits come from the newest model all the same.
                old_items = previous["topn_items"].to(device)
                kept = torch.ones(old_items.shape[0], dtype=torch.bool, device=device)
                trained = torch.as_tensor(ctx.split.train.active_users(), device=device)
                kept[trained[trained < old_items.shape[0]]] = False
                kept_users = torch.nonzero(kept).squeeze(1)
                if kept_users.numel():
                    items[kept_users] = old_items[kept_users]
                    rows = model.score_users(global_state, private_state, kept_users)
                    logits[kept_users] = rows.gather(1, old_items[kept_users])
        return {"topn_items": items, "topn_logits": logits}


def kd_baseline(lambda_kd: float = 0.1, top_n: int = 30, **kwargs) -> F3CRec:
    """KD (F3CRec §5.1): distil the whole previous top-N list every step, no server CL."""
    return F3CRec(lambda_kd=lambda_kd, top_n=top_n, adaptive_replay=False, server_cl=False, name="KD", **kwargs)


@dataclass
class ParameterRegularisation(ContinualMethod):
    """Reg (F3CRec §5.1): squared distance to the previous block's parameters.

    See :class:`ParameterRegularisationLoss` for what is regularised.
    """

    lambda_reg: float = 1e-3
    name: str = "Reg"

    def make_method(self, ctx: BlockContext) -> FederatedMethod:
        if ctx.previous is None:
            return ctx.base_method
        loss = ParameterRegularisationLoss(ctx.previous.global_state, ctx.previous.private_state, self.lambda_reg,
                                           base_loss=ctx.base_method.client_loss)
        return dataclasses.replace(ctx.base_method, client_loss=loss, name=f"{ctx.base_method.name}+{self.name}")


# The registry's continual methods of this paper (fedlib.baselines.registry); FT, RLP2 and SPP
# are registered with the baselines.
register("F3CRec", "continual", paper="f3crec")(F3CRec)
register("KD", "continual")(kd_baseline)
register("Reg", "continual")(ParameterRegularisation)
