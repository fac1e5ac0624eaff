r"""PriCDR, a privacy-preserving CDR baseline of FedPCL-CDR's Table 2 (dual-target, :mod:`fedlib.baselines.cross_domain.pp_cdr`).

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
LDP budgets of P2FCDR (:mod:`fedlib.baselines.cross_domain.p2fcdr`) or of FedPCL-CDR.

HeteroCDR for target ``t`` (dual-target: ``A`` uses ``Y_B``, ``B`` uses ``Y_A``)::

    x_u = Y_s[u] / std(Y_s)                                 standardised published row (post-processing)
    z_u = Enc(x_u),  x̂_u = Dec(ReLU(z_u))                 auto-encoder k → d → d → d → k
    h_u = (p_u + z_u) / 2   if u < n_o,   else p_u          shared users fuse both views
    L   = L_rec + λ_rec · mean ‖x̂_u − x_u‖² / k + λ_align · mean_{u < n_o} ‖z_u − p_u‖²        (2)

The reconstruction term uses every published row (all ``U_s`` source users), the alignment
only the shared users of the batch.

Simplification on this machine (besides the family's, :mod:`fedlib.baselines.cross_domain.pp_cdr`)
-----------------------------------------------------------------------------------
* **PriCDR's JLT is calibrated, not Blocki-style.** PriCDR's JLT follows Blocki et al.
  (2012), whose guarantee comes from a *secret* Gaussian projection after lifting the
  singular values. We treat ``P`` as public and add Gaussian noise calibrated to its largest
  row norm by RDP accounting: a guarantee that holds whoever knows ``P``. Our SJLT is a
  sparse JL matrix with the same calibrated noise (its unit row norms make ``Δ = 1``); the
  paper's exact SJLT construction and noise calibration may differ. The published
  rows are standardised (post-processing) and the auto-encoder is two layers each way.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Dict, Sequence

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from fedlib.data.splits import DomainSplit, InteractionSplit, Pairs
from fedlib.engine.privacy import gaussian_noise_like, noise_multiplier_for_epsilon, rdp_epsilon
from fedlib.engine.trainer import RunResult
from fedlib.baselines.cross_domain.cdr_common import CrossDomainConfig, RunSummary, check_training_loop, train_with
from fedlib.baselines.cross_domain.pp_cdr import (DualTargetAlgorithm, DualTargetState, Progress, bce_step, check_dual_target,
                                   child_seed, mean_logs, normal_table, require_non_negative, dual_target_checkpoint_config,
                                   training_batches)

__all__ = ["PriCDRConfig", "PublishedMatrix", "PUBLISH_METHODS", "rating_matrix", "gaussian_jl_matrix",
           "sparse_jl_matrix", "projection_sensitivity", "gaussian_noise_std", "publish_rating_matrix", "HeteroCDR",
           "PriCDRAlgorithm", "train_pricdr"]

PUBLISH_METHODS = ("sjlt", "jlt")


@dataclass(frozen=True)
class PriCDRConfig(CrossDomainConfig):
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

    def __post_init__(self):
        check_training_loop(self)
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
        require_non_negative(self, "reconstruction_weight", "align_weight")


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
        self.user_emb = nn.Parameter(normal_table((num_users, d), 0.1, generator))
        self.item_emb = nn.Parameter(normal_table((num_items, d), 0.1, generator))
        # Standardising is post-processing of the release: it costs no privacy.
        scale = published.float().std().clamp_min(1e-8)
        self.register_buffer("published", (published.float() / scale).contiguous())
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(child_seed(generator))
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


class PriCDRAlgorithm(DualTargetAlgorithm):
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

            rows = [bce_step(model, state.optimizers[target], u, v, y, device, extra)
                    for u, v, y in training_batches(self.split[target], self.samplers[target], config.batch_size,
                                                     config.train_negatives, rng)]
            logged.update(mean_logs(rows, target))
        return logged


def train_pricdr(split: DomainSplit, config: PriCDRConfig = PriCDRConfig(), *, device=None,
                 progress: Progress = None, ks: Sequence[int] = (5, 10), checkpointer=None,
                 on_round_end=None) -> RunResult:
    """PriCDR, dual-target: each domain publishes ``Y`` once, each trains HeteroCDR on the other's.

    Arguments and the family's artifacts: :func:`~fedlib.baselines.cross_domain.cdr_common.train_with`
    (the same for P2FCDR and P²DTR); ``scalars``: ``epsilon``, ``delta``, per-domain
    ``"<d>/noise_std"`` and ``"<d>/sensitivity"``, ``bytes_published``; own artifact
    ``published``, the two :class:`PublishedMatrix`.
    """
    check_dual_target(split, "PriCDR")

    def summarise(algorithm: PriCDRAlgorithm, run: RunResult) -> RunSummary:
        published = algorithm.published
        scalars = {"epsilon": config.epsilon if config.dp else math.inf, "delta": config.delta if config.dp else 0.0,
                   "bytes_published": float(sum(p.nbytes() for p in published.values())),
                   "epochs_run": run.round_index}
        for d, release in published.items():
            scalars[f"{d}/noise_std"] = release.noise_std
            scalars[f"{d}/sensitivity"] = release.sensitivity
            if config.dp:  # the ε the accountant actually certifies for the σ used (≤ the target ε)
                scalars[f"{d}/epsilon_certified"] = rdp_epsilon(release.noise_std / release.sensitivity, 1.0, 1,
                                                                config.delta)
        return RunSummary(scalars=scalars, models=run.state.models, artifacts={"published": published})

    return train_with(lambda device: PriCDRAlgorithm(split, config, device, ks), config, method="PriCDR",
                      rounds=config.epochs, summarise=summarise, device=device, progress=progress,
                      checkpointer=checkpointer, checkpoint_config=dual_target_checkpoint_config,
                      on_round_end=on_round_end)
