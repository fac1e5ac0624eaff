"""The trainer: the one loop over rounds, for every algorithm of the course.

::

    state ← algorithm.init(seed)                       (or the checkpoint's, or a given start)
    for t = 0, 1, …, rounds − 1:
        plan          ← algorithm.plan_round(state, t)            every random choice of round t
        [algorithm.before_round(run, t, plan)]                    optional server work that reads the run
        state, report ← algorithm.run_round(state, plan, t)       Algorithm 1 of the paper
        every eval_every rounds (and after the last):
            metrics ← algorithm.evaluate(state, "valid")          [and "test", for the audit]
            selection.update(t + 1, metrics)                      keep the best, count patience
        save a checkpoint when due; stop when patience has run out
    test ← algorithm.evaluate(best state, "test")

The trainer owns the schedule, the evaluation, validation selection and early stopping
(:class:`~fedlib.engine.selection.Selection`), checkpoints (resume = uninterrupted: round
``t`` always draws from ``round_generator(seed, t)``), the communication ledger and the
:class:`RunResult`. An algorithm owns no loop over rounds.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Generic, List, Mapping, Optional, TypeVar

from fedlib.engine.algorithm import Algorithm, RoundContext
from fedlib.engine.plan import round_generator
from fedlib.engine.selection import Selection

__all__ = ["Schedule", "RunResult", "train", "start_run"]

StateT = TypeVar("StateT")


@dataclass(frozen=True)
class Schedule:
    """When to evaluate, what to select on, when to stop.

    Attributes:
        rounds: communication rounds (an upper bound with early stopping).
        eval_every: evaluate on validation every k rounds (and after the last round).
        patience: stop after this many evaluations without improvement (``None`` = never).
        selection_metric: the validation metric to maximise (e.g. ``"NDCG@20"``, without the
            ``valid/`` prefix).
        prefer_later_ties: on equal validation scores keep the later round (FedRKG's ``>=``)
            instead of the first (F3CRec).
        test_at_end: evaluate the selected state on the test set when the run ends.
        keep_best_state: keep a copy of the best-on-validation state and test it (else the
            last state is tested).
        test_every_evaluation: also score the test set at every evaluation, so the selected
            evaluation carries its own test numbers (and the audit below can run).
        audit_metric: with ``test_every_evaluation``, also keep the evaluation with the best
            *test* value of this metric (the audit of selecting on the test set); never stops
            the run.
        select_on: ``"valid"`` (our rule), or ``"test"`` to reproduce a paper's code that
            selects (and stops) on the test set; needs ``test_every_evaluation``.
    """

    rounds: int
    eval_every: int = 1
    patience: Optional[int] = None
    selection_metric: str = "NDCG@20"
    prefer_later_ties: bool = False
    test_at_end: bool = True
    keep_best_state: bool = True
    test_every_evaluation: bool = False
    audit_metric: Optional[str] = None
    select_on: str = "valid"

    def __post_init__(self):
        for name in ("rounds", "eval_every"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < (0 if name == "rounds" else 1):
                bound = ">= 0" if name == "rounds" else ">= 1"
                raise ValueError(f"Schedule.{name} must be an integer {bound}, got {value!r}")
        if self.select_on not in ("valid", "test"):
            raise ValueError(f"Schedule.select_on must be 'valid' or 'test', got {self.select_on!r}")
        if self.select_on == "test" and not self.test_every_evaluation:
            raise ValueError("Schedule.select_on='test' needs test_every_evaluation=True (test numbers are computed "
                             "at every evaluation only then)")
        if self.audit_metric is not None and not self.test_every_evaluation:
            raise ValueError("Schedule.audit_metric needs test_every_evaluation=True (the audit selects on test "
                             "numbers, which are only computed at every evaluation then)")

    def evaluates_after(self, completed_rounds: int) -> bool:
        """Whether an evaluation follows the round that brought the run to ``completed_rounds``."""
        return completed_rounds % self.eval_every == 0 or completed_rounds == self.rounds


@dataclass
class RunResult(Generic[StateT]):
    """A run so far (what a checkpoint stores) or finished (what :func:`train` returns).

    Attributes:
        state: the algorithm's state after ``round_index`` rounds.
        round_index: completed rounds (the next round to run).
        history: one row per completed round: ``round`` (1-based), ``train_loss``, what the
            round logged, and ``valid/<metric>`` (``test/<metric>``) when evaluated.
        selection: the validation selection (best round, score, metrics, patience).
        audit: the selection on test (``Schedule.audit_metric``), else ``None``.
        best_state: a copy of the state at ``selection.best_round`` (``keep_best_state``).
        test_metrics: the test metrics of the selected (or last) state, once the run ended.
        stopped_early: the run ended before ``rounds`` (patience, or a callback stopped it).
        wall_seconds: wall time of the rounds run by this process (earlier sessions of a
            resumed run: :attr:`~fedlib.engine.checkpoint.Checkpointer.earlier_seconds`).
        method: the method's name as its family labels it (e.g. ``"FedCSR"``,
            ``"FedProx-TiSASRec"``); set by the family's entry point, ``None`` from :func:`train`.
        artifacts: what the family hands out besides the numbers (e.g. ``"models"``, the
            selected networks; ``"graphs"``; ``"config"``); the family's entry point fills it
            and documents its keys. Neither ``method`` nor ``artifacts`` is checkpointed: the
            entry point rebuilds them after a resumed run, so a checkpoint holds only the run.

    The selection's and the audit's evaluations are read through the properties below, the
    same for every family; a family's own layout of them (per-domain blocks, history curves)
    is a plain function of a ``RunResult`` in the family's module.
    """

    state: StateT
    selection: Selection
    round_index: int = 0
    history: List[Dict[str, float]] = field(default_factory=list)
    audit: Optional[Selection] = None
    best_state: Optional[StateT] = None
    test_metrics: Optional[Dict[str, float]] = None
    stopped_early: bool = False
    wall_seconds: float = 0.0
    method: Optional[str] = None
    artifacts: Dict[str, Any] = field(default_factory=dict, repr=False)

    @property
    def best_round(self) -> Optional[int]:
        """The 1-based round of the selected evaluation (``None`` before any evaluation)."""
        return self.selection.best_round

    @property
    def best_score(self) -> Optional[float]:
        return self.selection.best_score

    @property
    def best_metrics(self) -> Optional[Dict[str, float]]:
        """The validation metrics of the selected evaluation (without the ``valid/`` prefix)."""
        if self.selection.best_metrics is None:
            return None
        return {k[len("valid/"):]: v for k, v in self.selection.best_metrics.items() if k.startswith("valid/")}

    @property
    def selected_test_metrics(self) -> Optional[Dict[str, float]]:
        """With ``test_every_evaluation``: the test metrics *at* the selected evaluation."""
        if self.selection.best_metrics is None:
            return None
        return {k[len("test/"):]: v for k, v in self.selection.best_metrics.items() if k.startswith("test/")} or None

    @property
    def selected_evaluation(self) -> Optional[Dict[str, float]]:
        """Every metric of the selected evaluation as recorded: ``valid/<metric>`` and, with
        ``test_every_evaluation``, ``test/<metric>`` (``None`` before any evaluation)."""
        return self.selection.best_metrics

    @property
    def audit_round(self) -> Optional[int]:
        """The 1-based round of the audit's evaluation (best test ``audit_metric``); ``None``
        without an audit or before any evaluation."""
        return None if self.audit is None else self.audit.best_round

    @property
    def audit_evaluation(self) -> Optional[Dict[str, float]]:
        """Every metric of the audit's evaluation as recorded (``valid/...`` and ``test/...``);
        ``None`` without an audit or before any evaluation."""
        return None if self.audit is None else self.audit.best_metrics

    @property
    def selected_state(self) -> StateT:
        """The selected state: the kept best state (``keep_best_state``), else the last one."""
        return self.best_state if self.best_state is not None else self.state


def _new_selection(schedule: Schedule) -> Selection:
    return Selection(f"{schedule.select_on}/{schedule.selection_metric}", schedule.patience,
                     schedule.prefer_later_ties)


def _new_audit(schedule: Schedule) -> Optional[Selection]:
    return None if schedule.audit_metric is None else Selection(f"test/{schedule.audit_metric}")


def start_run(algorithm: Algorithm, schedule: Schedule, seed: int, state=None, round_index: int = 0) -> RunResult:
    """A fresh run: ``state`` (default ``algorithm.init(seed)``) after ``round_index`` rounds, empty bookkeeping.

    Pass it as :func:`train`'s ``start`` to train a state prepared by hand (e.g. a module's own
    parameters, trained in place).
    """
    return RunResult(state=algorithm.init(seed) if state is None else state, selection=_new_selection(schedule),
                     audit=_new_audit(schedule), round_index=int(round_index))


def _snapshot(algorithm: Algorithm, run: RunResult) -> Dict[str, Any]:
    return {"round_index": run.round_index, "state": algorithm.state_dict(run.state),
            "best_state": None if run.best_state is None else algorithm.state_dict(run.best_state),
            "history": run.history, "selection": run.selection.state_dict(),
            "audit": None if run.audit is None else run.audit.state_dict(),
            "test_metrics": run.test_metrics, "stopped_early": run.stopped_early}


def _restore(algorithm: Algorithm, schedule: Schedule, saved: Mapping[str, Any]) -> RunResult:
    selection, audit = _new_selection(schedule), _new_audit(schedule)
    selection.load_state_dict(saved["selection"])
    if audit is not None:
        if saved.get("audit") is None:
            raise ValueError("the checkpoint holds no audit selection but the schedule asks for one; "
                             "delete it to start the run afresh")
        audit.load_state_dict(saved["audit"])
    run = RunResult(state=algorithm.load_state(saved["state"]), selection=selection, audit=audit,
                    round_index=int(saved["round_index"]), history=list(saved["history"]),
                    best_state=None if saved["best_state"] is None else algorithm.load_state(saved["best_state"]),
                    test_metrics=saved["test_metrics"], stopped_early=bool(saved["stopped_early"]))
    if run.round_index < schedule.rounds and not run.stopped_early:
        run.test_metrics = None  # an extended run is tested again when it ends
    return run


def train(algorithm: Algorithm, schedule: Schedule, *, seed: int, start: Optional[RunResult] = None,
          checkpointer=None, checkpoint_config: Optional[Mapping[str, Any]] = None, ledger=None,
          on_round_end: Optional[Callable[[RunResult, Dict[str, float]], None]] = None,
          evaluate: bool = True) -> RunResult:
    """Train ``algorithm`` for ``schedule.rounds`` rounds (see the module docstring).

    Args:
        seed: the run's only source of randomness (``init`` and every round plan).
        start: continue this run (e.g. a previous block's, or a state prepared by hand);
            else resume from ``checkpointer`` when it holds a checkpoint, else start fresh.
        checkpointer: a :class:`~fedlib.engine.checkpoint.Checkpointer`; the run is saved when
            it is due (every N rounds and/or seconds) and when it ends.
        checkpoint_config: everything the run's numbers depend on, as plain values; a
            checkpoint made under another one is refused. Required with ``checkpointer``.
        ledger: a :class:`~fedlib.engine.communication.CommunicationLedger` for every round's
            messages (only rounds run by this call are charged).
        on_round_end: ``callback(run, record)`` after each round; it may set
            ``run.stopped_early`` (e.g. on a diverged loss) or clear it (to run on past patience).
        evaluate: ``False`` runs the rounds without any evaluation (no selection, no test).

    Returns:
        The :class:`RunResult`.
    """
    if checkpointer is not None and checkpoint_config is None:
        raise ValueError("a checkpointer needs checkpoint_config (the run's settings as plain values) so that a "
                         "checkpoint made under other settings is refused")
    run = start
    if run is None and checkpointer is not None:
        saved = checkpointer.load_snapshot(checkpoint_config)
        run = None if saved is None else _restore(algorithm, schedule, saved)
    if run is None:
        run = start_run(algorithm, schedule, seed)
    before_round = getattr(algorithm, "before_round", None)
    # Optional: score several splits at once (a model whose embeddings are costly computes them once).
    evaluate_splits = getattr(algorithm, "evaluate_splits", None)
    began = time.perf_counter()
    while run.round_index < schedule.rounds and not run.stopped_early:
        t = run.round_index
        context = RoundContext(index=t, seed=seed, rng=round_generator(seed, t), ledger=ledger)
        plan = algorithm.plan_round(run.state, context)                       # who trains, on what
        if before_round is not None:
            before_round(run, t, plan)                                        # server work before the round
        run.state, report = algorithm.run_round(run.state, plan, context)     # one round of Algorithm 1
        run.round_index = t + 1
        record = {"round": run.round_index, "train_loss": float(report.train_loss), **report.logged}
        if evaluate and schedule.evaluates_after(run.round_index):
            splits = ("valid", "test") if schedule.test_every_evaluation else ("valid",)
            scored = (evaluate_splits(run.state, splits) if evaluate_splits is not None
                      else {split: algorithm.evaluate(run.state, split) for split in splits})
            metrics = {f"{split}/{k}": v for split in splits for k, v in scored[split].items()}
            record.update(metrics)
            if run.selection.update(run.round_index, metrics) and schedule.keep_best_state:
                run.best_state = algorithm.copy_state(run.state)
            if run.audit is not None:
                run.audit.update(run.round_index, metrics)
            if run.selection.stopped_early:
                run.stopped_early = True
        run.history.append(record)
        if on_round_end is not None:
            on_round_end(run, record)
        if checkpointer is not None and checkpointer.due(run.round_index,
                                                         run.stopped_early or run.round_index >= schedule.rounds):
            checkpointer.save_snapshot(_snapshot(algorithm, run), checkpoint_config)

    if evaluate and schedule.test_at_end and run.test_metrics is None:
        tested = run.best_state if schedule.keep_best_state and run.best_state is not None else run.state
        run.test_metrics = algorithm.evaluate(tested, "test")
        if checkpointer is not None:
            checkpointer.save_snapshot(_snapshot(algorithm, run), checkpoint_config)
    run.wall_seconds += time.perf_counter() - began
    return run

