"""FedKDRec ("Federated Recommendation with Reinforcement Learning based Knowledge Distillation",
anonymous ICLR 2026 submission) and PTF-FedRec (Yuan et al., ICDE 2024, its ``-m-c~s`` variant):
the whole paper.

Files in reading order. The method is the first three; the rest is the experiment.

1. ``agents.py``: the two reinforcement-learning agents on the server: the clients-to-server
   teacher weights ``ω = softmax(M_R(s))`` (§3.2, Eq. 10) and the server-to-clients
   actor–critic that picks the items to send (§3.3, Eqs. 8, 9, 11, 12), as small modules
   with their states, rewards and losses.
2. ``clients.py``: the settings (:class:`~fedlib.papers.fedkdrec.clients.FedKDRecConfig`,
   the ablations of Tables 2 and 4 as :data:`~fedlib.papers.fedkdrec.clients.VARIANTS`) and
   the client side (§3.1): a round's local data ``D_i ∪ D̃_i``, local training (Eq. 3; the
   batched and the sequential executor) and the upload (sample, mix with Eq. 4, swap).
3. ``method.py``: the server (its model, the labels it was told, both agents) and
   Algorithm 1 as an :class:`~fedlib.engine.algorithm.Algorithm`
   (:class:`~fedlib.papers.fedkdrec.method.FedKDRec`: one round = send, train clients,
   upload, train server, learn), the lesson's step-by-step
   :class:`~fedlib.papers.fedkdrec.method.FedKDRecSession` and
   :func:`~fedlib.papers.fedkdrec.method.train_fedkdrec` (the trainer runs the rounds and its
   ``RunResult`` is the result; ``server_scorer`` and ``curve_rows`` read it).
4. ``spec.toml``: the experiment as data: every cell default once with its reason (datasets,
   methods, backbones, the learning rates chosen on validation), the grid's parts and the
   layouts of Tables 1–5.
5. ``experiment.py``: the cell builder, ``run_cell`` (FedKDRec, the parameter-transfer
   baselines, FedPerGNN and the centralised backbones, evaluated under both protocols) and the
   grid command (``python -m fedlib grid fedkdrec <parts>``); ``tables.py``: the tables' hooks
   (derived rows, byte units) and the paper's claims, from the recorded runs.
6. ``figures.py``: Figures 2–4, the item-initialisation comparison and the learning curves.
7. ``lesson.py``: what notebook 03 trains live (``LiveRun``, one run opened up round by round)
   and its small tables.

The path from the notebook to the training step (three files):
``notebooks/03_fedkdrec.py`` -> ``experiment.run_cells`` / ``experiment.run_cell``
(``_run_fedkdrec`` builds the :class:`~fedlib.papers.fedkdrec.clients.FedKDRecConfig` of the
cell) -> ``method.train_fedkdrec`` -> :class:`~fedlib.papers.fedkdrec.method.FedKDRec`
``.run_round`` (calling ``clients.py`` for steps 3–4 and ``agents.py`` through the server for
steps 2, 5–6), run by the trainer (:func:`fedlib.engine.trainer.train`). The live lesson takes
``lesson.LiveRun`` -> ``method.FedKDRecSession`` (the same steps, one at a time).

Why this cut. The method is about 1,400 lines, so it needs three files under the 800-line
bound; each is one part of the method and imports only the ones before it (agents <- clients
<- method). The settings sit with the clients because both sides read them and the client
side comes first in a round. The FedKDRec data protocol stays in
:mod:`fedlib.data.protocols.fedkdrec` (the protocol registry and the synthetic data read it,
and the data layer may not import the papers); the baselines it compares with stay below the
papers (:mod:`fedlib.baselines.single_domain.fedpergnn`, the engine's FedMF/FedNCF, the centralised trainer).
"""

from fedlib.papers.fedkdrec import method as _registers  # noqa: E402,F401  registers the method by name
