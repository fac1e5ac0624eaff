"""Sequential cross-domain baselines: each platform a client with two domains' sequences.

The interface FedCSR and its baselines share is :mod:`.sequences` (splits, encoders, ranking)
and :mod:`.sequence_training` (platform training pieces); :mod:`.fedcsr_baselines` trains any
of the models below with FedProx. Models: :mod:`.tisasrec`, :mod:`.clsr`, :mod:`.conet`,
:mod:`.ccdr`, :mod:`.c2dsr`, :mod:`.mifn`, :mod:`.pinet`, :mod:`.psjnet`.
"""
