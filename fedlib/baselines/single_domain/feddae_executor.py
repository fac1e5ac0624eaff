"""FedDAE's fast round: local updates without per-client copies of its item-sized layers.

:class:`FedDAEExecutor` gives the updates of the reference path (the batched executor on
FedDAE's model, :mod:`fedlib.baselines.single_domain.feddae`) when every client takes one local step, FedRKG's
protocol; the tests compare the two.
"""
from __future__ import annotations

import numpy as np
import torch

from fedlib.engine.method import FederatedMethod
from fedlib.engine.plan import RoundPlan
from fedlib.baselines.single_domain.feddae import (_NORM_EPS, combine_posteriors, feddae_objective, draw_noise, FedDAEModel, FedDAELoss)

__all__ = ["FedDAEExecutor"]


# ======================================================================================
# A round without per-client copies of the item-sized layers
# ======================================================================================
class FedDAEExecutor:
    r"""FedDAE's local updates without per-client copies of its item-sized layers.

    The reference path, ``PlanAugmentingExecutor(BatchedExecutor(chunk_size))``, gives every
    client of a chunk its own copy of every parameter: about ``4 h I`` numbers per client
    (Amazon-Video: 2 M, 8 MB), copied, stepped and written back each round, ~70 s per round on
    one CPU thread. When every client takes **one** local step (``local_epochs = 1``, FedRKG's
    protocol), two facts make those copies unnecessary, with the same updates:

    * **Shared parameters.** Each client steps once from the download, so FedAvg's upload
      ``Σ_c w_c Δ_c = −lr Σ_c w_c ∇_θ L_c`` is the gradient of ``Σ_c w_c L_c`` with respect to
      one *shared* copy of the global encoder and decoder: one batched forward and backward.
    * **Sparse first layers.** ``x_u`` is 0/1 with a few ones (Amazon-Video: ~17 of 7,957), and
      the first layers of both encoders and of the gate read ``x_u`` only. Their output is a sum
      over the user's own items, and only those columns receive a gradient: the private
      ``(h, I)`` matrices are read and written at the user's ``n_u`` columns, ``(n_u, h)``.

    One backward pass with output gradient ``w_c`` serves both: the private gradients, scaled
    by ``w_c``, are divided by it again. The results equal the reference path's up to the order
    of float sums (tests compare them). Anything else (several local steps, clipping, gradient
    or upload noise, Adam, several update groups, per-client upload inspection, a zero weight)
    runs the reference path.

    Args:
        chunk_size: clients per batched forward (memory: ~3 ``(C, I)`` matrices).
        reference_chunk_size: ``chunk_size`` of the reference path's ``BatchedExecutor``.
    """

    name = "feddae-shared"

    def __init__(self, chunk_size: int = 256, reference_chunk_size: int = 64):
        from fedlib.engine.executors import BatchedExecutor
        from fedlib.baselines.continual.continual import PlanAugmentingExecutor

        if int(chunk_size) < 1:
            raise ValueError(f"chunk_size must be >= 1 (clients per batched forward), got {chunk_size}")
        self.chunk_size = int(chunk_size)
        self.reference = PlanAugmentingExecutor(BatchedExecutor(chunk_size=int(reference_chunk_size)))

    def applies(self, method: FederatedMethod, plan: RoundPlan, weights, return_client_updates: bool = False) -> bool:
        """Whether :meth:`local_updates` takes the shared-parameter path for this round."""
        return (isinstance(method.model, FedDAEModel) and isinstance(method.client_loss, FedDAELoss)
                and int(plan.local_epochs) == 1 and len(method.steps) == 1
                and method.grad_clip_norm is None and getattr(method, "step_clip_norm", None) is None
                and method.gradient_noise is None and not method.adds_upload_noise
                and not method.optimizer.is_adam and not return_client_updates
                and bool(np.all(np.asarray(weights, dtype=np.float64) > 0)))

    @torch.enable_grad()
    def local_updates(self, method: FederatedMethod, global_state, private_state, plan: RoundPlan, weights,
                      *, return_client_updates: bool = False, **kwargs):
        from fedlib.engine.executors import LocalUpdateResult

        if not self.applies(method, plan, weights, return_client_updates):
            return self.reference.local_updates(method, global_state, private_state, plan, weights,
                                                return_client_updates=return_client_updates, **kwargs)
        model, loss = method.model, method.client_loss
        ref = next(iter({**global_state, **private_state}.values()))
        loss.prepare_round(plan, global_state, private_state)
        try:
            clients, inputs = loss.round_inputs  # (P,) sorted ids, (P, I) rows in sorted order
            order = torch.searchsorted(clients, torch.as_tensor(plan.clients, dtype=torch.int64, device=clients.device))
            update = {name: torch.zeros_like(global_state[name]) for name in model.public_names}
            losses = torch.zeros(plan.num_clients, dtype=ref.dtype, device=ref.device)
            trained = set(method.steps[0])
            rates = {name: method.lr(name, plan.round_index) for name in model.param_kinds}
            w_all = torch.as_tensor(np.asarray(weights, dtype=np.float64), dtype=ref.dtype, device=ref.device)
            for start in range(0, plan.num_clients, self.chunk_size):
                stop = min(start + self.chunk_size, plan.num_clients)
                users = torch.as_tensor(plan.clients[start:stop], dtype=torch.int64, device=ref.device)
                x = inputs[order[start:stop]]  # (C, I)
                chunk_losses = self._chunk(model, loss, global_state, private_state, users, x, w_all[start:stop],
                                           trained, rates, update, int(plan.round_index))
                losses[start:stop] = chunk_losses
        finally:
            loss.finish_round()
        return LocalUpdateResult(update, losses, None)

    def _chunk(self, model, loss, global_state, private_state, users, x, w, trained, rates, update, round_index):
        """One chunk's forward, backward and steps; returns its losses ``(C,)``."""
        kinds = model.param_kinds
        num_clients = users.numel()
        noise = draw_noise(users.cpu(), [0] * num_clients, loss._noise_key, model.num_items, model.gate_hidden,
                           model.latent_dim, loss.dropout, loss.gate_dropout, dtype=x.dtype, device=x.device)
        client_of, item_of = torch.nonzero(x, as_tuple=True)  # (N,) the ones of x, by client
        x_normed = 1.0 / x.sum(1).sqrt().clamp(min=_NORM_EPS)  # (C,) every one of x_u / ‖x_u‖
        value = x_normed[client_of]  # (N,)
        leaves, sparse = {}, {}

        def leaf(name, tensor):
            leaves[name] = tensor.detach().requires_grad_(name in trained)
            return leaves[name]

        def first_layer(name, column_values):
            """``(C, out)`` = Σ over the user's items of ``W[:, i] · value`` (+ the bias)."""
            weight = global_state[name] if kinds[name] == "public_dense" else None
            if weight is not None:
                columns = leaf(name, weight).index_select(1, item_of).T  # (N, out) from the shared (out, I)
            else:
                columns = leaf(name, private_state[name][users[client_of], :, item_of])  # (N, out) own columns
                sparse[name] = True
            out = columns.new_zeros(num_clients, columns.shape[1]).index_add(0, client_of, columns * column_values[:, None])
            return out + bias(name.replace("_w", "_b"))

        def bias(name):
            if kinds[name] == "public_dense":
                return leaf(name, global_state[name])  # (out,), broadcast over clients
            return leaf(name, private_state[name][users])  # (C, out)

        def linear(name, h):
            if kinds[name] == "public_dense":
                return h @ leaf(name, global_state[name]).T + bias(name.replace("_w", "_b"))
            return torch.einsum("coi,ci->co", leaf(name, private_state[name][users]), h) + bias(name.replace("_w", "_b"))

        def encoder(prefix, mask):
            depth = len(model.encoder_dims) - 1
            h = first_layer(f"{prefix}0_w", value * mask[client_of, item_of])
            for j in range(1, depth):
                h = linear(f"{prefix}{j}_w", torch.tanh(h))
            return h

        k = model.latent_dim
        out_g, out_l = encoder("genc", noise.mask_global), encoder("lenc", noise.mask_local)
        mu_g, logvar_g, mu_l, logvar_l = out_g[:, :k], out_g[:, k:], out_l[:, :k], out_l[:, k:]
        hidden = torch.relu(first_layer("gate0_w", torch.ones_like(value))) * noise.mask_gate
        gate = torch.softmax(linear("gate1_w", hidden), dim=1)
        z_l = mu_l + noise.eps_local * torch.exp(0.5 * logvar_l)
        z_g = mu_g + noise.eps_global * torch.exp(0.5 * logvar_g)
        z = gate[:, :1] * z_l + gate[:, 1:] * z_g
        mu, logvar = combine_posteriors(gate, mu_l, logvar_l, mu_g, logvar_g)
        h = z
        for j in range(len(model.decoder_dims) - 1):
            h = linear(f"dec{j}_w", torch.tanh(h) if j else h)
        client_losses = feddae_objective(h, x, mu, logvar, loss.beta_t(round_index))  # (C,)

        names = [name for name in leaves if name in trained]
        grads = torch.autograd.grad(client_losses, [leaves[name] for name in names], grad_outputs=w)
        with torch.no_grad():
            for name, grad in zip(names, grads):
                step = rates[name]
                if kinds[name] == "public_dense":
                    update[name].add_(grad, alpha=-step)  # Σ_c w_c (−lr ∇L_c)
                elif name in sparse:
                    new = leaves[name] - step * grad / w[client_of][:, None]
                    private_state[name][users[client_of], :, item_of] = new
                else:
                    scale = w.view(-1, *([1] * (grad.dim() - 1)))
                    private_state[name][users] = leaves[name] - step * grad / scale
        return client_losses.detach()
