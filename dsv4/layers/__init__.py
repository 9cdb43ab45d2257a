"""Layers of the native NVFP4 model: small objects, one numerically meaningful step per method."""
