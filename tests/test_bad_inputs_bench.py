"""Bad inputs of `bench` and the CLI's heads default (issue 39): a decoder name bench cannot run, a name given
twice, too many images, are refused in one SSDError line before the model loads; a row that needs heads
without them before any image runs; the largest seed wraps as generate_batch's seeds do; ar's NLL of 0
(top-k 1) still writes the JSON; `--heads auto` loads every bundled model's own heads."""
import json

import pytest

import ssd_core
from ssd_core import bench, cli
from ssd_core.bench import BenchOptions, run_bench
from bad_inputs import one_line

BENCH = ["bench", "--model", "reference", "--grid", "4x4", "--images", "1"]
MAX_SEED = 2**64 - 1  # sampling.check_seed's largest


@pytest.fixture
def no_load(monkeypatch):
    """Loading a model fails the test: the input had to be refused before it."""
    monkeypatch.setattr(ssd_core, "load_model", lambda *a, **k: pytest.fail("the model loaded before the check"))


@pytest.fixture
def no_image(monkeypatch):
    """Sampling an image fails the test: the input had to be refused before the first image."""
    import ssd_core.api as api

    monkeypatch.setattr(api, "decode_batch", lambda *a, **k: pytest.fail("an image ran before the check"))


def _refused(argv, capsys) -> str:
    """cli.main(argv) exits 2 with one error line; that line."""
    code = cli.main([str(a) for a in argv])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1, err
    return one_line(err[0])


DECODER_CASES = [  # (case, --decoders, words the one line must hold)
    ("ar@3", "ar@3", ["'ar@3'", "only for ssd, ssd-exact", "ar has no draft rows", "drop @3"]),
    ("sjd@3", "ar,sjd@3", ["'sjd@3'", "only for ssd, ssd-exact", "sjd has no draft rows"]),
    ("zipar@2", "zipar@2", ["'zipar@2'", "zipar has no draft rows"]),
    ("ar:noheads", "ar:noheads", ["'ar:noheads'", ":noheads is only for ssd-exact", "drop :noheads"]),
    ("ssd:noheads", "ssd:noheads", ["'ssd:noheads'", ":noheads is only for ssd-exact"]),
    ("superscript two", "ssd-exact@\u00b2", ["must be ASCII digits from 0 to 8", "e.g. ssd-exact@3"]),
    ("fullwidth three", "ssd-exact@\uff13", ["must be ASCII digits from 0 to 8"]),
    ("5,000 digits", "ssd-exact@" + "9" * 5000, ["must be ASCII digits from 0 to 8", "characters)"]),
    ("empty rows", "ssd-exact@", ["'ssd-exact@'", "must be ASCII digits from 0 to 8"]),
    ("9 rows", "ssd-exact@9:noheads", ["must be ASCII digits from 0 to 8", "e.g. ssd-exact@3"]),
    ("negative rows", "ssd@-1", ["must be ASCII digits from 0 to 8", "e.g. ssd@3"]),
    ("unknown", "ssd-exactt@3", ["unknown decoder 'ssd-exactt'"]),
    ("ar twice", "ar,ar", ["--decoders names 'ar' twice", "give each decoder once"]),
    ("variant twice", "ar,ssd-exact@3:noheads,ssd-exact@3:noheads", ["'ssd-exact@3:noheads' twice"]),
]


@pytest.mark.parametrize("case,decoders,words", DECODER_CASES, ids=[c[0] for c in DECODER_CASES])
def test_bench_decoder_refused_before_the_model_loads(case, decoders, words, no_load, capsys):
    text = _refused(BENCH + ["--decoders", decoders], capsys)
    for w in words:
        assert w in text, text


@pytest.mark.parametrize("images", ["1000000000", "10001", "0"])
def test_bench_images_capped(images, no_load, capsys):
    text = _refused(["bench", "--model", "reference", "--images", images], capsys)
    assert f"--images must be a whole number from 1 to {bench.MAX_IMAGES}" in text and f"got {images}" in text, text


def test_bench_images_cap_is_in_the_help(capsys):
    with pytest.raises(SystemExit):
        cli.main(["bench", "--help"])
    assert f"1 to {bench.MAX_IMAGES}" in " ".join(capsys.readouterr().out.split())


def test_good_decoder_names_pass():
    bench.check_decoders(("ar", "ssd", "ssd@2", "ssd-exact@0", "ssd-exact@8:noheads", "ssd-exact:noheads", "sjd"))
    assert bench.check_images(bench.MAX_IMAGES) == bench.MAX_IMAGES


@pytest.fixture(scope="module")
def model():
    return ssd_core.load_model("reference")


@pytest.mark.parametrize("options,words", [
    ({"decoders": ("ar@3",)}, ["ar has no draft rows"]),
    ({"decoders": ("ar", "ar")}, ["'ar' twice"]),
    ({"images": 10**9}, ["--images must be a whole number from 1 to"]),
    ({"images": 2.5}, ["--images must be a whole number"]),
    ({"seed": 2**64}, ["seed must be from 0 to 2^64 - 1"]),
    ({"decoders": ("ar", "ssd")}, ["bench of ssd needs heads"]),  # heads None: refused before ar's first image
], ids=["ar@3", "ar twice", "1e9 images", "2.5 images", "seed 2^64", "ssd without heads"])
def test_run_bench_refuses_before_any_image(model, options, words, no_image):
    with pytest.raises(ssd_core.SSDError) as err:
        run_bench(model, None, BenchOptions(**{"grid": (4, 4), "images": 1, **options}), log=lambda *_: None)
    text = one_line(err)
    for w in words:
        assert w in text, text


def test_largest_seed_wraps_as_generate_batch(tmp_path, monkeypatch, capsys):
    """The images after seed 2^64 - 1 take 0, 1, ... (api.generate_batch's seeds), on every row."""
    seeds = []
    real = bench.generate
    monkeypatch.setattr(bench, "generate", lambda *a, seed, **k: seeds.append(seed) or real(*a, seed=seed, **k))
    code = cli.main(BENCH[:-1] + ["2", "--seed", str(MAX_SEED), "--decoders", "ar,ssd-exact@2",
                                  "--json", str(tmp_path / "b.json")])
    assert code == 0, capsys.readouterr().err
    # one call per image and row, then step_ops' one extra run per row on the first image
    assert seeds == [MAX_SEED, MAX_SEED, 0, 0, MAX_SEED, MAX_SEED], seeds
    assert json.loads((tmp_path / "b.json").read_text())["settings"]["seed"] == MAX_SEED


def test_top_k_1_writes_the_json(tmp_path, capsys):
    """top-k 1: every token is its row's only candidate, ar's NLL is 0 and the gaps to it are null ('-')."""
    out = tmp_path / "b.json"
    code = cli.main(BENCH + ["--top-k", "1", "--decoders", "ar,ssd-exact", "--json", str(out)])
    text = capsys.readouterr()
    assert code == 0, text.err
    rows = json.loads(out.read_text())["rows"]
    assert [r["decoder"] for r in rows] == ["ar", "ssd-exact"]
    for r in rows:
        assert r["nll"] == 0.0 and r["nll_gap"] is None, r
    table = next(line for line in text.out.splitlines() if line.startswith("ar "))
    assert "-%" in table and "-0.0000" not in table, table


@pytest.mark.parametrize("name", ssd_core.list_bundled()["heads"])
def test_heads_auto_loads_every_bundled_models_heads(name, capsys):
    """ssd needs heads: with the default --heads auto it runs on each bundled model (reference-48 too)."""
    code = cli.main(["generate", "--model", name, "--decoder", "ssd", "--grid", "4x4"])
    out = capsys.readouterr()
    assert code == 0, out.err
    assert out.out.startswith("ssd: "), out.out


def test_heads_auto_is_none_for_another_model(tmp_path, capsys):
    """A model folder given by path (here the bundled one's) gets no heads from auto: ssd says it needs them."""
    folder = ssd_core.api.BUNDLED_MODELS["reference"]
    code = cli.main(["generate", "--model", str(folder), "--decoder", "ssd", "--grid", "4x4"])
    err = capsys.readouterr().err.strip().splitlines()  # the weights' progress bar, then the error
    assert code == 2 and "decoder 'ssd' drafts with SSD heads" in err[-1], err


def test_the_bench_json_is_strict_json(tmp_path):
    """A non-finite figure (an infinite NLL, a NaN ratio) is written as null, not Infinity / NaN, which a
    browser's JSON.parse and strict readers refuse."""
    out = tmp_path / "b.json"
    report = {"rows": [{"decoder": "ar", "nll_full": float("inf"), "wall_ratio": float("nan"), "steps": 4}]}
    bench.write_outputs(report, {}, [], BenchOptions(json=str(out)), log=lambda *a: None)
    text = out.read_text()
    assert "Infinity" not in text and "NaN" not in text
    assert json.loads(text)["rows"][0] == {"decoder": "ar", "nll_full": None, "wall_ratio": None, "steps": 4}


@pytest.mark.parametrize("name, shown", [("ssd-exact@３", "got '３' (str)"),
                                         ("ssd-exact@" + "9" * 5000, "got '999999999999...'")])
def test_bench_variant_takes_ascii_digits_only_and_keeps_its_message_short(name, shown):
    """decoders.bench_variant, which other callers than the CLI use: fullwidth digits refused, a long name cut."""
    from ssd_core.decoders import bench_variant

    with pytest.raises(ssd_core.SSDError) as err:
        bench_variant(name)
    assert shown in str(err.value) and len(str(err.value)) < 200, str(err.value)
