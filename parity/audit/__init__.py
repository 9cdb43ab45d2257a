"""The kernel and weight audit: an exact verdict for any backend (docs/audit.md).

* :class:`CallAuditor` taps a model's dispatchers and replays every kernel call through the oracle,
  judging each output element against its analytic bound (:mod:`parity.audit.bounds`);
* :func:`audit_weights` reads every NVFP4 weight through the backend's own GEMM (identity activation)
  and compares it exactly with the reference's dequantization;
* :func:`export_repro` / :func:`load_repro` turn a violating call into a file ``python -m parity.audit
  replay FILE`` reruns without the model.
"""

from typing import Any

# Imported on first use (PEP 562): ``python -m`` of a sibling CLI answers --help without torch.
_LAZY = {
    'CallAuditor': '.auditor',
    'CallCheck': '.calls',
    'KeptCall': '.auditor',
    'Violation': '.auditor',
    'WeightAudit': '.weights',
    'audit_request': '.calls',
    'audit_weights': '.weights',
    'export_repro': '.repro',
    'load_repro': '.repro',
    'probe_for': '.auditor',
    'replay': '.repro',
    'weight_records': '.weights',
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name], __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["CallAuditor", "KeptCall", "Violation", "probe_for", "CallCheck", "audit_request", "export_repro",
           "load_repro", "replay", "WeightAudit", "audit_weights", "weight_records"]
