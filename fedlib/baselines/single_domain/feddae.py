r"""FedDAE: a federated VAE with a global and a local encoder mixed by a personal gate.

Reference:
    Li, Long, Zhou, Jiang, Zhang. "Personalized Federated Collaborative Filtering: A
    Variational AutoEncoder Approach" (FedDAE). AAAI 2025. arXiv:2408.08931. Public code
    ``mtics/FedDAE`` (read at commit 1c08fd2: ``utils/vae.py``, ``model/model.py``,
    ``utils/trainer.py``, ``utils/parser.py``, ``utils/data/ae.py``; the code calls the method
    "FedMAE"). FedRKG (Lim et al., arXiv:2511.12959, Table 1, App. C.2) runs it as a
    dual-knowledge baseline: latent 32 (64 outputs = 32 means + 32 log-variances), encoder
    ``m → 64 → 64``, decoder ``32 → 64 → m``, "the official implementation".

Notation: ``I`` items (``m`` in the paper), ``k`` latent size; ``x_u ∈ {0,1}^I`` the training
interaction vector of user ``u``. Each client holds a **global** encoder ``q_φg`` and decoder
``p_θ`` (shared, aggregated by the server) and a **local** encoder ``q_φl`` and gating network
``g_ψ`` (private, never uploaded). An encoder is an MLP with tanh between layers on the
L2-normalised, dropped-out input; its last layer gives ``(μ, log σ²)``::

    x̃      = dropout(x_u / ‖x_u‖₂)                        separate masks for the two encoders
    (μ_l, log σ_l²) = q_φl(x̃),   (μ_g, log σ_g²) = q_φg(x̃)
    (w_l, w_g) = softmax(W₂ dropout(ReLU(W₁ x_u + b₁)) + b₂)    gate on the raw vector, w_l + w_g = 1
    z_l = μ_l + ε_l ⊙ σ_l,  z_g = μ_g + ε_g ⊙ σ_g      ε ~ N(0, I)  (reparameterisation)
    z   = w_l z_l + w_g z_g                                               combined latent
    μ   = w_l μ_l + w_g μ_g,   σ² = w_l² σ_l² + w_g² σ_g²     Eq. 4 (sum of scaled independent Gaussians)
    π   = softmax(p_θ(z)) ∈ Δ^I                            decoder: MLP with tanh between layers
    L_u = −Σ_i x_ui log π_i + β_t · KL(N(μ, σ²) ‖ N(0, I))                 β-ELBO (negated)
    KL  = ½ Σ_j (μ_j² + σ_j² − log σ_j² − 1)

The multinomial likelihood over *all* items is the paper's "reconstruction of the interaction
vector with missing-value prediction": probability mass is also placed on items the user has
not interacted with, which become the recommendations. At evaluation dropout is off and
``z = μ``; items are ranked by the decoder logits ``p_θ(μ)``.

Server (Algorithm 1, "Global Procedure"): the global encoder and decoder are updated with the
clients' accumulated local gradients; the appendix (Eqs. A4–A5) shows these equal the local
parameter changes divided by the learning rate. With local SGD and server step size = local
learning rate this is exactly FedAvg of the changes (uniform over participants, as the code's
``grad /= len(sampled_clients)``), which is what the engine does.

Equation numbers: only Eq. 4 (the combined posterior, derived in the appendix, Eqs. A1–A3)
and Eqs. A4–A5 are recoverable from the sources available here; the rest is written out above.

Units and shapes: ``x`` ``(C, I)`` 0/1; logits ``(C, I)`` (log-softmax gives log-probabilities,
nats); ``μ, log σ²`` ``(C, k)``; gate weights ``(C, 2)`` in ``(0, 1)``, column 0 local,
column 1 global; losses ``(C,)`` in nats per client.

How it maps onto the engine (no engine change):

* **Parameters** are dense, stacked per client as the engine expects: the global encoder and
  decoder are ``public_dense`` (FedAvg), the local encoder and the gate ``private_dense``
  ``(U, ...)``. Their first layer (and the decoder's last) has ``I`` columns (rows): per user
  ``(h + h_gate) × I`` private numbers, the "doubling" of memory FedRKG criticises
  (ML-1M with FedRKG's sizes h = 64, h_gate = k = 32: 6040 × 96 × 3706 ≈ 2.1e9 floats,
  8.6 GB in float32). Keep ``BatchedExecutor(chunk_size)``
  small: every active client holds its own copy of every parameter (``≈ 4 h I`` numbers).
* **Whole interaction rows.** ``client_loss`` receives ``(user, item)`` batches, but the VAE
  consumes a user's whole vector in every step. :class:`FedDAELoss` therefore implements the
  ``prepare_round`` protocol of :class:`~fedlib.baselines.continual.continual.PlanAugmentingExecutor`:
  it reads each client's positives off the round plan (its ``x_u``) and replaces the plan by
  one *marker* example per local step (``local_epochs`` steps per round: the code feeds one
  full-vector batch per user and epoch; ``batch_size`` and the sampled negatives are unused).
  The marker's label is ``−1 − s`` with ``s`` the local step, which tells the loss which step
  it is in. Run with ``PlanAugmentingExecutor(BatchedExecutor())`` (or around a
  ``SequentialExecutor``); the loss refuses ordinary batches with a message saying so.
* **Randomness in the loss** (dropout masks, ``ε``) must not touch torch's global generator and
  must be the same in every executor: client ``u``'s draws in local step ``s`` come from
  :func:`~fedlib.engine.plan.client_noise_generator` ``(plan.noise_key, u, NOISE_STREAM + s)``,
  a stream range disjoint from the engine's gradient-noise streams ``1 + k``.
* **Scoring** needs each user's interaction vector, which ``score_users`` is not given:
  the model holds the training pairs (``FedDAEModel(..., train=split.train)``), the client's
  own data, used only to score.
* **The round index** (for ``β_t``) is read off the plan in ``prepare_round``.

Assumptions:

* **Optimisers**: local SGD (FedRKG: "SGD for all parameter updates"), and by default FedAvg of
  the global part. The code instead sums each client's gradients into the server model's
  ``.grad``, divides by the number of clients and takes an **Adam step on the server** (rate
  1e-3, ``l2_reg`` weight decay); ``server_lr`` selects that
  (:class:`~fedlib.engine.server_optim.ServerAdam` on the mean gradient, whose moments the
  trainer keeps and checkpoints). For one local epoch the code's server gradient is each
  client's gradient at the global parameters, which local SGD recovers exactly as change ÷ rate;
  its clients' own Adam step then only moves the private parts (and, under its ``_set_client``,
  nothing persists of those either: see "Parameter roles").
* **KL weight** ``β_t`` (``kl_schedule``): ``"tanh"`` (default): ``β · tanh(t/10)``, the
  schedule the code evidently intends (``self.beta = tanh(iteration/10) · self.beta``, as
  in FedRAP by the same authors); ``"constant"``: ``β``; ``"code"``: what that line actually
  does: it multiplies the running value, so ``β_0 = β`` (1 in the code) and ``β_t = 0`` for
  every later round (tanh(0) = 0), i.e. training without the KL term.
* **Parameter roles** (``roles``): ``"paper"`` (default): local encoder and gate private.
  ``"code"``: the code's ``_set_client`` loads the *global* copy of the local encoder into
  every client (its local encoder receives the summed gradients like the global one) and never
  restores the private gate: ``client_model.state_dict()[key] = ...`` writes into a temporary
  dict, so every round (and every evaluation) starts from the initial gate. Here ``"code"``
  makes the local encoder ``public_dense`` and freezes the gate at its initial draw (lr 0),
  which matches the code exactly for one local epoch.
* **Dropout** 0.5 on the encoders' input (one mask per encoder) and on the gate's hidden
  layer (``gate_dropout``, the code uses the same rate), inverted scaling ``1/(1 − p)``.
* **Gate width** ``gate_hidden`` defaults to the latent size ``k`` (the code's
  ``GatingNetwork(latent_dim=args.latent_dim)``).
* **Init**: ``nn.Linear``'s ``U(±1/√fan_in)``; every client starts as a copy of one model
  (shared init of the local encoder and the gate), as the code's ``deepcopy``.
* Not implemented (no place in the engine): the code's early exit over local epochs (tol
  1e-2), its accumulation of local gradients across epochs without ``zero_grad``, and
  ``l2_reg`` weight decay.

CUDA: the parameters live on the training state's device (CUDA when present, see
:func:`fedlib.default_device`); noise is drawn on the CPU from per-client generators and moved
there, so the numbers do not depend on the device.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Dict, Mapping, Optional, Sequence, Tuple

import numpy as np
import torch
import torch.nn.functional as F

from fedlib.data.splits import Pairs
from fedlib.engine.method import FederatedMethod, LocalBatch
from fedlib.engine.plan import RoundPlan, client_noise_generator
from fedlib.engine.server_optim import ServerAdam
from fedlib.baselines.single_domain.fedrap import curriculum_weight
from fedlib.models.base import FederatedModel, torch_linear_init

__all__ = [
    "ROLES", "KL_SCHEDULES", "NOISE_STREAM", "VAENoise", "draw_noise", "FedDAEOutput",
    "combine_posteriors", "multinomial_nll", "gaussian_kl", "feddae_objective", "kl_weight",
    "FedDAEModel", "feddae_forward", "feddae_forward_reference", "marker_plan", "FedDAELoss", "feddae_method",
]

#: ``"paper"``: local encoder and gate private; ``"code"``: the public code's effective roles.
ROLES = ("paper", "code")
#: ``β_t`` schedules (module docstring).
KL_SCHEDULES = ("tanh", "constant", "code")
#: ``client_noise_generator`` stream of local step ``s`` is ``NOISE_STREAM + s``.
NOISE_STREAM = 1 << 20

_NORM_EPS = 1e-12  # F.normalize's eps


# ======================================================================================
# Input checks
# ======================================================================================
def _check_choice(name: str, value, choices) -> None:
    if value not in choices:
        raise ValueError(f"unknown {name} {value!r}: use one of {choices}")


def _check_rate(name: str, value) -> float:
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a number in [0, 1), got {value!r}") from None
    if not 0.0 <= number < 1.0:
        raise ValueError(f"{name} must be a dropout rate in [0, 1) (the code uses 0.5), got {value!r}")
    return number


def _check_nonnegative(name: str, value, what: str) -> float:
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a number >= 0 ({what}), got {value!r}") from None
    if not math.isfinite(number) or number < 0:
        raise ValueError(f"{name} must be a finite number >= 0 ({what}), got {value!r}")
    return number


def _check_rows(name: str, tensor: torch.Tensor, width: Optional[int] = None) -> None:
    if tensor.dim() != 2 or (width is not None and tensor.shape[1] != width):
        expected = f"(C, {width})" if width is not None else "(C, ·)"
        raise ValueError(f"{name} must be {expected}: one row per client, got shape {tuple(tensor.shape)}")


# ======================================================================================
# Pure pieces of the objective
# ======================================================================================
def combine_posteriors(weights: torch.Tensor, mu_local: torch.Tensor, logvar_local: torch.Tensor,
                       mu_global: torch.Tensor, logvar_global: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    """Eq. 4: ``μ = w_l μ_l + w_g μ_g``, ``σ² = w_l² σ_l² + w_g² σ_g²``; returns ``(μ, log σ²)``.

    Args:
        weights: ``(C, 2)`` gate output, column 0 local, column 1 global.
        mu_local, logvar_local, mu_global, logvar_global: ``(C, k)``.
    """
    _check_rows("weights", weights, 2)
    for name, tensor in (("mu_local", mu_local), ("logvar_local", logvar_local), ("mu_global", mu_global),
                         ("logvar_global", logvar_global)):
        if tensor.shape != mu_local.shape or tensor.dim() != 2 or tensor.shape[0] != weights.shape[0]:
            raise ValueError(f"{name} must be (C, k) = ({weights.shape[0]}, k) like mu_local "
                             f"{tuple(mu_local.shape)}, got {tuple(tensor.shape)}")
    w_l, w_g = weights[:, :1], weights[:, 1:]
    mu = w_l * mu_local + w_g * mu_global
    var = w_l.pow(2) * logvar_local.exp() + w_g.pow(2) * logvar_global.exp()
    return mu, var.log()


def multinomial_nll(logits: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """``−Σ_i x_i log softmax(logits)_i`` per client: ``(C,)`` (nats)."""
    _check_rows("logits", logits)
    if x.shape != logits.shape:
        raise ValueError(f"x {tuple(x.shape)} must have the shape of logits {tuple(logits.shape)}: (C, num_items)")
    return -(F.log_softmax(logits, dim=1) * x).sum(1)


def gaussian_kl(mu: torch.Tensor, logvar: torch.Tensor) -> torch.Tensor:
    """``KL(N(μ, σ²) ‖ N(0, I)) = ½ Σ_j (μ_j² + σ_j² − log σ_j² − 1)`` per client: ``(C,)``."""
    _check_rows("mu", mu)
    if logvar.shape != mu.shape:
        raise ValueError(f"logvar {tuple(logvar.shape)} must have the shape of mu {tuple(mu.shape)}: (C, k)")
    return 0.5 * (mu.pow(2) + logvar.exp() - logvar - 1.0).sum(1)


def feddae_objective(logits: torch.Tensor, x: torch.Tensor, mu: torch.Tensor, logvar: torch.Tensor,
                     beta: float) -> torch.Tensor:
    """FedDAE's local loss ``−log p(x | z) + β KL`` per client: ``(C,)`` (module docstring)."""
    beta = _check_nonnegative("beta", beta, "weight of the KL term")
    if mu.shape[0] != logits.shape[0]:
        raise ValueError(f"mu has {mu.shape[0]} rows but logits {logits.shape[0]}: one row per client in both")
    return multinomial_nll(logits, x) + beta * gaussian_kl(mu, logvar)


def kl_weight(round_index: int, beta: float = 1.0, schedule: str = "tanh", scale: float = 10.0) -> float:
    """``β_t`` of round ``t`` (0-based): ``β tanh(t/scale)``, ``β``, or the code's ``β·[t = 0]``."""
    _check_choice("kl_schedule", schedule, KL_SCHEDULES)
    beta = _check_nonnegative("beta", beta, "weight of the KL term")
    if int(round_index) < 0:
        raise ValueError(f"round_index must be >= 0 (0-based rounds), got {round_index}")
    if schedule == "constant":
        return beta
    if schedule == "code":
        return beta if int(round_index) == 0 else 0.0
    return beta * curriculum_weight(int(round_index), "tanh", scale)


# ======================================================================================
# Noise of one local step
# ======================================================================================
@dataclass
class VAENoise:
    """The random numbers of one local step of ``C`` clients (all ``(C, ·)``, model dtype).

    Attributes:
        mask_global, mask_local: ``(C, I)`` inverted-dropout masks (0 or ``1/(1 − p)``) on the
            input of the global and the local encoder.
        mask_gate: ``(C, h_gate)`` dropout mask on the gate's hidden layer.
        eps_local, eps_global: ``(C, k)`` standard normal draws of the reparameterisation.
    """

    mask_global: torch.Tensor
    mask_local: torch.Tensor
    mask_gate: torch.Tensor
    eps_local: torch.Tensor
    eps_global: torch.Tensor


def draw_noise(users: Sequence[int], steps: Sequence[int], noise_key: int, num_items: int, gate_hidden: int,
               latent_dim: int, dropout: float = 0.5, gate_dropout: float = 0.5, dtype=torch.float32,
               device="cpu") -> VAENoise:
    """Each client's noise of its local step, from ``client_noise_generator(noise_key, u, NOISE_STREAM + s)``.

    Per client, in this order: ``2I + h_gate`` uniforms (the three masks: global, local, gate),
    then ``2k`` normals (``ε_l``, then ``ε_g``). A pure function of ``(noise_key, u, s)``.
    """
    dropout, gate_dropout = _check_rate("dropout", dropout), _check_rate("gate_dropout", gate_dropout)
    users, steps = list(np.asarray(users).tolist()), list(np.asarray(steps).tolist())
    if len(users) != len(steps):
        raise ValueError(f"users ({len(users)}) and steps ({len(steps)}) must have one entry per client")
    uniforms, normals = [], []
    for user, step in zip(users, steps):
        if int(step) < 0:
            raise ValueError(f"local steps must be >= 0, got {step}")
        gen = client_noise_generator(noise_key, int(user), NOISE_STREAM + int(step))
        uniforms.append(torch.rand(2 * num_items + gate_hidden, generator=gen, dtype=torch.float64))
        normals.append(torch.randn(2 * latent_dim, generator=gen, dtype=torch.float64))
    u = torch.stack(uniforms) if uniforms else torch.zeros(0, 2 * num_items + gate_hidden, dtype=torch.float64)
    n = torch.stack(normals) if normals else torch.zeros(0, 2 * latent_dim, dtype=torch.float64)

    def mask(part, rate):
        return (part >= rate).to(torch.float64) / (1.0 - rate)

    to = dict(dtype=dtype, device=device)
    return VAENoise(
        mask_global=mask(u[:, :num_items], dropout).to(**to),
        mask_local=mask(u[:, num_items:2 * num_items], dropout).to(**to),
        mask_gate=mask(u[:, 2 * num_items:], gate_dropout).to(**to),
        eps_local=n[:, :latent_dim].to(**to),
        eps_global=n[:, latent_dim:].to(**to),
    )


# ======================================================================================
# The model
# ======================================================================================
@dataclass
class FedDAEOutput:
    """One forward pass of ``C`` clients.

    Attributes:
        logits: ``(C, I)`` decoder output (scores).
        mu, logvar: ``(C, k)`` combined posterior (Eq. 4).
        z: ``(C, k)`` combined latent sample (``= mu`` without noise).
        weights: ``(C, 2)`` gate ``(w_l, w_g)``.
        mu_local, logvar_local, mu_global, logvar_global: ``(C, k)`` each encoder's output.
    """

    logits: torch.Tensor
    mu: torch.Tensor
    logvar: torch.Tensor
    z: torch.Tensor
    weights: torch.Tensor
    mu_local: torch.Tensor
    logvar_local: torch.Tensor
    mu_global: torch.Tensor
    logvar_global: torch.Tensor


class FedDAEModel(FederatedModel):
    """FedDAE's client model: global + local VAE encoders, a gate and a global decoder.

    Args:
        num_users, num_items: ``U``, ``I``.
        train: the training :class:`~fedlib.data.splits.Pairs`; each user's row ``x_u`` is the
            input when scoring (:meth:`score_users`). Can be set later with
            :meth:`set_interactions`.
        latent_dim: ``k`` (FedRKG: 32).
        hidden: encoder hidden sizes after the input, e.g. ``(64,)``: encoder ``I → 64 → 2k``,
            decoder ``k → 64 → I`` (reversed). The code's default: ``(768, 512)`` with ``k = 256``.
        gate_hidden: the gate's hidden width (default ``k``).
        roles: ``"paper"`` or ``"code"`` (module docstring).

    Parameters (``param_kinds``), weights ``(out, in)`` as ``nn.Linear``:

    ============================  ==================================  ============================
    ``genc{j}_w``, ``genc{j}_b``  ``public_dense``                    global encoder ``q_φg``
    ``dec{j}_w``, ``dec{j}_b``    ``public_dense``                    decoder ``p_θ`` (last: ``(I, h)``)
    ``lenc{j}_w``, ``lenc{j}_b``  ``private_dense`` (``"code"``:      local encoder ``q_φl``,
                                  ``public_dense``)                   ``(U, out, in)`` when private
    ``gate{0,1}_w``, ``_b``       ``private_dense``                   gate ``g_ψ``: ``(U, h_g, I)``,
                                                                      ``(U, 2, h_g)``
    ============================  ==================================  ============================
    """

    def __init__(self, num_users: int, num_items: int, train: Optional[Pairs] = None, latent_dim: int = 32,
                 hidden: Sequence[int] = (64,), gate_hidden: Optional[int] = None, roles: str = "paper"):
        self.num_users, self.num_items, self.latent_dim = int(num_users), int(num_items), int(latent_dim)
        if self.num_users < 1 or self.num_items < 1:
            raise ValueError(f"num_users and num_items must be >= 1, got {num_users} and {num_items}")
        if self.latent_dim < 1:
            raise ValueError(f"latent_dim must be >= 1 (size k of the latent z), got {latent_dim}")
        self.hidden = tuple(int(h) for h in hidden)
        if any(h < 1 for h in self.hidden):
            raise ValueError(f"hidden layer sizes must be >= 1, got {tuple(hidden)}")
        self.gate_hidden = int(gate_hidden) if gate_hidden is not None else self.latent_dim
        if self.gate_hidden < 1:
            raise ValueError(f"gate_hidden must be >= 1, got {gate_hidden}")
        _check_choice("roles", roles, ROLES)
        self.roles = roles
        self.encoder_dims = (self.num_items, *self.hidden, 2 * self.latent_dim)
        self.decoder_dims = (self.latent_dim, *reversed(self.hidden), self.num_items)
        local_kind = "private_dense" if roles == "paper" else "public_dense"
        kinds: Dict[str, str] = {}
        for prefix, kind, dims in (("genc", "public_dense", self.encoder_dims), ("dec", "public_dense",
                                                                                 self.decoder_dims),
                                   ("lenc", local_kind, self.encoder_dims)):
            for j in range(len(dims) - 1):
                kinds[f"{prefix}{j}_w"] = kinds[f"{prefix}{j}_b"] = kind
        for name in ("gate0_w", "gate0_b", "gate1_w", "gate1_b"):
            kinds[name] = "private_dense"
        self.param_kinds = kinds
        self._interactions: Optional[torch.Tensor] = None
        if train is not None:
            self.set_interactions(train)

    # -- data for scoring ------------------------------------------------------------------
    def set_interactions(self, train: Pairs) -> None:
        """Keep the training pairs: ``x_u`` is each user's 0/1 row (input of :meth:`score_users`)."""
        if not isinstance(train, Pairs):
            raise ValueError(f"train must be Pairs (e.g. split.train), got {type(train).__name__}")
        if train.num_users > self.num_users or (len(train) and int(train.items.max()) >= self.num_items):
            raise ValueError(f"train has {train.num_users} users and items up to "
                             f"{int(train.items.max()) if len(train) else -1}, but the model has {self.num_users} "
                             f"users and {self.num_items} items: build the model with the split's sizes")
        x = torch.zeros(self.num_users, self.num_items, dtype=torch.float32)
        x[torch.as_tensor(train.users), torch.as_tensor(train.items)] = 1.0
        self._interactions = x

    def interaction_rows(self, users: torch.Tensor, dtype=torch.float32, device="cpu") -> torch.Tensor:
        """``(n, I)`` 0/1 training rows of ``users``."""
        if self._interactions is None:
            raise ValueError("FedDAEModel has no interaction data to score from: build it with "
                             "FedDAEModel(..., train=split.train) or call model.set_interactions(split.train)")
        users = torch.as_tensor(users, dtype=torch.int64).cpu()
        return self._interactions[users].to(dtype=dtype, device=device)

    # -- engine contract -------------------------------------------------------------------
    def _draw(self, prefixes, generator, dtype, device, users: Optional[int]) -> Dict[str, torch.Tensor]:
        out = {}
        layers = {"genc": self.encoder_dims, "lenc": self.encoder_dims, "dec": self.decoder_dims,
                  "gate": (self.num_items, self.gate_hidden, 2)}
        for prefix in prefixes:
            dims = layers[prefix]
            for j in range(len(dims) - 1):
                weight, bias = torch_linear_init(dims[j], dims[j + 1], generator, dtype, device)
                if users is not None:  # every client starts as a copy of one model
                    weight = weight.unsqueeze(0).repeat(users, 1, 1)
                    bias = bias.unsqueeze(0).repeat(users, 1)
                out[f"{prefix}{j}_w"], out[f"{prefix}{j}_b"] = weight, bias
        return out

    def init_global(self, generator, dtype=torch.float32, device="cpu"):
        prefixes = ("genc", "dec") if self.roles == "paper" else ("genc", "dec", "lenc")
        return self._draw(prefixes, generator, dtype, device, None)

    def init_private(self, generator, dtype=torch.float32, device="cpu"):
        prefixes = ("lenc", "gate") if self.roles == "paper" else ("gate",)
        return self._draw(prefixes, generator, dtype, device, self.num_users)

    def logits(self, params: Mapping[str, torch.Tensor], rows: torch.Tensor) -> torch.Tensor:
        raise ValueError("FedDAE scores all items from a user's whole interaction vector, not (user, item) rows: "
                         "train it with feddae_method(...) (its FedDAELoss) and score with model.score_users")

    def score_users(self, global_state, private_state, users):
        users = torch.as_tensor(users, dtype=torch.int64)
        ref = next(iter({**global_state, **private_state}.values()))
        x = self.interaction_rows(users, dtype=ref.dtype, device=ref.device)  # (n, I)
        params = {}
        for name, kind in self.param_kinds.items():
            if kind == "public_dense":
                params[name] = global_state[name].unsqueeze(0).expand(users.numel(), *global_state[name].shape)
            else:
                params[name] = private_state[name][users.to(ref.device)]
        return feddae_forward(self, params, x).logits  # (n, I)


def _layers(params, prefix: str, count: int, h: torch.Tensor, activation) -> torch.Tensor:
    """``count`` stacked linear layers ``(C, out, in)`` with ``activation`` between them."""
    for j in range(count):
        h = torch.einsum("coi,ci->co", params[f"{prefix}{j}_w"], h) + params[f"{prefix}{j}_b"]
        if j < count - 1:
            h = activation(h)
    return h


def _check_forward_inputs(model: FedDAEModel, x: torch.Tensor, noise: Optional[VAENoise]) -> None:
    if not isinstance(model, FedDAEModel):
        raise ValueError(f"model must be a FedDAEModel, got {type(model).__name__}")
    _check_rows("x", x, model.num_items)
    if noise is not None:
        expected = {"mask_global": model.num_items, "mask_local": model.num_items, "mask_gate": model.gate_hidden,
                    "eps_local": model.latent_dim, "eps_global": model.latent_dim}
        for name, width in expected.items():
            tensor = getattr(noise, name)
            if tuple(tensor.shape) != (x.shape[0], width):
                raise ValueError(f"noise.{name} must be ({x.shape[0]}, {width}) (one row per client), got "
                                 f"{tuple(tensor.shape)}: draw it with draw_noise(...) for these clients")


def feddae_forward(model: FedDAEModel, params: Mapping[str, torch.Tensor], x: torch.Tensor,
                   noise: Optional[VAENoise] = None) -> FedDAEOutput:
    """The forward pass of ``C`` clients at once (module docstring); ``noise=None``: evaluation mode.

    Args:
        model: the :class:`FedDAEModel` (for its layer counts).
        params: every parameter with a leading client axis ``(C, ...)``.
        x: ``(C, I)`` 0/1 interaction rows.
        noise: :class:`VAENoise` of the step (dropout + sampling), or ``None`` (no dropout, ``z = μ``).
    """
    _check_forward_inputs(model, x, noise)
    k = model.latent_dim
    depth = len(model.encoder_dims) - 1
    x_normed = x / x.norm(dim=1, keepdim=True).clamp(min=_NORM_EPS)  # (C, I)
    out_g = _layers(params, "genc", depth, x_normed if noise is None else x_normed * noise.mask_global, torch.tanh)
    out_l = _layers(params, "lenc", depth, x_normed if noise is None else x_normed * noise.mask_local, torch.tanh)
    mu_g, logvar_g, mu_l, logvar_l = out_g[:, :k], out_g[:, k:], out_l[:, :k], out_l[:, k:]
    hidden = torch.relu(torch.einsum("coi,ci->co", params["gate0_w"], x) + params["gate0_b"])  # (C, h_g)
    if noise is not None:
        hidden = hidden * noise.mask_gate
    weights = torch.softmax(torch.einsum("coi,ci->co", params["gate1_w"], hidden) + params["gate1_b"], dim=1)
    if noise is None:
        z_l, z_g = mu_l, mu_g
    else:
        z_l = mu_l + noise.eps_local * torch.exp(0.5 * logvar_l)
        z_g = mu_g + noise.eps_global * torch.exp(0.5 * logvar_g)
    z = weights[:, :1] * z_l + weights[:, 1:] * z_g  # (C, k)
    mu, logvar = combine_posteriors(weights, mu_l, logvar_l, mu_g, logvar_g)
    logits = _layers(params, "dec", len(model.decoder_dims) - 1, z, torch.tanh)  # (C, I)
    return FedDAEOutput(logits, mu, logvar, z, weights, mu_l, logvar_l, mu_g, logvar_g)


def feddae_forward_reference(model: FedDAEModel, params: Mapping[str, torch.Tensor], x: torch.Tensor,
                             noise: Optional[VAENoise] = None) -> FedDAEOutput:
    """:func:`feddae_forward` one client at a time with ``F.linear`` (the readable reference)."""
    _check_forward_inputs(model, x, noise)
    k = model.latent_dim
    rows = []
    for c in range(x.shape[0]):
        p = {name: tensor[c] for name, tensor in params.items()}
        x_c = x[c]
        x_normed = F.normalize(x_c, dim=0, eps=_NORM_EPS)

        def mlp(prefix, count, h):
            for j in range(count):
                h = F.linear(h, p[f"{prefix}{j}_w"], p[f"{prefix}{j}_b"])
                if j < count - 1:
                    h = torch.tanh(h)
            return h

        depth = len(model.encoder_dims) - 1
        out_g = mlp("genc", depth, x_normed if noise is None else x_normed * noise.mask_global[c])
        out_l = mlp("lenc", depth, x_normed if noise is None else x_normed * noise.mask_local[c])
        mu_g, logvar_g, mu_l, logvar_l = out_g[:k], out_g[k:], out_l[:k], out_l[k:]
        hidden = F.relu(F.linear(x_c, p["gate0_w"], p["gate0_b"]))
        if noise is not None:
            hidden = hidden * noise.mask_gate[c]
        w = F.softmax(F.linear(hidden, p["gate1_w"], p["gate1_b"]), dim=0)
        z_l = mu_l if noise is None else mu_l + noise.eps_local[c] * logvar_l.mul(0.5).exp()
        z_g = mu_g if noise is None else mu_g + noise.eps_global[c] * logvar_g.mul(0.5).exp()
        z = w[0] * z_l + w[1] * z_g
        mu = w[0] * mu_l + w[1] * mu_g
        logvar = torch.log(w[0] ** 2 * logvar_l.exp() + w[1] ** 2 * logvar_g.exp())
        logits = mlp("dec", len(model.decoder_dims) - 1, z)
        rows.append((logits, mu, logvar, z, w, mu_l, logvar_l, mu_g, logvar_g))
    return FedDAEOutput(*(torch.stack(parts) for parts in zip(*rows)))


# ======================================================================================
# The client loss on whole interaction rows
# ======================================================================================
def marker_plan(plan: RoundPlan) -> RoundPlan:
    """One marker example per client and local step: item 0, label ``−1 − s``, step ``s``.

    ``s = 0 .. local_epochs − 1`` (one full-vector step per epoch). ``num_examples`` (the
    aggregation weights) is kept.
    """
    num_clients, epochs = plan.num_clients, int(plan.local_epochs)
    steps = np.tile(np.arange(epochs, dtype=np.int64), num_clients)
    return RoundPlan(
        round_index=plan.round_index, clients=plan.clients,
        example_indptr=np.arange(num_clients + 1, dtype=np.int64) * epochs,
        items=np.zeros(num_clients * epochs, dtype=np.int64), labels=(-1.0 - steps).astype(np.float32),
        steps=steps, num_steps=np.full(num_clients, epochs, dtype=np.int64), num_examples=plan.num_examples,
        batch_size=plan.batch_size, local_epochs=plan.local_epochs, noise_key=plan.noise_key,
    )


class FedDAELoss:
    """FedDAE's client loss ``−log p(x_u | z) + β_t KL`` on whole interaction rows (a ``ClientLossFn``).

    Implements ``prepare_round``/``finish_round`` for
    :class:`~fedlib.baselines.continual.continual.PlanAugmentingExecutor` (module docstring): the round's
    inputs ``x_u`` are read off the plan's positives, the plan becomes :func:`marker_plan`.

    Args:
        beta: ``β >= 0`` (the code's effective value: 1).
        kl_schedule: one of :data:`KL_SCHEDULES`; ``schedule_scale`` the tanh's rounds per unit (10).
        dropout: encoder input dropout (0.5); ``gate_dropout``: the gate's (default = ``dropout``).
    """

    def __init__(self, beta: float = 1.0, kl_schedule: str = "tanh", dropout: float = 0.5,
                 gate_dropout: Optional[float] = None, schedule_scale: float = 10.0):
        kl_weight(0, beta, kl_schedule, schedule_scale)  # validates
        if kl_schedule == "tanh":
            curriculum_weight(1, "tanh", schedule_scale)  # validates the scale
        self.beta, self.kl_schedule, self.schedule_scale = float(beta), kl_schedule, float(schedule_scale)
        self.dropout = _check_rate("dropout", dropout)
        self.gate_dropout = self.dropout if gate_dropout is None else _check_rate("gate_dropout", gate_dropout)
        self._clients: Optional[torch.Tensor] = None  # (C,) sorted user ids of the round
        self._inputs: Optional[torch.Tensor] = None  # (C, I) their x_u
        self._noise_key = 0
        self.round_index = 0

    @property
    def round_inputs(self) -> Optional[Tuple[torch.Tensor, torch.Tensor]]:
        """``(clients (C,), x (C, I))`` of the prepared round (sorted user ids, 0/1 rows), or ``None``."""
        return None if self._inputs is None else (self._clients, self._inputs)

    def beta_t(self, round_index: Optional[int] = None) -> float:
        """``β_t`` of round ``round_index`` (default: the prepared round)."""
        t = self.round_index if round_index is None else int(round_index)
        return kl_weight(t, self.beta, self.kl_schedule, self.schedule_scale)

    # -- PlanAugmentingExecutor protocol ---------------------------------------------------
    def prepare_round(self, plan: RoundPlan, global_state, private_state) -> RoundPlan:
        """Keep each client's ``x_u`` (its positives in ``plan``) and return :func:`marker_plan`."""
        ref = next(iter({**global_state, **private_state}.values()))
        num_items = _num_items_of(global_state, private_state)
        positions = plan.example_positions()
        positive = plan.labels > 0.5
        x = torch.zeros(plan.num_clients, num_items, dtype=ref.dtype)
        x[torch.as_tensor(positions[positive]), torch.as_tensor(plan.items[positive])] = 1.0
        self._clients = torch.as_tensor(plan.clients, dtype=torch.int64, device=ref.device)
        self._inputs = x.to(ref.device)
        self._noise_key = int(plan.noise_key)
        self.round_index = int(plan.round_index)
        return marker_plan(plan)

    def finish_round(self) -> None:
        """Drop the round's inputs."""
        self._clients, self._inputs = None, None

    def __call__(self, model: FederatedModel, params: Mapping[str, torch.Tensor], batch: LocalBatch) -> torch.Tensor:
        if not isinstance(model, FedDAEModel):
            raise ValueError(f"FedDAELoss needs a FedDAEModel, got {type(model).__name__}")
        real = batch.mask > 0
        if self._inputs is None or bool((batch.labels[real] >= 0).any()) or bool((real.sum(1) != 1).any()):
            raise ValueError(
                "FedDAELoss needs one marker example per client and step (whole interaction rows): run with "
                "fedlib.baselines.continual.continual.PlanAugmentingExecutor(BatchedExecutor()) (or around a SequentialExecutor), "
                "which calls its prepare_round")
        positions = torch.searchsorted(self._clients, batch.clients.to(self._clients.device))
        if bool((positions >= self._clients.numel()).any()) or \
                not torch.equal(self._clients[positions.clamp(max=self._clients.numel() - 1)], batch.clients):
            raise ValueError("a client of this batch is not in the prepared round: call prepare_round with this plan")
        x = self._inputs[positions]  # (C, I)
        marker = (batch.labels * batch.mask).sum(1)  # (C,) the one marker label −1 − s
        steps = (-1.0 - marker).round().to(torch.int64).cpu()
        like = params[next(iter(model.param_kinds))]
        noise = draw_noise(batch.clients.cpu(), steps, self._noise_key, model.num_items, model.gate_hidden,
                           model.latent_dim, self.dropout, self.gate_dropout, dtype=like.dtype, device=like.device)
        out = feddae_forward(model, params, x, noise)
        return feddae_objective(out.logits, x, out.mu, out.logvar, self.beta_t())

    def __repr__(self) -> str:
        return (f"FedDAELoss(beta={self.beta}, kl_schedule={self.kl_schedule!r}, dropout={self.dropout}, "
                f"gate_dropout={self.gate_dropout}, round_index={self.round_index})")


def _num_items_of(global_state, private_state) -> int:
    for state in (global_state, private_state):
        if "gate0_w" in state:
            return int(state["gate0_w"].shape[-1])
        if "genc0_w" in state:
            return int(state["genc0_w"].shape[-1])
    raise ValueError(f"FedDAELoss expects FedDAE's parameters (gate0_w, genc0_w), got "
                     f"{sorted({**global_state, **private_state})}")


def feddae_method(model: FedDAEModel, lr: float = 0.1, beta: float = 1.0, kl_schedule: str = "tanh",
                  dropout: float = 0.5, gate_dropout: Optional[float] = None, server_lr: Optional[float] = None,
                  server_weight_decay: float = 0.0, **kwargs) -> FederatedMethod:
    """FedDAE as an engine method: local SGD on every parameter, FedAvg (or server Adam) of the global part.

    Run it with ``PlanAugmentingExecutor(BatchedExecutor(chunk_size=...))``; the plan's
    ``local_epochs`` is the number of full-vector steps per round, ``batch_size`` and
    ``num_negatives`` are unused.

    Args:
        model: a :class:`FedDAEModel` (with ``train`` set, to be evaluated).
        lr: SGD learning rate of every trained parameter (with ``roles="code"`` the gate's is 0).
        beta, kl_schedule, dropout, gate_dropout: see :class:`FedDAELoss`.
        server_lr: ``None`` (default): the global encoder and decoder take the clients' mean
            change (FedAvg, FedRKG's "SGD for all parameter updates"). A step size: the server
            steps them with Adam on the clients' mean *gradient* (the change divided by the
            round's SGD rate, the paper's Eqs. A4–A5), as the public code does
            (:class:`~fedlib.engine.server_optim.ServerAdam`, ``pseudo_gradient="mean_gradient"``;
            the code's rate is 1e-3).
        server_weight_decay: that Adam's L2 coefficient (the code's ``l2_reg``: 1e-8 by default,
            1e-5 in its README's command).
        **kwargs: other :class:`~fedlib.engine.FederatedMethod` fields.
    """
    if not isinstance(model, FedDAEModel):
        raise ValueError(f"feddae_method needs a FedDAEModel, got {type(model).__name__}")
    lr = _check_nonnegative("lr", lr, "SGD learning rate")
    if "client_loss" in kwargs:
        raise ValueError("feddae_method builds its own client_loss (FedDAELoss); pass beta/kl_schedule/dropout instead")
    loss = FedDAELoss(beta, kl_schedule, dropout, gate_dropout)
    frozen = model.roles == "code"
    rates = {name: (0.0 if frozen and name.startswith("gate") else lr) for name in model.param_kinds}
    steps = None
    if frozen:
        steps = (tuple(name for name in model.param_kinds if not name.startswith("gate")),)
    kwargs.setdefault("name", "FedDAE")
    if server_lr is not None:
        if "server_optimizer" in kwargs:
            raise ValueError("give FedDAE's server Adam either as server_lr or as server_optimizer, not both")
        kwargs["server_optimizer"] = ServerAdam(float(server_lr), weight_decay=float(server_weight_decay),
                                                pseudo_gradient="mean_gradient")
    elif server_weight_decay:
        raise ValueError(f"server_weight_decay={server_weight_decay} needs a server Adam: set server_lr as well")
    return FederatedMethod(model, rates, update_steps=steps, client_loss=loss, **kwargs)
