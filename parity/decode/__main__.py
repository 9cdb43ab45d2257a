"""``python -m parity.decode``."""
import sys

from .cli import build_parser, main  # noqa: F401  (build_parser: the GPU script's test parses its steps)

if __name__ == "__main__":
    sys.exit(main())
