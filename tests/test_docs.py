"""Every code block of README.md and docs/*.md runs as written, on the bundled SmolLM2-135M-Instruct.

The convention, visible in the Markdown source:

- A fence names its language, and the language says whether the block runs:
  ```python and ```bash blocks run; ```text, ```console and ```json are
  illustrations (output, diagrams, bodies) and do not run.
- An HTML comment on the line just before a fence changes how that block runs:
    <!-- server -->      a bash block that starts a server, which the blocks after
                         it on the page call: it runs in the background, the page
                         waits until its /health answers, and it is stopped when
                         the page ends.
    <!-- gpu -->         needs a CUDA GPU (`<!-- gpu: 2 -->`: two GPUs). Such blocks
                         run benchmarks for minutes, so each is a test of its own
                         that runs only on a CUDA machine with NANOVLLM_DOCS_GPU=1
                         set, and is skipped otherwise.
    <!-- not run: WHY --> cannot run inside the test suite (the set-up commands,
                         which run the suite itself; a benchmark that takes many
                         minutes); say why.
  The `python benchmarks/...` command lines of blocks that do not run here (gpu
  and not-run blocks) are still parsed by the scripts' own argument parsers, so
  that a renamed or removed flag fails the test.
- The python blocks of a page run in order in one interpreter, as if pasted into
  one session: a later block may use what an earlier one defined. Each bash block
  runs in a shell of its own (bash -e -o pipefail).
- Blocks run from the repository root with .venv/bin first on PATH, each within
  a time limit. On a page with a server block, the port 8000 is replaced by a
  free port in every block of the page.
"""

import json
import os
import re
import select
import shlex
import signal
import subprocess
import sys
import time
import urllib.request
import warnings
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from helpers.ports import free_port

ROOT = Path(__file__).resolve().parent.parent
PAGES = ["README.md", *sorted(str(p.relative_to(ROOT)) for p in (ROOT / "docs").glob("*.md"))]
RUN = ("python", "bash")
ILLUSTRATION = ("text", "console", "json")
BLOCK_TIMEOUT_S = 300
GPU_BLOCK_TIMEOUT_S = 1800
SERVER_START_TIMEOUT_S = 300
DOC_PORT = "8000"

_FENCE = re.compile(r"^```(\S*)\s*$")
_MARKER = re.compile(r"^<!--\s*(.*?)\s*-->\s*$")
_LINK = re.compile(r"\]\(([^)\s]+)\)")


@dataclass(frozen=True)
class Block:
    """One fenced block: its page, the line of its opening fence, its language, the marker comment just
    before it ('' when none) and its text."""

    page: str
    line: int
    language: str
    marker: str
    code: str

    @property
    def where(self) -> str:
        return f"{self.page}:{self.line}"

    @property
    def runs(self) -> bool:
        return self.language in RUN and not self.marker.startswith("not run")

    @property
    def gpus(self) -> int:
        """GPUs the block needs (0: none)."""
        match = re.fullmatch(r"gpu(?::\s*(\d+))?", self.marker)
        return 0 if match is None else int(match.group(1) or 1)


def read_blocks(page: str) -> list[Block]:
    """The fenced blocks of a Markdown file, in order."""
    lines = (ROOT / page).read_text().splitlines()
    blocks, i = [], 0
    while i < len(lines):
        fence = _FENCE.match(lines[i])
        if fence is None:
            i += 1
            continue
        before = lines[i - 1] if i else ""
        marker = _MARKER.match(before)
        end = next((j for j in range(i + 1, len(lines)) if lines[j].startswith("```")), None)
        assert end is not None, f"{page}:{i + 1}: a fence that never closes"
        code = "\n".join(lines[i + 1 : end]) + "\n"
        blocks.append(Block(page, i + 1, fence.group(1), marker.group(1) if marker else "", code))
        i = end + 1
    return blocks


ALL_BLOCKS = [block for page in PAGES for block in read_blocks(page)]
GPU_BLOCKS = [block for block in ALL_BLOCKS if block.gpus and block.runs]
# blocks whose benchmark commands are parsed rather than run here
UNRUN_BASH = [
    block for block in ALL_BLOCKS if block.language == "bash" and (block.gpus or block.marker.startswith("not run"))
]


def block_env() -> dict:
    """A user's shell: .venv/bin first on PATH, and no switch the test suite sets for itself (the conftest
    turns on Triton's interpreter where there is no GPU)."""
    env = {key: value for key, value in os.environ.items() if key != "TRITON_INTERPRET"}
    env["PATH"] = f"{ROOT / '.venv' / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    env["PYTHONUNBUFFERED"] = "1"
    return env


def tail(path: Path, chars: int = 6000) -> str:
    text = path.read_text(errors="replace")
    return text[-chars:]


# A Python session fed one block at a time: the block's length on a line, then the block; it answers "ok" or
# "failed" on the file descriptor given as its argument, its own output going to stdout and stderr.
_SESSION = r"""
import os, sys, traceback
answers = os.fdopen(int(sys.argv[1]), "w")
names = {"__name__": "__main__"}
while True:
    header = sys.stdin.readline()
    if not header:
        break
    code = sys.stdin.read(int(header))
    try:
        exec(compile(code, sys.stdin.readline().strip(), "exec"), names)
        status = "ok"
    except BaseException:
        traceback.print_exc()
        status = "failed"
    sys.stdout.flush()
    sys.stderr.flush()
    answers.write(status + "\n")
    answers.flush()
"""


class PythonSession:
    """One interpreter that runs a page's python blocks in order, sharing their names."""

    def __init__(self, log: Path):
        self.log = log
        read_end, self._write_end = os.pipe()
        self._answers = os.fdopen(read_end)
        self._log_file = open(log, "w")
        self.process = subprocess.Popen(
            [sys.executable, "-c", _SESSION, str(self._write_end)],
            stdin=subprocess.PIPE,
            stdout=self._log_file,
            stderr=subprocess.STDOUT,
            cwd=ROOT,
            env=block_env(),
            text=True,
            pass_fds=[self._write_end],
        )
        os.close(self._write_end)

    def run(self, block: Block, timeout: float) -> None:
        """Run one block; fail with its output when it raises or outlasts `timeout`."""
        self.process.stdin.write(f"{len(block.code)}\n{block.code}{block.where}\n")
        self.process.stdin.flush()
        ready, _, _ = select.select([self._answers], [], [], timeout)
        if not ready:
            pytest.fail(f"{block.where}: the python block ran past {timeout} s\n{tail(self.log)}")
        answer = self._answers.readline().strip()
        if answer != "ok":
            pytest.fail(f"{block.where}: the python block failed\n{block.code}\n{tail(self.log)}")

    def close(self) -> None:
        self.process.stdin.close()
        try:
            self.process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self._answers.close()
        self._log_file.close()


class Server:
    """A server block running in the background, in a process group of its own."""

    def __init__(self, block: Block, port: int, log: Path):
        self.log = log
        self._log_file = open(log, "w")
        self.process = subprocess.Popen(
            ["bash", "-c", block.code],
            stdout=self._log_file,
            stderr=subprocess.STDOUT,
            cwd=ROOT,
            env=block_env(),
            start_new_session=True,
        )
        deadline = time.monotonic() + SERVER_START_TIMEOUT_S
        while not self._healthy(port):
            if self.process.poll() is not None:
                pytest.fail(f"{block.where}: the server exited with {self.process.returncode}\n{tail(log)}")
            if time.monotonic() > deadline:
                self.stop()
                pytest.fail(f"{block.where}: no answer on /health after {SERVER_START_TIMEOUT_S} s\n{tail(log)}")
            time.sleep(0.5)

    @staticmethod
    def _healthy(port: int) -> bool:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as response:
                return response.status == 200
        except OSError:
            return False

    def stop(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()
        self._log_file.close()


def run_bash(block: Block, timeout: float, log: Path) -> None:
    """Run a bash block in a shell of its own; fail with its output when it fails or outlasts `timeout`."""
    with open(log, "w") as out:
        try:
            result = subprocess.run(
                ["bash", "-e", "-o", "pipefail", "-c", block.code],
                stdout=out,
                stderr=subprocess.STDOUT,
                cwd=ROOT,
                env=block_env(),
                timeout=timeout,
                start_new_session=True,
            )
        except subprocess.TimeoutExpired:
            pytest.fail(f"{block.where}: the bash block ran past {timeout} s\n{tail(log)}")
    if result.returncode != 0:
        pytest.fail(f"{block.where}: the bash block exited with {result.returncode}\n{block.code}\n{tail(log)}")


def with_port(block: Block, port: int) -> Block:
    code = re.sub(rf"\b{DOC_PORT}\b", str(port), block.code)
    return Block(block.page, block.line, block.language, block.marker, code)


def run_blocks(blocks: list[Block], workdir: Path) -> None:
    """Run a page's blocks in order: python ones in one session, bash ones each in a shell, a server block in
    the background until the end."""
    if any(block.marker == "server" for block in blocks):
        port = free_port()
        blocks = [with_port(block, port) for block in blocks]
    session = server = None
    try:
        for block in blocks:
            log = workdir / f"line{block.line}.log"
            if block.marker == "server":
                assert server is None, f"{block.where}: a page starts one server at most"
                assert block.language == "bash", f"{block.where}: a server block is a bash block"
                server = Server(block, port, log)
            elif block.language == "python":
                session = session or PythonSession(workdir / "python.log")
                session.run(block, BLOCK_TIMEOUT_S)
            else:
                run_bash(block, BLOCK_TIMEOUT_S, log)
    finally:
        if session is not None:
            session.close()
        if server is not None:
            server.stop()


def test_every_fence_names_its_language_and_every_marker_is_known():
    for block in ALL_BLOCKS:
        assert block.language in RUN + ILLUSTRATION, (
            f"{block.where}: fence language {block.language!r}; use one of {', '.join(RUN + ILLUSTRATION)}"
        )
        known = block.marker in ("", "server") or block.gpus or re.fullmatch(r"not run: \S.*", block.marker)
        assert known, f"{block.where}: unknown marker <!-- {block.marker} -->"
        if block.marker and block.language in ILLUSTRATION:
            pytest.fail(f"{block.where}: a marker on a {block.language} block, which never runs")


def test_blocks_left_unrun_are_few():
    unrun = [block.where for block in ALL_BLOCKS if block.marker.startswith("not run")]
    assert len(unrun) <= 6, f"blocks marked 'not run': {unrun}; make them runnable instead"


def heading_anchors(path: Path) -> set[str]:
    """The anchors GitHub gives a Markdown file's headings: lower case, punctuation dropped, spaces as hyphens."""
    headings = re.findall(r"^#+ (.+)$", path.read_text(), flags=re.MULTILINE)
    return {re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-") for heading in headings}


def test_relative_links_point_to_files_and_headings_of_the_repository():
    for page in PAGES:
        for target in _LINK.findall((ROOT / page).read_text()):
            if re.match(r"[a-z]+:", target):
                continue
            file, _, anchor = target.partition("#")
            path = (ROOT / page).parent / file if file else ROOT / page
            assert path.exists(), f"{page}: the link {target!r} points to nothing"
            if anchor:
                assert anchor in heading_anchors(path), f"{page}: the link {target!r} names no heading of {file}"


def test_the_file_layout_names_every_file_of_the_package():
    """docs/architecture.md's layout lists every file under nanovllm/ (but empty __init__.py files), and no
    file that is gone."""
    [layout] = [block for block in read_blocks("docs/architecture.md") if block.code.startswith("__init__.py ")]
    listed = {line.split()[0] for line in layout.code.splitlines() if line.strip()}
    package = ROOT / "nanovllm"
    files = {
        str(path.relative_to(package))
        for path in package.rglob("*.py")
        if path.name != "__init__.py" or path.stat().st_size > 0
    }
    assert not files - listed, f"files the layout of docs/architecture.md leaves out: {sorted(files - listed)}"
    assert not listed - files, f"files the layout of docs/architecture.md names but are gone: {sorted(listed - files)}"


@pytest.mark.slow
@pytest.mark.parametrize("page", PAGES)
def test_the_blocks_of_a_page_run(page, tmp_path):
    blocks = [block for block in read_blocks(page) if block.runs and not block.gpus]
    if not blocks:
        pytest.skip(f"{page} has no block that runs without a GPU")
    run_blocks(blocks, tmp_path)


@pytest.mark.slow
@pytest.mark.parametrize("block", GPU_BLOCKS, ids=[block.where for block in GPU_BLOCKS])
def test_a_gpu_block_runs(block, tmp_path):
    if torch.cuda.device_count() < block.gpus:
        pytest.skip(f"needs {block.gpus} CUDA GPU{'s' if block.gpus > 1 else ''}")
    if os.environ.get("NANOVLLM_DOCS_GPU") != "1":
        pytest.skip("the docs' GPU blocks run benchmarks for minutes: set NANOVLLM_DOCS_GPU=1 to run them")
    if block.language == "python":
        session = PythonSession(tmp_path / "python.log")
        try:
            session.run(block, GPU_BLOCK_TIMEOUT_S)
        finally:
            session.close()
    else:
        run_bash(block, GPU_BLOCK_TIMEOUT_S, tmp_path / "bash.log")


# Runs each benchmark command line given as JSON on stdin up to its argument parser, no further; prints, per
# command, "ok", the parser's error, or "missing MODULE" when the script imports a package that is absent.
_PARSE_ONLY = r"""
import argparse, contextlib, io, json, os, runpy, sys

class Parsed(Exception):
    pass

parse_args = argparse.ArgumentParser.parse_args

def parse_then_stop(self, args=None, namespace=None):
    parse_args(self, args, namespace)
    raise Parsed

argparse.ArgumentParser.parse_args = parse_then_stop
results = []
for argv in json.load(sys.stdin):
    sys.argv = argv
    sys.path.insert(0, os.path.dirname(os.path.abspath(argv[0])))
    errors = io.StringIO()
    try:
        with contextlib.redirect_stderr(errors):
            runpy.run_path(argv[0], run_name="__main__")
        results.append("the script ran past its parser")
    except Parsed:
        results.append("ok")
    except ModuleNotFoundError as e:
        results.append(f"missing {e.name}")
    except SystemExit:
        results.append(errors.getvalue().strip())
    finally:
        sys.path.pop(0)
print(json.dumps(results))
"""


def benchmark_commands(block: Block) -> list[list[str]]:
    """The `python benchmarks/NAME.py ...` command lines of a bash block, each as its argv."""
    commands = []
    for line in block.code.replace("\\\n", " ").splitlines():
        words = shlex.split(line, comments=True)
        if len(words) >= 2 and words[0] == "python" and words[1].startswith("benchmarks/"):
            commands.append(words[1:])
    return commands


@pytest.mark.slow
def test_the_benchmark_commands_of_blocks_that_do_not_run_parse():
    """GPU blocks and not-run blocks do not run here, but their benchmark flags are still checked against the
    scripts' own argument parsers, so that a renamed or removed flag fails here."""
    commands = [argv for block in UNRUN_BASH for argv in benchmark_commands(block)]
    assert commands, "no benchmark command in the blocks that do not run"
    env = block_env()
    env["CUDA_VISIBLE_DEVICES"] = ""  # parsing only: no script touches a GPU
    result = subprocess.run(
        [sys.executable, "-c", _PARSE_ONLY],
        input=json.dumps(commands),
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=env,
        timeout=BLOCK_TIMEOUT_S,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    outcomes = dict(zip(map(shlex.join, commands), json.loads(result.stdout.splitlines()[-1])))
    failed = {command: outcome for command, outcome in outcomes.items() if outcome != "ok"}
    unchecked = {command: outcome for command, outcome in failed.items() if outcome.startswith("missing ")}
    for command, outcome in unchecked.items():
        warnings.warn(f"not checked: {command} ({outcome})", stacklevel=1)
    assert not {command: outcome for command, outcome in failed.items() if command not in unchecked}


def test_a_failing_block_fails_its_page(tmp_path):
    """The runner itself: a block that raises or exits non-zero fails the test, one that passes does not."""
    passing = [Block("page.md", 1, "python", "", "x = 1\n"), Block("page.md", 5, "bash", "", "true\n")]
    run_blocks(passing, tmp_path)
    for failing in (
        Block("page.md", 9, "python", "", "assert x == 2\n"),
        Block("page.md", 9, "bash", "", "false\necho never\n"),
    ):
        with pytest.raises(pytest.fail.Exception, match="page.md:9"):
            run_blocks([*passing, failing], tmp_path)
