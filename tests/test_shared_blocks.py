"""The `# TRY NOT TO MODIFY` blocks are word for word the same in every top-level script.

A block runs from its marker line to the next `# TRY NOT TO MODIFY:`, `# ALGO LOGIC:` or `# ENGINEERING:` marker, or to
the first line indented less than the marker, whichever comes first; trailing blank lines are not part of it."""

import glob
import os
import re

import pytest
from conftest import ROOT

MARKER = re.compile(r"^(\s*)# (TRY NOT TO MODIFY|ALGO LOGIC|ENGINEERING): (.*)$")
SCRIPTS = sorted(
    os.path.basename(path) for pattern in ("ppo_*.py", "ppg_*.py") for path in glob.glob(os.path.join(ROOT, pattern))
)


def shared_blocks(source: str) -> dict[str, str]:
    """Every `# TRY NOT TO MODIFY: <name>` block of a script's source, as name -> text."""
    lines, blocks = source.splitlines(), {}
    for i, line in enumerate(lines):
        match = MARKER.match(line)
        if not match or match.group(2) != "TRY NOT TO MODIFY":
            continue
        indent, body = len(match.group(1)), [line]
        for following in lines[i + 1 :]:
            stripped = following.strip()
            if MARKER.match(following) or (stripped and len(following) - len(following.lstrip()) < indent):
                break
            body.append(following)
        while body and not body[-1].strip():
            body.pop()
        name = match.group(3)
        assert name not in blocks, f"two blocks named {name!r} in one script"
        blocks[name] = "\n".join(body)
    return blocks


def differences(sources: dict[str, str]) -> list[str]:
    """One line per shared block that is missing from a script or differs from the first script's copy."""
    blocks = {script: shared_blocks(source) for script, source in sources.items()}
    names = sorted({name for found in blocks.values() for name in found})
    problems = []
    for name in names:
        holders = [script for script in sources if name in blocks[script]]
        missing = [script for script in sources if name not in blocks[script]]
        if missing:
            problems.append(f"block {name!r} is in {', '.join(holders)} but not in {', '.join(missing)}")
        texts = [blocks[script][name] for script in holders]
        majority = max(texts, key=texts.count)  # name the scripts that differ from what most of them hold
        differing = [script for script in holders if blocks[script][name] != majority]
        if differing:
            agreeing = [script for script in holders if script not in differing]
            problems.append(f"block {name!r} differs in {', '.join(differing)} from {', '.join(agreeing) or 'the others'}")
    return problems


def read_sources() -> dict[str, str]:
    return {script: open(os.path.join(ROOT, script)).read() for script in SCRIPTS}


def test_every_top_level_script_is_checked():
    assert {"ppo_fsmn_cartpole.py", "ppo_atari.py", "ppo_continuous.py", "ppo_transformer_pong.py"} <= set(SCRIPTS)


def test_shared_blocks_are_identical_in_every_script():
    sources = read_sources()
    assert len(shared_blocks(sources[SCRIPTS[0]])) >= 9
    assert "the run's life around the algorithm" in shared_blocks(sources[SCRIPTS[0]])
    problems = differences(sources)
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("script", SCRIPTS)
def test_a_one_character_change_to_any_shared_block_is_caught(script):
    """Change one character in each block of one script in turn (its last character, then a space inside it):
    the check names that block and that script."""
    sources = read_sources()
    for name, text in shared_blocks(sources[script]).items():
        for position in (len(text) - 1, len(text) // 2):
            mutated = text[:position] + ("#" if text[position] != "#" else "=") + text[position + 1 :]
            changed = {**sources, script: sources[script].replace(text, mutated, 1)}
            problems = differences(changed)
            assert any(f"block {name!r}" in problem and script in problem for problem in problems), (name, problems)


def main_function(source: str) -> list[str]:
    """The lines of `def main`, from its `def` to its last line (blank lines before the next top-level line left out)."""
    lines = source.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("def main("))
    end = next(i for i in range(start + 1, len(lines)) if lines[i] and not lines[i][0].isspace())
    while not lines[end - 1].strip():
        end -= 1
    return lines[start:end]


@pytest.mark.parametrize("script", SCRIPTS)
def test_main_reads_as_the_algorithm(script):
    """`main` stays short and reaches its rollout soon, as CleanRL's does (its first env step 62 lines in): the run's
    handling is a call per moment of a run, below the banner."""
    main = main_function(read_sources()[script])
    rollout = next(i for i, line in enumerate(main) if "for step in range(args.num_steps)" in line)
    assert len(main) <= 150, len(main)
    assert rollout <= 65, rollout


@pytest.mark.parametrize("script", SCRIPTS)
def test_below_the_banner_only_the_shared_machinery_and_evaluation(script):
    """Every function and class below the `# ---` banner is in a shared block or in the evaluation block: the env,
    the network and the algorithm's functions stay above it, where a reader meets them first."""
    lines = read_sources()[script].splitlines()
    banner = next(i for i, line in enumerate(lines) if line.startswith("# ---"))
    label = None
    for line in lines[banner:]:
        match = MARKER.match(line)
        if match and not match.group(1):
            label = f"{match.group(2)}: {match.group(3)}"
        if line.startswith(("def ", "class ")):
            assert label is not None and (label.startswith("TRY NOT TO MODIFY") or label == "ENGINEERING: evaluation"), (
                line,
                label,
            )
