"""Apple GPUs (mps): the engine is selectable there (CLI --device mps, load_model's device), and an op torch has
no mps kernel for stops a generation with one SSDError line naming the op and the fix. This machine has no mps:
torch's availability check is monkeypatched, and the missing op is a real step-loop op made to raise torch's
own error text (aten/src/ATen/mps/MPSFallback.mm, mps_error_fallback)."""
import pytest
import torch

import ssd_core
from ssd_core import api, cli
from ssd_core.errors import SSDError, missing_mps_op
from bad_inputs import one_line

# the message torch raises (NotImplementedError) for an op without an mps kernel, fallback off
TORCH_TEXT = ("The operator 'aten::{op}' is not currently implemented for the MPS device. If you want this op to be "
              "added in priority during the prototype phase of this feature, please comment on "
              "https://github.com/pytorch/pytorch/issues/77764. As a temporary fix, you can set the environment "
              "variable `PYTORCH_ENABLE_MPS_FALLBACK=1` to use the CPU as a fallback for this op. WARNING: this will "
              "be slower than running natively on MPS.")


@pytest.fixture
def mps_here(monkeypatch):
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: True)


def missing_after(monkeypatch, calls: int, op: str = "embedding", error=None):
    """F.embedding (every forward's token embedding) works `calls` times, then raises torch's mps error."""
    real, seen = torch.nn.functional.embedding, {"n": 0}

    def embedding(*args, **kwargs):
        seen["n"] += 1
        if seen["n"] > calls:
            raise error or NotImplementedError(TORCH_TEXT.format(op=op))
        return real(*args, **kwargs)

    monkeypatch.setattr(torch.nn.functional, "embedding", embedding)
    return seen


def test_device_mps_is_selectable(mps_here):
    assert api.check_device("mps") == torch.device("mps")
    assert api.resolve_dtype("auto", "mps") == torch.float16
    args = cli.build_parser().parse_args(["generate", "--device", "mps", "--out", "x.png"])
    cli.validate(args)  # refused only where torch has no mps
    assert args.device == "mps"
    assert "mps" in cli.build_parser()._subparsers._group_actions[0].choices["generate"].format_help()


def test_device_mps_without_an_apple_gpu_is_one_line(capsys):
    assert not torch.backends.mps.is_available()
    assert cli.main(["generate", "--device", "mps", "--out", "x.png"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "torch sees no Apple GPU (MPS) here" in err and "use device cpu" in err
    with pytest.raises(SSDError, match="no Apple GPU"):
        ssd_core.load_model("reference", device="mps")


def test_a_missing_mps_op_is_one_line_saying_how_to_go_on(bundled, monkeypatch):
    seen = missing_after(monkeypatch, 3, op="_fused_rms_norm")  # the prefill and two steps run, the third fails
    with pytest.raises(SSDError) as err:
        ssd_core.generate(bundled[0], None, prompt=1, decoder="ar", seed=0, grid=(4, 4), decode_pixels=False,
                          score=False)
    text = one_line(err)
    assert seen["n"] == 4
    assert "aten::_fused_rms_norm" in text and "PYTORCH_ENABLE_MPS_FALLBACK=1" in text and "device cpu" in text
    assert isinstance(err.value.__cause__, NotImplementedError)  # the original stays in the chain
    monkeypatch.undo()
    again = ssd_core.generate(bundled[0], None, prompt=1, decoder="ar", seed=0, grid=(4, 4), decode_pixels=False,
                              score=False)  # the model is left ready for the next run
    assert tuple(again.tokens.shape) == (4, 4)


def test_a_missing_mps_op_through_the_cli(monkeypatch, capsys, tmp_path):
    missing_after(monkeypatch, 1, op="isin.Tensor_Tensor_out")
    assert cli.main(["generate", "--grid", "4x4", "--decoder", "ar", "--out", str(tmp_path / "a.png")]) == 2
    lines = capsys.readouterr().err.splitlines()  # the weights' loading bar, then the error
    errors = [line for line in lines if line.startswith("error:")]
    assert len(errors) == 1 and errors[0].startswith("error: torch has no Apple GPU (mps) kernel for "
                                                     "aten::isin.Tensor_Tensor_out")
    assert not (tmp_path / "a.png").exists()


def test_other_errors_pass_unchanged(bundled, monkeypatch):
    missing_after(monkeypatch, 1, error=NotImplementedError("some other thing"))
    with pytest.raises(NotImplementedError, match="some other thing"):
        ssd_core.generate(bundled[0], None, prompt=1, decoder="ar", seed=0, grid=(4, 4), decode_pixels=False,
                          score=False)
    assert missing_mps_op(RuntimeError("CUDA out of memory")) is None
    dispatcher = NotImplementedError("Could not run 'aten::_foo' with arguments from the 'MPS' backend. This could be")
    assert "aten::_foo" in str(missing_mps_op(dispatcher))
