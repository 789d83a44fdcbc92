"""A forward pass that fails on demand: the hook end-to-end tests use to make a real worker fail.

handlers/loading.py wraps the backend's forward pass in this class once, at load, when the
archive's handler options set `fault_marker`; otherwise nothing here is imported and the
pipeline calls the backend directly. A pass holding an item whose text has the marker as a word
raises (fault_kind "error": RuntimeError; "oom": MemoryError, as an exhausted allocator would),
or with fault_delay_s > 0 stalls that long instead. The forward pass sees token ids, not texts,
so the marker is looked for in the text as the tokenizer gives it back (lower case for an
uncased model). Never set fault_marker in production.
"""

from __future__ import annotations

import re
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from handlers.options import HandlerOptions
from handlers.tokenization import Encoding


class FaultInjectingForward:
    def __init__(self, forward: Any, tokenizer: Any, options: HandlerOptions) -> None:
        """`forward`: the backend's forward pass (handlers/onnx_forward.py, handlers/torch_forward.py)."""
        self._forward = forward
        self._tokenizer = tokenizer
        self._options = options
        # The marker as the tokenizer normalizes it, so it matches in decoded token ids.
        marker = tokenizer.decode(tokenizer(options.fault_marker, add_special_tokens=False)["input_ids"]).strip()
        self._marker = re.compile(rf"(?<!\w){re.escape(marker)}(?!\w)")
        self.description = f"{forward.description}; test fault hook armed (fault_marker)"

    def _marked(self, encodings: Sequence[Encoding]) -> bool:
        return any(
            self._marker.search(self._tokenizer.decode(e.features["input_ids"], skip_special_tokens=True))
            for e in encodings
        )

    def __call__(self, encodings: Sequence[Encoding]) -> np.ndarray:
        if self._marked(encodings):
            if self._options.fault_delay_s:
                time.sleep(self._options.fault_delay_s)
            elif self._options.fault_kind == "oom":
                raise MemoryError("injected out of memory (handler option fault_marker)")
            else:
                raise RuntimeError("injected fault (handler option fault_marker)")
        return self._forward(encodings)
