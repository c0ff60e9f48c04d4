"""The README's test command sets the machine up itself: ``tests/system_setup.sh`` (run first by
that command, and so by ``.ci/run``) installs Chromium and chromedriver with apt-get when they are
missing, and says in one line what to install when it cannot. Run here against stand-in
``apt-get``, ``id`` and browsers on a ``PATH`` of their own: nothing is installed for real."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from conftest import ROOT

SCRIPT = ROOT / "tests" / "system_setup.sh"
APT_GET = """#!/bin/sh
echo "$*" >> "$SETUP_LOG"
[ "$1" = install ] || exit 0
[ -n "${APT_FAILS:-}" ] && { echo "E: Unable to locate package chromium" >&2; exit 100; }
for name in chromium chromedriver; do
  printf '#!/bin/sh\\n' > "$SETUP_BIN/$name" && /bin/chmod +x "$SETUP_BIN/$name"
done
"""


def readme_test_command() -> str:
    readme = (ROOT / "README.md").read_text()
    return re.findall(r"```bash\n(.*?)```", readme, flags=re.S)[1].strip()


def run_setup(tmp_path: Path, *, uid: int, apt: bool = True, browser: bool = False,
              apt_fails: bool = False) -> tuple[subprocess.CompletedProcess, list[str], Path]:
    """The script on a PATH of stand-ins only (plus ``env``); its result, the
    apt-get calls and the PATH folder."""
    bin_dir = tmp_path / f"bin-{uid}-{apt}-{browser}-{apt_fails}"
    bin_dir.mkdir()
    (bin_dir / "env").symlink_to(shutil.which("env"))
    # x86_64: the OpenBLAS wheel's machine, where only the browser is the script's business
    stubs = {"id": f"#!/bin/sh\necho {uid}\n", "uname": "#!/bin/sh\necho x86_64\n"}
    if apt:
        stubs["apt-get"] = APT_GET
    if browser:
        stubs["chromium"] = stubs["chromedriver"] = "#!/bin/sh\n"
    for name, text in stubs.items():
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    log = tmp_path / f"{bin_dir.name}.log"
    log.touch()
    env = {"PATH": str(bin_dir), "SETUP_LOG": str(log), "SETUP_BIN": str(bin_dir),
           **({"APT_FAILS": "1"} if apt_fails else {})}
    result = subprocess.run(["/bin/sh", str(SCRIPT)], env=env, capture_output=True, text=True,
                            timeout=60)
    return result, log.read_text().splitlines(), bin_dir


def test_the_readme_test_command_runs_the_setup_first():
    command = readme_test_command()
    assert command.startswith("sh tests/system_setup.sh && python3 -m venv .venv"), command
    ci = (ROOT / ".ci" / "run").read_text()
    assert "apt-get install" not in ci and "chromium" not in ci  # one place sets up: the script


def test_browser_present_installs_nothing(tmp_path):
    result, calls, _ = run_setup(tmp_path, uid=1000, browser=True)
    assert (result.returncode, result.stderr, calls) == (0, "", [])


def test_browser_missing_is_installed_as_root(tmp_path):
    result, calls, bin_dir = run_setup(tmp_path, uid=0)
    assert result.returncode == 0, result.stderr
    assert calls == ["update -qq", "install -y -qq chromium chromium-driver"]
    assert (bin_dir / "chromium").exists() and (bin_dir / "chromedriver").exists()


@pytest.mark.parametrize("case", ["not root, no sudo", "no apt-get", "apt-get fails"])
def test_when_it_cannot_install_it_says_what_to_install(tmp_path, case):
    result, calls, _ = run_setup(tmp_path, uid=0 if case != "not root, no sudo" else 1000,
                                 apt=case != "no apt-get", apt_fails=case == "apt-get fails")
    assert result.returncode == 1
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "chromium-driver" in errors[0], result.stderr
    assert calls == ([] if case != "apt-get fails" else
                     ["update -qq", "install -y -qq chromium chromium-driver"])
