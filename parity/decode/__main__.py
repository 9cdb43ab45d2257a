"""``python -m parity.decode``."""
import sys

from .cli import main

sys.exit(main())
