"""What a management describe call shows of a worker (GET /models/NAME?customized=true, gRPC DescribeModel with
customized): the model it serves and how, every option resolved, so an operator reads what each worker really runs.

TorchServe 0.12 sends such a call to a worker as a request of its own, marked by the header `describe: True`, and puts
the worker's answer in the description's `customizedMetadata`. Answered as a prediction it was an empty text: a 400
counted among the rejected items (and so in the alert on their rate) for every describe call.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from handlers.loading import LoadedModel
from handlers.responses import ModelIdentity


def describe(served: LoadedModel, identity: ModelIdentity) -> dict[str, Any]:
    """The worker's model and options, as the load log line says them, for `customizedMetadata`."""
    return {
        "model": identity.name,
        "version": identity.version,
        "model_type": served.model_type,
        "backend": served.backend,
        "runtime": served.description,
        "labels": list(served.labels),
        "scores": served.scores,
        "max_length": served.max_length,
        "plan": served.planner.description,
        "options": dataclasses.asdict(served.options),
    }
