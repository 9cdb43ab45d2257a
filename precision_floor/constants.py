"""Names the precision-floor CLIs need before any heavy import (argument parsing, ``--help``)."""

# The component classes a flip table toggles between FP4 and BF16 (kv_cache is not a weight format).
FLIP_CLASSES = ("lm_head", "router", "shared_expert", "compressor", "indexer_weights", "indexer_q", "attn_q",
                "attn_kv", "attn_o", "routed_experts")
