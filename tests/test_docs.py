"""The docs stay true: generated pages are current, every config key is documented, README commands run,
links resolve, and the editor snippets start the language server in the editor installed here."""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
GENERATOR = ROOT / "scripts" / "gen_docs.py"
# CI runs these two itself (.ci/run); they take minutes
QUICK_START = {"bash scripts/demo.sh", "bash scripts/test.sh"}
SKIP_MARK = re.compile(r"<!-- readme-test: skip \(([^)]+)\) -->\s*$")


def _env() -> dict:
    bin_dir = str(Path(sys.executable).parent)
    return {**os.environ, "PYTHONPATH": str(ROOT), "PATH": bin_dir + os.pathsep + os.environ.get("PATH", "")}


def _generate(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(GENERATOR), *args], cwd=ROOT, env=_env(), capture_output=True,
                          text=True, timeout=300)


def test_generated_pages_are_current():
    proc = _generate("--check")
    assert proc.returncode == 0, proc.stderr


def test_the_check_names_a_stale_a_missing_and_an_extra_page(tmp_path):
    out = tmp_path / "rules"
    assert _generate("--out", str(out)).returncode == 0
    assert _generate("--check", "--out", str(out)).returncode == 0
    (out / "TR601.md").write_text((out / "TR601.md").read_text() + "\nedited by hand\n")
    (out / "TR101.md").unlink()
    (out / "TR999.md").write_text("# a rule that does not exist\n")
    proc = _generate("--check", "--out", str(out))
    assert proc.returncode == 1
    assert "TR601.md: stale" in proc.stderr and "TR101.md: missing" in proc.stderr
    assert "TR999.md: no such rule" in proc.stderr
    assert _generate("--out", str(out)).returncode == 0  # regenerating repairs all three
    assert not (out / "TR999.md").exists()
    assert _generate("--check", "--out", str(out)).returncode == 0


def test_every_rule_page_carries_its_examples():
    from analyzers.rules import all_rules

    for rule in all_rules():
        page = (ROOT / "docs" / "rules" / f"{rule.id}.md").read_text(encoding="utf-8")
        assert page.startswith("<!-- generated") and f"# {rule.id} {rule.slug}" in page
        assert f"| default severity | {rule.severity.label} |" in page
        if rule.INVALID:
            assert "## Reported" in page, rule.id


def test_configuration_page_names_every_key_of_the_schema():
    from analyzers import config

    page = (ROOT / "docs" / "configuration.md").read_text(encoding="utf-8")
    runner = (ROOT / "docs" / "runner.md").read_text(encoding="utf-8")
    documented_here = [*config._TOP_KEYS, *config._SKIP_KEYS, *config.SMOKE_DEFAULTS, *config._REGRESSION_KEYS]
    missing = [key for key in documented_here if not re.search(rf"(^|[\s`\[{{]){key}( =|:|`)", page, re.M)]
    assert not missing, f"docs/configuration.md does not document {missing}"
    # smoke target and step tables are documented with the runner
    tables = [*config._TARGET_KEYS, *config._STEP_KEYS, *config._INPUT_KEYS, *config._OUTPUT_KEYS]
    missing = [key for key in tables if f"`{key}`" not in runner and f"{key}:" not in runner + page]
    assert not missing, f"docs/runner.md does not document the smoke keys {missing}"


def _bash_blocks(text: str) -> list[tuple[str, str | None]]:
    """Each ```bash block of a Markdown text, with the reason it is not run when a skip mark precedes it."""
    blocks = []
    for match in re.finditer(r"```bash\n(.*?)```", text, re.S):
        before = text[: match.start()].rstrip("\n").splitlines()
        mark = SKIP_MARK.search(before[-1]) if before else None
        blocks.append((match.group(1), mark.group(1) if mark else None))
    return blocks


def test_readme_is_short_and_keeps_the_quick_start():
    text = README.read_text(encoding="utf-8")
    assert len(text.splitlines()) <= 250
    assert {code.strip() for code, _ in _bash_blocks(text)} >= QUICK_START


def test_readme_command_blocks_run(tmp_path):
    ran = 0
    for code, skipped in _bash_blocks(README.read_text(encoding="utf-8")):
        if code.strip() in QUICK_START or skipped:
            continue
        proc = subprocess.run(["bash", "-euo", "pipefail", "-c", code], cwd=ROOT, env=_env(), capture_output=True,
                              text=True, timeout=300)
        assert proc.returncode == 0, f"README block failed:\n{code}\n{proc.stdout[-2000:]}{proc.stderr[-2000:]}"
        ran += 1
    assert ran >= 1


def test_a_failing_readme_block_is_noticed():
    blocks = _bash_blocks("```bash\ntorchreview rule TR000\n```\n<!-- readme-test: skip (slow) -->\n```bash\nx\n```\n")
    assert blocks == [("torchreview rule TR000\n", None), ("x\n", "slow")]
    proc = subprocess.run(["bash", "-euo", "pipefail", "-c", blocks[0][0]], cwd=ROOT, env=_env(),
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0


def test_relative_links_resolve():
    broken = []
    for page in [README, *sorted((ROOT / "docs").rglob("*.md")), ROOT / "CHANGELOG.md", ROOT / "CONTRIBUTING.md"]:
        text = re.sub(r"```.*?```", "", page.read_text(encoding="utf-8"), flags=re.S)
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            if re.match(r"[a-z]+:", target):
                continue
            file, _, anchor = target.partition("#")
            path = (page.parent / file).resolve() if file else page
            if not path.exists():
                broken.append(f"{page.relative_to(ROOT)}: {target}")
            elif anchor and path.suffix == ".md" and anchor not in _anchors(path):
                broken.append(f"{page.relative_to(ROOT)}: {target} (no such heading)")
    assert not broken


def _anchors(page: Path) -> set[str]:
    """GitHub's heading anchors: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"```.*?```", "", page.read_text(encoding="utf-8"), flags=re.S)
    return {re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
            for heading in re.findall(r"^#+ (.+)$", text, re.M)}


def _lua_blocks() -> list[str]:
    return re.findall(r"```lua\n(.*?)```", (ROOT / "docs" / "editors.md").read_text(encoding="utf-8"), re.S)


NVIM = shutil.which("nvim")
needs_nvim = pytest.mark.skipif(NVIM is None, reason="nvim is not installed (apt-get install neovim)")


def _nvim_version() -> tuple[int, int]:
    first = subprocess.run([NVIM, "--version"], capture_output=True, text=True, timeout=30).stdout.splitlines()[0]
    major, minor = re.search(r"v(\d+)\.(\d+)", first).groups()
    return int(major), int(minor)


def test_the_readme_snippet_is_the_tested_one():
    readme = re.findall(r"```lua\n(.*?)```", README.read_text(encoding="utf-8"), re.S)
    assert readme == [_lua_blocks()[0]]


@needs_nvim
def test_every_neovim_snippet_parses(tmp_path):
    for number, block in enumerate(_lua_blocks()):
        snippet = tmp_path / f"snippet{number}.lua"
        snippet.write_text(block)
        check = f"lua local f, e = loadfile('{snippet}'); if not f then io.stderr:write(e); vim.cmd('cquit 1') end"
        proc = subprocess.run([NVIM, "--headless", "--clean", "-c", check, "-c", "qa!"], capture_output=True,
                              text=True, timeout=60)
        assert proc.returncode == 0, f"{block}\n{proc.stderr}"


@needs_nvim
def test_the_neovim_snippet_for_this_version_shows_a_finding(tmp_path):
    blocks = _lua_blocks()
    version = _nvim_version()
    # the page's order: 0.8+ (vim.lsp.start), 0.7 (start_client); lspconfig and 0.11 need more than nvim
    snippet = blocks[0] if version >= (0, 8) else blocks[1]
    repo = tmp_path / "repo"
    repo.mkdir()
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    (repo / "train.py").write_text("import torch\n\n\ndef resume(path):\n    state = torch.load(path)\n    return state\n")
    (repo / ".torchreview.toml").write_text("select = [\"TR601\"]\n")  # a preview rule: named to run
    (tmp_path / "init.lua").write_text(snippet)
    out = tmp_path / "out.txt"
    probe = tmp_path / "probe.lua"
    probe.write_text(f"""
vim.wait(60000, function() return #vim.diagnostic.get(0) > 0 end, 200)
local lines = {{}}
for _, d in ipairs(vim.diagnostic.get(0)) do table.insert(lines, d.lnum .. ' ' .. tostring(d.code)) end
for _, c in pairs((vim.lsp.get_clients or vim.lsp.get_active_clients)()) do  -- get_clients: 0.10+
  table.insert(lines, 'root ' .. c.config.root_dir)
end
vim.fn.writefile(lines, '{out}')
vim.cmd('qa!')
""")
    subprocess.run([NVIM, "--headless", "--clean", "-u", str(tmp_path / "init.lua"), "-c", "filetype on",
                    "train.py", "-c", f"luafile {probe}"], cwd=repo, env=_env(), timeout=120, check=True,
                   capture_output=True)
    lines = out.read_text().splitlines()
    assert "4 TR601" in lines, lines
    assert f"root {repo}" in lines
