"""Backbones, in a federated form (roles of parameters, batched logits) and a centralised form.

==================  =====================================  ===============================
backbone            federated form                          centralised form
==================  =====================================  ===============================
MF                  :class:`FedMF`                          :class:`MF`
GMF / MLP / NeuMF   :class:`FedNCF` (+ F3CRec's variant)    :class:`GMF`, :class:`MLP`, :class:`NeuMF`
PFedRec             :class:`PFedRec`                        (pooled training of FedMF/NCF)
personal tables     :class:`PersonalItemTableModel`         n/a
LightGCN            (server / domain model)                 :class:`LightGCN`
==================  =====================================  ===============================
"""
from fedlib.models.base import PARAM_KINDS, FederatedModel, GlobalState, PrivateState
from fedlib.models.lightgcn import LightGCN, lightgcn_propagate, normalized_adjacency
from fedlib.models.mf import MF, FedMF
from fedlib.models.ncf import GMF, MLP, FedNCF, NeuMF
from fedlib.models.personal import PersonalItemTableModel
from fedlib.models.pfedrec import PFedRec
from fedlib.models.popularity import ItemPopularity

__all__ = [
    "PARAM_KINDS", "FederatedModel", "GlobalState", "PrivateState",
    "FedMF", "MF", "FedNCF", "GMF", "MLP", "NeuMF", "PFedRec", "PersonalItemTableModel", "ItemPopularity",
    "LightGCN", "lightgcn_propagate", "normalized_adjacency",
]
