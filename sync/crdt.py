"""The replicated data types, re-exported: they live in ``projections.crdt``, beside the
fold that uses them (imports point ops -> sync -> projections -> eventlog)."""

from projections.crdt import NO_STAMP, GCounter, LWWRegister, Stamp

__all__ = ["NO_STAMP", "GCounter", "LWWRegister", "Stamp"]
