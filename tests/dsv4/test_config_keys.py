"""Every key transformers 5.23's DeepseekV4Config writes is known: interpreted, fixed to DeepSeek-V4's
value (any other refused with its reason) or harmless (recorded in the provenance). The key set is read
from transformers itself, so a new transformers key fails here first."""
from __future__ import annotations

import pytest

from dsv4.config import ConfigError, DSV4Config, preset
from dsv4.config_keys import (ENGINE_KEYS, FIXED, HF_META_KEYS, KNOWN_KEYS, MODEL_KEYS, TRAINING_KEYS,
                              TRANSFORMERS_SAVED_EXTRAS)

transformers = pytest.importorskip("transformers")


def _tf_dicts() -> tuple[dict, dict]:
    from transformers import DeepseekV4Config

    c = DeepseekV4Config(**preset("tiny").to_transformers_dict())
    return c.to_dict(), c.to_diff_dict()


def test_every_transformers_key_is_known() -> None:
    full, diff = _tf_dicts()
    assert sorted(set(full) - KNOWN_KEYS) == []
    assert sorted(set(diff) - KNOWN_KEYS) == []
    # the classes are disjoint: a key has one fate
    groups = [MODEL_KEYS, set(FIXED), TRAINING_KEYS, HF_META_KEYS, ENGINE_KEYS]
    assert sum(len(g) for g in groups) == len(KNOWN_KEYS)


def test_full_transformers_dict_parses_and_records_harmless_keys() -> None:
    full, _ = _tf_dicts()
    c = DSV4Config.from_dict(full, "tf")
    assert c.replace(name="tiny", dtype="fp8", expert_dtype="fp4") == preset("tiny")
    assert set(c.ignored_keys) == set(full) & (TRAINING_KEYS | ENGINE_KEYS)
    assert "router_aux_loss_coef" in c.ignored_keys and "architectures" not in c.ignored_keys


def test_the_writer_adds_what_transformers_writes() -> None:
    _, diff = _tf_dicts()
    for k, v in TRANSFORMERS_SAVED_EXTRAS.items():
        assert k in diff and diff[k] == v, k


@pytest.mark.parametrize("key", sorted(FIXED))
def test_fixed_keys_refuse_another_value_with_the_reason(key) -> None:
    d = preset("tiny").to_transformers_dict()
    want, why = FIXED[key]
    other = (not want) if isinstance(want, bool) else "something-else"
    with pytest.raises(ConfigError, match=rf"{key}: expected {want!r} \(DeepSeek-V4\), found {other!r}"):
        DSV4Config.from_dict(dict(d, **{key: other}), "x")
    assert DSV4Config.from_dict(dict(d, **{key: want}), "x") == DSV4Config.from_dict(d, "x")


def test_an_unknown_key_is_still_an_error() -> None:
    d = dict(preset("tiny").to_transformers_dict(), engram_vocab_size=16000000)
    with pytest.raises(ConfigError, match=r"unexpected keys \['engram_vocab_size'\]"):
        DSV4Config.from_dict(d, "x")
