"""A client for TorchServe's gRPC APIs, generated at run time from TorchServe's own .proto files.

tests/proto/ holds inference.proto exactly as TorchServe 0.12 ships it;
grpcio-tools compiles it into a private directory, so no generated code lives in the repository
and the client always speaks the API of the server under test.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

PROTO_DIR = Path(__file__).resolve().parent / "proto"
PROTOS = ("inference.proto",)


def _include_dirs() -> list[str]:
    """Where protoc finds the imports: protobuf's well-known types and google/rpc/status.proto."""
    import grpc_tools
    from google.rpc import status_pb2

    well_known = Path(grpc_tools.__file__).parent / "_proto"
    common_protos = Path(status_pb2.__file__).parents[2]  # .../site-packages, holding google/rpc/status.proto
    return [str(PROTO_DIR), str(well_known), str(common_protos)]


def _load(name: str, path: Path) -> ModuleType:
    # The generated *_pb2_grpc modules import their *_pb2 module by its bare name.
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def compile_protos(out_dir: Path) -> dict[str, ModuleType]:
    """Compile TorchServe's protos into out_dir; return the modules by name (inference_pb2, inference_pb2_grpc, …)."""
    from grpc_tools import protoc

    out_dir.mkdir(parents=True, exist_ok=True)
    includes = [f"-I{d}" for d in _include_dirs()]
    arguments = ["protoc", *includes, f"--python_out={out_dir}", f"--grpc_python_out={out_dir}", *PROTOS]
    if protoc.main(arguments) != 0:
        raise RuntimeError(f"protoc failed on {PROTO_DIR}: {' '.join(arguments)}")
    modules = {}
    for proto in PROTOS:
        stem = Path(proto).stem
        for name in (f"{stem}_pb2", f"{stem}_pb2_grpc"):
            modules[name] = _load(name, out_dir / f"{name}.py")
    return modules
