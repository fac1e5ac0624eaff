"""Cross-domain baselines: domains that share users, each trained as a cross-domain algorithm.

What every method of the family shares (evaluation per domain, the schedule, the result) is
:mod:`.cdr_common`. Single-domain rows (NeuMF, LightGCN, FedNCF per domain):
:mod:`.cdr_single_domain`. Centralised CDR: :mod:`.ga_cdr` (GA-DTCDR, GA-MTCDR-P),
:mod:`.nmcdr`, :mod:`.cl_dtcdr`. Privacy-preserving dual-target CDR: :mod:`.pp_cdr` (shared
pieces), :mod:`.pricdr`, :mod:`.p2fcdr`, :mod:`.p2dtr`. Prototype clustering: :mod:`.user_clusters`.
"""
