import sys
from pathlib import Path

# tests import their shared helpers as a top-level module (also inside spawned workers)
sys.path.insert(0, str(Path(__file__).resolve().parent))
