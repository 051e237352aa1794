"""Developer tooling, outside the runtime package (left out of the published pack by .comfyignore):
benches, GPU checks, experiments, random-weight models of the released shapes, the README's results table.
Run from the repository root: `python -m tools.<name>` (tools/make_icon.py, tools/readme_results.py: as scripts)."""
