"""Every method of the course by name: one registry, four families, one way to train them.

A :class:`Method` is a name (as the papers' tables print it), its family, a short reference and
a ``build`` function that turns the family's data into a :class:`Trainable`: an
:class:`~fedlib.engine.algorithm.Algorithm` and the :class:`~fedlib.engine.trainer.Schedule`
its family trains with. Every method is then trained the same way::

    from fedlib.baselines.registry import get
    from fedlib.engine.trainer import train

    job = get("GPFedRec").build(split, FederatedConfig(rounds=20), dim=32)
    run = train(job.algorithm, job.schedule, seed=0)

The baselines register here, at import; a paper registers its own method in its folder
(``fedlib/papers/<slug>/__init__.py``), which this layer cannot import:
:func:`fedlib.papers.all_methods` imports the paper folders and returns the whole registry.

The families and what their ``build`` takes (``params`` are the method's own hyperparameters,
its defaults where not given):

* ``single-domain``: ``build(split: InteractionSplit, config: FederatedConfig, *, dim, device=None,
  **params)``; the schedule is ``config.schedule()``.
* ``cross-domain``: ``build(split: DomainSplit, *, dim, rounds, seed=0, device=None, **params)``;
  the family's schedule (select on mean validation HR@10, test at every evaluation).
* ``sequential``: ``build(split: SequenceSplit, *, dim, rounds, seed=0, device=None, **params)``;
  the platforms' schedule (select on mean validation MRR).
* ``continual``: ``build(**params) -> ContinualMethod``, trained block by block by
  :func:`~fedlib.baselines.continual.continual.run_continual` (each block a run of the trainer);
  its ``build`` returns the method itself, not a :class:`Trainable`.
"""
from __future__ import annotations

import dataclasses
import difflib
import importlib
import re
from typing import Any, Callable, Dict, NamedTuple, Optional, Tuple

import torch

from fedlib.engine.algorithm import Algorithm
from fedlib.engine.executors import BatchedExecutor
from fedlib.engine.loop import FederatedConfig, ParameterAveraging
from fedlib.engine.method import fedmf_method, fedncf_method, pfedrec_method
from fedlib.engine.trainer import Schedule

__all__ = ["FAMILIES", "Method", "Trainable", "METHODS", "register", "get", "names"]

#: The families, in the course's order, and the data their ``build`` takes.
FAMILIES: Dict[str, str] = {
    "single-domain": "an InteractionSplit (one user-item matrix) and a FederatedConfig",
    "cross-domain": "a DomainSplit (domains sharing users)",
    "sequential": "a SequenceSplit (platforms with two domains' sequences)",
    "continual": "a BlockStream, through run_continual (build returns the ContinualMethod)",
}


class Trainable(NamedTuple):
    """What :func:`fedlib.engine.trainer.train` needs besides the seed."""

    algorithm: Algorithm
    schedule: Schedule


@dataclasses.dataclass(frozen=True)
class Method:
    """One method of the course.

    Attributes:
        name: as the papers' tables print it (``"GPFedRec"``, ``"GA-DTCDR"``).
        family: a key of :data:`FAMILIES`.
        source: the module that implements it, whose docstring cites the method's paper.
        build: the family's builder (module docstring).
        paper: the paper slug whose own method this is; ``None`` for a baseline.
        config: the method's config dataclass, where it has one (cross-domain, sequential).
        train: the family's one-call training function, where the method has one:
            ``train(split, config, *, device, progress, ...) -> the family's result``
            (cross-domain: the trainer's :class:`~fedlib.engine.trainer.RunResult`, labelled and with
            the family's artifacts by :func:`~fedlib.baselines.cross_domain.cdr_common.finish_run`).
        model: a sequential baseline's model, ``model(split, config) -> nn.Module``, which
            FedProx trains on every platform.
    """

    name: str
    family: str
    source: str
    build: Callable[..., Any]
    paper: Optional[str] = None
    config: Optional[type] = None
    train: Optional[Callable[..., Any]] = None
    model: Optional[Callable[..., Any]] = None

    @property
    def reference(self) -> str:
        """The citation of the method's paper, from the docstring of :attr:`source`."""
        doc = importlib.import_module(self.source).__doc__ or ""
        match = re.search(r"^References?:\s*(.+?)(?:\n\s*\n|\Z)", doc, re.S | re.M)
        if match:
            return " ".join(match.group(1).split())
        # no "Reference:" header: the first paragraph that names a year
        cited = [p for p in doc.split("\n\n") if re.search(r"\b(19|20)\d\d\b", p)]
        return " ".join((cited or [doc.split("\n\n")[0]])[0].split())


#: (family, name) -> :class:`Method`, in registration order (baselines first, then each imported
#: paper). A name is unique within its family; FedNCF, for one, is a single-domain method and a
#: row of the cross-domain comparison (one model per domain).
METHODS: Dict[Tuple[str, str], Method] = {}


def register(name: str, family: str, source: Optional[str] = None, paper: Optional[str] = None,
             **parts: Any) -> Callable:
    """Decorator: register ``build`` as ``name`` of ``family`` (``source`` defaults to ``build``'s module);
    ``parts`` are :class:`Method`'s optional ``config``, ``train`` and ``model``.

    A second registration of a (family, name) by another function is an error."""
    if family not in FAMILIES:
        raise ValueError(f"unknown family {family!r} for {name!r}; the families are {', '.join(FAMILIES)}")

    def decorate(build: Callable[..., Any]) -> Callable[..., Any]:
        known = METHODS.get((family, name))
        if known is not None and known.build is not build:
            raise ValueError(f"the {family} method {name!r} is registered twice ({known.build.__module__} and "
                             f"{build.__module__}); give one of them another name")
        METHODS[(family, name)] = Method(name, family, source or build.__module__, build, paper, **parts)
        return build
    return decorate


def get(name: str, family: Optional[str] = None) -> Method:
    """The method registered as ``name`` (of ``family``, needed where two families share the name).

    Raises:
        KeyError: no such method (the message names the closest registered names), or the name is in
            several families and ``family`` is not given.
    """
    if family is not None and family not in FAMILIES:
        raise ValueError(f"unknown family {family!r}; the families are {', '.join(FAMILIES)}")
    found = [m for (f, n), m in METHODS.items() if n == name and family in (None, f)]
    if len(found) == 1:
        return found[0]
    if found:
        raise KeyError(f"{name!r} is a method of several families ({', '.join(m.family for m in found)}); "
                       f"pass family=")
    close = difflib.get_close_matches(name, [n for f, n in METHODS if family in (None, f)], n=3)
    hint = f" (did you mean {', '.join(map(repr, close))}?)" if close else ""
    where = f"the {family} methods" if family else "the registry"
    raise KeyError(f"no method {name!r} in {where}{hint}; a paper's own method is registered when its folder is "
                   f"imported (fedlib.papers.all_methods() imports them all)")


def names(family: Optional[str] = None) -> Tuple[str, ...]:
    """The registered names, of one family if given."""
    if family is not None and family not in FAMILIES:
        raise ValueError(f"unknown family {family!r}; the families are {', '.join(FAMILIES)}")
    return tuple(n for f, n in METHODS if family in (None, f))


# ======================================================================================
# Single-domain: parameter averaging (engine) and the personalised baselines
# ======================================================================================
def averaging(method, split, config: FederatedConfig, *, executor=None, device=None) -> Trainable:
    """A :class:`~fedlib.engine.method.FederatedMethod` on ``split.train`` as a :class:`Trainable`."""
    return Trainable(ParameterAveraging(method, split.train, config, executor=executor, device=device),
                     config.schedule())


@register("FedMF", "single-domain", "fedlib.models.mf")
def _fedmf(split, config, *, dim, device=None, **params):
    from fedlib.models import FedMF
    return averaging(fedmf_method(FedMF(split.num_users, split.num_items, dim), **params), split, config,
                     device=device)


@register("FedNCF", "single-domain", "fedlib.models.ncf")
def _fedncf(split, config, *, dim, device=None, hidden=None, **params):
    from fedlib.models import FedNCF
    model = FedNCF(split.num_users, split.num_items, dim, variant="mlp", hidden=tuple(hidden or (dim,)))
    return averaging(fedncf_method(model, **params), split, config, device=device)


@register("PFedRec", "single-domain", "fedlib.models.pfedrec")
def _pfedrec(split, config, *, dim, device=None, **params):
    from fedlib.models import PFedRec
    return averaging(pfedrec_method(PFedRec(split.num_users, split.num_items, dim), **params), split, config,
                     device=device)


@register("GPFedRec", "single-domain", "fedlib.baselines.single_domain.gpfedrec")
def _gpfedrec(split, config, *, dim, device=None, hidden=None, **params):
    from fedlib.baselines.single_domain.gpfedrec import GPFedRecExecutor, GPFedRecModel, gpfedrec_method
    model = GPFedRecModel(split.num_users, split.num_items, dim, hidden=tuple(hidden or (dim,)))
    return averaging(gpfedrec_method(model, **params), split, config, executor=GPFedRecExecutor(), device=device)


@register("CoFedRec", "single-domain", "fedlib.baselines.single_domain.cofedrec")
def _cofedrec(split, config, *, dim, device=None, **params):
    from fedlib.baselines.continual.continual import PlanAugmentingExecutor
    from fedlib.baselines.single_domain.cofedrec import CoFedRecModel, cofedrec_method, supcon_chunk
    model = CoFedRecModel(split.num_users, split.num_items, dim)
    method = cofedrec_method(model, split.train, config, **params)
    # L_sup compares every row of a step with every other: chunk the clients to bound memory
    rows = config.batch_size + (split.num_items if params.get("contrastive_rows", "table") == "table" else 0)
    executor = PlanAugmentingExecutor(BatchedExecutor(chunk_size=supcon_chunk(rows)))
    return averaging(method, split, config, executor=executor, device=device)


@register("FedRAP", "single-domain", "fedlib.baselines.single_domain.fedrap")
def _fedrap(split, config, *, dim, device=None, **params):
    """``weight_decay``, ``batch_lr_decay``, ``tol`` among ``params`` select the public code's optimiser."""
    from fedlib.baselines.single_domain.fedrap import FedRAP, FedRAPCodeExecutor, fedrap_method
    code_optimizer = {k: params.pop(k) for k in ("weight_decay", "batch_lr_decay", "tol") if k in params}
    if code_optimizer and params.get("gradient_noise") is not None:
        raise ValueError("FedRAP's code optimiser (weight_decay, batch_lr_decay, tol) runs without LDP noise: "
                         "drop those parameters or the ldp setting")
    executor = FedRAPCodeExecutor(**code_optimizer) if code_optimizer else None
    return averaging(fedrap_method(FedRAP(split.num_users, split.num_items, dim), **params), split, config,
                     executor=executor, device=device)


@register("FedDAE", "single-domain", "fedlib.baselines.single_domain.feddae")
def _feddae(split, config, *, dim, device=None, hidden=None, **params):
    from fedlib.baselines.single_domain.feddae import FedDAEModel, feddae_method
    from fedlib.baselines.single_domain.feddae_executor import FedDAEExecutor
    model = FedDAEModel(split.num_users, split.num_items, train=split.train, latent_dim=dim,
                        hidden=tuple(hidden or (2 * dim,)))
    # one local step per round: shared global parameters, the first layers at the user's items only
    # (the reference path, used otherwise, copies ~4·h·I numbers per client)
    return averaging(feddae_method(model, **params), split, config,
                     executor=FedDAEExecutor(chunk_size=256, reference_chunk_size=64), device=device)


@register("FedPerGNN", "single-domain", "fedlib.baselines.single_domain.fedpergnn")
def _fedpergnn(split, config, *, dim, device=None, **params):
    from fedlib.baselines.single_domain.fedpergnn import FedPerGNN, FedPerGNNConfig
    gnn = FedPerGNNConfig(dim=dim, rounds=config.rounds, seed=config.seed, **params)
    return Trainable(FedPerGNN(split, gnn), Schedule(rounds=config.rounds, eval_every=gnn.eval_every))


def centralised(module, split, config: FederatedConfig, *, lr: float, epochs_per_round: int = 1,
                device=None) -> Trainable:
    """An ``nn.Module`` trained on the pooled data, the one-client case: one round is
    ``epochs_per_round`` epochs of SGD over every training pair (``config``'s batch and negatives)."""
    from fedlib.engine.centralised import sgd_centralised
    module = module.to(device if device is not None else "cpu")
    algorithm = sgd_centralised(module, split.train, split.num_items, lr=lr, batch_size=config.batch_size,
                                num_negatives=config.num_negatives, epochs_per_round=epochs_per_round)
    return Trainable(algorithm, config.schedule())


@register("MF", "single-domain", "fedlib.models.mf")
def _mf(split, config, *, dim, device=None, **params):
    from fedlib.models.mf import MF
    generator = torch.Generator().manual_seed(int(config.seed))
    return centralised(MF(split.num_users, split.num_items, dim, generator=generator), split, config, device=device,
                       **params)


@register("NeuMF", "single-domain", "fedlib.models.ncf")
def _neumf(split, config, *, dim, device=None, hidden=None, **params):
    from fedlib.models.ncf import NeuMF
    generator = torch.Generator().manual_seed(int(config.seed))
    module = NeuMF(split.num_users, split.num_items, dim, hidden=tuple(hidden or (dim,)), generator=generator)
    return centralised(module, split, config, device=device, **params)


# ======================================================================================
# Cross-domain (FedPCL-CDR's Table 2)
# ======================================================================================
def cross_domain(algorithm_class, config_class, select_on_field: str = "select_on") -> Callable[..., Trainable]:
    """The builder of a cross-domain method: ``algorithm_class(split, config, device, ks)`` with the
    family's schedule, selecting on the split named by the config's ``select_on_field``."""
    def build(split, *, dim, rounds, seed=0, device=None, ks=(5, 10), **params):
        import torch

        from fedlib.baselines.cross_domain.cdr_common import cdr_schedule
        fields = {f.name for f in dataclasses.fields(config_class)}
        length = {"epochs": rounds} if "epochs" in fields else {"rounds": rounds}
        config = config_class(dim=dim, seed=seed, **length, **params)
        device = torch.device(device) if device is not None else torch.device("cpu")
        return Trainable(algorithm_class(split, config, device, ks),
                         cdr_schedule(config, rounds, getattr(config, select_on_field)))
    return build


def _register_cross_domain() -> None:
    from fedlib.baselines.cross_domain import cl_dtcdr, ga_cdr, nmcdr, p2dtr, p2fcdr, pricdr
    from fedlib.baselines.cross_domain import cdr_single_domain as single

    for name, source, config_class, domain_class, train in (
            ("NeuMF", "fedlib.models.ncf", single.NeuMFConfig, single._NeuMFDomain, single.train_neumf),
            ("LightGCN", "fedlib.models.lightgcn", single.LightGCNConfig, single._LightGCNDomain,
             single.train_lightgcn),
            ("FedNCF", "fedlib.models.ncf", single.FedNCFConfig, single._FedNCFDomain, single.train_fedncf)):
        register(name, "cross-domain", source, config=config_class, train=train)(cross_domain(
            lambda split, config, device, ks, domain_class=domain_class:
            single.SingleDomainBaseline(split, config, domain_class, device, ks), config_class))
    for name, algorithm_class, config_class, train in (
            ("GA-DTCDR", ga_cdr.GAAlgorithm, ga_cdr.GADTCDRConfig, ga_cdr.train_ga_dtcdr),
            ("GA-MTCDR-P", ga_cdr.GAAlgorithm, ga_cdr.GAMTCDRPConfig, ga_cdr.train_ga_mtcdr_p),
            ("NMCDR", nmcdr.NMCDRAlgorithm, nmcdr.NMCDRConfig, nmcdr.train_nmcdr),
            ("CL-DTCDR", cl_dtcdr.CLDTCDRAlgorithm, cl_dtcdr.CLDTCDRConfig, cl_dtcdr.train_cl_dtcdr),
            ("PriCDR", pricdr.PriCDRAlgorithm, pricdr.PriCDRConfig, pricdr.train_pricdr),
            ("P2FCDR", p2fcdr.P2FCDRAlgorithm, p2fcdr.P2FCDRConfig, p2fcdr.train_p2fcdr),
            ("P2DTR", p2dtr.P2DTRAlgorithm, p2dtr.P2DTRConfig, p2dtr.train_p2dtr)):
        register(name, "cross-domain", algorithm_class.__module__, config=config_class, train=train)(
            cross_domain(algorithm_class, config_class))


_register_cross_domain()


# ======================================================================================
# Sequential (FedCSR's Table 2): each model trained with FedProx on the platforms
# ======================================================================================
def sequential(model_class, config_class) -> Callable[..., Trainable]:
    """The builder of a sequential baseline: ``model_class(items_a, items_b, config)`` under FedProx."""
    def build(split, *, dim, rounds, seed=0, device=None, train=None, **params):
        from fedlib.baselines.sequential.fedcsr_baselines import FedProxAlgorithm, FedProxConfig
        from fedlib.baselines.sequential.sequence_training import platform_schedule
        model_config = config_class(dim=dim, seed=seed, **params)
        proximal = FedProxConfig(rounds=rounds, seed=seed, **(train or {}))
        algorithm = FedProxAlgorithm(lambda: model_class(split.num_items_a, split.num_items_b, model_config), split,
                                     proximal, device=device)
        return Trainable(algorithm, platform_schedule(proximal.rounds, proximal.patience))
    return build


def _register_sequential() -> None:
    from fedlib.baselines.sequential import c2dsr, ccdr, clsr, conet, mifn, pinet, psjnet, tisasrec

    for name, model_class, config_class in (("TiSASRec", tisasrec.TiSASRec, tisasrec.TiSASRecConfig),
                                            ("CLSR", clsr.CLSR, clsr.CLSRConfig),
                                            ("CoNet", conet.CoNet, conet.CoNetConfig),
                                            ("CCDR", ccdr.CCDR, ccdr.CCDRConfig),
                                            ("PiNet", pinet.PiNet, pinet.PiNetConfig),
                                            ("PSJNet", psjnet.PSJNet, psjnet.PSJNetConfig),
                                            ("MIFN", mifn.MIFN, mifn.MIFNConfig),
                                            ("C2DSR", c2dsr.C2DSR, c2dsr.C2DSRConfig)):
        register(name, "sequential", model_class.__module__, config=config_class,
                 model=lambda split, config, model_class=model_class: model_class(split.num_items_a,
                                                                                  split.num_items_b, config))(
            sequential(model_class, config_class))


_register_sequential()


# ======================================================================================
# Continual (F3CRec's Table 2): the method of each block
# ======================================================================================
@register("FT", "continual", "fedlib.baselines.continual.continual")
def _fine_tuning(**params):
    from fedlib.baselines.continual.continual import FineTuning
    return FineTuning(**params)


@register("RLP2", "continual", "fedlib.baselines.continual.rlp2")
def _rlp2(**params):
    from fedlib.baselines.continual.rlp2 import RLP2
    return RLP2(**params)


@register("SPP", "continual", "fedlib.baselines.continual.spp")
def _spp(**params):
    from fedlib.baselines.continual.spp import SPP
    return SPP(**params)
