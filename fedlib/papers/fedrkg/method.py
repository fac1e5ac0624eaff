r"""FedRKG in the engine's rounds: the local recipe, the guidance schedule and its hook, §5.1's memory.

Reference: Lim et al., "Federated Recommendation with Knowledge Guidance" (FedRKG),
https://openreview.net/forum?id=oj2Xj8WXih (arXiv:2511.12959), Algorithm 1 (Appendix B),
§5.1 memory analysis, §6.3 and Table 3; the local recipe and the schedule are the public
code's ``main.py`` and ``models/fedrkg.py`` (https://github.com/Jaehyung-Lim/fedrkg).

Local training (:func:`guided_method`). Each client trains its guided backbone
(:func:`fedlib.papers.fedrkg.guidance.guided_backbone`) with the code's recipe: an engine
:class:`~fedlib.engine.FederatedMethod` with item tables at ``lr × I × lr_eta``
(``0.1 × I × 80``), every other parameter at ``lr``, plain SGD, each update step's gradient
clipped to norm 1 per client. Without guidance this is the local-only run ("w/ PIE").

Schedule (Algorithm 1; the code's ``main.py``). The code aggregates ``P_g`` after the local training of
rounds ``r ∈ {T, 2T, …} (< R)`` and applies guidance at the *start* of round ``r + 1``, for
every user, before that round's local training; the gate is trained on the examples of that
round (its positives and freshly drawn negatives). In :func:`~fedlib.engine.run_federated`
terms (0-based round ``t`` = rounds completed), guidance runs in ``before_round(run, t, plan)``
when ``t − 1`` is a positive multiple of ``T`` (:meth:`KnowledgeGuidance.is_guidance_round`).

How it plugs into the engine (:class:`KnowledgeGuidance`). The gate ``(w_u, b_u)`` is private
per-client state that the backbone does not score with, so it is kept out of the model and
stored in ``AveragingState.extra`` (:data:`GATE_WEIGHT_KEY`, :data:`GATE_BIAS_KEY`; saved by
checkpoints). :meth:`KnowledgeGuidance.attach` puts :meth:`~KnowledgeGuidance.before_round_hook`
in the method's ``before_round(run, t, plan)``, which the trainer calls with round ``t``'s plan
just drawn: the gates train on that plan's examples (:func:`round_gate_examples`; with client
sampling, the users outside the plan get fresh examples too, as the code trains every gate).
The participants of round ``t − 1``, whose plan is gone, are replayed
(:func:`fedlib.engine.plan.guidance_participants`: the client draw is a pure function of
``(seed, round)``). :meth:`KnowledgeGuidance.guide` then runs Algorithm 1's lines 10–17: ``P_g``
(:func:`fedlib.engine.knowledge.global_knowledge`), the nested gate training
(:mod:`fedlib.papers.fedrkg.gates`) and the committed update (Eqs. 3 / 9,
:mod:`fedlib.papers.fedrkg.guidance`).
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Callable, Dict, Mapping, Optional

import numpy as np
import torch

from fedlib.baselines.registry import register
from fedlib.data.sampling import NegativeSampler
from fedlib.data.splits import Pairs
from fedlib.engine.knowledge import global_knowledge
from fedlib.engine.method import FederatedMethod
from fedlib.engine.plan import RoundPlan, guidance_participants, make_round_plan, round_generator
from fedlib.models.base import FederatedModel
from fedlib.models.personal import PersonalItemTableModel
from fedlib.papers.fedrkg.gates import (GateExamples, _buckets_by_count, _has_linear_head, _train_gates_bucketed,
                                       train_gates_on_model)
from fedlib.papers.fedrkg.guidance import (MODE_LABELS, PERSONAL_TABLE, _check_beta, _check_gate, _check_mode,
                                           apply_guidance, backbone_name, check_guided_model, fused_embedding,
                                           gate_values, guidance_vector)

__all__ = [
    "GATE_WEIGHT_KEY", "GATE_BIAS_KEY", "LOG_KEY",
    # the local recipe of a guided backbone
    "guided_method",
    # engine plumbing
    "gate_examples_from_plan", "guidance_examples", "KnowledgeGuidance",
    # §5.1
    "client_parameter_counts",
]

#: ``AveragingState.extra`` keys: gate weights ``(U, 3d)``, biases ``(U,)``, one record per guidance.
GATE_WEIGHT_KEY = "fedrkg_gate_weight"
GATE_BIAS_KEY = "fedrkg_gate_bias"
LOG_KEY = "fedrkg_guidance"


# ======================================================================================
# Local training: FedRKG's recipe for a guided backbone
# ======================================================================================
def guided_method(model: FederatedModel, lr: float = 0.1, lr_eta: float = 80.0, user_lr_scale: float = 1.0,
                  grad_clip_norm: Optional[float] = 1.0, **kwargs) -> FederatedMethod:
    """FedRKG's local recipe for a guided backbone (the plain personal-table run, "w/ PIE").

    Learning rates: ``personal_item_emb`` ``lr × I × lr_eta``; user vectors (``user_emb*``)
    ``lr × user_lr_scale`` (the code's ``lr_u = lr``; F3CRec's FedNCF uses ``lr_eta``); every
    other parameter (heads, MLP layers) ``lr``. Each update step's gradient is clipped to
    ``grad_clip_norm`` per client (the code's ``clip_grad_norm_(params, 1.0)``); the update
    steps are the model's own (:attr:`~fedlib.papers.fedrkg.guidance.GuidedPFedRec.update_steps`: score function, then
    items), one step on everything otherwise. FedNCF's public tower is FedAvg-aggregated with
    the default uniform weights (the paper's ``α_u = 1/n``).

    For :class:`~fedlib.models.PersonalItemTableModel` this is exactly
    :func:`~fedlib.engine.personal_table_method`'s learning rates. Attach the guidance with
    ``KnowledgeGuidance(...).attach(guided_method(model), train, config)``.

    Args:
        model: a guided model (:func:`~fedlib.papers.fedrkg.guidance.guided_backbone`).
        lr, lr_eta: base learning rate (code: 0.1) and item multiplier (code: 80).
        user_lr_scale: user-vector learning rate over ``lr``.
        grad_clip_norm: per-client clip of each step's gradient (``None`` = off).
        kwargs: any other :class:`~fedlib.engine.FederatedMethod` field (``aggregation``,
            ``lr_decay``, ``name``, ...).
    """
    check_guided_model(model)
    rates: Dict[str, float] = {}
    for name, kind in model.param_kinds.items():
        if kind == "private_rows":
            rates[name] = lr * model.num_items * lr_eta
        elif name.startswith("user_emb"):
            rates[name] = lr * user_lr_scale
        else:
            rates[name] = lr
    kwargs.setdefault("name", backbone_name(model))
    kwargs.setdefault("update_steps", getattr(model, "update_steps", None))
    return FederatedMethod(model, rates, grad_clip_norm=grad_clip_norm, **kwargs)


# ======================================================================================
# Engine plumbing
# ======================================================================================
def gate_examples_from_plan(plan: RoundPlan, device=None, dtype=torch.float32) -> GateExamples:
    """The first local epoch of each client of ``plan`` as padded :class:`~fedlib.papers.fedrkg.gates.GateExamples`.

    The code trains the gate on the user's examples of the guidance round (the same
    positives and negatives as its local training), in mini-batches of the local batch size.
    Here the plan's batches of epoch 1 are reused in every gate epoch (the code reshuffles;
    the order of examples inside a batch does not change its mean loss).
    """
    device = torch.device(device) if device is not None else torch.device("cpu")
    counts = plan.num_examples.astype(np.int64)  # (C,) examples of one epoch
    starts = plan.example_indptr[:-1]
    width = int(counts.max(initial=0))
    column = np.arange(width, dtype=np.int64)[None, :]
    valid = column < counts[:, None]  # (C, B)
    index = np.where(valid, starts[:, None] + column, 0)
    return GateExamples(
        users=torch.as_tensor(plan.clients, dtype=torch.int64, device=device),
        items=torch.as_tensor(np.where(valid, plan.items[index], 0), dtype=torch.int64, device=device),
        labels=torch.as_tensor(np.where(valid, plan.labels[index], 0), dtype=dtype, device=device),
        mask=torch.as_tensor(valid, dtype=dtype, device=device),
        steps=torch.as_tensor(np.where(valid, plan.steps[index], 0), dtype=torch.int64, device=device),
    )



def guidance_examples(train: Pairs, sampler: NegativeSampler, config, round_index: int, device=None,
                      dtype=torch.float32) -> GateExamples:
    """Gate-training examples of round ``round_index`` for every user with training data.

    Drawn like the engine's plan of that round (same generator, same options, clients = all
    users with data): with ``config.clients_per_round=None`` the engine's client selection
    draws nothing, so these are exactly the examples of the round's local training, as in
    the code. With client sampling, the users not sampled still get fresh examples (the
    code trains every user's gate), drawn after a different selection, so they differ.
    """
    plan = make_round_plan(train, sampler, round_generator(config.seed, int(round_index)),
                           round_index=int(round_index), num_negatives=config.num_negatives,
                           batch_size=config.batch_size, local_epochs=config.local_epochs,
                           clients=train.active_users())
    return gate_examples_from_plan(plan, device=device, dtype=dtype)


def round_gate_examples(plan: Optional[RoundPlan], train: Pairs, sampler: NegativeSampler, config, round_index: int,
                        device=None, dtype=torch.float32) -> GateExamples:
    """The gate examples of round ``round_index``: the round's own plan when every user with data
    trains in it (the papers' setting, ``clients_per_round=None``), else :func:`guidance_examples`
    for every user (also when no plan is given)."""
    if plan is not None and np.array_equal(plan.clients, train.active_users()):
        return gate_examples_from_plan(plan, device=device, dtype=dtype)
    return guidance_examples(train, sampler, config, round_index, device=device, dtype=dtype)


@dataclass(frozen=True)
class KnowledgeGuidance:
    """FedRKG's guidance schedule and its ablations, for any guided backbone (Table 3).

    Attributes:
        beta: ``β`` of Eqs. 3/9 (code: 0.99; paper: 0.999 on LastFM).
        interval: ``T_int``, rounds between aggregations of ``P_g`` (code: 100).
        mode: one of :data:`~fedlib.papers.fedrkg.guidance.MODES` (that module's docstring).
        gate_lr: the gate's SGD learning rate (code: 1e-4).
        gate_epochs: nested training epochs (code: 5, with an early exit).
        gate_clip_norm: the code's ``clip_grad_norm_`` over all parameters (1.0); ``None`` = off.
        gate_tol: the code's early exit on the running mean loss (1e-4); ``None`` = off.
        chunk_size: users processed together (bounds the ``(chunk, I, d)`` temporaries).
    """

    beta: float = 0.99
    interval: int = 100
    mode: str = "adaptive"
    gate_lr: float = 1e-4
    gate_epochs: int = 5
    gate_clip_norm: Optional[float] = 1.0
    gate_tol: Optional[float] = 1e-4
    chunk_size: int = 256

    def __post_init__(self):
        _check_beta(self.beta)
        _check_mode(self.mode)
        if int(self.interval) != self.interval or self.interval < 1:
            raise ValueError(f"interval must be an integer >= 1 (rounds between guidance steps; the code uses 100), "
                             f"got {self.interval!r}")
        if not math.isfinite(float(self.gate_lr)) or self.gate_lr < 0:
            raise ValueError(f"gate_lr must be a finite number >= 0 (the code uses 1e-4), got {self.gate_lr!r}")
        if int(self.gate_epochs) != self.gate_epochs or self.gate_epochs < 0:
            raise ValueError(f"gate_epochs must be an integer >= 0 (the code uses 5), got {self.gate_epochs!r}")
        if self.gate_clip_norm is not None and not float(self.gate_clip_norm) > 0:
            raise ValueError(f"gate_clip_norm must be > 0 or None, got {self.gate_clip_norm!r}")
        if self.gate_tol is not None and not float(self.gate_tol) >= 0:
            raise ValueError(f"gate_tol must be >= 0 or None, got {self.gate_tol!r}")
        if int(self.chunk_size) < 1:
            raise ValueError(f"chunk_size must be >= 1, got {self.chunk_size!r}")

    @property
    def label(self) -> str:
        """The paper's name of this configuration (Table 2)."""
        return MODE_LABELS[self.mode]

    def is_guidance_round(self, round_index: int) -> bool:
        """Whether guidance runs before round ``round_index`` (0-based, ``run_federated``'s ``t``).

        The code aggregates after rounds ``T, 2T, …`` and guides at the start of the next
        round: ``t − 1`` a positive multiple of ``T`` (``T = 100``: rounds 101, 201, …).
        """
        t = int(round_index)
        return t > self.interval and (t - 1) % self.interval == 0

    # -- one guidance step on the stacked private state ------------------------------------
    def guide(self, private_state: Dict[str, torch.Tensor], extra: Dict[str, object], participants,
              examples: Optional[GateExamples] = None, round_index: Optional[int] = None, *,
              model: Optional[FederatedModel] = None,
              global_state: Optional[Dict[str, torch.Tensor]] = None) -> dict:
        """Algorithm 1, lines 10–17, in place on ``private_state["personal_item_emb"]``.

        1. ``P_g`` = unweighted mean of the ``participants``' tables (before any change);
        2. ``"adaptive"``: train the gates of ``examples.users`` (Eqs. 6–8), kept in ``extra``
           (zero-initialised on first use, the code's init);
        3. commit the mode's update for **every** user (the code guides all users, not only
           the participants).

        The gate is trained on the backbone's logits: ``model=None`` or FedRKG's own backbone
        (:class:`~fedlib.models.PersonalItemTableModel`) take the linear-head fast path
        (:func:`~fedlib.papers.fedrkg.gates.train_gates`, head read from ``private_state``, clients
        chunked by number of examples); any other guided backbone the generic path
        (:func:`~fedlib.papers.fedrkg.gates.train_gates_on_model`, public parameters read from
        ``global_state``).

        Returns (and appends to ``extra[LOG_KEY]``) a small record: round, mode,
        participants, and for ``"adaptive"`` the mean/std of ``g*`` and the gate losses.
        """
        if model is not None:
            check_guided_model(model)
        tables = private_state[PERSONAL_TABLE]  # (U, I, d)
        num_users, _, dim = tables.shape
        participants = np.asarray(participants, dtype=np.int64)
        record = {"round": None if round_index is None else int(round_index), "mode": self.mode,
                  "participants": int(participants.size)}
        if self.mode == "personal_only":  # w/ PIE: nothing is uploaded, nothing changes
            extra.setdefault(LOG_KEY, []).append(record)
            return record
        with torch.no_grad():
            p_g = global_knowledge(tables, participants, self.chunk_size)  # (I, d)
        chunk = int(self.chunk_size)
        if self.mode == "adaptive":
            weight, bias = self._gates(extra, num_users, dim, tables)
            if examples is not None and self.gate_epochs > 0 and examples.users.numel():
                first, last = [], []

                def store(users, result):
                    users = users.to(weight.device)
                    weight[users], bias[users] = result.weight, result.bias
                    ran = result.epochs_run > 0
                    first.append(result.losses[ran, 0])
                    last.append(result.losses[ran].gather(1, (result.epochs_run[ran] - 1)[:, None])[:, 0])

                options = dict(beta=self.beta, lr=self.gate_lr, epochs=self.gate_epochs,
                               clip_norm=self.gate_clip_norm, tol=self.gate_tol)
                if _has_linear_head(model):  # chunks of clients with similar numbers of examples
                    store(examples.users, _train_gates_bucketed(tables, p_g, private_state["head_w"],
                                                                private_state["head_b"], weight, bias, examples,
                                                                chunk, **options))
                else:  # the same grouping, so a chunk is not padded to the busiest client's epoch
                    for _, part in _buckets_by_count(examples, chunk):
                        store(part.users, train_gates_on_model(
                            model, global_state if global_state is not None else {}, private_state, p_g, weight,
                            bias, part.users, part.items, part.labels, part.mask, steps=part.steps, **options))
                record["gate_loss_first_epoch"] = float(torch.cat(first).mean()) if first else float("nan")
                record["gate_loss_last_epoch"] = float(torch.cat(last).mean()) if last else float("nan")
        total = total_sq = 0.0
        with torch.no_grad():
            for start in range(0, num_users, chunk):
                part = slice(start, min(start + chunk, num_users))
                if self.mode == "adaptive":
                    gate = gate_values(tables[part], p_g, weight[part], bias[part])  # (c, I)
                    total += float(gate.sum())
                    total_sq += float(gate.pow(2).sum())
                    tables[part] = fused_embedding(tables[part], guidance_vector(gate, p_g, self.beta), self.beta)
                else:
                    tables[part] = apply_guidance(tables[part], p_g, self.beta, self.mode)
        if self.mode == "adaptive":
            n = num_users * tables.shape[1]
            mean = total / n
            record.update(gate_mean=mean, gate_std=math.sqrt(max(total_sq / n - mean * mean, 0.0)))
        extra.setdefault(LOG_KEY, []).append(record)
        return record

    @staticmethod
    def _gates(extra: Dict[str, object], num_users: int, dim: int, like: torch.Tensor):
        """The stored gates, created with the code's zero init on first use."""
        if GATE_WEIGHT_KEY not in extra:
            extra[GATE_WEIGHT_KEY] = like.new_zeros((num_users, 3 * dim))
            extra[GATE_BIAS_KEY] = like.new_zeros((num_users,))
        weight, bias = extra[GATE_WEIGHT_KEY], extra[GATE_BIAS_KEY]
        _check_gate(num_users, dim, weight, bias)
        return weight, bias

    # -- the engine hook -------------------------------------------------------------------
    def before_round_hook(self, train: Pairs, config, num_items: int, sampler: Optional[NegativeSampler] = None,
                          inner: Optional[Callable] = None, model: Optional[FederatedModel] = None) -> Callable:
        """A ``before_round(run, t, plan)`` hook for :class:`~fedlib.engine.FederatedMethod`.

        Args:
            train: the training pairs given to ``run_federated``.
            config: the run's :class:`~fedlib.engine.FederatedConfig` (seed and plan options).
            num_items: item count of the backbone.
            sampler: the negative sampler given to ``run_federated`` (``None``: its default,
                ``NegativeSampler(train, num_items)``); with client sampling it draws the gate
                examples of the users outside the round's plan.
            inner: an earlier ``before_round`` hook, run first.
            model: the guided backbone whose logits train the gate (``None``: FedRKG's own,
                :class:`~fedlib.models.PersonalItemTableModel`; see :meth:`guide`).
        """
        sampler = sampler if sampler is not None else NegativeSampler(train, num_items)

        def hook(run, round_index, plan):
            if inner is not None:
                inner(run, round_index, plan)
            if not self.is_guidance_round(round_index) or self.mode == "personal_only":
                return
            state = run.state  # the trainer's live run: guidance changes its tables and gates in place
            participants = guidance_participants(train, config, round_index - 1)  # who uploaded after round t − 1
            examples = None
            if self.mode == "adaptive" and self.gate_epochs > 0:
                tables = state.private_state["personal_item_emb"]
                examples = round_gate_examples(plan, train, sampler, config, round_index, device=tables.device,
                                               dtype=tables.dtype)
            self.guide(state.private_state, state.extra, participants, examples, round_index=round_index,
                       model=model, global_state=state.global_state)

        return hook

    def attach(self, method: FederatedMethod, train: Pairs, config, sampler: Optional[NegativeSampler] = None
               ) -> FederatedMethod:
        """``method`` with this guidance in its ``before_round`` hook (an existing hook runs first).

        ``method.model`` must hold a personal item table and no shared one: FedRKG's backbone
        (:class:`~fedlib.models.PersonalItemTableModel` without a shared table, e.g.
        ``personal_table_method(model)``) or any guided backbone of Table 3, e.g.
        ``guided_method(guided_backbone("FedNCF", U, I, d))`` (:mod:`fedlib.papers.fedrkg.guidance`).
        """
        model = method.model
        check_guided_model(model)  # ValueError naming what is wrong and how to build a guided model
        hook = self.before_round_hook(train, config, model.num_items, sampler, inner=method.before_round,
                                      model=model)
        name = f"{method.name}+{self.label}" if method.name else self.label
        return dataclasses.replace(method, before_round=hook, name=name)


# ======================================================================================
# §5.1 memory analysis
# ======================================================================================
def client_parameter_counts(model: FederatedModel, mode: str = "adaptive") -> Dict[str, int]:
    """Numbers one client stores, counted from the backbone's own initialisers (§5.1).

    Counts one user's share of every private parameter and the whole of every public one
    (the client holds its downloaded copy, e.g. FedNCF's tower), plus the gate ``3d + 1`` in
    ``"adaptive"`` mode. The initialisers run on the ``meta`` device (no ``U × I × d`` tensor
    is allocated; only the small per-parameter draws on the CPU).

    Keys: every parameter name; ``"gate"``; ``"stored"`` (between guidance rounds and at
    inference); ``"peak"`` (during guidance, when ``P_g`` (``I × d``) is downloaded too;
    equal to ``"stored"`` for ``"personal_only"`` and for a backbone that already holds a
    public table).

    Paper: ``md + 4d + 1`` stored, ``2md + 4d + 1`` at the guidance peak (``m`` items), for
    FedMF. Ours is one more (``md + 4d + 2``): the code's head is ``Linear(d → 1)``, with a
    bias. A dual-knowledge client (FedRAP: ``PersonalItemTableModel(shared_table=True)``)
    stores ``2md + d + 1`` at all times. Guided FedNCF / PFedRec add their own parameters
    (user vector, tower, score MLP) to the same ``md`` table.

    Args:
        model: :class:`~fedlib.models.PersonalItemTableModel` (either form) or a guided backbone
            (:func:`~fedlib.papers.fedrkg.guidance.guided_backbone`).
        mode: one of :data:`~fedlib.papers.fedrkg.guidance.MODES`.
    """
    _check_mode(mode)
    dual_knowledge = isinstance(model, PersonalItemTableModel) and model.shared_table
    if not dual_knowledge:
        if not isinstance(model, FederatedModel):
            raise ValueError("model must be a federated backbone with a personal item table, "
                             f"got {type(model).__name__}")
        check_guided_model(model)
    generator = torch.Generator().manual_seed(0)
    public = model.init_global(generator, device="meta")
    private = model.init_private(generator, device="meta")
    counts = {}
    for name, kind in model.param_kinds.items():
        if kind.startswith("public"):
            counts[name] = int(public[name].numel())  # the client's downloaded copy
        else:
            counts[name] = int(private[name].numel()) // model.num_users  # (U, ...) stacked: one user's share
    dim = int(private[PERSONAL_TABLE].shape[-1])
    guided = mode != "personal_only" and not dual_knowledge
    counts["gate"] = 3 * dim + 1 if mode == "adaptive" and not dual_knowledge else 0
    counts["stored"] = sum(counts.values())
    counts["peak"] = counts["stored"] + (model.num_items * dim if guided else 0)
    return counts


@register("FedRKG", "single-domain", paper="fedrkg")
def build_fedrkg(split, config, *, dim: int, device=None, backbone: str = "FedMF", mode: str = "adaptive",
                 sampler: Optional[NegativeSampler] = None, guidance: Optional[Mapping] = None, **params):
    """FedRKG for the registry: a guided ``backbone`` (its personal item table in place of the shared
    one) with Knowledge Guidance attached; ``guidance`` overrides :class:`KnowledgeGuidance`'s
    defaults (``beta``, ``interval``, ``gate_lr``, ``gate_epochs``), ``params`` the local recipe's."""
    from fedlib.baselines.registry import averaging
    from fedlib.engine.method import personal_table_method
    from fedlib.papers.fedrkg.guidance import guided_backbone

    model = guided_backbone(backbone, split.num_users, split.num_items, dim)
    recipe = personal_table_method if backbone == "FedMF" else guided_method
    base = recipe(model, **params)
    method = KnowledgeGuidance(mode=mode, **dict(guidance or {})).attach(base, split.train, config, sampler)
    return averaging(method, split, config, device=device)
