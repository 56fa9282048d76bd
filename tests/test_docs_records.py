"""Every figure's provenance in README.md and docs/ can be followed: each record a page links
or quotes (``docs/results/...json``, a run folder, a ``comparison.txt``) exists, and each
``metarl ...`` command a page quotes names a verb of today's command line and only flags that
verb accepts. The commands are checked against the parser :func:`metarl.cli.build_parser`
builds, so a verb or flag added or removed there is seen here without a list to keep. Each
``metarl compare ... --out docs/results/...`` command an evidence page gives writes the
``comparison.txt`` committed there, and every committed one has such a command: they read
records only, so they are run here (about half a second each).

The front door lists what is in the box: README.md names every registered algorithm,
objective and run kind; docs/index.md links every evidence page; mkdocs.yml's nav lists
every page of the site.

Each checker is also run on planted mistakes (a missing record, an unknown verb, a flag the
verb does not take), so that a checker which finds nothing is not mistaken for clean docs.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import re
import shlex
from pathlib import Path

import pytest

from metarl.cli import build_parser
from metarl.evolve.compare import between_runs, compare_runs, format_comparison, pooled_verdicts

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCS = ROOT / "docs"
RESULTS = DOCS / "results"
PAGES = [README, *sorted(DOCS.rglob("*.md"))]
# the pages that report measured results, whose commands must name real scripts and files
RESULT_PAGES = [README, DOCS / "index.md", *sorted((DOCS / "evidence").glob("*.md")),
                DOCS / "benchmarks.md", DOCS / "gpu.md", DOCS / "rejax.md"]

FENCE = re.compile(r"^(```|~~~)[^\n]*\n(.*?)^\1[^\n]*$", re.MULTILINE | re.DOTALL)
INLINE_CODE = re.compile(r"`([^`\n]+)`")
LINK = re.compile(r"\[[^\]\n]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
# a path to a record: something/…/name.json (.jsonl, .txt, .png, .csv), or a folder under
# docs/results/
RECORD = re.compile(r"^[\w.{},*/-]*/[\w.{},*-]+\.(?:json|jsonl|txt|png|csv)$"
                    r"|^docs/results/[\w.{},*/-]+$")
BRACES = re.compile(r"\{([^{}]*)\}")
# what separates one shell command from the next on a line
SEPARATORS = re.compile(r"\s&&\s|\s\|\|\s|;|\s\|\s|\bdo\b|\bthen\b")


def _expand(pattern: str) -> list[str]:
    """Shell brace expansion: ``a/{x,y}/b`` -> ``["a/x/b", "a/y/b"]``."""
    match = BRACES.search(pattern)
    if match is None or "," not in match.group(1):
        return [pattern]
    head, tail = pattern[:match.start()], pattern[match.end():]
    return [path for part in match.group(1).split(",") for path in _expand(head + part + tail)]


def _exists(candidate: str, page: Path) -> bool:
    """Whether ``candidate`` (a glob pattern allowed) names a file or folder from the
    repository root, the page's folder or ``docs/results``."""
    path = candidate.split("#", 1)[0]
    for base in (ROOT, page.parent, RESULTS):
        if any(True for _ in base.glob(path)) if "*" in path else (base / path).exists():
            return True
    return False


def record_problems(text: str, page: Path) -> list[str]:
    """The records ``text`` (the markdown of ``page``) links or quotes in code that do not
    exist. Links to pages and anchors are the site build's to check; commands' outputs
    (``--out``, ``--run-dir``, ``runs/...``) are made by the command, so only paths to
    records that are kept count: every file a link names, and quoted paths under
    ``docs/results`` (written from the repository's root or from ``docs/results``), to an
    evaluation record or to a comparison."""
    problems = []
    for target in LINK.findall(text):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.IGNORECASE) or target.startswith("#"):
            continue
        path = target.split("#", 1)[0]
        if RECORD.match(path) and not path.endswith(".md"):
            if not all(_exists(p, page) for p in _expand(path)):
                problems.append(f"link to a missing record: {target}")
    # a link's text names what its (checked) target is, perhaps relative to something else
    for span in INLINE_CODE.findall(LINK.sub("link", FENCE.sub("", text))):
        span = span.strip()
        if " " in span or not RECORD.match(span) or span.startswith(("runs/", "/")):
            continue
        first = span.split("/", 1)[0]
        if not (span.startswith("docs/results/") or "evaluations/" in span
                or "comparison." in span
                or any((RESULTS / name).exists() for name in _expand(first))):
            continue  # a path a command writes (`check/check.json`), not a kept record
        for path in _expand(span):
            if not _exists(path, page):
                problems.append(f"quoted record that does not exist: {path}")
    return problems


def _commands(text: str) -> list[tuple[str, bool]]:
    """Every ``metarl ...`` command of ``text``, with whether it is a whole command: the
    lines of its code blocks (continuation lines joined, comments dropped, one per shell
    command of a line) are; its inline code (``metarl evaluate --tune`` in a sentence) names
    a verb and flags but need not be whole."""
    found = []
    for block in FENCE.finditer(text):
        lines = block.group(2).replace("\\\n", " ").splitlines()
        for line in lines:
            line = re.sub(r"(^|\s)#.*$", "", line)
            found += [(part.strip(), True) for part in SEPARATORS.split(line)]
    found += [(span.strip(), False) for span in INLINE_CODE.findall(FENCE.sub("", text))]
    return [(command, whole) for command, whole in found
            if re.match(r"^(python3? -m )?metarl\s", command)]


def _subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    [action] = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return dict(action.choices)


def command_problems(command: str, parser: argparse.ArgumentParser,
                     whole: bool = True) -> list[str]:
    """What is wrong with one quoted ``metarl ...`` command (or a synopsis such as
    ``metarl resume RUN_DIR [--generations N]``) against ``parser``: an unknown verb, a flag
    the verb does not take, or, for a ``whole`` command with no placeholders, anything the
    parser itself refuses."""
    try:
        tokens = shlex.split(command)
    except ValueError:  # an unbalanced quote: a synopsis or a fragment of prose
        tokens = command.split()
    if tokens[:2] in (["python", "-m"], ["python3", "-m"]):
        tokens = tokens[2:]
    tokens = tokens[1:]  # "metarl"
    verbs = _subcommands(parser)
    index = 0
    while index < len(tokens):  # the global options before the verb
        action = parser._option_string_actions.get(tokens[index].split("=", 1)[0])
        if action is None:
            break
        index += 1 if action.nargs == 0 or "=" in tokens[index] else 2
    if index >= len(tokens):
        return [] if not whole else [f"{command}: no verb"]
    verb = tokens[index]
    if verb in ("...", "…") or verb.isupper():
        return []  # a placeholder for any verb: "metarl --distributed ARGS"
    alternatives = verb.split("|")  # a synopsis such as "metarl run|resume ... --time-limit"
    unknown = [name for name in alternatives if name not in verbs]
    if unknown:
        return [f"{command}: unknown verb {unknown[0]!r}; the verbs: {', '.join(verbs)}"]
    flags = re.findall(r"(?<![\w-])(--[a-z][\w-]*)", " ".join(tokens[index + 1:]))
    problems = [f"{command}: {name} takes no flag {flag}" for name in alternatives
                for flag in flags if flag not in verbs[name]._option_string_actions]
    synopsis = any(mark in command for mark in ("[", "...", "|", "…")) or any(
        token.isupper() and len(token) > 1 for token in tokens)
    if whole and not problems and not synopsis:
        stderr = io.StringIO()
        try:
            with contextlib.redirect_stderr(stderr):
                parser.parse_args(tokens)
        except SystemExit:
            problems.append(f"{command}: {stderr.getvalue().strip().splitlines()[-1]}")
    return problems


def _script_problems(text: str) -> list[str]:
    """``python path/to/script.py`` and ``metarl run path.toml`` name files that exist."""
    problems = []
    for path in re.findall(r"python3? ((?:benchmarks|experiments|notebooks)/[\w/.-]+\.py)",
                           text):
        if not (ROOT / path).is_file():
            problems.append(f"script that does not exist: {path}")
    for path in re.findall(r"metarl(?: --[\w-]+(?: \d+)?)* run (experiments/[\w/.-]+\.toml)",
                           text):
        if not (ROOT / path).is_file():
            problems.append(f"experiment file that does not exist: {path}")
    return problems


@pytest.fixture(scope="module")
def parser():
    return build_parser()


@pytest.mark.parametrize("page", PAGES, ids=lambda page: str(page.relative_to(ROOT)))
def test_every_record_a_page_links_or_quotes_exists(page):
    text = page.read_text(encoding="utf-8")
    problems = record_problems(text, page)
    if page in RESULT_PAGES:  # the guides' commands may name placeholder files
        problems += _script_problems(text)
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("page", PAGES, ids=lambda page: str(page.relative_to(ROOT)))
def test_every_quoted_command_names_a_verb_and_flags_the_cli_has(page, parser):
    problems = [problem for command, whole in _commands(page.read_text(encoding="utf-8"))
                for problem in command_problems(command, parser, whole)]
    assert not problems, "\n".join(problems)


def test_the_checkers_catch_planted_mistakes(parser):
    page = DOCS / "evidence" / "planted.md"
    text = ("Record: [`missing.json`](../results/lpo_cpu/evaluations/99.json), "
            "`docs/results/lpo_cpu/evaluations/1.json` and "
            "`lpo_cpu_seeds/lpo_s{1,7}/evaluations/1.json`.\n\n"
            "```bash\nmetarl evaluate docs/results/lpo_cpu --seeds 16 --tune-by iqm "
            "--no-such-flag 3   # planted\nmetarl evolve experiments/lpo_cpu.toml\n"
            "for s in 0 1; do metarl compare runs/a runs/b --evaluation 2 --out x; done\n"
            "metarl compare runs/a --which best\nmetarl evaluate runs/x --which worst\n```\n"
            "and `metarl run experiments/none.toml` inline, `metarl evaluate --tune`, "
            "`metarl --distributed ARGS`.\n")
    assert record_problems(text, page) == [
        "link to a missing record: ../results/lpo_cpu/evaluations/99.json",
        "quoted record that does not exist: lpo_cpu_seeds/lpo_s7/evaluations/1.json"]
    assert _script_problems(text) == [
        "experiment file that does not exist: experiments/none.toml"]
    problems = [p for c, whole in _commands(text) for p in command_problems(c, parser, whole)]
    assert len(problems) == 4, problems
    assert "takes no flag --no-such-flag" in problems[0]
    assert "unknown verb 'evolve'" in problems[1]
    assert "compare takes no flag --which" in problems[2]
    assert "invalid choice: 'worst'" in problems[3]
    # the same commands written correctly pass
    for command in ("metarl evaluate docs/results/lpo_cpu --seeds 16 --tune-by iqm",
                    "metarl --cpu-devices 2 run experiments/lpo_cpu.toml --set es.rungs=1",
                    "metarl resume RUN_DIR [--generations N] [--track ...]"):
        assert command_problems(command, parser) == [], command


def _compare_commands() -> list[tuple[Path, list[str]]]:
    """Every ``metarl compare ... --out docs/results/...`` command of the evidence pages, as
    its page and its arguments after the verb (braces expanded as a shell would)."""
    found = []
    for page in RESULT_PAGES:
        for command, whole in _commands(page.read_text(encoding="utf-8")):
            tokens = shlex.split(command)
            if whole and tokens[1:2] == ["compare"] and "--out" in tokens:
                out = tokens[tokens.index("--out") + 1]
                if out.startswith("docs/results/"):
                    found.append((page, [p for token in tokens[2:] for p in _expand(token)]))
    return found


COMPARE_COMMANDS = _compare_commands()


def test_every_committed_comparison_has_the_command_that_writes_it():
    written = {str(Path(args[args.index("--out") + 1]) / "comparison.txt")
               for _, args in COMPARE_COMMANDS}
    committed = {str(path.relative_to(ROOT)) for path in RESULTS.rglob("comparison.txt")}
    assert committed <= written, ("no page gives the metarl compare command of "
                                  f"{sorted(committed - written)}")


@pytest.mark.parametrize("page, args", COMPARE_COMMANDS,
                         ids=[args[args.index("--out") + 1] for _, args in COMPARE_COMMANDS])
def test_a_pages_compare_command_reproduces_its_committed_table(page, args, parser,
                                                                monkeypatch):
    monkeypatch.chdir(ROOT)  # the commands name paths from the repository's root
    options = parser.parse_args(["compare", *args])
    comparison = compare_runs(options.run_dirs, options.evaluation)
    table = format_comparison(comparison, pooled_verdicts(comparison), between_runs(comparison))
    committed = (ROOT / options.out / "comparison.txt").read_text(encoding="utf-8")
    assert table + "\n" == committed, f"{page.name}: metarl compare {' '.join(args)}"


def _readme_box() -> str:
    text = README.read_text(encoding="utf-8")
    start = text.index("## What is in the box")
    return text[start:text.index("\n## ", start + 1)]


def test_the_readme_box_lists_every_algorithm_objective_and_run_kind():
    from inner_loops.registry import available_algorithms
    from metarl.kinds import KINDS
    from metarl.objectives import available_objectives, get_objective

    box = _readme_box()
    named = set(re.findall(r"`([\w-]+)`", box))
    missing = {f"algorithm {n}" for n in available_algorithms() if n not in named}
    # only the toolkit's own objectives: tests sharing this worker process register more
    toolkit = [n for n in available_objectives()
               if get_objective(n).factory.__module__.startswith(("metarl.", "inner_loops."))]
    missing |= {f"objective {n}" for n in toolkit if n not in named}
    missing |= {f"run kind {n}" for n in KINDS if n not in named}
    assert not missing, "README.md's 'What is in the box' does not name: " + ", ".join(
        sorted(missing))


def test_the_home_page_layout_names_every_module_of_the_evolve_package():
    text = (DOCS / "index.md").read_text(encoding="utf-8")
    start = text.index("## Layout")
    layout = text[start:].split("\n## ", 1)[0]  # the page's last section
    evolve = layout[layout.index("evolve/"):]
    evolve = evolve[:evolve.index("population/")]
    modules = sorted(p.stem for p in (ROOT / "metarl" / "evolve").glob("*.py")
                     if p.stem != "__init__")
    missing = [m for m in modules if not re.search(rf"\b{m}\b", evolve)]
    assert not missing, f"docs/index.md's layout does not name metarl/evolve/{missing}"


def test_the_home_page_links_every_evidence_page_and_the_nav_lists_every_page():
    index = (DOCS / "index.md").read_text(encoding="utf-8")
    unlinked = [p.name for p in sorted((DOCS / "evidence").glob("*.md"))
                if f"evidence/{p.name}" not in index]
    assert not unlinked, f"docs/index.md links no {unlinked}"
    nav = (ROOT / "mkdocs.yml").read_text(encoding="utf-8")
    nav = nav[nav.index("\nnav:"):]
    pages = sorted(str(p.relative_to(DOCS)) for p in DOCS.rglob("*.md"))
    missing = [p for p in pages if not re.search(rf"[\s:]{re.escape(p)}\s*$", nav, re.M)]
    assert not missing, f"mkdocs.yml's nav lists no {missing}"


def test_the_remade_cartpole_searches_are_the_first_ones_bit_for_bit():
    """The engines page judges again six CartPole searches made anew (their first run
    directories were not kept): the same command gave every search the same held-out
    returns, so the evaluations judge the searches the first record describes."""
    first, remade = (json.loads((RESULTS / "engines" / name).read_text())
                     for name in ("cartpole.json", "cartpole_remade.json"))
    assert first["tasks"].keys() == remade["tasks"].keys() == {"cartpole_value",
                                                                "cartpole_drift"}
    for task, section in first["tasks"].items():
        for engine, runs in section["engines"].items():
            again = remade["tasks"][task]["engines"][engine]["runs"]
            assert [run["meta_seed"] for run in runs["runs"]] == [r["meta_seed"] for r in again]
            for run, run_again in zip(runs["runs"], again, strict=True):
                assert run["held_out"]["returns"] == run_again["held_out"]["returns"]
                assert run["agent_steps"] == run_again["agent_steps"]
