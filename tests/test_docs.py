"""The run's calls that CONTRIBUTING.md and README.md show a newcomer exist, as shown, in every top-level script.

Checked: every ```python block of CONTRIBUTING.md, and the code spans of both documents that show a call of the run
(`Run(...)`, `run.<method>(...)`, `with run.start(...):`, `main(...)`, `cli(...)`). Each must parse as Python (a span
ending in `:` is given a body). In it, a call of a plain name (`Run`, `main`, `cli`, `explained_variance`; builtins
aside) must name a function or class of every script, and a call of a method of the run (`run.restore(...)`, where
`run` is the name `Run(...)` is assigned to, or `run` in a span) an attribute of every script's `Run`, each with a
signature that accepts the call's arguments (`inspect.signature(...).bind`). A call whose only argument is `...`
(`run.record(...)`) elides its arguments: its name alone is checked. A starred call of a function annotated to return
a `tuple[...]` (`main(*cli())`) gives as many arguments as the tuple has items; that call passed unstarred, to a
parameter not annotated as a tuple (`main(cli())`), is refused. Calls of other objects (`optimizer.step()`) are not
checked."""

import ast
import builtins
import functools
import glob
import inspect
import os
import re
import typing

import pytest
from conftest import ROOT, import_script

SCRIPTS = sorted(
    os.path.basename(path)[: -len(".py")]
    for pattern in ("ppo_*.py", "ppg_*.py")
    for path in glob.glob(os.path.join(ROOT, pattern))
)
DOCUMENTS = ["CONTRIBUTING.md", "README.md"]

PYTHON_BLOCK = re.compile(r"^```python[ \t]*\n(.*?)^```[ \t]*$", re.MULTILINE | re.DOTALL)
FENCE = re.compile(r"^(```|~~~).*?^\1", re.MULTILINE | re.DOTALL)
CODE_SPAN = re.compile(r"(?<!`)`([^`]+)`(?!`)")
RUN_CALL = re.compile(r"^(?:with\s+)?(?:Run|run\.\w+|main|cli)\(")


def snippets(markdown: str, blocks: bool) -> list[str]:
    """The code of a Markdown text to check: its ```python blocks (where `blocks`), then the code spans outside
    fenced blocks that show a call of the run."""
    found = PYTHON_BLOCK.findall(markdown) if blocks else []
    spans = (" ".join(span.split()) for span in CODE_SPAN.findall(FENCE.sub("", markdown)))
    return found + [span for span in spans if RUN_CALL.match(span)]


@functools.cache
def script(name: str):
    return import_script(name)


def returned_tuple_size(target) -> int | None:
    """How many items a function annotated to return `tuple[A, B, ...]` returns (None: not such a function)."""
    try:
        annotation = inspect.signature(target).return_annotation
    except (TypeError, ValueError):
        return None
    items = typing.get_args(annotation)
    if typing.get_origin(annotation) is not tuple or not items or Ellipsis in items:
        return None
    return len(items)


def call_problems(code: str, module) -> list[str]:
    """What in `code` does not hold for the script `module`: a syntax error, a name or method it lacks, a call its
    signature refuses. A span ending in `:` (`with run.start(envs):`) is given a body."""
    source = code + " pass" if code.rstrip().endswith(":") else code
    try:
        tree = ast.parse(source)
    except SyntaxError as e:
        return [f"does not parse as Python ({e.msg}, line {e.lineno}): {code!r}"]
    where = f"{module.__name__}.py"
    run_names = {"run"} | {
        target.id
        for node in ast.walk(tree)
        if isinstance(node, ast.Assign)
        and isinstance(node.value, ast.Call)
        and isinstance(node.value.func, ast.Name)
        and node.value.func.id == "Run"
        for target in node.targets
        if isinstance(target, ast.Name)
    }
    problems = []
    for call in (node for node in ast.walk(tree) if isinstance(node, ast.Call)):
        func, shown = call.func, ast.unparse(call)
        if isinstance(func, ast.Name):
            if hasattr(builtins, func.id):
                continue
            if not callable(getattr(module, func.id, None)):
                problems.append(f"{shown}: {where} defines no {func.id}")
                continue
            target, bound_self, label = getattr(module, func.id), [], func.id
        elif isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) and func.value.id in run_names:
            run_class = getattr(module, "Run", None)
            if not callable(getattr(run_class, func.attr, None)):
                problems.append(f"{shown}: {where}'s Run has no method {func.attr}")
                continue
            target, bound_self, label = getattr(run_class, func.attr), [object()], f"Run.{func.attr}"
        else:
            continue
        elided = len(call.args) == 1 and isinstance(call.args[0], ast.Constant) and call.args[0].value is Ellipsis
        if elided and not call.keywords:
            continue
        args = []
        for arg in call.args:
            if isinstance(arg, ast.Starred):
                inner = arg.value
                named = isinstance(inner, ast.Call) and isinstance(inner.func, ast.Name)
                size = returned_tuple_size(getattr(module, inner.func.id, None)) if named else None
                if size is None:
                    break  # unknown arguments: the name alone is checked
                args.extend(object() for _ in range(size))
            else:
                args.append(arg)
        else:
            if any(keyword.arg is None for keyword in call.keywords):  # **kwargs: unknown
                continue
            signature = inspect.signature(target)
            try:
                bound = signature.bind(*bound_self, *args, **{k.arg: k.value for k in call.keywords})
            except TypeError as e:
                problems.append(f"{shown}: {where}'s {label}{signature} refuses it ({e})")
                continue
            for name, value in bound.arguments.items():
                given = isinstance(value, ast.Call) and isinstance(value.func, ast.Name)
                a_tuple = given and returned_tuple_size(getattr(module, value.func.id, None)) is not None
                if a_tuple and typing.get_origin(signature.parameters[name].annotation) is not tuple:
                    why = f"{where}'s {value.func.id}() returns a tuple, passed whole as {label}'s {name}: star it"
                    problems.append(f"{shown}: {why}")
    return problems


def document_problems(document: str, text: str | None = None) -> list[str]:
    """Every problem of the document's snippets (of `text` in its place, where given), in every script."""
    if text is None:
        with open(os.path.join(ROOT, document), encoding="utf-8") as f:
            text = f.read()
    problems = []
    for code in snippets(text, blocks=document == "CONTRIBUTING.md"):
        for name in SCRIPTS:
            problems.extend(f"{document}: {problem}" for problem in call_problems(code, script(name)))
    return sorted(set(problems), key=problems.index)


def test_the_snippets_are_found():
    assert {"ppo_fsmn_cartpole", "ppo_atari", "ppo_continuous", "ppo_transformer_pong", "ppg_lunarlander"} <= set(SCRIPTS)
    with open(os.path.join(ROOT, "CONTRIBUTING.md"), encoding="utf-8") as f:
        contributing = snippets(f.read(), blocks=True)
    assert any("run.record(" in code and "run.check_interrupt()" in code for code in contributing)
    assert "main(*cli())" in contributing
    with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as f:
        readme = snippets(f.read(), blocks=False)
    assert "Run(args, checkpoint)" in readme and "with run.start(envs):" in readme


@pytest.mark.parametrize("document", DOCUMENTS)
def test_every_call_of_the_run_shown_exists_in_every_script(document):
    problems = document_problems(document)
    assert not problems, "\n".join(problems)


# CONTRIBUTING.md's snippet as it stood before the calls it showed were checked (its prose line made a comment, so
# that it parses): the check names each call that no script has in that form.
OLD_SNIPPET = """
```python
run = Run(args)
run.prepare()
global_step = run.restore(agent, optimizer)
with run.start(envs):
    for iteration in run.iterations():
        # ...  run.check_interrupt() and run.log_episodes(infos, global_step) at every env step
        run.record(iteration, global_step, agent, optimizer, stats, returns, values)
        run.save(iteration, global_step, agent, optimizer)
```
Last, `if __name__ == "__main__":` calls `main(cli())`.
"""


def test_the_check_fails_on_calls_that_do_not_exist():
    problems = document_problems("CONTRIBUTING.md", OLD_SNIPPET)
    for name in SCRIPTS:
        for expected in ("has no method prepare", "has no method save", "Run.record(", "cli() returns a tuple, passed whole"):
            assert any(expected in problem and f"{name}.py" in problem for problem in problems), (name, expected)
    assert not any("restore" in problem or "iterations" in problem for problem in problems), problems
    unparsed = document_problems("CONTRIBUTING.md", OLD_SNIPPET.replace("# ...", "..."))
    assert any("does not parse as Python" in problem for problem in unparsed), unparsed
