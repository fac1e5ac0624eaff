r"""Privacy-preserving CDR baselines of FedPCL-CDR's Table 2: PriCDR, P2FCDR and P²DTR.

All three are **dual-target**: a :class:`~fedlib.data.splits.DomainSplit` with exactly two
domains ``A``, ``B``, users ``0 .. n_o − 1`` the same people in both, every domain a target
(each gets its own recommender, evaluated with :mod:`fedlib.methods.cdr_common`). What
differs is what crosses the domain boundary and how it is protected.

Notation: ``U`` users, ``I`` items of a domain, ``d`` the embedding size, ``n_o`` shared
users, ``p_u`` / ``q_i`` a domain's user / item embeddings, ``σ`` the logistic function.
Every domain recommender scores ``ŷ_ui = σ(h_uᵀ q_i)`` with a method-specific user vector
``h_u`` and is trained with BCE on each training pair plus one sampled negative (the common
setting of this comparison)::

    L_rec = −mean_{(u,i,y)} [y log ŷ_ui + (1 − y) log(1 − ŷ_ui)]

PriCDR
------
Chen, Wu, Su, Lyu, Zheng, Wang. "Differential Private Knowledge Transfer for
Privacy-Preserving Cross-Domain Recommendation." The ACM Web Conference (WWW) 2022,
pp. 1455–1465. arXiv:2202.04893.

**Mechanism: differentially private publication of the source rating matrix** (stage 1),
then a heterogeneous CDR model (HeteroCDR, stage 2) trained by the target on its own data
plus the published matrix. The source domain ``s`` releases once::

    Y_s = R_s P + N,   R_s ∈ {0,1}^{U_s × I_s},  P ∈ R^{I_s × k},  N_uj ~ N(0, σ²)       (1)

* ``method="sjlt"`` (sparse-aware JL, default): every row of ``P`` (one per item) has
  exactly ``s`` non-zeros ``±1/√s`` in random columns (a sparse Johnson–Lindenstrauss
  matrix), so ``R_s P`` costs ``O(nnz(R_s) · s)`` and every row of ``P`` has L2 norm 1;
* ``method="jlt"``: dense Gaussian JL, ``P_ij ~ N(0, 1/k)``.

Privacy: neighbouring matrices differ in one rating (one (user, item) pair added or
removed), which moves ``R_s P`` by one row of ``P``: L2 sensitivity ``Δ = max_i ‖P_i‖₂``
(exactly 1 for SJLT). ``σ = Δ · z(ε, δ)`` with ``z`` the smallest noise multiplier whose
one-shot Gaussian mechanism is ``(ε, δ)``-DP by RDP accounting
(:func:`~fedlib.engine.privacy.noise_multiplier_for_epsilon` with one step, sampling rate 1).
The release is made once, so training on it (post-processing) costs no further budget.
Defaults ``ε = 4``, ``δ = 1e-5`` per domain (``extra["epsilon"]``, ``extra["delta"]``). This ε
protects one rating in a central release; it is not comparable with the per-user, per-round
LDP budgets of P2FCDR below or of FedPCL-CDR.

HeteroCDR for target ``t`` (dual-target: ``A`` uses ``Y_B``, ``B`` uses ``Y_A``)::

    x_u = Y_s[u] / std(Y_s)                                 standardised published row (post-processing)
    z_u = Enc(x_u),  x̂_u = Dec(ReLU(z_u))                 auto-encoder k → d → d → d → k
    h_u = (p_u + z_u) / 2   if u < n_o,   else p_u          shared users fuse both views
    L   = L_rec + λ_rec · mean ‖x̂_u − x_u‖² / k + λ_align · mean_{u < n_o} ‖z_u − p_u‖²        (2)

The reconstruction term uses every published row (all ``U_s`` source users), the alignment
only the shared users of the batch.

P2FCDR
------
Chen, Zhang, Su, Lai, Xiang, Zhang, Zheng. "Win-Win: A Privacy-Preserving Federated
Framework for Dual-Target Cross-Domain Recommendation." AAAI 2023, pp. 4149–4156.

**Mechanism: orthogonal mapping + LDP (Laplace) on the transformed user embeddings, fused by
a gated selecting vector.** Peer to peer: in every round each domain ``i`` sends the other
its shared users' embeddings mapped by its own orthogonal matrix ``W_i`` and perturbed::

    m_u^i = clip(p_u^i W_i, C) + Lap(0, b)^d,   b = 2C√d / ε,   u < n_o                   (3)
    r_u^i = m_u^j W_iᵀ                              received message, mapped into domain i (4)
    g_u   = σ(W_g |p_u^i − r_u^i| + b_g) ∈ [0, 1]^d                   gated selecting vector (5)
    h_u   = g_u ⊙ p_u^i + (1 − g_u) ⊙ r_u^i   (u < n_o),   h_u = p_u^i otherwise          (6)
    L_i   = L_rec + λ_⊥ ‖W_iᵀ W_i − I‖²_F                                                   (7)

Our reading of the mapping: ``W_i`` takes domain ``i``'s space to a space both domains
share (outgoing ``p W_i``, incoming ``m W_iᵀ = m W_i^{-1}`` while ``W_i`` stays orthogonal),
so each ``W_i`` is trained by its own domain's loss only and nothing but ``m`` crosses.
``clip(v, C) = v · min(1, C/‖v‖₂)``; the Laplace mechanism then has L1 sensitivity ``2C√d``
(:func:`~fedlib.engine.privacy.l1_sensitivity_of_l2_clip`) and is ``ε``-LDP per user and
round; ``R`` rounds compose to ``R·ε`` (``extra["epsilon_total"]``). The default
``C = 1, ε = 32`` (``b = 0.5``) is the same per-release budget FedPCL-CDR's own setting
(β = 0.2, η = 0.1 on 64-dim prototypes) carries under this analysis, and the same
clip-to-noise ratio.

P²DTR
-----
Lin, Huang, Zhang, Xu, Liu, Liao, Wang, Wang, Tan. "Enhancing Dual-Target Cross-Domain
Recommendation with Federated Privacy-Preserving Learning." IJCAI 2024, pp. 2153–2161
(P²DTR; cited as "Chen et al., 2023b" in FedPCL-CDR's baseline list, as Lin et al. 2024 in
its related work).

**Mechanism: private set intersection (PSI) of the user sets, then prototype-based
federated learning whose averaged prototypes refine the users' embeddings inside each
domain.**

* PSI (simulated, :func:`private_set_intersection`): both domains hash their user
  identifiers with HMAC-SHA256 under a key only they share and exchange the digests; each
  learns which of its own users are in the intersection and a common order for them
  (sorted digests), nothing about the other users.
* Each round, after local training, domain ``i`` clusters the embeddings of its PSI users
  with k-means into ``K`` prototypes ``c_k^i`` (labels ``ℓ^i``) and uploads
  ``(c^i, ℓ^i)``; the server matches ``A``'s clusters to ``B``'s by the co-membership of the
  shared users (Hungarian assignment ``π`` maximising ``|{u : ℓ^A_u = k, ℓ^B_u = π(k)}|``) and
  returns the averaged prototypes::

      ḡ_k = (c_k^A + c_{π(k)}^B) / 2          (A's cluster k and B's cluster π(k))       (8)

* Refinement (our simplification of constrained-dominant-set propagation)::

      a(u) = ℓ^i_u if u is a PSI user, else argmin_k ‖p_u − c_k^i‖   (nearest own prototype)  (9)
      h_u  = (1 − α) p_u + α ḡ_{a(u)}                           ḡ fixed within a round   (10)

  Before the first aggregation ``h_u = p_u``.

What left a domain (Table 5's reconstruction attack)
---------------------------------------------------
``result.artifacts["transmitted"][domain] = {"sent": (n, ·), "private": (n, d)}``, one row
per shared user in user-id order, from the last round: P2FCDR ``sent`` = the noisy
messages ``m_u`` and ``private`` = the embeddings ``p_u`` they were computed from; P²DTR
``sent`` = the prototype of the user's cluster ``c_{ℓ_u}`` and ``private`` = the embeddings
the k-means summarised. PriCDR publishes a matrix instead (``artifacts["published"]``).

Simplifications on this machine
-------------------------------
* **One backbone.** Every domain recommender is a dot-product embedding model with BCE and
  one sampled negative (``d = 64``, Adam 1e-3, batch 256): PriCDR's target DNN (DMF towers
  over rating rows) is reduced to embedding tables, P2FCDR's and P²DTR's backbones likewise.
  The methods differ only in their defining mechanism above.
* **PriCDR's JLT is calibrated, not Blocki-style.** PriCDR's JLT follows Blocki et al.
  (2012), whose guarantee comes from a *secret* Gaussian projection after lifting the
  singular values. We treat ``P`` as public and add Gaussian noise calibrated to its largest
  row norm by RDP accounting: a guarantee that holds whoever knows ``P``. Our SJLT is a
  sparse JL matrix with the same calibrated noise (its unit row norms make ``Δ = 1``); the
  paper's exact SJLT construction and noise calibration may differ. The published
  rows are standardised (post-processing) and the auto-encoder is two layers each way.
* **P2FCDR's orthogonality is a penalty** (λ_⊥), not a constraint, and the gate reads the
  element-wise distance ``|p − r|`` (the paper's "similarity between in-domain and
  cross-domain embedding"). The received messages are refreshed once per round (local
  epoch), not per batch.
* **P²DTR's PSI is a simulation**: a keyed hash is not a secure PSI (a party holding the key
  can test any guessed identifier); real PSI uses a cryptographic protocol (e.g.
  Diffie–Hellman or oblivious-transfer based) that we do not run. Constrained-dominant-set
  propagation is replaced by the nearest-prototype assignment (9) and the fixed mixing (10);
  the cluster labels of the shared users are uploaded for the matching (the server learns
  which shared users share a cluster, as in FedPCL-CDR's uploads). Prototypes carry no
  noise (the paper's protection is PSI + aggregation).
* **Exactly two domains**, one selected epoch for both (mean validation HR@10, patience), as
  every method of this comparison.
"""
from __future__ import annotations

import hashlib
import hmac
import math
import time
from dataclasses import asdict, dataclass, field
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from fedlib.data.sampling import NegativeSampler
from fedlib.data.splits import DomainSplit, InteractionSplit, Pairs
from fedlib.engine.privacy import (add_laplace, clip_per_sample, gaussian_noise_like, l1_sensitivity_of_l2_clip,
                                   laplace_epsilon, noise_multiplier_for_epsilon, rdp_epsilon)
from fedlib.engine.algorithm import RoundContext, RoundReport
from fedlib.methods.cdr_common import CDRResult, CrossDomainAlgorithm, check_training_loop, train_cross_domain
from fedlib.methods.fedpcl_cdr import cluster_users

__all__ = [
    # PriCDR
    "PriCDRConfig", "PublishedMatrix", "PUBLISH_METHODS", "rating_matrix", "gaussian_jl_matrix", "sparse_jl_matrix",
    "projection_sensitivity", "gaussian_noise_std", "publish_rating_matrix", "HeteroCDR", "train_pricdr",
    # P2FCDR
    "P2FCDRConfig", "laplace_scale_for_epsilon", "ldp_message", "orthogonal_matrix", "P2FCDRDomain", "train_p2fcdr",
    # P²DTR
    "P2DTRConfig", "user_identities", "private_set_intersection", "match_clusters", "average_prototypes",
    "nearest_prototype", "P2DTRDomain", "train_p2dtr",
]

PUBLISH_METHODS = ("sjlt", "jlt")
Progress = Optional[Callable[[int, Dict[str, float]], None]]


# --------------------------------------------------------------------------------------
# Shared pieces
# --------------------------------------------------------------------------------------
def _validate_common(config) -> None:
    """The settings every config here shares; raises ``ValueError`` naming the field."""
    check_training_loop(config)


def _require_non_negative(config, *keys: str) -> None:
    for key in keys:
        value = getattr(config, key)
        if not (math.isfinite(value) and value >= 0):
            raise ValueError(f"{type(config).__name__}.{key} must be a finite number >= 0, got {value!r}")


def _check_dual_target(split: DomainSplit, method: str) -> None:
    if len(split.domains) != 2:
        raise ValueError(f"{method} is a dual-target method and needs exactly two domains, got "
                         f"{len(split.domains)} ({list(split.domains)}); run it once per pair of domains")
    if split.num_overlap_users < 1:
        raise ValueError(f"{method} transfers knowledge through shared users, but the split has none "
                         f"(num_overlap_users = 0); build the split with overlapping users")


def _normal(shape: Tuple[int, ...], std: float, generator: torch.Generator) -> torch.Tensor:
    return torch.randn(shape, generator=generator) * std


def _child_seed(generator: torch.Generator) -> int:
    return int(torch.randint(0, 2 ** 31 - 1, (1,), generator=generator))


def _training_batches(part: InteractionSplit, sampler: NegativeSampler, batch_size: int, negatives: int,
                      rng: np.random.Generator):
    """One epoch of ``(users, items, labels)`` numpy batches: ``B`` positives then ``B·n`` negatives."""
    train = part.train
    order = rng.permutation(len(train))
    for start in range(0, len(order), batch_size):
        rows = order[start:start + batch_size]
        users = train.users[rows]
        sampled = sampler.sample(users, negatives, rng)  # (B, n)
        yield (np.concatenate([users, np.repeat(users, negatives)]),
               np.concatenate([train.items[rows], sampled.reshape(-1)]),
               np.concatenate([np.ones(len(rows), np.float32), np.zeros(sampled.size, np.float32)]))


def _dot_scores(user_vectors: torch.Tensor, item_table: torch.Tensor, items: torch.Tensor) -> torch.Tensor:
    """``(n, d)`` users and ``(n, C)`` item ids → ``(n, C)`` dot products."""
    return torch.einsum("nd,ncd->nc", user_vectors, item_table[items])


def _scorer(model: nn.Module):
    """A :data:`~fedlib.methods.cdr_common.PairScorer` of ``model.user_vectors`` · item embeddings."""
    model.eval()

    def score(users: torch.Tensor, items: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            return _dot_scores(model.user_vectors(users), model.item_emb, items)

    return score


@dataclass
class DualTargetState:
    """The live state of a dual-target run: per domain its model and Adam, the epoch generator
    ``rng`` (batches, negatives, sampled rows), and ``torch_rng``, the global torch generator's
    state (dropout draws from it), restored around every epoch so that checkpoints capture it;
    ``messages``: what the method exchanged last (P2FCDR's messages, P²DTR's uploads), plain tensors."""

    models: Dict[str, nn.Module]
    optimizers: Dict[str, torch.optim.Optimizer]
    rng: np.random.Generator
    torch_rng: torch.Tensor
    generators: Dict[str, torch.Generator] = field(default_factory=dict)
    messages: Dict[str, Dict[str, object]] = field(default_factory=dict)


class _DualTargetAlgorithm(CrossDomainAlgorithm):
    """The three methods' side of the trainer: one round = one epoch of both domains.

    A subclass builds the state in :meth:`_build` (models, optimisers, generators, in the order
    of the original setup) and trains one epoch in :meth:`_epoch`; both run with the global
    torch generator seeded by ``config.seed`` (init) or restored from the state (epochs), inside
    ``fork_rng`` so the caller's global generator is untouched.
    """

    def __init__(self, split: DomainSplit, config, device, ks: Sequence[int]):
        self.split, self.config, self.seed, self.device, self.ks = split, config, int(config.seed), device, tuple(ks)
        self.names = list(split.domains)
        self.samplers = {d: NegativeSampler(split[d].train, split[d].num_items) for d in self.names}

    def _build(self) -> DualTargetState:
        raise NotImplementedError

    def _epoch(self, state: DualTargetState, epoch: int) -> Dict[str, float]:
        raise NotImplementedError

    def init(self, seed: int) -> DualTargetState:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(self.config.seed)  # dropout draws from the global RNG
            state = self._build()
            state.torch_rng = torch.get_rng_state()
        return state

    def run_round(self, state: DualTargetState, plan: int, context: RoundContext
                  ) -> Tuple[DualTargetState, RoundReport]:
        with torch.random.fork_rng(devices=[]):
            torch.set_rng_state(state.torch_rng)
            logged = self._epoch(state, context.index + 1)
            state.torch_rng = torch.get_rng_state()
        losses = [value for key, value in logged.items() if key.endswith("/loss_rec")]
        return state, RoundReport(train_loss=float(np.mean(losses)) if losses else math.nan, logged=logged)

    def scorers(self, state: DualTargetState):
        return {d: _scorer(state.models[d]) for d in self.names}

    def _models_and_optimizers(self, make_model) -> Tuple[Dict[str, nn.Module], Dict[str, torch.optim.Optimizer]]:
        """``make_model(index, name)`` for both domains, each with its Adam (lr, weight decay of the config)."""
        models, optimizers = {}, {}
        for index, name in enumerate(self.names):
            models[name] = make_model(index, name).to(self.device)
            optimizers[name] = torch.optim.Adam(models[name].parameters(), lr=self.config.lr,
                                                weight_decay=self.config.weight_decay)
        return models, optimizers


def _train(algorithm: _DualTargetAlgorithm, progress: Progress, checkpointer=None, on_round_end=None):
    """Train with the family's schedule; ``checkpoint_config`` is the config as plain values."""
    config = algorithm.config
    checkpoint_config = None if checkpointer is None else {"method": type(config).__name__, **asdict(config)}
    return train_cross_domain(algorithm, config, rounds=config.epochs, progress=progress, checkpointer=checkpointer,
                              checkpoint_config=checkpoint_config, on_round_end=on_round_end)


def _bce_step(model: nn.Module, optimizer: torch.optim.Optimizer, users, items, labels, device,
              extra_loss: Optional[Callable[[torch.Tensor], Dict[str, torch.Tensor]]] = None) -> Dict[str, float]:
    """One Adam step on ``L_rec`` (+ the weighted extra terms ``extra_loss(users)`` returns)."""
    u = torch.as_tensor(users, device=device)
    v = torch.as_tensor(items, device=device)
    y = torch.as_tensor(labels, device=device)
    logits = (model.user_vectors(u) * model.item_emb[v]).sum(-1)  # (B(1+n),)
    loss_rec = F.binary_cross_entropy_with_logits(logits, y)
    terms = extra_loss(u) if extra_loss is not None else {}
    loss = loss_rec + sum(terms.values()) if terms else loss_rec
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()
    return {"loss_rec": loss_rec.item(), **{key: value.item() for key, value in terms.items()}}


def _mean_logs(rows: List[Dict[str, float]], prefix: str) -> Dict[str, float]:
    if not rows:
        return {}
    return {f"{prefix}/{key}": float(np.mean([row[key] for row in rows])) for key in rows[0]}


# --------------------------------------------------------------------------------------
# PriCDR: differentially private rating publication (Eq. 1) + HeteroCDR (Eq. 2)
# --------------------------------------------------------------------------------------
@dataclass(frozen=True)
class PriCDRConfig:
    """One PriCDR run.

    Attributes:
        dim: d (64). lr, weight_decay: Adam (1e-3, 0). batch_size: positives per step (256),
            each with ``train_negatives`` sampled negatives (1).
        publish_method: ``"sjlt"`` (sparse-aware JL, default) or ``"jlt"`` (dense Gaussian JL).
        projection_dim: k, the columns of the published matrix (64).
        sjlt_nonzeros: s, non-zeros per row of the SJLT matrix (8; at most ``projection_dim``).
        epsilon, delta: the (ε, δ) of each domain's one-shot release, per rating (4, 1e-5).
        dp: ``False`` publishes ``R P`` without noise (ablation; no guarantee).
        reconstruction_weight: λ_rec (1.0). align_weight: λ_align (0.1). dropout: on the
            auto-encoder input (0.1).
        epochs, patience, eval_every, select_on, seed: the loop (100, 10, 1, "valid", 0).
    """

    dim: int = 64
    lr: float = 1e-3
    weight_decay: float = 0.0
    batch_size: int = 256
    train_negatives: int = 1
    publish_method: str = "sjlt"
    projection_dim: int = 64
    sjlt_nonzeros: int = 8
    epsilon: float = 4.0
    delta: float = 1e-5
    dp: bool = True
    reconstruction_weight: float = 1.0
    align_weight: float = 0.1
    dropout: float = 0.1
    epochs: int = 100
    patience: int = 10
    eval_every: int = 1
    select_on: str = "valid"
    seed: int = 0

    def __post_init__(self):
        _validate_common(self)
        if self.publish_method not in PUBLISH_METHODS:
            raise ValueError(f"publish_method must be one of {PUBLISH_METHODS}, got {self.publish_method!r}")
        if int(self.projection_dim) < 1:
            raise ValueError(f"projection_dim must be >= 1, got {self.projection_dim}")
        if not 1 <= int(self.sjlt_nonzeros) <= int(self.projection_dim):
            raise ValueError(f"sjlt_nonzeros must be in [1, projection_dim={self.projection_dim}], "
                             f"got {self.sjlt_nonzeros}")
        if not (math.isfinite(self.epsilon) and self.epsilon > 0):
            raise ValueError(f"epsilon must be a finite number > 0 (use dp=False for no noise), got {self.epsilon}")
        if not 0 < self.delta < 1:
            raise ValueError(f"delta must be in (0, 1), e.g. 1e-5, got {self.delta}")
        if not 0 <= self.dropout < 1:
            raise ValueError(f"dropout must be in [0, 1), got {self.dropout}")
        _require_non_negative(self, "reconstruction_weight", "align_weight")


@dataclass(frozen=True)
class PublishedMatrix:
    """One domain's differentially private rating release (Eq. 1).

    Attributes:
        values: ``(U, k)`` float32 ``Y = R P + N``, row ``u`` = the domain's user ``u``.
        projection: ``(I, k)`` the JL matrix ``P`` (public in our analysis).
        method: ``"sjlt"`` or ``"jlt"``.
        epsilon, delta: the guarantee (``inf`` / 0 without noise).
        sensitivity: ``Δ = max_i ‖P_i‖₂``, the L2 change of ``R P`` when one rating changes.
        noise_std: σ per entry of ``N``.
    """

    values: torch.Tensor
    projection: torch.Tensor
    method: str
    epsilon: float
    delta: float
    sensitivity: float
    noise_std: float

    def nbytes(self) -> int:
        return self.values.numel() * self.values.element_size()


def rating_matrix(pairs: Pairs, num_users: int, num_items: int) -> torch.Tensor:
    """``(U, I)`` sparse COO float32 matrix with 1 at every (user, item) pair (duplicates count once)."""
    keys = np.unique(pairs.users.astype(np.int64) * int(num_items) + pairs.items)
    index = torch.as_tensor(np.stack([keys // num_items, keys % num_items]))
    return torch.sparse_coo_tensor(index, torch.ones(keys.size), (num_users, num_items),
                                   check_invariants=True).coalesce()


def gaussian_jl_matrix(num_items: int, k: int, generator: torch.Generator) -> torch.Tensor:
    """``(I, k)`` dense JL matrix, entries ``N(0, 1/k)`` (so ``E‖xP‖² = ‖x‖²``)."""
    return torch.randn(num_items, k, generator=generator) / math.sqrt(k)


def sparse_jl_matrix(num_items: int, k: int, nonzeros: int, generator: torch.Generator) -> torch.Tensor:
    """``(I, k)`` sparse JL matrix: each row has exactly ``s`` entries ``±1/√s`` in distinct random columns.

    Every row therefore has L2 norm exactly 1. Returned dense (``I·k`` floats; ``k`` is small).
    """
    if not 1 <= nonzeros <= k:
        raise ValueError(f"nonzeros must be in [1, k={k}], got {nonzeros}")
    columns = torch.rand(num_items, k, generator=generator).argsort(dim=1)[:, :nonzeros]  # (I, s) distinct
    signs = torch.randint(0, 2, (num_items, nonzeros), generator=generator).float() * 2 - 1
    matrix = torch.zeros(num_items, k)
    matrix.scatter_(1, columns, signs / math.sqrt(nonzeros))
    return matrix


def projection_sensitivity(projection: torch.Tensor, max_rating: float = 1.0) -> float:
    """L2 sensitivity ``max_rating · max_i ‖P_i‖₂`` of ``R ↦ R P`` to one changed rating."""
    return float(max_rating * torch.linalg.vector_norm(projection, dim=1).max())


def gaussian_noise_std(epsilon: float, delta: float, sensitivity: float) -> float:
    """σ for a one-shot ``(ε, δ)``-DP Gaussian mechanism of L2 sensitivity ``Δ``: ``Δ · z(ε, δ)``.

    ``z`` is the smallest noise multiplier (to 1 % in ε) for which Opacus' RDP accountant
    gives at most ``ε`` after one step at sampling rate 1. The accountant's RDP orders stop
    at 63, so it cannot certify very small ε (below about 0.2 at δ = 1e-5): that raises.
    """
    try:
        multiplier = noise_multiplier_for_epsilon(epsilon, 1.0, 1, delta)
    except ValueError as error:
        raise ValueError(f"the RDP accountant cannot certify epsilon={epsilon} at delta={delta} for one Gaussian "
                         f"release ({error}); use a larger epsilon (>= 0.2 at delta=1e-5) or a larger delta") from error
    return float(sensitivity) * multiplier


def publish_rating_matrix(part: InteractionSplit, *, projection_dim: int = 64, method: str = "sjlt",
                          sjlt_nonzeros: int = 8, epsilon: float = 4.0, delta: float = 1e-5,
                          generator: torch.Generator, dp: bool = True) -> PublishedMatrix:
    """PriCDR stage 1 on one domain's training pairs: ``Y = R P + N`` (Eq. 1)."""
    if method not in PUBLISH_METHODS:
        raise ValueError(f"method must be one of {PUBLISH_METHODS}, got {method!r}")
    ratings = rating_matrix(part.train, part.num_users, part.num_items)  # (U, I) sparse
    if method == "sjlt":
        projection = sparse_jl_matrix(part.num_items, projection_dim, sjlt_nonzeros, generator)
    else:
        projection = gaussian_jl_matrix(part.num_items, projection_dim, generator)
    signal = torch.sparse.mm(ratings, projection)  # (U, k)
    sensitivity = projection_sensitivity(projection)
    if not dp:
        return PublishedMatrix(signal, projection, method, math.inf, 0.0, sensitivity, 0.0)
    std = gaussian_noise_std(epsilon, delta, sensitivity)
    return PublishedMatrix(signal + gaussian_noise_like(signal, std, generator), projection, method,
                           float(epsilon), float(delta), sensitivity, std)


class HeteroCDR(nn.Module):
    """PriCDR stage 2 for one target domain: own embeddings + auto-encoded published source rows (Eq. 2).

    Args:
        num_users, num_items: the target domain's sizes.
        published: ``(U_s, k)`` the source's published matrix; rows ``0 .. n_o − 1`` are the
            target's users ``0 .. n_o − 1``.
        num_linked: n_o.
        config: sizes, dropout.
        generator: init randomness (embeddings ``N(0, 0.1²)``; the layers from a derived seed).
    """

    def __init__(self, num_users: int, num_items: int, published: torch.Tensor, num_linked: int,
                 config: PriCDRConfig, generator: torch.Generator):
        super().__init__()
        d, k = config.dim, published.shape[1]
        if not 0 < num_linked <= min(num_users, published.shape[0]):
            raise ValueError(f"num_linked must be in [1, {min(num_users, published.shape[0])}], got {num_linked}")
        self.num_linked = int(num_linked)
        self.user_emb = nn.Parameter(_normal((num_users, d), 0.1, generator))
        self.item_emb = nn.Parameter(_normal((num_items, d), 0.1, generator))
        # Standardising is post-processing of the release: it costs no privacy.
        scale = published.float().std().clamp_min(1e-8)
        self.register_buffer("published", (published.float() / scale).contiguous())
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(_child_seed(generator))
            self.encoder = nn.Sequential(nn.Dropout(config.dropout), nn.Linear(k, d), nn.ReLU(), nn.Linear(d, d))
            self.decoder = nn.Sequential(nn.Linear(d, d), nn.ReLU(), nn.Linear(d, k))

    def source_codes(self, rows: torch.Tensor) -> torch.Tensor:
        """``(B,)`` published row ids → ``(B, d)`` codes ``z``."""
        return self.encoder(self.published[rows])

    def reconstruction_loss(self, rows: torch.Tensor) -> torch.Tensor:
        """Mean squared reconstruction error of the published rows ``rows`` (per entry)."""
        x = self.published[rows]
        return F.mse_loss(self.decoder(torch.relu(self.encoder(x))), x)

    def user_vectors(self, users: torch.Tensor) -> torch.Tensor:
        """``(B,)`` → ``(B, d)``: ``(p_u + z_u)/2`` for linked users, ``p_u`` for the others."""
        p = self.user_emb[users]
        linked = users < self.num_linked
        z = self.source_codes(users.clamp(max=self.num_linked - 1))
        return torch.where(linked.unsqueeze(-1), (p + z) / 2, p)

    def align_loss(self, users: torch.Tensor) -> torch.Tensor:
        """Mean ``‖z_u − p_u‖²`` over the linked users among ``users`` (0 when there are none)."""
        linked = users[users < self.num_linked]
        if linked.numel() == 0:
            return self.user_emb.sum() * 0.0
        return (self.source_codes(linked) - self.user_emb[linked]).square().sum(-1).mean()


class PriCDRAlgorithm(_DualTargetAlgorithm):
    """PriCDR: both domains publish ``Y`` once (in :meth:`init`), then HeteroCDR epochs on the other's."""

    def _build(self) -> DualTargetState:
        config, split, names = self.config, self.split, self.names
        rng = np.random.default_rng([config.seed, 2201])
        noise = torch.Generator().manual_seed(config.seed + 2201)
        self.published = {d: publish_rating_matrix(split[d], projection_dim=config.projection_dim,
                                                   method=config.publish_method, sjlt_nonzeros=config.sjlt_nonzeros,
                                                   epsilon=config.epsilon, delta=config.delta, generator=noise,
                                                   dp=config.dp)
                          for d in names}
        models, optimizers = self._models_and_optimizers(
            lambda index, target: HeteroCDR(split[target].num_users, split[target].num_items,
                                            self.published[names[1 - index]].values, split.num_overlap_users, config,
                                            torch.Generator().manual_seed(config.seed * 1000 + index)))
        return DualTargetState(models, optimizers, rng, torch.get_rng_state())

    def _epoch(self, state: DualTargetState, epoch: int) -> Dict[str, float]:
        config, device, rng = self.config, self.device, state.rng
        logged: Dict[str, float] = {}
        for target in self.names:
            model = state.models[target]
            model.train()
            num_rows = model.published.shape[0]

            def extra(users: torch.Tensor, model=model, num_rows=num_rows) -> Dict[str, torch.Tensor]:
                rows = torch.as_tensor(rng.integers(0, num_rows, size=config.batch_size), device=device)
                return {"loss_reconstruction": config.reconstruction_weight * model.reconstruction_loss(rows),
                        "loss_align": config.align_weight * model.align_loss(users)}

            rows = [_bce_step(model, state.optimizers[target], u, v, y, device, extra)
                    for u, v, y in _training_batches(self.split[target], self.samplers[target], config.batch_size,
                                                     config.train_negatives, rng)]
            logged.update(_mean_logs(rows, target))
        return logged


def train_pricdr(split: DomainSplit, config: PriCDRConfig = PriCDRConfig(), *, device=None,
                 progress: Progress = None, ks: Sequence[int] = (5, 10), checkpointer=None) -> CDRResult:
    """PriCDR, dual-target: each domain publishes ``Y`` once, each trains HeteroCDR on the other's.

    ``checkpointer``: a :class:`~fedlib.engine.checkpoint.Checkpointer` to save the run to and
    resume it from (a resumed run equals an uninterrupted one); the same for P2FCDR and P²DTR.

    Returns:
        :class:`~fedlib.methods.cdr_common.CDRResult`; ``extra`` holds ``epsilon``, ``delta``,
        per-domain ``"<d>/noise_std"`` and ``"<d>/sensitivity"``, ``bytes_published``;
        ``artifacts["published"]`` the two :class:`PublishedMatrix`.
    """
    _check_dual_target(split, "PriCDR")
    device = torch.device(device) if device is not None else torch.device("cpu")
    start = time.perf_counter()
    algorithm = PriCDRAlgorithm(split, config, device, ks)
    run = _train(algorithm, progress, checkpointer)
    published = algorithm.published
    extra = {"epsilon": config.epsilon if config.dp else math.inf, "delta": config.delta if config.dp else 0.0,
             "bytes_published": float(sum(p.nbytes() for p in published.values())), "epochs_run": run.round_index}
    for d, release in published.items():
        extra[f"{d}/noise_std"] = release.noise_std
        extra[f"{d}/sensitivity"] = release.sensitivity
        if config.dp:  # the ε the accountant actually certifies for the σ used (≤ the target ε)
            extra[f"{d}/epsilon_certified"] = rdp_epsilon(release.noise_std / release.sensitivity, 1.0, 1,
                                                          config.delta)
    return CDRResult.from_run("PriCDR", config, run, split.domains, wall_seconds=time.perf_counter() - start,
                              extra=extra, models=run.state.models, artifacts={"published": published})


# --------------------------------------------------------------------------------------
# P2FCDR: orthogonal mapping, Laplace LDP on the mapped embeddings, gated fusion (Eqs. 3-7)
# --------------------------------------------------------------------------------------
@dataclass(frozen=True)
class P2FCDRConfig:
    """One P2FCDR run.

    Attributes:
        dim: d (64). lr, weight_decay, batch_size, train_negatives: as :class:`PriCDRConfig`.
        clip_norm: C, the L2 bound of a mapped embedding before noise (1.0).
        epsilon: ε-LDP of one user's message in one round (32: the budget of FedPCL-CDR's own
            setting under the same analysis); the Laplace scale is ``b = 2C√d/ε``.
        ldp: ``False`` sends the clipped mapped embeddings without noise (ablation).
        ortho_weight: λ_⊥, the orthogonality penalty (0.1).
        epochs (= rounds, one local epoch each), patience, eval_every, select_on, seed.
    """

    dim: int = 64
    lr: float = 1e-3
    weight_decay: float = 0.0
    batch_size: int = 256
    train_negatives: int = 1
    clip_norm: float = 1.0
    epsilon: float = 32.0
    ldp: bool = True
    ortho_weight: float = 0.1
    epochs: int = 100
    patience: int = 10
    eval_every: int = 1
    select_on: str = "valid"
    seed: int = 0

    def __post_init__(self):
        _validate_common(self)
        for key in ("clip_norm", "epsilon"):
            value = getattr(self, key)
            if not (math.isfinite(value) and value > 0):
                raise ValueError(f"{key} must be a finite number > 0 (use ldp=False for no noise), got {value!r}")
        _require_non_negative(self, "ortho_weight")

    @property
    def laplace_scale(self) -> float:
        """b = 2C√d / ε (0 without LDP)."""
        return laplace_scale_for_epsilon(self.epsilon, self.clip_norm, self.dim) if self.ldp else 0.0


def laplace_scale_for_epsilon(epsilon: float, clip_norm: float, dim: int) -> float:
    """Laplace scale ``b = 2C√d/ε`` that makes one clipped ``d``-vector ε-LDP (L1 sensitivity ``2C√d``)."""
    if not (math.isfinite(epsilon) and epsilon > 0):
        raise ValueError(f"epsilon must be a finite number > 0, got {epsilon}")
    return l1_sensitivity_of_l2_clip(clip_norm, dim) / float(epsilon)


def ldp_message(mapped: torch.Tensor, clip_norm: float, laplace_scale: float,
                generator: torch.Generator) -> torch.Tensor:
    """Eq. 3 after the mapping: ``clip(v, C) + Lap(0, b)`` per row of ``(n, d)``."""
    clipped = clip_per_sample(mapped, clip_norm)
    return add_laplace(clipped, laplace_scale, generator) if laplace_scale > 0 else clipped


def orthogonal_matrix(dim: int, generator: torch.Generator) -> torch.Tensor:
    """A random ``(d, d)`` orthogonal matrix (QR of a Gaussian, signs fixed so it is Haar-distributed)."""
    q, r = torch.linalg.qr(torch.randn(dim, dim, generator=generator))
    return q * torch.sign(torch.diagonal(r)).unsqueeze(0)


class P2FCDRDomain(nn.Module):
    """One P2FCDR client: embeddings, orthogonal map ``W``, gate, and the last received messages.

    Args:
        num_users, num_items: the domain's sizes. num_linked: n_o (rows of a message).
        config: sizes. generator: init randomness.
    """

    def __init__(self, num_users: int, num_items: int, num_linked: int, config: P2FCDRConfig,
                 generator: torch.Generator):
        super().__init__()
        d = config.dim
        if not 0 < num_linked <= num_users:
            raise ValueError(f"num_linked must be in [1, {num_users}], got {num_linked}")
        self.num_linked = int(num_linked)
        self.user_emb = nn.Parameter(_normal((num_users, d), 0.1, generator))
        self.item_emb = nn.Parameter(_normal((num_items, d), 0.1, generator))
        self.mapping = nn.Parameter(orthogonal_matrix(d, generator))  # W: own space -> shared space
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(_child_seed(generator))
            self.gate = nn.Linear(d, d)
        self.register_buffer("received", torch.zeros(num_linked, d))  # (n_o, d) in the shared space
        self.has_received = False

    def outgoing(self) -> torch.Tensor:
        """``(n_o, d)`` the shared users' embeddings mapped to the shared space, ``p W`` (no gradient)."""
        with torch.no_grad():
            return self.user_emb[: self.num_linked] @ self.mapping

    def receive(self, message: torch.Tensor) -> None:
        """Store the other domain's ``(n_o, d)`` message for the next local epoch."""
        if tuple(message.shape) != tuple(self.received.shape):
            raise ValueError(f"message must be {tuple(self.received.shape)}, got {tuple(message.shape)}")
        self.received.copy_(message.detach())
        self.has_received = True

    def gate_values(self, own: torch.Tensor, received: torch.Tensor) -> torch.Tensor:
        """Eq. 5: ``σ(W_g |p − r| + b_g)`` in ``[0, 1]``, shape of ``own``."""
        return torch.sigmoid(self.gate((own - received).abs()))

    def fuse(self, own: torch.Tensor, received: torch.Tensor) -> torch.Tensor:
        """Eq. 6: ``g ⊙ p + (1 − g) ⊙ r``."""
        g = self.gate_values(own, received)
        return g * own + (1 - g) * received

    def user_vectors(self, users: torch.Tensor) -> torch.Tensor:
        """``(B,)`` → ``(B, d)`` fused vectors for linked users (once a message arrived), ``p_u`` otherwise."""
        own = self.user_emb[users]
        if not self.has_received:
            return own
        incoming = self.received[users.clamp(max=self.num_linked - 1)] @ self.mapping.T  # Eq. 4
        return torch.where((users < self.num_linked).unsqueeze(-1), self.fuse(own, incoming), own)

    def orthogonality_penalty(self) -> torch.Tensor:
        """``‖WᵀW − I‖²_F``."""
        eye = torch.eye(self.mapping.shape[0], device=self.mapping.device, dtype=self.mapping.dtype)
        return (self.mapping.T @ self.mapping - eye).square().sum()


class P2FCDRAlgorithm(_DualTargetAlgorithm):
    """P2FCDR: every round both domains exchange noisy mapped embeddings, then train one epoch.

    ``state.messages``: ``{"sent": {d: (n_o, d)}, "private": {d: (n_o, d)}}``, the last round's
    messages and the embeddings they were made from; ``state.generators["noise"]`` the LDP noise.
    """

    def _build(self) -> DualTargetState:
        config, split = self.config, self.split
        rng = np.random.default_rng([config.seed, 2023])
        noise = torch.Generator().manual_seed(config.seed + 2023)
        models, optimizers = self._models_and_optimizers(
            lambda index, name: P2FCDRDomain(split[name].num_users, split[name].num_items, split.num_overlap_users,
                                             config, torch.Generator().manual_seed(config.seed * 1000 + index)))
        return DualTargetState(models, optimizers, rng, torch.get_rng_state(), generators={"noise": noise},
                               messages={"sent": {}, "private": {}})

    def _epoch(self, state: DualTargetState, epoch: int) -> Dict[str, float]:
        config, names, models, n_o = self.config, self.names, state.models, self.split.num_overlap_users
        sent, private = {}, {}
        for name in names:  # each sender perturbs its own message (local DP)
            private[name] = models[name].user_emb[:n_o].detach().clone()
            sent[name] = ldp_message(models[name].outgoing(), config.clip_norm, config.laplace_scale,
                                     state.generators["noise"])
        state.messages = {"sent": sent, "private": private}
        for index, name in enumerate(names):
            models[name].receive(sent[names[1 - index]])
        logged: Dict[str, float] = {"bytes_exchanged": float(sum(m.numel() * m.element_size() for m in sent.values()))}
        for name in names:
            model = models[name]
            model.train()

            def extra(users: torch.Tensor, model=model) -> Dict[str, torch.Tensor]:
                return {"loss_ortho": config.ortho_weight * model.orthogonality_penalty()}

            rows = [_bce_step(model, state.optimizers[name], u, v, y, self.device, extra)
                    for u, v, y in _training_batches(self.split[name], self.samplers[name], config.batch_size,
                                                     config.train_negatives, state.rng)]
            logged.update(_mean_logs(rows, name))
        return logged


def train_p2fcdr(split: DomainSplit, config: P2FCDRConfig = P2FCDRConfig(), *, device=None,
                 progress: Progress = None, ks: Sequence[int] = (5, 10), checkpointer=None) -> CDRResult:
    """P2FCDR, peer to peer: every round both domains exchange noisy mapped embeddings, then train.

    Returns:
        :class:`~fedlib.methods.cdr_common.CDRResult`; ``extra``: ``laplace_scale``,
        ``epsilon_per_round``, ``epsilon_total`` (rounds run × per round), ``bytes_exchanged``;
        ``artifacts["transmitted"]`` (module docstring).
    """
    _check_dual_target(split, "P2FCDR")
    device = torch.device(device) if device is not None else torch.device("cpu")
    start = time.perf_counter()
    names = list(split.domains)
    scale = config.laplace_scale
    run = _train(P2FCDRAlgorithm(split, config, device, ks), progress, checkpointer)
    rounds = run.round_index
    sent, private = run.state.messages["sent"], run.state.messages["private"]
    per_round = laplace_epsilon(l1_sensitivity_of_l2_clip(config.clip_norm, config.dim), scale)
    bytes_round = float(sum(m.numel() * m.element_size() for m in sent.values()))
    extra = {"laplace_scale": scale, "clip_norm": config.clip_norm, "epsilon_per_round": per_round,
             "epsilon_total": per_round * rounds, "bytes_exchanged": bytes_round * rounds, "epochs_run": rounds}
    transmitted = {name: {"sent": sent[name].cpu(), "private": private[name].cpu()} for name in names}
    return CDRResult.from_run("P2FCDR", config, run, split.domains, wall_seconds=time.perf_counter() - start,
                              extra=extra, models=run.state.models, artifacts={"transmitted": transmitted})


# --------------------------------------------------------------------------------------
# P²DTR: PSI, prototype federated learning, prototype propagation (Eqs. 8-10)
# --------------------------------------------------------------------------------------
@dataclass(frozen=True)
class P2DTRConfig:
    """One P²DTR run.

    Attributes:
        dim: d (64). lr, weight_decay, batch_size, train_negatives: as :class:`PriCDRConfig`.
        num_clusters: K prototypes per domain (10, FedPCL-CDR's K).
        propagation_weight: α in Eq. 10 (0.3).
        kmeans_restarts: scikit-learn ``n_init`` (1).
        epochs (= rounds, one local epoch each), patience, eval_every, select_on, seed (also
            keys the simulated PSI).
    """

    dim: int = 64
    lr: float = 1e-3
    weight_decay: float = 0.0
    batch_size: int = 256
    train_negatives: int = 1
    num_clusters: int = 10
    propagation_weight: float = 0.3
    kmeans_restarts: int = 1
    epochs: int = 100
    patience: int = 10
    eval_every: int = 1
    select_on: str = "valid"
    seed: int = 0

    def __post_init__(self):
        _validate_common(self)
        for key in ("num_clusters", "kmeans_restarts"):
            if int(getattr(self, key)) < 1:
                raise ValueError(f"{key} must be >= 1, got {getattr(self, key)}")
        if not 0 <= self.propagation_weight <= 1:
            raise ValueError(f"propagation_weight (α) must be in [0, 1], got {self.propagation_weight}")


def user_identities(split: DomainSplit, domain: str) -> List[str]:
    """Each local user id's identifier as its owner knows it (the raw id of the data files).

    Falls back to the split's convention when the raw ids are missing: ids below
    ``num_overlap_users`` are the same person in every domain, the others are local.
    """
    part = split[domain]
    raw = part.extra.get("raw_users")
    if raw is not None and len(raw) == part.num_users:
        return [str(value) for value in raw]
    return [f"shared:{u}" if u < split.num_overlap_users else f"{domain}:{u}" for u in range(part.num_users)]


def private_set_intersection(ids_a: Sequence, ids_b: Sequence, key: bytes) -> Tuple[np.ndarray, np.ndarray]:
    """Simulated PSI: each party learns only its own rows of the intersection, in a common order.

    Both parties compute ``HMAC-SHA256(key, id)`` of their identifiers and exchange the
    digests; the intersection of the digests, sorted, gives the common order. (A real PSI
    protocol is cryptographic; a keyed hash is not secure against a key holder guessing ids.)

    Returns:
        ``(rows_a, rows_b)`` int64 arrays of equal length: ``ids_a[rows_a[r]] == ids_b[rows_b[r]]``.
    Raises:
        ValueError: an identifier appears twice in one party's list.
    """
    def digests(ids: Sequence, party: str) -> Dict[bytes, int]:
        table = {hmac.new(key, str(x).encode("utf-8"), hashlib.sha256).digest(): row for row, x in enumerate(ids)}
        if len(table) != len(ids):
            raise ValueError(f"party {party}'s identifiers must be unique, got {len(ids) - len(table)} duplicate(s)")
        return table

    table_a, table_b = digests(ids_a, "A"), digests(ids_b, "B")
    common = sorted(table_a.keys() & table_b.keys())
    return (np.array([table_a[h] for h in common], dtype=np.int64),
            np.array([table_b[h] for h in common], dtype=np.int64))


def match_clusters(labels_a: torch.Tensor, labels_b: torch.Tensor, num_clusters: int) -> torch.Tensor:
    """``(K,)`` ``π``: B's cluster for each of A's, maximising the shared users both put together.

    ``labels_a``, ``labels_b``: ``(n,)`` cluster of each PSI user (same rows) in A and in B.
    """
    from scipy.optimize import linear_sum_assignment

    k = int(num_clusters)
    co = torch.bincount(labels_a.cpu() * k + labels_b.cpu(), minlength=k * k).reshape(k, k)  # co[k, k']
    rows, cols = linear_sum_assignment(-co.numpy())
    perm = torch.empty(k, dtype=torch.int64)
    perm[torch.as_tensor(rows)] = torch.as_tensor(cols, dtype=torch.int64)
    return perm


def average_prototypes(prototypes_a: torch.Tensor, prototypes_b: torch.Tensor,
                       perm: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    """Eq. 8: ``ḡ`` for each domain's own cluster order, ``((K, d), (K, d))``."""
    perm = perm.to(prototypes_a.device)
    averaged_a = (prototypes_a + prototypes_b[perm]) / 2
    averaged_b = torch.empty_like(averaged_a)
    averaged_b[perm] = averaged_a
    return averaged_a, averaged_b


def nearest_prototype(vectors: torch.Tensor, prototypes: torch.Tensor) -> torch.Tensor:
    """``(U, d)``, ``(K, d)`` → ``(U,)`` index of the nearest prototype (Euclidean, as k-means)."""
    return torch.cdist(vectors, prototypes).argmin(dim=1)


class P2DTRDomain(nn.Module):
    """One P²DTR client: embeddings and the averaged prototypes of the last round (Eq. 10)."""

    def __init__(self, num_users: int, num_items: int, config: P2DTRConfig, generator: torch.Generator):
        super().__init__()
        d = config.dim
        self.alpha = float(config.propagation_weight)
        self.user_emb = nn.Parameter(_normal((num_users, d), 0.1, generator))
        self.item_emb = nn.Parameter(_normal((num_items, d), 0.1, generator))
        self.register_buffer("prototypes", torch.zeros(config.num_clusters, d))  # ḡ, own cluster order
        self.register_buffer("assignment", torch.zeros(num_users, dtype=torch.int64))  # a(u)
        self.has_prototypes = False

    def set_prototypes(self, averaged: torch.Tensor, assignment: torch.Tensor) -> None:
        self.prototypes.copy_(averaged.detach())
        self.assignment.copy_(assignment)
        self.has_prototypes = True

    def user_vectors(self, users: torch.Tensor) -> torch.Tensor:
        """``(B,)`` → ``(B, d)``: ``(1 − α) p_u + α ḡ_{a(u)}`` once prototypes exist."""
        own = self.user_emb[users]
        if not self.has_prototypes:
            return own
        return (1 - self.alpha) * own + self.alpha * self.prototypes[self.assignment[users]]


class P2DTRAlgorithm(_DualTargetAlgorithm):
    """P²DTR: PSI once (in the constructor), then rounds of local training, k-means prototypes and
    server averaging. ``state.messages``: the last round's ``uploads`` ``{d: (prototypes (K, d),
    labels (n,))}`` and the ``summarised`` PSI users' embeddings ``{d: (n, d)}``."""

    def __init__(self, split: DomainSplit, config, device, ks: Sequence[int]):
        super().__init__(split, config, device, ks)
        names = self.names
        key = hashlib.sha256(f"p2dtr-psi-key/{config.seed}".encode()).digest()  # shared by the two domains only
        self.rows_a, self.rows_b = private_set_intersection(user_identities(split, names[0]),
                                                            user_identities(split, names[1]), key)
        if self.rows_a.size < config.num_clusters:
            raise ValueError(f"P2DTR clusters the shared users, but the PSI found {self.rows_a.size} < num_clusters="
                             f"{config.num_clusters}; lower num_clusters")
        self.psi_rows = {names[0]: torch.as_tensor(self.rows_a, device=device),
                         names[1]: torch.as_tensor(self.rows_b, device=device)}

    def _build(self) -> DualTargetState:
        config, split = self.config, self.split
        rng = np.random.default_rng([config.seed, 2024])
        models, optimizers = self._models_and_optimizers(
            lambda index, name: P2DTRDomain(split[name].num_users, split[name].num_items, config,
                                            torch.Generator().manual_seed(config.seed * 1000 + index)))
        return DualTargetState(models, optimizers, rng, torch.get_rng_state(),
                               messages={"uploads": {}, "summarised": {}})

    def _epoch(self, state: DualTargetState, epoch: int) -> Dict[str, float]:
        config, names, models, psi_rows = self.config, self.names, state.models, self.psi_rows
        logged: Dict[str, float] = {}
        for name in names:
            model = models[name]
            model.train()
            rows = [_bce_step(model, state.optimizers[name], u, v, y, self.device)
                    for u, v, y in _training_batches(self.split[name], self.samplers[name], config.batch_size,
                                                     config.train_negatives, state.rng)]
            logged.update(_mean_logs(rows, name))
        uploads, summarised = {}, {}
        for index, name in enumerate(names):  # local clustering of the PSI users, then upload
            with torch.no_grad():
                summarised[name] = models[name].user_emb[psi_rows[name]].detach().clone()  # (n, d)
            uploads[name] = cluster_users(summarised[name], config.num_clusters,
                                          seed=config.seed * 100_003 + epoch * 2 + index,
                                          restarts=config.kmeans_restarts)
        state.messages = {"uploads": uploads, "summarised": summarised}
        (protos_a, labels_a), (protos_b, labels_b) = uploads[names[0]], uploads[names[1]]
        perm = match_clusters(labels_a, labels_b, config.num_clusters)  # server
        averaged = dict(zip(names, average_prototypes(protos_a, protos_b, perm)))
        for name in names:  # download, then propagate inside the domain (Eq. 9)
            protos, labels = uploads[name]
            with torch.no_grad():
                assignment = nearest_prototype(models[name].user_emb.detach(), protos)
            assignment[psi_rows[name]] = labels
            models[name].set_prototypes(averaged[name], assignment)
        k, d = protos_a.shape
        logged["bytes_up"] = float(2 * (k * d * 4 + self.rows_a.size * 8))
        logged["bytes_down"] = float(2 * k * d * 4)
        return logged


def train_p2dtr(split: DomainSplit, config: P2DTRConfig = P2DTRConfig(), *, device=None,
                progress: Progress = None, ks: Sequence[int] = (5, 10), checkpointer=None) -> CDRResult:
    """P²DTR: PSI once, then rounds of local training, k-means prototypes and server averaging.

    Returns:
        :class:`~fedlib.methods.cdr_common.CDRResult`; ``extra``: ``psi_size``,
        ``psi_matches_split`` (1.0 when the PSI found exactly users ``0 .. n_o − 1``), bytes;
        ``artifacts``: ``psi`` rows, last ``prototypes`` / ``labels``, ``transmitted``.
    """
    _check_dual_target(split, "P2DTR")
    device = torch.device(device) if device is not None else torch.device("cpu")
    start = time.perf_counter()
    names = list(split.domains)
    algorithm = P2DTRAlgorithm(split, config, device, ks)
    rows_a, rows_b, psi_rows = algorithm.rows_a, algorithm.rows_b, algorithm.psi_rows
    expected = np.arange(split.num_overlap_users)
    matches = bool(np.array_equal(np.sort(rows_a), expected) and np.array_equal(rows_a, rows_b))
    run = _train(algorithm, progress, checkpointer)
    rounds = run.round_index
    uploads, summarised = run.state.messages["uploads"], run.state.messages["summarised"]
    transmitted = {}
    for name in names:
        protos, labels = uploads[name]
        order = torch.argsort(psi_rows[name])  # rows in the domain's user-id order
        transmitted[name] = {"sent": protos[labels][order].cpu(), "private": summarised[name][order].cpu()}
    k, d = config.num_clusters, config.dim
    extra = {"psi_size": float(rows_a.size), "psi_matches_split": float(matches),
             "bytes_up": float(rounds * 2 * (k * d * 4 + rows_a.size * 8)), "bytes_down": float(rounds * 2 * k * d * 4),
             "epochs_run": rounds}
    return CDRResult.from_run("P2DTR", config, run, split.domains, wall_seconds=time.perf_counter() - start,
                              extra=extra, models=run.state.models,
                              artifacts={"psi": {names[0]: rows_a, names[1]: rows_b},
                                         "prototypes": {n: uploads[n][0].cpu() for n in names},
                                         "labels": {n: uploads[n][1].cpu() for n in names},
                                         "transmitted": transmitted})
