"""FedRKG (Lim et al., "Federated Recommendation with Knowledge Guidance", arXiv:2511.12959): the whole paper.

Files in reading order. The method is the first three; the rest is the experiment.

1. ``guidance.py``: what is guided and how. The guided backbones (FedMF, FedNCF, PFedRec with
   a personal item table ``P_u`` in place of the shared ``Q``; §6.3, Table 3) and the guidance
   equations as pure functions: Knowledge Guidance (Eq. 3, Proposition 1), the gate (Eqs.
   4–5) and Adaptive Guidance (Eqs. 6, 9), with the ablation modes of Table 2.
2. ``gates.py``: the nested gate training (Eqs. 6–8): SGD on each client's gate with
   everything else frozen, a closed-form fast path for FedMF's head and a generic path for
   any guided backbone, each with its per-user reference.
3. ``method.py``: the method in the engine's rounds. The local recipe of a guided backbone
   (``guided_method``), :class:`~fedlib.papers.fedrkg.method.KnowledgeGuidance` (Algorithm 1's
   schedule; ``attach`` puts its ``before_round`` hook on the method, ``guide`` runs one
   guidance step) and §5.1's memory counts.
4. ``spec.toml`` and ``experiment.py``: the experiment as data and one entry point. The spec
   holds every default of a cell once with its justification (datasets, methods, samplers),
   the grid's parts (cells per table and figure) and the tables' layouts; ``experiment.py``
   builds a cell from it (``cell``), trains it (``run_cell``) and runs the grid command
   (``python -m fedlib grid fedrkg <parts>``).
5. ``measures.py``: what ``run_cell`` records besides training (validation selection with
   the test at every evaluation, the centralised baselines, the guidance probe, LDP ε) and
   §5.1's per-method memory table.
6. ``tables.py``, ``figures.py``: the paper's tables and figures from the recorded runs.

The path from the notebook to the training step (three files):
``notebooks/01_fedrkg.py`` -> ``experiment.run_cells`` / ``experiment.run_cell``
(``make_federated`` asks the method registry for FedRKG) -> ``method.py`` (``build_fedrkg``
builds ``guided_method(guidance.guided_backbone(...))`` with ``KnowledgeGuidance(...).attach(...)``;
before each guidance round the trainer hands ``KnowledgeGuidance.before_round_hook`` the round's
plan -> ``guide``, calling ``gates.py`` and ``guidance.py``) -> the engine's training step
(``fedlib.engine.run_federated``).

Why this cut. The method is about 1,700 lines, so it needs three files under the 800-line
bound; each file is one layer of the method and imports only the ones before it (guidance
<- gates <- method), so the three read top to bottom. The guided backbones live here
because only FedRKG trains them (its Table 3; no baseline uses them). The FedRKG data
protocol stays in :mod:`fedlib.data.protocols.fedrkg`: the protocol registry and the leak
audit (``fedlib.metrics``) read it, and the data layer may not import the papers. What
other methods share with FedRKG lives below the papers: ``P_g`` is
:func:`fedlib.engine.knowledge.global_knowledge` and the replay of a round's participants
:func:`fedlib.engine.plan.guidance_participants` (both used by CoFedRec too).
"""

from fedlib.papers.fedrkg import method as _registers  # noqa: E402,F401  registers the method by name
