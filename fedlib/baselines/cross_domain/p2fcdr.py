r"""P2FCDR, a privacy-preserving CDR baseline of FedPCL-CDR's Table 2 (dual-target, :mod:`fedlib.baselines.cross_domain.pp_cdr`).

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

Simplification on this machine (besides the family's, :mod:`fedlib.baselines.cross_domain.pp_cdr`)
-----------------------------------------------------------------------------------
* **P2FCDR's orthogonality is a penalty** (λ_⊥), not a constraint, and the gate reads the
  element-wise distance ``|p − r|`` (the paper's "similarity between in-domain and
  cross-domain embedding"). The received messages are refreshed once per round (local
  epoch), not per batch.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Dict, Sequence

import numpy as np
import torch
from torch import nn

from fedlib.data.splits import DomainSplit
from fedlib.engine.privacy import add_laplace, clip_per_sample, l1_sensitivity_of_l2_clip, laplace_epsilon
from fedlib.engine.trainer import RunResult
from fedlib.baselines.cross_domain.cdr_common import CrossDomainConfig, RunSummary, check_training_loop, train_with
from fedlib.baselines.cross_domain.pp_cdr import (DualTargetAlgorithm, DualTargetState, Progress, bce_step, check_dual_target,
                                   child_seed, mean_logs, normal_table, require_non_negative, dual_target_checkpoint_config,
                                   training_batches)

__all__ = ["P2FCDRConfig", "laplace_scale_for_epsilon", "ldp_message", "orthogonal_matrix", "P2FCDRDomain",
           "P2FCDRAlgorithm", "train_p2fcdr"]


@dataclass(frozen=True)
class P2FCDRConfig(CrossDomainConfig):
    """One P2FCDR run.

    Attributes:
        dim: d (64). lr, weight_decay, batch_size, train_negatives: as :class:`~fedlib.baselines.cross_domain.pricdr.PriCDRConfig`.
        clip_norm: C, the L2 bound of a mapped embedding before noise (1.0).
        epsilon: ε-LDP of one user's message in one round (32: the budget of FedPCL-CDR's own
            setting under the same analysis); the Laplace scale is ``b = 2C√d/ε``.
        ldp: ``False`` sends the clipped mapped embeddings without noise (ablation).
        ortho_weight: λ_⊥, the orthogonality penalty (0.1).
        epochs (= rounds, one local epoch each), patience, eval_every, select_on, seed.
    """

    weight_decay: float = 0.0
    batch_size: int = 256
    train_negatives: int = 1
    clip_norm: float = 1.0
    epsilon: float = 32.0
    ldp: bool = True
    ortho_weight: float = 0.1
    epochs: int = 100

    def __post_init__(self):
        check_training_loop(self)
        for key in ("clip_norm", "epsilon"):
            value = getattr(self, key)
            if not (math.isfinite(value) and value > 0):
                raise ValueError(f"{key} must be a finite number > 0 (use ldp=False for no noise), got {value!r}")
        require_non_negative(self, "ortho_weight")

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
        self.user_emb = nn.Parameter(normal_table((num_users, d), 0.1, generator))
        self.item_emb = nn.Parameter(normal_table((num_items, d), 0.1, generator))
        self.mapping = nn.Parameter(orthogonal_matrix(d, generator))  # W: own space -> shared space
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(child_seed(generator))
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


class P2FCDRAlgorithm(DualTargetAlgorithm):
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

            rows = [bce_step(model, state.optimizers[name], u, v, y, self.device, extra)
                    for u, v, y in training_batches(self.split[name], self.samplers[name], config.batch_size,
                                                     config.train_negatives, state.rng)]
            logged.update(mean_logs(rows, name))
        return logged


def train_p2fcdr(split: DomainSplit, config: P2FCDRConfig = P2FCDRConfig(), *, device=None,
                 progress: Progress = None, ks: Sequence[int] = (5, 10), checkpointer=None,
                 on_round_end=None) -> RunResult:
    """P2FCDR, peer to peer: every round both domains exchange noisy mapped embeddings, then train.

    Arguments and the family's artifacts: :func:`~fedlib.baselines.cross_domain.cdr_common.train_with`;
    ``scalars``: ``laplace_scale``, ``epsilon_per_round``, ``epsilon_total`` (rounds run × per
    round), ``bytes_exchanged``; own artifact ``transmitted`` (module docstring).
    """
    check_dual_target(split, "P2FCDR")

    def summarise(algorithm: P2FCDRAlgorithm, run: RunResult) -> RunSummary:
        rounds, scale = run.round_index, config.laplace_scale
        sent, private = run.state.messages["sent"], run.state.messages["private"]
        per_round = laplace_epsilon(l1_sensitivity_of_l2_clip(config.clip_norm, config.dim), scale)
        bytes_round = float(sum(m.numel() * m.element_size() for m in sent.values()))
        scalars = {"laplace_scale": scale, "clip_norm": config.clip_norm, "epsilon_per_round": per_round,
                   "epsilon_total": per_round * rounds, "bytes_exchanged": bytes_round * rounds, "epochs_run": rounds}
        transmitted = {name: {"sent": sent[name].cpu(), "private": private[name].cpu()} for name in split.domains}
        return RunSummary(scalars=scalars, models=run.state.models, artifacts={"transmitted": transmitted})

    return train_with(lambda device: P2FCDRAlgorithm(split, config, device, ks), config, method="P2FCDR",
                      rounds=config.epochs, summarise=summarise, device=device, progress=progress,
                      checkpointer=checkpointer, checkpoint_config=dual_target_checkpoint_config,
                      on_round_end=on_round_end)
