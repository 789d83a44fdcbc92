"""Build KServe's TorchServe storage layout, with the cluster configuration, from an archive.

    python -m scripts.kserve_layout model_store/bert.mar --out build/kserve \\
        [--name bert --batch-size 8 --max-batch-delay 2 --workers W --response-timeout 60] [--gpus N]
        [--pod-cpus 2] [--latency-budget-ms 1000 --throughput-rps R]   # the queue: docs/reliability.md, "Overload"

--workers defaults to as many workers as the CPU pod's CPUs hold: --pod-cpus (2, the CPU limit of the manifests in
deploy/kubernetes and deploy/kserve) divided by the archive's handler option cpu_threads. The set-up's archive
(model_store/bert.mar, ONNX fp32 with cpu_threads 1) gets 2 one-thread workers, the layout that served 180.2
requests/s at 16 clients on 2 cores (docs/benchmarks.md, "Backends"); an archive with cpu_threads 0 (every CPU the
pod may use, handlers/cpu_quota.py) gets one worker (docs/batching.md, "Workers and threads on a CPU").

--gpus N lays it out for pods with N GPUs: 8 workers per GPU, batch 128, 5 ms (on an H100 at 1,024 clients
8 workers served 3.6x what one did, 8,757 against 2,409 requests/s, with a 5 ms delay: docs/benchmarks.md#gpu),
and the queue from the GPU's measured 8,757 requests/s, unless --workers, --batch-size, --max-batch-delay or
--throughput-rps say otherwise. It refuses an archive holding an ONNX model (scripts.archive_model --backend onnx):
every GPU worker refuses to serve one, so its pods would never become ready.

writes build/kserve/config/config.properties (+ metrics.yaml) and build/kserve/model-store/<name>.mar,
then prints where to upload them. The work is done by tooling/cluster_config.py; this is its command line.
"""

from __future__ import annotations

import argparse
import sys
import zipfile
from pathlib import Path

from handlers.onnx_forward import ONNX_FILE
from handlers.options import HandlerOptions
from tooling.cli_arguments import model_name, non_negative_int, output_folder, positive_float, positive_int
from tooling.cluster_config import (
    DEFAULT_BATCH_SIZE,
    DEFAULT_MAX_BATCH_DELAY_MS,
    DEFAULT_RESPONSE_TIMEOUT_S,
    DEFAULT_ROOT,
    GPU_BATCH_SIZE,
    GPU_MAX_BATCH_DELAY_MS,
    GPU_WORKERS_PER_GPU,
    build_kserve_layout,
)
from tooling.cpu_layout import cpu_layout
from tooling.latency_budget import DEFAULT_BUDGET_MS, machine_throughput
from tooling.model_archive import NotAnArchive, handler_options

# Where the InferenceService's storageUri is set: the CPU one, and the GPU variants' shared component.
STORAGE_URI_CPU = "deploy/kserve/serverless/inferenceservice.yaml"
STORAGE_URI_GPU = "deploy/kserve/components/gpu/kustomization.yaml"


# The CPU pods' CPUs: requests = limits = 2 in deploy/kubernetes/base/deployment.yaml and in the ServingRuntime
# of deploy/kserve/serverless (tests/unit/test_kserve_layout_backend.py checks both).
POD_CPUS = 2


def mount_path(value: str) -> str:
    if not value.startswith("/"):
        raise argparse.ArgumentTypeError(f"{value!r} is not an absolute path in the pod (e.g. {DEFAULT_ROOT})")
    return value


def holds_onnx_model(archive: Path, options: HandlerOptions) -> bool:
    """Whether the handler serves `archive` with ONNX Runtime: its model folder (the handler option model_subdir,
    `options` as handler_options read them) holds model.onnx (handlers/loading.backend_of)."""
    subdir = options.model_subdir
    with zipfile.ZipFile(archive) as mar:
        return f"{subdir}/{ONNX_FILE}" in mar.namelist()


def _unset_workers(fit: int) -> str:
    return f"leave --workers unset for {fit}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("archive", type=Path, help="the .mar to serve (scripts/archive_model.py builds it)")
    parser.add_argument(
        "--out", type=output_folder, default=Path("build/kserve"), help="layout folder (default build/kserve)"
    )
    parser.add_argument(
        "--name", type=model_name, default="bert", help="model name in URLs (/v1/models/NAME:predict); default bert"
    )
    parser.add_argument(
        "--gpus", type=non_negative_int, default=0, help="GPUs per pod (the gpu overlay: 1); 0 for CPU pods"
    )
    parser.add_argument(
        "--batch-size", type=positive_int, help=f"default {DEFAULT_BATCH_SIZE}, {GPU_BATCH_SIZE} with --gpus"
    )
    parser.add_argument(
        "--max-batch-delay",
        type=non_negative_int,
        help=f"milliseconds; default {DEFAULT_MAX_BATCH_DELAY_MS}, {GPU_MAX_BATCH_DELAY_MS} with --gpus",
    )
    parser.add_argument(
        "--workers",
        type=positive_int,
        help=f"workers per pod; default --pod-cpus / the archive's cpu_threads (1 for cpu_threads 0), "
        f"{GPU_WORKERS_PER_GPU} per GPU with --gpus (docs/batching.md)",
    )
    parser.add_argument(
        "--pod-cpus",
        type=positive_int,
        default=POD_CPUS,
        help=f"CPUs of each CPU pod, for the default --workers (default {POD_CPUS}, the manifests' CPU limit)",
    )
    parser.add_argument("--response-timeout", type=positive_int, default=DEFAULT_RESPONSE_TIMEOUT_S, help="seconds")
    parser.add_argument("--latency-budget-ms", type=positive_int, default=DEFAULT_BUDGET_MS,
                        help="how long a request may wait: sets job_queue_size, and a smaller batch_size "
                        "when it is under five batch times")  # fmt: skip
    parser.add_argument("--throughput-rps", type=positive_float, default=None,
                        help="the pod's measured requests/s (default: per core its workers use)")  # fmt: skip
    parser.add_argument(
        "--root", type=mount_path, default=DEFAULT_ROOT, help=f"where the layout is mounted in the pod ({DEFAULT_ROOT})"
    )
    args = parser.parse_args(argv)
    gpu = args.gpus > 0
    if args.batch_size is None:
        args.batch_size = GPU_BATCH_SIZE if gpu else DEFAULT_BATCH_SIZE
    if args.max_batch_delay is None:
        args.max_batch_delay = GPU_MAX_BATCH_DELAY_MS if gpu else DEFAULT_MAX_BATCH_DELAY_MS
    if args.throughput_rps is None and gpu:
        args.throughput_rps = machine_throughput("gpu", args.gpus)
    if not args.archive.is_file():
        print(f"kserve_layout: {args.archive}: no such archive (build it with scripts.archive_model)", file=sys.stderr)
        return 2
    try:
        options = handler_options(args.archive)  # refused here, in one line, before anything is written
        onnx = holds_onnx_model(args.archive, options)
    except (NotAnArchive, ValueError) as exc:
        print(f"kserve_layout: {exc}", file=sys.stderr)
        return 2
    if gpu and args.workers is None:
        args.workers = GPU_WORKERS_PER_GPU * args.gpus
    if not gpu:  # serve.sh's rule on the pod's CPUs (tooling/cpu_layout.py), and its warning
        layout = cpu_layout(args.archive, args.pod_cpus, args.workers, _unset_workers)
        args.workers = layout.workers
        if layout.warning:
            print(f"kserve_layout: warning: each pod's {args.pod_cpus} CPUs: {layout.warning}", file=sys.stderr)
        if args.throughput_rps is None:
            # The queue is sized for what the pod's cores serve, not per worker: a cpu_threads 0 worker uses them all.
            args.throughput_rps = machine_throughput("cpu", layout.busy)
    if gpu and onnx:
        # Refused here, not in the pods: TorchServe gives every worker a GPU, each worker refuses an ONNX model it
        # cannot run there (handlers/onnx_forward.providers_for), and the pods would never become ready.
        print(
            f"kserve_layout: {args.archive} holds an ONNX model ({ONNX_FILE}), and --gpus {args.gpus} lays it out for "
            "GPU pods, whose workers refuse it: the image's onnxruntime has no CUDAExecutionProvider. Archive the "
            "checkpoint for PyTorch, as scripts/setup.sh does on a GPU host (float16 on CUDA, the dtype option's "
            "auto): python -m scripts.archive_model CHECKPOINT --name NAME --backend pytorch; or lay this archive "
            "out for CPU pods, without --gpus.",
            file=sys.stderr,
        )
        return 2
    try:
        config = build_kserve_layout(
            args.archive,
            args.out,
            args.name,
            batch_size=args.batch_size,
            max_batch_delay=args.max_batch_delay,
            workers=args.workers,
            response_timeout=args.response_timeout,
            latency_budget_ms=args.latency_budget_ms,
            throughput_rps=args.throughput_rps,
            root=args.root,
        )
    except NotAnArchive as exc:
        print(f"kserve_layout: {exc}", file=sys.stderr)
        return 2
    out = args.out
    # The Dockerfile bakes build/kserve by default; another folder must be inside the build context
    # (the repository) and admitted by .dockerignore.
    default_layout = out == Path("build/kserve")
    layout_arg = "" if default_layout else f" --build-arg LAYOUT={out}"
    layout_note = "" if default_layout else f"{'':24}(LAYOUT: a folder inside the repository, see .dockerignore)\n"
    print(f"wrote {config} ({args.workers} workers per pod)")
    print(f"wrote {config.parent / 'metrics.yaml'}")
    print(f"wrote {out / 'model-store' / (args.name + '.mar')}")
    print(
        f"\nUpload the folder as it is, so that the pod sees it at {args.root}:\n"
        f"  KServe (storageUri):  aws s3 cp --recursive {out} s3://YOUR-BUCKET/{args.name}/   "
        f"(or gsutil -m cp -r {out}/* gs://YOUR-BUCKET/{args.name}/)\n"
        f"                        then set storageUri: s3://YOUR-BUCKET/{args.name} in "
        f"{STORAGE_URI_GPU if gpu else STORAGE_URI_CPU}\n"
        f"  Image (baked in):     docker build -f deploy/docker/Dockerfile{layout_arg} "
        f"{' --build-arg VARIANT=cuda' if gpu else ''} -t REGISTRY/bert-torchserve:0.1.0-{'cuda' if gpu else 'cpu'} .\n"
        f"{layout_note}"
        f"  Volume (mounted):     copy {out}/ to the volume mounted at {args.root} "
        f"(and build the image with --target runtime)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
