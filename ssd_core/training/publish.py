"""`train-heads --push-to-hub REPO`: the trained heads file and a model card, in one commit to a Hugging Face
model repo. Only when asked, and only with a token (`huggingface-cli login`, or HF_TOKEN).

Checked before the run starts, without the network: the repo id's form (owner/name), that huggingface_hub is
installed, that a token is found, and the --bench-json file. Not checked until the push, after training (they
need the network): that the token is valid and may write to the repo. A push that fails keeps the heads file
and says how to upload it. The Load SSD Heads node downloads them again (hub_repo REPO, hub_file
heads.safetensors)."""
from __future__ import annotations

import os

from ..errors import SSDError, shown
from . import data

HUB_FILE = "heads.safetensors"
MAX_BENCH_ROWS = 1000  # rows of a bench file in the model card (bench writes one a decoder)


def _token() -> str | None:
    token = os.environ.get("HF_TOKEN")
    if token:
        return token
    try:
        from huggingface_hub import get_token
    except ImportError:
        return None
    return get_token()


def check(repo_id) -> str:
    """The repo id (owner/name) and a token to push with, refused before any training; offline: whether the
    token may write to the repo is known only when pushing."""
    from ..hub import hub_repo_id

    repo = hub_repo_id(repo_id)
    try:
        import huggingface_hub  # noqa: F401
    except ImportError:
        raise SSDError("--push-to-hub needs the huggingface_hub package (pip install huggingface_hub)") from None
    if not _token():
        raise SSDError(f"--push-to-hub {repo} needs a Hugging Face token with write access and none was found: run "
                       "`huggingface-cli login` or set HF_TOKEN, then start again (nothing was trained)")
    return repo


def read_bench(path) -> dict:
    """A `bench --json` file (its rows go into the model card): a JSON object of sane size and depth whose
    'rows' are objects (data.read_json_file); anything else one SSDError line before the run."""
    fix = "give the file `bench --json FILE` wrote"
    bench = data.read_json_file(path, "--bench-json", fix)
    rows = bench.get("rows")
    if not isinstance(rows, list):
        raise SSDError(f"--bench-json {path} has no 'rows' list: {fix}")
    if len(rows) > MAX_BENCH_ROWS:
        raise SSDError(f"--bench-json {path} has {len(rows):,} rows, more than the {MAX_BENCH_ROWS} of a model card "
                       f"(one a decoder): {fix}")
    for i, row in enumerate(rows):
        if not isinstance(row, dict):
            raise SSDError(f"--bench-json {path}: row {i} is {shown(row)}, not an object (decoder, steps, ...): {fix}")
    return bench


def _fmt(value) -> str:
    """A table cell: a float to 3 places; anything else as text on one line, without the table's '|', cut."""
    text = f"{value:.3f}" if isinstance(value, float) else str(value)
    return " ".join(text.replace("|", "/").split())[:80]


def model_card(repo_id: str, report: dict, bench: dict | None = None, base_repo: str | None = None) -> str:
    """A README.md: the base model, the data, the held-out acceptance by head and the bench figures."""
    base = report.get("base_model", "?")
    front = ["---", "library_name: comfyui-ssd", "tags:", "- speculative-decoding", "- ssd-draft-heads",
             "- image-generation"]
    if base_repo:
        front.append(f"base_model: {base_repo}")
    front.append("---")
    lines = front + [
        "", f"# SSD draft heads for {base}", "",
        "Draft heads for spatially speculative decoding (SSD) of an autoregressive image model: a horizontal head "
        "(Hh) drafts along a row, a vertical head (Hv) drafts the next row from the one above; the base model "
        "verifies every draft, so `ssd-exact` gives the base model's own image in fewer steps.",
        "Trained with `python -m ssd_core train-heads` (ComfyUI-SSD).", "",
        "## Base model", "",
        "| | |", "|---|---|",
        f"| model | {base}{f' ({base_repo})' if base_repo else ''} |",
        f"| dtype | {report.get('base_dtype', '?')} |",
        f"| quantization | {report.get('base_quantization', 'none')} |", "",
        "The heads read the features of this model as loaded here (dtype, quantization); with another "
        "quantization the acceptance can be lower.", "",
        "## Data", "",
        f"- {report.get('samples', '?')} training grids"
        + (f", {report['self_distilled']} self-distilled by the base model (prompts: {report.get('prompts', '?')})"
           if report.get("self_distilled") else " (given grids)"),
        f"- {report.get('heldout', '?')} held-out grids", "",
        "## Training", "",
        f"- {report.get('steps')} steps of {report.get('batch_grids')} grids ({report.get('epochs')} epochs at most), "
        f"lr {report.get('lr')}, {report.get('processes', 1)} process(es); heads trained: {report.get('trained')}, "
        f"init: {report.get('init')}",
        f"- losses: Smooth-L1 on features, KL weight {report.get('kl_weight')}, TV weight {report.get('tv_weight')}, "
        f"CE weight {report.get('ce_weight')}; Hv reads left {report.get('vertical_left')}, shift "
        f"{report.get('vertical_shift')}", "",
        "## Held-out acceptance by head", "",
        "Expected acceptance sum_v min(p, q) of the drafts on the held-out grids (1 = every draft accepted), with "
        "top-1 agreement beside it.", "",
        "| head | expected acceptance | top-1 agreement |", "|---|---|---|",
        f"| Hh (row chains) | {_fmt(report.get('horizontal_expected'))} | {_fmt(report.get('horizontal_top1'))} |",
        f"| Hv (rows below) | {_fmt(report.get('vertical_expected'))} | {_fmt(report.get('vertical_top1'))} |",
        f"| both, as ssd drafts | {_fmt(report.get('expected_acceptance'))} | |",
    ]
    if "vertical_stale_expected" in report:
        lines.append(f"| Hv on stale inputs | {_fmt(report['vertical_stale_expected'])} | |")
    if bench:
        lines += ["", "## Bench", "", "| decoder | steps | step ratio | wall ratio | identical to ar |",
                  "|---|---|---|---|---|"]
        for row in bench["rows"]:
            lines.append(f"| {row.get('decoder')} | {_fmt(row.get('steps'))} | {_fmt(row.get('step_ratio'))} | "
                         f"{_fmt(row.get('wall_ratio'))} | {row.get('identical_to_ar')} |")
    lines += ["", "## Use", "",
              f"ComfyUI: **Load SSD Heads** with hub_repo `{repo_id}`, hub_file `{HUB_FILE}`, download on.",
              f"Command line: download `{HUB_FILE}` and run `python -m ssd_core generate --model MODEL_DIR --heads "
              f"{HUB_FILE} --decoder ssd-exact`; check it with `python -m ssd_core bench --heads {HUB_FILE}`.", ""]
    return "\n".join(lines)


def base_repo_of(report: dict) -> str | None:
    """The base model's Hub id when the model folder is named as a known repo (e.g. Janus-Pro-7B)."""
    from ..families import FAMILIES

    name = str(report.get("base_model", ""))
    for cls in FAMILIES.values():
        for repo in getattr(cls, "repo_ids", ()):
            if repo.split("/")[-1] == name:
                return repo
    return None


def push(repo_id: str, heads_path, report: dict, bench: dict | None = None) -> str:
    """Upload the heads file and its model card in one commit; returns the repo's URL."""
    from huggingface_hub import CommitOperationAdd, HfApi

    card = model_card(repo_id, report, bench, base_repo_of(report))
    api = HfApi(token=_token())
    try:
        api.create_repo(repo_id, repo_type="model", exist_ok=True)
        api.create_commit(repo_id, repo_type="model", commit_message="SSD draft heads (train-heads)",
                          operations=[CommitOperationAdd(path_in_repo=HUB_FILE, path_or_fileobj=str(heads_path)),
                                      CommitOperationAdd(path_in_repo="README.md",
                                                         path_or_fileobj=card.encode("utf-8"))])
    except Exception as err:  # network, permissions, a token without write access
        reason = " ".join(str(err).split())[:160]
        raise SSDError(f"could not push to {repo_id} ({reason}); the heads are in {heads_path}: push them later with "
                       f"`huggingface-cli upload {repo_id} {heads_path} {HUB_FILE}`") from None
    return f"https://huggingface.co/{repo_id}"
