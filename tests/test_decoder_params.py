"""One decoder-parameters object (decoders.DecoderParams, made from the PARAMS table) and one whole-number check
(limits.whole_number): the API, make_policy, bench, the CLI and the policies take the same object, refuse the
same values with the same words, and run the same images from it as from the parameters given by name."""
import dataclasses

import pytest
import torch

import ssd_core
from ssd_core import cli
from ssd_core.bench import BenchOptions, _variants
from ssd_core.decoders import DECODERS, PARAMS, DecoderParams, FirstRow, Repair, make_policy
from ssd_core.errors import SSDError
from ssd_core.limits import whole_number
from tiny import make_heads, make_llama_grid


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    folder = make_llama_grid(tmp_path_factory.mktemp("m") / "model", grid=(4, 5), row_end=True)
    model = ssd_core.load_model(folder)
    return folder, model, ssd_core.load_heads(make_heads(model, folder / "heads.safetensors"), model)


def test_the_object_is_the_table_frozen_and_checked_when_made():
    assert [f.name for f in dataclasses.fields(DecoderParams)] == list(PARAMS)
    p = DecoderParams(draft_rows=2.0, window=np_int(5))  # whole floats and numpy ints become ints
    assert (p.draft_rows, p.window, p.verify_rounds) == (2, 5, None) and type(p.draft_rows) is int
    with pytest.raises(dataclasses.FrozenInstanceError):
        p.draft_rows = 3
    assert DecoderParams.of(p, draft_rows=None, repair=0) == DecoderParams(draft_rows=2, window=5, repair=0)
    assert p.given() == {"draft_rows": 2, "window": 5}
    with pytest.raises(TypeError, match="unknown decoder parameter 'rows'; the decoder parameters are draft_rows"):
        DecoderParams.of(rows=2)
    assert DecoderParams.of({"window": 4}, draft_rows=1) == DecoderParams(window=4, draft_rows=1)
    with pytest.raises(SSDError, match="^params must be a DecoderParams .or a dict of decoder parameters., got int$"):
        DecoderParams.of(3)


def np_int(v):
    import numpy as np

    return np.int64(v)


@pytest.mark.parametrize("value, words", [
    (9, "draft_rows must be a whole number from 0 to 8, got 9"),
    (-1, "draft_rows must be a whole number from 0 to 8, got -1"),
    (1.5, "draft_rows must be a whole number from 0 to 8, got 1.5"),
    ("2", "draft_rows must be a whole number from 0 to 8, got '2' (str)"),
    (True, "draft_rows must be a whole number from 0 to 8, got 'True' (bool)"),
    (float("nan"), "draft_rows must be a whole number from 0 to 8, got nan"),
])
def test_one_check_refuses_a_bad_value_with_the_same_words_everywhere(tiny, value, words):
    _, model, _ = tiny
    for make in (lambda: DecoderParams(draft_rows=value), lambda: make_policy("ssd", draft_rows=value),
                 lambda: ssd_core.generate(model, None, prompt=1, decoder="ar", draft_rows=value)):
        with pytest.raises(SSDError) as err:
            make()
        assert str(err.value) == words
    with pytest.raises(SSDError, match="^--draft-rows must be a whole number from 0 to 8, got 9$"):
        DecoderParams.read(type("Args", (), {"draft_rows": 9})(), shown=lambda n: "--" + n.replace("_", "-"))


def test_coded_parameters_take_numbers_and_name_their_values(capsys):
    """stable_first_row and repair are codes: users give the numbers (API, CLI, saved settings), the policy holds
    them by name, and a bad number is refused with every value's meaning."""
    policy = make_policy("ssd", stable_first_row=1)
    assert policy.stable_first_row is FirstRow.UNTIL_STABLE and policy.repair is Repair.REDRAW  # repair's default
    assert make_policy("ssd").stable_first_row is FirstRow.EXACT  # the default
    assert type(policy.params["stable_first_row"]) is int  # what the trace records: the number
    assert DecoderParams(stable_first_row=FirstRow.OFF) == DecoderParams(stable_first_row=0)
    assert type(DecoderParams(repair=Repair.OFF).repair) is int
    first_row = "from 0 to 2 (0 = off, 1 = until stable, 2 = exact), got 3"
    for make in (lambda: DecoderParams(stable_first_row=3), lambda: make_policy("ssd", stable_first_row=3)):
        with pytest.raises(SSDError) as err:
            make()
        assert str(err.value) == "stable_first_row must be a whole number " + first_row
    with pytest.raises(SSDError, match=r"^repair must be a whole number from 0 to 1 \(0 = off, 1 = redraw\), got 2$"):
        DecoderParams(repair=2)
    assert cli.main(["generate", "--model", "reference", "--stable-first-row", "3"]) == 2
    assert cli.main(["bench", "--model", "reference", "--ssd-first-row", "1,3"]) == 2
    err = capsys.readouterr().err
    assert f"--stable-first-row must be a whole number {first_row}" in err
    assert f"--ssd-first-row must be a whole number {first_row}" in err


def test_whole_number_limits_and_reasons():
    assert whole_number("n", 3.0, 0, 4) == 3 and whole_number("n", 10**30) == 10**30
    for value, words in ((5, "n must be a whole number from 0 to 4 (why), got 5"),
                         (float("inf"), "n must be a whole number from 0 to 4 (why), got inf"),
                         (None, "n must be a whole number from 0 to 4 (why), got 'None' (NoneType)")):
        with pytest.raises(SSDError) as err:
            whole_number("n", value, 0, 4, " (why)")
        assert str(err.value) == words
    with pytest.raises(SSDError, match="^n must be a whole number >= 1, got 0$"):
        whole_number("n", 0, 1)


def test_each_decoder_gets_its_own_defaults_and_records_what_it_runs_with():
    none = DecoderParams()
    assert none.for_decoder("ssd-exact") == {"draft_rows": 0}  # 0: picked for the device (calibrate.py)
    assert none.for_decoder("ssd") == {"draft_rows": 1, "verify_rounds": 2, "stable_first_row": 2,
                                       "adaptive_percent": 0, "repair": 1}
    assert none.for_decoder("sjd") == {"window": 16} and none.for_decoder("zipar") == {"window": None}
    assert DecoderParams(draft_rows=0).for_decoder("ssd") == {**none.for_decoder("ssd"), "draft_rows": 1}  # 0: default
    for name in DECODERS:
        given = DecoderParams(draft_rows=2, window=5, verify_rounds=1)
        policy = make_policy(name, given)
        assert policy.params == given.for_decoder(name)
        assert all(getattr(policy, key) == value for key, value in policy.params.items())


def test_the_object_and_the_names_make_the_same_images(tiny):
    _, model, heads = tiny
    kw = dict(prompt=1, seed=3, cfg=3.0, decode_pixels=False, score=False)
    for decoder, values in (("ssd", dict(draft_rows=2, verify_rounds=1, stable_first_row=1)), ("sjd", dict(window=5)),
                            ("ssd-exact", dict(draft_rows=2))):
        drafter = heads if decoder != "sjd" else None
        by_name = ssd_core.generate(model, drafter, decoder=decoder, **values, **kw)
        by_object = ssd_core.generate(model, drafter, decoder=decoder, params=DecoderParams(**values), **kw)
        default = ssd_core.generate(model, drafter, decoder=decoder, **kw)
        assert torch.equal(by_name.tokens, by_object.tokens) and by_name.trace.steps == by_object.trace.steps
        assert by_name.trace.settings == by_object.trace.settings != default.trace.settings
        names_win = ssd_core.generate(model, drafter, decoder=decoder, params=DecoderParams(), **values, **kw)
        assert names_win.trace.settings == by_name.trace.settings


def test_bench_rows_carry_the_object():
    base = DecoderParams(draft_rows=2)
    rows = _variants(BenchOptions(decoders=("ar", "ssd", "ssd-exact@4", "ssd-exact:noheads"), params=base,
                                  ssd_first_row=(1, 2), ssd_adaptive=(20,)))
    assert [label for label, _, _ in rows] == ["ar", "ssd f=1", "ssd a=20 f=1", "ssd f=2", "ssd a=20 f=2",
                                               "ssd-exact@4", "ssd-exact:noheads"]
    assert rows[-2][1:] == ("ssd-exact", DecoderParams(draft_rows=4))  # NAME@N: N draft rows
    assert rows[2][2] == DecoderParams(draft_rows=2, stable_first_row=1, adaptive_percent=20)
    assert rows[-1][1:] == ("ssd-exact", base) and rows[0][2] is base


def test_the_cli_passes_one_object(tiny, tmp_path, monkeypatch):
    folder, _, _ = tiny
    seen = []
    real = ssd_core.generate

    def spy(*args, **kwargs):
        seen.append(kwargs)
        return real(*args, **kwargs)

    monkeypatch.setattr(ssd_core, "generate", spy)
    assert cli.main(["generate", "--model", str(folder), "--heads", "none", "--decoder", "sjd", "--window", "5",
                     "--draft-rows", "2", "--trace", str(tmp_path / "t.json")]) == 0
    assert seen[0]["params"] == DecoderParams(window=5, draft_rows=2)
    assert not PARAMS.keys() & seen[0].keys()  # no parameter spelled out beside it


def test_a_models_own_decoder_defaults_fill_what_the_caller_leaves_unset(tiny, tmp_path):
    """ssd_model.json's decoder_defaults (reference-48 runs ssd with 3 verify rounds and adaptive 10%): the caller's
    value, else the model's, else the decoder's; the same images as the values given by hand; bench's `ssd r=2` row
    runs 2 rounds with the model's adaptive percent."""
    import json
    import shutil

    folder, plain, heads = tiny
    own = tmp_path / "own"
    shutil.copytree(folder, own)
    spec = json.loads((own / "ssd_model.json").read_text())
    spec["decoder_defaults"] = {"ssd": {"verify_rounds": 0, "adaptive_percent": 30}}
    (own / "ssd_model.json").write_text(json.dumps(spec))
    model = ssd_core.load_model(own)
    assert model.decoder_defaults == {"ssd": {"verify_rounds": 0, "adaptive_percent": 30}}
    assert plain.decoder_defaults == {}
    kw = dict(prompt=1, seed=3, cfg=3.0, decode_pixels=False, score=False, decoder="ssd")
    run = ssd_core.generate(model, heads, **kw)
    assert run.trace.settings["verify_rounds"] == 0 and run.trace.settings["adaptive_percent"] == 30
    by_hand = ssd_core.generate(plain, heads, verify_rounds=0, adaptive_percent=30, **kw)
    assert torch.equal(run.tokens, by_hand.tokens) and run.trace.steps == by_hand.trace.steps
    given = ssd_core.generate(model, heads, verify_rounds=2, **kw)  # the caller's value wins, the rest the model's
    assert (given.trace.settings["verify_rounds"], given.trace.settings["adaptive_percent"]) == (2, 30)
    own_none = ssd_core.generate(plain, heads, **kw).trace.settings  # no defaults of its own: the decoder's
    assert (own_none["verify_rounds"], own_none["adaptive_percent"]) == (2, 0)
    exact = ssd_core.generate(model, heads, **{**kw, "decoder": "ssd-exact"}, draft_rows=2)  # other decoders: theirs
    assert "adaptive_percent" not in exact.trace.settings
    from ssd_core.bench import run_bench

    report = run_bench(model, heads, BenchOptions(decoders=("ar", "ssd"), images=1, ssd_rounds=(2,), step_ops=False,
                                                  ssd_first_row=()), log=lambda *_: None)
    rows = {r["decoder"]: r["params"] for r in report["rows"]}
    assert (rows["ssd r=2"]["verify_rounds"], rows["ssd r=2"]["adaptive_percent"]) == (2, 30)


@pytest.mark.parametrize("table, words", [
    ([1], "decoder_defaults must be an object of decoder names"),
    ({"ssdx": {}}, "decoder_defaults names 'ssdx', not a decoder; the decoders are ar, ssd"),
    ({"ssd": 3}, "decoder_defaults['ssd'] must be an object of parameter values, got 3"),
    ({"ssd": {"window": 4}}, "decoder_defaults['ssd'] sets 'window', which ssd does not take; it takes draft_rows"),
    ({"ar": {"draft_rows": 1}}, "which ar does not take; it takes no parameters"),
    ({"ssd": {"verify_rounds": 9}}, "decoder_defaults['ssd']['verify_rounds'] must be a whole number from 0 to 8"),
    ({"sjd": {"window": 0}}, "decoder_defaults['sjd']['window'] must be a whole number >= 1"),
])
def test_bad_decoder_defaults_in_ssd_model_json_are_refused_by_name(tiny, tmp_path, table, words):
    import json
    import shutil

    folder, _, _ = tiny
    bad = tmp_path / "bad"
    shutil.copytree(folder, bad)
    spec = json.loads((bad / "ssd_model.json").read_text())
    (bad / "ssd_model.json").write_text(json.dumps({**spec, "decoder_defaults": table}))
    with pytest.raises(SSDError) as err:
        ssd_core.load_model(bad)
    assert words in str(err.value) and "ssd_model.json" in str(err.value) and "\n" not in str(err.value)
