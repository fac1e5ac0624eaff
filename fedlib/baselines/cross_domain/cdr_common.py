"""What every cross-domain method of the FedPCL-CDR comparison shares: evaluation, the trainer's schedule, result.

A method trains on a :class:`~fedlib.data.splits.DomainSplit` (2+ domains, users
``0 .. n_o − 1`` shared) and is evaluated per domain on the protocol's sampled candidates
(``split[d].extra["valid_candidates"]`` / ``["test_candidates"]``, positive in column 0).
Every method is an :class:`~fedlib.engine.algorithm.Algorithm` trained by the one trainer,
:func:`fedlib.engine.train`; one round is one epoch of a centralised baseline or one
communication round of a federated one. The shared pieces:

* :func:`evaluate_scorer`: HR@K, NDCG@K and MRR of a ``score(users (n,), items (n, C)) -> (n, C)``
  function on one domain and role (a metric, :mod:`fedlib.metrics.scorer`, imported here);
* :class:`CrossDomainAlgorithm`: the family's evaluation (``{"<domain>/HR@10": ..., "HR@10": mean
  over domains}``), and its checkpointable state: the live models, optimisers and generators of
  a run, saved as tensors and plain values and loaded back into a freshly initialised state;
* :func:`train_cross_domain`: the family's :class:`~fedlib.engine.trainer.Schedule` (select on
  the **mean validation** HR@10 with patience, and the audit: the evaluation with the best mean
  **test** HR@10, the FedPCL-CDR code's rule; test numbers at every evaluation);
* :class:`CrossDomainConfig`: the settings every method's config shares, each default written
  once (size, learning rate, the schedule's patience, evaluation interval and selection split, seed);
* :func:`train_with`: every method's train function in one call (build the algorithm on a device,
  :func:`train_cross_domain`, the method's :class:`RunSummary`, :func:`finish_run`);
* :func:`finish_run`: what every train function returns, the trainer's
  :class:`~fedlib.engine.trainer.RunResult` labelled with the method and carrying the family's
  ``artifacts`` (domains, config, seconds, scalars, models); its numbers in the family's layout
  are plain functions of it: :func:`selected_blocks` and :func:`audit_blocks` (``{domain:
  {"valid/HR@10", "test/HR@10", ...}}``), :func:`history_rows` (the curves), :func:`flat_metrics`
  (one flat record).

Example (any method)::

    return train_with(lambda device: MyMethod(split, config, device), config, method="MyMethod",
                      rounds=config.epochs, summarise=lambda algorithm, run: RunSummary(scalars={...}, models={...}))
"""
from __future__ import annotations

import copy
import dataclasses
import math
import time
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np
import torch

from fedlib.baselines.config_checks import check_positive_ints, check_seed
from fedlib.engine.algorithm import RoundContext
from fedlib.engine.trainer import RunResult, Schedule, train
from fedlib.metrics.scorer import PairScorer, evaluate_both, evaluate_scorer

__all__ = ["PairScorer", "evaluate_scorer", "evaluate_both", "CrossDomainConfig", "CrossDomainAlgorithm", "finish_run",
           "selected_blocks", "audit_blocks", "history_rows", "flat_metrics", "history_row",
           "train_cross_domain", "cdr_schedule", "checkpoint_config_of", "JointModelState", "SELECTION_METRIC",
           "check_positive_ints", "check_training_loop", "Progress", "train_with", "RunSummary"]

SELECTION_METRIC = "HR@10"
ROLES = ("valid", "test")

#: ``progress(round, history_row)``, called after every evaluation (see :func:`train_cross_domain`).
Progress = Optional[Callable[[int, Dict[str, float]], None]]


def check_training_loop(config: Any, positive_ints: Sequence[str] = ()) -> None:
    """The settings every cross-domain method's config shares, checked once for all of them.

    ``dim``, ``patience``, ``eval_every`` and (when present) ``epochs``, ``rounds``,
    ``batch_size``, ``train_negatives`` must be integers >= 1, plus ``positive_ints``; ``lr``
    a finite number > 0; ``weight_decay`` (when present) >= 0; ``select_on`` "valid" or
    "test"; ``seed`` an integer >= 0. Errors name the config class and field.
    """
    name = type(config).__name__
    optional = [f for f in ("epochs", "rounds", "batch_size", "train_negatives") if hasattr(config, f)]
    check_positive_ints(config, ["dim", "patience", "eval_every", *optional, *positive_ints])
    lr = config.lr
    if isinstance(lr, bool) or not isinstance(lr, (int, float)) or not math.isfinite(lr) or lr <= 0:
        raise ValueError(f"{name}.lr must be a finite number > 0 (the Adam step, e.g. 1e-3), got {lr!r}")
    decay = getattr(config, "weight_decay", 0.0)
    if not (math.isfinite(decay) and decay >= 0):
        raise ValueError(f"{name}.weight_decay must be a finite number >= 0, got {decay!r}")
    if config.select_on not in ("valid", "test"):
        raise ValueError(f"{name}.select_on must be 'valid' (our rule) or 'test' (the audit of selecting on the "
                         f"test set), got {config.select_on!r}")
    check_seed(config)


# --------------------------------------------------------------------------------------
# The result: the trainer's RunResult, and the family's layouts of its numbers
# --------------------------------------------------------------------------------------
def _domain_blocks(metrics: Optional[Mapping[str, float]], domains: Sequence[str]) -> Dict[str, Dict[str, float]]:
    """``{"valid/<d>/HR@10": ...}`` (the trainer's keys) → ``{d: {"valid/HR@10": ..., "test/HR@10": ...}}``."""
    if not metrics:
        return {}
    blocks: Dict[str, Dict[str, float]] = {}
    for domain in domains:
        block: Dict[str, float] = {}
        for role in ROLES:
            prefix = f"{role}/{domain}/"
            block.update({f"{role}/{key[len(prefix):]}": value for key, value in metrics.items()
                          if key.startswith(prefix)})
        blocks[domain] = block
    return blocks


def history_row(record: Mapping[str, Any], domains: Sequence[str]) -> Dict[str, Any]:
    """One evaluated round of the trainer's history in the family's layout.

    ``round``, what the round logged (losses, bytes, ``seconds``; not the trainer's
    ``train_loss``), ``"<domain>/<role>/<metric>"`` domain by domain (valid then test), and
    the means ``"valid/HR@10"`` and ``"test/HR@10"`` over the domains.
    """
    row: Dict[str, Any] = {"round": record["round"]}
    row.update({key: value for key, value in record.items()
                if key not in ("round", "train_loss") and not key.startswith(("valid/", "test/"))})
    for domain, block in _domain_blocks(record, domains).items():
        row.update({f"{domain}/{key}": value for key, value in block.items()})
    row.update({f"{role}/{SELECTION_METRIC}": record[f"{role}/{SELECTION_METRIC}"] for role in ROLES})
    return row


def finish_run(run: RunResult, method: str, config: Any, domains: Sequence[str], *, seconds: float,
               scalars: Optional[Mapping[str, float]] = None, models: Optional[Mapping[str, Any]] = None,
               artifacts: Optional[Mapping[str, Any]] = None) -> RunResult:
    """Label a finished run of :func:`train_cross_domain` and fill the family's artifacts; returns ``run``.

    Every method's train function ends with it, so every cross-domain run carries
    ``run.method = method`` and these ``run.artifacts`` (besides the method's own keys,
    documented by its train function):

    * ``"domains"``: the domain names, in the order of the metrics' keys (``split.domains``);
    * ``"config"``: the method's config;
    * ``"seconds"``: wall seconds of the train function in this process (building the method
      and training; ``run.wall_seconds`` counts the rounds only);
    * ``"scalars"``: method-specific numbers recorded with the metrics (rounds run, privacy
      budget, bytes, ...; :func:`flat_metrics`);
    * ``"models"``: the final trained models by domain (one joint model under every name for
      the joint methods).

    Raises ``RuntimeError`` when the run recorded no evaluation (nothing to select), and
    ``ValueError`` when a method's own artifact takes one of the family's keys.
    """
    if not _evaluated(run):
        raise RuntimeError("the run recorded no evaluation; train with evaluate=True and at least one round")
    family = {"domains": tuple(domains), "config": config, "seconds": float(seconds),
              "scalars": dict(scalars or {}), "models": dict(models or {})}
    own = dict(artifacts or {})
    clash = sorted(set(own) & set(family))
    if clash:
        raise ValueError(f"artifacts {clash} are the family's own keys (finish_run sets them); rename the method's")
    run.method, run.artifacts = method, {**family, **own}
    return run


def _evaluated(run: RunResult) -> List[Mapping[str, Any]]:
    return [record for record in run.history if f"valid/{SELECTION_METRIC}" in record]


def _domains_of(run: RunResult) -> Tuple[str, ...]:
    if "domains" not in run.artifacts:
        raise ValueError("run.artifacts has no 'domains': pass the RunResult of a cross-domain train function "
                         "(finish_run fills it), or set run.artifacts['domains'] to the split's domain names")
    return tuple(run.artifacts["domains"])


def selected_blocks(run: RunResult) -> Dict[str, Dict[str, float]]:
    """``{domain: {"valid/HR@10", "test/HR@10", "test/NDCG@10", ...}}`` of the selected evaluation
    (best mean validation HR@10, or test when the method was asked to select on test; round
    :attr:`~fedlib.engine.trainer.RunResult.best_round`); ``{}`` before any evaluation."""
    return _domain_blocks(run.selected_evaluation, _domains_of(run))


def audit_blocks(run: RunResult) -> Dict[str, Dict[str, float]]:
    """The same blocks at the audit's evaluation: the best mean **test** HR@10 (the FedPCL-CDR
    code's rule; round :attr:`~fedlib.engine.trainer.RunResult.audit_round`)."""
    return _domain_blocks(run.audit_evaluation, _domains_of(run))


def history_rows(run: RunResult) -> List[Dict[str, Any]]:
    """One :func:`history_row` per evaluated round: ``round``, what the method logged (losses,
    bytes, ``seconds``), ``"<domain>/<role>/<metric>"`` and the means ``"valid/HR@10"``, ``"test/HR@10"``."""
    domains = _domains_of(run)
    return [history_row(record, domains) for record in _evaluated(run)]


def flat_metrics(run: RunResult) -> Dict[str, float]:
    """A finished run's numbers as one flat record (the grid's and the lesson's ``metrics``).

    ``"<domain>/<role>/<metric>"`` of :func:`selected_blocks`, ``"test_selected/<domain>/<role>/<metric>"``
    of :func:`audit_blocks`, ``selected_round`` and ``test_selected_round`` (1-based; 0 without
    one), ``seconds`` (``artifacts["seconds"]``) and the method's ``artifacts["scalars"]``.
    """
    out: Dict[str, float] = {}
    for prefix, blocks in (("", selected_blocks(run)), ("test_selected/", audit_blocks(run))):
        for domain, values in blocks.items():
            out.update({f"{prefix}{domain}/{key}": float(value) for key, value in values.items()})
    out.update({"selected_round": float(run.best_round or 0), "test_selected_round": float(run.audit_round or 0),
                "seconds": float(run.artifacts["seconds"])})
    out.update({key: float(value) for key, value in run.artifacts["scalars"].items()})
    return out


@dataclass(frozen=True)
class CrossDomainConfig:
    """What every cross-domain method's config shares, each default written once.

    The methods' configs derive from it and override a default only where the method's
    paper or code differs (FedNCF evaluates every 10 rounds). The FedPCL-CDR comparison trains
    every method at this size and step size unless its tuning selected another rate.

    Attributes:
        dim: embedding size ``d`` (64: FedPCL-CDR's public code, §5.1).
        lr: Adam's step size.
        patience: evaluations without a better mean validation HR@10 before stopping.
        eval_every: rounds (epochs) between evaluations.
        select_on: ``"valid"`` (ours) or ``"test"`` (the audit of the code's rule).
        seed: the run's only source of randomness.
    """

    dim: int = 64
    lr: float = 1e-3
    patience: int = 10
    eval_every: int = 1
    select_on: str = "valid"
    seed: int = 0


# --------------------------------------------------------------------------------------
# The algorithm side: evaluation and a checkpointable state of live objects
# --------------------------------------------------------------------------------------
def _export(value):
    """Tensors and plain values of one field of a live state (what a checkpoint stores)."""
    if isinstance(value, torch.nn.Module):
        # parameters and buffers, plus the dense tensors and flags a model keeps as plain
        # attributes (received messages, prototypes, assignments); sparse graphs are static
        attributes = {}
        for name, module in value.named_modules():
            for key, item in vars(module).items():
                if key.startswith("_") or key == "training":
                    continue
                if (isinstance(item, torch.Tensor) and item.layout == torch.strided) or \
                        isinstance(item, (bool, int, float)):
                    attributes[f"{name}:{key}"] = item
        return {"module": value.state_dict(), "attributes": attributes}
    if isinstance(value, torch.optim.Optimizer):
        return value.state_dict()
    if isinstance(value, np.random.Generator):
        return value.bit_generator.state
    if isinstance(value, torch.Generator):
        return value.get_state()
    if isinstance(value, dict):
        return {key: _export(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_export(item) for item in value]
    if value is None or isinstance(value, (bool, int, float, str, torch.Tensor)):
        return value
    if dataclasses.is_dataclass(value):
        return {f.name: _export(getattr(value, f.name)) for f in dataclasses.fields(value)}
    raise TypeError(f"cannot checkpoint a {type(value).__name__} in a cross-domain state; hold it as tensors, "
                    f"plain values, modules, optimisers or generators")


def _import(fresh, saved):
    """Load ``saved`` (from :func:`_export`) into ``fresh`` (the same field of a freshly initialised state)."""
    if isinstance(fresh, torch.nn.Module):
        fresh.load_state_dict(saved["module"])
        modules = dict(fresh.named_modules())
        for key, item in saved["attributes"].items():
            name, attribute = key.split(":", 1)
            setattr(modules[name], attribute, item)
        return fresh
    if isinstance(fresh, torch.optim.Optimizer):
        fresh.load_state_dict(saved)
        return fresh
    if isinstance(fresh, np.random.Generator):
        fresh.bit_generator.state = saved
        return fresh
    if isinstance(fresh, torch.Generator):
        fresh.set_state(saved)
        return fresh
    if isinstance(fresh, dict):
        return {key: _import(fresh.get(key), item) for key, item in saved.items()}
    if isinstance(fresh, (list, tuple)) and len(fresh) == len(saved):
        return type(fresh)(_import(f, s) for f, s in zip(fresh, saved))
    if dataclasses.is_dataclass(fresh) and not isinstance(fresh, type):
        return dataclasses.replace(fresh, **{key: _import(getattr(fresh, key), item) for key, item in saved.items()})
    return saved


@dataclass
class JointModelState:
    """The live state of a method with one model over all domains (GA-DTCDR, NMCDR, CL-DTCDR):
    the model, its Adam and the epoch generator (batch order, negatives, augmentations)."""

    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    rng: np.random.Generator


class CrossDomainAlgorithm:
    """The family's side of the :class:`~fedlib.engine.algorithm.Algorithm` protocol.

    A subclass sets ``self.split`` (the :class:`~fedlib.data.splits.DomainSplit`), ``self.seed``,
    ``self.device`` and ``self.ks`` and implements ``init(seed)`` (a dataclass state of live
    models, optimisers and generators), ``run_round(state, plan, context)`` (one epoch or
    round, mutating the live objects and returning the state) and ``scorers(state) ->
    {domain: PairScorer}``. The epoch's randomness comes from the generators held in the
    state (so a checkpoint captures it), drawn in the order of the paper's code; the
    trainer's ``context.rng`` is not used, and ``plan_round`` returns the round index.
    """

    split: Any
    seed: int
    device: torch.device
    ks: Sequence[int] = (5, 10)

    def plan_round(self, state, context: RoundContext) -> int:
        return context.index

    def scorers(self, state) -> Dict[str, PairScorer]:
        raise NotImplementedError

    def evaluate(self, state, split: str) -> Dict[str, float]:
        """``{"<domain>/HR@10": ..., ..., "HR@10": mean over domains}`` on ``split`` (``"valid"`` or ``"test"``)."""
        return self.evaluate_splits(state, (split,))[split]

    def evaluate_splits(self, state, splits: Sequence[str]) -> Dict[str, Dict[str, float]]:
        """``{split: evaluate(state, split)}`` from one call of :meth:`scorers`.

        The scorers hold the model's embeddings (a graph propagation for LightGCN, NMCDR,
        CL-DTCDR, FedPCL-CDR), so validation and test share one embedding pass; the numbers
        are those of :meth:`evaluate` per split (the pass is deterministic, in eval mode).
        """
        with torch.no_grad():
            scorers = self.scorers(state)
            scored: Dict[str, Dict[str, float]] = {}
            for split in splits:
                metrics: Dict[str, float] = {}
                for domain in self.split.domains:
                    values = evaluate_scorer(scorers[domain], self.split[domain], split, self.ks, self.device)
                    metrics.update({f"{domain}/{key}": value for key, value in values.items()})
                metrics[SELECTION_METRIC] = float(np.mean([metrics[f"{d}/{SELECTION_METRIC}"]
                                                           for d in self.split.domains]))
                scored[split] = metrics
        return scored

    def state_dict(self, state) -> Dict[str, Any]:
        return {f.name: _export(getattr(state, f.name)) for f in dataclasses.fields(state)}

    def load_state(self, saved: Mapping[str, Any]):
        fresh = self.init(self.seed)
        return dataclasses.replace(fresh, **{key: _import(getattr(fresh, key), item) for key, item in saved.items()})

    def copy_state(self, state):
        """A copy through :meth:`state_dict` into a freshly initialised state (later rounds leave it unchanged)."""
        return self.load_state(copy.deepcopy(self.state_dict(state)))


def cdr_schedule(config: Any, rounds: int, select_on: Optional[str] = None) -> Schedule:
    """The family's schedule: evaluate valid and test every ``config.eval_every`` rounds, select on
    mean HR@10 (``config.select_on``: validation, or test for the audit cells), stop after
    ``config.patience`` evaluations without improvement, keep the best-on-test evaluation as the audit."""
    return Schedule(rounds=int(rounds), eval_every=int(config.eval_every), patience=int(config.patience),
                    selection_metric=SELECTION_METRIC, test_at_end=False, keep_best_state=False,
                    test_every_evaluation=True, audit_metric=SELECTION_METRIC,
                    select_on=config.select_on if select_on is None else select_on)


def checkpoint_config_of(config: Any) -> Dict[str, Any]:
    """A dataclass config as plain values, named by its class (a checkpoint made under another one is refused)."""
    plain = {k: (list(v) if isinstance(v, tuple) else v) for k, v in dataclasses.asdict(config).items()}
    return {"config_class": type(config).__name__, **plain}


def train_cross_domain(algorithm: CrossDomainAlgorithm, config: Any, *, rounds: int, progress: Progress = None,
                       select_on: Optional[str] = None, checkpointer=None,
                       checkpoint_config: Optional[Mapping[str, Any]] = None,
                       on_round_end: Optional[Callable[[RunResult, Dict[str, float]], None]] = None) -> RunResult:
    """Train ``algorithm`` with :func:`cdr_schedule` through the one trainer.

    Every evaluated history record gets ``seconds`` (wall time since this call began, after
    the evaluation), and ``progress(round, history_row)`` is called with its
    :func:`history_row`. ``on_round_end(run, record)`` is called after each round (tests stop
    a run with it). ``checkpointer``/``checkpoint_config``: as :func:`fedlib.engine.train`.
    """
    start = time.perf_counter()
    domains = list(algorithm.split.domains)

    def after_round(run: RunResult, record: Dict[str, float]) -> None:
        if f"valid/{SELECTION_METRIC}" in record:
            earlier = checkpointer.earlier_seconds if checkpointer is not None else 0.0  # a resumed run's past
            record["seconds"] = earlier + time.perf_counter() - start
            if progress is not None:
                progress(record["round"], history_row(record, domains))
        if on_round_end is not None:
            on_round_end(run, record)

    return train(algorithm, cdr_schedule(config, rounds, select_on), seed=algorithm.seed, checkpointer=checkpointer,
                 checkpoint_config=checkpoint_config, on_round_end=after_round)


def _resolve_device(device) -> torch.device:
    """``torch.device(device)``, the CPU when ``device`` is ``None``."""
    return torch.device(device) if device is not None else torch.device("cpu")


@dataclass
class RunSummary:
    """What a method adds to a finished run (:func:`finish_run`'s ``scalars``, ``models`` and own ``artifacts``)."""

    scalars: Mapping[str, float]
    models: Mapping[str, Any]
    artifacts: Mapping[str, Any] = dataclasses.field(default_factory=dict)


def train_with(build: Callable[[torch.device], CrossDomainAlgorithm], config: Any, *, method: str, rounds: int,
               summarise: Callable[[Any, RunResult], RunSummary], device=None, progress: Progress = None,
               checkpointer=None, checkpoint_config: Callable[[Any], Mapping[str, Any]] = checkpoint_config_of,
               select_on: Optional[str] = None,
               on_round_end: Optional[Callable[[RunResult, Dict[str, float]], None]] = None) -> RunResult:
    """Every cross-domain train function: build the algorithm, :func:`train_cross_domain`, :func:`finish_run`.

    Args:
        build: ``build(device) -> algorithm`` (the method's :class:`CrossDomainAlgorithm` on its split).
        config: the method's config (its schedule settings: ``patience``, ``eval_every``, ``select_on``).
        method: the run's label (``run.method``), e.g. ``"NMCDR"``.
        rounds: the most rounds (epochs) to train.
        summarise: ``summarise(algorithm, run) -> RunSummary``, the method's scalars, models and own
            artifacts, read from the trained algorithm and ``run.state``.
        device: torch device of the method's tensors (CPU by default).
        progress: called as ``progress(round, history_row)`` after every evaluation.
        checkpointer: a :class:`~fedlib.engine.checkpoint.Checkpointer` to save the run to and resume
            it from (a resumed run equals an uninterrupted one).
        checkpoint_config: ``config -> plain values`` stored with a checkpoint (one made under other
            values is refused); called only with a ``checkpointer``.
        select_on: overrides ``config.select_on`` (``"valid"`` or ``"test"``).
        on_round_end: ``callback(run, record)`` after every round (the trainer's; tests stop a run with it).

    Returns:
        The trainer's :class:`~fedlib.engine.trainer.RunResult` with the family's artifacts
        (:func:`finish_run`; ``seconds`` counts building the algorithm, training and ``summarise``)
        and the method's own.
    """
    start = time.perf_counter()
    algorithm = build(_resolve_device(device))
    run = train_cross_domain(algorithm, config, rounds=rounds, progress=progress, select_on=select_on,
                             checkpointer=checkpointer,
                             checkpoint_config=None if checkpointer is None else checkpoint_config(config),
                             on_round_end=on_round_end)
    summary = summarise(algorithm, run)
    return finish_run(run, method, config, algorithm.split.domains, seconds=time.perf_counter() - start,
                      scalars=summary.scalars, models=summary.models, artifacts=summary.artifacts)
