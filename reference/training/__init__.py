"""Training the tiny DeepSeek-V4 the parity tools run on by default (docs/trained-model.md).

The model is the reference's own math: :mod:`.params` hands the reference model trainable tensors
in place of dequantized checkpoint weights and runs its layer functions with autograd, so there is
no third implementation of the architecture. ``python -m reference.training --out DIR``."""
