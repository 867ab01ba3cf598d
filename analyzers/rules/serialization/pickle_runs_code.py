"""TR620 pickle-runs-code: a checkpoint or pickle file imports a callable that runs code when it is loaded."""
from __future__ import annotations

from analyzers.model import Category, Severity
from analyzers.rules.serialization._checkpoint_files import CheckpointFileRule


class PickleRunsCode(CheckpointFileRule):
    id = "TR620"
    syntactic = True
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
