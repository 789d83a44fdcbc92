"""BERT sequence-classification handler for TorchServe with dynamic batching.

Module map (one job each), in the order a batch flows through them:
  bert_handler.py     the TorchServe BaseHandler: a thin adapter around pipeline.py
  pipeline.py         one batch: requests -> instances -> validation -> encoding -> plan -> forward -> answers
  decoding.py         request payload (bytes, forms, charsets, JSON) -> text or JSON document, torch-free
  protocols.py        the request formats: /predictions text or {"text"}, KServe v1, KServe v2 -> instances
  binary_tensors.py   KServe v2's binary tensor extension (tritonclient's default): binary inputs read into the JSON,
                      binary outputs written after it
  instances.py        what the model classifies: a text, or a pair of texts (text, text_pair)
  validation.py       text checks that need no tokenizer, torch-free
  tokenization.py     valid texts -> token ids, with the token cap; padding into arrays
  ascii_normalization.py  BERT's normalization of an ASCII text in Python, ahead of a tokenizer copy without it
  word_pieces.py      such a text (or pair) split into words, each word's WordPiece ids asked once and remembered
  frame_reader.py     TorchServe's worker reads each batch off its socket through a buffer, not a recv() per field
  batching.py         length-aware micro-batch planning, torch-free
  fault_isolation.py  bisection of a failing forward pass down to the items that fail alone
  fault_injection.py  a forward pass that fails on demand (the test-only fault_marker options), chosen at load
  torch_forward.py    the forward pass in PyTorch (GPU, float16, any checkpoint)
  onnx_forward.py     the forward pass in ONNX Runtime (the fast CPU path)
  scores.py           what a head's logits become: softmax, sigmoid or raw, as the checkpoint's config says
  responses.py        instance results -> each request's status and body (JSON; v2 outputs asked for as binary after it)
  rejection.py        the catalogue: every error the service answers, and TorchServe's error body shape
  loading.py          the one loader: a model folder -> tokenizer, labels, limits and the forward pass, once
  handler_metrics.py  the handler's own Prometheus metrics
  options.py          handler options from the archive's model-config.yaml
"""
