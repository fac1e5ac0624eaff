"""F3CRec (Lim et al., "Federated Continual Recommendation", CIKM 2025, arXiv:2508.04792): the whole paper.

Files in reading order. The method is the first file (with the continual framework it plugs
into); the rest is the experiment.

1. ``method.py``: the method. The client side (Eqs. 1–6: top-N memory, preference shift,
   adaptive replay memory, the KD loss) and the server side (Eqs. 7–13: item-wise temporal
   mean) as pure functions; the plumbing that adds the replay items to the round plan
   (``augment_plan_with_replay``) and the client loss that reads them
   (:class:`~fedlib.papers.f3crec.method.ReplayDistillationLoss`); the continual methods
   :class:`~fedlib.papers.f3crec.method.F3CRec` (with its ablation flags) and the KD and Reg
   baselines of §5.1 (``kd_baseline``, ``ParameterRegularisation``).
2. ``experiment.py``: the experiment as data and one entry point: the cell configuration read
   from ``spec.toml``, the backbones and methods of a cell, the cached block-0 model,
   ``run_cell``, the grid's parts and the grid command (``python -m fedlib grid f3crec <parts>``).
3. ``spec.toml``: the grid's parts (datasets × backbones × methods × sweeps), every default once
   with its justification, the hyperparameters chosen on validation, and the tables' layouts.
4. ``tables.py``, ``figures.py``: the paper's Tables 1–8 and Figures 3–4 from the recorded runs.

The path from the notebook to the training step (three files):
``notebooks/02_f3crec.py`` -> ``experiment.run_live`` / ``experiment.run_cell`` (builds
``make_method(config, num_items)``, i.e. ``method.F3CRec(...)``, and calls
:func:`fedlib.baselines.continual.continual.run_continual`) -> ``method.py`` (``F3CRec.make_method`` puts
``ReplayDistillationLoss`` and ``item_temporal_mean_mix`` on the backbone's
:class:`~fedlib.engine.FederatedMethod`; ``after_block`` keeps the top-N memory) ->
``fedlib/baselines/continual/continual.py`` (``run_continual``: block by block, the
``PlanAugmentingExecutor``) -> the engine's training step (``fedlib.engine.run_federated``).

Why this cut. The method is one file under the 800-line bound, read top to bottom: client
equations, server equations, plumbing, methods. The continual framework
(:mod:`fedlib.baselines.continual.continual`: blocks, backbones, FT, ``run_continual``) stays below the
papers because the baselines RLP2 and SPP (:mod:`fedlib.baselines.continual.rlp2`,
:mod:`fedlib.baselines.continual.spp`) run on it too; so does the rank count of a few items among all
items (:func:`fedlib.baselines.continual.continual.student_ranks`), which F3CRec's Eq. 2 and SPP's
ranking discrepancy share. The F3CRec data protocol (chronological blocks) stays in
:mod:`fedlib.data.protocols.f3crec`: the protocol registry and the data statistics read it,
and the data layer may not import the papers.
"""

from fedlib.papers.f3crec import method as _registers  # noqa: E402,F401  registers the method by name
