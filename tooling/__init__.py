"""The project's tooling library: what scripts/ (entry points) and tests/ share.

Nothing here is shipped in a .mar (that is handlers/); nothing here exits the process
or installs signal handlers: errors are exceptions, entry points decide what to do.

  paths.py        repository locations
  files.py        writing a file whole, for readers in other processes
  corpus.py       the labelled reviews in data/ and the held-out split
  checkpoints.py  random tiny / BERT-base / DistilBERT / RoBERTa checkpoints for tests and timing
  demo_model.py   fine-tuning the demo classifier
  archiving.py    any checkpoint -> .mar (model-config.yaml, handlers/ packed as they are)
  cpu_layout.py   the workers an archive's cpu_threads fit on a number of CPUs (serve.sh, fleet, pods, updates)
  torchserve.py   a private TorchServe on free loopback ports, in its own directory; the default worker count
  prometheus.py   reading samples from a Prometheus text endpoint
  inprocess.py    driving the handler without a server, with TorchServe's own Context
  soak.py         steady mixed traffic and worker memory over time
  onnx_export.py  checkpoint -> ONNX, parity check against PyTorch, int8 quantization and its agreement
  cluster_config.py  the cluster server configuration (KServe storage layout, Kubernetes, the fleet)
  fleet_config.py the fleet's configuration, rendered (HAProxy, Prometheus, core shares): pure
  fleet.py        replicas behind HAProxy, watched by Prometheus, on one machine: the processes
  bench/          the benchmark: corpus, load generator, ceilings, served cells, targets, report
"""
