"""Benchmark: PyTorch, ONNX fp32 and ONNX int8, served one at a time and batched, against in-process ceilings.

    python -m scripts.benchmark                      # default run: demo model, 3 backends, ~9 min on 2 cores
    python -m scripts.benchmark --layouts 1x0,2x1    # also two one-thread workers per model (docs/benchmarks.md)
    python -m scripts.benchmark --layouts 2x1,0x1    # ... beside a registration with no initial_workers
    python -m scripts.benchmark --model bert-base    # BERT-base-sized model (random weights, real cost)
    python -m scripts.benchmark --quick              # about a minute, checks the pipeline end to end
    python -m scripts.benchmark --worst-batch        # one full batch at the token cap per backend, and exit
    python -m scripts.benchmark --tokenization       # the handler's tokenization against the ways before it
    python -m scripts.benchmark --frame-reading      # a worker reading its batches: TorchServe's reader, buffered
    python -m scripts.benchmark --sweep-max-batch-tokens 1000000000,512,256,128 --backends onnx-fp32
    python -m scripts.benchmark --device cuda --model bert-base --batch-size 128 --gpu-workers 1,8 \\
        --concurrency 1,256,1024 --duration 10 --out docs/bench-gpu   # on a GPU (docs/benchmarks.md)

One run, one machine, one model. Each backend (the checkpoint for PyTorch; an ONNX export,
fp32 or int8, checked against PyTorch; on a GPU, the checkpoint with CUDA graphs) is archived and
served by a private TorchServe at batch_size=1 and batch_size=B (at each --delays) under closed-loop
load at each client count; per cell: requests/s, latency percentiles, errors, and from /metrics the batches formed, the
padding and where the time went (frontend queue, worker, handler stages). The ceilings run
without a server over the same texts: the plain model loop at batch 1 and B, and the handler
in-process at batch B with and without length-aware micro-batches. Every served answer is checked
against its text's answer alone in float32. --device cuda (auto: when torch sees a GPU) serves PyTorch
archives in float16 on GPU 0, skips the ONNX backends and records GPU utilisation and memory per cell;
the pytorch-graphs backend (handlers/cuda_graphs.py) runs there only. The targets are data
(tooling/bench/targets.yaml), the GPU's held to GPU runs. Writes JSON (every figure), markdown and a PNG plot to --out.
The parts live in tooling/bench/; this is the command line.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
import traceback
from pathlib import Path

import yaml

from handlers.options import HandlerOptions
from tooling.archiving import add_handler_option_argument
from tooling.bench.backends import BACKENDS, parse_backends, parse_backends_or_none, prepare_backends
from tooling.bench.ceilings import (
    HANDLER_WAYS,
    TOKENIZATION_WAYS,
    ceilings,
    sweep_max_batch_tokens,
    tokenization_speed,
    worst_batch_seconds,
)
from tooling.bench.corpus import build_corpus
from tooling.bench.device import DEVICES, GPU_COMMAND, backends_for_device, cuda_available, resolve_device
from tooling.bench.frames import reading_speed
from tooling.bench.plot import plot
from tooling.bench.report import machine, markdown
from tooling.bench.served import Layout, batching_settings, gpu_layouts, parse_layouts, served_cells
from tooling.bench.targets import evaluate_targets
from tooling.cli_arguments import (
    existing_folder,
    list_of,
    non_negative_int,
    output_folder,
    positive_float,
    positive_int,
)
from tooling.files import write_atomically
from tooling.paths import MODEL_CONFIG, REPO
from tooling.termination import exit_on_sigterm

MODEL_NAMES = ("demo", "tiny", "bert-base")
# Quick: the one-at-a-time baseline for PyTorch only (the targets' reference); every backend batched.
QUICK = {"concurrency": [1, 16], "delays": [2], "duration": 0.6, "texts": 48, "one_at_a_time_backends": ["pytorch"]}


def model_argument(value: str) -> str:
    """--model: a name the benchmark builds, or a checkpoint folder that is there."""
    return value if value in MODEL_NAMES else str(existing_folder(value))


def resolve_model(name: str, workdir: Path) -> Path:
    from tooling.checkpoints import build_random_classifier

    if name == "demo":
        from tooling.demo_model import ensure_demo_model

        return ensure_demo_model()
    if name in MODEL_NAMES:  # tiny, bert-base: random weights at that size
        return build_random_classifier(workdir / name, name)
    return Path(name)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--model", type=model_argument, default="demo", help="demo, bert-base, tiny, or a checkpoint folder"
    )
    parser.add_argument("--device", choices=DEVICES, default="auto", help="auto: cuda where torch sees a GPU")
    parser.add_argument(
        "--backends", type=parse_backends, default=list(BACKENDS), help=f"comma-separated, from {list(BACKENDS)}"
    )
    parser.add_argument("--concurrency", type=list_of(positive_int), default=[1, 16, 64])
    parser.add_argument("--batch-size", type=positive_int, default=8)
    parser.add_argument(
        "--delays", type=list_of(non_negative_int), default=[2], help="max_batch_delay values (ms) for batch_size=B"
    )
    parser.add_argument(
        "--one-at-a-time-backends",
        type=parse_backends_or_none,
        default=None,
        help="backends also served at batch_size=1 (default: every backend; none: no batch_size=1 cells)",
    )
    parser.add_argument("--duration", type=positive_float, default=15.0, help="seconds of load per cell")
    parser.add_argument("--texts", type=positive_int, default=256, help="corpus size")
    parser.add_argument("--threads", type=non_negative_int, default=0, help="handler cpu_threads (0: every core)")
    parser.add_argument(
        "--layouts",
        type=parse_layouts,
        default=None,
        help="served CPU layouts, WORKERSxTHREADS per model, e.g. 1x0,2x1 (default: 1x<--threads>; 0 threads: every "
        "core; 0 workers: registered without initial_workers, the server's default)",
    )
    parser.add_argument(
        "--gpu-workers",
        default=None,
        help="served GPU layouts: workers per GPU, e.g. 1,2,4,8 (each with --threads threads); replaces --layouts",
    )
    add_handler_option_argument(
        parser, "a handler option over model-config.yaml's, for the served archives and the ceilings (repeatable)"
    )
    parser.add_argument("--no-ceilings", action="store_true", help="served cells only (targets that need them: -)")
    parser.add_argument("--out", type=output_folder, default=REPO / "bench_out")
    parser.add_argument("--quick", action="store_true", help=f"small settings that finish in about a minute: {QUICK}")
    parser.add_argument(
        "--worst-batch", action="store_true", help="only time one forward pass of batch-size x 256 tokens, and exit"
    )
    parser.add_argument(
        "--tokenization",
        action="store_true",
        help="only time the handler's tokenization against the ways before it at batch 1, 8 and --batch-size, on "
        "the corpus, on the corpus with every word new and on pairs of its texts, and exit",
    )
    parser.add_argument(
        "--frame-reading",
        action="store_true",
        help="only time a worker reading batches of --batch-size requests off its socket, TorchServe's reader "
        "against handlers/frame_reader.py, at 4, 8 and 16 headers a request, and exit",
    )
    parser.add_argument(
        "--sweep-max-batch-tokens",
        type=list_of(non_negative_int),
        help="only measure the in-process handler ceiling at each of these budgets, per backend, and exit (0: the "
        "handler's auto, which under CUDA graphs plans by the graphs' measured pass times)",
    )
    args = parser.parse_args(argv)
    if args.quick:
        for key, value in QUICK.items():
            setattr(args, key, value)
    if args.gpu_workers is not None:
        if args.layouts is not None:
            parser.error("--gpu-workers and --layouts both name the served layouts: give one")
        try:
            args.layouts = gpu_layouts(args.gpu_workers, args.threads)
        except ValueError as error:
            parser.error(str(error))
    if args.layouts is None:
        args.layouts = [Layout(1, args.threads)]
    if args.one_at_a_time_backends is None:
        args.one_at_a_time_backends = args.backends
    return args


def handler_options_of(args: argparse.Namespace) -> tuple[dict, dict]:
    """(overrides given on the command line, the full handler section the archives and ceilings use)."""
    overrides = dict(args.handler_option)
    if args.threads:
        overrides["cpu_threads"] = args.threads
    options = {**yaml.safe_load(MODEL_CONFIG.read_text())["handler"], **overrides}
    HandlerOptions.from_mapping(options)  # fail now, not in a worker, on a wrong option
    return overrides, options


def main(argv: list[str] | None = None) -> int:
    # A time limit's SIGTERM unwinds like an error: each layout's workers' log is copied to --out, the private
    # TorchServe stopped and the workdir removed.
    exit_on_sigterm()
    args = parse_args(argv)
    overrides, options = handler_options_of(args)
    args.out.mkdir(parents=True, exist_ok=True)
    workdir = Path(tempfile.mkdtemp(prefix="bench-"))
    try:
        return run(args, argv, overrides, options, workdir)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def run(args: argparse.Namespace, argv: list[str] | None, overrides: dict, options: dict, workdir: Path) -> int:
    started = time.monotonic()
    print(f"On a GPU host (one H100), run: {GPU_COMMAND}", flush=True)

    def progress(message: str) -> None:
        print(f"[{time.monotonic() - started:6.1f}s] {message}", flush=True)

    if args.frame_reading:  # TorchServe's worker protocol alone: no model, no device
        print("| headers a request | batch | frame KiB | TorchServe's reader, µs/request | buffered, µs/request "
              "| speed-up |")  # fmt: skip
        print("|---:|---:|---:|---:|---:|---:|")
        for row in reading_speed([4, 8, 16], args.batch_size):
            print(f"| {row['headers']} | {row['batch_size']} | {row['frame_bytes'] / 1024:.0f} | "
                  f"{row['torchserve_us_per_request']:.1f} | {row['buffered_us_per_request']:.1f} | "
                  f"{row['speed_up']:.2f}x |", flush=True)  # fmt: skip
        return 0
    try:
        device = resolve_device(args.device, cuda_available())
    except ValueError as error:
        print(f"benchmark: {error}", file=sys.stderr)
        return 2
    names, skipped = backends_for_device(args.backends, device)
    for name, why in skipped.items():
        progress(f"backend {name} {why}")
    if not names:
        print(f"no backend left to run on {device}", file=sys.stderr)
        return 2
    args.one_at_a_time_backends = [name for name in args.one_at_a_time_backends if name in names]
    progress(f"device {device}; backends {names}")
    checkpoint = resolve_model(args.model, workdir)
    if args.tokenization:  # the tokenizer alone: no backend to prepare
        texts = build_corpus(args.texts)
        print("| texts | batch | handler, µs/text | from an empty cache | from a full cache of other words | Rust "
              "batch call, BERT's normalizer skipped (before) | Rust call, its own normalizer | wrapper's call (two "
              "passes) | speed-up over the Rust batch call (handler, empty, full) |")  # fmt: skip
        print("|---|---:|---:|---:|---:|---:|---:|---:|---|")
        sizes = sorted({1, 8, args.batch_size})
        for row in tokenization_speed(checkpoint, texts, sizes, HandlerOptions.from_mapping(options)):
            times = [row[f"{way}_us_per_text"] for way in TOKENIZATION_WAYS]
            ratios = [row[f"{way}_speed_up_over_rust_batch_call"] for way in HANDLER_WAYS]
            cells = [f"{t:.1f}" for t in times] + [", ".join(f"{r:.2f}x" for r in ratios)]
            print(f"| {row['corpus']} | {row['batch_size']} | " + " | ".join(cells) + " |", flush=True)
        return 0
    backends = prepare_backends(names, checkpoint, workdir, progress)
    resolved = HandlerOptions.from_mapping(options).for_device(device)

    if args.worst_batch:
        tokens = resolved.max_length
        for prepared in backends:
            times = worst_batch_seconds(prepared, args.batch_size, tokens, prepared.options(options, device), device)
            print(f"{args.model} {prepared.name}: forward pass of {args.batch_size} x {tokens} tokens: "
                  + ", ".join(f"{t:.2f} s" for t in times))  # fmt: skip
        return 0

    texts = build_corpus(args.texts)
    if args.sweep_max_batch_tokens:
        print("| backend | max_batch_tokens | texts/s | padded/real | forward passes per batch |")
        print("|---|---:|---:|---:|---:|")
        for prepared in backends:
            for c in sweep_max_batch_tokens(
                prepared, texts, args.batch_size, options, args.sweep_max_batch_tokens, device
            ):
                print(f"| {prepared.name} | {c['max_batch_tokens']} | {c['texts_per_s']:.1f} | "
                      f"{c['padding_waste']:.2f} | {c['forward_passes_per_batch']:.2f} |", flush=True)  # fmt: skip
        return 0

    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(checkpoint, local_files_only=True)
    lengths = [len(ids) for ids in tokenizer(texts, truncation=True, max_length=resolved.max_length)["input_ids"]]
    progress(f"model {args.model}; {len(texts)} texts, {min(lengths)}-{max(lengths)} tokens")
    report = {
        "machine": machine(),
        "command": "python -m scripts.benchmark " + " ".join(argv if argv is not None else sys.argv[1:]),
        "settings": {
            "model": args.model,
            "device": device,
            "backends": names,
            "skipped_backends": skipped,
            "batch_size": args.batch_size,
            "delays_ms": args.delays,
            "concurrency": args.concurrency,
            "one_at_a_time_backends": args.one_at_a_time_backends,
            "duration": args.duration,
            "texts": len(texts),
            "mean_tokens": statistics.mean(lengths),
            "max_tokens": max(lengths),
            "handler_options": overrides,
            "max_batch_tokens": {p.name: p.options(options, device).max_batch_tokens for p in backends},
            "cpu_threads": resolved.cpu_threads or len(os.sched_getaffinity(0)),
            "layouts": [layout.label for layout in args.layouts],
        },
        "backends": {p.name: {"export": p.export} for p in backends},
        "ceilings": [],
        "served": [],
        # What failed and was skipped, the run going on with the rest: a backend's ceilings, a model's registration
        # (its worker's own exception in the error). A run with any exits 1 once everything else is written.
        "failures": [],
    }
    results = args.out / "benchmark.json"

    def keep(**measured) -> None:
        # Written before the ceilings, after each backend's ceilings and after every served cell, replacing the
        # file whole (a SIGTERM mid-write leaves the previous one): a run cut short (a time limit, Ctrl-C, a
        # failure) leaves what it measured, marked incomplete.
        report.update(measured)
        write_atomically(results, json.dumps({**report, "complete": False}, indent=2))

    def failed(failure: dict) -> None:
        report["failures"].append(failure)
        keep()

    keep()
    if not args.no_ceilings:
        report["ceilings"] = ceilings(backends, texts, args.batch_size, options, progress, device,
                                      measured=lambda rows: keep(ceilings=rows), failed=failed)  # fmt: skip
    keep()
    settings = {
        p.name: batching_settings(args.batch_size, args.delays, p.name in args.one_at_a_time_backends) for p in backends
    }
    try:
        report["served"] = served_cells(
            backends, texts, workdir, settings, args.concurrency, args.duration, options, progress, args.layouts,
            device, measured=lambda cells: keep(served=cells), failed=failed, logs_to=args.out,
        )  # fmt: skip
    except Exception as error:  # noqa: BLE001 - recorded; what was measured is kept and the tables written
        traceback.print_exc()
        failed({"stage": "served", "backend": ",".join(names), "error": f"{type(error).__name__}: {error}"})
    report["targets"] = evaluate_targets(report)
    report["complete"] = True

    write_atomically(results, json.dumps(report, indent=2))
    write_atomically(args.out / "benchmark.md", markdown(report))
    plot(report, args.out / "benchmark.png")
    print()
    print(markdown(report))
    progress(f"wrote {args.out}/benchmark.json, benchmark.md, benchmark.png, model_log-<layout>.log")
    for failure in report["failures"]:
        print(f"benchmark: {failure['stage']} of {failure['backend']} failed: {failure['error']}", file=sys.stderr)
    return 1 if report["failures"] else 0


if __name__ == "__main__":
    sys.exit(main())
