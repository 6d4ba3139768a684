"""Collectives built from point-to-point messages (see ``ring`` for the contract, the
message and byte formulas and the time model)."""

from .ring import ring_all_gather, ring_all_reduce, ring_all_reduce_alternate, ring_reduce_scatter

__all__ = ["ring_all_gather", "ring_all_reduce", "ring_all_reduce_alternate", "ring_reduce_scatter"]
