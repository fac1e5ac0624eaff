"""FedCSR (Zheng et al., "FedCSR: A Federated Framework for Multi-Platform Cross-Domain Sequential
Recommendation with Dual Contrastive Learning", COLING 2025): the whole paper.

Files in reading order. The method is three files: ``model.py`` and ``training.py`` here and the
sequential interface they build on, :mod:`fedlib.baselines.sequential.sequences`; the rest is the experiment.

1. :mod:`fedlib.baselines.sequential.sequences` (below the papers, shared with the sequential baselines): the
   batches (``make_batch``: left-padded windows of the cross-domain sequence ``s*`` with the
   single-domain rows time-aligned, next-item targets per domain), the item-transition graphs
   and their propagation, the graph-attention encoder ``GAEncoder`` (Eq. 1) and the prediction
   heads of Eqs. 16-17 (``prediction_loss``, ``cross_domain_scores``).
2. ``model.py``: what is FedCSR's own. ``FedCSRConfig`` (the paper's defaults and the ablation
   flags), the augmentation of Eqs. 7-11, the sequence representations of Eq. 2,
   ``FedCSRModel`` (encoder + heads + MCL projector + SCL transform and matchers) and the local
   objective of Eq. 18: ``mcl_loss`` (Eqs. 3-6), ``scl_loss`` (Eqs. 12-15), ``fedcsr_loss``.
   Its docstring states the readings chosen where the paper is ambiguous.
3. ``training.py``: Algorithm 1 as one round of the one trainer. ``FedCSRAlgorithm``
   (``init``, ``run_round``: every platform's local epochs then FedAvg, Eq. 19; ``evaluate``),
   ``FedCSRState`` (weights, optimiser moments and generators, so a checkpoint resumes
   exactly) and the entry points ``train_fedcsr`` and ``train_individual`` (Table 9,
   Figure 4). The evaluation, FedAvg, the platforms' graphs and rows and the schedule are
   shared with the FedProx baselines: :mod:`fedlib.baselines.sequential.sequence_training`.
4. ``experiment.py``: the experiment as data and one entry point: the cell configuration
   (datasets, methods, variants, justified defaults), ``run_cell``, the grid's parts (one list
   of cells per table and figure) and the grid command (``python -m fedlib grid fedcsr <parts>``).
5. ``tables.py``: Tables 1-9 and App. A.5 (paper vs ours) and the tables of ours only, from the
   recorded runs; ``figures.py``: Figures 2, 3, 4 and 6 from those frames.

The path from the notebook to the training step (three files):
``notebooks/05_fedcsr.py`` -> ``experiment.run_cells`` / ``experiment.run_cell`` (builds the
``FedCSRConfig`` and ``FedCSRTrainConfig`` of a cell and calls ``training.train_fedcsr``) ->
``training.py`` (``train_fedcsr`` hands ``FedCSRAlgorithm`` to :func:`fedlib.engine.train`; its
``run_round`` runs each platform's local epochs on ``model.fedcsr_loss``) -> ``model.py``
(``fedcsr_loss``, calling :mod:`fedlib.baselines.sequential.sequences` for the encoder and the heads).

Why this cut. FedCSR's encoder, batches, graphs, heads and evaluation are also what its
baselines use (C2DSR's encoder is FedCSR's ``GAEncoder``; TiSASRec, PiNet, PSJNet, MIFN, CCDR,
CoNet and CLSR take its batches and heads; the FedProx training of
:mod:`fedlib.baselines.sequential.fedcsr_baselines` its evaluation and FedAvg). The baselines sit below the
papers and may not import them, so those pieces live in :mod:`fedlib.baselines.sequential.sequences` and
:mod:`fedlib.baselines.sequential.sequence_training`, and this folder holds what only FedCSR uses. The
FedCSR data protocol stays in :mod:`fedlib.data.protocols.fedcsr` (the protocol registry and the
data layer read it).
"""

from fedlib.papers.fedcsr import training as _registers  # noqa: E402,F401  registers the method by name
