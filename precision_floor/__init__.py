"""precision_floor: which component classes must stay BF16 for the native NVFP4 model to meet a
budget (docs/methods.md §7), measured with the parity harness and rendered as one HTML report.

Library entry points (the ``python -m precision_floor.<tool>`` CLIs are thin shells over these):

* :class:`precision_floor.evaluate.Evaluator` — score one plan (first-token KL +- SE, top-1
  agreement, worst per-layer cosine, selection agreement), through the resumable
  :class:`precision_floor.cache.EvalStore`;
* :func:`precision_floor.flips.run_flips` — rescue / damage flip tables per component class;
* :func:`precision_floor.search.floor_search` — greedy promotion, then add-then-revert, and the
  Pareto curve (KL vs bytes) of every visited plan;
* :func:`precision_floor.attribution.run_attribution` — would the flip tables or the floor search
  blame a precision choice for a bug-zoo fault;
* :func:`precision_floor.report.build.render_report` — the self-contained HTML report.

Dependencies point one way: ``dsv4`` -> ``parity`` -> ``precision_floor``. Nothing is imported here
eagerly, so ``import precision_floor`` stays cheap.
"""
