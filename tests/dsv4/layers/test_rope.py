"""RoPE layout (interleaved pairs on the trailing dims), inverse, relativity, YaRN frequencies (spec §5, §11)."""
from __future__ import annotations

import math

import torch

from dsv4.config import preset
from dsv4.layers.rope import Rope, rope_omega

from .helpers import rand


def test_rotates_adjacent_pairs_of_the_trailing_dims_only():
    omega = torch.tensor([0.5, 0.25])
    rope = Rope(omega, 4)
    x = torch.arange(1.0, 9.0)[None]          # nope dims [1..4], rope pairs (5,6), (7,8)
    y = rope.apply(x, torch.tensor([2]))
    assert torch.equal(y[0, :4], x[0, :4])
    a = 2 * 0.5
    torch.testing.assert_close(y[0, 4:6], torch.tensor([5 * math.cos(a) - 6 * math.sin(a),
                                                        5 * math.sin(a) + 6 * math.cos(a)]))
    b = 2 * 0.25
    torch.testing.assert_close(y[0, 6:8], torch.tensor([7 * math.cos(b) - 8 * math.sin(b),
                                                        7 * math.sin(b) + 8 * math.cos(b)]))


def test_inverse_undoes_and_scores_depend_on_relative_position():
    rope = Rope(rope_omega(preset("tiny"), compressed=True), 64)
    q, k = rand(1, 3, 128, seed=1), rand(1, 128, seed=2)
    pos = torch.tensor([37])
    torch.testing.assert_close(rope.apply(rope.apply(q, pos), pos, inverse=True), q, rtol=1e-5, atol=1e-5)
    d1 = (rope.apply(q, torch.tensor([50]))[0] @ rope.apply(k, torch.tensor([40]))[0])
    d2 = (rope.apply(q, torch.tensor([20]))[0] @ rope.apply(k, torch.tensor([10]))[0])
    torch.testing.assert_close(d1, d2, rtol=1e-4, atol=1e-4)


def test_yarn_blend_for_compressed_layers_and_plain_theta_for_window_layers():
    c = preset("flash")
    base = 1.0 / (c.compress_rope_theta ** (torch.arange(0, 64, 2, dtype=torch.float32) / 64))
    y = rope_omega(c, compressed=True)
    torch.testing.assert_close(y[:16], base[:16])             # lo = 15: pairs 0..15 keep their frequency
    torch.testing.assert_close(y[25:], base[25:] / 16)        # hi = 25: pairs >= 25 divided by 16
    assert ((y[16:25] < base[16:25]) & (y[16:25] > base[16:25] / 16)).all()
    plain = rope_omega(c, compressed=False)
    torch.testing.assert_close(plain, 1.0 / (1e4 ** (torch.arange(0, 64, 2, dtype=torch.float32) / 64)))
