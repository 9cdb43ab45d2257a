"""Built-in kernel faults judged by the kernel audit (bug_budget column): subtle bugs of the kind kernel
engineers write, each in a stand-in backend (a copy of ``emulated`` with one piece replaced, see
:mod:`parity.bugzoo.backends`). Every layer runs the faulty kernel; the expectation is the first call
in execution order that the fault touches (layer 0 here).

=================================  ===========================================  ==================
fault                              what the kernel does wrong                   first hit
=================================  ===========================================  ==================
kernel_weight_scale_neighbour      1 weight scale in 256 read from its          attn_q (wq_a)
                                   neighbour (scale-tile address off by one)
kernel_ktail_tile_dropped          k-tile of 192: the partial last tile of a    attn_q (wq_a, K=256)
                                   K not divisible by 192 is never accumulated
kernel_tile_row_unwritten          fused-SwiGLU grouped GEMM: last row of each  routed_experts (w13)
                                   16-row tile never stored
kernel_act_scale_1_in_64           activation quantizer: 1 block scale in 64    attn_q (wq_a input)
                                   stored one E4M3 code too large
kernel_alpha_of_next_expert        grouped GEMM: group e scaled with group      attn_o (wo_a groups)
                                   e+1's alpha (global scale)
=================================  ===========================================  ==================
"""
from __future__ import annotations

from typing import Any, Iterator

from .backends import act_scale_bumped, alpha_of_next_expert, kernel_fault, ktail_dropped, scale_from_neighbour, swap_backend, \
    tile_row_unwritten
from .around import Around
from .registry import register_fault

# Each fault twice: its stand-in (a copy of emulated with the piece replaced) and, as ``around``, the
# same fault injected around a real kernel's calls, which the zoo uses wherever a kernel backend runs.
SCALE_NEIGHBOUR = kernel_fault("bugzoo-kernel-scale-neighbour", weight_scales=scale_from_neighbour,
                               around=Around(weight_scale_bytes=scale_from_neighbour))
KTAIL = kernel_fault("bugzoo-kernel-ktail-dropped", matmul=ktail_dropped(192),
                     around=Around(a_code_tail=lambda k: (k // 192) * 192 if k > 192 else None))
ROW_UNWRITTEN = kernel_fault("bugzoo-kernel-row-unwritten", rows=tile_row_unwritten,
                             around=Around(output_rows=tile_row_unwritten))
ACT_SCALE = kernel_fault("bugzoo-kernel-act-scale-1-in-64", act_scales=act_scale_bumped,
                         around=Around(act_scale_bytes=act_scale_bumped))
NEXT_ALPHA = kernel_fault("bugzoo-kernel-alpha-of-next-expert", alpha_of=alpha_of_next_expert,
                          around=Around(expert_shift=1))


@register_fault("kernel_weight_scale_neighbour", layer=0, component="attn_q", column="bug_budget",
                backend=SCALE_NEIGHBOUR,
                description="Kernel bug: one weight block scale in 256 is read from its neighbour (an "
                            "off-by-one in the scale-tile address); a few output columns per weight are off.")
def kernel_weight_scale_neighbour(model: Any) -> Iterator[None]:
    with swap_backend(model, SCALE_NEIGHBOUR):
        yield


@register_fault("kernel_ktail_tile_dropped", layer=0, component="attn_q", column="bug_budget", backend=KTAIL,
                description="Kernel bug: with k-tiles of 192, the partial last tile of a K not divisible by 192 "
                            "(K = 256 here) is never accumulated; GEMMs with K <= 192 are right.")
def kernel_ktail_tile_dropped(model: Any) -> Iterator[None]:
    with swap_backend(model, KTAIL):
        yield


@register_fault("kernel_tile_row_unwritten", layer=0, component="routed_experts", column="bug_budget",
                backend=ROW_UNWRITTEN,
                description="Kernel bug: the fused-SwiGLU grouped GEMM never stores the last row of each "
                            "16-row output tile (left zero).")
def kernel_tile_row_unwritten(model: Any) -> Iterator[None]:
    with swap_backend(model, ROW_UNWRITTEN):
        yield


@register_fault("kernel_act_scale_1_in_64", layer=0, component="attn_q", column="bug_budget", backend=ACT_SCALE,
                description="Kernel bug: the activation quantizer stores one block scale in 64 one E4M3 code too "
                            "large (the codes were computed with the right scale): 1 block in 64 dequantizes "
                            "~6-12 % too large.")
def kernel_act_scale_1_in_64(model: Any) -> Iterator[None]:
    with swap_backend(model, ACT_SCALE):
        yield


@register_fault("kernel_alpha_of_next_expert", layer=0, component="attn_o", column="bug_budget", backend=NEXT_ALPHA,
                description="Kernel bug: the grouped GEMM scales group e with group e+1's alpha (per-group global "
                            "scale pointer advanced once too often); first hit: wo_a's head groups.")
def kernel_alpha_of_next_expert(model: Any) -> Iterator[None]:
    with swap_backend(model, NEXT_ALPHA):
        yield
