"""TR401 softmax-before-cross-entropy: softmax output passed to CrossEntropyLoss, which applies log_softmax itself."""
from __future__ import annotations

import re
from analyzers.model import Category, Severity
from analyzers.rules.base import Invalid
from analyzers.rules.numerics._numerics import ActivationIntoLoss as _ActivationIntoLoss


_CE_MODULES = {"torch.nn.CrossEntropyLoss": "CrossEntropyLoss",
               "torch.nn.modules.loss.CrossEntropyLoss": "CrossEntropyLoss",
               "torch.nn.NLLLoss": "NLLLoss", "torch.nn.modules.loss.NLLLoss": "NLLLoss"}
_CE_FUNCS = {"torch.nn.functional.cross_entropy": "F.cross_entropy", "torch.nn.functional.nll_loss": "F.nll_loss"}


class SoftmaxBeforeCrossEntropy(_ActivationIntoLoss):
    id = "TR401"
    source_hint = re.compile(r"ross_?[Ee]ntropy|NLLLoss|nll_loss")  # the loss is named in this file (import or call)
    slug = "softmax-before-cross-entropy"
    category = Category.NUMERICS
    severity = Severity.HIGH
    summary = "softmax output passed to CrossEntropyLoss, which applies log_softmax itself"
    what = """
        Flags a softmax output (`F.softmax`, `torch.softmax`, `x.softmax(dim)`, an
        `nn.Softmax` module, a `Sequential` ending in `nn.Softmax` (also one filled by
        `add_module` / `append` after it is built, or returned by a builder function), or a model
        defined in the file whose `forward` returns softmax; in a step function, the model and the
        loss every caller passes) passed as the input of `nn.CrossEntropyLoss` /
        `F.cross_entropy`, and softmax probabilities passed to `NLLLoss` / `F.nll_loss`.
        A `log_softmax` output passed to CrossEntropyLoss is reported at low severity as
        redundant.
    """
    why = """
        `CrossEntropyLoss` expects raw logits: it applies `log_softmax` internally. Feeding it
        probabilities squashes the logits into [0, 1], so the loss can never approach zero,
        its gradients shrink as the model grows confident and training stalls or converges
        to a worse model, without any error. `NLLLoss` expects log-probabilities, so
        probabilities there give a wrong loss.
    """
    example = """
        probs = F.softmax(model(x), dim=1)
        loss = criterion(probs, y)  # criterion = nn.CrossEntropyLoss()
    """
    fix_example = """
        logits = model(x)
        loss = criterion(logits, y)
        probs = F.softmax(logits, dim=1)  # only for metrics / predictions
    """
    LOSS_MODULES = _CE_MODULES
    LOSS_FUNCS = _CE_FUNCS
    KINDS = {"CrossEntropyLoss": ("softmax", "log_softmax"), "F.cross_entropy": ("softmax", "log_softmax"),
             "NLLLoss": ("softmax",), "F.nll_loss": ("softmax",)}
    VALID = [
        # the Sequential's last layer is added under a branch: which one ends it is not known
        """
        import torch.nn as nn
        clf = nn.Sequential(nn.Linear(8, 5))
        if export:
            clf.add_module("probs", nn.Softmax(dim=1))
        ce = nn.CrossEntropyLoss()
        total = ce(clf(batch), target)
        """,
        # a layer added after the softmax: the Sequential ends in logits
        """
        import torch.nn as nn
        clf = nn.Sequential()
        clf.add_module("probs", nn.Softmax(dim=1))
        clf.add_module("proj", nn.Linear(5, 5))
        ce = nn.CrossEntropyLoss()
        total = ce(clf(batch), target)
        """,
        # the parameter receives a different loss from each caller: the step function's loss is not known
        """
        import torch
        def update(head, objective, inputs, labels):
            return objective(head(inputs), labels)
        head = torch.nn.Sequential(torch.nn.Linear(4, 2), torch.nn.Softmax(dim=1))
        update(head, torch.nn.CrossEntropyLoss(), xs, ys)
        update(head, torch.nn.MSELoss(), xs, ys)
        """,
        # the branch builds another model, not the same one moved
        """
        import torch
        import torch.nn as nn
        import torch.nn.functional as F
        class Classifier(nn.Module):
            def forward(self, x):
                return F.softmax(self.fc(x), dim=1)
        net = Classifier()
        if use_logits:
            net = LogitsNet()
        criterion = nn.CrossEntropyLoss()
        loss = criterion(net(x), y)
        """,
        # logits into the loss, softmax only for metrics
        """
        import torch.nn as nn
        import torch.nn.functional as F
        criterion = nn.CrossEntropyLoss()
        logits = model(x)
        loss = criterion(logits, y)
        probs = F.softmax(logits, dim=1)
        pred = probs.argmax(dim=1)
        """,
        # log_softmax + NLLLoss is the intended pairing
        """
        import torch.nn as nn
        import torch.nn.functional as F
        criterion = nn.NLLLoss()
        loss = criterion(F.log_softmax(out, dim=1), y)
        """,
        # softmax rebound to something else before the loss
        """
        import torch
        import torch.nn.functional as F
        out = F.softmax(logits, dim=-1)
        out = head(features)
        loss = F.cross_entropy(out, y)
        """,
        # forward returns logits in training, probabilities at inference
        """
        import torch.nn as nn
        import torch.nn.functional as F
        class Net(nn.Module):
            def forward(self, x):
                x = self.fc(x)
                if self.training:
                    return x
                return F.softmax(x, dim=1)
        model = Net()
        criterion = nn.CrossEntropyLoss()
        loss = criterion(model(x), y)
        """,
        # softmax only on the inference branch
        """
        import torch.nn.functional as F
        out = model(x)
        if not training:
            out = F.softmax(out, dim=1)
        loss = F.cross_entropy(out, y)
        """,
        # a different criterion object
        """
        import torch.nn as nn
        criterion = nn.MSELoss()
        loss = criterion(probs.softmax(1), y)
        """,
        # a custom class with its own softmax method that is not a tensor
        """
        import torch
        import torch.nn as nn
        class Head(nn.Module):
            def softmax(self, x):
                return x
            def forward(self, x):
                return self.softmax(x)
        loss = nn.CrossEntropyLoss()(Head()(x), y)
        """,
    ]
    INVALID = [
        # the model is moved to the GPU on one branch only: either way it is the same module
        Invalid(
            """
            import torch
            import torch.nn as nn
            import torch.nn.functional as F
            class Classifier(nn.Module):
                def __init__(self):
                    super().__init__()
                    self.fc = nn.Linear(8, 3)
                def forward(self, x):
                    return F.softmax(self.fc(x), dim=1)
            net = Classifier()
            if torch.cuda.is_available():
                net = net.cuda()
            criterion = nn.CrossEntropyLoss()
            loss = criterion(net(x), y)
            """,
            line=15, message="Classifier.forward returns softmax",
        ),
        Invalid(
            """
            import torch.nn as nn
            import torch.nn.functional as F
            criterion = nn.CrossEntropyLoss()
            probs = F.softmax(logits, dim=1)
            loss = criterion(probs, y)
            """,
            line=6, message="`criterion` (CrossEntropyLoss)",
        ),
        Invalid(
            """
            import torch
            import torch.nn.functional as F
            loss = F.cross_entropy(F.softmax(out, 1), target)
            """,
            line=4, message="F.cross_entropy",
        ),
        Invalid(
            """
            import torch as th
            loss = th.nn.functional.cross_entropy(input=out.softmax(dim=-1), target=y)
            """,
            line=3,
        ),
        Invalid(
            """
            import torch
            from torch import nn
            class Classifier(nn.Module):
                def __init__(self):
                    super().__init__()
                    self.fc = nn.Linear(10, 3)
                    self.softmax = nn.Softmax(dim=1)
                def forward(self, x):
                    return self.softmax(self.fc(x))
            model = Classifier().to("cuda")
            criterion = nn.CrossEntropyLoss()
            for x, y in loader:
                out = model(x)
                loss = criterion(out, y)
                loss.backward()
            """,
            line=15, message="Classifier.forward returns softmax",
        ),
        Invalid(
            """
            import torch.nn as nn
            from torch.nn import CrossEntropyLoss
            class Trainer:
                def __init__(self):
                    self.loss_fn = CrossEntropyLoss(label_smoothing=0.1)
                    self.head = nn.Sequential(nn.Linear(4, 2), nn.Softmax(dim=-1))
                def step(self, x, y):
                    return self.loss_fn(self.head(x), y)
            """,
            line=9, message="`self.loss_fn` (CrossEntropyLoss)",
        ),
        Invalid(
            """
            import torch.nn as nn
            import torch.nn.functional as F
            criterion = nn.CrossEntropyLoss()
            loss = criterion(F.log_softmax(logits, dim=1), y)
            """,
            line=5, message="NLLLoss",
        ),
        Invalid(
            """
            import torch
            import torch.nn.functional as F
            loss = F.nll_loss(torch.softmax(logits, dim=1), y)
            """,
            line=4, message="log-probabilities",
        ),
        Invalid(
            """
            import torch
            import lightning as L
            import torch.nn.functional as F
            class Lit(L.LightningModule):
                def forward(self, x):
                    return F.softmax(self.net(x), dim=1)
                def training_step(self, batch, idx):
                    x, y = batch
                    logits = self(x)
                    return F.cross_entropy(logits, y)
            """,
            line=11, message="Lit.forward returns softmax",
        ),
        # a Sequential filled by add_module after it is built: its last layer is the softmax
        Invalid(
            """
            import torch.nn as nn
            clf = nn.Sequential()
            clf.add_module("proj", nn.Linear(8, 5))
            clf.add_module("probs", nn.Softmax(dim=1))
            ce = nn.CrossEntropyLoss()
            total = ce(clf(batch), target)
            """,
            line=7, message="`clf(batch)` is a softmax output",
        ),
        # a builder function returns the model, and a step function receives it and the loss as parameters
        # (called through an explicit .forward)
        Invalid(
            """
            import torch
            def make_head(width, classes):
                head = torch.nn.Sequential()
                head.append(torch.nn.Linear(width, classes))
                head.append(torch.nn.Softmax(dim=-1))
                return head
            def update(head, objective, solver, inputs, labels):
                solver.zero_grad()
                scores = head.forward(inputs)
                objective.forward(scores, labels).backward()
                solver.step()
            def run():
                head = make_head(16, 4)
                objective = torch.nn.CrossEntropyLoss()
                solver = torch.optim.Adam(head.parameters())
                for inputs, labels in batches:
                    update(head, objective, solver, inputs, labels)
            """,
            line=11, message="`scores` comes from `head.forward(inputs)`",
        ),
    ]

    def describe(self, crit, source, kind, loss):
        if loss in ("NLLLoss", "F.nll_loss"):
            return (f"{crit} receives probabilities: {source}; NLLLoss expects log-probabilities, so the loss "
                    f"is wrong. Use log_softmax (or pass raw logits to CrossEntropyLoss)"), None
        if kind == "log_softmax":
            return (f"{crit} receives a log_softmax output: {source}; CrossEntropyLoss applies log_softmax "
                    f"itself, so this is redundant work. Use NLLLoss with log_softmax, or drop log_softmax "
                    f"and pass raw logits"), Severity.LOW
        return (f"{crit} receives probabilities: {source}; CrossEntropyLoss applies log_softmax itself, so "
                f"softmax is applied twice, the loss saturates and gradients vanish. Pass the raw logits and "
                f"keep softmax for predictions/metrics"), None
