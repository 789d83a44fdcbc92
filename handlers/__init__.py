"""BERT sequence-classification handler for TorchServe with dynamic batching.

Module map (one job each):
  options.py          handler options read from the archive's model-config.yaml
  rejection.py        the per-item error type and TorchServe's error body shape
  decoding.py         request payload (bytes / JSON) -> text, torch-free
  validation.py       text checks that need no tokenizer, torch-free
  tokenization.py     valid texts -> token ids, with the token cap
  batching.py         length-aware micro-batch planning, torch-free
  inference.py        one forward pass per micro-batch, fault bisection
  responses.py        probabilities -> the JSON answer for each item
  handler_metrics.py  the handler's own Prometheus metrics
  bert_handler.py     the TorchServe BaseHandler that composes them
"""
