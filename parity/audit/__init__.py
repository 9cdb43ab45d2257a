"""The kernel and weight audit: an exact verdict for any backend (docs/audit.md).

* :class:`CallAuditor` taps a model's dispatchers and replays every kernel call through the oracle,
  judging each output element against its analytic bound (:mod:`parity.audit.bounds`);
* :func:`audit_weights` reads every NVFP4 weight through the backend's own GEMM (identity activation)
  and compares it exactly with the reference's dequantization;
* :func:`export_repro` / :func:`load_repro` turn a violating call into a file ``python -m parity.audit
  replay FILE`` reruns without the model.
"""
from .auditor import CallAuditor, KeptCall, Violation, probe_for
from .calls import CallCheck, audit_request
from .repro import export_repro, load_repro, replay
from .weights import WeightAudit, audit_weights, weight_records

__all__ = ["CallAuditor", "KeptCall", "Violation", "probe_for", "CallCheck", "audit_request", "export_repro",
           "load_repro", "replay", "WeightAudit", "audit_weights", "weight_records"]
