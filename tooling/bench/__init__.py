"""The benchmarks' parts; scripts/benchmark.py and scripts/overload.py are their command lines.

corpus.py      the texts: a realistic spread of lengths built from data/
loadgen.py     the closed-loop asynchronous load generator and latency percentiles
http_client.py both loops' keep-alive HTTP/1.1 client (httptools; the open loop's through a pool)
scrape.py      the handler's and TorchServe's counters read from /metrics around each cell
backends.py    PyTorch, ONNX fp32 and ONNX int8: one model folder per backend, exported once
ceilings.py    in-process ceilings: the plain model loop and the handler without a server
served.py      served cells: a private TorchServe, each backend x batch size x clients
targets.py     the targets, read from targets.yaml (data, not code), evaluated on one run's figures
report.py      the machine, the markdown tables
plot.py        throughput and p95 latency against clients, one line per backend and batch size

The overload benchmark (scripts/overload.py):
openloop.py        open-loop arrivals (constant, Poisson), each client giving up after its timeout
overload.py        the setups (today's queue, each latency budget's) and their cells
overload_report.py its tables, targets and plot
litserve_app.py    the same pipeline behind LitServe, for contrast (run with LitServe's own interpreter)
"""
