"""Every Python block of the README and docs/ runs as written, as a user's own file in a folder of its own (the
installed package, no checkout on the path), offline. A block whose first line is ``# needs: hub`` or
``# needs: gpu`` is skipped here. Where a block reads the default run's folder, a tiny published model stands in.
Every ``--flag`` that a bash block gives one of the three scripts is one of that script's arguments."""

from __future__ import annotations

import argparse
import os
import re
import shlex
import shutil
import subprocess
import sys

import pytest
from conftest import DEFAULT_RUN, ROOT

DOCUMENTS = [
    ROOT / "README.md",
    *sorted((ROOT / "docs").glob("*.md")),
    ROOT / "ifcl/sts/metric/sts_spearman/README.md",
]


def python_blocks() -> list[tuple[str, str]]:
    """(document:line, code) of every ```python block."""
    blocks = []
    for document in DOCUMENTS:
        text = document.read_text(encoding="utf-8")
        for match in re.finditer(r"^```python\n(.*?)^```", text, flags=re.MULTILINE | re.DOTALL):
            line = text.count("\n", 0, match.start()) + 1
            blocks.append((f"{document.relative_to(ROOT)}:{line}", match.group(1)))
    return blocks


BLOCKS = python_blocks()


@pytest.fixture(scope="module")
def user_folder(tmp_path_factory, published_dir):
    """A folder of the user's own, holding a tiny published model where the default run would have saved one."""
    folder = tmp_path_factory.mktemp("user")
    shutil.copytree(published_dir, folder / DEFAULT_RUN)
    return folder


def test_the_documents_have_python_blocks():
    assert len(BLOCKS) >= 6 and any(name.startswith("README.md") for name, _ in BLOCKS)


@pytest.mark.slow
@pytest.mark.parametrize("name, code", BLOCKS, ids=[name for name, _ in BLOCKS])
def test_each_python_block_runs_as_written(name, code, user_folder):
    needs = re.match(r"# needs: (\w+)", code)
    if needs:
        pytest.skip(f"{name} needs the {needs.group(1)}")
    path = user_folder / "block.py"
    path.write_text(code, encoding="utf-8")
    environment = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
    result = subprocess.run(
        [sys.executable, str(path)],
        cwd=user_folder,
        env={**environment, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"},
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, f"{name}\n{code}\n{result.stdout[-1500:]}{result.stderr[-3000:]}"
    for output_dir in re.findall(r'output_dir="([^"]+)"', code):  # a block that trains leaves its model there
        assert (user_folder / output_dir / "config.json").is_file(), f"{name}: nothing saved in {output_dir}"


# The scripts' names in a command line (as files or as the installed commands), by the module whose
# ``parse_arguments`` builds the script's parser.
SCRIPTS = {
    "run_ifcl.py": "run_ifcl",
    "ifcl-train": "run_ifcl",
    "evaluate_sts.py": "ifcl.sts.command",
    "ifcl-evaluate-sts": "ifcl.sts.command",
    "prepare_fraternal.py": "ifcl.translation",
    "ifcl-prepare-fraternal": "ifcl.translation",
}


class _Built(Exception):
    def __init__(self, parser: argparse.ArgumentParser) -> None:
        self.parser = parser


@pytest.fixture(scope="module")
def script_options() -> dict[str, set[str]]:
    """Each script's option strings, from the parser its ``parse_arguments`` builds, caught before it parses."""
    import importlib

    def built(parser, *args, **kwargs):
        raise _Built(parser)

    options = {}
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(argparse.ArgumentParser, "parse_known_args", built)
        for module in sorted(set(SCRIPTS.values())):
            with pytest.raises(_Built) as caught:
                importlib.import_module(module).parse_arguments([])
            options[module] = set(caught.value.parser._option_string_actions)
    return options


def command_lines(text: str, name: str) -> list[tuple[str, list[str]]]:
    """(name:line, words) of every command in the ```bash blocks of ``text``: continuation lines joined, comments
    dropped, ``&&``/``;``/``|`` chains split, and ``$NAME`` replaced by a ``NAME="..."`` set earlier in the block."""
    commands = []
    for match in re.finditer(r"^```bash\n(.*?)^```", text, flags=re.MULTILINE | re.DOTALL):
        first = text.count("\n", 0, match.start()) + 2
        variables: dict[str, str] = {}
        logical, start = "", None
        for number, line in enumerate(match.group(1).splitlines(), start=first):
            start = number if start is None else start
            if line.rstrip().endswith("\\"):
                logical += line.rstrip()[:-1] + " "
                continue
            logical += line
            logical = re.sub(r"\$\{?(\w+)\}?", lambda m: variables.get(m[1], m[0]), logical)
            assignment = re.fullmatch(r"\s*([A-Za-z_]\w*)=(.*)", logical)
            if assignment:
                variables[assignment[1]] = " ".join(shlex.split(assignment[2], comments=True))
            else:
                lexer = shlex.shlex(logical, posix=True, punctuation_chars=True)
                lexer.whitespace_split = True
                words = list(lexer)
                command: list[str] = []
                for word in [*words, ";"]:
                    if word and set(word) <= set("&|;()<>"):
                        if command:
                            commands.append((f"{name}:{start}", command))
                        command = []
                    else:
                        command.append(word)
            logical, start = "", None
    return commands


def unknown_flags(text: str, name: str, script_options: dict[str, set[str]]) -> list[str]:
    """``name:line: script --flag`` for each flag that a bash block of ``text`` gives a script and its parser lacks;
    the words before the script (``accelerate launch``'s own flags) are not the script's."""
    unknown = []
    for where, words in command_lines(text, name):
        at = next((i for i, word in enumerate(words) if os.path.basename(word) in SCRIPTS), None)
        if at is None:
            continue
        script = os.path.basename(words[at])
        for word in words[at + 1 :]:
            flag = word.split("=", 1)[0]
            if flag.startswith("--") and len(flag) > 2 and flag not in script_options[SCRIPTS[script]]:
                unknown.append(f"{where}: {script} {flag}")
    return unknown


def test_every_flag_in_the_bash_blocks_is_an_argument_of_its_script(script_options):
    unknown, scripts = [], set()
    for document in DOCUMENTS:
        name = str(document.relative_to(ROOT))
        text = document.read_text(encoding="utf-8")
        unknown += unknown_flags(text, name, script_options)
        for _, words in command_lines(text, name):
            scripts.update(SCRIPTS[os.path.basename(w)] for w in words if os.path.basename(w) in SCRIPTS)
    assert scripts == set(SCRIPTS.values()), "a script is no longer run in any bash block: the check has nothing to do"
    assert not unknown, "flags the scripts do not have:\n" + "\n".join(unknown)


def test_the_flag_check_finds_a_made_up_flag(script_options):
    text = (
        "```python\nrun_ifcl.py --not_checked_in_python\n```\n"
        "```bash\n"
        "# run_ifcl.py --in_a_comment\n"
        'COMMON="--learning_rate 3e-5 --made_up_common 1"\n'
        "accelerate launch -q --num_processes 2 run_ifcl.py --train_file a.txt \\\n"
        "  --made_up_flag 1 $COMMON --max_steps=-1 && ifcl-evaluate-sts --model_name_or_path m --bogus\n"
        "python prepare_fraternal.py --input_file a --batch_size 8 --no_such_thing  # --nor_in_this_comment\n"
        "```\n"
    )
    assert unknown_flags(text, "sample", script_options) == [
        "sample:7: run_ifcl.py --made_up_flag",
        "sample:7: run_ifcl.py --made_up_common",
        "sample:7: ifcl-evaluate-sts --bogus",
        "sample:9: prepare_fraternal.py --no_such_thing",
    ]
