"""Checkpoint scanning (analyzers/pickles.py): a malicious corpus built here, at test time, with the verdict
each file must get; the CLI on it in every format; bounded memory on a large checkpoint."""
from __future__ import annotations

import argparse
import builtins
import io
import json
import os
import pickle
import runpy
import struct
import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch

from analyzers.config import Config
from analyzers.pickles import checkpoint_result, scan_file, verdict

REPO = Path(__file__).resolve().parent.parent


class RunsShell:
    def __reduce__(self):
        return (os.system, ("echo pwned",))


class Popens:
    def __reduce__(self):
        return (subprocess.Popen, (["true"],))


class GetattrOfPopen:
    """Nested __reduce__: the argument of one reduce is another malicious object."""

    def __reduce__(self):
        return (builtins.getattr, (Popens(), "wait"))


class Execs:
    def __reduce__(self):
        return (builtins.exec, ("import os",))


class RunsCode:
    def __reduce__(self):
        return (runpy._run_code, ("x = 1", {}))


def _findings(path: Path, config: Config | None = None):
    return checkpoint_result(path, path.name, config or Config()).findings


def _critical_callables(path: Path) -> set[str]:
    return {f.message.split("`")[1] for f in _findings(path) if f.rule == "TR620" and "`" in f.message}


def _rules(path: Path) -> set[str]:
    return {f.rule for f in _findings(path)}


def _hand_made_zip(path: Path, payload: bytes) -> Path:
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("archive/data.pkl", payload)
        archive.writestr("archive/version", "3\n")
    return path


def _state_dict():
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.BatchNorm1d(3))
    return model, model.state_dict()


@pytest.mark.parametrize("protocol", range(pickle.HIGHEST_PROTOCOL + 1))
def test_os_system_in_every_protocol_is_critical(tmp_path, protocol):
    path = tmp_path / f"evil{protocol}.pkl"
    path.write_bytes(pickle.dumps({"weights": [1.0], "hook": RunsShell()}, protocol=protocol))
    assert _critical_callables(path) == {f"{os.system.__module__}.system"}  # posix.system on Linux


# name -> (how to build the file, the callables TR620 must name; empty: benign, no TR620)
def _corpus(tmp_path: Path) -> dict[str, tuple[Path, set[str]]]:
    model, state = _state_dict()
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
    model(torch.ones(2, 4)).sum().backward()
    optimizer.step()
    corpus: dict[str, tuple[Path, set[str]]] = {}

    def save(name, obj, expected, **kwargs):
        torch.save(obj, tmp_path / name, **kwargs)
        corpus[name] = (tmp_path / name, expected)

    system = f"{os.system.__module__}.system"
    save("zip_evil.pt", {"model": state, "extra": RunsShell()}, {system})
    save("legacy_evil.pth", {"model": state, "extra": RunsShell()}, {system}, _use_new_zipfile_serialization=False)
    save("nested.ckpt", {"state": state, "cb": GetattrOfPopen()}, {"builtins.getattr", "subprocess.Popen"})
    save("exec.bin", [Execs()], {"builtins.exec"})
    save("runpy.pt", {"x": RunsCode()}, {"runpy._run_code"})
    save("state_dict.pt", state, set())
    save("state_dict_legacy.pt", state, set(), _use_new_zipfile_serialization=False)
    save("optimizer.pt", {"optimizer": optimizer.state_dict(), "epoch": 3, "model": state}, set())
    save("namespace.pt", {"model": state, "args": argparse.Namespace(lr=0.1)}, set())
    save("quantized.pt", {"q": torch.quantize_per_tensor(torch.ones(4), 0.1, 0, torch.quint8),
                          "p": torch.nn.Parameter(torch.ones(2)), "s": torch.Size([2, 3]),
                          "d": torch.device("cpu"), "dt": torch.bfloat16}, set())
    corpus["hand_zip.pt"] = (_hand_made_zip(tmp_path / "hand_zip.pt", pickle.dumps(RunsShell(), protocol=2)), {system})
    np.save(tmp_path / "numbers.npy", np.arange(10.0))
    corpus["numbers.npy"] = (tmp_path / "numbers.npy", set())
    np.save(tmp_path / "objects.npy", np.array([RunsShell(), 1], dtype=object), allow_pickle=True)
    corpus["objects.npy"] = (tmp_path / "objects.npy", {system})
    np.savez(tmp_path / "arrays.npz", a=np.ones(3), b=np.array([Popens()], dtype=object))
    corpus["arrays.npz"] = (tmp_path / "arrays.npz", {"subprocess.Popen"})
    (tmp_path / "sklearn_like.pkl").write_bytes(pickle.dumps({"coef": np.ones((2, 2)), "n": 3}))
    corpus["sklearn_like.pkl"] = (tmp_path / "sklearn_like.pkl", set())
    return corpus


def test_corpus_verdicts(tmp_path):
    for name, (path, expected) in _corpus(tmp_path).items():
        assert _critical_callables(path) == expected, name
        if not expected:
            assert "TR622" not in _rules(path), (name, _findings(path))


def test_namespace_is_a_low_note_not_critical(tmp_path):
    path = tmp_path / "ns.pt"
    torch.save({"args": argparse.Namespace(lr=0.1)}, path)
    [finding] = _findings(path)
    assert (finding.rule, finding.severity.label) == ("TR621", "low")
    assert "`argparse.Namespace`" in finding.message


def test_benign_checkpoints_import_only_what_weights_only_accepts(tmp_path):
    """The allowlist agrees with torch: every global of the benign torch files is one weights_only loads."""
    for name, (path, expected) in _corpus(tmp_path).items():
        if expected or not name.endswith((".pt", ".pth")) or name == "namespace.pt":
            continue
        assert {i.dotted for i in scan_file(path).imports if verdict(i) != "allowed"} == set(), name
        torch.load(path, weights_only=True)  # and torch agrees


def _op(code: str, payload: bytes = b"") -> bytes:
    return code.encode("latin-1") + payload


def _short_unicode(text: str) -> bytes:
    return b"\x8c" + bytes([len(text)]) + text.encode()


def test_name_built_on_the_stack_is_unresolved_and_critical(tmp_path):
    # 'os', then str('system') computed by a REDUCE: STACK_GLOBAL's name is not a constant
    payload = (b"\x80\x04" + _short_unicode("os") + b"c" + b"builtins\nstr\n" + _short_unicode("system")
               + b"\x85R\x93" + _short_unicode("id") + b"\x85R.")
    path = tmp_path / "obfuscated.pkl"
    path.write_bytes(payload)
    messages = [f.message for f in _findings(path) if f.rule == "TR620"]
    assert any("cannot name" in m for m in messages), messages


def test_memoized_names_resolve(tmp_path):
    # the names come back from the memo (BINGET), as the pickler writes repeated strings
    payload = (b"\x80\x04" + _short_unicode("subprocess") + b"\x94" + _short_unicode("run") + b"\x94"
               + b"h\x00h\x01\x93" + _short_unicode("id") + b"\x85R.")
    path = tmp_path / "memo.pkl"
    path.write_bytes(payload)
    assert _critical_callables(path) == {"subprocess.run"}


def test_truncated_pickle_after_a_payload_reports_both(tmp_path):
    path = tmp_path / "broken.pkl"
    path.write_bytes(pickle.dumps(RunsShell(), protocol=2)[:-1] + b"\xff\xfe")
    assert _rules(path) == {"TR620", "TR622"}


def test_payload_after_long_inline_bytes_is_found(tmp_path):
    path = tmp_path / "long.pkl"
    path.write_bytes(pickle.dumps([b"\0" * 3_000_000, RunsShell()], protocol=4))
    assert _critical_callables(path) == {f"{os.system.__module__}.system"}


def test_raw_bin_that_is_not_a_pickle_is_skipped(tmp_path):
    path = tmp_path / "vocab.bin"
    path.write_bytes(b"\x00\x01\x02 raw float weights" * 10)
    assert _findings(path) == []


def _safetensors(path: Path, header: dict, data: bytes) -> Path:
    raw = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + data)
    return path


def test_safetensors_headers(tmp_path):
    good = {"w": {"dtype": "F32", "shape": [2, 2], "data_offsets": [0, 16]},
            "b": {"dtype": "BF16", "shape": [2], "data_offsets": [16, 20]}, "__metadata__": {"format": "pt"}}
    assert _findings(_safetensors(tmp_path / "good.safetensors", good, bytes(20))) == []
    cases = {
        "past_end": ({"w": {"dtype": "F32", "shape": [2, 2], "data_offsets": [0, 4096]}}, "outside"),
        "shape": ({"w": {"dtype": "F32", "shape": [3], "data_offsets": [0, 16]}}, "needs 12 bytes"),
        "dtype": ({"w": {"dtype": "F99", "shape": [4], "data_offsets": [0, 16]}}, "unknown dtype"),
        "overlap": ({"a": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]},
                     "b": {"dtype": "F32", "shape": [2], "data_offsets": [8, 16]}}, "overlap"),
        "negative": ({"w": {"dtype": "F32", "shape": [-4], "data_offsets": [0, 16]}}, "non-negative"),
    }
    for name, (header, expected) in cases.items():
        findings = _findings(_safetensors(tmp_path / f"{name}.safetensors", header, bytes(16)))
        assert [f.rule for f in findings] == ["TR622"] and expected in findings[0].message, (name, findings)
    huge = tmp_path / "huge.safetensors"
    huge.write_bytes(struct.pack("<Q", 1 << 40) + b"{}")
    assert "exceeds" in _findings(huge)[0].message
    not_json = tmp_path / "text.safetensors"
    not_json.write_bytes(struct.pack("<Q", 3) + b"abc")
    assert "not JSON" in _findings(not_json)[0].message


def test_select_and_severity_configuration_apply(tmp_path):
    path = tmp_path / "ns.pt"
    torch.save({"args": argparse.Namespace(lr=0.1), "x": RunsShell()}, path)
    assert {f.rule for f in _findings(path, Config(ignore=("TR621",)))} == {"TR620"}
    config = Config(severity={"TR621": Config().severity_for("TR620", _findings(path)[0].severity)})
    assert {f.severity.label for f in _findings(path, config)} == {"critical"}


def _cli(*args, cwd):
    exe = Path(sys.executable).with_name("torchreview")
    cmd = [str(exe)] if exe.exists() else [sys.executable, "-m", "bot.cli"]
    return subprocess.run([*cmd, *args], cwd=cwd, capture_output=True, text=True,
                          env={**os.environ, "NO_COLOR": "1", "COLUMNS": "300", "PYTHONPATH": str(REPO)})


def test_cli_finds_checkpoints_in_the_tree_in_every_format(tmp_path):
    (tmp_path / ".git").mkdir()
    (tmp_path / "weights").mkdir()
    torch.save({"x": RunsShell()}, tmp_path / "weights" / "model.pt")
    torch.save(_state_dict()[1], tmp_path / "weights" / "clean.pt")
    text = _cli("check", ".", "--no-cache", cwd=tmp_path)
    assert text.returncode == 1 and "weights/model.pt" in text.stdout and "TR620" in text.stdout, text.stdout
    assert "clean.pt" not in text.stdout
    report = json.loads(_cli("check", ".", "--no-cache", "--format", "json", cwd=tmp_path).stdout)
    assert [(f["path"], f["rule"], f["severity"]) for f in report["findings"]] == [
        ("weights/model.pt", "TR620", "critical")]
    sarif = json.loads(_cli("check", ".", "--no-cache", "--format", "sarif", cwd=tmp_path).stdout)
    [result] = sarif["runs"][0]["results"]
    assert result["ruleId"] == "TR620" and "system" in result["message"]["text"]
    assert "TR620" in {r["id"] for r in sarif["runs"][0]["tool"]["driver"]["rules"]}
    github = _cli("check", "weights/model.pt", "--no-cache", "--format", "github", cwd=tmp_path).stdout
    assert github.startswith("::error file=weights/model.pt,line=1") and "TR620" in github
    assert _cli("check", "weights/clean.pt", "--no-cache", cwd=tmp_path).returncode == 0
    docs = _cli("rule", "TR620", cwd=tmp_path)
    assert docs.returncode == 0 and "pickle" in docs.stdout


# VmHWM (the peak RSS of this process's memory since exec): getrusage's ru_maxrss would include the parent's
# peak (pytest, with torch), which survives fork and exec.
_PEAK_RSS = """
import sys
from pathlib import Path
from analyzers.config import Config
from analyzers.pickles import checkpoint_result
result = checkpoint_result(Path(sys.argv[1]), sys.argv[1], Config())
assert [f.rule for f in result.findings] == sys.argv[2:], result.findings
status = dict(line.split(":", 1) for line in open("/proc/self/status"))
print(int(status["VmHWM"].split()[0]) // 1024)
"""


def _peak_rss_mb(path: Path, *rules: str) -> int:
    proc = subprocess.run([sys.executable, "-c", _PEAK_RSS, str(path), *rules], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(REPO)}, check=True)
    return int(proc.stdout.strip())


def test_large_checkpoints_are_scanned_in_bounded_memory(tmp_path):
    """200 MB of tensor data (zip and legacy format) and 200 MB of bytes pickled inline: the scan's peak
    RSS stays far below the file's size (the data is skipped, never read into memory)."""
    big = torch.zeros(50_000_000)  # 200 MB
    torch.save({"w": big, "x": RunsShell()}, tmp_path / "big.pt")
    torch.save({"w": big}, tmp_path / "big_legacy.pt", _use_new_zipfile_serialization=False)
    del big
    inline = tmp_path / "inline.pkl"
    with inline.open("wb") as stream:  # BINBYTES8 of 200 MB, written in chunks, then os.system
        stream.write(b"\x80\x04\x8e" + struct.pack("<Q", 200_000_000))
        for _ in range(200):
            stream.write(bytes(1_000_000))
        stream.write(b"0" + pickle.dumps(RunsShell(), protocol=4)[2:])
    for path, rules in ((tmp_path / "big.pt", ["TR620"]), (tmp_path / "big_legacy.pt", []), (inline, ["TR620"])):
        assert path.stat().st_size > 190_000_000
        assert _peak_rss_mb(path, *rules) < 80, path.name


def test_cli_fix_reports_checkpoints_and_leaves_them_unchanged(tmp_path):
    (tmp_path / ".git").mkdir()
    torch.save({"x": RunsShell()}, tmp_path / "model.pt")
    before = (tmp_path / "model.pt").read_bytes()
    proc = _cli("check", ".", "--no-cache", "--fix", "--format", "json", cwd=tmp_path)
    report = json.loads(proc.stdout)
    assert [f["rule"] for f in report["findings"]] == ["TR620"] and report["errors"] == [], proc.stderr
    assert (tmp_path / "model.pt").read_bytes() == before


def test_git_lfs_pointer_is_not_a_malformed_checkpoint(tmp_path):
    path = tmp_path / "model.pt"
    path.write_text("version https://git-lfs.github.com/spec/v1\noid sha256:" + "0" * 64 + "\nsize 123\n")
    assert _findings(path) == []


def test_cli_diff_keeps_findings_of_a_changed_checkpoint(tmp_path):
    """``--diff`` (the Action): a checkpoint changed since the base is reported whole, in both filters."""
    def git(*args):
        subprocess.run(["git", *args], cwd=tmp_path, check=True, capture_output=True)

    git("init", "-q")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "--allow-empty", "-m", "base")
    torch.save({"x": RunsShell()}, tmp_path / "model.pt")
    torch.save({"x": RunsShell()}, tmp_path / "untracked.pt")
    git("add", "model.pt")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "add a checkpoint")
    for filter_ in ("added", "introduced"):
        (tmp_path / ".torchreview.toml").write_text(f'filter = "{filter_}"\n')
        report = json.loads(_cli("check", ".", "--no-cache", "--diff", "HEAD~1", "--format", "json",
                                 cwd=tmp_path).stdout)
        assert sorted(f["path"] for f in report["findings"]) == ["model.pt", "untracked.pt"], (filter_, report)


@pytest.mark.parametrize("compress", ["gzip", "bz2", "xz", "lzma", "zlib"])
def test_compressed_pickles_are_scanned_as_a_stream(tmp_path, compress):
    import bz2
    import gzip
    import lzma
    import zlib

    packers = {"gzip": gzip.compress, "bz2": bz2.compress, "xz": lzma.compress, "zlib": zlib.compress,
               "lzma": lambda data: lzma.compress(data, format=lzma.FORMAT_ALONE)}
    evil, clean = tmp_path / "evil.joblib", tmp_path / "clean.pkl"
    evil.write_bytes(packers[compress](pickle.dumps({"w": np.ones(100), "x": RunsShell()})))
    clean.write_bytes(packers[compress](pickle.dumps({"w": np.ones(100)})))
    assert _critical_callables(evil) == {f"{os.system.__module__}.system"}
    assert _findings(clean) == []


def test_joblib_files_with_inline_arrays(tmp_path):
    """joblib writes array bytes into the pickle stream after each wrapper: the scan steps over them (with
    joblib's alignment padding) and scans object arrays' own pickles, so a payload after an array is found."""
    joblib = pytest.importorskip("joblib")
    arrays = {"f": np.ones((30, 40)), "i": np.arange(7, dtype=np.int16), "u": np.array(["ab", "cde"]),
              "empty": np.zeros((0, 3)), "fortran": np.asfortranarray(np.ones((3, 5)))}
    joblib.dump(arrays, tmp_path / "clean.joblib")
    joblib.dump({**arrays, "x": RunsShell()}, tmp_path / "after.joblib")
    joblib.dump({**arrays, "o": np.array([Popens()], dtype=object)}, tmp_path / "objects.joblib")
    joblib.dump({**arrays, "x": RunsShell()}, tmp_path / "zlib.joblib", compress=3)
    assert _findings(tmp_path / "clean.joblib") == []
    assert _critical_callables(tmp_path / "after.joblib") == {f"{os.system.__module__}.system"}
    assert _critical_callables(tmp_path / "objects.joblib") == {"subprocess.Popen"}
    assert _critical_callables(tmp_path / "zlib.joblib") == {f"{os.system.__module__}.system"}


def test_bytes_disguised_as_joblib_array_data_are_scanned_as_pickle_load_reads_them(tmp_path):
    """An array wrapper (shape (2,), dtype i8: 16 bytes of data, no alignment padding) whose "data" is opcodes:
    joblib.load steps over them, pickle.load runs them. Written by hand, so no joblib is needed."""
    wrapper = (b"\x80\x04" + _short_unicode("joblib.numpy_pickle") + _short_unicode("NumpyArrayWrapper")
               + b"\x93)\x81}(" + _short_unicode("shape") + b"K\x02\x85" + _short_unicode("dtype")
               + _short_unicode("numpy") + _short_unicode("dtype") + b"\x93" + _short_unicode("i8")
               + b"\x89\x88\x87R" + _short_unicode("order") + _short_unicode("C") + b"ub")
    disguised = b"cos\nsystem\n" + _short_unicode("id") + b"\x85"
    assert len(disguised) == 16
    path = tmp_path / "disguised.pkl"
    path.write_bytes(wrapper + disguised + b"R0.")
    assert _critical_callables(path) == {"os.system"}


def test_a_path_in_hyper_parameters_is_a_note_but_a_path_method_runs_code(tmp_path):
    hparams = tmp_path / "hparams.ckpt"
    torch.save({"state_dict": _state_dict()[1], "hyper_parameters": {"root": Path("/data")}}, hparams)
    assert [(f.rule, f.message.split("`")[1]) for f in _findings(hparams)] == [("TR621", "pathlib.PosixPath")]
    writes = tmp_path / "writes.pkl"  # protocol 4 looks up the qualified name Path.write_text
    writes.write_bytes(b"\x80\x04" + _short_unicode("pathlib") + _short_unicode("Path.write_text") + b"\x93"
                       + _short_unicode("/tmp/x") + b"\x85R.")
    assert _critical_callables(writes) == {"pathlib.Path.write_text"}


def test_a_partial_is_judged_by_what_it_wraps(tmp_path):
    import functools

    benign, evil = tmp_path / "benign.ckpt", tmp_path / "evil.ckpt"
    torch.save({"optimizer_factory": functools.partial(torch.optim.SGD, lr=0.1)}, benign)
    torch.save({"hook": functools.partial(os.system, "id")}, evil)
    assert {f.rule for f in _findings(benign)} == {"TR621"}
    assert _critical_callables(evil) == {f"{os.system.__module__}.system"}


def test_the_allowlist_covers_what_torch_weights_only_accepts():
    """The allowlist is written out (analyzers never import torch): it must keep up with the installed torch."""
    from torch._weights_only_unpickler import _get_allowed_globals

    from analyzers.pickles import ImportedGlobal

    refused = [key for key in _get_allowed_globals()
               if verdict(ImportedGlobal(*key.rsplit(".", 1), where="", offset=0)) != "allowed"]
    assert refused == []


def test_a_legacy_torch_file_is_known_by_its_magic_number_whatever_its_name(tmp_path):
    """torch.save in the legacy format writes 5 pickles and then raw storage bytes; saved as ``model.pkl`` those
    bytes were read as a sixth pickle and reported as a malformed file (TR622, high)."""
    target = tmp_path / "model.pkl"
    torch.save(torch.nn.Linear(64, 64), target, _use_new_zipfile_serialization=False)
    assert not target.read_bytes().startswith(b"PK")
    assert _rules(target) == {"TR621"}  # the module classes weights_only refuses, and nothing malformed
    # a plain pickle of the same name is not cut after five pickles: what follows them is still read
    shell = tmp_path / "shell.pkl"
    shell.write_bytes(b"".join(pickle.dumps(i, protocol=2) for i in range(5)) + pickle.dumps(RunsShell(), protocol=2))
    assert "posix.system" in _critical_callables(shell) or "os.system" in _critical_callables(shell)


def test_an_empty_checkpoint_is_nothing_to_report(tmp_path):
    empty = tmp_path / "model.ckpt"
    empty.write_bytes(b"")
    assert _findings(empty) == []
