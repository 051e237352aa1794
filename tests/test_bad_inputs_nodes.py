"""The nodes under inputs a workflow file or an API client can send (issue 39): NaN, infinity and fractions in
INT inputs are refused in one SSDError line before the run (never a raw ValueError, never truncated: draft_rows
1.7 ran 1), a missing model name is refused, a not-found name's control characters come escaped, and the
widget's payloads are strict JSON."""
import json
import math

import pytest

from conftest import load_pack, pack_module, run
from bad_inputs import one_line

nodes = load_pack()
core = pack_module("ssd_core")
api = pack_module("ssd_core.api")
trace_nodes = pack_module("nodes.trace")
SSDError = core.SSDError
NAN, INF = math.nan, math.inf


@pytest.fixture
def no_run(monkeypatch):
    """Sampling fails the test: the input had to be refused before it."""
    monkeypatch.setattr(api, "decode_batch", lambda *a, **k: pytest.fail("the run started before the check"))


# ---- INT inputs: whole numbers only --------------------------------------------------------------------------
INT_CASES = [  # (input, value, words)
    ("seed", NAN, "seed must be a whole number from 0 to 18446744073709551615, got nan"),
    ("seed", INF, "seed must be a whole number from 0 to 18446744073709551615, got inf"),
    ("seed", 1.5, "got 1.5"),
    ("top_k", NAN, "top_k must be a whole number, got nan"),
    ("top_k", -INF, "top_k must be a whole number, got -inf"),
    ("top_k", 3.7, "top_k must be a whole number, got 3.7"),
    ("draft_rows", NAN, "draft_rows must be a whole number from 0 to 8, got nan"),
    ("draft_rows", 1.7, "draft_rows must be a whole number from 0 to 8, got 1.7"),
    ("draft_rows", INF, "draft_rows must be a whole number from 0 to 8, got inf"),
    ("verify_rounds", NAN, "verify_rounds must be a whole number from 0 to 8, got nan"),
    ("verify_rounds", 2.5, "verify_rounds must be a whole number from 0 to 8, got 2.5"),
    ("batch_size", NAN, "batch_size must be a whole number from 1 to 64, got nan"),
    ("batch_size", INF, "batch_size must be a whole number from 1 to 64, got inf"),
    ("batch_size", 1.5, "batch_size must be a whole number from 1 to 64, got 1.5"),
]


@pytest.mark.parametrize("name, value, words", INT_CASES, ids=[f"{c[0]} {c[1]}" for c in INT_CASES])
def test_sampler_refuses_int_inputs_that_are_not_whole(ref_model, no_run, name, value, words):
    with pytest.raises(SSDError) as err:
        run(ref_model, decoder="ssd-exact", grid="4x4", **{name: value})
    assert words in one_line(err), str(err.value)


def test_sampler_still_takes_whole_floats_and_auto(ref_model):
    """2.0 is 2 (a workflow file may hold it); -1 stays the model's default."""
    out = run(ref_model, decoder="ssd-exact", grid="4x4", seed=3.0, top_k=-1, draft_rows=2.0, batch_size=1.0)
    settings = out["result"][1]["settings"]
    assert settings["seed"] == 3 and settings["draft_rows"] == 2 and settings["top_k"] == 40


@pytest.mark.parametrize("value", [None, 3, ["reference"]])
def test_model_loader_refuses_a_name_that_is_not_text(value):
    with pytest.raises(SSDError) as err:
        nodes.SSDLoadModel().load(value, "auto", "cpu")
    assert "the model input must be a name from its list" in one_line(err)


def test_heads_loader_refuses_a_name_that_is_not_text(ref_model):
    with pytest.raises(SSDError) as err:
        nodes.SSDLoadHeads().load(ref_model, None)
    assert "the heads input must be a name from its list, got None" in one_line(err)


# ---- not-found names: escaped, one line -------------------------------------------------------------------------
EVIL = "x\x1b[31mred\nnext\u202e"  # ESC (a terminal colour), a newline, a right-to-left override


def test_loaders_not_found_errors_escape_the_name(ref_model, tmp_path, monkeypatch):
    monkeypatch.setenv("SSD_MODELS_DIR", str(tmp_path))
    monkeypatch.setenv("SSD_HEADS_DIR", str(tmp_path))
    for load, words in ((lambda: nodes.SSDLoadModel().load(EVIL, "auto", "cpu"), "SSD model folder"),
                        (lambda: nodes.SSDLoadHeads().load(ref_model, EVIL + ".safetensors"), "SSD heads file")):
        with pytest.raises(FileNotFoundError) as err:
            load()
        text = one_line(err)
        assert words in text and "x\\x1b[31mred\\nnext\\u202e" in text, text


def test_loaders_list_checks_escape_the_name():
    for answer in (nodes.SSDLoadModel.validate_inputs(model=EVIL), nodes.SSDLoadHeads.validate_inputs(heads=EVIL)):
        assert "is not in the list" in one_line(answer) and "\\x1b[31m" in answer, answer
    assert nodes.SSDLoadModel.validate_inputs(model="reference") is True
    # every list input, through the shared check: the value escaped, the answer one line
    answer = pack_module("nodes.types").check_choices(nodes.SSDSampler, decoder="ar\x1b[2J\nrm")
    assert "decoder: 'ar\\x1b[2J\\nrm' is not in the list" in answer and "\n" not in answer, answer


# ---- SSD Trace to Image: INT inputs ------------------------------------------------------------------------------
TRACE = {"decoder": "ar", "grid": [2, 2], "status": [["ar", "ar"], ["ar", "ar"]], "steps": 4}


@pytest.mark.parametrize("kw, words", [(dict(cell_size=NAN), "cell_size must be a whole number from 1 to 64, got nan"),
                                       (dict(cell_size=2.5), "cell_size must be a whole number from 1 to 64, got 2.5"),
                                       (dict(index=NAN), "index must be a whole number >= -1, got nan"),
                                       (dict(index=0.5), "index must be a whole number >= -1, got 0.5")])
def test_trace_to_image_refuses_int_inputs_that_are_not_whole(kw, words):
    with pytest.raises(SSDError) as err:
        nodes.SSDTraceToImage.render(TRACE, **kw)
    assert words in one_line(err)


# ---- the widget's payloads and the trace output: strict JSON ------------------------------------------------------
def test_live_and_compact_payloads_are_strict_json():
    progress = type("P", (), {"grid": (2, 2), "status": TRACE["status"], "step": 1, "final_cells": 2})()
    live = trace_nodes.live(progress, "ar", INF)
    small = trace_nodes.compact({**TRACE, "seed": NAN, "wall_s": INF, "nll": INF}, done=True)
    for payload in (live, small):
        json.dumps(payload, allow_nan=False)
    assert live["wall_s"] is None and small["seed"] is None


def test_sampler_trace_output_is_strict_json(ref_model, monkeypatch):
    """A run whose untruncated NLL is infinite: the trace output and the widget's payload hold null."""
    real = core.generate

    def infinite(*a, **k):
        result = real(*a, **k)
        result.trace.nll_full = INF
        return result
    monkeypatch.setattr(core, "generate", infinite)
    out = run(ref_model, decoder="ar", grid="4x4")
    trace, ui = out["result"][1], out["ui"]
    json.dumps(trace, allow_nan=False)
    json.dumps(ui, allow_nan=False)
    assert trace["nll_full"] is None
