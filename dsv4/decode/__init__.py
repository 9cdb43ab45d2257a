"""Decoding beyond the first token.

* ``loop``      — generation loops over the model surface (prefill + decode_step; forced, greedy or
  sampled; probes at chosen steps; memory after each step), for the reference and the native model;
* ``pieces``    — one native decode step cut into graph-capturable and eager pieces (exact on any device);
* ``graphs``    — the CUDA-graph decoder replaying those pieces (explicit per-device streams);
* ``readiness`` — ``python -m dsv4.decode.readiness``: what keeps a decode step out of a CUDA graph,
  and where (``optrace`` diffs the ops of consecutive steps, ``where`` maps stacks to ``dsv4/`` lines).

Nothing here imports the harness (``parity``); nothing is imported eagerly.
"""
