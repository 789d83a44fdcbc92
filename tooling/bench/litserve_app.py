"""The same model and pipeline behind LitServe, for the overload benchmark's contrast (not part of the service).

Run with an interpreter that has litserve (a venv of its own; scripts/overload.py --litserve-python);
nothing else imports this module:

    python -m tooling.bench.litserve_app --model-dir DIR --options OPTIONS.yaml --port P --workers 2

LitServe batches up to --batch-size requests within --batch-timeout seconds, like TorchServe's batch_size
and max_batch_delay, and its queue is unbounded. Requests are JSON {"text": ...}; each batch is answered
by handlers/pipeline.py exactly as the TorchServe handler answers it.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import litserve as ls


class Classifier(ls.LitAPI):
    """Module level: LitServe pickles the API object into its worker processes."""

    def __init__(self, model_dir: Path, options_file: Path, **batching) -> None:
        super().__init__(**batching)
        self.model_dir = model_dir
        self.options_file = options_file

    def setup(self, device) -> None:
        import yaml

        from handlers.loading import load_model
        from handlers.options import HandlerOptions

        options = HandlerOptions.from_mapping(yaml.safe_load(self.options_file.read_text()).get("handler"))
        self.model = load_model(self.model_dir, options, None)

    def decode_request(self, request):
        return request["text"]

    def batch(self, inputs):
        return list(inputs)

    def predict(self, texts):
        from handlers.pipeline import answer_batch
        from handlers.responses import ModelIdentity

        items = [{"body": text.encode()} for text in texts]
        outcome = answer_batch(items, [{"content-type": "text/plain"}] * len(items), self.model, ModelIdentity("bert"))
        return [answer.body for answer in outcome.answers]

    def unbatch(self, output):
        return output

    def encode_response(self, output):
        return output


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model-dir", type=Path, required=True)
    parser.add_argument("--options", type=Path, required=True, help="a model-config.yaml: its handler: section")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--batch-timeout", type=float, default=0.002)
    args = parser.parse_args(argv)
    api = Classifier(args.model_dir, args.options, max_batch_size=args.batch_size, batch_timeout=args.batch_timeout)
    server = ls.LitServer(api, accelerator="cpu", devices=1, workers_per_device=args.workers)
    server.run(host="127.0.0.1", port=args.port, generate_client_file=False, log_level="warning")
    return 0


if __name__ == "__main__":
    sys.exit(main())
