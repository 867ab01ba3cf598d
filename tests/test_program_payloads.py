"""What a checkpoint load reads, as the program model tells it: the payload its uses show (a state dict, a whole
module, an array, an object with fields), the torch a conda environment pins, and how TR601 speaks of each."""
from __future__ import annotations

import textwrap
from pathlib import Path

import libcst as cst
import pytest

from analyzers.config import Config
from analyzers.context import FileContext
from analyzers.engine import analyze_file
from analyzers.program import Payload
from analyzers.program.flow import subtree
from analyzers.program.payloads import LoadedPayloads
from analyzers.program.versions import checkout_root, conda_requirements, pinned_cap, pinned_floor
from tests.test_program_model import context as _context


def _loads(ctx: FileContext) -> list[cst.Call]:
    return [node for node in subtree(ctx.module) if isinstance(node, cst.Call)
            and ctx.module.code_for_node(node.func) == "torch.load"]


def _restore(code: str) -> tuple[FileContext, cst.Call]:
    """``code`` as the body of a loading function; the context and its first ``torch.load``."""
    body = "\n".join("    " + line for line in code.splitlines())
    ctx = _context(f"import torch\ndef restore(weights_file, device):\n{body}\n")
    return ctx, _loads(ctx)[0]


@pytest.mark.parametrize("code,kinds,use", [
    # straight into a module's (or an optimizer's) state
    ("encoder.load_state_dict(torch.load(weights_file))", {Payload.TENSORS}, "encoder.load_state_dict("),
    # through a name and a key
    ("blob = torch.load(weights_file)\nopt.load_state_dict(blob['optim'])", {Payload.TENSORS}, "opt.load_state_dict("),
    # an item taken with get() (or the first of two that exists), moved and cast, then switched to eval: a module
    ("blob = torch.load(weights_file)\nnet = (blob.get('averaged') or blob['net']).to(device).float()\nnet.eval()",
     {Payload.MODULE}, "net.eval()"),
    ("blob = torch.load(weights_file)\nblob.get('net').cuda().eval()", {Payload.MODULE}, "blob.get('net').cuda().eval()"),
    # the loaded object is run, or asked for its parameters: a pickled module
    ("scorer = torch.load(weights_file)\nout = scorer(batch)", {Payload.MODULE}, "scorer(batch)"),
    ("scorer = torch.load(weights_file)\nn = sum(p.numel() for p in scorer.parameters())", {Payload.MODULE},
     "scorer.parameters()"),
    # an array method a tensor lacks
    ("table = torch.load(weights_file)\nsmall = table.astype('float16')", {Payload.NUMPY}, "table.astype"),
    # a field of an object kept beside the weights
    ("blob = torch.load(weights_file)\nwidth = blob['hparams'].hidden", {Payload.NAMESPACE}, "blob['hparams'].hidden"),
    ("blob = torch.load(weights_file)\nprint(blob.run_config)", {Payload.NAMESPACE}, "blob.run_config"),
    # a dict or tensor used as one: nothing said either way
    ("blob = torch.load(weights_file)\nfor k, v in blob.items():\n    print(k, v.shape)", set(), None),
    ("emb = torch.load(weights_file)\nrows = emb.size(0)\nemb = emb.to(device)", set(), None),
    ("return torch.load(weights_file)", set(), None),
    # the per-module step of load_state_dict, called by hand in a loading loop
    ("sd = torch.load(weights_file)\nfor m in net.modules():\n    m._load_from_state_dict(sd, '', {}, True, [], [], [])",
     {Payload.TENSORS}, "m._load_from_state_dict("),
    # a keyword that takes a state dict by its name (transformers' from_pretrained, load_state_dict)
    ("net = Encoder.from_pretrained(name, state_dict=torch.load(weights_file))", {Payload.TENSORS}, "Encoder."),
    # getattr is a builtin: it decides nothing about the payload
    ("sd = torch.load(weights_file)\nmeta = getattr(sd, '_metadata', None)", set(), None),
])
def test_what_the_use_of_a_load_shows(code, kinds, use):
    ctx, load = _restore(code)
    facts = ctx.facts(LoadedPayloads)
    assert facts.of(load) == kinds
    for kind in kinds:
        assert facts.use(load, kind).startswith(use)


@pytest.mark.parametrize("code,escape", [
    ("return torch.load(weights_file)", "return torch.load(weights_file)"),
    ("blob = torch.load(weights_file)\nnet = assemble(blob['cfg'], blob['weights'])", "assemble(blob['cfg'], blob['weights'])"),
    ("blob = torch.load(weights_file)\nprint(len(blob))\nx = torch.stack(blob['rows'])\nblob['t'].copy_(x)", ""),
    ("enc.load_state_dict(state_dict=torch.load(weights_file), strict=False)", ""),
])
def test_where_a_loaded_value_leaves_the_file_s_view(code, escape):
    ctx, load = _restore(code)
    assert ctx.facts(LoadedPayloads).escapes(load) == escape


def test_a_helper_that_returns_the_load_is_judged_by_its_callers():
    ctx = _context("""
        import torch
        def read_checkpoint(path, device):
            blob = torch.load(path, map_location=device)
            return blob
        def main(a):
            saved = read_checkpoint(a.ckpt, "cpu")
            vocoder.load_state_dict(saved["vocoder"])
    """)
    facts = ctx.facts(LoadedPayloads)
    assert facts.of(_loads(ctx)[0]) == {Payload.TENSORS} and facts.escapes(_loads(ctx)[0]) == ""
    lonely = _context("import torch\ndef read_checkpoint(path):\n    return torch.load(path)\n")
    assert lonely.facts(LoadedPayloads).escapes(_loads(lonely)[0]) == "return torch.load(path)"


def test_an_attribute_of_self_is_followed_across_methods():
    ctx = _context("""
        import torch
        class Runner:
            def setup(self, path):
                self.net = torch.load(path)
            def step(self, x):
                self.net.train()
                return self.net(x)
    """)
    assert ctx.facts(LoadedPayloads).of(_loads(ctx)[0]) == {Payload.MODULE}


ENVIRONMENT = """\
name: lab
channels:
  - pytorch   # a channel, not a package
  - conda-forge
dependencies:
  - python=3.9
  - pytorch::pytorch=1.13.1=py3.9_cuda11.7_cudnn8.5.0_0
  - pytorch-cuda=11.7
  - pip
  - pip:
      - torchvision==0.14.1
      - numpy>=1.21  # floor only
variables:
  TORCH_HOME: /data/torch
"""


def test_conda_environment_lists_only_its_dependencies():
    assert conda_requirements(ENVIRONMENT).splitlines() == [
        "python=3.9", "pytorch=1.13.1=py3.9_cuda11.7_cudnn8.5.0_0", "pytorch-cuda=11.7", "pip",
        "torchvision==0.14.1", "numpy>=1.21"]
    assert conda_requirements("dependencies: [python=3.8, 'pytorch>=2.1']\n").splitlines() == \
        ["python=3.8", "pytorch>=2.1"]


def test_conda_environment_pins_torch_and_a_channel_named_pytorch_does_not_open_it(tmp_path: Path):
    (tmp_path / "environment.yaml").write_text(ENVIRONMENT)
    cap, floor = pinned_cap(tmp_path / "a.py", tmp_path, "torch"), pinned_floor(tmp_path / "a.py", tmp_path, "torch")
    assert cap is not None and cap.version == (1, 13, 1) and cap.source == "environment.yaml"
    assert floor is not None and floor.version == (1, 13, 1)
    assert pinned_floor(tmp_path / "a.py", tmp_path, "numpy").version == (1, 21)


def test_a_vendored_package_is_pinned_by_the_repository_around_it(tmp_path: Path, monkeypatch):
    """A copied third-party package has its own README (the index's root for its files); the environment file at
    the checkout's top still decides which torch runs it."""
    vendored = tmp_path / "third_party" / "seglib"
    vendored.mkdir(parents=True)
    (vendored / "README.md").write_text("vendored\n")
    (tmp_path / "environment.yml").write_text(ENVIRONMENT)
    monkeypatch.chdir(tmp_path)  # a checkout without .git: the working folder holds it
    assert checkout_root(vendored) == tmp_path.resolve()
    (tmp_path / ".git").mkdir()
    monkeypatch.chdir(vendored)
    assert checkout_root(vendored) == tmp_path.resolve()
    script = vendored / "amp_step.py"
    script.write_text("import torch\nscaler = torch.cuda.amp.GradScaler()\n")
    result = analyze_file(script, str(script), Config(select=("TR801",)))
    assert not result.errors
    assert result.findings == []  # torch 1.13 predates the deprecation the rule is about


def _tr601(tmp_path: Path, code: str, env: str = ""):
    (tmp_path / ".git").mkdir(exist_ok=True)
    if env:
        (tmp_path / "environment.yml").write_text(env)
    script = tmp_path / "restore.py"
    script.write_text(textwrap.dedent(code))
    result = analyze_file(script, "restore.py", Config(select=("TR601",), measured_severities=False))
    assert not result.errors, result.errors
    return result.findings


def test_tr601_offers_the_fix_only_where_the_payload_is_known_to_load(tmp_path: Path):
    # feeds load_state_dict: the fix at the full severity
    [known] = _tr601(tmp_path, "import torch\nhead.load_state_dict(torch.load(weights_file))\n")
    assert known.fix is not None and known.severity.name == "HIGH"
    # used as a module: no fix, lower, and the message says what to do instead
    [module] = _tr601(tmp_path, "import torch\nscorer = torch.load(weights_file)\nscorer.eval()\n")
    assert module.fix is None and module.severity.name == "MEDIUM"
    assert "whole nn.Module" in module.message and "state_dict()" in module.message
    # handed to a function this file does not show, which decides what it must hold: no fix, lower
    [unknown] = _tr601(tmp_path, "import torch\nblob = torch.load(weights_file)\nhead = make_head(blob)\n")
    assert unknown.fix is None and unknown.severity.name == "MEDIUM" and "`make_head(blob)`" in unknown.message
    # used only as a dict, in view: the fix stays
    [plain] = _tr601(tmp_path, "import torch\nblob = torch.load(weights_file)\nprint(len(blob), blob['step'])\n")
    assert plain.fix is not None


def test_tr601_names_the_old_torch_a_conda_environment_pins(tmp_path: Path):
    [finding] = _tr601(tmp_path, "import torch\nhead.load_state_dict(torch.load(weights_file))\n", env=ENVIRONMENT)
    assert "torch < 2.6 the repository pins" in finding.message and "environment.yml" in finding.message
