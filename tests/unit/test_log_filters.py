"""tooling/log_filters.py hides one known notice of a library's logger, only while asked, and nothing else."""

from __future__ import annotations

import logging

from tooling.log_filters import without_message


def test_a_message_containing_the_text_is_dropped_only_inside_the_block(caplog):
    """The library's notice carries more than the text (a report after it), so containing it is enough."""
    logger = logging.getLogger("tests.log_filters")
    with caplog.at_level(logging.INFO, logger=logger.name):
        with without_message(logger, "LOAD REPORT"):
            logger.info("LOAD REPORT from the checkpoint: 3 keys unexpected")
            logger.info("something else worth seeing")
        logger.info("LOAD REPORT after the block")
    assert [record.getMessage() for record in caplog.records] == [
        "something else worth seeing",
        "LOAD REPORT after the block",
    ]
    assert logger.filters == [], "the filter outlived its block"
