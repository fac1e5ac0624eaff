"""Single-domain baselines: one user-item matrix, one item table shared or personalised.

GPFedRec (:mod:`.gpfedrec`, its server graph in :mod:`.gpfedrec_graph`), CoFedRec
(:mod:`.cofedrec`, item clusters from :mod:`.seeded_kmeans`), FedRAP (:mod:`.fedrap`), FedDAE
(:mod:`.feddae`, its fast round in :mod:`.feddae_executor`) and FedPerGNN (:mod:`.fedpergnn`).
"""
