import sys
from pathlib import Path

# The tools are stand-alone scripts, not a package: make them importable by name.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
