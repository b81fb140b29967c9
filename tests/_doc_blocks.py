"""Every fenced code block of the documentation, and how each is checked.

The pages are ``README.md`` and every ``docs/**/*.md``. A page's blocks run in order, as
a reader would type them: the Python blocks in one module namespace of the page's own,
the shell blocks in one working folder of the page's own (where the blocks with a
``title="name"`` are written as files). ``docs/reference/docs-tests.md`` is the reader's
version of the rules below.

A block's kind comes from its language and, where there is one, the annotation on the
line just above it, ``<!-- check: KIND -->`` or ``<!-- check: KIND: why -->``:

==========  ===============  ==============================================================
language    kind             how it is checked
==========  ===============  ==============================================================
python      run (default)    executed in the page's namespace
python      file             (``title="name.py"``) written to the page's folder; a later
                             block of the page must name it
python      parse: why       compiled; every ``agent_blackbox`` name it imports must exist
sh          run (default)    executed by bash (``-e -o pipefail``) in the page's folder
sh          parse: why       each command parsed: ``blackbox`` subcommands and options
                             must exist, ``make`` targets, ``python -m`` modules, extras
                             and ``BLACKBOX_*`` variables too; other programs are named
sql         run (default)    executed against the page's database, rolled back
json        parse            must be JSON
cron        parse            each line's command checked as ``sh`` ``parse``
text        output           compared with the previous block's output (``...`` matches
                             anything)
text        figure           a drawing: nothing to run
==========  ===============  ==============================================================

``sh`` ``run`` blocks are parse-checked before they run. A page whose first line is
``<!-- docs-test: stack -->`` needs Postgres and Kafka: it runs in the integration tier
(``tests/integration/test_docs_stack.py``); every other page runs in the unit tier
(``tests/unit/test_docs.py``), and every page's blocks are parse-checked there.
"""

from __future__ import annotations

import ast
import contextlib
import importlib
import importlib.util
import io
import json
import os
import re
import shlex
import subprocess
import sys
import types
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import click

ROOT = Path(__file__).resolve().parents[1]
BIN = ROOT / ".venv" / "bin"

_FENCE = re.compile(r"^(?P<indent> *)(?P<fence>`{3,}|~{3,})(?P<info>[^`]*)$")
_ANNOTATION = re.compile(r"^<!--\s*check:\s*(?P<kind>[a-z]+)(?:\s*:\s*(?P<why>.*?))?\s*-->$")
_TITLE = re.compile(r'title="(?P<title>[^"]+)"')
STACK_MARKER = "<!-- docs-test: stack -->"

KINDS: Mapping[str, frozenset[str]] = {
    "python": frozenset({"run", "file", "parse"}),
    "sh": frozenset({"run", "parse"}),
    "sql": frozenset({"run"}),
    "json": frozenset({"parse"}),
    "cron": frozenset({"parse"}),
    "text": frozenset({"output", "figure"}),
}
DEFAULT_KIND = {"python": "run", "sh": "run", "sql": "run", "json": "parse", "cron": "parse"}

PROGRAMS = frozenset(
    {
        "cd",
        "echo",
        "export",
        "grep",
        "tail",
        "jq",
        "psql",
        "cat",
        "ls",
        "rm",
        "docker",
        "git",
        "kafka-topics.sh",
        "kafka-consumer-groups.sh",
        "openssl",
        "chmod",
        "page-oncall",
        "date",
    }
)
"""Programs other than ``blackbox``, ``make``, ``python`` and ``pip`` a parse-checked
command may name (shell built-ins and common tools the pages use)."""


class DocBlockError(AssertionError):
    """A block of the documentation failed its check; the message names page and line."""


@dataclass(frozen=True)
class Block:
    """One fenced code block."""

    page: Path
    line: int
    """The line of its opening fence (1-based)."""
    language: str
    kind: str
    code: str
    title: str | None = None
    why: str | None = None

    @property
    def where(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"


@dataclass(frozen=True)
class Page:
    """A Markdown page and its blocks."""

    path: Path
    blocks: tuple[Block, ...]
    stack: bool
    error: str | None = None
    """Why the page could not be read into blocks (its test fails with it)."""

    @property
    def name(self) -> str:
        return str(self.path.relative_to(ROOT))


def pages() -> list[Page]:
    """Every page of the documentation, the README first."""
    paths = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    found = []
    for path in paths:
        try:
            found.append(read_page(path))
        except DocBlockError as exc:  # reported by the page's own test, not at collection
            found.append(Page(path, (), False, f"{path.relative_to(ROOT)}: {exc}"))
    return found


def read_page(path: Path) -> Page:
    """The page at ``path`` with its blocks.

    Raises:
        DocBlockError: a block has an unknown language or kind, or a ``parse`` without
            its reason.
    """
    lines = path.read_text(encoding="utf-8").splitlines()
    blocks: list[Block] = []
    index = 0
    while index < len(lines):
        match = _FENCE.match(lines[index])
        if match is None:
            index += 1
            continue
        end = _closing(lines, index, match["fence"])
        body = [line.removeprefix(match["indent"]) for line in lines[index + 1 : end]]
        annotation = _annotation_above(lines, index)
        blocks.append(_block(path, index + 1, match["info"], "\n".join(body) + "\n", annotation))
        index = end + 1
    stack = bool(lines) and lines[0].strip() == STACK_MARKER
    return Page(path, tuple(blocks), stack)


def _closing(lines: list[str], start: int, fence: str) -> int:
    for index in range(start + 1, len(lines)):
        if lines[index].strip() == fence:
            return index
    raise DocBlockError(f"line {start + 1}: a code block is never closed")


def _annotation_above(lines: list[str], index: int) -> re.Match[str] | None:
    above = index - 1
    if above >= 0 and lines[above].strip().startswith("<!--"):
        match = _ANNOTATION.match(lines[above].strip())
        if match is None:
            raise DocBlockError(f"line {above + 1}: an annotation is not <!-- check: KIND -->")
        return match
    return None


def _block(path: Path, line: int, info: str, code: str, note: re.Match[str] | None) -> Block:
    words = info.split()
    language = words[0] if words else ""
    where = f"{path.relative_to(ROOT)}:{line}"
    if language not in KINDS:
        raise DocBlockError(
            f"{where}: a block in {language or 'no language'!r}; the pages use "
            f"{', '.join(KINDS)} (docs/reference/docs-tests.md)"
        )
    title_match = _TITLE.search(info)
    title = title_match["title"] if title_match else None
    kind = note["kind"] if note else ("file" if title else DEFAULT_KIND.get(language))
    why = note["why"] if note else None
    if kind is None or kind not in KINDS[language]:
        raise DocBlockError(
            f"{where}: a {language} block needs one of "
            f"{', '.join(sorted(KINDS[language]))} as <!-- check: KIND --> (got {kind!r})"
        )
    if kind == "parse" and language in ("python", "sh") and not why:
        raise DocBlockError(f"{where}: <!-- check: parse: why --> must say why it cannot run")
    if kind == "file" and not title:
        raise DocBlockError(f'{where}: a file block needs title="name"')
    return Block(path, line, language, kind, code, title, why)


# Parse checks --------------------------------------------------------------------------


def parse_check(block: Block) -> None:
    """The checks that need nothing to run: Python compiles and imports real names; a
    command names real subcommands, options, targets and modules; JSON parses.

    Raises:
        DocBlockError: naming the block and what is wrong.
    """
    try:
        if block.language == "python":
            check_python(block.code)
        elif block.language == "sh":
            for command in commands(block.code):
                check_command(command)
        elif block.language == "cron":
            for line in block.code.splitlines():
                if line.strip() and not line.lstrip().startswith("#"):
                    for command in commands(" ".join(line.split()[5:])):
                        check_command(command)
        elif block.language == "json":
            json.loads(block.code)
    except DocBlockError as exc:
        raise DocBlockError(f"{block.where}: {exc}") from None
    except (SyntaxError, ValueError) as exc:
        raise DocBlockError(f"{block.where}: {exc}") from None


def check_python(code: str) -> None:
    """Compile ``code`` and import every ``agent_blackbox`` name it imports."""
    tree = ast.parse(code)
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("agent_blackbox"):
            module = importlib.import_module(node.module or "")
            for alias in node.names:
                if not hasattr(module, alias.name):
                    raise DocBlockError(f"{node.module} has no name {alias.name}")
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("agent_blackbox"):
                    importlib.import_module(alias.name)


def commands(script: str) -> Iterator[list[str]]:
    """The simple commands of a shell script, as words (continued lines joined, comments
    dropped, split at ``;``, ``&&``, ``||``, ``|`` and ``$(...)``)."""
    text = script.replace("\\\n", " ")
    inner = re.findall(r"\$\(([^()]*)\)", text)
    text = re.sub(r"\$\(([^()]*)\)", "SUBSTITUTED", text)
    for command in inner:
        yield from commands(command)
    for line in text.splitlines():
        lexer = shlex.shlex(line, posix=True, punctuation_chars=";&|()")
        lexer.whitespace_split = True
        lexer.commenters = "#"
        words: list[str] = []
        for word in lexer:
            if word in (";", "&&", "||", "|", "(", ")", "$(", "&") or set(word) <= set(";&|()"):
                if words:
                    yield words
                words = []
            elif word.startswith("$") and word.endswith("$"):
                continue
            else:
                words.append(word.removeprefix("$"))
        if words:
            yield words


def check_command(words: list[str]) -> None:
    """Check one simple command (see the module's table)."""
    while words and re.match(r"^[A-Z_][A-Z0-9_]*=", words[0]):
        check_variable(words[0].split("=", 1)[0])
        words = words[1:]
    if not words:
        return
    program, args = words[0], words[1:]
    if program in (".", "source"):
        return  # reads a file of variables the page or a command wrote
    program = Path(program).name
    if program == "blackbox":
        check_blackbox(args)
    elif program == "make":
        targets = makefile_targets()
        for target in (a for a in args if not a.startswith("-") and "=" not in a):
            if target not in targets:
                raise DocBlockError(f"make has no target {target!r}")
    elif program in ("python", "python3"):
        if args[:1] == ["-m"]:
            check_module(args[1])
    elif program == "pip":
        for arg in args:
            if arg.startswith("agent-blackbox["):
                check_extras(arg)
    elif program == "export":
        for arg in args:
            check_variable(arg.split("=", 1)[0])
    elif program not in PROGRAMS:
        raise DocBlockError(f"unknown program {program!r} (tests/_doc_blocks.py PROGRAMS)")


def check_blackbox(args: list[str]) -> None:
    """The subcommands exist and every option given is one of the command's."""
    from agent_blackbox.cli import main

    command: click.Command = main
    path = ["blackbox"]
    rest = list(args)
    options = _option_names(command)
    while isinstance(command, click.Group):
        while rest and rest[0].startswith("-"):
            _check_option(path, options, rest.pop(0))
        if not rest:
            return
        name = rest.pop(0)
        sub = command.get_command(click.Context(command), name)
        if sub is None:
            raise DocBlockError(f"{' '.join(path)} has no command {name!r}")
        command, path = sub, [*path, name]
        options = _option_names(command)
    for arg in rest:
        if arg == "--":
            break
        if arg.startswith("-") and arg != "-":
            _check_option(path, options, arg)


def _option_names(command: click.Command) -> set[str]:
    names = {"--help"}
    for param in command.params:
        if isinstance(param, click.Option):
            names.update(param.opts)
            names.update(param.secondary_opts)
    return names


def _check_option(path: list[str], options: set[str], arg: str) -> None:
    name = arg.split("=", 1)[0]
    if name not in options:
        raise DocBlockError(f"{' '.join(path)} has no option {name}")


def makefile_targets() -> set[str]:
    text = (ROOT / "Makefile").read_text(encoding="utf-8")
    return set(re.findall(r"^([a-z][a-z-]*):", text, re.MULTILINE))


def check_module(name: str) -> None:
    if name.startswith("bench") and str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    if importlib.util.find_spec(name) is None:
        raise DocBlockError(f"python -m {name}: no such module")


def check_extras(requirement: str) -> None:
    import tomllib

    wanted = requirement.split("[", 1)[1].rstrip("]").split(",")
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]
    for extra in wanted:
        if extra.strip() not in extras:
            raise DocBlockError(f"agent-blackbox has no extra {extra!r}")


def check_variable(name: str) -> None:
    if name.startswith("BLACKBOX_") and name not in documented_variables():
        raise DocBlockError(f"{name} is not in the settings reference")


def documented_variables() -> set[str]:
    """Every ``BLACKBOX_*`` variable the settings reference names (its tables and the
    Settings fields it is generated from)."""
    from agent_blackbox.schemas import Settings

    text = (ROOT / "docs" / "reference" / "settings.md").read_text(encoding="utf-8")
    named = set(re.findall(r"`(BLACKBOX_[A-Z0-9_]+)`", text))
    return named | {f"BLACKBOX_{name.upper()}" for name in Settings.__dataclass_fields__}


# Running a page ------------------------------------------------------------------------


@dataclass
class PageRun:
    """Runs a page's blocks in order in one namespace and one folder."""

    page: Page
    folder: Path
    env: dict[str, str]
    database_url: str | None = None
    outputs: list[str] = field(default_factory=list)

    def run(self) -> None:
        """Run every block, in order.

        Raises:
            DocBlockError: the first block that failed its check, with its output.
        """
        if self.page.error:
            raise DocBlockError(self.page.error)
        module = types.ModuleType(f"docs_{_slug(self.page.name)}")
        module.__file__ = str(self.folder / "page.py")
        sys.modules[module.__name__] = module
        sys.path.insert(0, str(self.folder))
        try:
            with _environment(self.env), _working_directory(self.folder):
                last = ""
                for block in self.page.blocks:
                    last = self._run_block(block, module, last)
            self._check_files_named()
        finally:
            sys.path.remove(str(self.folder))
            sys.modules.pop(module.__name__, None)

    def _run_block(self, block: Block, module: types.ModuleType, last: str) -> str:
        if block.kind == "parse" or block.language in ("sh", "cron", "json"):
            parse_check(block)
        if block.kind == "file":
            (self.folder / str(block.title)).write_text(block.code, encoding="utf-8")
            return last
        if block.kind == "output":
            compare_output(block, last)
            return last
        if block.kind != "run":
            return last
        if block.language == "python":
            return self._python(block, module)
        if block.language == "sh":
            return self._shell(block)
        if block.language == "sql":
            return self._sql(block)
        return last

    def _python(self, block: Block, module: types.ModuleType) -> str:
        out = io.StringIO()
        code = compile(block.code, block.where, "exec")
        try:
            with contextlib.redirect_stdout(out):
                exec(code, module.__dict__)
        except Exception as exc:
            raise BlockFailed(block, out.getvalue(), exc) from exc
        return out.getvalue()

    def _shell(self, block: Block) -> str:
        done = subprocess.run(
            ["bash", "-e", "-o", "pipefail", "-c", block.code],
            cwd=self.folder,
            env={**os.environ, **self.env},
            capture_output=True,
            text=True,
            timeout=600,
            check=False,
        )
        if done.returncode != 0:
            raise BlockFailed(
                block, f"{done.stdout}\n--- stderr ---\n{done.stderr}", None, done.returncode
            )
        return done.stdout

    def _sql(self, block: Block) -> str:
        if self.database_url is None:
            raise DocBlockError(
                f"{block.where}: an sql block on a page without {STACK_MARKER} has no database"
            )
        import psycopg

        url = self.database_url.replace("postgresql+psycopg://", "postgresql://", 1)
        with psycopg.connect(url) as conn:
            try:
                conn.execute(block.code.encode())
            except psycopg.Error as exc:
                raise BlockFailed(block, "", exc) from exc
            finally:
                conn.rollback()
        return ""

    def _check_files_named(self) -> None:
        blocks = self.page.blocks
        for index, block in enumerate(blocks):
            if block.kind != "file":
                continue
            stem = Path(str(block.title)).stem
            later = [b.code for b in blocks[index + 1 :] if b.kind in ("run", "parse")]
            if not any(str(block.title) in code or stem in code for code in later):
                raise DocBlockError(
                    f"{block.where}: file {block.title} is never used by a later block"
                )


class BlockFailed(DocBlockError):
    """A block that ran and failed."""

    def __init__(
        self, block: Block, output: str, error: BaseException | None, status: int | None = None
    ) -> None:
        what = f"exit status {status}" if status is not None else f"{type(error).__name__}"
        super().__init__(
            f"{block.where}: the {block.language} block failed ({what}: {error})\n"
            f"--- block ---\n{block.code}--- output ---\n{output}"
        )
        self.block = block
        self.error = error


def compare_output(block: Block, actual: str) -> None:
    """``actual`` must read as the output block shows, ``...`` standing for any text.

    Raises:
        DocBlockError: it does not.
    """
    expected = block.code.strip()
    pattern = ".*?".join(re.escape(part) for part in expected.split("..."))
    if re.fullmatch(pattern, actual.strip(), flags=re.DOTALL) is None:
        raise DocBlockError(
            f"{block.where}: the output differs\n--- shown ---\n{expected}\n"
            f"--- actual ---\n{actual.strip()}"
        )


def _slug(name: str) -> str:
    return re.sub(r"[^a-z0-9]+", "_", name.lower()).strip("_")


@contextlib.contextmanager
def _environment(env: Mapping[str, str]) -> Iterator[None]:
    saved = {name: os.environ.get(name) for name in env}
    os.environ.update(env)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


@contextlib.contextmanager
def _working_directory(folder: Path) -> Iterator[None]:
    before = Path.cwd()
    os.chdir(folder)
    try:
        yield
    finally:
        os.chdir(before)
