"""TorchFix compatibility: every TorchFix code and the torchreview rules that cover it.

TorchFix (pytorch-labs/torchfix, archived) is a flake8 plugin whose codes are ``TOR`` + three digits.
Its users have ``select``/``ignore`` lists and ``# noqa: TOR102`` comments written in those codes; this
table lets them keep working. A selector is a TorchFix code or a prefix of one (``TOR1``, ``TOR10``,
``TOR``), as flake8 matches them; it stands for the union of the rules of every code it names.
A TorchFix user who selects a code gets TorchFix's scope for it: ``scope`` names the rule options
(``Rule.OPTIONS``) that widen a rule to what TorchFix's checker reported, and the rules that exist only for
TorchFix codes are ``opt_in`` (they run only when selected). Users who select no TOR code see neither.
The descriptions are ours; the codes and their meaning come from TorchFix 0.7.0's README and visitors
(TOR108 and TOR402 were added on its main branch after that release).
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Iterable, Optional

TORCHFIX_SELECTOR = re.compile(r"TOR\d{0,3}", re.I)
# TorchFix leaves these families off unless selected (its DISABLED_BY_DEFAULT).
TORCHFIX_OFF_BY_DEFAULT = ("TOR3", "TOR4", "TOR9")


@dataclass(frozen=True)
class TorchFixCode:
    code: str
    checks: str  # what TorchFix reports, in our words
    rules: tuple[str, ...]  # our rules that cover it; empty: not covered
    note: str = ""  # what differs, or why it is not covered
    scope: tuple[tuple[str, str], ...] = ()  # (rule, option): on when this code is selected, TorchFix's wider scope


TORCHFIX_CODES: tuple[TorchFixCode, ...] = (
    TorchFixCode("TOR001", "call of a function PyTorch removed (torch.solve, torch.symeig)", ("TR810",),
                 "TR810 also covers torch.eig, torch.lstsq and torch.matrix_rank"),
    TorchFixCode("TOR002", "assignment to `require_grad` (a typo of `requires_grad`)", ("TR514",)),
    TorchFixCode("TOR003", "torch.utils.checkpoint without an explicit use_reentrant", ("TR812",)),
    TorchFixCode("TOR004", "import of a function PyTorch removed", ("TR810",)),
    TorchFixCode("TOR101", "call of a deprecated torch function (torch.qr, chain_matmul, cholesky, range, "
                 "weight_norm, sdp_kernel, torch.cuda/cpu.amp, functorch, _register_pytree_node...)",
                 ("TR811", "TR801"),
                 "torch.cuda.amp / torch.cpu.amp are TR801; the rest TR811, which rewrites a call only where the "
                 "new spelling gives the same results"),
    TorchFixCode("TOR102", "torch.load without a weights_only argument", ("TR601",),
                 "TR601 also reports weights_only=False and stays quiet for a checkpoint the same program "
                 "wrote (TorchFix accepts any explicit weights_only)"),
    TorchFixCode("TOR103", "import of a deprecated torch function", ("TR811", "TR801"),
                 "TR811 reports the import without rewriting it; calls through the name are reported too"),
    TorchFixCode("TOR104", "call of a private torch function that has a public alias "
                 "(torch.utils.data._utils.collate.default_collate / default_convert)", ("TR813",),
                 "by default a bare call through a name imported from the private module is reported once, at the "
                 "import; selected as TOR104, each call is reported too",
                 scope=(("TR813", "each-call"),)),
    TorchFixCode("TOR105", "import of such a private function", ("TR813",)),
    TorchFixCode("TOR106", "torch.log(1 + x) instead of torch.log1p(x)", ("TR414",),
                 "by default TR414 reports it only in files that compute in half precision, where the precision loss "
                 "is real; selected as TOR106, in any precision", scope=(("TR414", "any-precision"),)),
    TorchFixCode("TOR107", "torch.exp(x) - 1 instead of torch.expm1(x)", ("TR414",),
                 "as TOR106: by default only in half-precision files; selected as TOR107, in any precision",
                 scope=(("TR414", "any-precision"),)),
    TorchFixCode("TOR108", "log(sum(exp(x))) instead of torch.logsumexp", ("TR412",)),
    TorchFixCode("TOR201", "torchvision model builder called with pretrained= / pretrained_backbone=", ("TR814",)),
    TorchFixCode("TOR202", "torchvision.transforms.v2.ToTensor (deprecated in favour of ToImage + ToDtype)", ("TR811",),
                 "reported without a fix (the replacement is a two-step pipeline)"),
    TorchFixCode("TOR203", "`import torchvision.models as models` instead of `from torchvision import models`",
                 ("TR823",), "TR823 runs only when selected (a style preference with no effect on behaviour)"),
    TorchFixCode("TOR401", "DataLoader without num_workers (loading in the training process)", ("TR702",),
                 "by default TR702 reports only training loaders (shuffle=True or a train* name) in files that train "
                 "on CUDA, where the idle GPU is a real cost; selected as TOR401, every DataLoader",
                 scope=(("TR702", "every-loader"),)),
    TorchFixCode("TOR402", "zero_grad(set_to_none=False)", ("TR729",),
                 "TR729 runs only when selected (set_to_none=False is sometimes deliberate)"),
    TorchFixCode("TOR901", "torch.library.Library instead of _scoped_library in pytorch/pytorch's own tests",
                 ("TR903",), "TR903 runs only when selected (a convention of the pytorch/pytorch repository)"),
)

_BY_CODE = {entry.code: entry for entry in TORCHFIX_CODES}


def is_torchfix_selector(selector: str) -> bool:
    return bool(TORCHFIX_SELECTOR.fullmatch(selector.strip()))


def torchfix_codes_named(selector: str) -> list[TorchFixCode]:
    """The TorchFix codes a selector names: the code itself, or every code it is a prefix of."""
    prefix = selector.strip().upper()
    if not is_torchfix_selector(prefix):
        return []
    return [entry for entry in TORCHFIX_CODES if entry.code.startswith(prefix)]


def rules_for_torchfix(selector: str) -> tuple[str, ...]:
    """Our rule ids covering every TorchFix code the selector names, in catalog order of first mention."""
    found: dict[str, None] = {}
    for entry in torchfix_codes_named(selector):
        found.update(dict.fromkeys(entry.rules))
    return tuple(found)


def torchfix_selector_problem(selector: str, selecting: bool) -> Optional[str]:
    """Why a TorchFix selector cannot be used, or None. Ignoring a code we do not cover is harmless;
    selecting only such codes would select nothing, which is an error, not a silent no-op."""
    named = torchfix_codes_named(selector)
    if not named:
        return f"{selector!r} names no TorchFix code (known: {', '.join(_BY_CODE)})"
    if selecting and not rules_for_torchfix(selector):
        reasons = "; ".join(f"{e.code}: {e.note}" for e in named)
        return f"{selector!r} has no torchreview equivalent ({reasons})"
    return None


def torchfix_entry(code: str) -> Optional[TorchFixCode]:
    return _BY_CODE.get(code.strip().upper())


def torchfix_codes_for(rule_id: str, option: Optional[str] = None) -> list[TorchFixCode]:
    """The codes a rule covers, or (with ``option``) the codes whose selection turns that option on."""
    if option is None:
        return [e for e in TORCHFIX_CODES if rule_id in e.rules]
    return [e for e in TORCHFIX_CODES if (rule_id, option) in e.scope]


def torchfix_scopes(select: Iterable[str], ignore: Iterable[str] = ()) -> dict[str, frozenset[str]]:
    """Rule id -> the options TorchFix's scope turns on, for the TorchFix codes selected and not ignored
    (``select: [TOR4]`` widens TR702; ``ignore: [TOR401]`` beside it takes that back)."""
    def named(selectors: Iterable[str]) -> set[str]:
        return {e.code for s in selectors for e in torchfix_codes_named(s)}

    options: dict[str, set[str]] = {}
    for code in named(select) - named(ignore):
        for rule_id, option in _BY_CODE[code].scope:
            options.setdefault(rule_id, set()).add(option)
    return {rule_id: frozenset(found) for rule_id, found in options.items()}
