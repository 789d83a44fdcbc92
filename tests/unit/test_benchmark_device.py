"""The benchmark's device choice, GPU layouts, length-sorted loop order, GPU metrics and answers check:
the pure parts that decide what a GPU run measures, exercised here without a GPU."""

from __future__ import annotations

import json
import math
import shlex

import pytest

import scripts.benchmark
from scripts.benchmark import main, parse_args
from tooling.bench.answers import TOLERANCE, AnswerCheck, difference, served_dtype
from tooling.bench.ceilings import length_sorted
from tooling.bench.device import (
    GPU_COMMAND,
    GRAPHS_OFF_CUDA,
    ONNX_ON_CUDA,
    backends_for_device,
    gpu_id_of,
    resolve_device,
)
from tooling.bench.scrape import gpu_figures
from tooling.bench.served import Layout, gpu_layouts
from tooling.paths import REPO


@pytest.mark.parametrize(
    ("requested", "available", "device"),
    [("auto", True, "cuda"), ("auto", False, "cpu"), ("cpu", True, "cpu"), ("cuda", True, "cuda")],
)
def test_the_device_resolves_auto_to_cuda_only_where_torch_sees_a_gpu(requested, available, device):
    assert resolve_device(requested, available) == device
    assert gpu_id_of(device) == (0 if device == "cuda" else None)


def test_cuda_without_a_gpu_is_an_error_not_a_silent_cpu_run():
    with pytest.raises(ValueError, match="cuda"):
        resolve_device("cuda", False)
    with pytest.raises(ValueError):
        resolve_device("tpu", True)


def test_on_cuda_the_onnx_backends_are_skipped_and_on_cpu_the_cuda_graphs_with_the_reason():
    names = ["pytorch", "onnx-fp32", "onnx-int8", "pytorch-graphs"]
    assert backends_for_device(names, "cpu") == (names[:3], {"pytorch-graphs": GRAPHS_OFF_CUDA})
    assert backends_for_device(names, "cuda") == (
        ["pytorch", "pytorch-graphs"],
        {"onnx-fp32": ONNX_ON_CUDA, "onnx-int8": ONNX_ON_CUDA},
    )


def test_the_graphs_backend_archives_the_checkpoint_with_cuda_graphs_on(tmp_path):
    from tooling.bench.backends import BACKENDS, PreparedBackend

    graphs = PreparedBackend(BACKENDS["pytorch-graphs"], tmp_path, None)
    assert graphs.handler_options({"dtype": "auto", "cuda_graphs": False}) == {"dtype": "auto", "cuda_graphs": True}
    assert graphs.options({}, "cuda").cuda_graphs is True
    assert PreparedBackend(BACKENDS["pytorch"], tmp_path, None).options({}, "cuda").cuda_graphs is False


def test_the_printed_gpu_command_parses_into_gpu_layouts_and_big_batches():
    argv = shlex.split(GPU_COMMAND)
    assert argv[:3] == ["python", "-m", "scripts.benchmark"]
    args = parse_args(argv[3:])
    assert args.device == "cuda" and args.batch_size == 128
    # 8 workers first and the CUDA graphs first: the cells most GPU targets read (pytorch-graphs, 8 workers, 1,024
    # clients) are measured early, not the first a run cut short by its time limit loses.
    assert args.layouts == [Layout(8, 0), Layout(1, 0)]
    assert max(args.concurrency) == 1024
    # The CUDA graphs beside the eager passes, in one run; the batch_size=1 baseline for the eager one only.
    assert args.backends == ["pytorch-graphs", "pytorch"] and args.one_at_a_time_backends == ["pytorch"]


def test_gpu_workers_take_the_thread_count_and_exclude_layouts():
    assert parse_args(["--gpu-workers", "1,2,4,8", "--threads", "2"]).layouts == [Layout(w, 2) for w in (1, 2, 4, 8)]
    assert parse_args([]).device == "auto"
    with pytest.raises(SystemExit):
        parse_args(["--gpu-workers", "1,8", "--layouts", "1x0"])
    for wrong in ("0", "1,x", ""):
        with pytest.raises(ValueError):
            gpu_layouts(wrong)
    with pytest.raises(SystemExit):
        parse_args(["--device", "gpu"])


def test_the_documented_gpu_command_is_the_printed_one():
    docs = (REPO / "docs" / "benchmarks.md").read_text()
    assert GPU_COMMAND in docs
    # On a lent device: under a time limit, its results and its output under $OUT.
    on_device = GPU_COMMAND.replace("--out docs/bench-gpu", "--out $OUT/b")
    assert f"timeout 590 .venv/bin/{on_device} 2>&1 | tee $OUT/bench.log" in docs


def test_length_sorted_puts_short_texts_first_and_keeps_arrival_order_among_equals():
    texts = ["d", "b", "c", "a", "e"]  # arrival order is not alphabetical: a sort on the text would show
    assert length_sorted(texts, [30, 5, 30, 5, 1]) == ["e", "b", "a", "d", "c"]
    assert length_sorted([], []) == []


CPU_METRICS = """# TYPE CPUUtilization gauge
CPUUtilization{Level="Host",Hostname="h",} 12.5
# TYPE ts_inference_requests_total counter
ts_inference_requests_total{model_name="m",model_version="default",hostname="h",} 3.0
"""
GPU_METRICS = (
    CPU_METRICS
    + """# TYPE GPUUtilization gauge
GPUUtilization{Level="Host",DeviceId="0",Hostname="h",} 80.0
GPUUtilization{Level="Host",DeviceId="1",Hostname="h",} 40.0
# TYPE GPUMemoryUsed gauge
GPUMemoryUsed{Level="Host",DeviceId="0",Hostname="h",} 1500.0
GPUMemoryUsed{Level="Host",DeviceId="1",Hostname="h",} 500.0
"""
)


def test_gpu_figures_are_none_when_the_server_reports_no_gpu_never_zero():
    assert gpu_figures(CPU_METRICS) == {"gpu_utilization_percent": None, "gpu_memory_used_mb": None}
    assert gpu_figures("") == {"gpu_utilization_percent": None, "gpu_memory_used_mb": None}


def test_gpu_figures_average_utilisation_and_sum_memory_over_gpus():
    assert gpu_figures(GPU_METRICS) == {"gpu_utilization_percent": 60.0, "gpu_memory_used_mb": 2000.0}


def test_the_tolerance_follows_the_served_dtype():
    assert served_dtype("auto", "cuda") == "float16" and served_dtype("auto", "cpu") == "float32"
    assert served_dtype("bfloat16", "cuda") == "bfloat16"
    assert served_dtype("auto", "cpu", "int8") == "int8" and TOLERANCE["int8"] > TOLERANCE["float16"]
    assert TOLERANCE["float16"] == 2e-2 and TOLERANCE["float32"] < TOLERANCE["float16"]


def answer(positive: float, truncated: bool = False) -> dict:
    label = "positive" if positive >= 0.5 else "negative"
    return {"label": label, "scores": {"negative": 1 - positive, "positive": positive}, "truncated": truncated}


def test_the_answers_check_counts_every_answer_and_the_ones_outside_the_tolerance():
    expected = [answer(0.9), answer(0.2)]
    check = AnswerCheck(expected, TOLERANCE["float16"])
    check.check(0, json.dumps(answer(0.91)).encode())  # float16 noise: right
    check.check(3, json.dumps(answer(0.2)).encode())  # index 3 is text 1 again (the corpus wraps)
    check.check(1, json.dumps(answer(0.9)).encode())  # text 0's answer for text 1: a swap
    check.check(0, b"not json")
    figures = check.figures()
    assert figures["answers_checked"] == 4 and figures["answers_wrong"] == 2
    assert math.isinf(figures["answers_max_abs_diff"])


def test_an_answer_exactly_at_the_tolerance_is_within_it_not_wrong():
    # "every probability is within the served dtype's tolerance": a difference equal to it passes.
    check = AnswerCheck([answer(0.5)], 0.25)  # 0.25 and 0.75 are exact in binary: no rounding at the edge
    check.check(0, json.dumps(answer(0.75)).encode())
    figures = check.figures()
    assert figures["answers_max_abs_diff"] == 0.25 and figures["answers_wrong"] == 0


def test_a_different_truncation_flag_or_label_set_is_never_within_tolerance():
    assert difference(answer(0.9), answer(0.9)) == 0.0
    assert math.isinf(difference(answer(0.9, truncated=True), answer(0.9)))
    assert math.isinf(difference({"scores": {"a": 1.0}, "truncated": False}, answer(0.9)))
    assert difference(answer(0.5), answer(0.49)) == pytest.approx(0.01)  # a label flip at the boundary, in tolerance


def test_a_cuda_run_without_a_gpu_stops_at_once_after_printing_the_gpu_command(monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(scripts.benchmark, "cuda_available", lambda: False)
    assert main(["--device", "cuda", "--model", "tiny", "--out", str(tmp_path)]) == 2
    out, err = capsys.readouterr()
    assert out.splitlines()[0] == f"On a GPU host (one H100), run: {GPU_COMMAND}"
    assert "torch.cuda.is_available() is False" in err and list(tmp_path.iterdir()) == []


def test_none_leaves_out_every_batch_size_one_cell():
    # A GPU run spends its device minutes on the batched cells; the batch_size=1 baseline is a committed figure.
    args = parse_args(["--backends", "pytorch-graphs,pytorch", "--one-at-a-time-backends", "none"])
    assert args.one_at_a_time_backends == []
    assert parse_args(["--backends", "pytorch"]).one_at_a_time_backends == ["pytorch"]
    with pytest.raises(SystemExit):
        parse_args(["--one-at-a-time-backends", "nothing"])
