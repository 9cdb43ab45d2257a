"""``python -m parity.decode --teacher-forced|--free``: decode parity over N generated tokens.

First-token parity never reaches what forms during generation: an HCA layer's first compressed entry
(at 128 tokens in the real models, 16 in tiny), the compressors' decode state, the window ring
wrapping, and the loops a broken decoder falls into. Step convention: :mod:`dsv4.decode.loop`
(step 0 = the prefill's last position, step s >= 1 = one ``decode_step``).

* ``--teacher-forced`` (default): both models are fed one sequence — the reference's greedy
  continuation, or ``--forced sample`` (the reference's seeded samples) or given ids — so every
  step is comparable. Per step: KL(reference || native), top-1 agreement with the near-tie flag,
  top-k overlap, dp of the forced token, both sides' logit range and the memory after the step;
  at ``--probe-steps`` every probe (per-layer cosine). Aggregates over all steps of all prompts
  (KL mean +- SE, percentiles, top-1 with near ties forgiven, top-k overlap) are judged by the rules;
  dp and the PPL ratio, measured at the forced token, are reported as ``forced_*``
  (:mod:`parity.decode.records` says why).
* ``--free``: both models decode greedily on their own. The first step where their tokens differ is
  the divergence (both still saw the same context there): a *near tie* when the reference's top-2
  log-prob margin is below the rules' ``near_tie_logprob``, a *mutual top-k* flip when each side's
  token is within the other's top ``--mutual-topk``. A clear flip (neither) fails, and so does a
  native stream that degenerates (:mod:`parity.degeneration`) while the reference's does not. Steps
  up to the divergence are compared as above.

Models run one at a time (reference first, then native), like :mod:`parity.threeway`: the reference's
logits of every step stay on the host (N x V fp32 per prompt). Records: the harness's JSONL schema
with ``step`` set. Per-step and per-probe-step values carry ``step_``-prefixed metric names: the
default rules were calibrated on prefill positions (a first-token KL rule, whole-tensor averages
over ~70 tokens) and would misjudge single decode steps. Exact metrics (hash routing, entry counts,
non-finite patterns) keep their names and are judged at every probe step.

Exit codes: 0 every check passes, 1 a threshold failure, 2 bad input.
"""
from __future__ import annotations


from typing import Any

# Imported on first use (PEP 562): ``python -m`` of a sibling CLI answers --help without torch.
_LAZY = {
    'DecodeRun': '.run',
    'DecodeSpec': '.run',
    'PromptResult': '.run',
    'SideRun': '.run',
    'aggregate_name': '.records',
    'aggregate_records': '.records',
    'auto_probe_steps': '.run',
    'build_parser': '.cli',
    'free_running_failures': '.records',
    'logit_ranges': '.records',
    'main': '.cli',
    'parse_ids': '.cli',
    'parse_steps': '.cli',
    'prompt_records': '.records',
    'run_decode': '.run',
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name], __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["DecodeRun", "DecodeSpec", "PromptResult", "SideRun", "aggregate_name", "aggregate_records",
           "auto_probe_steps", "build_parser", "free_running_failures", "logit_ranges", "main", "parse_ids",
           "parse_steps", "prompt_records", "run_decode"]
