"""Every file the repository's text points at exists: the relative links of its markdown, and every
benchmarks/results/NAME named anywhere (results are pruned to the latest of each suite; a figure's evidence must
not be pruned from under the sentence that quotes it). A pruned result is cited from git history as
`git show REV:benchmarks/results/NAME`: that file must exist at REV."""

import functools
import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LINK = re.compile(r"\]\(([^)\s]+)\)")
RESULT = re.compile(r"(?<!:)benchmarks/results/([\w.\-]+\w)")     # REV:benchmarks/results/NAME is IN_GIT's
IN_GIT = re.compile(r"\b([0-9a-f]{7,40}):(benchmarks/results/[\w.\-]+\w)")


@functools.cache
def _shallow() -> bool:
    """A shallow clone lacks the commits that pruned results are cited at: those citations cannot be checked."""
    out = subprocess.run(["git", "rev-parse", "--is-shallow-repository"], cwd=ROOT, capture_output=True, text=True)
    return out.stdout.strip() != "false"


def _in_git(rev: str, path: str) -> bool:
    return _shallow() or subprocess.run(["git", "cat-file", "-e", f"{rev}:{path}"], cwd=ROOT,
                                        capture_output=True).returncode == 0


def _texts() -> list[Path]:
    """The repository's text files, tracked or new, that point at others."""
    listed = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "README.md", "docs", "benchmarks", "src",
                             "scripts", "tests", "examples"], cwd=ROOT, capture_output=True, text=True, check=True)
    return [ROOT / p for p in listed.stdout.split()
            if p.endswith((".md", ".py", ".cpp", ".cu", ".cuh", ".txt")) or p.startswith("scripts/")]


def _broken(path: Path, root: Path = ROOT) -> list[str]:
    text = path.read_text(errors="replace")
    out = []
    if path.suffix == ".md":
        for target in LINK.findall(re.sub(r"`[^`\n]*`", "", text)):   # code spans hold no links
            if re.match(r"^[a-z]+:", target) or target.startswith("#"):
                continue   # a URL, or an anchor in the same page
            if not (path.parent / target.split("#")[0]).exists():
                out.append(f"{path.relative_to(root)}: ]({target})")
    for name in RESULT.findall(text):
        if not (root / "benchmarks" / "results" / name).exists():
            out.append(f"{path.relative_to(root)}: benchmarks/results/{name}")
    for rev, name in IN_GIT.findall(text):
        if not _in_git(rev, name):
            out.append(f"{path.relative_to(root)}: {rev}:{name}")
    return out


def test_every_link_and_every_results_file_named_exists():
    texts = _texts()
    assert len(texts) > 50 and any(p.name == "README.md" for p in texts)
    broken = [b for p in texts if p.exists() and p != Path(__file__) for b in _broken(p)]
    assert not broken, "\n".join(broken)


def test_the_check_finds_a_broken_link(tmp_path):
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                          check=True).stdout.strip()
    (tmp_path / "benchmarks" / "results").mkdir(parents=True)
    (tmp_path / "benchmarks" / "results" / "h100x2-distributed.md").write_text("")
    (tmp_path / "docs").mkdir()
    page = tmp_path / "docs" / "page.md"
    page.write_text("[gone](missing.md) [here](page.md) [web](https://example.com) [anchor](#top) `k[grid](...)`\n"
                    "see benchmarks/results/no-such-run.json and benchmarks/results/h100x2-distributed.md.\n"
                    f"in git: `git show {head}:benchmarks/results/h100.md`, "
                    "`git show 0000000:benchmarks/results/a.json`\n")
    assert _broken(page, tmp_path) == ["docs/page.md: ](missing.md)",
                                       "docs/page.md: benchmarks/results/no-such-run.json",
                                       *([] if _shallow() else ["docs/page.md: 0000000:benchmarks/results/a.json"])]


def test_the_readme_is_read_in_minutes():
    # issue 38's bound: what it is, the two commands, three short examples, one table, links; the rest in docs/
    assert (ROOT / "README.md").stat().st_size <= 12_000
