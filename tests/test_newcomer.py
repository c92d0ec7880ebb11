"""What a newcomer meets first: the README's commands exist and answer --help, every link and image in README and
docs/ resolves, and every published result folder is cited by some page (an uncited folder is clutter)."""

import contextlib
import importlib
import io
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
CLI = re.compile(r"python -m (cooper_openrlhf\.cli\.\w+)")


def test_every_link_and_image_in_readme_and_docs_resolves():
    broken = []
    for page in PAGES:
        for target in LINK.findall(page.read_text()):
            if target.startswith(("http://", "https://", "mailto:", "#")):
                continue
            if not (page.parent / target.split("#", 1)[0]).exists():
                broken.append(f"{page.relative_to(REPO)}: {target}")
    assert not broken, "links to nothing:\n  " + "\n  ".join(broken)


def test_every_published_result_folder_is_cited():
    text = "\n".join(page.read_text() for page in PAGES)
    folders = sorted(p.name for p in (REPO / "docs" / "results").iterdir() if p.is_dir())
    uncited = [name for name in folders if f"results/{name}" not in text]
    assert not uncited, f"docs/results folders no page cites (remove them; git history keeps them): {uncited}"


@pytest.mark.parametrize("module", sorted(set(CLI.findall((REPO / "README.md").read_text()))))
def test_every_command_the_readme_names_exists_and_answers_help(module):
    main = importlib.import_module(module).main
    shown = io.StringIO()
    with pytest.raises(SystemExit) as done, contextlib.redirect_stdout(shown):
        main(["--help"])
    assert done.value.code == 0 and "usage:" in shown.getvalue()


def test_the_readmes_scripts_and_make_targets_exist():
    readme = (REPO / "README.md").read_text()
    for script in set(re.findall(r"bash (scripts/[\w./-]+|launch_scripts/[\w./-]+)", readme)):
        assert (REPO / script).is_file(), script
    targets = set(re.findall(r"^([\w-]+):", (REPO / "Makefile").read_text(), re.M))
    assert set(re.findall(r"\bmake (\w+)", readme)) <= targets
