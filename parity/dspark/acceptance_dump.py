"""Write an acceptance counts file (docs/dspark.md, "Judging an engine's acceptance") from our own
native model: greedy speculation with k speculative tokens, optionally with a DSpark fault of the bug
zoo patched into the draft. ``python -m parity.dspark acceptance-dump`` is its CLI; the tests judge
these dumps (a clean dump passes, each faulty one is flagged)."""
from __future__ import annotations

import contextlib
import json
from pathlib import Path
from typing import Any, Sequence

import torch

from .acceptance import FORMAT, FORMAT_VERSION


@torch.no_grad()
def speculate_k(side: Any, prompt: list[int], k: int, n_tokens: int) -> tuple[list[int], list[int], torch.Tensor]:
    """(output tokens, accepted count per step, draft logits [steps, k, V]) of greedy speculation
    proposing the first ``k`` draft tokens per step (what an engine with num_speculative_tokens = k does)."""
    logits, mh, state = side.start(torch.tensor(prompt, dtype=torch.int64))
    ds = side.dspark.new_state()
    side.commit(ds, mh)
    out, accepted, rows = [int(torch.argmax(logits[-1]))], [], []
    while len(out) < n_tokens:
        anchor = out[-1]
        d = side.dspark.draft(ds, anchor)
        tokens = d.tokens[:k]
        rows.append(d.logits[:k].to(torch.float32).cpu())
        before = side.snapshot(state)
        q, _ = side.extend(state, [anchor] + tokens)
        best = torch.argmax(q, dim=-1).tolist()
        n = 0
        while n < k and tokens[n] == best[n]:
            n += 1
        state = before
        _, mh = side.extend(state, [anchor] + tokens[:n])
        side.commit(ds, mh)
        out += tokens[:n] + [best[n]]
        accepted.append(n)
    return out, accepted, torch.stack(rows)


def dump_native(checkpoint: str, out: str | Path, *, prompts: Sequence[Any], k: int, n_tokens: int = 32,
                precision: str = "nvfp4", fault: str | None = None, with_logits: bool = True,
                device: str = "cpu") -> Path:
    """Write ``out`` (JSONL) and, with logits, ``<out stem>.draft_logits.safetensors`` beside it.
    ``prompts``: encoded prompts (``.id``, ``.ids``); ``precision`` fp32 runs the all-fp32 plan."""
    from safetensors.torch import save_file

    from dsv4.plan import PrecisionPlan

    from ..bugzoo.draft_zoo import DSPARK_FAULTS
    from ..source import resolve_checkpoint
    from .sides import native_side

    src = resolve_checkpoint(checkpoint, 0)
    plan = PrecisionPlan.preset("all-fp32" if precision == "fp32" else "default")
    side = native_side(str(src.path), plan=plan, backend="emulated", device=device)
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    logits_file = out.with_name(out.stem + ".draft_logits.safetensors")
    header = {"format": FORMAT, "format_version": FORMAT_VERSION,
              "engine": f"dsv4-parity native {plan.name}/emulated" + (f" + fault {fault}" if fault else ""),
              "checkpoint": src.spec, "num_speculative_tokens": k, "temperature": 0.0,
              "draft_sample_method": "greedy", "precision": precision}
    if with_logits:
        header["draft_logits"] = logits_file.name
    lines, tensors = [json.dumps(header)], {}
    with contextlib.ExitStack() as stack:
        if fault:
            stack.enter_context(DSPARK_FAULTS[fault](side.dspark))
        for p in prompts:
            ids = list(p.ids)
            toks, acc, lg = speculate_k(side, ids, k, n_tokens)
            lines.append(json.dumps({"prompt_id": p.id, "prompt_ids": ids, "output_tokens": toks, "accepted": acc}))
            tensors[p.id] = lg.contiguous()
    out.write_text("\n".join(lines) + "\n", encoding="utf-8")
    if with_logits:
        save_file(tensors, str(logits_file))
    return out
