"""``python -m quietgnn`` == ``quietgnn`` (also what torchrun's ``-m quietgnn`` runs)."""

import sys

from .cli import main

sys.exit(main())
