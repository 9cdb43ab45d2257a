"""The SGLang plugin (entry point group ``sglang.srt.plugins``, which SGLang 0.5.23 loads in the
launcher, the engine, the scheduler and the detokenizer processes): with ``DSV4_PARITY_DUMP_DIR``
set it registers, through SGLang's own ``HookRegistry``, an AFTER hook on
``DeepseekV4ForCausalLM.__init__`` that attaches :class:`parity.engines.live.LiveDump` with the table
of :mod:`parity.engines.sglang_map` to the new model. Nothing of SGLang is patched; unset, it does
nothing. Run SGLang with ``--cuda-graph-backend-prefill=disabled`` (module hooks do not fire in a
replayed graph) and attention tensor parallelism 1 (docs/engines.md)."""
from __future__ import annotations

from typing import Any

from . import sglang_map

TARGET = f"sglang.srt.models.deepseek_v4.{sglang_map.ROOT}.__init__"


def register() -> None:
    from .live import settings_from_env

    if settings_from_env() is None:
        return
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    HookRegistry.register(TARGET, after_init, HookType.AFTER)


def after_init(_result: Any, model: Any, *args: Any, **kwargs: Any) -> None:
    """HookType.AFTER signature: (the original's result, then its arguments; ``self`` first)."""
    import sglang

    from .live import attach_from_env, engine_label

    model._dsv4_parity_dump = attach_from_env(model, sglang_map, engine=engine_label("sglang", sglang.__version__,
                                                                                    sglang_map.VERSION))
