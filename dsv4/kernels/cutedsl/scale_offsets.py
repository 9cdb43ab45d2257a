"""Byte offsets into the 32_4_4 (``swizzled``) block-scale layout, as plain arithmetic: the CuTe DSL
kernels trace it on ``Int32`` values and the CPU tests run it on ints and numpy arrays.

Row ``128*mt + 32*r1 + r0`` and scale column ``4*kt + c`` of a matrix with ``sc_pad`` (a multiple of 4)
scale columns go to ``((mt*(sc_pad/4) + kt)*32 + r0)*16 + r1*4 + c`` (``common.swizzle_linear_scales``
writes the same layout in torch)."""
from __future__ import annotations


def swizzled_scale_offset(row, col, sc_pad):
    return (((row // 128) * (sc_pad // 4) + col // 4) * 512 + (row % 32) * 16
            + ((row // 32) % 4) * 4 + col % 4)
