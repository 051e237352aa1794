"""Tooling, not runtime: the recipe that retrains the bundled reference model (ssd_core/reference/model/)
from scratch, and its dataset. Run from the repository root: python -m reference_recipe --help."""
