"""Trainable weights for the reference model: the store the reference reads its weights from,
holding ``torch.nn.Parameter``s, and a forward that runs the reference's own layer code with
autograd on (its public calls are ``no_grad``; the undecorated functions are the same code)."""
from __future__ import annotations

from typing import Callable, Iterator

import numpy as np
import torch

from dsv4.checkpoint.names import INDEX, WeightSpec, all_weights

from ..model import ReferenceModel

# Not trained by the next-token gradient, and why (docs/trained-model.md):
# the router's correction bias only selects (DeepSeek's auxiliary-loss-free balancing updates it
# from the expert loads, as `balance_bias` does); the indexer's weights only choose the top-k
# compressed entries, a selection with no gradient: they keep their synthetic initialization.
NO_GRADIENT = ("ffn.gate.bias", "attn.indexer.wq_b", "attn.indexer.weights_proj", "attn.indexer.compressor.")


def trains(name: str) -> bool:
    return not any(name == n or (n.endswith(".") and name.startswith(n)) for n in NO_GRADIENT)


class TrainableWeights:
    """Drop-in for reference.weights.WeightStore: ``get(name, layer, device, fp32)`` returns the
    parameter (fp32) of one canonical weight; the hash table stays an int64 tensor."""

    cache = True

    def __init__(self, config, init: Callable[[WeightSpec], np.ndarray]) -> None:
        self.specs = {(s.name, s.layer): s for s in all_weights(config)}
        self.tensors: dict[tuple[str, int | None], torch.Tensor] = {}
        for key, spec in self.specs.items():
            v = torch.from_numpy(np.ascontiguousarray(init(spec)))
            self.tensors[key] = v if spec.kind == INDEX else torch.nn.Parameter(v.float(), requires_grad=trains(spec.name))

    def get(self, name: str, layer: int | None, device, fp32: bool = False) -> torch.Tensor:
        try:
            return self.tensors[(name, layer)]
        except KeyError:
            raise KeyError(f"trainable weights: no weight {name!r} in layer {layer}") from None

    def release(self) -> None:
        pass

    def parameters(self) -> Iterator[tuple[str, torch.nn.Parameter]]:
        for (name, layer), t in self.tensors.items():
            if isinstance(t, torch.nn.Parameter):
                yield (name if layer is None else f"layers.{layer}.{name}"), t

    def values(self, spec: WeightSpec) -> np.ndarray:
        """The logical values of one weight for the checkpoint writer (synth.build_tensors ``values``)."""
        t = self.tensors[(spec.name, spec.layer)].detach()
        return t.numpy() if spec.kind == INDEX else t.float().numpy()


def trainable_model(model: ReferenceModel, weights: TrainableWeights) -> ReferenceModel:
    """The reference model ``model`` reading its weights from ``weights`` (fp32, bf16 profile)."""
    if model.dtype != torch.float32 or model.profile.act_quant:
        raise ValueError(f"training: expected an fp32 reference without activation quantization, found "
                         f"{model.dtype} profile {model.profile.name!r}")
    model.store = weights
    return model


def forward(model: ReferenceModel, ids: torch.Tensor) -> torch.Tensor:
    """fp32 logits [T, V] of a prefill, differentiable in the weights."""
    state = model.new_state(ids)
    x = ReferenceModel.embed.__wrapped__(model, state.ids)
    for i in range(model.config.num_hidden_layers):
        x = ReferenceModel.layer.__wrapped__(model, i, x, state)
    return ReferenceModel.head.__wrapped__(model, x)
