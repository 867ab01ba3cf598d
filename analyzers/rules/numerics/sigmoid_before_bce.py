"""TR402 sigmoid-before-bce: sigmoid followed by BCELoss instead of BCEWithLogitsLoss."""
from __future__ import annotations

import re
from analyzers.model import Category, Severity
from analyzers.rules.base import Invalid
from analyzers.rules.numerics._numerics import ActivationIntoLoss as _ActivationIntoLoss


class SigmoidBeforeBCE(_ActivationIntoLoss):
    id = "TR402"
    source_hint = re.compile(r"BCELoss|binary_cross_entropy")  # the loss is named in this file (import or call)
    slug = "sigmoid-before-bce"
    category = Category.NUMERICS
    severity = Severity.MEDIUM
    summary = "sigmoid followed by BCELoss instead of BCEWithLogitsLoss"
    what = """
        Flags a sigmoid output (`torch.sigmoid`, `F.sigmoid`, `x.sigmoid()`, an `nn.Sigmoid`
        module, or a model defined in the file whose `forward` returns sigmoid) passed to
        `nn.BCELoss` / `F.binary_cross_entropy`.
    """
    why = """
        `sigmoid` saturates to exactly 0.0 or 1.0 in float32 (and much sooner in float16), and
        `BCELoss` then takes `log(0)`: PyTorch clamps the log at -100, so the loss and its
        gradient become meaningless for confident mistakes. `BCEWithLogitsLoss` fuses the two
        with the log-sum-exp trick and stays exact; it is also the only one allowed under
        autocast.
    """
    example = """
        criterion = nn.BCELoss()
        loss = criterion(torch.sigmoid(logits), y)
    """
    fix_example = """
        criterion = nn.BCEWithLogitsLoss()
        loss = criterion(logits, y)
    """
    LOSS_MODULES = {"torch.nn.BCELoss": "BCELoss", "torch.nn.modules.loss.BCELoss": "BCELoss"}
    LOSS_FUNCS = {"torch.nn.functional.binary_cross_entropy": "F.binary_cross_entropy"}
    KINDS = {"BCELoss": ("sigmoid",), "F.binary_cross_entropy": ("sigmoid",)}
    VALID = [
        """
        import torch
        import torch.nn as nn
        criterion = nn.BCEWithLogitsLoss()
        loss = criterion(logits, y)
        probs = torch.sigmoid(logits)
        """,
        # probabilities that do not come from a sigmoid (e.g. a mixture) are fine for BCELoss
        """
        import torch
        import torch.nn as nn
        criterion = nn.BCELoss()
        loss = criterion(mix_weights * p1 + (1 - mix_weights) * p2, y)
        """,
        """
        import torch
        import torch.nn.functional as F
        p = torch.sigmoid(logits)
        p = p.clamp(1e-6, 1 - 1e-6)
        loss = F.binary_cross_entropy(p.clamp(1e-6, 1 - 1e-6), y)
        """,
        # one condition picks both: the sigmoid meets the loss that takes logits, the raw scores meet BCELoss
        """
        import torch.nn as nn
        def fit(net, batches, opt, probs_out=False):
            head = nn.Sigmoid() if probs_out else nn.Identity()
            crit = nn.BCEWithLogitsLoss() if probs_out else nn.BCELoss()
            for x, y in batches:
                crit(head(net(x)), y).backward()
                opt.step()
        """,
        # the default is filled only in one branch of two: the other keeps what the caller passed
        """
        import torch
        import torch.nn as nn
        def score(p, y, crit=None):
            if crit is None:
                crit = nn.BCELoss()
            elif isinstance(crit, str):
                crit = make_loss(crit)
            return crit(torch.sigmoid(p), y)
        """,
    ]
    INVALID = [
        # the defaults a training method fills in for arguments left at None: with one output, the sigmoid
        # head (picked by the same condition as the loss) feeds BCELoss
        Invalid("""
            import torch.nn as nn
            class Scorer:
                def train(self, batches, crit=None, head=None):
                    if crit is None:
                        crit = nn.BCELoss() if self.outputs == 1 else nn.CrossEntropyLoss()
                    if head is None:
                        head = nn.Sigmoid() if self.outputs == 1 else nn.Identity()
                    for x, y in batches:
                        out = head(self.net(x))
                        if self.outputs == 1:
                            out = out.flatten()
                        crit(out, y).backward()
            """, line=13, message="where `self.outputs == 1` holds"),
        # a sigmoid head chosen by a flag meets a fixed BCELoss
        Invalid("""
            import torch.nn as nn
            head = nn.Identity() if not args.probabilities else nn.Sigmoid()
            bce = nn.BCELoss()
            loss = bce(head(net(x)), y)
            """, line=5, message="where `args.probabilities` holds"),
        # a Sequential ending in Sigmoid, moved to the device under its own name
        Invalid("""
            import torch.nn as nn
            D = nn.Sequential(nn.Linear(784, 1), nn.Sigmoid())
            D = D.to(device)
            criterion = nn.BCELoss()
            d_loss = criterion(D(images), real_labels)
            """, line=6, message="BCELoss"),
        # forward returns the Sequential's output reshaped, on both data-parallel branches
        Invalid("""
            import torch.nn as nn
            class Discriminator(nn.Module):
                def __init__(self):
                    super().__init__()
                    self.main = nn.Sequential(nn.Conv2d(3, 1, 4), nn.Sigmoid())
                def forward(self, x):
                    if x.is_cuda and self.ngpu > 1:
                        output = nn.parallel.data_parallel(self.main, x, range(self.ngpu))
                    else:
                        output = self.main(x)
                    return output.view(-1, 1).squeeze(1)
            netD = Discriminator().to(device)
            criterion = nn.BCELoss()
            errD = criterion(netD(real), label)
            """, line=15, message="Discriminator.forward returns sigmoid"),
        # a tuple return (output, hidden), unpacked, squeezed
        Invalid("""
            import torch.nn as nn
            class RNN(nn.Module):
                def __init__(self):
                    super().__init__()
                    self.lstm = nn.LSTM(8, 8, batch_first=True)
                    self.fc = nn.Linear(8, 1)
                    self.sig = nn.Sigmoid()
                def forward(self, x, hidden):
                    out, hidden = self.lstm(x, hidden)
                    out = self.sig(self.fc(out))
                    out = out[:, -1]
                    return out, hidden
            net = RNN()
            criterion = nn.BCELoss()
            for inputs, labels in loader:
                output, h = net(inputs, h)
                loss = criterion(output.squeeze(), labels.float())
            """, line=18),
        # the model arrives as a parameter; the caller passes the class
        Invalid("""
            import torch.nn as nn
            class Siamese(nn.Module):
                def __init__(self):
                    super().__init__()
                    self.fc = nn.Linear(4, 1)
                    self.sigmoid = nn.Sigmoid()
                def forward(self, a, b):
                    output = self.fc(a - b)
                    output = self.sigmoid(output)
                    return output
            def train(args, model, loader, optimizer):
                criterion = nn.BCELoss()
                for x1, x2, y in loader:
                    loss = criterion(model(x1, x2).squeeze(), y)
            def main():
                model = Siamese().to(device)
                train(args, model, loader, optimizer)
            """, line=15, message="Siamese.forward returns sigmoid"),
        Invalid(
            """
            import torch
            import torch.nn as nn
            criterion = nn.BCELoss()
            loss = criterion(torch.sigmoid(logits), y)
            """,
            line=5, message="`criterion` (BCELoss)",
        ),
        Invalid(
            """
            import torch.nn.functional as F
            probs = logits.sigmoid()
            loss = F.binary_cross_entropy(probs, target, reduction="sum")
            """,
            line=4, message="BCEWithLogitsLoss",
        ),
        Invalid(
            """
            from torch import nn
            class Disc(nn.Module):
                def __init__(self):
                    super().__init__()
                    self.net = nn.Sequential(nn.Linear(8, 1), nn.Sigmoid())
                def forward(self, x):
                    return self.net(x)
            D = Disc()
            adv_loss = nn.BCELoss()
            loss = adv_loss(D(fake), valid)
            """,
            line=11, message="Disc.forward returns sigmoid",
        ),
    ]

    def describe(self, crit, source, kind, loss):
        return (f"{crit} receives a sigmoid output: {source}; sigmoid + BCELoss is numerically unstable "
                f"(log(0) once the sigmoid saturates). Pass the logits to BCEWithLogitsLoss / "
                f"F.binary_cross_entropy_with_logits instead"), None
