r"""SPP: stability/plasticity proxies with ranking-discrepancy replay, adapted to federated training.

References:
    Lee, Kang, Kweon, Yu. "Continual Collaborative Distillation for Recommender System."
    KDD 2024, pp. 1495–1505 (CCD; the student side's "stability-plasticity proxy" replay).
    Lim, Kweon, Kim, Kim, Choi, Kim, Yu. "Federated Continual Recommendation." CIKM 2025
    (F3CRec), §5.1: SPP "leverages a stability-plasticity proxy and ranking discrepancy-based
    replay memory, with proxies applied to both private (client) and public (server)
    parameters in the FL setting". No code of that federated adaptation was released (the
    authors' public code, https://github.com/Jaehyung-Lim/F3CRec-CIKM-25, has F3CRec only);
    this module rebuilds it from that sentence and CCD's public code
    (https://github.com/Gyu-Seok0/CCD_KDD24, ``Utils/utils.py: get_replay_learning_rank_dataset``,
    ``Run/S_update.py``).

Proxies of block ``t ≥ 1`` (block 0 is plain training), fixed for the whole block::

    stability  θ^S = block t−1's best-validation state (Q^{t−1}, each user's p_u^{t−1})
    plasticity θ^P = the backbone fine-tuned on D_t from block t−1's state (an extra FT run
                     of the block, best validation round kept)

Client side, every round ``r`` of block ``t``, for every participating user ``u`` and each
proxy ``X ∈ {S, P}`` the user has (new users of block ``t`` have no ``θ^S``)::

    C^X_u        = top-A items of u's proxy scores s^X_u (u's current-block train items
                   masked; S: old items only)                                         (A,)
    r^X_u(i)     = k for the k-th item of C^X_u  (1-based)
    r_u(i)       = 1 + #{j : s_uj > s_ui}, s_u = scores of the downloaded Q with u's current
                   private part (same train items masked)
    P^X_u(i)     = exp(ε (r_u(i) − r^X_u(i))) / Σ_{j ∈ C^X_u} exp(ε (r_u(j) − r^X_u(j)))
    M^X_u        = n items of C^X_u drawn without replacement from P^X_u
    y_ui         = σ(s^X_ui)                                                        soft label
    M_u          = M^S_u ∪ M^P_u,   y_ui = max over the proxies that drew i

    L(u)         = L_rec(u) + λ_replay · exp(−r / a_T) · (1/|B_u|) Σ_{i ∈ M_u} BCE(s_ui, y_ui)

with ``L_rec(u)`` the backbone's loss, a mean over the ``|B_u|`` recommendation examples of the
local step, so each replay row weighs ``λ_replay · exp(−r / a_T)`` times one recommendation
example, as in CCD, where both losses are sums.

Items the current model ranks much lower than a proxy did (forgotten by the current model)
are the most likely to be replayed. ``M_u`` is drawn once per round and added to every local
step of the round (the rows reach the loss as extra plan examples, see
:class:`SPPReplayLoss`).

Server side, after every aggregation of block ``t`` (for every ``public_rows`` table)::

    Q_i ← (1 − w) Q'_i + w · (½ Q^S_i + ½ Q^P_i)     old items i < |I^{t−1}|
    Q_i ← (1 − w) Q'_i + w · Q^P_i                    new items (``mix_new_items``)

with one uniform weight ``w`` (``server_weight``) for every item: F3CRec contrasts exactly this
"uniform retention across users and items" with its item-wise temporal mean.

Assumptions and simplifications (each a choice where neither paper nor code says more):

1. **Proxies.** CCD's student keeps its proxies as exponential moving averages of past
   student models (``s_weight``/``p_weight``; its example run uses ``p_weight = 0``, i.e. the
   plasticity proxy is the most recent model). Following F3CRec's description, the stability
   proxy here is block ``t−1``'s best-validation model and the plasticity proxy a fine-tuned
   model of block ``t`` (plain FT, ``plasticity_rounds`` rounds, selected on the block's
   validation N@20 with the block's patience). No EMA across blocks.
2. **Plasticity cost.** The plasticity proxy is a second federated training of the block
   before the actual one (all block users, every round), and every client downloads the
   proxy's public tables once more. On ML-100K D1 (FedMF, CPU, 60 rounds, patience 30) the
   proxy run cost as much as FT's whole block (26.5 s vs 26.8 s); the main run took ≈ 100 s
   more, because a loss other than the plain BCE sends the batched executor down its generic
   autograd path instead of its analytic FedMF kernel, plus ≈ 0.2 s per round to rank. Its
   run uses the block's config seed, so its round plans are those of the main run; its new
   rows are drawn with ``growth_seed`` (default the block seed). Pass the run's seed as
   ``growth_seed`` to start it exactly where ``run_continual`` starts the block: with
   ``plasticity_rounds`` equal to the block's rounds it is then the FT model of the block.
3. **Knowledge per user.** Each client uses only its own rows: its private parameters of
   each proxy (kept locally) and the proxies' public tables (``Q^{t−1}`` was downloaded in
   block ``t−1``, ``Q^P`` once after the proxy run). New users of block ``t`` have no
   stability proxy and replay from the plasticity proxy only. The stability proxy only
   knows the old items, so its candidates are old items.
4. **Masking.** As in CCD (``filtering_simple``), the user's training items are removed
   from the proxies' candidate lists; here only the *current* block's training items (the
   FCRec setting forbids keeping older interactions). The same items are masked in the
   current ranking, so both ranks count only unmasked items.
5. **Current ranks.** CCD ranks with the block-start student (its replay set is resampled
   every 5 epochs from fixed matrices). Here ``r_u`` comes from the state each client
   downloads in the round (global tables + its private part), so the replay set follows the
   model, once per round; the current rank is over all ``|I^t|`` items (incl. new items).
6. **Sampling.** ``torch.multinomial(p, n)`` without replacement (CCD) is drawn as a
   Gumbel-top-``n`` (the same Plackett–Luce distribution) with noise from
   ``round_generator(seed, round, SPP_STREAM)``, so every executor sees the same draws.
   With fewer than ``n`` unmasked candidates all of them are replayed.
7. **Where the replay loss goes and its scale.** CCD takes separate Adam steps on replay
   mini-batches after each epoch, with sum-reduced BPR and sum-reduced replay BCE. Here the
   replay term is added to every local step's loss (like F3CRec's KD). The backbones' loss
   is a *mean* over the step's examples, so the replay sum is divided by the same count
   (``reduction="example"``): the relative weight of one replay example and one training
   example is CCD's ``λ_replay · exp(−epoch / a_T)``. A mean over the ≤ 2n replay rows
   (``"mean"``) instead gives each replay row ``λ_replay |B_u| / |M_u|`` ≈ 4–18× the weight
   of a training example on ML-100K (``|B_u|`` ≈ 100–512 examples per step). With FedMF's
   item learning rate ``lr × |I|`` that collapsed the model on ML-100K D1 (validation N@20
   0.09 → 0.02 within four rounds; test N@20 0.12 vs FT's 0.18).
8. **Annealing.** CCD's ``exp(−epoch / a_T)`` uses the 0-based round of the block as the epoch.
9. **Server side.** Unspecified by F3CRec beyond "proxies applied to public parameters":
   implemented as a uniform pull of the aggregated item tables towards the mean of the two
   proxies' tables after every round; new items are pulled towards the plasticity proxy
   (``mix_new_items``) or left as aggregated. Public dense tensors (none in F3CRec's three
   backbones) are left as aggregated.
10. **Defaults.** ``absolute`` 50 (CCD's example run; its argparse default is 100),
    ``num_replay`` 10 per proxy (CCD's example draws 3 + 1 from its much larger datasets;
    F3CRec replays up to N = 30 items), ``λ_replay`` 0.5 and ``a_T`` 10 (CCD), ``w`` 0.1.
    ``ε``: CCD uses 1e-4 for tens of thousands of items; what matters is ``ε`` times the
    spread of the rank gaps ``r_u − r^X_u`` among the ``A`` candidates. On ML-100K D1 (FedMF,
    1,146 items) the gaps' 5–95 % range grew from about −20…+140 (round 10) to −20…+400
    (round 50) for the stability proxy and −20…+50 to −20…+150 for the plasticity proxy
    (they are all 0 for the stability proxy in round 0, where the current model *is* that
    proxy: uniform draws). With ``ε = 0.01`` the sampling distributions' mean perplexity
    (``exp`` of the entropy; ``A`` = uniform, 1 = argmax) was 19–37 (stability) and 24–45
    (plasticity) of ``A = 50``: focused on the forgotten items without being an argmax
    (``ε = 0.1`` puts ``e^{10}`` on a 100-rank gap, practically an argmax).
"""
from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from typing import Dict, Mapping, Optional, Tuple

import numpy as np
import torch
import torch.nn.functional as F

from fedlib.engine import BatchedExecutor, FederatedMethod, LocalBatch, RankingEvaluator, bce_client_loss, run_federated
from fedlib.engine.aggregation import ServerMixFn
from fedlib.engine.plan import RoundPlan, round_generator
from fedlib.baselines.continual.continual import BlockContext, ContinualMethod, initial_block_state, student_ranks
from fedlib.models.base import FederatedModel

__all__ = [
    "SPP_STREAM", "proxy_candidates", "rank_discrepancy_log_weights", "replay_probabilities", "sample_replay",
    "merge_replay_sets", "encode_replay_target", "decode_replay_target", "append_to_every_step",
    "REDUCTIONS", "replay_bce", "proxy_mixture_mix", "SPPReplayLoss", "SPP",
]

#: ``round_generator`` stream of SPP's replay draws (0 = round plan, 1 = upload noise, 0x5EED = F3CRec).
SPP_STREAM = 0x5BB
#: Users scored at once when ranking (``chunk × num_items`` scores in memory).
_CHUNK = 512


# ======================================================================================
# Ranks, sampling distribution, merge
# ======================================================================================
def _mask_rows(scores: torch.Tensor, users: torch.Tensor, indptr: np.ndarray, items: np.ndarray) -> torch.Tensor:
    """``scores`` with each user's items ``items[indptr[u]:indptr[u+1]]`` (ids < width) set to −inf."""
    users_np = users.detach().cpu().numpy()
    starts, ends = indptr[users_np], indptr[users_np + 1]
    counts = ends - starts
    if counts.sum() == 0:
        return scores
    row = np.repeat(np.arange(users_np.size), counts)
    take = np.arange(int(counts.sum())) + np.repeat(starts - (np.cumsum(counts) - counts), counts)
    col = items[take]
    keep = col < scores.shape[1]
    out = scores.clone()
    out[torch.as_tensor(row[keep], device=scores.device), torch.as_tensor(col[keep], device=scores.device)] = float("-inf")
    return out


def proxy_candidates(scores: torch.Tensor, absolute: int) -> Tuple[torch.Tensor, torch.Tensor]:
    """A proxy's top-``absolute`` items per user, best first: ``C^X_u`` and the proxy's logits.

    Args:
        scores: ``(n, I)`` proxy logits, masked items already −inf.
        absolute: ``A``; clamped to ``I``.

    Returns:
        ``(items (n, A) int64, logits (n, A))``; the proxy's 1-based rank of ``items[:, k]`` is
        ``k + 1``. A −inf logit marks a masked (invalid) candidate.
    """
    a = min(int(absolute), scores.shape[1])
    logits, items = torch.topk(scores, a, dim=1, largest=True, sorted=True)
    return items, logits


def rank_discrepancy_log_weights(current_ranks: torch.Tensor, valid: torch.Tensor, eps: float) -> torch.Tensor:
    """``ε (r_u(i) − r^X_u(i))`` of each candidate, −inf for invalid ones: ``(n, A)`` float64.

    Args:
        current_ranks: ``(n, A)`` 1-based current ranks of the proxy's candidates ``C^X_u``.
        valid: ``(n, A) bool`` candidates that may be drawn.
        eps: ``ε``.
    """
    proxy_ranks = torch.arange(1, current_ranks.shape[1] + 1, device=current_ranks.device)
    logw = float(eps) * (current_ranks - proxy_ranks).to(torch.float64)
    return logw.masked_fill(~valid, float("-inf"))


def replay_probabilities(log_weights: torch.Tensor) -> torch.Tensor:
    """``P^X_u(i) ∝ exp(ε (r_u(i) − r^X_u(i)))`` over the valid candidates: ``(n, A)``, rows sum to 1.

    (The probability of being the *first* draw; :func:`sample_replay` draws ``n`` without
    replacement, successively renormalised, as ``torch.multinomial`` does.)
    """
    return torch.softmax(log_weights, dim=1)


def sample_replay(log_weights: torch.Tensor, gumbel: torch.Tensor, num: int) -> Tuple[torch.Tensor, torch.Tensor]:
    """``num`` candidates per row without replacement, ``∝ exp(log_weights)`` (Gumbel-top-k).

    Args:
        log_weights: ``(n, A)`` unnormalised log-probabilities (−inf = never drawn).
        gumbel: ``(n, A)`` standard Gumbel noise (the round's draws).
        num: draws per row (clamped to ``A``).

    Returns:
        ``(positions (n, k) int64, drawn (n, k) bool)``: columns of the drawn candidates in
        draw order; ``drawn`` is False where a row had fewer valid candidates than ``k``.
    """
    k = min(int(num), log_weights.shape[1])
    keys = log_weights + gumbel.to(device=log_weights.device, dtype=log_weights.dtype)
    values, positions = torch.topk(keys, k, dim=1, largest=True, sorted=True)
    return positions, torch.isfinite(values)


def merge_replay_sets(items: torch.Tensor, targets: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """Union of replay sets per row; an item drawn more than once keeps its largest label.

    Args:
        items: ``(n, m) int64`` drawn items (e.g. the stability draws, then the plasticity draws).
        targets: ``(n, m)`` their soft labels.
        valid: ``(n, m) bool`` real draws.

    Returns:
        ``(n, m) bool`` keep mask: for every distinct valid ``(row, item)`` exactly one entry,
        one with the maximal label (CCD's ``max_dict``).
    """
    if items.numel() == 0:
        return valid.clone()
    neg_inf = torch.finfo(targets.dtype).min
    score = torch.where(valid, targets, torch.full_like(targets, neg_inf))
    by_label = torch.argsort(score, dim=1, descending=True, stable=True)  # largest label first
    marked = torch.where(valid, items, torch.full_like(items, -1)).gather(1, by_label)
    by_item = torch.argsort(marked, dim=1, stable=True)  # groups of equal items, largest label first
    order = by_label.gather(1, by_item)
    sorted_items = marked.gather(1, by_item)
    first = torch.ones_like(sorted_items, dtype=torch.bool)
    first[:, 1:] = sorted_items[:, 1:] != sorted_items[:, :-1]
    keep = torch.zeros_like(first).scatter(1, order, first)
    return keep & valid


# ======================================================================================
# Label codes and the plan
# ======================================================================================
def encode_replay_target(target):
    """Plan label of a replay example with soft target ``y ∈ [0, 1]``: ``−(1 + y) ∈ [−2, −1]``."""
    return -(1.0 + target)


def decode_replay_target(labels: torch.Tensor) -> torch.Tensor:
    """Inverse of :func:`encode_replay_target` (exact up to float32 rounding, ≈ 1e-7)."""
    return (-labels - 1.0).clamp(0.0, 1.0)


def _ranges(starts: np.ndarray, counts: np.ndarray) -> np.ndarray:
    offsets = np.cumsum(counts) - counts
    return np.arange(int(counts.sum()), dtype=np.int64) + np.repeat(starts - offsets, counts)


def append_to_every_step(plan: RoundPlan, positions: np.ndarray, items: np.ndarray, labels: np.ndarray) -> RoundPlan:
    """Add extra examples to every local step of their client.

    Args:
        plan: the engine's round plan.
        positions: ``(R,) int64`` client positions (indices into ``plan.clients``).
        items, labels: ``(R,)`` the extra examples (labels: codes the loss recognises).

    Returns:
        The plan with example ``r`` appended to each of the ``num_steps`` steps of client
        ``positions[r]`` (sorted by client, step; original examples first within a step).
        ``num_examples`` (aggregation weights) is unchanged.
    """
    positions = np.asarray(positions, dtype=np.int64)
    items = np.asarray(items, dtype=np.int64)
    labels = np.asarray(labels, dtype=np.float32)
    steps_of = plan.num_steps[positions]  # (R,)
    extra_pos = np.repeat(positions, steps_of)
    extra_step = _ranges(np.zeros_like(steps_of), steps_of)
    extra_item, extra_label = np.repeat(items, steps_of), np.repeat(labels, steps_of)
    ex_pos = plan.example_positions()
    pos = np.concatenate([ex_pos, extra_pos])
    step = np.concatenate([plan.steps, extra_step])
    kind = np.concatenate([np.zeros(ex_pos.size, dtype=np.int64), np.ones(extra_pos.size, dtype=np.int64)])
    all_items = np.concatenate([plan.items, extra_item])
    all_labels = np.concatenate([plan.labels.astype(np.float32), extra_label])
    order = np.lexsort((np.arange(pos.size), kind, step, pos))
    indptr = np.zeros(plan.num_clients + 1, dtype=np.int64)
    np.cumsum(np.bincount(pos, minlength=plan.num_clients), out=indptr[1:])
    return RoundPlan(
        round_index=plan.round_index, clients=plan.clients, example_indptr=indptr, items=all_items[order],
        labels=all_labels[order], steps=step[order], num_steps=plan.num_steps, num_examples=plan.num_examples,
        batch_size=plan.batch_size, local_epochs=plan.local_epochs, noise_key=plan.noise_key,
    )


# ======================================================================================
# Loss and server mix
# ======================================================================================
REDUCTIONS = ("example", "mean", "sum")


def replay_bce(logits: torch.Tensor, targets: torch.Tensor, selected: torch.Tensor, reduction: str = "example",
               num_rec: Optional[torch.Tensor] = None) -> torch.Tensor:
    """BCE-with-logits of the replay rows, per client: ``(C,)`` (0 for a client without any).

    Args:
        logits: ``(C, B)`` current logits; targets: ``(C, B)`` soft labels; selected: ``(C, B) bool``.
        reduction: ``"example"``: sum over the client's replay rows divided by ``num_rec``, its
            number of recommendation examples in the step, so that next to a mean-reduced
            recommendation loss every replay row weighs as much as one recommendation example
            (CCD sums both losses); ``"mean"``: mean over the replay rows; ``"sum"``: plain sum.
        num_rec: ``(C,)`` recommendation examples per client (needed by ``"example"``).
    """
    per_row = F.binary_cross_entropy_with_logits(logits, targets.to(logits.dtype), reduction="none")
    weight = selected.to(logits.dtype)
    total = (per_row * weight).sum(1)
    if reduction == "sum":
        return total
    if reduction == "mean":
        return total / weight.sum(1).clamp(min=1.0)
    if reduction == "example":
        if num_rec is None:
            raise ValueError("reduction='example' needs num_rec")
        return total / num_rec.to(logits.dtype).clamp(min=1.0)
    raise ValueError(f"reduction must be one of {REDUCTIONS}, got {reduction!r}")


def proxy_mixture_mix(stability_tables: Mapping[str, torch.Tensor], plasticity_tables: Mapping[str, torch.Tensor],
                      weight: float, mix_new_items: bool = True) -> ServerMixFn:
    """SPP's server side as an engine ``server_mix`` hook (assumption 9 of the module docstring).

    Args:
        stability_tables: ``name -> (I_old, d)`` block ``t−1``'s best-validation tables.
        plasticity_tables: ``name -> (I, d)`` the plasticity proxy's tables.
        weight: ``w ∈ [0, 1]``, the same for every item.
        mix_new_items: pull new items (``i ≥ I_old``) towards the plasticity proxy; False
            leaves them as aggregated.

    Returns:
        ``mix(previous_global, aggregated, round) -> new_global``:
        ``Q_i = (1 − w) Q'_i + w (½ Q^S_i + ½ Q^P_i)`` for old items, ``(1 − w) Q'_i + w Q^P_i``
        (or ``Q'_i``) for new ones.
    """
    w = float(weight)
    if not 0.0 <= w <= 1.0:
        raise ValueError("server weight must lie in [0, 1]")
    anchors = {}
    for name, plastic in plasticity_tables.items():
        stable = stability_tables[name].to(device=plastic.device, dtype=plastic.dtype)
        anchor = plastic.detach().clone()
        anchor[:stable.shape[0]] = 0.5 * stable + 0.5 * plastic[:stable.shape[0]]
        row_weight = torch.full((plastic.shape[0], 1), w, dtype=plastic.dtype, device=plastic.device)
        if not mix_new_items:
            row_weight[stable.shape[0]:] = 0.0
        anchors[name] = (anchor, row_weight)

    def mix(previous_global, aggregated, round_index):
        out = dict(aggregated)
        for name, (anchor, row_weight) in anchors.items():
            out[name] = (1.0 - row_weight) * aggregated[name] + row_weight * anchor
        return out

    return mix


class SPPReplayLoss:
    """SPP's client loss: ``L_rec + λ_replay exp(−r/a_T) · BCE(replay rows)`` as an engine ``client_loss``.

    Holds each user's proxy candidates (fixed for the block); :meth:`prepare_round` draws
    the round's replay set of every participant from its current ranks and adds it to every
    local step (labels :func:`encode_replay_target`). Must run under
    :class:`~fedlib.baselines.continual.continual.PlanAugmentingExecutor`.

    Args:
        model: the block's backbone (scores the downloaded state).
        stability_items, stability_logits: ``(U_old, A)`` stability candidates (best first) and
            the proxy's logits (−inf = masked); ``None`` = no stability proxy.
        plasticity_items, plasticity_logits: ``(U, A)`` the same for the plasticity proxy
            (``None`` = none).
        train_indptr, train_items: the block's training pairs (CSR by user), masked in the
            current ranking (assumption 4).
        eps, num_replay, lambda_replay, a_t, reduction: see :class:`SPP`.
        seed: seeds the draws (``round_generator(seed, round, SPP_STREAM)``).
        base_loss: the backbone's loss (default BCE with logits, mean).
        rank_strategy: see :func:`fedlib.baselines.continual.continual.count_higher_scores`.
        record: keep, per round, the clients, their number of replayed items, and per proxy
            the quantiles (5/25/50/75/95 %) of the rank gaps ``r_u − r^X_u`` of the valid
            candidates and the mean perplexity of ``P^X_u`` (in :attr:`records`).
    """

    def __init__(self, model: FederatedModel, *, stability_items: Optional[torch.Tensor],
                 stability_logits: Optional[torch.Tensor], plasticity_items: Optional[torch.Tensor],
                 plasticity_logits: Optional[torch.Tensor], train_indptr: np.ndarray, train_items: np.ndarray,
                 eps: float, num_replay: int, lambda_replay: float, a_t: float, reduction: str = "example",
                 seed: int = 0, base_loss=None, rank_strategy: str = "compare", record: bool = False):
        if reduction not in REDUCTIONS:
            raise ValueError(f"reduction must be one of {REDUCTIONS}, got {reduction!r}")
        self.model = model
        self.proxies = {name: (items, logits) for name, items, logits in
                        (("stability", stability_items, stability_logits),
                         ("plasticity", plasticity_items, plasticity_logits)) if items is not None}
        self.train_indptr, self.train_items = np.asarray(train_indptr), np.asarray(train_items)
        self.eps, self.num_replay = float(eps), int(num_replay)
        self.lambda_replay, self.a_t, self.reduction = float(lambda_replay), float(a_t), reduction
        self.seed, self.rank_strategy, self.record = int(seed), rank_strategy, bool(record)
        self.base_loss = base_loss if base_loss is not None else bce_client_loss
        self.records = []
        self._diagnostics: Dict[str, dict] = {}
        self._round: Optional[int] = None

    def replay_weight(self, round_index: int) -> float:
        """``λ_replay · exp(−round / a_T)``."""
        return self.lambda_replay * float(np.exp(-float(round_index) / self.a_t))

    # -- the round's replay sets ------------------------------------------------------------
    def replay_sets(self, clients: torch.Tensor, global_state, private_state,
                    rng: np.random.Generator) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Draw ``M_u`` of every client.

        Args:
            clients: ``(C,) int64`` user ids.
            global_state, private_state: the downloaded public state, every user's private state.
            rng: the round's generator (Gumbel noise, one ``(C, A)`` block per proxy, in the
                order stability, plasticity).

        Returns:
            ``(items (C, m), targets (C, m), keep (C, m) bool)``, ``m = Σ_proxies min(n, A)``:
            the merged replay set is ``items[keep]`` with labels ``targets[keep]``.
        """
        num_clients = clients.shape[0]
        noise = {name: torch.as_tensor(rng.gumbel(size=(num_clients, items.shape[1])))
                 for name, (items, _) in self.proxies.items()}
        all_items, all_targets, all_valid = [], [], []
        gaps = {name: [] for name in self.proxies}
        perplexity = {name: [] for name in self.proxies}
        with torch.no_grad():
            for start in range(0, num_clients, _CHUNK):
                users = clients[start:start + _CHUNK]
                current = self.model.score_users(global_state, private_state, users)  # (c, I)
                current = _mask_rows(current, users, self.train_indptr, self.train_items)
                parts_i, parts_t, parts_v = [], [], []
                for name, (cand_items, cand_logits) in self.proxies.items():
                    known = users < cand_items.shape[0]  # users the proxy knows (S: old users only)
                    rows = users.clamp(max=cand_items.shape[0] - 1)
                    items, logits = cand_items[rows], cand_logits[rows]  # (c, A)
                    valid = torch.isfinite(logits) & known[:, None]
                    ranks = student_ranks(current, current.gather(1, items), self.rank_strategy)  # (c, A) 1-based
                    logw = rank_discrepancy_log_weights(ranks, valid, self.eps)
                    if self.record:
                        gaps[name].append((ranks - torch.arange(1, ranks.shape[1] + 1, device=ranks.device))[valid])
                        probs = replay_probabilities(logw[valid.any(1)])
                        entropy = -(probs * torch.log(probs.clamp(min=1e-300))).sum(1)
                        perplexity[name].append(torch.exp(entropy))
                    pos, drawn = sample_replay(logw, noise[name][start:start + users.shape[0]], self.num_replay)
                    parts_i.append(items.gather(1, pos))
                    parts_t.append(torch.sigmoid(logits.gather(1, pos)).masked_fill(~drawn, 0.0))
                    parts_v.append(drawn)
                all_items.append(torch.cat(parts_i, 1))
                all_targets.append(torch.cat(parts_t, 1))
                all_valid.append(torch.cat(parts_v, 1))
        items, targets, valid = torch.cat(all_items), torch.cat(all_targets), torch.cat(all_valid)
        if self.record:
            # Spread of the rank gaps r_u − r^X_u and the sampling distributions' perplexity
            # (exp of the entropy: A = uniform over the candidates, 1 = argmax): how ε acts.
            quantiles = torch.tensor([0.05, 0.25, 0.5, 0.75, 0.95], dtype=torch.float64)
            self._diagnostics = {name: {
                "gap_quantiles": torch.quantile(torch.cat(gaps[name]).to(torch.float64).cpu(), quantiles).numpy()
                if gaps[name] and torch.cat(gaps[name]).numel() else np.full(5, np.nan),
                "mean_perplexity": float(torch.cat(perplexity[name]).mean()) if perplexity[name] else float("nan"),
            } for name in self.proxies}
        return items, targets, merge_replay_sets(items, targets, valid)

    # -- called by PlanAugmentingExecutor ----------------------------------------------------
    def prepare_round(self, plan: RoundPlan, global_state, private_state=None) -> RoundPlan:
        """Draw the round's replay sets and add them to every local step of their client."""
        if private_state is None:
            raise ValueError("SPPReplayLoss.prepare_round needs the private state (current ranks)")
        self._round = plan.round_index
        if not self.proxies or plan.num_clients == 0:
            return plan
        device = next(iter(global_state.values())).device
        clients = torch.as_tensor(plan.clients, device=device)
        rng = round_generator(self.seed, plan.round_index, SPP_STREAM)
        items, targets, keep = self.replay_sets(clients, global_state, private_state, rng)
        rows, cols = keep.nonzero(as_tuple=True)
        positions = rows.cpu().numpy()
        replay_items = items[rows, cols].cpu().numpy()
        labels = encode_replay_target(targets[rows, cols].to(torch.float64).cpu().numpy())
        if self.record:
            self.records.append({"round": plan.round_index, "clients": plan.clients.copy(),
                                 "replayed": np.bincount(positions, minlength=plan.num_clients),
                                 **self._diagnostics})
        return append_to_every_step(plan, positions, replay_items, labels)

    def finish_round(self) -> None:
        """Nothing to release: the replay sets live in the plan."""

    # -- the loss ------------------------------------------------------------------------------
    def __call__(self, model: FederatedModel, params: Mapping[str, torch.Tensor], batch: LocalBatch) -> torch.Tensor:
        valid = batch.mask > 0
        is_rec = valid & (batch.labels >= 0)
        rec_batch = LocalBatch(clients=batch.clients, rows=batch.rows, items=batch.items,
                               labels=batch.labels.clamp(min=0.0), mask=is_rec.to(batch.mask.dtype))
        rec = self.base_loss(model, params, rec_batch)  # (C,)
        is_replay = valid & (batch.labels <= -1.0)
        if not bool(is_replay.any()):
            return rec
        if self._round is None:
            raise RuntimeError("SPPReplayLoss needs its round prepared: run it under PlanAugmentingExecutor")
        logits = model.logits(params, batch.rows)  # (C, B)
        replay = replay_bce(logits, decode_replay_target(batch.labels), is_replay, self.reduction, is_rec.sum(1))
        return rec + self.replay_weight(self._round) * replay


# ======================================================================================
# The method
# ======================================================================================
def _proxy_tables(model: FederatedModel, global_state, private_state, users: torch.Tensor, num_items: int,
                  indptr: np.ndarray, items: np.ndarray, absolute: int) -> Tuple[torch.Tensor, torch.Tensor]:
    """Top-``absolute`` candidates of ``users`` under one proxy, train items masked: ``(n, A)`` each."""
    parts_items, parts_logits = [], []
    with torch.no_grad():
        for start in range(0, users.shape[0], _CHUNK):
            chunk = users[start:start + _CHUNK]
            scores = model.score_users(global_state, private_state, chunk)[:, :num_items]
            scores = _mask_rows(scores, chunk, indptr, items)
            top_items, top_logits = proxy_candidates(scores, absolute)
            parts_items.append(top_items)
            parts_logits.append(top_logits)
    return torch.cat(parts_items), torch.cat(parts_logits)


@dataclass
class SPP(ContinualMethod):
    """SPP (CCD's stability/plasticity proxies) in the federated block loop; see the module docstring.

    Attributes:
        absolute: ``A``, candidates per proxy (proxy's top-A unmasked items).
        num_replay: ``n``, items drawn per user and proxy each round.
        eps: ``ε`` of the sampling weights ``exp(ε (r_current − r_proxy))``.
        lambda_replay, a_t: replay weight ``λ_replay · exp(−round / a_T)``.
        reduction: how a client's replay rows are reduced, see :func:`replay_bce` (default
            ``"example"``: each replay row weighs like one recommendation example).
        server_weight: ``w`` of the server mix.
        server_proxy: False = no server side (client replay only).
        mix_new_items: pull new items towards the plasticity proxy on the server.
        use_stability, use_plasticity: which proxies feed the client replay (the server mix
            always uses both when ``server_proxy``).
        plasticity_rounds: rounds of the plasticity proxy's run (None = the block's rounds).
        growth_seed: seed of the proxy run's new rows (None = the block seed; assumption 2).
        executor: executor of the proxy run (default :class:`~fedlib.engine.BatchedExecutor`).
        rank_strategy: see :func:`fedlib.baselines.continual.continual.count_higher_scores`.
        record: keep per-round replay counts (``self.losses[block].records``).
        name: label in results.

    After a block, ``self.proxy_runs[t]`` holds the plasticity run's cost and selection
    (``seconds``, ``rounds_run``, ``best_round``, ``valid``) and ``self.losses[t]`` the loss.
    """

    absolute: int = 50
    num_replay: int = 10
    eps: float = 0.01
    lambda_replay: float = 0.5
    a_t: float = 10.0
    reduction: str = "example"
    server_weight: float = 0.1
    server_proxy: bool = True
    mix_new_items: bool = True
    use_stability: bool = True
    use_plasticity: bool = True
    plasticity_rounds: Optional[int] = None
    growth_seed: Optional[int] = None
    executor: Optional[object] = None
    rank_strategy: str = "compare"
    record: bool = False
    name: str = "SPP"

    def __post_init__(self):
        if self.reduction not in REDUCTIONS:
            raise ValueError(f"reduction must be one of {REDUCTIONS}, got {self.reduction!r}")
        if not 0.0 <= self.server_weight <= 1.0:
            raise ValueError("server_weight must lie in [0, 1]")
        if self.absolute < 1 or self.num_replay < 1 or self.a_t <= 0:
            raise ValueError("absolute and num_replay must be >= 1 and a_t > 0")
        self.losses: Dict[int, SPPReplayLoss] = {}
        self.proxy_runs: Dict[int, dict] = {}
        self.plasticity_states: Dict[int, Tuple[dict, dict]] = {}

    def train_plasticity_proxy(self, ctx: BlockContext):
        """Fine-tune the backbone on block ``ctx.index`` from block ``t−1``'s state; best-validation state.

        Returns:
            ``(global_state, private_state)`` of the selected round.
        """
        device = next(iter(ctx.previous.global_state.values())).device
        config = dataclasses.replace(ctx.config, test_at_end=False, rounds=int(
            self.plasticity_rounds if self.plasticity_rounds is not None else ctx.config.rounds))
        seed = ctx.config.seed if self.growth_seed is None else int(self.growth_seed)
        started = time.perf_counter()
        state = initial_block_state(ctx, seed, device=device)
        # Selected like the block itself: the block's validation set and selection metric.
        cutoff = int(config.selection_metric.split("@")[1])
        evaluator = RankingEvaluator(ctx.split.train, ctx.split.valid, ctx.split.test, ks=(cutoff,))
        run = run_federated(ctx.base_method, ctx.split.train, config, evaluator=evaluator, state=state,
                            executor=self.executor if self.executor is not None else BatchedExecutor(),
                            device=device)
        selected = run.selected_state
        self.proxy_runs[ctx.index] = {"seconds": time.perf_counter() - started, "rounds_run": run.round_index,
                                      "best_round": run.best_round, "valid": dict(run.best_metrics or {})}
        return selected.global_state, selected.private_state

    def make_method(self, ctx: BlockContext) -> FederatedMethod:
        base = ctx.base_method
        previous = ctx.previous
        if previous is None:  # block 0: the plain backbone
            return base
        plastic_global, plastic_private = self.train_plasticity_proxy(ctx)
        self.plasticity_states[ctx.index] = (plastic_global, plastic_private)
        device = next(iter(plastic_global.values())).device
        train = ctx.split.train
        changes = {}
        stab_items = stab_logits = plast_items = plast_logits = None
        if self.use_stability:
            users = torch.arange(previous.num_users, device=device)
            stab_items, stab_logits = _proxy_tables(previous.model, previous.global_state, previous.private_state,
                                                    users, previous.num_items, train.indptr, train.items,
                                                    self.absolute)
        if self.use_plasticity:
            users = torch.arange(ctx.model.num_users, device=device)
            plast_items, plast_logits = _proxy_tables(ctx.model, plastic_global, plastic_private, users,
                                                      ctx.model.num_items, train.indptr, train.items, self.absolute)
        if self.use_stability or self.use_plasticity:
            loss = SPPReplayLoss(ctx.model, stability_items=stab_items, stability_logits=stab_logits,
                                 plasticity_items=plast_items, plasticity_logits=plast_logits,
                                 train_indptr=train.indptr, train_items=train.items, eps=self.eps,
                                 num_replay=self.num_replay, lambda_replay=self.lambda_replay, a_t=self.a_t,
                                 reduction=self.reduction, seed=ctx.config.seed, base_loss=base.client_loss,
                                 rank_strategy=self.rank_strategy, record=self.record)
            self.losses[ctx.index] = loss
            changes["client_loss"] = loss
        if self.server_proxy:
            names = ctx.model.names("public_rows")
            changes["server_mix"] = proxy_mixture_mix({n: previous.global_state[n] for n in names},
                                                      {n: plastic_global[n] for n in names},
                                                      self.server_weight, self.mix_new_items)
        return dataclasses.replace(base, name=f"{base.name}+{self.name}", **changes) if changes else base
