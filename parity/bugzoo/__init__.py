"""The bug zoo: known-bad variants of the native model, and a runner proving the harness catches
each one in the right column and localizes it (docs/methods.md §9).

* :mod:`parity.bugzoo.registry` — ``register_fault`` / ``get_fault`` / ``list_faults`` /
  ``load_faults_module`` / ``patched`` (faults patch one native model instance, restored exactly);
* :mod:`parity.bugzoo.faults` — the built-in faults and their expectations;
* :mod:`parity.bugzoo.backends` — the kernel-side stand-ins (clean copy of ``emulated``, faulty epilogue);
* :mod:`parity.bugzoo.runner` — ``run_zoo``: one three-way run per fault plus the clean row, judged
  with the default thresholds; the JSON summary schema is documented there;
* :mod:`parity.bugzoo.render` — the rich table; ``python -m parity.bugzoo`` is the CLI.
"""

from typing import Any

# Imported on first use (PEP 562): ``python -m`` of a sibling CLI answers --help without torch.
_LAZY = {
    'Fault': '.registry',
    'FaultError': '.registry',
    'FaultTargetError': '.registry',
    'KernelFault': '.registry',
    'get_fault': '.registry',
    'list_faults': '.registry',
    'load_faults_module': '.registry',
    'patched': '.registry',
    'register_fault': '.registry',
    'unregister_fault': '.registry',
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name], __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["Fault", "FaultError", "FaultTargetError", "KernelFault", "get_fault", "list_faults",
           "load_faults_module", "patched", "register_fault", "unregister_fault"]
