"""Benchmark: sequential vs dynamically batched serving vs the in-process model ceiling.

    python -m scripts.benchmark                      # default run: demo model, ~10 min on 2 cores
    python -m scripts.benchmark --model bert-base    # BERT-base-sized model (random weights, real cost)
    python -m scripts.benchmark --quick              # < 1 minute, checks the pipeline end to end

One run, one machine, one model:
  * served cells: a private TorchServe with the model registered as batch_size=1 (the
    sequential baseline) and as batch_size=B at each max_batch_delay; for each, a
    closed-loop asynchronous load (aiohttp) at each concurrency level. Per cell:
    requests/s, p50/p95/p99 latency, errors, mean batch size formed (from the
    handler's Prometheus counters) and the load generator's own CPU use.
  * ceilings, no server, same texts: the plain Hugging Face loop (tokenize, pad to the
    longest, forward) at batch 1 and B, and this project's handler in-process at
    batch B, with pad-to-longest and with length-aware micro-batches.
Writes JSON (every figure), a markdown table and a PNG plot to --out.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import random
import resource
import statistics
import sys
import time
from pathlib import Path

from tooling.paths import MODEL_CONFIG, REPO

UNLIMITED_TOKENS = 10**9


# ---- corpus -----------------------------------------------------------------------------------


def build_corpus(n: int, seed: int = 7) -> list[str]:
    """Texts with a realistic spread of lengths (a few words to ~200 tokens) from data/reviews_*.tsv."""
    from tooling.corpus import read_examples

    sentences = [text for _, _, text in read_examples()]
    rng = random.Random(seed)
    texts = []
    for _ in range(n):
        shape = rng.random()
        if shape < 0.2:  # a fragment: a few words
            words = rng.choice(sentences).split()
            texts.append(" ".join(words[: rng.randint(2, 5)]))
        elif shape < 0.7:  # one or two sentences
            texts.append(" ".join(rng.sample(sentences, rng.randint(1, 2))))
        else:  # a long review: 3 to 14 sentences, up to ~200 tokens
            texts.append(" ".join(rng.sample(sentences, rng.randint(3, 14))))
    return texts


# ---- statistics -------------------------------------------------------------------------------


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    k = (len(ordered) - 1) * q
    lo, hi = int(k), min(int(k) + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (k - lo)


def cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


# ---- load generation --------------------------------------------------------------------------


async def closed_loop(url: str, headers: dict, texts: list[str], concurrency: int, seconds: float) -> dict:
    """`concurrency` clients, each sending its next request as soon as the last one is answered."""
    import aiohttp

    latencies: list[float] = []
    errors = 0
    connector = aiohttp.TCPConnector(limit=concurrency)
    timeout = aiohttp.ClientTimeout(total=120)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout, headers=headers) as session:
        start = time.perf_counter()
        deadline = start + seconds

        async def client(n: int) -> None:
            nonlocal errors
            i = n
            while time.perf_counter() < deadline:
                body = texts[i % len(texts)].encode()
                i += concurrency
                sent = time.perf_counter()
                try:
                    async with session.post(url, data=body) as response:
                        await response.read()
                        ok = response.status == 200
                except aiohttp.ClientError:
                    ok = False
                if ok:
                    latencies.append(time.perf_counter() - sent)
                else:
                    errors += 1

        cpu_before = cpu_seconds()
        await asyncio.gather(*(client(n) for n in range(concurrency)))
        elapsed = time.perf_counter() - start
        cpu_used = cpu_seconds() - cpu_before
    return {
        "concurrency": concurrency,
        "requests": len(latencies),
        "errors": errors,
        "seconds": elapsed,
        "rps": len(latencies) / elapsed,
        "p50_ms": 1000 * percentile(latencies, 0.50),
        "p95_ms": 1000 * percentile(latencies, 0.95),
        "p99_ms": 1000 * percentile(latencies, 0.99),
        "client_cpu_fraction": cpu_used / elapsed,
    }


def read_counters(server, model: str) -> dict[str, float]:
    from tooling.prometheus import metric_value

    text = server.metrics_text()
    names = {"items": "bert_items_total", "batches": "bert_batches_total", "real": "bert_real_tokens_total",
             "padded": "bert_padded_tokens_total", "handler_ms": "bert_stage_milliseconds_total"}  # fmt: skip
    return {key: metric_value(text, name, ModelName=model) for key, name in names.items()}


def served_cells(args, checkpoint: Path, texts: list[str], workdir: Path, progress) -> list[dict]:
    from tooling.archiving import build_archive, write_model_config
    from tooling.torchserve import TorchServe

    store = workdir / "store"
    options = {"cpu_threads": args.threads} if args.threads else {}
    if args.dtype:
        options["dtype"] = args.dtype
    config = write_model_config(workdir / "model-config.yaml", **options)
    build_archive(checkpoint, name="bench", export_path=store, config_file=config)
    configs = [(1, 0)] + [(args.batch_size, d) for d in args.delays]
    cells = []
    with TorchServe(workdir / "server", store) as server:
        url = f"{server.inference_url}/predictions/bench"
        for batch_size, delay in configs:
            response = server.register("bench.mar", batch_size=batch_size, max_batch_delay=delay)
            if response.status_code != 200:
                raise RuntimeError(response.text)
            headers = {"Content-Type": "text/plain", **server.auth("inference")}
            asyncio.run(closed_loop(url, headers, texts, 4, min(2.0, args.duration)))  # warm-up
            for concurrency in args.concurrency:
                before = read_counters(server, "bench")
                cell = asyncio.run(closed_loop(url, headers, texts, concurrency, args.duration))
                after = read_counters(server, "bench")
                delta = {k: after[k] - before[k] for k in after}
                cell.update(
                    config=f"batch_size={batch_size}" + (f", delay={delay}ms" if batch_size > 1 else ""),
                    batch_size=batch_size,
                    max_batch_delay_ms=delay,
                    mean_batch_size=delta["items"] / delta["batches"] if delta["batches"] else float("nan"),
                    padding_waste=delta["padded"] / delta["real"] if delta["real"] else float("nan"),
                    # Time inside the handler per batch; the rest of a request's latency is
                    # queueing, the batch delay and TorchServe's frontend and IPC.
                    handler_ms_per_batch=delta["handler_ms"] / delta["batches"] if delta["batches"] else float("nan"),
                )
                cells.append(cell)
                progress(
                    f"{cell['config']:<28} c={concurrency:<3} {cell['rps']:7.1f} req/s  p50 {cell['p50_ms']:7.1f} ms"
                    f"  p95 {cell['p95_ms']:7.1f} ms  batch {cell['mean_batch_size']:.2f}  errors {cell['errors']}"
                    f"  client CPU {100 * cell['client_cpu_fraction']:.0f}% of a core"
                )
            server.unregister("bench")
    return cells


# ---- ceilings ---------------------------------------------------------------------------------


def hf_loop_ceiling(checkpoint: Path, texts: list[str], batch_size: int, threads: int) -> dict:
    """The plain Hugging Face loop: tokenize, pad to the longest, forward. No server, no validation."""
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    torch.set_num_threads(threads)
    tokenizer = AutoTokenizer.from_pretrained(checkpoint, local_files_only=True)
    model = AutoModelForSequenceClassification.from_pretrained(checkpoint, local_files_only=True).eval()
    batch_times = []
    with torch.inference_mode():
        model(**tokenizer(texts[:2], padding=True, return_tensors="pt"))  # warm-up
        started = time.perf_counter()
        for i in range(0, len(texts), batch_size):
            chunk = texts[i : i + batch_size]
            batch_started = time.perf_counter()
            batch = tokenizer(chunk, padding="longest", truncation=True, max_length=256, return_tensors="pt")
            model(**batch).logits.softmax(-1)
            batch_times.append(time.perf_counter() - batch_started)
        elapsed = time.perf_counter() - started
    return {
        "texts_per_s": len(texts) / elapsed,
        "ms_per_text": 1000 * elapsed / len(texts),
        "p50_ms_per_batch": 1000 * percentile(batch_times, 0.5),
    }


def worst_batch_seconds(checkpoint: Path, batch_size: int, tokens: int, threads: int, repeats: int = 3) -> list[float]:
    """Forward time of a full batch at the token cap: what responseTimeout must cover."""
    import torch
    from transformers import AutoModelForSequenceClassification

    torch.set_num_threads(threads)
    model = AutoModelForSequenceClassification.from_pretrained(checkpoint, local_files_only=True).eval()
    vocab = model.config.vocab_size
    batch = {
        "input_ids": torch.randint(5, vocab, (batch_size, tokens)),
        "attention_mask": torch.ones(batch_size, tokens, dtype=torch.long),
    }
    times = []
    with torch.inference_mode():
        model(**batch)  # warm-up
        for _ in range(repeats):
            started = time.perf_counter()
            model(**batch)
            times.append(time.perf_counter() - started)
    return times


def handler_ceiling(checkpoint: Path, texts: list[str], batch_size: int, max_batch_tokens: int, threads: int) -> dict:
    """This project's handler in-process at batch B: validation, tokenization, planning, forward, JSON."""
    import tempfile

    from handlers.batching import padded_tokens, plan_micro_batches
    from handlers.tokenization import encode
    from tooling.inprocess import load_handler, make_context, set_batch, unpacked_layout

    model_dir = unpacked_layout(checkpoint, Path(tempfile.mkdtemp(prefix="bench-unpacked-")))
    options = {"max_batch_tokens": max_batch_tokens, "cpu_threads": threads}
    handler = load_handler(model_dir, options)
    context = make_context(model_dir, options)
    batches = [texts[i : i + batch_size] for i in range(0, len(texts), batch_size)]
    started = time.perf_counter()
    for batch in batches:
        handler.handle(set_batch(context, [(t.encode(), "text/plain") for t in batch]), context)
    elapsed = time.perf_counter() - started

    # Padding waste of the same plan the handler made, from the handler's own functions.
    real = padded = passes = 0
    multiple = handler.options.pad_to_multiple_of
    for batch in batches:
        lengths = [e.length for e in encode(handler.tokenizer, batch, handler.max_length)]
        groups = plan_micro_batches(lengths, max_batch_tokens, multiple)
        passes += len(groups)
        real += sum(lengths)
        padded += padded_tokens(lengths, groups, multiple, handler.token_limit)
    return {
        "texts_per_s": len(texts) / elapsed,
        "padding_waste": padded / real,
        "forward_passes_per_batch": passes / len(batches),
    }


def ceilings(args, checkpoint: Path, texts: list[str], progress) -> dict:
    threads = args.threads or len(os.sched_getaffinity(0))
    results = {}
    for b in (1, args.batch_size):
        results[f"hf_loop_b{b}"] = hf_loop_ceiling(checkpoint, texts, b, threads)
        progress(f"ceiling: Hugging Face loop, batch {b}: {results[f'hf_loop_b{b}']['texts_per_s']:.1f} texts/s")
    for name, budget in (("pad_to_longest", UNLIMITED_TOKENS), ("length_aware", args.max_batch_tokens)):
        key = f"handler_b{args.batch_size}_{name}"
        results[key] = handler_ceiling(checkpoint, texts, args.batch_size, budget, threads)
        progress(
            f"ceiling: handler in-process, batch {args.batch_size}, {name} (max_batch_tokens={budget}): "
            f"{results[key]['texts_per_s']:.1f} texts/s, padded/real tokens {results[key]['padding_waste']:.2f}"
        )
    return results


# ---- targets, report ----------------------------------------------------------------------------


def evaluate_targets(report: dict) -> list[dict]:
    cells, ceil, b = report["served"], report["ceilings"], report["settings"]["batch_size"]
    batched = [c for c in cells if c["batch_size"] > 1]
    sequential = [c for c in cells if c["batch_size"] == 1]
    top = max(c["concurrency"] for c in cells)
    best_served = max(c["rps"] for c in batched if c["concurrency"] == top)
    hf_best = max(ceil["hf_loop_b1"]["texts_per_s"], ceil[f"hf_loop_b{b}"]["texts_per_s"])
    targets = [
        {
            "target": "served throughput at saturation >= 0.95 x Hugging Face loop ceiling (best of batch 1 and B)",
            "measured": best_served / hf_best,
            "goal": 0.95,
        },
        {
            "target": "length-aware ceiling >= 1.3 x pad-to-longest ceiling",
            "measured": ceil[f"handler_b{b}_length_aware"]["texts_per_s"]
            / ceil[f"handler_b{b}_pad_to_longest"]["texts_per_s"],
            "goal": 1.3,
        },
    ]
    at16 = [c for c in batched if c["concurrency"] == 16]
    base16 = [c for c in sequential if c["concurrency"] == 16]
    if at16 and base16:
        targets.append(
            {
                "target": "batched requests/s >= 1.5 x batch_size=1 at 16 clients (best delay)",
                "measured": max(c["rps"] for c in at16) / base16[0]["rps"],
                "goal": 1.5,
            }
        )
    single_ms = ceil["hf_loop_b1"]["p50_ms_per_batch"]  # median single-text time, to compare with a p50
    for cell in batched:
        if cell["concurrency"] == 1:
            bound = single_ms + cell["max_batch_delay_ms"] + 5
            targets.append(
                {
                    "target": f"lone-client p50 <= single-text time + delay + 5 ms ({cell['config']})",
                    "measured": cell["p50_ms"],
                    "goal": bound,
                    "lower_is_better": True,
                }
            )
    for t in targets:
        t["met"] = t["measured"] <= t["goal"] if t.get("lower_is_better") else t["measured"] >= t["goal"]
    return targets


def markdown(report: dict) -> str:
    s = report["settings"]
    lines = [
        f"Model: {s['model']} ({s['dtype']}), texts: {s['texts']} (mean {s['mean_tokens']:.0f} tokens, "
        f"max {s['max_tokens']}), {s['duration']} s per cell, machine: {report['machine']}",
        "",
        "| configuration | clients | req/s | p50 ms | p95 ms | p99 ms | errors | mean batch "
        "| handler ms/batch | padded/real | client CPU |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for c in report["served"]:
        lines.append(
            f"| {c['config']} | {c['concurrency']} | {c['rps']:.1f} | {c['p50_ms']:.1f} | {c['p95_ms']:.1f} | "
            f"{c['p99_ms']:.1f} | {c['errors']} | {c['mean_batch_size']:.2f} | {c['handler_ms_per_batch']:.1f} | "
            f"{c['padding_waste']:.2f} | "
            f"{100 * c['client_cpu_fraction']:.0f}% |"
        )
    lines += ["", "| ceiling (in-process, no server) | texts/s | notes |", "|---|---:|---|"]
    for name, c in report["ceilings"].items():
        if "padding_waste" in c:
            note = f"padded/real {c['padding_waste']:.2f}"
        else:
            note = f"{c['ms_per_text']:.1f} ms/text; p50 per batch {c['p50_ms_per_batch']:.1f} ms"
        lines.append(f"| {name} | {c['texts_per_s']:.1f} | {note} |")
    lines += ["", "| target | measured | goal | met |", "|---|---:|---:|---|"]
    for t in report["targets"]:
        lines.append(f"| {t['target']} | {t['measured']:.3f} | {t['goal']:.3f} | {'yes' if t['met'] else 'NO'} |")
    return "\n".join(lines) + "\n"


def plot(report: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2))
    for config in dict.fromkeys(c["config"] for c in report["served"]):
        cells = [c for c in report["served"] if c["config"] == config]
        x = [c["concurrency"] for c in cells]
        left.plot(x, [c["rps"] for c in cells], marker="o", label=config)
        right.plot(x, [c["p95_ms"] for c in cells], marker="o", label=config)
    for name, c in report["ceilings"].items():
        if name.startswith("hf_loop"):
            left.axhline(c["texts_per_s"], linestyle=":", color="grey")
            left.annotate(name, (1, c["texts_per_s"]), fontsize=7, color="grey")
    levels = sorted({c["concurrency"] for c in report["served"]})
    for axis, label in ((left, "requests/s"), (right, "p95 latency (ms)")):
        axis.set_xscale("log", base=2)
        axis.set_xticks(levels, [str(level) for level in levels])
        axis.set_xlabel("concurrent clients")
        axis.set_ylabel(label)
        axis.grid(alpha=0.3)
    right.set_yscale("log")
    left.legend(fontsize=8)
    fig.suptitle(f"{report['settings']['model']} on {report['machine']}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


# ---- main -------------------------------------------------------------------------------------


def resolve_model(name: str, workdir: Path) -> Path:
    from tooling.checkpoints import build_random_classifier

    if name == "demo":
        from tooling.demo_model import ensure_demo_model

        return ensure_demo_model()
    if name in ("tiny", "bert-base"):
        return build_random_classifier(workdir / name, name)
    return Path(name)


def _cuda_available() -> bool:
    import torch

    return torch.cuda.is_available()


def machine() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{len(os.sched_getaffinity(0))} cores, {cpu}, Python {platform.python_version()}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="demo", help="demo, bert-base, tiny, or a checkpoint folder")
    parser.add_argument("--concurrency", type=lambda s: [int(x) for x in s.split(",")], default=[1, 4, 16, 64])
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--delays", type=lambda s: [int(x) for x in s.split(",")], default=[2, 5, 10, 50])
    parser.add_argument("--duration", type=float, default=15.0, help="seconds of load per cell")
    parser.add_argument("--texts", type=int, default=256, help="corpus size")
    parser.add_argument("--max-batch-tokens", type=int, default=None, help="default: the value in model-config.yaml")
    parser.add_argument("--dtype", default=None, help="handler dtype option (auto: float16 on CUDA)")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: every core)")
    parser.add_argument("--out", type=Path, default=REPO / "bench_out")
    parser.add_argument("--quick", action="store_true", help="tiny settings that finish in under a minute")
    parser.add_argument(
        "--worst-batch", action="store_true", help="only time one forward pass of batch-size x 256 tokens, and exit"
    )
    parser.add_argument(
        "--sweep-max-batch-tokens",
        type=lambda s: [int(x) for x in s.split(",")],
        help="only measure the in-process handler ceiling at each of these budgets, and exit",
    )
    args = parser.parse_args(argv)
    if args.quick:
        args.concurrency, args.delays, args.duration, args.texts = [1, 4, 16], [2], 2.0, 48
    if args.max_batch_tokens is None:
        import yaml

        from handlers.options import HandlerOptions

        handler_config = yaml.safe_load(MODEL_CONFIG.read_text())["handler"]
        device = "cuda" if _cuda_available() else "cpu"
        args.max_batch_tokens = HandlerOptions.from_mapping(handler_config).for_device(device).max_batch_tokens

    import tempfile

    args.out.mkdir(parents=True, exist_ok=True)
    workdir = Path(tempfile.mkdtemp(prefix="bench-"))
    started = time.monotonic()

    def progress(message: str) -> None:
        print(f"[{time.monotonic() - started:6.1f}s] {message}", flush=True)

    checkpoint = resolve_model(args.model, workdir)
    if args.worst_batch:
        times = worst_batch_seconds(checkpoint, args.batch_size, 256, args.threads or len(os.sched_getaffinity(0)))
        print(
            f"{args.model}: forward pass of {args.batch_size} x 256 tokens: " + ", ".join(f"{t:.2f} s" for t in times)
        )
        return 0
    texts = build_corpus(args.texts)
    if args.sweep_max_batch_tokens:
        threads = args.threads or len(os.sched_getaffinity(0))
        print("| max_batch_tokens | texts/s | padded/real | forward passes per batch |\n|---:|---:|---:|---:|")
        for budget in args.sweep_max_batch_tokens:
            c = handler_ceiling(checkpoint, texts, args.batch_size, budget, threads)
            waste, passes = c["padding_waste"], c["forward_passes_per_batch"]
            print(f"| {budget} | {c['texts_per_s']:.1f} | {waste:.2f} | {passes:.2f} |")
        return 0
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(checkpoint, local_files_only=True)
    lengths = [len(ids) for ids in tokenizer(texts, truncation=True, max_length=256)["input_ids"]]
    mean_tokens = statistics.mean(lengths)
    progress(f"model {args.model}; {len(texts)} texts, {min(lengths)}-{max(lengths)} tokens (mean {mean_tokens:.0f})")

    report = {
        "machine": machine(),
        "command": "python -m scripts.benchmark " + " ".join(argv if argv is not None else sys.argv[1:]),
        "settings": {
            "model": args.model,
            "dtype": args.dtype or "auto",
            "batch_size": args.batch_size,
            "delays_ms": args.delays,
            "concurrency": args.concurrency,
            "duration": args.duration,
            "texts": len(texts),
            "mean_tokens": statistics.mean(lengths),
            "max_tokens": max(lengths),
            "max_batch_tokens": args.max_batch_tokens,
        },
    }
    report["ceilings"] = ceilings(args, checkpoint, texts, progress)
    report["served"] = served_cells(args, checkpoint, texts, workdir, progress)
    report["targets"] = evaluate_targets(report)

    (args.out / "benchmark.json").write_text(json.dumps(report, indent=2))
    (args.out / "benchmark.md").write_text(markdown(report))
    plot(report, args.out / "benchmark.png")
    print()
    print(markdown(report))
    progress(f"wrote {args.out}/benchmark.json, benchmark.md, benchmark.png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
