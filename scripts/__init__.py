"""The project's commands: `python -m scripts.NAME` (each module's docstring says what it does)."""

import os

# Loading or saving a checkpoint draws transformers' progress bars (huggingface_hub's setting, read once when it is
# imported, so it is set here, before any command imports it). A load here takes well under a second: on a terminal
# the bar only flashes, and in a log (the set-up's, CI's) each is a line of carriage returns between the command's own
# lines. The commands print their own steps instead; HF_HUB_DISABLE_PROGRESS_BARS=0 brings the bars back. A worker,
# which TorchServe starts, not a command, turns them off in handlers/bert_handler.py's initialize.
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
