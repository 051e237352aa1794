"""Load SSD Heads from a Hugging Face repo id + file, without network: the local HF cache layout, a file
already in models/ssd_heads, and the errors when the file is not here (download off, or offline)."""
import shutil

import pytest
import torch

from conftest import REF_DIR, heads_missing, load_pack, pack_module

nodes = load_pack()
core = pack_module("ssd_core")
folders_glue = pack_module("nodes._folders")
REPO, FILE = "someone/ssd-heads-reference", "v1/heads.safetensors"


@pytest.fixture()
def offline(tmp_path, monkeypatch):
    """An empty HF cache, HF_HUB_OFFLINE=1, and an ssd_heads folder; returns (cache dir, heads folder)."""
    hf_constants = pytest.importorskip("huggingface_hub.constants")
    cache, heads = tmp_path / "hf_cache", tmp_path / "ssd_heads"
    cache.mkdir()
    heads.mkdir()
    monkeypatch.setattr(hf_constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("SSD_HEADS_DIR", str(heads))
    return cache, heads


@pytest.fixture(scope="module")
def bare():
    if heads_missing():
        pytest.skip(heads_missing())
    return nodes.SSDLoadModel().load("reference", "auto", "cpu")[0]


def test_missing_file_without_download_names_repo_file_and_folder(offline, bare):
    _, heads = offline
    with pytest.raises(core.SSDError) as err:
        nodes.SSDLoadHeads().load(bare, "none", hub_repo=REPO, hub_file=FILE, download=False)
    msg = str(err.value)
    assert REPO in msg and FILE in msg and str(heads / REPO) in msg and "download" in msg
    assert not any(heads.rglob("*.safetensors"))


def test_offline_download_of_an_uncached_file_names_repo_file_and_folder(offline, bare):
    _, heads = offline
    with pytest.raises(core.SSDError) as err:
        nodes.SSDLoadHeads().load(bare, "none", hub_repo=REPO, hub_file=FILE, download=True)
    msg = str(err.value)
    assert REPO in msg and FILE in msg and str(heads / REPO) in msg and "could not download" in msg


def test_download_takes_the_file_from_the_hf_cache_layout_then_lists_and_reuses_it(offline, bare):
    cache, heads = offline
    snapshot = cache / f"models--{REPO.replace('/', '--')}" / "snapshots" / "0123abc"
    (snapshot / "v1").mkdir(parents=True)
    shutil.copyfile(REF_DIR / "heads.safetensors", snapshot / FILE)
    (cache / f"models--{REPO.replace('/', '--')}" / "refs").mkdir()
    (cache / f"models--{REPO.replace('/', '--')}" / "refs" / "main").write_text("0123abc")
    (m,) = nodes.SSDLoadHeads().load(bare, "none", hub_repo=REPO, hub_file=FILE, download=True)
    kept = heads / REPO / FILE
    assert kept.is_file() and m.heads is not None and m.heads_name == f"{REPO}/{FILE}"
    assert f"{REPO}/{FILE}" in folders_glue.heads_choices()  # now in the heads list too
    reference = core.load_heads("reference", bare.model)
    assert all(torch.equal(a, b) for a, b in zip(m.heads.state_dict().values(), reference.state_dict().values()))
    shutil.rmtree(cache)  # the copy in models/ssd_heads is enough from now on, download off
    (again,) = nodes.SSDLoadHeads().load(bare, "none", hub_repo=REPO, hub_file=FILE, download=False)
    assert again.heads is not None


@pytest.mark.parametrize("repo, file", [("no-slash", "heads.safetensors"), ("a/b/c", "heads.safetensors"),
                                        ("a/..", "heads.safetensors"), ("a/b", "heads.pt"),
                                        ("a/b", "../escape.safetensors")])
def test_bad_repo_or_file_is_refused(offline, repo, file):
    with pytest.raises(core.SSDError, match="owner/name|safetensors path"):
        core.hub_file(repo, file, offline[1], download=True)
