"""Audits run against federated training: what an honest-but-curious server can infer, and leaks.

* :mod:`fedlib.audits.inference_attack`: which items a client trained on, read from its row
  uploads (F3CRec §5.6 and notebook 00's attack section).
* :mod:`fedlib.audits.leak_trace`: FedRKG's test-leak audit attached to a federated run, round
  by round (the measure itself is :mod:`fedlib.metrics.leak_audit`).
"""
