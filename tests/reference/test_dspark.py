"""The reference DSpark draft (docs/dspark.md): lossless greedy speculation, the accept rule, the
rings, the capture of the target layers, the Markov correction and the confidence head, each
against its equation on the tiny 0731 flavor."""
from __future__ import annotations

import pytest
import torch

import reference
from dsv4 import probes
from dsv4.checkpoint.synth import resolve_preset
from reference.dspark import Draft, DSparkReference

PROMPT = torch.tensor([1, 5, 9, 33, 70, 12, 100, 7, 3, 44, 61, 2, 90, 17, 8, 250, 4, 33, 19, 6], dtype=torch.int64)


@pytest.fixture(scope="module")
def model() -> reference.ReferenceModel:
    return reference.load_model(str(resolve_preset("tiny", flavor="official-dspark", seed=0)), dtype=torch.float32)


@pytest.fixture(scope="module")
def plain(model) -> list[int]:
    """Plain greedy decoding of the trunk: what speculation must reproduce."""
    logits, st = model.prefill(PROMPT)
    toks = [int(torch.argmax(logits[-1]))]
    while len(toks) < 24:
        toks.append(int(torch.argmax(model.decode_step(st, toks[-1]))))
    return toks


@pytest.mark.parametrize("profile,dtype", [("bf16", torch.float32), ("official", torch.bfloat16)])
def test_speculative_output_equals_plain_greedy(profile, dtype) -> None:
    model = reference.load_model(str(resolve_preset("tiny", flavor="official-dspark", seed=0)), profile=profile,
                                 dtype=dtype)
    logits, st = model.prefill(PROMPT)
    plain = [int(torch.argmax(logits[-1]))]
    while len(plain) < 24:
        plain.append(int(torch.argmax(model.decode_step(st, plain[-1]))))
    res = DSparkReference(model).generate(PROMPT, 24)
    assert res.tokens == plain
    assert all(0 <= a <= 5 for a in res.accepted) and 1 <= res.acceptance_length <= 6


@pytest.mark.parametrize("oracle", [True, False])
def test_accept_rule_takes_the_agreeing_prefix_plus_the_bonus(model, plain, monkeypatch, oracle) -> None:
    """A draft that proposes the target's own next tokens is accepted whole (τ = γ + 1); one that is
    always wrong keeps only the bonus (τ = 1); the output is the plain greedy text either way."""
    ds = DSparkReference(model)
    real = ds.draft

    def draft(state, anchor, *args):
        d = real(state, anchor, *args)                 # the real draft runs; only its tokens are replaced
        i = state.pos - len(PROMPT) + 1          # index in `plain` of the token after the anchor
        assert plain[i - 1] == anchor
        want = plain[i:i + ds.gamma] if oracle else [(t + 1) % model.config.vocab_size for t in plain[i:i + ds.gamma]]
        want += [0] * (ds.gamma - len(want))
        return Draft(want, d.logits, d.base_logits, d.confidence)

    monkeypatch.setattr(ds, "draft", draft)
    res = ds.generate(PROMPT, 19)
    assert res.tokens == plain[:19]
    assert res.accepted == ([5, 5, 5] if oracle else [0] * 18)


def test_capture_is_the_stream_mean_after_each_target_layer_in_config_order(model) -> None:
    ds = DSparkReference(model)
    with probes.ProbeRecorder() as rec:
        _, mh = ds.trunk(model.new_state(PROMPT))
    D = model.config.hidden_size
    for b, layer in enumerate(model.config.dspark_target_layer_ids):                          # Eq 1-2
        want = rec.values[f"layers.{layer}.out"].double().mean(dim=1).float()
        assert torch.equal(mh[:, b * D:(b + 1) * D], want)


def test_rings_hold_the_last_window_of_context_at_slot_position_mod_w(model) -> None:
    ds = DSparkReference(model)
    W = model.config.sliding_window
    _, mh = ds.trunk(model.new_state(PROMPT))            # 20 positions > W = 16
    whole = ds.new_state()
    ds.commit(whole, mh)
    split = ds.new_state()
    ds.commit(split, mh[:13])
    ds.commit(split, mh[13:])
    assert whole.pos == split.pos == len(PROMPT) and W < len(PROMPT)
    for a, b in zip(whole.rings, split.rings):
        assert torch.equal(a, b)                          # Eq 5: one write per position, slot t mod W
    one = ds.new_state()
    ds.commit(one, mh[:1])
    assert one.rings[0][1:].abs().sum() == 0 and one.rings[0][0].abs().sum() > 0


def test_markov_correction_and_confidence_follow_their_equations(model) -> None:
    ds = DSparkReference(model)
    st = model.new_state(PROMPT)
    logits, mh = ds.trunk(st)
    dst = ds.new_state()
    ds.commit(dst, mh)
    anchor = int(torch.argmax(logits[-1]))
    with probes.ProbeRecorder() as rec:
        d = ds.draft(dst, anchor)
    last = f"mtp.{ds.stages - 1}."
    w1 = model.store.get(last + "markov_head.markov_w1", None, "cpu")
    w2 = model.store.get(last + "markov_head.markov_w2", None, "cpu", True).double()
    wc = model.store.get(last + "confidence_head.proj", None, "cpu", True).double().reshape(-1)
    z = rec.values["dspark.hc_head"]
    prev = [anchor] + d.tokens[:-1]                        # row 0 is corrected from the anchor (Eq 17)
    for r in range(ds.gamma):
        bias = (w2 @ w1[prev[r]].double()).float()
        assert torch.allclose(d.logits[r] - d.base_logits[r], bias, atol=1e-5)
        assert d.tokens[r] == int(torch.argmax(d.logits[r]))
        c = wc @ torch.cat((z[r].double(), w1[prev[r]].double()))                            # Eq 18: raw logit
        assert abs(float(d.confidence[r]) - float(c)) < 1e-4


def test_block_attention_is_non_causal_and_reads_only_valid_ring_slots(model) -> None:
    """Row 0 sees the later block rows (non-causal, Eq 12); zeroing a ring slot that holds no context
    yet changes nothing; a slot that does hold context changes the draft."""
    ds = DSparkReference(model)
    _, mh = ds.trunk(model.new_state(PROMPT[:6]))
    st = ds.new_state()
    ds.commit(st, mh)
    base = ds.draft(st, 7).base_logits
    noise = model.config.dspark_noise_token_id
    try:
        model.config.__dict__["dspark_noise_token_id"] = (noise + 1) % model.config.vocab_size
        other = ds.draft(st, 7).base_logits
    finally:
        model.config.__dict__["dspark_noise_token_id"] = noise
    assert not torch.equal(base[0], other[0])            # row 0 attends to the noise rows' keys
    for ring in st.rings:
        ring[10] = 1e3                                   # slot 10: no context at 6 positions
    assert torch.equal(ds.draft(st, 7).base_logits, base)
    for ring in st.rings:
        ring[2] = 1e3
    assert not torch.equal(ds.draft(st, 7).base_logits, base)


def test_a_checkpoint_without_dspark_is_refused_by_name() -> None:
    m = reference.load_model(str(resolve_preset("tiny", flavor="nvidia-nvfp4", seed=0)))
    with pytest.raises(ValueError, match="DSpark: expected a checkpoint with dspark_"):
        DSparkReference(m)


def test_rejection_sampling_commits_tokens_distributed_as_the_target() -> None:
    """Statistical (the noise is real: 40,000 draws): the first committed token of a step is distributed
    as the target's q_0 whatever the draft's p, checked per token within 5 binomial SEs (a draft
    token accepted without the min(1, q/p) rule would move it by ~0.1, i.e. >20 SE)."""
    from reference.dspark import rejection_accept

    gen = torch.Generator().manual_seed(0)
    V, g, N = 5, 2, 40_000
    p = torch.softmax(torch.randn(g, V, generator=gen) * 2, dim=-1)
    q = torch.softmax(torch.randn(g + 1, V, generator=gen) * 2, dim=-1)
    first = torch.zeros(V)
    for _ in range(N):
        toks = [int(torch.multinomial(p[j], 1, generator=gen)) for j in range(g)]
        n, nxt = rejection_accept(p, q, toks, gen)
        first[toks[0] if n >= 1 else nxt] += 1
    freq, se = first / N, (q[0] * (1 - q[0]) / N).sqrt()
    assert ((freq - q[0]).abs() <= 5 * se + 1e-9).all(), (freq, q[0])
    with pytest.raises(ValueError, match="expected draft probs"):
        rejection_accept(p, q[:2], [0, 1])


def test_sampled_speculation_is_reproducible_and_commits_whole_steps(model) -> None:
    ds = DSparkReference(model)
    runs = [ds.generate(PROMPT, 16, temperature=0.8, generator=torch.Generator().manual_seed(3)) for _ in range(2)]
    assert runs[0].tokens == runs[1].tokens and len(runs[0].tokens) == 16
    assert sum(a + 1 for a in runs[0].accepted) >= 15 and all(0 <= a <= ds.gamma for a in runs[0].accepted)
