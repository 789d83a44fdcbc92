"""The backends the benchmark compares, each a model folder the handler can load: exported once per run."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

from handlers.loading import backend_of
from handlers.options import HandlerOptions


@dataclass(frozen=True)
class Backend:
    name: str
    onnx: bool
    quantize: str | None = None
    # Handler options this backend's archives and ceilings add to the run's (model-config.yaml's and --option's).
    handler_options: dict = field(default_factory=dict)
    cuda_only: bool = False


BACKENDS = {
    backend.name: backend
    for backend in (
        Backend("pytorch", onnx=False),
        Backend("onnx-fp32", onnx=True),
        Backend("onnx-int8", True, "int8"),
        # The same checkpoint with each pass replayed from a CUDA graph (handlers/cuda_graphs.py): beside
        # "pytorch" in one run, the graphs' gain is measured side by side.
        Backend("pytorch-graphs", onnx=False, handler_options={"cuda_graphs": True}, cuda_only=True),
    )
}


@dataclass(frozen=True)
class PreparedBackend:
    backend: Backend
    model_dir: Path  # the checkpoint itself, or the exported ONNX folder (model.onnx + tokenizer + config.json)
    export: dict | None  # what tooling.onnx_export measured against PyTorch

    @property
    def name(self) -> str:
        return self.backend.name

    def handler_options(self, handler_options: dict) -> dict:
        """The run's handler options with this backend's own on top: what its archives hold."""
        return {**handler_options, **self.backend.handler_options}

    def options(self, handler_options: dict, device: str = "cpu") -> HandlerOptions:
        """The handler options as the handler resolves them on `device` for this backend's archive."""
        resolved = HandlerOptions.from_mapping(self.handler_options(handler_options))
        return resolved.for_device(device, backend_of(self.model_dir))


def parse_backends(value: str) -> list[str]:
    names = [name.strip() for name in value.split(",") if name.strip()]
    unknown = [name for name in names if name not in BACKENDS]
    if unknown or not names:
        raise ValueError(f"unknown backend(s) {unknown}; expected a comma-separated list of {list(BACKENDS)}")
    return names


def parse_backends_or_none(value: str) -> list[str]:
    """parse_backends, or "none" for no backend at all (the benchmark's --one-at-a-time-backends)."""
    return [] if value == "none" else parse_backends(value)


def prepare_backends(
    names: Sequence[str], checkpoint: Path, workdir: Path, progress: Callable[[str], None]
) -> list[PreparedBackend]:
    """The checkpoint for PyTorch; an exported folder for each ONNX backend.

    The int8 export is never refused here (minimum agreement 0): the benchmark measures
    speed, and reports the agreement and accuracy the export measured beside it.
    """
    from tooling.onnx_export import export_checkpoint

    prepared = []
    export_cache = Path(workdir) / "backends" / "exported.onnx"  # one export for fp32 and int8
    export_cache.parent.mkdir(parents=True, exist_ok=True)
    for name in names:
        backend = BACKENDS[name]
        if not backend.onnx:
            prepared.append(PreparedBackend(backend, Path(checkpoint), None))
            continue
        out = Path(workdir) / "backends" / name
        record = export_checkpoint(
            checkpoint, out, backend.quantize, min_agreement=0.0, progress=progress, export_cache=export_cache
        )
        prepared.append(PreparedBackend(backend, out, asdict(record) | {"summary": record.summary}))
    return prepared
