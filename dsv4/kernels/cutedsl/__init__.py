"""CuTe DSL NVFP4 kernels (sm_90a Hopper emulation, sm_100a Blackwell block-scaled MMA).

Importing this package does not import ``cutlass``; the kernel modules do, lazily. Host-side
validation and the compiled-kernel cache live in ``common``; registration in ``register``.
"""
