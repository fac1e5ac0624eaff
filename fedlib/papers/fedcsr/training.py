r"""FedCSR: sampled evaluation, the federated round (FedAvg) as an Algorithm, and individual training.

Reference: D. Zheng et al., "FedCSR", COLING 2025 (https://aclanthology.org/2025.coling-main.581/,
Algorithm 1 and Eq. 19); public code https://github.com/zdy769243418/FedCSR-v1 (``train_rec.py``,
``clients.py``, ``aggregator.py``, ``data_utils.py``). The model and the local loss live in
:mod:`fedlib.papers.fedcsr.model`.

Algorithm (K platforms, ``D_k`` the training sequences of platform ``k``, ``w`` the global
weights, ``N_k`` the weight of platform ``k``)::

    for k = 1..K:  A_k = transition_graphs(D_k)             # each platform, its own data only
    w^0 = random init                                       # FedCSRAlgorithm.init
    for t = 1..T:                                           # the trainer (fedlib.engine.train), T = rounds
        for k = 1..K (all platforms every round):
            w_k = w^{t-1};  w_g = frozen copy of w^{t-1}   # MCL target (Eq. 3)
            repeat E local epochs (E = 3):
                for each shuffled mini-batch b ⊂ D_k (size 256):
                    w_k ← Adam step on L(b; w_k, w_g, A_k)  # Eq. 18, fedcsr_loss
            send w_k to the server
        w^t = Σ_k N_k w_k / Σ_k N_k                        # FedAvg (Eq. 19); end of run_round
        evaluate w^t on every platform's valid/test rows with that platform's A_k   # evaluate
        select on the mean over domains of the validation MRR; stop after `patience`
        rounds without improvement                          # the trainer's Selection

:class:`FedCSRAlgorithm` is one round of this (``init``, ``run_round``, ``evaluate`` over a
:class:`FedCSRState`); :func:`train_fedcsr` hands it to the one trainer,
:func:`fedlib.engine.train`, with :func:`platform_schedule`, and returns the trainer's
:class:`~fedlib.engine.trainer.RunResult` (its per-domain blocks and history rows:
:func:`~fedlib.baselines.sequential.sequence_training.selected_blocks` and its siblings).
The round's randomness (batch order, augmentation, sampled negatives: one numpy stream;
dropout masks: torch's generator) continues from round to round, as in the code, so both
generators' states live in the state, and a checkpoint (the trainer's) resumes them exactly.

Evaluation, FedAvg (Eq. 19), the platforms' graphs and rows, the schedule and the history rows
are shared with the FedProx baselines: :mod:`fedlib.baselines.sequential.sequence_training`.

Choices (where the paper is silent):

* **Graphs per platform.** Each platform builds ``A_k`` from its own training sequences.
  The graph is platform data, so the server holds no global graph: the global model is
  evaluated on platform ``k``'s share of the valid/test rows (``split.extra["valid_platforms"]``
  / ``["test_platforms"]``) with ``A_k``, and the per-row ranks are pooled into one score per
  domain (= the row-count-weighted mean over platforms). ``central_graph=True`` reproduces the
  public code: one graph from all platforms' training sequences, used everywhere.
* **Optimiser.** Each platform gets a **fresh Adam every round** (FedAvg semantics: optimiser
  moments are local state that is neither sent nor kept between rounds; keeping 10 sets of
  Adam moments of a 65 M-parameter model would also cost ~5 GB). ``shared_optimizer=True``
  reproduces the code: one Adam instance shared by all platforms and rounds, whose moments
  carry over from platform to platform. Adam betas default to the code's (0.9, 0.98).
* **FedAvg weights**: ``weight_by="users"`` (Eq. 19: the number of training users) or
  ``"sequences"`` (the code). Every state-dict entry is averaged (the model has no buffers).
* **MCL target**: a frozen copy of the round's global model (eval mode), run on the platform
  with the platform's own graph.
* **Selection**: best mean (over domains) validation MRR, the first best on ties, patience
  counted from the best round (the code counts from the previous round): the trainer's
  :class:`~fedlib.engine.selection.Selection`. The test metrics of the round with the best
  mean **test** MRR are kept too (the run's ``audit_evaluation``, the schedule's
  ``audit_metric``; recorded as ``test_selected/...``), the audit of the code's per-round test log.
* **Communication**: per round, each participating platform downloads and uploads every
  state-dict tensor (``numel × element size`` bytes); graphs never leave a platform.
* **Individual training** (``individual=True``, paper Figure 4 / Table 9): each platform
  trains its own model on its own data with its own persistent Adam (no aggregation, no
  communication; the MCL target is the platform's own model at the start of the round) and
  is evaluated on its own valid/test rows with its own graph. One round = ``local_epochs``
  epochs on every platform; selection is joint over platforms (pooled validation MRR).

Where the public code differs (``train_rec.py``): central graph; one shared Adam; local
batches in a fixed order without shuffling (the last partial batch wrapped around); weights
= #sequences; early stopping against the previous round and no validation-based selection
(test logged every round); evaluation loop per sequence (here batched with ``gather``).
"""
from __future__ import annotations

import copy
import dataclasses
import math
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Mapping, Optional, Tuple

import numpy as np
import torch

from fedlib.baselines.config_checks import check_positive_ints, check_seed
from fedlib.baselines.registry import register
from fedlib.data.splits import SequenceSplit
from fedlib.engine.algorithm import RoundContext, RoundReport, dataclass_from_dict, dataclass_to_dict
from fedlib.engine.optim import adam
from fedlib.engine.trainer import RunResult, train
from fedlib.baselines.sequential.sequence_training import (TIE_RULES, PlatformPlan, clone_tensors, deep_clone,
                                              domain_names, evaluate_sequences, fedavg, flat_evaluation, generator_states,
                                              generators_of, platform_device, platform_graphs, platform_rows,
                                              platform_schedule, round_callback, state_bytes)
from fedlib.baselines.sequential.sequences import make_batch
from fedlib.papers.fedcsr.model import FedCSRConfig, FedCSRModel, fedcsr_loss, frozen_copy, global_representations

__all__ = ["FedCSRTrainConfig", "FedCSRState", "FedCSRAlgorithm", "train_fedcsr", "train_individual"]


# ----------------------------------------------------------------------------- config
@dataclass(frozen=True)
class FedCSRTrainConfig:
    """Round-loop settings (paper / code defaults).

    ``rounds`` is the maximum number of rounds; ``patience`` stops after that many rounds
    without a better mean validation MRR. ``device``: ``"cpu"`` or ``"cuda"``.
    """

    rounds: int = 100
    local_epochs: int = 3
    batch_size: int = 256
    lr: float = 1e-3
    betas: tuple = (0.9, 0.98)
    weight_decay: float = 0.0
    patience: int = 20
    weight_by: str = "users"
    tie_rule: str = "optimistic"
    central_graph: bool = False
    shared_optimizer: bool = False
    eval_batch_size: int = 512
    seed: int = 0
    device: str = "cpu"

    def __post_init__(self):
        check_positive_ints(self, ("rounds", "local_epochs", "batch_size", "patience", "eval_batch_size"))
        if isinstance(self.lr, bool) or not isinstance(self.lr, (int, float)) or not math.isfinite(self.lr) \
                or self.lr <= 0:
            raise ValueError(f"FedCSRTrainConfig.lr must be a finite number > 0 (e.g. 1e-3), got {self.lr!r}")
        if len(tuple(self.betas)) != 2 or not all(0.0 <= float(b) < 1.0 for b in self.betas):
            raise ValueError(f"FedCSRTrainConfig.betas must be two numbers in [0, 1), got {self.betas!r}")
        if not (math.isfinite(self.weight_decay) and self.weight_decay >= 0):
            raise ValueError(f"FedCSRTrainConfig.weight_decay must be >= 0, got {self.weight_decay!r}")
        if self.weight_by not in ("users", "sequences"):
            raise ValueError(f"FedCSRTrainConfig.weight_by must be 'users' (Eq. 19) or 'sequences' (the code), "
                             f"got {self.weight_by!r}")
        if self.tie_rule not in TIE_RULES:
            raise ValueError(f"FedCSRTrainConfig.tie_rule must be one of {TIE_RULES}, got {self.tie_rule!r}")
        check_seed(self)
        if str(self.device).split(":")[0] not in ("cpu", "cuda"):
            raise ValueError(f"FedCSRTrainConfig.device must be 'cpu' or 'cuda[:i]', got {self.device!r}")


# ----------------------------------------------------------------------------- FedCSR as an Algorithm
@dataclass
class FedCSRState:
    """Everything FedCSR's next round depends on.

    Attributes:
        models: state dicts: ``[w]``, the global model (federated), or one per platform
            (individual training).
        optimizers: Adam state dicts that outlive a round: ``[]`` (a fresh Adam per platform and
            round), ``[shared]`` (``shared_optimizer``) or one per platform (individual).
        numpy_rng: the numpy generator's state (batch order, augmentation, sampled negatives).
        torch_rng: torch's CPU generator state (dropout masks), (N,) uint8.
        cuda_rng: the CUDA generator's state on a CUDA device, else ``None``.
    """

    models: List[Dict[str, torch.Tensor]]
    optimizers: List[Dict[str, Any]]
    numpy_rng: Dict[str, Any]
    torch_rng: torch.Tensor
    cuda_rng: Optional[torch.Tensor] = None


class FedCSRAlgorithm:
    """FedCSR's round (module docstring) as an :class:`~fedlib.engine.algorithm.Algorithm`.

    ``individual=True``: every platform trains its own model alone (no aggregation, no
    communication). The modules are scratch space: every round loads its state into them.
    """

    def __init__(self, split: SequenceSplit, config: FedCSRConfig = FedCSRConfig(),
                 train_config: FedCSRTrainConfig = FedCSRTrainConfig(), *, individual: bool = False):
        tc = train_config
        if not isinstance(split, SequenceSplit):
            raise ValueError(f"split must be a SequenceSplit (e.g. fedlib.data.protocols.fedcsr), "
                             f"got {type(split).__name__}")
        if individual and (tc.shared_optimizer or tc.central_graph):
            raise ValueError("individual=True trains each platform alone: shared_optimizer and central_graph "
                             "(audit flags of the federated code) do not apply")
        K = len(split.platforms)
        if K == 0:
            raise ValueError("split.platforms is empty: FedCSR needs at least one platform")
        for role in ("valid", "test"):
            rows = split.extra.get(f"{role}_platforms")
            if rows is None or len(rows) != K:
                raise ValueError(f"split.extra['{role}_platforms'] must hold one row array per platform ({K}); "
                                 f"got {None if rows is None else len(rows)}")
        self.split, self.config, self.train_config, self.individual = split, config, tc, bool(individual)
        self.device = platform_device(tc.device)
        self.names = domain_names(split)
        self.train_rows, self.counts, self.active = platform_rows(split, tc.weight_by)
        self.graphs = platform_graphs(split, central=tc.central_graph, binary=config.binary_graph)
        with torch.random.fork_rng(devices=[]):                  # scratch modules: their init draws nothing
            self._modules = [self._new_model() for _ in range(K if individual else 2)]  # (global, work) or per platform
        self.model_bytes = state_bytes(self._modules[0].state_dict())

    @property
    def method(self) -> str:
        return ("FedCSR-individual" if self.individual
                else ("FedCSR-central-graph" if self.train_config.central_graph else "FedCSR"))

    def _new_model(self) -> FedCSRModel:
        return FedCSRModel(self.split.num_items_a, self.split.num_items_b, self.config).to(self.device)

    def _new_adam(self, params) -> torch.optim.Optimizer:
        tc = self.train_config
        return adam(params, lr=tc.lr, betas=tuple(tc.betas), weight_decay=tc.weight_decay)

    # --- state -------------------------------------------------------------------------------
    def init(self, seed: int) -> FedCSRState:
        """``torch.manual_seed(seed)``, then one model: the global one, or every platform's (same init)."""
        torch.manual_seed(seed)
        rng = np.random.default_rng([seed, 4004])
        weights = clone_tensors(self._new_model().state_dict())
        if self.individual:
            models = [clone_tensors(weights) for _ in self._modules]
            optimizers = [self._new_adam(m.parameters()).state_dict() for m in self._modules]
        else:
            models = [weights]
            optimizers = [self._new_adam(self._modules[1].parameters()).state_dict()] \
                if self.train_config.shared_optimizer else []
        return FedCSRState(models=models, optimizers=optimizers, **generator_states(rng, self.device))

    def copy_state(self, state: FedCSRState) -> FedCSRState:
        """A new state sharing ``state``'s tensors: states are never written to after
        :meth:`run_round` returns them (it trains the scratch modules and fresh Adams loaded with
        clones), so the kept best state costs no copy of the K models and their Adam moments."""
        return dataclasses.replace(state, models=list(state.models), optimizers=list(state.optimizers))

    def state_dict(self, state: FedCSRState) -> Dict[str, Any]:
        return dataclass_to_dict(state)

    def load_state(self, saved: Mapping[str, Any]) -> FedCSRState:
        state = dataclass_from_dict(FedCSRState, saved)
        state.models = [{n: v.to(self.device) for n, v in m.items()} for m in state.models]
        return state

    # --- one round -----------------------------------------------------------------------------
    def plan_round(self, state: FedCSRState, context: RoundContext) -> PlatformPlan:
        return PlatformPlan(platforms=tuple(self.active))

    def run_round(self, state: FedCSRState, plan: PlatformPlan, context: RoundContext
                  ) -> Tuple[FedCSRState, RoundReport]:
        """Every platform: E local epochs from ``w^{t-1}`` (Eq. 18); then FedAvg (Eq. 19)."""
        tc, use_mcl = self.train_config, self.config.use_mcl
        rng = generators_of(state.numpy_rng, state.torch_rng, state.cuda_rng, self.device)
        losses, parts_acc, steps_total, uploads = {}, {}, 0, []
        if self.individual:
            optimizers = []
            for net, weights, saved in zip(self._modules, state.models, state.optimizers):
                net.load_state_dict(weights)
                optimizers.append(self._new_adam(net.parameters()))
                optimizers[-1].load_state_dict(deep_clone(saved))   # the state's tensors stay untouched
        else:
            global_model, work = self._modules
            global_model.load_state_dict(state.models[0])
            target = frozen_copy(global_model) if use_mcl else None          # MCL target: w^{t-1}, frozen
            shared = None
            if tc.shared_optimizer:
                shared = self._new_adam(work.parameters())
                shared.load_state_dict(deep_clone(state.optimizers[0]))
        for k in plan.platforms:
            if self.individual:
                net, opt = self._modules[k], optimizers[k]
                target = frozen_copy(net) if use_mcl else None
            else:
                work.load_state_dict(state.models[0])
                net, opt = work, (shared if shared is not None else self._new_adam(work.parameters()))
            net.set_graphs(self.graphs[k])
            if target is not None:
                target.set_graphs(self.graphs[k])
            loss, parts, steps = _local_epochs(net, opt, self.split, self.train_rows[k], target, tc, rng, self.device)
            losses[k], steps_total = loss, steps_total + steps
            for key, value in parts.items():
                parts_acc.setdefault(key, []).append((self.counts[k], value))
            if not self.individual:
                uploads.append(clone_tensors(work.state_dict()))
        if self.individual:
            models = [clone_tensors(m.state_dict()) for m in self._modules]
            optimizer_states = [o.state_dict() for o in optimizers]
        else:
            models = [fedavg(uploads, [self.counts[k] for k in plan.platforms])]          # Eq. 19
            optimizer_states = [shared.state_dict()] if shared is not None else []
        sent = 0 if self.individual else self.model_bytes * len(plan.platforms)   # every state-dict tensor, both ways
        w_active = np.asarray([self.counts[k] for k in plan.platforms], dtype=np.float64)
        logged: Dict[str, float] = {"local_steps": steps_total, "bytes_up": sent, "bytes_down": sent}
        logged.update({f"loss/{key}": float(np.average([v for _, v in vals], weights=[c for c, _ in vals]))
                       for key, vals in parts_acc.items()})
        logged.update({f"loss/platform{k}": losses[k] for k in plan.platforms})
        loss = float(np.average([losses[k] for k in plan.platforms], weights=w_active))
        new_state = FedCSRState(models=models, optimizers=optimizer_states, **generator_states(rng, self.device))
        return new_state, RoundReport(train_loss=loss, logged=logged)

    # --- evaluation ------------------------------------------------------------------------------
    def networks(self, state: FedCSRState) -> List[FedCSRModel]:
        """The modules holding ``state``'s models: ``[global]`` or one per platform (scratch, reloaded every round)."""
        nets = self._modules if self.individual else self._modules[:1]
        for net, weights in zip(nets, state.models):
            net.load_state_dict(weights)
        return list(nets)

    def evaluate(self, state: FedCSRState, split: str) -> Dict[str, float]:
        """Per-domain (and per-platform) metrics of ``split`` rows, each platform's with its own graph."""
        tc, nets = self.train_config, self.networks(state)
        evaluation = evaluate_sequences(nets[0], self.split, split, self.graphs, models=nets if self.individual else None,
                                        tie_rule=tc.tie_rule, batch_size=tc.eval_batch_size, device=self.device)
        return flat_evaluation(evaluation, self.names)

    def shared_optimizer(self, state: FedCSRState) -> Optional[torch.optim.Optimizer]:
        """The shared Adam (``shared_optimizer``) holding ``state``'s moments, else ``None``."""
        if self.individual or not self.train_config.shared_optimizer:
            return None
        shared = self._new_adam(self._modules[1].parameters())
        shared.load_state_dict(deep_clone(state.optimizers[0]))
        return shared


class KeptTableGradients:
    """Dense gradients of the five item-sized tables kept between steps and filled by sparse reads.

    The tables (``emb_cross``, ``emb_a``, ``emb_b``, ``head_a``, ``head_b`` weights: (|V|, n) each)
    are read with sparse gradients (:func:`~fedlib.baselines.sequential.sequences.read_rows`),
    which autograd adds in place into their ``.grad``; this keeps that ``.grad`` a dense tensor
    that lives across the steps of the local epochs and is zeroed in place, instead of a fresh
    table-sized zero fill per table and step (whose page faults made those fills 10-15 % of a
    d = 256 step). Adam (unchanged, dense) sees the same dense gradients as before.

    A table that no loss term read in a step (a head whose domain has no target in the batch)
    gets ``.grad = None`` before the step, so Adam skips it as it did with ``zero_grad(set_to_none=True)``
    (its zeroed buffer is kept aside and handed back at the next :meth:`zero_grad`).
    Every other parameter's ``.grad`` is set to None before each step's backward, as before.

    Zeroing: a sparse read adds into the rows it names only, so the buffer is zero outside the
    rows the last step read; :meth:`zero_grad` zeroes those rows (a few thousand of the tables'
    190,000 at Food-Kitchen) instead of filling the five tables (200 MB at d = 256) every step.
    A dense gradient (a full-softmax head reads the whole table) marks every row. The result is
    the same exact zeros.

    Use::

        with KeptTableGradients(model) as tables:
            loss = ...
            tables.zero_grad(optimizer)   # in place of optimizer.zero_grad(set_to_none=True)
            loss.backward()
            tables.before_step()
            optimizer.step()
    """

    def __init__(self, model: FedCSRModel):
        encoder = model.encoder
        self.model = model
        self.tables = [encoder.emb_cross.weight, encoder.emb_a.weight, encoder.emb_b.weight,
                       model.head_a.weight, model.head_b.weight]
        self._index = {id(t): i for i, t in enumerate(self.tables)}
        self._read: set = set()
        self._hooks: list = []
        # Per table: the row ids (1-D int64 tensors) whose .grad rows the last step may have written, or None
        # when every row may be non-zero (a dense gradient, or a buffer of unknown content).
        self._written: List[Optional[List[torch.Tensor]]] = [[] for _ in self.tables]
        self._aside: List[Optional[torch.Tensor]] = [None] * len(self.tables)   # zeroed-to-be buffers of unread tables

    def _reached(self, index: int, grad: torch.Tensor) -> None:
        """Tensor hook: table ``index`` got ``grad`` this step (sparse: note its rows; dense: every row)."""
        self._read.add(index)
        written = self._written[index]
        if grad.is_sparse and written is not None:
            written.append(grad._indices()[0])
        else:
            self._written[index] = None

    def __enter__(self) -> "KeptTableGradients":
        def reached(index):
            return lambda grad: self._reached(index, grad)
        self._hooks = [t.register_hook(reached(i)) for i, t in enumerate(self.tables)]
        self.model.encoder.sparse_table_grads = True
        return self

    def __exit__(self, *exc) -> None:
        for handle in self._hooks:
            handle.remove()
        self.model.encoder.sparse_table_grads = False
        for table in self.tables:
            table.grad = None
        self._aside = [None] * len(self.tables)
        self._written = [[] for _ in self.tables]

    def zero_grad(self, optimizer: torch.optim.Optimizer) -> None:
        """The tables' ``.grad`` dense zeros (allocated once, then the rows the last step wrote zeroed in
        place); every other ``.grad`` None."""
        for group in optimizer.param_groups:
            for p in group["params"]:
                index = self._index.get(id(p))
                if index is None:
                    p.grad = None
                    continue
                if p.grad is None:
                    p.grad, self._aside[index] = self._aside[index], None
                written = self._written[index]
                if p.grad is None:
                    p.grad = torch.zeros_like(p)
                elif written is None or p.grad.layout != torch.strided:
                    p.grad = torch.zeros_like(p) if p.grad.layout != torch.strided else p.grad.zero_()
                elif written:
                    p.grad.index_fill_(0, torch.cat(written), 0.0)    # repeated ids are fine: zeroed twice
                self._written[index] = []
        self._read.clear()

    def before_step(self) -> None:
        """After the backward: a table that got no gradient this step gets ``.grad = None`` (Adam skips it);
        its buffer (zero, or written only at the noted rows) is kept aside for the next :meth:`zero_grad`."""
        for index, table in enumerate(self.tables):
            if index not in self._read:
                self._aside[index], table.grad = table.grad, None


class GlobalRepresentations:
    """The frozen MCL target's ``(r_g^A, r_g^B)`` (Eq. 3) of a platform's training rows, each computed once per round.

    The target is a frozen copy of the round's global model in eval mode: no dropout, no random
    draw, no gradient, so a row's ``r_g`` is the same in every local epoch. It is computed with
    the row's batch of the first epoch, exactly as :func:`fedcsr_loss` would, and read back in
    the later epochs: the target's forward (an eighth of a step: three encoders over the whole
    batch) runs in one epoch of ``local_epochs`` instead of every one. A read-back row's values
    can differ from a recomputation inside another batch by float rounding only (the batch's
    layout and matrix shapes differ), so the loss equals the recomputing loop's to float precision.

    Args:
        target: the frozen model (:func:`~fedlib.papers.fedcsr.model.frozen_copy`), its graph set.
        rows: (N,) the platform's training row ids (distinct), those the batches are drawn from.
    """

    def __init__(self, target: FedCSRModel, rows: np.ndarray):
        self.target = target
        self._sorter = np.argsort(rows, kind="stable")                         # (N,)
        self._sorted_rows = np.asarray(rows)[self._sorter]                     # (N,)
        self._known = np.zeros(len(rows), dtype=bool)                          # (N,) computed this round
        self._values: Optional[Tuple[torch.Tensor, torch.Tensor]] = None       # 2 × (N, n), allocated at first use

    def of(self, batch_rows: np.ndarray, inputs) -> Tuple[torch.Tensor, torch.Tensor]:
        """``(g_a, g_b)``, two (B, n), of the batch rows ``batch_rows`` (B,) whose inputs are ``inputs``."""
        slots = self._sorter[np.searchsorted(self._sorted_rows, batch_rows)]  # (B,) places in ``rows``
        if self._values is not None and self._known[slots].all():
            index = torch.from_numpy(slots).to(self._values[0].device)
            return self._values[0][index], self._values[1][index]
        g_a, g_b = global_representations(self.target, inputs)                # 2 × (B, n)
        if self._values is None:
            self._values = tuple(g.new_empty(self._known.size, g.shape[1]) for g in (g_a, g_b))
        index = torch.from_numpy(slots).to(g_a.device)
        self._values[0][index], self._values[1][index] = g_a, g_b
        self._known[slots] = True
        return g_a, g_b


def _local_epochs(model: FedCSRModel, optimizer: torch.optim.Optimizer, split: SequenceSplit, rows: np.ndarray,
                  target: Optional[FedCSRModel], tc: FedCSRTrainConfig, rng: np.random.Generator,
                  device: torch.device):
    """``local_epochs`` shuffled passes of mini-batches over ``rows``; returns (mean loss, mean parts, steps).

    ``target`` (the frozen MCL model, or None) does not change during the call: its representations
    of each row are computed once (:class:`GlobalRepresentations`).
    """
    model.train()
    total, parts_sum, steps = 0.0, {}, 0
    known = GlobalRepresentations(target, rows) if target is not None else None
    with KeptTableGradients(model) as tables:
        for _ in range(tc.local_epochs):
            order = rows[rng.permutation(rows.size)]
            for start in range(0, order.size, tc.batch_size):
                chosen = order[start:start + tc.batch_size]
                batch = make_batch(split.train, split.num_items_a, split.num_items_b, model.config.maxlen,
                                   rows=chosen).to(device)
                reps = known.of(chosen, batch.inputs) if known is not None else None
                loss, parts = fedcsr_loss(model, batch, global_model=target, rng=rng, global_reps=reps)
                tables.zero_grad(optimizer)
                loss.backward()
                tables.before_step()
                optimizer.step()
                total += float(loss.detach())
                for key, value in parts.items():
                    parts_sum[key] = parts_sum.get(key, 0.0) + float(value.detach())
                steps += 1
    steps_div = max(steps, 1)
    return total / steps_div, {k: v / steps_div for k, v in parts_sum.items()}, steps


# ----------------------------------------------------------------------------- entry points
def train_fedcsr(split: SequenceSplit, config: FedCSRConfig = FedCSRConfig(),
                 train_config: FedCSRTrainConfig = FedCSRTrainConfig(), *, individual: bool = False,
                 verbose: bool = False, progress: Optional[Callable[[Dict[str, float]], None]] = None,
                 checkpointer=None) -> RunResult[FedCSRState]:
    """FedCSR (module docstring) trained by :func:`fedlib.engine.train`; ``individual=True`` trains each platform alone.

    ``progress`` is called with each round's history row (e.g. to advance a progress bar).
    ``checkpointer``: a :class:`~fedlib.engine.Checkpointer`. The trainer resumes from its
    checkpoint when there is one, and saves at the end of each round its schedule picks and when
    the run stops. The state holds the models, the Adam states that outlive a round (the shared
    Adam, the individual platforms' Adams) and the numpy and torch generator states, so a resumed
    run gives the numbers of an uninterrupted one.

    Returns:
        The trainer's :class:`~fedlib.engine.trainer.RunResult`: ``best_round`` and
        ``selected_evaluation`` (best mean validation MRR, with that round's test numbers),
        ``audit_round`` and ``audit_evaluation`` (best mean **test** MRR; audit only), the raw
        ``history``; ``method`` (``"FedCSR"``, ``"FedCSR-central-graph"``, ``"FedCSR-individual"``)
        and ``artifacts``: ``domains`` (the domain names of the metrics' keys), ``models`` (copies
        of the selected networks: ``[global]``, or one per platform individually), ``graphs`` (the
        platforms'), ``config``, ``train_config``, ``shared_optimizer`` (the shared Adam with
        ``shared_optimizer``, else ``None``), ``weights`` (FedAvg's ``N_k``), ``model_bytes``,
        ``active_platforms``. Per-domain blocks and history rows:
        :func:`~fedlib.baselines.sequential.sequence_training.selected_blocks`, ``audit_blocks``,
        ``platform_blocks``, ``history_rows``.

    Raises:
        ValueError: no platform with training sequences, platform/valid/test platform counts
            that differ, CUDA asked for but absent, or ``individual`` with the audit flags.
    """
    tc = train_config
    algorithm = FedCSRAlgorithm(split, config, tc, individual=individual)
    run = train(algorithm, platform_schedule(tc.rounds, tc.patience), seed=tc.seed, checkpointer=checkpointer,
                checkpoint_config=_snapshot_config(config, tc, individual),
                on_round_end=round_callback(algorithm.names, progress, verbose))
    run.method = algorithm.method
    run.artifacts = {"domains": algorithm.names,
                     "models": [copy.deepcopy(net) for net in algorithm.networks(run.selected_state)],
                     "graphs": algorithm.graphs, "config": config, "train_config": tc,
                     "shared_optimizer": algorithm.shared_optimizer(run.state), "weights": algorithm.counts,
                     "model_bytes": algorithm.model_bytes, "active_platforms": algorithm.active}
    return run


def _snapshot_config(config: FedCSRConfig, tc: FedCSRTrainConfig, individual: bool) -> Dict[str, Any]:
    """What a checkpoint must have been made under to be resumed: every setting but ``rounds`` (which may grow).

    ``"loop": "trainer"`` refuses (with the differing key named) a snapshot of the round loop
    this module had before the trainer, whose layout differs.
    """
    train_settings = {k: v for k, v in dataclasses.asdict(tc).items() if k != "rounds"}
    return {"rounds": tc.rounds, "model": dataclasses.asdict(config), "train": train_settings,
            "individual": bool(individual), "loop": "trainer"}


def train_individual(split: SequenceSplit, config: FedCSRConfig = FedCSRConfig(),
                     train_config: FedCSRTrainConfig = FedCSRTrainConfig(), **kwargs) -> RunResult[FedCSRState]:
    """Paper Figure 4 / Table 9: every platform trains alone; same as ``train_fedcsr(..., individual=True)``."""
    return train_fedcsr(split, config, train_config, individual=True, **kwargs)


@register("FedCSR", "sequential", paper="fedcsr", config=FedCSRConfig, train=train_fedcsr)
def build_fedcsr(split: SequenceSplit, *, dim: int, rounds: int, seed: int = 0, device=None,
                 train: Optional[Mapping] = None, **params):
    """FedCSR for the registry: ``params`` override :class:`FedCSRConfig`, ``train`` the
    :class:`FedCSRTrainConfig`; the platforms' schedule of :func:`train_fedcsr`."""
    from fedlib.baselines.registry import Trainable

    local = dict(train or {}, **({"device": str(device)} if device is not None else {}))
    tc = FedCSRTrainConfig(rounds=rounds, seed=seed, **local)
    return Trainable(FedCSRAlgorithm(split, FedCSRConfig(dim=dim, **params), tc), platform_schedule(tc.rounds, tc.patience))
