"""Where a bug does little harm: test code, a benchmark, a program whose only data is a tiny synthetic tensor.

The engine's severity step (``analyzers.engine.context_severity``) lowers a finding in such a file by one level
and says why. Each role is read from what the code does, not from its file name alone:

- **test code**: tests pytest or unittest would collect: ``test_*`` functions or ``Test*`` classes in a file that
  imports pytest/unittest (or that pytest collects by its name, ``test_*.py`` / ``*_test.py``), a
  ``unittest.TestCase`` subclass, or pytest fixtures (a ``conftest.py``'s);
- **benchmark**: code that times code and trains nothing: a benchmarking library (``timeit``,
  ``torch.utils.benchmark``, ``triton.testing``), or clock reads (``time.perf_counter``, CUDA events with
  ``enable_timing``) around repetitions (``for _ in range(n)``, ``torch.cuda.synchronize()``) in a file with no
  ``backward()`` and no data read from outside (a clock alone is a progress bar's);
- **tiny synthetic data**: every tensor the program makes up is small (at most ``TINY_ELEMENTS`` elements, its
  sizes literal), and it reads no data: no file, dataset, download or pretrained weights, and a ``DataLoader``
  only over a ``TensorDataset``.

A file with none of these keeps its findings' severities: a training script, an evaluation script, a library.
"""
from __future__ import annotations

import math
from functools import cached_property
from typing import TYPE_CHECKING, Optional

import libcst as cst

from analyzers.context import argument, dotted_name
from analyzers.program.flow import ModuleNodes
from analyzers.program.roles import collects_tests
from analyzers.program.library import LIBRARY_ROOTS, is_data_loader

if TYPE_CHECKING:
    from analyzers.context import FileContext

TEST_CODE, BENCHMARK, TINY_DATA = "test code", "benchmark", "tiny synthetic data"
TINY_ELEMENTS = 1 << 16  # a 64 x 1024 batch: any real image or text batch is larger

_BENCHMARK_LIBRARIES = ("timeit", "torch.utils.benchmark", "triton.testing", "pytest_benchmark")
_CLOCKS = {"time.time", "time.perf_counter", "time.monotonic", "time.process_time", "time.perf_counter_ns",
           "time.time_ns"}
_CUDA_EVENT = "torch.cuda.Event"
_SYNCHRONIZE = "torch.cuda.synchronize"
# calls that make up a tensor from its sizes
_SYNTHETIC = {"torch.randn", "torch.rand", "torch.randint", "torch.zeros", "torch.ones", "torch.empty", "torch.full",
              "torch.normal", "numpy.random.randn", "numpy.random.rand", "numpy.random.randint",
              "numpy.random.normal", "numpy.random.uniform", "numpy.zeros", "numpy.ones", "numpy.random.random"}
_SIZE_KEYWORDS = ("size", "shape")
# calls that read data from outside the program
_DATA_SOURCES = {"torch.load", "torch.hub.load", "torch.hub.load_state_dict_from_url", "numpy.load",
                 "numpy.loadtxt", "numpy.genfromtxt", "numpy.fromfile", "numpy.memmap", "PIL.Image.open",
                 "cv2.imread", "h5py.File", "datasets.load_dataset", "urllib.request.urlopen", "requests.get",
                 "torchvision.io.read_image", "torchaudio.load", "safetensors.torch.load_file"}
_DATA_SOURCE_PREFIXES = ("torchvision.datasets.", "torchaudio.datasets.", "torchtext.datasets.", "sklearn.datasets.",
                         "pandas.read_", "imageio.", "tensorflow_datasets.")
_DATA_SOURCE_METHODS = {"from_pretrained", "load_state_dict_from_url"}
# the standard library and known libraries: a module of neither may be the repository's own, with its data
_KNOWN_ROOTS = LIBRARY_ROOTS | {"matplotlib", "tqdm", "seaborn", "IPython", "scipy", "pytest"}
_TENSOR_DATASET = "torch.utils.data.TensorDataset"


class HarmContext:
    """The low-harm role of one file (``role``: one of the names above, or None), a fact of the program model."""

    def __init__(self, ctx: "FileContext") -> None:
        self.ctx = ctx

    @cached_property
    def role(self) -> Optional[str]:
        if collects_tests(self.ctx):
            return TEST_CODE
        if self._is_benchmark():
            return BENCHMARK
        if self._has_only_tiny_synthetic_data():
            return TINY_DATA
        return None

    # ---- what the file holds -------------------------------------------------------------
    @property
    def _nodes(self) -> list[cst.CSTNode]:
        """Every code node of the file: the program model's list, which other facts walk too (not a walk of its own)."""
        return self.ctx.facts(ModuleNodes).nodes

    @cached_property
    def _calls(self) -> list[tuple[cst.Call, Optional[str]]]:
        return [(node, self.ctx.qualified_name(node.func)) for node in self.ctx.facts(ModuleNodes).of_type(cst.Call)]

    @cached_property
    def _single_assignments(self) -> dict[str, cst.BaseExpression]:
        """Names assigned exactly once in the file (``N = 64``), so a size written as a name can be read."""
        values: dict[str, list[cst.BaseExpression]] = {}
        for node in self._nodes:
            if isinstance(node, cst.Assign):
                for target in node.targets:
                    if isinstance(target.target, cst.Name):
                        values.setdefault(target.target.value, []).append(node.value)
            elif isinstance(node, cst.AugAssign) and isinstance(node.target, cst.Name):
                values.setdefault(node.target.value, []).extend([node.value, node.value])  # never single
        return {name: found[0] for name, found in values.items() if len(found) == 1}

    def _imports(self, roots: tuple[str, ...]) -> bool:
        return any(self.ctx.imports.imports_root(root) for root in roots)

    # ---- benchmark ------------------------------------------------------------------------
    def _is_benchmark(self) -> bool:
        if self._imports(_BENCHMARK_LIBRARIES):
            return True
        times = any(name in _CLOCKS or (name == _CUDA_EVENT and argument(call, None, "enable_timing") is not None)
                    for call, name in self._calls)
        # a clock alone is a progress bar or an epoch log; a benchmark repeats what it times
        return times and self._repeats() and not self._trains() and not self._reads_data()

    def _repeats(self) -> bool:
        """``for _ in range(n)`` (the loop variable unused: the body is run n times over), or CUDA synchronized
        before a clock is read."""
        return any(name == _SYNCHRONIZE for _, name in self._calls) or any(
            isinstance(node, cst.For) and isinstance(node.target, cst.Name) and node.target.value.strip("_") == ""
            and isinstance(node.iter, cst.Call) and dotted_name(node.iter.func) == "range" for node in self._nodes)

    def _trains(self) -> bool:
        return any(isinstance(call.func, cst.Attribute) and call.func.attr.value == "backward"
                   for call, _ in self._calls)

    # ---- tiny synthetic data -------------------------------------------------------------
    def _reads_data(self) -> bool:
        for call, name in self._calls:
            if name is None:
                if dotted_name(call.func) == "open":
                    return True
                if isinstance(call.func, cst.Attribute) and call.func.attr.value in _DATA_SOURCE_METHODS:
                    return True
                continue
            if name in _DATA_SOURCES or name.startswith(_DATA_SOURCE_PREFIXES):
                return True
            if is_data_loader(name) and not self._over_tensor_dataset(call):
                return True
        return False

    def _imports_only_known_libraries(self) -> bool:
        """Data can come from a module of the repository (``from data import loader``), which this file does not
        show: only a file that imports nothing but the standard library and known libraries can be judged."""
        roots = {module.split(".", 1)[0] for module in self.ctx.imports.modules}
        return not self._relative_imports and roots <= _KNOWN_ROOTS

    @cached_property
    def _relative_imports(self) -> bool:
        return any(isinstance(node, cst.ImportFrom) and node.relative for node in self._nodes)

    def _over_tensor_dataset(self, loader: cst.Call) -> bool:
        dataset = argument(loader, 0, "dataset")
        if isinstance(dataset, cst.Name):
            dataset = self._single_assignments.get(dataset.value, dataset)
        return isinstance(dataset, cst.Call) and self.ctx.qualified_name(dataset.func) == _TENSOR_DATASET

    def _has_only_tiny_synthetic_data(self) -> bool:
        made = [call for call, name in self._calls if name in _SYNTHETIC]
        if not made or self._reads_data() or not self._imports_only_known_libraries():
            return False
        return all((self._elements(call) or TINY_ELEMENTS + 1) <= TINY_ELEMENTS for call in made)

    def _elements(self, call: cst.Call) -> Optional[int]:
        """How many elements the call makes, when its sizes are literal (or names assigned a literal once)."""
        name = self.ctx.qualified_name(call.func) or ""
        positional = [a.value for a in call.args if a.keyword is None]
        keyword = next((a.value for a in call.args if a.keyword and a.keyword.value in _SIZE_KEYWORDS), None)
        if keyword is not None:
            sizes = [keyword]
        elif name == "torch.randint":  # randint(high, size) or randint(low, high, size)
            sizes = positional[-1:] if len(positional) >= 2 else []
        elif name in ("torch.full",):
            sizes = positional[:1]
        elif name.startswith("numpy.random.") and name.rsplit(".", 1)[-1] in ("randint", "normal", "uniform"):
            sizes = positional[2:3] or [cst.Integer("1")]  # no size: one number
        elif name == "torch.normal":
            sizes = positional[2:3]  # normal(mean, std) of tensors: as large as they are, unknown here
        else:
            sizes = positional  # randn(2, 3) or randn((2, 3))
        if not sizes:
            return None
        counts = [self._count(size) for size in sizes]
        return None if any(c is None for c in counts) else math.prod(counts)

    def _count(self, size: cst.BaseExpression, depth: int = 0) -> Optional[int]:
        if depth > 3:
            return None
        if isinstance(size, cst.Integer):
            return int(size.evaluated_value)
        if isinstance(size, (cst.Tuple, cst.List)):
            counts = [self._count(e.value, depth + 1) for e in size.elements]
            return None if any(c is None for c in counts) else math.prod(counts)
        if isinstance(size, cst.Name) and size.value in self._single_assignments:
            return self._count(self._single_assignments[size.value], depth + 1)
        return None
