"""The engine over generated programs: every rule's own examples and the project's example scripts, as they are and
mutated the way real code rebinds its values (bench/robustness.py: ``x = x.to(d)``, ``x = f(x)``,
``self.m = self.m.cuda()``, cycles through tuples and attributes, statements shuffled, duplicated and deleted).
Each program is analyzed with every rule in a child with a per-file limit: no hang, no crash, no rule error."""
from __future__ import annotations

import importlib.util
import textwrap
from pathlib import Path

from analyzers.rules import all_rules

ROOT = Path(__file__).resolve().parents[1]
LIMIT = 60.0  # seconds: programs take milliseconds; only a hang (or a machine under heavy load) comes near it


def _robustness():
    spec = importlib.util.spec_from_file_location("bench_robustness", ROOT / "bench" / "robustness.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _sources() -> dict[str, str]:
    sources = {}
    for rule in all_rules():
        for i, example in enumerate([*rule.VALID, *rule.INVALID]):
            sources[f"{rule.id}-{i}"] = textwrap.dedent(example if isinstance(example, str) else example.code)
    for path in [*sorted((ROOT / "examples").glob("*.py")), *sorted((ROOT / "tests" / "fixtures" / "models").glob("*.py"))]:
        sources[path.relative_to(ROOT).as_posix()] = path.read_text(encoding="utf-8")
    return sources


def test_generated_programs_neither_hang_nor_break_the_analysis():
    robustness = _robustness()
    sources = _sources()
    programs = robustness.programs(sources, mutants=2, seed=30)
    assert len(programs) > 2 * len(sources)  # the mutants were made (an example that does not parse has none)
    results = robustness.analyze_all(programs, LIMIT, jobs=2)
    assert len(results) == len(programs)
    assert robustness.problems(results) == {}


def test_the_mutants_rebind_values_from_themselves():
    """The generator does what it claims: valid Python that rebinds names from themselves and around cycles."""
    import ast
    import random

    robustness = _robustness()
    source = "import torch\nmodel = Net()\nopt = make(model)\nfor x in data:\n    y = model(x)\n"
    mutants = [robustness.mutate(source, random.Random(seed), edits=12) for seed in range(20)]
    texts = "\n".join(m for m in mutants if m is not None)
    for mutant in filter(None, mutants):
        ast.parse(mutant)
    assert "model = model.to(device)" in texts or "model = model.cuda()" in texts
    assert any(f"{a}, {b} = ({b}, {a})" in texts for a in ("model", "opt", "y") for b in ("model", "opt", "y") if a != b)
