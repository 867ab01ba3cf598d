"""Rules on checkpoint files themselves (not Python code): what loading a pickle-based file would run.

They report on files, not on code: :mod:`analyzers.pickles` reads the file and builds their findings,
so they declare no handlers, and their examples are files built by ``tests/test_pickle_scan.py``.
"""
from __future__ import annotations

from analyzers.model import Category, Severity
from analyzers.rules.base import Rule


class CheckpointFileRule(Rule):
    """Reports on a checkpoint file (see :data:`analyzers.pickles.CHECKPOINT_SUFFIXES`), never on code."""

    scans_files = True


class PickleRunsCode(CheckpointFileRule):
    id = "TR620"
    slug = "pickle-runs-code"
    category = Category.SECURITY
    severity = Severity.CRITICAL
    summary = "a checkpoint or pickle file imports a callable that runs code when it is loaded"
    what = """
        Reads the pickle opcodes of every pickle-based file (`.pt`, `.pth`, `.ckpt`, `.bin` torch
        checkpoints in zip or legacy format, `.pkl`/`.pickle`, joblib files, NumPy `.npy`/`.npz`
        object arrays) without unpickling it, and flags each global it imports that executes code,
        starts a process or reaches files or the network when called: `os.system`,
        `builtins.exec`/`eval`/`getattr`, `subprocess.Popen`, `runpy._run_code`, `socket`,
        `importlib`, `torch.hub`... A global whose name is assembled on the pickle stack in a way
        the scanner cannot follow is flagged too. The finding names the callable and where it is
        (the zip member, or the pickle in the stream).
    """
    why = """
        Unpickling imports each global the pickle names and calls it with arguments the file
        chooses (`__reduce__`). `torch.load(..., weights_only=False)`, torch before 2.6,
        `pickle.load`, `joblib.load` and `numpy.load(..., allow_pickle=True)` all run that call:
        a checkpoint committed in a pull request is code that runs on every machine that loads it.
    """
    example = """
        # model.pt, whose data.pkl holds:  GLOBAL 'posix system'  ...  REDUCE
        state = torch.load("model.pt", weights_only=False)  # runs os.system(...)
    """
    fix_example = """
        # Do not load the file. Ask for its state dict saved by a trusted run,
        # preferably as safetensors; load pickles only with weights_only=True.
        state = safetensors.torch.load_file("model.safetensors")
    """


class PickleImportsUnlistedGlobal(CheckpointFileRule):
    id = "TR621"
    slug = "pickle-unlisted-global"
    category = Category.SECURITY
    severity = Severity.LOW
    summary = "a checkpoint imports a global that weights_only=True loading refuses"
    what = """
        Flags globals a pickle-based file imports that are neither on the allowlist of torch's
        weights-only unpickler (tensor and storage rebuilds, dtypes, `collections.OrderedDict`,
        `torch.Size`, the few builtins it accepts) or NumPy's array reconstruction, nor known to
        run code: `argparse.Namespace`, a project's own config class, a tokenizer object.
    """
    why = """
        `torch.load(path, weights_only=True)`, the default since torch 2.6, refuses such a file,
        so users turn weights-only off, and then every global in the file is imported and called.
        The class itself may be harmless; its `__setstate__` or `__reduce__` is code of that
        module. Saving plain data (a state dict, a dict of numbers and strings) keeps the file
        loadable with weights-only.
    """
    example = """
        torch.save({"model": model.state_dict(), "args": args}, "model.pt")  # args: argparse.Namespace
    """
    fix_example = """
        torch.save({"model": model.state_dict(), "args": vars(args)}, "model.pt")
    """


class MalformedCheckpoint(CheckpointFileRule):
    id = "TR622"
    slug = "malformed-checkpoint"
    category = Category.SECURITY
    severity = Severity.HIGH
    summary = "a checkpoint file that cannot be read as its format: a broken pickle or safetensors header"
    what = """
        Flags a pickle-based file whose opcodes cannot be read to the end (an unknown opcode, a
        truncated argument, a zip checkpoint without `data.pkl`), and a `.safetensors` file whose
        header is invalid: the 8-byte little-endian length past the end of the file or above
        100 MB, a header that is not a JSON object, a tensor whose dtype is unknown, whose shape is
        not a list of non-negative integers, or whose `data_offsets` lie outside the data, disagree
        with its dtype and shape, or overlap another tensor.
    """
    why = """
        A pickle is executed opcode by opcode: whatever comes before the unreadable part still
        runs when it is loaded, and a scanner cannot vouch for what it could not read. A bad
        safetensors header is either a corrupt upload or an attempt to make a loader read out of
        bounds or allocate without limit.
    """
    example = """
        # model.safetensors: header says data_offsets [0, 4096] for a 16-byte tensor
    """
    fix_example = """
        # Regenerate the file with the library that writes it (safetensors.torch.save_file).
    """
