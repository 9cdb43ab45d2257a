"""Exception classes of the harness. Every CLI maps :class:`ParityInputError` (and its subclasses) to
exit code 2 ("bad input"), so a caller can tell a broken invocation from a threshold failure (exit 1)."""
from __future__ import annotations


class ParityInputError(ValueError):
    """Bad input to the harness: the message names what was expected and what was found."""


class RulesError(ParityInputError):
    """A malformed or inconsistent thresholds file (TOML syntax, unknown probe / metric / op / pair)."""


class RecordsError(ParityInputError):
    """Records that cannot be read or judged together (malformed JSONL, mixed checkpoints or plans)."""


class DumpError(ParityInputError):
    """An engine dump that does not match the reference (missing probes, shapes, token ids, manifest)."""


class PromptError(ParityInputError):
    """A prompt that cannot be selected or encoded for the checkpoint's tokenizer / vocabulary."""


class SurfaceError(RuntimeError):
    """A model that does not behave as docs/model_surface.md says (missing probe, wrong shape)."""


class NonFiniteError(RuntimeError):
    """A forward that failed after producing non-finite values: names the first probe (in execution
    order) that held NaN/Inf, which a crash further on (a kernel refusing NaN scales) would hide."""

    def __init__(self, probe: str, layer: int | None, component: str, mode: str, cause: BaseException) -> None:
        self.probe, self.layer, self.component, self.mode, self.cause = probe, layer, component, mode, cause
        where = f"layer {layer}" if layer is not None else "global"
        origin = "from the anchor's finite inputs" if mode == "isolated" else "end to end"
        super().__init__(f"non-finite values first at {probe} ({where}, component {component}; {mode} forward, "
                         f"{origin}); the forward then failed: {type(cause).__name__}: {cause}")
