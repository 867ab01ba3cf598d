"""Where a value comes from when it comes from outside the program (analyzers/program/origins.py)."""
from __future__ import annotations

import libcst as cst
import pytest

from analyzers.program.flow import subtree
from analyzers.program.origins import Outside, outside_origin
from tests.test_program_meanings import context


def _origin_of_load(code: str):
    """Where the first argument of the file's ``load(...)`` call comes from."""
    ctx = context(code)
    call = next(n for n in subtree(ctx.module) if isinstance(n, cst.Call) and isinstance(n.func, cst.Attribute)
                and n.func.attr.value == "load" and isinstance(n.func.value, cst.Name) and n.func.value.value == "torch")
    return outside_origin(ctx, call.args[0].value)


@pytest.mark.parametrize("code,expected", [
    # parsed options, however they are named
    ("import argparse, torch\nparser = argparse.ArgumentParser()\nparser.add_argument('--weights')\n"
     "settings = parser.parse_args()\nstate = torch.load(settings.weights)\n", Outside.COMMAND_LINE),
    ("import sys, torch\nstate = torch.load(sys.argv[1])\n", Outside.COMMAND_LINE),
    # through a path built from them, and a function every call passes them to
    ("import argparse, os, torch\ndef restore(options):\n    return torch.load(os.path.join(options.out, 'last.pt'))\n"
     "if __name__ == '__main__':\n    opts = argparse.ArgumentParser().parse_args()\n    restore(opts)\n",
     Outside.COMMAND_LINE),
    # a constructor's parameter kept on self, the class called with a parsed configuration file
    ("import torch, yaml\nclass Runner:\n    def __init__(self, setup):\n        self.setup = setup\n"
     "    def resume(self):\n        return torch.load(self.setup['resume'])\n"
     "setup = yaml.safe_load(open('run.yaml'))\nRunner(setup).resume()\n", Outside.CONFIGURATION),
    ("import os, torch\nstate = torch.load(os.environ['WEIGHTS'])\n", Outside.ENVIRONMENT),
    ("import os, torch\nstate = torch.load(f\"{os.getenv('HOME')}/w.pt\")\n", Outside.ENVIRONMENT),
    ("import torch\nfrom huggingface_hub import hf_hub_download\npath = hf_hub_download('org/repo', 'w.bin')\n"
     "state = torch.load(path)\n", Outside.DOWNLOAD),
    ("import torch\nstate = torch.load(fetch('https://example.com/w.pt'))\n", Outside.DOWNLOAD),
    ("import torch\nname = input('weights? ')\nstate = torch.load(name)\n", Outside.USER_INPUT),
    # a function of the file that returns the parsed options, as a parameter's default
    ("import argparse, torch\ndef options():\n    parser = argparse.ArgumentParser()\n"
     "    return parser.parse_known_args()[0]\ndef run(opts=options()):\n    return torch.load(opts.resume)\nrun()\n",
     Outside.COMMAND_LINE),
    ("import torch, hydra\n@hydra.main(config_path='conf')\ndef main(cfg):\n    return torch.load(cfg.model.weights)\n",
     Outside.CONFIGURATION),
])
def test_values_from_outside_the_program_are_followed_to_where_they_come_from(code, expected):
    assert _origin_of_load(code) is expected


def test_a_parameter_no_call_in_view_passes_is_whatever_its_callers_pass():
    assert _origin_of_load("import torch\ndef restore(cfg):\n    return torch.load(cfg.resume)\n") is Outside.CALLER
    assert _origin_of_load("import torch\nclass Runner:\n    def __init__(self, opts):\n        self.opts = opts\n"
                           "    def resume(self):\n        return torch.load(self.opts.ckpt)\n") is Outside.CALLER


@pytest.mark.parametrize("code", [
    # a name alone proves nothing: options nobody is seen to parse
    "import torch\nstate = torch.load(args.weights)\n",
    # a path the program spells, and a parameter every call gives such a path
    "import torch\nstate = torch.load('runs/best.pt')\n",
    "import torch\ndef restore(p):\n    return torch.load(p)\nrestore('runs/best.pt')\n",
])
def test_values_the_program_chooses_are_not_from_outside(code):
    assert _origin_of_load(code) is None


def test_a_constructor_is_passed_what_the_class_is_called_with_not_what_a_subclass_is():
    # the subclass is built with the command line, but hands its parent a fixed file
    assert _origin_of_load("import argparse, torch\nclass Base:\n    def __init__(self, where):\n"
                           "        self.where = where\n    def restore(self):\n        return torch.load(self.where)\n"
                           "class Child(Base):\n    def __init__(self, opts):\n        super().__init__('fixed.pt')\n"
                           "Child(argparse.ArgumentParser().parse_args())\n") is not Outside.COMMAND_LINE
