"""scripts.kserve_layout --gpus N refuses an archive holding an ONNX model, which every GPU worker refuses to serve
(handlers/onnx_forward.providers_for: the image's onnxruntime has no CUDA provider), so its pods would never be
ready; archives packed by the project's own packer (tooling/archiving.pack_archive)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from handlers.onnx_forward import ONNX_FILE
from scripts import kserve_layout
from tooling.archiving import pack_archive


@pytest.fixture(scope="module")
def archives(tiny_checkpoint, tmp_path_factory) -> dict[str, Path]:
    """The tiny checkpoint packed as a PyTorch archive, and beside it as an ONNX one: its tokenizer and config with a
    model.onnx in place of the weights, as tooling/onnx_export.py lays out an export (the layout reads the listing
    only, never the graph)."""
    root = tmp_path_factory.mktemp("kserve-archives")
    onnx_dir = root / "onnx-checkpoint"
    onnx_dir.mkdir()
    for item in tiny_checkpoint.iterdir():
        if item.name not in ("model.safetensors", "pytorch_model.bin"):
            shutil.copy2(item, onnx_dir / item.name)
    (onnx_dir / ONNX_FILE).write_bytes(b"an ONNX graph")
    store = root / "store"
    return {
        "pytorch": pack_archive(tiny_checkpoint, "tiny-pytorch", store),
        "onnx": pack_archive(onnx_dir, "tiny-onnx", store),
    }


def test_a_gpu_layout_of_an_onnx_archive_is_refused_with_the_archive_that_serves_instead(archives, tmp_path, capsys):
    out = tmp_path / "layout"
    assert kserve_layout.main([str(archives["onnx"]), "--out", str(out), "--gpus", "1"]) == 2
    refusal = capsys.readouterr().err
    assert f"holds an ONNX model ({ONNX_FILE})" in refusal and "no CUDAExecutionProvider" in refusal
    assert "python -m scripts.archive_model CHECKPOINT --name NAME --backend pytorch" in refusal
    assert not out.exists()  # nothing half-written for an upload


def test_a_gpu_layout_of_a_pytorch_archive_and_a_cpu_layout_of_an_onnx_one_are_written(archives, tmp_path):
    assert kserve_layout.main([str(archives["pytorch"]), "--out", str(tmp_path / "gpu"), "--gpus", "1"]) == 0
    assert kserve_layout.main([str(archives["onnx"]), "--out", str(tmp_path / "cpu")]) == 0
    assert (tmp_path / "gpu" / "model-store" / "bert.mar").is_file()
    assert (tmp_path / "cpu" / "model-store" / "bert.mar").is_file()
