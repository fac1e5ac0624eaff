"""The baselines of the five papers, one folder per family, and the registry of methods by name.

* :mod:`fedlib.baselines.single_domain`: one user-item matrix (FedRKG's and FedKDRec's
  comparisons): GPFedRec, CoFedRec, FedRAP, FedDAE, FedPerGNN; FedMF, FedNCF and PFedRec are
  parameter averaging in :mod:`fedlib.engine.method`.
* :mod:`fedlib.baselines.cross_domain`: two or three domains sharing users (FedPCL-CDR's
  Table 2): the single-domain rows, GA-DTCDR, GA-MTCDR-P, NMCDR, CL-DTCDR, PriCDR, P2FCDR, P²DTR,
  and what they share (:mod:`~fedlib.baselines.cross_domain.cdr_common`).
* :mod:`fedlib.baselines.sequential`: cross-domain sequences (FedCSR's Table 2): TiSASRec,
  CLSR, CoNet, CCDR, C2DSR, MIFN, π-Net, PSJNet-II under FedProx, and the sequence interface
  FedCSR shares with them.
* :mod:`fedlib.baselines.continual`: a stream of data blocks (F3CRec's Table 2): fine-tuning,
  regularisation and distillation in :mod:`~fedlib.baselines.continual.continual`, RLP2, SPP.

:mod:`fedlib.baselines.registry` finds any method of the course, a paper's or a baseline's, by
name.
"""
