"""Generation loops over the model surface (dsv4.decode.loop): step numbering, forcing, choosing,
probes at chosen steps, request checks, the memory meter. CPU, the tiny native model (emulated)."""
from __future__ import annotations

import mmap

import pytest
import torch

import dsv4
from dsv4.decode.loop import DecodeInputError, MemoryMeter, Sampler, check_request, greedy, model_devices, run_steps

PROMPT = torch.tensor([0, 5, 17, 42, 99, 7, 300, 12, 8, 64], dtype=torch.int64)


@pytest.fixture(scope="module")
def model():
    torch.set_num_threads(1)
    return dsv4.load_model("tiny", plan="all-bf16", backend="emulated")


def test_greedy_steps_follow_the_convention_and_match_manual_decoding(model) -> None:
    steps = list(run_steps(model, PROMPT, 6))
    P = PROMPT.numel()
    assert [s.step for s in steps] == list(range(6))
    assert [s.position for s in steps] == [P - 1 + s for s in range(6)]
    assert steps[0].fed is None and [s.fed for s in steps[1:]] == [s.target for s in steps[:-1]]
    # the same thing by hand, through the surface
    with torch.no_grad():
        logits, state = model.prefill(PROMPT)
        tok = int(logits[-1].argmax())
        assert torch.equal(steps[0].logits, logits[-1].float())
        for s in steps[1:]:
            out = model.decode_step(state, tok)
            assert torch.equal(s.logits, out.float()) and s.fed == tok
            tok = int(out.argmax())
    assert all(s.target == greedy(s.logits) for s in steps)


def test_forced_tokens_are_fed_and_are_the_targets(model) -> None:
    forced = [3, 1, 4, 1, 5]
    steps = list(run_steps(model, PROMPT, 5, forced=forced))
    assert [s.target for s in steps] == forced
    assert [s.fed for s in steps[1:]] == forced[:4]


def test_sampler_is_seeded_and_differs_from_greedy(model) -> None:
    a = [s.target for s in run_steps(model, PROMPT, 12, choose=Sampler(1.5, seed=3))]
    b = [s.target for s in run_steps(model, PROMPT, 12, choose=Sampler(1.5, seed=3))]
    g = [s.target for s in run_steps(model, PROMPT, 12)]
    assert a == b and a != g


def test_probes_are_recorded_at_the_requested_steps_only(model) -> None:
    steps = list(run_steps(model, PROMPT, 5, probe_steps=[2, 4]))
    assert [s.step for s in steps if s.probes is not None] == [2, 4]
    pr = steps[2].probes
    assert pr["logits"].shape == (1, model.config.vocab_size)
    assert torch.equal(pr["logits"][0].float(), steps[2].logits)
    assert pr["layers.0.attn.q"].shape[0] == 1     # one decode token


def test_step_fn_replaces_decode_step(model) -> None:
    calls = []

    def step_fn(state, tok):
        calls.append(tok)
        return model.decode_step(state, tok)

    steps = list(run_steps(model, PROMPT, 4, step_fn=step_fn))
    assert calls == [s.target for s in steps[:-1]]


def test_request_checks_name_the_problem(model) -> None:
    c = model.config
    with pytest.raises(DecodeInputError, match="max_position_embeddings=1024"):
        check_request(c, 1000, 30, None, ())
    check_request(c, 1000, 25, None, ())          # writes position 1023: the last one allowed
    with pytest.raises(DecodeInputError, match="at least 5"):
        check_request(c, 10, 5, [1, 2], ())
    with pytest.raises(DecodeInputError, match=r"ids in \[0, 512\)"):
        check_request(c, 10, 2, [1, 600], ())
    with pytest.raises(DecodeInputError, match="probe steps"):
        check_request(c, 10, 5, None, [0])
    with pytest.raises(DecodeInputError, match="at least 1"):
        check_request(c, 10, 0, None, ())
    with pytest.raises(DecodeInputError, match="temperature"):
        Sampler(0.0)


def test_memory_meter_on_cpu_reads_the_resident_set(model) -> None:
    m = MemoryMeter(model_devices(model))
    assert model_devices(model) == ["cpu"] and m.kind == "cpu_rss"
    before = m.read()
    # a fresh anonymous mapping, every page written: an allocator may hand back freed pages that are still
    # resident (a torch tensor here once left the resident set unchanged after an earlier test)
    blob = mmap.mmap(-1, 64 << 20)
    blob.write(b"\x01" * (64 << 20))
    assert m.read() - before >= 32 << 20
    blob.close()
