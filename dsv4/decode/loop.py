"""Generation loops over the model surface (``prefill`` + ``decode_step``), for either model.

Step convention (shared with :mod:`parity.decode`): a prompt of P tokens holds positions 0..P-1.
Step 0 is the prefill; its logits (position P-1) predict the first continuation token ``c_0``. Step
``s >= 1`` feeds ``c_{s-1}`` at position ``P+s-1`` through ``decode_step``; its logits predict ``c_s``.
N steps feed N-1 tokens, so the last position written is ``P+N-2``.

What is fed is either a **forced** sequence (teacher forcing: ``c_s = forced[s]``) or chosen from the
model's own logits (free running: :func:`greedy`, or a seeded :class:`Sampler`). Each step reports its
logits (fp32, on the CPU), the token that follows them, the wall time of the model call, the memory
of the model's devices after it (:class:`MemoryMeter`), and, at requested steps, every probe.
"""
from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Sequence

import torch

from .. import probes

Chooser = Callable[[torch.Tensor], int]
StepFn = Callable[[Any, int], torch.Tensor]


class DecodeInputError(ValueError):
    """A generation request that cannot run: too many positions, bad forced ids or probe steps."""


def greedy(logits: torch.Tensor) -> int:
    """The argmax (the lowest id among equal maxima, as ``torch.argmax`` breaks ties)."""
    return int(torch.argmax(logits))


class Sampler:
    """Seeded sampling at ``temperature`` (float64 softmax on the CPU, so it is device independent)."""

    def __init__(self, temperature: float = 1.0, seed: int = 0) -> None:
        if not temperature > 0:
            raise DecodeInputError(f"temperature: expected > 0, found {temperature}")
        self.temperature = float(temperature)
        self.gen = torch.Generator().manual_seed(seed)

    def __call__(self, logits: torch.Tensor) -> int:
        p = torch.softmax(logits.detach().to("cpu", torch.float64) / self.temperature, dim=-1)
        return int(torch.multinomial(p, 1, generator=self.gen))


def model_devices(model: Any) -> list[str]:
    """Devices a model computes on: the native ``device_map``, the reference ``devices``, else cpu."""
    m = getattr(model, "device_map", None) or getattr(model, "devices", None) or {}
    return sorted({str(d) for d in m.values()}) or ["cpu"]


class MemoryMeter:
    """Memory after a step. On CUDA: ``torch.cuda.memory_allocated`` summed over the model's CUDA
    devices (``kind = 'cuda_allocated'``, exact, this process's tensors only). On the CPU: the
    process's resident set (``kind = 'cpu_rss'``; includes everything in the process, so only its
    growth per step means something)."""

    def __init__(self, devices: Sequence[str]) -> None:
        self.cuda = sorted({torch.device(d) for d in devices if torch.device(d).type == "cuda"}, key=str)
        self.kind = "cuda_allocated" if self.cuda else "cpu_rss"

    def sync(self) -> None:
        for d in self.cuda:
            torch.cuda.synchronize(d)

    def read(self) -> int:
        if self.cuda:
            return sum(int(torch.cuda.memory_allocated(d)) for d in self.cuda)
        return _rss_bytes()


def _rss_bytes() -> int:
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):   # not Linux: the peak is the best the stdlib offers
        import resource

        return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024


@dataclass
class Step:
    step: int
    position: int                 # the position whose logits these are
    fed: int | None               # the token fed at this step (None at step 0: the prompt)
    target: int                   # the token that follows these logits (forced, or chosen from them)
    logits: torch.Tensor          # fp32 [V] on the CPU
    seconds: float                # the model call (prefill or decode_step), synchronized
    memory: int                   # MemoryMeter.read() after the step
    probes: dict[str, torch.Tensor] | None = None


def check_request(config: Any, prompt_len: int, n_steps: int, forced: Sequence[int] | None,
                  probe_steps: Sequence[int]) -> None:
    """Everything :func:`run_steps` would trip over, before any compute."""
    if n_steps < 1:
        raise DecodeInputError(f"steps: expected at least 1, found {n_steps}")
    last = prompt_len + n_steps - 2
    if last >= config.max_position_embeddings:
        raise DecodeInputError(f"{n_steps} steps after a {prompt_len}-token prompt write position {last}: expected "
                               f"< max_position_embeddings={config.max_position_embeddings} (at most "
                               f"{config.max_position_embeddings - prompt_len + 1} steps)")
    if forced is not None:
        if len(forced) < n_steps:
            raise DecodeInputError(f"forced tokens: expected at least {n_steps} (one per step), found {len(forced)}")
        bad = [t for t in forced[:n_steps] if not 0 <= int(t) < config.vocab_size]
        if bad:
            raise DecodeInputError(f"forced tokens: expected ids in [0, {config.vocab_size}), found {bad[:5]}")
    bad_steps = [s for s in probe_steps if not 1 <= s < n_steps]
    if bad_steps:
        raise DecodeInputError(f"probe steps: expected decode steps in [1, {n_steps - 1}], found {bad_steps}")


def run_steps(model: Any, prompt: torch.Tensor, n_steps: int, *, forced: Sequence[int] | None = None,
              choose: Chooser = greedy, probe_steps: Sequence[int] = (), step_fn: StepFn | None = None,
              meter: MemoryMeter | None = None) -> Iterator[Step]:
    """Prefill ``prompt`` then ``n_steps - 1`` decode steps (see the module doc); yields every step.

    ``forced``: the continuation to feed (teacher forcing), else ``choose`` picks each next token from
    the step's logits. ``step_fn(state, token) -> logits`` replaces ``model.decode_step`` (e.g. a
    CUDA-graph decoder's ``step``) except at ``probe_steps``, where the eager ``decode_step`` runs under
    a probe recorder (to the CPU): the two advance the same state identically."""
    config = model.config
    prompt = prompt.to("cpu", torch.int64).reshape(-1)
    check_request(config, int(prompt.numel()), n_steps, forced, probe_steps)
    meter = meter or MemoryMeter(model_devices(model))
    step_fn = step_fn or model.decode_step
    wanted = set(probe_steps)
    P = int(prompt.numel())
    with torch.no_grad():
        t0 = time.perf_counter()
        logits, state = model.prefill(prompt)
        meter.sync()
        logits = logits[-1]
        fed: int | None = None
        for s in range(n_steps):
            rec = None
            if s > 0:
                t0 = time.perf_counter()
                if s in wanted:      # probes come from the eager decode_step (a CUDA graph emits none)
                    rec = probes.ProbeRecorder(to_cpu=True)
                    with rec:
                        logits = model.decode_step(state, fed)
                else:
                    logits = step_fn(state, fed)
                meter.sync()
            secs = time.perf_counter() - t0
            cpu = logits.detach().to("cpu", torch.float32).reshape(-1)
            target = int(forced[s]) if forced is not None else choose(cpu)
            yield Step(s, P - 1 + s, fed, target, cpu, secs, meter.read(), dict(rec.values) if rec else None)
            fed = target
