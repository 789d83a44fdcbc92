"""One known message of a library's logger hidden, and only that one: everything else it logs still shows.

For notices a library prints at every use that say nothing about the model or the run (each use names why);
a logger filter, not a level, so the library's other messages, and any check it ties to its logger's level, stay.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator


class _WithoutMessage(logging.Filter):
    def __init__(self, text: str) -> None:
        super().__init__()
        self.text = text

    def filter(self, record: logging.LogRecord) -> bool:
        return self.text not in record.getMessage()


@contextlib.contextmanager
def without_message(logger: logging.Logger, text: str) -> Iterator[None]:
    """While in the block, `logger` drops its own records whose message contains `text` (a filter on a logger sees
    the records logged on it, not those its children pass up)."""
    hidden = _WithoutMessage(text)
    logger.addFilter(hidden)
    try:
        yield
    finally:
        logger.removeFilter(hidden)
