"""A new family is one class plus one registry line: the nodes list it, load it and sample it, unchanged.

The family below is a file's worth of GridModel around a tiny real LlamaForCausalLM (saved with save_pretrained,
its config.json naming the family's architecture). It is registered with one line, inside the test; nothing
under nodes/ knows it, yet the loader's model list offers its folder and loads it as that family, and the
sampler's grid list offers its sizes (tagged with its name) and samples it."""
import json
import re

import pytest
import torch

from conftest import ROOT, load_pack, pack_module

nodes = load_pack()
families = pack_module("ssd_core.families")
GridModel = pack_module("ssd_core.families.base").GridModel
Layout = pack_module("ssd_core.session").Layout
Prompt = pack_module("ssd_core.session").Prompt
model_files = pack_module("ssd_core.model_files")
grids = pack_module("nodes.grids")

VOCAB = 16  # image codes 0..15; then the prompt token and the unconditional token


# ---- the new family: one class ----------------------------------------------------------------------------------
class ToyGridModel(GridModel):
    family = "toy"
    architectures = ("ToyGridForImages",)
    pixels_per_token = 2
    negative_prompts = True

    @classmethod
    def listed_grids(cls):
        return [(3, 5), (4, 4)]

    def __init__(self, model):
        super().__init__(model)
        self.hidden_size = int(model.config.hidden_size)
        self.image_vocab_size = VOCAB
        self.default_grid = (3, 5)
        self.defaults = {"cfg": 2.0, "temperature": 1.0, "top_k": 0, "top_p": 1.0, "min_p": 0.0}

    @classmethod
    def load(cls, folder, dtype=None, device="cpu", download=None, **kwargs):
        from transformers import LlamaForCausalLM

        folder = cls.ensure_folder(folder, download)
        return cls(model_files.from_pretrained(LlamaForCausalLM, folder, dtype=dtype, **kwargs).to(device))

    def backbone(self):
        return self.model.model

    def final_norm(self):
        return self.model.model.norm

    def head_logits(self, normed):
        return self.rows_logits(normed, self.model.lm_head, slice(0, VOCAB))

    def code_to_id(self, codes):
        return codes

    def grid_options(self):
        return self.listed_grids()

    def layout(self, grid=None):
        return Layout.build(self.check_grid(grid))

    def build_prompt(self, prompt, negative_prompt, cfg, grid):
        ids = torch.tensor([[VOCAB], [VOCAB + 1]] if cfg else [[VOCAB]], dtype=torch.long)
        return Prompt(ids, torch.ones_like(ids, dtype=torch.bool))


def make_toy_folder(folder):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=VOCAB + 2, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                         tie_word_embeddings=False)
    LlamaForCausalLM(config).save_pretrained(folder)
    cfg = json.loads((folder / "config.json").read_text())
    cfg["architectures"] = list(ToyGridModel.architectures)
    (folder / "config.json").write_text(json.dumps(cfg))
    return folder


@pytest.fixture
def toy_registered(monkeypatch, tmp_path):
    monkeypatch.setitem(families.FAMILIES, "toy", (__name__, "ToyGridModel"))  # the one registry line
    models = tmp_path / "ssd_models"
    make_toy_folder(models / "my-toy")
    monkeypatch.setenv("SSD_MODELS_DIR", str(models))
    return models


def test_a_registered_family_shows_in_the_nodes_lists_without_touching_them(toy_registered):
    inputs = {i.id: i.as_dict() for i in nodes.SSDSampler.define_schema().inputs}
    assert "3x5 (10x6 px, 5:3) toy" in inputs["grid"]["options"]
    assert "4x4 (8x8 px, 1:1) toy" in inputs["grid"]["options"]
    assert "24x24 (384x384 px, 1:1) janus" in inputs["grid"]["options"]  # the others stay
    assert "toy" in inputs["negative_prompt"]["tooltip"]  # it takes a negative prompt: the tooltip says so
    loader = {i.id: i.as_dict() for i in nodes.SSDLoadModel.define_schema().inputs}
    assert "my-toy" in loader["model"]["options"]


def test_the_loader_and_sampler_run_a_registered_family(toy_registered):
    (m,) = nodes.SSDLoadModel().load("my-toy", "float32", "cpu")
    assert type(m.model).__name__ == "ToyGridModel" and m.model.family == "toy"
    args = dict(prompt="anything", negative_prompt="", seed=3, cfg=-1, temperature=-1, top_k=-1, top_p=-1,
                draft_rows=2, verify_rounds=2, unique_id="1")
    ar = nodes.SSDSampler().sample(m, decoder="ar", grid="4x4 (8x8 px, 1:1) toy", **args)
    exact = nodes.SSDSampler().sample(m, decoder="ssd-exact", grid="4x4 (8x8 px, 1:1) toy", **args)
    assert ar["result"][1]["grid"] == [4, 4] and exact["result"][1]["tokens"] == ar["result"][1]["tokens"]
    with pytest.raises(ValueError, match="a size for reference and this model is my-toy: pick auto or one of: 3x5"):
        nodes.SSDSampler().sample(m, decoder="ar", grid="8x8 (32x32 px, 1:1) reference", **args)


def test_the_grid_list_is_the_registry_s(toy_registered):
    """Every listed size comes from a bundled model's ssd_model.json or a family class: its grids, pixels per
    token and tag (the bundled model's name or the family's)."""
    bundled = {"reference": [(24, 24), (16, 16), (12, 12), (8, 8)],
               "reference-48": [(48, 48), (32, 32), (16, 16), (12, 12), (8, 8)]}
    for tag, (name, px, listed) in grids.sizes().items():
        cls = families.family_class(name)
        assert px == cls.pixels_per_token
        if tag in bundled:
            assert name == "llama-grid" and listed == bundled[tag]
        else:
            assert tag == name and listed == cls.listed_grids()
    assert grids.sizes()["toy"] == ("toy", 2, [(3, 5), (4, 4)])


def test_the_nodes_import_no_family_module():
    """The nodes know the families only through the registry (ssd_core.families) and the API."""
    for path in sorted((ROOT / "nodes").glob("*.py")):
        found = re.findall(r"ssd_core\.families\.\w+", path.read_text())
        assert not found, f"{path.name} imports {found}: ask the registry (family_class) instead"
