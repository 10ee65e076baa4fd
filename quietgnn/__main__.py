"""``python -m quietgnn`` == ``quietgnn`` (also what torchrun's ``-m quietgnn`` runs)."""

from .cli import entry

entry()
