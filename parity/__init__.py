"""parity: the harness comparing the BF16 reference, the native model on the emulated backend, and
the native model on a kernel backend (docs/design.md; docs/methods.md).

Library entry points (the CLIs are thin shells over these):

* :func:`parity.threeway.run_threeway` — run the logic / floor / bug-budget columns, get records;
* :func:`parity.compare.compare_probes` — compare two probe dicts (any two models or dumps);
* :func:`parity.runner.run_propagated`, :func:`parity.runner.run_isolated` — drive one model;
* :func:`parity.rules.load_rules`, :func:`parity.verdict.evaluate` — judge records;
* :func:`parity.records.read_records`, :func:`parity.records.write_records` — the JSONL schema;
* :mod:`parity.metrics`, :mod:`parity.logits_stats`, :mod:`parity.selection` — the metrics;
* :mod:`parity.dumps` — the engine dump format.

Nothing is imported here eagerly, so ``import parity`` stays cheap.
"""
