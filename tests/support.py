"""Helpers the test modules share (fixtures live in conftest.py)."""

from __future__ import annotations

import csv
import json
import os
from pathlib import Path

DATA = Path(__file__).resolve().parent / "data"
TEXT = "text/plain"
JSON = "application/json"
# The tiny model conftest.py's `shared_model` fixture registers once per session.
SHARED_MODEL = "tiny-shared"


def pinned_versions(requirements: Path) -> dict[str, str]:
    """name -> version of every requirement line of a pip requirements or constraints file, each `==`-pinned."""
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    pins = {}
    for line in requirements.read_text().splitlines():
        line = line.split("#")[0].strip()  # comments and uv's `# via` annotations
        if line:
            requirement = Requirement(line)
            [spec] = requirement.specifier
            assert spec.operator == "==", f"{requirements.name}: not pinned: {line}"
            pins[canonicalize_name(requirement.name)] = spec.version
    return pins


def unseen_reviews() -> list[tuple[str, str]]:
    """(label, text) pairs written for the tests; none of them is in data/."""
    with (DATA / "unseen_reviews.tsv").open(encoding="utf-8") as f:
        return [(label, text) for label, text in csv.reader(f, delimiter="\t")]


def statuses(context, n: int) -> list[int]:
    """The HTTP status the handler set for each of the first n items of the context's batch."""
    return [context.get_response_status(i)[0] for i in range(n)]


def expected_alone(handler, model_dir, texts: list[str]) -> list[dict]:
    """The answer for each text sent alone, from the same handler code and weights in-process."""
    from tooling.inprocess import make_context, set_batch

    answers = []
    context = make_context(model_dir)  # set_batch refills its per-request state each time
    for text in texts:
        [out] = handler.handle(set_batch(context, [(text.encode(), TEXT)]), context)
        answers.append(json.loads(out))
    return answers


def plain_outcome(decoded: object) -> object:
    """What the handler makes of one decoded body, with the pipeline's own steps: the body read by
    protocols.parse_request, each instance checked by validation.validate_instance; the text (or pair), or the
    request's first rejection."""
    from handlers.options import HandlerOptions
    from handlers.protocols import parse_request
    from handlers.rejection import Rejection
    from handlers.validation import validate_instance

    request = parse_request(decoded, HandlerOptions().max_instances)
    problem = request.first_problem()
    if problem is not None:
        return problem[1]
    checked = [validate_instance(instance) for instance in request.instances]
    return next((c for c in checked if isinstance(c, Rejection)), checked[0])


def decode_and_validate(value: object, content_type: str | None, max_bytes: int) -> object:
    """A payload sent as the raw body with its whole Content-Type -> its valid text, or why not (everything
    before batching), through the pipeline's own decode_request."""
    from handlers.decoding import decode_request

    headers = {} if content_type is None else {"content-type": content_type}
    return plain_outcome(decode_request({"body": value}, headers, max_bytes))


def server_from_layout(workdir: Path, root: Path, config: Path):
    """A TorchServe (not started) running exactly the generated cluster configuration at `config` for the
    layout at `root` (standing for /mnt/models): only its addresses and ports move to free loopback ones."""
    from tooling.cluster_config import MODEL_STORE_DIR
    from tooling.torchserve import TorchServe, read_properties

    generated = read_properties(config)
    # TorchServe() points metrics_config at the repository's metrics.yaml; keep the layout's copy.
    return TorchServe(
        workdir, root / MODEL_STORE_DIR, overrides={"metrics_config": generated["metrics_config"]}, base=generated
    )


def run_transformers_pipeline(checkpoint, inputs: list, **call_options) -> list:
    """transformers' own text-classification pipeline on `inputs` (texts, or {"text", "text_pair"} dicts): the
    reference the handler's answers are checked against, with its default function_to_apply."""
    from unittest import mock

    from transformers import pipeline

    # The pipeline sets TOKENIZERS_PARALLELISM=false in this process's environment, which later tests' subprocesses
    # would inherit (tests/inprocess/test_tokenizer_threads.py counts the tokenizer's threads): put it back after.
    with mock.patch.dict(os.environ):
        classify = pipeline("text-classification", model=str(checkpoint), tokenizer=str(checkpoint), device="cpu")
        return classify(inputs, **call_options)
