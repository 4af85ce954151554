"""The README and docs/ (issue 26 item 1): every relative link leads to a file
of the checkout, every #anchor to a heading of its page, every page of docs/ is
reachable from the README, and the README stays short. No network: links to
other sites are not followed."""
import importlib.util
import os
import re

import pytest

from support import readme_examples, run_python

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
README = os.path.join(ROOT, "README.md")
DOCS = os.path.join(ROOT, "docs")
LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")

pytestmark = pytest.mark.skipif(not os.path.isdir(DOCS), reason="docs/ is not in this tree (an installed wheel)")


def _pages():
    return [README] + sorted(os.path.join(DOCS, f) for f in os.listdir(DOCS) if f.endswith(".md"))


def _text_outside_code(path):
    with open(path, encoding="utf-8") as f:
        text = f.read()
    return re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)


def _anchors(path):
    """GitHub's anchors: a heading lower-cased, punctuation dropped, spaces to '-'."""
    out = set()
    for line in _text_outside_code(path).splitlines():
        m = re.match(r"#{1,6}\s+(.*)", line)
        if m:
            title = m.group(1).strip().lower()
            out.add(re.sub(r"\s", "-", re.sub(r"[^\w\- ]", "", title)))
    return out


def _links(path):
    return LINK.findall(_text_outside_code(path))


@pytest.mark.parametrize("page", _pages(), ids=lambda p: os.path.relpath(p, ROOT))
def test_every_link_leads_to_a_file_and_heading_of_the_checkout(page):
    broken = []
    for target in _links(page):
        if re.match(r"[a-z]+:", target):        # https:, mailto: ... (not followed: no network)
            continue
        path, _, anchor = target.partition("#")
        dest = os.path.normpath(os.path.join(os.path.dirname(page), path)) if path else page
        if not os.path.exists(dest):
            broken.append(f"{target}: no file {os.path.relpath(dest, ROOT)}")
        elif anchor and dest.endswith(".md") and anchor not in _anchors(dest):
            broken.append(f"{target}: no heading #{anchor} in {os.path.relpath(dest, ROOT)}")
    assert not broken, f"{os.path.relpath(page, ROOT)}: " + "; ".join(broken)


def test_every_docs_page_is_linked_from_the_readme():
    linked = {os.path.normpath(os.path.join(ROOT, t.partition("#")[0])) for t in _links(README)}
    missing = [os.path.relpath(p, ROOT) for p in _pages()[1:] if p not in linked]
    assert not missing, f"not linked from README.md: {missing}"


def test_every_docs_page_links_back_to_the_readme():
    lone = [os.path.relpath(p, ROOT) for p in _pages()[1:]
            if not any(t.partition("#")[0] == "../README.md" for t in _links(p))]
    assert not lone, f"no link back to the README: {lone}"


def test_the_readme_is_short_and_starts_with_the_two_commands():
    with open(README, encoding="utf-8") as f:
        lines = f.read().splitlines()
    assert len(lines) <= 200, f"README.md has {len(lines)} lines"
    head = "\n".join(lines[:8])
    assert "bash bench/main.sh --quick" in head and "bash tests/run.sh" in head, head
    assert "prefetch-ring" in "\n".join(lines), "the distribution name"


def test_the_anchor_rule_catches_a_missing_heading():
    anchors = _anchors(os.path.join(DOCS, "contract.md"))
    assert "memory" in anchors and "no-such-heading" not in anchors


def test_the_design_table_has_a_row_for_every_file_of_the_core():
    """Issue 22 item 6: docs/design.md has one row per stage file; a file added
    to prefetch/ or csrc/ without its row fails here."""
    with open(os.path.join(ROOT, "docs", "design.md"), encoding="utf-8") as f:
        design = f.read()
    names = [f"prefetch/{n}" for n in os.listdir(os.path.join(ROOT, "prefetch"))
             if n.endswith((".pyx", ".pxi", ".py")) and n not in ("__init__.py", "_version.py")]
    names += [f"csrc/{n.rsplit('.', 1)[0]}" for n in os.listdir(os.path.join(ROOT, "csrc"))
              if n.startswith("pf_") and n.endswith(".h")]
    missing = [n for n in names if f"`{n}" not in design]
    assert not missing, missing


@pytest.mark.timeout(60)
@pytest.mark.parametrize("code", readme_examples(None), ids=lambda c: c.splitlines()[0][:40])
def test_the_readmes_examples_run_as_pasted(code):
    """Issue 35 item 6: each numpy-only example of the README runs as pasted."""
    r = run_python(code, timeout=50)
    assert r.returncode == 0, r.stderr


@pytest.mark.timeout(120)
@pytest.mark.parametrize("framework", ["torch", "mxnet"])
def test_the_readmes_framework_examples_run_as_pasted(framework):
    """Issue 35 item 6: the README's PyTorch and Gluon examples run as pasted, in
    their framework's environment (tests/run.sh runs this test there too)."""
    if importlib.util.find_spec(framework) is None:
        pytest.skip(f"{framework} is not in this environment: tests/run.sh runs this test in its own")
    examples = readme_examples(framework)
    assert examples, f"the README has no example importing {framework}"
    for code in examples:
        r = run_python(code, timeout=100)
        assert r.returncode == 0, r.stderr


FRAGMENT = "<!-- fragment -->"


def _docs_python_blocks():
    """(page, first line, code, is_fragment) of every ```python block in docs/; a block is a
    fragment when the line before its fence is FRAGMENT (the page says what it leaves out)."""
    out = []
    for page in _pages()[1:] if os.path.isdir(DOCS) else []:
        with open(page, encoding="utf-8") as f:
            text = f.read()
        for m in re.finditer(r"^( *)```python\n(.*?)^\1```", text, re.S | re.M):
            before = text[:m.start()].rstrip("\n").rsplit("\n", 1)[-1].strip()
            code = "\n".join(line[len(m.group(1)):] for line in m.group(2).splitlines())
            out.append((os.path.relpath(page, ROOT), code.splitlines()[0], code, before == FRAGMENT))
    return out


def test_every_docs_code_block_runs_or_is_marked_a_fragment():
    """A block that needs a framework is a fragment (the runnable ones are numpy-only, run
    below); every page's blocks are found (a page's count going to 0 would hide them)."""
    blocks = _docs_python_blocks()
    assert len(blocks) >= 10 and any(not frag for *_, frag in blocks)
    needs = [f"{page}: {first}" for page, first, code, frag in blocks
             if not frag and re.search(r"^\s*(import|from) (prefetch\.)?(torch|mxnet|mx)\b", code, re.M)]
    assert not needs, f"not marked {FRAGMENT!r}, yet needs a framework: {needs}"


@pytest.mark.timeout(60)
@pytest.mark.parametrize("code", [code for _p, _f, code, frag in _docs_python_blocks() if not frag],
                         ids=lambda c: c.splitlines()[0][:40])
def test_the_docs_complete_examples_run_as_pasted(code):
    r = run_python(code, timeout=50)
    assert r.returncode == 0, r.stderr
