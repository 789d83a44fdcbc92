"""Every command refuses a value that cannot mean anything as it reads its command line (tooling/cli_arguments.py):
exit 2, one line naming the option, before it loads, trains, writes or starts anything. Each case below was, before,
a traceback minutes into a run (0 epochs, a negative grace period after the new version became the default), a
half-written layout, or a silent nonsense (a checkpoint written into the current folder, 0 replicas)."""

from __future__ import annotations

import argparse
import importlib

import pytest

from tooling.cli_arguments import (
    existing_file,
    existing_folder,
    fraction,
    list_of,
    model_name,
    model_version,
    non_negative_float,
    non_negative_int,
    output_folder,
    positive_float,
    positive_int,
    seed,
)

ACCEPTED = [
    (positive_int, "1", 1),
    (positive_int, "128", 128),
    (non_negative_int, "0", 0),
    (seed, "4294967295", 2**32 - 1),
    (positive_float, "0.3", 0.3),
    (non_negative_float, "0", 0.0),
    (fraction, "0", 0.0),  # 0 turns a --min-accuracy / --min-agreement check off
    (fraction, "0.99", 0.99),
    (fraction, "1", 1.0),
    (list_of(positive_int), "1,16, 64", [1, 16, 64]),
    (list_of(positive_float), "0.3", [0.3]),
    (model_name, "sentiment-v2.1_en", "sentiment-v2.1_en"),
    (model_version, "2.0", "2.0"),
    (model_version, "20261128", "20261128"),
]

REFUSED = [
    (positive_int, "0"),
    (positive_int, "-3"),
    (positive_int, "1.5"),
    (positive_int, "eight"),
    (non_negative_int, "-1"),
    (seed, "4294967296"),
    (seed, "99999999999999999999999"),
    (positive_float, "0"),
    (positive_float, "inf"),
    (positive_float, "nan"),
    (non_negative_float, "-5"),
    (fraction, "5"),
    (fraction, "nan"),
    (list_of(positive_int), ""),
    (list_of(positive_int), "13,,1"),
    (list_of(positive_int), "1,0"),
    (output_folder, ""),
    (model_name, ""),
    (model_name, "../escaped"),
    (model_name, "two words"),
    (model_version, ""),
    (model_version, "1 0"),
    (model_version, "1.0/extra"),
    (model_version, ".1"),
]


@pytest.mark.parametrize(("read", "value", "expected"), ACCEPTED)
def test_a_value_that_means_something_is_read(read, value, expected):
    assert read(value) == expected


@pytest.mark.parametrize(("read", "value"), REFUSED)
def test_a_value_that_means_nothing_is_refused(read, value):
    with pytest.raises(argparse.ArgumentTypeError):
        read(value)


def test_paths_are_what_they_are_said_to_be(tmp_path):
    a_file = tmp_path / "file"
    a_file.write_text("x")
    assert existing_file(str(a_file)) == a_file and existing_folder(str(tmp_path)) == tmp_path
    assert output_folder(str(tmp_path / "new")) == tmp_path / "new"
    wrong = [
        (existing_file, tmp_path),
        (existing_file, tmp_path / "missing"),
        (existing_file, ""),
        (existing_folder, a_file),
        (existing_folder, tmp_path / "missing"),
        (output_folder, a_file),
    ]
    for read, value in wrong:
        with pytest.raises(argparse.ArgumentTypeError):
            read(str(value))


# (command, its arguments, the option refused). "{out}" is a folder that must not come to exist, "{file}" a file
# where a folder is expected, "{missing}" a path that is not there, "{mar}" and "{checkpoint}" stand-ins that the
# command never reaches. Where a command would start servers or train once past a missing check, its case ends with a
# tripwire: an argument the command refuses on its own before any work, so that a check gone missing fails here at
# once, naming another option, and starts nothing.
STARTS_NOTHING = {
    "benchmark": ["--model", "{missing}"],
    "overload": ["--archive", "{missing}"],
    "fleet": ["--archive", "{missing}"],
    "soak": ["--checkpoint", "{missing}"],
    "update_model": ["--config", "{missing}"],
}
COMMANDS = [
    ("build_demo_model", ["--out", "{out}", "--epochs", "0"], "--epochs"),
    ("build_demo_model", ["--out", "{out}", "--batch-size", "-1"], "--batch-size"),
    ("build_demo_model", ["--out", "{out}", "--threads", "0"], "--threads"),
    ("build_demo_model", ["--out", "{out}", "--seed", "99999999999999999999999"], "--seed"),
    ("build_demo_model", ["--out", "{out}", "--min-accuracy", "5"], "--min-accuracy"),
    ("build_demo_model", ["--out", "{file}"], "--out"),
    ("demo_spread", ["--out", "{out}", "--seeds", ""], "--seeds"),
    ("random_model", [""], "out_dir"),
    ("random_model", ["{out}", "--seed", "-1"], "--seed"),
    ("archive_model", ["{checkpoint}", "--export-path", "{file}"], "--export-path"),
    ("archive_model", ["{checkpoint}", "--export-path", "{out}", "--config", "{missing}"], "--config"),
    (
        "archive_model",
        ["{checkpoint}", "--export-path", "{out}", "--backend", "onnx", "--eval-tsv", "{missing}"],
        "--eval-tsv",
    ),
    ("kserve_layout", ["{mar}", "--out", "{out}", "--workers", "0"], "--workers"),
    ("kserve_layout", ["{mar}", "--out", "{out}", "--name", "../escaped"], "--name"),
    ("kserve_layout", ["{mar}", "--out", "{out}", "--root", ""], "--root"),
    ("kserve_layout", ["{mar}", "--out", "{out}", "--max-batch-delay", "-5"], "--max-batch-delay"),
    ("kserve_layout", ["{mar}", "--out", "{out}", "--gpus", "-1"], "--gpus"),
    ("kserve_layout", ["{mar}", "--out", "{out}", "--gpus", "1", "--throughput-rps", "0"], "--throughput-rps"),
    (
        "latency_budget",
        ["--device", "gpu", "--units", "1", "--workers", "8", "--batch-size", "128", "--throughput-rps", "inf"],
        "--throughput-rps",
    ),
    ("benchmark", ["--out", "{out}", "--texts", "0"], "--texts"),
    ("benchmark", ["--out", "{out}", "--frame-reading", "--batch-size", "0"], "--batch-size"),
    ("benchmark", ["--out", "{out}", "--concurrency", "0,16"], "--concurrency"),
    ("benchmark", ["--out", "{out}", "--duration", "0"], "--duration"),
    ("benchmark", ["--out", "{out}", "--threads", "-1"], "--threads"),
    ("benchmark", ["--out", "{out}", "--model", "{missing}"], "--model"),
    ("overload", ["--out", "{out}", "--timeouts", "0,1"], "--timeouts"),
    ("overload", ["--out", "{out}", "--archive", "{missing}"], "--archive"),
    ("fleet", ["--root", "{out}", "up", "--replicas", "0"], "--replicas"),
    ("fleet", ["--root", "{out}", "up", "--alert-for", "BertReplicaDown"], "--alert-for"),
    ("fleet", ["--root", "{out}", "up", "--latency-budget-ms", "-5"], "--latency-budget-ms"),
    ("soak", ["--workdir", "{out}", "--minutes", "0"], "--minutes"),
    ("soak", ["--workdir", "{out}", "--clients", "0"], "--clients"),
    ("soak", ["--workdir", "{out}", "--checkpoint", "{missing}"], "--checkpoint"),
    ("update_model", ["{mar}", "--grace-seconds", "-5"], "--grace-seconds"),
    ("update_model", ["{mar}", "--model", "two words"], "--model"),
    ("archive_model", ["{checkpoint}", "--export-path", "{out}", "--version", ""], "--version"),
    ("archive_model", ["{checkpoint}", "--export-path", "{out}", "--name", "two words"], "--name"),
    ("ports_free", ["--properties", "{missing}"], "--properties"),
]


@pytest.mark.parametrize(("command", "arguments", "option"), COMMANDS, ids=lambda v: v if isinstance(v, str) else "")
def test_each_command_refuses_nonsense_before_it_does_anything(command, arguments, option, tmp_path, capsys,
                                                               monkeypatch, sigterm_kept):  # fmt: skip
    a_file = tmp_path / "a-file"
    a_file.write_text("not a folder")
    places = {
        "out": tmp_path / "out", "file": a_file, "missing": tmp_path / "missing", "mar": a_file,
        "checkpoint": tmp_path,
    }  # fmt: skip
    tripwire = STARTS_NOTHING.get(command, [])
    if option in tripwire:  # the case refuses the tripwire's own option
        tripwire = []
    argv = [argument.format(**places) for argument in [*arguments, *tripwire]]
    main = importlib.import_module(f"scripts.{command}").main
    monkeypatch.chdir(tmp_path)  # a path of '' is the current folder: the test's, never the checkout
    with pytest.raises(SystemExit) as stopped:
        main(argv)
    said = capsys.readouterr()
    assert stopped.value.code == 2, said.err
    assert f"error: argument {option}: " in said.err.strip().splitlines()[-1], said.err
    assert said.out == "" and "Traceback" not in said.err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a-file"]  # nothing written, not even --out
