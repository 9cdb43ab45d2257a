"""The bug zoo: known-bad variants of the native model, and a runner proving the harness catches
each one in the right column and localizes it (parity-methods.md §9, §11.1).

* :mod:`parity.bugzoo.registry` — ``register_fault`` / ``get_fault`` / ``list_faults`` /
  ``load_faults_module`` / ``patched`` (faults patch one native model instance, restored exactly);
* :mod:`parity.bugzoo.faults` — the built-in faults and their expectations;
* :mod:`parity.bugzoo.backends` — the kernel-side stand-ins (clean copy of ``emulated``, faulty epilogue);
* :mod:`parity.bugzoo.runner` — ``run_zoo``: one three-way run per fault plus the clean row, judged
  with the default thresholds; the JSON summary schema is documented there;
* :mod:`parity.bugzoo.render` — the rich table; ``python -m parity.bugzoo`` is the CLI.
"""
from .registry import Fault, FaultError, FaultTargetError, KernelFault, get_fault, list_faults, \
    load_faults_module, patched, register_fault, unregister_fault

__all__ = ["Fault", "FaultError", "FaultTargetError", "KernelFault", "get_fault", "list_faults",
           "load_faults_module", "patched", "register_fault", "unregister_fault"]
