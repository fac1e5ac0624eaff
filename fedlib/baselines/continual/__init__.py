"""Continual baselines: one federated run per data block, state carried between blocks.

:mod:`.continual` is the framework (blocks, plan augmentation, FT, Reg, KD); :mod:`.rlp2`
and :mod:`.spp` are the two continual-learning baselines of F3CRec's Table 2.
"""
