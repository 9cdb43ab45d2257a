"""Every DSpark draft fault of the zoo, the door its users import: the built-in ones
(:mod:`parity.bugzoo.dspark_faults`) and the field bugs' (:mod:`parity.bugzoo.field_faults` registers
its draft faults into the same table when imported)."""
from __future__ import annotations

from . import field_faults  # noqa: F401  (registers the field bugs' draft faults)
from .dspark_faults import DSPARK_FAULTS, DraftFault

__all__ = ["DSPARK_FAULTS", "DraftFault"]
