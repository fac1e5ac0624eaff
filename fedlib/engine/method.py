"""A federated method as a small bundle of named parts (FedJAX style).

A :class:`FederatedMethod` answers four questions and nothing else:

* **what a client keeps private, what it uploads**: the roles of the backbone's
  parameters (``model.param_kinds``: ``private_*`` stay, ``public_*`` are downloaded and
  their changes uploaded);
* **its local loss**: ``client_loss(model, params, batch) -> (C,)`` one mean loss per
  client (default: BCE with logits, mean over the client's batch);
* **how it steps**: per-parameter learning rates, the local optimiser (plain SGD, or a
  per-client Adam: ``optimizer``, see :class:`LocalOptimizer`), the parameter groups stepped
  in turn per batch (``update_steps``; PFedRec steps its head, then its item rows), optional
  per-client gradient clipping, optionally with Gaussian noise in every local step
  (``gradient_noise``, FedRKG's LDP, §5.2);
* **what the server does**: the aggregation weighting, plus optional hooks to mix the new
  global state with earlier global state (``server_mix``) and to touch private state before
  a round (``before_round``; FedRKG's guidance);
* **what goes over the wire**: the full public tables or only the touched rows
  (``upload_mode``), optionally perturbed by Laplace noise (``upload_noise``, F3CRec §5.6).

Example (FedMF with F3CRec's learning rates)::

    model = FedMF(num_users, num_items, dim=32)
    method = FederatedMethod(
        model=model,
        learning_rates={"user_emb": 1.0, "item_emb": 1.0 * num_items},
        aggregation=Aggregation("uniform"),
    )

FedMF trained locally with Adam (the FedKDRec baselines; one step size for every parameter)::

    method = fedmf_method(model, lr=1e-3, optimizer=LocalOptimizer("adam", weight_decay=1e-6))
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable, Mapping, Optional, Tuple, Union

import torch
import torch.nn.functional as F
from torch.autograd.graph import increment_version

from fedlib.engine.adam_kernel import adam_moments, adam_params
from fedlib.engine.aggregation import Aggregation, ServerMixFn
from fedlib.engine.server_optim import ServerAdam
from fedlib.models.base import FederatedModel
from fedlib.models.mf import FedMF
from fedlib.models.ncf import FedNCF
from fedlib.models.personal import PersonalItemTableModel
from fedlib.models.pfedrec import PFedRec

__all__ = [
    "LocalBatch", "ClientLossFn", "bce_client_loss", "UploadNoise", "GradientNoise", "UPLOAD_MODES", "FederatedMethod",
    "LOCAL_OPTIMIZERS", "LocalOptimizer", "masked_adam_step",
    "fedmf_method", "fedncf_method", "pfedrec_method", "personal_table_method", "chain_hooks",
]


@dataclass
class LocalBatch:
    """One local mini-batch of each of ``C`` clients, padded to a common length ``B``.

    Attributes:
        clients: ``(C,) int64`` user ids.
        rows: ``(C, B) int64`` index into the row tables given to ``model.logits``.
        items: ``(C, B) int64`` global item ids (for losses that need them).
        labels: ``(C, B)`` 1 / 0 targets (model dtype).
        mask: ``(C, B)`` 1 for real examples, 0 for padding.
    """

    clients: torch.Tensor
    rows: torch.Tensor
    items: torch.Tensor
    labels: torch.Tensor
    mask: torch.Tensor


ClientLossFn = Callable[[FederatedModel, Mapping[str, torch.Tensor], LocalBatch], torch.Tensor]
"""``(model, params, batch) -> (C,)`` each client's loss on its own batch. The executors
sum it over clients and differentiate once: clients share no parameter inside a step, so
each client receives exactly the gradient of its own loss."""


def bce_client_loss(model: FederatedModel, params: Mapping[str, torch.Tensor], batch: LocalBatch) -> torch.Tensor:
    """BCE with logits, mean over each client's real examples: ``(C,)``."""
    logits = model.logits(params, batch.rows)  # (C, B)
    losses = F.binary_cross_entropy_with_logits(logits, batch.labels, reduction="none")  # (C, B)
    return (losses * batch.mask).sum(1) / batch.mask.sum(1)


UPLOAD_MODES = ("full", "rows")
NOISE_SUPPORTS = ("full", "touched")


@dataclass(frozen=True)
class UploadNoise:
    r"""Laplace noise each client adds to what it uploads (F3CRec §5.6).

    A client that took part in round ``t`` uploads, for every public tensor ``θ``,
    ``θ_c + ε_c`` with ``ε_c ~ Laplace(0, scale)`` i.i.d. per coordinate (density
    ``exp(−|x|/b) / 2b``, standard deviation ``√2·b``). The server's aggregate is then
    ``θ + Σ_c w_c (Δ_c + ε_c)``.

    Attributes:
        scale: Laplace scale ``b ≥ 0`` (F3CRec's λ ∈ {0, 0.1, …, 0.5}).
        support: which rows of a ``public_rows`` table receive noise.

            * ``"full"``: every row of the full table the client uploads, as F3CRec writes
              ``Q_u ← Q_u + Laplace(0, λ)``. Rows the client never touched change too, so
              the server can no longer read the set of touched items off the upload.
              Costs ``num_items × d`` random numbers per client and round.
            * ``"touched"``: only the rows the client trained on this round (its positives
              and sampled negatives). Much cheaper, but which rows moved is still visible.

            Public dense tensors (e.g. a shared MLP) are always noised entirely.

    Each client's noise is fresh every round and keyed by ``(round key, client id, tensor,
    element)`` with the round key a function of ``(seed, round)``: a counter-based generator
    (:func:`~fedlib.engine.plan.client_noise_keys`, :func:`~fedlib.engine.uploads.upload_noise_rows`)
    evaluated for all clients of a round in one draw. Runs are therefore reproducible (also when
    resumed), every executor adds the same numbers, and row ``i`` of a client's upload gets the
    same noise with either support. Averaging shrinks it: with
    uniform weights over ``C`` clients the aggregate carries noise of variance ``2b²/C`` per
    coordinate, while each individual upload carries ``2b²``.

    Noise is not a formal privacy guarantee here: nothing bounds how much one interaction
    changes a table (see :mod:`fedlib.engine.privacy`).
    """

    scale: float
    support: str = "full"

    def __post_init__(self):
        scale = float(self.scale)
        if not math.isfinite(scale) or scale < 0:
            raise ValueError(f"UploadNoise.scale must be a finite number >= 0, got {self.scale!r}")
        if self.support not in NOISE_SUPPORTS:
            raise ValueError(f"UploadNoise.support must be one of {NOISE_SUPPORTS}, got {self.support!r}")


@dataclass(frozen=True)
class GradientNoise:
    r"""DP-SGD inside local training: clip each client's step gradient, add Gaussian noise.

    In every local step ``k`` (one parameter group of :attr:`FederatedMethod.steps` on one
    batch) of every client ``u`` that steps a covered parameter::

        g   = ∇ L_u  over the covered parameters of the step     (joint vector, all tensors)
        ĝ   = g · min(1, C / ‖g‖₂)                               (privacy.clip_per_sample)
        g̃   = ĝ + N(0, (σ·C)² I)                                 (every covered coordinate)
        θ  ← θ − lr · g̃

    with ``C = clip_norm`` and ``σ = noise_multiplier``. This is FedRKG §5.2: "clip the
    L2-norm of each gradient to C" during local training, then Gaussian noise on the
    gradients of ``P_u`` "with σ proportional to C", the privacy loss given by a moments (RDP)
    accountant (:func:`~fedlib.engine.privacy.dp_epsilon`).

    **Adjacency** is user-level: the unit protected is one client = one user's whole local
    data. The clipped unit is therefore the client's mini-batch gradient (not a single
    example), and every noisy step the client takes counts as one Gaussian mechanism.

    **What is noised.** Covered parameters: ``params`` (e.g. ``("personal_item_emb",)``:
    FedRKG noises the gradient of its item table ``P_u`` only), or every parameter when
    ``None``. Per covered tensor, the noise ``N(0, (σC)²)`` goes on

    * a dense tensor (private head, shared MLP): every entry of the client's copy;
    * a ``private_rows`` table (FedRKG's personal ``P_u``): with ``support="full"`` every
      row of the client's whole table, since the client holds all of it and the
      mechanism's output is the whole gradient (``num_items × d`` draws per step);
    * a ``public_rows`` table (FedMF's or PFedRec's item table): with ``support="full"``
      every row of the client's downloaded copy, so its upload changes every row and does
      not reveal which items it trained on (``upload_mode="rows"`` is then refused:
      untouched rows would not be sent).

    ``support="touched"`` noises, in both kinds of table, only the rows the client trains
    on this round (its positives and sampled negatives, at every step, including steps
    whose batch does not use them). It is much cheaper, but which rows move still
    depends on the client's data, so the ε of :func:`~fedlib.engine.privacy.dp_epsilon`
    does not cover that: treat it as a utility experiment, not a guarantee.

    **Randomness.** The noise of client ``u`` in local step ``k`` of a round is element ``j``
    of the counter stream :func:`~fedlib.engine.plan.client_noise_keys`
    ``(round key, u, stream=1 + k, tensor)`` (``k = batch × len(steps) + group``), drawn for
    all clients of a step at once (:func:`~fedlib.engine.uploads.clients_gradient_noise`), so
    it does not depend on the executor, the chunking or the other participants, and is
    reproducible (also when resumed).

    **With** :attr:`FederatedMethod.grad_clip_norm`: when ``params`` is ``None`` this clip
    replaces it (``grad_clip_norm`` must then be ``None`` or equal to ``clip_norm``); with a
    ``params`` subset, ``grad_clip_norm`` first clips the step's whole gradient (FedRKG's
    ``clip_grad_norm_(all params, 1.0)``), then the covered part is clipped to ``clip_norm``
    and noised.

    Attributes:
        clip_norm: ``C > 0``, L2 bound of a client's covered gradient per step (FedRKG's
            "sensitivity", 0.1 in Table 5).
        noise_multiplier: ``σ ≥ 0``, noise std over ``C`` (``0``: clipping only, no noise).
        params: covered parameter names (``None`` = all).
        support: ``"full"`` (default) or ``"touched"``, the rows of a row table that get
            noise (see above).
    """

    clip_norm: float
    noise_multiplier: float
    params: Optional[Tuple[str, ...]] = None
    support: str = "full"

    def __post_init__(self):
        clip_norm = float(self.clip_norm)
        if not math.isfinite(clip_norm) or clip_norm <= 0:
            raise ValueError(f"GradientNoise.clip_norm must be a finite number > 0, got {self.clip_norm!r}")
        multiplier = float(self.noise_multiplier)
        if not math.isfinite(multiplier) or multiplier < 0:
            raise ValueError(f"GradientNoise.noise_multiplier must be a finite number >= 0, got {self.noise_multiplier!r}")
        if self.params is not None:
            if isinstance(self.params, str):
                raise TypeError(f"GradientNoise.params must be a tuple of names, e.g. ({self.params!r},), not a string")
            names = tuple(self.params)
            if not names or not all(isinstance(name, str) for name in names):
                raise ValueError(f"GradientNoise.params must be a non-empty tuple of parameter names, got {self.params!r}")
            object.__setattr__(self, "params", names)  # accept a list, store a hashable tuple
        if self.support not in NOISE_SUPPORTS:
            raise ValueError(f"GradientNoise.support must be one of {NOISE_SUPPORTS}, got {self.support!r}")

    @classmethod
    def from_std(cls, clip_norm: float, noise_std: float, params: Optional[Tuple[str, ...]] = None,
                 support: str = "full") -> "GradientNoise":
        """From the noise standard deviation instead of the multiplier: ``σ = noise_std / clip_norm``.

        Papers often state the std (FedRKG: "sensitivity 0.1 and σ = 0.001", i.e.
        ``GradientNoise.from_std(0.1, 0.001)``, multiplier 0.01).
        """
        clip_norm = float(clip_norm)
        if not math.isfinite(clip_norm) or clip_norm <= 0:
            raise ValueError(f"clip_norm must be a finite number > 0, got {clip_norm!r}")
        return cls(clip_norm, float(noise_std) / clip_norm, params, support)

    @property
    def noise_std(self) -> float:
        """Standard deviation ``σ·C`` of the noise on each coordinate."""
        return float(self.noise_multiplier) * float(self.clip_norm)


LOCAL_OPTIMIZERS = ("sgd", "adam")


@dataclass(frozen=True)
class LocalOptimizer:
    r"""The optimiser of every client's local training: plain SGD (default) or Adam.

    ``"sgd"``: ``θ ← θ − lr · g`` with ``g`` the step's gradient (after clipping and noise).

    ``"adam"``: ``torch.optim.Adam`` semantics, per client and per parameter, with the L2 form
    of weight decay (``torch.optim.Adam(weight_decay=λ)``, not AdamW)::

        t  ← t + 1                                 (the client's own step count of θ)
        g  ← g + λ θ
        m  ← β₁ m + (1 − β₁) g
        v  ← β₂ v + (1 − β₂) g²
        θ  ← θ − lr / (1 − β₁ᵗ) · m / (√v / √(1 − β₂ᵗ) + ε)

    with ``lr`` the parameter's rate (:meth:`FederatedMethod.lr`, ``lr_decay`` included), now
    read as Adam's step size. What the engine does with it:

    * **Fresh state every round.** A client builds its Adam (``m = v = 0``, ``t = 0``) at the
      start of each round in which it is selected, as FL code that creates the optimiser
      inside local training does: nothing of Adam persists across rounds, and the server
      never sees the moments. Downloaded (public) and private parameters are stepped by the
      same per-client Adam.
    * **Only real steps count.** A client steps only on the local steps where it has a batch;
      a client whose data is exhausted (others still have batches) neither moves nor advances
      its step count, so bias correction uses its own count. With ``update_steps`` each
      parameter has its own count, advanced only by the steps of the groups that contain it
      (one ``torch.optim.Adam`` over all parameters, the others' gradients left ``None``).
    * **Dense gradients.** A row a client did not use in a step gets a zero gradient, so its
      moments decay and it keeps moving on its momentum, exactly as ``torch.optim.Adam`` on the
      client's dense copy of the table. Rows a client never trains on in the round keep
      ``m = v = 0`` and stay put, so (as with SGD) only its touched rows change and
      ``upload_mode="rows"`` still sends everything that moved, **except with**
      ``weight_decay > 0``: the decay term ``λ θ`` reaches every row of every row table the
      client holds, so every row moves and is uploaded (the batched executor then keeps
      whole-table copies, ``C × I × d`` values per chunk as with full-support gradient noise,
      and ``upload_mode="rows"`` is refused).
    * **Clipping and gradient noise** act on the gradient first; Adam consumes the clipped,
      noised gradient (post-processing: the DP guarantee of :class:`GradientNoise` is unchanged).

    Attributes:
        name: ``"sgd"`` or ``"adam"``.
        weight_decay: L2 coefficient ``λ ≥ 0`` added to the gradient (Adam only).
        betas: ``(β₁, β₂)``, each in ``[0, 1)`` (Adam only).
        eps: ``ε > 0`` (Adam only; ``0`` would give ``0 / 0`` on rows whose moments are zero).
    """

    name: str = "sgd"
    weight_decay: float = 0.0
    betas: Tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-8

    def __post_init__(self):
        if self.name not in LOCAL_OPTIMIZERS:
            raise ValueError(f"unknown local optimizer {self.name!r}; expected one of {LOCAL_OPTIMIZERS}")
        decay = float(self.weight_decay)
        if not math.isfinite(decay) or decay < 0:
            raise ValueError(f"weight_decay must be a finite number >= 0, got {self.weight_decay!r}")
        if decay > 0 and self.name != "adam":
            raise ValueError(f"weight_decay={self.weight_decay} is only supported with the 'adam' local optimizer")
        try:
            betas = tuple(float(b) for b in self.betas)
        except (TypeError, ValueError):
            raise ValueError(f"betas must be two numbers in [0, 1), got {self.betas!r}") from None
        if len(betas) != 2 or not all(0.0 <= b < 1.0 for b in betas):
            raise ValueError(f"betas must be two numbers in [0, 1), got {self.betas!r}")
        eps = float(self.eps)
        if not math.isfinite(eps) or eps <= 0:
            raise ValueError(f"eps must be a finite number > 0, got {self.eps!r}")
        object.__setattr__(self, "betas", betas)  # accept a list, store a hashable tuple

    @classmethod
    def of(cls, value: Union[str, "LocalOptimizer"]) -> "LocalOptimizer":
        """``"sgd"`` / ``"adam"`` (default settings) or a :class:`LocalOptimizer` as it is."""
        if isinstance(value, cls):
            return value
        if isinstance(value, str):
            return cls(value)
        raise TypeError(f"optimizer must be 'sgd', 'adam' or a LocalOptimizer, got {type(value).__name__}")

    @property
    def is_adam(self) -> bool:
        return self.name == "adam"


def masked_adam_step(param: torch.Tensor, grad: torch.Tensor, exp_avg: torch.Tensor, exp_avg_sq: torch.Tensor,
                     step: torch.Tensor, mask: torch.Tensor, *, lr: float, betas: Tuple[float, float] = (0.9, 0.999),
                     eps: float = 1e-8, weight_decay: float = 0.0, owner: Optional[torch.Tensor] = None) -> None:
    """One Adam step of many clients' stacked tensors, in place; masked clients are left alone.

    Elementwise ``torch.optim.Adam`` (L2 weight decay, see :class:`LocalOptimizer`) with a
    step count per client, so stacking clients changes nothing: row ``n`` is updated exactly
    as ``torch.optim.Adam`` would update it in client ``owner[n]``'s own optimiser.

    On CPU float32/float64 tensors this is three passes over the elements (two compiled loops
    around torch's square root, :mod:`fedlib.engine.adam_kernel`, written into the callers'
    storage, views included); elsewhere (CUDA, other dtypes, layouts that do not flatten to
    rows, tensors autograd tracks) it is :func:`masked_adam_step_reference`, the torch
    formulation (about ten passes). Both give the same bits (``tests/test_masked_adam.py``).

    Args:
        param: ``(N, ...)`` parameters; row ``n`` belongs to client ``owner[n]``.
        grad: ``(N, ...)`` gradients (zero on rows the client did not use in this step).
        exp_avg, exp_avg_sq: ``(N, ...)`` first and second moments (zeros when fresh).
        step: ``(C,) int64`` step count of each client for this tensor, advanced by one for
            the clients in ``mask``.
        mask: ``(C,) bool``, the clients that step. The others (e.g. clients whose local data
            is exhausted) keep their parameters, moments and step count unchanged.
        lr, betas, eps, weight_decay: as ``torch.optim.Adam``.
        owner: ``(N,) int64`` client of each row (e.g. the ragged local rows of an item
            table); ``None``: ``N == C``, row ``c`` is client ``c``'s.
    """
    rows = _adam_rows_views(param, grad, exp_avg, exp_avg_sq, step, mask, owner)
    if rows is None:
        masked_adam_step_reference(param, grad, exp_avg, exp_avg_sq, step, mask, lr=lr, betas=betas, eps=eps,
                                   weight_decay=weight_decay, owner=owner)
        return
    # numpy views of the small tensors too: a numpy operation costs a microsecond, a torch one ten
    step_counts, stepping = step.numpy(), mask.numpy()
    step_counts += stepping
    top = int(step_counts.max()) if step_counts.size else 0
    step_size, bias2_sqrt, constants = _adam_tables(lr, betas, eps, weight_decay, param.dtype, top)
    if owner is not None:  # numpy indexing raises IndexError for an owner outside [0, C)
        owner = owner.numpy()
        stepping, step_counts = stepping[owner], step_counts[owner]
    param_rows, grad_rows, exp_avg_rows, exp_avg_sq_rows = rows
    adam_moments(param_rows, grad_rows, exp_avg_rows, exp_avg_sq_rows, stepping, constants)
    increment_version((exp_avg, exp_avg_sq, step))  # autograd's in-place check sees the numpy writes
    # torch's square root, the same bits as the reference's (see fedlib.engine.adam_kernel)
    sqrt_rows = exp_avg_sq.detach().sqrt().reshape(param.shape[0], -1).numpy()
    adam_params(param_rows, exp_avg_rows, sqrt_rows, stepping, step_counts, step_size, bias2_sqrt, constants)
    increment_version(param)


def _adam_rows_views(param, grad, exp_avg, exp_avg_sq, step, mask, owner):
    """``(N, E)`` numpy views sharing the four tensors' storage, or ``None`` when the compiled
    pass does not apply (then the torch formulation runs)."""
    tensors = (param, grad, exp_avg, exp_avg_sq)
    dtype, shape = param.dtype, param.shape
    applies = (
        (dtype == torch.float32 or dtype == torch.float64) and param.dim() > 0
        and all(t.dtype == dtype and t.shape == shape and t.device.type == "cpu" for t in tensors)
        and step.dtype == torch.int64 and mask.dtype == torch.bool and step.device.type == mask.device.type == "cpu"
        and mask.dim() == 1 and mask.shape == step.shape
        and (shape[0] == mask.shape[0] if owner is None else
             owner.dtype == torch.int64 and owner.device.type == "cpu" and owner.shape == shape[:1])
        and not (torch.is_grad_enabled() and any(t.requires_grad for t in tensors)))
    if not applies:  # the torch formulation runs (it broadcasts or raises its own errors)
        return None
    try:  # views, never copies, of what the loops write (the caller's storage); the gradient is only read
        param_rows, exp_avg_rows, exp_avg_sq_rows = (t.detach().view(shape[0], -1).numpy()
                                                     for t in (param, exp_avg, exp_avg_sq))
    except RuntimeError:  # strides that do not merge into one row stride
        return None
    # e.g. a batched matmul's weight gradient comes transposed: a copy then
    grad_rows = grad.detach().reshape(shape[0], -1).numpy()
    return param_rows, grad_rows, exp_avg_rows, exp_avg_sq_rows


# (lr, β₁, β₂, ε, weight decay, dtype) -> (step sizes, √bias corrections, constants), grown as counts grow
_ADAM_TABLES: dict = {}


def _adam_tables(lr, betas, eps, weight_decay, dtype, top: int):
    """The per-count step sizes ``lr / (1 − β₁^t)`` and ``√(1 − β₂^t)`` for ``t ≤ top`` (at least),
    computed in Python floats as ``torch.optim.Adam`` does for its scalar step and then rounded
    to ``dtype`` (as :func:`masked_adam_step_reference`), plus the kernel's constants in ``dtype``.

    Cached: recomputing the tables on every call costs more than the step on small tensors.
    """
    beta1, beta2 = betas
    key = (float(lr), float(beta1), float(beta2), float(eps), float(weight_decay), dtype)
    cached = _ADAM_TABLES.get(key)
    if cached is None or len(cached[0]) <= top:
        size = max(2 * top, 64)
        counts = range(size)
        step_size = torch.tensor([lr / (1 - beta1 ** max(t, 1)) for t in counts], dtype=dtype).numpy()
        bias2_sqrt = torch.tensor([(1 - beta2 ** max(t, 1)) ** 0.5 for t in counts], dtype=dtype).numpy()
        weight = torch.tensor(1 - beta1, dtype=dtype)
        constants = torch.stack([weight, torch.tensor(beta2, dtype=dtype), torch.tensor(1 - beta2, dtype=dtype),
                                 torch.tensor(eps, dtype=dtype), torch.tensor(weight_decay, dtype=dtype),
                                 weight - 1]).numpy()
        if len(_ADAM_TABLES) >= 256:  # a decaying learning rate makes a new key every round
            _ADAM_TABLES.clear()
        cached = _ADAM_TABLES[key] = (step_size, bias2_sqrt, constants)
    return cached


def masked_adam_step_reference(param: torch.Tensor, grad: torch.Tensor, exp_avg: torch.Tensor,
                               exp_avg_sq: torch.Tensor, step: torch.Tensor, mask: torch.Tensor, *, lr: float,
                               betas: Tuple[float, float] = (0.9, 0.999), eps: float = 1e-8,
                               weight_decay: float = 0.0, owner: Optional[torch.Tensor] = None) -> None:
    """:func:`masked_adam_step` in torch operations: the reference of the compiled pass, and the
    path off CPU. Same arguments and effect; about ten passes over the tensors, plus
    ``torch.where`` copies when not every row steps."""
    beta1, beta2 = betas
    step += mask.to(step.dtype)
    rows_step = mask if owner is None else mask[owner]  # (N,) bool
    count = step if owner is None else step[owner]  # (N,)
    shape = (-1,) + (1,) * (param.dim() - 1)
    keep = rows_step.view(shape)
    if weight_decay != 0:
        grad = grad.add(param, alpha=weight_decay)
    everyone = bool(rows_step.all())  # the common case: in-place updates, no masking copies
    if everyone:
        exp_avg.lerp_(grad, 1 - beta1)
        exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
    else:
        exp_avg.copy_(torch.where(keep, exp_avg.lerp(grad, 1 - beta1), exp_avg))
        exp_avg_sq.copy_(torch.where(keep, exp_avg_sq.mul(beta2).addcmul_(grad, grad, value=1 - beta2), exp_avg_sq))
    # Bias corrections for every count in use, computed in Python floats as torch.optim.Adam
    # does for its scalar step (so the numbers match it), then looked up per row.
    top = int(count.max()) if count.numel() else 0
    counts = range(top + 1)
    step_size = torch.tensor([lr / (1 - beta1 ** max(t, 1)) for t in counts], dtype=param.dtype, device=param.device)
    bias2_sqrt = torch.tensor([(1 - beta2 ** max(t, 1)) ** 0.5 for t in counts], dtype=param.dtype,
                              device=param.device)
    denom = (exp_avg_sq.sqrt() / bias2_sqrt[count].view(shape)).add_(eps)
    if everyone:
        param.sub_(step_size[count].view(shape) * exp_avg / denom)
    else:
        param.sub_(torch.where(keep, step_size[count].view(shape) * exp_avg / denom, 0.0))


@dataclass(frozen=True)
class FederatedMethod:
    """See the module docstring.

    Attributes:
        model: the backbone (roles and logits of its parameters).
        learning_rates: step size per parameter name (every trainable parameter): SGD's
            learning rate, or Adam's step size with ``optimizer="adam"``.
        lr_decay: every learning rate is multiplied by this after each round, i.e. round ``t``
            (0-based) uses ``lr × lr_decay**t`` (FedRKG: 0.99 on Amazon-Video, 1.0 elsewhere).
        update_steps: parameter groups stepped one after another on each batch, the loss
            being recomputed before each; ``None`` = one step on every parameter.
        grad_clip_norm: clip each client's gradient (over the parameters of the step) to
            this L2 norm, as ``torch.nn.utils.clip_grad_norm_`` (FedRKG: 1.0). See
            :class:`GradientNoise` for how the two combine.
        aggregation: FedAvg weighting.
        client_loss: local loss (default :func:`bce_client_loss`).
        server_mix: optional ``(previous_global, aggregated, round) -> global`` hook.
        before_round: optional ``(run, round_index, plan) -> None`` hook run after the round's
            plan is drawn and before its local training; ``run`` is the trainer's live
            :class:`~fedlib.engine.trainer.RunResult` (it may change ``run.state.private_state`` /
            ``run.state.global_state``, and reads the selection), ``plan`` the round's
            :class:`~fedlib.engine.plan.RoundPlan` (its clients and their examples; read only).
            Several hooks run in order with :func:`chain_hooks`.
        name: label for logs and checkpoints.
        upload_noise: Laplace noise added by each client to its upload (``None`` = none).
        upload_mode: what a client sends for a ``public_rows`` table. ``"full"``: the whole
            table (F3CRec); ``"rows"``: only the rows it touched plus their int64 indices
            (many FedRec papers). The aggregate is the same either way (untouched rows carry
            a zero change); the mode decides the bytes counted by the communication ledger
            and rules out full-support noise (rows that are not sent cannot carry noise).
        gradient_noise: clipping plus Gaussian noise in every local step (DP-SGD at the
            client level, FedRKG's LDP); ``None`` = none. See :class:`GradientNoise`.
        optimizer: the clients' local optimiser: ``"sgd"`` (default), ``"adam"`` or a
            :class:`LocalOptimizer` (Adam's betas, eps, weight decay); a string is stored as
            ``LocalOptimizer(name)``. Adam composes with every other option (clipping and
            gradient noise act on the gradient before Adam; each ``update_steps`` group steps
            its own parameters); see :class:`LocalOptimizer` for its per-round semantics.
        server_optimizer: ``None`` (default: θ ← θ + Δ̄, plain FedAvg) or a
            :class:`~fedlib.engine.server_optim.ServerAdam` that steps the public parameters
            with the negated mean change as its gradient, its moments kept by the trainer
            (FedDAE's code; FedAdam). Applied after aggregation and before ``server_mix``.
    """

    model: FederatedModel
    learning_rates: Mapping[str, float]
    lr_decay: float = 1.0
    update_steps: Optional[Tuple[Tuple[str, ...], ...]] = None
    grad_clip_norm: Optional[float] = None
    aggregation: Aggregation = field(default_factory=Aggregation)
    client_loss: ClientLossFn = bce_client_loss
    server_mix: Optional[ServerMixFn] = None
    before_round: Optional[Callable] = None
    name: str = ""
    upload_noise: Optional[UploadNoise] = None
    upload_mode: str = "full"
    gradient_noise: Optional[GradientNoise] = None
    optimizer: Union[str, LocalOptimizer] = "sgd"
    server_optimizer: Optional[ServerAdam] = None

    def __post_init__(self):
        object.__setattr__(self, "optimizer", LocalOptimizer.of(self.optimizer))
        if self.server_optimizer is not None:
            if not isinstance(self.server_optimizer, ServerAdam):
                raise TypeError(f"server_optimizer must be a ServerAdam or None, "
                                f"got {type(self.server_optimizer).__name__}")
            if self.server_optimizer.pseudo_gradient == "mean_gradient" and self.optimizer.is_adam:
                raise ValueError("ServerAdam(pseudo_gradient='mean_gradient') recovers the clients' gradients from "
                                 "SGD changes (Δ = −lr · Σ g); with a local Adam the change is not a multiple of "
                                 "the gradient: use optimizer='sgd' or pseudo_gradient='change'")
        if self.upload_mode not in UPLOAD_MODES:
            raise ValueError(f"upload_mode must be one of {UPLOAD_MODES}, got {self.upload_mode!r}")
        if self.upload_noise is not None and not isinstance(self.upload_noise, UploadNoise):
            raise TypeError(f"upload_noise must be an UploadNoise or None, got {type(self.upload_noise).__name__}")
        if self.upload_mode == "rows" and self.upload_noise is not None and self.upload_noise.support == "full":
            raise ValueError(
                "upload_mode='rows' sends only the touched rows, so noise cannot cover the full table: "
                "use UploadNoise(scale, support='touched') or upload_mode='full'")
        names = set(self.model.param_kinds)
        missing = names - set(self.learning_rates)
        if missing:
            raise ValueError(f"learning_rates misses {sorted(missing)} (use 0.0 to freeze a parameter)")
        for group in self.steps:
            unknown = set(group) - names
            if unknown:
                raise ValueError(f"update_steps names unknown parameters {sorted(unknown)}")
        self._check_gradient_noise(names)
        if self.optimizer.is_adam:
            negative = sorted(name for name, rate in self.learning_rates.items() if float(rate) < 0)
            if negative:
                raise ValueError(f"Adam step sizes must be >= 0, got negative learning_rates for {negative}")
        if self.upload_mode == "rows" and self.decays_every_row:
            raise ValueError(
                f"upload_mode='rows' sends only the touched rows, but Adam's weight_decay="
                f"{self.optimizer.weight_decay} changes every row of {list(self.model.names('public_rows'))}: "
                "use weight_decay=0 or upload_mode='full'")

    def _check_gradient_noise(self, names) -> None:
        noise = self.gradient_noise
        if noise is None:
            return
        if not isinstance(noise, GradientNoise):
            raise TypeError(f"gradient_noise must be a GradientNoise or None, got {type(noise).__name__}")
        if noise.params is not None:
            unknown = sorted(set(noise.params) - names)
            if unknown:
                raise ValueError(f"GradientNoise.params names unknown parameters {unknown}; "
                                 f"the model has {sorted(names)}")
            stepped = {name for group in self.steps for name in group}
            never = sorted(set(noise.params) - stepped)
            if never:
                raise ValueError(f"GradientNoise.params names parameters no update step trains: {never}")
        elif self.grad_clip_norm is not None and float(self.grad_clip_norm) != float(noise.clip_norm):
            raise ValueError(
                f"grad_clip_norm={self.grad_clip_norm} and GradientNoise.clip_norm={noise.clip_norm} both clip every "
                "parameter: GradientNoise's clip replaces grad_clip_norm, so set grad_clip_norm=None (or equal), or "
                "restrict the noise to some parameters with GradientNoise(params=...)")
        if self.upload_mode == "rows" and self.adds_gradient_noise and noise.support == "full":
            covered = [name for name in self.model.names("public_rows") if name in self.gradient_noise_names]
            if covered:
                raise ValueError(
                    f"upload_mode='rows' sends only the touched rows, but full-support gradient noise changes every "
                    f"row of {covered}: use GradientNoise(..., support='touched') or upload_mode='full'")

    def lr(self, name: str, round_index: int) -> float:
        """Learning rate of parameter ``name`` in round ``round_index``."""
        return float(self.learning_rates[name]) * float(self.lr_decay) ** int(round_index)

    @property
    def steps(self) -> Tuple[Tuple[str, ...], ...]:
        """The parameter groups stepped in turn on each batch."""
        if self.update_steps is None:
            return (tuple(self.model.param_kinds),)
        return tuple(tuple(g) for g in self.update_steps)

    @property
    def adds_upload_noise(self) -> bool:
        """Whether clients perturb their uploads (noise configured with a scale > 0)."""
        return self.upload_noise is not None and float(self.upload_noise.scale) > 0.0

    @property
    def adds_gradient_noise(self) -> bool:
        """Whether local steps add Gaussian noise (``gradient_noise`` with a multiplier > 0)."""
        return self.gradient_noise is not None and float(self.gradient_noise.noise_multiplier) > 0.0

    @property
    def gradient_noise_names(self) -> Tuple[str, ...]:
        """Parameters whose gradients ``gradient_noise`` clips and noises, in declaration order."""
        if self.gradient_noise is None:
            return ()
        covered = self.gradient_noise.params
        return tuple(name for name in self.model.param_kinds if covered is None or name in covered)

    @property
    def step_clip_norm(self) -> Optional[float]:
        """The ``clip_grad_norm_``-style clip of a step's whole gradient, if any.

        ``grad_clip_norm``, except when ``gradient_noise`` covers every parameter: its own
        clip then replaces it.
        """
        if self.gradient_noise is not None and self.gradient_noise.params is None:
            return None
        return self.grad_clip_norm

    @property
    def noised_steps_per_batch(self) -> int:
        """Update steps per batch that use ``gradient_noise`` (groups with a covered parameter).

        A client's noisy local steps per round are its batches times this: the
        ``steps_per_round`` of :func:`~fedlib.engine.privacy.dp_epsilon`.
        """
        covered = set(self.gradient_noise_names)
        return sum(1 for group in self.steps if covered & set(group))

    @property
    def decays_every_row(self) -> bool:
        """Whether Adam's L2 weight decay moves every row of the stepped row tables.

        The decay term ``λ θ`` is part of the gradient of every row the client holds, so
        with ``weight_decay > 0`` a client changes whole tables, not only its touched rows.
        """
        if not (self.optimizer.is_adam and float(self.optimizer.weight_decay) > 0.0):
            return False
        stepped = {name for group in self.steps for name in group}
        return any(name in stepped for name in self.model.row_names)

    def uploads_every_row(self, name: str) -> bool:
        """Whether a client's upload of ``public_rows`` table ``name`` changes every row.

        True with full-support upload noise, full-support gradient noise (multiplier > 0)
        on that table, or Adam weight decay on a stepped table; otherwise only the rows the
        client trained on change.
        """
        if self.adds_upload_noise and self.upload_noise.support == "full":
            return True
        if self.decays_every_row and any(name in group for group in self.steps):
            return True
        return (self.adds_gradient_noise and self.gradient_noise.support == "full"
                and name in self.gradient_noise_names)

    @property
    def is_plain(self) -> bool:
        """Default loss, one step on all parameters, SGD, no clipping or gradient noise (enables analytic kernels)."""
        return (self.client_loss is bce_client_loss and self.update_steps is None and self.grad_clip_norm is None
                and self.gradient_noise is None and not self.optimizer.is_adam)


def chain_hooks(*hooks: Optional[Callable]) -> Optional[Callable]:
    """One ``before_round(run, round_index, plan)`` hook that runs ``hooks`` in order (``None`` skipped).

    Returns ``None`` when no hook is given and the hook itself when there is one, so that a
    method without hooks keeps ``before_round=None``.
    """
    present = [hook for hook in hooks if hook is not None]
    if len(present) <= 1:
        return present[0] if present else None

    def chained(run, round_index: int, plan) -> None:
        for hook in present:
            hook(run, round_index, plan)
    return chained


# -- factories with the learning-rate schemes of the papers' public code ------------------------
def _uses_adam(kwargs) -> bool:
    return LocalOptimizer.of(kwargs.get("optimizer", "sgd")).is_adam


def fedmf_method(model: FedMF, lr: float = 1.0, **kwargs) -> FederatedMethod:
    """FedMF with F3CRec's scheme: user lr = ``lr``, item lr = ``lr × num_items``; uniform mean.

    With ``optimizer="adam"`` (or an Adam :class:`LocalOptimizer`) every parameter gets step
    size ``lr``: the ``× num_items`` factor compensates SGD's small per-row item gradients,
    and Adam's steps do not scale with the gradient.
    """
    if _uses_adam(kwargs):
        return FederatedMethod(model, {"user_emb": lr, "item_emb": lr}, name="FedMF", **kwargs)
    return FederatedMethod(model, {"user_emb": lr, "item_emb": lr * model.num_items}, name="FedMF", **kwargs)


def fedncf_method(model: FedNCF, lr: float = 0.05, lr_eta: float = 170.0, **kwargs) -> FederatedMethod:
    """FedNCF with F3CRec's scheme: head (and tower) ``lr``, user ``lr × lr_eta``, items ``lr × I × lr_eta``.

    With ``optimizer="adam"`` (or an Adam :class:`LocalOptimizer`) every parameter gets step
    size ``lr`` and ``lr_eta`` is not used (see :func:`fedmf_method`).
    """
    if _uses_adam(kwargs):
        return FederatedMethod(model, {name: lr for name in model.param_kinds}, name="FedNCF", **kwargs)
    rates = {}
    for name, kind in model.param_kinds.items():
        if name.startswith("user_emb"):
            rates[name] = lr * lr_eta
        elif kind == "public_rows":
            rates[name] = lr * model.num_items * lr_eta
        else:
            rates[name] = lr
    return FederatedMethod(model, rates, name="FedNCF", **kwargs)


def pfedrec_method(model: PFedRec, lr: float = 0.1, lr_eta: float = 80.0, **kwargs) -> FederatedMethod:
    """PFedRec: head ``lr``, items ``lr × I × lr_eta``; two steps per batch (head, then items)."""
    rates = {"head_w": lr, "head_b": lr, "item_emb": lr * model.num_items * lr_eta}
    return FederatedMethod(model, rates, update_steps=model.update_steps, name="PFedRec", **kwargs)


def personal_table_method(model: PersonalItemTableModel, lr: float = 0.1, lr_eta: float = 80.0,
                          grad_clip_norm: Optional[float] = 1.0, **kwargs) -> FederatedMethod:
    """FedRKG's local recipe: head ``lr``, item tables ``lr × I × lr_eta``, clip to norm 1."""
    rates = {name: (lr * model.num_items * lr_eta if kind.endswith("rows") else lr)
             for name, kind in model.param_kinds.items()}
    return FederatedMethod(model, rates, grad_clip_norm=grad_clip_norm, name="PersonalTable", **kwargs)
