"""Tables derived from records (pure functions of a records DataFrame, pandas): the stat block per
pair, the per-layer cosine summary of the three columns, and the selection-agreement summary.
The CLIs render these; the JSON summary stores them; the HTML report can reuse them."""
from __future__ import annotations

import math


import pandas as pd

from .records import ALL_PROMPTS

STAT_ROWS: tuple[tuple[str, str, str | None], ...] = (
    # (label, metric, its standard-error metric)
    ("KL mean", "kl_mean", "kl_se"),
    ("KL p50", "kl_p50", None), ("KL p90", "kl_p90", None), ("KL p99", "kl_p99", None),
    ("KL p99.9", "kl_p99.9", None), ("KL max", "kl_max", None),
    ("top-1 agreement", "top1_agree_rate", "top1_agree_se"),
    ("top-1 agreement (near ties forgiven)", "top1_agree_tieaware_rate", None),
    ("near-tie positions", "near_tie_rate", None),
    ("top-5 overlap", "topk_overlap_mean", None),
    ("dp mean", "dp_mean", "dp_se"), ("RMS dp", "dp_rms", "dp_rms_se"),
    ("dp p1", "dp_p1", None), ("dp p99", "dp_p99", None),
    ("ln(PPL test / PPL ref)", "ln_ppl_ratio_mean", "ln_ppl_ratio_se"),
    ("first token: KL mean", "first_kl_mean", "first_kl_se"),
    ("first token: top-1 agreement", "first_top1_agree_rate", "first_top1_agree_se"),
    ("first token: top-1 (near ties forgiven)", "first_top1_agree_tieaware_rate", None),
    ("positions scored", "n_positions", None),
)


def stat_block(df: pd.DataFrame, pair: str, mode: str = "propagated") -> dict[str, tuple[float, float | None]]:
    """label -> (value, standard error or None) of the run-level logits aggregates of one pair."""
    rows = df[(df["pair"] == pair) & (df["compare_mode"] == mode) & (df["prompt_id"] == ALL_PROMPTS)
              & (df["probe"] == "logits")]
    vals = dict(zip(rows["metric"], rows["value"]))
    out: dict[str, tuple[float, float | None]] = {}
    for label, metric, se in STAT_ROWS:
        if metric in vals:
            s = vals.get(se) if se else None
            out[label] = (float(vals[metric]), None if s is None or math.isnan(s) else float(s))
    return out


def layer_cosines(df: pd.DataFrame) -> pd.DataFrame:
    """Per layer (and 'global' for embed/head probes) and pair: the worst propagated cosine of the
    layer's output (``layers.i.out``; ``logits`` for global) and the worst isolated cosine over the
    layer's probes with the probe it came from. Worst = minimum over prompts."""
    cos = df[(df["metric"] == "cosine") & (df["prompt_id"] != ALL_PROMPTS)]
    rows = []
    for (pair, layer), g in cos.groupby(["pair", cos["layer"].fillna(-1)], sort=False):
        lyr = None if layer == -1 else int(layer)
        out_probe = "logits" if lyr is None else f"layers.{lyr}.out"
        prop = g[(g["compare_mode"] == "propagated") & (g["probe"] == out_probe)]["value"]
        iso = g[g["compare_mode"] == "isolated"]
        worst = iso.loc[iso["value"].idxmin()] if not iso.empty else None
        rows.append({"pair": pair, "layer": lyr, "out_probe": out_probe,
                     "propagated_out_cos": float(prop.min()) if not prop.empty else math.nan,
                     "isolated_worst_cos": float(worst["value"]) if worst is not None else math.nan,
                     "isolated_worst_probe": worst["probe"] if worst is not None else ""})
    return pd.DataFrame(rows)


SELECTION_SUMMARY = (("router_jaccard_min", "min"), ("router_flip_rate", "max"), ("router_clear_flip_rate", "max"),
                     ("hash_route_exact", "min"), ("indexer_topk_overlap_mean", "min"),
                     ("indexer_clear_flip_rate", "max"), ("entry_count_match", "min"))


def selection_summary(df: pd.DataFrame, mode: str = "propagated") -> pd.DataFrame:
    """Per pair and layer: worst selection agreement over prompts."""
    sel = df[(df["compare_mode"] == mode) & df["metric"].isin([m for m, _ in SELECTION_SUMMARY])]
    if sel.empty:
        return pd.DataFrame()
    agg = {m: how for m, how in SELECTION_SUMMARY}
    # entry_count_match comes from two probes (compressed_kv, indexer.k); min covers both.
    table = sel.groupby(["pair", "layer", "metric"])["value"].agg(list).reset_index()
    table["value"] = [min(v) if agg[m] == "min" else max(v) for m, v in zip(table["metric"], table["value"])]
    return table.pivot_table(index=["pair", "layer"], columns="metric", values="value", sort=False).reset_index()
