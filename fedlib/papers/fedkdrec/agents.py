"""FedKDRec's two reinforcement-learning agents (both live on the server).

Reference: "Federated Recommendation with Reinforcement Learning based Knowledge
Distillation" (FedKDRec, anonymous ICLR 2026 submission), §3.2, §3.3 and App. C.2–C.3.

**Clients-to-server agent** ``M_R`` (§3.2) weighs the round's clients as teachers of the
server (multi-teacher distillation, Eq. 7 ``L = Σ_i ω_i L_i``):

* state ``s_i`` = [sample volume ``|D̂_i|``; mean and variance of the uploaded labels;
  the server's mean BCE on ``D̂_i``] (:data:`TEACHER_FEATURES`; Table 4 drops one group);
* action ``ω = softmax_i(M_R(s_i))`` over the round's clients, ``M_R`` an MLP with one ReLU;
* reward ``R_i = −L_i`` (Eq. 6, the server's summed BCE on ``D̂_i`` after it trained),
  normalised across the round's clients;
* update: minimise ``−Σ_i R_i log ω_i`` (Eq. 10).

**Server-to-clients actor–critic agent** ``π_A`` / ``M_C`` (§3.3) walks, for each client,
the items uploaded in the previous round ordered by the server's prediction for that
client (at most ``μ`` states) and decides item by item whether to send it:

* state ``s_ij`` = [server prediction ``r̃_ij``; the item's frequency in the previous
  round's uploads; the server's user and item embeddings; how many items are selected so far];
* action ``a_ij ~ Bernoulli(π_A(s_ij))``;
* episode reward ``R^AC_i`` = mean of the normalised ``R_i``, ``R^s_i`` (Eq. 8, item
  diversity) and ``R^l_i`` (Eq. 9, model divergence), shaped per position (App. C.3):
  ``R^AC ∓ p/(ρ|S_i|)·|R^AC|`` (minus when selected, plus when skipped);
* critic: mean squared TD error (Eq. 11); actor: ``−log π · advantage`` with the TD
  advantage (Eq. 12).

Choices the paper leaves open (documented in the notebook, each tested):

* **normalisation**: z-score across the round's clients (``(x − mean)/(std + 1e-8)``), for
  the agent's state features and for every reward; a single client gets 0;
* **R^s (Eq. 8)**: KL between the softmax of the mean server item embedding of what the
  client uploaded and of what the server sent; 0 when nothing was sent;
* **R^l (Eq. 9)**: "cos" between two scalars is ±1, so we read it as the cosine between the
  two prediction vectors over ``V̂_i``: ``R^l = 1 − cos(r̄_i, r̃_i)``;
* **discount** ``γ = 0.9``; the value after the last state is 0;
* ``V^s``: the items of the **previous round's** uploads (all clients), ordered per client.
"""
from __future__ import annotations

from typing import Optional, Sequence

import torch
import torch.nn.functional as F
from torch import nn

__all__ = [
    "TEACHER_FEATURES", "TRANSFER_REWARDS", "zscore", "TeacherWeightAgent", "TransferAgent",
    "diversity_reward", "divergence_reward", "shaped_rewards", "td_losses",
]

#: state groups of the clients-to-server agent (Table 4's "w/o sample size / statistics / BCE loss")
TEACHER_FEATURES = ("volume", "statistics", "server_loss")
#: reward terms of the server-to-clients agent (Table 4's "w/o R_i / R_i^s / R_i^l")
TRANSFER_REWARDS = ("server", "diversity", "divergence")


def zscore(values: torch.Tensor, dim: int = 0) -> torch.Tensor:
    """``(x − mean) / (std + 1e-8)`` along ``dim`` (population std); one entry → 0."""
    if values.shape[dim] < 2:
        return torch.zeros_like(values)
    mean = values.mean(dim, keepdim=True)
    std = values.std(dim, unbiased=False, keepdim=True)
    return (values - mean) / (std + 1e-8)


def _mlp(inputs: int, hidden: int, generator: torch.Generator) -> nn.Sequential:
    net = nn.Sequential(nn.Linear(inputs, hidden), nn.ReLU(), nn.Linear(hidden, 1))
    with torch.no_grad():  # seeded init, independent of the global torch RNG
        for layer in (net[0], net[2]):
            bound = 1.0 / layer.in_features ** 0.5
            layer.weight.copy_(torch.empty_like(layer.weight).uniform_(-bound, bound, generator=generator))
            layer.bias.copy_(torch.empty_like(layer.bias).uniform_(-bound, bound, generator=generator))
    return net


class TeacherWeightAgent:
    """``M_R``: teacher weights ``ω`` for the round's clients (§3.2, Eq. 10).

    Args:
        features: which state groups to use (subset of :data:`TEACHER_FEATURES`).
        hidden, lr: MLP width and Adam step size.
    """

    def __init__(self, features: Sequence[str] = TEACHER_FEATURES, hidden: int = 32, lr: float = 1e-3,
                 generator: Optional[torch.Generator] = None, device="cpu"):
        unknown = set(features) - set(TEACHER_FEATURES)
        if unknown or not features:
            raise ValueError(f"features must be a non-empty subset of {TEACHER_FEATURES}, got {tuple(features)}")
        self.features = tuple(f for f in TEACHER_FEATURES if f in features)
        width = sum(2 if f == "statistics" else 1 for f in self.features)
        generator = generator if generator is not None else torch.Generator().manual_seed(0)
        self.net = _mlp(width, hidden, generator).to(device)
        self.optimizer = torch.optim.Adam(self.net.parameters(), lr=lr)

    def states(self, volume: torch.Tensor, label_mean: torch.Tensor, label_var: torch.Tensor,
               server_loss: torch.Tensor) -> torch.Tensor:
        """``(C, F)`` z-scored states from per-client ``(C,)`` statistics of ``D̂_i``."""
        columns = {"volume": [volume], "statistics": [label_mean, label_var], "server_loss": [server_loss]}
        raw = torch.stack([c.float() for f in self.features for c in columns[f]], dim=1)  # (C, F)
        return zscore(raw)

    def weights(self, states: torch.Tensor) -> torch.Tensor:
        """``ω = softmax(M_R(s))``: ``(C,)``, sums to 1 (no gradient)."""
        with torch.no_grad():
            return torch.softmax(self.net(states).squeeze(-1), dim=0)

    def update(self, states: torch.Tensor, rewards: torch.Tensor) -> float:
        """One policy-gradient step on ``−Σ_i R_i log ω_i`` (Eq. 10); ``rewards`` already normalised."""
        log_weights = torch.log_softmax(self.net(states).squeeze(-1), dim=0)  # (C,)
        loss = -(rewards.detach() * log_weights).sum()
        self.optimizer.zero_grad()
        loss.backward()
        self.optimizer.step()
        return float(loss.detach())


def diversity_reward(uploaded_mean: torch.Tensor, sent_mean: torch.Tensor, sent_any: torch.Tensor) -> torch.Tensor:
    """Eq. 8, ``R^s_i = KL(V̂_i ‖ Ṽ_i)``: ``(C,)``.

    Each item set becomes a distribution through the softmax of its mean item embedding
    (``uploaded_mean``, ``sent_mean``: ``(C, d)``). Clients that were sent nothing
    (``sent_any`` False) get 0.
    """
    log_p = torch.log_softmax(uploaded_mean, dim=-1)
    log_q = torch.log_softmax(sent_mean, dim=-1)
    kl = (log_p.exp() * (log_p - log_q)).sum(-1)
    return torch.where(sent_any, kl, torch.zeros_like(kl))


def divergence_reward(client_labels: torch.Tensor, server_predictions: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Eq. 9 read over vectors: ``R^l_i = 1 − cos(r̄_i, r̃_i)`` over each client's uploads: ``(C,)``.

    Args: ``(C, L)`` uploaded labels, server predictions on the same items, 0/1 mask.
    """
    a, b = client_labels * mask, server_predictions * mask
    return 1.0 - F.cosine_similarity(a, b, dim=1, eps=1e-8)


def shaped_rewards(episode_reward: torch.Tensor, actions: torch.Tensor, valid: torch.Tensor, rho: float) -> torch.Tensor:
    """App. C.3: per-state rewards ``R ∓ p/(ρ|S|)·|R|`` (minus if selected, plus if skipped).

    Args:
        episode_reward: ``(C,)`` ``R^AC_i``; actions: ``(C, S)`` 0/1; valid: ``(C, S)`` 0/1
            (a client's sequence may be shorter than ``S``).
    Returns:
        ``(C, S)`` rewards (0 on invalid states). Positions ``p`` run 1..|S_i|.
    """
    length = valid.sum(1, keepdim=True).clamp(min=1)  # (C, 1)
    position = torch.cumsum(valid, dim=1)  # (C, S): 1..|S_i|
    scale = position / (rho * length) * episode_reward.abs()[:, None]
    sign = torch.where(actions > 0, -1.0, 1.0)
    return (episode_reward[:, None] + sign * scale) * valid


def td_losses(values: torch.Tensor, rewards: torch.Tensor, log_probs: torch.Tensor, valid: torch.Tensor,
              gamma: float):
    """Eqs. 11–12: critic ``mean δ²`` and actor ``−mean log π(a|s)·δ`` (δ detached for the actor).

    Args: ``(C, S)`` critic values ``V(s_ij)``, shaped rewards, log-probabilities of the taken
    actions, 0/1 validity. ``δ_j = r_j + γ V(s_{j+1}) − V(s_j)`` with ``V = 0`` after the last
    valid state. Means run over each client's states, then over clients.
    """
    next_values = torch.cat([values[:, 1:] * valid[:, 1:], torch.zeros_like(values[:, :1])], dim=1)
    delta = (rewards + gamma * next_values - values) * valid  # (C, S)
    count = valid.sum(1).clamp(min=1)
    has_states = (valid.sum(1) > 0).float()
    denominator = has_states.sum().clamp(min=1)
    critic = ((delta.pow(2).sum(1) / count) * has_states).sum() / denominator
    actor = ((-(log_probs * delta.detach() * valid).sum(1) / count) * has_states).sum() / denominator
    return critic, actor


class TransferAgent:
    """``π_A`` (actor) and ``M_C`` (critic): which items the server sends each client (§3.3).

    Args:
        state_dim: ``2 d + 3`` (prediction, frequency, user and item embedding, count so far).
        mu: cap on the states per client (μ = 30); rho: position factor (ρ = 4);
        gamma: TD discount; rewards: subset of :data:`TRANSFER_REWARDS`.
    """

    def __init__(self, state_dim: int, mu: int = 30, rho: float = 4.0, gamma: float = 0.9,
                 rewards: Sequence[str] = TRANSFER_REWARDS, hidden: int = 32, lr: float = 1e-3,
                 generator: Optional[torch.Generator] = None, device="cpu"):
        unknown = set(rewards) - set(TRANSFER_REWARDS)
        if unknown or not rewards:
            raise ValueError(f"rewards must be a non-empty subset of {TRANSFER_REWARDS}, got {tuple(rewards)}")
        if mu < 1 or rho <= 0 or not 0.0 <= gamma <= 1.0:
            raise ValueError(f"need mu >= 1, rho > 0 and 0 <= gamma <= 1; got mu={mu}, rho={rho}, gamma={gamma}")
        self.mu, self.rho, self.gamma = int(mu), float(rho), float(gamma)
        self.rewards = tuple(r for r in TRANSFER_REWARDS if r in rewards)
        generator = generator if generator is not None else torch.Generator().manual_seed(1)
        self.actor = _mlp(state_dim, hidden, generator).to(device)
        self.critic = _mlp(state_dim, hidden, generator).to(device)
        self.optimizer = torch.optim.Adam(list(self.actor.parameters()) + list(self.critic.parameters()), lr=lr)

    @torch.no_grad()
    def act(self, base_states: torch.Tensor, valid: torch.Tensor, generator: torch.Generator):
        """Walk each client's sequence and sample keep/skip decisions.

        Args:
            base_states: ``(C, S, D − 1)`` every state feature except the running count.
            valid: ``(C, S)`` 0/1 (sequences shorter than ``S`` are padded).
            generator: draws the Bernoulli actions.
        Returns:
            ``(states (C, S, D), actions (C, S) 0/1)``; ``states`` hold the count the actor saw.
        """
        c, s, _ = base_states.shape
        counts = torch.zeros(c, device=base_states.device)
        states, actions = [], []
        for j in range(s):  # sequential by definition: state j sees the decisions before it
            state = torch.cat([base_states[:, j], (counts / self.mu)[:, None]], dim=1)  # (C, D)
            prob = torch.sigmoid(self.actor(state).squeeze(-1))
            draw = torch.rand(c, generator=generator, device="cpu").to(prob.device)
            action = (draw < prob).float() * valid[:, j]
            counts = counts + action
            states.append(state)
            actions.append(action)
        return torch.stack(states, 1), torch.stack(actions, 1)

    def update(self, states: torch.Tensor, actions: torch.Tensor, valid: torch.Tensor,
               episode_reward: torch.Tensor) -> dict:
        """One actor–critic step (Eqs. 11–12) from the round's episodes; returns the losses."""
        shaped = shaped_rewards(episode_reward, actions, valid, self.rho)
        values = self.critic(states).squeeze(-1)  # (C, S)
        logits = self.actor(states).squeeze(-1)
        log_probs = -F.binary_cross_entropy_with_logits(logits, actions, reduction="none")  # log π(a|s)
        critic, actor = td_losses(values, shaped, log_probs, valid, self.gamma)
        self.optimizer.zero_grad()
        (critic + actor).backward()
        self.optimizer.step()
        return {"critic_loss": float(critic.detach()), "actor_loss": float(actor.detach())}

    def episode_reward(self, server: torch.Tensor, diversity: torch.Tensor, divergence: torch.Tensor) -> torch.Tensor:
        """``R^AC_i``: the mean of the enabled, z-scored terms (each ``(C,)``)."""
        terms = {"server": server, "diversity": diversity, "divergence": divergence}
        return torch.stack([zscore(terms[name]) for name in self.rewards], 0).mean(0)
