"""FedPCL-CDR (Wang, Wu, Xu, "FedPCL-CDR: A Federated Prototype-based Contrastive Learning Framework for
Privacy-Preserving Cross-domain Recommendation", arXiv:2409.03294): the whole paper.

Files in reading order. The method is the first two; the rest is the experiment.

1. ``method.py``: the method. Its docstring has the notation, Eqs. 1–14 and the readings we
   chose; then :class:`~fedlib.papers.fedpcl_cdr.method.FedPCLConfig` (with Table 3's
   ablation variants), the domain model (LightGCN on ID and review embeddings, Eqs. 1–2,
   and the predictor, Eq. 10), the local update (Eq. 11), Algorithm 1 as the trainer's
   :class:`~fedlib.papers.fedpcl_cdr.method.FedPCLAlgorithm` (one round = every domain's
   local update and upload, then the server's prototypes) and
   :func:`~fedlib.papers.fedpcl_cdr.method.train_fedpcl_cdr`.
2. ``prototypes.py``: the prototype and privacy math the round calls, as pure functions:
   the differential prototypes (clip to β, Laplace noise, Eqs. 4–6) and the privacy budget,
   the messages (what a domain uploads, what the server returns, what a domain trains
   with), the server's aggregation (Eqs. 12–14, vectorised and the code's per-cluster
   reference) and the contrastive losses (Eqs. 7–9, with a reference of the local one).
3. ``spec.toml`` and ``experiment.py``: the experiment as data and one entry point: the tasks
   (substitutes, Douban with Movie, the original format with reviews), the cell configuration
   (methods, variants, ε, α, K, overlap; justified defaults), ``run_cell`` (FedPCL-CDR or one of the
   cross-domain baselines of :mod:`fedlib.baselines.cross_domain`, then the reconstruction attack), the
   learning-rate tuning, the grid's parts and the grid command
   (``python -m fedlib grid fedpcl_cdr <parts>``).
4. ``tables.py``: the paper's Tables 1–5 and Figures 3–6 from the recorded runs.
5. ``lesson.py``: what notebook 04 trains live and shows (the prototypes' signal against
   the noise, the server's view, the live curves).

The path from the notebook to the training step:
``notebooks/04_fedpcl_cdr.py`` -> ``lesson.train_live`` (the grid: ``experiment.run_cell``), which
builds the cell's ``FedPCLConfig`` (``experiment.fedpcl_config``) -> ``method.train_fedpcl_cdr`` ->
``method.FedPCLAlgorithm.run_round`` (``_local_update`` and ``_make_upload`` per domain, then
``prototypes.aggregate_prototypes`` and ``complete_prototypes``), iterated by the one trainer
(:func:`fedlib.baselines.cross_domain.cdr_common.train_cross_domain` -> :func:`fedlib.engine.train`).

Why this cut. The method is about 900 lines, so it takes two files under the 800-line bound:
``prototypes.py`` is stateless math (it imports nothing of this folder) and ``method.py`` the
model and Algorithm 1 around it, re-exporting the math so that it stays the method's one
entry point. What the baselines share with FedPCL-CDR lives below the papers: the k-means of
Eq. 3 is :func:`fedlib.baselines.cross_domain.user_clusters.cluster_users` (P²DTR clusters with it too), and
the cross-domain trainer, result and evaluation are :mod:`fedlib.baselines.cross_domain.cdr_common`. The
data protocol stays in :mod:`fedlib.data.protocols.fedpcl_cdr` (the protocol registry and the
data statistics read it, and the data layer may not import the papers).
"""

from fedlib.papers.fedpcl_cdr import method as _registers  # noqa: E402,F401  registers the method by name
