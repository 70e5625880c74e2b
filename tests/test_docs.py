"""The README is a front door and the docs cannot drift from the code.

- README.md opens with exactly the two set-up commands CI runs, and stays <= 250 lines;
- every relative link in README.md and docs/*.md points at a file (and heading) that exists;
- docs/configuration.md is what ``python -m jobs.config_reference`` generates from the typed
  config, and lists every key the job accepts.
"""
import os
import re

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOCS = [os.path.join(ROOT, "README.md")] + sorted(
    os.path.join(ROOT, "docs", f) for f in os.listdir(os.path.join(ROOT, "docs")) if f.endswith(".md"))


def _read(path):
    with open(path) as fh:
        return fh.read()


def test_readme_opens_with_the_two_setup_commands_and_is_short():
    text = _read(os.path.join(ROOT, "README.md"))
    block = re.search(r"```bash\n(.*?)```", text, re.S).group(1).strip().splitlines()
    assert block == [
        "pip install -c constraints.txt -e . && python -m jobs.distill --config "
        "jobs/configs/digits_central.yaml",
        'pip install -c constraints.txt -e ".[test]" && python -m pytest -q -n 2 tests']
    assert text.index("```bash") < text.index("\n## ")       # before any section
    assert len(text.splitlines()) <= 250
    ci = _read(os.path.join(ROOT, ".ci", "run"))
    assert 'pip install -q -c constraints.txt -e ".[test]"' in ci
    assert "python -m pytest -q -n 2" in ci and " tests" in ci   # the README's, plus flags


def _anchor(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to dashes."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


@pytest.mark.parametrize("path", DOCS, ids=lambda p: os.path.relpath(p, ROOT))
def test_relative_links_resolve(path):
    text = _read(path)
    broken = []
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if re.match(r"[a-z]+://", target):
            continue
        file_part, _, anchor = target.partition("#")
        dest = os.path.normpath(os.path.join(os.path.dirname(path), file_part)) if file_part else path
        if not os.path.exists(dest):
            broken.append(target)
            continue
        if anchor and dest.endswith(".md"):
            anchors = {_anchor(h) for h in re.findall(r"^#+ (.*)$", _read(dest), re.M)}
            if anchor not in anchors:
                broken.append(target)
    assert not broken, f"{os.path.relpath(path, ROOT)} links to missing files or headings: {broken}"


def test_configuration_reference_is_generated_from_the_config():
    from jobs.config_reference import DOC_PATH, render
    from rknn_ray.config import KNOWN_KEYS
    generated = render()
    assert _read(DOC_PATH) == generated, "docs/configuration.md is stale: python -m jobs.config_reference"
    for key in KNOWN_KEYS:
        assert f"`{key}`" in generated or f"`{key.split('.')[0]}.{key.split('.')[1]}`" in generated, key


def test_config_reference_check_flags_a_stale_file(tmp_path, monkeypatch, capsys):
    import jobs.config_reference as ref
    stale = tmp_path / "configuration.md"
    stale.write_text("# old\n")
    monkeypatch.setattr(ref, "DOC_PATH", str(stale))
    assert ref.main(["--check"]) == 1
    assert "out of date" in capsys.readouterr().err
    assert ref.main([]) == 0 and ref.main(["--check"]) == 0
