"""What the time-to-verdict estimates share (``parity.verdict_time``, ``parity.verdict_fit``): card families
and their memory bandwidth, and the parameters of one layer of a config."""
from __future__ import annotations

from typing import Any

# Peak memory bandwidth, TB/s (vendor data sheets); a CPU entry is a stand-in so CPU tables scale too.
BANDWIDTH_TBS = {"H100": 3.35, "H200": 4.8, "B200": 8.0, "GB200": 8.0, "A100": 2.0, "L40S": 0.864, "cpu": 0.1}


def card_family(card: str) -> str:
    for k in sorted(BANDWIDTH_TBS, key=len, reverse=True):
        if k.lower() in card.lower():
            return k
    return "cpu" if card.lower().startswith("cpu") else card


def layer_params(c: Any) -> float:
    """Parameters of one layer, approximately (attention projections + routed and shared experts),
    from a config or a bench JSON's config summary; the experts dominate at real width."""
    g = (lambda k: c[k]) if isinstance(c, dict) else (lambda k: getattr(c, k))
    D, I, E, H, d = (g(k) for k in ("hidden_size", "moe_intermediate_size", "n_routed_experts",
                                     "num_attention_heads", "head_dim"))
    q, o = g("q_lora_rank"), g("o_lora_rank")
    return D * q + q * H * d + D * d + H * d * o + o * D + (E + 1) * 3 * D * I


def slowest_load(table: dict[str, Any], *, with_bytes: bool = False) -> dict[str, Any] | None:
    """The table's slowest measured model load (of those that recorded the bytes read, ``with_bytes``),
    or None when it measured none."""
    loads = [r for r in table.get("runs", [])
             if r.get("phase") == "load" and (r.get("disk_read_bytes") or not with_bytes)]
    return max(loads, key=lambda r: r["seconds"]) if loads else None


__all__ = ["BANDWIDTH_TBS", "card_family", "layer_params", "slowest_load"]
