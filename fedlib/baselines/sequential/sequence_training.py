r"""Platform training pieces shared by FedCSR and its FedProx baselines (sequential cross-domain).

FedCSR (:mod:`fedlib.papers.fedcsr.training`) and the baselines of its tables
(:mod:`fedlib.baselines.sequential.fedcsr_baselines`) train K platforms, each with the training sequences of
its own users, and evaluate the global model on every platform's valid/test rows with that
platform's item graph. What both use lives here, below the papers: the sampled (or full)
ranking evaluation, FedAvg over the platforms' state dicts (FedCSR's Eq. 19), the platforms'
graphs and rows, the round plan, the generators kept in a state, the trainer's schedule and
the history rows.

Evaluation (:func:`evaluate_sequences`): for a valid/test sequence ``s`` with ground truth
(GT) ``y = s[-1]`` of domain ``d``, the history ``s[:-1]`` (its latest ``maxlen`` items) is
encoded and the candidates (GT in column 0 + same-domain negatives) are scored by domain
``d``'s cross-domain head of Eq. 16, ``(h*_last + h^d_last) W^d``: ``h*_last`` is the cross
encoder's feature at the last history position and ``h^d_last`` the domain-``d`` encoder's
feature at the last domain-``d`` position of the history (zero when the history has no
domain-``d`` item), as C2DSR/the public code score ("specific" feature). Then::

    rank = 1 + #{negatives j : score_j > score_GT}            (tie_rule="optimistic", default)
    MRR = 1/rank,  HR@K = [rank ≤ K],  NDCG@K = [rank ≤ K] / log2(rank + 1)

averaged over the rows whose GT is in domain ``d``. ``tie_rule="pessimistic"`` counts ties
against the GT (``≥``); ``tie_rule="code"`` is the public code's ``score_j > score_GT + 1e-5``.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence as SequenceT, Tuple, Union

import numpy as np
import torch

from fedlib.data.splits import SequenceSplit
from fedlib.engine.aggregation import client_weights
from fedlib.engine.aggregation import fedavg as engine_fedavg
from fedlib.engine.trainer import RunResult, Schedule
from fedlib.baselines.sequential.sequences import TransitionGraphs, make_batch, transition_graphs

__all__ = ["TIE_RULES", "METRICS", "SCORES", "ranks_from_scores", "rank_metrics", "sequence_ranks", "evaluate_sequences",
           "fedavg", "state_bytes", "platform_graphs", "platform_rows", "PlatformPlan", "generators_of",
           "generator_states", "platform_device", "domain_names", "deep_clone", "clone_tensors", "flat_evaluation",
           "domain_blocks", "curve_row", "selected_blocks", "audit_blocks", "platform_blocks", "history_rows",
           "platform_schedule", "round_callback"]

TIE_RULES = ("optimistic", "pessimistic", "code")
METRICS = ("MRR", "NDCG@5", "NDCG@10", "HR@1", "HR@5", "HR@10")
CODE_TIE_MARGIN = 1e-5


# ----------------------------------------------------------------------------- metrics
def ranks_from_scores(scores: torch.Tensor, tie_rule: str = "optimistic") -> torch.Tensor:
    """1-based rank of column 0 (the GT) among the columns of ``scores`` (R, C) → (R,) int64.

    ``optimistic``: rank = 1 + #{j ≥ 1: s_j > s_0} (ties favour the GT); ``pessimistic``:
    ``s_j ≥ s_0``; ``code``: ``s_j > s_0 + 1e-5`` (the public code).
    """
    if tie_rule not in TIE_RULES:
        raise ValueError(f"tie_rule must be one of {TIE_RULES}, got {tie_rule!r}")
    if scores.dim() != 2 or scores.shape[1] < 2:
        raise ValueError(f"scores must be (rows, 1 + negatives) with the GT in column 0, got shape {tuple(scores.shape)}")
    gt, neg = scores[:, :1], scores[:, 1:]                                 # (R, 1), (R, C−1)
    if tie_rule == "optimistic":
        above = neg > gt
    elif tie_rule == "pessimistic":
        above = neg >= gt
    else:
        above = neg > gt + CODE_TIE_MARGIN
    return 1 + above.sum(dim=1).to(torch.int64)                            # (R,)


def rank_metrics(ranks) -> Dict[str, float]:
    """Mean MRR, NDCG@5/10, HR@1/5/10 of 1-based ranks, plus ``count``; NaN metrics when empty."""
    r = np.asarray(ranks, dtype=np.float64)
    if r.size == 0:
        return {**{m: float("nan") for m in METRICS}, "count": 0}
    out = {"MRR": float(np.mean(1.0 / r))}
    for k in (5, 10):
        out[f"NDCG@{k}"] = float(np.mean(np.where(r <= k, 1.0 / np.log2(r + 1.0), 0.0)))
    for k in (1, 5, 10):
        out[f"HR@{k}"] = float(np.mean(r <= k))
    out["count"] = int(r.size)
    return out


def domain_names(split: SequenceSplit):
    return tuple(split.extra.get("domain_names", ("A", "B")))


@torch.no_grad()
def sequence_ranks(model: torch.nn.Module, split: SequenceSplit, role: str, rows=None, *,
                   tie_rule: str = "optimistic", batch_size: int = 512, device=None,
                   full_ranking: bool = False) -> np.ndarray:
    """Ranks of the GT of ``split.<role>`` rows (default all) → (n,) int64.

    ``model`` is FedCSR or any baseline: it has ``config.maxlen`` and
    ``score(inputs, candidates (B, C), gt_domain (B,)) -> (B, C)``, and carries its current graphs.
    ``full_ranking=False`` ranks the GT among the row's stored candidates (GT + sampled
    negatives); ``True`` among **every item of the GT's domain** (the user's other items are not
    removed; ties count for the GT as in ``tie_rule="optimistic"``).
    """
    if role not in ("valid", "test"):
        raise ValueError(f"role must be 'valid' or 'test', got {role!r}")
    seqs, cands = getattr(split, role), np.asarray(getattr(split, f"{role}_candidates"))
    if cands.ndim != 2 or cands.shape[0] != len(seqs):
        raise ValueError(f"{role}_candidates must be ({len(seqs)}, 1 + negatives), got shape {cands.shape}")
    rows = np.arange(len(seqs), dtype=np.int64) if rows is None else np.asarray(rows, dtype=np.int64)
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    device = torch.device(device) if device is not None else next(model.parameters()).device
    na, nb, maxlen = split.num_items_a, split.num_items_b, model.config.maxlen
    if full_ranking:                       # (B, |V^d|) scores per chunk: keep chunks small
        batch_size = max(1, batch_size // 8)
    was_training = model.training
    model.eval()
    out = np.empty(rows.size, dtype=np.int64)
    try:
        with torch.no_grad():
            for start in range(0, rows.size, batch_size):
                chunk = rows[start:start + batch_size]
                inputs = make_batch(seqs, na, nb, maxlen, rows=chunk).inputs.to(device)
                gt = torch.as_tensor(cands[chunk, 0], device=device)          # (B,) global ids
                gt_domain = (gt >= na).to(torch.int64)                         # (B,)
                if full_ranking:
                    out[start:start + chunk.size] = _full_ranks(model, inputs, gt, gt_domain, na, nb).cpu().numpy()
                    continue
                cand = torch.as_tensor(cands[chunk], device=device)            # (B, C) global ids, GT first
                try:
                    scores = model.score(inputs, cand, gt_domain)              # (B, C)
                except ValueError as error:
                    raise ValueError(f"{role} candidates must all lie in the GT's domain") from error
                out[start:start + chunk.size] = ranks_from_scores(scores, tie_rule).cpu().numpy()
    finally:
        model.train(was_training)
    return out


def _full_ranks(model, inputs, gt: torch.Tensor, gt_domain: torch.Tensor, na: int, nb: int) -> torch.Tensor:
    """1 + #{items of the GT's domain scored above the GT}, per row → (B,) int64."""
    ranks = torch.empty(gt.shape, dtype=torch.int64, device=gt.device)
    for d, (offset, size) in enumerate(((0, na), (na, nb))):
        m = gt_domain == d                                                     # (B,)
        if not bool(m.any()):
            continue
        sub = type(inputs)(*(t[m] for t in inputs))                            # the rows of domain d
        every = torch.arange(offset, offset + size, device=gt.device).expand(int(m.sum()), size)  # (b, |V^d|)
        scores = model.score(sub, every, gt_domain[m])                         # (b, |V^d|)
        truth = scores.gather(1, (gt[m] - offset).view(-1, 1))                 # (b, 1)
        ranks[m] = 1 + (scores > truth).sum(dim=1)
    return ranks


def evaluate_sequences(model: torch.nn.Module, split: SequenceSplit, role: str,
                       graphs_per_platform: Union[TransitionGraphs, SequenceT[TransitionGraphs]], *,
                       rows_per_platform: Optional[SequenceT] = None, models: Optional[SequenceT[torch.nn.Module]] = None,
                       tie_rule: str = "optimistic", batch_size: int = 512, device=None,
                       return_ranks: bool = False, full_ranking: bool = False) -> Dict[str, Any]:
    """Per-GT-domain MRR, NDCG@5/10, HR@1/5/10 (and ``count``) of ``split.<role>``.

    Args:
        graphs_per_platform: one :class:`TransitionGraphs` (all rows scored with it) or one per
            platform; platform ``k``'s rows (``rows_per_platform[k]``, default
            ``split.extra[f"{role}_platforms"][k]``) are scored with graph ``k``.
        models: optional per-platform models (individual training); default ``model`` everywhere.
        return_ranks: also return ``"ranks"`` (pooled) and ``"domains"``.
        full_ranking: rank the GT among every item of its domain (:func:`sequence_ranks`).
    Returns:
        ``{domain_name: {metric: value, "count": n}}`` (plus ``"per_platform"``: the same per platform).
    """
    if role not in ("valid", "test"):
        raise ValueError(f"role must be 'valid' or 'test', got {role!r}")
    seqs = getattr(split, role)
    if isinstance(graphs_per_platform, TransitionGraphs):
        graphs_list = [graphs_per_platform]
        rows_list = [np.arange(len(seqs), dtype=np.int64)] if rows_per_platform is None else list(rows_per_platform)
    else:
        graphs_list = list(graphs_per_platform)
        if rows_per_platform is None:
            key = f"{role}_platforms"
            if key not in split.extra:
                raise ValueError(f"split.extra has no {key!r}: pass rows_per_platform or a single graph")
            rows_per_platform = split.extra[key]
        rows_list = list(rows_per_platform)
    if len(rows_list) != len(graphs_list):
        raise ValueError(f"{len(graphs_list)} graphs for {len(rows_list)} platforms' {role} rows")
    if models is not None and len(models) != len(graphs_list):
        raise ValueError(f"{len(models)} models for {len(graphs_list)} platforms")
    names = domain_names(split)
    targets = seqs.last_items()
    all_ranks, all_dom, per_platform = [], [], []
    for k, (graphs, rows) in enumerate(zip(graphs_list, rows_list)):
        net = model if models is None else models[k]
        net.set_graphs(graphs)
        rows = np.asarray(rows, dtype=np.int64)
        ranks = sequence_ranks(net, split, role, rows, tie_rule=tie_rule, batch_size=batch_size, device=device,
                               full_ranking=full_ranking)
        dom = (targets[rows] >= split.num_items_a).astype(np.int64)
        all_ranks.append(ranks)
        all_dom.append(dom)
        per_platform.append({names[d]: rank_metrics(ranks[dom == d]) for d in (0, 1)})
    ranks = np.concatenate(all_ranks) if all_ranks else np.empty(0, np.int64)
    dom = np.concatenate(all_dom) if all_dom else np.empty(0, np.int64)
    out: Dict[str, Any] = {names[d]: rank_metrics(ranks[dom == d]) for d in (0, 1)}
    out["per_platform"] = per_platform
    if return_ranks:
        out.update(ranks=ranks, domains=dom)
    return out


# ----------------------------------------------------------------------------- federated pieces
def fedavg(states: SequenceT[Mapping[str, torch.Tensor]], weights) -> Dict[str, torch.Tensor]:
    """Eq. 19: ``Σ_k N_k w_k / Σ_k N_k`` for every entry of the state dicts, by the library's FedAvg.

    ``states``: the K uploaded state dicts (same keys); ``weights``: (K,) the ``N_k``. Each float
    entry goes through :func:`fedlib.engine.aggregation.fedavg` as ``θ + Σ_k p_k Δ_k`` with
    ``θ = 0`` and ``Δ_k = w_k`` (so it is exactly the weighted mean, not a sum of differences to
    the global model), ``p_k = N_k / Σ N`` (:func:`~fedlib.engine.aggregation.client_weights`), in
    float64, rounded once to the entry's dtype: the float32 result then equals a float64 running
    sum rounded once (tested on 2 M entries: no element differs), which averaging in float32 would
    not (2.5 % of the entries differ by an ulp). One entry at a time, so only one entry's K
    copies are stacked at once. Integer entries (none in FedCSR's model) keep the first state's.
    """
    w = np.asarray(weights, dtype=np.float64)
    if len(states) == 0 or w.shape != (len(states),):
        raise ValueError(f"need one weight per state dict, got {w.shape} weights for {len(states)} states")
    if not np.all(np.isfinite(w)) or (w < 0).any() or w.sum() <= 0:
        raise ValueError(f"FedAvg weights must be finite, >= 0 and not all 0, got {w.tolist()}")
    keys = list(states[0].keys())
    if any(list(s.keys()) != keys for s in states[1:]):
        raise ValueError("all state dicts must have the same keys")
    p = client_weights(w, "num_examples")                                   # (K,) N_k / Σ N
    out = {}
    for key in keys:
        ref = states[0][key]
        if not torch.is_floating_point(ref):
            out[key] = ref.clone()
            continue
        uploads = torch.stack([s[key].to(torch.float64) for s in states])    # (K, *shape)
        zero = torch.zeros(ref.shape, dtype=torch.float64, device=ref.device)
        out[key] = engine_fedavg({key: zero}, {key: uploads}, p)[key].to(ref.dtype)
    return out


def state_bytes(state: Mapping[str, torch.Tensor]) -> int:
    """Bytes of every tensor of a state dict (what one platform sends or receives per round)."""
    return int(sum(t.numel() * t.element_size() for t in state.values()))


def platform_graphs(split: SequenceSplit, *, central: bool = False, binary: bool = True) -> List[TransitionGraphs]:
    """One graph per platform from its own training rows, or (``central``) the all-platform graph K times."""
    na, nb = split.num_items_a, split.num_items_b
    if central:
        g = transition_graphs(split.train, na, nb, binary=binary)
        return [g] * len(split.platforms)
    return [transition_graphs(split.train.subset(np.asarray(rows, dtype=np.int64)), na, nb, binary=binary)
            for rows in split.platforms]


# ----------------------------------------------------------------------------- pieces shared with the baselines
SCORES = METRICS + ("count",)


def platform_device(name: str) -> torch.device:
    dev = torch.device(name)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {name!r} was asked for but CUDA is not available; use device='cpu'")
    return dev


def platform_rows(split: SequenceSplit, weight_by: str):
    """``(train_rows, counts, active)``: each platform's training rows (sequences of length >= 2),
    its FedAvg weight ``N_k`` (training users, or rows with ``weight_by="sequences"``) and the
    platforms that have rows. Raises ``ValueError`` when no platform has one."""
    lengths = split.train.lengths()
    train_rows = [np.asarray(r, dtype=np.int64)[lengths[np.asarray(r, dtype=np.int64)] >= 2] for r in split.platforms]
    counts = [np.unique(split.train.users[r]).size if weight_by == "users" else r.size for r in train_rows]
    if sum(counts) == 0:
        raise ValueError("no platform has a training sequence of length >= 2")
    return train_rows, counts, [k for k in range(len(train_rows)) if train_rows[k].size]


@dataclass(frozen=True)
class PlatformPlan:
    """Round ``t``'s plan: the platforms that train (every platform with training rows, every round).

    The batch order, augmentation and sampled negatives are drawn during local training from the
    generator carried in the state (one stream across rounds, as the papers' code), not here.
    """

    platforms: Tuple[int, ...]


def generators_of(numpy_rng: Mapping[str, Any], torch_rng: torch.Tensor, cuda_rng: Optional[torch.Tensor],
                  device: torch.device) -> np.random.Generator:
    """Restore the run's generators from a state: torch's global CPU (and CUDA) generator, which
    draws the dropout masks, is set in place; the numpy generator (batch order, augmentation,
    sampled negatives) is returned."""
    rng = np.random.default_rng()
    rng.bit_generator.state = dict(numpy_rng)
    torch.set_rng_state(torch_rng.cpu())
    if device.type == "cuda" and cuda_rng is not None:
        torch.cuda.set_rng_state(cuda_rng.cpu(), device)
    return rng


def generator_states(rng: np.random.Generator, device: torch.device) -> Dict[str, Any]:
    """The states :func:`generators_of` restores: ``numpy_rng``, ``torch_rng``, ``cuda_rng``."""
    return {"numpy_rng": rng.bit_generator.state, "torch_rng": torch.get_rng_state(),
            "cuda_rng": torch.cuda.get_rng_state(device) if device.type == "cuda" else None}


def deep_clone(value):
    """A copy of nested dicts / lists / tuples whose tensors are cloned (an optimizer's state dict):
    loading it into an optimizer leaves the original's tensors untouched (``load_state_dict`` aliases them)."""
    if isinstance(value, torch.Tensor):
        return value.detach().clone()
    if isinstance(value, dict):
        return {k: deep_clone(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(deep_clone(v) for v in value)
    return value


def clone_tensors(state: Mapping[str, torch.Tensor]) -> Dict[str, torch.Tensor]:
    return {n: v.detach().clone() for n, v in state.items()}


def flat_evaluation(evaluation: Mapping[str, Any], names, per_platform: bool = True) -> Dict[str, float]:
    """One :func:`evaluate_sequences` result as the trainer's flat metrics.

    ``<domain>/<metric>`` (and ``count``), ``platform<k>/<domain>/<metric>`` with ``per_platform``,
    and ``MRR``: the mean over domains of the (finite) MRRs, the selection metric.
    """
    out = {f"{d}/{m}": v for d in names for m, v in evaluation[d].items()}
    if per_platform:
        out.update({f"platform{k}/{d}/{m}": v for k, block in enumerate(evaluation["per_platform"])
                    for d in names for m, v in block[d].items()})
    finite = [evaluation[d]["MRR"] for d in names if np.isfinite(evaluation[d]["MRR"])]
    out["MRR"] = float(np.mean(finite)) if finite else float("nan")
    return out


def domain_blocks(metrics: Optional[Mapping[str, float]], names, prefix: str = "") -> Dict[str, Dict[str, float]]:
    """``{domain: {"valid/MRR", ..., "test/count"}}`` from the trainer's ``valid/<prefix><domain>/<metric>``
    (``{}`` when ``metrics`` is ``None``: no evaluation)."""
    if metrics is None:
        return {}
    return {d: {f"{role}/{m}": metrics[f"{role}/{prefix}{d}/{m}"] for role in ("valid", "test") for m in SCORES}
            for d in names}


def curve_row(record: Mapping[str, Any], names) -> Dict[str, Any]:
    """A trainer history record as the family's history row (the record's ``extra["curve"]``).

    ``round``, ``loss`` (the round's ``train_loss``), what the round logged in its order,
    ``<domain>/<role>/<metric>`` as floats, ``valid/MRR``, ``test/MRR`` and ``seconds``.
    """
    row: Dict[str, Any] = {"round": record["round"], "loss": record["train_loss"]}
    row.update({k: v for k, v in record.items() if k not in ("round", "train_loss", "seconds")
                and not k.startswith(("valid/", "test/"))})
    for d in names:
        row.update({f"{d}/{role}/{m}": float(record[f"{role}/{d}/{m}"]) for role in ("valid", "test")
                    for m in SCORES})
    row.update({"valid/MRR": record["valid/MRR"], "test/MRR": record["test/MRR"], "seconds": record["seconds"]})
    return row


# The family's layouts of a finished run (train_fedcsr, train_federated_baseline return the trainer's
# RunResult; its artifacts["domains"] names the domains in the metrics' keys).
def _domains(run: RunResult) -> Tuple[str, ...]:
    if "domains" not in run.artifacts:
        raise ValueError("run.artifacts has no 'domains': pass the RunResult of train_fedcsr or "
                         "train_federated_baseline (or set run.artifacts['domains'] to the split's domain names)")
    return tuple(run.artifacts["domains"])


def selected_blocks(run: RunResult) -> Dict[str, Dict[str, float]]:
    """``{domain: {"valid/MRR", ..., "test/count"}}`` of the selected evaluation (best mean
    validation MRR, round :attr:`~fedlib.engine.trainer.RunResult.best_round`); ``{}`` before any."""
    return domain_blocks(run.selected_evaluation, _domains(run))


def audit_blocks(run: RunResult) -> Dict[str, Dict[str, float]]:
    """The same blocks at the audit's evaluation (best mean **test** MRR, round
    :attr:`~fedlib.engine.trainer.RunResult.audit_round`; the audit of the papers' code)."""
    return domain_blocks(run.audit_evaluation, _domains(run))


def platform_blocks(run: RunResult) -> List[Dict[str, Dict[str, float]]]:
    """Per platform ``k``, the selected evaluation's blocks of platform ``k``'s own rows
    (``platform<k>/`` metrics; FedCSR records them, the baselines do not: ``[]``)."""
    metrics, names = run.selected_evaluation, _domains(run)
    if metrics is None:
        return []
    platforms = 0
    while f"valid/platform{platforms}/{names[0]}/MRR" in metrics:
        platforms += 1
    return [domain_blocks(metrics, names, f"platform{k}/") for k in range(platforms)]


def history_rows(run: RunResult) -> List[Dict[str, Any]]:
    """Every round of the run as the family's history row (:func:`curve_row`)."""
    names = _domains(run)
    return [curve_row(record, names) for record in run.history]


def platform_schedule(rounds: int, patience: int) -> Schedule:
    """Evaluate valid and test after every round; select (and stop) on the mean validation MRR
    with the first best kept; also keep the round of the best mean **test** MRR (the audit of the
    code's rule); report the test numbers *at* the selected round (no test of the end state)."""
    return Schedule(rounds=rounds, eval_every=1, patience=patience, selection_metric="MRR",
                    test_every_evaluation=True, audit_metric="MRR", test_at_end=False, keep_best_state=True)


def round_callback(names, progress: Optional[Callable[[Dict[str, Any]], None]] = None,
                   verbose: bool = False) -> Callable:
    """The trainer's ``on_round_end``: stamps ``seconds`` (wall time since the previous round
    ended, or since this call) on the record and hands the history row to ``progress``."""
    clock = [time.perf_counter()]

    def on_round_end(run, record):
        now = time.perf_counter()
        record["seconds"], clock[0] = now - clock[0], now
        row = curve_row(record, names)
        if progress is not None:
            progress(row)
        if verbose:
            print(f"round {row['round']}: loss {row['loss']:.4f} valid/MRR {row['valid/MRR']:.4f} "
                  f"test/MRR {row['test/MRR']:.4f}")
    return on_round_end
