"""Covers: grader.jail.kernel, grader.jail.kernel_manager, grader.judge.judged_execute.

One word for one thing: the grader's boundary is the jail, everywhere (issue 57). "Sandbox", in
any case, is found in no tracked file's name or text but on the lines of its deprecation path,
an explicit list below of the old names an instructor's files may still use (each must still be
there: a name whose deprecation ended leaves the list), and of words of others we cannot change.
The deprecation path itself is held too: the old class names import, with a FutureWarning naming
the new one, as the classes of the new names; the old settings still work, saying what to use.
"""
from __future__ import annotations

import re
import shutil
import subprocess

import pytest
from traitlets.utils.importstring import import_item

from helpers import REPO, make_environment

WORD = re.compile("sandbox", re.IGNORECASE)
#: {tracked file: the old names, or others' words, that may say it there, and why}.
ALLOWED = {
    "Makefile": ("sandbox-tools",),                              # the old make target: says it goes, runs jail-tools
    "grader/jail/kernel.py": ("SandboxedExecute", "SandboxedKernelManager", "SandboxedKernelClient"),
    "grader/judge/judged_execute.py": ("JudgedSandboxedExecute",),
    "grader/jail/kernel_manager.py": ("GRADER_SANDBOX_SPEC",),     # read where GRADER_JAIL_SPEC is not set
    "nbgrader_config.py": ("GRADER_SANDBOX_SPEC",),                # an instructor's script may still set it
    "tests/helpers/browser.py": ("--no-sandbox", "Chromium sandbox"),   # Chromium's own words
    "tests/test_words.py": ("",),                                  # this file, which names them all
    # The vocabulary's entry for the jail, which says where the old word survives.
    "CONTRIBUTING.md": ('old word "sandbox"', "JudgedSandboxedExecute", "SandboxedExecute", "SandboxedKernelManager",
                        "SandboxedKernelClient", "GRADER_SANDBOX_SPEC", "sandbox-tools"),
}


def stray_words(files: dict[str, str], allowed: dict[str, tuple[str, ...]]) -> list[str]:
    """'path:line: text' of each line that says the word past the names allowed in its file, and
    'path: ...' for a file named with it, or an allowed name its file no longer holds."""
    found = []
    for path, text in sorted(files.items()):
        names = allowed.get(path, ())
        if path not in allowed and WORD.search(path):
            found.append(f"{path}: the file's name says it")
        if names == ("",):
            continue
        for number, line in enumerate(text.splitlines(), 1):
            rest = line
            for name in names:
                rest = rest.replace(name, "")
            if WORD.search(rest):
                found.append(f"{path}:{number}: {line.strip()[:160]}")
        found += [f"{path}: no longer says {name!r}: take it off ALLOWED" for name in names if name not in text]
    return found + [f"{path}: in ALLOWED, not tracked" for path in sorted(set(allowed) - set(files))]


def tracked_files() -> dict[str, str]:
    """{path: text} of every tracked text file of the checkout, as it is on disk."""
    paths = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True, text=True,
                           check=True).stdout.split("\0")
    files = {}
    for path in filter(None, paths):
        try:
            files[path] = (REPO / path).read_text(encoding="utf-8")
        except (UnicodeDecodeError, FileNotFoundError, IsADirectoryError):  # binary, or deleted in the tree
            files[path] = ""
    return files


def test_the_jail_has_one_word():
    found = stray_words(tracked_files(), ALLOWED)
    assert not found, ("say jail, not sandbox (CONTRIBUTING.md, Words); an old name an instructor's config may "
                       "still use belongs in tests/test_words.py's ALLOWED, with its deprecation:\n"
                       + "\n".join(found))


def test_a_stray_sandbox_is_caught():
    files = {"grader/x.py": "a = 1\nb = Sandboxed()  # the SANDBOX\n", "docs/sandbox-notes.md": "jail",
             "Makefile": "jail-tools:\n\tsh grader/jail-tools.sh\n"}
    found = stray_words(files, {"grader/x.py": ("Sandboxed",), "Makefile": ("sandbox-tools",), "gone.py": ("x",)})
    assert found == ["Makefile: no longer says 'sandbox-tools': take it off ALLOWED",
                     "docs/sandbox-notes.md: the file's name says it",
                     "grader/x.py:2: b = Sandboxed()  # the SANDBOX",
                     "gone.py: in ALLOWED, not tracked"], found


@pytest.mark.parametrize("old, new", [("grader.jail.kernel.SandboxedExecute", "grader.jail.kernel.JailedExecute"),
                                      ("grader.jail.kernel.SandboxedKernelManager",
                                       "grader.jail.kernel_manager.JailedKernelManager"),
                                      ("grader.jail.kernel.SandboxedKernelClient",
                                       "grader.jail.kernel_manager.JailedKernelClient"),
                                      ("grader.judge.judged_execute.JudgedSandboxedExecute",
                                       "grader.judge.judged_execute.JudgedJailedExecute")])
def test_an_old_class_name_imports_with_a_warning_as_the_new_class(old, new):
    # As nbgrader resolves the class names of an instructor's nbgrader_config.py (traitlets' import_item).
    with pytest.warns(FutureWarning, match=re.escape(new.rpartition(".")[2])):
        assert import_item(old) is import_item(new)


def test_a_name_that_never_was_is_still_refused():
    with pytest.raises(ImportError):
        import_item("grader.jail.kernel.SandboxedNothing")
    with pytest.raises(AttributeError, match="JailedNothing"):
        import_item("grader.judge.judged_execute").JudgedJailedNothing  # noqa: B018


def test_the_old_spec_variable_still_names_the_jail_and_says_to_set_the_new(monkeypatch, capsys):
    from grader.jail.kernel_manager import OLD_SPEC_ENV, SPEC_ENV, spec_path

    assert (SPEC_ENV, OLD_SPEC_ENV) == ("GRADER_JAIL_SPEC", "GRADER_SANDBOX_SPEC")
    monkeypatch.delenv(SPEC_ENV, raising=False)
    monkeypatch.setenv(OLD_SPEC_ENV, "/old/jail.json")
    assert spec_path() == "/old/jail.json"
    assert f"{OLD_SPEC_ENV} is deprecated and goes next term: set {SPEC_ENV}" in capsys.readouterr().err
    monkeypatch.setenv(SPEC_ENV, "/new/jail.json")   # the grader sets both: the new one is read, and nothing said
    assert spec_path() == "/new/jail.json"
    assert capsys.readouterr().err == ""
    monkeypatch.delenv(SPEC_ENV)
    monkeypatch.delenv(OLD_SPEC_ENV)
    with pytest.raises(KeyError, match=SPEC_ENV):
        spec_path()


def test_the_old_make_target_says_it_goes_and_installs_the_jail():
    if not shutil.which("bwrap"):
        pytest.skip("no bubblewrap here: the target would install it")
    old = subprocess.run(["make", "--no-print-directory", "sandbox-tools"], cwd=REPO, capture_output=True,
                         text=True, env=make_environment(), timeout=60)
    new = subprocess.run(["make", "--no-print-directory", "jail-tools"], cwd=REPO, capture_output=True,
                         text=True, env=make_environment(), timeout=60)
    assert old.returncode == new.returncode == 0, (old.stderr, new.stderr)
    assert old.stderr == "make sandbox-tools is deprecated and goes next term: make jail-tools\n", old.stderr
    assert old.stdout == new.stdout == "sh grader/jail-tools.sh\n", (old.stdout, new.stdout)
