"""Exception classes of the precision-floor tools. The CLIs map :class:`FloorInputError` to exit
code 2 (bad input), like the parity harness's ``ParityInputError``."""
from __future__ import annotations

from parity.errors import ParityInputError


class FloorInputError(ParityInputError):
    """Bad input to a precision-floor tool (budget, class list, records directory)."""


class StoreError(FloorInputError):
    """An evaluation store that cannot be read: a malformed entry, or records without their manifest."""


class SearchError(RuntimeError):
    """The floor search cannot proceed (e.g. an evaluation returned no first-token statistics)."""
