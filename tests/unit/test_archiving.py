"""tooling/archiving.py writes an archive whole or not at all: torch-model-archiver writes its zip in place, manifest
last, so an archiver cut short must never leave a truncated file under the archive's name (scripts/setup.sh would
call a truncated model_store/bert.mar, newer than its sources, up to date)."""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import zipfile

import pytest

from tests.support import answering_every_call, serving_http
from tooling import archiving
from tooling.model_archive import archive_name, archive_response_timeout, archive_version

OLD = b"the archive that was there before"


def export_path_of(command: list[str]) -> str:
    return command[command.index("--export-path") + 1]


def test_an_archiver_cut_short_leaves_the_old_archive_and_nothing_else(tiny_checkpoint, tmp_path, monkeypatch):
    store = tmp_path / "store"
    store.mkdir()
    (store / "tiny.mar").write_bytes(OLD)
    real_run = subprocess.run

    def cut_short(command, **kwargs):
        """The real archiver, then its zip truncated and a kill's exit status: what an interrupted write leaves."""
        real_run(command, **kwargs)
        written = next(path for path in (tmp_path / "store").rglob("tiny.mar") if path.read_bytes() != OLD)
        written.write_bytes(written.read_bytes()[: written.stat().st_size // 2])
        raise subprocess.CalledProcessError(-9, command)

    monkeypatch.setattr(archiving.subprocess, "run", cut_short)
    with pytest.raises(subprocess.CalledProcessError):
        archiving.pack_archive(tiny_checkpoint, "tiny", store)
    assert (store / "tiny.mar").read_bytes() == OLD
    assert sorted(path.name for path in store.iterdir()) == ["tiny.mar"], "a partial file or folder was left"


def test_a_finished_archive_replaces_the_old_one_in_one_rename(tiny_checkpoint, tmp_path):
    store = tmp_path / "store"
    store.mkdir()
    (store / "tiny.mar").write_bytes(OLD)
    before = (store / "tiny.mar").stat().st_ino
    written = archiving.pack_archive(tiny_checkpoint, "tiny", store, version="2.0")
    assert written == store / "tiny.mar" and archive_version(written) == "2.0"
    assert written.stat().st_ino != before, "written in place rather than renamed over the old file"
    assert sorted(path.name for path in store.iterdir()) == ["tiny.mar"]


def test_a_file_name_of_its_own_keeps_the_model_name(tiny_checkpoint, tmp_path):
    """scripts.update_model's input: a new version of `tiny` beside tiny.mar, which is left alone."""
    store = tmp_path / "store"
    store.mkdir()
    (store / "tiny.mar").write_bytes(OLD)
    written = archiving.pack_archive(tiny_checkpoint, "tiny", store, version="2.0", file_name="tiny-2.0.mar")
    assert written == store / "tiny-2.0.mar"
    assert (archive_name(written), archive_version(written)) == ("tiny", "2.0")
    assert (store / "tiny.mar").read_bytes() == OLD
    assert sorted(path.name for path in store.iterdir()) == ["tiny-2.0.mar", "tiny.mar"]


@pytest.mark.parametrize("file_name", ["sub/tiny.mar", "tiny.zip", ".tiny.mar", "../tiny.mar"])
def test_a_file_name_must_be_a_plain_archive_name(file_name):
    with pytest.raises(ValueError, match=r"plain NAME\.mar"):
        archiving.archive_file_name("tiny", file_name)


def test_an_archive_without_a_version_is_read_as_torchserves_1_0(tmp_path):
    """torch-model-archiver leaves the version out of the manifest for an empty --version, and TorchServe 0.12
    registers such an archive as 1.0: scripts.update_model and the cluster snapshot read it the same way (it was a
    KeyError)."""
    archive = tmp_path / "unversioned.mar"
    with zipfile.ZipFile(archive, "w") as mar:
        mar.writestr("MAR-INF/MANIFEST.json", json.dumps({"model": {"modelName": "tiny", "handler": "h.py"}}))
    assert (archive_name(archive), archive_version(archive)) == ("tiny", "1.0")


@pytest.mark.parametrize("value", ["cpu_threads", "=2", " =2"])
def test_a_handler_option_needs_a_key_and_an_equals_sign(value):
    """`cpu_threads` alone would otherwise become the option cpu_threads with no value (None) in model-config.yaml."""
    with pytest.raises(argparse.ArgumentTypeError, match="expected KEY=VALUE"):
        archiving.parse_handler_option(value)


def test_a_handler_options_value_is_read_as_yaml():
    assert archiving.parse_handler_option("cpu_threads=2") == ("cpu_threads", 2)
    assert archiving.parse_handler_option("compile=true") == ("compile", True)


def test_an_archives_config_without_a_response_timeout_is_read_as_torchserves_120_seconds(tmp_path):
    """With a model-config.yaml in the archive TorchServe 0.12 takes responseTimeout from it, 120 when it has none,
    and ignores the server's value: the caller's default applies only to an archive without a config."""
    archive = tmp_path / "configured.mar"
    manifest = {"model": {"modelName": "tiny", "handler": "h.py", "configFile": "model-config.yaml"}}
    with zipfile.ZipFile(archive, "w") as mar:
        mar.writestr("MAR-INF/MANIFEST.json", json.dumps(manifest))
        mar.writestr("model-config.yaml", "batchSize: 8\n")
    assert archive_response_timeout(archive, default=30) == 120


def test_an_archive_without_a_config_takes_the_callers_response_timeout(tmp_path):
    archive = tmp_path / "unconfigured.mar"
    with zipfile.ZipFile(archive, "w") as mar:
        mar.writestr("MAR-INF/MANIFEST.json", json.dumps({"model": {"modelName": "tiny", "handler": "h.py"}}))
    assert archive_response_timeout(archive, default=30) == 30


# ---- archive_model's refusals before anything is archived --------------------------------------------------------


def test_a_folder_without_weights_is_no_checkpoint_and_options_of_another_backend_are_refused(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(archiving.NotACheckpoint, match="no weights"):
        archiving.build_archive(tmp_path, export_path=tmp_path / "store")
    with pytest.raises(ValueError, match="backend must be one of"):
        archiving.build_archive(tmp_path, export_path=tmp_path / "store", backend="tensorrt")
    with pytest.raises(ValueError, match="apply to the onnx backend only"):
        archiving.build_archive(tmp_path, export_path=tmp_path / "store", quantize="int8")
    assert not (tmp_path / "store").exists()


@pytest.mark.parametrize(
    "flags, refusal",
    [
        (["--quantize", "int8"], "--quantize, --min-agreement and --eval-tsv need --backend onnx"),
        (["--backend", "onnx", "--min-agreement", "0.9"], "--min-agreement applies to --quantize int8"),
    ],
)
def test_archive_model_refuses_onnx_options_that_would_not_apply(tmp_path, capsys, flags, refusal):
    from scripts import archive_model

    with pytest.raises(SystemExit) as exited:
        archive_model.main([str(tmp_path / "checkpoint"), "--export-path", str(tmp_path), *flags])
    assert exited.value.code == 2 and refusal in capsys.readouterr().err


def test_archive_model_refuses_a_handler_option_the_handler_would_refuse_before_archiving(tmp_path, capsys):
    from scripts import archive_model

    store = tmp_path / "store"
    argv = [str(tmp_path / "checkpoint"), "--export-path", str(store), "--handler-option", "no_such_option=1"]
    assert archive_model.main(argv) == 2
    said = capsys.readouterr().err
    assert "no_such_option" in said and "no such folder" not in said, said
    assert not store.exists() or not list(store.iterdir())


def test_an_archive_of_every_cpu_per_worker_says_what_serve_sh_makes_of_it_and_the_option_for_one_per_cpu(
    tiny_checkpoint, tmp_path, capsys
):
    """torch-model-archiver's default, cpu_threads 0, gives one worker on a CPU host (scripts/cpu_layout.py): said as
    the archive is written, where the option that gives one per CPU can still be added."""
    from scripts import archive_model

    argv = [str(tiny_checkpoint), "--export-path", str(tmp_path), "--server-config", str(tmp_path / "none.properties")]
    assert archive_model.main([*argv, "--name", "every"]) == 0
    said = capsys.readouterr().out
    assert "every.mar: cpu_threads 0, every CPU in each worker: on a CPU host scripts/serve.sh starts one" in said, said
    assert "--handler-option cpu_threads=1 gives one per CPU" in said, said
    assert archive_model.main([*argv, "--name", "one", "--handler-option", "cpu_threads=1"]) == 0
    assert "cpu_threads 0" not in capsys.readouterr().out
    # The set-up's GPU archive (CUDA graphs, which only a GPU runs): serve.sh starts 8 workers a GPU, said nothing of.
    assert archive_model.main([*argv, "--name", "gpu", "--handler-option", "cuda_graphs=true"]) == 0
    assert "cpu_threads 0" not in capsys.readouterr().out
    # A --config its workers will refuse at load is archived as before (their load says why), nothing said of it.
    refused = archiving.write_model_config(tmp_path / "refused.yaml", None, max_length="long")
    assert archive_model.main([*argv, "--name", "refused", "--config", str(refused)]) == 0
    assert "cpu_threads 0" not in capsys.readouterr().out and (tmp_path / "refused.mar").is_file()


def test_archive_model_asks_nothing_of_a_server_without_a_key_file_or_with_another_store(tmp_path, capsys):
    """No key file: that server is not running. Another store: the archive is none of its. Either way the
    archive is written (here the missing checkpoint stops it next), with no warning and no request sent."""
    from scripts import archive_model

    asked: list[str] = []
    store = tmp_path / "store"
    store.mkdir()
    (store / "bert.mar").write_bytes(OLD)
    config = tmp_path / "config.properties"
    argv = [str(tmp_path / "checkpoint"), "--export-path", str(store), "--server-config", str(config)]
    with serving_http(answering_every_call(500, asked=asked)) as url:
        config.write_text(f"inference_address={url}\nmanagement_address={url}\nmodel_store={store}\n")
        assert archive_model.main([*argv, "--key-file", str(tmp_path / "key_file.json")]) == 2
        said = capsys.readouterr().err
        assert "no such folder" in said and "WARNING" not in said, said
        config.write_text(
            f"inference_address={url}\nmanagement_address={url}\nmodel_store={tmp_path / 'other'}\n"
            "disable_token_authorization=true\n"
        )
        assert archive_model.main([*argv, "--key-file", str(tmp_path / "key_file.json")]) == 2
        said = capsys.readouterr().err
        assert "no such folder" in said and "WARNING" not in said, said
    assert asked == []


def test_a_checkpoint_saved_without_its_tokenizer_is_refused_by_the_archiver_and_the_loader(
    tiny_checkpoint, tmp_path, capsys
):
    """Without tokenizer files transformers builds, without a word, a tokenizer of the config's family holding only
    its special tokens: every word would be [UNK], and every text of as many words answered alike. Refused before
    anything is archived, and by the loader every worker, export and benchmark goes through."""
    from handlers.loading import ModelLoadFailed, load_model
    from handlers.options import HandlerOptions
    from scripts import archive_model

    bare = tmp_path / "bare"
    bare.mkdir()
    for name in ("config.json", "model.safetensors"):
        shutil.copy2(tiny_checkpoint / name, bare / name)
    store = tmp_path / "store"
    assert archive_model.main([str(bare), "--name", "bare", "--export-path", str(store)]) == 2
    said = capsys.readouterr().err
    assert "the tokenizer knows 5 token ids" in said and "model embeds 30522" in said, said
    assert "tokenizer.save_pretrained(folder)" in said, said
    assert not store.exists() or not list(store.iterdir())
    with pytest.raises(ModelLoadFailed, match="the checkpoint's tokenizer files are missing"):
        load_model(bare, HandlerOptions(), None)
    # Its own tokenizer beside it, the same checkpoint loads.
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy2(tiny_checkpoint / name, bare / name)
    assert load_model(bare, HandlerOptions(), None).labels == ("negative", "positive")


def test_a_checkpoint_path_that_is_not_there_is_named_so(tmp_path):
    with pytest.raises(archiving.NotACheckpoint, match="absent: no such folder"):
        archiving.check_checkpoint(tmp_path / "absent")
    (tmp_path / "empty").mkdir()
    with pytest.raises(archiving.NotACheckpoint, match=r"empty: no config\.json"):
        archiving.check_checkpoint(tmp_path / "empty")
