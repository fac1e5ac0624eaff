r"""A server-side optimiser for parameter averaging: Adam on the clients' averaged change.

Plain FedAvg moves the global parameters by the (weighted) mean of the clients' changes,
:math:`\theta_{t+1} = \theta_t + \bar\Delta_t`. Some methods instead treat the negated mean
change as a *pseudo-gradient* and hand it to an optimiser that keeps state across rounds:

.. math::

    g_t = -\bar\Delta_t / s_t, \qquad
    m_t = \beta_1 m_{t-1} + (1-\beta_1) g_t, \qquad
    v_t = \beta_2 v_{t-1} + (1-\beta_2) g_t^2, \\
    \theta_{t+1} = \theta_t - \eta_s \, \frac{m_t / (1-\beta_1^{t+1})}{\sqrt{v_t / (1-\beta_2^{t+1})} + \epsilon}.

* FedAdam (Reddi et al., "Adaptive Federated Optimization", ICLR 2021,
  https://arxiv.org/abs/2003.00295) uses the change itself, :math:`s_t = 1`
  (``pseudo_gradient="change"``).
* FedDAE (Li et al., AAAI 2025, https://arxiv.org/abs/2408.08931; code
  https://github.com/mtics/FedDAE, ``model/model.py``) sums the clients' *gradients* into the
  server model's ``.grad``, divides by the number of clients and calls ``torch.optim.Adam.step``.
  Its appendix (Eqs. A4–A5) notes that for local SGD these gradients are the parameter changes
  divided by the local learning rate: :math:`s_t` is the clients' SGD rate of that round
  (``pseudo_gradient="mean_gradient"``; with ``local_epochs`` steps it is the mean of each
  client's summed step gradients, exactly what the code's accumulation holds for one epoch).

The update is ``torch.optim.Adam``'s (L2 ``weight_decay`` added to the gradient, bias
corrections, ``eps`` outside the square root), written out so that its state is plain tensors
the trainer keeps in :attr:`~fedlib.engine.loop.AveragingState.extra` and saves in every
checkpoint: a resumed run continues the same moments. Only the *public* parameters the server
aggregates are stepped; private ones never reach the server.

Shapes: every state tensor has its parameter's shape; ``step`` is the number of server steps
taken (an int).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Dict, Mapping, Optional, Tuple

import torch

__all__ = ["PSEUDO_GRADIENTS", "ServerAdam", "ServerAdamState"]

PSEUDO_GRADIENTS = ("change", "mean_gradient")

ServerAdamState = Dict[str, object]   # {"step": int, "exp_avg": {name: T}, "exp_avg_sq": {name: T}}


@dataclass(frozen=True)
class ServerAdam:
    """Adam on the server with the negated mean client change as its gradient (module docstring).

    Attributes:
        lr: the server's step size :math:`\\eta_s`.
        betas: Adam's :math:`(\\beta_1, \\beta_2)`.
        eps: added to :math:`\\sqrt{\\hat v}`.
        weight_decay: L2 coefficient added to the pseudo-gradient (``torch.optim.Adam``'s).
        pseudo_gradient: ``"change"`` (:math:`s_t = 1`, FedAdam) or ``"mean_gradient"``
            (:math:`s_t` = each parameter's client SGD rate in round ``t``, FedDAE's code).
    """

    lr: float
    betas: Tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-8
    weight_decay: float = 0.0
    pseudo_gradient: str = "change"

    def __post_init__(self):
        if not (math.isfinite(self.lr) and self.lr > 0):
            raise ValueError(f"ServerAdam.lr must be a positive number, got {self.lr!r}")
        beta1, beta2 = (float(b) for b in self.betas)
        if not (0.0 <= beta1 < 1.0 and 0.0 <= beta2 < 1.0):
            raise ValueError(f"ServerAdam.betas must lie in [0, 1), got {self.betas!r}")
        if not self.eps > 0:
            raise ValueError(f"ServerAdam.eps must be > 0, got {self.eps!r}")
        if not self.weight_decay >= 0:
            raise ValueError(f"ServerAdam.weight_decay must be >= 0, got {self.weight_decay!r}")
        if self.pseudo_gradient not in PSEUDO_GRADIENTS:
            raise ValueError(f"ServerAdam.pseudo_gradient must be one of {PSEUDO_GRADIENTS}, "
                             f"got {self.pseudo_gradient!r}")
        object.__setattr__(self, "betas", (beta1, beta2))

    def init_state(self, global_state: Mapping[str, torch.Tensor]) -> ServerAdamState:
        """Zero moments for every public parameter, no step taken."""
        return {"step": 0,
                "exp_avg": {k: torch.zeros_like(v) for k, v in global_state.items()},
                "exp_avg_sq": {k: torch.zeros_like(v) for k, v in global_state.items()}}

    def step(self, previous: Mapping[str, torch.Tensor], aggregated: Mapping[str, torch.Tensor],
             state: Optional[ServerAdamState], client_lrs: Optional[Mapping[str, float]] = None
             ) -> Tuple[Dict[str, torch.Tensor], ServerAdamState]:
        """One server step from ``previous`` (θ_t) given FedAvg's ``aggregated`` (θ_t + Δ̄_t).

        Args:
            previous, aggregated: ``name -> tensor`` of the public parameters.
            state: the previous step's state, or ``None`` for the first step.
            client_lrs: ``name -> clients' SGD rate this round``; needed, and > 0 for every
                parameter, with ``pseudo_gradient="mean_gradient"``.

        Returns:
            ``(θ_{t+1}, new state)``; neither input nor ``state`` is modified.
        """
        if state is None:
            state = self.init_state(previous)
        beta1, beta2 = self.betas
        step = int(state["step"]) + 1
        bias1, bias2 = 1.0 - beta1 ** step, 1.0 - beta2 ** step
        new_params, exp_avg, exp_avg_sq = {}, {}, {}
        for name, theta in previous.items():
            grad = theta - aggregated[name]                                      # −Δ̄ (same shape as θ)
            if self.pseudo_gradient == "mean_gradient":
                rate = None if client_lrs is None else client_lrs.get(name)
                if rate is None or not float(rate) > 0:
                    raise ValueError(
                        f"ServerAdam(pseudo_gradient='mean_gradient') divides {name!r}'s change by the clients' "
                        f"SGD rate, which is {rate!r}: give the parameter a positive learning rate or use "
                        "pseudo_gradient='change'")
                grad = grad / float(rate)
            if self.weight_decay:
                grad = grad + self.weight_decay * theta
            m = state["exp_avg"][name].to(theta.device)
            v = state["exp_avg_sq"][name].to(theta.device)
            m = torch.lerp(m, grad, 1.0 - beta1)                                 # β₁ m + (1 − β₁) g
            v = v * beta2 + (1.0 - beta2) * grad * grad
            denom = (v.sqrt() / math.sqrt(bias2)) + self.eps
            new_params[name] = theta - (self.lr / bias1) * m / denom
            exp_avg[name], exp_avg_sq[name] = m, v
        for name in aggregated:
            if name not in previous:
                raise ValueError(f"aggregated state has {name!r}, which the previous global state lacks")
        return new_params, {"step": step, "exp_avg": exp_avg, "exp_avg_sq": exp_avg_sq}
