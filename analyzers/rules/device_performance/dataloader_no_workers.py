"""TR702 dataloader-no-workers: training DataLoader loads batches in the main process (no num_workers) on a CUDA job."""
from __future__ import annotations

import re
import libcst as cst

from analyzers.context import FileContext, argument
from analyzers.markdown import named
from analyzers.model import Category, Severity
from analyzers.rules.base import Invalid, Valid
from analyzers.program.devices import device_facts as _facts
from analyzers.program.data import Loader as _Loader
from analyzers.rules.device_performance._device import LoaderRule as _LoaderRule


class DataLoaderNoWorkers(_LoaderRule):
    id = "TR702"
    source_hint = re.compile(r"DataLoader")  # a DataLoader call
    slug = "dataloader-no-workers"
    category = Category.DEVICE
    severity = Severity.LOW
    speed_only = True
    summary = "training DataLoader loads batches in the main process (no num_workers) on a CUDA job"
    what = """
        Flags a training `DataLoader` (`shuffle=True`, or a dataset/loader named `train*`) that
        does not pass `num_workers`, or passes `num_workers=0`, in a file that trains on CUDA. A data
        set the program model knows to be in memory is skipped (`TensorDataset`, the MNIST and CIFAR
        families, SVHN, a `Dataset` class of the repository whose `__getitem__` only indexes what it holds, or one
        of these handed in by every caller of the function or returned by a function of the file).
    """
    why = """
        With `num_workers=0` every batch is loaded, decoded and collated in the training
        process, between GPU steps: the GPU idles while Python reads files and augments images.
        Worker processes prepare the next batches in parallel with the step.
    """
    example = """
        train_loader = DataLoader(train_ds, batch_size=64, shuffle=True)
        model = model.cuda()
    """
    fix_example = """
        train_loader = DataLoader(train_ds, batch_size=64, shuffle=True,
                                  num_workers=4, pin_memory=True, persistent_workers=True)
        model = model.cuda()
    """
    OPTIONS = {"every-loader": """
        every `DataLoader` without `num_workers` (or with a literal `num_workers=0`) is reported at low
        severity, evaluation loaders, in-memory data sets and CPU-only files included, as TorchFix reported them.
    """}
    VALID = [
        # a tensor built in memory is the data set
        Valid("import torch\nfrom torch.utils.data import DataLoader\ndef train(ids):\n"
              "    data = torch.from_numpy(ids)\n    train_loader = DataLoader(data, batch_size=8, shuffle=True)\n"
              "    for x in train_loader:\n        x = x.cuda()\n"),
        # a data set class of the program that only indexes tensors it holds: nothing to read per item
        Valid("import torch\nfrom torch.utils.data import Dataset, DataLoader\nclass Tokens(Dataset):\n"
              "    def __init__(self, ids, labels):\n        self.ids = torch.tensor(ids)\n        self.labels = labels\n"
              "    def __getitem__(self, i):\n        return self.ids[i], torch.tensor(self.labels[i])\n"
              "    def __len__(self):\n        return len(self.labels)\n"
              "train_loader = DataLoader(Tokens(ids, labels), batch_size=32, shuffle=True)\n"
              "for x, y in train_loader:\n    x = x.cuda()\n"),
        # in-memory data: MNIST with ToTensor only, a TensorDataset; and a (shuffled) test loader
        "import torch\nfrom torchvision import datasets, transforms\nfrom torch.utils.data import DataLoader\n"
        "train_ds = datasets.MNIST('data', train=True, transform=transforms.ToTensor())\n"
        "train_loader = DataLoader(train_ds, batch_size=64, shuffle=True)\n"
        "test_loader = DataLoader(test_folder, batch_size=64, shuffle=True)\n"
        "for x, y in train_loader:\n    x = x.cuda()\n",
        "import torch\nfrom torch.utils.data import DataLoader\n"
        "loader = DataLoader(train_ds, batch_size=32, shuffle=True, num_workers=8)\nmodel.cuda()\n",
        "import torch\nfrom torch.utils.data import DataLoader\n"
        "loader = DataLoader(train_ds, batch_size=32, shuffle=True, num_workers=args.workers)\nmodel.cuda()\n",
        # CPU-only file
        "import torch\nfrom torch.utils.data import DataLoader\nloader = DataLoader(train_ds, shuffle=True)\n",
        # evaluation loader
        "import torch\nfrom torch.utils.data import DataLoader\n"
        "test_loader = DataLoader(test_ds, batch_size=256)\nmodel.to('cuda')\n",
        # settings passed through **kwargs
        "import torch\nfrom torch.utils.data import DataLoader\n"
        "loader = DataLoader(train_ds, shuffle=True, **loader_kwargs)\nmodel.cuda()\n",
        # selected through TorchFix: a worker count known only at run time is not reported
        Valid("import torch\nfrom torch.utils.data import DataLoader\n"
              "test_loader = DataLoader(test_ds, num_workers=workers)\n"
              "loader = DataLoader(ds, 10, False, None, None, 2)\n", select=("TOR401",)),
    ]
    INVALID = [
        # its __getitem__ opens an image file per item
        Invalid("import torch\nfrom PIL import Image\nfrom torch.utils.data import Dataset, DataLoader\nclass Photos(Dataset):\n"
                "    def __init__(self, paths):\n        self.paths = paths\n"
                "    def __getitem__(self, i):\n        return Image.open(self.paths[i])\n"
                "    def __len__(self):\n        return len(self.paths)\n"
                "train_loader = DataLoader(Photos(paths), batch_size=32, shuffle=True)\n"
                "for x in train_loader:\n    x = x.cuda()\n", line=11),
        Invalid("import torch\nfrom torch.utils.data import DataLoader\n"
                "train_loader = DataLoader(train_ds, batch_size=32, shuffle=True)\nmodel = Net().cuda()\n",
                line=3, message="train_loader"),
        Invalid("import torch\nfrom torch.utils.data import DataLoader as DL\n"
                "device = 'cuda' if torch.cuda.is_available() else 'cpu'\n"
                "loader = DL(trainset, batch_size=32, num_workers=0)\nmodel.to(device)\n",
                line=4, message="num_workers=0"),
        # positional num_workers (the sixth parameter)
        Invalid("import torch\nfrom torch.utils.data import DataLoader\n"
                "train_loader = DataLoader(train_ds, 32, True, None, None, 0)\nmodel.cuda()\n",
                line=3, message="`num_workers=0`"),
        # selected through TorchFix: every loader, an evaluation loader in a CPU script too
        Invalid("import torch\nfrom torch.utils.data import DataLoader\n"
                "test_loader = DataLoader(test_ds, batch_size=256)\n",
                line=3, message="TOR401", select=("TOR401",)),
        Invalid("import torch\nimport torch.utils.data\n"
                "loader = torch.utils.data.DataLoader(torch.rand(100, 4), 10, False, None, None, 0)\n",
                line=3, message="`num_workers=0`", select=("TOR4",)),
        Invalid("import torch.utils.data as tud\nimport torch\n"
                "dl = tud.DataLoader(ds, batch_size=8, shuffle=True)\n"
                "for x, y in dl:\n    x = x.to('cuda')\n",
                line=3, message="dl"),
    ]

    def wants(self, loader: _Loader) -> bool:
        workers = argument(loader.call, 5, "num_workers")  # the sixth positional parameter
        in_process = workers is None or (isinstance(workers, cst.Integer) and workers.evaluated_value == 0)
        return in_process and ("every-loader" in self.options or (loader.training and not loader.read_in_memory))

    def end_file(self, ctx: FileContext) -> None:
        if not self.loaders:
            return
        cuda = _facts(ctx).cuda_evidence
        for loader in self.loaders:
            how = "no `num_workers`" if argument(loader.call, 5, "num_workers") is None else "`num_workers=0`"
            if cuda and loader.training and not loader.read_in_memory:
                self.report(loader.call, f"training {named('DataLoader', loader.label)} has {how}: batches are loaded "
                                         f"in the training process and the GPU waits for them; pass num_workers>0 "
                                         f"(e.g. num_workers=4, persistent_workers=True)")
            elif "every-loader" in self.options:
                self.report(loader.call, f"{named('DataLoader', loader.label)} has {how}: each batch is loaded in the "
                                         f"process that iterates the loader, while it waits; num_workers>0 loads the "
                                         f"next batches in parallel (TorchFix's TOR401, selected)", severity=Severity.LOW)
