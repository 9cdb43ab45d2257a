class CheckpointError(ValueError):
    """A checkpoint that cannot be read as DeepSeek-V4: names the tensor or key, expected and found."""
