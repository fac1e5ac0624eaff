"""FedRKG's local training recipe for a guided backbone (the plain personal-table run, "w/ PIE").

The guided forms of FedMF, FedNCF and PFedRec (each user's personal item table ``P_u`` in
place of the shared ``Q``) are models: :mod:`fedlib.models.guided`. How they are trained
(learning rate per parameter, per-client gradient clipping, the update steps) is an engine
:class:`~fedlib.engine.FederatedMethod`, built here, one layer above the models; FedRKG's
guidance attaches to it (:class:`fedlib.methods.fedrkg.KnowledgeGuidance`).

Reference: FedRKG, "Federated Recommendation with Knowledge Guidance" (Lim et al.,
https://openreview.net/forum?id=oj2Xj8WXih, arXiv:2511.12959), §6.3 and Table 3; the local
recipe is in its public code's ``main.py`` and ``models/fedrkg.py``
(https://github.com/Jaehyung-Lim/fedrkg).
"""
from __future__ import annotations

from typing import Dict, Optional

from fedlib.engine.method import FederatedMethod
from fedlib.models.base import FederatedModel
from fedlib.models.guided import backbone_name, check_guided_model

__all__ = ["guided_method"]


def guided_method(model: FederatedModel, lr: float = 0.1, lr_eta: float = 80.0, user_lr_scale: float = 1.0,
                  grad_clip_norm: Optional[float] = 1.0, **kwargs) -> FederatedMethod:
    """FedRKG's local recipe for a guided backbone (the plain personal-table run, "w/ PIE").

    Learning rates: ``personal_item_emb`` ``lr × I × lr_eta``; user vectors (``user_emb*``)
    ``lr × user_lr_scale`` (the code's ``lr_u = lr``; F3CRec's FedNCF uses ``lr_eta``); every
    other parameter (heads, MLP layers) ``lr``. Each update step's gradient is clipped to
    ``grad_clip_norm`` per client (the code's ``clip_grad_norm_(params, 1.0)``); the update
    steps are the model's own (:attr:`~fedlib.models.guided.GuidedPFedRec.update_steps`: score function, then
    items), one step on everything otherwise. FedNCF's public tower is FedAvg-aggregated with
    the default uniform weights (the paper's ``α_u = 1/n``).

    For :class:`~fedlib.models.PersonalItemTableModel` this is exactly
    :func:`~fedlib.engine.personal_table_method`'s learning rates. Attach the guidance with
    ``KnowledgeGuidance(...).attach(guided_method(model), train, config)``.

    Args:
        model: a guided model (:func:`~fedlib.models.guided.guided_backbone`).
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
