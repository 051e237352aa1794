"""`make demo`'s program on the bundled model (whatever model is bundled): a sample sheet, a short table, and a
progress bar that rewrites one stderr line."""
from PIL import Image

from ssd_core import demo


def test_demo_writes_a_sheet_a_table_and_a_one_line_progress_bar(tmp_path, capsys):
    out = tmp_path / "demo"
    assert demo.main(["--images", "1", "--decoders", "ar,ssd", "--out-dir", str(out), "--grid", "6x6"]) == 0
    sheet = Image.open(out / "samples_all_decoders.png")
    assert sheet.width > 0 and sheet.height > 0
    table = (out / "table.txt").read_text().splitlines()
    assert table[0].startswith("1 images, grid") and table[1].split()[:3] == ["decoder", "steps", "step"]
    assert [ln.split()[0] for ln in table[2:4]] == ["ar", "ssd"]
    captured = capsys.readouterr()
    bar = captured.err
    assert bar.count("\r[") >= 2 and bar.endswith("\n")
    assert "\n" not in bar[:-1]  # one line, rewritten in place
    last = bar.rsplit("\r", 1)[1]
    assert "100.0%" in last and "done" in last
    assert "samples_all_decoders.png" in captured.out and "make bench" in captured.out
