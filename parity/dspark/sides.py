"""The two sides of a draft-parity pair, each a target and a draft behind one small interface, so
that any target can be paired with any draft (the crossed pairs):

* a **target** runs its trunk over a state's pending tokens: ``start(prompt)`` -> (logits, main_hidden,
  state), ``extend(state, ids)`` -> (logits, main_hidden), ``snapshot(state)``;
* a **draft** is ``reference.dspark.DSparkReference`` or ``dsv4.dspark.NativeDSpark`` as they are
  (``new_state``, ``commit``, ``draft``).

The reference keeps its pending chunk in ``state.ids``; the native state holds every token id."""
from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any, Mapping

import torch


@dataclass
class Side:
    """One model pair of a column: ``label`` (e.g. ``reference:bf16/fp32``), the DSpark object (its
    trunk is the target, itself the draft) and the dtype its draft takes main_hidden in."""

    label: str
    dspark: Any
    dtype: torch.dtype
    fault: Any = None   # the bug zoo's patch applied to this side's draft, if any

    # ---- the target ------------------------------------------------------------------------------
    @property
    def native(self) -> bool:
        return getattr(self.dspark, "side", "") == "native"

    def start(self, prompt: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, Any]:
        model = self.dspark.target if self.native else self.dspark.model
        state = model.new_state(prompt)
        logits, mh = self.dspark.trunk(state)
        return logits, mh, state

    def extend(self, state: Any, ids: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        if self.native:
            state.start = state.pos
            state.token_ids = torch.cat((state.token_ids, torch.tensor(ids, dtype=torch.int64)))
        else:
            state.ids, state.start = torch.tensor(ids, dtype=torch.int64), state.pos
        return self.dspark.trunk(state)

    @staticmethod
    def snapshot(state: Any) -> Any:
        return copy.deepcopy(state)

    # ---- the draft -------------------------------------------------------------------------------
    def commit(self, ds: Any, main_hidden: torch.Tensor) -> None:
        self.dspark.commit(ds, main_hidden.to(self.dtype))

    def release(self) -> None:
        self.dspark = None


def reference_side(path: str, *, profile: str, dtype: torch.dtype, device: str = "cpu",
                   device_map: Mapping[Any, str] | None = None) -> Side:
    import reference
    from reference.dspark import DSparkReference
    from ..refcache import dtype_name

    model = reference.load_model(path, profile=profile, dtype=dtype, device=device, device_map=device_map)
    return Side(f"reference:{profile}/{dtype_name(dtype)}", DSparkReference(model), dtype)


def native_side(path: str, *, plan: Any, backend: str, device: str = "cpu",
                device_map: Mapping[Any, str] | None = None, act_scale: str = "frozen") -> Side:
    """``act_scale``: ``frozen`` by default. Speculation compares a γ+1-row verify pass with 1-row
    decode steps; a runtime per-tensor activation amax (what ``static`` falls back to for weights
    converted to FP4 at load, which carry no calibrated input scale) quantizes those differently,
    measured on tiny-dspark: logits up to 0.84 apart for the same position. ``frozen`` keeps each
    linear's first scale, leaving only the backend's FP32 summation-order noise (~2e-6)."""
    import dsv4
    from dsv4.dspark import load_dspark

    target = dsv4.load_model(path, plan=plan, backend=backend, device=device, device_map=device_map,
                             act_scale=act_scale)
    draft = load_dspark(target)
    return Side(f"native:{target.plan.name}/{backend}", draft, target.act_dtype)
