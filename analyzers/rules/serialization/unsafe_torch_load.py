"""TR601 unsafe-torch-load: torch.load without weights_only=True can execute arbitrary code."""
from __future__ import annotations

import re
from typing import Optional, Sequence

import libcst as cst

from analyzers.context import FileContext, argument, is_false, is_true, keyword_arg
from analyzers.model import Category, Severity
from analyzers.program import CheckpointWrites, Payload, call_site_values, in_compat_fallback
from analyzers.program.library import Does, does
from analyzers.program.origins import Outside, path_outside_origin
from analyzers.program.payloads import LoadedPayloads
from analyzers.program.roles import collects_tests, describe, unrestricted_load_beside
from analyzers.program.values import called_functions, forwards_callers_keywords, unpacked_keyword
from analyzers.program.versions import VersionFacts
from analyzers.rules.base import Invalid, Rule, Valid


# torch.load defaults to weights_only=True from this release on (unless a pickle_module is passed)
WEIGHTS_ONLY_DEFAULT = (2, 6)
SAFE_GLOBALS = ("torch.serialization.safe_globals",)


class UnsafeTorchLoad(Rule):
    id = "TR601"
    security = True
    source_hint = re.compile(r"load")  # a torch.load call
    fix_safety = "unsafe"  # weights_only=True refuses checkpoints holding arbitrary objects
    slug = "unsafe-torch-load"
    category = Category.SECURITY
    severity = Severity.HIGH
    summary = "torch.load without weights_only=True can execute arbitrary code"
    what = """
        Flags `torch.load(...)` calls that pass `weights_only=False`, or that do not pass
        `weights_only=True`, on a file the program did not write itself. The finding is critical
        when the path comes from outside the program (command-line arguments, environment,
        configuration, a download). Not flagged: a checkpoint the same file saved before loading it
        (the best-model reload of a training script or notebook, a cache; not a `load(path)` helper
        beside a `save(path)` one, whose parameters only share a name), a fixed file spelled
        whole in the code that the program itself saves to as it runs (a notebook that restores
        `'./model/net.pkl'` from its earlier run, then trains and saves there again), a file the
        program hands to a function's saving parameter (`fit(..., best_model_save_path='top.pt')`,
        whether the function is defined in the file or imported), loads inside
        `with torch.serialization.safe_globals([...])` (weights-only with an allowlist), and the
        `except TypeError:` fallback for torch builds that lack the `weights_only` keyword, and a wrapper
        of `torch.load` that hands on the keywords its own callers give (`**kwargs`): whether they pass
        `weights_only` is theirs to say. Also the program's own: a file that a function or class of the
        repository saves into a folder it is handed, when this function handed it that folder before the
        load (an early-stopping helper's best weights, reloaded once training ends), and a file that another
        method of the same class saves, built from the same parts (a file name spelled in the code, a folder
        from the instance's own settings or spelled in the code, and the parameters both methods take: an
        experiment's `test(setting)` rereading what its `train(setting)` wrote).
        A file that another script or module of the repository saves, its path built from the same parts (the
        file name spelled in the code, the same option or configuration keys: `eval.py` reading
        `os.path.join(args.save_dir, 'best.pth')`, which `train.py` writes), is the repository's own checkpoint:
        when every such save holds tensors and plain values, the finding is low (medium when the command line or
        a configuration names the path) and keeps the fix; when one saves a pickled object, the message names it.
        A script that writes that file itself (a resume of its own checkpoint) is judged so only when its own saves
        there hold tensors and plain values too; otherwise by its own saves, as above. A resume of a checkpoint
        the script itself saves with tensors and plain values only is the program's own file too: low (medium
        when the command line or a configuration names the path), with the fix.
        What the file holds decides the fix. Known to load weights-only (the result feeds
        `load_state_dict`, or every checkpoint the program saves there holds tensors and plain
        values): the `weights_only=True` fix, at full severity. Known not to (the file, the scripts
        beside it or the modules it imports save a whole module, an `argparse.Namespace` or NumPy
        arrays; or the result is used as one: `net.eval()`, `net(x)`, `arr.astype(...)`,
        `ckpt["args"].lr`): no fix, one step lower, and the message names who saves or uses what and
        the real ways out (a `state_dict()` checkpoint, `add_safe_globals` / `safe_globals`, loading
        only trusted files). Not known, and the result goes to code this file does not show
        (passed to a function that builds from it, or returned by a helper the file never calls; a
        helper it calls is judged by what its callers do): no fix, one step lower. A result used
        only as a dict or a tensor, or not at all, keeps the fix. The message names the torch
        the pins allow (requirements, `pyproject.toml`, `setup.py`, conda `environment.yml`).
    """
    why = """
        `torch.load` unpickles its input. A pickle can run any code while it loads, so a
        checkpoint from an untrusted place is a remote-code-execution vector. torch >= 2.6
        defaults to `weights_only=True`, but an explicit `weights_only=False` (often added to
        silence an error) turns the protection off, and code that runs on older torch or that
        copies the call elsewhere has no protection at all.
    """
    example = """
        state = torch.load(args.checkpoint)
    """
    fix_example = """
        state = torch.load(args.checkpoint, weights_only=True)
        # for custom classes: torch.serialization.add_safe_globals([MyConfig])
    """
    VALID = [
        # a cache at a path from the command line, written by this program when missing
        "import torch, os\nif os.path.isfile(args.vector_cache):\n    vectors = torch.load(args.vector_cache)\n"
        "else:\n    torch.save(vectors, args.vector_cache)\n",
        # saved by train(), which the notebook calls with the same file name
        "import torch\ndef train(model, save_path):\n    torch.save(model.state_dict(), save_path)\n"
        "train(model, 'model_scratch.pt')\nmodel.load_state_dict(torch.load('model_scratch.pt'))\n",
        "import torch\nstate = torch.load('model.pt', weights_only=True)\n",
        "import torch\nstate = torch.load(path, map_location='cpu', weights_only=True)\n",
        "import torch as th\nstate = th.load(f, weights_only=True)\n",
        # not torch.load
        "import torch\nimport pickle\nobj = json.load(f)\n",
        "import torch\nclass Loader:\n    def load(self, p):\n        return p\nLoader().load('x')\n",
        # the best checkpoint this script wrote a few lines earlier
        "import torch\nfor epoch in range(3):\n    torch.save(model.state_dict(), 'best-model.pt')\n"
        "model.load_state_dict(torch.load('best-model.pt'))\n",
        # passed to where train() saves: an exercise whose train() says "## TODO: save the model"
        "import torch\ndef train(n_epochs, model, save_path):\n    for epoch in range(n_epochs):\n        pass\n"
        "    return model\nmodel = train(10, model, 'model_scratch.pt')\n"
        "model.load_state_dict(torch.load('model_scratch.pt'))\n",
        # an imported training helper is told to save its best model to this file, which is then read back
        "import torch\nfrom helpers import fit\nfit(model, loaders, best_model_save_path='top.pt')\n"
        "model.load_state_dict(torch.load('top.pt'))\n",
        # written through a helper whose argument is the same file
        "import torch\ntorch.save(ckpt, 'checkpoint.pth')\ndef load_checkpoint(filepath):\n"
        "    return torch.load(filepath)\nmodel = load_checkpoint('checkpoint.pth')\n",
        # a cache the program writes and reads back
        "import torch, os\nif os.path.isfile(cache_file):\n    vectors = torch.load(cache_file)\n"
        "else:\n    torch.save(vectors, cache_file)\n",
        # a data set that caches its processed tensors through a file handle and reads them back
        "import os, torch\nclass Digits(Dataset):\n    def __init__(self, root, build=False):\n"
        "        self.root = root\n        if build:\n            self.build()\n"
        "        self.images, self.labels = torch.load(os.path.join(self.root, 'cache', 'digits.pt'))\n"
        "    def build(self):\n        images, labels = read_raw(self.root)\n"
        "        with open(os.path.join(self.root, 'cache', 'digits.pt'), 'wb') as handle:\n"
        "            torch.save((images, labels), handle)\n",
        # one of the files the training loop wrote, named by the same template: the best epoch's
        "import torch\nfor epoch in range(n_epochs):\n    score = run_epoch(net)\n"
        "    torch.save(net.state_dict(), 'snapshots/{}.weights'.format(epoch))\n    if score > top:\n"
        "        top, chosen = score, epoch\nnet.load_state_dict(torch.load('snapshots/{}.weights'.format(chosen)))\n",
        "import torch, os\nfor k in range(5):\n    torch.save(state, os.path.join(root, f'round{k}.bin'))\n"
        "state = torch.load(os.path.join(root, f'round{last}.bin'))\n",
        # the best checkpoint Lightning's callback wrote during this program's own fit
        "import torch\nimport pytorch_lightning as pl\nfrom pytorch_lightning.callbacks import ModelCheckpoint\n"
        "saver = ModelCheckpoint(dirpath='runs', monitor='val_loss')\ntrainer = pl.Trainer(callbacks=[saver])\n"
        "trainer.fit(system)\nweights = torch.load(saver.best_model_path)['state_dict']\n",
        "import torch\nfrom lightning.pytorch import Trainer\ntrainer = Trainer(max_epochs=3)\ntrainer.fit(system)\n"
        "final = torch.load(trainer.checkpoint_callback.last_model_path)\n",
        # restored from the fixed file its own training loop saves to: what an earlier run of it left there
        "import torch\ntry:\n    net = torch.load('saved/net.pkl')\nexcept OSError:\n    net = Net()\n"
        "for epoch in range(5):\n    fit(net)\n    torch.save(net, 'saved/net.pkl')\n",
        # the same fixed file, saved through an f-string with nothing to fill in and read back without the ./
        "import torch\nif resume:\n    net.load_state_dict(torch.load('weights_final.pt'))\n"
        "for epoch in range(9):\n    step(net)\n    torch.save(net.state_dict(), f'./weights_final.pt')\n",
        # the best weights an early-stopping helper saved into the folder this function handed it, reloaded after
        # training (the helper may live in another module of the repository)
        Valid("import torch\nclass KeepBest:\n    def __call__(self, score, net, where):\n"
              "        torch.save(net.state_dict(), where + '/top.pth')\n"
              "def train(net, folder):\n    keeper = KeepBest()\n    for epoch in range(9):\n"
              "        keeper(step(net), net, folder)\n    net.load_state_dict(torch.load(folder + '/top.pth'))\n",
              requirements="numpy\n"),
        # a runner that keeps its snapshot file in an attribute, saves there, and restores through a method every
        # call of which it hands that same file: one value, the program's own snapshot
        "import os\nimport torch\nclass Runner:\n    def __init__(self, net, snapshot_path):\n"
        "        self.net = net\n        self.snapshot_path = snapshot_path\n"
        "        if os.path.exists(snapshot_path):\n            self._restore(snapshot_path)\n"
        "    def _restore(self, snapshot_path):\n        self.net.load_state_dict(torch.load(snapshot_path))\n"
        "    def _keep(self):\n        torch.save(self.net.state_dict(), self.snapshot_path)\n"
        "    def fit(self, epochs):\n        for epoch in range(epochs):\n            step(self.net)\n"
        "            self._keep()\n"
        "def main(epochs, snapshot_path='snapshot.pt'):\n    Runner(Net(), snapshot_path).fit(epochs)\n",
        # an experiment object whose scoring step rereads what its fitting step saved for the same run name: the
        # folder from the object's own options, the file name spelled in the code
        "import os\nimport torch\nclass Study:\n    def __init__(self, opts):\n        self.opts = opts\n"
        "    def fit(self, run):\n        where = os.path.join(self.opts.out_dir, run)\n"
        "        torch.save(self.net.state_dict(), os.path.join(where, 'top.ckpt'))\n"
        "    def score(self, run):\n        target = os.path.join(self.opts.out_dir, run) + '/top.ckpt'\n"
        "        self.net.load_state_dict(torch.load(target))\n",
        # the same, the scoring step naming the folder spelled in the code, the fitting step handing its folder to a
        # keeper object that saves the file there
        Valid("import torch\nclass Keeper:\n    def __call__(self, net, folder):\n"
              "        torch.save(net.state_dict(), folder + '/top.ckpt')\nclass Study:\n"
              "    def fit(self, run):\n        folder = self.opts.out_dir + run\n        keep = Keeper()\n"
              "        for epoch in range(3):\n            keep(self.net, folder)\n"
              "    def score(self, run):\n        self.net.load_state_dict(torch.load('./runs/' + run + '/top.ckpt'))\n",
              requirements="numpy\n"),
        # a saving helper and a scoring helper, both handed the one file this program picks
        "import torch\ndef fit(net, out):\n    for epoch in range(3):\n        torch.save(net.state_dict(), out)\n"
        "def score(net, where):\n    net.load_state_dict(torch.load(where))\ntarget = 'runs/best.pt'\n"
        "fit(net, target)\nscore(net, target)\n",
        # weights-only with an allowlist
        "import torch\nwith torch.serialization.safe_globals([Net]):\n    model = torch.load(args.model)\n",
        # a wrapper of torch.load that hands on whatever keywords its callers give (weights_only among them)
        "import torch\ndef load_on_cpu(f, **options):\n    return torch.load(f, map_location='cpu', **options)\n",
        # the fallback for torch builds without the keyword
        "import torch\ntry:\n    sd = torch.load(p, map_location='cpu', weights_only=True)\nexcept TypeError:\n"
        "    sd = torch.load(p, map_location='cpu')\n",
    ]
    INVALID = [
        # per torch version, the same file loaded with an explicit weights_only=False: reported there, once
        Invalid("import torch\ndef load(f):\n    if torch.__version__ < '2.6':\n        return torch.load(f)\n"
                "    return torch.load(f, weights_only=False)\n", line=5, message="weights_only=False"),
        Invalid(
            "import torch\nstate = torch.load('model.pt')\n",
            line=2,
            message="torch.load('model.pt')",
            fixed="import torch\nstate = torch.load('model.pt', weights_only=True)\n",
        ),
        Invalid(
            "import torch\nstate = torch.load(args.ckpt, weights_only=False)\n",
            line=2,
            message="weights_only=False",
            fixed="import torch\nstate = torch.load(args.ckpt, weights_only=True)\n",
        ),
        Invalid("import torch as th\nsd = th.load(\n    path,\n    map_location='cpu',\n)\n", line=2),
        Invalid("from torch import load\nsd = load(p)\n", line=2, fixed="from torch import load\nsd = load(p, weights_only=True)\n"),
        # the result feeds load_state_dict: a dict of tensors, which weights_only=True loads
        Invalid("import torch\nfrom torch import load\nnet.load_state_dict(load(p))\n", line=3,
                fixed="import torch\nfrom torch import load\nnet.load_state_dict(load(p, weights_only=True))\n"),
        # the loaded value goes to code this file does not show, which decides what it must hold: reported, said
        # less firmly, and no fix (weights_only=True might refuse it)
        Invalid("import torch\nckpt = torch.load(args.weights)\nmodel = build_model(ckpt['cfg'])\n", line=2,
                message="`build_model(ckpt['cfg'])` decides what the file must hold"),
        # used as a whole module: weights_only=True would refuse it, so the message names the use and the way out
        Invalid("import torch\nnet = torch.load(args.model, map_location='cpu')\nnet.eval()\n", line=2,
                message="its result is used as a whole nn.Module (`net.eval()`)"),
        # a field of a pickled configuration read from the loaded checkpoint
        Invalid("import torch\ndef restore(path):\n    ckpt = torch.load(path)\n    lr = ckpt['args'].lr\n"
                "    return ckpt, lr\n", line=3, message="`ckpt['args'].lr`"),
        # the repository's conda environment pins an old torch: the default load unpickles everything there
        Invalid("import torch\nstate = torch.load(args.ckpt)\n", line=2, message="the torch < 2.6 the repository pins",
                requirements="torch==1.12.1\n"),
        Invalid("import torch.serialization\nsd = torch.serialization.load(p)\n", line=2),
        # keywords unpacked from a dict the function builds itself, not from its callers: weights_only is not among them
        Invalid("import torch\ndef restore(f, **options):\n    settings = dict(map_location='cpu')\n"
                "    return torch.load(f, **settings)\n", line=4),
        # the same file name, but read from a directory the user names (features dumped by another run)
        Invalid("import torch, os\ntorch.save(feats, os.path.join(args.dump_dir, 'feat.pth'))\n"
                "feats = torch.load(os.path.join(args.load_dir, 'feat.pth'))\n", line=3),
        # the helper saves into the folder it is handed, but this function hands it another one
        Invalid("import torch\nclass KeepBest:\n    def __call__(self, score, net, where):\n"
                "        torch.save(net.state_dict(), where + '/top.pth')\n"
                "def train(net, folder, out):\n    keeper = KeepBest()\n    for epoch in range(9):\n"
                "        keeper(step(net), net, out)\n    net.load_state_dict(torch.load(folder + '/top.pth'))\n",
                line=9, requirements="numpy\n"),
        # a path attribute of an object the library table does not know as a checkpoint callback
        Invalid("import torch\nrun = fetch_run(args.run_id)\nweights = torch.load(run.best_model_path)\n", line=3),
        # the same template, but the slot picks the folder: another run's files, wherever it wrote them
        Invalid("import torch\nfor epoch in range(3):\n    torch.save(sd, '{}/weights.pt'.format(run_dir))\n"
                "sd = torch.load('{}/weights.pt'.format(other_dir))\n", line=4),
        # the same file-name template, in a folder the load names differently
        Invalid("import torch, os\nfor k in range(5):\n    torch.save(state, os.path.join(out_root, f'round{k}.bin'))\n"
                "state = torch.load(os.path.join(in_root, f'round{k}.bin'))\n", line=4),
        # a snapshot path from configuration, opened through fsspec (it may be remote): reported even
        # though this program also writes it
        Invalid("import torch, fsspec\ntorch.save(snapshot, self.config.snapshot_path)\n"
                "with fsspec.open(self.config.snapshot_path) as f:\n    data = torch.load(f)\n", line=4),
        # a resume from the run directory, which the training loop below writes only later: the file comes from
        # an earlier run, wherever the configuration points
        Invalid("import torch, os\nout_dir = 'out'\nif init_from == 'resume':\n"
                "    checkpoint = torch.load(os.path.join(out_dir, 'ckpt.pt'))\nfor step in range(100):\n"
                "    torch.save(checkpoint, os.path.join(out_dir, 'ckpt.pt'))\n", line=4),
        # a resume path from the command line, in a file that saves the args into its checkpoints:
        # weights_only=True would refuse them, so no mechanical fix, and the message says why
        Invalid("import torch\ntorch.save({'model': model.state_dict(), 'args': args}, 'checkpoint.pth')\n"
                "ckpt = torch.load(args.resume, map_location='cpu')\n", line=3, message="add_safe_globals"),
        # a resume from the script's own output folder: the options only pick the run and the epoch inside it, so
        # the path does not count as coming from outside; the script itself saves that file with a state dict
        # only, so it is the program's own checkpoint and the finding is low, with the fix
        Invalid("import torch\nif opt.start_epoch > 0:\n"
                "    gen.load_state_dict(torch.load('checkpoints/%s/gen_%d.pt' % (opt.run_name, opt.start_epoch)))\n"
                "for epoch in range(opt.start_epoch, opt.epochs):\n"
                "    torch.save(gen.state_dict(), 'checkpoints/%s/gen_%d.pt' % (opt.run_name, epoch))\n",
                line=3, message="this file saves it with tensors and plain values only"),
        # a config dict and model arguments built with dict(): plain values whatever their names, so the message
        # claims no Namespace or module and the fix stays on offer
        Invalid("import torch\nconfig = {k: globals()[k] for k in keys}\nmodel_args = dict(n_layer=4, n_head=4)\n"
                "torch.save({'model': model.state_dict(), 'model_args': model_args, 'config': config}, 'ck.pt')\n"
                "state = torch.load(resume_path)\n", line=5, message="rules out; pass `weights_only=True`",
                fixed="import torch\nconfig = {k: globals()[k] for k in keys}\nmodel_args = dict(n_layer=4, n_head=4)\n"
                      "torch.save({'model': model.state_dict(), 'model_args': model_args, 'config': config}, 'ck.pt')\n"
                      "state = torch.load(resume_path, weights_only=True)\n"),
        # ... while the parsed arguments themselves are a Namespace, whatever their name
        Invalid("import torch\nsettings = parser.parse_args()\n"
                "torch.save({'model': model.state_dict(), 'settings': settings}, 'ck.pt')\n"
                "state = torch.load(resume_path)\n", line=4, message="this file saves an argparse.Namespace"),
        # every torch the requirements allow loads weights only by default: low, and the explicit keyword is a safe fix
        Invalid("import torch\nstate = torch.load(args.ckpt)\n", requirements="numpy\ntorch>=2.6,<3\n", line=2,
                message="relies on torch's default `weights_only=True` (requirements.txt pins torch>=2.6)",
                fixed="import torch\nstate = torch.load(args.ckpt, weights_only=True)\n"),
        # a pickle_module turns the default off again, whatever the pin
        Invalid("import torch, dill\nstate = torch.load(args.ckpt, pickle_module=dill)\n", requirements="torch==2.7.1\n",
                line=2, message="with `pickle_module=` (which turns the weights-only default off)"),
        # a pin that still allows an old torch: the default load is not safe there
        Invalid("import torch\nstate = torch.load(args.ckpt)\n", requirements="torch>=1.13\n", line=2,
                message="on torch < 2.6, which nothing in the repository's requirements rules out"),
        # a converter that renames keys into a dict it builds: a dict of tensors, whatever its name says, so the
        # weights-only fix stays on offer
        Invalid("import torch\nsd = torch.load(args.src, map_location='cpu')\nmodel_renamed = {}\n"
                "for k, v in sd['model'].items():\n    model_renamed[k.replace('module.', '')] = v.clone()\n"
                "torch.save({'model': model_renamed}, args.dst)\n", line=2, message="pass `weights_only=True`"),
        # the whole model (built from a class, or resumed) is saved: the snapshot it resumes from is a pickled
        # module, which weights_only=True refuses
        Invalid("import torch\nif args.resume_snapshot:\n    model = torch.load(args.resume_snapshot)\nelse:\n"
                "    model = SNLIClassifier(config)\nfor step in range(10):\n    torch.save(model, snapshot_path)\n",
                line=3, message="this file saves a whole nn.Module into checkpoints"),
        # a save helper and a load helper that both call their parameter `path`: the same word, two values, each
        # chosen by its own callers; the load reads whatever file a caller names
        Invalid("import torch\nclass Agent(torch.nn.Module):\n    def dump(self, path):\n"
                "        torch.save(self.state_dict(), path)\n    @classmethod\n    def restore(cls, path):\n"
                "        agent = cls()\n        agent.load_state_dict(torch.load(path))\n        return agent\n",
                line=8, message="`torch.load(path)`"),
        # a method of the object that saves into its own folder, but reading from a folder its caller names: the
        # same file name in anyone's folder
        Invalid("import os\nimport torch\nclass Study:\n    def fit(self, run):\n"
                "        torch.save(self.net.state_dict(), os.path.join(self.opts.out_dir, run, 'top.ckpt'))\n"
                "    def score(self, folder):\n        self.net.load_state_dict(torch.load(os.path.join(folder, 'top.ckpt')))\n",
                line=7, message="`torch.load(os.path.join(folder, 'top.ckpt'))`"),
        # handed whole to load_state_dict, the file is a state dict whatever else the script saves: the fix is safe
        Invalid("import torch\nmodel.load_state_dict(torch.load(args.weights))\ntorch.save(model, 'final.pt')\n",
                line=2, message="pass `weights_only=True`",
                fixed="import torch\nmodel.load_state_dict(torch.load(args.weights, weights_only=True))\n"
                      "torch.save(model, 'final.pt')\n"),
    ]

    def visit_Call(self, node: cst.Call, ctx: FileContext) -> None:
        if not any(does(name, Does.READS_TORCH_CHECKPOINT) for name in called_functions(ctx, node)):
            return
        weights_only = keyword_arg(node, "weights_only")
        passed = weights_only.value if weights_only is not None else unpacked_keyword(ctx, node, "weights_only")
        if passed is not None and is_true(passed):
            return
        if passed is not None and not is_false(passed):
            return  # a variable: the author decides at run time; nothing mechanical to say
        if passed is None and forwards_callers_keywords(ctx, node):
            return  # a wrapper handing on its callers' keywords: whether they pass weights_only is theirs to say
        # a call of a function chosen at run time, or options unpacked from a dict: no edit of this call fits
        fixable = ctx.call_name(node) is not None and (weights_only is not None or passed is None)
        if ctx.in_context_manager(*SAFE_GLOBALS) or in_compat_fallback(ctx, node):
            return
        if passed is None and unrestricted_load_beside(ctx, node):
            return  # the explicit weights_only=False load of the same file beside it is reported: said once
        source = argument(node, 0, "f")
        checkpoints = ctx.facts(CheckpointWrites)
        outside = path_outside_origin(ctx, source)
        # from outside the program for certain (critical), or perhaps (a parameter no call in view passes): either
        # way, only a save to exactly this path makes it the program's own file
        external = outside is not None and outside is not Outside.CALLER
        if source is not None and self._self_written(source, ctx, checkpoints, outside is not None):
            return  # the program reloads what it saved itself: no trust boundary is crossed
        if collects_tests(ctx):
            # a test reloading what it wrote to its temporary directory; by what the file holds, not the folder
            # it sits in: a script kept under test/ that loads a path from its command line is still exposed
            return
        source_text = ctx.module.code_for_node(source) if source is not None else "?"
        shown = f"torch.load({source_text})"
        loaded = ctx.facts(LoadedPayloads)
        # handed whole to load_state_dict, the file holds a state dict (anything else fails there), whatever
        # else this file or its neighbours save; a checkpoint read for one of its items may hold more
        # the repository's other scripts that save the file this load reads (``eval.py`` reading what ``train.py``
        # wrote, built from the same parts), when what each puts there is known; not for a download or a file the
        # user types in, whoever else writes that name
        elsewhere = checkpoints.saved_elsewhere(source, node) if source is not None and outside not in (
            Outside.DOWNLOAD, Outside.USER_INPUT) else {}
        savers = sorted(path for path, kinds in elsewhere.items()
                        if kinds is not None and any(not kind.loads_weights_only for kind in kinds))
        # known: every save of it shows what it holds, or one holds what weights_only=True refuses, whatever the rest
        known = bool(elsewhere) and (None not in elsewhere.values() or bool(savers))
        if loaded.fed_whole_to_state_dict(node):
            refused, saved_by = set(), ""
        elif known:
            refused = {kind for path in savers for kind in elsewhere[path] if not kind.loads_weights_only}
            saved_by = _shown_files(savers) + (" in this repository " + ("saves" if len(savers) == 1 else "save"))
        else:
            refused, saved_by = self._refused_payloads(source, checkpoints)
        used_as = {kind for kind in loaded.of(node) if not kind.loads_weights_only} - refused
        reasons = [f"{saved_by} {describe(refused)} into checkpoints"] if refused else []
        if used_as:
            # the program uses what it loaded as a module, an array, an object with fields: weights_only=True
            # refuses that payload whatever the file is called
            uses = ", ".join(f"`{loaded.use(node, kind)}`" for kind in sorted(used_as, key=lambda k: k.value))
            reasons.append(f"its result is used as {describe(used_as)} ({uses})")
            refused |= used_as
        # weights-only compatible by what the program does: the result feeds load_state_dict, or every checkpoint
        # this file (or the name the load reads) is saved with holds tensors and plain values. Neither that nor
        # refused: the fix stays on offer while every use of the result is in view (it is used as a dict or a
        # tensor, or not at all), not when it goes to code that decides what it must be
        compatible = not refused and (known or Payload.TENSORS in loaded.of(node)
                                      or self._saves_tensors(source, checkpoints))
        # the repository's own checkpoint, of tensors and plain values only: the fix is safe and the file is not a
        # stranger's; said quietly (a little louder when the command line or a configuration names it)
        own = f"{_shown_files(sorted(elsewhere))} in this repository " \
            f"{'saves' if len(elsewhere) == 1 else 'save'} this file with tensors and plain values only, which " \
            "`weights_only=True` loads" if known and not refused else ""
        if not own and not refused and source is not None and checkpoints.saved_here_holding_weights(source, node):
            # a resume of the program's own checkpoint, which this file writes with tensors and plain values only
            own = "this file saves it with tensors and plain values only, which `weights_only=True` loads"
        pickle_module = keyword_arg(node, "pickle_module")
        versions = ctx.facts(VersionFacts)
        floor = versions.floor("torch")
        if passed is None and pickle_module is None and floor is not None and \
                floor.guarantees(WEIGHTS_ONLY_DEFAULT):
            # every torch the pins allow loads weights only by default: safe today, said explicitly it stays safe
            if not refused:
                self.report(node, f"`{shown}` relies on torch's default `weights_only=True` ({floor.source} pins "
                            f"torch{floor.text}); pass it explicitly so the load stays safe if the pin is loosened",
                            replacement=node.with_changes(args=_with_weights_only(node.args)) if fixable else None,
                            severity=Severity.LOW,
                            safe=True)
            return
        if passed is not None:
            message = (f"`{shown}` passes `weights_only=False`: unpickling can run arbitrary code"
                       + (f" and the path comes from {outside.value}" if external else ""))
            new_args = [a.with_changes(value=cst.Name("True")) if a is weights_only else a for a in node.args]
        else:
            # what the default does depends on the torch that runs it: say which one the message assumes
            cap = versions.cap("torch")
            if pickle_module is not None:
                runs_on = "with `pickle_module=` (which turns the weights-only default off)"
            elif cap is not None and not cap.admits(WEIGHTS_ONLY_DEFAULT):
                runs_on = f"on the torch < 2.6 the repository pins ({versions.assumption('torch')})"
            else:
                runs_on = "on torch < 2.6, which nothing in the repository's requirements rules out"
            message = (f"`{shown}` without `weights_only=True` unpickles arbitrary objects {runs_on}"
                       + (f", from a path that comes from {outside.value}" if external else ""))
            new_args = _with_weights_only(node.args)
        # said with less weight when weights_only=True cannot simply be added: the file needs full unpickling (the
        # risk is in trusting its source), or nothing shows what it holds
        lowered = Severity.HIGH if outside is not None else Severity.MEDIUM
        if refused:
            # weights_only=True would refuse this program's own checkpoints: no committable suggestion
            self.report(node, message + f"; {' and '.join(reasons)}, which `weights_only=True` refuses: load "
                        "only files you trust, or save `state_dict()`s and plain values instead, or allow the classes with "
                        "`torch.serialization.add_safe_globals([...])` (`safe_globals` around one load) and load "
                        "with `weights_only=True`", severity=lowered)
            return
        escapes = "" if compatible else loaded.escapes(node)
        if escapes:
            # what the file must hold is decided by code out of view: say less, and offer no fix
            self.report(node, message + f"; `{escapes}` decides what the file must hold, which nothing here shows: "
                        "if it is a `state_dict()` or tensors, pass `weights_only=True`; if it holds other objects, "
                        "allow their classes with `torch.serialization.safe_globals([...])`", severity=lowered)
            return
        if own:
            self.report(node, message + f"; {own}: pass `weights_only=True`",
                        replacement=node.with_changes(args=new_args) if fixable else None,
                        severity=Severity.MEDIUM if external else Severity.LOW)
            return
        self.report(node, message + "; pass `weights_only=True`",
                    replacement=node.with_changes(args=new_args) if fixable else None,
                    severity=Severity.CRITICAL if external else None)

    @staticmethod
    def _saves_tensors(source: Optional[cst.BaseExpression], checkpoints: CheckpointWrites) -> bool:
        """The checkpoints this load may read are known to hold tensors and plain values only: those saved to the
        file name it reads, else every checkpoint the file saves (a script reloads its own format)."""
        names = checkpoints.literals(source) if source is not None else set()
        own = [write for write in checkpoints.writes if names & write.path_literals]
        writes = own or checkpoints.writes
        return bool(writes) and all(write.payloads and write.payloads <= {Payload.TENSORS} for write in writes)

    @staticmethod
    def _refused_payloads(source: Optional[cst.BaseExpression], checkpoints: CheckpointWrites
                          ) -> tuple[set[Payload], str]:
        """What ``weights_only=True`` would refuse in the checkpoints this load may read, and who saves them:
        this file's saves, else those of the scripts beside it and the modules it imports (a checkpoint that
        ``util/misc.py`` writes with the run's ``args``). A load of a file name that this file only ever saves
        tensors to (features dumped by ``--dump_features``) reads its own tensors: nothing refused."""
        refused = {kind for kind in checkpoints.payload_kinds() if not kind.loads_weights_only}
        if refused:
            return refused, "this file saves"
        names = checkpoints.literals(source) if source is not None else set()
        own = [write for write in checkpoints.writes if names & write.path_literals]
        if own and all(write.payloads <= {Payload.TENSORS} for write in own):
            return set(), ""
        nearby = checkpoints.refused_nearby()
        if not nearby:
            return set(), ""
        files = sorted(nearby)
        return set().union(*nearby.values()), \
            f"{_shown_files(files)} in this repository {'saves' if len(files) == 1 else 'save'}"

    @staticmethod
    def _self_written(source: cst.BaseExpression, ctx: FileContext, checkpoints: CheckpointWrites,
                      external: bool) -> bool:
        # a path from outside the program counts as this program's own file only when it saves to exactly
        # that expression too (a cache: ``if isfile(args.cache): load(args.cache) else: save(.., args.cache)``)
        if checkpoints.written_before_loaded(source, ctx.origin(source), same_expression_only=external):
            return True
        if checkpoints.writes_fixed_path(source):
            return True  # restored from the fixed file this program saves to as it runs (an earlier run's)
        if checkpoints.saved_by_the_instance(source, source):
            return True  # a method of the same object saved it there: an experiment's test step after its train step
        if external:
            return False
        # a helper's parameter: self-written when every call in the file passes a self-written path
        fn = ctx.function_def
        if isinstance(source, cst.Name) and fn is not None and ctx.binding(source.value) is not None \
                and ctx.binding(source.value).kind == "param":
            values = call_site_values(ctx, fn, source.value)
            return bool(values) and all(checkpoints.written_before_loaded(v, None) for v in values)
        return False


def _shown_files(files: Sequence[str]) -> str:
    return ", ".join(f"`{path}`" for path in files[:3]) + (f" and {len(files) - 3} more" if len(files) > 3 else "")


def _with_weights_only(args: Sequence[cst.Arg]) -> list[cst.Arg]:
    new_args = list(args)
    if new_args:
        # keep a trailing comma layout intact: drop it from the last arg, add ours
        new_args[-1] = new_args[-1].with_changes(comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" ")))
    new_args.append(cst.Arg(value=cst.Name("True"), keyword=cst.Name("weights_only"),
                            equal=cst.AssignEqual(cst.SimpleWhitespace(""), cst.SimpleWhitespace(""))))
    return new_args
